//! A multi-node cell's record, without IO: every rank's hardware, status
//! and telemetry in `info.nodes` (the shape the slurm backend gives:
//! `rank`, `host`, `status`, `hardware`, `metrics`), and which rank's end is
//! the cell's.
//!
//! Rank 0's result is the cell's. A rank that failed by itself (a status
//! other than `succeeded` or `cancelled`) while rank 0 did not (it
//! succeeded, or was stopped: the host deletes the Job once a rank ends
//! without success, and the Job controller does once a pod fails) fails the cell as
//! `node_rank_failed`, naming the rank; so does a rank that did not succeed
//! or wrote no result when rank 0 succeeded. A cell orch stopped (cancel,
//! deadline) keeps rank 0's end.

use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::collections::BTreeMap;

/// One rank other than 0 as the host saw it end.
#[derive(Debug, Clone)]
pub struct RankEnd {
    pub rank: u32,
    /// The node its pod ran on.
    pub host: Option<String>,
    /// Its agent's result (from its log, else its termination message, else
    /// made from its pod's end); `None`: its pod never ran.
    pub result: Option<CellResult>,
}

/// The GPU telemetry figures of a result (`gpu_*`, energy, power), as the
/// slurm backend keeps them per node.
pub fn telemetry_metrics(m: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    m.iter()
        .filter(|(k, _)| k.starts_with("gpu_") || k.contains("energy") || k.contains("power"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// Did this end come from the rank itself (not a stop from outside, a lost
/// pod, or success)?
fn failed_by_itself(r: &CellResult) -> bool {
    !matches!(r.status, Status::Succeeded | Status::Cancelled)
        && !r
            .failure
            .as_ref()
            .is_some_and(|f| matches!(f.kind, FailureKind::PodLost | FailureKind::Disrupted))
}

/// Put every rank into `result.info.nodes` and name the rank whose failure
/// is the cell's ([`RankEnd`]); `stopped`: orch stopped the cell.
pub fn apply(result: &mut CellResult, host0: Option<&str>, others: &[RankEnd], stopped: bool) {
    let mut nodes = vec![serde_json::json!({
        "rank": 0,
        "host": host0.unwrap_or_default(),
        "status": result.status,
        "hardware": result.hardware,
        "metrics": telemetry_metrics(&result.metrics),
    })];
    for o in others {
        let r = o.result.as_ref();
        nodes.push(serde_json::json!({
            "rank": o.rank,
            "host": o.host.clone().unwrap_or_default(),
            "status": r.map(|r| r.status.as_str()).unwrap_or("no_result"),
            "hardware": r.and_then(|r| r.hardware.clone()),
            "metrics": r.map(|r| telemetry_metrics(&r.metrics)).unwrap_or_default(),
        }));
    }
    result
        .info
        .insert("nodes".into(), serde_json::Value::Array(nodes));
    if stopped || failed_by_itself(result) {
        return;
    }
    // A rank that failed by itself first; else, when rank 0 succeeded, one
    // that did not succeed or never wrote a result.
    let culprit = others
        .iter()
        .find(|o| o.result.as_ref().is_some_and(failed_by_itself))
        .or_else(|| {
            (result.status == Status::Succeeded)
                .then(|| {
                    others
                        .iter()
                        .find(|o| o.result.as_ref().is_none_or(|r| r.status != Status::Succeeded))
                })
                .flatten()
        });
    let Some(o) = culprit else { return };
    let (status, why) = match &o.result {
        Some(r) => (
            if matches!(r.status, Status::Succeeded | Status::Cancelled) {
                Status::Failed
            } else {
                r.status
            },
            r.failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_else(|| format!("it ended {}", r.status.as_str())),
        ),
        None => (
            Status::Failed,
            "it wrote no result (its pod never ran)".to_string(),
        ),
    };
    result.status = status;
    let mut f = Failure::new(
        FailureKind::NodeRankFailed,
        format!(
            "node rank {} did not succeed: {why}; its logs are in `nodes/{}/`",
            o.rank, o.rank
        ),
    );
    f.exit_code = o
        .result
        .as_ref()
        .and_then(|r| r.failure.as_ref())
        .and_then(|f| f.exit_code);
    result.failure = Some(f);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(cpus: u64) -> CellResult {
        let mut r = CellResult::new("c", Status::Succeeded);
        r.hardware = Some(orch_protocol::Hardware {
            cpus: cpus as usize,
            ..Default::default()
        });
        r.metrics.insert("gpu_util_mean".into(), 50.0);
        r.metrics.insert("tokens_per_s".into(), 9.0);
        r
    }

    fn failed(kind: &str, code: Option<i32>) -> CellResult {
        let mut r = CellResult::failed(
            "c",
            Status::Failed,
            FailureKind::new(kind),
            "command exited with code 1",
        );
        if let Some(f) = r.failure.as_mut() {
            f.exit_code = code;
        }
        r
    }

    fn rank(rank: u32, result: Option<CellResult>) -> RankEnd {
        RankEnd {
            rank,
            host: Some(format!("node-{rank}")),
            result,
        }
    }

    #[test]
    fn every_rank_is_in_info_nodes_in_the_slurm_shape() {
        let mut r = ok(4);
        apply(&mut r, Some("node-0"), &[rank(1, Some(ok(8)))], false);
        assert_eq!(r.status, Status::Succeeded);
        let nodes = r.info["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), 2);
        for (i, n) in nodes.iter().enumerate() {
            let keys: Vec<&str> = n.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys, ["hardware", "host", "metrics", "rank", "status"]);
            assert_eq!(n["rank"], i);
            assert_eq!(n["host"], format!("node-{i}"));
            assert_eq!(n["status"], "succeeded");
            // Telemetry only: the workload's own metrics are rank 0's, in the record.
            assert_eq!(n["metrics"], serde_json::json!({"gpu_util_mean": 50.0}));
        }
        assert_eq!(nodes[1]["hardware"]["cpus"], 8);
    }

    #[test]
    fn a_rank_that_failed_by_itself_is_the_cells_failure_even_when_rank_0_was_stopped() {
        // Rank 1 exited 1; the Job failed and its controller stopped rank 0.
        let mut r = CellResult::failed(
            "c",
            Status::Cancelled,
            FailureKind::Disrupted,
            "stopped from outside",
        );
        apply(
            &mut r,
            Some("n0"),
            &[
                rank(1, Some(failed("exit_code", Some(1)))),
                rank(2, Some(CellResult::new("c", Status::Cancelled))),
            ],
            false,
        );
        assert_eq!(r.status, Status::Failed);
        let f = r.failure.unwrap();
        assert_eq!((f.kind.as_str(), f.exit_code), ("node_rank_failed", Some(1)));
        assert!(
            f.message
                .starts_with("node rank 1 did not succeed: command exited with code 1"),
            "{}",
            f.message
        );
        assert!(f.message.contains("`nodes/1/`"), "{}", f.message);
        assert_eq!(r.info["nodes"][2]["status"], "cancelled");
    }

    #[test]
    fn rank_0s_own_failure_and_orchs_stop_stay() {
        let mut r = failed("exit_code", Some(3));
        apply(
            &mut r,
            None,
            &[rank(1, Some(CellResult::new("c", Status::Cancelled)))],
            false,
        );
        assert_eq!(r.failure.unwrap().kind, FailureKind::ExitCode);
        let mut r = CellResult::new("c", Status::Cancelled);
        apply(&mut r, None, &[rank(1, Some(failed("exit_code", Some(1))))], true);
        assert_eq!(r.status, Status::Cancelled);
        assert!(r.failure.is_none());
        // Everyone stopped from outside (a drain): the disruption stays.
        let mut r = CellResult::failed("c", Status::Cancelled, FailureKind::Disrupted, "drained");
        apply(
            &mut r,
            None,
            &[rank(1, Some(CellResult::new("c", Status::Cancelled)))],
            false,
        );
        assert_eq!(r.failure.unwrap().kind, FailureKind::Disrupted);
    }

    #[test]
    fn a_rank_without_a_result_fails_a_succeeded_cell_and_keeps_its_oom() {
        let mut r = ok(1);
        apply(&mut r, None, &[rank(1, Some(ok(1))), rank(2, None)], false);
        assert_eq!(r.status, Status::Failed);
        let f = r.failure.unwrap();
        assert!(
            f.message
                .starts_with("node rank 2 did not succeed: it wrote no result"),
            "{}",
            f.message
        );
        assert_eq!(r.info["nodes"][2]["status"], "no_result");
        let mut r = ok(1);
        let oom = CellResult::failed("c", Status::Oom, FailureKind::Oom, "OOMKilled");
        apply(&mut r, None, &[rank(1, Some(oom))], false);
        assert_eq!(
            (r.status, r.failure.unwrap().kind.as_str()),
            (Status::Oom, "node_rank_failed")
        );
    }
}
