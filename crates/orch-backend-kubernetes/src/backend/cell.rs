//! One cell's Job as the lifecycle's [`Platform`]: created (with the
//! run's Secret and ConfigMaps first) and waited for until it runs, its
//! log as the cell's stream, deleted to stop it, its end from the facts the
//! cluster gives ([`crate::end::decide`]), its record's `info` and its
//! deletion at the finish.

use super::follow::Followed;
use super::{note_line, KubernetesBackend, Rank, API_TIMEOUT, RANKS_WAIT};
use crate::nodes::RankEnd;
use crate::{end, files, nodes, spec, KubeError};
use async_trait::async_trait;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams};
use orch_backend::lifecycle::{Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::BackendError;
use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::time::Duration;
use tokio::sync::mpsc;

/// One cell's Job: the kubernetes backend's platform.
pub(super) struct JobCell<'a> {
    pub(super) backend: &'a KubernetesBackend,
    pub(super) job: Job,
    pub(super) job_name: String,
    pub(super) job_uid: Option<String>,
    pub(super) image: String,
    /// `kubernetes.log`, appended to line by line.
    pub(super) klog: std::path::PathBuf,
    pub(super) pod_name: Option<String>,
    pub(super) node: Option<String>,
    pub(super) follower: Option<tokio::task::JoinHandle<Followed>>,
    pub(super) lines: Option<mpsc::UnboundedReceiver<String>>,
    pub(super) deleted: bool,
    /// The API server stayed away past the budget: the cell's words.
    pub(super) unreachable: Option<String>,
    /// The ConfigMaps of the cell's files.
    pub(super) packs: Vec<files::Pack>,
    /// A multi-node cell's headless Service ([`spec::indexed`]).
    pub(super) service: Option<Service>,
    pub(super) service_made: bool,
    /// A multi-node cell's ranks other than 0 (rank 0 is the fields above).
    pub(super) ranks: Vec<Rank>,
    /// How orch stopped the cell, if it did.
    pub(super) stopped: Option<Stop>,
    /// The ranks' ends are collected.
    pub(super) collected: bool,
    /// Ranks other than 0 that ended without success, as their followers see them.
    pub(super) rank_tx: mpsc::UnboundedSender<u32>,
    pub(super) rank_rx: mpsc::UnboundedReceiver<u32>,
    /// The first such rank (the Job was deleted for it).
    pub(super) failed_rank: Option<u32>,
    /// The run's watch (`None`: the pod is polled).
    pub(super) watch: Option<std::sync::Arc<super::RunWatch>>,
}

impl JobCell<'_> {
    pub(super) fn log(&mut self, line: &str) {
        let _ = orch_backend::append(&self.klog, format!("{line}\n").as_bytes());
    }
}

/// A cell that ends before its agent ran, for an error of the API server:
/// `api_unreachable` when it stayed away past the budget, else `backend`.
pub(super) fn early(e: KubeError) -> Early {
    match &e {
        KubeError::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut => {
            Early::failed(FailureKind::ApiUnreachable, e.to_string())
        }
        _ => Early::failed(FailureKind::Backend, BackendError::from(e).to_string()),
    }
}

#[async_trait]
impl Platform for JobCell<'_> {
    fn what(&self) -> &'static str {
        "the cell's container"
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let backend = self.backend;
        // The run's watch lists while the cell's objects are made (a list
        // or the watch after it sees the new Job and pod either way).
        let watch = backend.run_watch(&cell.task.run_id);
        backend
            .ensure_secret(&cell.task.run_id, &cell.launch.secrets)
            .await
            .map_err(early)?;
        if !self.packs.is_empty() {
            let (made, bytes) = backend
                .ensure_files(&cell.task.run_id, &self.packs)
                .await
                .map_err(early)?;
            let total: u64 = self.packs.iter().map(files::Pack::bytes).sum();
            let line = format!(
                "orch: files: {} ConfigMap(s), {} ({made} new, {}; the rest already in the cluster)",
                self.packs.len(),
                orch_files::human_bytes(total),
                orch_files::human_bytes(bytes)
            );
            self.log(&line);
        }
        // A Job of this name made again (the cell's next attempt in this
        // process): its pods and events are kept again.
        watch.remember(&self.job_name);
        let uid = backend.create_job(&self.job).await.map_err(early)?;
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
            backend.create_service(&svc).await.map_err(early)?;
            self.log(&format!(
                "orch: headless service {name} created (the pods' subdomain; owned by the Job)"
            ));
        }
        // Looked at in the run's watch once it has listed; `None` when its
        // lists did not come within API_TIMEOUT or the Role refuses a watch:
        // the pod is polled then.
        self.watch = watch.ready(API_TIMEOUT).await.then_some(watch);
        if self.watch.is_none() {
            let why = backend
                .watch_refused(&cell.task.run_id)
                .unwrap_or_else(|| "its first lists did not come in time".into());
            self.log(&format!(
                "orch: the run's watch is not available ({why}); the pod is polled"
            ));
        }
        if !self.ranks.is_empty() {
            return self.wait_ranks(cell).await;
        }
        self.wait_pod(cell).await
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
        self.stopped = stopped;
        let facts = self.facts(cell, stopped).await;
        let end = end::decide(&facts);
        // The other ranks of a multi-node cell: their logs home too.
        if !self.ranks.is_empty() {
            self.collect_ranks(cell, RANKS_WAIT).await;
        }
        end
    }

    fn note_line(&self, f: &Failure) -> Option<String> {
        Some(note_line(f))
    }

    fn stopped_outside(&self) -> Option<(Status, Failure)> {
        Some(end::stopped_outside())
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
            if let Some(f) = result.failure.as_ref().filter(|f| {
                f.kind == FailureKind::NodeRankFailed && before != Some(FailureKind::NodeRankFailed)
            }) {
                let line = format!("orch: {}", note_line(f));
                self.log(&line);
                cell.note(&line);
            }
        }
        if self.job_uid.is_some() {
            self.delete().await;
        }
        if let Some(w) = &self.watch {
            w.forget(&self.job_name);
        }
        if self.service_made {
            result.info.insert(
                "kubernetes_service".into(),
                spec::service_name(&self.job_name).into(),
            );
        }
        let delivery = match self.backend.settings.agent_delivery {
            orch_manifest::AgentDelivery::ImageVolume => "image-volume",
            _ => "init-container",
        };
        let info: [(&str, Option<String>); 6] = [
            (
                "kubernetes_namespace",
                Some(self.backend.settings.namespace.clone()),
            ),
            ("kubernetes_agent_delivery", Some(delivery.to_string())),
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
