//! The Job orch applies for a cell, from a real suite: an `H100:8` cell with
//! weights on a PVC, a secret and a custom image. Structure checked field by
//! field, and the whole YAML (what `--dry-run` prints) as a snapshot.

use k8s_openapi::api::batch::v1::Job;
use orch_backend_kubernetes::{spec, KubeSettings};

const SUITE: &str = r#"
name: k8s-spec
gpus: ["H100:8"]
image: registry.example.com/team/vllm:v1
secrets: [HF_TOKEN]
memory_limit: 64GiB
measure: {timeout: 10m, kill_grace: 20s}
benchmarks:
  - name: serve
    workload: {shell: "python3 -m bench --model $MODEL"}
    env: {MODEL: org/model}
"#;

fn job() -> Job {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.yaml");
    std::fs::write(&path, SUITE).unwrap();
    let plan = orch_manifest::load(&path, &Default::default()).unwrap();
    let mut task = plan.cells[0].task.clone();
    task.run_id = "20261125-101500-k8s-spec-abcd".into();
    let mut s = KubeSettings::new("bench", "registry.example.com/orch/orch-agent:0.1.0");
    s.weights_pvc = Some("hf-weights".into());
    s.shm_size_bytes = Some(16 << 30);
    s.node_selector.insert("pool".into(), "h100".into());
    s.image_pull_secrets = vec!["regcred".into()];
    spec::cell_job(
        &task,
        "registry.example.com/team/vllm:v1",
        &["HF_TOKEN".into()],
        &s,
    )
}

#[test]
fn an_h100x8_cell_asks_for_what_it_needs_and_nothing_secret() {
    let job = job();
    let v = serde_json::to_value(&job).unwrap();
    let js = &v["spec"];
    assert_eq!(js["backoffLimit"], 0);
    assert_eq!(js["ttlSecondsAfterFinished"], 3600);
    // timeout 600 + grace 20 + max_pending 900 + 180
    assert_eq!(js["activeDeadlineSeconds"], 1700);
    let pod = &js["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let labels = &v["metadata"]["labels"];
    assert_eq!(labels["app.kubernetes.io/managed-by"], "orch");
    assert_eq!(labels["orch.dev/run"], "20261125-101500-k8s-spec-abcd");
    assert_eq!(labels["orch.dev/cell"], "serve.h100x8");
    let cell = &pod["containers"][0];
    assert_eq!(cell["image"], "registry.example.com/team/vllm:v1");
    assert_eq!(cell["resources"]["limits"]["nvidia.com/gpu"], "8");
    assert_eq!(cell["resources"]["limits"]["memory"], "64Gi");
    assert_eq!(cell["terminationMessagePolicy"], "FallbackToLogsOnError");
    // The secret only by reference.
    let env = cell["env"].as_array().unwrap();
    assert_eq!(env.len(), 1);
    assert_eq!(env[0]["name"], "HF_TOKEN");
    assert!(env[0].get("value").is_none());
    assert_eq!(env[0]["valueFrom"]["secretKeyRef"]["key"], "HF_TOKEN");
    // GPU type by node labels; the GPU taint tolerated; the user's selector.
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert_eq!(terms[0]["matchExpressions"][0]["key"], "nvidia.com/gpu.product");
    assert!(terms[0]["matchExpressions"][0]["values"]
        .as_array()
        .unwrap()
        .contains(&"NVIDIA-H100-80GB-HBM3".into()));
    assert_eq!(pod["tolerations"][0]["key"], "nvidia.com/gpu");
    assert_eq!(pod["nodeSelector"]["pool"], "h100");
    assert_eq!(pod["imagePullSecrets"][0]["name"], "regcred");
    // Weights read-only, /dev/shm in memory, the agent from the init container.
    let mounts = cell["volumeMounts"].as_array().unwrap();
    let weights = mounts.iter().find(|m| m["name"] == "weights").unwrap();
    assert_eq!(
        (weights["mountPath"].as_str(), weights["readOnly"].as_bool()),
        (Some("/weights"), Some(true))
    );
    let vols = pod["volumes"].as_array().unwrap();
    let w = vols.iter().find(|v| v["name"] == "weights").unwrap();
    assert_eq!(w["persistentVolumeClaim"]["claimName"], "hf-weights");
    assert_eq!(w["persistentVolumeClaim"]["readOnly"], true);
    let shm = vols.iter().find(|v| v["name"] == "dshm").unwrap();
    assert_eq!(shm["emptyDir"]["medium"], "Memory");
    assert_eq!(shm["emptyDir"]["sizeLimit"], "16Gi");
    assert_eq!(
        pod["initContainers"][0]["image"],
        "registry.example.com/orch/orch-agent:0.1.0"
    );
    assert_eq!(cell["command"][0], "/orch/bin/orch-agent");
    // The task the agent gets reads weights from the mount.
    let args = cell["args"].as_array().unwrap();
    let b64 = args[2].as_str().unwrap();
    use base64::Engine as _;
    let task: serde_json::Value =
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(b64).unwrap()).unwrap();
    assert_eq!(task["weights_dir"], "/weights");
    assert_eq!(task["gpu"], "H100:8");
}

#[test]
fn the_dry_run_yaml_is_stable() {
    let job = job();
    let mut v = serde_json::to_value(&job).unwrap();
    // The task (base64) holds the manifest's absolute path: not stable.
    v["spec"]["template"]["spec"]["containers"][0]["args"][2] = "<task>".into();
    let job: Job = serde_json::from_value(v).unwrap();
    let s = KubeSettings::new("bench", "x");
    let yaml = spec::dry_run_yaml(
        &[job],
        &[],
        &["HF_TOKEN".into()],
        "20261125-101500-k8s-spec-abcd",
        &s,
    );
    insta::assert_snapshot!(yaml);
}

/// Under a ResourceQuota on `limits.cpu`/`limits.memory` with no
/// LimitRange, the API server refuses a pod any of whose containers lacks
/// either limit: every container orch adds has both (the cell's own gets
/// what the suite asks for).
#[test]
fn every_container_orch_adds_has_cpu_and_memory_limits() {
    let s = KubeSettings::new("bench", "registry.example.com/orch/orch-agent:0.1.0");
    let cell = serde_json::to_value(job()).unwrap();
    let probe = serde_json::to_value(spec::probe_job("orch-probe-x", "busybox:1", "true", &s)).unwrap();
    let setup = serde_json::to_value(spec::setup_job(
        "orch-setup-x",
        "registry.example.com/orch/orch-agent:0.1.0",
        &["setup".into()],
        None,
        &[],
        &s,
    ))
    .unwrap();
    let added = [
        (
            "the agent installer",
            &cell["spec"]["template"]["spec"]["initContainers"][0],
        ),
        ("the probe", &probe["spec"]["template"]["spec"]["containers"][0]),
        ("the setup", &setup["spec"]["template"]["spec"]["containers"][0]),
    ];
    for (what, c) in added {
        for r in ["cpu", "memory"] {
            assert!(
                c["resources"]["limits"][r].is_string(),
                "{what} has no {r} limit: {c:#}"
            );
            assert!(
                c["resources"]["requests"][r].is_string(),
                "{what} has no {r} request: {c:#}"
            );
        }
    }
    // A benchmark pod is not consolidated or scaled down under it.
    let ann = &cell["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(ann["karpenter.sh/do-not-disrupt"], "true");
    assert_eq!(ann["cluster-autoscaler.kubernetes.io/safe-to-evict"], "false");
}

/// The agent installer of every Job passes Pod Security `restricted` (its
/// container-level rules: non-root, no privilege escalation, every
/// capability dropped, a `RuntimeDefault`/`Localhost` seccomp profile) and
/// OpenShift's `restricted-v2` SCC, which assigns the UID from the
/// namespace's range and refuses a pod that fixes another: no `runAsUser`.
#[test]
fn the_agent_installer_passes_restricted_and_openshifts_scc() {
    let s = KubeSettings::new("bench", "registry.example.com/orch/orch-agent:0.1.0");
    let cell = serde_json::to_value(job()).unwrap();
    let setup = serde_json::to_value(spec::setup_job(
        "orch-setup-x",
        "registry.example.com/orch/orch-agent:0.1.0",
        &["setup".into()],
        None,
        &[],
        &s,
    ))
    .unwrap();
    for job in [&cell, &setup] {
        let init = &job["spec"]["template"]["spec"]["initContainers"][0];
        let sc = &init["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{init}");
        assert!(
            sc.get("runAsUser").is_none(),
            "a fixed UID is refused by OpenShift: {sc}"
        );
        assert!(job["spec"]["template"]["spec"]["securityContext"]
            .get("runAsUser")
            .is_none());
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
        assert!(sc["capabilities"].get("add").is_none());
        assert!(matches!(
            sc["seccompProfile"]["type"].as_str(),
            Some("RuntimeDefault" | "Localhost")
        ));
        assert!(sc.get("privileged").is_none_or(|p| p == false));
    }
}

/// A `nodes: 2` cell: an Indexed Job of 2 pods under the subdomain of its
/// headless Service, the rendezvous variables from the completion index,
/// the cell's GPUs per pod; `--dry-run` prints the Service after its Job.
#[test]
fn a_two_node_cell_is_an_indexed_job_with_a_headless_service() {
    let mut job = job();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.yaml");
    std::fs::write(&path, SUITE).unwrap();
    let plan = orch_manifest::load(&path, &Default::default()).unwrap();
    let mut task = plan.cells[0].task.clone();
    task.run_id = "20261125-101500-k8s-spec-abcd".into();
    assert!(
        spec::indexed(&mut job.clone(), &task, 1).is_none(),
        "one node: no Service"
    );
    let svc = spec::indexed(&mut job, &task, 2).unwrap();
    let name = job.metadata.name.clone().unwrap();
    let v = serde_json::to_value(&job).unwrap();
    let js = &v["spec"];
    assert_eq!(js["completionMode"], "Indexed");
    assert_eq!(
        (js["completions"].as_i64(), js["parallelism"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(js["backoffLimit"], 0);
    let pod = &js["template"]["spec"];
    assert_eq!(pod["subdomain"], name.as_str());
    let cell = &pod["containers"][0];
    // The GPUs per node, as slurm asks for them.
    assert_eq!(cell["resources"]["limits"]["nvidia.com/gpu"], "8");
    let env: std::collections::BTreeMap<String, serde_json::Value> = cell["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_string(), e.clone()))
        .collect();
    let val = |k: &str| env[k]["value"].as_str().unwrap_or_default().to_string();
    assert_eq!(val("MASTER_ADDR"), format!("{name}-0.{name}"));
    assert_eq!(val("MASTER_PORT"), "29500");
    assert_eq!(
        (val("WORLD_SIZE"), val("NNODES"), val("NPROC_PER_NODE")),
        ("2".into(), "2".into(), "8".into())
    );
    assert_eq!(
        env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    );
    assert_eq!(val("RANK"), "$(NODE_RANK)");
    // The secret still by reference only.
    assert!(env["HF_TOKEN"].get("value").is_none());
    // The Service: headless, selecting the Job's pods, labelled as the run's.
    let s = serde_json::to_value(&svc).unwrap();
    assert_eq!(s["metadata"]["name"], name.as_str());
    assert_eq!(s["spec"]["clusterIP"], "None");
    assert_eq!(s["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(s["spec"]["selector"]["orch.dev/job"], name.as_str());
    assert_eq!(
        js["template"]["metadata"]["labels"]["orch.dev/job"],
        name.as_str(),
        "the selector matches the pods"
    );
    assert_eq!(
        s["metadata"]["labels"]["orch.dev/run"],
        "20261125-101500-k8s-spec-abcd"
    );
    assert_eq!(s["spec"]["ports"][0]["port"], 29500);
    let owned = serde_json::to_value(spec::owned_by(svc.clone(), &name, "uid-1")).unwrap();
    assert_eq!(owned["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    assert_eq!(owned["metadata"]["ownerReferences"][0]["kind"], "Job");
    // `--dry-run`: the Job, then its Service.
    let s = KubeSettings::new("bench", "x");
    let yaml = spec::dry_run_yaml(&[job], &[svc], &[], "20261125-101500-k8s-spec-abcd", &s);
    let (j, rest) = yaml.split_once("kind: Service").unwrap();
    assert!(
        j.contains("completionMode: Indexed") && j.contains("kind: Job"),
        "{yaml}"
    );
    assert!(rest.contains("clusterIP: None"), "{yaml}");
    assert_eq!(
        yaml.matches("\n---\n").count() + usize::from(yaml.starts_with("---\n")),
        2,
        "{yaml}"
    );
}

/// `agent_delivery: image-volume`: no init container; the agent image is a
/// read-only `image` volume at `/orch/bin`, where the cell runs the agent.
#[test]
fn an_image_volume_cell_has_no_init_container_and_mounts_the_agent_image() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("suite.yaml");
    std::fs::write(&path, SUITE).unwrap();
    let plan = orch_manifest::load(&path, &Default::default()).unwrap();
    let mut s = KubeSettings::new("bench", "registry.example.com/orch/orch-agent:0.1.0");
    s.agent_delivery = orch_manifest::AgentDelivery::ImageVolume;
    let job = spec::cell_job(&plan.cells[0].task, "registry.example.com/team/vllm:v1", &[], &s);
    let v = serde_json::to_value(&job).unwrap();
    let pod = &v["spec"]["template"]["spec"];
    assert!(pod.get("initContainers").is_none(), "{pod:#}");
    let vol = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "orch-bin")
        .unwrap();
    assert_eq!(
        vol["image"]["reference"],
        "registry.example.com/orch/orch-agent:0.1.0"
    );
    assert!(vol.get("emptyDir").is_none(), "{vol:#}");
    let cell = &pod["containers"][0];
    assert_eq!(cell["command"][0], "/orch/bin/orch-agent");
    let mount = cell["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "orch-bin")
        .unwrap();
    assert_eq!(mount["mountPath"], "/orch/bin");
    assert_eq!(mount["readOnly"], true);
}
