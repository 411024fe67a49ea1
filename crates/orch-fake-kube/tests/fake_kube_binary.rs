//! The `fake-kube` binary's flags for load at scale (`scripts/bench-scale.sh`): `--latency-ms`
//! (no request answered sooner), `--rate-limit` (429 past the rate), `--stats` (what it
//! answered, written on SIGTERM), and `--nodes`/`--gpus-per-node` (N×G one-GPU pods run at
//! once, the next one pends as unschedulable).

use serde_json::{json, Value};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

struct Fake {
    child: Child,
    url: String,
}

impl Fake {
    fn start(dir: &Path, args: &[&str]) -> Fake {
        let kubeconfig = dir.join("kubeconfig");
        let (child, url) = orch_test_support::child::spawn_url(
            Command::new(env!("CARGO_BIN_EXE_fake-kube"))
                .arg(&kubeconfig)
                .args(args),
        );
        Fake { child, url }
    }

    /// SIGTERM, and its exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: a plain syscall on the pid of a child not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Fake {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: as in `stop`.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

async fn req(url: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = reqwest::Client::new()
        .request(method.parse().unwrap(), format!("{url}{path}"))
        .header("Authorization", "Bearer fake-token");
    if let Some(b) = body {
        r = r.header("Content-Type", "application/json").body(b.to_string());
    }
    let resp = r.send().await.unwrap();
    let code = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_rate_limit_and_stats_flags() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let fake = Fake::start(
        dir.path(),
        &[
            "--latency-ms",
            "150",
            "--rate-limit",
            "0.5:3",
            "--stats",
            stats.to_str().unwrap(),
        ],
    );
    let mut codes = Vec::new();
    for _ in 0..4 {
        let t = Instant::now();
        let (code, _) = req(&fake.url, "GET", "/api/v1/namespaces/ns/pods", None).await;
        let took = t.elapsed();
        // Answered no sooner than the latency: refused requests too.
        assert!(took >= Duration::from_millis(150), "answered after {took:?}");
        codes.push(code);
    }
    // A bucket of 3 refilled one every 2 s: the fourth, well under 2 s after the first,
    // finds under one token.
    assert_eq!(codes, [200, 200, 200, 429]);
    // A client that waits as told (a token comes every 2 s) is served.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, _) = req(
        &fake.url,
        "POST",
        "/api/v1/namespaces/ns/configmaps",
        Some(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})),
    )
    .await;
    assert_eq!(code, 201);
    assert!(fake.stop().success());
    let s: Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(s["requests"], 5, "{s}");
    assert_eq!(s["by_verb"]["list"], 4, "{s}");
    assert_eq!(s["by_verb"]["create"], 1, "{s}");
    assert_eq!(s["by_verb_resource"]["create configmaps"], 1, "{s}");
    assert_eq!(s["throttled"], 1, "{s}");
    let per_second: u64 = s["per_second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 5, "{s}");
}

fn gpu_job(name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sleep", "30"],
                "resources": {"limits": {"nvidia.com/gpu": 1}}}],
        }}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_times_gpus_one_gpu_pods_run_at_once_and_the_next_pends() {
    if !orch_fake_containers::container::available_or_skip("the fake kubelet's containers") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start(
        dir.path(),
        &[
            "--nodes",
            "3",
            "--gpus-per-node",
            "2",
            "--busybox-image",
            "busybox:1.36",
        ],
    );
    let (_, nodes) = req(&fake.url, "GET", "/api/v1/nodes", None).await;
    let names: Vec<&str> = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    for n in ["gpu-0", "gpu-1", "gpu-2", "cpu-0"] {
        assert!(names.contains(&n), "{names:?}");
    }
    for i in 0..7 {
        let (code, v) = req(
            &fake.url,
            "POST",
            "/apis/batch/v1/namespaces/ns/jobs",
            Some(gpu_job(&format!("g{i}"))),
        )
        .await;
        assert_eq!(code, 201, "{v}");
    }
    let t = Instant::now();
    let (running, pending) = loop {
        let (_, pods) = req(&fake.url, "GET", "/api/v1/namespaces/ns/pods", None).await;
        let pods = pods["items"].as_array().unwrap().clone();
        let running: Vec<Value> = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Running")
            .cloned()
            .collect();
        let unschedulable: Vec<Value> = pods
            .iter()
            .filter(|p| {
                p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "Unschedulable"))
            })
            .cloned()
            .collect();
        if running.len() == 6 && unschedulable.len() == 1 {
            break (running, unschedulable);
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{} running, {} unschedulable",
            running.len(),
            unschedulable.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for p in &running {
        *per_node
            .entry(p["spec"]["nodeName"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        per_node,
        [("gpu-0".into(), 2), ("gpu-1".into(), 2), ("gpu-2".into(), 2)].into()
    );
    let msg = pending[0]["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["reason"] == "Unschedulable")
        .unwrap()["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        msg.starts_with("0/4 nodes are available: 4 Insufficient nvidia.com/gpu"),
        "{msg}"
    );
    assert!(fake.stop().success());
}
