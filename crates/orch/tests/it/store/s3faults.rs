//! `orch run` on the S3 store through the fault proxy
//! (`orch_testkit::faultproxy`) in front of `moto_server`: outages of 3 s
//! of every kind in the middle of a run (refused, 503 SlowDown, dropped,
//! silent) lose and skip nothing; a silent endpoint is given up within the
//! budget; a long outage keeps finished records on local disk and
//! `--resume` uploads them; an outage that never ends is given up within
//! one budget (exit 3, naming what the store answered, the run left
//! `store_unreachable`); credentials refused mid-run exit 2 with a hint.
//! Under CI=true a missing server fails the test; elsewhere it is skipped.
//! No timing is asserted beyond generous bounds that prove nothing hangs.

use crate::support::{dump, orch_s3};
use orch_store_s3::objects::Settings;
use orch_store_s3::S3Store;
use orch_testkit::faultproxy::{FaultProxy, Mode};
use orch_testkit::s3::{require, S3Server};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn moto() -> Option<S3Server> {
    let s = require(S3Server::moto())?;
    s.create_bucket("team").unwrap();
    Some(s)
}

/// `orch` against the proxy, with short attempts so that a silent
/// request is tried again within seconds.
fn orch(server: &S3Server, proxy: &FaultProxy, work: &Path, extra: &[(&str, &str)]) -> Command {
    let mut c = orch_s3(work);
    c.envs(server.env())
        .env("AWS_ENDPOINT_URL", &proxy.endpoint)
        .env("ORCH_S3_ATTEMPT_TIMEOUT_S", "2")
        .env("ORCH_S3_CONNECT_TIMEOUT_S", "1")
        .envs(extra.iter().copied());
    c
}

fn manifest(dir: &Path, cells: usize, sleep: &str) -> PathBuf {
    let p = dir.join("faults.yaml");
    let values: Vec<String> = (1..=cells).map(|i| i.to_string()).collect();
    std::fs::write(
        &p,
        format!(
            "name: faults\nbenchmarks:\n  - name: s\n    workload:\n      shell: 'sleep {sleep}; echo ORCH_METRIC i={{{{i}}}}'\n    matrix:\n      i: [{}]\n",
            values.join(", ")
        ),
    )
    .unwrap();
    p
}

/// Wait for a child, killing it past `limit` (then the test fails: it hung).
fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("orch hung for {:?}: {}", start.elapsed(), dump(&out));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The run's records read straight from the server: per cell, the
/// statuses of its attempt records, and the cells with a `done` marker.
fn recorded(server: &S3Server, work: &Path, prefix: &str) -> (String, BTreeMap<String, Vec<String>>, usize) {
    let direct = S3Store::open_with(
        &format!("s3://team/{prefix}"),
        Settings {
            endpoint: Some(server.endpoint.clone()),
            credentials: Some((
                orch_testkit::s3::ACCESS_KEY.to_string(),
                orch_testkit::s3::SECRET_KEY.to_string(),
            )),
            ..Settings::default()
        },
    )
    .unwrap();
    let _ = work;
    let o = direct.objects();
    let runs = o.list_dirs(&format!("{prefix}/")).unwrap();
    let runs: Vec<&String> = runs.iter().filter(|r| !r.contains("/.")).collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let base = runs[0].clone();
    let id = base[prefix.len() + 1..].trim_end_matches('/').to_string();
    let mut per_cell: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in o.list(&format!("{base}records/")).unwrap() {
        let rest = &l.key[base.len() + "records/".len()..];
        let cell = rest.split('/').next().unwrap().to_string();
        let rec: Value = serde_json::from_slice(&o.get(&l.key, 0).unwrap().unwrap()).unwrap();
        per_cell
            .entry(cell)
            .or_default()
            .push(rec["status"].as_str().unwrap_or("?").to_string());
    }
    let done = o.list(&format!("{base}done/")).unwrap().len();
    (id, per_cell, done)
}

#[test]
fn outages_of_every_kind_in_a_run_lose_and_skip_no_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = moto() else { return };
    let proxy = FaultProxy::start(&server.endpoint).unwrap();
    let m = manifest(tmp.path(), 30, "0.5");
    let work = tmp.path().join("w");
    let child = orch(&server, &proxy, &work, &[])
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            "s3://team/o",
            "-j",
            "2",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let s = Duration::from_secs;
    let timetable = proxy.schedule(vec![
        (s(2), Mode::Refuse),
        (s(3), Mode::Pass),
        (s(1), Mode::SlowDown),
        (s(3), Mode::Pass),
        (s(1), Mode::Drop),
        (s(3), Mode::Pass),
        (s(1), Mode::Silent),
        (s(3), Mode::Pass),
    ]);
    let out = wait_bounded(child, s(300));
    timetable.join().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    for mode in [Mode::SlowDown, Mode::Drop, Mode::Silent] {
        assert!(
            proxy.count(mode) > 0,
            "the {mode:?} outage met no request: {}",
            dump(&out)
        );
    }
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["state"], "complete", "{}", dump(&out));
    let cells = rec["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 30);
    assert!(cells.iter().all(|c| c["status"] == "succeeded"), "{rec}");
    let (_, per_cell, done) = recorded(&server, &work, "o");
    assert_eq!(done, 30);
    assert_eq!(per_cell.len(), 30, "{per_cell:?}");
    for (cell, statuses) in &per_cell {
        assert_eq!(
            statuses,
            &vec!["succeeded".to_string()],
            "{cell} ran more than once"
        );
    }
}

#[test]
fn a_silent_endpoint_fails_within_the_budget_not_after_minutes() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = moto() else { return };
    let proxy = FaultProxy::start(&server.endpoint).unwrap();
    proxy.set(Mode::Silent);
    let child = orch(
        &server,
        &proxy,
        &tmp.path().join("w"),
        &[("ORCH_S3_TIMEOUT_S", "5")],
    )
    .args(["ls", "--store", "s3://team/x"])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let out = wait_bounded(child, Duration::from_secs(120));
    assert_ne!(out.status.code(), Some(0), "{}", dump(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no reply within 2 s ×") && err.contains("hint:"),
        "{}",
        dump(&out)
    );
    assert_eq!(out.status.code(), Some(3), "{}", dump(&out));
    assert!(proxy.count(Mode::Silent) >= 2, "not retried: {}", dump(&out));
}

#[test]
fn a_long_outage_keeps_finished_records_and_resume_uploads_them() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = moto() else { return };
    let proxy = FaultProxy::start(&server.endpoint).unwrap();
    let m = manifest(tmp.path(), 10, "0.5");
    let work = tmp.path().join("w");
    let short = [("ORCH_S3_TIMEOUT_S", "3")];
    let child = orch(&server, &proxy, &work, &short)
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            "s3://team/l",
            "-j",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Up for 2 s (some cells recorded), then away for longer than any
    // retry budget while cells finish.
    let timetable = proxy.schedule(vec![(Duration::from_secs(2), Mode::Refuse)]);
    let first = wait_bounded(child, Duration::from_secs(300));
    timetable.join().unwrap();
    let all = dump(&first);
    assert!(all.contains("is kept at"), "no record was kept: {all}");
    // `<work>/<bucket>/<prefix>/.spool/<run>/`.
    let spool = find_spool(&work).unwrap_or_else(|| work.join(".spool"));
    assert!(
        std::fs::read_dir(&spool)
            .map(|d| d
                .flatten()
                .map(|e| std::fs::read_dir(e.path()).map_or(1, |r| r.count()))
                .sum::<usize>())
            .unwrap_or(0)
            > 0,
        "nothing in {}: {all}",
        spool.display()
    );
    proxy.set(Mode::Pass);
    let out = wait_bounded(
        orch(&server, &proxy, &work, &short)
            .args(["run", "--resume", "latest", "--store", "s3://team/l", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(300),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "first:\n{all}\nresume:\n{}",
        dump(&out)
    );
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rec["state"], "complete", "{}", dump(&out));
    let (_, per_cell, done) = recorded(&server, &work, "l");
    assert_eq!(done, 10, "{per_cell:?}");
    for (cell, statuses) in &per_cell {
        let ok = statuses.iter().filter(|s| *s == "succeeded").count();
        assert_eq!(ok, 1, "{cell}: {statuses:?}\nfirst:\n{all}");
    }
    assert!(
        std::fs::read_dir(&spool).map(|d| d.count()).unwrap_or(0) == 0,
        "records left in {}",
        spool.display()
    );
}

#[test]
fn an_outage_that_never_ends_is_given_up_within_one_budget_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = moto() else { return };
    let proxy = FaultProxy::start(&server.endpoint).unwrap();
    let m = manifest(tmp.path(), 12, "0.5");
    let work = tmp.path().join("w");
    let budget = 8;
    let short = [("ORCH_S3_TIMEOUT_S", "8")];
    let child = orch(&server, &proxy, &work, &short)
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            "s3://team/n",
            "-j",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Up for 2 s, then `503 SlowDown` to every request, for good.
    std::thread::sleep(Duration::from_secs(2));
    proxy.set(Mode::SlowDown);
    let outage = Instant::now();
    let out = wait_bounded(child, Duration::from_secs(300));
    let took = outage.elapsed();
    let all = dump(&out);
    // One budget for the whole give-up (record uploads, the next cells'
    // claims, the spooled records, the final state), not one each.
    assert!(
        took < Duration::from_secs(2 * budget),
        "given up {took:?} after the outage began, budget {budget} s: {all}"
    );
    assert_eq!(out.status.code(), Some(3), "a store outage exits 3: {all}");
    let err = String::from_utf8_lossy(&out.stderr);
    // What the store answered, not the SDK's words.
    assert!(err.contains("`503 SlowDown` ×"), "{all}");
    for internal in [
        "did not answer",
        "service error",
        "DispatchFailure",
        "unhandled error",
    ] {
        assert!(!err.contains(internal), "`{internal}` in: {all}");
    }
    assert!(!err.contains(orch_testkit::s3::SECRET_KEY), "{all}");
    // Where what was not written is kept, and how it goes up.
    assert!(
        err.contains("is kept at") && err.contains("orch run --resume"),
        "{all}"
    );
    assert!(err.contains("hint:"), "{all}");
    // The stopped state is kept on this host, and written on the next access.
    let spool = find_spool(&work).expect("a spool");
    let kept = std::fs::read_dir(&spool)
        .unwrap()
        .flatten()
        .any(|run| run.path().join("state.pending").is_file());
    assert!(kept, "no state kept in {}: {all}", spool.display());
    proxy.set(Mode::Pass);
    let show = orch(&server, &proxy, &work, &short)
        .args(["show", "latest", "--store", "s3://team/n", "--json"])
        .output()
        .unwrap();
    let rec: Value = serde_json::from_slice(&show.stdout).unwrap_or_else(|e| panic!("{e}: {}", dump(&show)));
    assert_eq!(rec["state"], "store_unreachable", "{}", dump(&show));
    let ls = orch(&server, &proxy, &work, &short)
        .args(["ls", "--store", "s3://team/n"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("store_unreachable"),
        "{}",
        dump(&ls)
    );
    // And the run resumes to the end, nothing lost or run twice.
    let out = wait_bounded(
        orch(&server, &proxy, &work, &short)
            .args(["run", "--resume", "latest", "--store", "s3://team/n", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(300),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "first:\n{all}\nresume:\n{}",
        dump(&out)
    );
    let (_, per_cell, done) = recorded(&server, &work, "n");
    assert_eq!(done, 12, "{per_cell:?}");
    for (cell, statuses) in &per_cell {
        let ok = statuses.iter().filter(|s| *s == "succeeded").count();
        assert_eq!(ok, 1, "{cell}: {statuses:?}\nfirst:\n{all}");
    }
}

#[test]
fn credentials_refused_in_the_middle_of_a_run_exit_2_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = moto() else { return };
    let proxy = FaultProxy::start(&server.endpoint).unwrap();
    let m = manifest(tmp.path(), 20, "0.3");
    let child = orch(&server, &proxy, &tmp.path().join("w"), &[])
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            "s3://team/d",
            "-j",
            "2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let timetable = proxy.schedule(vec![(Duration::from_secs(2), Mode::Deny)]);
    let out = wait_bounded(child, Duration::from_secs(300));
    timetable.join().unwrap();
    assert!(proxy.count(Mode::Deny) > 0, "{}", dump(&out));
    assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`team`") && err.contains("refused") && err.contains("hint:"),
        "{}",
        dump(&out)
    );
}

/// The spool folder under a working folder, wherever the bucket and
/// prefix put it.
fn find_spool(dir: &Path) -> Option<PathBuf> {
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == ".spool") {
                return Some(p);
            }
            if let Some(found) = find_spool(&p) {
                return Some(found);
            }
        }
    }
    None
}
