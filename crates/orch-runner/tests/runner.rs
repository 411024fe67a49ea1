use orch_backend::fake::FakeBackend;
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::Status;
use orch_runner::{execute, Progress, RunnerOptions};
use orch_store::{host_environment, RunState, Store};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

fn plan(n: usize) -> orch_manifest::Plan {
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let text = format!(
        "name: t\nbenchmarks:\n  - name: a\n    workload: {{noop: true}}\n    matrix: {{i: [{}]}}\n",
        values.join(", ")
    );
    load_str(&text, Path::new("t.yaml"), &ExpandOptions::default()).unwrap()
}

fn opts(concurrency: usize) -> RunnerOptions {
    RunnerOptions {
        concurrency,
        secrets: vec![],
        weights_dir: None,
        images: Default::default(),
        gpu_devices: None,
        diagnose_rules: None,
    }
}

#[tokio::test]
async fn respects_concurrency_and_records_every_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    let mut run = store
        .create_run(
            &plan(6),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    let fake =
        Arc::new(FakeBackend::new(Duration::from_millis(50)).with_outcome("a.cpu.i-3", Status::Failed));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_cancel_tx, cancel_rx) = watch::channel(false);
    let outcome = execute(&mut run, fake.clone(), opts(2), tx, cancel_rx)
        .await
        .unwrap();
    assert_eq!(fake.max_parallel_seen(), 2);
    assert_eq!(fake.launched().len(), 6);
    assert_eq!(outcome.counts.get(&Status::Succeeded), Some(&5));
    assert_eq!(outcome.counts.get(&Status::Failed), Some(&1));
    assert!(!outcome.all_succeeded());
    let mut finished = 0;
    while let Ok(p) = rx.try_recv() {
        if matches!(p, Progress::CellFinished(_)) {
            finished += 1;
        }
    }
    assert_eq!(finished, 6);
    assert_eq!(run.record().unwrap().state, RunState::Complete);
}

#[tokio::test]
async fn default_concurrency_is_one_cell_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    let mut run = store
        .create_run(
            &plan(3),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    let fake = Arc::new(FakeBackend::new(Duration::from_millis(20)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let concurrency = run.plan.concurrency;
    execute(&mut run, fake.clone(), opts(concurrency), tx, cancel_rx)
        .await
        .unwrap();
    assert_eq!(fake.max_parallel_seen(), 1);
    assert_eq!(fake.launched(), vec!["a.cpu.i-1", "a.cpu.i-2", "a.cpu.i-3"]);
}

#[tokio::test]
async fn cancel_stops_launching_and_resume_runs_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    let mut run = store
        .create_run(
            &plan(4),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    let fake = Arc::new(FakeBackend::new(Duration::from_secs(30)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (cancel_tx, cancel_rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = cancel_tx.send(true);
    });
    let outcome = execute(&mut run, fake.clone(), opts(1), tx, cancel_rx)
        .await
        .unwrap();
    assert!(outcome.cancelled);
    assert_eq!(outcome.counts.get(&Status::Cancelled), Some(&1));
    assert_eq!(outcome.not_started, 3);
    assert_eq!(run.meta.state, RunState::Interrupted);

    let fake2 = Arc::new(FakeBackend::new(Duration::from_millis(1)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let mut again = store.open_run(run.id()).unwrap();
    let outcome = execute(&mut again, fake2.clone(), opts(1), tx, cancel_rx)
        .await
        .unwrap();
    assert!(outcome.all_succeeded());
    assert_eq!(
        fake2.launched().len(),
        4,
        "the cancelled cell and the 3 never started"
    );
}
