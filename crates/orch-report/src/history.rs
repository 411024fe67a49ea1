//! A run judged against its history (issue 33): each cell's primary
//! metric(s) against the last runs of the same suite, cell and testbed. The
//! verdicts are computed by `orch-history` in the caller, which reads the
//! store (`orch report`, `orch show`); this crate holds their shape, which
//! every format renders, and picks the metrics judged.

use crate::model::Options;
use orch_record::{CellView, CompareInfo};
use serde::{Deserialize, Serialize};

/// The run against the earlier runs of its suite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryCheck {
    /// Runs of the suite in the store created before this run.
    pub earlier_runs: usize,
    /// The fewest earlier comparable points a metric needs to be judged.
    pub min_history: usize,
    /// The rule of the verdicts, in words.
    pub rule: String,
    /// Every primary metric judged (enough history), flagged or not.
    pub judged: Vec<HistoryVerdict>,
    /// Primary metrics left unjudged: fewer than `min_history` comparable points.
    pub too_little_history: usize,
}

/// One primary metric of one cell against its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryVerdict {
    pub cell: String,
    pub metric: String,
    /// `local · NVIDIA H100 80GB HBM3 x1 · driver 580.1`.
    pub testbed: String,
    /// `regression`, `improvement` or `normal`.
    pub verdict: String,
    pub value: f64,
    /// The window's mean and sd, and the band `[low, high]` outside which a
    /// value is flagged.
    pub mean: f64,
    pub sd: f64,
    pub low: f64,
    pub high: f64,
    /// Points in the window, and its first and last run.
    pub window: usize,
    pub window_first_run: String,
    pub window_last_run: String,
    /// Earlier succeeded points of the series.
    pub history: usize,
    /// The level the window starts at when it is not the plain last `N`
    /// (`judged since the change point at ...`, `level shift of ... accepted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl HistoryVerdict {
    pub fn flagged(&self) -> bool {
        self.verdict == "regression" || self.verdict == "improvement"
    }

    /// `(value − mean) / |mean|`.
    pub fn change(&self) -> f64 {
        (self.value - self.mean) / self.mean.abs().max(f64::MIN_POSITIVE)
    }

    /// `cell x metric output_throughput: regression, 800.1 vs 1001 (-20.1%), outside [961, 1041]; window 10 runs (a..b) of 40 earlier`.
    pub fn text(&self) -> String {
        let mut s = format!(
            "{} {}: {}, {} vs mean {} ({:+.1}%), outside [{}, {}]; window: {} runs ({} .. {}) of {} earlier on {}",
            self.cell,
            self.metric,
            self.verdict,
            crate::fmt::num(self.value),
            crate::fmt::num(self.mean),
            self.change() * 100.0,
            crate::fmt::num(self.low),
            crate::fmt::num(self.high),
            self.window,
            self.window_first_run,
            self.window_last_run,
            self.history,
            self.testbed
        );
        if let Some(n) = &self.note {
            s.push_str(&format!(" ({n})"));
        }
        s
    }
}

impl HistoryCheck {
    pub fn flagged(&self) -> impl Iterator<Item = &HistoryVerdict> {
        self.judged.iter().filter(|v| v.flagged())
    }

    /// The one line said when nothing is flagged: how many metrics were
    /// judged in line with their history, or why none could be.
    pub fn summary(&self) -> String {
        let flagged = self.flagged().count();
        if self.judged.is_empty() {
            return format!(
                "not judged: too few comparable earlier runs (a metric needs {}; {} earlier run(s) of the suite)",
                self.min_history, self.earlier_runs
            );
        }
        let mut s = format!(
            "{} of {} primary metric(s) outside their history",
            flagged,
            self.judged.len()
        );
        if self.too_little_history > 0 {
            s.push_str(&format!(
                "; {} not judged (fewer than {} comparable runs)",
                self.too_little_history, self.min_history
            ));
        }
        s
    }
}

/// The metrics of a cell judged against its history: in a comparison each
/// variant's primary metric (`<variant>.<primary_metric>`); else the cell's
/// throughput metric (`--metric`, or the documented order of
/// [`crate::metrics`]). None for a cell with neither, or a comparison whose
/// `info` does not read ([`crate::Report::build`] names it).
pub fn primary_metrics(c: &CellView, options: &Options) -> Vec<String> {
    match CompareInfo::from_info(&c.info) {
        Some(Ok(cmp)) => {
            let primary = options.metric.as_deref().or(cmp.primary_metric.as_deref());
            if let Some(p) = primary {
                return cmp
                    .variants
                    .keys()
                    .map(|v| format!("{v}.{p}"))
                    .filter(|m| c.metrics.contains_key(m))
                    .collect();
            }
        }
        Some(Err(_)) => return Vec::new(),
        None => {}
    }
    crate::metrics::throughput_metric(&c.metrics, options.metric.as_deref())
        .map(|(m, _)| vec![m.to_string()])
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(v: &str) -> HistoryVerdict {
        HistoryVerdict {
            cell: "bench".into(),
            metric: "output_throughput".into(),
            testbed: "local · NVIDIA H100 x1".into(),
            verdict: v.into(),
            value: 800.0,
            mean: 1000.0,
            sd: 10.0,
            low: 970.0,
            high: 1030.0,
            window: 10,
            window_first_run: "r1".into(),
            window_last_run: "r10".into(),
            history: 30,
            note: None,
        }
    }

    #[test]
    fn a_flag_says_the_change_the_band_and_the_window() {
        let t = verdict("regression").text();
        for needle in [
            "regression",
            "-20.0%",
            "[970, 1030]",
            "10 runs (r1 .. r10)",
            "30 earlier",
        ] {
            assert!(t.contains(needle), "{needle}: {t}");
        }
        let check = HistoryCheck {
            earlier_runs: 30,
            min_history: 5,
            rule: String::new(),
            judged: vec![verdict("regression"), verdict("normal")],
            too_little_history: 1,
        };
        assert_eq!(check.flagged().count(), 1);
        assert!(check.summary().starts_with("1 of 2"), "{}", check.summary());
        let none = HistoryCheck {
            judged: vec![],
            ..check
        };
        assert!(none.summary().contains("too few"), "{}", none.summary());
    }
}
