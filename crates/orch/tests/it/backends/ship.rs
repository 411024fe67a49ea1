//! The way home of the remote backends, end to end: the real agent with
//! `--ship` (as a pod or a sandbox runs it), its stdout fed to
//! `orch_backend::home::Home`, the cell folder compared with what the agent
//! wrote where it ran.

use crate::support::orch;
use orch_backend::home::{task_b64, Home};
use orch_protocol::{CommandWorkload, Measure, Status, TaskSpec, Workload};
use std::process::Stdio;

fn task(script: &str) -> TaskSpec {
    TaskSpec {
        version: orch_protocol::PROTOCOL_VERSION,
        run_id: "r1".into(),
        cell_id: "c1".into(),
        gpu: "none".into(),
        params: Default::default(),
        env: Default::default(),
        secret_env: vec![],
        workload: Workload::Command(CommandWorkload {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            workdir: None,
        }),
        measure: Measure {
            warmup: 0,
            repetitions: 1,
            timeout_s: 60.0,
            kill_grace_s: 1.0,
        },
        logs: Default::default(),
        memory_limit_bytes: None,
        weights_dir: None,
        strict_hardware: false,
        gpu_fallback: vec![],
        files: None,
    }
}

#[tokio::test]
async fn a_shipped_cell_arrives_whole_over_one_stream_and_again_on_replay() {
    // 3 MB of stdout written over ~1 s, stderr, a metrics file, a result file.
    let script = r#"
i=0
while [ $i -lt 30 ]; do
  head -c 100000 /dev/zero | tr '\0' 'x'; echo " line $i"
  i=$((i+1)); sleep 0.03
done
echo "ORCH_METRIC tokens_per_s=42"
echo "to stderr" >&2
echo '{"n": 1}' > loadgen.json
exit 3
"#;
    let scratch = tempfile::tempdir().unwrap();
    let agent_out = scratch.path().join("out");
    let child = orch()
        .args(["agent", "run", "--task-b64", &task_b64(&task(script)), "--out"])
        .arg(&agent_out)
        .args(["--ship", "--summary-file"])
        .arg(scratch.path().join("summary.json"))
        .current_dir(scratch.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "{}",
        String::from_utf8_lossy(&child.stderr)
    );
    // The agent's own stderr went into agent.log (shipped), not the stream.
    let stream = String::from_utf8(child.stdout).unwrap();
    assert!(stream.lines().all(|l| l.starts_with("{\"n\":")));

    let home_dir = tempfile::tempdir().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut home = Home::new("c1", home_dir.path(), tx).unwrap();
    // A first connection that drops a third of the way through.
    let lines: Vec<&str> = stream.lines().collect();
    let cut = lines.len() / 3;
    let first = lines[..cut].join("\n");
    assert!(home.pump(first.as_bytes()).await.unwrap().is_none());
    // The replay of the whole log, with a runtime's timestamp line mixed in.
    let replay = format!("some runtime noise\n{stream}");
    let result = home.pump(replay.as_bytes()).await.unwrap().expect("a result");
    assert_eq!(result.status, Status::Failed);
    assert_eq!(result.failure.as_ref().unwrap().exit_code, Some(3));
    assert_eq!(result.metrics.get("tokens_per_s"), Some(&42.0));
    assert_eq!(home.verify(), Ok(true));
    assert!(!home.gaps());
    for name in ["stdout.log", "stderr.log", "agent.log"] {
        assert_eq!(
            std::fs::read(home_dir.path().join(name)).unwrap(),
            std::fs::read(agent_out.join(name)).unwrap(),
            "{name}"
        );
    }
    assert!(std::fs::read(home_dir.path().join("stdout.log")).unwrap().len() > 3_000_000);
    assert!(
        !home_dir.path().join("result.json").exists() && !home_dir.path().join("agent-result.json").exists(),
        "the host's store writes the result"
    );
    let events = std::fs::read_to_string(home_dir.path().join("events.jsonl")).unwrap();
    assert!(events.lines().next().unwrap().contains("\"started\""));
    assert!(events.lines().last().unwrap().contains("\"result\""));
    assert!(rx.try_recv().is_ok());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["status"], "failed");
    assert_eq!(summary["exit_code"], 3);
}
