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

use crate::files;
use crate::spec::{self, KubeSettings};
use crate::watch::{self, Action, Autoscaler, Pending, PendingLimits, PodState, Seen};
use crate::{KubeError, CELL_CONTAINER, JOB_LABEL};
use async_trait::async_trait;
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event as K8sEvent, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use orch_backend::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_protocol::{CellResult, Failure, Status};
use std::io::Write as _;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};

/// Longest wait for one API call inside a cell's watch loop (cancel and
/// deadlines are looked at between calls).
const API_TIMEOUT: Duration = Duration::from_secs(15);

pub struct KubernetesBackend {
    client: kube::Client,
    settings: KubeSettings,
    /// Runs whose Secret this process created.
    secrets_made: Mutex<Vec<String>>,
    /// ConfigMaps of files this process created or found: (run, name).
    files_made: Mutex<std::collections::HashSet<(String, String)>>,
    poll: Duration,
}

impl KubernetesBackend {
    pub fn new(client: kube::Client, settings: KubeSettings) -> KubernetesBackend {
        KubernetesBackend {
            client,
            settings,
            secrets_made: Mutex::new(Vec::new()),
            files_made: Mutex::new(Default::default()),
            poll: Duration::from_millis(500),
        }
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
        match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Left by an earlier invocation of this run: made again from
                // this host's values.
                secrets
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map_err(KubeError::api(format!("delete secret {name}")))?;
                secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map_err(KubeError::api(format!("create secret {name}")))?;
            }
            Err(e) => return Err(KubeError::api(format!("create secret {name}"))(e)),
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
            match api.create(&PostParams::default(), &cm).await {
                Ok(_) => {
                    new.0 += 1;
                    new.1 += pack.bytes();
                }
                // Made by another cell of the run, or an earlier invocation of it.
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(KubeError::api(format!("create configmap {}", pack.name))(e)),
            }
            self.files_made.lock().await.insert(key);
        }
        Ok(new)
    }

    /// Create the Job and return its uid. One of the same name left by an
    /// earlier invocation of the run is deleted first, with its pods
    /// (foreground), so that its pod is never taken for the new one's.
    async fn create_job(&self, job: &Job) -> Result<String, KubeError> {
        let jobs: Api<Job> = self.api();
        let name = job.metadata.name.clone().unwrap_or_default();
        let started = Instant::now();
        loop {
            match jobs.create(&PostParams::default(), job).await {
                Ok(j) => return Ok(j.metadata.uid.unwrap_or_default()),
                Err(kube::Error::Api(s)) if s.code == 409 && started.elapsed() < Duration::from_secs(120) => {
                    let _ = jobs.delete(&name, &DeleteParams::foreground()).await;
                    while started.elapsed() < Duration::from_secs(120) {
                        if let Ok(None) = jobs.get_opt(&name).await {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
                Err(e) => return Err(KubeError::api(format!("create job {name}"))(e)),
            }
        }
    }

    async fn delete_job(&self, name: &str) {
        let jobs: Api<Job> = self.api();
        let _ = tokio::time::timeout(API_TIMEOUT, jobs.delete(name, &DeleteParams::background())).await;
    }

    /// The Job's pod: made by this Job (its uid; `""`: any), not being deleted.
    async fn find_pod(&self, job: &str, uid: &str) -> Option<Pod> {
        let pods: Api<Pod> = self.api();
        let lp = ListParams::default().labels(&format!("{JOB_LABEL}={job}"));
        let list = tokio::time::timeout(API_TIMEOUT, pods.list(&lp))
            .await
            .ok()?
            .ok()?;
        list.items.into_iter().find(|p| {
            p.metadata.deletion_timestamp.is_none()
                && (uid.is_empty()
                    || p.metadata
                        .owner_references
                        .as_ref()
                        .is_some_and(|o| o.iter().any(|r| r.uid == uid)))
        })
    }

    /// Could any node ever run this pod? `None`: the nodes cannot be listed
    /// (a role without `list nodes`).
    async fn fits_some_node(&self, pod: &Pod) -> Option<bool> {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let list = tokio::time::timeout(API_TIMEOUT, nodes.list(&ListParams::default()))
            .await
            .ok()?
            .ok()?;
        Some(watch::fits_some_node(pod, &list.items))
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
                *fits_cache = Some(self.fits_some_node(pod).await);
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
            secrets
                .create(
                    &PostParams::default(),
                    &spec::plain_secret(&name, secret_values, &self.settings),
                )
                .await
                .map_err(KubeError::api(format!("create secret {name}")))?;
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
            let _ = secrets.delete(&name, &DeleteParams::default()).await;
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
            let follower = tokio::spawn(follow_log(pods.clone(), pod.clone(), tx));
            let mut log = String::new();
            while let Some(line) = rx.recv().await {
                on_line(&line);
                log.push_str(&line);
                log.push('\n');
            }
            let _ = follower.await;
            let code = tokio::time::timeout(API_TIMEOUT, pods.get_opt(&pod))
                .await
                .ok()
                .and_then(|r| r.ok())
                .flatten()
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
        self.delete_job(&name).await;
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
        loop {
            if started.elapsed() > limit {
                return Err(fail(format!(
                    "the Job `{name}` did not start within {:.0}s",
                    limit.as_secs_f64()
                )));
            }
            tokio::time::sleep(self.poll).await;
            let now = Instant::now();
            let (seen, pod_name) = match self.find_pod(name, uid).await {
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

/// Follow the cell container's log into `tx`, line by line, reconnecting
/// after a dropped stream (the whole log again: frames already home are
/// dropped by number) until the container has ended or the pod is gone.
async fn follow_log(pods: Api<Pod>, pod: String, tx: mpsc::UnboundedSender<String>) -> Result<(), String> {
    let mut failures = 0u32;
    loop {
        let lp = LogParams {
            container: Some(CELL_CONTAINER.into()),
            follow: true,
            ..Default::default()
        };
        match pods.log_stream(&pod, &lp).await {
            Ok(stream) => {
                let mut lines = stream.lines();
                while let Some(line) = lines.next().await {
                    match line {
                        Ok(l) => {
                            failures = 0;
                            if tx.send(l).is_err() {
                                return Ok(());
                            }
                        }
                        Err(_) => break,
                    }
                }
            }
            Err(e) => {
                failures += 1;
                if failures > 40 {
                    return Err(format!("the pod log could not be read: {e}"));
                }
            }
        }
        match pods.get_opt(&pod).await {
            Ok(Some(p)) if watch::cell_terminated(&p) => return Ok(()),
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
            Err(e) => {
                failures += 1;
                if failures > 40 {
                    return Err(format!("the pod could not be read: {e}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
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
        let mut task = cell.task.clone();
        let mut packs = Vec::new();
        let shipment = cell.launch.files.clone().filter(|s| !s.is_empty());
        if let Some(shipment) = &shipment {
            files::check_size(&cell.id, shipment)?;
            shipment.apply(&mut task, orch_files::CELL_ROOT, orch_files::CELL_BLOBS);
            packs = files::packs(&task.run_id, &shipment.blobs());
        }
        let mut job = spec::cell_job(&task, &image, &names, &self.settings);
        // A task too long for one argument travels as a file.
        let task_json = cell.dir.join("task.json");
        let big = orch_backend::home::task_b64(&task).len() > files::TASK_ARG_BYTES;
        if big {
            let json = serde_json::to_vec_pretty(&task).map_err(|e| BackendError::Io {
                action: "serialise the task".into(),
                source: std::io::Error::other(e),
            })?;
            std::fs::write(&task_json, json).map_err(|e| BackendError::Io {
                action: format!("write `{}`", task_json.display()),
                source: e,
            })?;
            packs.extend(files::task_file(&mut job, &task.run_id, &task_json)?);
        }
        if shipment.is_some() || big {
            files::mount(&mut job, &packs);
        }
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
            packs,
        };
        Ok(lifecycle::drive(&mut platform, cell, cancel).await)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let lp = ListParams::default().labels(&spec::run_selector(run_id));
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let secrets: Api<Secret> = self.api();
        let config_maps: Api<ConfigMap> = self.api();
        // Every kind is tried (the Secret first: it holds values), the
        // first error is returned after.
        let s = secrets
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .map(|_| ());
        let f = config_maps
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .map(|_| ());
        let j = jobs
            .delete_collection(&DeleteParams::background(), &lp)
            .await
            .map(|_| ());
        let p = pods
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .map(|_| ());
        // Wait until the pods are gone (their grace period), at most a minute.
        for _ in 0..120 {
            match pods.list(&lp).await {
                Ok(l) if l.items.is_empty() => break,
                Ok(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                Err(_) => break,
            }
        }
        self.secrets_made.lock().await.retain(|r| r != run_id);
        self.files_made.lock().await.retain(|(r, _)| r != run_id);
        s.map_err(KubeError::api("delete the run's secret"))?;
        f.map_err(KubeError::api("delete the run's configmaps"))?;
        j.map_err(KubeError::api("delete the run's jobs"))?;
        p.map_err(KubeError::api("delete the run's pods"))?;
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
    follower: Option<tokio::task::JoinHandle<Result<(), String>>>,
    lines: Option<mpsc::UnboundedReceiver<String>>,
    deleted: bool,
    /// The ConfigMaps of the cell's files.
    packs: Vec<files::Pack>,
}

impl JobCell<'_> {
    fn log(&mut self, line: &str) {
        let _ = writeln!(self.klog, "{line}");
    }

    async fn delete(&mut self) {
        if !self.deleted {
            self.deleted = true;
            self.backend.delete_job(&self.job_name).await;
        }
    }

    /// One look at the Job's pod.
    async fn look(
        &mut self,
        pending: &Pending,
        fits_cache: &mut Option<Option<bool>>,
    ) -> (Seen, Option<Pod>) {
        let backend = self.backend;
        let uid = self.job_uid.clone().unwrap_or_default();
        let Some(pod) = backend.find_pod(&self.job_name, &uid).await else {
            let refusals = if pending.stalled(Instant::now(), &backend.limits()) || self.pod_name.is_none() {
                backend.job_refusals(&self.job_name).await
            } else {
                vec![]
            };
            return (Seen::NoPod { refusals }, None);
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
        (backend.look_pod(&pod, stalled, fits_cache).await, Some(pod))
    }
}

#[async_trait]
impl Platform for JobCell<'_> {
    fn what(&self) -> &'static str {
        "the cell's container"
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let backend = self.backend;
        let err = |e: KubeError| Early::failed("backend", BackendError::from(e).to_string());
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
        self.job_uid = Some(backend.create_job(&self.job).await.map_err(err)?);
        let line = format!(
            "orch: job {} created in namespace {} (image {}, gpu {})",
            self.job_name, backend.settings.namespace, self.image, cell.task.gpu
        );
        self.log(&line);
        let limits = backend.limits();
        let mut pending = Pending::new(Instant::now());
        let mut fits_cache = None;
        let mut ticker = tokio::time::interval(backend.poll);
        loop {
            ticker.tick().await;
            let (seen, pod) = self.look(&pending, &mut fits_cache).await;
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
                    self.follower = Some(tokio::spawn(follow_log(backend.api(), pname, tx)));
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
        self.lines.as_mut()?.recv().await
    }

    async fn stop(&mut self, _cell: &mut Cell, why: Stop, kill: bool) {
        if kill {
            // Past the grace: the pod goes without one.
            if let Some(p) = self.pod_name.clone() {
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
        let pods: Api<Pod> = backend.api();
        let stream = match self.follower.take() {
            Some(mut f) => match tokio::time::timeout(Duration::from_secs(5), &mut f).await {
                Ok(Ok(r)) => r,
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
        let pod = match &self.pod_name {
            Some(p) => tokio::time::timeout(API_TIMEOUT, pods.get_opt(p))
                .await
                .ok()
                .and_then(|r| r.ok())
                .flatten(),
            None => None,
        };
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
        let (status, mut failure) = watch::pod_end(pod.as_ref());
        // The Job's own deadline deletes its pod: the Job says so.
        if stopped.is_none() && !matches!(failure.kind.as_str(), "oom" | "evicted") {
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
            failure.message.push_str(&format!(" ({e})"));
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
        // What the cluster did to the pod (OOM kill, eviction, the Job's
        // deadline, a lost node) names the end.
        PlatformEnd::named(
            recovered,
            exit_code,
            (status, failure),
            &["oom", "evicted", "node_lost", "timeout"],
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
        if self.job_uid.is_some() {
            self.delete().await;
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
