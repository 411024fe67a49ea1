//! The fake Modal server speaks Modal's protocol: Modal's own Python client
//! (`pip install modal`), pointed at it with `MODAL_SERVER_URL`, creates a
//! sandbox with `gpu="H100:2"`, a volume and a secret, and reads its stdout
//! and exit code. Under CI a missing `modal` fails; elsewhere the test is
//! skipped with the reason printed (`orch_test_support::skip`).

use orch_fake_modal::FakeModal;

const SCRIPT: &str = r#"
import json, modal
app = modal.App.lookup("orch-proof", create_if_missing=True)
vol = modal.Volume.from_name("proof-vol", create_if_missing=True)
sec = modal.Secret.from_dict({"PROOF_SECRET": "s3cr3t"})
img = modal.Image.from_registry("debian:bookworm-slim")
sb = modal.Sandbox.create(
    "sh", "-c", 'echo "hello $PROOF_SECRET"; ls "$1"; echo to-stderr >&2; exit 3', "sh", "/data",
    app=app, image=img, gpu="H100:2", volumes={"/data": vol}, secrets=[sec], timeout=60,
)
out = sb.stdout.read()
err = sb.stderr.read()
sb.wait(raise_on_termination=False)
print("RESULT " + json.dumps({"stdout": out, "stderr": err, "returncode": sb.returncode, "id": sb.object_id}))
"#;

fn have_modal() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import modal"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok || orch_test_support::skip::skip_or_fail(
        &orch_test_support::skip::current_test(),
        "python3 with the `modal` package is not installed here (pip install modal)",
    )
}

#[test]
fn the_official_python_client_runs_a_sandbox_on_the_fake() {
    if !have_modal() || !orch_fake_containers::container::available_or_skip("the fake Modal's sandboxes") {
        return;
    }
    let fake = FakeModal::builder()
        .token("ak-proof", "as-proof")
        .image(
            "debian:bookworm-slim",
            orch_fake_containers::container::busybox_root().unwrap(),
        )
        .start()
        .unwrap();
    std::fs::create_dir_all(fake.volume_dir("proof-vol")).unwrap();
    std::fs::write(fake.volume_dir("proof-vol").join("marker.txt"), "x").unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", SCRIPT])
        .env("MODAL_SERVER_URL", fake.url())
        .env("MODAL_TOKEN_ID", "ak-proof")
        .env("MODAL_TOKEN_SECRET", "as-proof")
        .env("HOME", home.path())
        .env_remove("MODAL_PROFILE")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a result line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["returncode"], 3, "{v}");
    let so = v["stdout"].as_str().unwrap();
    assert!(so.contains("hello s3cr3t"), "{so}");
    assert!(so.contains("marker.txt"), "the volume is mounted: {so}");
    assert!(v["stderr"].as_str().unwrap().contains("to-stderr"), "{v}");

    let sb = fake.sandboxes();
    assert_eq!(sb.len(), 1);
    assert_eq!(sb[0].gpu, Some(("H100".to_string(), 2)));
    assert_eq!(sb[0].secret_keys, ["PROOF_SECRET"]);
    assert_eq!(sb[0].volume_mounts.len(), 1);
    assert_eq!(sb[0].volume_mounts[0].1, "/data");
    assert!(fake
        .calls()
        .iter()
        .all(|c| c.token_id.as_deref() == Some("ak-proof")));
}

#[test]
fn a_wrong_token_is_refused() {
    if !have_modal() {
        return;
    }
    let fake = FakeModal::builder()
        .token("ak-right", "as-right")
        .start()
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import modal; modal.App.lookup('x', create_if_missing=True)",
        ])
        .env("MODAL_SERVER_URL", fake.url())
        .env("MODAL_TOKEN_ID", "ak-wrong")
        .env("MODAL_TOKEN_SECRET", "as-wrong")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
}
