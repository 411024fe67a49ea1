//! The `kubernetes` backend: every cell is a batch/v1 Job on a cluster with
//! the NVIDIA device plugin, driven with kube-rs.
//!
//! A cell of `nodes: N` (N > 1) is an Indexed Job of N pods (the cell's
//! GPUs each) with a headless Service named as the pods' `subdomain`, so
//! pod `<job>-<k>` is `<job>-<k>.<job>` by DNS; every pod gets the
//! rendezvous variables the slurm backend gives (`MASTER_ADDR` = rank 0's
//! name, `MASTER_PORT` = 29500, `WORLD_SIZE`, `NNODES`, `NPROC_PER_NODE`,
//! `NODE_RANK`/`RANK` from the completion index). The host waits until
//! every pod runs (each judged like a one-node cell's pod), follows rank 0's
//! log as the cell's stream and every other rank's into `nodes/<k>/`, and
//! records every rank in `info.nodes` ([`nodes`]); a rank whose result is
//! not success (the agent exits 0 whatever its workload did) makes the host
//! delete the Job, so the other ranks stop (a pod that fails by itself fails
//! the Job: `backoffLimit: 0`), and the cell fails `node_rank_failed`. The Service is owned by the Job, deleted with
//! it and by `orch down` (the run's labels).
//!
//! - [`spec`]: the objects orch applies (the cell's Job, the run's Secret),
//!   built without IO, so `orch run --dry-run` prints exactly what is applied;
//! - [`watch`]: what a pod's status and events say (scheduled, pulling,
//!   unschedulable, image errors, config errors, disruption), without IO;
//! - [`end`]: how a cell's pod ended (OOM kill, eviction, disruption, the
//!   Job's deadline, a lost node, the agent's summary, a refused log), the
//!   facts the host gathered → the platform's end, without IO;
//! - [`backend`]: the [`orch_backend::Backend`] for `--backend kubernetes`:
//!   create, watch, follow the pod log home through
//!   [`orch_backend::home::Home`], gather the end's facts, delete.
//!
//! The cell's files (a command's `workdir`, a local compare `repo`, `patch`
//! files, a `prompt_file`, `sync.paths`) travel in content-addressed
//! ConfigMaps, mounted into the pod as one `projected` volume, no shared
//! filesystem needed: see [`files`] for the design and its limits (64 MiB a
//! cell, 768 KiB a ConfigMap).
//!
//! The agent reaches ANY image from the small agent image (`FROM scratch`,
//! the static agent at `/orch-agent`), one of two ways
//! (`kubernetes.agent_delivery`): mounted read-only at `/orch/bin` as an
//! `image` volume (KEP-4639; `auto` picks it when every node's kubelet is
//! 1.35 or later on containerd 2.1 or CRI-O 1.31 and a server-side dry run
//! keeps the volume: `host::resolve_agent_delivery`), or copied into an
//! `emptyDir` there by an init container (`orch-agent install
//! /orch/bin/orch-agent`; any cluster, one more container start per pod).
//! The cell's container runs `/orch/bin/orch-agent` either way. The agent's
//! stdout is the frame stream of the way home; the pod log carries it to the
//! host.
//!
//! ## What is where
//!
//! `--backend kubernetes`: `spec.rs` (the cell's Job and the run's Secret
//! without IO: labels, deadlines, GPU limits and node affinity by GFD/GKE/Karpenter
//! labels, tolerations, `/dev/shm`, the weights PVC, `secretKeyRef` env, the agent's init
//! container; a multi-node cell's Indexed Job and headless Service; `--dry-run` YAML); `watch.rs` (a pod's status read without IO: pending,
//! unschedulable, stuck on an image or a Secret, started); `end.rs` (a cell's end without
//! IO: the pod's end read from its status, the gathered facts → a verdict or words and
//! the result that came home, the termination message as the fallback result);
//! `backend/` (Secret, ConfigMaps, Job, the run's one watch of its pods, Jobs and events, its
//! log followed into `Home` with reconnects (at most 64 streams at once), the end's facts gathered, Job deleted on end/cancel/timeout,
//! `cleanup` by the run's labels; a multi-node cell's ranks followed into `nodes/<k>/`;
//! one file per concern, listed in its `mod.rs`); `nodes.rs` (a multi-node cell's `info.nodes` and
//! which rank's end is the cell's, without IO); `weights.rs`
//! (the weights PVC checked by a probe Job: refs and completeness markers);
//! `spec::setup_job` + `run_setup` (`orch setup --backend kubernetes`: the static `orch`
//! from the agent image runs `orch setup` in the cluster with the PVC read-write);
//! `files.rs` (the cell's files packed into ConfigMaps by digest, their projected volume, the
//! 64 MiB cap); `lib.rs` (`connect` like `kubectl`: `KUBECONFIG`, context, in-cluster). Its host side
//! (`host.rs`): settings from the suite and the flags, each cell's image, the weights
//! check, `orch setup` run remotely, `orch down`. `limiter.rs`: the client-side rate limit of
//! every request and the server's `429`s obeyed.

pub mod backend;
pub mod end;
pub mod files;
pub mod host;
pub mod limiter;
pub mod nodes;
pub mod spec;
pub mod watch;
pub mod weights;

pub use backend::KubernetesBackend;
pub use host::KubernetesHost;
pub use spec::{KubeSettings, Toleration};

/// Label every object orch creates carries.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "orch");
/// Label: the run (a label-safe form of the run id).
pub const RUN_LABEL: &str = "orch.dev/run";
/// Label: the cell (a label-safe form of the cell id).
pub const CELL_LABEL: &str = "orch.dev/cell";
/// Label on the pod template: the Job's name (orch finds its pod by it).
pub const JOB_LABEL: &str = "orch.dev/job";
/// The cell's container.
pub const CELL_CONTAINER: &str = "cell";
/// The init container that installs the agent.
pub const AGENT_CONTAINER: &str = "orch-agent";
/// Where the agent is installed in the cell's container.
pub const AGENT_DIR: &str = "/orch/bin";
pub const AGENT_PATH: &str = "/orch/bin/orch-agent";
/// Where the agent writes its output folder (an `emptyDir`).
pub const OUT_DIR: &str = "/orch/out";
/// Where the weights PVC is mounted (read-only).
pub const WEIGHTS_MOUNT: &str = "/weights";
/// The agent image's own path of the static agent.
pub const AGENT_IN_IMAGE: &str = "/orch-agent";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The cluster cannot be used from here (no kubeconfig, refused credentials, no agent image).
    #[error("{message}\nhint: {hint}")]
    Unavailable { message: String, hint: String },
    /// The API server answered a call with an error.
    #[error("kubernetes `{call}` failed: {source}")]
    Api {
        call: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
}

impl KubeError {
    pub fn api(call: impl Into<String>) -> impl FnOnce(kube::Error) -> KubeError {
        let call = call.into();
        move |source| {
            match &source {
            kube::Error::Api(s) if s.code == 401 || s.code == 403 => KubeError::Unavailable {
                message: format!(
                    "the cluster refused orch's credentials for `{call}` ({}): {}",
                    s.code, s.message
                ),
                hint: "check the kubeconfig's user (`kubectl auth can-i create jobs`), `--context` or `KUBECONFIG`; orch needs to create, list, watch and delete Jobs, Pods, Secrets, ConfigMaps and Services in the namespace".into(),
            },
            kube::Error::Api(s) if s.code == 422 => KubeError::Unavailable {
                message: format!("the cluster refused `{call}` as invalid: {}", s.message),
                hint: "check the suite's `kubernetes:` values (`cpu`, `shm_size`, tolerations, names) against the message; `orch run --dry-run` prints what orch sends".into(),
            },
            _ => KubeError::Api { call, source },
        }
        }
    }

    pub fn is_user_error(&self) -> bool {
        matches!(self, KubeError::Unavailable { .. })
    }
}

impl From<KubeError> for orch_backend::BackendError {
    fn from(e: KubeError) -> Self {
        match e {
            KubeError::Unavailable { message, hint } => orch_backend::BackendError::Unavailable {
                backend: "kubernetes",
                message,
                hint,
            },
            other => orch_backend::BackendError::Io {
                action: "talk to the Kubernetes API server".into(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}

/// A client for the cluster, like `kubectl` finds it: `KUBECONFIG` (or
/// `~/.kube/config`) with its current context or `context`, else the
/// in-cluster service account; its requests paced by the process's one
/// rate limit ([`limiter`]). Returns the client and the namespace:
/// `namespace` if given, else the context's, else `default`.
pub async fn connect(
    context: Option<&str>,
    namespace: Option<&str>,
) -> Result<(kube::Client, String), KubeError> {
    let config = match context {
        Some(ctx) => {
            let opts = kube::config::KubeConfigOptions {
                context: Some(ctx.to_string()),
                cluster: None,
                user: None,
            };
            kube::Config::from_kubeconfig(&opts)
                .await
                .map_err(|e| KubeError::Unavailable {
                    message: format!("cannot load the kubeconfig context `{ctx}`: {e}"),
                    hint: "list the contexts with `kubectl config get-contexts`; `KUBECONFIG` names the file".into(),
                })?
        }
        None => kube::Config::infer().await.map_err(|e| KubeError::Unavailable {
            message: format!("no Kubernetes cluster configured: {e}"),
            hint: "point `KUBECONFIG` at a kubeconfig (or use `~/.kube/config`), pass `--context`, or run orch inside the cluster".into(),
        })?,
    };
    let ns = namespace
        .map(str::to_string)
        .unwrap_or_else(|| config.default_namespace.clone());
    // kube-client's own retry (on by default in kube-client 5: 429, 503 and 504
    // sent again up to 15 times after their `Retry-After`) sits below orch's
    // limiter: every request refused at once came back at once after its
    // `Retry-After`, past the bucket, and the limiter never heard of a 429
    // to stop bursting. Off: each 429 reaches `limiter`, which pauses every
    // request and paces the retries.
    let mut config = config;
    config.default_retry = false;
    let client = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| KubeError::Unavailable {
            message: format!("cannot make a client for the cluster: {e}"),
            hint: "check the kubeconfig's cluster entry (server URL, certificate)".into(),
        })?
        .with_layer(&limiter::RateLimitLayer(limiter::shared()))
        .build();
    Ok((client, ns))
}

impl orch_protocol::ErrorClass for KubeError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}
