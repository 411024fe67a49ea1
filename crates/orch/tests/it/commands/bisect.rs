//! `orch bisect` end to end on the local backend (issue 33): a toy
//! repository of 32 commits of the toy OpenAI-compatible server
//! (`scripts/bench-compare/toy_server.py`, its host-side loop off so that a
//! token costs a sleep alone: deterministic enough on a loaded 2-core
//! machine), one commit planting a 10% slowdown and one commit whose server
//! does not start. The bisection finds the planted commit in about
//! log2(32) steps, skips the broken one with its cause, continues after a
//! `kill -9` without redoing finished steps, and says "no significant
//! change" on a flat range. User errors exit 2 with a hint.

use crate::support::{git, json, repo};
use orch_testkit::suites::free_port;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The commit (1-based, commit 0 is the root) that slows every token by 10%.
pub const SLOW_COMMIT: usize = 20;
/// The commit whose server exits before it is ready (fixed by the next).
pub const BROKEN_COMMIT: usize = 15;

/// A repository of 32 commits (0..=31) of the toy server; returns it and
/// the SHA of every commit.
pub fn toy_repo(dir: &Path, commits: usize, slow: usize, broken: Option<usize>) -> (PathBuf, Vec<String>) {
    let repo_dir = dir.join("toy");
    std::fs::create_dir_all(&repo_dir).unwrap();
    let src = std::fs::read_to_string(repo().join("scripts/bench-compare/toy_server.py")).unwrap();
    // A token costs its sleep alone: no CPU loop whose time a busy machine stretches.
    let base = src
        .replacen("WORK = 200 ", "WORK = 0 ", 1)
        .replacen("STEP_MS = 4.0 ", "STEP_MS = 20.0 ", 1);
    assert_ne!(base, src);
    let slowed = base.replacen("STEP_MS = 20.0 ", "STEP_MS = 22.0 ", 1);
    assert_ne!(slowed, base);
    git(&repo_dir, &["init", "-q", "-b", "main"]);
    let mut shas = Vec::new();
    for k in 0..commits {
        let mut s = if k >= slow { slowed.clone() } else { base.clone() };
        if Some(k) == broken {
            s = format!("raise SystemExit(\"this commit's server does not start\")\n{s}");
        }
        s.push_str(&format!("# revision {k}\n"));
        std::fs::write(repo_dir.join("server.py"), s).unwrap();
        git(&repo_dir, &["add", "."]);
        git(&repo_dir, &["commit", "-q", "-m", &format!("revision {k}")]);
        shas.push(git(&repo_dir, &["rev-parse", "HEAD"]).trim().to_string());
    }
    (repo_dir, shas)
}

/// The suite: one comparison of the toy server, small rounds.
pub fn suite(dir: &Path, toy: &Path, port: u16) -> PathBuf {
    let m = dir.join("suite.yaml");
    std::fs::write(
        &m,
        format!(
            r#"
name: toybisect
benchmarks:
  - name: serve
    compare:
      repo: {toy}
      rounds: auto
      max_rounds: 8
      warmup_rounds: 1
      noise: 0.03
      seed: 11
      output_check: {{prompts: 2, max_tokens: 4}}
      variants:
        - {{name: baseline, ref: main, install: "echo installed >> {installs}"}}
        - {{name: latest, ref: main}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
        startup_timeout: 30s
      client:
        loadgen: {{num_prompts: 8, max_concurrency: 4, input_len: 8, output_len: 16, seed: 5}}
"#,
            toy = toy.display(),
            installs = dir.join("installs.log").display()
        ),
    )
    .unwrap();
    m
}

/// [`crate::support::orch`] with its cache and store in `dir`.
fn orch(dir: &Path) -> Command {
    let mut c = crate::support::orch();
    c.env("ORCH_CACHE_DIR", dir.join("cache"))
        .arg("--store")
        .arg(dir.join("store"));
    c
}

fn wait_port_free(port: u16) {
    let t0 = Instant::now();
    while std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "port {port} stays taken");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn finds_the_planted_slowdown_skips_a_broken_commit_and_resumes_after_kill_9() {
    let tmp = tempfile::tempdir().unwrap();
    let (toy, shas) = toy_repo(tmp.path(), 32, SLOW_COMMIT, Some(BROKEN_COMMIT));
    let port = free_port();
    let m = suite(tmp.path(), &toy, port);
    let args = |c: &mut Command| {
        c.args(["bisect", "-f"])
            .arg(&m)
            .args(["--good", &shas[0], "--bad", "main", "--json"]);
    };
    // First invocation: killed (-9) once two steps are in the state file.
    let mut first = orch(tmp.path());
    args(&mut first);
    let log = tmp.path().join("first.log");
    let mut child = first
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let state_dir = tmp.path().join("store/bisect");
    let t0 = Instant::now();
    let before: Value = loop {
        let state = std::fs::read_dir(&state_dir)
            .ok()
            .and_then(|mut d| {
                d.find(|e| {
                    e.as_ref()
                        .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "json"))
                })
            })
            .and_then(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .and_then(|t| serde_json::from_str::<Value>(&t).ok());
        if let Some(s) = state {
            if s["bisection"]["steps"].as_array().unwrap().len() >= 2 {
                break s;
            }
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "orch bisect ended before it was killed:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(t0.elapsed() < Duration::from_secs(120), "no two steps in 120 s");
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    wait_port_free(port);
    let first_runs: Vec<String> = before["bisection"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["run"].as_str().unwrap().to_string())
        .collect();

    // The same command continues.
    let mut again = orch(tmp.path());
    args(&mut again);
    let out = again.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("continuing bisection"), "{stderr}");
    let v = json(&out);
    let outcome = &v["outcome"];
    assert_eq!(outcome["kind"], "culprit", "{v}\n{stderr}");
    assert_eq!(outcome["commit"], shas[SLOW_COMMIT], "{v}\n{stderr}");
    // Its effect: about the planted 10% (the midpoint to the bad ratio decides a step).
    assert!(
        ["slower", "same"].contains(&outcome["effect"]["verdict"].as_str().unwrap()),
        "{outcome}"
    );
    let ratio = outcome["effect"]["ratio"].as_f64().unwrap();
    assert!((0.8..0.96).contains(&ratio), "{outcome}");
    // The bad endpoint itself differs significantly.
    let bad = &v["bisection"]["steps"][0]["effect"];
    assert_eq!(bad["verdict"], "slower", "{bad}");
    assert!(bad["ci_high"].as_f64().unwrap() < 1.0, "{bad}");
    let steps = v["bisection"]["steps"].as_array().unwrap();
    // log2(31) rounded up, the bad endpoint, one skip.
    assert!(steps.len() <= 7, "{} steps: {v}", steps.len());
    // The finished steps of the killed invocation were kept, not redone.
    for (i, r) in first_runs.iter().enumerate() {
        assert_eq!(steps[i]["run"], r.as_str(), "{v}");
    }
    // The broken commit was skipped, with its cause.
    let broken = steps
        .iter()
        .find(|s| s["commit"] == shas[BROKEN_COMMIT])
        .unwrap_or_else(|| panic!("the broken commit was not tried: {v}"));
    assert_eq!(broken["class"], "skip", "{broken}");
    assert!(
        broken["cause"].as_str().is_some_and(|c| !c.is_empty()),
        "{broken}"
    );
    // Each commit is installed once (the install cache of the local
    // backend): the good commit not again in every step. Without the cache
    // each step installs twice.
    let installs = std::fs::read_to_string(tmp.path().join("installs.log"))
        .unwrap_or_default()
        .lines()
        .count();
    let restarted = v["restarted_steps"].as_u64().unwrap_or(0) as usize;
    assert!(
        installs <= steps.len() + 1 + restarted && installs < 2 * steps.len(),
        "{installs} installs for {} steps: {v}",
        steps.len()
    );
    // Every step's run is in the store, with its pair.
    for s in steps {
        let run = s["run"].as_str().unwrap();
        assert!(
            tmp.path().join("store").join(run).join("run.json").is_file(),
            "{run}"
        );
    }
    // Once more: finished, nothing runs.
    let mut done = orch(tmp.path());
    args(&mut done);
    let t1 = Instant::now();
    let out = done.output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(t1.elapsed() < Duration::from_secs(10));
    assert_eq!(
        json(&out)["bisection"]["steps"].as_array().unwrap().len(),
        steps.len()
    );
}

#[test]
fn a_flat_range_is_no_significant_change_and_user_errors_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let (toy, shas) = toy_repo(tmp.path(), 12, 100, None);
    let port = free_port();
    let m = suite(tmp.path(), &toy, port);
    let out = orch(tmp.path())
        .args(["bisect", "-f"])
        .arg(&m)
        .args(["--good", &shas[2], "--bad", &shas[11]])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("no significant change"), "{stdout}\n{stderr}");
    assert!(stderr.contains("step 1:"), "{stderr}");

    let err = |extra: &[&str], want: &str| {
        let out = orch(tmp.path()).arg("bisect").args(extra).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(
            stderr.contains(want) && stderr.contains("hint:"),
            "{extra:?}: {stderr}"
        );
    };
    let f = m.to_str().unwrap();
    err(
        &["-f", f, "--good", "nope", "--bad", "main"],
        "`--good nope`: no such commit",
    );
    err(
        &["-f", f, "--good", "main", "--bad", &shas[0]],
        "is not an ancestor",
    );
    err(
        &["-f", f, "--good", &shas[0], "--bad", "main", "--benchmark", "x"],
        "no such benchmark",
    );
    err(&["--resume", "nosuch"], "no bisection `nosuch`");
    let plain = tmp.path().join("plain.yaml");
    std::fs::write(
        &plain,
        "name: plain\nbenchmarks:\n  - name: hi\n    workload: {command: [echo, hi]}\n",
    )
    .unwrap();
    err(
        &["-f", plain.to_str().unwrap(), "--good", "a", "--bad", "b"],
        "has no `compare:` benchmark",
    );
}
