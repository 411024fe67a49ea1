//! How a cell's pod ended, without IO: what the host gathered once the log
//! stream ended ([`Facts`]: the pod's status, the Job's condition, the log
//! stream, the API server) → the platform's end ([`decide`]), tested with
//! table cases like [`crate::watch::Pending::decide`].
//!
//! This names what the cluster did to the cell or saw of it, and what came
//! home of the agent's result. Which of that and the agent's own result
//! names the cell's end is decided once, for every platform, by
//! [`orch_backend::lifecycle::judge`]:
//!
//! - a *verdict* is what the cluster did to the pod: `OOMKilled` (`oom`),
//!   an eviction (`evicted`), a disruption (`disrupted`), the Job's
//!   deadline (`timeout`), a lost node (`node_lost`), a log it refused
//!   (`forbidden`: the cell's output cannot come home);
//! - *words* only describe an end without a result: the container exited
//!   (`agent_died`, its exit code the agent's own), the pod failed
//!   (`pod_failed`) or is gone (`pod_lost`), the API server stayed away
//!   (`api_unreachable`: the pod may run on);
//! - a pod stopped from outside orch with no reason left on it (the agent
//!   says it was told to stop, and orch told it nothing) is
//!   [`stopped_outside`], which the lifecycle applies.
//!
//! ## Disruption
//!
//! A pod the cluster took away (its `DisruptionTarget` condition:
//! `PreemptionByScheduler`, `DeletionByTaintManager`,
//! `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`) ends
//! the cell `cancelled` with failure kind `disrupted` and the condition's
//! reason and message: it did not finish its work, so `orch run --resume`
//! runs it again (resume runs every cell recorded `cancelled`).

use crate::watch;
use crate::CELL_CONTAINER;
use k8s_openapi::api::core::v1::Pod;
use orch_backend::lifecycle::PlatformEnd;
use orch_protocol::{CellResult, Failure, FailureKind, Status};

/// The cell container's `terminated` state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Terminated {
    /// `OOMKilled`, `Error`, `Completed`, ...
    pub reason: Option<String>,
    pub exit_code: i32,
    /// Its termination message: the agent's summary, or the log's tail
    /// (`FallbackToLogsOnError`).
    pub message: Option<String>,
}

/// What a pod's status says of its end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodFacts {
    /// `status.phase`: `Running`, `Failed`, `Succeeded`, ...
    pub phase: Option<String>,
    /// `status.reason`: `Evicted`, `DeadlineExceeded`, `NodeLost`, ...
    pub reason: Option<String>,
    /// `status.message`.
    pub message: Option<String>,
    /// Its `DisruptionTarget` condition, when `True`: reason and message
    /// ([`watch::disruption`]).
    pub disruption: Option<(String, String)>,
    /// The cell container's end, once it ended.
    pub terminated: Option<Terminated>,
}

impl PodFacts {
    pub fn of(pod: &Pod) -> PodFacts {
        let status = pod.status.as_ref();
        let terminated = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == CELL_CONTAINER))
            .and_then(|c| c.state.as_ref()?.terminated.as_ref())
            .map(|t| Terminated {
                reason: t.reason.clone(),
                exit_code: t.exit_code,
                message: t.message.clone(),
            });
        PodFacts {
            phase: status.and_then(|s| s.phase.clone()),
            reason: status.and_then(|s| s.reason.clone()),
            message: status.and_then(|s| s.message.clone()),
            disruption: watch::disruption(pod),
            terminated,
        }
    }

    /// Has the cell's container (or the pod) ended?
    pub fn ended(&self) -> bool {
        self.terminated.is_some() || matches!(self.phase.as_deref(), Some("Failed" | "Succeeded"))
    }

    /// The cell container's termination message, when it says anything.
    pub fn termination_message(&self) -> Option<&str> {
        self.terminated
            .as_ref()?
            .message
            .as_deref()
            .filter(|m| !m.trim().is_empty())
    }
}

/// How a pod ended, as its status says; the first that holds, in this
/// order, is its end.
#[derive(Debug, Clone, PartialEq)]
pub enum PodEnd {
    /// The cell's container was killed for going over its memory limit
    /// (`OOMKilled`).
    Oom { exit_code: i32 },
    /// Evicted from its node (`Evicted`: node pressure).
    Evicted { message: String },
    /// Taken away by the cluster (its `DisruptionTarget` condition).
    Disrupted { reason: String, message: String },
    /// The Job's `activeDeadlineSeconds` passed (`DeadlineExceeded`).
    Deadline { message: String },
    /// Its node went away (`NodeLost`, `NodeShutdown`, `Terminated`).
    NodeLost { reason: String, message: String },
    /// The cell's container exited by itself (`reason`: the runtime's
    /// word, `Error` when none).
    Exited { exit_code: i32, reason: String },
    /// The pod ended and its container never did (its phase).
    Failed { phase: String },
    /// No pod: deleted from outside, or its node was lost.
    Gone,
}

impl PodEnd {
    pub fn of(pod: Option<&PodFacts>) -> PodEnd {
        let Some(pod) = pod else {
            return PodEnd::Gone;
        };
        if let Some(t) = pod
            .terminated
            .as_ref()
            .filter(|t| t.reason.as_deref() == Some("OOMKilled"))
        {
            return PodEnd::Oom {
                exit_code: t.exit_code,
            };
        }
        let reason = pod.reason.clone().unwrap_or_default();
        let message = pod.message.clone().unwrap_or_default();
        match (reason.as_str(), &pod.disruption) {
            ("Evicted", _) => return PodEnd::Evicted { message },
            (_, Some((reason, message))) => {
                return PodEnd::Disrupted {
                    reason: reason.clone(),
                    message: message.clone(),
                }
            }
            ("DeadlineExceeded", None) => return PodEnd::Deadline { message },
            ("NodeLost" | "NodeShutdown" | "Terminated", None) => {
                return PodEnd::NodeLost { reason, message }
            }
            _ => {}
        }
        match &pod.terminated {
            Some(t) => PodEnd::Exited {
                exit_code: t.exit_code,
                reason: t.reason.clone().unwrap_or_else(|| "Error".into()),
            },
            None => PodEnd::Failed {
                phase: pod.phase.clone().unwrap_or_default(),
            },
        }
    }

    /// The end in a record's words: (status, failure).
    pub fn failure(&self) -> (Status, Failure) {
        let failed = |kind: FailureKind, message: String| (Status::Failed, Failure::new(kind, message));
        match self {
            PodEnd::Oom { exit_code } => (
                Status::Oom,
                Failure::new(
                    FailureKind::Oom,
                    format!(
                        "the cell's container was killed for going over its memory limit (OOMKilled, exit code {exit_code})"
                    ),
                )
                .exited(Some(*exit_code), None),
            ),
            PodEnd::Evicted { message } => {
                failed(FailureKind::Evicted, format!("the pod was evicted from its node: {message}"))
            }
            PodEnd::Disrupted { reason, message } => watch::disrupted(reason, message),
            PodEnd::Deadline { message } => (
                Status::Timeout,
                Failure::new(
                    FailureKind::Timeout,
                    format!("the Job's activeDeadlineSeconds passed: {message}"),
                ),
            ),
            PodEnd::NodeLost { reason, message } => failed(
                FailureKind::NodeLost,
                format!("the pod's node went away ({reason}): {message}"),
            ),
            PodEnd::Exited { exit_code, reason } => (
                Status::Failed,
                Failure::new(
                    FailureKind::AgentDied,
                    format!(
                        "the cell's container exited with {exit_code} ({reason}) before the agent sent a result"
                    ),
                )
                .exited(Some(*exit_code), None),
            ),
            PodEnd::Failed { phase } => failed(
                FailureKind::PodFailed,
                format!("the pod ended without a result (phase {phase})"),
            ),
            PodEnd::Gone => failed(
                FailureKind::PodLost,
                "the pod disappeared before the agent sent a result (deleted from outside, or its node was lost)"
                    .into(),
            ),
        }
    }

    /// Did the kubelet or the cluster do this to the pod (killed it for
    /// memory, evicted or took it away)? Then it says more than the Job's
    /// deadline, which only deletes the pod.
    fn done_to_the_pod(&self) -> bool {
        matches!(
            self,
            PodEnd::Oom { .. } | PodEnd::Evicted { .. } | PodEnd::Disrupted { .. }
        )
    }
}

/// What the host gathered of a cell's end, once the log stream ended (the
/// IO is the backend's).
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The cell, for a result read from the termination message.
    pub cell_id: String,
    /// The namespace, for the hint of a refused log.
    pub namespace: String,
    /// The pod at the last look; `None`: gone (one last seen with a
    /// disruption is kept: its condition outlives it).
    pub pod: Option<PodFacts>,
    /// The agent's result, as its frames brought it home.
    pub result: Option<CellResult>,
    /// Why the log stream ended early, if it did.
    pub stream_error: Option<String>,
    /// The API server refused the log (a 403: the Role lacks `get pods/log`).
    pub log_refused: Option<String>,
    /// The API server stayed away past the API budget.
    pub unreachable: Option<String>,
    /// The reason of the Job's `Failed` condition (`DeadlineExceeded`),
    /// asked where [`Facts::asks_job`] (and only when orch did not stop
    /// the cell: its own stop is the lifecycle's).
    pub job_failed: Option<String>,
}

/// What ended the cell, as the cluster tells it.
#[derive(Debug, Clone, PartialEq)]
enum Cause {
    /// The pod's own status.
    Pod(PodEnd),
    /// The API server stayed away before the pod was seen to end (it may
    /// run on; never `pod_lost`).
    Unreachable(String),
    /// The Job's `activeDeadlineSeconds` passed and its pod was stopped.
    JobDeadline,
    /// The API server refused the log: the cell's logs and metrics cannot
    /// come home, whatever the agent said.
    Refused(String),
}

impl Cause {
    /// A verdict (what the cluster did to the cell), or words (what it saw
    /// of an end without a result)? How either ranks against the agent's
    /// result is the lifecycle's.
    fn is_verdict(&self) -> bool {
        match self {
            Cause::Pod(p) => !matches!(p, PodEnd::Exited { .. } | PodEnd::Failed { .. } | PodEnd::Gone),
            Cause::JobDeadline | Cause::Refused(_) => true,
            Cause::Unreachable(_) => false,
        }
    }

    fn failure(&self, namespace: &str) -> (Status, Failure) {
        match self {
            Cause::Pod(p) => p.failure(),
            Cause::Unreachable(why) => (Status::Failed, Failure::new(FailureKind::ApiUnreachable, why.clone())),
            Cause::JobDeadline => (
                Status::Timeout,
                Failure::new(
                    FailureKind::Timeout,
                    "the Job's activeDeadlineSeconds passed and its pod was stopped",
                ),
            ),
            Cause::Refused(why) => (
                Status::Failed,
                Failure::new(
                    FailureKind::Forbidden,
                    format!("{why}; the cell's logs and metrics could not come home\nhint: grant what `deploy/kubernetes/orch-role.yaml` grants (`kubectl auth can-i get pods/log -n {namespace}`)"),
                ),
            ),
        }
    }
}

impl Facts {
    /// The pod's end, or the API server's absence where the pod was not
    /// seen to end and was not taken away.
    fn seen(&self) -> Cause {
        let pod = PodEnd::of(self.pod.as_ref());
        match &self.unreachable {
            Some(why)
                if !self.pod.as_ref().is_some_and(PodFacts::ended)
                    && !matches!(pod, PodEnd::Disrupted { .. }) =>
            {
                Cause::Unreachable(why.clone())
            }
            _ => Cause::Pod(pod),
        }
    }

    /// Could the Job's `Failed` condition name the end? Its deadline
    /// deletes the pod, which then says only that it exited or is gone;
    /// what was done to the pod itself, a refused log or an API server gone
    /// say more. The backend asks the Job only then.
    pub fn asks_job(&self) -> bool {
        self.log_refused.is_none() && matches!(self.seen(), Cause::Pod(p) if !p.done_to_the_pod())
    }

    fn cause(&self) -> Cause {
        if let Some(why) = &self.log_refused {
            return Cause::Refused(why.clone());
        }
        if self.asks_job() && self.job_failed.as_deref() == Some("DeadlineExceeded") {
            return Cause::JobDeadline;
        }
        self.seen()
    }
}

/// The platform's end of a cell from the facts: what the cluster did to it
/// (a verdict) or saw of it (words), and what came home of the agent's
/// result.
pub fn decide(f: &Facts) -> PlatformEnd {
    let cause = f.cause();
    let message = f.pod.as_ref().and_then(PodFacts::termination_message);
    // The agent's result: its frames, else its summary in the termination
    // message. A container killed for memory was killed mid-way: its
    // summary is not the agent's last word. A refused log: nothing came
    // home, whatever the summary says.
    let result = match &cause {
        Cause::Refused(_) => None,
        Cause::Pod(PodEnd::Oom { .. }) => f.result.clone(),
        _ => f
            .result
            .clone()
            .or_else(|| message.and_then(|m| summary_result(&f.cell_id, m))),
    };
    // The container's exit code is the agent's own only where the
    // container ended by itself.
    let exit_code = match &cause {
        Cause::Pod(PodEnd::Exited { exit_code, .. }) => Some(*exit_code),
        _ => None,
    };
    let (status, mut failure) = cause.failure(&f.namespace);
    if let Some(e) = f
        .stream_error
        .as_ref()
        .filter(|_| !matches!(cause, Cause::Unreachable(_) | Cause::Refused(_)))
    {
        failure.message.push_str(&format!(" ({e})"));
    }
    if let (Some(m), Cause::Pod(PodEnd::Exited { .. } | PodEnd::Failed { .. })) = (message, &cause) {
        failure
            .message
            .push_str(&format!("; its last output:\n{}", last_output(m)));
    }
    let verdict = cause.is_verdict();
    let ended = (status, failure);
    PlatformEnd {
        result,
        exit_code,
        signal: None,
        verdict: verdict.then(|| ended.clone()),
        words: (!verdict).then_some(ended),
    }
}

/// A pod stopped from outside orch with the cluster's reason not seen
/// (deleted, drained or preempted before a look saw its
/// `DisruptionTarget`): the agent says it was told to stop, and orch told
/// it nothing. A disruption too: `--resume` runs it again. The lifecycle
/// names the end so where the cluster named nothing it did.
pub fn stopped_outside() -> (Status, Failure) {
    (
        Status::Cancelled,
        Failure::new(
            FailureKind::Disrupted,
            "the pod was stopped from outside orch (deleted, drained or preempted; the cluster left no reason on it) while the cell ran; `orch run --resume RUN` runs it again",
        ),
    )
}

/// The last five lines of a termination message that are not frames.
fn last_output(message: &str) -> String {
    let tail: Vec<&str> = message
        .lines()
        .filter(|l| orch_protocol::ship::Frame::parse(l).is_none())
        .rev()
        .take(5)
        .collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// A result from the agent's summary in the termination message.
pub fn summary_result(cell_id: &str, text: &str) -> Option<CellResult> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let status: Status = serde_json::from_value(v.get("status")?.clone()).ok()?;
    let mut r = match v.get("kind").and_then(|k| k.as_str()) {
        Some(kind) => CellResult::failed(
            cell_id,
            status,
            FailureKind::new(kind),
            v.get("message").and_then(|m| m.as_str()).unwrap_or_default(),
        ),
        None => CellResult::new(cell_id, status),
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

#[cfg(test)]
mod tests;
