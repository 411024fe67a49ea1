//! What a cell cost.
//!
//! - [`catalog`]: the price catalog built in (`prices/catalog.yaml`), the
//!   user's prices file over it, and the price per second of a cell;
//! - [`cell_cost`]: a cell's cost from its billed seconds, by phase;
//!   [`record_cost`]: a recorded cell's, billed from its container's start;
//! - [`estimate`]: a cell's expected duration and cost before it runs;
//! - [`ledger`]: one line per recorded cell (`costs.jsonl`), and spend
//!   grouped by GPU, backend, suite, status or model;
//! - [`budget`]: the accounting behind `orch run --max-cost`.
//!
//! The values records keep ([`CellCost`], [`RunCost`], [`BudgetRecord`])
//! are `orch-record`'s, re-exported here under their old paths.
//!
//! No IO beyond reading a prices file.
//!
//! ## What is where
//!
//! `prices/catalog.yaml` (embedded; Modal's prices, 2025-08),
//! `catalog.rs`: the user's prices file over it (strict, `file:line:column`),
//! `Prices::rate` per backend/GPU/CPU/memory; `lib.rs`: `cell_cost` by phase + `other`,
//! `record_cost` (billed from the container's start),
//! `RunCost`; `estimate.rs`: history → similar cells → timeout upper bound; `ledger.rs`:
//! `LedgerLine`, spend by gpu/backend/suite/status/model/run; `budget.rs`:
//! `BudgetTracker` (accrued, committed, look-ahead), `BudgetRecord`. It does not: IO
//! beyond reading a prices file; know the store.

pub mod budget;
pub mod catalog;
pub mod estimate;
pub mod ledger;

pub use budget::{BudgetRecord, BudgetTracker};
pub use catalog::{CostError, Prices, Rate};
pub use estimate::{Basis, Estimate, History};
pub use ledger::{GroupBy, LedgerLine, Spend, SpendGroup};
/// The cost values records keep (`orch-record`'s), under their old paths.
pub use orch_record::{CellCost, RunCost, OTHER_PHASE};

use orch_protocol::{Phase, Status};
use std::collections::BTreeMap;

/// The cost of a cell that ran `billed_s` seconds (the host's wall time) at
/// `rate`, split by the phases in `timings`.
///
/// Each phase costs its seconds at the cell's rate; billed time no phase
/// covers (waiting for the agent's result, the host's bookkeeping) is
/// `other`. When the phases add up to more than the billed time (clocks of
/// two processes), they are scaled down so that the parts add up to `usd`.
pub fn cell_cost(rate: &Rate, status: Status, billed_s: f64, timings: &BTreeMap<Phase, f64>) -> CellCost {
    let billed_s = if billed_s.is_finite() {
        billed_s.max(0.0)
    } else {
        0.0
    };
    let phases: Vec<(Phase, f64)> = timings
        .iter()
        .filter(|(_, s)| s.is_finite() && **s > 0.0)
        .map(|(p, s)| (*p, *s))
        .collect();
    let covered: f64 = phases.iter().map(|(_, s)| s).sum();
    let scale = if covered > billed_s && covered > 0.0 {
        billed_s / covered
    } else {
        1.0
    };
    let mut by_phase = BTreeMap::new();
    for (p, s) in &phases {
        *by_phase.entry(p.as_str().to_string()).or_insert(0.0) += s * scale * rate.usd_per_s;
    }
    let other_s = (billed_s - covered * scale).max(0.0);
    by_phase.insert(OTHER_PHASE.to_string(), other_s * rate.usd_per_s);
    CellCost {
        usd: billed_s * rate.usd_per_s,
        wasted: status != Status::Succeeded,
        gpus: rate.gpus,
        gpu_type: rate.gpu_type.clone(),
        usd_per_gpu_s: rate.usd_per_gpu_s,
        usd_per_s: rate.usd_per_s,
        billed_s,
        by_phase,
        price_source: rate.source.clone(),
        priced: rate.priced,
        backend: rate.backend.clone(),
    }
}

/// The cost of a recorded cell: [`cell_cost`] over the seconds its platform bills
/// ([`orch_record::CellRecord::billed_s`]: from the start of its container, none when
/// no container was started). The time before the container started, which the
/// provision phase covers, is taken off that phase.
pub fn record_cost(rate: &Rate, record: &orch_record::CellRecord) -> CellCost {
    let billed_s = record.billed_s();
    let unbilled = (record.duration_s - billed_s).max(0.0);
    let mut timings = record.timings.clone();
    if unbilled > 0.0 {
        if let Some(p) = timings.get_mut(&Phase::Provision) {
            *p = (*p - unbilled).max(0.0);
        }
    }
    cell_cost(rate, record.status, billed_s, &timings)
}

/// Dollars for people: more digits for small amounts.
pub fn fmt_usd(usd: f64) -> String {
    let a = usd.abs();
    if a == 0.0 {
        "$0".into()
    } else if a < 0.01 {
        format!("${usd:.6}")
    } else if a < 100.0 {
        format!("${usd:.4}")
    } else {
        format!("${usd:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100x8() -> Rate {
        Prices::builtin()
            .unwrap()
            .rate("modal", &orch_manifest::GpuSpec::parse("H100:8").unwrap(), None)
    }

    #[test]
    fn h100x8_for_100_s_by_hand() {
        // The GPU part alone: 8 GPUs x 100 s x $0.001097 = $0.8776.
        let rate = h100x8();
        assert_eq!(rate.gpus, 8);
        assert!((rate.usd_per_gpu_s - 0.001097).abs() < 1e-12);
        let gpu_only = Rate {
            usd_per_s: rate.usd_per_gpu_s * 8.0,
            ..rate.clone()
        };
        let timings = BTreeMap::from([(Phase::Measure, 100.0)]);
        let c = cell_cost(&gpu_only, Status::Succeeded, 100.0, &timings);
        assert!((c.usd - 0.8776).abs() < 1e-9, "{}", c.usd);
        assert!((c.by_phase["measure"] - 0.8776).abs() < 1e-9);
        assert_eq!(c.by_phase[OTHER_PHASE], 0.0);
        assert!(!c.wasted);

        // With Modal's minimum CPU and memory request billed on top:
        // 0.125 cores x $0.0000131 + 0.125 GiB x $0.00000222 per second.
        let c = cell_cost(&rate, Status::Succeeded, 100.0, &timings);
        let cpu_mem = 100.0 * (0.125 * 0.0000131 + 0.125 * 0.00000222);
        assert!((c.usd - (0.8776 + cpu_mem)).abs() < 1e-9, "{}", c.usd);
        assert!(c.price_source.contains("2025-08"), "{}", c.price_source);
    }

    #[test]
    fn a_record_is_billed_from_its_containers_start_and_never_without_one() {
        use chrono::{DateTime, Utc};
        let t0: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let mut r = orch_record::CellRecord {
            id: "c".into(),
            benchmark: "b".into(),
            status: Status::Failed,
            gpu: "H100".into(),
            params: BTreeMap::new(),
            metrics: BTreeMap::new(),
            timings: BTreeMap::from([(Phase::Provision, 600.0)]),
            failure: None,
            started_at: t0,
            finished_at: t0 + chrono::Duration::seconds(600),
            duration_s: 600.0,
            stdout: Default::default(),
            stderr: Default::default(),
            info: BTreeMap::new(),
            attempt: 1,
            diagnosis: None,
            hardware: None,
            flags: vec![],
            cost: None,
        };
        let h100 = Rate::flat("modal", 0.001097);
        // 600 s of waiting for a sandbox that was never created: $0 (was $0.66).
        r.info
            .insert(orch_record::CONTAINER_STARTED_AT.into(), serde_json::Value::Null);
        let c = record_cost(&h100, &r);
        assert_eq!((c.usd, c.billed_s), (0.0, 0.0));
        // Started 590 s in: 10 s, none of the 590 in `provision`.
        r.info.insert(
            orch_record::CONTAINER_STARTED_AT.into(),
            "2026-01-01T00:09:50Z".into(),
        );
        r.timings.insert(Phase::Provision, 592.0);
        r.timings.insert(Phase::Measure, 8.0);
        let c = record_cost(&h100, &r);
        assert_eq!(c.billed_s, 10.0);
        assert!((c.usd - 10.0 * 0.001097).abs() < 1e-12);
        assert!((c.by_phase["provision"] - 2.0 * 0.001097).abs() < 1e-12, "{c:?}");
        // A backend that does not say: the whole wall time, as before.
        r.info.remove(orch_record::CONTAINER_STARTED_AT);
        assert_eq!(record_cost(&h100, &r).billed_s, 600.0);
    }

    #[test]
    fn phases_and_other_add_up_and_failures_are_waste() {
        let rate = Rate::flat("local", 0.5);
        let timings = BTreeMap::from([
            (Phase::Provision, 1.0),
            (Phase::Start, 2.0),
            (Phase::Measure, 4.0),
        ]);
        let c = cell_cost(&rate, Status::Failed, 10.0, &timings);
        assert!(c.wasted);
        assert!((c.usd - 5.0).abs() < 1e-12);
        assert!((c.by_phase["provision"] - 0.5).abs() < 1e-12);
        assert!((c.by_phase["other"] - 1.5).abs() < 1e-12);
        let sum: f64 = c.by_phase.values().sum();
        assert!((sum - c.usd).abs() < 1e-12);

        // Phases longer than the billed time are scaled into it.
        let c = cell_cost(&rate, Status::Succeeded, 3.5, &timings);
        let sum: f64 = c.by_phase.values().sum();
        assert!((sum - c.usd).abs() < 1e-12 && (c.usd - 1.75).abs() < 1e-12);
        assert_eq!(c.by_phase["other"], 0.0);
    }

    #[test]
    fn run_cost_sums_cells() {
        let rate = Rate::flat("local", 1.0);
        let mut run = RunCost::default();
        run.add(&cell_cost(&rate, Status::Succeeded, 2.0, &BTreeMap::new()), false);
        run.add(&cell_cost(&rate, Status::Oom, 3.0, &BTreeMap::new()), false);
        run.add(&cell_cost(&rate, Status::Cancelled, 1.0, &BTreeMap::new()), true);
        assert_eq!(run.usd, 6.0);
        assert_eq!(run.wasted_usd, 4.0);
        assert_eq!(run.earlier_attempts_usd, 1.0);
        assert_eq!(run.by_phase["other"], 6.0);
        assert_eq!(run.cells, 3);
    }
}
