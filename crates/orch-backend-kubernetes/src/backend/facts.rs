//! What the cluster says of a cell's end, gathered once its log stream
//! ended: the log follower's end (refused, the API server gone), lines it
//! sent that were not taken, the pod now (or as last seen, when a
//! disruption was on it), its termination message and, where frames are
//! missing, its whole log fed home; a second look at a container killed
//! (137) with no reason yet; the Job's condition where it could name the
//! end. The pod and the Job come from the run's watch where there is one.
//! All IO; what it means is [`crate::end::decide`]'s.

use super::api::{call, unreachable_message, CallError};
use super::follow::read_log;
use super::JobCell;
use crate::end::{Facts, PodEnd, PodFacts};
use crate::{watch, KubeError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use orch_backend::lifecycle::{Cell, Stop};
use std::time::Duration;

impl JobCell<'_> {
    /// The facts of the cell's end. `stopped`: orch stopped the cell (its
    /// Job deleted: the Job is not asked).
    pub(super) async fn facts(&mut self, cell: &mut Cell, stopped: Option<Stop>) -> Facts {
        let backend = self.backend;
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
        let w = self.watch.clone();
        let from_watch = match (&self.pod_name, &w) {
            (Some(p), Some(w)) => w.pod(p),
            _ => None,
        };
        let pod = match &self.pod_name {
            Some(_) if from_watch.is_some() => from_watch.flatten(),
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
        // Billing starts when the kubelet started the pod's containers.
        if let Some(at) = pod.as_ref().and_then(watch::container_started) {
            cell.container_started(at);
        }
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
        let mut pod = pod.as_ref().map(PodFacts::of);
        // Killed (137) with no reason yet: the kubelet may still be writing
        // why (an eviction sets the pod's `Evicted` after its containers are
        // killed). A short look again before calling it the agent's death.
        if matches!(PodEnd::of(pod.as_ref()), PodEnd::Exited { exit_code: 137, .. }) {
            if let (Some(p), Some(w)) = (&self.pod_name, &w) {
                let exited = |p: Option<&Pod>| {
                    let f = p.map(PodFacts::of);
                    matches!(PodEnd::of(f.as_ref()), PodEnd::Exited { .. })
                };
                if let Some(Some(again)) = w.wait_pod(p, Duration::from_secs(2), |p| !exited(p)).await {
                    if !exited(Some(&again)) {
                        pod = Some(PodFacts::of(&again));
                    }
                }
            } else if let Some(p) = &self.pod_name {
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let Ok(Some(again)) = pods.get_opt(p).await else {
                        break;
                    };
                    let again = PodFacts::of(&again);
                    if !matches!(PodEnd::of(Some(&again)), PodEnd::Exited { .. }) {
                        pod = Some(again);
                        break;
                    }
                }
            }
        }
        let mut facts = Facts {
            cell_id: cell.id.clone(),
            namespace: backend.settings.namespace.clone(),
            pod,
            result: cell.stream.home().and_then(|h| h.result().cloned()),
            stream_error: stream.err(),
            log_refused: refused,
            unreachable: self.unreachable.clone(),
            job_failed: None,
        };
        if stopped.is_none() && facts.asks_job() {
            facts.job_failed = backend.job_failed_reason(w.as_deref(), &self.job_name).await;
        }
        facts
    }
}
