//! The kubernetes backend's host side: the settings ([`KubeSettings`]) from
//! the suite's `kubernetes:` section and `--context`/`--namespace`, each
//! cell's image, the weights PVC (checked by a probe Job), `orch setup` in a
//! Job, `orch down`, and `--dry-run`'s YAML.

use crate::weights::WeightsQuery;
use crate::{spec, KubeError, KubeSettings, KubernetesBackend, Toleration};
use async_trait::async_trait;
use orch_backend::host::{
    first_line, model_requests, static_agent_check, Check, DefaultJobs, Flags, Host, Images, Kind,
    ModelCheck, OnLine, SetupPlace, SetupRequest, Weights,
};
use orch_backend::{Backend, BackendError};
use orch_manifest::{ImageDef, KubernetesDef, Plan};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Cells at once by default: the cluster queues what it cannot place.
pub const DEFAULT_JOBS: usize = 64;

fn user(message: String) -> BackendError {
    BackendError::User(message)
}

fn kube_err(e: KubeError) -> BackendError {
    e.into()
}

/// The agent image: the suite's `kubernetes.agent_image`, else `ORCH_AGENT_IMAGE`.
fn agent_image(def: &KubernetesDef) -> String {
    def.agent_image
        .clone()
        .or_else(|| std::env::var("ORCH_AGENT_IMAGE").ok())
        .unwrap_or_default()
}

/// The settings for a plan, in `namespace`.
pub fn settings(plan: &Plan, namespace: &str) -> KubeSettings {
    let def = plan.kubernetes.clone().unwrap_or_default();
    let mut s = KubeSettings::new(namespace, &agent_image(&def));
    s.node_selector = def.node_selector.clone();
    s.tolerations = def
        .tolerations
        .iter()
        .map(|t| Toleration {
            key: t.key.clone(),
            operator: t.operator.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        })
        .collect();
    s.service_account = def.service_account.clone();
    s.image_pull_secrets = def.image_pull_secrets.clone();
    s.shm_size_bytes = def.shm_size.map(|b| b.0);
    s.runtime_class = def.runtime_class.clone();
    s.gpu_label = def.gpu_label.clone();
    s.gpu_types = def.gpu_types.clone();
    s.gpu_affinity = def.gpu_affinity.unwrap_or_default();
    s.agent_delivery = def.agent_delivery.unwrap_or_default();
    s.weights_pvc = def.weights_pvc.clone();
    s.secret_name = def.secret.clone();
    s.secret_keys = plan.secrets.clone();
    s.cpu = def.cpu.clone();
    if let Some(p) = def.max_pending {
        s.max_pending = Duration::from_secs_f64(p.0.max(1.0));
    }
    if let Some(g) = def.unschedulable_grace {
        s.unschedulable_grace = Duration::from_secs_f64(g.0.max(0.0));
    }
    if let Some(t) = def.scale_up_timeout {
        s.scale_up_timeout = Duration::from_secs_f64(t.0.max(1.0));
    }
    s
}

/// The namespace: `--namespace` (a DNS-1123 label, as the API server
/// requires), else the suite's (checked by `orch-manifest`), else (None) the
/// context's.
fn namespace_choice<'a>(plan: &'a Plan, flag: Option<&'a str>) -> Result<Option<&'a str>, BackendError> {
    if let Some(ns) = flag.filter(|n| !orch_manifest::k8s::is_dns_label(n)) {
        return Err(user(format!(
            "`--namespace`: `{ns}` is not a namespace name\nhint: namespaces are lowercase letters, digits and `-` (at most 63), as `kubectl get namespaces` lists them"
        )));
    }
    Ok(flag.or(plan.kubernetes.as_ref().and_then(|k| k.namespace.as_deref())))
}

/// Connect as `kubectl` would and make the backend.
pub async fn backend(
    plan: &Plan,
    context: Option<&str>,
    namespace: Option<&str>,
) -> Result<KubernetesBackend, BackendError> {
    let context = context.or(plan.kubernetes.as_ref().and_then(|k| k.context.as_deref()));
    let (client, ns) = crate::connect(context, namespace_choice(plan, namespace)?)
        .await
        .map_err(kube_err)?;
    let mut s = settings(plan, &ns);
    let gpu_cells = plan.cells.iter().any(|c| c.task.gpu.type_name().is_some());
    if gpu_cells && s.gpu_affinity == orch_manifest::GpuAffinity::Auto {
        if let Some(note) = resolve_gpu_affinity(&client, &mut s).await {
            eprintln!("note: {note}");
        }
    }
    if !plan.cells.is_empty() {
        if let Some(note) = resolve_agent_delivery(&client, &mut s).await? {
            eprintln!("note: {note}");
        }
    }
    Ok(KubernetesBackend::new(client, s).with_nodes(nodes_of(plan)))
}

/// The oldest kubelet whose `ImageVolume` gate is on by default (beta, 1.35).
const IMAGE_VOLUME_KUBELET_MINOR: u32 = 35;

/// `agent_delivery`: `auto` becomes `image-volume` when every node runs a
/// kubelet of 1.35 or later (its `ImageVolume` gate on by default) on a
/// runtime that mounts image volumes (containerd 2.1, CRI-O 1.31), and a
/// server-side dry run of a Job with an `image` volume keeps it (the API
/// server's gate is on: off, it drops the volume silently); else
/// `init-container`, which every cluster runs. Each cell's record says
/// which (`info.kubernetes_agent_delivery`); a note says when `auto` chose
/// the image volume, or why not on a cluster whose nodes could mount one.
/// An explicit `image-volume` the API server drops is a user error (no cell
/// would find its agent).
async fn resolve_agent_delivery(
    client: &kube::Client,
    s: &mut KubeSettings,
) -> Result<Option<String>, BackendError> {
    use orch_manifest::AgentDelivery;
    if s.agent_delivery == AgentDelivery::InitContainer || s.agent_image.is_empty() {
        return Ok(None);
    }
    if s.agent_delivery == AgentDelivery::ImageVolume {
        if dry_run_image_volume(client, s).await == Ok(false) {
            return Err(user(
                "`kubernetes.agent_delivery: image-volume`: the API server dropped the `image` volume from a dry-run Job (its `ImageVolume` feature gate is off), so no cell would find its agent\nhint: use `agent_delivery: init-container` (or `auto`), or enable `ImageVolume` on the API server and kubelets (on by default from Kubernetes 1.35)".into(),
            ));
        }
        return Ok(None);
    }
    let (choice, why) = auto_delivery(client, s).await;
    s.agent_delivery = choice;
    Ok(match (choice, why) {
        (AgentDelivery::ImageVolume, _) => Some(format!(
            "the agent reaches each cell as an image volume of `{}` (every node's kubelet and runtime mount them): no init container",
            s.agent_image
        )),
        // Said only where the nodes could have mounted it.
        (_, AutoWhy::GateOff) => Some(
            "the agent reaches each cell by an init container: the nodes could mount it as an image volume, but the API server drops `image` volumes (its `ImageVolume` feature gate is off)\nhint: `kubernetes.agent_delivery: init-container` silences this".into(),
        ),
        _ => None,
    })
}

/// Why `auto` chose what it chose.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AutoWhy {
    /// Every node mounts image volumes and the API server keeps them.
    Mounted,
    /// The nodes cannot be listed (no `nodes list`), or there are none yet.
    NodesUnknown(String),
    /// A node's kubelet or runtime cannot mount one.
    Node(String),
    /// The API server drops `image` volumes.
    GateOff,
    /// The dry run was refused (an admission policy) or not answered.
    Unanswered(String),
}

impl AutoWhy {
    fn text(&self) -> String {
        match self {
            AutoWhy::Mounted => {
                "every node's kubelet and runtime mount image volumes and the API server keeps them".into()
            }
            AutoWhy::NodesUnknown(w) | AutoWhy::Node(w) => w.clone(),
            AutoWhy::GateOff => {
                "the API server drops `image` volumes (its `ImageVolume` feature gate is off)".into()
            }
            AutoWhy::Unanswered(e) => format!("a dry-run Job with an `image` volume was not accepted: {e}"),
        }
    }
}

/// What `agent_delivery: auto` becomes on this cluster, and why: the nodes
/// first (no request to the API server's admission where no node could
/// mount the volume anyway), then a server-side dry run.
async fn auto_delivery(client: &kube::Client, s: &KubeSettings) -> (orch_manifest::AgentDelivery, AutoWhy) {
    use k8s_openapi::api::core::v1::Node;
    use orch_manifest::AgentDelivery;
    let init = AgentDelivery::InitContainer;
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let Some(nodes) = tokio::time::timeout(
        Duration::from_secs(15),
        api.list(&kube::api::ListParams::default()),
    )
    .await
    .ok()
    .and_then(Result::ok) else {
        return (
            init,
            AutoWhy::NodesUnknown("the nodes cannot be listed (their kubelets and runtimes decide)".into()),
        );
    };
    if nodes.items.is_empty() {
        return (init, AutoWhy::NodesUnknown("the cluster has no node yet".into()));
    }
    if let Some(why) = nodes.items.iter().find_map(node_without_image_volumes) {
        return (init, AutoWhy::Node(why));
    }
    match dry_run_image_volume(client, s).await {
        Ok(true) => (AgentDelivery::ImageVolume, AutoWhy::Mounted),
        Ok(false) => (init, AutoWhy::GateOff),
        Err(e) => (init, AutoWhy::Unanswered(e)),
    }
}

/// `orch doctor`'s word on `agent_delivery`: what it becomes here, and why.
async fn delivery_check(client: &kube::Client, s: &KubeSettings) -> Check {
    use orch_manifest::AgentDelivery;
    let name = "agent delivery";
    match s.agent_delivery {
        AgentDelivery::InitContainer => Check::ok(name, "an init container copies the agent in (`agent_delivery: init-container`)"),
        AgentDelivery::ImageVolume => match dry_run_image_volume(client, s).await {
            Ok(false) => Check::fail(
                name,
                "`agent_delivery: image-volume`, but the API server drops `image` volumes (its `ImageVolume` feature gate is off)",
                "use `agent_delivery: auto` or `init-container`, or enable `ImageVolume` (on by default from Kubernetes 1.35)",
            ),
            Ok(true) => Check::ok(name, "the agent image as an image volume (`agent_delivery: image-volume`)"),
            Err(e) => Check::warn(
                name,
                format!("`agent_delivery: image-volume`, but a dry-run Job with an `image` volume was not accepted: {e}"),
                "check the cluster's admission policies for `image` volumes, or use `agent_delivery: init-container`",
            ),
        },
        AgentDelivery::Auto => match auto_delivery(client, s).await {
            (AgentDelivery::ImageVolume, why) => Check::ok(name, format!("an image volume: {}", why.text())),
            (_, why) => Check::ok(name, format!("an init container, not an image volume: {}", why.text())),
        },
    }
}

/// Why a node cannot mount the agent image as a volume (`None`: it can):
/// a kubelet before 1.35, or a runtime before containerd 2.1 or CRI-O 1.31.
fn node_without_image_volumes(node: &k8s_openapi::api::core::v1::Node) -> Option<String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
    let kubelet = info.map(|i| i.kubelet_version.as_str()).unwrap_or_default();
    let runtime = info
        .map(|i| i.container_runtime_version.as_str())
        .unwrap_or_default();
    let (_, kubelet_minor) = version_pair(kubelet);
    if kubelet_minor < IMAGE_VOLUME_KUBELET_MINOR {
        return Some(format!(
            "node `{name}` runs kubelet `{kubelet}` (image volumes are on by default from 1.35)"
        ));
    }
    let (engine, version) = runtime.split_once("://").unwrap_or((runtime, ""));
    let v = version_pair(version);
    let ok = match engine {
        "containerd" => v >= (2, 1),
        "cri-o" => v >= (1, 31),
        _ => false,
    };
    (!ok).then(|| format!("node `{name}` runs `{runtime}` (image volumes need containerd 2.1 or CRI-O 1.31)"))
}

/// (major, minor) of `v1.35.2`, `2.1.4-k3s1`; (0, 0) when unreadable.
fn version_pair(v: &str) -> (u32, u32) {
    let mut parts = v.trim_start_matches('v').split(['.', '-', '+']);
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// Whether the API server keeps an `image` volume: a server-side dry run
/// (`dryRun=All`: admitted and validated, never stored) of a Job mounting
/// the agent image. `Err`: what refused it (an admission policy, RBAC) or
/// that it was not answered.
async fn dry_run_image_volume(client: &kube::Client, s: &KubeSettings) -> Result<bool, String> {
    use k8s_openapi::api::batch::v1::Job;
    let mut probe = s.clone();
    probe.agent_delivery = orch_manifest::AgentDelivery::ImageVolume;
    let job = spec::delivery_probe_job(&probe);
    let api: kube::Api<Job> = kube::Api::namespaced(client.clone(), &s.namespace);
    let params = kube::api::PostParams {
        dry_run: true,
        field_manager: None,
    };
    let made = tokio::time::timeout(Duration::from_secs(15), api.create(&params, &job))
        .await
        .map_err(|_| "no answer within 15 s".to_string())?
        .map_err(|e| first_line(&e.to_string()))?;
    Ok(made
        .spec
        .and_then(|j| j.template.spec)
        .and_then(|p| p.volumes)
        .is_some_and(|v| v.iter().any(|v| v.image.is_some())))
}

/// Nodes per cell id, for cells of more than one (`nodes: N`).
pub fn nodes_of(plan: &Plan) -> BTreeMap<String, u32> {
    plan.cells
        .iter()
        .filter(|c| c.nodes > 1)
        .map(|c| (c.id.clone(), c.nodes))
        .collect()
}

/// `gpu_affinity: auto`: off when the cluster has GPU nodes (allocatable
/// `nvidia.com/gpu`) and none carries a label the affinity would use (no
/// GPU Feature Discovery, a cloud without a GPU-name label): the affinity
/// would match nothing, and the record's hardware identity still says
/// which GPU ran. Kept when the nodes cannot be listed, when there are no
/// GPU nodes yet (an autoscaler's node templates carry the labels) or when
/// one carries a label. Returns a note when it turns the affinity off.
async fn resolve_gpu_affinity(client: &kube::Client, s: &mut KubeSettings) -> Option<String> {
    use k8s_openapi::api::core::v1::Node;
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let list = tokio::time::timeout(
        Duration::from_secs(15),
        api.list(&kube::api::ListParams::default()),
    )
    .await
    .ok()?
    .ok()?;
    let (off, gpu_nodes) = gpu_nodes_without_labels(&list.items, s);
    if !off {
        return None;
    }
    s.gpu_affinity = orch_manifest::GpuAffinity::Off;
    Some(format!(
        "none of the cluster's {gpu_nodes} GPU node(s) shows its GPU type in a label orch reads (GPU Feature Discovery, GKE, Karpenter, EKS Auto Mode, a known instance type{}): GPU cells ask for `nvidia.com/gpu` only, and each record's hardware identity says which GPU ran\nhint: set `kubernetes.gpu_label` and `gpu_types` to your nodes' label, `gpu_affinity: required` to insist, or `off` to silence this",
        s.gpu_label.as_ref().map(|l| format!(", `{l}`")).unwrap_or_default()
    ))
}

/// (turn the affinity off?, how many GPU nodes) for `auto`.
fn gpu_nodes_without_labels(nodes: &[k8s_openapi::api::core::v1::Node], s: &KubeSettings) -> (bool, usize) {
    let gpus = |n: &k8s_openapi::api::core::v1::Node| {
        let status = n.status.as_ref();
        [
            status.and_then(|s| s.allocatable.as_ref()),
            status.and_then(|s| s.capacity.as_ref()),
        ]
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("nvidia.com/gpu"))
        .any(|q| q.0.trim() != "0" && !q.0.trim().is_empty())
    };
    let gpu_nodes: Vec<_> = nodes.iter().filter(|n| gpus(n)).collect();
    let labelled = gpu_nodes.iter().any(|n| {
        n.metadata
            .labels
            .as_ref()
            .is_some_and(|l| spec::node_shows_gpu_type(l, s))
    });
    (!gpu_nodes.is_empty() && !labelled, gpu_nodes.len())
}

/// Which of the suite's models are complete on the weights PVC (a probe Job
/// reads refs and orch's completeness markers there).
pub async fn check_models(
    plan: &Plan,
    context: Option<&str>,
    namespace: Option<&str>,
) -> Result<Vec<ModelCheck>, BackendError> {
    let requests = model_requests(plan);
    if requests.is_empty() {
        return Ok(vec![]);
    }
    let backend = backend(plan, context, namespace).await?;
    let queries: Vec<WeightsQuery> = requests
        .iter()
        .map(|r| WeightsQuery {
            folder: orch_hub::cache::repo_folder_name(&r.repo, &r.repo_type),
            revision: r.revision.clone(),
        })
        .collect();
    let commits = crate::weights::check(&backend, &default_image(), &queries)
        .await
        .map_err(kube_err)?;
    Ok(requests
        .into_iter()
        .zip(commits)
        .map(|(r, commit)| ModelCheck::remote(r, commit))
        .collect())
}

/// The image of cells that name none (builtin workloads need nothing of
/// it, commands a shell): `ORCH_KUBERNETES_IMAGE`, else `debian:bookworm-slim`.
fn default_image() -> String {
    std::env::var("ORCH_KUBERNETES_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "debian:bookworm-slim".into())
}

/// Each cell's image: `image: REF` as written; `image: {build: NAME}` as
/// pushed by `orch build --push REGISTRY` (`kubernetes.registry`, else
/// `ORCH_REGISTRY`).
pub fn images(plan: &Plan) -> Result<BTreeMap<String, String>, BackendError> {
    let specs = orch_images::plan_specs(plan).map_err(|e| user(e.to_string()))?;
    let registry = plan
        .kubernetes
        .as_ref()
        .and_then(|k| k.registry.clone())
        .or_else(|| std::env::var("ORCH_REGISTRY").ok().filter(|r| !r.is_empty()));
    let mut out = BTreeMap::new();
    for c in &plan.cells {
        match &c.image {
            Some(ImageDef::Ref(r)) => {
                out.insert(c.id.clone(), r.clone());
            }
            Some(ImageDef::Build(b)) => {
                let Some(spec) = specs.get(&b.build) else { continue };
                let Some(registry) = &registry else {
                    return Err(user(format!(
                        "cell `{}` uses `image: {{build: {}}}`, which the cluster can only pull from a registry\nhint: `orch build -f {} --push REGISTRY`, then set `kubernetes.registry: REGISTRY` in the suite (or `ORCH_REGISTRY`)",
                        c.id,
                        b.build,
                        plan.manifest.display()
                    )));
                };
                let tag = orch_images::resolve_tag(spec).map_err(|e| user(e.to_string()))?;
                out.insert(c.id.clone(), format!("{}/{tag}", registry.trim_end_matches('/')));
            }
            None => {
                out.insert(c.id.clone(), default_image());
            }
        }
    }
    Ok(out)
}

/// `orch run --backend kubernetes --dry-run`: the manifests, as YAML.
pub fn dry_run(
    plan: &Plan,
    files: &orch_files::Files,
    namespace: Option<&str>,
    context: Option<&str>,
) -> Result<String, BackendError> {
    let images = images(plan)?;
    let ns = namespace_choice(plan, namespace)?.unwrap_or("default");
    let mut s = settings(plan, ns);
    if s.agent_image.is_empty() {
        s.agent_image = "<ORCH_AGENT_IMAGE>".into();
    }
    let run_id = run_id_like(plan, std::time::SystemTime::now());
    let mut jobs = Vec::new();
    let mut services = Vec::new();
    // The ConfigMaps of every cell's files, each once; long tasks' JSON in
    // a folder of their own, as a run stages them.
    let mut packs: Vec<crate::files::Pack> = Vec::new();
    let staged = std::env::temp_dir().join(format!("orch-dry-run-{}", std::process::id()));
    std::fs::create_dir_all(&staged).map_err(|source| BackendError::Io {
        action: format!("create `{}`", staged.display()),
        source,
    })?;
    let built = (|| {
        for c in &plan.cells {
            let mut task = c.task.clone();
            task.run_id = run_id.clone();
            let shipment = files
                .shipment(&task)
                .map_err(|e| orch_backend::host::files_error(&e))?;
            let image = images.get(&c.id).cloned().unwrap_or_default();
            let json = staged.join(format!("{}.json", spec::dns_name("task", &c.id, 60)));
            let objects = crate::files::cell_objects(
                &task,
                &image,
                &plan.secrets,
                Some(&shipment),
                &json,
                c.nodes.max(1),
                &s,
            )?;
            for p in objects.packs {
                if !packs.iter().any(|q| q.name == p.name) {
                    packs.push(p);
                }
            }
            jobs.push(objects.job);
            services.extend(objects.service);
        }
        Ok::<(), BackendError>(())
    })();
    let described = crate::files::describe(&packs, &s);
    let _ = std::fs::remove_dir_all(&staged);
    built?;
    let mut out = format!(
        "# orch run --backend kubernetes --dry-run: {} Job(s){} of suite `{}` for namespace `{ns}`{}\n",
        jobs.len(),
        if services.is_empty() {
            String::new()
        } else {
            format!(" and {} headless Service(s) of multi-node cells", services.len())
        },
        plan.suite,
        context.map(|c| format!(", context `{c}`")).unwrap_or_default()
    );
    out.push_str(&orch_backend::host::files_listing(
        plan,
        files,
        orch_files::CELL_ROOT,
    )?);
    out.push_str(&format!(
        "# names derive from the run id, here `{run_id}` (a run's own id differs in its time and last four characters)\n"
    ));
    out.push_str(&described);
    out.push_str(&spec::dry_run_yaml(&jobs, &services, &plan.secrets, &run_id, &s));
    Ok(out)
}

/// A run id as `orch run` makes them (`<yyyymmdd-hhmmss>-<suite>-<salt>`,
/// UTC), with `0000` for the salt: `--dry-run` names objects the way a run
/// will.
fn run_id_like(plan: &Plan, now: std::time::SystemTime) -> String {
    orch_record::run_id(chrono::DateTime::<chrono::Utc>::from(now), &plan.suite, 0)
}

/// `orch setup --backend kubernetes`: the download runs in the cluster, in a
/// Job with the weights PVC mounted read-write (`orch setup` itself, the
/// static `orch` from the agent image, with its resume and verification), so
/// weights never pass through this machine. The token and the suite travel
/// in a Secret made for the Job and deleted after it.
pub async fn setup(
    flags: &Flags,
    req: &SetupRequest,
    plan: Option<&Plan>,
    on_line: OnLine<'_>,
) -> Result<i32, BackendError> {
    let def = plan.and_then(|p| p.kubernetes.clone()).unwrap_or_default();
    let context = flags.context.as_deref().or(def.context.as_deref());
    let namespace = flags.namespace.as_deref().or(def.namespace.as_deref());
    let (client, ns) = crate::connect(context, namespace)
        .await
        .map_err(|e| user(e.to_string()))?;
    let mut s = match plan {
        Some(p) => settings(p, &ns),
        None => KubeSettings::new(&ns, &agent_image(&def)),
    };
    if s.weights_pvc.is_none() {
        s.weights_pvc = std::env::var("ORCH_WEIGHTS_PVC").ok().filter(|v| !v.is_empty());
    }
    let Some(pvc) = s.weights_pvc.clone() else {
        return Err(user(
            "`orch setup --backend kubernetes` fills the weights PVC, and none is named\nhint: `kubernetes: {weights_pvc: NAME}` in the suite (`-f SUITE`), or `ORCH_WEIGHTS_PVC=NAME`".into(),
        ));
    };
    if s.agent_image.is_empty() {
        return Err(user(
            "`orch setup --backend kubernetes` runs the static `orch` of the agent image, and none is named\nhint: `orch build --agent --push REGISTRY` (with `bash scripts/prepare-modal.sh` run first, for the static `orch`), then `ORCH_AGENT_IMAGE=...`".into(),
        ));
    }
    let mut secret_values: Vec<(String, String)> = Vec::new();
    if let Some(f) = &req.file {
        let text = std::fs::read_to_string(f).map_err(|source| BackendError::Io {
            action: format!("read `{}`", f.display()),
            source,
        })?;
        secret_values.push(("suite.yaml".into(), text));
    }
    let suite = format!("{}/suite.yaml", spec::SETUP_SUITE_DIR);
    let cmd = orch_backend::host::setup_argv(
        req,
        req.file.as_ref().map(|_| suite.as_str()),
        crate::WEIGHTS_MOUNT,
    );
    if let Some(t) = orch_hub::token::resolve_token() {
        secret_values.push(("HF_TOKEN".into(), t.expose().to_string()));
    }
    let mut env = Vec::new();
    if let Ok(e) = std::env::var("HF_ENDPOINT") {
        env.push(("HF_ENDPOINT".to_string(), e));
    }
    let image = std::env::var("ORCH_KUBERNETES_SETUP_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| orch_backend::host::DEFAULT_SETUP_IMAGE.into());
    on_line(
        false,
        &format!("weights volume: PVC `{pvc}` in namespace `{ns}` (setup runs in a Job, image {image})\n"),
    );
    let backend = KubernetesBackend::new(client, s);
    let json = req.json;
    let code = backend
        .run_setup(&image, &cmd, &secret_values, &env, |line| {
            on_line(json, &format!("{line}\n"))
        })
        .await
        .map_err(kube_err)?;
    // `orch setup` exits 2 for user errors (a gated repo...): keep its code.
    Ok(match code {
        0 => 0,
        2 => 2,
        _ => 1,
    })
}

/// The kubernetes backend's host side.
pub struct KubernetesHost {
    pub flags: Flags,
}

#[async_trait]
impl Host for KubernetesHost {
    fn kind(&self) -> Kind {
        Kind::Kubernetes
    }

    async fn weights(&self, plan: Option<&Plan>, _create: bool) -> Result<Weights, BackendError> {
        let def = plan.and_then(|p| p.kubernetes.clone()).unwrap_or_default();
        let namespace = self.flags.namespace.clone().or(def.namespace.clone());
        Ok(Weights::Pvc {
            name: def
                .weights_pvc
                .clone()
                .or_else(|| std::env::var("ORCH_WEIGHTS_PVC").ok().filter(|v| !v.is_empty())),
            namespace,
        })
    }

    async fn check_models(&self, plan: &Plan, _weights: &Weights) -> Result<Vec<ModelCheck>, BackendError> {
        check_models(
            plan,
            self.flags.context.as_deref(),
            self.flags.namespace.as_deref(),
        )
        .await
    }

    async fn backend(&self, plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError> {
        let images = images(plan)?;
        let backend = backend(
            plan,
            self.flags.context.as_deref(),
            self.flags.namespace.as_deref(),
        )
        .await?;
        backend.preflight().await?;
        Ok((Arc::new(backend), images))
    }

    async fn setup(
        &self,
        req: &SetupRequest,
        plan: Option<&Plan>,
        on_line: OnLine<'_>,
    ) -> Result<SetupPlace, BackendError> {
        setup(&self.flags, req, plan, on_line).await.map(SetupPlace::Ran)
    }

    async fn down(&self, run_id: &str, plan: &Plan) -> Result<String, BackendError> {
        let backend = backend(
            plan,
            self.flags.context.as_deref(),
            self.flags.namespace.as_deref(),
        )
        .await?;
        backend.cleanup(run_id).await?;
        Ok(format!(
            "deleted every Job, pod, Service, Secret and ConfigMap of run {run_id} in namespace {}",
            backend.settings().namespace
        ))
    }

    /// A cell of `nodes: N` is an Indexed Job of N pods with a headless Service.
    fn max_nodes(&self) -> u32 {
        u32::MAX
    }

    /// Queueing is the cluster's job: cells wait as pending pods.
    async fn default_jobs(&self, _plan: &Plan, _host_gpus: Option<usize>) -> DefaultJobs {
        DefaultJobs::new(
            DEFAULT_JOBS,
            "cells beyond the cluster's GPUs wait as pending pods",
        )
    }

    fn dry_run(&self, plan: &Plan, files: &orch_files::Files) -> Result<String, BackendError> {
        dry_run(
            plan,
            files,
            self.flags.namespace.as_deref(),
            self.flags.context.as_deref(),
        )
    }

    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        doctor(&self.flags, plan).await
    }
}

/// What the shipped Role (`deploy/kubernetes/orch-role.yaml`) grants in a
/// namespace: (API group, resource, verbs). `orch doctor` asks the cluster
/// for each verb (a `SelfSubjectAccessReview`); a test keeps it equal to
/// the Role file.
pub const ROLE_RULES: &[(&str, &str, &[&str])] = &[
    (
        "batch",
        "jobs",
        &["create", "get", "list", "watch", "delete", "deletecollection"],
    ),
    (
        "",
        "pods",
        &["get", "list", "watch", "delete", "deletecollection"],
    ),
    ("", "pods/log", &["get"]),
    ("", "secrets", &["create", "delete", "deletecollection"]),
    ("", "configmaps", &["create", "deletecollection"]),
    ("", "events", &["list", "watch"]),
    (
        "",
        "services",
        &["create", "get", "list", "delete", "deletecollection"],
    ),
];

/// The verbs of [`ROLE_RULES`] only the run's one watch uses (its lists
/// and watches of Jobs, pods and events): without them the cells poll
/// their pods instead (more requests), so `orch doctor` warns, and fails
/// only for the others.
pub const WATCH_VERBS: &[(&str, &str, &str)] = &[
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("", "pods", "watch"),
    ("", "events", "watch"),
];

/// `orch doctor`'s `rbac` line from the verbs of [`ROLE_RULES`] the
/// cluster does not grant in `ns` (group, resource, verb), of `asked`:
/// fail for one a cell needs, warn when only [`WATCH_VERBS`] are missing.
pub fn rbac_check(ns: &str, asked: usize, missing: &[(&str, &str, &str)]) -> Check {
    let words = |m: &[&(&str, &str, &str)]| {
        m.iter()
            .map(|(group, resource, verb)| {
                format!(
                    "`{verb}` on `{resource}`{}",
                    if group.is_empty() {
                        String::new()
                    } else {
                        format!(" ({group})")
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let apply = format!(
        "apply orch's Role: `sed 's/namespace: bench/namespace: {ns}/' deploy/kubernetes/orch-role.yaml | kubectl apply -f -`"
    );
    let (watch, needed): (Vec<_>, Vec<_>) = missing.iter().partition(|m| WATCH_VERBS.contains(m));
    if !needed.is_empty() {
        let all: Vec<_> = needed.iter().chain(&watch).copied().collect();
        return Check::fail(
            "rbac",
            format!("not granted in namespace `{ns}`: {}", words(&all)),
            apply,
        );
    }
    if !watch.is_empty() {
        return Check::warn(
            "rbac",
            format!(
                "not granted in namespace `{ns}`: {}: the run's one watch of its pods, Jobs and events is refused, and every cell polls its pod instead (more requests to the API server)",
                words(&watch)
            ),
            apply,
        );
    }
    Check::ok(
        "rbac",
        format!("all {asked} verbs of orch's Role granted in namespace `{ns}`"),
    )
}

/// Can the kubeconfig's user do `verb` on `resource` (`pods/log`) of
/// `group` in `namespace` (`None`: cluster-scoped)? The API server's
/// answer to a `SelfSubjectAccessReview`.
pub async fn can_i(
    client: &kube::Client,
    verb: &str,
    group: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Result<bool, kube::Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let (resource, sub) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_string())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                subresource: sub,
                namespace: namespace.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    let answer = api.create(&kube::api::PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Is a cluster configured here at all (a kubeconfig, a context asked
/// for, or a pod's service account)?
fn configured(context: Option<&str>) -> bool {
    let home_config = std::env::var_os("HOME")
        .map(|h| std::path::PathBuf::from(h).join(".kube/config"))
        .is_some_and(|p| p.is_file());
    context.is_some()
        || std::env::var_os("KUBECONFIG").is_some_and(|k| !k.is_empty())
        || home_config
        || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
}

/// `orch doctor --backend kubernetes`: the kubeconfig's context and
/// namespace, the API server answering, each verb of the shipped Role
/// (`SelfSubjectAccessReview`), the GPU nodes and their labels (where the
/// optional ClusterRole lets orch list them), the agent image and the
/// static agent for `orch build --agent`.
async fn doctor(flags: &Flags, plan: Option<&Plan>) -> Vec<Check> {
    let def = plan.and_then(|p| p.kubernetes.clone()).unwrap_or_default();
    let context = flags.context.clone().or(def.context.clone());
    if !configured(context.as_deref()) {
        return vec![Check::skipped(
            "kubeconfig",
            "no kubeconfig (`KUBECONFIG` unset, no `~/.kube/config`) and not in a cluster",
            "point `KUBECONFIG` at your cluster's kubeconfig, or pass `--context`",
        )];
    }
    let ns_flag = flags.namespace.clone().or(def.namespace.clone());
    if let Some(ns) = ns_flag
        .as_deref()
        .filter(|n| !orch_manifest::k8s::is_dns_label(n))
    {
        return vec![Check::fail(
            "kubeconfig",
            format!("`{ns}` is not a namespace name"),
            "namespaces are lowercase letters, digits and `-` (at most 63)",
        )];
    }
    let (client, ns) = match crate::connect(context.as_deref(), ns_flag.as_deref()).await {
        Ok(c) => c,
        Err(e) => {
            let text = e.to_string();
            let next = text
                .lines()
                .find_map(|l| l.strip_prefix("hint: "))
                .unwrap_or("check the kubeconfig (`kubectl config view`)")
                .to_string();
            return vec![Check::fail("kubeconfig", first_line(&text), next)];
        }
    };
    let context_name = context.clone().or_else(|| {
        kube::config::Kubeconfig::read()
            .ok()
            .and_then(|k| k.current_context)
    });
    let mut out = vec![Check::ok(
        "kubeconfig",
        format!(
            "context `{}`, namespace `{ns}`",
            context_name.as_deref().unwrap_or("(in-cluster)")
        ),
    )];
    let limit = Duration::from_secs(15);
    match tokio::time::timeout(limit, client.apiserver_version()).await {
        Ok(Ok(v)) => out.push(Check::ok("api server", format!("Kubernetes {}", v.git_version))),
        Ok(Err(e)) => {
            out.push(Check::fail(
                "api server",
                format!("the API server did not answer: {e}"),
                "check the cluster and your credentials (`kubectl version`)",
            ));
            return out;
        }
        Err(_) => {
            out.push(Check::fail(
                "api server",
                "the API server did not answer within 15 s",
                "check the network and the kubeconfig's server URL (`kubectl version`)",
            ));
            return out;
        }
    }
    // Every verb of the shipped Role, in the namespace.
    let mut missing = Vec::new();
    let mut asked = 0;
    for (group, resource, verbs) in ROLE_RULES {
        for verb in *verbs {
            asked += 1;
            match tokio::time::timeout(limit, can_i(&client, verb, group, resource, Some(&ns))).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => missing.push((*group, *resource, *verb)),
                Ok(Err(e)) => {
                    out.push(Check::warn(
                        "rbac",
                        format!("cannot ask the cluster what orch may do (SelfSubjectAccessReview): {e}"),
                        format!("check by hand: `kubectl auth can-i --list -n {ns}`"),
                    ));
                    missing.clear();
                    asked = 0;
                    break;
                }
                Err(_) => {
                    out.push(Check::warn(
                        "rbac",
                        "the SelfSubjectAccessReview did not answer within 15 s",
                        format!("check by hand: `kubectl auth can-i --list -n {ns}`"),
                    ));
                    missing.clear();
                    asked = 0;
                    break;
                }
            }
        }
        if asked == 0 {
            break;
        }
    }
    if asked > 0 {
        out.push(rbac_check(&ns, asked, &missing));
    }
    out.push(gpu_nodes_check(&client, plan, &ns).await);
    let image = agent_image(&def);
    out.push(if image.is_empty() {
        Check::warn(
            "agent image",
            "no agent image (`kubernetes.agent_image` in the suite, or `ORCH_AGENT_IMAGE`)",
            "`orch build --agent --push REGISTRY`, then set `ORCH_AGENT_IMAGE` to the tag it prints",
        )
    } else {
        Check::ok("agent image", format!("`{image}`"))
    });
    if image.is_empty() {
        out.push(static_agent_check());
    } else {
        let mut s = KubeSettings::new(&ns, &image);
        s.agent_delivery = def.agent_delivery.unwrap_or_default();
        out.push(delivery_check(&client, &s).await);
    }
    if let Some(plan) = plan {
        if let Err(e) = images(plan) {
            let text = e.to_string();
            let next = text
                .lines()
                .find_map(|l| l.strip_prefix("hint: "))
                .unwrap_or("check the suite's images")
                .to_string();
            out.push(Check::fail("images", first_line(&text), next));
        }
    }
    out
}

/// The GPU nodes and whether their labels show the GPU type (nodes are
/// cluster-scoped: listed only where the optional ClusterRole allows).
async fn gpu_nodes_check(client: &kube::Client, plan: Option<&Plan>, ns: &str) -> Check {
    use k8s_openapi::api::core::v1::Node;
    match can_i(client, "list", "", "nodes", None).await {
        Ok(true) => {}
        Ok(false) => {
            return Check::warn(
                "gpu nodes",
                "orch may not list nodes (the optional ClusterRole `orch-nodes`): an impossible GPU request waits `unschedulable_grace` before it fails",
                "apply the ClusterRole and ClusterRoleBinding at the end of `deploy/kubernetes/orch-role.yaml`",
            )
        }
        Err(e) => return Check::warn("gpu nodes", format!("cannot ask whether orch may list nodes: {e}"), "`kubectl auth can-i list nodes`"),
    }
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let list = match tokio::time::timeout(
        Duration::from_secs(15),
        api.list(&kube::api::ListParams::default()),
    )
    .await
    {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => {
            return Check::warn(
                "gpu nodes",
                format!("cannot list nodes: {e}"),
                "`kubectl get nodes`",
            )
        }
        Err(_) => return Check::warn("gpu nodes", "listing nodes took over 15 s", "`kubectl get nodes`"),
    };
    let s = plan
        .map(|p| settings(p, ns))
        .unwrap_or_else(|| KubeSettings::new(ns, ""));
    let mut gpu_nodes = Vec::new();
    for n in &list.items {
        let status = n.status.as_ref();
        let count = [
            status.and_then(|s| s.allocatable.as_ref()),
            status.and_then(|s| s.capacity.as_ref()),
        ]
        .into_iter()
        .flatten()
        .find_map(|m| m.get("nvidia.com/gpu"))
        .map(|q| q.0.trim().to_string())
        .filter(|q| !q.is_empty() && q != "0");
        let Some(count) = count else { continue };
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let label = labels
            .iter()
            .find(|(k, _)| {
                k.contains("gpu.product")
                    || k.contains("accelerator")
                    || k.contains("gpu-type")
                    || k.contains("gpu.name")
            })
            .map(|(k, v)| format!("{k}={v}"));
        gpu_nodes.push((
            n.metadata.name.clone().unwrap_or_default(),
            count,
            label,
            spec::node_shows_gpu_type(&labels, &s),
        ));
    }
    let gpu_cells = plan.is_some_and(|p| p.cells.iter().any(|c| c.task.gpu.type_name().is_some()));
    if gpu_nodes.is_empty() {
        let detail = format!(
            "{} node(s), none with allocatable `nvidia.com/gpu`",
            list.items.len()
        );
        let next = "install the NVIDIA device plugin (or GPU operator), or add GPU nodes; an autoscaler adds them on demand";
        return if gpu_cells {
            Check::warn("gpu nodes", detail, next)
        } else {
            Check::ok("gpu nodes", format!("{detail} (the suite's cells need none)"))
        };
    }
    let shown = gpu_nodes.iter().filter(|g| g.3).count();
    let listing = gpu_nodes
        .iter()
        .take(5)
        .map(|(n, c, l, _)| {
            format!(
                "{n} ({c} GPU{})",
                l.as_ref().map(|l| format!(", {l}")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if shown == 0 {
        Check::warn(
            "gpu nodes",
            format!("{} GPU node(s), none labelled with its GPU type: {listing}", gpu_nodes.len()),
            "install GPU Feature Discovery, or set `kubernetes.gpu_label` and `gpu_types` to your nodes' label",
        )
    } else {
        Check::ok("gpu nodes", format!("{} GPU node(s): {listing}", gpu_nodes.len()))
    }
}

#[cfg(test)]
mod role_tests {
    use super::*;

    /// `ROLE_RULES` is what `deploy/kubernetes/orch-role.yaml`'s Role grants.
    #[test]
    fn the_doctor_asks_for_every_verb_of_the_shipped_role() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/orch-role.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).unwrap();
        let role = docs.iter().find(|d| d["kind"] == "Role").unwrap();
        let mut from_file = Vec::new();
        for r in role["rules"].as_array().unwrap() {
            for g in r["apiGroups"].as_array().unwrap() {
                for res in r["resources"].as_array().unwrap() {
                    for v in r["verbs"].as_array().unwrap() {
                        from_file.push(format!(
                            "{} {} {}",
                            g.as_str().unwrap(),
                            res.as_str().unwrap(),
                            v.as_str().unwrap()
                        ));
                    }
                }
            }
        }
        let mut ours: Vec<String> = ROLE_RULES
            .iter()
            .flat_map(|(g, r, vs)| vs.iter().map(move |v| format!("{g} {r} {v}")))
            .collect();
        from_file.sort();
        ours.sort();
        assert_eq!(ours, from_file);
        // The watch's verbs are the Role's.
        for (g, r, v) in WATCH_VERBS {
            assert!(ours.contains(&format!("{g} {r} {v}")), "{g} {r} {v}");
        }
    }

    #[test]
    fn the_doctor_warns_for_the_watch_verbs_and_fails_for_the_others() {
        let ok = rbac_check("bench", 24, &[]);
        assert_eq!(ok.status, orch_backend::host::CheckStatus::Ok);
        // An older Role: no list/watch of Jobs, no watch of events.
        let older = [
            ("batch", "jobs", "list"),
            ("batch", "jobs", "watch"),
            ("", "events", "watch"),
        ];
        let w = rbac_check("bench", 24, &older);
        assert_eq!(w.status, orch_backend::host::CheckStatus::Warn, "{w:?}");
        assert!(w.detail.contains("`watch` on `jobs` (batch)"), "{w:?}");
        assert!(w.detail.contains("`watch` on `events`"), "{w:?}");
        assert!(w.detail.contains("polls its pod"), "{w:?}");
        assert!(w.next.as_deref().unwrap().contains("orch-role.yaml"));
        // A verb a cell needs fails, naming the watch's too.
        let mut cut = older.to_vec();
        cut.push(("", "pods/log", "get"));
        let f = rbac_check("bench", 24, &cut);
        assert_eq!(f.status, orch_backend::host::CheckStatus::Fail, "{f:?}");
        assert!(f.detail.contains("`get` on `pods/log`"), "{f:?}");
        assert!(f.detail.contains("`list` on `jobs` (batch)"), "{f:?}");
    }
}

#[cfg(test)]
mod namespace_tests {
    use super::*;

    fn node(labels: &[(&str, &str)], gpus: Option<&str>) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>()},
            "status": {"allocatable": gpus.map(|g| serde_json::json!({"nvidia.com/gpu": g})).unwrap_or(serde_json::json!({}))}
        }))
        .unwrap()
    }

    fn versions(kubelet: &str, runtime: &str) -> k8s_openapi::api::core::v1::Node {
        let info = serde_json::json!({"kubeletVersion": kubelet, "containerRuntimeVersion": runtime,
            "architecture": "", "bootID": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "",
            "operatingSystem": "", "osImage": "", "systemUUID": ""});
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}, "status": {"nodeInfo": info}}))
            .unwrap()
    }

    #[test]
    fn image_volumes_need_kubelet_1_35_on_containerd_2_1_or_cri_o_1_31() {
        for (kubelet, runtime, ok) in [
            ("v1.35.0", "containerd://2.1.0", true),
            ("v1.36.2-eks-1", "containerd://2.1.4-k3s1", true),
            ("v1.35.1", "cri-o://1.31.3", true),
            ("v1.34.9", "containerd://2.1.4", false),
            ("v1.35.0", "containerd://2.0.5", false),
            ("v1.35.0", "containerd://1.7.27", false),
            ("v1.35.0", "cri-o://1.30.9", false),
            ("v1.35.0", "docker://28.1.1", false),
            ("", "", false),
        ] {
            let why = node_without_image_volumes(&versions(kubelet, runtime));
            assert_eq!(why.is_none(), ok, "{kubelet} {runtime}: {why:?}");
        }
        assert_eq!(version_pair("v1.35.2"), (1, 35));
        assert_eq!(version_pair("2.1.4-k3s1"), (2, 1));
        assert_eq!(version_pair("garbage"), (0, 0));
    }

    #[test]
    fn auto_turns_the_gpu_affinity_off_only_where_no_gpu_node_carries_a_label() {
        let s = KubeSettings::new("ns", "a");
        // A GPU node of an instance type orch does not know, no GFD.
        let odd = node(
            &[
                ("kubernetes.azure.com/accelerator", "nvidia"),
                ("node.kubernetes.io/instance-type", "Standard_NC4as_T4_v3"),
            ],
            Some("1"),
        );
        let cpu = node(&[("kubernetes.io/os", "linux")], None);
        assert_eq!(
            gpu_nodes_without_labels(&[odd.clone(), cpu.clone()], &s),
            (true, 1)
        );
        // One GPU node of a known instance type: the affinity stays.
        let aks = node(
            &[("node.kubernetes.io/instance-type", "Standard_ND96isr_H100_v5")],
            Some("8"),
        );
        assert_eq!(gpu_nodes_without_labels(&[odd.clone(), aks], &s), (false, 2));
        // No GPU node yet (a pool at zero): the autoscaler's templates decide.
        assert_eq!(
            gpu_nodes_without_labels(std::slice::from_ref(&cpu), &s),
            (false, 0)
        );
        let gfd = node(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")], Some("8"));
        assert!(!gpu_nodes_without_labels(&[gfd, cpu], &s).0);
        let zero = node(&[], Some("0"));
        assert_eq!(gpu_nodes_without_labels(&[zero], &s), (false, 0));
        // The user's own label.
        let mut own = KubeSettings::new("ns", "a");
        own.gpu_label = Some("example.com/gpu".into());
        let labelled = node(&[("example.com/gpu", "t4")], Some("1"));
        assert!(!gpu_nodes_without_labels(&[odd.clone(), labelled], &own).0);
        assert!(gpu_nodes_without_labels(&[odd], &own).0);
    }

    #[test]
    fn the_namespace_flag_is_a_dns_label() {
        let plan = orch_manifest::load_str(
            "name: x\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n",
            std::path::Path::new("suite.yaml"),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(namespace_choice(&plan, Some("team-a")).unwrap(), Some("team-a"));
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_795_723_016);
        assert_eq!(run_id_like(&plan, t), "20261126-195656-x-0000");
        assert_eq!(
            run_id_like(&plan, std::time::UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "20000229-000000-x-0000"
        );
        assert_eq!(namespace_choice(&plan, None).unwrap(), None);
        let e = namespace_choice(&plan, Some("Team_A")).unwrap_err();
        assert!(matches!(e, BackendError::User(_)));
        let m = e.to_string();
        assert!(
            m.contains("`--namespace`: `Team_A` is not a namespace name") && m.contains("\nhint: "),
            "{m}"
        );
    }
}
