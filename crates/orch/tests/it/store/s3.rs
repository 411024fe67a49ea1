//! The `orch` binary with `--store s3://...` against real S3-compatible
//! servers started here: `s3s-fs` (SigV4 checked) for the functional tests,
//! `moto_server` (atomic conditional writes) for racing writers, and a
//! proxy that drops `If-None-Match` for a server that ignores it. Under
//! CI=true a missing server fails the test; elsewhere it is skipped.

use crate::support::{dump, json, orch_s3, repo};
use orch_testkit::s3::{require, IgnoringProxy, S3Server, ACCESS_KEY, SECRET_KEY};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// [`orch_s3`] with `env` (a server's endpoint and credentials) on top.
fn orch(env: &[(&'static str, String)], work: &Path) -> Command {
    let mut c = orch_s3(work);
    c.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    c
}

fn s3s(tmp: &Path) -> Option<S3Server> {
    let s = require(S3Server::s3s_fs(&tmp.join("s3root")))?;
    s.create_bucket("team").unwrap();
    Some(s)
}

fn slow_manifest(dir: &Path, cells: usize) -> PathBuf {
    let p = dir.join("slow.yaml");
    let values: Vec<String> = (1..=cells).map(|i| i.to_string()).collect();
    std::fs::write(
        &p,
        format!(
            "name: slow\nbenchmarks:\n  - name: s\n    workload:\n      shell: 'sleep 0.7; echo ORCH_METRIC i={{{{i}}}}'\n    matrix:\n      i: [{}]\n",
            values.join(", ")
        ),
    )
    .unwrap();
    p
}

/// `done/*.json` objects of the only run under `prefix` in an s3s-fs root.
fn done_objects(root: &Path, prefix: &str) -> Vec<(String, Vec<u8>)> {
    let base = root.join("s3root/team").join(prefix);
    let Ok(runs) = std::fs::read_dir(&base) else {
        return vec![];
    };
    let mut out = vec![];
    for r in runs.flatten() {
        if r.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        for e in std::fs::read_dir(r.path().join("done"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".json") {
                out.push((name, std::fs::read(e.path()).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn quickstart_on_s3_is_read_back_by_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = s3s(tmp.path()) else { return };
    let env = server.env();
    let work = tmp.path().join("work");
    let store = "s3://team/x";
    let manifest = repo().join("manifests/quickstart.yaml");
    let out = orch(&env, &work)
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--store",
            store,
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let rec = json(&out);
    let id = rec["id"].as_str().unwrap().to_string();
    let cells = rec["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    assert!(cells.iter().all(|c| c["status"] == "succeeded"), "{rec}");
    assert_eq!(
        done_objects(tmp.path(), "x").len(),
        4,
        "one finished record per cell"
    );

    // Another machine: another working folder, the same bucket (ORCH_STORE).
    let other = tmp.path().join("elsewhere");
    let read = |args: &[&str]| {
        orch(&env, &other)
            .env("ORCH_STORE", store)
            .current_dir(tmp.path())
            .args(args)
            .output()
            .unwrap()
    };
    let ls = read(&["ls", "--json"]);
    assert_eq!(ls.status.code(), Some(0), "{}", dump(&ls));
    let runs = json(&ls);
    assert_eq!(runs[0]["id"], id.as_str());
    assert_eq!(runs[0]["counts"]["succeeded"], 4, "{runs}");
    assert_eq!(runs[0]["state"], "complete");

    let show = read(&["show", &id, "--json"]);
    assert_eq!(show.status.code(), Some(0), "{}", dump(&show));
    let shown = json(&show);
    assert_eq!(shown["cells"], rec["cells"]);

    let logs = read(&["logs", &id, "command.cpu", "--stream", "stdout"]);
    assert_eq!(logs.status.code(), Some(0), "{}", dump(&logs));
    assert!(
        String::from_utf8_lossy(&logs.stdout).contains("hello from command.cpu"),
        "{}",
        dump(&logs)
    );
    let tail = read(&["logs", &id, "command.cpu", "--stream", "stdout", "--tail", "1"]);
    assert_eq!(
        String::from_utf8_lossy(&tail.stdout).lines().count(),
        1,
        "{}",
        dump(&tail)
    );

    let report = read(&["report", &id, "--format", "md"]);
    assert_eq!(report.status.code(), Some(0), "{}", dump(&report));
    assert!(String::from_utf8_lossy(&report.stdout).contains(&id));

    let cost = read(&["cost", "--json"]);
    assert_eq!(cost.status.code(), Some(0), "{}", dump(&cost));
    let c = json(&cost);
    assert_eq!(c["store"], store);
    assert_eq!(c["total"]["cells"], 4, "{c}");

    let down = read(&["down", &id]);
    assert_eq!(down.status.code(), Some(0), "{}", dump(&down));
    let compare = read(&["compare", &id, &id, "--json"]);
    assert_eq!(compare.status.code(), Some(0), "{}", dump(&compare));

    // Nothing the server was given holds the secret.
    let mut stack = vec![tmp.path().join("s3root")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                let b = std::fs::read(e.path()).unwrap();
                assert!(
                    !String::from_utf8_lossy(&b).contains(SECRET_KEY),
                    "{} holds the secret",
                    e.path().display()
                );
            }
        }
    }
}

#[test]
fn kill_9_then_resume_from_another_folder_loses_and_reruns_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = s3s(tmp.path()) else { return };
    let env = server.env();
    let m = slow_manifest(tmp.path(), 6);
    let mut child = orch(&env, &tmp.path().join("w1"))
        .args(["run", "-f", m.to_str().unwrap(), "--store", "s3://team/k"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while done_objects(tmp.path(), "k").len() < 2 {
        assert!(Instant::now() < deadline, "cells never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = done_objects(tmp.path(), "k");
    assert!(before.len() >= 2 && before.len() < 6, "{} finished", before.len());

    let elsewhere = tempfile::tempdir().unwrap();
    let out = orch(&env, &tmp.path().join("w2"))
        .current_dir(elsewhere.path())
        .args(["run", "--resume", "latest", "--store", "s3://team/k", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let rec = json(&out);
    assert_eq!(rec["state"], "complete");
    let after = done_objects(tmp.path(), "k");
    assert_eq!(after.len(), 6);
    for b in &before {
        assert!(after.contains(b), "the finished cell {} was run again", b.0);
    }
    // One ledger line per recorded attempt: nothing recorded twice.
    let cost = orch(&env, &tmp.path().join("w2"))
        .args(["cost", "--json", "--store", "s3://team/k"])
        .output()
        .unwrap();
    assert_eq!(json(&cost)["total"]["cells"], 6, "{}", dump(&cost));
}

#[test]
fn a_second_resume_is_refused_naming_the_cells_and_the_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = require(S3Server::moto()) else {
        return;
    };
    server.create_bucket("team").unwrap();
    let env = server.env();
    let m = slow_manifest(tmp.path(), 8);
    // Start a run and kill it as soon as it exists.
    let mut child = orch(&env, &tmp.path().join("w0"))
        .args(["run", "-f", m.to_str().unwrap(), "--store", "s3://team/r"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ls = orch(&env, &tmp.path().join("w0"))
            .args(["ls", "--json", "--store", "s3://team/r"])
            .output()
            .unwrap();
        if ls.status.success() && json(&ls).as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the run never appeared: {}", dump(&ls));
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Two resumes at once, as from two machines.
    let spawn = |w: &str| {
        orch(&env, &tmp.path().join(w))
            .args(["run", "--resume", "latest", "--store", "s3://team/r", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let a = spawn("wa");
    // The second a second or two later, as a user trying again would.
    std::thread::sleep(Duration::from_millis(1500));
    let b = spawn("wb");
    let a_pid = a.id();
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    // The first holds the run and runs it all; the second is refused
    // before it runs anything, naming the holder and its cells.
    assert_eq!(a.status.code(), Some(0), "{}", dump(&a));
    assert_eq!(b.status.code(), Some(2), "{}", dump(&b));
    let err = String::from_utf8_lossy(&b.stderr);
    assert!(
        err.contains("is being written by another orch")
            && err.contains(&format!("pid {a_pid}"))
            && err.contains("without a record: `s.")
            && err.contains("hint:"),
        "{err}"
    );
    let show = orch(&env, &tmp.path().join("w0"))
        .args(["show", "latest", "--json", "--store", "s3://team/r"])
        .output()
        .unwrap();
    let rec = json(&show);
    assert!(
        rec["cells"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["status"] == "succeeded"),
        "{rec}"
    );
    // Each cell recorded once: one ledger line per cell, no earlier attempt
    // with a record (the killed run's cell, if any, left no record).
    let cost = orch(&env, &tmp.path().join("w0"))
        .args(["cost", "--json", "--store", "s3://team/r"])
        .output()
        .unwrap();
    assert_eq!(json(&cost)["total"]["cells"], 8, "{}", dump(&cost));
}

#[test]
fn resumes_started_at_once_run_the_cells_once_with_one_holder() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = require(S3Server::moto()) else {
        return;
    };
    server.create_bucket("team").unwrap();
    let env = server.env();
    let m = slow_manifest(tmp.path(), 4);
    let first = orch(&env, &tmp.path().join("w0"))
        .args(["run", "-f", m.to_str().unwrap(), "--store", "s3://team/q"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", dump(&first));
    let spawn = |w: &str| {
        orch(&env, &tmp.path().join(w))
            .args(["run", "--resume", "latest", "--store", "s3://team/q"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("wa"), spawn("wb"));
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    // Nothing left to run: both may end at once, or one is refused while
    // the other holds the run; never both refused.
    let codes = [a.status.code(), b.status.code()];
    assert!(codes.contains(&Some(0)), "{}\n{}", dump(&a), dump(&b));
    assert!(
        codes.iter().all(|c| matches!(c, Some(0 | 2))),
        "{}\n{}",
        dump(&a),
        dump(&b)
    );
}

#[test]
fn a_server_that_ignores_conditional_writes_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = require(S3Server::moto()) else {
        return;
    };
    server.create_bucket("team").unwrap();
    let proxy = IgnoringProxy::start(&server.endpoint).unwrap();
    let mut env = server.env();
    for (k, v) in env.iter_mut() {
        if *k == "AWS_ENDPOINT_URL" {
            *v = proxy.endpoint.clone();
        }
    }
    let m = slow_manifest(tmp.path(), 1);
    let out = orch(&env, &tmp.path().join("w"))
        .args(["run", "-f", m.to_str().unwrap(), "--store", "s3://team/i"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ignores conditional writes") && err.contains("hint:"),
        "{err}"
    );
    // The explicit opt-in runs, with a warning.
    let out = orch(&env, &tmp.path().join("w"))
        .env(orch_store_s3::UNCONDITIONAL_ENV, "1")
        .args(["run", "-f", m.to_str().unwrap(), "--store", "s3://team/i"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("warning:"),
        "{}",
        dump(&out)
    );
}

#[test]
fn wrong_credentials_exit_2_naming_the_bucket_and_the_source() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = s3s(tmp.path()) else { return };
    let mut env = server.env();
    let wrong = "wrong-secret-that-must-not-be-printed";
    for (k, v) in env.iter_mut() {
        if *k == "AWS_SECRET_ACCESS_KEY" {
            *v = wrong.into();
        }
    }
    let out = orch(&env, &tmp.path().join("w"))
        .args(["ls", "--store", "s3://team/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
    let all = dump(&out);
    assert!(
        all.contains("`team`") && all.contains("AWS_ACCESS_KEY_ID") && all.contains("hint:"),
        "{all}"
    );
    assert!(!all.contains(wrong) && !all.contains(SECRET_KEY), "{all}");
    // A bucket that does not exist is named too.
    let out = orch(&server.env(), &tmp.path().join("w"))
        .args(["ls", "--store", "s3://nope-bucket/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
    assert!(dump(&out).contains("nope-bucket"), "{}", dump(&out));
}

/// Keys, region and endpoint from a named profile (`AWS_PROFILE`, the
/// config and credentials files), none in the environment: the standard
/// chain as a team member's laptop has it. A wrong secret in the profile
/// is named by its profile and never shown.
#[test]
fn a_named_profile_gives_keys_region_and_endpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = s3s(tmp.path()) else { return };
    let aws = tmp.path().join("aws");
    std::fs::create_dir_all(&aws).unwrap();
    let config = aws.join("config");
    let credentials = aws.join("credentials");
    std::fs::write(
        &config,
        format!(
            "[profile bench-team]\nregion = eu-west-1\nendpoint_url = {}\n",
            server.endpoint
        ),
    )
    .unwrap();
    let profile_orch = |secret: &str| {
        std::fs::write(
            &credentials,
            format!("[bench-team]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {secret}\n"),
        )
        .unwrap();
        let mut c = orch(&[], &tmp.path().join("w"));
        for k in [
            "AWS_ENDPOINT_URL",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
        ] {
            c.env_remove(k);
        }
        c.env("AWS_PROFILE", "bench-team")
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_EC2_METADATA_DISABLED", "true");
        c
    };
    let out = profile_orch(SECRET_KEY)
        .args(["ls", "--store", "s3://team/x", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    assert!(!dump(&out).contains(SECRET_KEY), "{}", dump(&out));

    let wrong = "profile-secret-that-must-not-be-printed";
    let out = profile_orch(wrong)
        .args(["ls", "--store", "s3://team/x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", dump(&out));
    let all = dump(&out);
    assert!(all.contains("`team`") && all.contains("`bench-team`"), "{all}");
    assert!(!all.contains(wrong), "{all}");
}

#[test]
fn push_then_pull_round_trip_and_logs_follow_a_running_cell() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(server) = s3s(tmp.path()) else { return };
    let env = server.env();
    let local = tmp.path().join("local");
    let m = slow_manifest(tmp.path(), 2);
    let out = orch(&env, &tmp.path().join("w"))
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            local.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", dump(&out));
    let id = json(&out)["id"].as_str().unwrap().to_string();
    let push = orch(&env, &tmp.path().join("w"))
        .args([
            "push",
            &id,
            "--to",
            "s3://team/p",
            "--store",
            local.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(push.status.code(), Some(0), "{}", dump(&push));
    let show = |store: &str| {
        let o = orch(&env, &tmp.path().join("w"))
            .args(["show", &id, "--json", "--store", store])
            .output()
            .unwrap();
        let mut v = json(&o);
        v["updated_at"] = Value::Null;
        v
    };
    assert_eq!(
        show("s3://team/p")["cells"],
        show(local.to_str().unwrap())["cells"]
    );
    let back = tmp.path().join("back");
    let pull = orch(&env, &tmp.path().join("w"))
        .args([
            "pull",
            &id,
            "--from",
            "s3://team/p",
            "--store",
            back.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(pull.status.code(), Some(0), "{}", dump(&pull));
    assert_eq!(
        show(back.to_str().unwrap())["cells"],
        show(local.to_str().unwrap())["cells"]
    );
    for c in ["s.cpu.i-1", "s.cpu.i-2"] {
        let a = std::fs::read(local.join(&id).join("cells").join(c).join("stdout.log")).unwrap();
        let b = std::fs::read(back.join(&id).join("cells").join(c).join("stdout.log")).unwrap();
        assert_eq!(a, b);
    }

    // `orch logs -f` from another working folder follows a running cell.
    let talk = tmp.path().join("talk.yaml");
    std::fs::write(
        &talk,
        "name: talk\nbenchmarks:\n  - name: t\n    workload:\n      shell: 'for i in 1 2 3 4 5 6; do echo line$i; sleep 1; done'\n",
    )
    .unwrap();
    let started = Instant::now();
    let mut run = orch(&env, &tmp.path().join("w3"))
        .args(["run", "-f", talk.to_str().unwrap(), "--store", "s3://team/f"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the run to exist, then follow from elsewhere.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ls = orch(&env, &tmp.path().join("w4"))
            .args(["ls", "--json", "--store", "s3://team/f"])
            .output()
            .unwrap();
        if ls.status.success() && json(&ls).as_array().is_some_and(|a| !a.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "{}", dump(&ls));
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut follow = orch(&env, &tmp.path().join("w4"))
        .args([
            "logs",
            "latest",
            "t.cpu",
            "--stream",
            "stdout",
            "-f",
            "--store",
            "s3://team/f",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = follow.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut seen = vec![];
        for line in std::io::BufReader::new(stdout).lines() {
            seen.push((line.unwrap(), started.elapsed()));
        }
        seen
    });
    let run_status = run.wait().unwrap();
    let ended = started.elapsed();
    assert!(run_status.success());
    let seen = reader.join().unwrap();
    follow.wait().unwrap();
    let lines: Vec<&str> = seen.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(lines, ["line1", "line2", "line3", "line4", "line5", "line6"]);
    assert!(
        seen[0].1 + Duration::from_secs(2) < ended,
        "the first line came only at the end: {seen:?} (run ended {ended:?})"
    );
}
