//! Short Jobs of one pod: the probes of `orch plan`/preflight (the weights
//! PVC) and `orch setup --backend kubernetes`. The pod is waited for as a
//! cell's is ([`crate::watch::Pending::decide`]), its log followed to the
//! caller, the Job deleted after. The pod and its events are seen in a
//! short watch of their own (a [`RunWatch`] of the pod's Job label, opened
//! before the create); where the Role refuses it, or its lists do not come
//! in time, the pod is polled every half second as before.

use super::api::{backoff, call, CallError, Down};
use super::follow::follow_log;
use super::informer::RunWatch;
use super::{KubernetesBackend, API_TIMEOUT, WATCH_TICK};
use crate::watch::{Action, Pending, Seen};
use crate::{spec, KubeError, CELL_CONTAINER, JOB_LABEL};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use orch_protocol::FailureKind;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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
        let w = self.short_watch(&name).await;
        let uid = self.create_job(job).await?;
        let r = async {
            let pod = self.wait_started(&name, &uid, limit, w.as_deref()).await?;
            let pods: Api<Pod> = self.api();
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            let follower = tokio::spawn(follow_log(
                pods.clone(),
                pod.clone(),
                tx,
                self.api_budget,
                w.clone(),
                self.log_slots.clone(),
            ));
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
            // The pod as the watch last saw it (the follow ended once it
            // saw the container end), else asked.
            let last = match (&w, followed.last) {
                (Some(_), Some(p)) if crate::watch::cell_terminated(&p) => Some(p),
                (_, last) => call(self.api_budget, || pods.get_opt(&pod))
                    .await
                    .ok()
                    .flatten()
                    .or(last),
            };
            let code = last
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

    /// The short Job's own watch (its pod and the events, not Jobs), or
    /// `None` where the Role refuses it or its lists do not come within
    /// [`API_TIMEOUT`]: the pod is polled then.
    async fn short_watch(&self, name: &str) -> Option<Arc<RunWatch>> {
        let w = RunWatch::start_pods(
            self.client.clone(),
            &self.settings.namespace,
            format!("{JOB_LABEL}={name}"),
        );
        w.ready(API_TIMEOUT).await.then_some(w)
    }

    /// Wait until a short Job's container has started; its pod's name. The
    /// pod is judged as a cell's is ([`Pending::decide`]: the autoscaler's
    /// word on an unschedulable pod, image pulls, `max_pending`), looked at
    /// in the short Job's watch `w` on each of its changes, else polled.
    async fn wait_started(
        &self,
        name: &str,
        uid: &str,
        limit: Duration,
        w: Option<&RunWatch>,
    ) -> Result<String, KubeError> {
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
        let mut changed = w.map(RunWatch::changed);
        let mut first = true;
        loop {
            if started.elapsed() > limit {
                return Err(fail(format!(
                    "the Job `{name}` did not start within {:.0}s",
                    limit.as_secs_f64()
                )));
            }
            match changed.as_mut() {
                // On every change of the watch (and every WATCH_TICK, for the timed waits).
                Some(rx) => {
                    if !first {
                        let _ = tokio::time::timeout(WATCH_TICK, rx.changed()).await;
                    }
                    rx.borrow_and_update();
                }
                None => tokio::time::sleep(if down.0.is_some() { backoff(n) } else { self.poll }).await,
            }
            first = false;
            let now = Instant::now();
            let looked = match w {
                Some(w) => Ok(w.pods_of(name, uid).into_iter().next()),
                None => self.find_pod(name, uid).await,
            };
            let found = match looked {
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
                    self.look_pod(w, &pod, pending.stalled(now, &limits), &mut fits_cache)
                        .await,
                    pod.metadata.name.clone().unwrap_or_default(),
                ),
                None => {
                    let refusals = if now.duration_since(started) > Duration::from_secs(5) {
                        self.job_refusals(w, name).await
                    } else {
                        vec![]
                    };
                    (Seen::NoPod { refusals }, String::new())
                }
            };
            match pending.decide(&seen, Instant::now(), &limits, "none").1 {
                Action::Wait => {}
                Action::Follow => return Ok(pod_name),
                Action::Fail(_, f) if f.kind == FailureKind::Unschedulable => {
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
