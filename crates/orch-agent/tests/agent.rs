//! The `orch-agent` binary as a container would run it.

use orch_protocol::{
    BuiltinWorkload, CellResult, CommandWorkload, Event, Measure, Status, TaskSpec, Workload,
};
use std::collections::BTreeMap;
use std::process::Command;

fn task(workload: Workload) -> TaskSpec {
    TaskSpec {
        version: orch_protocol::PROTOCOL_VERSION,
        run_id: "r1".into(),
        cell_id: "c1".into(),
        gpu: "none".into(),
        params: [("bs".to_string(), serde_json::json!(8))].into_iter().collect(),
        env: [("FROM_TASK".to_string(), "yes".to_string())]
            .into_iter()
            .collect(),
        secret_env: vec![],
        workload,
        measure: Measure {
            warmup: 1,
            repetitions: 2,
            timeout_s: 30.0,
            kill_grace_s: 1.0,
        },
        logs: Default::default(),
        memory_limit_bytes: None,
        weights_dir: Some("/weights".into()),
        strict_hardware: false,
        gpu_fallback: vec![],
        files: None,
    }
}

fn run_agent(t: &TaskSpec) -> (Vec<Event>, CellResult, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let task_path = dir.path().join("task.json");
    std::fs::write(&task_path, serde_json::to_vec(t).unwrap()).unwrap();
    let out_dir = dir.path().join("out");
    let out = Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .args([
            "run",
            "--task",
            task_path.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "agent failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<Event> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad event line {l}: {e}")))
        .collect();
    let result: CellResult =
        serde_json::from_slice(&std::fs::read(out_dir.join("result.json")).unwrap()).unwrap();
    (events, result, out_dir, dir)
}

#[test]
fn command_workload_reports_metrics_env_and_events() {
    let script = r#"
echo "bs=$ORCH_PARAM_BS task=$FROM_TASK cell=$ORCH_CELL_ID"
echo "hf=$HF_HUB_CACHE offline=$HF_HUB_OFFLINE"
echo "ORCH_PHASE warmup"
echo "ORCH_PHASE measure"
echo "ORCH_METRIC a=1.5 b=2"
echo '{"c": 3}' > "$ORCH_METRICS_FILE"
echo oops >&2
"#;
    let t = task(Workload::Command(CommandWorkload {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        workdir: None,
    }));
    let (events, result, out_dir, _tmp) = run_agent(&t);
    assert_eq!(result.status, Status::Succeeded);
    let want: BTreeMap<String, f64> = [("a", 1.5), ("b", 2.0), ("c", 3.0)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    assert_eq!(result.metrics, want);
    assert!(result.timings.contains_key(&orch_protocol::Phase::Warmup));
    assert_eq!(
        std::fs::read_to_string(out_dir.join("stdout.log"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
        "bs=8 task=yes cell=c1"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("stderr.log")).unwrap(),
        "oops\n"
    );
    assert!(matches!(events.first(), Some(Event::Started { .. })));
    match events.last() {
        Some(Event::Result { result: r }) => assert_eq!(r, &result),
        e => panic!("last event is not the result: {e:?}"),
    }
}

#[test]
fn signal_and_spawn_failures_are_recorded() {
    let t = task(Workload::Command(CommandWorkload {
        argv: vec!["sh".into(), "-c".into(), "kill -9 $$".into()],
        workdir: None,
    }));
    let (_, r, _, _tmp) = run_agent(&t);
    assert_eq!(r.status, Status::Failed);
    let f = r.failure.unwrap();
    assert_eq!(f.signal, Some(9));
    assert!(f.message.contains("SIGKILL"), "{}", f.message);

    let t = task(Workload::Command(CommandWorkload {
        argv: vec!["/no/such/program".into()],
        workdir: None,
    }));
    let (_, r, _, _tmp) = run_agent(&t);
    assert_eq!(r.failure.unwrap().kind, "spawn");
}

#[test]
fn noop_and_version() {
    let (_, r, _, _tmp) = run_agent(&task(Workload::Builtin(BuiltinWorkload::Noop)));
    assert_eq!(r.status, Status::Succeeded);
    let out = Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .arg("version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("orch-agent "));
    let out = Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .arg("bogus")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn rejects_a_task_of_another_protocol_version() {
    let mut t = task(Workload::Builtin(BuiltinWorkload::Noop));
    t.version = 999;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("task.json");
    std::fs::write(&p, serde_json::to_vec(&t).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .args([
            "run",
            "--task",
            p.to_str().unwrap(),
            "--out",
            dir.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("protocol version 999"));
}
