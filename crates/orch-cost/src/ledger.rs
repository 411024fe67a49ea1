//! The cost ledger: one JSON line per recorded cell attempt
//! (`<run>/costs.jsonl`), so that `orch cost` reads one small file per run
//! instead of every cell's record. The records stay the truth; the store
//! rebuilds a missing or stale ledger from them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Version of the ledger line format; a ledger of another version is rebuilt.
pub const LEDGER_VERSION: u32 = 1;

/// One recorded cell attempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerLine {
    pub v: u32,
    pub run: String,
    pub suite: String,
    pub backend: String,
    pub cell: String,
    pub attempt: u32,
    pub benchmark: String,
    /// GPU spec (`H100:8`, `none`).
    pub gpu: String,
    /// GPU type (`H100`), `none` for CPU-only cells.
    pub gpu_type: String,
    pub gpus: u32,
    /// The cell's model: its `model` parameter, else the suite's only model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub status: String,
    pub finished_at: DateTime<Utc>,
    pub billed_s: f64,
    pub usd: f64,
    pub wasted: bool,
    /// False when the record has no cost or its GPU type had no price.
    pub priced: bool,
}

/// What `orch cost --by` groups on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// GPU type (`H100`; `none` for CPU-only cells).
    Gpu,
    Backend,
    Suite,
    Status,
    /// The cell's model (`-` when it names none).
    Model,
    Run,
}

impl GroupBy {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Gpu => "gpu",
            GroupBy::Backend => "backend",
            GroupBy::Suite => "suite",
            GroupBy::Status => "status",
            GroupBy::Model => "model",
            GroupBy::Run => "run",
        }
    }

    fn key(self, l: &LedgerLine) -> &str {
        match self {
            GroupBy::Gpu => &l.gpu_type,
            GroupBy::Backend => &l.backend,
            GroupBy::Suite => &l.suite,
            GroupBy::Status => &l.status,
            GroupBy::Model => l.model.as_deref().unwrap_or("-"),
            GroupBy::Run => &l.run,
        }
    }
}

/// Spend of one group (or of everything).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpendGroup {
    pub key: String,
    /// Recorded cell attempts.
    pub cells: usize,
    /// Attempts that did not succeed.
    pub wasted_cells: usize,
    pub billed_s: f64,
    /// GPU-seconds (billed seconds times GPUs).
    pub gpu_s: f64,
    pub usd: f64,
    /// Dollars spent on attempts that did not succeed.
    pub wasted_usd: f64,
    /// Attempts with no price (not in `usd`).
    pub unpriced_cells: usize,
}

impl SpendGroup {
    fn add(&mut self, l: &LedgerLine) {
        self.cells += 1;
        self.billed_s += l.billed_s;
        self.gpu_s += l.billed_s * f64::from(l.gpus);
        self.usd += l.usd;
        if l.wasted {
            self.wasted_cells += 1;
            self.wasted_usd += l.usd;
        }
        if !l.priced {
            self.unpriced_cells += 1;
        }
    }
}

/// Spend grouped by one key: groups by dollars, most first, and the total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spend {
    pub by: GroupBy,
    pub groups: Vec<SpendGroup>,
    pub total: SpendGroup,
}

impl Spend {
    pub fn new(by: GroupBy) -> Spend {
        Spend {
            by,
            groups: Vec::new(),
            total: SpendGroup {
                key: "total".into(),
                ..Default::default()
            },
        }
    }

    /// Group `lines` (filter before). Attempts that never ran (cells the
    /// budget kept from starting: no billed time, no cost) are left out.
    pub fn aggregate<'a>(by: GroupBy, lines: impl IntoIterator<Item = &'a LedgerLine>) -> Spend {
        let mut spend = Spend::new(by);
        let mut groups: HashMap<String, SpendGroup> = HashMap::new();
        for l in lines.into_iter().filter(|l| l.billed_s > 0.0 || l.usd != 0.0) {
            let key = by.key(l);
            match groups.get_mut(key) {
                Some(g) => g.add(l),
                None => {
                    let mut g = SpendGroup {
                        key: key.to_string(),
                        ..Default::default()
                    };
                    g.add(l);
                    groups.insert(key.to_string(), g);
                }
            }
            spend.total.add(l);
        }
        spend.groups = groups.into_values().collect();
        spend
            .groups
            .sort_by(|a, b| b.usd.total_cmp(&a.usd).then_with(|| a.key.cmp(&b.key)));
        spend
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_add_up_to_the_total_with_waste_apart() {
        let mk = |gpu: &str, gpus: u32, usd: f64, wasted: bool| LedgerLine {
            gpu_type: gpu.into(),
            gpus,
            usd,
            wasted,
            billed_s: 10.0,
            priced: true,
            status: if wasted { "failed" } else { "succeeded" }.into(),
            ..Default::default()
        };
        let lines = vec![
            mk("H100", 8, 0.8776, false),
            mk("H100", 8, 0.5, true),
            mk("L4", 1, 0.1, false),
            mk("none", 0, 0.0, false),
            LedgerLine {
                gpu_type: "L4".into(),
                status: "cancelled".into(),
                wasted: true,
                ..Default::default()
            },
        ];
        let s = Spend::aggregate(GroupBy::Gpu, &lines);
        assert_eq!(s.groups[0].key, "H100");
        assert_eq!(s.groups[0].cells, 2);
        assert!((s.groups[0].usd - 1.3776).abs() < 1e-12);
        assert_eq!(s.groups[0].wasted_usd, 0.5);
        assert_eq!(s.groups[0].gpu_s, 160.0);
        assert_eq!(s.groups.len(), 3);
        let sum: f64 = s.groups.iter().map(|g| g.usd).sum();
        assert!((sum - s.total.usd).abs() < 1e-12);
        assert_eq!(s.total.wasted_cells, 1, "a cell that never ran is not counted");
        assert_eq!(s.total.cells, 4);
        let by_status = Spend::aggregate(GroupBy::Status, &lines);
        assert_eq!(
            by_status.groups.iter().find(|g| g.key == "failed").unwrap().usd,
            0.5
        );
    }
}
