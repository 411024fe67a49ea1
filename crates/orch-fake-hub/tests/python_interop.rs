//! Interop with the Python `huggingface_hub` package (`snapshot_download`, `hf download`).
//! Skipped (with a note) when `python3 -c "import huggingface_hub"` fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use orch_fake_hub::fixtures::{self, GeneratedModel, ModelOptions};
use orch_fake_hub::{HubServer, RequestKind};
use serde_json::Value;

const TOKEN: &str = "hf_valid_token";

const SCRIPT: &str = r#"
import json, sys
import huggingface_hub
from huggingface_hub import snapshot_download
from huggingface_hub.errors import GatedRepoError

cache, mode, token = sys.argv[1], sys.argv[2], sys.argv[3]
out = {"version": huggingface_hub.__version__}
if mode == "open":
    out["snapshot"] = snapshot_download("acme/tiny-llama", cache_dir=cache)
else:
    for label, tok in (("no_token", None), ("wrong_token", "hf_wrong")):
        try:
            snapshot_download("acme/gated-llama", cache_dir=cache, token=tok)
            out[label] = "downloaded"
        except GatedRepoError:
            out[label] = "GatedRepoError"
        except Exception as e:
            out[label] = type(e).__name__ + ": " + str(e)
    out["snapshot"] = snapshot_download("acme/gated-llama", cache_dir=cache, token=token)
print(json.dumps(out))
"#;

fn python_available() -> bool {
    Command::new("python3")
        .args(["-c", "import huggingface_hub"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn hf_env(cmd: &mut Command, server: &HubServer, home: &Path) {
    cmd.env("HF_ENDPOINT", server.endpoint())
        .env("HF_HOME", home)
        .env("HF_HUB_DISABLE_XET", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_ETAG_TIMEOUT", "30")
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
}

fn run_script(server: &HubServer, home: &Path, cache: &Path, mode: &str) -> Value {
    let script = home.join("interop.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(cache).arg(mode).arg(TOKEN);
    hf_env(&mut cmd, server, home);
    let out = cmd.output().expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout.lines().last().expect("output line");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad output {line:?}: {e}"))
}

/// Every source file is present, byte-identical, at `dir/{path}`.
fn assert_same(model: &GeneratedModel, dir: &Path) {
    for f in &model.files {
        let got = std::fs::read(dir.join(&f.path)).unwrap_or_else(|e| panic!("{}: {e}", f.path));
        let want = std::fs::read(model.path_of(&f.path)).expect("read source");
        assert!(got == want, "{} differs", f.path);
    }
    assert!(!dir.join(orch_fake_hub::MARKER_FILE).exists());
}

#[test]
fn huggingface_hub_snapshot_download() {
    if !python_available() {
        eprintln!("NOTE: skipping python interop test: `python3 -c 'import huggingface_hub'` failed");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let open =
        fixtures::write_test_model(root.path(), "acme/tiny-llama", &ModelOptions::tiny()).expect("write");
    let gated = fixtures::write_test_model(
        root.path(),
        "acme/gated-llama",
        &ModelOptions::tiny().seed(3).gated(TOKEN),
    )
    .expect("write");
    let server = HubServer::start(root.path());
    let cache = work.path().join("cache");

    // Open repo.
    let out = run_script(&server, work.path(), &cache, "open");
    eprintln!("huggingface_hub version {}", out["version"]);
    let snap = PathBuf::from(out["snapshot"].as_str().expect("snapshot path"));
    let commit = server.commit("acme/tiny-llama").expect("commit");
    assert!(
        snap.ends_with(format!("models--acme--tiny-llama/snapshots/{commit}")),
        "{}",
        snap.display()
    );
    assert_same(&open, &snap);
    assert_eq!(server.count(RequestKind::ResolveGet), open.files.len());

    // A second run downloads nothing.
    server.clear_requests();
    let out = run_script(&server, work.path(), &cache, "open");
    assert_eq!(PathBuf::from(out["snapshot"].as_str().expect("path")), snap);
    assert_eq!(
        server.count(RequestKind::ResolveGet),
        0,
        "{:#?}",
        server.requests()
    );

    // Gated repo.
    let out = run_script(&server, work.path(), &cache, "gated");
    assert_eq!(out["no_token"], "GatedRepoError", "{out}");
    assert_eq!(out["wrong_token"], "GatedRepoError", "{out}");
    assert_same(&gated, Path::new(out["snapshot"].as_str().expect("path")));
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert!(statuses.contains(&401) && statuses.contains(&403), "{statuses:?}");
}

#[test]
fn hf_cli_download() {
    if !python_available()
        || Command::new("hf")
            .arg("version")
            .output()
            .map(|o| !o.status.success())
            .unwrap_or(true)
    {
        eprintln!("NOTE: skipping `hf download` test: huggingface_hub / `hf` CLI not available");
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let gated = fixtures::write_test_model(
        root.path(),
        "acme/gated-llama",
        &ModelOptions::tiny().gated(TOKEN),
    )
    .expect("write");
    let server = HubServer::start(root.path());
    let local = work.path().join("local");

    let mut cmd = Command::new("hf");
    cmd.args(["download", "acme/gated-llama", "--local-dir"])
        .arg(&local);
    hf_env(&mut cmd, &server, work.path());
    let out = cmd.output().expect("run hf");
    assert!(!out.status.success(), "download without token must fail");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .to_lowercase()
            .contains("gated"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut cmd = Command::new("hf");
    cmd.args(["download", "acme/gated-llama", "--token", TOKEN, "--local-dir"])
        .arg(&local);
    hf_env(&mut cmd, &server, work.path());
    let out = cmd.output().expect("run hf");
    assert!(
        out.status.success(),
        "hf download failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same(&gated, &local);
}
