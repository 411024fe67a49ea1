//! The fake over plain HTTP (reqwest), one behaviour per test.

use super::*;
use std::time::Instant;

struct C {
    base: String,
    http: reqwest::Client,
    token: String,
}

impl C {
    fn new(k: &FakeKube) -> Self {
        C {
            base: k.url(),
            http: reqwest::Client::new(),
            token: "fake-token".into(),
        }
    }

    async fn req(&self, m: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (code, text) = self.raw(m, path, body).await;
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn raw(&self, m: &str, path: &str, body: Option<Value>) -> (u16, String) {
        let mut r = self
            .http
            .request(m.parse().unwrap(), format!("{}{path}", self.base))
            .header("Authorization", format!("Bearer {}", self.token));
        if let Some(b) = body {
            r = r.header("Content-Type", "application/json").body(b.to_string());
        }
        let resp = r.send().await.unwrap();
        let code = resp.status().as_u16();
        (code, resp.text().await.unwrap())
    }

    async fn get(&self, path: &str) -> Value {
        self.req("GET", path, None).await.1
    }

    /// The log of pod `p` (namespace `ns`).
    async fn log(&self, p: &Value) -> String {
        let path = format!("/api/v1/namespaces/ns/pods/{}/log", pod_name(p));
        self.raw("GET", &path, None).await.1
    }

    /// Poll `path` until `f` holds (20 s at most).
    async fn until(&self, path: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let t = Instant::now();
        loop {
            let v = self.get(path).await;
            if f(&v) {
                return v;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "timed out waiting for {what}: {v:#}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn job_pod(&self, ns: &str, job: &str) -> Value {
        let v = self
            .until(
                &format!("/api/v1/namespaces/{ns}/pods?labelSelector=job-name%3D{job}"),
                "a pod",
                |v| v["items"].as_array().is_some_and(|a| !a.is_empty()),
            )
            .await;
        v["items"][0].clone()
    }
}

/// Containers need root here: `false` (skip, with a note) without it, a panic under CI.
fn can_run() -> bool {
    crate::container::available_or_skip("the fake kubelet's containers")
}

fn busybox() -> PathBuf {
    crate::container::busybox_root().unwrap()
}

fn fake() -> (FakeKube, PathBuf) {
    let img = busybox();
    let k = FakeKube::builder()
        .node(FakeNode::h100("gpu-0", 8))
        .node(FakeNode::cpu("cpu-0"))
        .image("busybox:1.36", &img)
        .start()
        .unwrap();
    (k, img)
}

fn job(name: &str, cmd: &[&str]) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": "t"}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", "command": cmd}],
        }}},
    })
}

const JOBS: &str = "/apis/batch/v1/namespaces/ns/jobs";

fn has_cond(j: &Value, ty: &str) -> bool {
    j["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == json!(ty) && c["status"] == "True"))
}

fn cond<'a>(j: &'a Value, ty: &str) -> &'a Value {
    j["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == json!(ty)))
        .unwrap_or(&Value::Null)
}

fn pod_name(p: &Value) -> String {
    p["metadata"]["name"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_to_completion_with_merged_logs() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    let (code, j) = c
        .req(
            "POST",
            JOBS,
            Some(job("hi", &["sh", "-c", "echo hi; echo err >&2"])),
        )
        .await;
    assert_eq!(code, 201, "{j}");
    assert_eq!(j["metadata"]["namespace"], "ns");
    assert!(j["metadata"]["uid"].is_string() && j["metadata"]["resourceVersion"].is_string());
    assert_eq!(j["spec"]["template"]["metadata"]["labels"]["job-name"], "hi");
    let (code, dup) = c.req("POST", JOBS, Some(job("hi", &["true"]))).await;
    assert_eq!(code, 409);
    assert_eq!(dup["reason"], "AlreadyExists");
    assert_eq!(dup["message"], "jobs.batch \"hi\" already exists");
    let j = c
        .until(&format!("{JOBS}/hi"), "Complete", |j| has_cond(j, "Complete"))
        .await;
    assert_eq!(j["status"]["succeeded"], 1);
    assert!(j["status"]["completionTime"].is_string());
    let pod = c.job_pod("ns", "hi").await;
    let name = pod_name(&pod);
    assert!(name.starts_with("hi-") && name.len() == 8, "{name}");
    assert_eq!(pod["status"]["phase"], "Succeeded");
    assert_eq!(pod["metadata"]["labels"]["app"], "t");
    assert_eq!(
        pod["metadata"]["labels"]["batch.kubernetes.io/controller-uid"],
        j["metadata"]["uid"]
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], j["metadata"]["uid"]);
    assert_eq!(pod["spec"]["nodeName"], "cpu-0");
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 0, "{pod:#}");
    assert_eq!(t["reason"], "Completed");
    let (code, log) = c
        .raw("GET", &format!("/api/v1/namespaces/ns/pods/{name}/log"), None)
        .await;
    assert_eq!(code, 200);
    assert_eq!(log, "hi\nerr\n");
    let (_, log) = c
        .raw(
            "GET",
            &format!("/api/v1/namespaces/ns/pods/{name}/log?tailLines=1&timestamps=true"),
            None,
        )
        .await;
    assert!(log.ends_with("Z err\n") && log.lines().count() == 1, "{log}");
    let evs = c
        .get(&format!(
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3D{name}"
        ))
        .await;
    let reasons: Vec<&str> = evs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    for r in ["Scheduled", "Pulled", "Created", "Started"] {
        assert!(reasons.contains(&r), "{reasons:?}");
    }
    assert_eq!(evs["kind"], "EventList");
    let evs = c
        .get("/api/v1/namespaces/ns/events?fieldSelector=involvedObject.kind%3DJob")
        .await;
    let reasons: Vec<&str> = evs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    let (code, nf) = c.req("GET", &format!("{JOBS}/nope"), None).await;
    assert_eq!(code, 404);
    assert_eq!(
        nf,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": "jobs.batch \"nope\" not found", "reason": "NotFound", "details": {"name": "nope", "group": "batch", "kind": "jobs"}, "code": 404})
    );
    let (code, _) = c
        .req("GET", "/apis/apps/v1/namespaces/ns/deployments", None)
        .await;
    assert_eq!(code, 404);
    assert!(k
        .requests()
        .iter()
        .any(|r| r == "POST /apis/batch/v1/namespaces/ns/jobs"));
    // Deleted after it ended, the pod takes its folder (its containers'
    // roots) with it: a long run of pods does not fill the disk.
    let pods_dir = k.inner.root.join("pods");
    let held = || {
        std::fs::read_dir(&pods_dir)
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().contains(&format!("_{name}_")))
            })
            .unwrap_or(false)
    };
    assert!(held(), "the running pod's folder is under {}", pods_dir.display());
    let (code, _) = c
        .req("DELETE", &format!("/api/v1/namespaces/ns/pods/{name}"), None)
        .await;
    assert_eq!(code, 200);
    let t = std::time::Instant::now();
    while held() && t.elapsed() < std::time::Duration::from_secs(10) {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(!held(), "a deleted pod's folder stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_and_auth() {
    let (k, _img) = fake();
    let mut c = C::new(&k);
    let mut j = job("bad", &["true"]);
    j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
    let (code, e) = c.req("POST", JOBS, Some(j)).await;
    assert_eq!(code, 422, "{e}");
    assert_eq!(e["reason"], "Invalid");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("spec.template.spec.restartPolicy"),
        "{e}"
    );
    c.token = "wrong".into();
    let (code, e) = c.req("GET", JOBS, None).await;
    assert_eq!(code, 401);
    assert_eq!(e["reason"], "Unauthorized");
}

fn gpu_job(name: &str, gpus: u32, tolerate: bool, selector: bool) -> Value {
    let mut j = job(name, &["sleep", "30"]);
    let s = &mut j["spec"]["template"]["spec"];
    s["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": gpus}});
    if tolerate {
        s["tolerations"] = json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    if selector {
        s["nodeSelector"] = json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"});
    }
    j
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_over_capacity_are_unschedulable() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    c.req("POST", JOBS, Some(gpu_job("big", 16, true, true))).await;
    c.req("POST", JOBS, Some(gpu_job("untol", 1, false, false))).await;
    c.req("POST", JOBS, Some(gpu_job("fits", 6, true, true))).await;
    let big = c.job_pod("ns", "big").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&big));
    let big = c
        .until(&path, "unschedulable", |p| {
            cond(p, "PodScheduled")["reason"] == "Unschedulable"
        })
        .await;
    assert_eq!(big["status"]["phase"], "Pending");
    assert_eq!(
        cond(&big, "PodScheduled")["message"],
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
    );
    let untol = c.job_pod("ns", "untol").await;
    let path2 = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&untol));
    let untol = c
        .until(&path2, "unschedulable", |p| {
            cond(p, "PodScheduled")["reason"] == "Unschedulable"
        })
        .await;
    assert_eq!(
        cond(&untol, "PodScheduled")["message"],
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint {nvidia.com/gpu: present}. preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling."
    );
    let fits = c.job_pod("ns", "fits").await;
    let fits = c
        .until(
            &format!("/api/v1/namespaces/ns/pods/{}", pod_name(&fits)),
            "running",
            |p| p["status"]["phase"] == "Running",
        )
        .await;
    assert_eq!(fits["spec"]["nodeName"], "gpu-0");
    // An unbound pod's log is empty, as the API server has no kubelet to ask.
    let (code, log) = c.raw("GET", &format!("{path}/log"), None).await;
    assert_eq!((code, log.as_str()), (200, ""));
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let evs = c
        .get(&format!(
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3D{}",
            pod_name(&big)
        ))
        .await;
    let fs = evs["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["reason"] == "FailedScheduling")
        .cloned()
        .unwrap();
    assert_eq!(fs["type"], "Warning");
    assert!(fs["count"].as_u64().unwrap() >= 2, "{fs}");
    // One event counted, not one per attempt (the correlator's key).
    let same = evs["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "FailedScheduling");
    assert_eq!(same.count(), 1, "{evs}");
    // Another 3 GPUs do not fit while 6 are held: 8 - 6 < 3.
    c.req("POST", JOBS, Some(gpu_job("three", 3, true, true))).await;
    let three = c.job_pod("ns", "three").await;
    c.until(
        &format!("/api/v1/namespaces/ns/pods/{}", pod_name(&three)),
        "unschedulable",
        |p| cond(p, "PodScheduled")["reason"] == "Unschedulable",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_ooms() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    // 300 MB held by busybox awk (the image has no python).
    let mut j = job(
        "oom",
        &[
            "awk",
            "BEGIN { s = sprintf(\"%300000000s\", \"\"); system(\"sleep 5\") }",
        ],
    );
    j["spec"]["template"]["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": "100Mi"}});
    c.req("POST", JOBS, Some(j)).await;
    let j = c
        .until(&format!("{JOBS}/oom"), "Failed", |j| has_cond(j, "Failed"))
        .await;
    assert_eq!(cond(&j, "Failed")["reason"], "BackoffLimitExceeded");
    assert_eq!(
        cond(&j, "Failed")["message"],
        "Job has reached the specified backoff limit"
    );
    assert_eq!(j["status"]["failed"], 1);
    let pod = c.job_pod("ns", "oom").await;
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["reason"], "OOMKilled", "{pod:#}");
    assert_eq!(t["exitCode"], 137);
    assert_eq!(pod["status"]["phase"], "Failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_job_orphans_its_pods_by_default() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    c.req("POST", JOBS, Some(job("orph", &["sleep", "30"]))).await;
    let pod = c.job_pod("ns", "orph").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&pod));
    c.until(&path, "running", |p| p["status"]["phase"] == "Running")
        .await;
    assert_eq!(k.running_pods(), vec![pod_name(&pod)]);
    let (code, d) = c.req("DELETE", &format!("{JOBS}/orph"), None).await;
    assert_eq!(code, 200);
    assert_eq!(d["metadata"]["finalizers"], json!(["orphan"]), "{d}");
    c.until(&format!("{JOBS}/orph"), "the job gone", |j| j["code"] == 404)
        .await;
    let p = c
        .until(&path, "orphaned", |p| p["metadata"]["ownerReferences"].is_null())
        .await;
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(k.running_pods().len(), 1);
    // Deleting the pod: SIGTERM, and it goes once `sleep` has died.
    let (code, d) = c.req("DELETE", &path, None).await;
    assert_eq!(code, 200);
    assert!(d["metadata"]["deletionTimestamp"].is_string(), "{d}");
    c.until(&path, "the pod gone", |p| p["code"] == 404).await;
    assert!(k.running_pods().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_deletion_removes_pods_and_watch_sees_it() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    let list = c.get("/api/v1/namespaces/ns/pods").await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    c.req(
        "POST",
        JOBS,
        Some(job(
            "bg",
            &[
                "sh",
                "-c",
                "trap 'echo term; exit 0' TERM; while true; do sleep 0.1; done",
            ],
        )),
    )
    .await;
    let pod = c.job_pod("ns", "bg").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&pod));
    c.until(&path, "running", |p| p["status"]["phase"] == "Running")
        .await;
    let (code, d) = c
        .req(
            "DELETE",
            &format!("{JOBS}/bg"),
            Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})),
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(d["status"], "Success", "{d}");
    c.until(&path, "the pod gone", |p| p["code"] == 404).await;
    assert!(k.running_pods().is_empty());
    // A watch from the list's resourceVersion replays everything since.
    let resp = c
        .http
        .get(format!("{}/api/v1/namespaces/ns/pods?watch=true&labelSelector=job-name%3Dbg&resourceVersion={rv}&timeoutSeconds=1", c.base))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    let evs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(evs.first().unwrap()["type"], "ADDED");
    assert_eq!(evs.last().unwrap()["type"], "DELETED");
    assert!(evs
        .iter()
        .any(|e| e["object"]["metadata"]["deletionTimestamp"].is_string()));
    let last = evs.last().unwrap();
    assert_eq!(
        last["object"]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"], 0,
        "{last:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_changes_live() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    c.req("POST", JOBS, Some(job("w", &["sh", "-c", "sleep 0.3; exit 4"])))
        .await;
    let mut resp = c
        .http
        .get(format!(
            "{}/api/v1/namespaces/ns/pods?watch=1&labelSelector=app%3Dt",
            c.base
        ))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await
        .unwrap();
    let mut buf = Vec::new();
    let t = Instant::now();
    'outer: loop {
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        buf.extend_from_slice(&chunk);
        for l in String::from_utf8_lossy(&buf).lines() {
            if let Ok(e) = serde_json::from_str::<Value>(l) {
                if e["object"]["status"]["phase"] == "Failed" {
                    assert_eq!(
                        e["object"]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
                        4
                    );
                    break 'outer;
                }
            }
        }
        assert!(t.elapsed() < Duration::from_secs(20));
    }
    let first: Value = serde_json::from_str(String::from_utf8_lossy(&buf).lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["kind"], "Pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_errors() {
    let (k, _img) = fake();
    let c = C::new(&k);
    let mut j = job("unknown", &["true"]);
    j["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nope/missing:v9");
    c.req("POST", JOBS, Some(j)).await;
    let mut j = job("invalid", &["true"]);
    j["spec"]["template"]["spec"]["containers"][0]["image"] = json!("Busybox:1");
    c.req("POST", JOBS, Some(j)).await;
    let p = c.job_pod("ns", "unknown").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p));
    let w = |p: &Value| p["status"]["containerStatuses"][0]["state"]["waiting"].clone();
    let p = c
        .until(&path, "ErrImagePull", |p| w(p)["reason"] == "ErrImagePull")
        .await;
    assert!(w(&p)["message"].as_str().unwrap().starts_with(
        "rpc error: code = NotFound desc = failed to pull and unpack image \"docker.io/nope/missing:v9\""
    ));
    let p = c
        .until(&path, "ImagePullBackOff", |p| {
            w(p)["reason"] == "ImagePullBackOff"
        })
        .await;
    assert_eq!(w(&p)["message"], "Back-off pulling image \"nope/missing:v9\"");
    assert_eq!(p["status"]["phase"], "Pending");
    let (code, e) = c.req("GET", &format!("{path}/log?follow=true"), None).await;
    assert_eq!(code, 400);
    assert_eq!(
        e["message"],
        format!(
            "container \"main\" in pod \"{}\" is waiting to start: trying and failing to pull image",
            pod_name(&p)
        )
    );
    let p = c.job_pod("ns", "invalid").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p));
    c.until(&path, "InvalidImageName", |p| {
        w(p)["reason"] == "InvalidImageName"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_from_secrets_waits_for_the_secret() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    let mut j = job("env", &["sh", "-c", "echo \"v=$V w=$W\"; echo \"$(P)\""]);
    j["spec"]["template"]["spec"]["containers"][0]["env"] = json!([
        {"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "W", "value": "x$(V)"},
        {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]);
    c.req("POST", JOBS, Some(j)).await;
    let p = c.job_pod("ns", "env").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p));
    let w = |p: &Value| p["status"]["containerStatuses"][0]["state"]["waiting"].clone();
    let p = c
        .until(&path, "config error", |p| {
            w(p)["reason"] == "CreateContainerConfigError"
        })
        .await;
    assert_eq!(w(&p)["message"], "secret \"s\" not found");
    let (code, _) = c
        .req(
            "POST",
            "/api/v1/namespaces/ns/secrets",
            Some(json!({"metadata": {"name": "s"}, "stringData": {"other": "1"}})),
        )
        .await;
    assert_eq!(code, 201);
    let p = c
        .until(&path, "missing key", |p| {
            w(p)["message"] == "couldn't find key k in Secret ns/s"
        })
        .await;
    assert_eq!(p["status"]["phase"], "Pending");
    c.req("DELETE", "/api/v1/namespaces/ns/secrets/s", None).await;
    let (_, s) = c
        .req(
            "POST",
            "/api/v1/namespaces/ns/secrets",
            Some(json!({"metadata": {"name": "s"}, "stringData": {"k": "sekrit"}})),
        )
        .await;
    assert_eq!(s["data"]["k"], "c2Vrcml0");
    assert!(s["stringData"].is_null());
    c.until(&path, "done", |p| p["status"]["phase"] == "Succeeded")
        .await;
    let (_, log) = c.raw("GET", &format!("{path}/log"), None).await;
    assert_eq!(log, format!("v=sekrit w=xsekrit\n{}\n", pod_name(&p)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_volumes_and_termination_messages() {
    if !can_run() {
        return;
    }
    let img = tempfile::tempdir().unwrap();
    crate::container::make_busybox_root(img.path()).unwrap();
    let agent = img.path().join("agent");
    std::fs::write(&agent, "#!/bin/sh\ncp \"$0\" \"$2\"\n").unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let pvc = tempfile::tempdir().unwrap();
    std::fs::write(pvc.path().join("data.txt"), "from-pvc").unwrap();
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .image("reg/agent:v1", img.path())
        .image("busybox:1.36", img.path())
        .pvc("weights", pvc.path())
        .start()
        .unwrap();
    let c = C::new(&k);
    let mut j = job(
        "init",
        &[
            "sh",
            "-c",
            "cat \"$0\"; test -x \"$1\" && echo installed; echo bye > \"$2\"; exit 2",
        ],
    );
    let s = &mut j["spec"]["template"]["spec"];
    s["containers"][0]["args"] = json!(["/w/data.txt", "/orch/bin/agent", "/dev/termination-log"]);
    s["containers"][0]["volumeMounts"] = json!([{"name": "bin", "mountPath": "/orch/bin"}, {"name": "w", "mountPath": "/w", "readOnly": true}]);
    s["initContainers"] = json!([{"name": "install", "image": "reg/agent:v1", "command": ["/agent", "install", "/orch/bin/agent"],
        "volumeMounts": [{"name": "bin", "mountPath": "/orch/bin"}]}]);
    s["volumes"] = json!([{"name": "bin", "emptyDir": {"medium": "Memory"}}, {"name": "w", "persistentVolumeClaim": {"claimName": "weights"}}]);
    c.req("POST", JOBS, Some(j)).await;
    c.until(&format!("{JOBS}/init"), "Failed", |j| has_cond(j, "Failed"))
        .await;
    let p = c.job_pod("ns", "init").await;
    let name = pod_name(&p);
    assert_eq!(
        p["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"], "Completed",
        "{p:#}"
    );
    let t = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 2);
    assert_eq!(t["message"], "bye\n");
    let (_, log) = c
        .raw(
            "GET",
            &format!("/api/v1/namespaces/ns/pods/{name}/log?container=main"),
            None,
        )
        .await;
    assert_eq!(log, "from-pvcinstalled\n");
    // A missing PVC leaves the pod unschedulable.
    let mut j = job("nopvc", &["true"]);
    j["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "x", "persistentVolumeClaim": {"claimName": "ghost"}}]);
    c.req("POST", JOBS, Some(j)).await;
    let p = c.job_pod("ns", "nopvc").await;
    let p = c
        .until(
            &format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p)),
            "unschedulable",
            |p| cond(p, "PodScheduled")["reason"] == "Unschedulable",
        )
        .await;
    assert!(cond(&p, "PodScheduled")["message"]
        .as_str()
        .unwrap()
        .contains("persistentvolumeclaim \"ghost\" not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_evictions_ttl_and_cut_log_streams() {
    if !can_run() {
        return;
    }
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .image("busybox:1.36", busybox())
        .cut_log_streams_after(5)
        .start()
        .unwrap();
    let c = C::new(&k);
    let mut j = job("dl", &["sleep", "30"]);
    j["spec"]["activeDeadlineSeconds"] = json!(1);
    c.req("POST", JOBS, Some(j)).await;
    c.req(
        "POST",
        JOBS,
        Some(job("ev", &["sh", "-c", "echo hello world; echo $$$$; sleep 30"])),
    )
    .await;
    let mut j = job("ttl", &["true"]);
    j["spec"]["ttlSecondsAfterFinished"] = json!(1);
    c.req("POST", JOBS, Some(j)).await;

    let ev = c.job_pod("ns", "ev").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&ev));
    c.until(&format!("{path}/log"), "output", |l| {
        l.as_str().is_some_and(|s| s.lines().count() == 2) || l.is_number()
    })
    .await;
    let (_, log) = c.raw("GET", &format!("{path}/log?follow=true"), None).await;
    assert_eq!(log, "hello", "the follow stream is cut after 5 bytes");
    k.evict("ns", &pod_name(&ev), "The node was low on resource: memory.");
    let p = c
        .until(&path, "evicted", |p| p["status"]["phase"] == "Failed")
        .await;
    assert_eq!(p["status"]["reason"], "Evicted");
    assert_eq!(p["status"]["message"], "The node was low on resource: memory.");

    let j = c
        .until(&format!("{JOBS}/dl"), "deadline", |j| has_cond(j, "Failed"))
        .await;
    assert_eq!(cond(&j, "Failed")["reason"], "DeadlineExceeded");
    assert_eq!(
        cond(&j, "Failed")["message"],
        "Job was active longer than specified deadline"
    );
    let p = c.job_pod("ns", "dl").await;
    assert_eq!(p["status"]["reason"], "DeadlineExceeded", "{p:#}");

    c.until(&format!("{JOBS}/ttl"), "ttl deletion", |j| j["code"] == 404)
        .await;
    c.until(
        "/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dttl",
        "ttl pods",
        |v| v["items"].as_array().is_some_and(Vec::is_empty),
    )
    .await;
    assert!(k.running_pods().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_kills_every_process_group() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    c.req(
        "POST",
        JOBS,
        Some(job("bg", &["sh", "-c", "sleep 60 & echo $!; echo $$$$; wait"])),
    )
    .await;
    let pod = c.job_pod("ns", "bg").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}/log", pod_name(&pod));
    let log = c
        .until(&path, "pids", |l| {
            l.as_str().is_some_and(|s| s.lines().count() == 2)
        })
        .await;
    let pids: Vec<i32> = log
        .as_str()
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().expect(l))
        .collect();
    drop(k);
    let t = Instant::now();
    for pid in pids {
        // SAFETY: signal 0 only checks for existence.
        while unsafe { libc::kill(pid, 0) } == 0 {
            let zombie =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
            if zombie {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "pid {pid} survived the drop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_see_their_image_and_volumes_and_nothing_of_the_host() {
    if !can_run() {
        return;
    }
    let pvc = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(pvc.path().join("models/a")).unwrap();
    std::fs::write(pvc.path().join("models/a/w.txt"), "weights").unwrap();
    let img = busybox();
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .image("busybox:1.36", &img)
        .pvc("weights", pvc.path())
        .start()
        .unwrap();
    let c = C::new(&k);
    let script = "echo \"pwd=$(pwd) path=$PATH home=$HOME\"; cat w.txt; echo; \
        test -e /work && echo LEAK-work; test -e /root/.cargo && echo LEAK-cargo; \
        test -e /usr/lib/x86_64-linux-gnu/libc.so.6 && echo LEAK-glibc; \
        echo x > /data/f && echo wrote-ro; echo y > /scratch/f && echo wrote-scratch; \
        echo z > /in-image && echo wrote-image; grep -c ' /data ' /proc/self/mountinfo";
    let mut j = job("iso", &["sh", "-c", script]);
    let s = &mut j["spec"]["template"]["spec"];
    s["containers"][0]["workingDir"] = json!("/data");
    s["containers"][0]["volumeMounts"] = json!([
        {"name": "w", "mountPath": "/data", "subPath": "models/a", "readOnly": true},
        {"name": "tmp", "mountPath": "/scratch"},
    ]);
    s["volumes"] = json!([{"name": "w", "persistentVolumeClaim": {"claimName": "weights"}}, {"name": "tmp", "emptyDir": {}}]);
    c.req("POST", JOBS, Some(j)).await;
    c.until(&format!("{JOBS}/iso"), "Complete", |j| has_cond(j, "Complete"))
        .await;
    let p = c.job_pod("ns", "iso").await;
    let log = c.log(&p).await;
    assert!(
        log.starts_with(&format!(
            "pwd=/data path={} home=/root\nweights\n",
            crate::container::DEFAULT_PATH
        )),
        "{log}"
    );
    assert!(!log.contains("LEAK"), "{log}");
    assert!(
        !log.contains("wrote-ro") && log.contains("Read-only file system"),
        "{log}"
    );
    assert!(
        log.contains("wrote-scratch") && log.contains("wrote-image"),
        "{log}"
    );
    assert!(log.ends_with("1\n"), "{log}");
    assert!(!pvc.path().join("models/a/f").exists());
    // The image stays as it was: the container wrote to its own layer.
    assert!(!img.join("in-image").exists() && !img.join("data").exists() && !img.join("scratch").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_pods_get_their_own_devices_and_the_nvml_library() {
    if !can_run() {
        return;
    }
    let lib = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(lib.path(), "stub-nvml").unwrap();
    let k = FakeKube::builder()
        .node(FakeNode::h100("gpu-0", 8))
        .node(FakeNode::cpu("cpu-0"))
        .image("busybox:1.36", busybox())
        .nvml_stub(lib.path())
        .start()
        .unwrap();
    let c = C::new(&k);
    let show = "echo \"dev=${NVIDIA_VISIBLE_DEVICES-unset}\"; cat /usr/lib64/libnvidia-ml.so.1 2>/dev/null || echo no-lib; echo; sleep 30";
    for (name, n) in [("a", 2), ("b", 3)] {
        let mut j = gpu_job(name, n, true, true);
        j["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["sh", "-c", show]);
        c.req("POST", JOBS, Some(j)).await;
    }
    c.req("POST", JOBS, Some(job("cpu", &["sh", "-c", show]))).await;
    let mut seen = BTreeMap::new();
    for name in ["a", "b", "cpu"] {
        let p = c.job_pod("ns", name).await;
        let path = format!("/api/v1/namespaces/ns/pods/{}/log", pod_name(&p));
        let log = c
            .until(&path, "output", |l| {
                l.as_str().is_some_and(|s| s.lines().count() >= 2)
            })
            .await;
        seen.insert(name, log.as_str().unwrap().to_string());
    }
    assert!(seen["cpu"].starts_with("dev=unset\nno-lib\n"), "{seen:?}");
    let devs = |name: &str| -> BTreeSet<u32> {
        let log = &seen[name];
        assert!(log.contains("stub-nvml"), "{log}");
        log.lines()
            .next()
            .unwrap()
            .trim_start_matches("dev=")
            .split(',')
            .map(|d| d.parse().unwrap())
            .collect()
    };
    let (a, b) = (devs("a"), devs("b"));
    assert_eq!((a.len(), b.len()), (2, 3), "{seen:?}");
    assert!(a.is_disjoint(&b), "{seen:?}");
    assert!(a.union(&b).all(|d| *d < 5), "the lowest free indices: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_the_image_lacks_does_not_start() {
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    // The host may have python3; the busybox image does not.
    c.req("POST", JOBS, Some(job("nopy", &["python3", "-c", "print(1)"])))
        .await;
    c.until(&format!("{JOBS}/nopy"), "Failed", |j| has_cond(j, "Failed"))
        .await;
    let p = c.job_pod("ns", "nopy").await;
    let t = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["reason"], "StartError", "{p:#}");
    assert_eq!(t["exitCode"], 128);
    assert!(
        t["message"]
            .as_str()
            .unwrap()
            .contains("exec: \"python3\": executable file not found in $PATH"),
        "{t}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_are_validated_listed_by_label_and_size_limited() {
    use base64::Engine as _;
    let k = FakeKube::builder().node(FakeNode::cpu("cpu-0")).start().unwrap();
    let c = C::new(&k);
    const CMS: &str = "/api/v1/namespaces/ns/configmaps";
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let cm = |name: &str, run: &str, bin: Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {"orch.dev/run": run}},
            "data": {"note.txt": "hello"}, "binaryData": bin, "immutable": true})
    };
    let (code, v) = c
        .req(
            "POST",
            CMS,
            Some(cm("a", "r1", json!({"blob.0": b64(&[0, 1, 2, 255])}))),
        )
        .await;
    assert_eq!(code, 201, "{v:#}");
    assert_eq!(v["binaryData"]["blob.0"], b64(&[0, 1, 2, 255]));
    let (code, _) = c.req("POST", CMS, Some(cm("b", "r2", json!({})))).await;
    assert_eq!(code, 201);
    let (code, v) = c.req("POST", CMS, Some(cm("a", "r1", json!({})))).await;
    assert_eq!((code, v["reason"].as_str()), (409, Some("AlreadyExists")));
    // Exactly 1 MiB of data is accepted; one byte more is not, as the API server says.
    let (code, v) = c
        .req(
            "POST",
            CMS,
            Some(cm("full", "r1", json!({"x": b64(&vec![7u8; (1 << 20) - 5])}))),
        )
        .await;
    assert_eq!(code, 201, "{v:#}");
    let (code, v) = c
        .req(
            "POST",
            CMS,
            Some(cm("big", "r1", json!({"x": b64(&vec![7u8; (1 << 20) - 4])}))),
        )
        .await;
    assert_eq!(code, 422, "{v:#}");
    assert_eq!(
        v["message"],
        "ConfigMap \"big\" is invalid: []: Too long: must have at most 1048576 bytes"
    );
    let (code, _) = c
        .req("POST", CMS, Some(cm("bad", "r1", json!({"x": "%%%"}))))
        .await;
    assert_eq!(code, 400);
    let (code, v) = c
        .req("POST", CMS, Some(cm("bad", "r1", json!({"a/b": "AA=="}))))
        .await;
    assert_eq!((code, v["reason"].as_str()), (422, Some("Invalid")));
    let (code, _) = c
        .req("POST", CMS, Some(cm("dup", "r1", json!({"note.txt": "AA=="}))))
        .await;
    assert_eq!(code, 422);
    // Immutable: the data cannot change.
    let (code, _) = c
        .req(
            "PATCH",
            &format!("{CMS}/a"),
            Some(json!({"data": {"note.txt": "other"}})),
        )
        .await;
    assert_eq!(code, 422);
    let names = |v: &Value| -> Vec<String> {
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    let l = c.get(&format!("{CMS}?labelSelector=orch.dev%2Frun%3Dr1")).await;
    assert_eq!(l["kind"], "ConfigMapList");
    assert_eq!(names(&l), ["a", "full"]);
    let (code, _) = c
        .req(
            "DELETE",
            &format!("{CMS}?labelSelector=orch.dev%2Frun%3Dr1"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(names(&c.get(CMS).await), ["b"]);
    assert_eq!(k.objects("configmaps").len(), 1);
    let (code, _) = c.req("DELETE", &format!("{CMS}/b"), None).await;
    assert_eq!(code, 200);
    let (code, _) = c.req("GET", &format!("{CMS}/b"), None).await;
    assert_eq!(code, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn projected_config_maps_are_read_only_files_and_a_missing_one_keeps_the_pod_waiting() {
    use base64::Engine as _;
    if !can_run() {
        return;
    }
    let (k, _img) = fake();
    let c = C::new(&k);
    const CMS: &str = "/api/v1/namespaces/ns/configmaps";
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let (code, _) = c
        .req(
            "POST",
            CMS,
            Some(json!({"metadata": {"name": "one"}, "binaryData": {"k1": b64(b"first\n")}, "data": {"t": "text\n"}})),
        )
        .await;
    assert_eq!(code, 201);
    let mut j = job(
        "files",
        &[
            "sh",
            "-c",
            "cat /b/k1 /b/t /b/k2 /c/t; if touch /b/new 2>/dev/null; then echo writable; else echo read-only; fi",
        ],
    );
    let s = &mut j["spec"]["template"]["spec"];
    s["containers"][0]["volumeMounts"] = json!([
        {"name": "blobs", "mountPath": "/b", "readOnly": true},
        {"name": "plain", "mountPath": "/c"},
    ]);
    s["volumes"] = json!([
        {"name": "blobs", "projected": {"defaultMode": 292, "sources": [
            {"configMap": {"name": "one"}}, {"configMap": {"name": "two"}}]}},
        {"name": "plain", "configMap": {"name": "one", "items": [{"key": "t", "path": "t"}]}},
    ]);
    c.req("POST", JOBS, Some(j)).await;
    let p = c.job_pod("ns", "files").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p));
    c.until("/api/v1/namespaces/ns/events", "FailedMount", |v| {
        v["items"].as_array().is_some_and(|a| {
            a.iter().any(|e| {
                e["reason"] == "FailedMount"
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("configmap \"two\" not found"))
            })
        })
    })
    .await;
    assert_eq!(c.get(&path).await["status"]["phase"], "Pending");
    let (code, _) = c
        .req(
            "POST",
            CMS,
            Some(json!({"metadata": {"name": "two"}, "binaryData": {"k2": b64(b"second\n")}})),
        )
        .await;
    assert_eq!(code, 201);
    let p = c
        .until(&path, "done", |p| p["status"]["phase"] == "Succeeded")
        .await;
    let (_, log) = c.raw("GET", &format!("{path}/log"), None).await;
    assert_eq!(log, "first\ntext\nsecond\ntext\nread-only\n", "{p:#}");
}

fn events_of(evs: &Value, reason: &str) -> Vec<Value> {
    evs["items"]
        .as_array()
        .map(|a| a.iter().filter(|e| e["reason"] == reason).cloned().collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_autoscaler_scales_an_empty_gpu_pool_up_or_says_why_not() {
    if !can_run() {
        return;
    }
    let img = busybox();
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .autoscaler(
            FakeAutoscaler::gpu_pool(FakeNode::h100("gpu-pool", 8))
                .timings(Duration::from_millis(1500), Duration::from_secs(3)),
        )
        .image("busybox:1.36", &img)
        .start()
        .unwrap();
    let c = C::new(&k);
    // A GPU pod: FailedScheduling, TriggeredScaleUp, then the node, then it runs there.
    c.req("POST", JOBS, Some(gpu_job("gpu", 1, true, true))).await;
    let pod = c.job_pod("ns", "gpu").await;
    let path = format!("/api/v1/namespaces/ns/pods/{}", pod_name(&pod));
    c.until(&path, "unschedulable", |p| {
        cond(p, "PodScheduled")["reason"] == "Unschedulable"
    })
    .await;
    let running = c
        .until(&path, "running", |p| p["status"]["phase"] == "Running")
        .await;
    assert_eq!(running["spec"]["nodeName"], "gpu-pool-0");
    let evs = c
        .get(&format!(
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3D{}",
            pod_name(&pod)
        ))
        .await;
    assert!(!events_of(&evs, "FailedScheduling").is_empty(), "{evs}");
    let up = events_of(&evs, "TriggeredScaleUp");
    assert_eq!(up[0]["source"]["component"], "cluster-autoscaler", "{evs}");
    assert!(up[0]["message"]
        .as_str()
        .unwrap()
        .contains("gpu-pool 0->1 (max: 4)"));
    assert_eq!(k.objects("nodes").len(), 2);
    // A pod no node of the pool matches: NotTriggerScaleUp, in the autoscaler's words.
    let mut j = gpu_job("odd", 1, true, false);
    j["spec"]["template"]["spec"]["nodeSelector"] = json!({"pool": "none"});
    c.req("POST", JOBS, Some(j)).await;
    let pod = c.job_pod("ns", "odd").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let evs = c
        .get(&format!(
            "/api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3D{}",
            pod_name(&pod)
        ))
        .await;
    let no = events_of(&evs, "NotTriggerScaleUp");
    assert_eq!(
        no[0]["message"], "pod didn't trigger scale-up: 1 node(s) didn't match Pod's node affinity/selector",
        "{evs}"
    );
    assert!(events_of(&evs, "TriggeredScaleUp").is_empty());
}

fn shipped_role() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/orch-role.yaml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_role_is_enforced_with_the_api_servers_forbidden() {
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .role(shipped_role())
        .start()
        .unwrap();
    let c = C::new(&k);
    let secret =
        json!({"metadata": {"name": "s", "labels": {"orch.dev/run": "r"}}, "stringData": {"k": "v"}});
    let (code, _) = c
        .req("POST", "/api/v1/namespaces/bench/secrets", Some(secret))
        .await;
    assert_eq!(code, 201, "create secrets is granted");
    // Reading a Secret back is not: orch never does.
    let (code, v) = c.req("GET", "/api/v1/namespaces/bench/secrets/s", None).await;
    assert_eq!(code, 403);
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["reason"], "Forbidden");
    assert_eq!(
        v["message"],
        "secrets \"s\" is forbidden: User \"system:serviceaccount:bench:orch\" cannot get resource \"secrets\" in API group \"\" in the namespace \"bench\""
    );
    assert_eq!(v["details"]["kind"], "secrets");
    let (code, _) = c
        .req(
            "DELETE",
            "/api/v1/namespaces/bench/secrets?labelSelector=orch.dev%2Frun%3Dr",
            None,
        )
        .await;
    assert_eq!(code, 200, "deletecollection secrets is granted");
    // The optional ClusterRole: nodes list, cluster-scoped.
    assert_eq!(c.req("GET", "/api/v1/nodes", None).await.0, 200);
    assert_eq!(c.req("GET", "/api/v1/nodes/cpu-0", None).await.0, 403);
    // A subresource is its own resource: `pods/log` get is granted (then the pod is missing).
    assert_eq!(
        c.req("GET", "/api/v1/namespaces/bench/pods/p/log?container=cell", None)
            .await
            .0,
        404
    );
    // No watch of ConfigMaps (the run's pods, Jobs and events are watched),
    // and nothing in another namespace.
    let (code, v) = c
        .req("GET", "/api/v1/namespaces/bench/configmaps?watch=true", None)
        .await;
    assert_eq!(code, 403, "{v}");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("cannot watch resource \"configmaps\""));
    assert_eq!(c.req("GET", "/api/v1/namespaces/other/pods", None).await.0, 403);
    assert_eq!(
        c.req("GET", "/api/v1/namespaces/bench/configmaps", None).await.0,
        403,
        "no list configmaps"
    );
    assert_eq!(
        c.req(
            "GET",
            "/apis/batch/v1/namespaces/bench/jobs?watch=true&timeoutSeconds=1",
            None
        )
        .await
        .0,
        200,
        "the run's watch of its Jobs"
    );
    // Discovery is for everyone.
    assert_eq!(c.req("GET", "/api/v1", None).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_drop_cuts_streams_resets_new_connections_and_passes() {
    let k = FakeKube::builder().node(FakeNode::cpu("cpu-0")).start().unwrap();
    let c = C::new(&k);
    let cm = json!({"metadata": {"name": "kept"}, "data": {"a": "b"}});
    assert_eq!(
        c.req("POST", "/api/v1/namespaces/ns/configmaps", Some(cm))
            .await
            .0,
        201
    );
    // A watch open when the API server goes away is cut mid-way.
    let resp = c
        .http
        .get(format!("{}/api/v1/namespaces/ns/configmaps?watch=true", c.base))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await
        .unwrap();
    k.drop_connections(Duration::from_secs(2));
    assert!(k.is_down());
    let body = tokio::time::timeout(Duration::from_secs(10), resp.text())
        .await
        .unwrap();
    assert!(
        body.is_err() || !body.unwrap().contains("DELETED"),
        "the stream ended"
    );
    // New connections are refused while it lasts.
    let fresh = reqwest::Client::new();
    let r = fresh
        .get(format!("{}/api/v1/namespaces/ns/configmaps", c.base))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await;
    assert!(r.is_err(), "{r:?}");
    // Then it answers again, with everything as it was.
    let t = Instant::now();
    let v = loop {
        let r = fresh
            .get(format!("{}/api/v1/namespaces/ns/configmaps/kept", c.base))
            .header("Authorization", "Bearer fake-token")
            .send()
            .await;
        if let Ok(r) = r {
            break r.json::<Value>().await.unwrap();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(v["data"]["a"], "b");
    assert!(!k.is_down());
    // A drop armed on a request: that request gets no answer.
    k.drop_connections_on(
        "DELETE /api/v1/namespaces/ns/configmaps/kept",
        Duration::from_secs(1),
    );
    let r = reqwest::Client::new()
        .delete(format!("{}/api/v1/namespaces/ns/configmaps/kept", c.base))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(
        k.objects("configmaps").len(),
        1,
        "the unanswered deletion did nothing"
    );
}

/// An Indexed Job of `n` pods under `subdomain`, each running `sh -c SCRIPT`.
fn indexed_job(name: &str, n: u32, subdomain: &str, script: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "completionMode": "Indexed", "completions": n, "parallelism": n,
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "restartPolicy": "Never",
                "subdomain": subdomain,
                "terminationGracePeriodSeconds": 2,
                "containers": [{"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}],
            }}},
    })
}

/// The pods of a Job, by completion index.
async fn pods_by_index(c: &C, job: &str, n: usize) -> Vec<Value> {
    let v = c
        .until(
            &format!("/api/v1/namespaces/ns/pods?labelSelector=job-name%3D{job}"),
            "every index's pod",
            |v| v["items"].as_array().is_some_and(|a| a.len() == n),
        )
        .await;
    let mut pods = v["items"].as_array().unwrap().clone();
    pods.sort_by_key(|p| {
        p["metadata"]["annotations"][super::jobs::COMPLETION_INDEX]
            .as_str()
            .unwrap()
            .to_string()
    });
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexed_job_makes_a_pod_per_index_as_the_job_controller_does() {
    if !can_run() {
        return;
    }
    let (k, _) = fake();
    let c = C::new(&k);
    let script = "echo idx=$JOB_COMPLETION_INDEX host=$HOSTNAME";
    let (code, v) = c
        .req("POST", JOBS, Some(indexed_job("ij", 3, "ij", script)))
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["spec"]["completionMode"], "Indexed");
    let pods = pods_by_index(&c, "ij", 3).await;
    for (i, p) in pods.iter().enumerate() {
        let name = pod_name(p);
        assert!(
            name.starts_with(&format!("ij-{i}-")) && name.len() == format!("ij-{i}-").len() + 5,
            "{name}"
        );
        assert_eq!(p["spec"]["hostname"], format!("ij-{i}"));
        assert_eq!(p["spec"]["subdomain"], "ij");
        assert_eq!(
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"],
            i.to_string()
        );
        assert_eq!(
            p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"],
            i.to_string()
        );
        let env = &p["spec"]["containers"][0]["env"];
        assert_eq!(env[0]["name"], "JOB_COMPLETION_INDEX");
        assert_eq!(
            env[0]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        );
    }
    let j = c
        .until(&format!("{JOBS}/ij"), "Complete", |j| has_cond(j, "Complete"))
        .await;
    assert_eq!(j["status"]["succeeded"], 3, "{j}");
    assert_eq!(j["status"]["completedIndexes"], "0-2", "{j}");
    assert!(j["status"].get("active").is_none(), "{j}");
    for (i, p) in pods.iter().enumerate() {
        let log = c.log(p).await;
        assert_eq!(log, format!("idx={i} host=ij-{i}\n"));
    }
    assert_eq!(super::jobs::index_ranges(&[4, 0, 1, 2, 7, 8]), "0-2,4,7-8");
    // Indexed needs completions; other modes do not exist.
    let mut bad = indexed_job("bad", 2, "bad", "true");
    bad["spec"].as_object_mut().unwrap().remove("completions");
    let (code, v) = c.req("POST", JOBS, Some(bad)).await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("spec.completions: Required value: when completion mode is Indexed"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_index_fails_the_job_and_its_other_pods_are_terminated() {
    if !can_run() {
        return;
    }
    let (k, _) = fake();
    let c = C::new(&k);
    let script = "if [ \"$JOB_COMPLETION_INDEX\" = 1 ]; then sleep 0.5; exit 1; fi; trap 'echo term; exit 143' TERM; sleep 60 & wait";
    let (code, v) = c
        .req("POST", JOBS, Some(indexed_job("fj", 2, "fj", script)))
        .await;
    assert_eq!(code, 201, "{v}");
    let pods = pods_by_index(&c, "fj", 2).await;
    let t = Instant::now();
    let j = c
        .until(&format!("{JOBS}/fj"), "Failed", |j| has_cond(j, "Failed"))
        .await;
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(cond(&j, "Failed")["reason"], "BackoffLimitExceeded");
    assert!(has_cond(&j, "FailureTarget"), "{j}");
    assert_eq!(j["status"]["failed"], 2, "both pods counted failed: {j}");
    // Index 0 was terminated (SIGTERM) and deleted by the controller.
    let p0 = pod_name(&pods[0]);
    c.until(
        "/api/v1/namespaces/ns/pods?labelSelector=job-name%3Dfj",
        "index 0 deleted",
        |v| {
            v["items"]
                .as_array()
                .is_some_and(|a| a.iter().all(|p| pod_name(p) != p0))
        },
    )
    .await;
    assert!(k.running_pods().is_empty(), "{:?}", k.running_pods());
    let evs = c.get("/api/v1/namespaces/ns/events").await;
    assert_eq!(events_of(&evs, "SuccessfulDelete").len(), 1, "{evs:#}");
}

fn headless(name: &str, selector: Value) -> Value {
    json!({"metadata": {"name": name, "labels": {"orch.dev/run": "r"}},
        "spec": {"clusterIP": "None", "selector": selector, "publishNotReadyAddresses": true,
            "ports": [{"name": "rendezvous", "port": 29500}]}})
}

const SVCS: &str = "/api/v1/namespaces/ns/services";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_are_validated_listed_deleted_and_collected_with_their_job() {
    let k = FakeKube::builder().node(FakeNode::cpu("cpu-0")).start().unwrap();
    let c = C::new(&k);
    // A DNS-1035 label: a letter first.
    let (code, v) = c
        .req("POST", SVCS, Some(headless("1abc", json!({"a": "b"}))))
        .await;
    assert_eq!(code, 422, "{v}");
    assert!(v["message"].as_str().unwrap().contains("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character"), "{v}");
    // A ClusterIP Service needs ports; a headless one gets none drawn.
    let (code, v) = c
        .req(
            "POST",
            SVCS,
            Some(json!({"metadata": {"name": "plain"}, "spec": {"selector": {"a": "b"}}})),
        )
        .await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("spec.ports: Required value"),
        "{v}"
    );
    let (code, v) = c
        .req("POST", SVCS, Some(headless("peers", json!({"a": "b"}))))
        .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["spec"]["clusterIP"], "None");
    assert_eq!(v["spec"]["type"], "ClusterIP");
    assert_eq!(v["spec"]["ports"][0]["targetPort"], 29500);
    assert_eq!(v["spec"]["ports"][0]["protocol"], "TCP");
    assert_eq!(
        c.req("POST", SVCS, Some(headless("peers", json!({})))).await.0,
        409
    );
    let listed = c.get(&format!("{SVCS}?labelSelector=orch.dev%2Frun%3Dr")).await;
    assert_eq!(listed["kind"], "ServiceList");
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    assert_eq!(c.get(&format!("{SVCS}/peers")).await["metadata"]["name"], "peers");
    let (code, _) = c
        .req(
            "DELETE",
            &format!("{SVCS}?labelSelector=orch.dev%2Frun%3Dr"),
            None,
        )
        .await;
    assert_eq!(code, 200);
    assert_eq!(c.req("GET", &format!("{SVCS}/peers"), None).await.0, 404);
    // Owned by a Job: the garbage collector deletes it with the Job (Background), and an
    // Orphan deletion leaves it without the reference.
    for (job, policy, gone) in [("gj", "Background", true), ("oj", "Orphan", false)] {
        let (code, j) = c.req("POST", JOBS, Some(job_spec_sleep(job))).await;
        assert_eq!(code, 201, "{j}");
        let mut svc = headless(job, json!({"app": job}));
        svc["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": j["metadata"]["uid"]}]);
        assert_eq!(c.req("POST", SVCS, Some(svc)).await.0, 201);
        let (code, _) = c
            .req(
                "DELETE",
                &format!("{JOBS}/{job}"),
                Some(json!({"propagationPolicy": policy})),
            )
            .await;
        assert_eq!(code, 200);
        c.until(JOBS, "the Job gone", |v| {
            v["items"]
                .as_array()
                .is_some_and(|a| a.iter().all(|j| j["metadata"]["name"] != json!(job)))
        })
        .await;
        let (code, s) = c.req("GET", &format!("{SVCS}/{job}"), None).await;
        if gone {
            assert_eq!(code, 404, "{s}");
        } else {
            assert_eq!(code, 200, "{s}");
            assert!(s["metadata"].get("ownerReferences").is_none(), "{s}");
        }
    }
}

/// A Job whose pod never gets a node (it asks for 99 GPUs): no container runs.
fn job_spec_sleep(name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox:1.36", "command": ["true"],
                "resources": {"limits": {"nvidia.com/gpu": "99"}}}],
        }}},
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_under_a_headless_service_resolve_each_other_and_connect_over_tcp() {
    if !can_run() {
        return;
    }
    let (k, _) = fake();
    let c = C::new(&k);
    // A port of its own (not the e2e tests' 29500): pods share this host's network.
    let port = 30_000 + (std::process::id() % 5_000);
    assert_eq!(
        c.req("POST", SVCS, Some(headless("peers", json!({"app": "tj"}))))
            .await
            .0,
        201
    );
    let script = format!(
        r#"if [ "$JOB_COMPLETION_INDEX" = 0 ]; then
  msg=$(nc -l -p {port}); echo "rank 0 got: $msg"
else
  i=0
  until grep -q 'tj-0[.]peers' /etc/hosts; do i=$((i+1)); [ $i -gt 100 ] && exit 6; sleep 0.1; done
  cat /etc/hosts
  i=0
  until echo "hello from $HOSTNAME" | nc -w 2 tj-0.peers {port}; do
    i=$((i+1)); [ $i -gt 100 ] && exit 7; sleep 0.1
  done
fi"#
    );
    let (code, v) = c
        .req("POST", JOBS, Some(indexed_job("tj", 2, "peers", &script)))
        .await;
    assert_eq!(code, 201, "{v}");
    let pods = pods_by_index(&c, "tj", 2).await;
    let j = c
        .until(&format!("{JOBS}/tj"), "Complete or Failed", |j| {
            has_cond(j, "Complete") || has_cond(j, "Failed")
        })
        .await;
    let logs: Vec<String> = futures_util::future::join_all(pods.iter().map(|p| c.log(p))).await;
    assert!(has_cond(&j, "Complete"), "{j:#}\n{logs:?}");
    assert_eq!(logs[0], "rank 0 got: hello from tj-1\n", "{logs:?}");
    let ip0 = pods_ip(&c, &pod_name(&pods[0])).await;
    assert!(ip0.starts_with("127."), "{ip0}");
    // The kubelet's hosts file: its own name, and its peers' as cluster DNS answers them.
    assert!(
        logs[1].contains("# Kubernetes-managed hosts file."),
        "{}",
        logs[1]
    );
    assert!(
        logs[1].contains(&format!(
            "{ip0}\ttj-0.peers.ns.svc.cluster.local\ttj-0.peers.ns.svc\ttj-0.peers.ns\ttj-0.peers\n"
        )),
        "{}",
        logs[1]
    );
    assert!(
        logs[1].contains("\ttj-1.peers.ns.svc.cluster.local\ttj-1\n"),
        "{}",
        logs[1]
    );
    // No Service, no peers: only the pod's own entry.
    let pod = c
        .get(&format!("/api/v1/namespaces/ns/pods/{}", pod_name(&pods[1])))
        .await;
    assert_eq!(c.req("DELETE", &format!("{SVCS}/peers"), None).await.0, 200);
    let hosts = super::kubelet::hosts_file(&k.inner, &pod);
    assert!(!hosts.contains("tj-0"), "{hosts}");
}

async fn pods_ip(c: &C, pod: &str) -> String {
    c.get(&format!("/api/v1/namespaces/ns/pods/{pod}")).await["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_role_grants_the_headless_services_of_multi_node_cells() {
    let k = FakeKube::builder()
        .node(FakeNode::cpu("cpu-0"))
        .role(shipped_role())
        .start()
        .unwrap();
    let c = C::new(&k);
    let svcs = "/api/v1/namespaces/bench/services";
    assert_eq!(
        c.req("POST", svcs, Some(headless("s", json!({"a": "b"}))))
            .await
            .0,
        201,
        "create"
    );
    assert_eq!(c.req("GET", &format!("{svcs}/s"), None).await.0, 200, "get");
    assert_eq!(
        c.req("GET", &format!("{svcs}?labelSelector=orch.dev%2Frun%3Dr"), None)
            .await
            .0,
        200,
        "list"
    );
    let (code, v) = c
        .req(
            "PATCH",
            &format!("{svcs}/s"),
            Some(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await;
    assert_eq!(code, 403, "no patch: {v}");
    assert_eq!(c.req("DELETE", &format!("{svcs}/s"), None).await.0, 200, "delete");
    assert_eq!(
        c.req(
            "DELETE",
            &format!("{svcs}?labelSelector=orch.dev%2Frun%3Dr"),
            None
        )
        .await
        .0,
        200,
        "deletecollection"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_counted_by_verb_and_refused_past_the_rate_with_retry_after() {
    let k = FakeKube::builder().rate_limit(1.0, 3.0).start().unwrap();
    let c = C::new(&k);
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(c.req("GET", "/api/v1/namespaces/ns/pods", None).await.0);
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    let resp = c
        .http
        .get(format!("{}/api/v1/namespaces/ns/pods/p", c.base))
        .header("Authorization", "Bearer fake-token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert!(resp.headers().contains_key("x-kubernetes-pf-prioritylevel-uid"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["reason"], "TooManyRequests");
    assert_eq!(v["details"]["retryAfterSeconds"], 1);
    let t = k.throttled();
    assert_eq!(t.len(), 3);
    assert_eq!(t[0].retry_after, Duration::from_secs(1));
    assert!(t[0].request.starts_with("GET /api/v1/namespaces/ns/pods"));
    // Told to wait, a client that waits is served.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(c.req("GET", "/api/v1/namespaces/ns/pods/p", None).await.0, 404);
    let counts = k.request_counts();
    assert_eq!(counts[&("list".to_string(), "pods".to_string())], 5);
    assert_eq!(counts[&("get".to_string(), "pods".to_string())], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumes_from_its_version_sends_bookmarks_when_asked_and_a_compacted_one_is_gone() {
    let k = FakeKube::builder().start().unwrap();
    let c = C::new(&k);
    let cm = |n: &str| json!({"metadata": {"name": n}, "data": {"k": "v"}});
    let cms = "/api/v1/namespaces/ns/configmaps";
    let (code, a) = c.req("POST", cms, Some(cm("a"))).await;
    assert_eq!(code, 201, "{a}");
    let rv_a = a["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    c.req("POST", cms, Some(cm("b"))).await;
    let watch = |q: String| {
        let c = &c;
        async move {
            let resp = c
                .http
                .get(format!("{}{cms}?watch=true&{q}", c.base))
                .header("Authorization", "Bearer fake-token")
                .send()
                .await
                .unwrap();
            let text = resp.text().await.unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<_>>()
        }
    };
    // From a's version: only b, then (asked) a bookmark as it ends.
    let evs = watch(format!(
        "resourceVersion={rv_a}&timeoutSeconds=1&allowWatchBookmarks=true"
    ))
    .await;
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["ADDED", "BOOKMARK"], "{evs:#?}");
    assert_eq!(evs[0]["object"]["metadata"]["name"], "b");
    let bookmark_rv: u64 = evs[1]["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(bookmark_rv > rv_a.parse().unwrap());
    // Not asked: no bookmark.
    let evs = watch(format!("resourceVersion={rv_a}&timeoutSeconds=1")).await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    // Compacted past a's version: 410 Gone, as an ERROR event.
    k.compact();
    let evs = watch(format!("resourceVersion={rv_a}&timeoutSeconds=1")).await;
    assert_eq!(evs.len(), 1, "{evs:#?}");
    assert_eq!(evs[0]["type"], "ERROR");
    assert_eq!(evs[0]["object"]["code"], 410);
    assert_eq!(evs[0]["object"]["reason"], "Expired");
}

/// A bookmark says every change up to its version was sent: one that said
/// the store's latest version while changes were still unsent made the
/// client reopen past them (a 5,000-cell run lost a pod's end that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bookmark_never_passes_a_change_the_watch_has_not_sent() {
    let k = FakeKube::builder().start().unwrap();
    let c = C::new(&k);
    let cms = "/api/v1/namespaces/ns/configmaps";
    let cm = |n: String| json!({"metadata": {"name": n}, "data": {"k": "v"}});
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (http, base, stop) = (c.http.clone(), c.base.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let _ = http
                    .post(format!("{base}{cms}"))
                    .header("Authorization", "Bearer fake-token")
                    .json(&cm(format!("cm-{i}")))
                    .send()
                    .await;
            }
        })
    };
    let (_, first) = c.req("POST", cms, Some(cm("first".into()))).await;
    let mut from: u64 = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut spans = Vec::new();
    // (Six in turn: each ends while changes arrive, and without the rule
    // about half of them bookmarked past an unsent change.)
    for _ in 0..6 {
        let text = c
            .http
            .get(format!(
                "{}{cms}?watch=true&resourceVersion={from}&timeoutSeconds=1&allowWatchBookmarks=true",
                c.base
            ))
            .header("Authorization", "Bearer fake-token")
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let evs: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let rv = |e: &Value| -> u64 {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        };
        let seen: std::collections::BTreeSet<u64> =
            evs.iter().filter(|e| e["type"] == "ADDED").map(rv).collect();
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "BOOKMARK", "{last}");
        spans.push((from, rv(last), seen));
        // As a client does: the next watch from the bookmark.
        from = rv(last);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    writer.await.unwrap();
    let (_, all) = c.req("GET", cms, None).await;
    let created: Vec<u64> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    for (from, to, seen) in spans {
        let missed: Vec<u64> = created
            .iter()
            .copied()
            .filter(|rv| *rv > from && *rv <= to && !seen.contains(rv))
            .collect();
        assert!(
            missed.is_empty(),
            "the watch from {from} bookmarked {to} but never sent {missed:?}"
        );
    }
}

/// KEP-4639 image volumes as a cluster of each version has them: 1.33 (gate
/// off by default) drops the volume and its mounts as it stores the Job, with
/// no error; 1.35 on containerd 2.1 mounts the image's root read-only and
/// executable; 1.35 on containerd 2.0 never creates the container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_volumes_follow_the_gate_and_the_runtime() {
    if !can_run() {
        return;
    }
    let tools = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tools.path().join("bin")).unwrap();
    let tool = tools.path().join("bin/tool");
    std::fs::write(&tool, "#!/bin/sh\necho tool-ran\n").unwrap();
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let with_volume = |name: &str| {
        let mut j = job(
            name,
            &[
                "sh",
                "-c",
                "/t/bin/tool; touch /t/new 2>/dev/null && echo writable || echo read-only",
            ],
        );
        let s = &mut j["spec"]["template"]["spec"];
        s["containers"][0]["volumeMounts"] = json!([{"name": "tools", "mountPath": "/t"}]);
        s["volumes"] = json!([{"name": "tools", "image": {"reference": "reg/tools:v1"}}]);
        j
    };
    let cluster = |minor: u32, runtime: &str| {
        FakeKube::builder()
            .node(FakeNode::cpu("cpu-0"))
            .image("busybox:1.36", busybox())
            .image("reg/tools:v1", tools.path())
            .kubernetes_minor(minor)
            .container_runtime(runtime)
            .start()
            .unwrap()
    };

    // 1.33: stored without the volume or its mount; the container finds no tool.
    let k = cluster(33, "containerd://2.0.0");
    let c = C::new(&k);
    assert_eq!(c.get("/version").await["minor"], "33");
    let (code, stored) = c.req("POST", JOBS, Some(with_volume("old"))).await;
    assert_eq!(code, 201, "{stored:#}");
    let spec = &stored["spec"]["template"]["spec"];
    assert!(
        spec["volumes"].as_array().is_none_or(|v| v.is_empty()),
        "{spec:#}"
    );
    assert!(
        spec["containers"][0]["volumeMounts"]
            .as_array()
            .is_none_or(|v| v.is_empty()),
        "{spec:#}"
    );
    drop(k);

    // 1.35 on containerd 2.1: mounted, executable, read-only; pullPolicy defaulted.
    let k = cluster(35, "containerd://2.1.4");
    let c = C::new(&k);
    let node = c.get("/api/v1/nodes/cpu-0").await;
    assert_eq!(node["status"]["nodeInfo"]["kubeletVersion"], "v1.35.0-fake");
    let (code, stored) = c.req("POST", JOBS, Some(with_volume("new"))).await;
    assert_eq!(code, 201, "{stored:#}");
    assert_eq!(
        stored["spec"]["template"]["spec"]["volumes"][0]["image"]["pullPolicy"],
        "IfNotPresent"
    );
    c.until(&format!("{JOBS}/new"), "Complete", |j| has_cond(j, "Complete"))
        .await;
    let p = c.job_pod("ns", "new").await;
    let log = c.log(&p).await;
    assert_eq!(log, "tool-ran\nread-only\n");
    assert!(!tools.path().join("new").exists());
    // A volume without a reference is refused.
    let mut bad = with_volume("noref");
    bad["spec"]["template"]["spec"]["volumes"][0]["image"] = json!({});
    let (code, st) = c.req("POST", JOBS, Some(bad)).await;
    assert_eq!(code, 422, "{st:#}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains("spec.template.spec.volumes[0].image.reference: Required value"),
        "{st:#}"
    );
    drop(k);

    // 1.35 on containerd 2.0: the API keeps it, the node cannot mount it.
    let k = cluster(35, "containerd://2.0.0");
    let c = C::new(&k);
    c.req("POST", JOBS, Some(with_volume("norun"))).await;
    let p = c.job_pod("ns", "norun").await;
    let p = c
        .until(
            &format!("/api/v1/namespaces/ns/pods/{}", pod_name(&p)),
            "CreateContainerError",
            |p| p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CreateContainerError",
        )
        .await;
    assert_eq!(p["status"]["phase"], "Pending", "{p:#}");
}
