//! `--backend modal` end to end against `FakeModal` (orch-testkit): a local
//! server speaking Modal's gRPC protocol that builds each image from its
//! Dockerfile steps into a root folder and runs each sandbox's entrypoint
//! there (a mount namespace and chroot, as a runtime would), so the static
//! agent runs in the cell's image and ships its frames home over the
//! sandbox's stdout. No network to Modal, but root is (and
//! `bash scripts/prepare-docker.sh`'s static agent and busybox): without them
//! the tests are skipped with a note, except under `CI=true`.
//!
//! Registry images: `debian:bookworm-slim` is busybox with this host's glibc
//! 2.36 runtime (Debian 12's: what that image carries), `python:3.11-slim`
//! the same with a CA bundle (less Python), where the setup sandbox's
//! dynamically linked `orch` runs; `{build: quickstart}` is built from
//! `containers/quickstart/Dockerfile` (FROM scratch, the static busybox).
//! A Dockerfile's context travels as Modal's official client sends it: a
//! context mount, its files of 4 MiB or more as blobs (multipart when the
//! fake asks for it), never inline in `ImageGetOrCreate`.

use crate::support::{cell, container_agent, json, repo, write_suite};
use orch_testkit::modal::FakeModal;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN_SECRET: &str = "as-NEVER-PRINT-THIS-0042";

fn ready() -> bool {
    crate::support::containers_ready("modal tests")
}

/// The fake, with the registry images these tests use.
fn fake_modal() -> FakeModal {
    let glibc = orch_testkit::container::glibc_root().unwrap();
    FakeModal::builder()
        .image("debian:bookworm-slim", &glibc)
        .image(
            "python:3.11-slim",
            orch_testkit::container::glibc_ca_root().unwrap(),
        )
        .start()
        .unwrap()
}

/// [`crate::support::orch`] at the fake, with its token and the static agent.
fn orch(fake: &FakeModal, tmp: &Path) -> Command {
    let mut c = crate::support::orch();
    c.env_remove("MODAL_PROFILE")
        .env("HOME", tmp)
        .env("MODAL_SERVER_URL", fake.url())
        .env("MODAL_TOKEN_ID", "ak-test")
        .env("MODAL_TOKEN_SECRET", TOKEN_SECRET)
        .env("ORCH_AGENT_STATIC", container_agent())
        .env("ORCH_MODAL_SCHEDULE_TIMEOUT", "2");
    c
}

fn run(fake: &FakeModal, tmp: &Path, manifest: &Path, extra: &[&str]) -> (Output, Value) {
    let out = orch(fake, tmp)
        .args(["run", "-f"])
        .arg(manifest)
        .args(["--backend", "modal", "--store"])
        .arg(tmp.join("store"))
        .arg("--json")
        .args(extra)
        .output()
        .unwrap();
    let v = json(&out);
    assert_no_token(&out, &tmp.join("store"));
    (out, v)
}

/// The token secret is in no output and no file of the store.
fn assert_no_token(out: &Output, store: &Path) {
    assert!(!String::from_utf8_lossy(&out.stdout).contains(TOKEN_SECRET));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(TOKEN_SECRET));
    fn walk(p: &Path) {
        if p.is_dir() {
            for e in std::fs::read_dir(p).unwrap() {
                walk(&e.unwrap().path());
            }
        } else if let Ok(b) = std::fs::read(p) {
            assert!(
                !String::from_utf8_lossy(&b).contains(TOKEN_SECRET),
                "the token is in {}",
                p.display()
            );
        }
    }
    walk(store);
}

fn cell_dir(tmp: &Path, record: &Value, id: &str) -> PathBuf {
    tmp.join("store")
        .join(record["id"].as_str().unwrap())
        .join("cells")
        .join(id)
}

#[test]
fn quickstart_runs_in_sandboxes_with_logs_home() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    let tmp = tempfile::tempdir().unwrap();
    let (out, rec) = run(&fake, tmp.path(), &repo().join("manifests/quickstart.yaml"), &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(rec["backend"], "modal");
    for c in rec["cells"].as_array().unwrap() {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert!(
            c["info"]["modal_sandbox_id"].as_str().unwrap().starts_with("sb-"),
            "{c}"
        );
    }
    let cmd = cell(&rec, "command.cpu");
    assert!(cmd["metrics"]["md5_mib"].as_f64().is_some(), "{cmd}");
    let dir = cell_dir(tmp.path(), &rec, "command.cpu");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(stdout.contains("hello from command.cpu"), "{stdout}");
    assert!(dir.join("events.jsonl").is_file());
    // One sandbox per cell, tagged; every one ended; the agent went up once,
    // the image's context (its `COPY busybox`) as a mount of its own.
    let sbs = fake.sandboxes();
    assert_eq!(sbs.len(), rec["cells"].as_array().unwrap().len());
    assert!(sbs
        .iter()
        .all(|s| s.tags.get("orch.run") == rec["id"].as_str().map(String::from).as_ref()));
    assert!(fake.running().is_empty());
    assert_eq!(fake.count("MountGetOrCreate"), 2);
    assert!(fake
        .image_contexts()
        .iter()
        .all(|c| !c.mount_id.is_empty() && c.files.iter().all(|f| !f.inline)));
    assert!(fake
        .calls()
        .iter()
        .all(|c| c.token_id.as_deref() == Some("ak-test")));
    // Idempotency keys on unary calls.
    assert!(fake
        .calls()
        .iter()
        .filter(|c| c.method == "SandboxCreate")
        .all(|c| c.idempotency_key.is_some()));
}

#[test]
fn a_server_cell_runs_and_transient_errors_are_retried() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| {
        s.transient_failures = 3;
        s.drop_log_streams = true;
    });
    let tmp = tempfile::tempdir().unwrap();
    let port = 19000 + (std::process::id() % 1000) as u16;
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: srv
image: python:3.11-slim
benchmarks:
  - name: ok
    workload:
      server:
        command: [sh, -c, 'echo ok > /tmp/index.html; exec httpd -f -p 127.0.0.1:{port} -h /tmp']
        ready: {{http: /, port: {port}}}
        startup_timeout: 30s
      client:
        shell: 'for i in $(seq 1 200); do echo "line $i of the client"; done; echo ORCH_METRIC requests=1'
"#
        ),
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = cell(&rec, "ok.cpu");
    assert_eq!(c["status"], "succeeded", "{c}");
    assert_eq!(c["metrics"]["requests"], 1.0);
    // The log stream was dropped after every batch and resumed from the last entry id.
    assert!(fake.count("SandboxGetLogs") > 3);
    let retried = fake
        .calls()
        .iter()
        .filter(|c| c.retry_attempt.as_deref() == Some("1"))
        .count();
    assert!(retried >= 1, "a transient UNAVAILABLE is retried");
}

#[test]
fn failures_are_cells_with_logs_and_causes() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| {
        s.oom = vec!["hog".into()];
        s.terminate = vec!["killed".into()];
        s.kill_after = Duration::from_millis(1500);
    });
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: fails
image: debian:bookworm-slim
benchmarks:
  - name: hog
    workload: {shell: 'echo started; sleep 30'}
  - name: killed
    workload: {shell: 'echo first line before the kill; sleep 30'}
"#,
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    assert_eq!(out.status.code(), Some(1));
    let hog = cell(&rec, "hog.cpu");
    assert_eq!(hog["status"], "oom", "{hog}");
    assert_eq!(hog["diagnosis"]["kind"], "host_oom_killed", "{hog}");
    let killed = cell(&rec, "killed.cpu");
    assert_eq!(killed["status"], "failed", "{killed}");
    assert_eq!(killed["failure"]["kind"], "sandbox_terminated", "{killed}");
    assert_eq!(killed["diagnosis"]["kind"], "sandbox_terminated", "{killed}");
    let stdout =
        std::fs::read_to_string(cell_dir(tmp.path(), &rec, "killed.cpu").join("stdout.log")).unwrap();
    assert!(
        stdout.contains("first line before the kill"),
        "logs that came home stay: {stdout}"
    );
    assert!(fake.running().is_empty());

    // An image that does not build: a failed cell naming the step.
    fake.scenario(|s| s.build_fail = Some("pip install nope".into()));
    let ctx = tmp.path().join("containers/bad");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM python:3.11-slim\nRUN pip install nope==9\n",
    )
    .unwrap();
    let m = write_suite(
        tmp.path(),
        "name: badimg\nimage: {build: bad}\nbenchmarks:\n  - name: x\n    workload: {shell: 'echo never'}\n",
    );
    let (_, rec) = run(&fake, tmp.path(), &m, &[]);
    let x = cell(&rec, "x.cpu");
    assert_eq!(x["failure"]["kind"], "image_build_failed", "{x}");
    assert!(
        x["failure"]["message"]
            .as_str()
            .unwrap()
            .contains("RUN pip install nope==9"),
        "{x}"
    );
    assert_eq!(x["diagnosis"]["kind"], "image_build_failed", "{x}");
    // No sandbox was created: nothing billed.
    assert!(x["info"]["container_started_at"].is_null(), "{x}");
    assert_eq!(x["cost"]["usd"].as_f64(), Some(0.0), "{x}");
    assert!(cell_dir(tmp.path(), &rec, "x.cpu")
        .join("image-build.log")
        .is_file());
}

#[test]
fn an_unavailable_gpu_falls_back_and_the_record_says_which_ran() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| s.unavailable_gpus = vec!["H100".into()]);
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: fallback
image: debian:bookworm-slim
gpus: ["H100:2", L4]
gpu_fallback:
  "H100:2": ["A100-80GB:2"]
benchmarks:
  - name: g
    workload: {shell: 'echo ran'}
"#,
    );
    let (_, rec) = run(&fake, tmp.path(), &m, &[]);
    let g = cell(&rec, "g.h100x2");
    assert_eq!(g["status"], "succeeded", "{g}");
    assert_eq!(g["info"]["modal_gpu"], "A100-80GB:2", "{g}");
    // Billed from the A100 sandbox's start, not from the H100 wait before it.
    let billed = g["cost"]["billed_s"].as_f64().unwrap();
    assert!(g["info"]["container_started_at"].is_string(), "{g}");
    assert!(
        billed < g["duration_s"].as_f64().unwrap() - 1.5,
        "the 2 s spent waiting for an H100 is not billed: {g}"
    );
    let asked: Vec<_> = fake.sandboxes().iter().filter_map(|s| s.gpu.clone()).collect();
    assert!(
        asked.contains(&("H100".into(), 2)) && asked.contains(&("A100-80GB".into(), 2)),
        "{asked:?}"
    );
    assert!(asked.contains(&("L4".into(), 1)));
    // With no alternative left, the cell fails with a named cause.
    fake.scenario(|s| s.unavailable_gpus = vec!["H100".into(), "A100-80GB".into()]);
    let (_, rec) = run(&fake, tmp.path(), &m, &[]);
    let g = cell(&rec, "g.h100x2");
    assert_eq!(g["failure"]["kind"], "gpu_unavailable", "{g}");
    assert_eq!(g["diagnosis"]["kind"], "gpu_unavailable", "{g}");
    // No sandbox was ever scheduled: it cost nothing, however long it waited (billing
    // starts when Modal starts the container).
    assert!(g["info"]["container_started_at"].is_null(), "{g}");
    assert_eq!(g["cost"]["usd"].as_f64(), Some(0.0), "{g}");
    assert_eq!(g["cost"]["billed_s"].as_f64(), Some(0.0), "{g}");
    assert!(
        fake.running().is_empty(),
        "sandboxes waiting for a GPU are terminated"
    );
    // `--strict-hardware` pins the type.
    fake.scenario(|s| s.unavailable_gpus.clear());
    run(&fake, tmp.path(), &m, &["--strict-hardware"]);
    assert!(fake
        .sandboxes()
        .iter()
        .any(|s| s.gpu == Some(("H100!".into(), 2))));
}

#[test]
fn down_terminates_every_sandbox_of_a_killed_run() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: long\nimage: debian:bookworm-slim\nconcurrency: 2\nbenchmarks:\n  - name: a\n    workload: {shell: 'sleep 60'}\n  - name: b\n    workload: {shell: 'sleep 60'}\n",
    );
    let mut child = orch(&fake, tmp.path())
        .args(["run", "-f"])
        .arg(&m)
        .args(["--backend", "modal", "--store"])
        .arg(tmp.path().join("store"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while fake.running().len() < 2 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(fake.running().len(), 2);
    child.kill().unwrap(); // SIGKILL: orch leaves its sandboxes behind
    child.wait().unwrap();
    assert_eq!(fake.running().len(), 2);
    let out = orch(&fake, tmp.path())
        .args(["down", "latest", "--store"])
        .arg(tmp.path().join("store"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fake.running().is_empty(), "{:?}", fake.running());
}

#[test]
fn setup_fills_the_volume_from_a_sandbox_and_plan_sees_it() {
    if !ready() {
        return;
    }
    use orch_testkit::fixtures::{write_test_model, ModelOptions};
    use orch_testkit::hub::HubServer;
    let fake = fake_modal();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    write_test_model(&root, "acme/tiny", &ModelOptions::tiny()).unwrap();
    let hub = HubServer::start(&root);
    let m = write_suite(
        tmp.path(),
        "name: w\nimage: debian:bookworm-slim\nmodels: [{repo: acme/tiny}]\nbenchmarks:\n  - name: a\n    workload: {shell: 'echo ok'}\n",
    );
    let plan = |fake: &FakeModal| {
        orch(fake, tmp.path())
            .args(["plan", "-f"])
            .arg(&m)
            .args(["--backend", "modal", "--json"])
            .env("HF_ENDPOINT", hub.endpoint())
            .output()
            .unwrap()
    };
    let before = plan(&fake);
    let v: Value = serde_json::from_slice(&before.stdout).unwrap();
    assert_eq!(v["models"][0]["complete"], false, "{v}");
    // `orch run` refuses while the weights are missing.
    let out = orch(&fake, tmp.path())
        .args(["run", "-f"])
        .arg(&m)
        .args(["--backend", "modal", "--store"])
        .arg(tmp.path().join("store"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The "static orch" of the setup sandbox: this orch (a large file: it
    // goes through the blob upload).
    let out = orch(&fake, tmp.path())
        .args(["setup", "-f"])
        .arg(&m)
        .args(["--backend", "modal"])
        .env("ORCH_STATIC", env!("CARGO_BIN_EXE_orch"))
        .env("HF_ENDPOINT", hub.endpoint())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fake.count("BlobCreate") >= 1);
    let vol = fake.volume_dir("orch-weights");
    assert!(vol.join("models--acme--tiny/refs/main").is_file());
    let setup_sb = fake
        .sandboxes()
        .into_iter()
        .find(|s| s.tags.contains_key("orch.setup"))
        .unwrap();
    assert_eq!(setup_sb.volume_mounts[0].1, "/weights");
    assert!(!setup_sb.volume_mounts[0].2, "mounted read-write");
    let after = plan(&fake);
    let v: Value = serde_json::from_slice(&after.stdout).unwrap();
    assert_eq!(v["models"][0]["complete"], true, "{v}");
    assert_eq!(after.status.code(), Some(0));
}

/// The agent in images like real GPU images on Modal: Debian roots of two
/// glibc versions and a glibc-less one as registry images, GPU sandboxes
/// given the driver's NVML (a stub reporting H100s) in the image's library
/// folder. A GPU cell names the stub's GPUs with telemetry; a CPU cell
/// succeeds (see `gpu_images.rs`).
#[test]
fn gpu_and_cpu_cells_in_real_images() {
    if !ready() || !orch_testkit::rootfs::require_tooling(orch_testkit::rootfs::debootstrap_available()) {
        return;
    }
    let stub = orch_testkit::gpu::nvml_stub().unwrap();
    let images = super::gpu_images::image_roots("registry.local");
    let mut b = FakeModal::builder().nvml_stub(&stub);
    for (image, root, _) in &images {
        b = b.image(image, root);
    }
    let fake = b.start().unwrap();
    for (image, _, glibc) in &images {
        let tmp = tempfile::tempdir().unwrap();
        let suite = super::gpu_images::suite(tmp.path(), image);
        let (out, rec) = run(&fake, tmp.path(), &suite, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{image}: {}\n{rec:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        super::gpu_images::check_record(&rec, glibc.as_deref(), false, image);
    }
    assert!(fake.running().is_empty());
}

/// `orch run --json` of `manifest` on `backend` (modal: against `fake`),
/// with the files' cache in `tmp`; the exit status and the record.
fn run_on(fake: &FakeModal, tmp: &Path, backend: &str, manifest: &Path) -> (Output, Value) {
    let out = orch(fake, tmp)
        .env("ORCH_CACHE_DIR", tmp.join("cache"))
        .env("ORCH_WEIGHTS_DIR", "/nonexistent-orch-weights")
        .args(["run", "--json", "--backend", backend, "-f"])
        .arg(manifest)
        .arg("--store")
        .arg(tmp.join(format!("store-{backend}")))
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{backend}: stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, v)
}

/// What must match between backends: each cell's status, its variants'
/// statuses and rounds, and the names of its metrics.
fn shape(record: &Value) -> Vec<(String, String, String, Vec<String>)> {
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
            let mut metrics: Vec<String> = c["metrics"]
                .as_object()
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            metrics.sort();
            (
                c["id"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
                variants,
                metrics,
            )
        })
        .collect()
}

/// The task each sandbox got names no folder of this machine's (neither
/// `hosts`' nor their files) and lists its files under `/orch/files`, whose
/// blobs are in the sandbox's mounts at `/orch/blobs`.
fn assert_tasks_travel(fake: &FakeModal, hosts: &[&Path], what: &str) {
    let sbs = fake.sandboxes();
    assert!(!sbs.is_empty(), "{what}: no sandbox");
    for sb in sbs {
        let task = sb
            .task()
            .unwrap_or_else(|| panic!("{what}: no task in {:?}", sb.entrypoint));
        let text = task.to_string();
        // A host path as a path (a string or a word of one starting with
        // it); the same names under `/orch/files` are the cell's own.
        fn strings(v: &Value, out: &mut Vec<String>) {
            match v {
                Value::String(s) => out.push(s.clone()),
                Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
                Value::Object(o) => o.iter().for_each(|(k, v)| {
                    out.push(k.clone());
                    strings(v, out)
                }),
                _ => {}
            }
        }
        let mut all = Vec::new();
        strings(&task, &mut all);
        for host in hosts {
            let host = host.to_string_lossy().into_owned();
            for s in &all {
                let named = s
                    .split(|c: char| c.is_whitespace() || c == '=' || c == ':' || c == '"' || c == '\'')
                    .any(|w| w.starts_with(&host));
                assert!(!named, "{what}: the task names `{host}` in `{s}`:\n{task:#}");
            }
        }
        assert_eq!(
            task["env"]["ORCH_FILES"],
            orch_files::CELL_ROOT,
            "{what}: {task:#}"
        );
        assert!(
            task["workload"].to_string().contains(orch_files::CELL_ROOT),
            "{what}: {task:#}"
        );
        let files = task["files"]["files"].as_array().cloned().unwrap_or_default();
        assert!(!files.is_empty(), "{what}: {task:#}");
        for f in &files {
            assert!(
                f["path"].as_str().unwrap().starts_with(orch_files::CELL_ROOT),
                "{what}: {f}"
            );
            let blob = format!("{}/{}", orch_files::CELL_BLOBS, f["sha256"].as_str().unwrap());
            assert!(
                sb.mount_files.contains(&blob),
                "{what}: {blob} not mounted: {:?}",
                sb.mount_files
            );
        }
        // `.gitignore`d files stay home.
        assert!(!text.contains("big.bin"), "{what}: {task:#}");
    }
}

/// A suite's workdir and prompt file (`workdir_toy`) and the stand-in's
/// local repository and patches (`standin_toy`: this checkout as a git
/// bundle) travel to Modal as a mount of their blobs: the cell succeeds on
/// the fake with the same variants and metrics as on `--backend local`, in
/// an image root that has none of this machine's files, and the task the
/// sandbox got names no host path.
#[test]
fn the_travelling_suites_run_on_modal_as_on_local() {
    if !ready() || !orch_testkit::rootfs::require_tooling(orch_testkit::rootfs::debootstrap_available()) {
        return;
    }
    let numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !numpy {
        orch_testkit::skip::skip_or_fail(
            &orch_testkit::skip::current_test(),
            "python3 with numpy is not installed (the stand-in server needs it on `--backend local`): `apt-get install python3-numpy`",
        );
        return;
    }
    let root = match orch_testkit::rootfs::debian_root_with("bookworm", orch_testkit::suites::PACKAGES) {
        Ok(r) => r,
        Err(e) => {
            orch_testkit::skip::skip_or_fail(
                &orch_testkit::skip::current_test(),
                &format!("a Debian bookworm root with git and numpy (debootstrap, network): {e}"),
            );
            return;
        }
    };
    let image = "registry.local/debian:bookworm-standin";
    for name in ["workdir", "standin"] {
        let fake = FakeModal::builder().image(image, &root).start().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let suite_dir = tmp.path().join("suite");
        let manifest = match name {
            "workdir" => orch_testkit::suites::workdir_toy(&suite_dir, image),
            _ => orch_testkit::suites::standin_toy(&suite_dir, image),
        };
        let (out, local) = run_on(&fake, tmp.path(), "local", &manifest);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name} local: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (out, modal) = run_on(&fake, tmp.path(), "modal", &manifest);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name} modal: {}\n{modal:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            shape(&modal),
            shape(&local),
            "{name}: modal {modal}\nlocal {local}"
        );
        for c in modal["cells"].as_array().unwrap() {
            assert_eq!(c["status"], "succeeded", "{name}: {c}");
        }
        assert_tasks_travel(&fake, &[&suite_dir, &orch_testkit::suites::checkout()], name);
        // The agent's mount and the files' mount.
        assert_eq!(fake.count("MountGetOrCreate"), 2, "{name}");
        assert!(!fake.uploads().is_empty(), "{name}");
        // Run again: Modal has every blob, nothing is uploaded.
        let before = fake.uploads().len();
        let (out, again) = run_on(&fake, tmp.path(), "modal", &manifest);
        assert_eq!(out.status.code(), Some(0), "{name} again: {again:#}");
        assert_eq!(
            fake.uploads().len(),
            before,
            "{name}: the second run uploaded files again"
        );
        assert!(fake.running().is_empty());
    }
}

/// Cells that name the same files share one mount of them in a run: two
/// cells with the same workdir make the files' mount once (each blob offered
/// once), and each reads the files from `/orch/files`.
#[test]
fn cells_naming_the_same_files_share_one_mount() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    let tmp = tempfile::tempdir().unwrap();
    let bench = tmp.path().join("bench");
    std::fs::create_dir_all(bench.join("sub")).unwrap();
    std::fs::write(bench.join("data.txt"), "from the host\n").unwrap();
    std::fs::write(bench.join("sub/more.txt"), "nested\n").unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: shared-files
image: debian:bookworm-slim
concurrency: 2
benchmarks:
  - name: a
    workload: {shell: 'cat data.txt sub/more.txt; echo "at $(pwd) files=$ORCH_FILES"', workdir: bench}
  - name: b
    workload: {shell: 'cat data.txt sub/more.txt', workdir: bench}
"#,
    );
    let (out, rec) = run_on(&fake, tmp.path(), "modal", &m);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{rec:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in ["a.cpu", "b.cpu"] {
        let c = cell(&rec, id);
        assert_eq!(c["status"], "succeeded", "{c}");
        let dir = tmp
            .path()
            .join("store-modal")
            .join(rec["id"].as_str().unwrap())
            .join("cells")
            .join(id);
        let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
        assert!(stdout.contains("from the host\nnested\n"), "{id}: {stdout}");
    }
    let a = std::fs::read_to_string(
        tmp.path()
            .join("store-modal")
            .join(rec["id"].as_str().unwrap())
            .join("cells/a.cpu/stdout.log"),
    )
    .unwrap();
    assert!(
        a.contains("at /orch/files") && a.contains("files=/orch/files"),
        "{a}"
    );
    assert_tasks_travel(&fake, &[tmp.path()], "shared");
    // The agent's mount and one mount of the files, each blob offered once.
    assert_eq!(fake.count("MountGetOrCreate"), 2);
    assert_eq!(
        fake.count("MountPutFile"),
        1 + 1 + 2 + 2,
        "agent and 2 files: a probe and an upload each"
    );
    assert_eq!(fake.uploads().len(), 3);
}

/// Throttling (`RESOURCE_EXHAUSTED` with a retry-after) is waited out: the same
/// `SandboxCreate` goes again under the same idempotency key and the cell runs on its
/// first GPU, its fallback untouched.
#[test]
fn a_throttled_sandbox_create_is_retried_not_a_gpu_refusal() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| {
        s.throttle_sandbox_creates = 2;
        s.throttle_after = Duration::from_millis(200);
    });
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        r#"
name: throttled
image: debian:bookworm-slim
gpus: ["H100:2"]
gpu_fallback:
  "H100:2": ["A100-80GB:2"]
benchmarks:
  - name: g
    workload: {shell: 'echo ran'}
"#,
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    let g = cell(&rec, "g.h100x2");
    assert_eq!(
        g["status"],
        "succeeded",
        "{g}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(g["info"]["modal_gpu"], "H100:2", "{g}");
    assert!(g["info"].get("modal_gpus_tried").is_none(), "no fallback: {g}");
    let creates: Vec<_> = fake
        .calls()
        .into_iter()
        .filter(|c| c.method == "SandboxCreate")
        .collect();
    assert_eq!(creates.len(), 3, "{creates:?}");
    assert!(creates[0].idempotency_key.is_some());
    assert!(
        creates
            .iter()
            .all(|c| c.idempotency_key == creates[0].idempotency_key),
        "{creates:?}"
    );
    let asked: Vec<_> = fake.sandboxes().iter().filter_map(|s| s.gpu.clone()).collect();
    assert_eq!(asked, [("H100".to_string(), 2)]);
}

/// Files Modal ingests slowly (`exists: false` after the upload) are asked about
/// again until they are there: the mounts are made and the cell runs.
#[test]
fn slowly_ingested_uploads_still_make_their_mounts() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| s.slow_ingestion = 2);
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: slow\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: x\n    workload: {shell: 'echo ran'}\n",
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    let x = cell(&rec, "x.cpu");
    assert_eq!(
        x["status"],
        "succeeded",
        "{x}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!fake.uploads().is_empty(), "the agent was uploaded");
    let not_yet = fake
        .calls()
        .iter()
        .filter(|c| c.detail.as_deref() == Some("exists=false (ingesting)"))
        .count();
    assert_eq!(not_yet, 2 * fake.uploads().len(), "each upload waited for");
}

/// Uploads Modal needs again (answered `exists: false`, their bytes dropped) are sent
/// again with their data, as the official client's loop sends them, not asked about by
/// digest alone (which such a server never answers `true`: the cell waited 600 s and was
/// billed for a sandbox never created).
#[test]
fn uploads_modal_needs_again_are_sent_again_with_their_data() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| s.drop_uploads = 2);
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: again\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: x\n    workload: {shell: 'echo ran'}\n",
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    let x = cell(&rec, "x.cpu");
    assert_eq!(
        x["status"],
        "succeeded",
        "{x}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dropped = fake
        .calls()
        .iter()
        .filter(|c| c.detail.as_deref() == Some("exists=false (dropped: send it again)"))
        .count();
    assert_eq!(dropped, 2, "{:?}", fake.calls());
    // Every file was stored by a request that carried it.
    assert!(!fake.uploads().is_empty());
}

/// The sandbox is asked for with `network_access: OPEN`, as the official client asks,
/// and every call says it comes from Modal's Go client (client type 9).
#[test]
fn sandboxes_get_open_network_and_calls_the_go_client_type() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    let tmp = tempfile::tempdir().unwrap();
    let m = write_suite(
        tmp.path(),
        "name: net\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: x\n    workload: {shell: 'echo ran'}\n",
    );
    let (_, rec) = run(&fake, tmp.path(), &m, &[]);
    assert_eq!(cell(&rec, "x.cpu")["status"], "succeeded");
    let sbs = fake.sandboxes();
    assert_eq!(sbs.len(), 1);
    assert_eq!(
        sbs[0].network_access,
        Some(orch_backend_modal::proto::network_access::NetworkAccessType::Open as i32)
    );
    let calls = fake.calls();
    assert!(!calls.is_empty());
    for c in &calls {
        assert_eq!(c.client_type.as_deref(), Some("9"), "{c:?}");
        assert!(
            c.libmodal_version
                .as_deref()
                .is_some_and(|v| v.starts_with("modal-go/")),
            "{c:?}"
        );
    }
}

/// A container whose context holds a 5 MiB file: the context goes as a mount referenced
/// by the image, the big file as a multipart blob (2 MiB parts, as the fake asks, one
/// part refused once and sent again), no gRPC request reaches 1 MiB, and the cell
/// reads the file in its image with the bytes it has here.
#[test]
fn a_large_dockerfile_context_travels_as_a_mount_and_a_multipart_blob() {
    if !ready() {
        return;
    }
    let fake = fake_modal();
    fake.scenario(|s| {
        s.multipart_part_bytes = Some(2 * 1024 * 1024);
        s.fail_blob_puts = 1;
    });
    let tmp = tempfile::tempdir().unwrap();
    let ctx = tmp.path().join("containers/big");
    std::fs::create_dir_all(&ctx).unwrap();
    let big: Vec<u8> = (0..5 * 1024 * 1024 + 11)
        .map(|i: usize| (i * 13 % 241) as u8)
        .collect();
    std::fs::write(ctx.join("big.bin"), &big).unwrap();
    // What the Dockerfile does not COPY stays here, as with the official client.
    std::fs::create_dir_all(ctx.join("notes")).unwrap();
    std::fs::write(ctx.join("notes/unused.bin"), vec![7u8; 300_000]).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian:bookworm-slim\nCOPY big.bin /data/big.bin\n",
    )
    .unwrap();
    let m = write_suite(
        tmp.path(),
        "name: bigctx\nimage: {build: big}\nbenchmarks:\n  - name: x\n    workload: {shell: 'sha256sum /data/big.bin; wc -c < /data/big.bin'}\n",
    );
    let (out, rec) = run(&fake, tmp.path(), &m, &[]);
    let x = cell(&rec, "x.cpu");
    assert_eq!(
        x["status"],
        "succeeded",
        "{x}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sha = orch_testkit::modal::sha256_hex(&big);
    let stdout = std::fs::read_to_string(cell_dir(tmp.path(), &rec, "x.cpu").join("stdout.log")).unwrap();
    assert!(stdout.contains(&sha), "the image has other bytes: {stdout}");
    assert!(stdout.contains(&big.len().to_string()), "{stdout}");

    let ctxs = fake.image_contexts();
    assert_eq!(ctxs.len(), 1, "{ctxs:?}");
    assert!(!ctxs[0].mount_id.is_empty(), "{ctxs:?}");
    assert!(
        ctxs[0]
            .files
            .iter()
            .any(|f| f.name == "big.bin" && f.sha256 == sha && !f.inline),
        "{ctxs:?}"
    );
    assert!(ctxs[0].files.iter().all(|f| !f.inline), "{ctxs:?}");
    assert!(
        ctxs[0].files.iter().all(|f| !f.name.contains("unused")),
        "a file no COPY names travelled: {ctxs:?}"
    );
    let blob = fake
        .blobs()
        .into_iter()
        .find(|b| b.size == big.len() as u64)
        .expect("the big file went as a blob");
    assert_eq!(blob.parts, 3, "{blob:?}");
    assert!(blob.completed, "{blob:?}");
    assert!(fake.uploads().iter().any(|u| u.via_blob && u.sha256 == sha));
    let (method, largest) = fake.largest_request().unwrap();
    assert!(largest < 1024 * 1024, "{method} carried {largest} bytes");
}

/// 300 cells at once under Modal's throttling (every unary call of each method over
/// 20 a second refused `RESOURCE_EXHAUSTED` with a retry-after): every cell succeeds
/// and is recorded once, one sandbox each, and no call is refused again after it was
/// told to wait (orch waits as told, and sends it again under the same key). The RPCs
/// per cell are printed (`--nocapture`).
#[test]
fn three_hundred_cells_under_throttling_each_recorded_once_orch_waiting_as_told() {
    if !ready() {
        return;
    }
    const CELLS: usize = 300;
    let fake = fake_modal();
    fake.scenario(|s| {
        s.rate_limit = Some(orch_testkit::modal::RateLimit {
            per_s: 20.0,
            burst: 5,
            methods: vec![],
        })
    });
    let tmp = tempfile::tempdir().unwrap();
    let values: Vec<String> = (0..CELLS).map(|i| i.to_string()).collect();
    let m = write_suite(
        tmp.path(),
        &format!(
            "name: many\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: c\n    workload: {{shell: 'echo ran'}}\n    matrix:\n      i: [{}]\n",
            values.join(", ")
        ),
    );
    // orch's own pacing above the server's limit, so the server's throttle is met.
    let out = orch(&fake, tmp.path())
        .env("ORCH_MODAL_CREATE_RATE", "100:50")
        .args(["run", "-f"])
        .arg(&m)
        .args(["--backend", "modal", "--jobs", "60", "--json", "--store"])
        .arg(tmp.path().join("store"))
        .output()
        .unwrap();
    let rec = json(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells = rec["cells"].as_array().unwrap();
    assert_eq!(cells.len(), CELLS);
    let ids: std::collections::BTreeSet<&str> = cells.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), CELLS, "each cell once");
    for c in cells {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert!(c["info"]["container_started_at"].is_string(), "{c}");
    }
    let stored = std::fs::read_dir(
        tmp.path()
            .join("store")
            .join(rec["id"].as_str().unwrap())
            .join("cells"),
    )
    .unwrap()
    .filter(|e| e.as_ref().unwrap().path().join("result.json").is_file())
    .count();
    assert_eq!(stored, CELLS, "one record each");
    assert_eq!(fake.sandboxes().len(), CELLS, "one sandbox each");
    let t = fake.throttling();
    assert!(t.told.values().sum::<usize>() > 0, "the limit was met: {t:?}");
    assert_eq!(t.early, 0, "a call sent again before its retry-after: {t:?}");
    let counts = fake.counts();
    let total: usize = counts.values().sum();
    eprintln!(
        "{CELLS} cells: {total} RPCs ({:.2} a cell), told to wait {:?}, waited {}; by method: {counts:?}",
        total as f64 / CELLS as f64,
        t.told,
        t.waited
    );
    // Long polls, not polling: a handful of calls a cell, throttled ones included.
    assert!(total < 12 * CELLS, "{counts:?}");
}
