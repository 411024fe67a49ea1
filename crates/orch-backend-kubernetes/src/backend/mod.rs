//! `--backend kubernetes`: a Job per cell.
//!
//! For each cell: the run's Secret (once, from the suite's `secrets:`), the
//! cell's Job ([`crate::spec::cell_job`]), then its pod looked at in the
//! run's one watch ([`informer`]: the run's pods, Jobs and events, listed
//! once and watched) on every change, until the cell's container starts. A pod that cannot start is a
//! failed cell within seconds, with the cluster's own words: unschedulable
//! (no autoscaler adds a node: its `NotTriggerScaleUp`, or no word within
//! `unschedulable_grace`; one that does, `TriggeredScaleUp` or Karpenter's
//! `Nominated`, gets `scale_up_timeout` for the node), an
//! image that cannot be pulled, a container that cannot be created (a
//! missing Secret key), no progress for `max_pending`. Once the container
//! runs, its log (the agent's frame stream) is followed into the shared
//! [`Home`], reconnecting after a dropped stream (frames already home are
//! dropped by number). When the stream ends without a result, the cell's
//! end comes from the pod: the agent's summary in the termination message,
//! `OOMKilled`, eviction, the Job's deadline ([`crate::end`]). The Job is
//! deleted (with its pod) when the cell ends, on cancel and on timeout. The
//! cell's files go first, as the run's ConfigMaps ([`crate::files`]), each
//! created once. Every call goes on through the API server's absences, for
//! the API budget ([`DEFAULT_API_BUDGET`]).
//!
//! What is where, in the order a cell meets it:
//!
//! - `mod.rs`: [`KubernetesBackend`] and its [`Backend`] (preflight, a
//!   cell's [`lifecycle::drive`], cleanup);
//! - `api.rs`: calls made again through the API server's absences, for the
//!   API budget;
//! - `create.rs`: the run's Secret and ConfigMaps, the cell's Job and Service;
//! - `cell.rs`: one cell's Job as the lifecycle's [`lifecycle::Platform`];
//! - `informer.rs`: the run's one watch of its pods, Jobs and events, and
//!   the cap on open log streams;
//! - `pending.rs`: looks at the Job and its pod until the container runs;
//! - `follow.rs`: the cell container's log, followed through reconnects;
//! - `ranks.rs`: a multi-node cell's other ranks: waited for, followed into
//!   `nodes/<k>/`, their ends;
//! - `facts.rs`: what the cluster says of a cell's end, gathered for
//!   [`crate::end::decide`];
//! - `down.rs`: deleting a cell's Job, and a run's objects (`orch down`);
//! - `short_job.rs`: the short Jobs of probes and `orch setup`.

mod api;
mod cell;
mod create;
mod down;
mod facts;
mod follow;
mod informer;
mod pending;
mod ranks;
mod short_job;

use api::api_budget_from_env;
pub use api::transient;
use cell::JobCell;
use informer::{LogSlots, RunWatch};
pub use informer::{DEFAULT_LOG_STREAMS, LOG_STREAMS_ENV};
use ranks::Rank;

use crate::files;
use crate::spec::KubeSettings;
use crate::watch::PendingLimits;
use crate::KubeError;
use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
#[cfg(doc)]
use orch_backend::home::Home;
use orch_backend::lifecycle::{self, Cell};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_protocol::{Failure, FailureKind, Status};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::{mpsc, Mutex};

/// Longest wait for one API call inside a cell's watch loop (cancel and
/// deadlines are looked at between calls).
const API_TIMEOUT: Duration = Duration::from_secs(15);

/// How long orch goes on without one answer from the API server before a
/// cell fails `api_unreachable` (and again for the Job's deletion, and for
/// the run's cleanup).
pub const DEFAULT_API_BUDGET: Duration = Duration::from_secs(180);

/// Sets the API budget, in seconds.
pub const API_BUDGET_ENV: &str = "ORCH_KUBERNETES_API_BUDGET";

/// How often the pod is looked at while its log streams (its
/// `DisruptionTarget` condition is seen before the pod is gone).
const POD_POLL: Duration = Duration::from_secs(2);

/// How often a cell waiting on the run's watch looks again without a
/// change (its timed waits: `max_pending`, the unschedulable grace).
const WATCH_TICK: Duration = Duration::from_secs(1);

/// After rank 0 of a multi-node cell ended, how long the other ranks' logs
/// may take to come home (their pods end with the Job).
const RANKS_WAIT: Duration = Duration::from_secs(60);

pub struct KubernetesBackend {
    client: kube::Client,
    settings: KubeSettings,
    /// Runs whose Secret this process created.
    secrets_made: Mutex<Vec<String>>,
    /// ConfigMaps of files this process created or found: (run, name).
    files_made: Mutex<std::collections::HashSet<(String, String)>>,
    poll: Duration,
    /// How long calls go on without an answer ([`DEFAULT_API_BUDGET`]).
    api_budget: Duration,
    /// Nodes per cell id (1 when absent): an Indexed Job of that many pods.
    nodes: BTreeMap<String, u32>,
    /// One watch per run ([`informer`]), by run id.
    watches: std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<RunWatch>>>,
    /// The log streams open at once ([`DEFAULT_LOG_STREAMS`]).
    log_slots: LogSlots,
}

impl KubernetesBackend {
    pub fn new(client: kube::Client, settings: KubeSettings) -> KubernetesBackend {
        KubernetesBackend {
            client,
            settings,
            secrets_made: Mutex::new(Vec::new()),
            files_made: Mutex::new(Default::default()),
            poll: Duration::from_millis(500),
            api_budget: api_budget_from_env(),
            nodes: BTreeMap::new(),
            watches: Default::default(),
            log_slots: std::sync::Arc::new(tokio::sync::Semaphore::new(informer::log_streams_from_env())),
        }
    }

    /// Cells of more than one node (`nodes: N`, by cell id): each is an
    /// Indexed Job of N pods with a headless Service.
    pub fn with_nodes(mut self, nodes: BTreeMap<String, u32>) -> KubernetesBackend {
        self.nodes = nodes;
        self
    }

    /// How long calls go on without an answer from the API server.
    pub fn api_budget(&self) -> Duration {
        self.api_budget
    }

    pub fn settings(&self) -> &KubeSettings {
        &self.settings
    }

    /// The run's watch, started by its first cell (its lists under way: see
    /// [`RunWatch::ready`]).
    fn run_watch(&self, run_id: &str) -> std::sync::Arc<RunWatch> {
        let mut map = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(run_id.to_string())
            .or_insert_with(|| {
                RunWatch::start(
                    self.client.clone(),
                    &self.settings.namespace,
                    crate::spec::run_selector(run_id),
                )
            })
            .clone()
    }

    /// Why the run's watch is not used (its refusal's words, if any).
    fn watch_refused(&self, run_id: &str) -> Option<String> {
        let map = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        map.get(run_id).and_then(|w| w.refused())
    }

    fn limits(&self) -> PendingLimits {
        PendingLimits {
            max_pending: self.settings.max_pending,
            unschedulable_grace: self.settings.unschedulable_grace,
            scale_up_timeout: self.settings.scale_up_timeout,
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }
}

/// The `orch: kubernetes ...` line of a failure (the diagnosis rules match it).
fn note_line(f: &Failure) -> String {
    format!("kubernetes {}: {}", f.kind, f.message)
}

#[async_trait]
impl Backend for KubernetesBackend {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        if self.settings.agent_image.trim().is_empty() {
            return Err(KubeError::Unavailable {
                message: "the kubernetes backend needs the agent image (the static agent, `FROM scratch`)".into(),
                hint: "publish it with `orch build --agent --push REGISTRY` and name it in `kubernetes.agent_image` or `ORCH_AGENT_IMAGE`".into(),
            }
            .into());
        }
        let pods: Api<Pod> = self.api();
        pods.list(&ListParams::default().limit(1))
            .await
            .map_err(KubeError::api(format!(
                "list pods in namespace {}",
                self.settings.namespace
            )))?;
        Ok(())
    }

    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran {
        let cell = Cell::with_frames(launch, events)?;
        let Some(image) = cell.launch.image.clone() else {
            let mut r = cell.failed(
                Status::Failed,
                FailureKind::NoImage,
                "the cell names no `image`; the kubernetes backend needs one (`image: REF`)",
            );
            r.timings.insert(orch_protocol::Phase::Provision, 0.0);
            return Ok(r);
        };
        // With an existing Secret, every name the suite lists is a key of
        // it (the host need not hold the values); else the values at hand.
        let names: Vec<String> = if self.settings.secret_name.is_some() {
            self.settings.secret_keys.clone()
        } else {
            cell.launch.secrets.iter().map(|(k, _)| k.clone()).collect()
        };
        // The task as the pod sees it: its files under `/orch/files`.
        // The same objects `--dry-run` prints: the task rewritten to its
        // files, the Job, the ConfigMaps (a long task as a file too).
        let nodes = self.nodes.get(&cell.id).copied().unwrap_or(1).max(1);
        let objects = files::cell_objects(
            &cell.task,
            &image,
            &names,
            cell.launch.files.as_deref(),
            &cell.dir.join("task.json"),
            nodes,
            &self.settings,
        )?;
        let (job, packs, service) = (objects.job, objects.packs, objects.service);
        let (rank_tx, rank_rx) = mpsc::unbounded_channel();
        // Appended to line by line (no descriptor held while the cell runs).
        let klog = cell.dir.join("kubernetes.log");
        std::fs::File::create(&klog).map_err(|e| BackendError::Io {
            action: "create kubernetes.log".into(),
            source: e,
        })?;
        let mut platform = JobCell {
            backend: self,
            job_name: job.metadata.name.clone().unwrap_or_default(),
            job,
            job_uid: None,
            image,
            klog,
            pod_name: None,
            node: None,
            follower: None,
            lines: None,
            deleted: false,
            unreachable: None,
            packs,
            service,
            service_made: false,
            ranks: (1..nodes).map(Rank::new).collect(),
            stopped: None,
            collected: false,
            rank_tx,
            rank_rx,
            failed_rank: None,
            watch: None,
        };
        Ok(lifecycle::drive(&mut platform, cell, cancel).await)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let w = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(run_id);
        drop(w);
        self.delete_run(run_id).await
    }
}
