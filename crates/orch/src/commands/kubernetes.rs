//! What `--backend kubernetes` needs from the command line and the suite:
//! the settings ([`orch_backend_kubernetes::KubeSettings`]) from the suite's
//! `kubernetes:` section and `--context`/`--namespace`, each cell's image,
//! and `--dry-run`'s YAML.

use crate::error::user;
use orch_backend_kubernetes::weights::WeightsQuery;
use orch_backend_kubernetes::{spec, KubeSettings, KubernetesBackend, Toleration};
use orch_manifest::{ImageDef, KubernetesDef, Plan};
use std::collections::BTreeMap;
use std::time::Duration;

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
    s
}

/// The namespace: `--namespace`, else the suite's, else (None) the context's.
fn namespace_choice<'a>(plan: &'a Plan, flag: Option<&'a str>) -> Option<&'a str> {
    flag.or(plan.kubernetes.as_ref().and_then(|k| k.namespace.as_deref()))
}

/// Connect as `kubectl` would and make the backend.
pub async fn backend(
    plan: &Plan,
    context: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<KubernetesBackend> {
    let context = context.or(plan.kubernetes.as_ref().and_then(|k| k.context.as_deref()));
    let (client, ns) = orch_backend_kubernetes::connect(context, namespace_choice(plan, namespace))
        .await
        .map_err(|e| -> anyhow::Error {
            if e.is_user_error() {
                user(e.to_string())
            } else {
                e.into()
            }
        })?;
    Ok(KubernetesBackend::new(client, settings(plan, &ns)))
}

/// Which of the suite's models are complete on the weights PVC (a probe Job
/// reads refs and orch's completeness markers there).
pub async fn check_models(
    plan: &Plan,
    context: Option<&str>,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<crate::commands::plan::ModelCheck>> {
    let requests = crate::commands::setup::requests_of(plan);
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
    let commits = orch_backend_kubernetes::weights::check(&backend, &default_image(), &queries)
        .await
        .map_err(|e| -> anyhow::Error {
            if e.is_user_error() {
                user(e.to_string())
            } else {
                e.into()
            }
        })?;
    Ok(requests
        .into_iter()
        .zip(commits)
        .map(|(r, commit)| crate::commands::plan::ModelCheck {
            repo: r.repo,
            revision: r.revision,
            complete: commit.is_some(),
            commit,
            bytes: None,
            params: None,
            weights_bytes: None,
            fit: vec![],
        })
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
pub fn images(plan: &Plan) -> anyhow::Result<BTreeMap<String, String>> {
    let specs = crate::commands::build::image_specs(plan)?;
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
                let tag = orch_images::resolve_tag(spec)?;
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
pub fn dry_run(plan: &Plan, namespace: Option<&str>, context: Option<&str>) -> anyhow::Result<String> {
    let images = images(plan)?;
    let ns = namespace_choice(plan, namespace).unwrap_or("default");
    let mut s = settings(plan, ns);
    if s.agent_image.is_empty() {
        s.agent_image = "<ORCH_AGENT_IMAGE>".into();
    }
    let run_id = format!("dry-run-{}", plan.suite);
    let mut jobs = Vec::new();
    for c in &plan.cells {
        let mut task = c.task.clone();
        task.run_id = run_id.clone();
        let image = images.get(&c.id).cloned().unwrap_or_default();
        jobs.push(spec::cell_job(&task, &image, &plan.secrets, &s));
    }
    let mut out = format!(
        "# orch run --backend kubernetes --dry-run: {} Job(s) of suite `{}` for namespace `{ns}`{}\n",
        jobs.len(),
        plan.suite,
        context.map(|c| format!(", context `{c}`")).unwrap_or_default()
    );
    out.push_str(&spec::dry_run_yaml(&jobs, &plan.secrets, &run_id, &s));
    Ok(out)
}

/// `orch setup --backend kubernetes`: the download runs in the cluster, in a
/// Job with the weights PVC mounted read-write (`orch setup` itself, the
/// static `orch` from the agent image, with its resume and verification), so
/// weights never pass through this machine. The token and the suite travel
/// in a Secret made for the Job and deleted after it.
pub async fn setup(args: &crate::cli::SetupArgs) -> anyhow::Result<i32> {
    let plan = match &args.file {
        Some(f) => Some(orch_manifest::load(f, &orch_manifest::ExpandOptions::default())?),
        None => None,
    };
    let def = plan
        .as_ref()
        .and_then(|p| p.kubernetes.clone())
        .unwrap_or_default();
    let context = args.context.as_deref().or(def.context.as_deref());
    let namespace = args.namespace.as_deref().or(def.namespace.as_deref());
    let (client, ns) = orch_backend_kubernetes::connect(context, namespace)
        .await
        .map_err(|e| user(e.to_string()))?;
    let mut s = match &plan {
        Some(p) => settings(p, &ns),
        None => KubeSettings::new(&ns, &agent_image(&def)),
    };
    if s.weights_pvc.is_none() {
        s.weights_pvc = std::env::var("ORCH_WEIGHTS_PVC").ok().filter(|v| !v.is_empty());
    }
    let Some(pvc) = s.weights_pvc.clone() else {
        return Err(user(
            "`orch setup --backend kubernetes` fills the weights PVC, and none is named\nhint: `kubernetes: {weights_pvc: NAME}` in the suite (`-f SUITE`), or `ORCH_WEIGHTS_PVC=NAME`",
        ));
    };
    if s.agent_image.is_empty() {
        return Err(user(
            "`orch setup --backend kubernetes` runs the static `orch` of the agent image, and none is named\nhint: `orch build --agent --push REGISTRY` (with `bash scripts/prepare-modal.sh` run first, for the static `orch`), then `ORCH_AGENT_IMAGE=...`",
        ));
    }
    let mut cmd: Vec<String> = vec!["setup".into()];
    let mut secret_values: Vec<(String, String)> = Vec::new();
    if let Some(f) = &args.file {
        let text = std::fs::read_to_string(f)?;
        secret_values.push(("suite.yaml".into(), text));
        cmd.extend(["-f".into(), format!("{}/suite.yaml", spec::SETUP_SUITE_DIR)]);
    }
    for m in &args.models {
        cmd.extend(["--model".into(), m.clone()]);
    }
    cmd.extend([
        "--weights-dir".into(),
        orch_backend_kubernetes::WEIGHTS_MOUNT.into(),
        "--connections".into(),
        args.connections.to_string(),
    ]);
    if args.json {
        cmd.push("--json".into());
    }
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
        .unwrap_or_else(|| orch_backend_modal::setup::DEFAULT_SETUP_IMAGE.into());
    eprintln!("weights volume: PVC `{pvc}` in namespace `{ns}` (setup runs in a Job, image {image})");
    let backend = KubernetesBackend::new(client, s);
    let json = args.json;
    let code = backend
        .run_setup(&image, &cmd, &secret_values, &env, |line| {
            if json {
                println!("{line}");
            } else {
                eprintln!("{line}");
            }
        })
        .await
        .map_err(|e| -> anyhow::Error {
            if e.is_user_error() {
                user(e.to_string())
            } else {
                e.into()
            }
        })?;
    // `orch setup` exits 2 for user errors (a gated repo...): keep its code.
    Ok(match code {
        0 => 0,
        2 => 2,
        _ => 1,
    })
}
