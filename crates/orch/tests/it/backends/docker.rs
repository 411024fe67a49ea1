//! The docker backend against the real engine of this machine (no registry:
//! the quickstart image is built locally, `FROM scratch` with a static
//! busybox; the agent is a static binary mounted into each container).
//! Needs `bash scripts/prepare-docker.sh` first (CI's `.ci/run` does it);
//! outside CI the tests are skipped when Docker or the static agent is absent.

use crate::support::{container_agent, orch_without_weights, repo, text, wait_for, write_suite};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The quickstart image tag, built if needed; `None` (skip) without Docker.
fn ready() -> Option<String> {
    let docker = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let agent = container_agent();
    let busybox = repo().join("containers/quickstart/busybox");
    if !matches!(docker, Ok(s) if s.success()) {
        eprintln!("note: no Docker engine reachable here; docker tests skipped");
        return None;
    }
    if !(agent.is_file() && busybox.is_file()) {
        orch_testkit::skip::skip_or_fail(
            &orch_testkit::skip::current_test(),
            "Docker is here but not the static agent or busybox: run `bash scripts/prepare-docker.sh` first",
        );
        return None;
    }
    let out = orch_without_weights()
        .args(["build", "-f"])
        .arg(repo().join("manifests/quickstart.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .trim()
            .to_string(),
    )
}

fn containers_of(run: &str) -> Vec<String> {
    let out = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=orch.run={run}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect()
}

fn volumes() -> usize {
    let out = Command::new("docker")
        .args(["volume", "ls", "-q"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn build_twice_then_quickstart_on_docker_leaves_nothing() {
    let Some(_tag) = ready() else { return };
    // The second build makes no build call and is quick.
    let started = Instant::now();
    let out = orch_without_weights()
        .args(["build", "-f"])
        .arg(repo().join("manifests/quickstart.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("up to date"), "{}", text(&out));
    assert!(started.elapsed() < Duration::from_secs(3));

    let vols = volumes();
    let tmp = tempfile::tempdir().unwrap();
    let out = orch_without_weights()
        .args(["run", "--backend", "docker", "--json", "-f"])
        .arg(repo().join("manifests/quickstart.yaml"))
        .arg("--store")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    for c in rec["cells"].as_array().unwrap() {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert!(!c["metrics"].as_object().unwrap().is_empty());
        // Billing starts at the engine's `State.StartedAt` (a time it said).
        let at = c["info"]["container_started_at"]
            .as_str()
            .unwrap_or_else(|| panic!("{c}"));
        assert!(chrono::DateTime::parse_from_rfc3339(at).is_ok(), "{c}");
    }
    assert!(
        containers_of(rec["id"].as_str().unwrap()).is_empty(),
        "containers left behind"
    );
    assert_eq!(volumes(), vols, "stray volumes");
}

fn write(dir: &Path, tag: &str, body: &str) -> PathBuf {
    write_suite(dir, &format!("name: d\nimage: {tag}\nbenchmarks:\n{body}"))
}

#[test]
fn container_killed_from_outside_is_failed_with_logs() {
    let Some(tag) = ready() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = write(
        tmp.path(),
        &tag,
        "  - name: victim\n    workload:\n      shell: 'echo started; echo err-line >&2; sleep 60'\n",
    );
    let store = tmp.path().join("s");
    let child = orch_without_weights()
        .args(["run", "--backend", "docker", "--json", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the workload to start, then kill its container.
    let log = wait_for(
        "the cell never started",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            std::fs::read_dir(&store)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(|e| e.ok())
                .map(|e| e.path().join("cells/victim.cpu/stdout.log"))
                .filter(|p| {
                    std::fs::read_to_string(p)
                        .map(|t| t.contains("started"))
                        .unwrap_or(false)
                })
        },
    );
    let run_id = log
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();
    let ids = containers_of(&run_id);
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(Command::new("docker")
        .args(["kill", &ids[0]])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cell = &rec["cells"][0];
    assert_eq!(cell["status"], "failed", "{cell}");
    // The logs outlived the container.
    let logs = orch_without_weights()
        .args(["logs", &run_id, "victim.cpu", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    let t = text(&logs);
    assert!(t.contains("started") && t.contains("err-line"), "{t}");
    assert!(containers_of(&run_id).is_empty());
}

#[test]
fn memory_limited_cell_that_is_oom_killed_is_oom() {
    let Some(tag) = ready() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = write(
        tmp.path(),
        &tag,
        "  - name: hog\n    memory_limit: 48MiB\n    workload:\n      shell: 'echo before; x=$(head -c 300000000 /dev/zero | tr \"\\\\0\" a); echo after'\n  - name: fine\n    workload: {noop: true}\n",
    );
    let out = orch_without_weights()
        .args(["run", "--backend", "docker", "--json", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(tmp.path().join("s"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    let hog = rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "hog.cpu")
        .unwrap();
    assert_eq!(hog["status"], "oom", "{hog}");
    let fine = rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "fine.cpu")
        .unwrap();
    assert_eq!(fine["status"], "succeeded", "the sweep goes on");
    assert!(containers_of(rec["id"].as_str().unwrap()).is_empty());
}

#[test]
fn failed_build_exits_1_showing_the_failing_step() {
    let Some(_) = ready() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let ctx = tmp.path().join("containers/broken");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(ctx.join("Dockerfile"), "FROM scratch\nCOPY missing-file /x\n").unwrap();
    let m = tmp.path().join("suite.yaml");
    std::fs::write(
        &m,
        "name: b\nimage: {build: broken}\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n",
    )
    .unwrap();
    let out = orch_without_weights()
        .args(["build", "-f"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("Step 2/2 : COPY missing-file /x"), "{t}");
    // A run of a suite whose image is not built refuses before any cell.
    let out = orch_without_weights()
        .args(["run", "--backend", "docker", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(tmp.path().join("s"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("orch build"), "{}", text(&out));
}

#[test]
fn a_suite_that_names_no_image_is_refused_before_the_run() {
    let Some(_tag) = ready() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("suite.yaml");
    std::fs::write(
        &m,
        "name: bare\nbenchmarks:\n  - name: hello\n    workload:\n      shell: 'echo hi'\n",
    )
    .unwrap();
    let out = orch_without_weights()
        .args(["run", "--backend", "docker", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(tmp.path().join("s"))
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("cell `hello") && t.contains("names no `image`"), "{t}");
    assert!(t.contains("hint: add `image: REF`"), "{t}");
    // Refused before the run: no run folder was made.
    assert!(
        !tmp.path().join("s").exists() || std::fs::read_dir(tmp.path().join("s")).unwrap().next().is_none(),
        "{t}"
    );
}
