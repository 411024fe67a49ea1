//! The `fake-modal` binary's `--stats FILE` (for `scripts/bench-scale.sh`): on SIGTERM it
//! writes the calls it answered, by method and by second, and the calls its `--rate-limit`
//! told to wait.

use orch_modal_proto::modal_client_client::ModalClientClient;
use orch_modal_proto::{AppGetOrCreateRequest, ObjectCreationType};
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_on_sigterm_count_calls_by_method_and_the_throttled_ones() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let (mut child, url) = orch_test_support::child::spawn_url(
        Command::new(env!("CARGO_BIN_EXE_fake-modal"))
            .args(["--root"])
            .arg(dir.path().join("root"))
            .args([
                "--token",
                "ak-t:as-t",
                "--rate-limit",
                "0.5:2:AppGetOrCreate",
                "--stats",
            ])
            .arg(&stats),
    );
    let channel = tonic::transport::Channel::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ModalClientClient::new(channel);
    let mut codes = Vec::new();
    for i in 0..3 {
        let mut req = tonic::Request::new(AppGetOrCreateRequest {
            app_name: "a".into(),
            environment_name: String::new(),
            object_creation_type: ObjectCreationType::CreateIfMissing as i32,
        });
        let md = req.metadata_mut();
        md.insert("x-modal-token-id", "ak-t".parse().unwrap());
        md.insert("x-modal-token-secret", "as-t".parse().unwrap());
        md.insert("x-idempotency-key", format!("key-{i}").parse().unwrap());
        codes.push(match client.app_get_or_create(req).await {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        });
    }
    // A burst of 2, then one every 2 s: the third is told to wait.
    assert_eq!(
        codes,
        [tonic::Code::Ok, tonic::Code::Ok, tonic::Code::ResourceExhausted]
    );
    // SAFETY: a plain syscall on the pid of a child not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(s["requests"], 3, "{s}");
    assert_eq!(s["by_method"]["AppGetOrCreate"], 3, "{s}");
    assert_eq!(s["throttled"], 1, "{s}");
    assert_eq!(s["throttled_by_method"]["AppGetOrCreate"], 1, "{s}");
    let per_second: u64 = s["per_second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 3, "{s}");
}
