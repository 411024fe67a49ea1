//! `orch run` end to end on the local backend (real agent child processes, real
//! workloads, a real store on disk): the quickstart, user errors, oom, timeout and log
//! truncation, `kill -9` then `--resume`, SIGINT, live phases, a GPU request the host
//! cannot meet.

use crate::support::{cell, json, orch, orch_output, repo, write_suite};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn quickstart_succeeds_with_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = repo().join("manifests/quickstart.yaml");
    let store = tmp.path().join("store");
    let out = orch_output(&[
        "run",
        "-f",
        manifest.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let cells = rec["cells"].as_array().unwrap();
    assert!(cells.len() >= 3);
    for c in cells {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert!(!c["metrics"].as_object().unwrap().is_empty(), "{c}");
        assert!(c["failure"].is_null());
        for phase in ["start", "measure", "teardown"] {
            assert!(c["timings"][phase].as_f64().is_some(), "no {phase} timing in {c}");
        }
    }
    let t = cell(&rec, "transformer.cpu.preset-nano");
    assert!(t["metrics"]["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(t["metrics"]["params"].as_f64().unwrap() > 0.0);
    assert!(t["timings"]["warmup"].as_f64().is_some());

    // `ls --json` and `show --json` agree with the run.
    let ls = json(&orch_output(&[
        "ls",
        "--json",
        "--store",
        store.to_str().unwrap(),
    ]));
    assert_eq!(ls[0]["id"], rec["id"]);
    let show = json(&orch_output(&[
        "show",
        rec["id"].as_str().unwrap(),
        "--json",
        "--store",
        store.to_str().unwrap(),
    ]));
    assert_eq!(show["cells"], rec["cells"]);
    // The run folder holds the resolved manifest and the environment.
    let dir = store.join(rec["id"].as_str().unwrap());
    assert!(dir.join("manifest.yaml").is_file() && dir.join("plan.json").is_file());
    assert!(rec["environment"]["orch_version"].is_string());
}

#[test]
fn unknown_field_exits_2_naming_field_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: t\nbenchmarks:\n  - name: a\n    workload:\n      noop: true\n    measure:\n      warmpu: 1\n",
    );
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        tmp.path().join("s").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("suite.yaml:7:"), "{err}");
    assert!(err.contains("`warmpu`") && err.contains("hint:"), "{err}");
    assert!(
        !tmp.path().join("s").exists(),
        "nothing is stored for an invalid manifest"
    );

    let out = orch_output(&["run", "-f", m.to_str().unwrap(), "--gpu", "H9000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown GPU type `H9000`"));
}

#[test]
fn failing_command_is_failed_with_stderr_in_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: t\nbenchmarks:\n  - name: bad\n    workload:\n      shell: 'echo to-stdout; echo the-cause >&2; exit 3'\n  - name: good\n    workload:\n      noop: true\n",
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let rec = json(&out);
    let bad = cell(&rec, "bad.cpu");
    assert_eq!(bad["status"], "failed");
    assert_eq!(bad["failure"]["exit_code"], 3);
    assert!(bad["failure"]["message"].as_str().unwrap().contains("the-cause"));
    assert_eq!(cell(&rec, "good.cpu")["status"], "succeeded", "the sweep goes on");

    let id = rec["id"].as_str().unwrap();
    let logs = orch_output(&[
        "logs",
        id,
        "bad.cpu",
        "--stream",
        "stderr",
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "the-cause\n");
    let all = orch_output(&["logs", id, "--store", store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.contains("to-stdout") && text.contains("the-cause"), "{text}");
}

#[test]
fn oom_timeout_and_truncation_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: t
logs: {head: 1KiB, tail: 1KiB}
benchmarks:
  - name: big
    memory_limit: 1MiB
    workload:
      transformer: {preset: small, context: 128, batch: 2}
  - name: slow
    measure: {timeout: 1s, kill_grace: 1s}
    workload:
      shell: "trap '' TERM; sleep 30"
  - name: loud
    workload:
      shell: "yes 0123456789 | head -c 3000000; echo; echo last-line"
"#,
    );
    let store = tmp.path().join("s");
    let started = Instant::now();
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "timeout was not enforced"
    );
    assert_eq!(out.status.code(), Some(1));
    let rec = json(&out);
    assert_eq!(cell(&rec, "big.cpu")["status"], "oom");
    assert_eq!(cell(&rec, "slow.cpu")["status"], "timeout");
    let loud = cell(&rec, "loud.cpu");
    assert_eq!(loud["status"], "succeeded");
    let log = std::fs::read_to_string(
        store
            .join(rec["id"].as_str().unwrap())
            .join("cells/loud.cpu/stdout.log"),
    )
    .unwrap();
    assert!(log.len() < 4096, "log kept {} bytes", log.len());
    assert!(
        log.contains("bytes truncated") && log.ends_with("last-line\n"),
        "{log}"
    );
}

fn slow_manifest(dir: &Path) -> PathBuf {
    write_suite(
        dir,
        "name: slow\nbenchmarks:\n  - name: s\n    workload:\n      shell: 'sleep 0.7; echo ORCH_METRIC i={{i}}'\n    matrix:\n      i: [1, 2, 3, 4, 5, 6]\n",
    )
}

fn records(store: &Path) -> Vec<Value> {
    let run = std::fs::read_dir(store).unwrap().next().unwrap().unwrap().path();
    let mut out = vec![];
    for e in std::fs::read_dir(run.join("cells")).unwrap() {
        if let Ok(bytes) = std::fs::read(e.unwrap().path().join("result.json")) {
            out.push(serde_json::from_slice(&bytes).unwrap());
        }
    }
    out
}

#[test]
fn kill_9_then_resume_loses_and_repeats_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = slow_manifest(tmp.path());
    let store = tmp.path().join("s");
    let mut child = orch()
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until two cells are finished, then kill orch mid-cell.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.exists() && records(&store).len() < 2 || !store.exists() {
        assert!(Instant::now() < deadline, "cells never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = records(&store);
    assert!(before.len() >= 2 && before.len() < 6, "{} finished", before.len());

    let out = orch_output(&[
        "run",
        "--resume",
        "latest",
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    assert_eq!(rec["state"], "complete");
    assert!(rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "succeeded"));
    // Every cell finished before the kill is untouched: same record, not run again.
    let after = records(&store);
    assert_eq!(after.len(), 6);
    for b in &before {
        let a = after.iter().find(|a| a["id"] == b["id"]).unwrap();
        assert_eq!(a, b, "a finished cell was run again");
    }
}

#[test]
fn interrupt_records_cancelled_and_resume_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let m = slow_manifest(tmp.path());
    let store = tmp.path().join("s");
    let child = orch()
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.exists() || records(&store).is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    unsafe_sigint(child.id());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    assert_eq!(rec["state"], "interrupted");
    let statuses: Vec<&str> = rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"cancelled"), "{statuses:?}");
    assert!(statuses.contains(&"pending"), "{statuses:?}");

    let out = orch_output(&[
        "run",
        "--resume",
        rec["id"].as_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let rec = json(&out);
    assert!(rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "succeeded"));
}

fn unsafe_sigint(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn live_phases_follow_the_workloads_markers_and_gpu_counts_take_a_colon() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: phases
benchmarks:
  - name: p
    workload:
      shell: "sleep 0.3; echo ORCH_PHASE warmup; sleep 0.1; echo ORCH_PHASE measure; sleep 0.1; echo ORCH_METRIC samples_per_s=5 gpu_energy_j=3"
"#,
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let phases: Vec<&str> = err
        .lines()
        .filter_map(|l| l.trim().strip_prefix("p.cpu "))
        .filter(|l| ["warmup", "measure", "teardown"].contains(l))
        .collect();
    assert_eq!(phases, ["warmup", "measure", "teardown"], "{err}");
    // The workload's own metrics come before telemetry in the table.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("samples_per_s=5 gpu_energy_j=3"), "{text}");

    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--gpu",
        "H100x8",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`H100:8`") && err.contains("hint:"), "{err}");
}

#[test]
fn a_cell_asking_for_more_gpus_than_the_host_has_is_refused_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: big\ngpus: [\"H100:8\", \"H100:2\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let store = tmp.path().join("store");
    let out = orch()
        .env("ORCH_GPUS", "0,1,2,3")
        .args(["run", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cell `hello.h100x8` asks for 8 GPUs"), "{err}");
    assert!(err.contains("this host has 4"), "{err}");
    assert!(err.contains("hint:"), "{err}");
    // Nothing ran and no run was made.
    assert!(std::fs::read_dir(&store).map(|d| d.count() == 0).unwrap_or(true));
    // `plan` says the same.
    let out = orch()
        .env("ORCH_GPUS", "0,1,2,3")
        .args(["plan", "-f"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("asks for 8 GPUs"));
}
