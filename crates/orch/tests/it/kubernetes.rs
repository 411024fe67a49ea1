//! `--backend kubernetes` end to end against `FakeKube` (orch-testkit): a
//! local API server speaking the Kubernetes REST protocol, whose Job
//! controller and "kubelet" schedule pods on fake nodes (GPU capacity,
//! labels, taints) and run each container in its image's root folder (a
//! mount namespace and chroot, as a runtime would), so the static agent is
//! installed by the init container from the agent image, runs in the cell's
//! image, and ships its frames home over the pod log. No cluster is needed,
//! but root is (and `bash scripts/prepare-docker.sh`'s static agent): without
//! them the tests are skipped with a note, except under `CI=true`.
//!
//! Images: the agent image holds the static agent and `orch` (FROM scratch);
//! `debian:bookworm-slim` is busybox with this host's glibc 2.36 runtime
//! (Debian 12's: what that image carries), `python:3.11-slim` the same with
//! a CA bundle (less Python), where the setup Job's dynamically linked
//! `orch` runs; the quickstart image is a static busybox, as
//! `containers/quickstart` builds it.

use orch_testkit::kube::{FakeKube, FakeNode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const AGENT_IMAGE: &str = "registry.local/orch/orch-agent:test";
const TOKEN: &str = "hf_CANARY-k8s-NEVER-SHOWN-7731";

use crate::repo;

fn static_agent() -> PathBuf {
    crate::container_agent()
}

fn ready() -> bool {
    crate::containers_ready("kubernetes tests")
}

/// The agent image's file system, FROM scratch: the static agent at
/// `/orch-agent` and the `orch` the setup Job runs at `/orch-cli` (here this
/// build's, dynamically linked: it runs in the glibc image the Job uses).
fn agent_image_root(tmp: &Path) -> PathBuf {
    let root = tmp.join("agent-image");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(static_agent(), root.join("orch-agent")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_orch"), root.join("orch-cli")).unwrap();
    root
}

/// The quickstart's built image as the cluster knows it (`ORCH_REGISTRY`).
fn quickstart_image() -> String {
    let spec = orch_images::ImageSpec {
        name: "quickstart".into(),
        context: repo().join("containers/quickstart"),
        dockerfile: "Dockerfile".into(),
        args: Default::default(),
    };
    format!("registry.local/{}", orch_images::resolve_tag(&spec).unwrap())
}

struct Cluster {
    fake: FakeKube,
    tmp: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn cluster(
    nodes: Vec<FakeNode>,
    tweak: impl FnOnce(orch_testkit::kube::FakeKubeBuilder) -> orch_testkit::kube::FakeKubeBuilder,
) -> Cluster {
    let tmp = tempfile::tempdir().unwrap();
    let glibc = orch_testkit::container::glibc_root().unwrap();
    let mut b = FakeKube::builder()
        .image(AGENT_IMAGE, agent_image_root(tmp.path()))
        .image("debian:bookworm-slim", &glibc)
        .image(
            "python:3.11-slim",
            orch_testkit::container::glibc_ca_root().unwrap(),
        )
        .image(
            &quickstart_image(),
            orch_testkit::container::busybox_root().unwrap(),
        );
    for n in nodes {
        b = b.node(n);
    }
    let fake = tweak(b).start().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig, "bench").unwrap();
    Cluster {
        fake,
        tmp,
        kubeconfig,
    }
}

impl Cluster {
    fn orch(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_orch"));
        c.env_remove("ORCH_STORE")
            .env_remove("ORCH_AGENT")
            .env("HOME", self.tmp.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("ORCH_AGENT_IMAGE", AGENT_IMAGE)
            .env("ORCH_REGISTRY", "registry.local")
            .stdin(Stdio::null());
        c
    }

    fn store(&self) -> PathBuf {
        self.tmp.path().join("store")
    }

    /// `orch run -f SUITE --backend kubernetes --store STORE EXTRA...`.
    fn run_cmd(&self, suite: &Path, extra: &[&str]) -> Command {
        let mut c = self.orch();
        c.args(["run", "-f"])
            .arg(suite)
            .args(["--backend", "kubernetes", "--store"])
            .arg(self.store())
            .args(extra);
        c
    }

    fn run(&self, manifest: &Path, extra: &[&str]) -> (Output, Value) {
        let mut extra = extra.to_vec();
        extra.push("--json");
        let out = self.run_cmd(manifest, &extra).output().unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (out, v)
    }

    fn suite(&self, name: &str, text: &str) -> PathBuf {
        let p = self.tmp.path().join(format!("{name}.yaml"));
        std::fs::write(&p, text).unwrap();
        p
    }

    /// `orch run` of a suite in the background (`--json` on a pipe).
    fn spawn(&self, suite: &Path) -> std::process::Child {
        self.run_cmd(suite, &["--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The first pod whose container runs (waits up to 30 s).
    fn wait_running(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(p) = self.fake.running_pods().first() {
                return p.clone();
            }
            assert!(Instant::now() < deadline, "the pod never ran");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Nothing of orch's is left on the cluster.
    fn assert_nothing_left(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let jobs = self.fake.objects("jobs");
            let pods = self.fake.objects("pods");
            if jobs.is_empty() && pods.is_empty() && self.fake.running_pods().is_empty() {
                return;
            }
            if Instant::now() > deadline {
                panic!("left on the cluster: jobs {jobs:?}\npods {pods:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn cells(v: &Value) -> Vec<Value> {
    v["cells"].as_array().unwrap().clone()
}

fn cell_dir(store: &Path, v: &Value, cell: &str) -> PathBuf {
    store.join(v["id"].as_str().unwrap()).join("cells").join(cell)
}

#[test]
fn the_quickstart_runs_on_the_fake_cluster_with_logs_in_the_store() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::h100("gpu-1", 8), FakeNode::cpu("cpu-1")], |b| b);
    let (out, v) = c.run(&repo().join("manifests/quickstart.yaml"), &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{v:#}");
    let cells = cells(&v);
    assert_eq!(cells.len(), 4);
    for cell in &cells {
        assert_eq!(cell["status"], "succeeded", "{cell:#}");
        assert!(cell["info"]["kubernetes_pod"].is_string(), "{cell:#}");
        // Every file came home whole (checked against the agent's digests).
        assert!(
            cell["info"].get("kubernetes_files_incomplete").is_none(),
            "{cell:#}"
        );
        assert!(cell["timings"]["provision"].as_f64().unwrap() > 0.0);
    }
    // The command cell's output came home through the pod log.
    let dir = cell_dir(&c.store(), &v, "command.cpu");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(stdout.contains("hello from command.cpu"), "{stdout}");
    assert!(dir.join("events.jsonl").is_file());
    // `orch logs` reads it like any other backend's.
    let logs = c
        .orch()
        .args(["logs", "--store"])
        .arg(c.store())
        .args([v["id"].as_str().unwrap(), "command.cpu"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&logs.stdout).contains("hello from command.cpu"));
    // Every Job asked what the spec says, and nothing is left.
    let reqs = c.fake.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("POST /apis/batch/v1/namespaces/bench/jobs")),
        "{reqs:?}"
    );
    c.assert_nothing_left();
}

#[test]
fn a_dropped_log_stream_reconnects_without_losing_or_duplicating_lines() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.cut_log_streams_after(3000));
    let suite = c.suite(
        "lines",
        "name: lines\nbenchmarks:\n  - name: count\n    workload:\n      shell: 'for i in $(seq 1 400); do echo \"line $i of the count\"; done; sleep 1; echo done'\n",
    );
    let (out, v) = c.run(&suite, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = std::fs::read_to_string(cell_dir(&c.store(), &v, "count.cpu").join("stdout.log")).unwrap();
    let want: String = (1..=400)
        .map(|i| format!("line {i} of the count\n"))
        .collect::<String>()
        + "done\n";
    assert_eq!(stdout, want);
    assert!(
        cells(&v)[0]["info"].get("kubernetes_files_incomplete").is_none(),
        "{v:#}"
    );
    let log_calls = c.fake.requests().iter().filter(|r| r.contains("/log?")).count();
    assert!(
        log_calls > 2,
        "the stream was cut and resumed: {log_calls} log requests"
    );
    c.assert_nothing_left();
}

#[test]
fn an_unschedulable_h100x8_cell_fails_within_seconds_with_the_schedulers_words() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::h100("gpu-1", 4), FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "big",
        "name: big\ngpus: [\"H100:8\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let t0 = Instant::now();
    let (out, v) = c.run(&suite, &[]);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "failed", "{cell:#}");
    assert_eq!(cell["failure"]["kind"], "unschedulable", "{cell:#}");
    let msg = cell["failure"]["message"].as_str().unwrap();
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    assert_eq!(cell["diagnosis"]["kind"], "unschedulable", "{cell:#}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    c.assert_nothing_left();
}

#[test]
fn an_oom_killed_pod_is_oom() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "oom",
        r#"name: oom
memory_limit: 96MiB
benchmarks:
  - name: hog
    workload:
      shell: |
        awk 'BEGIN { s = sprintf("%400000000s", ""); system("sleep 30") }'
"#,
    );
    let (_, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "oom", "{cell:#}");
    assert!(
        cell["failure"]["message"].as_str().unwrap().contains("OOMKilled"),
        "{cell:#}"
    );
    c.assert_nothing_left();
}

#[test]
fn image_and_secret_errors_are_named() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "img",
        "name: img\nimage: registry.local/nosuch/image:v9\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let t0 = Instant::now();
    let (_, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(cell["failure"]["kind"], "image_pull_failed", "{cell:#}");
    assert!(t0.elapsed() < Duration::from_secs(30));

    // An existing Secret without the key the suite needs.
    let suite = c.suite(
        "sec",
        "name: sec\nsecrets: [HF_TOKEN]\nkubernetes: {secret: team-tokens}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let (_, v) = {
        let out = c
            .run_cmd(&suite, &["--json"])
            .env("HF_TOKEN", TOKEN)
            .output()
            .unwrap();
        (out.status, serde_json::from_slice::<Value>(&out.stdout).unwrap())
    };
    let cell = &cells(&v)[0];
    assert_eq!(cell["failure"]["kind"], "container_config_error", "{cell:#}");
    assert!(cell["failure"]["message"]
        .as_str()
        .unwrap()
        .contains("team-tokens"));
    c.assert_nothing_left();
}

#[test]
fn secrets_reach_the_pod_by_reference_only_and_are_masked_at_home() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "canary",
        "name: canary\nsecrets: [HF_TOKEN]\nbenchmarks:\n  - name: leak\n    workload: {shell: 'echo \"token=$HF_TOKEN\"; echo \"$HF_TOKEN\" | base64; echo \"err $HF_TOKEN\" >&2'}\n",
    );
    let out = c.run_cmd(&suite, &[]).env("HF_TOKEN", TOKEN).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains(TOKEN));
    // The workload got the value (masked in what came home).
    let mut found_mask = false;
    for entry in walk(&c.store()) {
        let text = String::from_utf8_lossy(&std::fs::read(&entry).unwrap()).to_string();
        assert!(!text.contains(TOKEN), "the token is in {}", entry.display());
        found_mask |= text.contains("token=***");
    }
    assert!(found_mask, "the workload printed the (masked) token");
    // The Job names the secret; only the Secret object holds its value.
    let reqs = c.fake.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("POST /api/v1/namespaces/bench/secrets")),
        "{reqs:?}"
    );
    c.assert_nothing_left();
    assert!(
        c.fake.objects("secrets").is_empty(),
        "the run's Secret is deleted"
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn ctrl_c_deletes_the_job_and_records_the_cell_cancelled() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "long",
        "name: long\nbenchmarks:\n  - name: sleepy\n    workload: {shell: 'echo started; sleep 120'}\n",
    );
    let child = c.spawn(&suite);
    c.wait_running();
    std::thread::sleep(Duration::from_millis(500));
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cells(&v)[0]["status"], "cancelled", "{v:#}");
    c.assert_nothing_left();
}

#[test]
fn orch_down_deletes_what_a_killed_run_left() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "left",
        "name: left\nbenchmarks:\n  - name: sleepy\n    workload: {shell: 'sleep 120'}\n",
    );
    let mut child = c
        .run_cmd(&suite, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.wait_running();
    child.kill().unwrap();
    child.wait().unwrap();
    // The Job outlives `kill -9` of orch on a real cluster too ...
    assert!(!c.fake.objects("jobs").is_empty());
    // ... until `orch down`.
    let out = c
        .orch()
        .args(["down", "latest", "--store"])
        .arg(c.store())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.assert_nothing_left();
}

#[test]
fn dry_run_prints_the_manifests_and_applies_nothing() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "dry",
        "name: dry\ngpus: [\"H100:8\"]\nimage: registry.local/team/serve:v1\nsecrets: [HF_TOKEN]\nkubernetes: {weights_pvc: hf-weights, namespace: bench}\nbenchmarks:\n  - name: serve\n    workload: {shell: 'echo hi'}\n",
    );
    let out = c
        .run_cmd(&suite, &["--dry-run"])
        .env("HF_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    for want in [
        "kind: Job",
        "backoffLimit: 0",
        "nvidia.com/gpu:",
        "claimName: hf-weights",
        "secretKeyRef:",
        "activeDeadlineSeconds:",
        "app.kubernetes.io/managed-by: orch",
        "registry.local/team/serve:v1",
    ] {
        assert!(yaml.contains(want), "`{want}` missing:\n{yaml}");
    }
    assert!(!yaml.contains(TOKEN));
    assert!(c.fake.requests().is_empty(), "nothing is applied");
}

#[test]
fn kubernetes_cells_are_costed_at_the_users_price() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::h100("gpu-1", 8)], |b| b);
    let prices = c.tmp.path().join("prices.yaml");
    std::fs::write(&prices, "backends:\n  kubernetes:\n    gpu: {H100: 0.001}\n").unwrap();
    let suite = c.suite(
        "paid",
        "name: paid\ngpus: [\"H100:2\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'sleep 1; echo hi'}\n",
    );
    let out = c
        .run_cmd(&suite, &["--prices", prices.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cell = &cells(&v)[0];
    // The agent finds no GPU on this host: the cell still ran and is costed
    // at 2 x 0.001 USD per GPU-second for its whole time.
    let usd = cell["cost"]["usd"].as_f64().unwrap_or_else(|| panic!("{cell:#}"));
    assert!(usd >= 0.002, "{cell:#}");
    c.assert_nothing_left();
}

#[test]
fn an_evicted_pod_is_a_failed_cell_named_evicted_with_its_logs() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "evict",
        "name: evict\nbenchmarks:\n  - name: victim\n    workload: {shell: 'echo before-eviction; sleep 120'}\n",
    );
    let child = c.spawn(&suite);
    let pod = c.wait_running();
    std::thread::sleep(Duration::from_millis(1500));
    c.fake
        .evict("bench", &pod, "The node was low on resource: memory.");
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "failed", "{cell:#}");
    assert_eq!(cell["failure"]["kind"], "evicted", "{cell:#}");
    assert_eq!(cell["diagnosis"]["kind"], "evicted", "{cell:#}");
    let stdout = std::fs::read_to_string(cell_dir(&c.store(), &v, "victim.cpu").join("stdout.log")).unwrap();
    assert!(stdout.contains("before-eviction"), "{stdout}");
    c.assert_nothing_left();
}

#[test]
fn plan_and_run_check_the_weights_pvc_on_the_cluster() {
    if !ready() {
        return;
    }
    let tmp_pvc = tempfile::tempdir().unwrap();
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| {
        b.pvc("hf-weights", tmp_pvc.path())
    });
    let suite = c.suite(
        "weights",
        "name: weights\nmodels: [{repo: org/tiny, revision: main}]\nkubernetes: {weights_pvc: hf-weights}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let plan = |c: &Cluster| {
        c.orch()
            .args(["plan", "-f"])
            .arg(&suite)
            .args(["--backend", "kubernetes", "--json"])
            .output()
            .unwrap()
    };
    // Empty PVC: missing; `orch run` refuses before any cell.
    let out = plan(&c);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["models"][0]["complete"], false, "{v:#}");
    let run = c.run_cmd(&suite, &[]).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("org/tiny@main"));
    // What `orch setup` leaves: the ref and the completeness marker.
    let repo = tmp_pvc.path().join("models--org--tiny");
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join(".orch")).unwrap();
    std::fs::write(repo.join("refs/main"), "0123456789abcdef0123456789abcdef01234567").unwrap();
    std::fs::write(
        repo.join(".orch/complete-0123456789abcdef0123456789abcdef01234567.json"),
        "{}",
    )
    .unwrap();
    let out = plan(&c);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["models"][0]["complete"], true, "{v:#}");
    assert_eq!(
        v["models"][0]["commit"],
        "0123456789abcdef0123456789abcdef01234567"
    );
    c.assert_nothing_left();
}

#[test]
fn a_busy_cluster_is_a_queue_not_a_failure() {
    if !ready() {
        return;
    }
    // One node with 8 GPUs, two H100:8 cells at once: the second waits for
    // the first's GPUs (unschedulable for a while, never for good).
    let c = cluster(vec![FakeNode::h100("gpu-1", 8)], |b| b);
    let suite = c.suite(
        "queue",
        "name: queue\nconcurrency: 2\ngpus: [\"H100:8\"]\nbenchmarks:\n  - name: hold\n    workload: {shell: 'sleep 3; echo held'}\n    matrix:\n      i: [1, 2]\n",
    );
    let (out, v) = c.run(&suite, &[]);
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    for cell in cells(&v) {
        assert_eq!(cell["status"], "succeeded", "{cell:#}");
    }
    c.assert_nothing_left();
}

#[test]
fn setup_fills_the_weights_pvc_from_a_job_in_the_cluster() {
    if !ready() {
        return;
    }
    use orch_testkit::fixtures::{write_test_model, ModelOptions};
    let pvc = tempfile::tempdir().unwrap();
    let hub_root = tempfile::tempdir().unwrap();
    write_test_model(hub_root.path(), "acme/tiny", &ModelOptions::tiny()).unwrap();
    let hub = orch_testkit::hub::HubServer::start(hub_root.path());
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.pvc("hf-weights", pvc.path()));
    let suite = c.suite(
        "setup",
        "name: setup\nmodels: [{repo: acme/tiny}]\nkubernetes: {weights_pvc: hf-weights}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let out = c
        .orch()
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_TOKEN", TOKEN)
        .args(["setup", "-f"])
        .arg(&suite)
        .args(["--backend", "kubernetes"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains(TOKEN));
    // The weights are on the PVC, complete, and `orch plan` finds them there.
    let repo = pvc.path().join("models--acme--tiny");
    let commit = std::fs::read_to_string(repo.join("refs/main")).unwrap();
    assert!(repo
        .join(format!(".orch/complete-{}.json", commit.trim()))
        .is_file());
    let plan = c
        .orch()
        .args(["plan", "-f"])
        .arg(&suite)
        .args(["--backend", "kubernetes", "--json"])
        .output()
        .unwrap();
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    // The token went in a Secret by reference, and the Secret is gone.
    let reqs = c.fake.requests();
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("POST /api/v1/namespaces/bench/secrets")),
        "{reqs:?}"
    );
    c.assert_nothing_left();
    assert!(c.fake.objects("secrets").is_empty());
}

/// The agent in images like real GPU images on a cluster: Debian roots of two
/// glibc versions and a glibc-less one, a GPU node whose device plugin and
/// container toolkit give a pod its GPUs (`NVIDIA_VISIBLE_DEVICES`) and the
/// driver's NVML library (a stub reporting H100s) bound into the image's
/// library folder. A GPU cell names the stub's GPUs with telemetry; a CPU
/// cell succeeds (see `gpu_images.rs`).
#[test]
fn gpu_and_cpu_cells_in_real_images() {
    if !ready() || !orch_testkit::rootfs::require_tooling(orch_testkit::rootfs::debootstrap_available()) {
        return;
    }
    let stub = orch_testkit::gpu::nvml_stub().unwrap();
    let images = crate::gpu_images::image_roots("registry.local");
    let c = cluster(
        vec![FakeNode::h100("gpu-1", 8), FakeNode::cpu("cpu-1")],
        |mut b| {
            for (image, root, _) in &images {
                b = b.image(image, root);
            }
            b.nvml_stub(&stub)
        },
    );
    for (image, _, glibc) in &images {
        let suite = crate::gpu_images::suite(c.tmp.path(), image);
        let (out, v) = c.run(&suite, &[]);
        assert!(
            out.status.success(),
            "{image}: {}\n{v:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        crate::gpu_images::check_record(&v, glibc.as_deref(), false, image);
    }
    c.assert_nothing_left();
}
