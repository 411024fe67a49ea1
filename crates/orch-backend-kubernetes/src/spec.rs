//! The objects orch applies, built without IO: one Job per cell, one Secret
//! per run. `orch run --backend kubernetes --dry-run` prints these.
//!
//! A cell's Job: `backoffLimit: 0` (a failed benchmark is a result, not
//! something to retry behind the user's back), `restartPolicy: Never`,
//! `activeDeadlineSeconds` from the cell's timeout (plus the time it may
//! wait for a node), `ttlSecondsAfterFinished` as a safety net, labels for
//! the run and the cell. GPUs as `nvidia.com/gpu` limits, the GPU type by
//! node labels (GPU Feature Discovery, GKE, Karpenter, or the user's label),
//! the usual `nvidia.com/gpu` toleration, `/dev/shm` as a memory `emptyDir`
//! (NCCL), weights from a PVC read-only, secrets through `secretKeyRef` only.

use crate::{
    AGENT_CONTAINER, AGENT_DIR, AGENT_IN_IMAGE, AGENT_PATH, CELL_CONTAINER, CELL_LABEL, JOB_LABEL,
    MANAGED_BY, OUT_DIR, RUN_LABEL, WEIGHTS_MOUNT,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, LocalObjectReference, NodeAffinity,
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimVolumeSource, PodSpec,
    PodTemplateSpec, ResourceRequirements, Secret, SecretKeySelector, Toleration as K8sToleration, Volume,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use orch_protocol::TaskSpec;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::Duration;

/// A toleration as the suite writes it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Toleration {
    pub key: Option<String>,
    /// `Exists` or `Equal` (default `Equal` with a value, `Exists` without).
    pub operator: Option<String>,
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule`, `NoExecute`; empty: all.
    pub effect: Option<String>,
}

/// How cells run on the cluster: the suite's `kubernetes:` section with the
/// command line's `--namespace`/`--context` applied and defaults filled in.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub namespace: String,
    /// Every pod's `nodeSelector` (added to the GPU type's affinity).
    pub node_selector: BTreeMap<String, String>,
    /// Added to the `nvidia.com/gpu` toleration GPU cells always get.
    pub tolerations: Vec<Toleration>,
    pub service_account: Option<String>,
    pub image_pull_secrets: Vec<String>,
    /// `/dev/shm` size (a memory `emptyDir`); `None`: no limit but the pod's memory.
    pub shm_size_bytes: Option<u64>,
    pub runtime_class: Option<String>,
    /// The node label naming the GPU type (`None`: GPU Feature Discovery's
    /// `nvidia.com/gpu.product`, GKE's and Karpenter's labels, any of them).
    pub gpu_label: Option<String>,
    /// Label values per GPU type for `gpu_label` (or in place of the known
    /// values of the three standard labels).
    pub gpu_types: BTreeMap<String, Vec<String>>,
    /// A PVC holding the weights (a hub cache), mounted read-only at `/weights`.
    pub weights_pvc: Option<String>,
    /// An existing Secret holding the suite's secrets under their names;
    /// `None`: orch creates one per run from the host's environment.
    pub secret_name: Option<String>,
    /// With `secret_name`: the keys every cell gets (the suite's `secrets:`).
    pub secret_keys: Vec<String>,
    /// The image whose `/orch-agent` is the static agent (`orch build --push` publishes it).
    pub agent_image: String,
    /// A pod that makes no progress (pending, pulling, creating) this long fails the cell.
    pub max_pending: Duration,
    /// How long an unschedulable pod waits for an autoscaler's word
    /// (`TriggeredScaleUp`, `NotTriggerScaleUp`, `Nominated`) before it fails
    /// (default 90s: the cluster autoscaler decides within ~15s to a minute).
    pub unschedulable_grace: Duration,
    /// How long a pod an autoscaler is adding a node for waits for it
    /// (default 15 min: a new GPU node takes minutes).
    pub scale_up_timeout: Duration,
    /// `ttlSecondsAfterFinished` (orch deletes its Jobs itself; this is the net).
    pub ttl_after_finished_s: i32,
    /// CPU request and limit per cell (`"8"`, `"500m"`).
    pub cpu: Option<String>,
}

impl KubeSettings {
    pub fn new(namespace: &str, agent_image: &str) -> KubeSettings {
        KubeSettings {
            namespace: namespace.into(),
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            service_account: None,
            image_pull_secrets: vec![],
            shm_size_bytes: None,
            runtime_class: None,
            gpu_label: None,
            gpu_types: BTreeMap::new(),
            weights_pvc: None,
            secret_name: None,
            secret_keys: vec![],
            agent_image: agent_image.into(),
            max_pending: Duration::from_secs(15 * 60),
            unschedulable_grace: Duration::from_secs(90),
            scale_up_timeout: Duration::from_secs(15 * 60),
            ttl_after_finished_s: 3600,
            cpu: None,
        }
    }
}

/// A DNS-1123 label (Job, Secret names; at most `max` characters): the
/// readable part of `text` in lowercase, `-` for anything else, and a hash
/// of the whole text so that two ids never share a name.
pub fn dns_name(prefix: &str, text: &str, max: usize) -> String {
    let hash = hex8(text);
    let mut body: String = text
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() {
                c
            } else {
                '-'
            }
        })
        .collect();
    while body.contains("--") {
        body = body.replace("--", "-");
    }
    let room = max.saturating_sub(prefix.len() + hash.len() + 2);
    body.truncate(room);
    let body = body.trim_matches('-');
    if body.is_empty() {
        format!("{prefix}-{hash}")
    } else {
        format!("{prefix}-{body}-{hash}")
    }
}

/// A label value (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at
/// both ends): the text itself when it is one, else a readable part and a hash.
pub fn label_value(text: &str) -> String {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
    };
    if text.len() <= 63 && text.chars().all(ok) && ends(text) {
        return text.to_string();
    }
    let hash = hex8(text);
    let mut body: String = text.chars().map(|c| if ok(c) { c } else { '-' }).collect();
    body.truncate(63 - hash.len() - 1);
    let body = body.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if body.is_empty() {
        hash
    } else {
        format!("{body}-{hash}")
    }
}

fn hex8(text: &str) -> String {
    let d = Sha256::digest(text.as_bytes());
    d.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// The Job's name for a cell of a run (at most 52 characters, so the pod
/// names the Job controller derives stay under 63).
pub fn job_name(run_id: &str, cell_id: &str) -> String {
    dns_name("orch", &format!("{cell_id}.{run_id}"), 52)
}

/// The name of the Secret orch creates for a run.
pub fn secret_name(run_id: &str) -> String {
    dns_name("orch-secrets", run_id, 63)
}

/// Labels of every object of a run (`cell`: and of one cell).
pub fn labels(run_id: &str, cell_id: Option<&str>) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    l.insert(RUN_LABEL.to_string(), label_value(run_id));
    if let Some(c) = cell_id {
        l.insert(CELL_LABEL.to_string(), label_value(c));
    }
    l
}

/// The label selector of a run's objects.
pub fn run_selector(run_id: &str) -> String {
    format!(
        "{}={},{}={}",
        MANAGED_BY.0,
        MANAGED_BY.1,
        RUN_LABEL,
        label_value(run_id)
    )
}

/// Node label values of GPU types on the standard labels: GPU Feature
/// Discovery's `nvidia.com/gpu.product`, GKE's
/// `cloud.google.com/gke-accelerator`, Karpenter's
/// `karpenter.k8s.aws/instance-gpu-name`.
fn known_gpu_labels(gpu_type: &str) -> [(&'static str, Vec<&'static str>); 3] {
    let (gfd, gke, karpenter): (Vec<&str>, Vec<&str>, Vec<&str>) = match gpu_type {
        "H100" => (
            vec![
                "NVIDIA-H100-80GB-HBM3",
                "NVIDIA-H100-PCIe",
                "NVIDIA-H100-NVL",
                "NVIDIA-H100-SXM5-80GB",
            ],
            vec!["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
            vec!["h100"],
        ),
        "H200" => (
            vec!["NVIDIA-H200", "NVIDIA-H200-141GB-HBM3e", "NVIDIA-H200-NVL"],
            vec!["nvidia-h200-141gb"],
            vec!["h200"],
        ),
        "B200" => (vec!["NVIDIA-B200"], vec!["nvidia-b200"], vec!["b200"]),
        "A100-80GB" => (
            vec!["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"],
            vec!["nvidia-a100-80gb"],
            vec!["a100"],
        ),
        "A100-40GB" => (
            vec!["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"],
            vec!["nvidia-tesla-a100"],
            vec!["a100"],
        ),
        "L40S" => (vec!["NVIDIA-L40S"], vec![], vec!["l40s"]),
        "L4" => (vec!["NVIDIA-L4"], vec!["nvidia-l4"], vec!["l4"]),
        "A10G" => (vec!["NVIDIA-A10G"], vec![], vec!["a10g"]),
        "A10" => (vec!["NVIDIA-A10"], vec![], vec!["a10"]),
        "T4" => (vec!["Tesla-T4"], vec!["nvidia-tesla-t4"], vec!["t4"]),
        _ => (vec![], vec![], vec![]),
    };
    [
        ("nvidia.com/gpu.product", gfd),
        ("cloud.google.com/gke-accelerator", gke),
        ("karpenter.k8s.aws/instance-gpu-name", karpenter),
    ]
}

/// The node affinity that picks nodes of a GPU type: one term per label
/// that knows the type (a node needs to match any one of them).
pub fn gpu_affinity(gpu_type: &str, s: &KubeSettings) -> Affinity {
    let term = |key: &str, values: Vec<String>| NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.to_string(),
            operator: "In".into(),
            values: Some(values),
        }]),
        match_fields: None,
    };
    let user_values = s.gpu_types.get(gpu_type).cloned();
    let terms: Vec<NodeSelectorTerm> = match &s.gpu_label {
        Some(label) => vec![term(
            label,
            user_values.unwrap_or_else(|| vec![gpu_type.to_string()]),
        )],
        None => match user_values {
            Some(values) => vec![term("nvidia.com/gpu.product", values)],
            None => {
                let known: Vec<NodeSelectorTerm> = known_gpu_labels(gpu_type)
                    .into_iter()
                    .filter(|(_, v)| !v.is_empty())
                    .map(|(k, v)| term(k, v.into_iter().map(String::from).collect()))
                    .collect();
                if known.is_empty() {
                    vec![term("nvidia.com/gpu.product", vec![gpu_type.to_string()])]
                } else {
                    known
                }
            }
        },
    };
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        pod_affinity: None,
        pod_anti_affinity: None,
    }
}

/// A byte count as a Kubernetes quantity (`Mi` when whole, else bytes).
pub fn quantity_bytes(b: u64) -> Quantity {
    if b.is_multiple_of(1 << 30) {
        Quantity(format!("{}Gi", b >> 30))
    } else if b.is_multiple_of(1 << 20) {
        Quantity(format!("{}Mi", b >> 20))
    } else {
        Quantity(b.to_string())
    }
}

/// Seconds the Job may be active: the cell's timeout, its stop grace, the
/// time it may wait for a node and an allowance for pulling and starting,
/// two minutes past orch's own deadline for the cell (so that orch, which
/// keeps the logs, always stops it first; the Job's is the net).
pub fn active_deadline_s(task: &TaskSpec, s: &KubeSettings) -> i64 {
    (task.measure.timeout_s + task.measure.kill_grace_s.max(1.0) + s.max_pending.as_secs_f64() + 180.0).ceil()
        as i64
}

/// The toleration of the `nvidia.com/gpu` taint GPU nodes carry (any effect).
fn gpu_toleration() -> Option<K8sToleration> {
    Some(K8sToleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    })
}

/// The suite's tolerations.
fn user_tolerations(s: &KubeSettings) -> Vec<K8sToleration> {
    s.tolerations
        .iter()
        .map(|t| K8sToleration {
            key: t.key.clone(),
            operator: t
                .operator
                .clone()
                .or_else(|| Some(if t.value.is_some() { "Equal" } else { "Exists" }.into())),
            value: t.value.clone(),
            effect: t.effect.clone(),
            toleration_seconds: None,
        })
        .collect()
}

/// The agent installer's security context: what a `restricted` Pod
/// Security namespace admits (the copy needs nothing more).
/// A benchmark pod is not to be moved: Karpenter's consolidation and the
/// cluster autoscaler's scale-down leave a node running one alone (a
/// drain still evicts it, which is recorded as such).
fn pod_annotations(mut annotations: BTreeMap<String, String>) -> BTreeMap<String, String> {
    annotations.insert("karpenter.sh/do-not-disrupt".into(), "true".into());
    annotations.insert(
        "cluster-autoscaler.kubernetes.io/safe-to-evict".into(),
        "false".into(),
    );
    annotations
}

/// Requests and limits for a container orch adds (probe, setup): every
/// container of a pod needs limits where a ResourceQuota covers
/// `limits.cpu`/`limits.memory` and no LimitRange gives defaults.
fn small_resources(cpu_limit: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("10m".into())),
            ("memory".to_string(), Quantity("32Mi".into())),
        ])),
        limits: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity(cpu_limit.into())),
            ("memory".to_string(), Quantity(memory_limit.into())),
        ])),
        ..Default::default()
    }
}

fn installer_security() -> k8s_openapi::api::core::v1::SecurityContext {
    k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        allow_privilege_escalation: Some(false),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        }),
        ..Default::default()
    }
}

/// The cell's Job. `image`: the cell's container image; `secret_names`:
/// the names of the secrets the cell gets (keys of the run's Secret).
pub fn cell_job(task: &TaskSpec, image: &str, secret_names: &[String], s: &KubeSettings) -> Job {
    let name = job_name(&task.run_id, &task.cell_id);
    let mut meta_labels = labels(&task.run_id, Some(&task.cell_id));
    let mut annotations = BTreeMap::new();
    annotations.insert("orch.dev/run-id".to_string(), task.run_id.clone());
    annotations.insert("orch.dev/cell-id".to_string(), task.cell_id.clone());
    annotations.insert("orch.dev/gpu".to_string(), task.gpu.to_string());

    let mut task = task.clone();
    if s.weights_pvc.is_some() {
        task.weights_dir = Some(WEIGHTS_MOUNT.to_string());
    }
    let gpu = task.gpu.type_name().map(|t| (t.to_string(), task.gpu.count()));

    // The secrets: names only, values in the Secret.
    let secret = s.secret_name.clone().unwrap_or_else(|| secret_name(&task.run_id));
    let env: Vec<EnvVar> = secret_names
        .iter()
        .map(|n| EnvVar {
            name: n.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.clone(),
                    key: n.clone(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        })
        .collect();

    let mut limits = BTreeMap::new();
    let mut requests = BTreeMap::new();
    if let Some((_, n)) = &gpu {
        limits.insert("nvidia.com/gpu".to_string(), Quantity(n.to_string()));
    }
    if let Some(m) = task.memory_limit_bytes {
        limits.insert("memory".to_string(), quantity_bytes(m));
        requests.insert("memory".to_string(), quantity_bytes(m));
    }
    if let Some(c) = &s.cpu {
        limits.insert("cpu".to_string(), Quantity(c.clone()));
        requests.insert("cpu".to_string(), Quantity(c.clone()));
    }

    let mut mounts = vec![
        VolumeMount {
            name: "orch-bin".into(),
            mount_path: AGENT_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        },
        VolumeMount {
            name: "orch-out".into(),
            mount_path: OUT_DIR.into(),
            ..Default::default()
        },
        VolumeMount {
            name: "dshm".into(),
            mount_path: "/dev/shm".into(),
            ..Default::default()
        },
    ];
    let mut volumes = vec![
        Volume {
            name: "orch-bin".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "orch-out".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        },
        Volume {
            name: "dshm".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".into()),
                size_limit: s.shm_size_bytes.map(quantity_bytes),
            }),
            ..Default::default()
        },
    ];
    if let Some(pvc) = &s.weights_pvc {
        mounts.push(VolumeMount {
            name: "weights".into(),
            mount_path: WEIGHTS_MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "weights".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.clone(),
                read_only: Some(true),
            }),
            ..Default::default()
        });
    }

    let mut tolerations: Vec<K8sToleration> = Vec::new();
    if gpu.is_some() {
        tolerations.extend(gpu_toleration());
    }
    tolerations.extend(user_tolerations(s));

    let b64 = orch_backend::home::task_b64(&task);
    let cell = Container {
        name: CELL_CONTAINER.into(),
        image: Some(image.to_string()),
        command: Some(vec![AGENT_PATH.into()]),
        args: Some(vec![
            "run".into(),
            "--task-b64".into(),
            b64,
            "--out".into(),
            OUT_DIR.into(),
            "--ship".into(),
            "--summary-file".into(),
            "/dev/termination-log".into(),
        ]),
        env: (!env.is_empty()).then_some(env),
        resources: Some(ResourceRequirements {
            limits: (!limits.is_empty()).then_some(limits),
            requests: (!requests.is_empty()).then_some(requests),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        termination_message_path: Some("/dev/termination-log".into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    let installer = Container {
        name: AGENT_CONTAINER.into(),
        image: Some(s.agent_image.clone()),
        command: Some(vec![AGENT_IN_IMAGE.into(), "install".into(), AGENT_PATH.into()]),
        security_context: Some(installer_security()),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".into())),
                ("memory".to_string(), Quantity("32Mi".into())),
            ])),
            // A namespace whose ResourceQuota covers `limits.cpu` refuses a
            // pod with any container that has no CPU limit.
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("100m".into())),
                ("memory".to_string(), Quantity("128Mi".into())),
            ])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "orch-bin".into(),
            mount_path: AGENT_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };

    let mut pod_labels = meta_labels.clone();
    pod_labels.insert(JOB_LABEL.to_string(), name.clone());
    meta_labels.insert("app.kubernetes.io/name".into(), "orch-cell".into());
    pod_labels.insert("app.kubernetes.io/name".into(), "orch-cell".into());
    let grace = (task.measure.kill_grace_s.max(1.0) + 10.0).ceil() as i64;

    Job {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(s.namespace.clone()),
            labels: Some(meta_labels),
            annotations: Some(annotations.clone()),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(active_deadline_s(&task, s)),
            ttl_seconds_after_finished: Some(s.ttl_after_finished_s),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(pod_annotations(annotations)),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    init_containers: Some(vec![installer]),
                    containers: vec![cell],
                    volumes: Some(volumes),
                    node_selector: (!s.node_selector.is_empty()).then(|| s.node_selector.clone()),
                    affinity: gpu.as_ref().map(|(t, _)| gpu_affinity(t, s)),
                    tolerations: (!tolerations.is_empty()).then_some(tolerations),
                    service_account_name: s.service_account.clone(),
                    image_pull_secrets: (!s.image_pull_secrets.is_empty()).then(|| {
                        s.image_pull_secrets
                            .iter()
                            .map(|n| LocalObjectReference { name: n.clone() })
                            .collect()
                    }),
                    runtime_class_name: s.runtime_class.clone(),
                    termination_grace_period_seconds: Some(grace),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A short Job that runs `sh -c SCRIPT` in `image` with the weights PVC
/// mounted read-only (`orch plan`'s check of the PVC). Its container is
/// named like a cell's, so its states read the same.
pub fn probe_job(name: &str, image: &str, script: &str, s: &KubeSettings) -> Job {
    let mut l = BTreeMap::new();
    l.insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    l.insert("orch.dev/probe".to_string(), "weights".to_string());
    let mut pod_labels = l.clone();
    pod_labels.insert(JOB_LABEL.to_string(), name.to_string());
    let (mounts, volumes) = match &s.weights_pvc {
        Some(pvc) => (
            Some(vec![VolumeMount {
                name: "weights".into(),
                mount_path: WEIGHTS_MOUNT.into(),
                read_only: Some(true),
                ..Default::default()
            }]),
            Some(vec![Volume {
                name: "weights".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: pvc.clone(),
                    read_only: Some(true),
                }),
                ..Default::default()
            }]),
        ),
        None => (None, None),
    };
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(s.namespace.clone()),
            labels: Some(l),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(600),
            ttl_seconds_after_finished: Some(600),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: CELL_CONTAINER.into(),
                        image: Some(image.to_string()),
                        command: Some(vec!["sh".into(), "-c".into(), script.to_string()]),
                        env: Some(vec![EnvVar {
                            name: "ORCH_WEIGHTS".into(),
                            value: Some(WEIGHTS_MOUNT.into()),
                            value_from: None,
                        }]),
                        volume_mounts: mounts,
                        resources: Some(small_resources("100m", "128Mi")),
                        ..Default::default()
                    }],
                    volumes,
                    node_selector: (!s.node_selector.is_empty()).then(|| s.node_selector.clone()),
                    tolerations: Some(gpu_toleration().into_iter().chain(user_tolerations(s)).collect()),
                    service_account_name: s.service_account.clone(),
                    image_pull_secrets: (!s.image_pull_secrets.is_empty()).then(|| {
                        s.image_pull_secrets
                            .iter()
                            .map(|n| LocalObjectReference { name: n.clone() })
                            .collect()
                    }),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Where the static `orch` is in the agent image (for `orch setup` Jobs).
pub const ORCH_CLI_IN_IMAGE: &str = "/orch-cli";
/// Where the setup Job's suite file is mounted.
pub const SETUP_SUITE_DIR: &str = "/orch/suite";

/// `orch setup --backend kubernetes`: a Job that runs the static `orch`
/// (installed from the agent image by its init container) in `image` (one
/// with a CA bundle) with the weights PVC mounted read-write at `/weights`.
/// `secret`: a Secret holding `HF_TOKEN` and/or `suite.yaml` (by reference
/// only); `env`: plain variables (`HF_ENDPOINT`).
pub fn setup_job(
    name: &str,
    image: &str,
    args: &[String],
    secret: Option<(&str, bool, bool)>,
    env: &[(String, String)],
    s: &KubeSettings,
) -> Job {
    let mut l = BTreeMap::new();
    l.insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    l.insert("orch.dev/setup".to_string(), "weights".to_string());
    let mut pod_labels = l.clone();
    pod_labels.insert(JOB_LABEL.to_string(), name.to_string());
    let mut mounts = vec![VolumeMount {
        name: "orch-bin".into(),
        mount_path: AGENT_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    }];
    let mut volumes = vec![Volume {
        name: "orch-bin".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    if let Some(pvc) = &s.weights_pvc {
        mounts.push(VolumeMount {
            name: "weights".into(),
            mount_path: WEIGHTS_MOUNT.into(),
            ..Default::default()
        });
        volumes.push(Volume {
            name: "weights".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: pvc.clone(),
                read_only: Some(false),
            }),
            ..Default::default()
        });
    }
    let mut env_vars: Vec<EnvVar> = env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            value_from: None,
        })
        .collect();
    if let Some((secret_name, has_token, has_suite)) = secret {
        if has_token {
            env_vars.push(EnvVar {
                name: "HF_TOKEN".into(),
                value: None,
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(SecretKeySelector {
                        name: secret_name.into(),
                        key: "HF_TOKEN".into(),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }),
            });
        }
        if has_suite {
            mounts.push(VolumeMount {
                name: "suite".into(),
                mount_path: SETUP_SUITE_DIR.into(),
                read_only: Some(true),
                ..Default::default()
            });
            volumes.push(Volume {
                name: "suite".into(),
                secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                    secret_name: Some(secret_name.into()),
                    items: Some(vec![k8s_openapi::api::core::v1::KeyToPath {
                        key: "suite.yaml".into(),
                        path: "suite.yaml".into(),
                        mode: None,
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    let installer = Container {
        name: AGENT_CONTAINER.into(),
        image: Some(s.agent_image.clone()),
        command: Some(vec![
            AGENT_IN_IMAGE.into(),
            "install".into(),
            format!("{AGENT_DIR}/orch"),
            ORCH_CLI_IN_IMAGE.into(),
        ]),
        security_context: Some(installer_security()),
        volume_mounts: Some(vec![VolumeMount {
            name: "orch-bin".into(),
            mount_path: AGENT_DIR.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let mut command = vec![format!("{AGENT_DIR}/orch")];
    command.extend(args.iter().cloned());
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(s.namespace.clone()),
            labels: Some(l),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            ttl_seconds_after_finished: Some(s.ttl_after_finished_s),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    init_containers: Some(vec![installer]),
                    containers: vec![Container {
                        name: CELL_CONTAINER.into(),
                        image: Some(image.to_string()),
                        command: Some(command),
                        env: (!env_vars.is_empty()).then_some(env_vars),
                        volume_mounts: Some(mounts),
                        // Parallel ranged downloads: a few CPUs and buffers.
                        resources: Some(small_resources("4", "4Gi")),
                        ..Default::default()
                    }],
                    volumes: Some(volumes),
                    node_selector: (!s.node_selector.is_empty()).then(|| s.node_selector.clone()),
                    tolerations: Some(gpu_toleration().into_iter().chain(user_tolerations(s)).collect()),
                    service_account_name: s.service_account.clone(),
                    image_pull_secrets: (!s.image_pull_secrets.is_empty()).then(|| {
                        s.image_pull_secrets
                            .iter()
                            .map(|n| LocalObjectReference { name: n.clone() })
                            .collect()
                    }),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// A Secret of named values (the setup Job's token and suite), labelled as orch's.
pub fn plain_secret(name: &str, values: &[(String, String)], s: &KubeSettings) -> Secret {
    let mut l = BTreeMap::new();
    l.insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(s.namespace.clone()),
            labels: Some(l),
            ..Default::default()
        },
        data: Some(
            values
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The run's Secret with these values (created by orch, deleted with the run).
pub fn run_secret(run_id: &str, values: &[(String, String)], s: &KubeSettings) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(run_id)),
            namespace: Some(s.namespace.clone()),
            labels: Some(labels(run_id, None)),
            ..Default::default()
        },
        data: Some(
            values
                .iter()
                .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The manifests of a run for `--dry-run`: YAML documents, the Secret shown
/// as a comment (its values are never printed; orch makes it from the host's
/// environment).
pub fn dry_run_yaml(jobs: &[Job], secret_keys: &[String], run_id: &str, s: &KubeSettings) -> String {
    let mut out = String::new();
    if !secret_keys.is_empty() {
        match &s.secret_name {
            Some(name) => out.push_str(&format!(
                "# secrets come from the existing Secret `{name}` (keys: {})\n",
                secret_keys.join(", ")
            )),
            None => {
                out.push_str(&format!(
                    "# orch creates the Secret `{}` from the host's environment (keys: {}); values are never printed.\n# By hand: kubectl -n {} create secret generic {}",
                    secret_name(run_id),
                    secret_keys.join(", "),
                    s.namespace,
                    secret_name(run_id)
                ));
                for k in secret_keys {
                    out.push_str(&format!(" --from-literal={k}=\"${k}\""));
                }
                out.push('\n');
            }
        }
    }
    for job in jobs {
        let v = serde_json::to_value(job).unwrap_or_default();
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&v).unwrap_or_default());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels_and_unique() {
        let a = job_name(
            "20261122-061502-quickstart-3fa2",
            "transformer.h100x8.preset-small",
        );
        assert!(a.len() <= 52, "{a}");
        assert!(a
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'));
        assert!(a.starts_with("orch-transformer-h100x8"), "{a}");
        let b = job_name(
            "20261122-061502-quickstart-3fa2",
            "transformer.h100x8.preset_small",
        );
        assert_ne!(a, b);
        let long = "x".repeat(300);
        assert!(job_name(&long, &long).len() <= 52);
        assert_eq!(
            label_value("transformer.none.preset-tiny"),
            "transformer.none.preset-tiny"
        );
        let l = label_value(&format!("a/{}", "b".repeat(80)));
        assert!(l.len() <= 63 && !l.contains('/'), "{l}");
    }

    #[test]
    fn gpu_types_pick_nodes_by_standard_labels_or_the_users() {
        let s = KubeSettings::new("ns", "agent");
        let a = gpu_affinity("H100", &s);
        let terms = a
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        let keys: Vec<String> = terms
            .iter()
            .map(|t| t.match_expressions.as_ref().unwrap()[0].key.clone())
            .collect();
        assert_eq!(
            keys,
            [
                "nvidia.com/gpu.product",
                "cloud.google.com/gke-accelerator",
                "karpenter.k8s.aws/instance-gpu-name"
            ]
        );
        let mut s = s;
        s.gpu_label = Some("example.com/gpu".into());
        s.gpu_types.insert("H100".into(), vec!["h100-sxm".into()]);
        let a = gpu_affinity("H100", &s);
        let t = &a
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(t.len(), 1);
        let e = &t[0].match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (e.key.as_str(), e.values.clone().unwrap()),
            ("example.com/gpu", vec!["h100-sxm".to_string()])
        );
    }
}
