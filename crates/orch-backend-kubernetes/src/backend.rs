//! `--backend kubernetes`: a Job per cell.
//!
//! For each cell: the run's Secret (once, from the suite's `secrets:`), the
//! cell's Job ([`crate::spec::cell_job`]), then its pod watched every half
//! second until the cell's container starts. A pod that cannot start is a
//! failed cell within seconds, with the cluster's own words: unschedulable
//! (after `unschedulable_grace`, unless an autoscaler is adding a node), an
//! image that cannot be pulled, a container that cannot be created (a
//! missing Secret key), no progress for `max_pending`. Once the container
//! runs, its log (the agent's frame stream) is followed into the shared
//! [`Home`], reconnecting after a dropped stream (frames already home are
//! dropped by number). When the stream ends without a result, the cell's
//! end comes from the pod: the agent's summary in the termination message,
//! `OOMKilled`, eviction, the Job's deadline. The Job is deleted (with its
//! pod) when the cell ends, on cancel and on timeout.

use crate::spec::{self, KubeSettings};
use crate::watch::{self, PodState};
use crate::{KubeError, CELL_CONTAINER, JOB_LABEL};
use async_trait::async_trait;
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as K8sEvent, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use orch_backend::home::Home;
use orch_backend::{Backend, BackendError, CellEvent, CellLaunch};
use orch_protocol::{CellResult, Failure, Phase, Status};
use std::io::Write as _;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch as tokio_watch, Mutex};

/// Longest wait for one API call inside a cell's watch loop (cancel and
/// deadlines are looked at between calls).
const API_TIMEOUT: Duration = Duration::from_secs(15);

pub struct KubernetesBackend {
    client: kube::Client,
    settings: KubeSettings,
    /// Runs whose Secret this process created.
    secrets_made: Mutex<Vec<String>>,
    poll: Duration,
}

impl KubernetesBackend {
    pub fn new(client: kube::Client, settings: KubeSettings) -> KubernetesBackend {
        KubernetesBackend {
            client,
            settings,
            secrets_made: Mutex::new(Vec::new()),
            poll: Duration::from_millis(500),
        }
    }

    pub fn settings(&self) -> &KubeSettings {
        &self.settings
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

    /// Warning events of a pod, and whether an autoscaler is adding a node for it.
    async fn pod_events(&self, pod: &str) -> (Vec<String>, bool) {
        let events: Api<K8sEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        let Ok(Ok(list)) = tokio::time::timeout(API_TIMEOUT, events.list(&lp)).await else {
            return (vec![], false);
        };
        let mut scaling = false;
        let mut lines = Vec::new();
        for e in list.items {
            let reason = e.reason.clone().unwrap_or_default();
            if matches!(
                reason.as_str(),
                "TriggeredScaleUp" | "Nominated" | "NominatedNode"
            ) {
                scaling = true;
            }
            lines.push(format!(
                "{} {}: {}",
                e.type_.unwrap_or_default(),
                reason,
                e.message.unwrap_or_default()
            ));
        }
        (lines, scaling)
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

    /// Wait until a short Job's container has started; its pod's name.
    async fn wait_started(&self, name: &str, uid: &str, limit: Duration) -> Result<String, KubeError> {
        let started = Instant::now();
        let mut unschedulable_since: Option<Instant> = None;
        let fail = |message: String| KubeError::Unavailable {
            message,
            hint: format!(
                "check the PVC, the images and the namespace (`kubectl describe pod -l {JOB_LABEL}={name}`)"
            ),
        };
        loop {
            if started.elapsed() > limit {
                return Err(fail(format!(
                    "the Job `{name}` did not start within {:.0}s",
                    limit.as_secs_f64()
                )));
            }
            tokio::time::sleep(self.poll).await;
            let Some(pod) = self.find_pod(name, uid).await else {
                continue;
            };
            match watch::pod_state(&pod) {
                PodState::Started => return Ok(pod.metadata.name.clone().unwrap_or_default()),
                PodState::Unschedulable { message } => {
                    let since = *unschedulable_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.settings.unschedulable_grace.max(Duration::from_secs(60)) {
                        return Err(fail(format!(
                            "the pod of Job `{name}` cannot be scheduled: {message}"
                        )));
                    }
                }
                PodState::Stuck { message, .. } | PodState::EndedEarly { message, .. } => {
                    return Err(fail(format!("the pod of Job `{name}` did not run: {message}")))
                }
                PodState::Pending { .. } => unschedulable_since = None,
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

    async fn run_cell(
        &self,
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        mut cancel: tokio_watch::Receiver<bool>,
    ) -> Result<CellResult, BackendError> {
        let cell_id = launch.task.cell_id.clone();
        let run_id = launch.task.run_id.clone();
        let dir = launch.cell_dir.clone();
        let launched = Instant::now();
        let mut home = Home::new(&cell_id, &dir, events).map_err(|e| BackendError::Io {
            action: "open the cell folder".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        let Some(image) = launch.image.clone() else {
            return Ok(CellResult::failed(
                &cell_id,
                Status::Failed,
                "no_image",
                "the cell names no `image`; the kubernetes backend needs one (`image: REF`)",
            ));
        };
        self.ensure_secret(&run_id, &launch.secrets).await?;
        // With an existing Secret, every name the suite lists is a key of
        // it (the host need not hold the values); else the values at hand.
        let names: Vec<String> = if self.settings.secret_name.is_some() {
            self.settings.secret_keys.clone()
        } else {
            launch.secrets.iter().map(|(k, _)| k.clone()).collect()
        };
        let job = spec::cell_job(&launch.task, &image, &names, &self.settings);
        let job_name = job.metadata.name.clone().unwrap_or_default();
        let mut klog = std::fs::File::create(dir.join("kubernetes.log")).map_err(|e| BackendError::Io {
            action: "create kubernetes.log".into(),
            source: e,
        })?;
        let job_uid = self.create_job(&job).await?;
        let _ = writeln!(
            klog,
            "orch: job {job_name} created in namespace {} (image {image}, gpu {})",
            self.settings.namespace, launch.task.gpu
        );

        let pods: Api<Pod> = self.api();
        let grace = launch.task.measure.kill_grace_s.max(1.0);
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs_f64(launch.task.measure.timeout_s + grace)
            + self.settings.max_pending
            + Duration::from_secs(60);
        let mut pod_name: Option<String> = None;
        let mut node: Option<String> = None;
        let mut follower: Option<tokio::task::JoinHandle<Result<(), String>>> = None;
        let (line_tx, mut line_rx) = mpsc::unbounded_channel::<String>();
        let mut line_tx = Some(line_tx);
        let mut last_state = String::new();
        let mut unschedulable_since: Option<Instant> = None;
        let mut trouble_since: Option<Instant> = None;
        let mut last_progress = Instant::now();
        let mut fits_cache: Option<Option<bool>> = None;
        let mut by_host: Option<Status> = None;
        let mut stop_by: Option<tokio::time::Instant> = None;
        let mut early: Option<(Status, Failure)> = None;
        let mut result: Option<CellResult> = None;
        let mut ticker = tokio::time::interval(self.poll);

        loop {
            tokio::select! {
                line = line_rx.recv(), if follower.is_some() => match line {
                    Some(line) => {
                        if let Ok(Some(r)) = home.line(&line) {
                            result = Some(r);
                        }
                    }
                    None => break,
                },
                _ = orch_backend::wait_cancel(&mut cancel), if by_host.is_none() => {
                    by_host = Some(Status::Cancelled);
                    let _ = writeln!(klog, "orch: cancelled; deleting job {job_name}");
                    self.delete_job(&job_name).await;
                    if follower.is_none() {
                        early = Some((Status::Cancelled, Failure {
                            kind: "cancelled".into(),
                            message: "cancelled before the cell's container started".into(),
                            exit_code: None,
                            signal: None,
                        }));
                        break;
                    }
                    stop_by = Some(tokio::time::Instant::now() + Duration::from_secs_f64(grace + 30.0));
                }
                _ = tokio::time::sleep_until(deadline), if by_host.is_none() => {
                    by_host = Some(Status::Timeout);
                    let _ = writeln!(klog, "orch: the cell passed its deadline; deleting job {job_name}");
                    self.delete_job(&job_name).await;
                    if follower.is_none() {
                        early = Some((Status::Timeout, Failure {
                            kind: "timeout".into(),
                            message: "the cell's container did not start before the cell's deadline".into(),
                            exit_code: None,
                            signal: None,
                        }));
                        break;
                    }
                    stop_by = Some(tokio::time::Instant::now() + Duration::from_secs_f64(grace + 30.0));
                }
                _ = async { match stop_by { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                    let _ = writeln!(klog, "orch: the pod did not end in time after being deleted");
                    break;
                }
                _ = ticker.tick(), if follower.is_none() => {
                    let Some(pod) = self.find_pod(&job_name, &job_uid).await else {
                        // No pod: the Job controller may be refused one
                        // (quota, Pod Security, a webhook): its events say.
                        if launched.elapsed() > Duration::from_secs(5) {
                            let refused = self.job_refusals(&job_name).await;
                            if let Some(last) = refused.last() {
                                let shown = format!("job refused a pod: {last}");
                                if shown != last_state {
                                    let _ = writeln!(klog, "orch: {shown}");
                                    last_state = shown;
                                    last_progress = Instant::now();
                                }
                                // Quota may free up; other refusals are final.
                                if !last.contains("exceeded quota") || last_progress.elapsed() > self.settings.max_pending {
                                    early = Some((Status::Failed, Failure {
                                        kind: "pod_rejected".into(),
                                        message: format!("the cluster refused to create the cell's pod: {last}"),
                                        exit_code: None,
                                        signal: None,
                                    }));
                                    break;
                                }
                            }
                        }
                        if last_progress.elapsed() > self.settings.max_pending {
                            early = Some((Status::Failed, Failure {
                                kind: "pending_too_long".into(),
                                message: format!("the Job made no pod within {:.0}s", self.settings.max_pending.as_secs_f64()),
                                exit_code: None,
                                signal: None,
                            }));
                            break;
                        }
                        continue;
                    };
                    let pname = pod.metadata.name.clone().unwrap_or_default();
                    if pod_name.is_none() {
                        let _ = writeln!(klog, "orch: pod {pname}");
                    }
                    pod_name = Some(pname.clone());
                    node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).or(node);
                    let nominated = pod.status.as_ref().and_then(|s| s.nominated_node_name.clone());
                    let state = watch::pod_state(&pod);
                    let shown = format!("{state:?}{}", nominated.as_ref().map(|n| format!(" (nominated node {n})")).unwrap_or_default());
                    if shown != last_state {
                        let _ = writeln!(klog, "orch: {shown}");
                        last_state = shown;
                        last_progress = Instant::now();
                    }
                    let stalled = last_progress.elapsed() > self.settings.max_pending;
                    match state {
                        PodState::Started => {
                            let Some(tx) = line_tx.take() else { continue };
                            follower = Some(tokio::spawn(follow_log(pods.clone(), pname, tx)));
                        }
                        PodState::Unschedulable { message } => {
                            let since = *unschedulable_since.get_or_insert_with(Instant::now);
                            let (evs, scaling) = self.pod_events(&pname).await;
                            // Final when no node could ever take it and no
                            // autoscaler is adding one; a busy cluster is a
                            // queue (up to `max_pending`); unknown (nodes not
                            // listable) gets a minute.
                            let waiting = scaling || nominated.is_some();
                            let fits = if waiting { Some(true) } else {
                                if fits_cache.is_none() {
                                    fits_cache = Some(self.fits_some_node(&pod).await);
                                }
                                fits_cache.flatten()
                            };
                            let limit = match fits {
                                Some(false) => self.settings.unschedulable_grace,
                                None => self.settings.unschedulable_grace.max(Duration::from_secs(60)),
                                Some(true) => self.settings.max_pending,
                            };
                            if since.elapsed() >= limit || stalled {
                                for e in &evs {
                                    let _ = writeln!(klog, "event: {e}");
                                }
                                let why = match fits {
                                    Some(false) => "no node of the cluster can ever run it",
                                    None => "it stayed unschedulable",
                                    Some(true) => "it waited for a node its whole `max_pending`",
                                };
                                early = Some((Status::Failed, Failure {
                                    kind: "unschedulable".into(),
                                    message: format!(
                                        "no node can run the pod ({} `{}`; {why}, {:.0}s): {message}",
                                        if launch.task.gpu == "none" { "CPU cell" } else { "GPU" },
                                        launch.task.gpu,
                                        since.elapsed().as_secs_f64()
                                    ),
                                    exit_code: None,
                                    signal: None,
                                }));
                                break;
                            }
                        }
                        PodState::Stuck { kind, message, .. } => {
                            let (evs, _) = self.pod_events(&pname).await;
                            for e in &evs {
                                let _ = writeln!(klog, "event: {e}");
                            }
                            early = Some((Status::Failed, Failure { kind: kind.into(), message, exit_code: None, signal: None }));
                            break;
                        }
                        PodState::EndedEarly { status, kind, message } => {
                            early = Some((Status::Failed, Failure { kind: kind.into(), message, exit_code: None, signal: None }));
                            if status != Status::Failed {
                                if let Some((s, _)) = early.as_mut() {
                                    *s = status;
                                }
                            }
                            break;
                        }
                        PodState::Pending { reason, message } => {
                            unschedulable_since = None;
                            // Errors the kubelet retries: failed when they last.
                            let (limit, kind) = match reason.as_str() {
                                "ErrImagePull" | "ImagePullBackOff" | "RegistryUnavailable" | "ImageInspectError" => {
                                    (Some(Duration::from_secs(90)), "image_pull_failed")
                                }
                                "CreateContainerError" | "RunContainerError" => (Some(Duration::from_secs(30)), "container_config_error"),
                                _ => (None, "pending_too_long"),
                            };
                            match limit {
                                Some(limit) => {
                                    let since = *trouble_since.get_or_insert_with(Instant::now);
                                    if since.elapsed() > limit {
                                        early = Some((Status::Failed, Failure {
                                            kind: kind.into(),
                                            message: format!("{reason} for {:.0}s: {message}", limit.as_secs_f64()),
                                            exit_code: None,
                                            signal: None,
                                        }));
                                        break;
                                    }
                                }
                                None => trouble_since = None,
                            }
                            if stalled {
                                let (evs, _) = self.pod_events(&pname).await;
                                for e in &evs {
                                    let _ = writeln!(klog, "event: {e}");
                                }
                                early = Some((Status::Failed, Failure {
                                    kind: "pending_too_long".into(),
                                    message: format!(
                                        "the pod made no progress for {:.0}s (still {reason}{}){}",
                                        self.settings.max_pending.as_secs_f64(),
                                        if message.is_empty() { String::new() } else { format!(": {message}") },
                                        evs.last().map(|e| format!("; last event: {e}")).unwrap_or_default()
                                    ),
                                    exit_code: None,
                                    signal: None,
                                }));
                                break;
                            }
                        }
                    }
                }
            }
        }
        // Lines the follower sent that the loop did not take (a stop by deadline).
        while let Ok(line) = line_rx.try_recv() {
            if let Ok(Some(r)) = home.line(&line) {
                result = Some(r);
            }
        }

        let mut info: Vec<(&str, serde_json::Value)> = vec![
            ("kubernetes_namespace", self.settings.namespace.clone().into()),
            ("kubernetes_job", job_name.clone().into()),
            ("container_image", image.clone().into()),
        ];
        if let Some(p) = &pod_name {
            info.push(("kubernetes_pod", p.clone().into()));
        }

        let mut result = if let Some((status, failure)) = early {
            // The container never ran: the Job goes now.
            self.delete_job(&job_name).await;
            if let Some(f) = follower.take() {
                f.abort();
            }
            orch_backend::note_agent_log(&dir, &note_line(&failure));
            let _ = writeln!(klog, "orch: {}", note_line(&failure));
            let mut r = home.finish_without_result(&cell_id, status, failure);
            r.timings
                .insert(Phase::Provision, launched.elapsed().as_secs_f64());
            r
        } else {
            let stream = match follower.take() {
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
            let pod = match &pod_name {
                Some(p) => tokio::time::timeout(API_TIMEOUT, pods.get_opt(p))
                    .await
                    .ok()
                    .and_then(|r| r.ok())
                    .flatten(),
                None => None,
            };
            // The termination message may hold the log's last lines (frames,
            // even the result) when the agent could not write its summary.
            if let Some(msg) = pod.as_ref().and_then(watch::termination_message) {
                for line in msg.lines() {
                    if let Ok(Some(r)) = home.line(line) {
                        result = Some(r);
                    }
                }
            }
            // Frames missing (a stream cut mid-way): the whole log once more.
            if result.is_none() || home.gaps() {
                if let Some(p) = &pod_name {
                    if let Some(text) = read_log(&pods, p).await {
                        for line in text.lines() {
                            if let Ok(Some(r)) = home.line(line) {
                                result = Some(r);
                            }
                        }
                    }
                }
            }
            if let Err(e) = &stream {
                let _ = writeln!(klog, "orch: {e}");
            }
            let mut end = watch::pod_end(pod.as_ref());
            // The Job's own deadline deletes its pod: the Job says so.
            if result.is_none() || !matches!(end.1.kind.as_str(), "oom" | "evicted") {
                if let Some(reason) = self.job_failed_reason(&job_name).await {
                    if reason == "DeadlineExceeded" && by_host.is_none() {
                        end = (
                            Status::Timeout,
                            Failure {
                                kind: "timeout".into(),
                                message: "the Job's activeDeadlineSeconds passed and its pod was stopped"
                                    .into(),
                                exit_code: None,
                                signal: None,
                            },
                        );
                    }
                }
            }
            let summary = pod
                .as_ref()
                .and_then(watch::termination_message)
                .and_then(|m| summary_result(&cell_id, &m))
                .filter(|_| end.0 != Status::Oom);
            let mut result = match (result, by_host, summary) {
                (Some(r), _, _) => r,
                (None, Some(Status::Cancelled), _) => home.finish_without_result(
                    &cell_id,
                    Status::Cancelled,
                    Failure {
                        kind: "cancelled".into(),
                        message: "the cell's Job was deleted by orch (cancel)".into(),
                        exit_code: None,
                        signal: None,
                    },
                ),
                (None, _, Some(s)) => {
                    // The agent's own summary: its status and failure.
                    let failure = s.failure.clone().unwrap_or(Failure {
                        kind: "stream_lost".into(),
                        message: "the log stream did not bring the agent's result".into(),
                        exit_code: None,
                        signal: None,
                    });
                    let mut r = home.finish_without_result(&cell_id, s.status, failure);
                    if s.failure.is_none() {
                        r.failure = None;
                    }
                    r.info.extend(s.info);
                    r
                }
                (None, Some(Status::Timeout), None) => home.finish_without_result(
                    &cell_id,
                    Status::Timeout,
                    Failure {
                        kind: "timeout".into(),
                        message: "the cell passed its deadline and its Job was deleted".into(),
                        exit_code: None,
                        signal: None,
                    },
                ),
                (None, _, None) => {
                    let (status, mut failure) = end.clone();
                    // The container's exit code names the agent's own crash
                    // (136: SIGFPE); the note goes into agent.log here.
                    // Only a signal the agent died of (not SIGKILL: a kill
                    // from outside; not 126-128: it never started) is its crash.
                    let crashed = failure.kind == "agent_died"
                        && orch_backend::crash_signal(failure.exit_code).is_some();
                    if crashed {
                        let platform = failure.message.clone();
                        failure =
                            orch_backend::agent_crash(&dir, "the cell's container", failure.exit_code, None);
                        failure.message.push_str(&format!(" ({platform})"));
                    }
                    if let Err(e) = &stream {
                        failure.message.push_str(&format!(" ({e})"));
                    }
                    if let Some(msg) = pod.as_ref().and_then(watch::termination_message) {
                        let tail: Vec<&str> = msg
                            .lines()
                            .filter(|l| orch_protocol::ship::Frame::parse(l).is_none())
                            .rev()
                            .take(5)
                            .collect();
                        let tail: Vec<&str> = tail.into_iter().rev().collect();
                        failure
                            .message
                            .push_str(&format!("; its last output:\n{}", tail.join("\n")));
                    }
                    if !crashed {
                        orch_backend::note_agent_log(&dir, &note_line(&failure));
                    }
                    home.finish_without_result(&cell_id, status, failure)
                }
            };
            // What the cluster did to the pod (OOM kill, eviction, the Job's
            // deadline, a lost node) names the end, whatever the agent managed
            // to say while it was being stopped.
            let cluster_ended_it = match end.1.kind.as_str() {
                "oom" => !matches!(result.status, Status::Succeeded | Status::Cancelled),
                "evicted" | "node_lost" | "timeout" => {
                    by_host.is_none() && result.status != Status::Succeeded
                }
                _ => false,
            };
            if cluster_ended_it
                && result.failure.as_ref().map(|f| f.kind.as_str()) != Some(end.1.kind.as_str())
            {
                orch_backend::note_agent_log(&dir, &note_line(&end.1));
                result.status = end.0;
                result.failure = Some(end.1.clone());
            }
            if let Some(n) = pod
                .as_ref()
                .and_then(|p| p.spec.as_ref())
                .and_then(|s| s.node_name.clone())
            {
                node = Some(n);
            }
            // Every file whole? (A stream that lost frames for good, e.g. to
            // the kubelet's log rotation, leaves a file short of its digest.)
            match home.verify() {
                Ok(true) => {}
                Ok(false) | Err(_) => {
                    let why = match home.verify() {
                        Err(e) => e,
                        _ => "the agent's file digests never came home".to_string(),
                    };
                    let _ = writeln!(klog, "orch: the cell's files are incomplete: {why}");
                    result
                        .info
                        .insert("kubernetes_files_incomplete".into(), why.into());
                }
            }
            self.delete_job(&job_name).await;
            result
        };
        if let Some(n) = node {
            info.push(("kubernetes_node", n.into()));
        }
        for (k, v) in info {
            result.info.insert(k.into(), v);
        }
        result
            .timings
            .entry(Phase::Provision)
            .or_insert(launched.elapsed().as_secs_f64());
        Ok(result)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let lp = ListParams::default().labels(&spec::run_selector(run_id));
        let jobs: Api<Job> = self.api();
        let pods: Api<Pod> = self.api();
        let secrets: Api<Secret> = self.api();
        // Every kind is tried (the Secret first: it holds values), the
        // first error is returned after.
        let s = secrets
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
        s.map_err(KubeError::api("delete the run's secret"))?;
        j.map_err(KubeError::api("delete the run's jobs"))?;
        p.map_err(KubeError::api("delete the run's pods"))?;
        Ok(())
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
