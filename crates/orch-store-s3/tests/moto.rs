//! The S3 store against `moto_server`, whose conditional writes are atomic:
//! racing writers, lost replies, hostile keys. One server for the whole
//! binary (the AWS chain reads the process environment, set once here).

use orch_fake_s3::{require, S3Server};
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::{CellResult, Status};
use orch_store::{host_environment, CellRecord, Run, Store, StoreError};
use orch_store_s3::objects::Created;
use orch_store_s3::S3Store;
use std::path::Path;
use std::sync::{Arc, OnceLock};

fn server() -> Option<&'static S3Server> {
    static SERVER: OnceLock<Option<S3Server>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let s = require(S3Server::moto())?;
            s.create_bucket("team").unwrap();
            for (k, v) in s.env() {
                // SAFETY-free in edition 2021; set once, before any client reads it.
                std::env::set_var(k, v);
            }
            std::env::set_var(
                "ORCH_S3_WORKDIR",
                std::env::temp_dir().join(format!("orch-s3-test-{}", std::process::id())),
            );
            Some(s)
        })
        .as_ref()
}

fn open(prefix: &str) -> Arc<S3Store> {
    Arc::new(S3Store::open(&format!("s3://team/{prefix}")).unwrap())
}

fn new_run(store: &Store) -> Run {
    let plan = load_str(
        "name: t\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n    matrix: {x: [1, 2]}\n",
        Path::new("t.yaml"),
        &ExpandOptions::default(),
    )
    .unwrap();
    store
        .create_run(
            &plan,
            "name: t\n",
            "local",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap()
}

#[test]
fn a_lost_reply_is_told_apart_from_a_conflict() {
    let Some(_s) = server() else { return };
    let s = open("lost");
    let o = s.objects();
    let key = "lost/object";
    assert_eq!(
        o.create(key, b"{\"writer\":\"me-1\"}".to_vec(), "me-1").unwrap(),
        Created::Ours
    );
    // The same writer's retry (its first reply lost): ours.
    assert_eq!(
        o.create(key, b"{\"writer\":\"me-1\"}".to_vec(), "me-1").unwrap(),
        Created::Ours
    );
    // Another writer: a conflict, with the first writer's bytes.
    match o
        .create(key, b"{\"writer\":\"you-2\"}".to_vec(), "you-2")
        .unwrap()
    {
        Created::Theirs(b) => assert!(String::from_utf8_lossy(&b).contains("me-1")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn racing_writers_claim_and_record_a_cell_once() {
    let Some(_s) = server() else { return };
    let first = open("race");
    let store = Store::with_backend(first.clone());
    let run = new_run(&store);
    let id = run.id().to_string();
    let cell = run.plan.cells[0].clone();
    // Eight processes (eight store handles, eight tokens) claim attempt 1 at once.
    let handles: Vec<Arc<S3Store>> = (0..8).map(|_| open("race")).collect();
    let claims: Vec<Result<(std::path::PathBuf, u32), StoreError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = handles
            .iter()
            .map(|h| {
                let (h, id, cell) = (h.clone(), id.clone(), cell.id.clone());
                sc.spawn(move || {
                    let store = Store::with_backend(h);
                    store.open_exact(&id).unwrap().prepare_cell(&cell)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let won = claims.iter().filter(|c| c.is_ok()).count();
    let lost = claims
        .iter()
        .filter(|c| matches!(c, Err(StoreError::Claimed { .. })))
        .count();
    assert_eq!((won, lost), (1, 7), "{claims:?}");

    // Eight processes that each ran the cell (attempts 1..=8) record it at once.
    let now = chrono::Utc::now();
    let results: Vec<Result<(), StoreError>> = std::thread::scope(|sc| {
        let hs: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let (h, id, cell) = (h.clone(), id.clone(), cell.clone());
                sc.spawn(move || {
                    let run = Store::with_backend(h).open_exact(&id).unwrap();
                    let rec = CellRecord::from_result(
                        &cell,
                        CellResult::new(&cell.id, Status::Succeeded),
                        now,
                        now,
                        i as u32 + 1,
                    );
                    run.finish_cell(&rec)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let elsewhere = results
        .iter()
        .filter(|r| matches!(r, Err(StoreError::RecordedElsewhere { .. })))
        .count();
    assert_eq!((ok, elsewhere), (1, 7), "{results:?}");
    let run = store.open_exact(&id).unwrap();
    let rec = run.record().unwrap();
    assert_eq!(rec.counts.get("succeeded"), Some(&1));
    // The losers' attempts are kept as earlier attempts (they were spent).
    assert_eq!(
        run.all_records()
            .unwrap()
            .iter()
            .filter(|(_, earlier)| *earlier)
            .count(),
        7
    );
}

#[test]
fn a_pull_never_writes_outside_the_store() {
    let Some(_s) = server() else { return };
    let s = open("hostile");
    let store = Store::with_backend(s.clone());
    let run = new_run(&store);
    let cell = run.plan.cells[0].clone();
    run.prepare_cell(&cell.id).unwrap();
    let now = chrono::Utc::now();
    run.finish_cell(&CellRecord::from_result(
        &cell,
        CellResult::new(&cell.id, Status::Succeeded),
        now,
        now,
        1,
    ))
    .unwrap();
    let base = s.run_key(run.id());
    for evil in [
        format!("{base}cells/{}/1/../../../../../escaped.txt", cell.id),
        format!("{base}cells/../../escaped/1/x.log"),
    ] {
        s.objects().put(&evil, b"pwned".to_vec()).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("a").join("b").join("store");
        let e = orch_store_s3::transfer::pull(&s, run.id(), &root).unwrap_err();
        assert!(matches!(e, StoreError::Unsafe { .. }), "{e}");
        assert!(e.is_user_error());
        let mut found = vec![];
        let mut stack = vec![tmp.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    found.push(e.path());
                }
            }
        }
        assert!(
            found
                .iter()
                .all(|p| !p.ends_with("escaped.txt") && !p.ends_with("x.log")),
            "{found:?}"
        );
        s.objects().delete(&[evil]).unwrap();
    }
    // Without the hostile keys the same pull works.
    let tmp = tempfile::tempdir().unwrap();
    let moved = orch_store_s3::transfer::pull(&s, run.id(), tmp.path()).unwrap();
    assert_eq!(moved.records, 1);
    let local = Store::new(tmp.path()).open_exact(run.id()).unwrap();
    assert_eq!(
        local.cell_record(&cell.id).unwrap().unwrap().status,
        Status::Succeeded
    );
}

/// Every key under `prefix` in the bucket `team`.
fn keys_under(s: &S3Store, prefix: &str) -> Vec<String> {
    s.objects()
        .list(prefix)
        .unwrap()
        .into_iter()
        .map(|l| l.key)
        .collect()
}

#[test]
fn ls_reads_the_catalog_and_still_sees_every_change() {
    use orch_store::RunState;
    let Some(_s) = server() else { return };
    let writer = open("cat");
    let store = Store::with_backend(writer.clone());
    let mut ids = Vec::new();
    for _ in 0..20 {
        let mut run = new_run(&store);
        run.set_state(RunState::Complete).unwrap();
        ids.push(run.id().to_string());
    }
    // The first `ls` reads every run and leaves a catalog.
    let (listed, damaged) = Store::with_backend(open("cat")).list_checked().unwrap();
    assert!(damaged.is_empty(), "{damaged:?}");
    assert_eq!(listed.len(), 20);
    let catalogs = keys_under(&writer, "cat/.orch/catalog/");
    assert_eq!(catalogs.len(), 1, "{catalogs:?}");

    // The catalog is what the next `ls` reads: an entry changed in it shows.
    let bytes = writer.objects().get(&catalogs[0], 0).unwrap().unwrap();
    let mut cat: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    for id in [&ids[3], &ids[7]] {
        cat["runs"][id.as_str()]["summary"]["suite"] = "from-the-catalog".into();
    }
    writer
        .objects()
        .put(&catalogs[0], serde_json::to_vec(&cat).unwrap())
        .unwrap();
    let suite_of = |listed: &[orch_store::RunSummary], id: &str| {
        listed
            .iter()
            .find(|s| s.id == id)
            .map(|s| (s.suite.clone(), s.state))
    };
    let listed = Store::with_backend(open("cat")).list().unwrap();
    assert_eq!(
        suite_of(&listed, &ids[7]),
        Some(("from-the-catalog".into(), RunState::Complete))
    );

    // Another machine resumes run 3, makes a new run and deletes run 5.
    let other = open("cat");
    let other_store = Store::with_backend(other.clone());
    let mut resumed = other_store.open_exact(&ids[3]).unwrap();
    resumed.note_resume().unwrap();
    let new = new_run(&other_store);
    let mut gone = keys_under(&other, &format!("cat/{}/", ids[5]));
    gone.push(format!("cat/.orch/runs/{}", ids[5]));
    other.objects().delete(&gone).unwrap();

    let listed = Store::with_backend(open("cat")).list().unwrap();
    assert_eq!(listed.len(), 20, "{listed:?}");
    // The resumed run is read again, not taken from the catalog.
    assert_eq!(suite_of(&listed, &ids[3]), Some(("t".into(), RunState::Running)));
    assert_eq!(suite_of(&listed, new.id()).map(|s| s.1), Some(RunState::Running));
    assert_eq!(suite_of(&listed, &ids[5]), None);
    assert_eq!(
        suite_of(&listed, &ids[7]),
        Some(("from-the-catalog".into(), RunState::Complete))
    );
}

#[test]
fn runs_written_before_the_run_markers_stay_listed_after_a_new_run() {
    let Some(_s) = server() else { return };
    let writer = open("old");
    let store = Store::with_backend(writer.clone());
    let mut old: Vec<String> = (0..2).map(|_| new_run(&store).id().to_string()).collect();
    old.sort();
    // A store written by an orch that made no markers.
    let markers = keys_under(&writer, "old/.orch/runs/");
    assert_eq!(markers.len(), 2, "{markers:?}");
    writer.objects().delete(&markers).unwrap();
    assert_eq!(Store::with_backend(open("old")).run_ids().unwrap(), old);

    let new = new_run(&Store::with_backend(open("old")));
    let mut all = old.clone();
    all.push(new.id().to_string());
    all.sort();
    assert_eq!(Store::with_backend(open("old")).run_ids().unwrap(), all);
    assert_eq!(keys_under(&writer, "old/.orch/runs/").len(), 3);
}

#[test]
fn show_trusts_the_records_cache_of_a_finished_run_only_while_it_is_current() {
    use orch_store::RunState;
    let Some(_s) = server() else { return };
    let writer = open("cache");
    let store = Store::with_backend(writer.clone());
    let mut run = new_run(&store);
    let id = run.id().to_string();
    let now = chrono::Utc::now();
    // The first cell is cancelled (it will run again), the second fails.
    for (cell, status) in run
        .plan
        .cells
        .clone()
        .into_iter()
        .zip([Status::Cancelled, Status::Failed])
    {
        let (_, n) = run.prepare_cell(&cell.id).unwrap();
        let rec = CellRecord::from_result(&cell, CellResult::new(&cell.id, status), now, now, n);
        run.finish_cell(&rec).unwrap();
    }
    run.set_state(RunState::Interrupted).unwrap();
    let cache_key = format!("cache/{id}/records.json");
    let first_cache = writer.objects().get(&cache_key, 0).unwrap().unwrap();

    // A finished run's records come from the cache alone: a record changed
    // in it shows.
    let mut cache: serde_json::Value = serde_json::from_slice(&first_cache).unwrap();
    cache["records"][0]["status"] = "succeeded".into();
    writer
        .objects()
        .put(&cache_key, serde_json::to_vec(&cache).unwrap())
        .unwrap();
    let rec = Store::with_backend(open("cache"))
        .open_exact(&id)
        .unwrap()
        .record()
        .unwrap();
    assert_eq!(rec.counts.get("succeeded"), Some(&1), "{:?}", rec.counts);

    // Another session runs the first cell again and finishes the run; a
    // lagging process then puts the old cache back. It covers an older
    // state, so it is not trusted: the new attempt shows.
    let other = open("cache");
    let mut again = Store::with_backend(other.clone()).open_exact(&id).unwrap();
    again.note_resume().unwrap();
    let cell = again.plan.cells[0].clone();
    let (_, n) = again.prepare_cell(&cell.id).unwrap();
    assert_eq!(n, 2);
    let rec = CellRecord::from_result(&cell, CellResult::new(&cell.id, Status::Succeeded), now, now, n);
    again.finish_cell(&rec).unwrap();
    again.set_state(RunState::Interrupted).unwrap();
    other.objects().put(&cache_key, first_cache).unwrap();
    let reader = Store::with_backend(open("cache")).open_exact(&id).unwrap();
    let all = reader.all_records().unwrap();
    let current: Vec<(u32, bool)> = all.iter().map(|(r, e)| (r.attempt, *e)).collect();
    assert!(
        current.contains(&(2, false)) && current.contains(&(1, true)),
        "{current:?}"
    );
    assert_eq!(reader.record().unwrap().counts.get("succeeded"), Some(&1));
}

fn run_of(store: &Store, cells: usize) -> Run {
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

fn finished(run: &Run) -> Vec<CellRecord> {
    run.plan
        .cells
        .iter()
        .map(|c| {
            let (_, attempt) = run.prepare_cell(&c.id).unwrap();
            let now = chrono::Utc::now();
            CellRecord::from_result(c, CellResult::new(&c.id, Status::Succeeded), now, now, attempt)
        })
        .collect()
}

#[test]
fn cells_ending_together_rewrite_the_run_index_once() {
    let Some(_s) = server() else { return };
    let s3 = open("together");
    let store = Store::with_backend(s3.clone());

    // A batch of records (the runner's group commit): each stored, the index once.
    let run = run_of(&store, 120);
    let records = finished(&run);
    let before = s3.index_writes();
    let out = run.finish_cells(&records);
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    assert_eq!(s3.index_writes() - before, 1, "one index rewrite for the batch");

    // The same records written one by one from many threads at once: of the
    // writers that find the index due together, one rewrites it.
    let run2 = run_of(&store, 64);
    let records = finished(&run2);
    let before = s3.index_writes();
    let started = std::time::Instant::now();
    std::thread::scope(|sc| {
        for chunk in records.chunks(4) {
            let run2 = &run2;
            sc.spawn(move || {
                for r in chunk {
                    run2.finish_cell(r).unwrap();
                }
            });
        }
    });
    // (The index is rewritten at most every 5 s while cells end: a slow
    // server may see one more, never one per writer.)
    let allowed = 1 + started.elapsed().as_secs() / 5;
    let writes = s3.index_writes() - before;
    assert!(
        (1..=allowed).contains(&writes),
        "{writes} index rewrites for 64 cells ending at once (at most {allowed})"
    );

    // Every record is in the store, as another process reads it.
    let fresh = Store::with_backend(open("together"));
    for (r, n) in [(&run, 120), (&run2, 64)] {
        let again = fresh.open_exact(r.id()).unwrap();
        let recs = again.record().unwrap();
        assert_eq!(recs.cells.len(), n);
        assert!(recs
            .cells
            .iter()
            .all(|c| c.status == orch_store::CellStatus::Succeeded));
    }
}

/// A finished attempt of `run`'s cell `i`, billed `usd` ($1 a second).
fn billed(run: &Run, i: usize, usd: f64) -> CellRecord {
    let cell = run.plan.cells[i].clone();
    let (_, n) = run.prepare_cell(&cell.id).unwrap();
    let end = chrono::Utc::now();
    let start = end - chrono::Duration::milliseconds((usd * 1000.0) as i64);
    let mut r = CellRecord::from_result(&cell, CellResult::new(&cell.id, Status::Succeeded), start, end, n);
    let rate = orch_cost::Rate::flat("local", 1.0);
    r.cost = Some(orch_cost::cell_cost(&rate, r.status, r.duration_s, &r.timings));
    r
}

fn spent(lines: &[orch_cost::LedgerLine]) -> f64 {
    (lines.iter().map(|l| l.usd).sum::<f64>() * 1000.0).round() / 1000.0
}

/// `orch cost` on a large S3 store read every run's index and listed its
/// state (two requests a run: 100,000 runs did not finish in 10 minutes);
/// it reads the catalog `orch ls` reads, and still sees every change.
#[test]
fn cost_reads_the_catalog_and_still_sees_every_change() {
    use orch_store::RunState;
    let Some(_s) = server() else { return };
    let writer = open("costcat");
    let store = Store::with_backend(writer.clone());
    let mut ids = Vec::new();
    for _ in 0..20 {
        let mut run = new_run(&store);
        run.finish_cell(&billed(&run, 0, 2.0)).unwrap();
        run.set_state(RunState::Complete).unwrap();
        ids.push(run.id().to_string());
    }
    // The first `orch cost` reads every run and leaves a catalog with the ledgers.
    assert_eq!(
        spent(&Store::with_backend(open("costcat")).cost_lines(None).unwrap()),
        40.0
    );
    let catalogs = keys_under(&writer, "costcat/.orch/catalog/");
    assert_eq!(catalogs.len(), 1, "{catalogs:?}");

    // The next one reads the catalog: a line changed in it shows.
    let bytes = writer.objects().get(&catalogs[0], 0).unwrap().unwrap();
    let mut cat: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    cat["runs"][ids[7].as_str()]["ledger"][0]["usd"] = 12.0.into();
    writer
        .objects()
        .put(&catalogs[0], serde_json::to_vec(&cat).unwrap())
        .unwrap();
    assert_eq!(
        spent(&Store::with_backend(open("costcat")).cost_lines(None).unwrap()),
        50.0
    );
    // `orch ls` reads the same catalog.
    assert_eq!(Store::with_backend(open("costcat")).list().unwrap().len(), 20);
    assert_eq!(keys_under(&writer, "costcat/.orch/catalog/"), catalogs);

    // Another machine resumes run 3 and bills its other cell $3: the run is
    // read again while running (its index made current) and after.
    let other = Store::with_backend(open("costcat"));
    let mut resumed = other.open_exact(&ids[3]).unwrap();
    resumed.note_resume().unwrap();
    resumed.finish_cell(&billed(&resumed, 1, 3.0)).unwrap();
    assert_eq!(
        spent(&Store::with_backend(open("costcat")).cost_lines(None).unwrap()),
        53.0
    );
    resumed.set_state(RunState::Complete).unwrap();
    assert_eq!(
        spent(&Store::with_backend(open("costcat")).cost_lines(None).unwrap()),
        53.0
    );

    // `--since`: only the attempts that finished at or after it.
    let later = Store::with_backend(open("costcat"))
        .cost_lines(Some(chrono::Utc::now() + chrono::Duration::hours(1)))
        .unwrap();
    assert!(later.is_empty(), "{later:?}");

    // A catalog written before it kept ledgers (or by an older orch): the
    // runs are read again, and a catalog with their ledgers is written.
    let newest = keys_under(&writer, "costcat/.orch/catalog/");
    for key in &newest {
        let bytes = writer.objects().get(key, 0).unwrap().unwrap();
        let mut cat: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for entry in cat["runs"].as_object_mut().unwrap().values_mut() {
            entry.as_object_mut().unwrap().remove("ledger");
        }
        writer
            .objects()
            .put(key, serde_json::to_vec(&cat).unwrap())
            .unwrap();
    }
    assert_eq!(
        spent(&Store::with_backend(open("costcat")).cost_lines(None).unwrap()),
        43.0
    );
    let bytes = writer
        .objects()
        .get(&keys_under(&writer, "costcat/.orch/catalog/")[0], 0)
        .unwrap()
        .unwrap();
    let cat: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert!(cat["runs"][ids[0].as_str()]["ledger"].is_array(), "{cat}");
}
