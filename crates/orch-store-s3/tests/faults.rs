//! The S3 store through the fault proxy (`orch_fake_s3::faultproxy`) in
//! front of `moto_server`: outages of every kind ridden out by the SDK's
//! retries, a silent endpoint given up within the budget, records kept on
//! local disk through a long outage and uploaded once afterwards, refused
//! credentials told as the user's to fix. No timing is asserted beyond a
//! generous bound that proves nothing hangs.

use orch_fake_s3::faultproxy::{FaultProxy, Mode};
use orch_fake_s3::{require, S3Server};
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::{CellResult, Status};
use orch_store::{host_environment, CellRecord, Run, Store};
use orch_store_s3::objects::Settings;
use orch_store_s3::S3Store;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

fn server() -> Option<&'static S3Server> {
    static SERVER: OnceLock<Option<S3Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let s = require(S3Server::moto())?;
            s.create_bucket("team").unwrap();
            for (k, v) in s.env() {
                // Set once, before any client reads it.
                std::env::set_var(k, v);
            }
            Some(s)
        })
        .as_ref()
}

/// Short timeouts so that a test sees several attempts in a few seconds.
fn settings(endpoint: &str) -> Settings {
    Settings {
        budget: Duration::from_secs(30),
        attempt_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_secs(1),
        endpoint: Some(endpoint.to_string()),
        ..Settings::default()
    }
}

fn open(prefix: &str, work: &Path, s: Settings) -> Arc<S3Store> {
    // The working folder (and with it the spool) of this store handle,
    // read from the environment by `open`: one test at a time.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("ORCH_S3_WORKDIR", work);
    Arc::new(S3Store::open_with(&format!("s3://team/{prefix}"), s).unwrap())
}

fn new_run(store: &Store, cells: usize) -> Run {
    let xs: Vec<String> = (1..=cells).map(|i| i.to_string()).collect();
    let yaml = format!(
        "name: t\nbenchmarks:\n  - name: a\n    workload: {{noop: true}}\n    matrix: {{x: [{}]}}\n",
        xs.join(", ")
    );
    let plan = load_str(&yaml, Path::new("t.yaml"), &ExpandOptions::default()).unwrap();
    store
        .create_run(
            &plan,
            &yaml,
            "local",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap()
}

fn succeeded(run: &Run, i: usize, attempt: u32) -> CellRecord {
    let cell = &run.plan.cells[i];
    let now = chrono::Utc::now();
    CellRecord::from_result(
        cell,
        CellResult::new(&cell.id, Status::Succeeded),
        now,
        now,
        attempt,
    )
}

/// Keys under the run's `records/` and `done/`, read straight from the
/// server (not through the proxy).
fn record_keys(direct: &S3Store, run: &str) -> (Vec<String>, Vec<String>) {
    let base = direct.run_key(run);
    let keys = |p: &str| -> Vec<String> {
        direct
            .objects()
            .list(&format!("{base}{p}"))
            .unwrap()
            .into_iter()
            .map(|l| l.key[base.len()..].to_string())
            .collect()
    };
    (keys("records/"), keys("done/"))
}

#[test]
fn outages_of_every_kind_are_ridden_out_and_every_cell_recorded_once() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let proxy = FaultProxy::start(&s.endpoint).unwrap();
    let store_h = open("ride", tmp.path(), settings(&proxy.endpoint));
    let direct = open("ride", &tmp.path().join("direct"), settings(&s.endpoint));
    let store = Store::with_backend(store_h.clone());
    for (n, mode) in [Mode::Refuse, Mode::SlowDown, Mode::Drop, Mode::Silent]
        .into_iter()
        .enumerate()
    {
        proxy.set(Mode::Pass);
        let run = new_run(&store, 6);
        // The outage starts while the cells are claimed and recorded, and
        // lasts 3 s.
        let timetable = proxy.schedule(vec![
            (Duration::from_millis(150), mode),
            (Duration::from_secs(3), Mode::Pass),
        ]);
        let started = Instant::now();
        let results: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..run.plan.cells.len())
                .map(|i| {
                    let run = &run;
                    sc.spawn(move || {
                        std::thread::sleep(Duration::from_millis(100 * i as u64));
                        let (_, attempt) = run.prepare_cell(&run.plan.cells[i].id)?;
                        std::thread::sleep(Duration::from_millis(300));
                        run.finish_cell(&succeeded(run, i, attempt))
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        timetable.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{mode:?}: hung for {:?}",
            started.elapsed()
        );
        for r in &results {
            assert!(r.is_ok(), "{mode:?}: {r:?}");
        }
        if mode != Mode::Refuse {
            assert!(proxy.count(mode) > 0, "{mode:?}: the outage met no request");
        }
        assert!(
            store_h.spooled(run.id()).is_empty(),
            "{mode:?}: records left in the spool"
        );
        let (attempts, done) = record_keys(&direct, run.id());
        assert_eq!(attempts.len(), 6, "{mode:?} (run {n}): {attempts:?}");
        assert_eq!(done.len(), 6, "{mode:?} (run {n}): {done:?}");
        let rec = Store::with_backend(direct.clone())
            .open_exact(run.id())
            .unwrap()
            .record()
            .unwrap();
        assert_eq!(rec.counts.get("succeeded"), Some(&6), "{mode:?}");
    }
}

#[test]
fn a_silent_endpoint_fails_within_the_budget_with_a_clear_error() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let proxy = FaultProxy::start(&s.endpoint).unwrap();
    proxy.set(Mode::Silent);
    let st = Settings {
        budget: Duration::from_secs(5),
        ..settings(&proxy.endpoint)
    };
    let store = open("silent", tmp.path(), st);
    let started = Instant::now();
    let err = Store::with_backend(store.clone()).run_ids().unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "hung for {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    // Named by what the store answered (nothing, in time), not the SDK's words.
    assert!(
        text.contains("failed every request for")
            && text.contains("no reply within")
            && text.contains("hint:"),
        "{text}"
    );
    assert!(err.is_outage() && !err.is_user_error(), "{text}");
    assert!(text.contains("ORCH_S3_TIMEOUT_S"), "{text}");
    assert!(
        proxy.count(Mode::Silent) >= 2,
        "retried: {}",
        proxy.count(Mode::Silent)
    );
}

#[test]
fn a_long_outage_keeps_records_on_disk_until_the_run_is_opened_again() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let proxy = FaultProxy::start(&s.endpoint).unwrap();
    let short = Settings {
        budget: Duration::from_secs(2),
        ..settings(&proxy.endpoint)
    };
    let first = open("long", tmp.path(), short.clone());
    let direct = open("long", &tmp.path().join("direct"), settings(&s.endpoint));
    let store = Store::with_backend(first.clone());
    let run = new_run(&store, 3);
    let id = run.id().to_string();
    let (dir, a0) = run.prepare_cell(&run.plan.cells[0].id).unwrap();
    std::fs::write(dir.join("stdout.log"), b"cell 0 says hello\n").unwrap();
    let (_, a1) = run.prepare_cell(&run.plan.cells[1].id).unwrap();
    proxy.set(Mode::Refuse);
    // The store is away for longer than the budget: the records are kept.
    run.finish_cell(&succeeded(&run, 0, a0)).unwrap();
    run.finish_cell(&succeeded(&run, 1, a1)).unwrap();
    let spooled = first.spooled(&id);
    assert_eq!(spooled.len(), 2, "{spooled:?}");
    assert!(spooled.iter().all(|p| p.starts_with(tmp.path())));
    let (attempts, done) = record_keys(&direct, &id);
    assert!(attempts.is_empty() && done.is_empty(), "{attempts:?} {done:?}");
    // An entry as it was before its upload: uploaded again below, it must
    // be recorded once all the same (create-once, the same writer).
    let copy = std::fs::read(&spooled[0]).unwrap();
    drop(store);
    drop(run);
    drop(first);

    // The store is back; another process (another handle, the same host
    // and working folder) opens the run, as `orch run --resume` does.
    proxy.set(Mode::Pass);
    let second = open("long", tmp.path(), short);
    let reopened = Store::with_backend(second.clone()).open_exact(&id).unwrap();
    assert!(second.spooled(&id).is_empty());
    let recs: Vec<_> = (0..3)
        .map(|i| reopened.cell_record(&run_cell(&reopened, i)).unwrap())
        .collect();
    assert!(
        recs[0].is_some() && recs[1].is_some() && recs[2].is_none(),
        "{recs:?}"
    );
    let log = reopened
        .read_cell_file(&run_cell(&reopened, 0), "stdout.log", 0)
        .unwrap();
    assert_eq!(log.as_deref(), Some(&b"cell 0 says hello\n"[..]));
    let (attempts, done) = record_keys(&direct, &id);
    assert_eq!((attempts.len(), done.len()), (2, 2), "{attempts:?} {done:?}");

    // The same entry once more (a lost reply before it was removed): no
    // second record, no error, and the entry is gone.
    std::fs::create_dir_all(spooled[0].parent().unwrap()).unwrap();
    std::fs::write(&spooled[0], &copy).unwrap();
    let third = open("long", tmp.path(), settings(&proxy.endpoint));
    Store::with_backend(third.clone()).open_exact(&id).unwrap();
    assert!(third.spooled(&id).is_empty());
    let (attempts, done) = record_keys(&direct, &id);
    assert_eq!((attempts.len(), done.len()), (2, 2), "{attempts:?} {done:?}");
}

fn run_cell(run: &Run, i: usize) -> String {
    run.plan.cells[i].id.clone()
}

#[test]
fn refused_credentials_are_the_users_to_fix_and_keep_the_record() {
    let Some(s) = server() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let proxy = FaultProxy::start(&s.endpoint).unwrap();
    let store_h = open("deny", tmp.path(), settings(&proxy.endpoint));
    let store = Store::with_backend(store_h.clone());
    let run = new_run(&store, 2);
    let (_, a) = run.prepare_cell(&run.plan.cells[0].id).unwrap();
    proxy.set(Mode::Deny);
    let started = Instant::now();
    let err = run.finish_cell(&succeeded(&run, 0, a)).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a refusal is not retried for long: {:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(err.is_user_error(), "{text}");
    assert!(
        text.contains("`team`") && text.contains("InvalidAccessKeyId") && text.contains("hint:"),
        "{text}"
    );
    assert!(text.contains("--resume"), "{text}");
    assert_eq!(store_h.spooled(run.id()).len(), 1);
    let err = store.run_ids().unwrap_err();
    assert!(err.is_user_error(), "{err}");
}
