//! The `orch-agent` binary as a container would run it.

use orch_protocol::{
    BuiltinWorkload, CellResult, CommandWorkload, Event, FailureKind, Measure, Status, TaskSpec, Workload,
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
        serde_json::from_slice(&std::fs::read(out_dir.join("agent-result.json")).unwrap()).unwrap();
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
    assert_eq!(r.failure.unwrap().kind, FailureKind::Spawn);
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

/// The cell's warning lines: the agent's message events (the host writes
/// them to `agent.log`).
fn warnings(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message { text } if text.starts_with("warning: ") => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn metric_notes(result: &CellResult) -> Vec<String> {
    result
        .info
        .get("metric_notes")
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

#[test]
fn metrics_that_are_not_finite_numbers_are_left_out_with_a_note_and_a_warning() {
    // From a metric line and from a metrics file alike; the file's one bad
    // value does not fail the cell.
    let script = r#"
echo "ORCH_METRIC good=1 nan=NaN inf=inf big=1e400 word=fast"
printf '{"ok": 2, "fnan": NaN, "nested": {"finf": -Infinity, "fbig": 1e400}, "s": "NaN"}' > "$ORCH_METRICS_FILE"
"#;
    let t = task(Workload::Command(CommandWorkload {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        workdir: None,
    }));
    let (events, result, _out, _tmp) = run_agent(&t);
    assert_eq!(result.status, Status::Succeeded, "{:?}", result.failure);
    let want: BTreeMap<String, f64> = [("good", 1.0), ("ok", 2.0)]
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    assert_eq!(result.metrics, want);
    let notes = metric_notes(&result);
    let warned = warnings(&events);
    for name in ["nan", "inf", "big", "word", "fnan", "nested.finf", "nested.fbig"] {
        let key = format!("metric `{name}` left out");
        assert!(notes.iter().any(|n| n.contains(&key)), "{key} in notes {notes:?}");
        assert!(
            warned.iter().any(|w| w.contains(&key)),
            "{key} in warnings {warned:?}"
        );
    }
    assert_eq!(notes.len(), 7, "{notes:?}");
    assert!(notes.iter().any(|n| n.contains("`1e400`")), "{notes:?}");
}

#[test]
fn long_metric_lines_are_read_or_refused_with_a_warning() {
    // 100 KiB: over the old 64 KiB limit, read whole. Over 1 MiB: refused,
    // with a warning and a note, never silently.
    let script = r#"
pad=$(head -c 100000 /dev/zero | tr '\0' 'x')
echo "ORCH_METRIC first=1 pad=$pad last=2"
big=$(head -c 1100000 /dev/zero | tr '\0' 'y')
echo "ORCH_METRIC lost=3 pad=$big"
echo "ORCH_METRIC after=4"
"#;
    let t = task(Workload::Command(CommandWorkload {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        workdir: None,
    }));
    let (events, result, _out, _tmp) = run_agent(&t);
    assert_eq!(result.status, Status::Succeeded, "{:?}", result.failure);
    assert_eq!(result.metrics.get("first"), Some(&1.0));
    assert_eq!(result.metrics.get("last"), Some(&2.0));
    assert_eq!(result.metrics.get("after"), Some(&4.0));
    assert_eq!(result.metrics.get("lost"), None);
    let refused = "an `ORCH_METRIC` line longer than 1 MiB was not read";
    assert!(
        warnings(&events).iter().any(|w| w.contains(refused)),
        "{:?}",
        warnings(&events)
    );
    assert!(metric_notes(&result).iter().any(|n| n.contains(refused)));
}
