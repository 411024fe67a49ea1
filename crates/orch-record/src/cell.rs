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

/// A cell as shown in a run record: its record, or `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellView {
    pub id: String,
    pub benchmark: String,
    /// `succeeded`, `failed`, `oom`, `timeout`, `cancelled` or `pending`.
    pub status: String,
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
    /// The view of a recorded cell (its status as text, its duration known).
    fn from(r: CellRecord) -> CellView {
        CellView {
            id: r.id,
            benchmark: r.benchmark,
            status: r.status.to_string(),
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
