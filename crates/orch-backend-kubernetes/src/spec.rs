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
    Affinity, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ImageVolumeSource, LocalObjectReference,
    NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimVolumeSource,
    PodSpec, PodTemplateSpec, ResourceRequirements, Secret, SecretKeySelector, Service, ServicePort,
    ServiceSpec, Toleration as K8sToleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use orch_manifest::{AgentDelivery, GpuAffinity};
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
    /// Label values per GPU type for `gpu_label` (or added to GPU Feature
    /// Discovery's known values).
    pub gpu_types: BTreeMap<String, Vec<String>>,
    /// Whether GPU pods get the GPU-type node affinity (`auto` is resolved
    /// by the host against the cluster's nodes; here it means `required`).
    pub gpu_affinity: GpuAffinity,
    /// A PVC holding the weights (a hub cache), mounted read-only at `/weights`.
    pub weights_pvc: Option<String>,
    /// An existing Secret holding the suite's secrets under their names;
    /// `None`: orch creates one per run from the host's environment.
    pub secret_name: Option<String>,
    /// With `secret_name`: the keys every cell gets (the suite's `secrets:`).
    pub secret_keys: Vec<String>,
    /// The image whose `/orch-agent` is the static agent (`orch build --push` publishes it).
    pub agent_image: String,
    /// How the agent reaches a cell's container: `ImageVolume` (the agent
    /// image mounted at [`AGENT_DIR`]) or `InitContainer` (copied there);
    /// `Auto` is resolved by the host against the cluster (here it means
    /// `InitContainer`, which every cluster runs).
    pub agent_delivery: AgentDelivery,
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
            gpu_affinity: GpuAffinity::Auto,
            weights_pvc: None,
            secret_name: None,
            secret_keys: vec![],
            agent_image: agent_image.into(),
            agent_delivery: AgentDelivery::Auto,
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

/// Node labels that name a node's GPU type, the label keys in the order
/// they are tried:
/// - NVIDIA GPU Feature Discovery's `nvidia.com/gpu.product` (the NVML
///   product name with `-` for spaces: the exact product, any cloud);
/// - GKE's `cloud.google.com/gke-accelerator`;
/// - Karpenter's (AWS provider) `karpenter.k8s.aws/instance-gpu-name` and
///   EKS Auto Mode's `eks.amazonaws.com/instance-gpu-name`, with their
///   `instance-gpu-memory` (MiB per GPU) where the name alone is ambiguous
///   (`a100` is both A100 sizes);
/// - the well-known `node.kubernetes.io/instance-type` every cloud node
///   carries, with the instance types of one GPU type (AWS, Azure, which has
///   no GPU-name label, OCI, Nebius, Google Cloud).
pub const GPU_LABEL_KEYS: [&str; 6] = [
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
    "eks.amazonaws.com/instance-gpu-name",
    "node.kubernetes.io/instance-type",
    "karpenter.k8s.aws/instance-gpu-memory",
];

/// One way to pick nodes of a GPU type: every (label, values) must match.
type Term = Vec<(&'static str, Vec<String>)>;

/// The node-selector terms that pick nodes of `gpu_type` on the standard
/// labels ([`GPU_LABEL_KEYS`]); a node matching any one term will do.
/// Empty for a type no label knows.
pub fn known_gpu_terms(gpu_type: &str) -> Vec<Term> {
    // (GFD products, GKE accelerators, AWS GPU name and its memory in MiB
    // when needed, instance types)
    type Row = (
        &'static [&'static str],
        &'static [&'static str],
        Option<(&'static str, Option<&'static str>)>,
        &'static [&'static str],
    );
    let row: Row = match gpu_type {
        "H100" => (
            &[
                "NVIDIA-H100-80GB-HBM3",
                "NVIDIA-H100-PCIe",
                "NVIDIA-H100-NVL",
                "NVIDIA-H100-SXM5-80GB",
            ],
            &["nvidia-h100-80gb", "nvidia-h100-mega-80gb"],
            Some(("h100", None)),
            &[
                "p5.48xlarge",
                "p5.4xlarge",
                "Standard_ND96isr_H100_v5",
                "Standard_NC40ads_H100_v5",
                "Standard_NC80adis_H100_v5",
                "BM.GPU.H100.8",
                "gpu-h100-sxm",
                "a3-highgpu-1g",
                "a3-highgpu-2g",
                "a3-highgpu-4g",
                "a3-highgpu-8g",
                "a3-megagpu-8g",
                "a3-edgegpu-8g",
            ],
        ),
        "H200" => (
            &["NVIDIA-H200", "NVIDIA-H200-NVL", "NVIDIA-H200-141GB-HBM3e"],
            &["nvidia-h200-141gb"],
            Some(("h200", None)),
            &[
                "p5e.48xlarge",
                "p5en.48xlarge",
                "Standard_ND96isr_H200_v5",
                "BM.GPU.H200.8",
                "gpu-h200-sxm",
                "a3-ultragpu-8g",
            ],
        ),
        "B200" => (
            &["NVIDIA-B200"],
            &["nvidia-b200"],
            Some(("b200", None)),
            &[
                "p6-b200.48xlarge",
                "BM.GPU.B200.8",
                "gpu-b200-sxm",
                "a4-highgpu-8g",
            ],
        ),
        "A100-80GB" => (
            &["NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"],
            &["nvidia-a100-80gb"],
            Some(("a100", Some("81920"))),
            &[
                "p4de.24xlarge",
                "Standard_ND96amsr_A100_v4",
                "Standard_NC24ads_A100_v4",
                "Standard_NC48ads_A100_v4",
                "Standard_NC96ads_A100_v4",
                "BM.GPU.A100-v2.8",
                "a2-ultragpu-1g",
                "a2-ultragpu-2g",
                "a2-ultragpu-4g",
                "a2-ultragpu-8g",
            ],
        ),
        "A100-40GB" => (
            &["NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"],
            &["nvidia-tesla-a100"],
            Some(("a100", Some("40960"))),
            &[
                "p4d.24xlarge",
                "Standard_ND96asr_v4",
                "BM.GPU4.8",
                "a2-highgpu-1g",
                "a2-highgpu-2g",
                "a2-highgpu-4g",
                "a2-highgpu-8g",
                "a2-megagpu-16g",
            ],
        ),
        "L40S" => (
            &["NVIDIA-L40S"],
            &[],
            Some(("l40s", None)),
            &[
                "g6e.xlarge",
                "g6e.2xlarge",
                "g6e.4xlarge",
                "g6e.8xlarge",
                "g6e.12xlarge",
                "g6e.16xlarge",
                "g6e.24xlarge",
                "g6e.48xlarge",
                "BM.GPU.L40S.4",
                "gpu-l40s-a",
                "gpu-l40s-d",
            ],
        ),
        "L4" => (
            &["NVIDIA-L4"],
            &["nvidia-l4"],
            Some(("l4", None)),
            &[
                "g6.xlarge",
                "g6.2xlarge",
                "g6.4xlarge",
                "g6.8xlarge",
                "g6.12xlarge",
                "g6.16xlarge",
                "g6.24xlarge",
                "g6.48xlarge",
                "g2-standard-4",
                "g2-standard-8",
                "g2-standard-12",
                "g2-standard-16",
                "g2-standard-24",
                "g2-standard-32",
                "g2-standard-48",
                "g2-standard-96",
            ],
        ),
        "A10G" => (
            &["NVIDIA-A10G"],
            &[],
            Some(("a10g", None)),
            &[
                "g5.xlarge",
                "g5.2xlarge",
                "g5.4xlarge",
                "g5.8xlarge",
                "g5.12xlarge",
                "g5.16xlarge",
                "g5.24xlarge",
                "g5.48xlarge",
            ],
        ),
        "A10" => (
            &["NVIDIA-A10"],
            &[],
            None,
            &[
                "Standard_NV36ads_A10_v5",
                "Standard_NV72ads_A10_v5",
                "VM.GPU.A10.1",
                "VM.GPU.A10.2",
                "BM.GPU.A10.4",
            ],
        ),
        "T4" => (
            &["Tesla-T4"],
            &["nvidia-tesla-t4"],
            Some(("t4", None)),
            &[
                "g4dn.xlarge",
                "g4dn.2xlarge",
                "g4dn.4xlarge",
                "g4dn.8xlarge",
                "g4dn.12xlarge",
                "g4dn.16xlarge",
                "g4dn.metal",
            ],
        ),
        _ => (&[], &[], None, &[]),
    };
    let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (gfd, gke, aws, instance_types) = row;
    let mut terms: Vec<Term> = Vec::new();
    if !gfd.is_empty() {
        terms.push(vec![(GPU_LABEL_KEYS[0], owned(gfd))]);
    }
    if !gke.is_empty() {
        terms.push(vec![(GPU_LABEL_KEYS[1], owned(gke))]);
    }
    if let Some((name, memory)) = aws {
        for (key, memory_key) in [
            (GPU_LABEL_KEYS[2], "karpenter.k8s.aws/instance-gpu-memory"),
            (GPU_LABEL_KEYS[3], "eks.amazonaws.com/instance-gpu-memory"),
        ] {
            let mut term = vec![(key, vec![name.to_string()])];
            if let Some(m) = memory {
                term.push((memory_key, vec![m.to_string()]));
            }
            terms.push(term);
        }
    }
    if !instance_types.is_empty() {
        terms.push(vec![(GPU_LABEL_KEYS[4], owned(instance_types))]);
    }
    terms
}

/// The node affinity that picks nodes of a GPU type: the user's label
/// (`gpu_label`, with `gpu_types`' values or the type's name), else GPU
/// Feature Discovery's label with `gpu_types`' values (the exact products
/// wanted), else one term per standard label that knows the type
/// ([`known_gpu_terms`]). `None` with `gpu_affinity: off`.
pub fn gpu_affinity(gpu_type: &str, s: &KubeSettings) -> Option<Affinity> {
    if s.gpu_affinity == GpuAffinity::Off {
        return None;
    }
    let term = |reqs: Vec<(&str, Vec<String>)>| NodeSelectorTerm {
        match_expressions: Some(
            reqs.into_iter()
                .map(|(key, values)| NodeSelectorRequirement {
                    key: key.to_string(),
                    operator: "In".into(),
                    values: Some(values),
                })
                .collect(),
        ),
        match_fields: None,
    };
    let user_values = s.gpu_types.get(gpu_type).cloned();
    let terms: Vec<NodeSelectorTerm> = match &s.gpu_label {
        Some(label) => vec![term(vec![(
            label.as_str(),
            user_values.unwrap_or_else(|| vec![gpu_type.to_string()]),
        )])],
        // The user's values for the type are the exact products wanted.
        None => match user_values {
            Some(values) => vec![term(vec![(GPU_LABEL_KEYS[0], values)])],
            None => {
                let known = known_gpu_terms(gpu_type);
                if known.is_empty() {
                    vec![term(vec![(GPU_LABEL_KEYS[0], vec![gpu_type.to_string()])])]
                } else {
                    known.into_iter().map(term).collect()
                }
            }
        },
    };
    Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            preferred_during_scheduling_ignored_during_execution: None,
        }),
        pod_affinity: None,
        pod_anti_affinity: None,
    })
}

/// The GPU types [`known_gpu_terms`] knows.
pub const KNOWN_GPU_TYPES: [&str; 10] = [
    "H100",
    "H200",
    "B200",
    "A100-80GB",
    "A100-40GB",
    "L40S",
    "L4",
    "A10G",
    "A10",
    "T4",
];

/// Does a node with these labels show its GPU type in a way these settings
/// read: the user's `gpu_label`, else a known type's terms? (For `auto`: a
/// cluster none of whose GPU nodes does has labels orch cannot read.)
pub fn node_shows_gpu_type(labels: &BTreeMap<String, String>, s: &KubeSettings) -> bool {
    if let Some(key) = &s.gpu_label {
        return labels.contains_key(key);
    }
    let user = s.gpu_types.values().flatten();
    if user.into_iter().any(|v| labels.get(GPU_LABEL_KEYS[0]) == Some(v)) {
        return true;
    }
    KNOWN_GPU_TYPES.iter().any(|t| {
        known_gpu_terms(t).iter().any(|term| {
            term.iter()
                .all(|(k, vs)| labels.get(*k).is_some_and(|v| vs.contains(v)))
        })
    })
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

/// The agent installer's security context: what Pod Security `restricted`
/// admits, and OpenShift's `restricted-v2` SCC too: no fixed `runAsUser`
/// (OpenShift assigns one from the namespace's range and refuses any other);
/// `runAsNonRoot` is met by the agent image's numeric `USER 65532` elsewhere.
/// The copy needs nothing more (the `emptyDir` it writes is world-writable).
pub fn installer_security() -> k8s_openapi::api::core::v1::SecurityContext {
    k8s_openapi::api::core::v1::SecurityContext {
        run_as_non_root: Some(true),
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
    let image_volume = s.agent_delivery == AgentDelivery::ImageVolume;
    let mut volumes = vec![
        if image_volume {
            // KEP-4639: the kubelet pulls the agent image (once per node, as
            // for a container) and mounts its root read-only: the agent is at
            // `AGENT_PATH` with no container started to copy it.
            Volume {
                name: "orch-bin".into(),
                image: Some(ImageVolumeSource {
                    reference: Some(s.agent_image.clone()),
                    pull_policy: None,
                }),
                ..Default::default()
            }
        } else {
            Volume {
                name: "orch-bin".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Default::default()
            }
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
                    init_containers: (!image_volume).then(|| vec![installer]),
                    containers: vec![cell],
                    volumes: Some(volumes),
                    node_selector: (!s.node_selector.is_empty()).then(|| s.node_selector.clone()),
                    affinity: gpu.as_ref().and_then(|(t, _)| gpu_affinity(t, s)),
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

/// The port rank 0 of a multi-node cell listens on for its peers
/// (`MASTER_PORT`: torchrun's and `torch.distributed`'s default).
pub const MASTER_PORT: u16 = 29500;

/// The annotation (and label) the Job controller puts on each pod of an
/// Indexed Job: its completion index, the node rank.
pub const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

/// The headless Service of a multi-node cell's Job: the Job's own name (a
/// Job name is a DNS-1035 label: it starts with `orch-`).
pub fn service_name(job_name: &str) -> String {
    job_name.to_string()
}

/// `MASTER_ADDR` of a multi-node cell: rank 0's DNS name, `<job>-0.<service>`
/// (the hostname Kubernetes gives pod 0 of an Indexed Job, under the
/// subdomain of the headless Service).
pub fn master_addr(job_name: &str) -> String {
    format!("{job_name}-0.{}", service_name(job_name))
}

/// Make a cell's Job one of `nodes` pods, as the ecosystem runs multi-node
/// work on Kubernetes: an Indexed Job (`completionMode: Indexed`,
/// `completions` = `parallelism` = `nodes`) whose pods are `<job>-<index>`
/// under the headless Service's subdomain, with the rendezvous variables
/// the slurm backend gives (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`,
/// `NNODES`, `NPROC_PER_NODE`, `NODE_RANK` and `RANK` from the completion
/// index). Each pod asks for the cell's GPUs (per node, as on slurm).
/// `backoffLimit: 0` stays: a failed pod fails the Job, and the Job
/// controller terminates the other ranks (the agent exits 0 after a failed
/// workload: for that the host deletes the Job). Returns the headless Service
/// ([`cell_service`]). One node: the Job unchanged, no Service.
pub fn indexed(job: &mut Job, task: &TaskSpec, nodes: u32) -> Option<Service> {
    if nodes <= 1 {
        return None;
    }
    let name = job.metadata.name.clone().unwrap_or_default();
    let nproc = task.gpu.count().max(1);
    let spec = job.spec.as_mut()?;
    spec.completion_mode = Some("Indexed".into());
    spec.completions = Some(nodes as i32);
    spec.parallelism = Some(nodes as i32);
    spec.backoff_limit = Some(0);
    if let Some(a) = job.metadata.annotations.as_mut() {
        a.insert("orch.dev/nodes".into(), nodes.to_string());
    }
    let pod = spec.template.spec.as_mut()?;
    pod.subdomain = Some(service_name(&name));
    let plain = |k: &str, v: String| EnvVar {
        name: k.into(),
        value: Some(v),
        value_from: None,
    };
    let rank = EnvVar {
        name: "NODE_RANK".into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                api_version: None,
                field_path: format!("metadata.annotations['{COMPLETION_INDEX}']"),
            }),
            ..Default::default()
        }),
    };
    let rendezvous = vec![
        plain("MASTER_ADDR", master_addr(&name)),
        plain("MASTER_PORT", MASTER_PORT.to_string()),
        plain("WORLD_SIZE", nodes.to_string()),
        plain("NNODES", nodes.to_string()),
        plain("NPROC_PER_NODE", nproc.to_string()),
        rank,
        // A reference to the variable above, expanded by the kubelet.
        plain("RANK", "$(NODE_RANK)".into()),
    ];
    for c in pod.containers.iter_mut().filter(|c| c.name == CELL_CONTAINER) {
        let mut env = rendezvous.clone();
        env.extend(c.env.take().unwrap_or_default());
        c.env = Some(env);
        c.ports = Some(vec![k8s_openapi::api::core::v1::ContainerPort {
            name: Some("rendezvous".into()),
            container_port: i32::from(MASTER_PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]);
    }
    Some(cell_service(job))
}

/// The headless Service of a multi-node cell's Job (`clusterIP: None`,
/// selecting the Job's pods by [`JOB_LABEL`], `publishNotReadyAddresses` so
/// that a rank resolves before its peers are ready), named as the pods'
/// `subdomain`, with the cell's labels (`orch down` finds it by the run's).
/// The backend adds an ownerReference to the Job once it exists
/// ([`owned_by`]), so the garbage collector deletes it with the Job.
pub fn cell_service(job: &Job) -> Service {
    let name = job.metadata.name.clone().unwrap_or_default();
    let mut labels = job.metadata.labels.clone().unwrap_or_default();
    labels.insert("app.kubernetes.io/name".into(), "orch-cell".into());
    Service {
        metadata: ObjectMeta {
            name: Some(service_name(&name)),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(BTreeMap::from([(JOB_LABEL.to_string(), name)])),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("rendezvous".into()),
                port: i32::from(MASTER_PORT),
                target_port: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(
                    i32::from(MASTER_PORT),
                )),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The Service owned by the Job (`uid`): the garbage collector deletes it
/// with the Job. No `blockOwnerDeletion` (that needs `update` on
/// `jobs/finalizers`, which the Role does not grant).
pub fn owned_by(mut svc: Service, job_name: &str, uid: &str) -> Service {
    svc.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            name: job_name.into(),
            uid: uid.into(),
            controller: Some(false),
            block_owner_deletion: None,
        },
    ]);
    svc
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
/// The Job a server-side dry run sends to learn whether the API server keeps
/// an `image` volume (its `ImageVolume` gate: off, it drops the volume and
/// its mounts without an error): one container of the agent image running
/// the agent from the volume. Never stored (`dryRun=All`).
pub fn delivery_probe_job(s: &KubeSettings) -> Job {
    let mut labels = BTreeMap::new();
    labels.insert(MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string());
    Job {
        metadata: ObjectMeta {
            generate_name: Some("orch-delivery-check-".into()),
            namespace: Some(s.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    containers: vec![Container {
                        name: CELL_CONTAINER.into(),
                        image: Some(s.agent_image.clone()),
                        command: Some(vec![AGENT_PATH.into(), "version".into()]),
                        volume_mounts: Some(vec![VolumeMount {
                            name: "orch-bin".into(),
                            mount_path: AGENT_DIR.into(),
                            read_only: Some(true),
                            ..Default::default()
                        }]),
                        resources: Some(small_resources("10m", "32Mi")),
                        ..Default::default()
                    }],
                    volumes: Some(vec![Volume {
                        name: "orch-bin".into(),
                        image: Some(ImageVolumeSource {
                            reference: Some(s.agent_image.clone()),
                            pull_policy: None,
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        status: None,
    }
}

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
pub fn dry_run_yaml(
    jobs: &[Job],
    services: &[Service],
    secret_keys: &[String],
    run_id: &str,
    s: &KubeSettings,
) -> String {
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
        let name = job.metadata.name.as_deref().unwrap_or_default();
        for svc in services
            .iter()
            .filter(|v| v.metadata.name.as_deref() == Some(name))
        {
            let v = serde_json::to_value(svc).unwrap_or_default();
            out.push_str(&format!(
                "---\n# The headless Service of Job `{name}`'s pods (their DNS names under it); orch adds an ownerReference to the Job once the Job exists, so it goes with the Job.\n"
            ));
            out.push_str(&serde_saphyr::to_string(&v).unwrap_or_default());
        }
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

    /// The terms of an affinity as (key, values) lists.
    fn terms_of(a: Option<Affinity>) -> Vec<Vec<(String, Vec<String>)>> {
        a.unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms
            .into_iter()
            .map(|t| {
                t.match_expressions
                    .unwrap()
                    .into_iter()
                    .map(|e| (e.key, e.values.unwrap()))
                    .collect()
            })
            .collect()
    }

    /// Does a node with these labels match any term?
    fn matches(terms: &[Vec<(String, Vec<String>)>], node: &[(&str, &str)]) -> bool {
        terms.iter().any(|t| {
            t.iter()
                .all(|(k, vs)| node.iter().any(|(nk, nv)| nk == k && vs.iter().any(|v| v == nv)))
        })
    }

    #[test]
    fn gpu_types_pick_nodes_by_standard_labels_or_the_users() {
        let s = KubeSettings::new("ns", "agent");
        let terms = terms_of(gpu_affinity("H100", &s));
        let keys: Vec<&str> = terms.iter().map(|t| t[0].0.as_str()).collect();
        assert_eq!(
            keys,
            [
                "nvidia.com/gpu.product",
                "cloud.google.com/gke-accelerator",
                "karpenter.k8s.aws/instance-gpu-name",
                "eks.amazonaws.com/instance-gpu-name",
                "node.kubernetes.io/instance-type",
            ]
        );
        // Nodes as each platform labels them (their documentation's examples).
        let gfd = [("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")];
        let gke = [("cloud.google.com/gke-accelerator", "nvidia-h100-80gb")];
        let eks_auto = [
            ("eks.amazonaws.com/instance-gpu-name", "h100"),
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
        ];
        let aks = [
            ("kubernetes.azure.com/accelerator", "nvidia"),
            ("node.kubernetes.io/instance-type", "Standard_ND96isr_H100_v5"),
        ];
        let oci = [("node.kubernetes.io/instance-type", "BM.GPU.H100.8")];
        let nebius = [("node.kubernetes.io/instance-type", "gpu-h100-sxm")];
        for node in [&gfd[..], &gke, &eks_auto, &aks, &oci, &nebius] {
            assert!(matches(&terms, node), "{node:?}");
        }
        let a100_80 = [
            ("karpenter.k8s.aws/instance-gpu-name", "a100"),
            ("karpenter.k8s.aws/instance-gpu-memory", "81920"),
        ];
        let a100_40 = [
            ("karpenter.k8s.aws/instance-gpu-name", "a100"),
            ("karpenter.k8s.aws/instance-gpu-memory", "40960"),
        ];
        assert!(!matches(&terms, &a100_80) && !matches(&terms, &[("nvidia.com/gpu.product", "NVIDIA-H200")]));
        // Karpenter's `a100` is both sizes: the memory tells them apart.
        let big = terms_of(gpu_affinity("A100-80GB", &s));
        let small = terms_of(gpu_affinity("A100-40GB", &s));
        assert!(matches(&big, &a100_80) && !matches(&big, &a100_40));
        assert!(matches(&small, &a100_40) && !matches(&small, &a100_80));
        // Every value is a valid label value.
        for t in big.iter().chain(&small).chain(&terms) {
            for (k, vs) in t {
                assert_eq!(orch_manifest::k8s::qualified_name_error(k), None, "{k}");
                for v in vs {
                    assert_eq!(orch_manifest::k8s::label_value_error(v), None, "{v}");
                }
            }
        }

        // The user's exact products on GPU Feature Discovery's label.
        let mut exact = KubeSettings::new("ns", "agent");
        exact
            .gpu_types
            .insert("H100".into(), vec!["NVIDIA-H100-80GB-HBM3".into()]);
        let t = terms_of(gpu_affinity("H100", &exact));
        assert!(matches(&t, &gfd) && !matches(&t, &[("nvidia.com/gpu.product", "NVIDIA-H100-PCIe")]));
        assert!(!matches(&t, &gke));

        // The user's own label.
        let mut s = s;
        s.gpu_label = Some("example.com/gpu".into());
        s.gpu_types.insert("H100".into(), vec!["h100-sxm".into()]);
        assert_eq!(
            terms_of(gpu_affinity("H100", &s)),
            [vec![(
                "example.com/gpu".to_string(),
                vec!["h100-sxm".to_string()]
            )]]
        );

        // An unknown type: its name on GPU Feature Discovery's label.
        let plain = KubeSettings::new("ns", "agent");
        assert_eq!(
            terms_of(gpu_affinity("MI300X", &plain)),
            [vec![(
                "nvidia.com/gpu.product".to_string(),
                vec!["MI300X".to_string()]
            )]]
        );

        // Off: no affinity at all.
        let mut off = KubeSettings::new("ns", "agent");
        off.gpu_affinity = GpuAffinity::Off;
        assert!(gpu_affinity("H100", &off).is_none());
    }
}
