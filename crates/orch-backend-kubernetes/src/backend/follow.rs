//! The cell container's log, followed line by line until the container
//! ended, reconnecting after a dropped stream, in one of the backend's
//! log slots ([`LogSlots`]: a container that ends before a slot is free
//! has its log read once, whole); the pod seen meanwhile in the run's
//! watch ([`RunWatch`]), or without one watched and looked at every
//! [`POD_POLL`], so a disruption is seen before the pod is gone.

use super::api::{transient, unreachable_message, Down};
use super::informer::{LogSlots, RunWatch};
use super::{API_TIMEOUT, POD_POLL};
use crate::{watch, KubeError, CELL_CONTAINER};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a log follower saw: the last look at the pod, and why it stopped
/// early (if it did).
#[derive(Debug, Default)]
pub(super) struct Followed {
    /// The pod as last seen (looked at every [`POD_POLL`] while the log
    /// streams, and after): its `DisruptionTarget` condition outlives it.
    pub(super) last: Option<Pod>,
    pub(super) error: Option<FollowError>,
}

#[derive(Debug)]
pub(super) struct FollowError {
    /// The API server stayed away past the budget (else it refused).
    pub(super) unreachable: bool,
    pub(super) message: String,
}

/// Follow the cell container's log into `tx`, line by line, until the
/// container has ended or the pod is gone. A stream that ends or breaks
/// (the API server dropped the connection, refused a new one, did not
/// answer) is opened again with [`backoff`] (the whole log again: frames
/// already home are dropped by number) until `budget` passed without an
/// answer; an answer that is an error (a 403: the Role lacks `get pods/log`)
/// ends it at once.
pub(super) async fn follow_log(
    pods: Api<Pod>,
    pod: String,
    tx: mpsc::UnboundedSender<String>,
    budget: Duration,
    w: Option<Arc<RunWatch>>,
    slots: LogSlots,
) -> Followed {
    let mut out = Followed::default();
    // A slot for the stream; a container that ends while the cell waits for
    // one (other cells hold them all) has its log read once, whole.
    let ended = |p: Option<&Pod>| p.is_none_or(watch::cell_terminated);
    let _slot = match &w {
        Some(w) => tokio::select! {
            // A free slot first: the log is followed.
            biased;
            s = slots.clone().acquire_owned() => s.ok(),
            _ = w.wait_pod(&pod, FOREVER, ended) => {
                if let Some(text) = read_log(&pods, &pod).await {
                    for line in text.lines() {
                        if tx.send(line.to_string()).is_err() {
                            break;
                        }
                    }
                }
                out.last = w.last_seen(&pod);
                return out;
            }
        },
        None => slots.clone().acquire_owned().await.ok(),
    };
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
                let mut watch = match &w {
                    // The run's watch sees the pod.
                    Some(_) => None,
                    None => match tokio::time::timeout(API_TIMEOUT, pods.watch(&wp, "0")).await {
                        Ok(Ok(w)) => Some(w.boxed()),
                        _ => None,
                    },
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
                        _ = look.tick(), if w.is_none() => {
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
        let seen = match &w {
            // A stream read to its end: the watch may lag it a moment; one
            // that did not open: the store as it is (the backoff is below).
            Some(w) => match w
                .wait_pod(&pod, if streamed { ENDED_WAIT } else { Duration::ZERO }, ended)
                .await
            {
                Some(Some(p)) => {
                    let done = watch::cell_terminated(&p);
                    out.last = Some(p);
                    if done && streamed {
                        return out;
                    }
                    // A stream read to its end while the watch still says the
                    // container runs: the API server is asked once (a watch
                    // that missed the change would otherwise have the log
                    // read again every ENDED_WAIT for ever); a stream that
                    // did not open: opened again at once (it waited already).
                    if streamed {
                        false
                    } else if down.0.is_none() {
                        continue;
                    } else {
                        true
                    }
                }
                Some(None) => {
                    out.last = w.last_seen(&pod);
                    return out;
                }
                // Never seen by the watch: asked.
                None => false,
            },
            None => false,
        };
        if !seen {
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

/// No end to a wait but its cause.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// After a log stream ended, how long the run's watch may take to show the
/// container ended (else the stream is opened again: the wait is also the
/// pause before it, as `Down::attempts_wait` is while the server answers).
const ENDED_WAIT: Duration = Duration::from_millis(300);

/// The whole log of the cell's container, once (no follow).
pub(super) async fn read_log(pods: &Api<Pod>, pod: &str) -> Option<String> {
    let lp = LogParams {
        container: Some(CELL_CONTAINER.into()),
        ..Default::default()
    };
    pods.logs(pod, &lp).await.ok()
}
