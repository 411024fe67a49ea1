//! What a pod's status says, without IO: has the cell's container started,
//! is the pod waiting for something that will come (a node, an image pull),
//! or for something that never will (no node fits, no such image, a missing
//! Secret key); how it ended is read by [`crate::end`]. A pod the cluster
//! took away (its `DisruptionTarget` condition, [`disruption`]) ended
//! `disrupted`, status `cancelled` (its work was not done: `--resume` runs
//! it again).

use crate::end::{PodEnd, PodFacts};
use crate::{AGENT_CONTAINER, CELL_CONTAINER};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use orch_protocol::{Failure, FailureKind, Status};
use std::time::{Duration, Instant};

/// Where a pod is before the cell's container runs.
#[derive(Debug, Clone, PartialEq)]
pub enum PodState {
    /// Waiting for something that may still come: a reason (`Pending`,
    /// `ContainerCreating`, `PodInitializing`, `ErrImagePull`...) and a message.
    Pending { reason: String, message: String },
    /// The scheduler found no node: its message lists what the cluster has.
    Unschedulable { message: String },
    /// Waiting for something that will never come by itself.
    Stuck {
        kind: FailureKind,
        reason: String,
        message: String,
    },
    /// The cell's container is running or has run.
    Started,
    /// The pod ended before the cell's container ran.
    EndedEarly {
        status: Status,
        kind: FailureKind,
        message: String,
    },
}

fn container<'a>(list: Option<&'a Vec<ContainerStatus>>, name: &str) -> Option<&'a ContainerStatus> {
    list.and_then(|l| l.iter().find(|c| c.name == name))
}

/// An image pull error that retrying will not fix.
fn pull_error_is_permanent(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "not found",
        "manifest unknown",
        "unauthorized",
        "denied",
        "repository does not exist",
        "invalid reference",
        "401 unauthorized",
        "403 forbidden",
    ]
    .iter()
    .any(|p| m.contains(p))
}

/// The `DisruptionTarget` condition of a pod, when it is `True`: its
/// reason (`PreemptionByScheduler`, `DeletionByTaintManager`,
/// `EvictionByEvictionAPI`, `DeletionByPodGC`, `TerminationByKubelet`) and
/// message. The control plane or kubelet sets it on a pod it is about to
/// delete or has terminated ("Pod disruption conditions", Kubernetes docs,
/// concepts/workloads/pods/disruptions).
pub fn disruption(pod: &Pod) -> Option<(String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_else(|| "DisruptionTarget".into()),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The failure of a disrupted pod: kind `disrupted`, the condition's words.
pub(crate) fn disrupted(reason: &str, message: &str) -> (Status, Failure) {
    (
        Status::Cancelled,
        Failure::new(
            FailureKind::Disrupted,
            format!(
                "the cluster took the pod away ({reason}){}; `orch run --resume` runs the cell again",
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ),
        ),
    )
}

/// The state of a pod before (or as) the cell's container starts.
pub fn pod_state(pod: &Pod) -> PodState {
    let Some(status) = pod.status.as_ref() else {
        return PodState::Pending {
            reason: "Pending".into(),
            message: "the pod has no status yet".into(),
        };
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let cell = container(status.container_statuses.as_ref(), CELL_CONTAINER);
    let started = cell
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some() || s.terminated.is_some());
    if started {
        return PodState::Started;
    }
    let gone = matches!(phase, "Failed" | "Succeeded") || pod.metadata.deletion_timestamp.is_some();
    if let Some((reason, message)) = disruption(pod).filter(|_| gone) {
        let (status, failure) = disrupted(&reason, &message);
        return PodState::EndedEarly {
            status,
            kind: FailureKind::Disrupted,
            message: failure.message,
        };
    }
    if matches!(phase, "Failed" | "Succeeded") {
        let reason = status.reason.clone().unwrap_or_default();
        let message = status.message.clone().unwrap_or_default();
        // The agent installer failed?
        if let Some(t) = container(status.init_container_statuses.as_ref(), AGENT_CONTAINER)
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref())
            .filter(|t| t.exit_code != 0)
        {
            return PodState::EndedEarly {
                status: Status::Failed,
                kind: FailureKind::AgentInstallFailed,
                message: format!(
                    "the init container `{AGENT_CONTAINER}` (installs the agent) exited with {}{}",
                    t.exit_code,
                    t.message
                        .as_deref()
                        .map(|m| format!(": {}", m.trim()))
                        .unwrap_or_default()
                ),
            };
        }
        let (st, kind) = match reason.as_str() {
            "Evicted" => (Status::Failed, FailureKind::Evicted),
            "DeadlineExceeded" => (Status::Timeout, FailureKind::Timeout),
            "NodeLost" | "NodeShutdown" | "Terminated" => (Status::Failed, FailureKind::NodeLost),
            _ => (Status::Failed, FailureKind::PodFailed),
        };
        return PodState::EndedEarly {
            status: st,
            kind,
            message: format!(
                "the pod ended ({phase}{}) before the cell's container started{}",
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(", {reason}")
                },
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ),
        };
    }
    // Scheduling.
    if let Some(c) = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "PodScheduled"))
    {
        if c.status == "False" && c.reason.as_deref() == Some("Unschedulable") {
            return PodState::Unschedulable {
                message: c.message.clone().unwrap_or_default(),
            };
        }
    }
    // Waiting containers: the installer first, then the cell's.
    let waiting = container(status.init_container_statuses.as_ref(), AGENT_CONTAINER)
        .and_then(|c| c.state.as_ref()?.waiting.as_ref().map(|w| (AGENT_CONTAINER, w)))
        .or_else(|| cell.and_then(|c| c.state.as_ref()?.waiting.as_ref().map(|w| (CELL_CONTAINER, w))));
    if let Some((name, w)) = waiting {
        let reason = w.reason.clone().unwrap_or_default();
        let message = w.message.clone().unwrap_or_default();
        let which = if name == AGENT_CONTAINER {
            "the agent image"
        } else {
            "the cell's image"
        };
        match reason.as_str() {
            "InvalidImageName" | "ErrImageNeverPull" => {
                return PodState::Stuck {
                    kind: FailureKind::ImagePullFailed,
                    message: format!("{which} cannot be pulled ({reason}): {message}"),
                    reason,
                }
            }
            "ErrImagePull" | "ImagePullBackOff" if pull_error_is_permanent(&message) => {
                return PodState::Stuck {
                    kind: FailureKind::ImagePullFailed,
                    message: format!("{which} cannot be pulled ({reason}): {message}"),
                    reason,
                }
            }
            "CreateContainerConfigError" => {
                return PodState::Stuck {
                    kind: FailureKind::ContainerConfigError,
                    message: format!("the container `{name}` cannot be created ({reason}): {message}"),
                    reason,
                }
            }
            _ => {
                return PodState::Pending {
                    message: if message.is_empty() {
                        format!("`{name}` waiting")
                    } else {
                        message
                    },
                    reason,
                }
            }
        }
    }
    PodState::Pending {
        reason: status.reason.clone().unwrap_or_else(|| phase.to_string()),
        message: status.message.clone().unwrap_or_default(),
    }
}

/// How the pod ended, when the agent sent no result: (status, failure)
/// ([`crate::end::PodEnd`]).
pub fn pod_end(pod: Option<&Pod>) -> (Status, Failure) {
    PodEnd::of(pod.map(PodFacts::of).as_ref()).failure()
}

/// The cell container's termination message, if any.
pub fn termination_message(pod: &Pod) -> Option<String> {
    PodFacts::of(pod).termination_message().map(str::to_string)
}

/// When the kubelet started the pod's first container (its init container's or the
/// cell's `startedAt`, running or terminated): where billing starts.
pub fn container_started(pod: &Pod) -> Option<std::time::SystemTime> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| {
            let st = c.state.as_ref()?;
            st.running
                .as_ref()
                .and_then(|r| r.started_at.as_ref())
                .or_else(|| st.terminated.as_ref().and_then(|t| t.started_at.as_ref()))
        })
        // The zero time is a container that never started (`StartError`).
        .filter(|t| t.0.as_second() > 0)
        .map(|t| std::time::SystemTime::from(t.0))
        .min()
}

/// Is the cell's container done?
pub fn cell_terminated(pod: &Pod) -> bool {
    PodFacts::of(pod).ended()
}

/// Could any of these nodes ever run the pod, if nothing else ran there?
/// Its node selector, required node affinity, tolerations of `NoSchedule`
/// and `NoExecute` taints, and `nvidia.com/gpu` against each node's
/// allocatable. `false` makes an unschedulable pod final: waiting cannot help
/// (unless an autoscaler adds a node, which its events say).
pub fn fits_some_node(pod: &Pod, nodes: &[k8s_openapi::api::core::v1::Node]) -> bool {
    fit_count(pod, nodes, 1) >= 1
}

/// Could these nodes run `count` such pods at once, if nothing else ran
/// there (a multi-node cell's ranks: the same pod `count` times)? Each node
/// that [`fits_some_node`] takes as many as its allocatable `nvidia.com/gpu`
/// holds (any number of CPU pods).
pub fn fits_all(pod: &Pod, nodes: &[k8s_openapi::api::core::v1::Node], count: u32) -> bool {
    fit_count(pod, nodes, count) >= i64::from(count)
}

/// How many of the pod the nodes could hold at once (at most `want`).
fn fit_count(pod: &Pod, nodes: &[k8s_openapi::api::core::v1::Node], want: u32) -> i64 {
    let want = i64::from(want);
    let Some(spec) = pod.spec.as_ref() else {
        return want;
    };
    let gpus: i64 = spec
        .containers
        .iter()
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("nvidia.com/gpu"))
        .filter_map(|q| q.0.parse::<i64>().ok())
        .sum();
    let per_node = nodes.iter().map(|n| {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let selector_ok = spec
            .node_selector
            .as_ref()
            .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k) == Some(v)));
        let terms = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
            .map(|s| s.node_selector_terms.clone())
            .unwrap_or_default();
        let affinity_ok = terms.is_empty()
            || terms.iter().any(|t| {
                t.match_expressions
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .all(|e| {
                        let have = labels.get(&e.key);
                        let values = e.values.as_deref().unwrap_or_default();
                        match e.operator.as_str() {
                            "In" => have.is_some_and(|h| values.contains(h)),
                            "NotIn" => have.is_none_or(|h| !values.contains(h)),
                            "Exists" => have.is_some(),
                            "DoesNotExist" => have.is_none(),
                            _ => true,
                        }
                    })
            });
        let tolerations = spec.tolerations.as_deref().unwrap_or_default();
        let taints_ok = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none_or(|taints| {
                taints
                    .iter()
                    .filter(|t| matches!(t.effect.as_str(), "NoSchedule" | "NoExecute"))
                    .all(|t| {
                        tolerations.iter().any(|tol| {
                            let key_ok = tol.key.as_deref().is_none_or(|k| k.is_empty() || k == t.key);
                            let effect_ok = tol
                                .effect
                                .as_deref()
                                .is_none_or(|e| e.is_empty() || e == t.effect);
                            let value_ok = tol.operator.as_deref() == Some("Exists")
                                || tol.value.as_deref().unwrap_or_default()
                                    == t.value.as_deref().unwrap_or_default();
                            key_ok && effect_ok && value_ok
                        })
                    })
            });
        let allocatable: i64 = n
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"))
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0);
        if !(selector_ok && affinity_ok && taints_ok) {
            0
        } else if gpus == 0 {
            want
        } else {
            allocatable / gpus
        }
    });
    per_node.fold(0i64, |a, b| a.saturating_add(b)).min(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn billing_starts_at_the_first_container_the_kubelet_started() {
        let at = |s: &str| std::time::SystemTime::from(chrono::DateTime::parse_from_rfc3339(s).unwrap());
        // Pending: never started.
        assert_eq!(
            container_started(&pod(serde_json::json!({"status": {"phase": "Pending"}}))),
            None
        );
        let p = pod(serde_json::json!({"status": {
            "initContainerStatuses": [{"name": "orch-agent", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "startedAt": "2026-01-01T00:09:50Z", "finishedAt": "2026-01-01T00:09:51Z"}}}],
            "containerStatuses": [{"name": "cell", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:09:52Z"}}}]
        }}));
        assert_eq!(container_started(&p), Some(at("2026-01-01T00:09:50Z")));
        // A container that failed to start carries the zero time: not a start.
        let p = pod(serde_json::json!({"status": {
            "containerStatuses": [{"name": "cell", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 128, "reason": "StartError", "startedAt": "1970-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:09:51Z"}}}]
        }}));
        assert_eq!(container_started(&p), None);
    }

    #[test]
    fn a_pod_fits_a_node_by_labels_taints_and_gpu_allocatable() {
        let node = |gpus: &str, taint: bool| -> k8s_openapi::api::core::v1::Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                "spec": {"taints": if taint { serde_json::json!([{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]) } else { serde_json::json!([]) }},
                "status": {"allocatable": {"nvidia.com/gpu": gpus}}
            }))
            .unwrap()
        };
        let pod = |gpus: u32| -> Pod {
            serde_json::from_value(serde_json::json!({"spec": {
                "containers": [{"name": "cell", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}]}}},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]
            }}))
            .unwrap()
        };
        assert!(fits_some_node(&pod(8), &[node("8", false)]));
        assert!(
            !fits_some_node(&pod(8), &[node("4", false)]),
            "never 8 GPUs on one node"
        );
        assert!(
            !fits_some_node(&pod(1), &[node("8", true)]),
            "an untolerated taint"
        );
        assert!(!fits_some_node(&pod(1), &[]));
        // A multi-node cell's ranks: all of them at once, GPUs counted per node.
        assert!(fits_all(&pod(8), &[node("8", false), node("8", false)], 2));
        assert!(
            !fits_all(&pod(8), &[node("8", false), node("4", false)], 2),
            "one node of 8 holds one rank of 8"
        );
        assert!(
            fits_all(&pod(4), &[node("8", false)], 2),
            "two ranks of 4 on one node of 8"
        );
        assert!(!fits_all(&pod(4), &[node("8", false), node("8", true)], 3));
        let cpu: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": [{"name": "cell"}]}})).unwrap();
        assert!(fits_all(&cpu, &[node("0", false)], 16), "CPU pods: any number");
    }

    #[test]
    fn states_are_read_from_the_pod_status() {
        let p = pod(serde_json::json!({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."}]}}));
        assert!(
            matches!(pod_state(&p), PodState::Unschedulable { message } if message.contains("Insufficient"))
        );
        let p = pod(
            serde_json::json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "cell", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ErrImagePull", "message": "rpc error: code = NotFound desc = failed to pull: not found"}}}]}}),
        );
        assert!(matches!(
            pod_state(&p),
            PodState::Stuck {
                kind: FailureKind::ImagePullFailed,
                ..
            }
        ));
        let p = pod(
            serde_json::json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "cell", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "ErrImagePull", "message": "i/o timeout"}}}]}}),
        );
        assert!(matches!(pod_state(&p), PodState::Pending { .. }));
        let p = pod(
            serde_json::json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "cell", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "couldn't find key HF_TOKEN in Secret ns/s"}}}]}}),
        );
        assert!(matches!(
            pod_state(&p),
            PodState::Stuck {
                kind: FailureKind::ContainerConfigError,
                ..
            }
        ));
        let p = pod(
            serde_json::json!({"status": {"phase": "Failed", "reason": "OOMKilled", "containerStatuses": [
            {"name": "cell", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}),
        );
        assert_eq!(pod_state(&p), PodState::Started);
        assert_eq!(pod_end(Some(&p)).0, Status::Oom);
        let p = pod(
            serde_json::json!({"status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}}),
        );
        assert!(matches!(
            pod_state(&p),
            PodState::EndedEarly {
                kind: FailureKind::Evicted,
                ..
            }
        ));
        assert_eq!(pod_end(Some(&p)).1.kind, FailureKind::Evicted);
        assert_eq!(pod_end(None).1.kind, FailureKind::PodLost);
    }

    #[test]
    fn a_disruption_target_condition_names_the_end_and_asks_for_a_resume() {
        // A drain: the Eviction API sets the condition, then deletes the pod.
        let p = pod(serde_json::json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:30Z"},
            "status": {"phase": "Failed", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                 "message": "Eviction API: evicting"}],
                "containerStatuses": [{"name": "cell", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                 "state": {"terminated": {"reason": "Error", "exitCode": 143}}}]}}));
        let (status, f) = pod_end(Some(&p));
        assert_eq!((status, f.kind.as_str()), (Status::Cancelled, "disrupted"));
        assert!(f.message.contains("EvictionByEvictionAPI") && f.message.contains("Eviction API: evicting"));
        // Preempted before the cell's container ran.
        let p = pod(serde_json::json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:30Z"},
            "status": {"phase": "Pending", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
                 "message": "ns/p: preempting to accommodate a higher priority pod"}]}}));
        assert!(matches!(
            pod_state(&p),
            PodState::EndedEarly {
                kind: FailureKind::Disrupted,
                status: Status::Cancelled,
                ..
            }
        ));
        // A condition that is not `True` is no disruption.
        let p = pod(serde_json::json!({"status": {"phase": "Failed", "conditions": [
            {"type": "DisruptionTarget", "status": "False", "reason": "EvictionByEvictionAPI"}]}}));
        assert_eq!(disruption(&p), None);
        assert_ne!(pod_end(Some(&p)).1.kind, FailureKind::Disrupted);
    }
}

/// What one look at a cell's Job found, before its container runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Seen {
    /// No pod yet, and the Job controller's refusals (`FailedCreate`
    /// events: quota, Pod Security, a webhook), if any.
    NoPod { refusals: Vec<String> },
    /// The Job's pod.
    Pod {
        state: PodState,
        nominated: Option<String>,
        /// The pod's events (`TYPE REASON: MESSAGE`), read when it is
        /// unschedulable, stuck or has made no progress for long.
        events: Vec<String>,
        /// What an autoscaler said about it, from its latest event.
        autoscaler: Autoscaler,
        /// Could any node of the cluster ever run it? `None`: the nodes
        /// cannot be listed (asked only while it is unschedulable).
        fits: Option<bool>,
    },
}

/// What a node autoscaler said about an unschedulable pod: its latest
/// event of `TriggeredScaleUp` or `NotTriggerScaleUp` (the cluster
/// autoscaler) or `Nominated` (Karpenter).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Autoscaler {
    /// No word (yet, or no autoscaler).
    #[default]
    Silent,
    /// A node is being added for the pod (`TriggeredScaleUp`, `Nominated`).
    ScalingUp,
    /// No node group can help: the autoscaler's message (`pod didn't trigger
    /// scale-up: 1 max node group size reached, ...`).
    NoScaleUp { message: String },
}

impl Autoscaler {
    /// The verdict of a pod's events, oldest first: (reason, source
    /// component, message). The last autoscaler event wins.
    pub fn from_events<'a>(events: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Autoscaler {
        let mut verdict = Autoscaler::Silent;
        for (reason, source, message) in events {
            match reason {
                "TriggeredScaleUp" | "Nominated" | "NominatedNode" => verdict = Autoscaler::ScalingUp,
                "NotTriggerScaleUp" if source.is_empty() || source.contains("autoscaler") => {
                    verdict = Autoscaler::NoScaleUp {
                        message: message.trim().to_string(),
                    }
                }
                _ => {}
            }
        }
        verdict
    }
}

/// What to do after a look.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Look again later.
    Wait,
    /// The cell's container runs: follow its log.
    Follow,
    /// The cell ends before its container ran.
    Fail(Status, Failure),
}

/// The limits of a cell's wait for its container (from the suite's
/// `kubernetes:` section).
#[derive(Debug, Clone, Copy)]
pub struct PendingLimits {
    /// No progress (no change of state) for this long fails the cell.
    pub max_pending: Duration,
    /// How long an unschedulable pod waits for an autoscaler's word (a
    /// scale-from-zero GPU pool included) before it fails.
    pub unschedulable_grace: Duration,
    /// How long a pod an autoscaler is adding a node for (`TriggeredScaleUp`,
    /// `Nominated`) waits for that node.
    pub scale_up_timeout: Duration,
}

/// The wait for a cell's container, as a pure state machine: each look
/// ([`Seen`]) at a time (`now`) gives a line for `kubernetes.log` when the
/// state changed, and an [`Action`]. Tested without a server.
#[derive(Debug, Clone)]
pub struct Pending {
    created: Instant,
    last_state: String,
    last_progress: Instant,
    unschedulable_since: Option<Instant>,
    /// An autoscaler said it adds a node (kept: its events may be read late).
    scaling: bool,
    trouble_since: Option<Instant>,
}

impl Pending {
    /// The Job was created at `now`.
    pub fn new(now: Instant) -> Pending {
        Pending {
            created: now,
            last_state: String::new(),
            last_progress: now,
            unschedulable_since: None,
            scaling: false,
            trouble_since: None,
        }
    }

    /// Has nothing changed for `max_pending`? (The caller then reads the
    /// pod's events for the message.)
    pub fn stalled(&self, now: Instant, limits: &PendingLimits) -> bool {
        now.duration_since(self.last_progress) > limits.max_pending
    }

    /// Is the pod unschedulable (so far)?
    pub fn unschedulable(&self) -> bool {
        self.unschedulable_since.is_some()
    }

    /// One look. `gpu` is the cell's request (`H100:8`, `none`), for messages.
    pub fn decide(
        &mut self,
        seen: &Seen,
        now: Instant,
        limits: &PendingLimits,
        gpu: &str,
    ) -> (Option<String>, Action) {
        let mut line = None;
        let mut shown = |this: &mut Pending, text: String| {
            if text != this.last_state {
                line = Some(text.clone());
                this.last_state = text;
                this.last_progress = now;
            }
        };
        let fail =
            |kind: FailureKind, message: String| Action::Fail(Status::Failed, Failure::new(kind, message));
        let action = match seen {
            Seen::NoPod { refusals } => {
                let mut action = Action::Wait;
                // The Job controller may be refused a pod: its events say.
                if now.duration_since(self.created) > Duration::from_secs(5) {
                    if let Some(last) = refusals.last() {
                        shown(self, format!("job refused a pod: {last}"));
                        // Quota may free up; other refusals are final.
                        if !last.contains("exceeded quota") || self.stalled(now, limits) {
                            action = fail(
                                FailureKind::PodRejected,
                                format!("the cluster refused to create the cell's pod: {last}"),
                            );
                        }
                    }
                }
                if action == Action::Wait && self.stalled(now, limits) {
                    action = fail(
                        FailureKind::PendingTooLong,
                        format!(
                            "the Job made no pod within {:.0}s",
                            limits.max_pending.as_secs_f64()
                        ),
                    );
                }
                action
            }
            Seen::Pod {
                state,
                nominated,
                events,
                autoscaler,
                fits,
            } => {
                shown(
                    self,
                    format!(
                        "{state:?}{}{}",
                        nominated
                            .as_ref()
                            .map(|n| format!(" (nominated node {n})"))
                            .unwrap_or_default(),
                        match autoscaler {
                            Autoscaler::Silent => String::new(),
                            a => format!(" (autoscaler: {a:?})"),
                        }
                    ),
                );
                let stalled = self.stalled(now, limits);
                match state {
                    PodState::Started => Action::Follow,
                    PodState::Unschedulable { message } => {
                        let since = *self.unschedulable_since.get_or_insert(now);
                        let waited = now.duration_since(since);
                        if *autoscaler == Autoscaler::ScalingUp || nominated.is_some() {
                            self.scaling = true;
                        }
                        let what = if gpu == "none" { "CPU cell" } else { "GPU" };
                        let fits = if self.scaling { Some(true) } else { *fits };
                        let unschedulable = |why: String| {
                            fail(
                                FailureKind::Unschedulable,
                                format!(
                                    "no node can run the pod ({what} `{gpu}`; {why}, {:.0}s): {message}",
                                    waited.as_secs_f64()
                                ),
                            )
                        };
                        if self.scaling {
                            // A node is coming: wait for it up to the
                            // scale-up timeout (a new GPU node takes minutes).
                            if waited >= limits.scale_up_timeout {
                                unschedulable(format!(
                                    "an autoscaler was adding a node but none came within `kubernetes.scale_up_timeout` ({:.0}s)",
                                    limits.scale_up_timeout.as_secs_f64()
                                ))
                            } else {
                                Action::Wait
                            }
                        } else if let (Autoscaler::NoScaleUp { message: words }, false) =
                            (autoscaler, fits == Some(true))
                        {
                            // The autoscaler's decision: no node group can help.
                            unschedulable(format!("the cluster autoscaler adds no node: {words}"))
                        } else {
                            // No autoscaler's word: final after the grace
                            // when no node could ever take it; a busy
                            // cluster is a queue (up to `max_pending`).
                            let limit = match fits {
                                Some(true) => limits.max_pending,
                                _ => limits.unschedulable_grace,
                            };
                            if waited >= limit || stalled {
                                unschedulable(
                                    match fits {
                                        Some(false) => "no node of the cluster can ever run it and no autoscaler added one",
                                        None => "it stayed unschedulable and no autoscaler added a node",
                                        Some(true) => "it waited for a node its whole `max_pending`",
                                    }
                                    .to_string(),
                                )
                            } else {
                                Action::Wait
                            }
                        }
                    }
                    PodState::Stuck { kind, message, .. } => fail(kind.clone(), message.clone()),
                    PodState::EndedEarly {
                        status,
                        kind,
                        message,
                    } => Action::Fail(*status, Failure::new(kind.clone(), message.clone())),
                    PodState::Pending { reason, message } => {
                        self.unschedulable_since = None;
                        self.scaling = false;
                        // Errors the kubelet retries: failed when they last.
                        // A transient pull error (a permanent one is `Stuck`
                        // already) is retried by the kubelet with a backoff
                        // of up to 5 minutes, and a large image's next pull
                        // takes minutes: it gets the whole `max_pending`.
                        let (limit, kind) = match reason.as_str() {
                            "ErrImagePull" | "ImagePullBackOff" | "RegistryUnavailable" => {
                                (Some(limits.max_pending), FailureKind::ImagePullFailed)
                            }
                            "ImageInspectError" => {
                                (Some(Duration::from_secs(90)), FailureKind::ImagePullFailed)
                            }
                            "CreateContainerError" | "RunContainerError" => {
                                (Some(Duration::from_secs(30)), FailureKind::ContainerConfigError)
                            }
                            _ => (None, FailureKind::PendingTooLong),
                        };
                        let mut action = Action::Wait;
                        match limit {
                            Some(limit) => {
                                let since = *self.trouble_since.get_or_insert(now);
                                if now.duration_since(since) > limit {
                                    action = fail(
                                        kind,
                                        format!("{reason} for {:.0}s: {message}", limit.as_secs_f64()),
                                    );
                                }
                            }
                            None => self.trouble_since = None,
                        }
                        if action == Action::Wait && stalled {
                            action = fail(
                                FailureKind::PendingTooLong,
                                format!(
                                    "the pod made no progress for {:.0}s (still {reason}{}){}",
                                    limits.max_pending.as_secs_f64(),
                                    if message.is_empty() {
                                        String::new()
                                    } else {
                                        format!(": {message}")
                                    },
                                    events
                                        .last()
                                        .map(|e| format!("; last event: {e}"))
                                        .unwrap_or_default()
                                ),
                            );
                        }
                        action
                    }
                }
            }
        };
        (line, action)
    }
}

#[cfg(test)]
mod decide_tests {
    use super::*;

    const LIMITS: PendingLimits = PendingLimits {
        max_pending: Duration::from_secs(600),
        unschedulable_grace: Duration::from_secs(10),
        scale_up_timeout: Duration::from_secs(900),
    };

    fn pod(state: PodState) -> Seen {
        Seen::Pod {
            state,
            nominated: None,
            events: vec![],
            autoscaler: Autoscaler::Silent,
            fits: Some(false),
        }
    }

    fn unschedulable() -> PodState {
        PodState::Unschedulable {
            message: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.".into(),
        }
    }

    #[test]
    fn a_pod_no_node_can_ever_run_fails_after_the_grace_and_an_autoscaler_makes_it_wait() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        let (line, a) = p.decide(&pod(unschedulable()), t0, &LIMITS, "H100:8");
        assert!(line.unwrap().starts_with("Unschedulable"));
        assert_eq!(a, Action::Wait);
        let (line, a) = p.decide(
            &pod(unschedulable()),
            t0 + Duration::from_secs(11),
            &LIMITS,
            "H100:8",
        );
        assert_eq!(line, None);
        let Action::Fail(Status::Failed, f) = a else {
            panic!("{a:?}")
        };
        assert_eq!(f.kind, FailureKind::Unschedulable);
        assert!(
            f.message
                .contains("GPU `H100:8`; no node of the cluster can ever run it"),
            "{}",
            f.message
        );
    }

    #[test]
    fn image_pull_errors_fail_when_they_last_and_progress_resets_the_wait() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        let pulling = |reason: &str| {
            pod(PodState::Pending {
                reason: reason.into(),
                message: "pull access denied".into(),
            })
        };
        assert_eq!(
            p.decide(&pulling("ErrImagePull"), t0, &LIMITS, "none").1,
            Action::Wait
        );
        // The kubelet is still retrying a transient error at 91 s (a
        // large image's first pull hit a timeout): wait.
        assert_eq!(
            p.decide(
                &pulling("ImagePullBackOff"),
                t0 + Duration::from_secs(91),
                &LIMITS,
                "none"
            )
            .1,
            Action::Wait
        );
        let (_, a) = p.decide(
            &pulling("ImagePullBackOff"),
            t0 + LIMITS.max_pending + Duration::from_secs(1),
            &LIMITS,
            "none",
        );
        let Action::Fail(_, f) = a else { panic!("{a:?}") };
        assert_eq!(f.kind, FailureKind::ImagePullFailed);
        // Started: follow.
        let mut p = Pending::new(t0);
        assert_eq!(
            p.decide(&pod(PodState::Started), t0, &LIMITS, "none").1,
            Action::Follow
        );
        // No pod, a quota refusal: waits (quota may free up), until max_pending.
        let mut p = Pending::new(t0);
        let quota = Seen::NoPod {
            refusals: vec!["exceeded quota: gpu-quota".into()],
        };
        assert_eq!(
            p.decide(&quota, t0 + Duration::from_secs(6), &LIMITS, "none").1,
            Action::Wait
        );
        assert!(matches!(
            p.decide(&quota, t0 + Duration::from_secs(700), &LIMITS, "none").1,
            Action::Fail(..)
        ));
        let mut p = Pending::new(t0);
        let denied = Seen::NoPod {
            refusals: vec!["violates PodSecurity \"restricted:latest\"".into()],
        };
        let Action::Fail(_, f) = p.decide(&denied, t0 + Duration::from_secs(6), &LIMITS, "none").1 else {
            panic!()
        };
        assert_eq!(f.kind, FailureKind::PodRejected);
    }

    /// The default limits: a 90s grace for the autoscaler's word, 15m for its node.
    const DEFAULTS: PendingLimits = PendingLimits {
        max_pending: Duration::from_secs(900),
        unschedulable_grace: Duration::from_secs(90),
        scale_up_timeout: Duration::from_secs(900),
    };

    fn seen(autoscaler: Autoscaler, fits: Option<bool>) -> Seen {
        Seen::Pod {
            state: unschedulable(),
            nominated: None,
            events: vec![],
            autoscaler,
            fits,
        }
    }

    fn at(p: &mut Pending, t0: Instant, s: u64, seen: &Seen) -> Action {
        p.decide(seen, t0 + Duration::from_secs(s), &DEFAULTS, "H100:8").1
    }

    #[test]
    fn a_scale_from_zero_gpu_pool_is_waited_for_failed_scheduling_then_triggered_scale_up_then_the_node() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        // `FailedScheduling` on a cluster without GPU nodes: no autoscaler word yet.
        let silent = seen(Autoscaler::Silent, Some(false));
        assert_eq!(at(&mut p, t0, 0, &silent), Action::Wait);
        assert_eq!(at(&mut p, t0, 10, &silent), Action::Wait);
        // `TriggeredScaleUp` at +15s: waits for the node, minutes.
        let scaling = seen(Autoscaler::ScalingUp, Some(false));
        let (line, a) = p.decide(&scaling, t0 + Duration::from_secs(15), &DEFAULTS, "H100:8");
        assert_eq!(a, Action::Wait);
        assert!(line.unwrap().contains("autoscaler: ScalingUp"));
        assert_eq!(at(&mut p, t0, 300, &scaling), Action::Wait);
        // The event read late, or gone: the wait goes on.
        assert_eq!(at(&mut p, t0, 600, &silent), Action::Wait);
        // The node came: scheduled, creating.
        let creating = pod(PodState::Pending {
            reason: "ContainerCreating".into(),
            message: String::new(),
        });
        assert_eq!(at(&mut p, t0, 620, &creating), Action::Wait);
        assert_eq!(at(&mut p, t0, 640, &pod(PodState::Started)), Action::Follow);
    }

    #[test]
    fn karpenter_nominated_extends_the_wait_up_to_the_scale_up_timeout() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        let nominated = seen(Autoscaler::ScalingUp, Some(false));
        assert_eq!(at(&mut p, t0, 0, &nominated), Action::Wait);
        assert_eq!(at(&mut p, t0, 899, &nominated), Action::Wait);
        let Action::Fail(Status::Failed, f) = at(&mut p, t0, 901, &nominated) else {
            panic!()
        };
        assert_eq!(f.kind, FailureKind::Unschedulable);
        assert!(
            f.message.contains("`kubernetes.scale_up_timeout` (900s)"),
            "{}",
            f.message
        );
        assert!(f.message.contains("Insufficient nvidia.com/gpu"), "{}", f.message);
    }

    #[test]
    fn not_trigger_scale_up_fails_at_once_with_the_autoscalers_words() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        assert_eq!(
            at(&mut p, t0, 0, &seen(Autoscaler::Silent, Some(false))),
            Action::Wait
        );
        let words = "pod didn't trigger scale-up: 1 max node group size reached, 2 node(s) didn't match Pod's node affinity/selector";
        let no = seen(
            Autoscaler::NoScaleUp {
                message: words.into(),
            },
            Some(false),
        );
        let Action::Fail(Status::Failed, f) = at(&mut p, t0, 15, &no) else {
            panic!()
        };
        assert_eq!(f.kind, FailureKind::Unschedulable);
        assert!(
            f.message
                .contains(&format!("the cluster autoscaler adds no node: {words}")),
            "{}",
            f.message
        );
        // A busy cluster whose nodes could run it: a queue, whatever the autoscaler says.
        let mut p = Pending::new(t0);
        let busy = seen(
            Autoscaler::NoScaleUp {
                message: words.into(),
            },
            Some(true),
        );
        assert_eq!(at(&mut p, t0, 0, &busy), Action::Wait);
        assert_eq!(at(&mut p, t0, 600, &busy), Action::Wait);
    }

    #[test]
    fn no_autoscaler_word_within_the_grace_is_unschedulable_with_the_schedulers_message() {
        let t0 = Instant::now();
        let mut p = Pending::new(t0);
        let silent = seen(Autoscaler::Silent, Some(false));
        assert_eq!(at(&mut p, t0, 0, &silent), Action::Wait);
        assert_eq!(at(&mut p, t0, 60, &silent), Action::Wait);
        let Action::Fail(Status::Failed, f) = at(&mut p, t0, 90, &silent) else {
            panic!()
        };
        assert_eq!(f.kind, FailureKind::Unschedulable);
        assert!(
            f.message
                .contains("no autoscaler added one, 90s): 0/3 nodes are available"),
            "{}",
            f.message
        );
        // Nodes not listable: the same grace.
        let mut p = Pending::new(t0);
        let unknown = seen(Autoscaler::Silent, None);
        assert_eq!(at(&mut p, t0, 0, &unknown), Action::Wait);
        assert!(matches!(at(&mut p, t0, 91, &unknown), Action::Fail(..)));
    }

    #[test]
    fn the_autoscalers_latest_event_is_its_verdict() {
        assert_eq!(Autoscaler::from_events([]), Autoscaler::Silent);
        assert_eq!(
            Autoscaler::from_events([
                ("FailedScheduling", "default-scheduler", "0/3 nodes are available"),
                (
                    "TriggeredScaleUp",
                    "cluster-autoscaler",
                    "pod triggered scale-up: [{gpu 0->1 (max: 4)}]"
                ),
            ]),
            Autoscaler::ScalingUp
        );
        assert_eq!(
            Autoscaler::from_events([(
                "Nominated",
                "karpenter",
                "Pod should schedule on: nodeclaim/gpu-x"
            )]),
            Autoscaler::ScalingUp
        );
        assert_eq!(
            Autoscaler::from_events([
                ("TriggeredScaleUp", "cluster-autoscaler", "pod triggered scale-up"),
                (
                    "NotTriggerScaleUp",
                    "cluster-autoscaler",
                    "pod didn't trigger scale-up: 1 max node group size reached "
                ),
            ]),
            Autoscaler::NoScaleUp {
                message: "pod didn't trigger scale-up: 1 max node group size reached".into()
            }
        );
    }
}
