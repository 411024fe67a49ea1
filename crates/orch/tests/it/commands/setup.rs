//! `orch setup`, `orch plan` and the run preflight against a real local
//! Hub-compatible server (orch-testkit), and the interop check: the Python
//! `huggingface_hub` package loads what orch wrote, offline, byte-identical.

use crate::support::{orch_without_hub_token, text};
use orch_testkit::fixtures::{write_test_model, GeneratedModel, ModelOptions};
use orch_testkit::hub::{HubServer, RequestKind};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "hf_orchTestSecretToken123";

/// [`orch_without_hub_token`] at the Hub `endpoint`.
fn orch(endpoint: &str) -> Command {
    let mut c = orch_without_hub_token();
    c.env("HF_ENDPOINT", endpoint);
    c
}

fn assert_same_files(model: &GeneratedModel, snapshot: &Path) {
    for f in &model.files {
        let want = std::fs::read(model.path_of(&f.path)).unwrap();
        let got = std::fs::read(snapshot.join(&f.path)).unwrap_or_else(|e| panic!("{}: {e}", f.path));
        assert!(want == got, "{} differs", f.path);
    }
}

fn snapshot_of(weights: &Path, repo: &str) -> std::path::PathBuf {
    let root = weights.join(format!("models--{}", repo.replace('/', "--")));
    let commit = std::fs::read_to_string(root.join("refs/main")).unwrap();
    root.join("snapshots").join(commit.trim())
}

#[test]
fn setup_downloads_verifies_and_second_setup_is_a_no_op() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    // Several shards, one over 100 MB (fetched in byte ranges).
    let model = write_test_model(&root, "acme/big", &ModelOptions::with_size_mb(150, 3)).unwrap();
    assert!(model.largest_file().unwrap().size > 40 << 20);
    let small = write_test_model(&root, "acme/small", &ModelOptions::tiny()).unwrap();
    let hub = HubServer::start(&root);
    let weights = tmp.path().join("weights");

    let out = orch(&hub.endpoint())
        .args([
            "setup",
            "--model",
            "acme/big",
            "--model",
            "acme/small@main",
            "--weights-dir",
        ])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(hub.ranged_gets() > 0, "large files are fetched in byte ranges");
    assert_same_files(&model, &snapshot_of(&weights, "acme/big"));
    assert_same_files(&small, &snapshot_of(&weights, "acme/small"));
    // Blobs are named like the hub's (sha256 for LFS files) and snapshots link to them.
    let link = snapshot_of(&weights, "acme/big").join("config.json");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert!(std::fs::read_link(&link).unwrap().starts_with("../../blobs"));
    let leftovers: Vec<_> = walk(&weights)
        .into_iter()
        .filter(|p| p.contains(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Again: nothing is downloaded, and it is quick.
    hub.clear_requests();
    let started = Instant::now();
    let out = orch(&hub.endpoint())
        .args([
            "setup",
            "--model",
            "acme/big",
            "--model",
            "acme/small",
            "--weights-dir",
        ])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(
        hub.count(RequestKind::ResolveGet),
        0,
        "a complete cache downloads no file"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}",
        started.elapsed()
    );

    // `orch plan` sees the weights (offline) and checks the fit.
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: s\nmodels:\n  - repo: acme/big\ngpus: [L4]\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n",
    )
    .unwrap();
    let out = orch("http://127.0.0.1:9")
        .args(["plan", "--json", "-f"])
        .arg(&manifest)
        .arg("--weights-dir")
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["models"][0]["complete"], true);
    assert!(plan["models"][0]["weights_bytes"].as_u64().unwrap() > 100 << 20);
    assert_eq!(plan["models"][0]["fit"][0]["fits"], true);

    // The interop check: huggingface_hub finds every file offline, byte-identical.
    python_loads_offline(&weights, &model);
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(p.clone());
            }
            out.push(p.to_string_lossy().into_owned());
        }
    }
    out
}

fn python_loads_offline(weights: &Path, model: &GeneratedModel) {
    let have = Command::new("python3")
        .args(["-c", "import huggingface_hub"])
        .status()
        .map(|s| s.success());
    if !matches!(have, Ok(true)) {
        orch_testkit::skip::skip_or_fail(
            &orch_testkit::skip::current_test(),
            "python3 with `huggingface_hub` is not installed (`pip install huggingface_hub`); \
             interop check skipped",
        );
        return;
    }
    let script = r#"
import hashlib, json, os, sys
from huggingface_hub import snapshot_download
p = snapshot_download(sys.argv[2], cache_dir=sys.argv[1], local_files_only=True)
out = {}
for dirpath, _, files in os.walk(p):
    for f in files:
        full = os.path.join(dirpath, f)
        out[os.path.relpath(full, p)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
print(json.dumps(out))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(weights)
        .arg(&model.repo)
        .env("HF_HUB_OFFLINE", "1")
        .env_remove("HF_ENDPOINT")
        .output()
        .unwrap();
    assert!(out.status.success(), "huggingface_hub failed: {}", text(&out));
    let seen: std::collections::BTreeMap<String, String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen.len(), model.files.len(), "{seen:?}");
    for f in &model.files {
        let want = sha256_hex(&std::fs::read(model.path_of(&f.path)).unwrap());
        assert_eq!(seen.get(&f.path), Some(&want), "{}", f.path);
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    orch_testkit::hashing::sha256_hex(bytes)
}

#[test]
fn gated_repo_exits_2_before_downloading_and_token_never_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    write_test_model(&root, "acme/gated", &ModelOptions::tiny().gated(TOKEN)).unwrap();
    let hub = HubServer::builder(&root)
        .gated("acme/gated", TOKEN)
        .start()
        .unwrap();
    let weights = tmp.path().join("weights");

    let out = orch(&hub.endpoint())
        .args(["setup", "--model", "acme/gated", "--weights-dir"])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let msg = text(&out);
    assert!(
        msg.contains("acme/gated") && msg.contains("HF_TOKEN") && msg.contains("hint:"),
        "{msg}"
    );
    assert_eq!(hub.count(RequestKind::ResolveGet), 0, "nothing may be downloaded");

    // A wrong token: still exit 2, and the token is not echoed.
    let out = orch(&hub.endpoint())
        .env("HF_TOKEN", "hf_wrongTokenValue999")
        .args(["setup", "--model", "acme/gated", "--weights-dir"])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(!text(&out).contains("hf_wrongTokenValue999"));

    // The right token: downloads, and the token is nowhere in output or files.
    let out = orch(&hub.endpoint())
        .env("HF_TOKEN", TOKEN)
        .args(["setup", "--model", "acme/gated", "--weights-dir"])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!text(&out).contains(TOKEN));
    for p in walk(&weights) {
        if let Ok(bytes) = std::fs::read(&p) {
            assert!(
                !String::from_utf8_lossy(&bytes).contains(TOKEN),
                "token written to {p}"
            );
        }
    }
}

#[test]
fn interrupted_setup_resumes_and_run_preflight_refuses_missing_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("hub");
    let model = write_test_model(&root, "acme/resume", &ModelOptions::with_size_mb(300, 2)).unwrap();
    let hub = HubServer::start(&root);
    let weights = tmp.path().join("weights");

    // Preflight: the run refuses before anything starts.
    let manifest = tmp.path().join("suite.yaml");
    std::fs::write(
        &manifest,
        "name: s\nmodels:\n  - repo: acme/resume\nbenchmarks:\n  - name: a\n    workload:\n      shell: 'test -n \"$HF_HUB_CACHE\" && test \"$HF_HUB_OFFLINE\" = 1'\n",
    )
    .unwrap();
    let store = tmp.path().join("store");
    let run = |extra: &[&str]| {
        orch(&hub.endpoint())
            .args(["run", "-f"])
            .arg(&manifest)
            .arg("--weights-dir")
            .arg(&weights)
            .arg("--store")
            .arg(&store)
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("acme/resume") && text(&out).contains("orch setup"),
        "{}",
        text(&out)
    );
    let plan = orch(&hub.endpoint())
        .args(["plan", "-f"])
        .arg(&manifest)
        .arg("--weights-dir")
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(plan.status.code(), Some(1), "{}", text(&plan));

    // Kill setup in the middle of the download.
    let mut child = orch(&hub.endpoint())
        .args([
            "setup",
            "--connections",
            "2",
            "--model",
            "acme/resume",
            "--weights-dir",
        ])
        .arg(&weights)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let total = model.total_size();
    let deadline = Instant::now() + Duration::from_secs(60);
    while hub.bytes_served() < total / 3 {
        assert!(Instant::now() < deadline, "download never started");
        if child.try_wait().unwrap().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let first = hub.bytes_served();
    assert!(
        first < total,
        "setup was not interrupted ({first} of {total} bytes)"
    );

    let out = orch(&hub.endpoint())
        .args(["setup", "--model", "acme/resume", "--weights-dir"])
        .arg(&weights)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let second = hub.bytes_served() - first;
    assert!(second < total, "resumed: {second} of {total} bytes fetched again");
    assert_same_files(&model, &snapshot_of(&weights, "acme/resume"));

    // Now the run starts, and its cell sees the weights volume, offline.
    let out = run(&["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
