//! The fake Kubernetes API server speaks Kubernetes: the official Python client
//! (`pip install kubernetes`), pointed at it with a kubeconfig, creates a Secret and a GPU Job,
//! watches its pod until the container terminates, reads the log, the Job's status and the
//! pod's events, and deletes the Job with `propagation_policy='Background'`. Under CI a
//! missing `kubernetes` package fails; elsewhere the test is skipped with the reason printed
//! (`orch_test_support::skip`).

use orch_fake_kube::{FakeKube, FakeNode};

const SCRIPT: &str = r#"
import json, sys, time
from kubernetes import client, config, watch

config.load_kube_config(config_file=sys.argv[1])
v1 = client.CoreV1Api()
batch = client.BatchV1Api()
ns = "proof"

v1.create_namespaced_secret(ns, client.V1Secret(
    metadata=client.V1ObjectMeta(name="proof-token"), string_data={"token": "s3cr3t-value"}))
job = client.V1Job(
    api_version="batch/v1", kind="Job",
    metadata=client.V1ObjectMeta(name="proof"),
    spec=client.V1JobSpec(backoff_limit=0, template=client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": "proof"}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
            containers=[client.V1Container(
                name="main", image="busybox:1.36",
                command=["sh", "-c", 'echo "hello $TOKEN"; exit 3'],
                env=[client.V1EnvVar(name="TOKEN", value_from=client.V1EnvVarSource(
                    secret_key_ref=client.V1SecretKeySelector(name="proof-token", key="token")))],
                resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "2"}),
            )],
        ),
    )),
)
batch.create_namespaced_job(ns, job)

w = watch.Watch()
seen, pod = [], None
for ev in w.stream(v1.list_namespaced_pod, ns, label_selector="job-name=proof", timeout_seconds=60):
    p = ev["object"]
    seen.append([ev["type"], p.status.phase])
    cs = p.status.container_statuses or []
    if cs and cs[0].state.terminated is not None:
        pod = p
        w.stop()
        break
assert pod is not None, seen
name = pod.metadata.name
term = pod.status.container_statuses[0].state.terminated
log = v1.read_namespaced_pod_log(name, ns, container="main")

failed = None
for _ in range(200):
    j = batch.read_namespaced_job("proof", ns)
    failed = next((c for c in (j.status.conditions or []) if c.type == "Failed" and c.status == "True"), None)
    if failed:
        break
    time.sleep(0.05)

events = v1.list_namespaced_event(ns, field_selector="involvedObject.name=" + name)
batch.delete_namespaced_job("proof", ns, propagation_policy="Background")
left = None
for _ in range(200):
    left = [p.metadata.name for p in v1.list_namespaced_pod(ns, label_selector="job-name=proof").items]
    if not left:
        break
    time.sleep(0.05)
try:
    batch.read_namespaced_job("proof", ns)
    job_status = 200
except client.exceptions.ApiException as e:
    job_status = e.status

print("RESULT " + json.dumps({
    "pod": name,
    "node": pod.spec.node_name,
    "watch": seen,
    "exit_code": term.exit_code,
    "reason": term.reason,
    "log": log,
    "job_failed": None if failed is None else {"reason": failed.reason, "message": failed.message},
    "job_status_failed": j.status.failed,
    "events": sorted({e.reason for e in events.items}),
    "pods_left": left,
    "job_after_delete": job_status,
}))
"#;

fn have_kubernetes() -> bool {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import kubernetes"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok || orch_test_support::skip::skip_or_fail(
        &orch_test_support::skip::current_test(),
        "python3 with the `kubernetes` package is not installed here (pip install kubernetes)",
    )
}

/// `python3 -c SCRIPT KUBECONFIG` against `fake` (namespace `proof`, a HOME of
/// its own, no `KUBECONFIG`): the JSON of the line it prints after `RESULT `.
fn run_script(fake: &FakeKube, script: &str) -> serde_json::Value {
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig, "proof").unwrap();
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&kubeconfig)
        .env("HOME", home.path())
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .expect("a result line");
    serde_json::from_str(line).unwrap()
}

#[test]
fn the_official_python_client_runs_a_job_on_the_fake() {
    if !have_kubernetes()
        || !orch_fake_containers::container::available_or_skip("the fake kubelet's containers")
    {
        return;
    }
    let image = orch_fake_containers::container::busybox_root().unwrap();
    let fake = FakeKube::builder()
        .node(FakeNode::h100("gpu-0", 8))
        .node(FakeNode::cpu("cpu-0"))
        .image("busybox:1.36", &image)
        .token("proof-token-123")
        .start()
        .unwrap();
    let v = run_script(&fake, SCRIPT);
    assert_eq!(v["exit_code"], 3, "{v}");
    assert_eq!(v["reason"], "Error", "{v}");
    assert_eq!(v["node"], "gpu-0", "{v}");
    assert_eq!(v["log"], "hello s3cr3t-value\n", "{v}");
    assert_eq!(v["job_failed"]["reason"], "BackoffLimitExceeded", "{v}");
    assert_eq!(
        v["job_failed"]["message"], "Job has reached the specified backoff limit",
        "{v}"
    );
    assert_eq!(v["job_status_failed"], 1, "{v}");
    for r in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(v["events"].as_array().unwrap().iter().any(|e| e == r), "{r}: {v}");
    }
    assert_eq!(v["pods_left"], serde_json::json!([]), "{v}");
    assert_eq!(v["job_after_delete"], 404, "{v}");
    assert_eq!(v["watch"][0][0], "ADDED", "{v}");

    assert!(fake.objects("pods").is_empty());
    assert!(fake.objects("jobs").is_empty());
    assert_eq!(fake.objects("secrets").len(), 1);
    assert!(fake.running_pods().is_empty());
    let reqs = fake.requests();
    assert!(
        reqs.iter().any(
            |r| r.starts_with("DELETE /apis/batch/v1/namespaces/proof/jobs/proof")
                && r.contains("propagationPolicy=Background")
        ),
        "{reqs:#?}"
    );
    assert!(
        reqs.iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/proof/pods?")
                && r.to_ascii_lowercase().contains("watch=true")),
        "{reqs:#?}"
    );
}

#[test]
fn a_wrong_token_is_refused() {
    if !have_kubernetes() {
        return;
    }
    let fake = FakeKube::builder().token("right").start().unwrap();
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("kubeconfig");
    fake.write_kubeconfig(&kubeconfig, "default").unwrap();
    let text = std::fs::read_to_string(&kubeconfig)
        .unwrap()
        .replace("\"right\"", "\"wrong\"");
    std::fs::write(&kubeconfig, text).unwrap();
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys\nfrom kubernetes import client, config\nconfig.load_kube_config(config_file=sys.argv[1])\ntry:\n    client.BatchV1Api().list_namespaced_job('default')\nexcept client.exceptions.ApiException as e:\n    print('STATUS', e.status)\n",
        ])
        .arg(&kubeconfig)
        .env("HOME", home.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("STATUS 401"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const IMAGE_VOLUME_SCRIPT: &str = r#"
import json, sys
from kubernetes import client, config

config.load_kube_config(config_file=sys.argv[1])
batch = client.BatchV1Api()
job = client.V1Job(
    api_version="batch/v1", kind="Job",
    metadata=client.V1ObjectMeta(generate_name="probe-"),
    spec=client.V1JobSpec(backoff_limit=0, template=client.V1PodTemplateSpec(
        spec=client.V1PodSpec(
            restart_policy="Never",
            containers=[client.V1Container(
                name="main", image="busybox:1.36", command=["/tools/run"],
                volume_mounts=[client.V1VolumeMount(name="tools", mount_path="/tools", read_only=True)],
            )],
            volumes=[client.V1Volume(name="tools", image=client.V1ImageVolumeSource(reference="reg/tools:v1"))],
        ),
    )),
)
made = batch.create_namespaced_job("proof", job, dry_run="All")
spec = made.spec.template.spec
print("RESULT " + json.dumps({
    "volumes": [v.to_dict() for v in (spec.volumes or [])],
    "mounts": [m.to_dict() for m in (spec.containers[0].volume_mounts or [])],
    "stored": [j.metadata.name for j in batch.list_namespaced_job("proof").items],
}))
"#;

/// The official client's `V1ImageVolumeSource` through a server-side dry run
/// (what orch's `agent_delivery: auto` sends): kept, with its pull policy
/// defaulted, on 1.35; dropped with its mount, without an error, on 1.33
/// (the `ImageVolume` gate off); never stored either way.
#[test]
fn the_official_client_sees_image_volumes_kept_or_dropped_by_the_gate() {
    if !have_kubernetes() {
        return;
    }
    for (minor, kept) in [(35, true), (33, false)] {
        let fake = FakeKube::builder()
            .node(FakeNode::cpu("cpu-0"))
            .kubernetes_minor(minor)
            .start()
            .unwrap();
        let v = run_script(&fake, IMAGE_VOLUME_SCRIPT);
        assert_eq!(v["stored"], serde_json::json!([]), "1.{minor}: {v}");
        if kept {
            assert_eq!(v["volumes"][0]["image"]["reference"], "reg/tools:v1", "{v}");
            assert_eq!(v["volumes"][0]["image"]["pull_policy"], "IfNotPresent", "{v}");
            assert_eq!(v["mounts"][0]["mount_path"], "/tools", "{v}");
        } else {
            assert_eq!(v["volumes"], serde_json::json!([]), "1.{minor}: {v}");
            assert_eq!(v["mounts"], serde_json::json!([]), "1.{minor}: {v}");
        }
    }
}
