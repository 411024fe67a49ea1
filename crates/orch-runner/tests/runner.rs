use orch_backend::fake::FakeBackend;
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::Status;
use orch_record::FailureKind;
use orch_runner::{execute, GpuDevices, Progress, RunnerOptions};
use orch_store::{host_environment, RunState, Store};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

mod common;
use common::{opts, plan};

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
    let concurrency = run.plan.concurrency.unwrap_or(1);
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

fn priced(run: &orch_store::Run, usd_per_s: f64, estimate_s: f64, max_usd: f64) -> RunnerOptions {
    let mut o = opts(1);
    for c in &run.plan.cells {
        o.cost
            .rates
            .insert(c.id.clone(), orch_cost::Rate::flat("fake", usd_per_s));
        o.cost.estimates.insert(c.id.clone(), estimate_s);
    }
    o.cost.max_usd = Some(max_usd);
    o.cost.tick = Some(Duration::from_millis(50));
    o
}

#[tokio::test]
async fn budget_stops_a_cell_that_runs_past_its_estimate_and_launches_no_more() {
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
    // Cells "run" 30 s at $1/s, estimated at 0.1 s each; the cap is $0.5.
    let fake = Arc::new(FakeBackend::new(Duration::from_secs(30)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let opts = priced(&run, 1.0, 0.1, 0.5);
    let started = std::time::Instant::now();
    let outcome = execute(&mut run, fake.clone(), opts, tx, cancel_rx)
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        outcome.budget_stopped.is_some() && !outcome.cancelled,
        "{outcome:?}"
    );
    assert_eq!(fake.launched().len(), 1, "no cell launched after the stop");
    assert_eq!(outcome.not_started, 2);
    let rec = run.record().unwrap();
    assert_eq!(rec.state, RunState::Interrupted);
    for c in &rec.cells {
        assert_eq!(c.status, orch_store::CellStatus::Cancelled);
        assert_eq!(c.failure.as_ref().unwrap().kind, orch_runner::BUDGET_FAILURE);
    }
    // Spent: within the cap plus what the cell cost while it stopped.
    let spent = rec.cost.unwrap().usd;
    assert!(spent <= 0.5 + 1.0 * (0.05 + 0.2), "{spent}");
    assert!(spent >= 0.3, "{spent}");
    let budget = rec.budget.unwrap();
    assert!(
        budget.stopped && (budget.accrued_usd - spent).abs() < 1e-9,
        "{budget:?}"
    );

    // Resumed with the same cap, the run has nothing left to spend on.
    let mut again = store.open_run(run.id()).unwrap();
    let mut opts = priced(&again, 1.0, 0.1, 0.5);
    opts.cost.prior_usd = spent;
    let fake2 = Arc::new(FakeBackend::new(Duration::from_millis(10)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let outcome = execute(&mut again, fake2.clone(), opts, tx, cancel_rx)
        .await
        .unwrap();
    // $0.5 - spent leaves less than a cell's estimate plus one tick only if
    // spent is near the cap; otherwise cells run. Either way the cap holds.
    let total = again.record().unwrap().cost.unwrap().usd;
    assert!(total <= 0.5 + 1.0 * (0.05 + 0.2), "{total}");
    assert!(outcome.budget_stopped.is_some() || outcome.all_succeeded());
}

#[tokio::test]
async fn cells_get_their_cost_without_a_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    let mut run = store
        .create_run(
            &plan(2),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    let fake =
        Arc::new(FakeBackend::new(Duration::from_millis(100)).with_outcome("a.cpu.i-2", Status::Failed));
    let mut o = priced(&run, 2.0, 1.0, 0.0);
    o.cost.max_usd = None;
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    execute(&mut run, fake, o, tx, cancel_rx).await.unwrap();
    let rec = run.record().unwrap();
    for c in &rec.cells {
        let cost = c.cost.as_ref().unwrap();
        assert!((cost.usd - 2.0 * c.duration_s.unwrap()).abs() < 1e-9);
        assert_eq!(cost.wasted, c.status != orch_store::CellStatus::Succeeded);
    }
    let total = rec.cost.unwrap();
    assert_eq!(total.cells, 2);
    assert!(total.wasted_usd > 0.0 && total.wasted_usd < total.usd);
    assert!(rec.budget.is_none());
    // The ledger has one line per record.
    let ledger = std::fs::read_to_string(run.ledger_path()).unwrap();
    assert_eq!(ledger.lines().count(), 2);
}

fn gpu_plan(spec: &str, n: usize) -> orch_manifest::Plan {
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let text = format!(
        "name: t\ngpus: [\"{spec}\"]\nbenchmarks:\n  - name: a\n    workload: {{noop: true}}\n    matrix: {{i: [{}]}}\n",
        values.join(", ")
    );
    load_str(&text, Path::new("t.yaml"), &ExpandOptions::default()).unwrap()
}

async fn run_gpu_plan(
    plan: &orch_manifest::Plan,
    devices: GpuDevices,
) -> (
    Arc<FakeBackend>,
    orch_runner::Outcome,
    Store,
    String,
    tempfile::TempDir,
) {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::new(tmp.path());
    let mut run = store
        .create_run(plan, "", "fake", host_environment(Path::new("t.yaml"), vec![]))
        .unwrap();
    let id = run.id().to_string();
    let fake = Arc::new(FakeBackend::new(Duration::from_millis(60)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_cancel_tx, cancel_rx) = watch::channel(false);
    let mut o = opts(4);
    o.gpu_devices = devices;
    let outcome = execute(&mut run, fake.clone(), o, tx, cancel_rx).await.unwrap();
    (fake, outcome, store, id, tmp)
}

#[tokio::test]
async fn a_gpu_never_serves_two_cells_at_once() {
    // Four GPUs known, cells of two each: two at a time, never more.
    let (fake, outcome, ..) = run_gpu_plan(
        &gpu_plan("H100:2", 4),
        GpuDevices::Known((0..4).map(|i| i.to_string()).collect()),
    )
    .await;
    assert_eq!(outcome.counts.get(&Status::Succeeded), Some(&4));
    assert_eq!(fake.max_parallel_seen(), 2);
    // GPUs not known: the backend gives a cell every GPU it sees, so GPU
    // cells take turns whatever the concurrency.
    let (fake, outcome, ..) = run_gpu_plan(&gpu_plan("H100:2", 3), GpuDevices::Unknown).await;
    assert_eq!(outcome.counts.get(&Status::Succeeded), Some(&3));
    assert_eq!(fake.max_parallel_seen(), 1);
    // A cluster or Modal assigns GPUs itself: nothing waits here.
    let (fake, outcome, ..) = run_gpu_plan(&gpu_plan("H100:8", 4), GpuDevices::Platform).await;
    assert_eq!(outcome.counts.get(&Status::Succeeded), Some(&4));
    assert_eq!(fake.max_parallel_seen(), 4);
}

#[tokio::test]
async fn a_cell_asking_for_more_gpus_than_the_host_has_never_runs() {
    let (fake, outcome, store, id, _tmp) = run_gpu_plan(
        &gpu_plan("H100:8", 1),
        GpuDevices::Known((0..4).map(|i| i.to_string()).collect()),
    )
    .await;
    assert!(fake.launched().is_empty(), "{:?}", fake.launched());
    assert_eq!(outcome.counts.get(&Status::Failed), Some(&1));
    let run = store.open_run(&id).unwrap();
    let rec = run.cell_record("a.h100x8.i-1").unwrap().expect("a record");
    let f = rec.failure.as_ref().unwrap();
    assert_eq!(f.kind, FailureKind::NotEnoughGpus);
    assert!(
        f.message.contains("asks for 8 GPUs and this host has 4"),
        "{}",
        f.message
    );
}
