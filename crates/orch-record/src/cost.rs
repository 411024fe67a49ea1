//! What a cell and a run cost, and the budget of a run, as records keep
//! them. `orch-cost` computes them (prices, phases, the budget's
//! accounting); this is only their shape and their sum.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Name of the cost entry for billed time that no phase covers.
pub const OTHER_PHASE: &str = "other";

/// The cost of one cell, as stored in its record.
///
/// Contract: the fields below are read by `orch cost`, `orch report` and
/// `orch compare`; add fields, never rename them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CellCost {
    /// Total dollars billed for the cell.
    pub usd: f64,
    /// The cell did not succeed: what it cost bought no result.
    pub wasted: bool,
    /// GPUs billed.
    pub gpus: u32,
    /// Normalised GPU type (`H100`), `None` for CPU-only cells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Price of one GPU-second.
    pub usd_per_gpu_s: f64,
    /// Everything billed per second of this cell (GPUs, CPU, memory).
    pub usd_per_s: f64,
    /// Seconds billed.
    pub billed_s: f64,
    /// Dollars per phase (`provision`, `start`, `load`, `server_start`,
    /// `warmup`, `measure`, `teardown`, `other` for time no phase covers).
    pub by_phase: BTreeMap<String, f64>,
    /// Where the price came from (`catalog: modal, 2026-11-01, https://...`,
    /// `user: ~/.config/orch/prices.yaml`, `default: local is free`).
    pub price_source: String,
    /// False when no price is known for this cell's GPU type on its backend
    /// (its `usd` then counts only what is priced, usually nothing).
    #[serde(default = "yes")]
    pub priced: bool,
    /// The backend that billed it (`local`, `docker`, `modal`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend: String,
}

fn yes() -> bool {
    true
}

/// What a whole run cost: the sum of its cells' costs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunCost {
    /// Every recorded attempt of every cell, earlier attempts included.
    pub usd: f64,
    /// The part spent on cells that did not succeed.
    pub wasted_usd: f64,
    /// Dollars per phase, over every attempt.
    pub by_phase: BTreeMap<String, f64>,
    /// Recorded attempts with a cost.
    pub cells: usize,
    /// Recorded attempts whose GPU type has no price on their backend.
    #[serde(default)]
    pub unpriced_cells: usize,
    /// The part spent on earlier attempts (moved to `interrupted/` by a
    /// resume); included in `usd` and `wasted_usd`.
    #[serde(default)]
    pub earlier_attempts_usd: f64,
}

impl RunCost {
    /// Add one recorded attempt.
    pub fn add(&mut self, cost: &CellCost, earlier_attempt: bool) {
        self.usd += cost.usd;
        if cost.wasted {
            self.wasted_usd += cost.usd;
        }
        for (p, usd) in &cost.by_phase {
            *self.by_phase.entry(p.clone()).or_insert(0.0) += usd;
        }
        self.cells += 1;
        if !cost.priced {
            self.unpriced_cells += 1;
        }
        if earlier_attempt {
            self.earlier_attempts_usd += cost.usd;
        }
    }
}

/// The budget of a run, as its record keeps it (`run.json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetRecord {
    /// The cap (`--max-cost`), in US dollars.
    pub max_usd: f64,
    /// The estimate of the cells this invocation was to run, when it started.
    pub estimate_usd: f64,
    /// The budget stopped the run (cells not launched or cancelled).
    pub stopped: bool,
    /// Why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the run's recorded cells cost when it ended (earlier invocations included).
    pub accrued_usd: f64,
    /// Seconds between two checks of the running cells.
    #[serde(default)]
    pub tick_s: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(usd: f64, wasted: bool, priced: bool) -> CellCost {
        CellCost {
            usd,
            wasted,
            priced,
            by_phase: BTreeMap::from([(OTHER_PHASE.to_string(), usd)]),
            ..CellCost::default()
        }
    }

    #[test]
    fn run_cost_sums_attempts() {
        let mut run = RunCost::default();
        run.add(&cell(2.0, false, true), false);
        run.add(&cell(3.0, true, false), false);
        run.add(&cell(1.0, true, true), true);
        assert_eq!(run.usd, 6.0);
        assert_eq!(run.wasted_usd, 4.0);
        assert_eq!(run.earlier_attempts_usd, 1.0);
        assert_eq!(run.by_phase[OTHER_PHASE], 6.0);
        assert_eq!((run.cells, run.unpriced_cells), (3, 1));
    }

    #[test]
    fn a_cost_recorded_before_priced_existed_reads_as_priced() {
        let c: CellCost = serde_json::from_value(serde_json::json!({
            "usd": 1.0, "wasted": false, "gpus": 1, "usd_per_gpu_s": 0.5,
            "usd_per_s": 0.5, "billed_s": 2.0, "by_phase": {}, "price_source": "x"
        }))
        .unwrap();
        assert!(c.priced);
        assert!(c.backend.is_empty() && c.gpu_type.is_none());
    }
}
