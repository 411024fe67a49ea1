//! One cell: its stored record (`cells/<id>/result.json`) and the view of it
//! in a run record.

use crate::{CellCost, Diagnosis};
use chrono::{DateTime, Utc};
use orch_protocol::{Failure, Hardware, Phase, Status, StreamInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The stored record of one finished cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    pub id: String,
    pub benchmark: String,
    pub status: Status,
    pub gpu: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metrics: BTreeMap<String, f64>,
    pub timings: BTreeMap<Phase, f64>,
    pub failure: Option<Failure>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Wall-clock seconds from launch to record, as the host saw it.
    pub duration_s: f64,
    pub stdout: StreamInfo,
    pub stderr: StreamInfo,
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
    /// 1 for the first try; earlier unfinished tries are under `interrupted/`.
    pub attempt: u32,
    /// The named cause of a failure, read from the cell's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
    /// The hardware the cell ran on (GPUs, driver, CUDA), as the agent saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<Hardware>,
    /// `hardware_mismatch`, `degraded_gpu`: the numbers are suspect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// What the cell cost, by phase; a failed cell's cost is waste.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CellCost>,
}

/// `info` key: when the platform started the cell's container (RFC 3339, by the
/// platform's own clock where it says one: Docker's `State.StartedAt`, the pod's
/// container `startedAt`, Slurm's `StartTime`, Modal's sandbox getting its task; the local
/// backend says none: this host is billed for the cell's whole time); `null`: the cell ended before any container was started.
/// Billing starts there ([`CellRecord::billed_s`]).
pub const CONTAINER_STARTED_AT: &str = "container_started_at";

impl CellRecord {
    /// The seconds a platform bills for this cell: from the start of its container
    /// ([`CONTAINER_STARTED_AT`], never before orch launched the cell) to the record,
    /// none when no container was ever started, and the whole `duration_s` when the
    /// backend did not say (records of an older orch).
    pub fn billed_s(&self) -> f64 {
        let whole = if self.duration_s.is_finite() {
            self.duration_s.max(0.0)
        } else {
            0.0
        };
        match self.info.get(CONTAINER_STARTED_AT) {
            Some(serde_json::Value::Null) => 0.0,
            Some(serde_json::Value::String(at)) => match DateTime::parse_from_rfc3339(at) {
                Ok(at) => {
                    let from = at.with_timezone(&Utc).max(self.started_at);
                    ((self.finished_at - from).num_milliseconds() as f64 / 1000.0).clamp(0.0, whole)
                }
                Err(_) => whole,
            },
            _ => whole,
        }
    }
}

#[cfg(feature = "plan")]
impl CellRecord {
    /// The record of an attempt at a planned cell from the agent's result;
    /// no diagnosis or cost yet (the runner adds them).
    pub fn from_result(
        plan_cell: &orch_manifest::CellPlan,
        result: orch_protocol::CellResult,
        started_at: DateTime<Utc>,
        finished_at: DateTime<Utc>,
        attempt: u32,
    ) -> CellRecord {
        CellRecord {
            id: plan_cell.id.clone(),
            benchmark: plan_cell.benchmark.clone(),
            status: result.status,
            gpu: plan_cell.gpu.to_string(),
            params: plan_cell.params.clone(),
            metrics: result.metrics,
            timings: result.timings,
            failure: result.failure,
            started_at,
            finished_at,
            duration_s: (finished_at - started_at).num_milliseconds() as f64 / 1000.0,
            stdout: result.stdout,
            stderr: result.stderr,
            info: result.info,
            attempt,
            diagnosis: None,
            hardware: result.hardware,
            flags: result.flags,
            cost: None,
        }
    }
}

/// A cell's status as a run record shows it: its record's, or `pending`
/// (no record yet). Serialised as the word (`succeeded`, ..., `pending`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    Succeeded,
    Failed,
    Oom,
    Timeout,
    Cancelled,
    /// Not run yet, or its run did not finish.
    Pending,
}

impl CellStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Pending => "pending",
            CellStatus::Succeeded => Status::Succeeded.as_str(),
            CellStatus::Failed => Status::Failed.as_str(),
            CellStatus::Oom => Status::Oom.as_str(),
            CellStatus::Timeout => Status::Timeout.as_str(),
            CellStatus::Cancelled => Status::Cancelled.as_str(),
        }
    }

    /// Its record's status; `None` while pending.
    pub fn recorded(self) -> Option<Status> {
        match self {
            CellStatus::Pending => None,
            CellStatus::Succeeded => Some(Status::Succeeded),
            CellStatus::Failed => Some(Status::Failed),
            CellStatus::Oom => Some(Status::Oom),
            CellStatus::Timeout => Some(Status::Timeout),
            CellStatus::Cancelled => Some(Status::Cancelled),
        }
    }

    /// A record whose cell `--resume` never runs again (not `cancelled`,
    /// not `pending`): [`Status::is_finished`].
    pub fn is_finished(self) -> bool {
        self.recorded().is_some_and(Status::is_finished)
    }
}

impl From<Status> for CellStatus {
    fn from(s: Status) -> CellStatus {
        match s {
            Status::Succeeded => CellStatus::Succeeded,
            Status::Failed => CellStatus::Failed,
            Status::Oom => CellStatus::Oom,
            Status::Timeout => CellStatus::Timeout,
            Status::Cancelled => CellStatus::Cancelled,
        }
    }
}

impl std::fmt::Display for CellStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CellStatus {
    type Err = String;

    /// The word, as records write it.
    fn from_str(s: &str) -> Result<CellStatus, String> {
        serde_json::from_value(serde_json::Value::String(s.to_string()))
            .map_err(|_| format!("unknown cell status `{s}`"))
    }
}

/// A cell as shown in a run record: its record, or `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellView {
    pub id: String,
    pub benchmark: String,
    pub status: CellStatus,
    pub gpu: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metrics: BTreeMap<String, f64>,
    pub timings: BTreeMap<Phase, f64>,
    pub failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
    /// The named cause of a failure (`{kind, evidence, hint}`), when it failed.
    #[serde(default)]
    pub diagnosis: Option<Diagnosis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<Hardware>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<CellCost>,
}

impl From<CellRecord> for CellView {
    /// The view of a recorded cell (its duration known).
    fn from(r: CellRecord) -> CellView {
        CellView {
            id: r.id,
            benchmark: r.benchmark,
            status: r.status.into(),
            gpu: r.gpu,
            params: r.params,
            metrics: r.metrics,
            timings: r.timings,
            failure: r.failure,
            duration_s: Some(r.duration_s),
            info: r.info,
            diagnosis: r.diagnosis,
            hardware: r.hardware,
            flags: r.flags,
            cost: r.cost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_status_is_its_word() {
        for s in [
            CellStatus::Succeeded,
            CellStatus::Failed,
            CellStatus::Oom,
            CellStatus::Timeout,
            CellStatus::Cancelled,
            CellStatus::Pending,
        ] {
            let word = serde_json::to_value(s).unwrap();
            assert_eq!(word, s.as_str());
            assert_eq!(s.as_str().parse::<CellStatus>(), Ok(s));
            if let Some(r) = s.recorded() {
                assert_eq!(serde_json::to_value(r).unwrap(), word);
                assert_eq!(CellStatus::from(r), s);
            }
        }
        assert!("running".parse::<CellStatus>().is_err());
        assert!(CellStatus::Succeeded.is_finished() && CellStatus::Oom.is_finished());
        assert!(!CellStatus::Cancelled.is_finished() && !CellStatus::Pending.is_finished());
    }

    #[test]
    fn billing_starts_with_the_container() {
        let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut r = CellRecord {
            id: "c".into(),
            benchmark: "b".into(),
            status: Status::Succeeded,
            gpu: "H100".into(),
            params: BTreeMap::new(),
            metrics: BTreeMap::new(),
            timings: BTreeMap::new(),
            failure: None,
            started_at: t0,
            finished_at: t0 + chrono::Duration::seconds(600),
            duration_s: 600.0,
            stdout: StreamInfo::default(),
            stderr: StreamInfo::default(),
            info: BTreeMap::new(),
            attempt: 1,
            diagnosis: None,
            hardware: None,
            flags: vec![],
            cost: None,
        };
        // A backend that does not say: the whole of it (as before).
        assert_eq!(r.billed_s(), 600.0);
        // Started by the platform 590 s after orch asked: 10 s.
        r.info
            .insert(CONTAINER_STARTED_AT.into(), "2026-01-01T00:09:50Z".into());
        assert_eq!(r.billed_s(), 10.0);
        // Never started: nothing.
        r.info
            .insert(CONTAINER_STARTED_AT.into(), serde_json::Value::Null);
        assert_eq!(r.billed_s(), 0.0);
        // A platform clock behind orch's: never more than the cell's own time.
        r.info
            .insert(CONTAINER_STARTED_AT.into(), "2025-12-31T23:00:00Z".into());
        assert_eq!(r.billed_s(), 600.0);
        // Or past its end: nothing.
        r.info
            .insert(CONTAINER_STARTED_AT.into(), "2026-01-01T01:00:00+00:00".into());
        assert_eq!(r.billed_s(), 0.0);
    }
}
