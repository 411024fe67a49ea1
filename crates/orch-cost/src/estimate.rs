//! A cell's expected duration and cost, before it runs.
//!
//! In order: the same cell's billed time in the latest earlier run of the
//! suite where it succeeded (`history`); else the median of the same
//! benchmark on the same GPUs in earlier runs (`similar`); else the cell's
//! timeout (`timeout_upper_bound`): the most it can be billed before orch
//! stops it, which is an upper bound and not a prediction.

use crate::ledger::LedgerLine;
use crate::Rate;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The same cell in an earlier run of the suite.
    History,
    /// The same benchmark on the same GPUs in earlier runs (median).
    Similar,
    /// No earlier run: the cell's timeout, an upper bound.
    TimeoutUpperBound,
}

impl Basis {
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::History => "history",
            Basis::Similar => "similar",
            Basis::TimeoutUpperBound => "timeout (upper bound)",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub seconds: f64,
    pub usd: f64,
    pub basis: Basis,
    /// The run the duration comes from (`history`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_run: Option<String>,
    /// False when the cell's GPU type has no price on its backend.
    pub priced: bool,
}

/// Durations of succeeded cells of earlier runs of one suite.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Cell id → (finished at, billed seconds, run).
    cells: BTreeMap<String, (DateTime<Utc>, f64, String)>,
    /// (benchmark, GPU spec) → billed seconds.
    similar: BTreeMap<(String, String), Vec<f64>>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    /// Add a ledger line (only succeeded cells count; the latest wins).
    pub fn add(&mut self, line: &LedgerLine) {
        if line.status != orch_protocol::Status::Succeeded.as_str() || !line.billed_s.is_finite() {
            return;
        }
        let newer = self
            .cells
            .get(&line.cell)
            .is_none_or(|(at, _, _)| *at <= line.finished_at);
        if newer {
            self.cells.insert(
                line.cell.clone(),
                (line.finished_at, line.billed_s, line.run.clone()),
            );
        }
        self.similar
            .entry((line.benchmark.clone(), line.gpu.clone()))
            .or_default()
            .push(line.billed_s);
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// Expected seconds and dollars of one cell at `rate`.
    pub fn estimate(&self, cell: &str, benchmark: &str, gpu: &str, timeout_s: f64, rate: &Rate) -> Estimate {
        let (seconds, basis, from_run) = if let Some((_, s, run)) = self.cells.get(cell) {
            (*s, Basis::History, Some(run.clone()))
        } else if let Some(m) = self
            .similar
            .get(&(benchmark.to_string(), gpu.to_string()))
            .and_then(|v| median(v))
        {
            (m, Basis::Similar, None)
        } else {
            (timeout_s, Basis::TimeoutUpperBound, None)
        };
        Estimate {
            seconds,
            usd: seconds * rate.usd_per_s,
            basis,
            from_run,
            priced: rate.priced,
        }
    }
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cell: &str, status: &str, s: f64, at: i64, run: &str) -> LedgerLine {
        LedgerLine {
            cell: cell.into(),
            benchmark: "b".into(),
            gpu: "H100".into(),
            status: status.into(),
            billed_s: s,
            run: run.into(),
            finished_at: DateTime::from_timestamp(at, 0).unwrap(),
            ..LedgerLine::default()
        }
    }

    #[test]
    fn history_then_similar_then_timeout() {
        let mut h = History::new();
        h.add(&line("b.h100.x-1", "succeeded", 10.0, 100, "r1"));
        h.add(&line("b.h100.x-1", "succeeded", 12.0, 200, "r2"));
        h.add(&line("b.h100.x-1", "failed", 99.0, 300, "r3"));
        h.add(&line("b.h100.x-2", "succeeded", 30.0, 100, "r1"));
        let rate = Rate::flat("modal", 0.5);
        let e = h.estimate("b.h100.x-1", "b", "H100", 600.0, &rate);
        assert_eq!(
            (e.seconds, e.basis, e.from_run.as_deref()),
            (12.0, Basis::History, Some("r2"))
        );
        assert_eq!(e.usd, 6.0);
        let e = h.estimate("b.h100.x-3", "b", "H100", 600.0, &rate);
        assert_eq!((e.seconds, e.basis), (12.0, Basis::Similar)); // median of 10, 12, 30
        let e = h.estimate("c.l4", "c", "L4", 600.0, &rate);
        assert_eq!(
            (e.seconds, e.basis, e.usd),
            (600.0, Basis::TimeoutUpperBound, 300.0)
        );
    }
}
