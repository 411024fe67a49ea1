//! `--backend kubernetes`: a Job per cell.
//!
//! For each cell: the run's Secret (once, from the suite's `secrets:`), the
//! cell's Job ([`crate::spec::cell_job`]), then its pod watched every half
//! second until the cell's container starts. A pod that cannot start is a
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
//! `OOMKilled`, eviction, the Job's deadline. The Job is deleted (with its
//! pod) when the cell ends, on cancel and on timeout. The cell's files go
//! first, as the run's ConfigMaps ([`crate::files`]), each created once.
//!
//! ## When the API server goes away
//!
//! Every call is made again, with backoff (0.25 s doubling to 2 s), after an
//! error that the API server's absence explains: connection refused or
//! reset, a stream cut, no answer within 15 s, a 5xx or 429. A watch of the
//! pod, a log follow, the Job's deletion and the run's cleanup all go on
//! through such a gap, and a running cell keeps its state (the log is read
//! again from its start; frames already home are dropped by number). orch
//! gives up only after the **API budget**: 180 s without one answer in a row
//! ([`DEFAULT_API_BUDGET`], `ORCH_KUBERNETES_API_BUDGET=SECONDS` sets it).
//! The cell then fails `api_unreachable` (never `pod_lost`: the pod may run
//! on), its Job's deletion is tried for one more budget, and what is left
//! stops by itself (every Job has `activeDeadlineSeconds`) or goes with
//! `orch down`, which finds it by the run's label. An error that is an
//! answer (403, 404, 422) is not retried: a 403 names the verb and resource
//! the Role lacks (`deploy/kubernetes/orch-role.yaml` is the minimal Role).
//! ConfigMaps and Secrets are the run's, shared by its cells: an owner
//! reference to one cell's Job would delete them under the others, so they
//! go by label (`cleanup`, `orch down`).
//!
//! ## Disruption
//!
//! A pod the cluster took away (its `DisruptionTarget` condition:
//! `PreemptionByScheduler`, `DeletionByTaintManager`,
//! `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`) ends
//! the cell `cancelled` with failure kind `disrupted` and the condition's
//! reason and message: it did not finish its work, so `orch run --resume`
//! runs it again (resume runs every cell recorded `cancelled`).

use crate::files;
use crate::nodes::{self, RankEnd};
use crate::spec::{self, KubeSettings};
use crate::watch::{self, Action, Autoscaler, Pending, PendingLimits, PodState, Seen};
use crate::{KubeError, CELL_CONTAINER, JOB_LABEL};
use async_trait::async_trait;
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event as K8sEvent, Pod, Secret, Service};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use orch_backend::home::Home;
use orch_backend::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_protocol::{CellResult, Failure, Status};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
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

/// After rank 0 of a multi-node cell ended, how long the other ranks' logs
/// may take to come home (their pods end with the Job).
const RANKS_WAIT: Duration = Duration::from_secs(60);

/// An error that the API server's absence explains (a connection refused
/// or reset, a stream cut, a 5xx, throttling): the call is made again.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_) => true,
        _ => false,
    }
}

/// The wait before attempt `n + 1` of a call.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << n.min(4))).min(Duration::from_secs(2))
}

/// Why a call gave up.
#[derive(Debug)]
enum CallError {
    /// The API server answered with an error.
    Api(kube::Error),
    /// No answer for the whole budget: the last error.
    Unreachable(String),
}

impl CallError {
    fn into_kube(self, call: &str, budget: Duration) -> KubeError {
        match self {
            CallError::Api(e) => KubeError::api(call)(e),
            CallError::Unreachable(last) => KubeError::Io {
                action: format!("`{call}`"),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, unreachable_message(budget, &last)),
            },
        }
    }
}

/// The words of an API server that stayed away past the budget.
fn unreachable_message(budget: Duration, last: &str) -> String {
    format!(
        "the Kubernetes API server could not be reached for {}s (the API budget, `{API_BUDGET_ENV}`): {last}",
        budget.as_secs()
    )
}

/// The API budget from the environment, else [`DEFAULT_API_BUDGET`].
fn api_budget_from_env() -> Duration {
    std::env::var(API_BUDGET_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_API_BUDGET)
}

/// Make one API call, again with [`backoff`] after a [`transient`] error or
/// no answer within [`API_TIMEOUT`], until `budget` passed without an answer.
async fn call<T, F, Fut>(budget: Duration, mut f: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let started = Instant::now();
    let mut n = 0;
    loop {
        let last = match tokio::time::timeout(API_TIMEOUT, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !transient(&e) => return Err(CallError::Api(e)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}s", API_TIMEOUT.as_secs()),
        };
        if started.elapsed() >= budget {
            return Err(CallError::Unreachable(last));
        }
        tokio::time::sleep(backoff(n).min(budget.saturating_sub(started.elapsed()))).await;
        n += 1;
    }
}

/// A run of failed calls: since when, and the last error.
#[derive(Debug, Default)]
struct Down(Option<(Instant, String)>);

impl Down {
    /// One more failure; `true` once the budget is spent.
    fn failed(&mut self, error: String, budget: Duration) -> bool {
        let since = self.0.as_ref().map_or_else(Instant::now, |d| d.0);
        self.0 = Some((since, error));
        since.elapsed() >= budget
    }
    fn ok(&mut self) {
        self.0 = None;
    }
    fn attempts_wait(&self, n: u32) -> Duration {
        if self.0.is_some() {
            backoff(n)
        } else {
            Duration::from_millis(300)
        }
    }
    fn last(&self) -> String {
        self.0.as_ref().map(|d| d.1.clone()).unwrap_or_default()
    }
}

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

    /// The run's Secret, made once from the values the host holds.
    async fn ensure_secret(&self, run_id: &str, values: &[(String, String)]) -> Result<(), KubeError> {
        if values.is_empty() || self.settings.secret_name.is_some() {
            return Ok(());
        }
        let mut made = self.secrets_made.lock().await;
        if made.iter().any(|r| r == run_id) {
            return Ok(());
        }
        let secrets: Api<Secret> = self.api();
        let secret = spec::run_secret(run_id, values, &self.settings);
        let name = spec::secret_name(run_id);
        let budget = self.api_budget;
        let create = || {
            call(budget, || async {
                secrets.create(&PostParams::default(), &secret).await
            })
        };
        match create().await {
            Ok(_) => {}
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => {
                // Left by an earlier invocation of this run (or made by
                // this call before its answer was lost): made again from
                // this host's values.
                match call(budget, || async {
                    secrets.delete(&name, &DeleteParams::default()).await
                })
                .await
                {
                    Ok(_) | Err(CallError::Api(kube::Error::Api(_))) => {}
                    Err(e) => return Err(e.into_kube(&format!("delete secret {name}"), budget)),
                }
                create()
                    .await
                    .map_err(|e| e.into_kube(&format!("create secret {name}"), budget))?;
            }
            Err(e) => return Err(e.into_kube(&format!("create secret {name}"), budget)),
        }
        made.push(run_id.to_string());
        Ok(())
    }

    /// The ConfigMaps of a cell's files, each created once per run (one
    /// already there has the same content: its name is its keys' digest).
    /// Returns how many were new and their bytes.
    async fn ensure_files(&self, run_id: &str, packs: &[files::Pack]) -> Result<(usize, u64), KubeError> {
        let api: Api<ConfigMap> = self.api();
        let mut new = (0, 0);
        for pack in packs {
            let key = (run_id.to_string(), pack.name.clone());
            if self.files_made.lock().await.contains(&key) {
                continue;
            }
            let cm = files::config_map(pack, run_id, &self.settings)?;
            match call(self.api_budget, || async {
                api.create(&PostParams::default(), &cm).await
            })
            .await
            {
                Ok(_) => {
                    new.0 += 1;
                    new.1 += pack.bytes();
                }
                // Made by another cell of the run, or an earlier invocation of it.
                Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => {}
                Err(e) => {
                    return Err(e.into_kube(&format!("create configmap {}", pack.name), self.api_budget))
                }
            }
            self.files_made.lock().await.insert(key);
        }
        Ok(new)
    }

    /// Create the Job and return its uid. One of the same name left by an
    /// earlier invocation of the run is deleted first, with its pods
    /// (foreground), so that its pod is never taken for the new one's.
    async fn create_job(&self, job: &Job) -> Result<String, KubeError> {
        let made = self.create_fresh(job, "job", DeleteParams::foreground()).await?;
        Ok(made.metadata.uid.unwrap_or_default())
    }

    /// Create `obj`, again and again while the API server is away (for the
    /// API budget). A create whose answer was lost, or an object of the same
    /// name left by an earlier invocation, is found as a 409: that one is
    /// deleted (`dp`), its going waited for (at most 120 s), and the create
    /// made again.
    async fn create_fresh<K>(&self, obj: &K, what: &str, dp: DeleteParams) -> Result<K, KubeError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::Serialize
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        let name = obj.meta().name.clone().unwrap_or_default();
        let started = Instant::now();
        let budget = self.api_budget;
        loop {
            match call(budget, || async { api.create(&PostParams::default(), obj).await }).await {
                Ok(made) => return Ok(made),
                Err(CallError::Api(kube::Error::Api(s)))
                    if s.code == 409 && started.elapsed() < Duration::from_secs(120) =>
                {
                    let _ = call(budget, || async { api.delete(&name, &dp).await }).await;
                    while started.elapsed() < Duration::from_secs(120) {
                        if let Ok(None) = call(budget, || api.get_opt(&name)).await {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                Err(e) => return Err(e.into_kube(&format!("create {what} {name}"), budget)),
            }
        }
    }

    /// Delete a Job with its pods, again and again while the API server is
    /// away (for the API budget). `Err`: why it is still there.
    async fn delete_job(&self, name: &str) -> Result<(), String> {
        self.delete_named::<Job>(name, "job").await
    }

    /// Delete the object `name` in the background (its dependents too),
    /// retried while the API server is away; gone already is fine.
    async fn delete_named<K>(&self, name: &str, what: &str) -> Result<(), String>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api: Api<K> = self.api();
        match call(self.api_budget, || async {
            api.delete(name, &DeleteParams::background()).await
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 404 => Ok(()),
            Err(CallError::Api(e)) => Err(KubeError::api(format!("delete {what} {name}"))(e).to_string()),
            Err(CallError::Unreachable(last)) => Err(unreachable_message(self.api_budget, &last)),
        }
    }

    /// The Job's pod: made by this Job (its uid; `""`: any), not being
    /// deleted. One call, no retry: `Err(Unreachable)` is one failed
    /// attempt (the caller counts them against the budget).
    async fn find_pod(&self, job: &str, uid: &str) -> Result<Option<Pod>, CallError> {
        Ok(self.find_pods(job, uid).await?.into_iter().next())
    }

    /// Every pod of the Job (its uid; `""`: any) not being deleted. One
    /// call, as [`Self::find_pod`].
    async fn find_pods(&self, job: &str, uid: &str) -> Result<Vec<Pod>, CallError> {
        let pods: Api<Pod> = self.api();
        let lp = ListParams::default().labels(&format!("{JOB_LABEL}={job}"));
        let list = match tokio::time::timeout(API_TIMEOUT, pods.list(&lp)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) if !transient(&e) => return Err(CallError::Api(e)),
            Ok(Err(e)) => return Err(CallError::Unreachable(e.to_string())),
            Err(_) => {
                return Err(CallError::Unreachable(format!(
                    "no answer within {}s",
                    API_TIMEOUT.as_secs()
                )))
            }
        };
        Ok(list
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && (uid.is_empty()
                        || p.metadata
                            .owner_references
                            .as_ref()
                            .is_some_and(|o| o.iter().any(|r| r.uid == uid)))
            })
            .collect())
    }

    /// Create a multi-node cell's headless Service, owned by its Job. One
    /// of the same name left by an earlier invocation is deleted first.
    async fn create_service(&self, svc: &Service) -> Result<(), KubeError> {
        self.create_fresh(svc, "service", DeleteParams::background())
            .await?;
        Ok(())
    }

    /// Delete a Service (the garbage collector also does, with its Job).
    async fn delete_service(&self, name: &str) -> Result<(), String> {
        self.delete_named::<Service>(name, "service").await
    }

    /// Delete the Services of a run (`orch down`): `deletecollection` by
    /// label, or, where the API server does not offer it for Services (a
    /// 405), each one listed by label.
    async fn delete_services(&self, lp: &ListParams, budget: Duration) -> Result<(), CallError> {
        let api: Api<Service> = self.api();
        match call(budget, || async {
            api.delete_collection(&DeleteParams::background(), lp).await
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 405 => {
                let list = call(budget, || api.list(lp)).await?;
                for svc in list.items {
                    let name = svc.metadata.name.unwrap_or_default();
                    match call(budget, || async {
                        api.delete(&name, &DeleteParams::background()).await
                    })
                    .await
                    {
                        Ok(_) => {}
                        Err(CallError::Api(kube::Error::Api(s))) if s.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Could the nodes ever run `count` of this pod at once (a multi-node
    /// cell's ranks)? `None`: the nodes cannot be listed.
    async fn fits_nodes(&self, pod: &Pod, count: u32) -> Option<bool> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let list = tokio::time::timeout(API_TIMEOUT, nodes.list(&ListParams::default()))
            .await
            .ok()?
            .ok()?;
        Some(watch::fits_all(pod, &list.items, count))
    }

    /// `FailedCreate` events of a Job (quota, Pod Security, a webhook).
    async fn job_refusals(&self, job: &str) -> Vec<String> {
        let events: Api<K8sEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.kind=Job,involvedObject.name={job}"));
        let Ok(Ok(list)) = tokio::time::timeout(API_TIMEOUT, events.list(&lp)).await else {
            return vec![];
        };
        list.items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
            .filter_map(|e| e.message)
            .collect()
    }

    /// The Job's `Failed` condition reason (`DeadlineExceeded`, ...).
    async fn job_failed_reason(&self, job: &str) -> Option<String> {
        let jobs: Api<Job> = self.api();
        let j = tokio::time::timeout(API_TIMEOUT, jobs.get_opt(job))
            .await
            .ok()?
            .ok()??;
        j.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .and_then(|c| c.reason)
    }

    /// The events of a pod (`TYPE REASON: MESSAGE`, oldest first), and what
    /// an autoscaler said about it ([`Autoscaler`]).
    async fn pod_events(&self, pod: &str) -> (Vec<String>, Autoscaler) {
        let events: Api<K8sEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        let Ok(Ok(list)) = tokio::time::timeout(API_TIMEOUT, events.list(&lp)).await else {
            return (vec![], Autoscaler::Silent);
        };
        let mut items = list.items;
        // Oldest first: the autoscaler's latest word is its verdict.
        items.sort_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
        });
        let autoscaler = Autoscaler::from_events(items.iter().map(|e| {
            (
                e.reason.as_deref().unwrap_or_default(),
                e.source
                    .as_ref()
                    .and_then(|s| s.component.as_deref())
                    .or(e.reporting_component.as_deref())
                    .unwrap_or_default(),
                e.message.as_deref().unwrap_or_default(),
            )
        }));
        let lines = items
            .into_iter()
            .map(|e| {
                format!(
                    "{} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect();
        (lines, autoscaler)
    }

    /// One look at a Job's pod for [`Pending::decide`]: its state, and
    /// while it is unschedulable its events (the autoscaler's word) and
    /// whether any node could ever run it (asked once, `fits_cache`).
    async fn look_pod(&self, pod: &Pod, stalled: bool, fits_cache: &mut Option<Option<bool>>) -> Seen {
        self.look_pods(pod, 1, stalled, fits_cache).await
    }

    /// [`Self::look_pod`] for one of `count` pods that must all run at once
    /// (a multi-node cell's ranks): it could ever run only if the nodes could
    /// hold all `count`.
    async fn look_pods(
        &self,
        pod: &Pod,
        count: u32,
        stalled: bool,
        fits_cache: &mut Option<Option<bool>>,
    ) -> Seen {
        let pname = pod.metadata.name.clone().unwrap_or_default();
        let nominated = pod.status.as_ref().and_then(|s| s.nominated_node_name.clone());
        let state = watch::pod_state(pod);
        let wants_events =
            matches!(state, PodState::Unschedulable { .. } | PodState::Stuck { .. }) || stalled;
        let (events, autoscaler) = if wants_events {
            self.pod_events(&pname).await
        } else {
            (vec![], Autoscaler::Silent)
        };
        let mut fits = None;
        if matches!(state, PodState::Unschedulable { .. })
            && autoscaler != Autoscaler::ScalingUp
            && nominated.is_none()
        {
            if fits_cache.is_none() {
                *fits_cache = Some(self.fits_nodes(pod, count).await);
            }
            fits = fits_cache.flatten();
        }
        Seen::Pod {
            state,
            nominated,
            events,
            autoscaler,
            fits,
        }
    }
}

impl KubernetesBackend {
    /// Run `sh -c SCRIPT` in a short Job ([`spec::probe_job`]) and return
    /// its log; a pod that cannot start, or a script that fails, is an error
    /// in the cluster's words.
    pub async fn probe(
        &self,
        what: &str,
        image: &str,
        script: &str,
        limit: Duration,
    ) -> Result<String, KubeError> {
        let name = short_job_name(&format!("orch-probe-{what}"));
        let job = spec::probe_job(&name, image, script, &self.settings);
        let (code, log) = self.run_short_job(&job, limit, |_| {}).await?;
        if code != 0 {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            return Err(KubeError::Unavailable {
                message: format!(
                    "the probe Job `{name}` exited with {code}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ),
                hint: "check the PVC and the probe image (`ORCH_KUBERNETES_IMAGE`; it needs `sh`)".into(),
            });
        }
        Ok(log)
    }

    /// `orch setup --backend kubernetes`: the setup Job (with its Secret of
    /// the token and the suite, deleted after), its log streamed to
    /// `on_line` as it runs; returns the `orch setup` exit code.
    pub async fn run_setup(
        &self,
        image: &str,
        args: &[String],
        secret_values: &[(String, String)],
        env: &[(String, String)],
        on_line: impl FnMut(&str),
    ) -> Result<i32, KubeError> {
        let name = short_job_name("orch-setup");
        let secrets: Api<Secret> = self.api();
        let has_token = secret_values.iter().any(|(k, _)| k == "HF_TOKEN");
        let has_suite = secret_values.iter().any(|(k, _)| k == "suite.yaml");
        if !secret_values.is_empty() {
            let secret = spec::plain_secret(&name, secret_values, &self.settings);
            call(self.api_budget, || async {
                secrets.create(&PostParams::default(), &secret).await
            })
            .await
            .map_err(|e| e.into_kube(&format!("create secret {name}"), self.api_budget))?;
        }
        let job = spec::setup_job(
            &name,
            image,
            args,
            (!secret_values.is_empty()).then_some((name.as_str(), has_token, has_suite)),
            env,
            &self.settings,
        );
        let r = self
            .run_short_job(&job, Duration::from_secs(24 * 3600), on_line)
            .await;
        if !secret_values.is_empty() {
            let _ = call(self.api_budget, || async {
                secrets.delete(&name, &DeleteParams::default()).await
            })
            .await;
        }
        r.map(|(code, _)| code)
    }

    /// Create a Job of one short-lived pod, wait for its container to start
    /// (or fail in the cluster's words), follow its log to `on_line` until it
    /// ends, delete the Job; its exit code and whole log.
    async fn run_short_job(
        &self,
        job: &Job,
        limit: Duration,
        mut on_line: impl FnMut(&str),
    ) -> Result<(i32, String), KubeError> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let uid = self.create_job(job).await?;
        let r = async {
            let pod = self.wait_started(&name, &uid, limit).await?;
            let pods: Api<Pod> = self.api();
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            let follower = tokio::spawn(follow_log(pods.clone(), pod.clone(), tx, self.api_budget));
            let mut log = String::new();
            while let Some(line) = rx.recv().await {
                on_line(&line);
                log.push_str(&line);
                log.push('\n');
            }
            let followed = follower.await.unwrap_or_default();
            if let Some(e) = followed.error {
                return Err(KubeError::Io {
                    action: format!("follow the log of Job `{name}`"),
                    source: std::io::Error::other(e.message),
                });
            }
            let code = call(self.api_budget, || pods.get_opt(&pod))
                .await
                .ok()
                .flatten()
                .or(followed.last)
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.name == CELL_CONTAINER))
                .and_then(|c| c.state.as_ref()?.terminated.as_ref())
                .map(|t| t.exit_code)
                .unwrap_or(1);
            Ok((code, log))
        }
        .await;
        let _ = self.delete_job(&name).await;
        r
    }

    /// Wait until a short Job's container has started; its pod's name. The
    /// pod is judged as a cell's is ([`Pending::decide`]: the autoscaler's
    /// word on an unschedulable pod, image pulls, `max_pending`).
    async fn wait_started(&self, name: &str, uid: &str, limit: Duration) -> Result<String, KubeError> {
        let started = Instant::now();
        let fail = |message: String| KubeError::Unavailable {
            message,
            hint: format!(
                "check the PVC, the images and the namespace (`kubectl describe pod -l {JOB_LABEL}={name}`)"
            ),
        };
        let limits = self.limits();
        let mut pending = Pending::new(started);
        let mut fits_cache = None;
        let mut down = Down::default();
        let mut n = 0;
        loop {
            if started.elapsed() > limit {
                return Err(fail(format!(
                    "the Job `{name}` did not start within {:.0}s",
                    limit.as_secs_f64()
                )));
            }
            tokio::time::sleep(if down.0.is_some() { backoff(n) } else { self.poll }).await;
            let now = Instant::now();
            let found = match self.find_pod(name, uid).await {
                Ok(found) => {
                    down.ok();
                    n = 0;
                    found
                }
                Err(CallError::Api(e)) => return Err(KubeError::api(format!("list pods of job {name}"))(e)),
                Err(CallError::Unreachable(e)) => {
                    if down.failed(e, self.api_budget) {
                        return Err(CallError::Unreachable(down.last())
                            .into_kube(&format!("watch the pod of job {name}"), self.api_budget));
                    }
                    n += 1;
                    continue;
                }
            };
            let (seen, pod_name) = match found {
                Some(pod) => (
                    self.look_pod(&pod, pending.stalled(now, &limits), &mut fits_cache)
                        .await,
                    pod.metadata.name.clone().unwrap_or_default(),
                ),
                None => {
                    let refusals = if now.duration_since(started) > Duration::from_secs(5) {
                        self.job_refusals(name).await
                    } else {
                        vec![]
                    };
                    (Seen::NoPod { refusals }, String::new())
                }
            };
            match pending.decide(&seen, Instant::now(), &limits, "none").1 {
                Action::Wait => {}
                Action::Follow => return Ok(pod_name),
                Action::Fail(_, f) if f.kind == "unschedulable" => {
                    return Err(fail(format!(
                        "the pod of Job `{name}` cannot be scheduled: {}",
                        f.message
                    )))
                }
                Action::Fail(_, f) => {
                    return Err(fail(format!(
                        "the pod of Job `{name}` did not run: {}",
                        f.message
                    )))
                }
            }
        }
    }
}

/// A fresh name for a short Job (`PREFIX-...`), unique per call.
fn short_job_name(prefix: &str) -> String {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    spec::dns_name(prefix, &stamp.to_string(), 52)
}

/// The `orch: kubernetes ...` line of a failure (the diagnosis rules match it).
fn note_line(f: &Failure) -> String {
    format!("kubernetes {}: {}", f.kind, f.message)
}

/// A result from the agent's summary in the termination message.
fn summary_result(cell_id: &str, text: &str) -> Option<CellResult> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let status: Status = serde_json::from_value(v.get("status")?.clone()).ok()?;
    let mut r = match v.get("kind").and_then(|k| k.as_str()) {
        Some(kind) => CellResult::failed(
            cell_id,
            status,
            kind,
            v.get("message").and_then(|m| m.as_str()).unwrap_or_default(),
        ),
        None => {
            let mut r = CellResult::failed(cell_id, status, "", "");
            r.failure = None;
            r
        }
    };
    if let (Some(f), Some(code)) = (r.failure.as_mut(), v.get("exit_code").and_then(|c| c.as_i64())) {
        f.exit_code = Some(code as i32);
    }
    r.info.insert(
        "kubernetes_result_from".into(),
        "termination message (the log stream did not bring the result)".into(),
    );
    Some(r)
}

/// What a log follower saw: the last look at the pod, and why it stopped
/// early (if it did).
#[derive(Debug, Default)]
struct Followed {
    /// The pod as last seen (looked at every [`POD_POLL`] while the log
    /// streams, and after): its `DisruptionTarget` condition outlives it.
    last: Option<Pod>,
    error: Option<FollowError>,
}

#[derive(Debug)]
struct FollowError {
    /// The API server stayed away past the budget (else it refused).
    unreachable: bool,
    message: String,
}

/// Follow the cell container's log into `tx`, line by line, until the
/// container has ended or the pod is gone. A stream that ends or breaks
/// (the API server dropped the connection, refused a new one, did not
/// answer) is opened again with [`backoff`] (the whole log again: frames
/// already home are dropped by number) until `budget` passed without an
/// answer; an answer that is an error (a 403: the Role lacks `get pods/log`)
/// ends it at once.
async fn follow_log(
    pods: Api<Pod>,
    pod: String,
    tx: mpsc::UnboundedSender<String>,
    budget: Duration,
) -> Followed {
    let mut out = Followed::default();
    let mut down = Down::default();
    let mut n = 0u32;
    let refused = |e: kube::Error, call: &str| FollowError {
        unreachable: false,
        message: KubeError::api(call)(e).to_string(),
    };
    loop {
        let lp = LogParams {
            container: Some(CELL_CONTAINER.into()),
            follow: true,
            ..Default::default()
        };
        let streamed = match tokio::time::timeout(API_TIMEOUT, pods.log_stream(&pod, &lp)).await {
            Ok(Ok(stream)) => {
                down.ok();
                n = 0;
                let mut lines = stream.lines();
                let mut look = tokio::time::interval(POD_POLL);
                look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                look.tick().await;
                // A watch of the pod sees every change, the `DisruptionTarget`
                // condition of a pod deleted a moment later included; the
                // look every POD_POLL is the net (a Role without `watch
                // pods`, a watch the server ended).
                let wp = kube::api::WatchParams::default()
                    .fields(&format!("metadata.name={pod}"))
                    .timeout(290);
                let mut watch = match tokio::time::timeout(API_TIMEOUT, pods.watch(&wp, "0")).await {
                    Ok(Ok(w)) => Some(w.boxed()),
                    _ => None,
                };
                let mut reopen = false;
                loop {
                    tokio::select! {
                        line = lines.next() => match line {
                            Some(Ok(l)) => {
                                if tx.send(l).is_err() {
                                    return out;
                                }
                            }
                            // Ended, or cut: looked at below.
                            _ => break,
                        },
                        event = async {
                            match watch.as_mut() {
                                Some(w) => w.next().await,
                                None => std::future::pending().await,
                            }
                        } => match event {
                            Some(Ok(
                                kube::api::WatchEvent::Added(p)
                                | kube::api::WatchEvent::Modified(p)
                                | kube::api::WatchEvent::Deleted(p),
                            )) => {
                                out.last = Some(p);
                            }
                            Some(Ok(_)) => {}
                            // The server's timeout ended it: open it again
                            // at the next look. An error (a Role without
                            // `watch pods`): the looks go on alone.
                            None => {
                                watch = None;
                                reopen = true;
                            }
                            Some(Err(_)) => watch = None,
                        },
                        _ = look.tick() => {
                            if let Ok(Ok(Some(p))) = tokio::time::timeout(API_TIMEOUT, pods.get_opt(&pod)).await {
                                out.last = Some(p);
                            }
                            if reopen {
                                reopen = false;
                                if let Ok(Ok(w)) = tokio::time::timeout(API_TIMEOUT, pods.watch(&wp, "0")).await {
                                    watch = Some(w.boxed());
                                }
                            }
                        }
                    }
                }
                true
            }
            Ok(Err(e)) if !transient(&e) => {
                out.error = Some(refused(e, &format!("get pods/log {pod}")));
                return out;
            }
            Ok(Err(e)) => {
                down.failed(e.to_string(), budget);
                false
            }
            Err(_) => {
                down.failed(format!("no answer within {}s", API_TIMEOUT.as_secs()), budget);
                false
            }
        };
        // Has the container ended (or the pod gone)? Only a stream that
        // was read ends the follow: else the log is read again (whole).
        match tokio::time::timeout(API_TIMEOUT, pods.get_opt(&pod)).await {
            Ok(Ok(Some(p))) => {
                let done = watch::cell_terminated(&p);
                out.last = Some(p);
                if done && streamed {
                    return out;
                }
            }
            Ok(Ok(None)) => return out,
            Ok(Err(e)) if !transient(&e) => {
                out.error = Some(refused(e, &format!("get pod {pod}")));
                return out;
            }
            Ok(Err(e)) => {
                down.failed(e.to_string(), budget);
            }
            Err(_) => {
                down.failed(format!("no answer within {}s", API_TIMEOUT.as_secs()), budget);
            }
        }
        if let Some((since, last)) = &down.0 {
            if since.elapsed() >= budget {
                out.error = Some(FollowError {
                    unreachable: true,
                    message: unreachable_message(budget, last),
                });
                return out;
            }
        }
        tokio::time::sleep(down.attempts_wait(n)).await;
        if down.0.is_some() {
            n += 1;
        }
    }
}

/// The whole log of the cell's container, once (no follow).
async fn read_log(pods: &Api<Pod>, pod: &str) -> Option<String> {
    let lp = LogParams {
        container: Some(CELL_CONTAINER.into()),
        ..Default::default()
    };
    pods.logs(pod, &lp).await.ok()
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
                "no_image",
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
        let klog = std::fs::File::create(cell.dir.join("kubernetes.log")).map_err(|e| BackendError::Io {
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
        };
        Ok(lifecycle::drive(&mut platform, cell, cancel).await)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let lp = ListParams::default().labels(&spec::run_selector(run_id));
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let secrets: Api<Secret> = self.api();
        let config_maps: Api<ConfigMap> = self.api();
        // Every kind is tried (the Secret first: it holds values), each
        // again while the API server is away (the budget: one for all, so
        // an API server gone for good holds `orch` for one budget), the
        // first error is returned after.
        let budget = self.api_budget;
        let t0 = Instant::now();
        let left = || budget.saturating_sub(t0.elapsed()).max(Duration::from_secs(1));
        let s = call(left(), || async {
            secrets.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        let f = call(left(), || async {
            config_maps.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        let j = call(left(), || async {
            jobs.delete_collection(&DeleteParams::background(), &lp).await
        })
        .await
        .map(|_| ());
        // The headless Services of multi-node cells (their Jobs' garbage
        // collection takes them too; one whose Job is gone stays otherwise).
        let v = self.delete_services(&lp, left()).await;
        let p = call(left(), || async {
            pods.delete_collection(&DeleteParams::default(), &lp).await
        })
        .await
        .map(|_| ());
        // Wait until the pods are gone (their grace period), at most a minute.
        if p.is_ok() {
            for _ in 0..120 {
                match tokio::time::timeout(API_TIMEOUT, pods.list(&lp)).await {
                    Ok(Ok(l)) if l.items.is_empty() => break,
                    Ok(Err(e)) if !transient(&e) => break,
                    _ => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        }
        self.secrets_made.lock().await.retain(|r| r != run_id);
        self.files_made.lock().await.retain(|(r, _)| r != run_id);
        s.map_err(|e| e.into_kube("delete the run's secret", budget))?;
        f.map_err(|e| e.into_kube("delete the run's configmaps", budget))?;
        j.map_err(|e| e.into_kube("delete the run's jobs", budget))?;
        v.map_err(|e| e.into_kube("delete the run's services", budget))?;
        p.map_err(|e| e.into_kube("delete the run's pods", budget))?;
        Ok(())
    }
}

/// One cell's Job: the kubernetes backend's platform.
struct JobCell<'a> {
    backend: &'a KubernetesBackend,
    job: Job,
    job_name: String,
    job_uid: Option<String>,
    image: String,
    klog: std::fs::File,
    pod_name: Option<String>,
    node: Option<String>,
    follower: Option<tokio::task::JoinHandle<Followed>>,
    lines: Option<mpsc::UnboundedReceiver<String>>,
    deleted: bool,
    /// The API server stayed away past the budget: the cell's words.
    unreachable: Option<String>,
    /// The ConfigMaps of the cell's files.
    packs: Vec<files::Pack>,
    /// A multi-node cell's headless Service ([`spec::indexed`]).
    service: Option<Service>,
    service_made: bool,
    /// A multi-node cell's ranks other than 0 (rank 0 is the fields above).
    ranks: Vec<Rank>,
    /// How orch stopped the cell, if it did.
    stopped: Option<Stop>,
    /// The ranks' ends are collected.
    collected: bool,
    /// Ranks other than 0 that ended without success, as their followers see them.
    rank_tx: mpsc::UnboundedSender<u32>,
    rank_rx: mpsc::UnboundedReceiver<u32>,
    /// The first such rank (the Job was deleted for it).
    failed_rank: Option<u32>,
}

/// One rank other than 0 of a multi-node cell: its pod, its log followed
/// into `nodes/<rank>/` of the cell folder through a [`Home`] of its own.
struct Rank {
    rank: u32,
    pod: Option<String>,
    node: Option<String>,
    home: Option<Arc<std::sync::Mutex<Home>>>,
    follower: Option<tokio::task::JoinHandle<Followed>>,
    end: Option<RankEnd>,
}

impl Rank {
    fn new(rank: u32) -> Rank {
        Rank {
            rank,
            pod: None,
            node: None,
            home: None,
            follower: None,
            end: None,
        }
    }
}

/// The node rank of a pod of an Indexed Job (its completion index).
fn pod_rank(p: &Pod) -> Option<usize> {
    let m = &p.metadata;
    m.annotations
        .as_ref()
        .and_then(|a| a.get(spec::COMPLETION_INDEX))
        .or_else(|| m.labels.as_ref().and_then(|l| l.get(spec::COMPLETION_INDEX)))
        .and_then(|v| v.parse().ok())
}

/// Lock a rank's [`Home`] (one whose holder panicked is still usable: it
/// only writes files).
fn lock_home(h: &std::sync::Mutex<Home>) -> std::sync::MutexGuard<'_, Home> {
    h.lock().unwrap_or_else(|e| e.into_inner())
}

/// Follow a rank's log into its [`Home`]; a result other than `succeeded`
/// is told on `ended` (the agent exits 0 whatever its workload did, so the
/// Job does not fail by itself: the host stops the other ranks).
async fn follow_rank(
    pods: Api<Pod>,
    pod: String,
    home: Arc<std::sync::Mutex<Home>>,
    budget: Duration,
    rank: u32,
    ended: mpsc::UnboundedSender<u32>,
) -> Followed {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let follower = tokio::spawn(follow_log(pods, pod, tx, budget));
    while let Some(line) = rx.recv().await {
        let result = lock_home(&home).line(&line);
        if let Ok(Some(r)) = result {
            if r.status != Status::Succeeded {
                let _ = ended.send(rank);
            }
        }
    }
    follower.await.unwrap_or_default()
}

impl JobCell<'_> {
    fn log(&mut self, line: &str) {
        let _ = writeln!(self.klog, "{line}");
    }

    /// Start following a rank's pod: rank 0's log is the cell's stream,
    /// another's goes into `nodes/<rank>/` through a [`Home`] of its own.
    fn follow(&mut self, cell: &Cell, rank: usize, pod: &Pod) {
        let backend = self.backend;
        let pname = pod.metadata.name.clone().unwrap_or_default();
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if rank == 0 {
            self.pod_name = Some(pname.clone());
            self.node = node.or(self.node.take());
            let (tx, rx) = mpsc::unbounded_channel();
            self.lines = Some(rx);
            self.follower = Some(tokio::spawn(follow_log(
                backend.api(),
                pname,
                tx,
                backend.api_budget,
            )));
            return;
        }
        let dir = cell.dir.join("nodes").join(rank.to_string());
        // Its events stay in its own `events.jsonl`: the cell's progress is rank 0's.
        let (events, _) = mpsc::unbounded_channel();
        let home = match Home::new(&cell.id, &dir, events) {
            Ok(h) => Arc::new(std::sync::Mutex::new(h.masked(cell.masker.clone()))),
            Err(e) => {
                self.log(&format!("orch: rank {rank}: {e}"));
                return;
            }
        };
        self.log(&format!(
            "orch: rank {rank}: pod {pname}, its files into nodes/{rank}/"
        ));
        let Some(r) = self.ranks.get_mut(rank - 1) else {
            return;
        };
        r.pod = Some(pname.clone());
        r.node = node;
        r.home = Some(home.clone());
        r.follower = Some(tokio::spawn(follow_rank(
            backend.api(),
            pname,
            home,
            backend.api_budget,
            rank as u32,
            self.rank_tx.clone(),
        )));
    }

    /// A rank other than 0 ended without success: the other ranks would
    /// wait for it (a rendezvous, a collective), so the Job goes with its
    /// pods, as the Job controller does when a pod fails.
    async fn rank_ended(&mut self, rank: u32) {
        if self.failed_rank.is_some() {
            return;
        }
        self.failed_rank = Some(rank);
        let line = format!(
            "orch: node rank {rank} ended without success; deleting job {} to stop the other ranks",
            self.job_name
        );
        self.log(&line);
        self.delete().await;
    }

    /// Ranks that ended without success since the last look.
    fn ended_ranks(&mut self) -> Option<u32> {
        let mut first = None;
        while let Ok(r) = self.rank_rx.try_recv() {
            first.get_or_insert(r);
        }
        first
    }

    /// Until every pod of a multi-node cell's Job runs: each rank's pod is
    /// judged as a one-node cell's is ([`Pending::decide`], one per rank);
    /// one that can never run fails the cell, naming its rank.
    async fn wait_ranks(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let backend = self.backend;
        let n = self.ranks.len() + 1;
        let limits = backend.limits();
        let now = Instant::now();
        let mut pending: Vec<Pending> = (0..n).map(|_| Pending::new(now)).collect();
        let mut followed = vec![false; n];
        let mut fits_cache = None;
        let mut ticker = tokio::time::interval(backend.poll);
        let mut down = Down::default();
        let uid = self.job_uid.clone().unwrap_or_default();
        let gpu = cell.task.gpu.to_string();
        let mut k = 0;
        loop {
            if down.0.is_some() {
                tokio::time::sleep(backoff(k)).await;
                k += 1;
            } else {
                ticker.tick().await;
                k = 0;
            }
            let pods = match backend.find_pods(&self.job_name, &uid).await {
                Ok(p) => {
                    if down.0.is_some() {
                        self.log("orch: the API server answers again");
                    }
                    down.ok();
                    p
                }
                Err(CallError::Api(e)) => {
                    let e = KubeError::api(format!("list pods of job {}", self.job_name))(e);
                    return Err(Early::failed("backend", BackendError::from(e).to_string()));
                }
                Err(CallError::Unreachable(e)) => {
                    if down.0.is_none() {
                        self.log(&format!(
                            "orch: the API server does not answer ({e}); trying again for {}s",
                            backend.api_budget.as_secs()
                        ));
                    }
                    if down.failed(e, backend.api_budget) {
                        let message = unreachable_message(backend.api_budget, &down.last());
                        self.log(&format!("orch: kubernetes api_unreachable: {message}"));
                        return Err(Early::failed("api_unreachable", message));
                    }
                    continue;
                }
            };
            let mut by_rank: Vec<Option<Pod>> = vec![None; n];
            for p in pods {
                if let Some(r) = pod_rank(&p).filter(|r| *r < n) {
                    if by_rank[r].is_none() {
                        by_rank[r] = Some(p);
                    }
                }
            }
            let mut refusals: Option<Vec<String>> = None;
            for r in 0..n {
                if followed[r] {
                    continue;
                }
                let stalled = pending[r].stalled(Instant::now(), &limits);
                let seen = match &by_rank[r] {
                    Some(p) => backend.look_pods(p, n as u32, stalled, &mut fits_cache).await,
                    None => {
                        if refusals.is_none() {
                            refusals = Some(backend.job_refusals(&self.job_name).await);
                        }
                        Seen::NoPod {
                            refusals: refusals.clone().unwrap_or_default(),
                        }
                    }
                };
                let (line, action) = pending[r].decide(&seen, Instant::now(), &limits, &gpu);
                if let Some(line) = line {
                    self.log(&format!("orch: rank {r}: {line}"));
                }
                match action {
                    Action::Wait => {}
                    Action::Follow => {
                        if let Some(p) = &by_rank[r] {
                            self.follow(cell, r, p);
                            followed[r] = true;
                        }
                    }
                    Action::Fail(status, mut failure) => {
                        if let Seen::Pod { events, .. } = &seen {
                            for e in events {
                                self.log(&format!("event: rank {r}: {e}"));
                            }
                        }
                        failure.message = format!("node rank {r} of {n}: {}", failure.message);
                        if failure.kind == "unschedulable" {
                            failure
                                .message
                                .push_str(&format!(" (the cell needs {n} such pods running at once)"));
                        }
                        let line = format!("orch: {}", note_line(&failure));
                        self.log(&line);
                        return Err(Early { status, failure });
                    }
                }
            }
            if let Some(rank) = self.ended_ranks() {
                self.rank_ended(rank).await;
                if followed[0] {
                    return Ok(());
                }
                let failure = Failure::new(
                    "node_rank_failed",
                    format!(
                        "node rank {rank} ended without success before every rank of the cell ran; its logs are in `nodes/{rank}/`"
                    ),
                );
                self.log(&format!("orch: {}", note_line(&failure)));
                return Err(Early {
                    status: Status::Failed,
                    failure,
                });
            }
            if followed.iter().all(|f| *f) {
                self.log(&format!("orch: all {n} ranks run"));
                return Ok(());
            }
            // A rank that ended before the others started failed the Job
            // (`backoffLimit: 0`), whose controller stops the rest: no more wait.
            if followed.iter().any(|f| *f) {
                if let Some(reason) = backend.job_failed_reason(&self.job_name).await {
                    let line = format!(
                        "orch: the Job failed ({reason}) before every rank ran; ranks seen running: {:?}",
                        (0..n).filter(|r| followed[*r]).collect::<Vec<_>>()
                    );
                    self.log(&line);
                    if followed[0] {
                        return Ok(());
                    }
                    let r = followed.iter().position(|f| *f).unwrap_or(1);
                    let failure = Failure::new(
                        "node_rank_failed",
                        format!(
                            "node rank {r} ended before every rank of the cell ran, and the Job failed ({reason}); its logs are in `nodes/{r}/`"
                        ),
                    );
                    self.log(&format!("orch: {}", note_line(&failure)));
                    return Err(Early {
                        status: Status::Failed,
                        failure,
                    });
                }
            }
        }
    }

    /// The ends of the ranks other than 0: each follower awaited (until
    /// `wait` has passed for all), every frame its pod's log still holds,
    /// its termination message, else its pod's end.
    async fn collect_ranks(&mut self, cell: &Cell, wait: Duration) {
        if self.collected {
            return;
        }
        self.collected = true;
        let deadline = Instant::now() + wait;
        let pods: Api<Pod> = self.backend.api();
        for i in 0..self.ranks.len() {
            let mut last = None;
            if let Some(mut f) = self.ranks[i].follower.take() {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, &mut f).await {
                    Ok(Ok(followed)) => last = followed.last,
                    _ => f.abort(),
                }
            }
            let rank = self.ranks[i].rank;
            let pod = match self.ranks[i].pod.clone() {
                Some(p) => tokio::time::timeout(API_TIMEOUT, pods.get_opt(&p))
                    .await
                    .ok()
                    .and_then(Result::ok)
                    .flatten()
                    .or(last),
                None => None,
            };
            if let Some(n) = pod
                .as_ref()
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.clone())
            {
                self.ranks[i].node = Some(n);
            }
            let message = pod.as_ref().and_then(watch::termination_message);
            let mut result = None;
            if let Some(home) = self.ranks[i].home.clone() {
                for line in message.iter().flat_map(|m| m.lines()) {
                    let _ = lock_home(&home).line(line);
                }
                let (missing, gaps) = {
                    let h = lock_home(&home);
                    (h.result().is_none(), h.gaps())
                };
                if missing || gaps {
                    if let Some(p) = &self.ranks[i].pod {
                        if let Some(text) = read_log(&pods, p).await {
                            let mut h = lock_home(&home);
                            for line in text.lines() {
                                let _ = h.line(line);
                            }
                        }
                    }
                }
                let mut h = lock_home(&home);
                result = h.result().cloned();
                h.close();
            }
            if result.is_none() && self.ranks[i].pod.is_some() {
                result = message
                    .as_deref()
                    .and_then(|m| summary_result(&cell.id, m))
                    .or_else(|| {
                        let (status, failure) = watch::pod_end(pod.as_ref());
                        let mut r = CellResult::new(&cell.id, status);
                        r.failure = Some(failure);
                        Some(r)
                    });
            }
            let status = result.as_ref().map(|r| r.status.as_str()).unwrap_or("no_result");
            self.log(&format!("orch: rank {rank}: ended {status}"));
            self.ranks[i].end = Some(RankEnd {
                rank,
                host: self.ranks[i].node.clone(),
                result,
            });
        }
    }

    /// Delete the Job (retried while the API server is away), and a
    /// multi-node cell's Service; one that stays is named in `kubernetes.log`.
    async fn delete(&mut self) {
        if !self.deleted {
            self.deleted = true;
            if self.service_made {
                let name = spec::service_name(&self.job_name);
                if let Err(e) = self.backend.delete_service(&name).await {
                    let line = format!(
                        "orch: the service {name} could not be deleted ({e}); the garbage collector deletes it with its Job, `orch down` by label"
                    );
                    self.log(&line);
                }
            }
            if let Err(e) = self.backend.delete_job(&self.job_name).await {
                let line = format!(
                    "orch: the job {} could not be deleted ({e}); its activeDeadlineSeconds stops it, `orch down` deletes it",
                    self.job_name
                );
                self.log(&line);
            }
        }
    }

    /// One look at the Job's pod.
    async fn look(
        &mut self,
        pending: &Pending,
        fits_cache: &mut Option<Option<bool>>,
    ) -> Result<(Seen, Option<Pod>), CallError> {
        let backend = self.backend;
        let uid = self.job_uid.clone().unwrap_or_default();
        let Some(pod) = backend.find_pod(&self.job_name, &uid).await? else {
            let refusals = if pending.stalled(Instant::now(), &backend.limits()) || self.pod_name.is_none() {
                backend.job_refusals(&self.job_name).await
            } else {
                vec![]
            };
            return Ok((Seen::NoPod { refusals }, None));
        };
        let pname = pod.metadata.name.clone().unwrap_or_default();
        if self.pod_name.is_none() {
            self.log(&format!("orch: pod {pname}"));
        }
        self.pod_name = Some(pname.clone());
        self.node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .or(self.node.take());
        let stalled = pending.stalled(Instant::now(), &backend.limits());
        Ok((backend.look_pod(&pod, stalled, fits_cache).await, Some(pod)))
    }
}

#[async_trait]
impl Platform for JobCell<'_> {
    fn what(&self) -> &'static str {
        "the cell's container"
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let backend = self.backend;
        let err = |e: KubeError| match &e {
            KubeError::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut => {
                Early::failed("api_unreachable", e.to_string())
            }
            _ => Early::failed("backend", BackendError::from(e).to_string()),
        };
        backend
            .ensure_secret(&cell.task.run_id, &cell.launch.secrets)
            .await
            .map_err(err)?;
        if !self.packs.is_empty() {
            let (made, bytes) = backend
                .ensure_files(&cell.task.run_id, &self.packs)
                .await
                .map_err(err)?;
            let total: u64 = self.packs.iter().map(files::Pack::bytes).sum();
            let line = format!(
                "orch: files: {} ConfigMap(s), {} ({made} new, {}; the rest already in the cluster)",
                self.packs.len(),
                orch_files::human_bytes(total),
                orch_files::human_bytes(bytes)
            );
            self.log(&line);
        }
        let uid = backend.create_job(&self.job).await.map_err(err)?;
        self.job_uid = Some(uid.clone());
        let line = format!(
            "orch: job {} created in namespace {} (image {}, gpu {}{})",
            self.job_name,
            backend.settings.namespace,
            self.image,
            cell.task.gpu,
            if self.ranks.is_empty() {
                String::new()
            } else {
                format!(
                    " per node, {} nodes: an Indexed Job, MASTER_ADDR {}",
                    self.ranks.len() + 1,
                    spec::master_addr(&self.job_name)
                )
            }
        );
        self.log(&line);
        if let Some(svc) = self.service.clone() {
            let svc = spec::owned_by(svc, &self.job_name, &uid);
            let name = svc.metadata.name.clone().unwrap_or_default();
            self.service_made = true;
            backend.create_service(&svc).await.map_err(err)?;
            self.log(&format!(
                "orch: headless service {name} created (the pods' subdomain; owned by the Job)"
            ));
        }
        if !self.ranks.is_empty() {
            return self.wait_ranks(cell).await;
        }
        let limits = backend.limits();
        let mut pending = Pending::new(Instant::now());
        let mut fits_cache = None;
        let mut ticker = tokio::time::interval(backend.poll);
        let mut down = Down::default();
        let mut n = 0;
        loop {
            if down.0.is_some() {
                tokio::time::sleep(backoff(n)).await;
                n += 1;
            } else {
                ticker.tick().await;
                n = 0;
            }
            let (seen, pod) = match self.look(&pending, &mut fits_cache).await {
                Ok(look) => {
                    if down.0.is_some() {
                        self.log("orch: the API server answers again");
                    }
                    down.ok();
                    look
                }
                Err(CallError::Api(e)) => {
                    let e = KubeError::api(format!("list pods of job {}", self.job_name))(e);
                    return Err(err(e));
                }
                Err(CallError::Unreachable(e)) => {
                    if down.0.is_none() {
                        self.log(&format!(
                            "orch: the API server does not answer ({e}); trying again for {}s",
                            backend.api_budget.as_secs()
                        ));
                    }
                    if down.failed(e, backend.api_budget) {
                        let message = unreachable_message(backend.api_budget, &down.last());
                        self.log(&format!("orch: kubernetes api_unreachable: {message}"));
                        return Err(Early::failed("api_unreachable", message));
                    }
                    continue;
                }
            };
            let (line, action) = pending.decide(&seen, Instant::now(), &limits, cell.task.gpu.as_str());
            if let Some(line) = line {
                self.log(&format!("orch: {line}"));
            }
            match action {
                Action::Wait => {}
                Action::Follow => {
                    let (Some(pod), Some(_)) = (pod, self.pod_name.as_ref()) else {
                        continue;
                    };
                    let pname = pod.metadata.name.clone().unwrap_or_default();
                    let (tx, rx) = mpsc::unbounded_channel();
                    self.lines = Some(rx);
                    self.follower = Some(tokio::spawn(follow_log(
                        backend.api(),
                        pname,
                        tx,
                        backend.api_budget,
                    )));
                    return Ok(());
                }
                Action::Fail(status, failure) => {
                    if let Seen::Pod { events, .. } = &seen {
                        for e in events {
                            self.log(&format!("event: {e}"));
                        }
                    }
                    let line = format!("orch: {}", note_line(&failure));
                    self.log(&line);
                    return Err(Early { status, failure });
                }
            }
        }
    }

    async fn next_line(&mut self, _cell: &mut Cell) -> Option<String> {
        enum Next {
            Line(Option<String>),
            RankEnded(Option<u32>),
        }
        loop {
            let watch_ranks = !self.ranks.is_empty() && self.failed_rank.is_none();
            let next = {
                let lines = self.lines.as_mut()?;
                let ranks = &mut self.rank_rx;
                tokio::select! {
                    l = lines.recv() => Next::Line(l),
                    r = ranks.recv(), if watch_ranks => Next::RankEnded(r),
                }
            };
            match next {
                Next::Line(l) => return l,
                // Another rank failed: the Job goes, rank 0's stream ends with its pod.
                Next::RankEnded(Some(rank)) => self.rank_ended(rank).await,
                Next::RankEnded(None) => {}
            }
        }
    }

    async fn stop(&mut self, _cell: &mut Cell, why: Stop, kill: bool) {
        if kill {
            // Past the grace: the pods go without one.
            let names: Vec<String> = self
                .pod_name
                .iter()
                .chain(self.ranks.iter().filter_map(|r| r.pod.as_ref()))
                .cloned()
                .collect();
            for p in names {
                let pods: Api<Pod> = self.backend.api();
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                };
                let _ = tokio::time::timeout(API_TIMEOUT, pods.delete(&p, &dp)).await;
            }
            self.delete().await;
            return;
        }
        let line = match why {
            Stop::Cancelled => format!("orch: cancelled; deleting job {}", self.job_name),
            Stop::Timeout => format!(
                "orch: the cell passed its deadline; deleting job {}",
                self.job_name
            ),
        };
        self.log(&line);
        self.delete().await;
    }

    async fn end(&mut self, cell: &mut Cell, stopped: Option<Stop>) -> PlatformEnd {
        let backend = self.backend;
        self.stopped = stopped;
        let pods: Api<Pod> = backend.api();
        let mut last_seen = None;
        // The API server refused the log (a 403: the Role lacks `get
        // pods/log`): the cell's logs and metrics cannot come home.
        let mut refused: Option<String> = None;
        let stream: Result<(), String> = match self.follower.take() {
            Some(mut f) => match tokio::time::timeout(Duration::from_secs(5), &mut f).await {
                Ok(Ok(followed)) => {
                    last_seen = followed.last;
                    match followed.error {
                        Some(e) if e.unreachable => {
                            self.unreachable = Some(e.message.clone());
                            Err(e.message)
                        }
                        Some(e) => {
                            refused = Some(e.message.clone());
                            Err(e.message)
                        }
                        None => Ok(()),
                    }
                }
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => {
                    f.abort();
                    Err("the log follower did not end".into())
                }
            },
            None => Ok(()),
        };
        // Lines the follower sent that were not taken (a stop by deadline).
        if let (Some(rx), Some(home)) = (self.lines.as_mut(), cell.stream.home()) {
            while let Ok(line) = rx.try_recv() {
                let _ = home.line(&line);
            }
        }
        // The pod now (the API server's absence is waited out for the
        // budget: a pod not seen is not a pod lost); one gone since keeps
        // the disruption it was last seen with.
        let pod = match &self.pod_name {
            Some(p) => match call(backend.api_budget, || pods.get_opt(p)).await {
                Ok(pod) => pod,
                Err(CallError::Unreachable(last)) => {
                    if self.unreachable.is_none() {
                        self.unreachable = Some(unreachable_message(backend.api_budget, &last));
                    }
                    last_seen.clone()
                }
                Err(CallError::Api(e)) => {
                    self.log(&format!("orch: {}", KubeError::api(format!("get pod {p}"))(e)));
                    last_seen.clone()
                }
            },
            None => None,
        };
        let pod = pod.or_else(|| last_seen.filter(|p| watch::disruption(p).is_some()));
        let message = pod.as_ref().and_then(watch::termination_message);
        if let Some(home) = cell.stream.home() {
            // The termination message may hold the log's last lines (frames,
            // even the result) when the agent could not write its summary.
            for line in message.iter().flat_map(|m| m.lines()) {
                let _ = home.line(line);
            }
            // Frames missing (a stream cut mid-way): the whole log once more.
            if home.result().is_none() || home.gaps() {
                if let Some(p) = &self.pod_name {
                    if let Some(text) = read_log(&pods, p).await {
                        for line in text.lines() {
                            let _ = home.line(line);
                        }
                    }
                }
            }
        }
        if let Err(e) = &stream {
            self.log(&format!("orch: {e}"));
        }
        if let Some(n) = pod
            .as_ref()
            .and_then(|p| p.spec.as_ref())
            .and_then(|s| s.node_name.clone())
        {
            self.node = Some(n);
        }
        let (mut status, mut failure) = watch::pod_end(pod.as_ref());
        // Killed (137) with no reason yet: the kubelet may still be writing
        // why (an eviction sets the pod's `Evicted` after its containers are
        // killed). A short look again before calling it the agent's death.
        if failure.kind == "agent_died" && failure.exit_code == Some(137) {
            if let Some(p) = &self.pod_name {
                for _ in 0..10 {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    let Ok(Some(again)) = pods.get_opt(p).await else {
                        break;
                    };
                    let (s2, f2) = watch::pod_end(Some(&again));
                    if f2.kind != "agent_died" {
                        (status, failure) = (s2, f2);
                        break;
                    }
                }
            }
        }
        // Given up on the API server: the pod was not seen to end (it may
        // run on), and that is what the cell says.
        if let Some(why) = self.unreachable.clone() {
            if !pod.as_ref().is_some_and(watch::cell_terminated) && failure.kind != "disrupted" {
                status = Status::Failed;
                failure = Failure::new("api_unreachable", why);
            }
        }
        // The Job's own deadline deletes its pod: the Job says so.
        if stopped.is_none()
            && !matches!(
                failure.kind.as_str(),
                "oom" | "evicted" | "disrupted" | "api_unreachable"
            )
        {
            if let Some(reason) = backend.job_failed_reason(&self.job_name).await {
                if reason == "DeadlineExceeded" {
                    failure = Failure::new(
                        "timeout",
                        "the Job's activeDeadlineSeconds passed and its pod was stopped",
                    );
                }
            }
        }
        let status = if failure.kind == "timeout" {
            Status::Timeout
        } else {
            status
        };
        let recovered = cell.stream.home().and_then(|h| h.result().cloned()).or_else(|| {
            // The agent's own summary: its status and failure.
            message
                .as_deref()
                .and_then(|m| summary_result(&cell.id, m))
                .filter(|_| failure.kind != "oom")
        });
        // The container's exit code is the agent's own only where the
        // container ended by itself.
        let exit_code = failure.exit_code.filter(|_| failure.kind == "agent_died");
        if let Err(e) = &stream {
            if failure.kind != "api_unreachable" {
                failure.message.push_str(&format!(" ({e})"));
            }
        }
        if let Some(msg) = &message {
            let tail: Vec<&str> = msg
                .lines()
                .filter(|l| orch_protocol::ship::Frame::parse(l).is_none())
                .rev()
                .take(5)
                .collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            if failure.kind == "agent_died" || failure.kind == "pod_failed" {
                failure
                    .message
                    .push_str(&format!("; its last output:\n{}", tail.join("\n")));
            }
        }
        let (mut status, mut failure) = (status, failure);
        // Stopped from outside orch with no word from the cluster (the pod
        // deleted, drained or preempted before a look saw its
        // `DisruptionTarget`): the agent says it was told to stop, and
        // orch told it nothing. A disruption too: `--resume` runs it again.
        if stopped.is_none()
            && !matches!(
                failure.kind.as_str(),
                "oom" | "evicted" | "disrupted" | "node_lost" | "timeout"
            )
            && recovered.as_ref().is_some_and(|r| r.status == Status::Cancelled)
        {
            status = Status::Cancelled;
            failure = Failure::new(
                "disrupted",
                "the pod was stopped from outside orch (deleted, drained or preempted; the cluster left no reason on it) while the cell ran; `orch run --resume RUN` runs it again",
            );
        }
        // A log the API server refused: whatever the agent's summary says,
        // its logs and metrics are not home; the permission is the cause
        // (the summary is not taken for a result).
        let recovered = if refused.is_some() { None } else { recovered };
        if let Some(why) = refused {
            status = Status::Failed;
            failure = Failure::new(
                "forbidden",
                format!("{why}; the cell's logs and metrics could not come home\nhint: grant what `deploy/kubernetes/orch-role.yaml` grants (`kubectl auth can-i get pods/log -n {}`)", backend.settings.namespace),
            );
        }
        // The other ranks of a multi-node cell: their logs home too.
        if !self.ranks.is_empty() {
            self.collect_ranks(cell, RANKS_WAIT).await;
        }
        // What the cluster did to the pod (OOM kill, eviction, a
        // disruption, the Job's deadline, a lost node) names the end.
        PlatformEnd::named(
            recovered,
            exit_code,
            (status, failure),
            &["oom", "evicted", "disrupted", "node_lost", "timeout", "forbidden"],
        )
    }

    fn note_line(&self, f: &Failure) -> Option<String> {
        Some(note_line(f))
    }

    async fn finish(&mut self, cell: &mut Cell, result: &mut CellResult) {
        // Every file whole? (A stream that lost frames for good, e.g. to the
        // kubelet's log rotation, leaves a file short of its digest.)
        if self.follower.is_none() && self.lines.is_some() {
            if let Some(home) = cell.stream.home() {
                if !matches!(home.verify(), Ok(true)) {
                    let why = match home.verify() {
                        Err(e) => e,
                        _ => "the agent's file digests never came home".to_string(),
                    };
                    self.log(&format!("orch: the cell's files are incomplete: {why}"));
                    result
                        .info
                        .insert("kubernetes_files_incomplete".into(), why.into());
                }
            }
        }
        // A multi-node cell: every rank into `info.nodes`, and a rank's own
        // failure is the cell's.
        if !self.ranks.is_empty() {
            self.collect_ranks(cell, Duration::from_secs(5)).await;
            let others: Vec<RankEnd> = self.ranks.iter().filter_map(|r| r.end.clone()).collect();
            let before = result.failure.as_ref().map(|f| f.kind.clone());
            nodes::apply(result, self.node.as_deref(), &others, self.stopped.is_some());
            if let Some(f) = result
                .failure
                .as_ref()
                .filter(|f| f.kind == "node_rank_failed" && before.as_deref() != Some("node_rank_failed"))
            {
                let line = format!("orch: {}", note_line(f));
                self.log(&line);
                cell.note(&line);
            }
        }
        if self.job_uid.is_some() {
            self.delete().await;
        }
        if self.service_made {
            result.info.insert(
                "kubernetes_service".into(),
                spec::service_name(&self.job_name).into(),
            );
        }
        let info: [(&str, Option<String>); 5] = [
            (
                "kubernetes_namespace",
                Some(self.backend.settings.namespace.clone()),
            ),
            ("kubernetes_job", Some(self.job_name.clone())),
            ("container_image", Some(self.image.clone())),
            ("kubernetes_pod", self.pod_name.clone()),
            ("kubernetes_node", self.node.clone()),
        ];
        for (k, v) in info {
            if let Some(v) = v {
                result.info.insert(k.into(), v.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_termination_message_summary_is_a_result() {
        let r = summary_result(
            "c",
            r#"{"cell_id":"c","status":"failed","exit_code":3,"signal":null,"kind":"exit_code","message":"exited with 3"}"#,
        )
        .unwrap();
        assert_eq!(r.status, Status::Failed);
        let f = r.failure.unwrap();
        assert_eq!((f.kind.as_str(), f.exit_code), ("exit_code", Some(3)));
        let r = summary_result(
            "c",
            r#"{"cell_id":"c","status":"succeeded","exit_code":null,"kind":null,"message":""}"#,
        )
        .unwrap();
        assert_eq!(r.status, Status::Succeeded);
        assert!(r.failure.is_none());
        assert!(summary_result("c", "Traceback (most recent call last):").is_none());
    }
}
