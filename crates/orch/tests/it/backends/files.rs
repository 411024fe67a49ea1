//! The files a suite names travel with its cells (issue 28): the shipped
//! stand-in 3-way comparison (this checkout as its repository, travelling
//! as a git bundle, two local patches) and a server in a local workdir
//! loaded from a local prompt file (`orch_testkit::suites`), run on docker
//! in a Debian image root that holds none of this machine's files, and on
//! a real one-node Slurm cluster through its shared folder: the same
//! statuses, variants and metrics as on `--backend local`, and no host path
//! in the task the agent got. Also `--dry-run`'s listing and the user
//! errors (a missing file, a dirty repository). Kubernetes and Modal have
//! theirs in `kubernetes.rs` and `modal.rs`.

use crate::support::{numpy_or_skip, orch_without_weights, text};
use orch_testkit::{rootfs, skip, suites};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// [`orch_without_weights`] with no prices file of this machine's user and its
/// cache of blobs and bundles in `cache`.
fn orch(cache: &Path) -> Command {
    let mut c = orch_without_weights();
    c.env_remove("ORCH_PRICES").env("ORCH_CACHE_DIR", cache);
    c
}

/// Whether the stand-in server can run on `--backend local` (NumPy), else skipped.
fn numpy() -> bool {
    numpy_or_skip("the stand-in server needs it on `--backend local`")
}

/// `orch run --json` of `manifest` on `backend`; the record.
fn run(backend: &str, manifest: &Path, dir: &Path, extra: &[(&str, &Path)]) -> Value {
    let mut c = orch(&dir.join("cache"));
    for (k, v) in extra {
        c.env(k, v);
    }
    let out = c
        .args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .arg("--store")
        .arg(dir.join(format!("store-{backend}")))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{backend}: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// What must match between backends: each cell's status, its variants'
/// statuses and rounds, and the names of its metrics.
fn shape(record: &Value) -> Vec<(String, String, String, BTreeSet<String>)> {
    record["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let variants = c["info"]["variants"]
                .as_object()
                .map(|vs| {
                    vs.iter()
                        .map(|(k, v)| format!("{k}:{}:{}", v["status"], v["rounds"]))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_default();
            let metrics = c["metrics"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            (
                c["id"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                variants,
                metrics,
            )
        })
        .collect()
}

/// Every `task.json` under `dir`.
fn tasks_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                // A variant's checkout holds no task.
                if p.file_name().is_some_and(|n| n != "variants") {
                    todo.push(p);
                }
            } else if p.file_name().is_some_and(|n| n == "task.json") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap()));
            }
        }
    }
    out
}

/// The task names no folder of this machine's: neither the suite's nor
/// this checkout (where the repository and patches are).
fn assert_no_host_path(task: &str, suite_dir: &Path, what: &str) {
    let task_json: Value = serde_json::from_str(task).unwrap();
    let mut workload = task_json["workload"].to_string();
    workload.push_str(&task_json["files"]["files"].to_string());
    for host in [suite_dir.to_path_buf(), suites::checkout()] {
        // As a JSON string's start: `/orch/files/work/...` may hold it.
        let host = format!("\"{}", host.to_string_lossy());
        assert!(
            !workload.contains(&host),
            "{what}: the task names `{host}`:\n{task}"
        );
    }
    assert!(workload.contains(orch_files::CELL_ROOT), "{what}: {task}");
    assert!(
        task_json["files"]["files"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "{what}: {task}"
    );
}

#[test]
fn the_travelling_suites_run_on_docker_as_on_local() {
    if !rootfs::require_tooling(rootfs::docker_available())
        || !rootfs::require_tooling(rootfs::debootstrap_available())
        || !numpy()
    {
        return;
    }
    let Some(agent) = super::gpu_images::shipped_agent() else {
        return;
    };
    let image = rootfs::debian_image_with("bookworm", suites::PACKAGES).expect("bookworm image");
    let tmp = tempfile::tempdir().unwrap();
    for (name, manifest) in [
        (
            "standin",
            suites::standin_toy(&tmp.path().join("standin"), &image),
        ),
        (
            "workdir",
            suites::workdir_toy(&tmp.path().join("workdir"), &image),
        ),
    ] {
        let dir = tmp.path().join(format!("runs-{name}"));
        let local = run("local", &manifest, &dir, &[]);
        let docker = run("docker", &manifest, &dir, &[("ORCH_AGENT_STATIC", &agent)]);
        assert_eq!(
            shape(&docker),
            shape(&local),
            "{name}: docker {docker}\nlocal {local}"
        );
        for c in docker["cells"].as_array().unwrap() {
            assert_eq!(c["status"], "succeeded", "{name}: {c}");
        }
        let tasks = tasks_under(&dir.join("store-docker"));
        assert!(!tasks.is_empty(), "{name}: no task.json in the docker store");
        for (path, task) in &tasks {
            assert_no_host_path(
                task,
                manifest.parent().unwrap(),
                &format!("{name}: {}", path.display()),
            );
            // `.gitignore`d files stay home.
            assert!(!task.contains("big.bin"), "{name}: {task}");
        }
    }
}

#[test]
fn dry_run_lists_what_travels_and_sends_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = suites::workdir_toy(tmp.path(), "orch-test/none:1");
    let cache = tmp.path().join("cache");
    let out = orch(&cache)
        .args(["run", "--backend", "docker", "--dry-run", "-f"])
        .arg(&manifest)
        .arg("--store")
        .arg(tmp.path().join("store"))
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("nothing is sent"), "{t}");
    assert!(t.contains("/orch/files/bench/server.py"), "{t}");
    assert!(t.contains("/orch/files/prompts.json"), "{t}");
    assert!(t.contains("sha256:"), "{t}");
    assert!(!t.contains("big.bin"), "{t}");
    assert!(!tmp.path().join("store").exists(), "a dry run made a run");

    let out = orch(&cache)
        .args(["run", "--backend", "local", "--dry-run", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("no files travel"), "{}", text(&out));
}

#[test]
fn a_missing_file_or_a_dirty_repository_is_refused_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("missing.yaml");
    std::fs::write(
        &manifest,
        "name: missing\nimage: orch-test/none:1\nbenchmarks:\n  - name: a\n    workload: {command: [python3, run.py], workdir: nowhere}\n",
    )
    .unwrap();
    let out = orch(&cache)
        .args(["run", "--backend", "docker", "-f"])
        .arg(&manifest)
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("the workdir `") && t.contains("nowhere` does not exist"),
        "{t}"
    );
    assert!(t.contains("hint: "), "{t}");

    // A repository with an uncommitted change: refused on every backend
    // (a clone would not carry it), with the way out.
    let repo = tmp.path().join("repo");
    let git = |args: &[&str]| {
        let ok = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    };
    std::fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q"]);
    std::fs::write(repo.join("server.py"), "a = 1\n").unwrap();
    git(&["add", "server.py"]);
    git(&["commit", "-q", "-m", "one"]);
    std::fs::write(repo.join("server.py"), "a = 2\n").unwrap();
    let manifest = tmp.path().join("dirty.yaml");
    std::fs::write(
        &manifest,
        "name: dirty\nbenchmarks:\n  - name: a\n    compare:\n      repo: repo\n      variants: [{name: base}, {name: other}]\n    workload:\n      server:\n        command: [python3, server.py]\n        ready: {tcp: 8000}\n",
    )
    .unwrap();
    for backend in ["local", "docker"] {
        let out = orch(&cache)
            .args(["run", "--backend", backend, "--dry-run", "-f"])
            .arg(&manifest)
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{backend}: {t}");
        assert!(t.contains("uncommitted changes (`server.py`)"), "{backend}: {t}");
        assert!(t.contains("sync: {dirty: patch}"), "{backend}: {t}");
    }
    assert!(!store.exists(), "a refused run made a run");
}

#[test]
fn the_travelling_suites_run_on_slurm_through_the_shared_folder() {
    if let Some(why) = orch_testkit::slurm::unavailable() {
        skip::skip_or_fail(
            &skip::current_test(),
            &format!("needs a Slurm cluster here: {why}"),
        );
        return;
    }
    if !numpy() {
        return;
    }
    let c = orch_testkit::slurm::SlurmCluster::start()
        .unwrap_or_else(|e| panic!("cannot start the test cluster: {e}"));
    let tmp = tempfile::tempdir().unwrap();
    let shared = tmp.path().join("shared");
    for (name, manifest) in [
        (
            "standin",
            suites::standin_toy(&tmp.path().join("standin"), "unused:1"),
        ),
        (
            "workdir",
            suites::workdir_toy(&tmp.path().join("workdir"), "unused:1"),
        ),
    ] {
        let mut text_m = std::fs::read_to_string(&manifest).unwrap();
        text_m.push_str(&format!(
            "slurm: {{shared_dir: {}, partition: gpu}}\n",
            shared.display()
        ));
        std::fs::write(&manifest, text_m).unwrap();
        let dir = tmp.path().join(format!("runs-{name}"));
        let local = run("local", &manifest, &dir, &[]);
        let out = orch(&dir.join("cache"))
            .envs(c.env())
            .args(["run", "--json", "--backend", "slurm", "-f"])
            .arg(&manifest)
            .arg("--store")
            .arg(dir.join("store-slurm"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
        let slurm: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            shape(&slurm),
            shape(&local),
            "{name}: slurm {slurm}\nlocal {local}"
        );
    }
    // The blobs went to the shared folder once; every path of every task
    // is under the shared folder, none in the suites' folders or this
    // checkout.
    let blobs: Vec<_> = std::fs::read_dir(shared.join("blobs"))
        .unwrap()
        .flatten()
        .collect();
    assert!(blobs.len() >= 5, "{blobs:?}");
    let tasks = tasks_under(&shared.join("jobs"));
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for (path, task) in &tasks {
        let v: Value = serde_json::from_str(task).unwrap();
        let mut workload = v["workload"].to_string();
        workload.push_str(&v["files"]["files"].to_string());
        for host in [
            tmp.path().join("standin"),
            tmp.path().join("workdir"),
            suites::checkout(),
        ] {
            let host = format!("\"{}", host.to_string_lossy());
            assert!(
                !workload.contains(&host),
                "{}: names `{host}`: {task}",
                path.display()
            );
        }
        assert!(
            workload.contains(&*shared.to_string_lossy()),
            "{}: {task}",
            path.display()
        );
    }
}
