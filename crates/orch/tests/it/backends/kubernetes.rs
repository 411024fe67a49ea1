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
//!
//! Every cluster enforces the shipped Role (`deploy/kubernetes/orch-role.yaml`,
//! as RBAC does: a verb the Role lacks is `403 Forbidden`), so each test is
//! also a test that the Role grants what orch calls. The API server going away
//! (`FakeKube::drop_connections`) and disruptions (`FakeKube::disrupt`) have
//! tests of their own at the end. A `nodes: 2` cell runs as an Indexed Job
//! with a headless Service: its ranks resolve each other by DNS name and
//! talk over TCP.

use crate::support::{container_agent, json, repo, wait_for};
use orch_testkit::kube::{FakeAutoscaler, FakeKube, FakeNode};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const AGENT_IMAGE: &str = "registry.local/orch/orch-agent:test";
const TOKEN: &str = "hf_CANARY-k8s-NEVER-SHOWN-7731";

fn ready() -> bool {
    crate::support::containers_ready("kubernetes tests")
}

/// The agent image's file system, FROM scratch: the static agent at
/// `/orch-agent` and the `orch` the setup Job runs at `/orch-cli` (here this
/// build's, dynamically linked: it runs in the glibc image the Job uses).
fn agent_image_root(tmp: &Path) -> PathBuf {
    let root = tmp.join("agent-image");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::copy(container_agent(), root.join("orch-agent")).unwrap();
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

/// The Role orch ships for a namespace (`bench`).
fn shipped_role() -> PathBuf {
    repo().join("deploy/kubernetes/orch-role.yaml")
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
        .role(shipped_role())
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
    /// [`crate::support::orch`] at this cluster, its agent image and registry.
    fn orch(&self) -> Command {
        let mut c = crate::support::orch();
        c.env("HOME", self.tmp.path())
            .env("KUBECONFIG", &self.kubeconfig)
            .env("ORCH_AGENT_IMAGE", AGENT_IMAGE)
            .env("ORCH_REGISTRY", "registry.local");
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
        let v = json(&out);
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
        wait_for(
            "the pod never ran",
            Duration::from_secs(30),
            Duration::from_millis(100),
            || self.fake.running_pods().first().cloned(),
        )
    }

    /// Nothing of orch's is left on the cluster.
    fn assert_nothing_left(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let jobs = self.fake.objects("jobs");
            let pods = self.fake.objects("pods");
            let services = self.fake.objects("services");
            if jobs.is_empty()
                && pods.is_empty()
                && services.is_empty()
                && self.fake.running_pods().is_empty()
            {
                return;
            }
            if Instant::now() > deadline {
                panic!("left on the cluster: jobs {jobs:?}\npods {pods:?}\nservices {services:?}");
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

/// The run's watch never hears that the pod ended (a lost watch event; the
/// fake's bookmarks once ran ahead of a change and lost one pod's end in a
/// 5,000-cell run): the cell read its log again every 300 ms for ever. Once
/// its log stream ended and the watch disagrees, the API server is asked.
#[test]
fn a_pod_end_the_watch_never_sends_still_ends_the_cell() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.lose_pod_endings_in_watches());
    let suite = c.suite(
        "lost",
        "name: lost\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi; echo ORCH_METRIC x=1'}\n",
    );
    let mut child = c.spawn(&suite);
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let logs = c.fake.requests().iter().filter(|r| r.contains("/log")).count();
            panic!("the run still waits after 120 s ({logs} log requests)");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = child.wait_with_output().unwrap();
    let v = json(&out);
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "succeeded", "{cell:#}");
    assert_eq!(cell["metrics"]["x"], 1.0, "{cell:#}");
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
        // No autoscaler: the grace for its word, shortened (90s by default).
        "name: big\ngpus: [\"H100:8\"]\nkubernetes: {unschedulable_grace: 3s}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
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

/// A GPU pool at zero: the scheduler says `FailedScheduling`, the cluster
/// autoscaler `TriggeredScaleUp`, the node comes later (the documented
/// +15 s / +45 s timeline, quickened): the cell waits for it and runs. The
/// grace for the autoscaler's word is shorter than the node's arrival, so
/// only the scale-up event keeps the cell waiting.
#[test]
fn a_gpu_cell_waits_for_the_autoscalers_new_node_and_runs() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| {
        b.autoscaler(
            FakeAutoscaler::gpu_pool(FakeNode::h100("gpu-pool-1", 8))
                .timings(Duration::from_secs(2), Duration::from_secs(25)),
        )
    });
    let suite = c.suite(
        "scale",
        "name: scale\ngpus: [\"H100:1\"]\nkubernetes: {unschedulable_grace: 10s}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let (out, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(out.status.code(), Some(0), "{cell:#}");
    assert_eq!(cell["status"], "succeeded", "{cell:#}");
    c.assert_nothing_left();
}

/// The autoscaler will not add a node (`NotTriggerScaleUp`, its pool at
/// its maximum): the cell fails `unschedulable` with the autoscaler's words
/// without waiting out the grace.
#[test]
fn a_cell_the_autoscaler_will_not_place_fails_with_its_words() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| {
        b.autoscaler(
            FakeAutoscaler::gpu_pool(FakeNode::h100("gpu-pool-1", 8))
                .timings(Duration::from_secs(2), Duration::from_secs(12))
                .max(0),
        )
    });
    let suite = c.suite(
        "noscale",
        "name: noscale\ngpus: [\"H100:1\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let t0 = Instant::now();
    let (out, v) = c.run(&suite, &[]);
    let took = t0.elapsed();
    assert_eq!(out.status.code(), Some(1));
    let cell = &cells(&v)[0];
    assert_eq!(cell["failure"]["kind"], "unschedulable", "{cell:#}");
    let msg = cell["failure"]["message"].as_str().unwrap();
    assert!(msg.contains("autoscaler"), "{msg}");
    // The default grace (90 s) is not waited out.
    assert!(took < Duration::from_secs(60), "took {took:?}");
    c.assert_nothing_left();
}

/// A task longer than Linux lets one argument be (128 KiB): two 60 KiB
/// environment values make a 160 KiB `--task-b64`. It travels as a file of
/// its own ConfigMap instead, and the cell runs.
#[test]
fn a_task_too_long_for_one_argument_travels_as_a_file() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let (a, b) = ("a".repeat(60 * 1024), "b".repeat(60 * 1024));
    let suite = c.suite(
        "bigtask",
        &format!(
            "name: bigtask\nenv: {{BIG_A: {a}, BIG_B: {b}}}\nbenchmarks:\n  - name: hello\n    workload: {{shell: 'echo ORCH_METRIC len=$((${{#BIG_A}} + ${{#BIG_B}}))'}}\n"
        ),
    );
    let (out, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(out.status.code(), Some(0), "{cell:#}");
    assert_eq!(cell["metrics"]["len"], 2.0 * 60.0 * 1024.0, "{cell:#}");
    let jobs = c.fake.created("jobs");
    let args = jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("\"--task\",\"/orch/blobs/"), "{args}");
    assert!(!args.contains("--task-b64"), "{args}");
    c.assert_nothing_left();
    assert!(
        c.fake.objects("configmaps").is_empty(),
        "the task's ConfigMap was left"
    );
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
    // Billed from the kubelet's start of the pod's containers, not from the Job's creation.
    assert!(cell["info"]["container_started_at"].is_string(), "{cell:#}");
    assert!(
        cell["cost"]["billed_s"].as_f64().unwrap() <= cell["duration_s"].as_f64().unwrap(),
        "{cell:#}"
    );
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
    // The probe's pod was seen in a watch of its own (by its Job's label),
    // listed once for it, not polled.
    let by_label: Vec<String> = c
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.contains("/pods?") && r.contains("labelSelector") && r.contains("orch-probe"))
        .collect();
    assert!(by_label.iter().any(|r| r.contains("watch=true")), "{by_label:#?}");
    assert_eq!(
        by_label.iter().filter(|r| !r.contains("watch=true")).count(),
        1,
        "{by_label:#?}"
    );
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
    let images = super::gpu_images::image_roots("registry.local");
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
        let suite = super::gpu_images::suite(c.tmp.path(), image);
        let (out, v) = c.run(&suite, &[]);
        assert!(
            out.status.success(),
            "{image}: {}\n{v:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        super::gpu_images::check_record(&v, glibc.as_deref(), false, image);
    }
    c.assert_nothing_left();
}

/// Standard base64 (the Job's `--task-b64`), decoded.
fn unbase64(s: &str) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ABC.iter().position(|a| *a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// The task of every Job orch created (from `--task-b64` of its cell container).
fn job_tasks(fake: &FakeKube) -> Vec<Value> {
    fake.created("jobs")
        .iter()
        .filter_map(|j| {
            let c = j["spec"]["template"]["spec"]["containers"]
                .as_array()?
                .iter()
                .find(|c| c["name"] == "cell")?
                .clone();
            let args: Vec<String> = serde_json::from_value(c["args"].clone()).ok()?;
            let b64 = args.iter().skip_while(|a| *a != "--task-b64").nth(1)?;
            serde_json::from_slice(&unbase64(b64)).ok()
        })
        .collect()
}

/// Every Job's task names no folder of `hosts` and lists its files under
/// `/orch/files`; the Job mounts the run's ConfigMaps at `/orch/blobs`.
fn assert_jobs_carry_files(fake: &FakeKube, hosts: &[&Path], what: &str) {
    let jobs = fake.created("jobs");
    assert!(!jobs.is_empty(), "{what}: no job");
    let tasks = job_tasks(fake);
    assert_eq!(tasks.len(), jobs.len(), "{what}: a job without a task");
    for task in &tasks {
        let text = task.to_string();
        for host in hosts {
            let host = host.to_string_lossy().into_owned();
            // A landing place keeps the files' layout (`/orch/files/<their folders>`): not a
            // host path.
            let rest = text.replace(&format!("{}{host}", orch_files::CELL_ROOT), "");
            assert!(
                !rest.contains(&host),
                "{what}: the task names `{host}`:\n{task:#}"
            );
        }
        assert_eq!(
            task["env"]["ORCH_FILES"],
            orch_files::CELL_ROOT,
            "{what}: {task:#}"
        );
        assert_eq!(task["files"]["blobs"], orch_files::CELL_BLOBS, "{what}: {task:#}");
        let files = task["files"]["files"].as_array().cloned().unwrap_or_default();
        assert!(!files.is_empty(), "{what}: {task:#}");
        for f in &files {
            assert!(
                f["path"].as_str().unwrap().starts_with(orch_files::CELL_ROOT),
                "{what}: {f}"
            );
        }
        // `.gitignore`d files stay home.
        assert!(!task["files"].to_string().contains("big.bin"), "{what}: {task:#}");
    }
    let made: Vec<String> = fake
        .created("configmaps")
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for j in &jobs {
        let vols = j["spec"]["template"]["spec"]["volumes"].as_array().unwrap();
        let blobs = vols
            .iter()
            .find(|v| v["name"] == "orch-blobs")
            .unwrap_or_else(|| panic!("{what}: no blobs volume in {j:#}"));
        for s in blobs["projected"]["sources"].as_array().unwrap() {
            let name = s["configMap"]["name"].as_str().unwrap();
            assert!(made.iter().any(|m| m == name), "{what}: {name} not created");
        }
    }
}

/// What must match between backends: each cell's status, its variants'
/// statuses and rounds, and the names of its metrics.
fn shape(record: &Value) -> Vec<(String, String, String, Vec<String>)> {
    cells(record)
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

/// A workdir with a file over one ConfigMap's size (it travels in chunks), a
/// nested file and a `.gitignore`d one that stays home.
fn bench_folder(dir: &Path) -> PathBuf {
    let bench = dir.join("bench");
    std::fs::create_dir_all(bench.join("sub")).unwrap();
    std::fs::create_dir_all(bench.join("cache")).unwrap();
    std::fs::write(bench.join("data.txt"), "from the host\n").unwrap();
    std::fs::write(bench.join("sub/more.txt"), "nested\n").unwrap();
    std::fs::write(bench.join(".gitignore"), "cache/\n").unwrap();
    std::fs::write(bench.join("cache/big.bin"), vec![1u8; 1 << 16]).unwrap();
    let mut x = 0x2545_f491_u32;
    let big: Vec<u8> = (0..(2 << 20) + 123)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    std::fs::write(bench.join("weights.dat"), big).unwrap();
    bench
}

/// A workdir travels in the run's ConfigMaps (a 2 MiB file in chunks over
/// several of them), each created once for the two cells that name it; the
/// cells read the files at `/orch/files`, their Jobs name no host path, and
/// the run leaves no ConfigMap behind. A killed run's ConfigMaps go with
/// `orch down`.
#[test]
fn the_cells_files_travel_in_configmaps_and_orch_down_removes_them() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    bench_folder(c.tmp.path());
    let suite = c.suite(
        "files",
        r#"name: files
image: debian:bookworm-slim
concurrency: 1
benchmarks:
  - name: a
    workload: {shell: 'cat data.txt sub/more.txt; wc -c < weights.dat; echo "at $(pwd) files=$ORCH_FILES"; test -e cache/big.bin || echo no-cache', workdir: bench}
  - name: b
    workload: {shell: 'cat data.txt; wc -c < weights.dat', workdir: bench}
"#,
    );
    let (out, v) = c.run(&suite, &[]);
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in ["a.cpu", "b.cpu"] {
        let stdout = std::fs::read_to_string(cell_dir(&c.store(), &v, id).join("stdout.log")).unwrap();
        assert!(stdout.contains("from the host\n"), "{id}: {stdout}");
        assert!(
            stdout.contains(&format!("{}\n", (2 << 20) + 123)),
            "{id}: {stdout}"
        );
    }
    let a = std::fs::read_to_string(cell_dir(&c.store(), &v, "a.cpu").join("stdout.log")).unwrap();
    assert!(a.contains("nested\n") && a.contains("no-cache"), "{a}");
    assert!(a.contains("at /orch/files/bench files=/orch/files"), "{a}");
    assert_jobs_carry_files(&c.fake, &[c.tmp.path()], "files");
    // Each ConfigMap sent once for both cells, under the API server's limit.
    let made = c.fake.created("configmaps");
    assert!(made.len() >= 3, "2 MiB in chunks: {} ConfigMaps", made.len());
    let posts = c
        .fake
        .requests()
        .iter()
        .filter(|r| r.starts_with("POST /api/v1/namespaces/bench/configmaps"))
        .count();
    assert_eq!(posts, made.len(), "unchanged files are not sent again");
    for m in &made {
        assert_eq!(
            m["metadata"]["labels"]["orch.dev/run"], v["id"],
            "{}",
            m["metadata"]
        );
        let keys = m["binaryData"].as_object().unwrap();
        assert!(
            keys.keys().all(|k| k.len() == 64 || k[64..].starts_with('.')),
            "{keys:?}"
        );
    }
    assert!(
        c.fake.objects("configmaps").is_empty(),
        "the run cleans up its ConfigMaps"
    );
    c.assert_nothing_left();

    // A killed run leaves its ConfigMaps (and Job) until `orch down`.
    let left = c.suite(
        "left-files",
        "name: left-files\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: sleepy\n    workload: {shell: 'sleep 120', workdir: bench}\n",
    );
    let mut child = c
        .run_cmd(&left, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.wait_running();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!c.fake.objects("configmaps").is_empty());
    let out = c
        .orch()
        .args(["down", "latest", "--store"])
        .arg(c.store())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("ConfigMap"), "{said}");
    assert!(c.fake.objects("configmaps").is_empty());
    c.assert_nothing_left();
}

/// `--dry-run` lists what travels and the ConfigMaps (names, keys, sizes;
/// no data), prints Jobs whose tasks name no host path and mount the
/// blobs, and contacts nothing; files over the backend's cap are refused.
#[test]
fn dry_run_lists_the_files_and_their_configmaps_without_host_paths_in_the_jobs() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    bench_folder(c.tmp.path());
    let suite = c.suite(
        "dry-files",
        "name: dry-files\nimage: debian:bookworm-slim\nbenchmarks:\n  - name: a\n    workload: {shell: 'cat data.txt', workdir: bench}\n",
    );
    let out = c.run_cmd(&suite, &["--dry-run"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "# files that travel with a.cpu",
        "/orch/files/bench/data.txt",
        "/orch/files/bench/weights.dat",
        "ConfigMap `orch-files-",
        "mountPath: /orch/blobs",
        "projected:",
        "name: orch-files-",
        "mountPath: /orch/files",
    ] {
        assert!(text.contains(want), "`{want}` missing:\n{text}");
    }
    assert!(!text.contains("big.bin"), "{text}");
    let jobs = &text[text.find("\n---\n").expect("a Job")..];
    let host = c.tmp.path().to_string_lossy().into_owned();
    assert!(!jobs.contains(&host), "a Job names `{host}`:\n{jobs}");
    // The task inside names none either.
    // `- >-` then the value's line(s), or `- VALUE`.
    let mut lines = jobs.lines().skip_while(|l| !l.contains("--task-b64")).skip(1);
    let first = lines.next().expect("--task-b64").trim().trim_start_matches("- ");
    let b64: String = if first.starts_with('>') || first.starts_with('|') {
        lines
            .map(str::trim)
            .take_while(|l| !l.starts_with('-') && !l.contains(':'))
            .collect()
    } else {
        first.trim_matches('\'').trim_matches('"').to_string()
    };
    let task = String::from_utf8(unbase64(&b64)).unwrap();
    assert!(
        !task.contains(&host) && task.contains("/orch/files/bench"),
        "{task}"
    );
    assert!(c.fake.requests().is_empty(), "nothing is applied");

    // Over the backend's cap: refused before anything is sent.
    std::fs::write(c.tmp.path().join("bench/huge.dat"), vec![3u8; 65 << 20]).unwrap();
    let out = c.run_cmd(&suite, &["--dry-run"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("over the kubernetes backend's limit of 64.0 MiB"),
        "{err}"
    );
    assert!(err.contains("hint:") && err.contains("`orch build`"), "{err}");
    assert!(c.fake.requests().is_empty(), "nothing is applied");
}

/// A suite's workdir and prompt file (`workdir_toy`) and the stand-in's
/// local repository and patches (`standin_toy`: this checkout as a git
/// bundle of about 3 MiB, in chunks) travel to the cluster in ConfigMaps:
/// the cell succeeds with the same variants and metrics as on `--backend
/// local`, in an image root that has none of this machine's files, its
/// Job's task names no host path, and the run leaves no ConfigMap behind.
#[test]
fn the_travelling_suites_run_on_kubernetes_as_on_local() {
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
    for name in ["standin", "workdir"] {
        let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.image(image, &root));
        let suite_dir = c.tmp.path().join("suite");
        let manifest = match name {
            "workdir" => orch_testkit::suites::workdir_toy(&suite_dir, image),
            _ => orch_testkit::suites::standin_toy(&suite_dir, image),
        };
        let local = c
            .orch()
            .env("ORCH_WEIGHTS_DIR", "/nonexistent-orch-weights")
            .args(["run", "--json", "--backend", "local", "-f"])
            .arg(&manifest)
            .arg("--store")
            .arg(c.tmp.path().join("store-local"))
            .output()
            .unwrap();
        assert_eq!(
            local.status.code(),
            Some(0),
            "{name} local: {}",
            String::from_utf8_lossy(&local.stderr)
        );
        let local: Value = serde_json::from_slice(&local.stdout).unwrap();
        let (out, kube) = c.run(&manifest, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name} kubernetes: {}\n{kube:#}",
            String::from_utf8_lossy(&out.stderr)
        );
        for cell in cells(&kube) {
            assert_eq!(cell["status"], "succeeded", "{name}: {cell:#}");
        }
        assert_eq!(
            shape(&kube),
            shape(&local),
            "{name}: kubernetes {kube}\nlocal {local}"
        );
        assert_jobs_carry_files(&c.fake, &[&suite_dir, &orch_testkit::suites::checkout()], name);
        assert!(!c.fake.created("configmaps").is_empty(), "{name}");
        assert!(c.fake.objects("configmaps").is_empty(), "{name}: ConfigMaps left");
        c.assert_nothing_left();
    }
}

/// A one-cell suite whose command prints `n` numbered lines, one every 0.2 s,
/// then a metric.
fn ticking_suite(c: &Cluster, n: u32) -> PathBuf {
    c.suite(
        "ticks",
        &format!(
            "name: ticks\nbenchmarks:\n  - name: ticks\n    workload:\n      shell: 'for i in $(seq 1 {n}); do echo \"tick $i\"; sleep 0.2; done; echo \"ORCH_METRIC ticks={n}\"'\n"
        ),
    )
}

fn ticks(n: u32) -> String {
    (1..=n).map(|i| format!("tick {i}\n")).collect()
}

#[test]
fn a_ten_second_api_server_drop_mid_run_fails_nothing() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = ticking_suite(&c, 100);
    let child = c.spawn(&suite);
    let pod = c.wait_running();
    std::thread::sleep(Duration::from_millis(1500));
    // Watches, polls and the log stream all cut; new connections reset.
    c.fake.drop_connections(Duration::from_secs(10));
    assert!(c.fake.is_down());
    // The pod runs on through it.
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.fake.running_pods().contains(&pod), "the pod was stopped");
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "succeeded", "{cell:#}");
    let dir = cell_dir(&c.store(), &v, "ticks.cpu");
    let stdout = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(stdout.starts_with(&ticks(100)), "{stdout}");
    assert!(
        cell["info"].get("kubernetes_files_incomplete").is_none(),
        "{cell:#}"
    );
    assert_eq!(cell["metrics"]["ticks"], 100.0, "{cell:#}");
    let klog = std::fs::read_to_string(dir.join("kubernetes.log")).unwrap_or_default();
    assert!(!klog.contains("api_unreachable"), "{klog}");
    // The log was read again after the drop.
    let log_calls = c.fake.requests().iter().filter(|r| r.contains("/log?")).count();
    assert!(log_calls >= 2, "{log_calls} log requests");
    c.assert_nothing_left();
}

#[test]
fn a_drop_when_the_job_is_deleted_is_waited_out_and_no_job_is_left() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    c.fake.drop_connections_on(
        "DELETE /apis/batch/v1/namespaces/bench/jobs/",
        Duration::from_secs(5),
    );
    let suite = ticking_suite(&c, 5);
    let (out, v) = c.run(&suite, &[]);
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(cells(&v)[0]["status"], "succeeded", "{v:#}");
    // The deletion that got no answer was made again, and went through.
    let job = cells(&v)[0]["info"]["kubernetes_job"]
        .as_str()
        .unwrap()
        .to_string();
    let deletes = c
        .fake
        .requests()
        .iter()
        .filter(|r| r.starts_with(&format!("DELETE /apis/batch/v1/namespaces/bench/jobs/{job}")))
        .count();
    assert!(deletes >= 2, "{deletes} deletions of {job}");
    assert!(c.fake.objects("jobs").is_empty(), "{:?}", c.fake.objects("jobs"));
    c.assert_nothing_left();
}

#[test]
fn an_api_server_away_past_the_budget_fails_the_cell_api_unreachable_and_leaves_nothing() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "away",
        "name: away\nbenchmarks:\n  - name: sleepy\n    workload: {shell: 'echo started; sleep 120'}\n",
    );
    let child = c
        .run_cmd(&suite, &["--json"])
        .env("ORCH_KUBERNETES_API_BUDGET", "3")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.wait_running();
    std::thread::sleep(Duration::from_millis(1000));
    c.fake.drop_connections(Duration::from_secs(5));
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "failed", "{cell:#}");
    assert_eq!(cell["failure"]["kind"], "api_unreachable", "{cell:#}");
    let message = cell["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains("API server could not be reached") && message.contains("ORCH_KUBERNETES_API_BUDGET"),
        "{message}"
    );
    // The Job's deletion went on past the cell's end until the API server came back.
    c.assert_nothing_left();
}

#[test]
fn a_disrupted_pod_is_named_disrupted_and_resume_runs_it_again() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    // The first attempt is drained a moment in; the resumed one runs to its end.
    let suite = c.suite(
        "drain",
        "name: drain\nbenchmarks:\n  - name: victim\n    workload: {shell: 'echo attempt; sleep 6; echo ORCH_METRIC done=1'}\n",
    );
    let child = c.spawn(&suite);
    let pod = c.wait_running();
    std::thread::sleep(Duration::from_millis(1500));
    c.fake
        .disrupt("bench", &pod, "EvictionByEvictionAPI", "Eviction API: evicting");
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let cell = &cells(&v)[0];
    assert_eq!(cell["failure"]["kind"], "disrupted", "{cell:#}");
    assert_eq!(cell["status"], "cancelled", "{cell:#}");
    let message = cell["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains("EvictionByEvictionAPI") && message.contains("Eviction API: evicting"),
        "{message}"
    );
    c.assert_nothing_left();
    // `--resume` runs the disrupted cell again, to its end.
    let out = c
        .orch()
        .args(["run", "--resume", v["id"].as_str().unwrap(), "--json", "--store"])
        .arg(c.store())
        .args(["--backend", "kubernetes"])
        .output()
        .unwrap();
    let again: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let requests = c.fake.requests();
    let creates = requests
        .iter()
        .filter(|r| r.starts_with("POST /apis/batch/v1/namespaces/bench/jobs"))
        .count();
    assert_eq!(creates, 2, "the cell ran again: {again:#}");
    let cell = &cells(&again)[0];
    assert_eq!(cell["status"], "succeeded", "{cell:#}");
    assert_eq!(cell["metrics"]["done"], 1.0, "{cell:#}");
    c.assert_nothing_left();
}

#[test]
fn a_role_without_pods_log_get_fails_with_the_missing_permission_named() {
    if !ready() {
        return;
    }
    let shipped = std::fs::read_to_string(shipped_role()).unwrap();
    let without_log = shipped.replace(
        "  - apiGroups: [\"\"]\n    resources: [\"pods/log\"]\n    verbs: [\"get\"]\n",
        "",
    );
    assert_ne!(without_log, shipped, "the shipped Role grants `get pods/log`");
    let dir = tempfile::tempdir().unwrap();
    let role = dir.path().join("role.yaml");
    std::fs::write(&role, without_log).unwrap();
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.role(&role));
    let suite = c.suite(
        "nolog",
        "name: nolog\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hello'}\n",
    );
    let (_, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "failed", "{cell:#}");
    let message = cell["failure"]["message"].as_str().unwrap();
    assert!(
        message.contains("cannot get resource \"pods/log\" in API group \"\" in the namespace \"bench\""),
        "{message}"
    );
    c.assert_nothing_left();
}

/// An AKS-like cluster: GPU nodes without GPU Feature Discovery, labelled
/// `kubernetes.azure.com/accelerator: nvidia` and an instance type orch does
/// not know. `gpu_affinity: auto` (the default) leaves the GPU-type affinity
/// out (with a note) and the cell runs; `required` insists, and the pod is
/// unschedulable in the scheduler's words; the EKS Auto Mode label of a
/// second cluster is matched as it is.
#[test]
fn gpu_nodes_without_a_gpu_type_label_are_used_under_auto_and_refused_under_required() {
    if !ready() {
        return;
    }
    let mut aks = FakeNode::h100("aks-gpu-1", 2);
    aks.labels.retain(|k, _| !k.starts_with("nvidia.com/"));
    aks.labels
        .insert("kubernetes.azure.com/accelerator".into(), "nvidia".into());
    aks.labels.insert(
        "node.kubernetes.io/instance-type".into(),
        "Standard_NC4as_T4_v3".into(),
    );
    let c = cluster(vec![aks], |b| b);
    let suite = c.suite(
        "aks",
        "name: aks\ngpus: [\"H100:1\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo on-a-gpu-node'}\n",
    );
    let (out, v) = c.run(&suite, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{v:#}");
    assert_eq!(cells(&v)[0]["status"], "succeeded", "{v:#}");
    assert!(
        stderr.contains("note: none of the cluster's 1 GPU node(s) shows its GPU type"),
        "{stderr}"
    );
    c.assert_nothing_left();

    let required = c.suite(
        "aks-required",
        "name: aksreq\ngpus: [\"H100:1\"]\nkubernetes: {gpu_affinity: required, unschedulable_grace: 3s}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let (out, v) = c.run(&required, &[]);
    assert!(!out.status.success(), "{v:#}");
    assert_eq!(cells(&v)[0]["failure"]["kind"], "unschedulable", "{v:#}");
    c.assert_nothing_left();

    // EKS Auto Mode's own label picks the node.
    let mut eks = FakeNode::h100("eks-gpu-1", 1);
    eks.labels.retain(|k, _| !k.starts_with("nvidia.com/"));
    eks.labels
        .insert("eks.amazonaws.com/instance-gpu-name".into(), "h100".into());
    let c = cluster(vec![eks], |b| b);
    let suite = c.suite(
        "eks",
        "name: eks\ngpus: [\"H100:1\"]\nkubernetes: {gpu_affinity: required}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let (out, v) = c.run(&suite, &[]);
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.assert_nothing_left();
}

/// A `nodes: 2` cell: rank 0 listens on `MASTER_PORT`, rank 1 connects to
/// `MASTER_ADDR` (rank 0's DNS name under the headless Service) and says
/// hello; each prints its rendezvous variables. `rank1`: what rank 1 does
/// after.
fn two_node_suite(c: &Cluster, name: &str, rank1: &str) -> PathBuf {
    c.suite(
        name,
        &format!(
            r#"name: {name}
benchmarks:
  - name: ring
    nodes: 2
    workload:
      shell: |
        echo "rank=$NODE_RANK/$RANK world=$WORLD_SIZE nnodes=$NNODES nproc=$NPROC_PER_NODE master=$MASTER_ADDR:$MASTER_PORT index=$JOB_COMPLETION_INDEX host=$HOSTNAME"
        if [ "$NODE_RANK" = 0 ]; then
          # Rank 0 answers `ack` to what it is told; a connection that says
          # nothing is not the hello (under load a hello could be lost while its
          # sender took it as sent: rank 1 now waits for the `ack`).
          msg=""; until [ -n "$msg" ]; do msg=$(echo ack | nc -l -p "$MASTER_PORT"); done
          echo "rank 0 got: $msg"
          sleep 0.5
        else
          i=0
          until [ "$(echo "hello from rank $NODE_RANK" | nc -w 2 "$MASTER_ADDR" "$MASTER_PORT")" = ack ]; do
            i=$((i+1)); [ $i -gt 150 ] && exit 7; sleep 0.2
          done
          {rank1}
        fi
        echo "ORCH_METRIC rank=$NODE_RANK"
"#
        ),
    )
}

#[test]
fn a_two_node_cell_runs_as_an_indexed_job_with_a_headless_service() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1"), FakeNode::cpu("cpu-2")], |b| b);
    let suite = two_node_suite(&c, "multi", "true");
    let (out, v) = c.run(&suite, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{v:#}");
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "succeeded", "{cell:#}");
    // Rank 0's result is the cell's.
    assert_eq!(cell["metrics"]["rank"], 0.0, "{cell:#}");
    let job = cell["info"]["kubernetes_job"].as_str().unwrap().to_string();
    assert_eq!(cell["info"]["kubernetes_service"], job.as_str(), "{cell:#}");
    let nodes = cell["info"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{cell:#}"));
    assert_eq!(nodes.len(), 2, "{cell:#}");
    for (i, n) in nodes.iter().enumerate() {
        assert_eq!(n["rank"], i, "{n}");
        assert!(n["host"].as_str().is_some_and(|h| h.starts_with("cpu-")), "{n}");
        assert_eq!(n["status"], "succeeded", "{n}");
        assert!(n["hardware"]["cpus"].as_u64().is_some(), "{n}");
    }
    // Both ranks' logs are in the cell folder: rank 1's under nodes/1/.
    let dir = cell_dir(&c.store(), &v, "ring.cpu");
    let master = format!("master={job}-0.{job}:29500");
    for (file, rank) in [(dir.join("stdout.log"), 0), (dir.join("nodes/1/stdout.log"), 1)] {
        let s = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            s.contains(&format!(
                "rank={rank}/{rank} world=2 nnodes=2 nproc=1 {master} index={rank} host={job}-{rank}"
            )),
            "{}: {s}",
            file.display()
        );
    }
    // A real TCP connection from rank 1 to MASTER_ADDR:MASTER_PORT.
    let s0 = std::fs::read_to_string(dir.join("stdout.log")).unwrap();
    assert!(s0.contains("rank 0 got: hello from rank 1"), "{s0}");
    assert!(dir.join("nodes/1/events.jsonl").is_file());
    // What was applied: an Indexed Job of 2 and the headless Service its pods live under.
    let applied = c.fake.created("jobs");
    let j = &applied[0]["spec"];
    assert_eq!(
        (
            j["completionMode"].as_str(),
            j["completions"].as_u64(),
            j["parallelism"].as_u64(),
            j["backoffLimit"].as_u64()
        ),
        (Some("Indexed"), Some(2), Some(2), Some(0)),
        "{j:#}"
    );
    assert_eq!(j["template"]["spec"]["subdomain"], job.as_str());
    let svc = &c.fake.created("services")[0];
    assert_eq!(svc["spec"]["clusterIP"], "None", "{svc:#}");
    assert_eq!(svc["spec"]["publishNotReadyAddresses"], true, "{svc:#}");
    assert_eq!(svc["spec"]["selector"]["orch.dev/job"], job.as_str(), "{svc:#}");
    assert_eq!(svc["metadata"]["ownerReferences"][0]["kind"], "Job", "{svc:#}");
    assert_eq!(
        svc["metadata"]["ownerReferences"][0]["uid"],
        applied[0]["metadata"]["uid"]
    );
    assert_eq!(svc["metadata"]["labels"]["app.kubernetes.io/managed-by"], "orch");
    c.assert_nothing_left();
}

#[test]
fn a_failed_rank_fails_the_cell_as_node_rank_failed_and_nothing_is_left() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1"), FakeNode::cpu("cpu-2")], |b| b);
    // Rank 1 fails; rank 0 would go on for a minute. (No listener here: pods of the
    // fake share this host's network, and the test above listens on 29500.)
    let suite = c.suite(
        "multifail",
        r#"name: multifail
benchmarks:
  - name: ring
    nodes: 2
    workload:
      shell: |
        echo "rank=$NODE_RANK world=$WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT"
        if [ "$NODE_RANK" = 1 ]; then sleep 1; echo rank 1 fails; exit 1; fi
        sleep 60
"#,
    );
    let t = Instant::now();
    let (out, v) = c.run(&suite, &[]);
    assert!(!out.status.success(), "{v:#}");
    assert!(
        t.elapsed() < Duration::from_secs(50),
        "the cell waited for rank 0: {:?}",
        t.elapsed()
    );
    let cell = &cells(&v)[0];
    assert_eq!(cell["status"], "failed", "{cell:#}");
    assert_eq!(cell["failure"]["kind"], "node_rank_failed", "{cell:#}");
    let msg = cell["failure"]["message"].as_str().unwrap();
    assert!(msg.starts_with("node rank 1 "), "{msg}");
    let nodes = cell["info"]["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{cell:#}"));
    assert_eq!(nodes.len(), 2, "{cell:#}");
    assert_eq!(nodes[1]["status"], "failed", "{cell:#}");
    let dir = cell_dir(&c.store(), &v, "ring.cpu");
    let s1 = std::fs::read_to_string(dir.join("nodes/1/stdout.log")).unwrap();
    assert!(s1.contains("rank 1 fails"), "{s1}");
    c.assert_nothing_left();
}

#[test]
fn a_two_node_cell_whose_second_pod_cannot_fit_is_unschedulable() {
    if !ready() {
        return;
    }
    // One GPU node of 8: the first rank's H100:8 fits, the second's never does.
    let c = cluster(vec![FakeNode::h100("gpu-1", 8), FakeNode::cpu("cpu-1")], |b| b);
    let suite = c.suite(
        "wide",
        "name: wide\nkubernetes: {unschedulable_grace: 3s}\nbenchmarks:\n  - name: big\n    nodes: 2\n    gpus: [\"H100:8\"]\n    workload: {shell: 'sleep 30'}\n",
    );
    let t = Instant::now();
    let (out, v) = c.run(&suite, &[]);
    assert!(!out.status.success(), "{v:#}");
    assert!(t.elapsed() < Duration::from_secs(40), "{:?}", t.elapsed());
    let cell = &cells(&v)[0];
    assert_eq!(cell["failure"]["kind"], "unschedulable", "{cell:#}");
    let msg = cell["failure"]["message"].as_str().unwrap();
    // Whichever rank the scheduler could not place is named.
    assert!(
        (msg.starts_with("node rank 0 of 2: ") || msg.starts_with("node rank 1 of 2: "))
            && msg.contains("no node can run the pod"),
        "{msg}"
    );
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    c.assert_nothing_left();
}

#[test]
fn dry_run_prints_a_two_node_cells_indexed_job_and_service_and_plan_accepts_it() {
    if !ready() {
        return;
    }
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b);
    let suite = two_node_suite(&c, "drymulti", "true");
    let out = c.run_cmd(&suite, &["--dry-run"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8_lossy(&out.stdout);
    for want in [
        "1 Job(s) and 1 headless Service(s) of multi-node cells",
        "completionMode: Indexed",
        "completions: 2",
        "parallelism: 2",
        "kind: Service",
        "clusterIP: None",
        "publishNotReadyAddresses: true",
        "name: MASTER_PORT",
        "fieldPath: metadata.annotations['batch.kubernetes.io/job-completion-index']",
    ] {
        assert!(yaml.contains(want), "`{want}` missing:\n{yaml}");
    }
    assert!(c.fake.requests().is_empty(), "nothing is applied");
    let plan = c
        .orch()
        .args(["plan", "-f"])
        .arg(&suite)
        .args(["--backend", "kubernetes"])
        .output()
        .unwrap();
    assert!(plan.status.success(), "{}", String::from_utf8_lossy(&plan.stderr));
}

/// 300 cells against an API server that refuses more than 20 requests a
/// second (a bucket of 5, as Priority and Fairness answers a client past its
/// share: 429 with `Retry-After`), orch's own limit set under it (10 a second)
/// but with a burst of 100: the burst at the start is refused, orch obeys the
/// `Retry-After`, no longer bursts, and is never refused after it; every cell
/// runs once and is recorded once, with a handful of requests a cell (one
/// watch per run, not per cell).
#[test]
fn three_hundred_cells_under_a_rate_limited_api_server_wait_as_told_and_run_once() {
    if !ready() {
        return;
    }
    const CELLS: usize = 300;
    // A bucket of 5, not 20: the start's 30 creates are refused unless they
    // reach the fake more than 40 ms apart (with 20, 16 ms: under 4 test
    // threads on 2 cores they once were, and nothing was refused). With 5,
    // kube-client's own retry under orch's limiter (since turned off) had
    // 1,283 of 2,196 requests refused: each refused request came back at
    // once after its `Retry-After`, all together, past orch's bucket.
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.rate_limit(20.0, 5.0));
    let values: Vec<String> = (1..=CELLS).map(|i| i.to_string()).collect();
    let suite = c.suite(
        "many",
        &format!(
            "name: many\nconcurrency: 30\nbenchmarks:\n  - name: noop\n    workload: {{noop: true}}\n    matrix:\n      i: [{}]\n",
            values.join(", ")
        ),
    );
    let out = c
        .run_cmd(&suite, &["--json"])
        .env("ORCH_KUBERNETES_QPS", "10")
        .env("ORCH_KUBERNETES_BURST", "100")
        .output()
        .unwrap();
    let v = json(&out);
    let throttled = c.fake.throttled();
    let counts = c.fake.request_counts();
    let total: u64 = counts.values().sum();
    let per_cell = total as f64 / CELLS as f64;
    eprintln!(
        "{total} requests for {CELLS} cells ({per_cell:.2} a cell), {} refused: {counts:?}",
        throttled.len()
    );
    assert!(
        out.status.success(),
        "{}\n{v:#}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells = cells(&v);
    assert_eq!(cells.len(), CELLS);
    let ids: std::collections::BTreeSet<&str> = cells.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), CELLS, "every cell recorded once");
    for cell in &cells {
        assert_eq!(cell["status"], "succeeded", "{cell:#}");
    }
    let done = std::fs::read_dir(c.store().join(v["id"].as_str().unwrap()).join("cells"))
        .unwrap()
        .filter(|d| d.as_ref().unwrap().path().join("result.json").is_file())
        .count();
    assert_eq!(done, CELLS, "a record per cell in the store");
    assert_eq!(
        c.fake.created("jobs").len(),
        CELLS,
        "every cell's Job created once"
    );
    // Refused at the start (the burst), and every refused request sent
    // again only after its `Retry-After`: orch waits as told. (The fake's
    // clock is when it reads a request: under this host's load, requests
    // orch spaced out can reach it bunched, so a request may be refused
    // again after its wait; it is never sent again before it.)
    let first = throttled.first().expect("the start's burst was refused");
    let mut last: std::collections::BTreeMap<&str, &orch_testkit::kube::Throttled> = Default::default();
    for t in &throttled {
        // One object's request (a Job's deletion, a pod's log); creates share their line.
        if !t.request.starts_with("POST ") {
            if let Some(before) = last.get(t.request.as_str()) {
                let waited = t.at.duration_since(before.at);
                assert!(
                    waited + Duration::from_millis(50) >= before.retry_after,
                    "{} sent again {waited:?} after a Retry-After of {:?}",
                    t.request,
                    before.retry_after
                );
            }
        }
        last.insert(t.request.as_str(), t);
    }
    let late = throttled
        .iter()
        .filter(|t| t.at >= first.at + first.retry_after)
        .count();
    eprintln!("{late} refused after the first Retry-After ran out");
    assert!(
        (throttled.len() as f64) < 0.1 * total as f64,
        "{} of {total} requests refused",
        throttled.len()
    );
    assert!(per_cell < 6.0, "{per_cell:.2} requests a cell: {counts:?}");
    c.assert_nothing_left();
}

/// An older Role, without `list`/`watch` on Jobs: the weights probe's own
/// watch asks for no Jobs (its pod's and the events', which that Role
/// allows), so `orch plan` still reads the PVC (an empty one: the model is
/// missing).
#[test]
fn a_role_without_the_watch_still_probes_the_weights_pvc() {
    if !ready() {
        return;
    }
    let shipped = std::fs::read_to_string(shipped_role()).unwrap();
    let older = shipped.replace(
        "verbs: [\"create\", \"get\", \"list\", \"watch\", \"delete\", \"deletecollection\"]",
        "verbs: [\"create\", \"get\", \"delete\", \"deletecollection\"]",
    );
    assert_ne!(older, shipped, "the shipped Role grants `list`/`watch` on Jobs");
    let dir = tempfile::tempdir().unwrap();
    let role = dir.path().join("role.yaml");
    std::fs::write(&role, older).unwrap();
    let pvc = tempfile::tempdir().unwrap();
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| {
        b.role(&role).pvc("hf-weights", pvc.path())
    });
    let suite = c.suite(
        "weights",
        "name: weights\nmodels: [{repo: org/tiny, revision: main}]\nkubernetes: {weights_pvc: hf-weights}\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let out = c
        .orch()
        .args(["plan", "-f"])
        .arg(&suite)
        .args(["--backend", "kubernetes", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["models"][0]["complete"], false, "{v:#}");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let polled = c
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.contains("/pods?") && r.contains("labelSelector") && r.contains("orch-probe"))
        .count();
    assert!(polled >= 1, "the probe's pod was listed");
    let jobs_listed = c
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.contains("/jobs?") && r.contains("orch-probe"))
        .count();
    assert_eq!(jobs_listed, 0, "the probe's watch lists no Jobs");
    c.assert_nothing_left();
}

/// An older Role, without `list`/`watch` on Jobs: the run's watch is
/// refused, and its cells poll their pods as before, and succeed.
#[test]
fn a_role_without_the_runs_watch_polls_and_succeeds() {
    if !ready() {
        return;
    }
    let shipped = std::fs::read_to_string(shipped_role()).unwrap();
    let older = shipped.replace(
        "verbs: [\"create\", \"get\", \"list\", \"watch\", \"delete\", \"deletecollection\"]",
        "verbs: [\"create\", \"get\", \"delete\", \"deletecollection\"]",
    );
    assert_ne!(older, shipped, "the shipped Role grants `list`/`watch` on Jobs");
    let dir = tempfile::tempdir().unwrap();
    let role = dir.path().join("role.yaml");
    std::fs::write(&role, older).unwrap();
    let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| b.role(&role));
    let suite = c.suite(
        "older",
        "name: older\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hello'}\n",
    );
    let (out, v) = c.run(&suite, &[]);
    let cell = &cells(&v)[0];
    assert_eq!(
        cell["status"],
        "succeeded",
        "{cell:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let klog = std::fs::read_to_string(
        cell_dir(&c.store(), &v, cell["id"].as_str().unwrap()).join("kubernetes.log"),
    )
    .unwrap();
    assert!(klog.contains("the pod is polled"), "{klog}");
    c.assert_nothing_left();
}

/// `agent_delivery: auto` on clusters of each kind (KEP-4639): 1.35 nodes on
/// containerd 2.1 get the agent as an image volume (no init container, the
/// cell runs, its record says so); the same nodes on containerd 2.0 get the
/// init container; an explicit `image-volume` the API server drops (gate
/// off) is a user error before any cell starts.
#[test]
fn the_agent_comes_as_an_image_volume_where_the_cluster_mounts_one() {
    if !ready() {
        return;
    }
    let suite_text =
        "name: delivery\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo ORCH_METRIC ok=1'}\n";
    let run = |runtime: &str, gate: Option<bool>, extra: &str| {
        let c = cluster(vec![FakeNode::cpu("cpu-1")], |b| {
            let b = b.kubernetes_minor(35).container_runtime(runtime);
            match gate {
                Some(on) => b.image_volume_gate(on),
                None => b,
            }
        });
        let suite = c.suite("delivery", &format!("{suite_text}{extra}"));
        let out = c.run_cmd(&suite, &["--json"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (c, out, v)
    };

    let (c, out, v) = run("containerd://2.1.4", None, "");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let cell = &cells(&v)[0];
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{cell:#}");
    assert_eq!(cell["metrics"]["ok"], 1.0, "{cell:#}");
    assert_eq!(
        cell["info"]["kubernetes_agent_delivery"], "image-volume",
        "{cell:#}"
    );
    assert!(stderr.contains("as an image volume of `"), "{stderr}");
    let jobs = c.fake.created("jobs");
    let pod = &jobs[0]["spec"]["template"]["spec"];
    assert!(pod["initContainers"].is_null(), "{pod:#}");
    assert_eq!(pod["volumes"][0]["image"]["reference"], AGENT_IMAGE, "{pod:#}");
    c.assert_nothing_left();
    assert!(
        delivery_doctor(&c).starts_with("an image volume: every node's kubelet and runtime mount"),
        "{}",
        delivery_doctor(&c)
    );

    let (c, out, v) = run("containerd://2.0.5", None, "");
    let cell = &cells(&v)[0];
    assert_eq!(out.status.code(), Some(0), "{cell:#}");
    assert_eq!(
        cell["info"]["kubernetes_agent_delivery"], "init-container",
        "{cell:#}"
    );
    let jobs = c.fake.created("jobs");
    assert_eq!(
        jobs[0]["spec"]["template"]["spec"]["initContainers"][0]["name"], "orch-agent",
        "{:#}",
        jobs[0]
    );
    let said = delivery_doctor(&c);
    assert!(
        said.contains("an init container, not an image volume: node `cpu-1` runs `containerd://2.0.5`"),
        "{said}"
    );

    let (c, out, _) = run(
        "containerd://2.1.4",
        Some(false),
        "kubernetes: {agent_delivery: image-volume}\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("dropped the `image` volume"), "{stderr}");
    assert!(stderr.contains("hint:"), "{stderr}");
    assert!(c.fake.created("jobs").is_empty());
}

/// `orch doctor --backend kubernetes --json`'s `agent delivery` detail.
fn delivery_doctor(c: &Cluster) -> String {
    let out = c
        .orch()
        .args(["doctor", "--backend", "kubernetes", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    v["sections"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["checks"].as_array().into_iter().flatten())
        .find(|c| c["name"] == "agent delivery")
        .and_then(|c| c["detail"].as_str())
        .unwrap_or_else(|| panic!("no `agent delivery` check: {v:#}"))
        .to_string()
}
