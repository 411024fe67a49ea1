//! A multi-node cell's ranks: every pod of the Indexed Job waited for
//! (each judged as a one-node cell's pod), rank 0's log followed as the
//! cell's stream and every other rank's into `nodes/<k>/` through a
//! [`Home`] of its own; a rank that ends without success deletes the Job
//! (the others would wait for it); each rank's end collected for
//! `info.nodes` ([`crate::nodes`]).

use super::api::{backoff, unreachable_message, CallError, Down};
use super::follow::{follow_log, read_log, Followed};
use super::informer::{LogSlots, RunWatch};
use super::{note_line, JobCell, API_TIMEOUT, WATCH_TICK};
use crate::end::summary_result;
use crate::nodes::RankEnd;
use crate::watch::{self, Action, Pending, Seen};
use crate::{spec, KubeError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use orch_backend::home::Home;
use orch_backend::lifecycle::{Cell, Early};
use orch_backend::BackendError;
use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// One rank other than 0 of a multi-node cell: its pod, its log followed
/// into `nodes/<rank>/` of the cell folder through a [`Home`] of its own.
pub(super) struct Rank {
    rank: u32,
    pub(super) pod: Option<String>,
    node: Option<String>,
    home: Option<Arc<std::sync::Mutex<Home>>>,
    follower: Option<tokio::task::JoinHandle<Followed>>,
    pub(super) end: Option<RankEnd>,
}

impl Rank {
    pub(super) fn new(rank: u32) -> Rank {
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
    (w, slots): (Option<Arc<RunWatch>>, LogSlots),
) -> Followed {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let follower = tokio::spawn(follow_log(pods, pod, tx, budget, w, slots));
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
                self.watch.clone(),
                backend.log_slots.clone(),
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
            (self.watch.clone(), backend.log_slots.clone()),
        )));
    }

    /// A rank other than 0 ended without success: the other ranks would
    /// wait for it (a rendezvous, a collective), so the Job goes with its
    /// pods, as the Job controller does when a pod fails.
    pub(super) async fn rank_ended(&mut self, rank: u32) {
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
    pub(super) async fn wait_ranks(&mut self, cell: &mut Cell) -> Result<(), Early> {
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
        let w = self.watch.clone();
        let mut changed = w.as_ref().map(|w| w.changed());
        let mut first = true;
        loop {
            if down.0.is_some() {
                tokio::time::sleep(backoff(k)).await;
                k += 1;
            } else if let Some(rx) = changed.as_mut() {
                if !first {
                    let _ = tokio::time::timeout(WATCH_TICK, rx.changed()).await;
                }
                rx.borrow_and_update();
            } else {
                ticker.tick().await;
                k = 0;
            }
            first = false;
            let found = match &w {
                Some(w) => Ok(w.pods_of(&self.job_name, &uid)),
                None => backend.find_pods(&self.job_name, &uid).await,
            };
            let pods = match found {
                Ok(p) => {
                    if down.0.is_some() {
                        self.log("orch: the API server answers again");
                    }
                    down.ok();
                    p
                }
                Err(CallError::Api(e)) => {
                    let e = KubeError::api(format!("list pods of job {}", self.job_name))(e);
                    return Err(Early::failed(
                        FailureKind::Backend,
                        BackendError::from(e).to_string(),
                    ));
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
                    Some(p) => {
                        backend
                            .look_pods(w.as_deref(), p, n as u32, stalled, &mut fits_cache)
                            .await
                    }
                    None => {
                        if refusals.is_none() {
                            refusals = Some(backend.job_refusals(w.as_deref(), &self.job_name).await);
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
                        if failure.kind == FailureKind::Unschedulable {
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
                    FailureKind::NodeRankFailed,
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
                if let Some(reason) = backend.job_failed_reason(w.as_deref(), &self.job_name).await {
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
                        FailureKind::NodeRankFailed,
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
    pub(super) async fn collect_ranks(&mut self, cell: &Cell, wait: Duration) {
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
            let seen = match (&self.ranks[i].pod, &self.watch) {
                (Some(p), Some(w)) => w.pod(p),
                _ => None,
            };
            let pod = match self.ranks[i].pod.clone() {
                Some(_) if seen.is_some() => seen.flatten().or(last),
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
}
