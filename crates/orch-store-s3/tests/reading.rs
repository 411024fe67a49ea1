//! Many runs opened only to read them (`orch history`), against
//! `moto_server`: finished runs from their caches without a listing each,
//! a run being written and a resumed one as `orch show` opens them.

use orch_fake_s3::{require, S3Server};
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::{CellResult, Status};
use orch_store::{host_environment, CellRecord, Run, RunState, Store};
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
                // Set once, before any client reads it.
                std::env::set_var(k, v);
            }
            std::env::set_var(
                "ORCH_S3_WORKDIR",
                std::env::temp_dir().join(format!("orch-s3-reading-{}", std::process::id())),
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
    let mut run = store
        .create_run(
            &plan,
            "name: t\n",
            "local",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    run.set_state(RunState::Running).unwrap();
    run
}

/// Run cell `i` of the run to `status`.
fn finish(run: &Run, i: usize, status: Status) {
    let cell = run.plan.cells[i].clone();
    let (_, n) = run.prepare_cell(&cell.id).unwrap();
    let now = chrono::Utc::now();
    let rec = CellRecord::from_result(&cell, CellResult::new(&cell.id, status), now, now, n);
    run.finish_cell(&rec).unwrap();
}

/// Each run's record as `orch show` reads it, on a handle of its own.
fn shown(prefix: &str, ids: &[String]) -> Vec<serde_json::Value> {
    let store = Store::with_backend(open(prefix));
    ids.iter()
        .map(|id| serde_json::to_value(store.open_exact(id).unwrap().record().unwrap()).unwrap())
        .collect()
}

/// Each run's record as `orch history` reads it, on a handle of its own.
fn read(prefix: &str, ids: &[String]) -> Vec<serde_json::Value> {
    let store = Store::with_backend(open(prefix));
    store
        .open_to_read(ids)
        .into_iter()
        .map(|r| serde_json::to_value(r.unwrap().record().unwrap()).unwrap())
        .collect()
}

#[test]
fn runs_opened_to_read_are_the_runs_show_opens_finished_running_or_resumed() {
    let Some(_s) = server() else { return };
    let writer = open("read");
    let store = Store::with_backend(writer.clone());
    // Finished.
    let mut done = new_run(&store);
    finish(&done, 0, Status::Succeeded);
    finish(&done, 1, Status::Failed);
    done.set_state(RunState::Complete).unwrap();
    // Being written: one cell recorded, the other not yet.
    let running = new_run(&store);
    finish(&running, 0, Status::Succeeded);
    // Finished, then resumed by another session while a lagging process
    // puts the caches of the finished state back.
    let mut resumed = new_run(&store);
    finish(&resumed, 0, Status::Cancelled);
    finish(&resumed, 1, Status::Succeeded);
    resumed.set_state(RunState::Interrupted).unwrap();
    let caches: Vec<(String, Vec<u8>)> = ["index.json", "records.json"]
        .iter()
        .map(|f| {
            let k = format!("read/{}/{f}", resumed.id());
            (k.clone(), writer.objects().get(&k, 0).unwrap().unwrap())
        })
        .collect();
    let other = open("read");
    let mut again = Store::with_backend(other.clone())
        .open_exact(resumed.id())
        .unwrap();
    again.note_resume().unwrap();
    again.set_state(RunState::Running).unwrap();
    finish(&again, 0, Status::Succeeded);
    for (k, b) in caches {
        other.objects().put(&k, b).unwrap();
    }

    let ids: Vec<String> = [&done, &running, &resumed]
        .iter()
        .map(|r| r.id().to_string())
        .collect();
    let got = read("read", &ids);
    assert_eq!(got, shown("read", &ids));
    assert_eq!(got[0]["state"], "complete");
    assert_eq!(got[1]["state"], "running");
    assert_eq!(got[1]["cells"][1]["status"], "pending");
    assert_eq!(
        got[2]["state"], "complete",
        "the resumed run's new attempt: {}",
        got[2]
    );
    assert_eq!(got[2]["cells"][0]["status"], "succeeded");
    // Every run of the store at once (as `orch history` opens them).
    let all = Store::with_backend(open("read")).open_all_to_read().unwrap();
    let mut listed: Vec<String> = all.iter().map(|(id, _)| id.clone()).collect();
    listed.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(listed, want);
    for (id, r) in all {
        let i = ids.iter().position(|x| *x == id).unwrap();
        assert_eq!(
            serde_json::to_value(r.unwrap().record().unwrap()).unwrap(),
            got[i]
        );
    }
    // Read twice from one handle: the same.
    let store = Store::with_backend(open("read"));
    let twice: Vec<Vec<RunState>> = (0..2)
        .map(|_| {
            store
                .open_to_read(&ids)
                .into_iter()
                .map(|r| r.unwrap().record().unwrap().state)
                .collect()
        })
        .collect();
    assert_eq!(twice[0], twice[1]);

    // The finished run is read from its caches alone, without listing its
    // states: a state object that no change names (never written so by a
    // writer) is seen by `orch show`, not by the reader.
    let stray = format!("read/{}/state/9999999999999-stray.json", done.id());
    let mut meta = serde_json::to_value(&done.meta).unwrap();
    meta["state"] = "interrupted".into();
    writer
        .objects()
        .put(&stray, serde_json::to_vec(&meta).unwrap())
        .unwrap();
    let one = vec![done.id().to_string()];
    assert_eq!(read("read", &one)[0]["state"], "complete");
    assert_eq!(shown("read", &one)[0]["state"], "interrupted");
    writer.objects().delete(&[stray]).unwrap();
}

#[test]
fn an_unreadable_run_is_its_own_error_and_the_others_still_open() {
    let Some(_s) = server() else { return };
    let writer = open("bad");
    let store = Store::with_backend(writer.clone());
    let mut good = new_run(&store);
    finish(&good, 0, Status::Succeeded);
    finish(&good, 1, Status::Succeeded);
    good.set_state(RunState::Complete).unwrap();
    let mut bad = new_run(&store);
    bad.set_state(RunState::Complete).unwrap();
    writer
        .objects()
        .put(&format!("bad/{}/plan.json", bad.id()), b"{\"suite\": ".to_vec())
        .unwrap();
    let ids = vec![good.id().to_string(), bad.id().to_string()];
    let got = Store::with_backend(open("bad")).open_to_read(&ids);
    assert!(got[0].is_ok());
    let err = got[1]
        .as_ref()
        .err()
        .expect("a damaged plan is an error")
        .to_string();
    assert!(err.contains("plan.json"), "{err}");
}

#[test]
fn the_snapshot_of_finished_runs_is_read_once_and_a_newer_state_overrides_it() {
    let Some(_s) = server() else { return };
    let writer = open("snap");
    let store = Store::with_backend(writer.clone());
    let mut runs = Vec::new();
    for _ in 0..17 {
        let mut r = new_run(&store);
        finish(&r, 0, Status::Succeeded);
        finish(&r, 1, Status::Cancelled);
        r.set_state(RunState::Interrupted).unwrap();
        runs.push(r);
    }
    let ids: Vec<String> = runs.iter().map(|r| r.id().to_string()).collect();
    let keys = |s: &S3Store| -> Vec<String> {
        s.objects()
            .list("snap/.orch/reading/")
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect()
    };
    // The first reader reads the runs one by one and writes the snapshot.
    assert!(keys(&writer).is_empty());
    let first = read("snap", &ids);
    assert_eq!(first, shown("snap", &ids));
    let snap = keys(&writer);
    assert_eq!(snap.len(), 1, "{snap:?}");

    // The next reader reads the snapshot: an entry edited in it shows.
    let bytes = writer.objects().get(&snap[0], 0).unwrap().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let entry = &mut v["runs"][&ids[0]];
    let mut cache: serde_json::Value = serde_json::from_str(entry["records"].as_str().unwrap()).unwrap();
    cache["records"][1]["status"] = "succeeded".into();
    entry["records"] = cache.to_string().into();
    writer
        .objects()
        .put(&snap[0], serde_json::to_vec(&v).unwrap())
        .unwrap();
    let got = read("snap", &ids);
    assert_eq!(got[0]["counts"]["succeeded"], 2, "{}", got[0]);
    assert_eq!(got[1..], first[1..]);

    // A run resumed since: its new state is noted, so its entry is not
    // trusted and the new attempt shows.
    let other = open("snap");
    let mut again = Store::with_backend(other.clone()).open_exact(&ids[0]).unwrap();
    again.note_resume().unwrap();
    again.set_state(RunState::Running).unwrap();
    finish(&again, 1, Status::Failed);
    again.set_state(RunState::Complete).unwrap();
    let got = read("snap", &ids);
    assert_eq!(got, shown("snap", &ids));
    assert_eq!(got[0]["counts"]["succeeded"], 1, "{}", got[0]);
    let attempts: Vec<u32> = Store::with_backend(open("snap"))
        .open_to_read(&ids[..1])
        .remove(0)
        .unwrap()
        .all_records()
        .unwrap()
        .into_iter()
        .map(|(r, _)| r.attempt)
        .collect();
    assert!(attempts.contains(&2), "{attempts:?}");
}
