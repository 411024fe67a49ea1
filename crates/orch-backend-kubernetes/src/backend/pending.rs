//! Until the cell's container runs: looks at the Job and its pod (its
//! state, and while it is stuck or unschedulable its events, the
//! autoscaler's word, whether any node could ever run it) in the run's
//! watch on each of its changes (or, without one, every half second), each judged by
//! [`Pending::decide`] into waiting, following the log, or a failed cell in
//! the cluster's words.

use super::api::{backoff, transient, unreachable_message, CallError, Down};
use super::cell::early;
use super::follow::follow_log;
use super::informer::{event_lines, event_time, RunWatch};
use super::{note_line, JobCell, KubernetesBackend, API_TIMEOUT, WATCH_TICK};
use crate::watch::{self, Action, Autoscaler, Pending, PodState, Seen};
use crate::{KubeError, JOB_LABEL};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event as K8sEvent, Pod};
use kube::api::{Api, ListParams};
use orch_backend::lifecycle::{Cell, Early};
use orch_protocol::FailureKind;
use std::time::Instant;
use tokio::sync::mpsc;

impl KubernetesBackend {
    /// The Job's pod: made by this Job (its uid; `""`: any), not being
    /// deleted. One call, no retry: `Err(Unreachable)` is one failed
    /// attempt (the caller counts them against the budget).
    pub(super) async fn find_pod(&self, job: &str, uid: &str) -> Result<Option<Pod>, CallError> {
        Ok(self.find_pods(job, uid).await?.into_iter().next())
    }

    /// Every pod of the Job (its uid; `""`: any) not being deleted. One
    /// call, as [`Self::find_pod`].
    pub(super) async fn find_pods(&self, job: &str, uid: &str) -> Result<Vec<Pod>, CallError> {
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

    /// `FailedCreate` events of a Job (quota, Pod Security, a webhook):
    /// from the run's watch, else listed.
    pub(super) async fn job_refusals(&self, w: Option<&RunWatch>, job: &str) -> Vec<String> {
        let items = match w {
            Some(w) => w.events_of(job, "Job"),
            None => {
                let events: Api<K8sEvent> = self.api();
                let lp = ListParams::default()
                    .fields(&format!("involvedObject.kind=Job,involvedObject.name={job}"));
                let Ok(Ok(list)) = tokio::time::timeout(API_TIMEOUT, events.list(&lp)).await else {
                    return vec![];
                };
                list.items
            }
        };
        items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("FailedCreate"))
            .filter_map(|e| e.message)
            .collect()
    }

    /// The Job's `Failed` condition reason (`DeadlineExceeded`, ...): from
    /// the run's watch, else asked.
    pub(super) async fn job_failed_reason(&self, w: Option<&RunWatch>, job: &str) -> Option<String> {
        let j = match w {
            Some(w) => w.job(job)?,
            None => {
                let jobs: Api<Job> = self.api();
                tokio::time::timeout(API_TIMEOUT, jobs.get_opt(job))
                    .await
                    .ok()?
                    .ok()??
            }
        };
        j.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Failed" && c.status == "True")
            .and_then(|c| c.reason)
    }

    /// The events of a pod (`TYPE REASON: MESSAGE`, oldest first), and what
    /// an autoscaler said about it ([`Autoscaler`]): from the run's watch,
    /// else listed.
    async fn pod_events(&self, w: Option<&RunWatch>, pod: &str) -> (Vec<String>, Autoscaler) {
        if let Some(w) = w {
            return event_lines(w.events_of(pod, ""));
        }
        let events: Api<K8sEvent> = self.api();
        let lp = ListParams::default().fields(&format!("involvedObject.name={pod}"));
        let Ok(Ok(list)) = tokio::time::timeout(API_TIMEOUT, events.list(&lp)).await else {
            return (vec![], Autoscaler::Silent);
        };
        let mut items = list.items;
        // Oldest first: the autoscaler's latest word is its verdict.
        items.sort_by_key(event_time);
        event_lines(items)
    }

    /// One look at a Job's pod for [`Pending::decide`]: its state, and
    /// while it is unschedulable its events (the autoscaler's word) and
    /// whether any node could ever run it (asked once, `fits_cache`).
    pub(super) async fn look_pod(
        &self,
        w: Option<&RunWatch>,
        pod: &Pod,
        stalled: bool,
        fits_cache: &mut Option<Option<bool>>,
    ) -> Seen {
        self.look_pods(w, pod, 1, stalled, fits_cache).await
    }

    /// [`Self::look_pod`] for one of `count` pods that must all run at once
    /// (a multi-node cell's ranks): it could ever run only if the nodes could
    /// hold all `count`.
    pub(super) async fn look_pods(
        &self,
        w: Option<&RunWatch>,
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
            self.pod_events(w, &pname).await
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

impl JobCell<'_> {
    /// One look at the Job's pod.
    async fn look(
        &mut self,
        pending: &Pending,
        fits_cache: &mut Option<Option<bool>>,
    ) -> Result<(Seen, Option<Pod>), CallError> {
        let backend = self.backend;
        let uid = self.job_uid.clone().unwrap_or_default();
        let w = self.watch.clone();
        let found = match &w {
            Some(w) => w.pods_of(&self.job_name, &uid).into_iter().next(),
            None => backend.find_pod(&self.job_name, &uid).await?,
        };
        let Some(pod) = found else {
            let refusals = if pending.stalled(Instant::now(), &backend.limits()) || self.pod_name.is_none() {
                backend.job_refusals(w.as_deref(), &self.job_name).await
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
        Ok((
            backend.look_pod(w.as_deref(), &pod, stalled, fits_cache).await,
            Some(pod),
        ))
    }

    /// Until the pod of a one-node cell runs (its log then followed), or
    /// can never run.
    pub(super) async fn wait_pod(&mut self, cell: &Cell) -> Result<(), Early> {
        let backend = self.backend;
        let limits = backend.limits();
        let mut pending = Pending::new(Instant::now());
        let mut fits_cache = None;
        let mut ticker = tokio::time::interval(backend.poll);
        let mut down = Down::default();
        let mut n = 0;
        let mut changed = self.watch.as_ref().map(|w| w.changed());
        let mut first = true;
        loop {
            if down.0.is_some() {
                tokio::time::sleep(backoff(n)).await;
                n += 1;
            } else if let Some(rx) = changed.as_mut() {
                // The run's watch: looked at on every change (and every
                // WATCH_TICK, for the waits that are timed).
                if !first {
                    let _ = tokio::time::timeout(WATCH_TICK, rx.changed()).await;
                }
                rx.borrow_and_update();
            } else {
                ticker.tick().await;
                n = 0;
            }
            first = false;
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
                    return Err(early(e));
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
                        return Err(Early::failed(FailureKind::ApiUnreachable, message));
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
                        self.watch.clone(),
                        backend.log_slots.clone(),
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
}
