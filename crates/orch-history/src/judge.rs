//! A run's value judged against its series' recent history: `regression`,
//! `improvement` or `normal`, with the rule written out.
//!
//! The rule: the window is the last `N` (10) succeeded points before the
//! one judged, none from before the last change point (or the last flagged
//! point, see below). With `m` and `σ` the window's mean and sample sd, the
//! value is outside when it lies beyond `m ± max(k·σ, floor·|m|)` (`k` = 3,
//! `floor` = 2%). Outside on the bad side is a `regression`, on the good
//! side an `improvement`, by the metric's sense from its name
//! ([`better_for`], `orch-stats`'s rule, the one comparisons and reports use:
//! throughputs, rates, goodput, flops, bandwidth and utilisation higher;
//! times, latencies, durations, memory, energy, cost and failures lower;
//! higher for any other name). With fewer than 5 points in the
//! window, `σ` is the larger of the sd of the `N` points before its start (the
//! noise of the level before) and the window's own (from 3 points): the sd of
//! 3 or 4 points alone is too unsure a band, and flagged the third point after
//! a real change point now and then. At the start of a series (fewer than 5
//! points, none before) a value is not judged (`no_history`).
//!
//! Accepted levels: a flagged point starts a provisional level, so the
//! re-runs after it are judged against it and not flagged again (the shift
//! is accepted, as after a change point); a point outside the provisional
//! level's band but nearer the mean of the level before the flag drops the
//! provisional level (the flag was a one-off) and is judged against the
//! plain window (the last `N` since the last change point).

use crate::changepoints::mean_var;
use serde::{Deserialize, Serialize};

/// The sense of a metric: the workspace's one rule, `orch-stats`'s (its
/// `direction` module says it), re-exported so `orch_history::better_for` is it.
pub use orch_stats::{better_for, Better};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Regression,
    Improvement,
    Normal,
    /// No earlier point to judge against.
    NoHistory,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Regression => "regression",
            Verdict::Improvement => "improvement",
            Verdict::Normal => "normal",
            Verdict::NoHistory => "no_history",
        }
    }
}

/// The window and the band of the rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct JudgeOptions {
    /// The last `window` comparable points (N).
    pub window: usize,
    /// `k` of `k·σ`.
    pub sigmas: f64,
    /// The noise floor, a fraction of the mean.
    pub noise_floor: f64,
    /// Fewer points than this in the window: `σ` from the level before.
    pub min_points: usize,
    /// A new run's metric with fewer earlier comparable points than this is
    /// not judged (`no_history`): too little history to predict anything
    /// (`judge_run`).
    #[serde(default = "default_min_history")]
    pub min_history: usize,
}

fn default_min_history() -> usize {
    5
}

impl Default for JudgeOptions {
    fn default() -> JudgeOptions {
        JudgeOptions {
            window: 10,
            sigmas: 3.0,
            noise_floor: 0.02,
            min_points: 5,
            min_history: default_min_history(),
        }
    }
}

impl JudgeOptions {
    /// The rule in words, for reports.
    pub fn rule(&self, metric: &str) -> String {
        let sense = match better_for(metric) {
            Better::Higher => "higher",
            Better::Lower => "lower",
        };
        format!(
            "outside mean ± max({}σ, {}% of mean) of the last {} points since the last change point \
             or accepted shift; {sense} is better for `{metric}`",
            self.sigmas,
            self.noise_floor * 100.0,
            self.window
        )
    }
}

/// The verdict on one value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgment {
    pub verdict: Verdict,
    pub value: f64,
    /// The window's mean and sd, and the band `[low, high]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub low: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high: Option<f64>,
    /// Points in the window, and the index (into the values) it starts at.
    pub window: usize,
    pub window_start: usize,
    /// Why a value outside the band is not flagged, or what was accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Every value of a series judged against the ones before it;
/// `change_points` are indices into `values` (the first value of each new
/// level), ascending.
pub fn judge_all(
    values: &[f64],
    change_points: &[usize],
    metric: &str,
    opts: &JudgeOptions,
) -> Vec<Judgment> {
    let better = better_for(metric);
    let n = opts.window.max(1);
    // The value at `i` against the window from `seg_start`.
    let against = |i: usize, seg_start: usize| -> Judgment {
        let v = values[i];
        let from = seg_start.max(i.saturating_sub(n));
        let window = &values[from..i];
        if window.is_empty() {
            return Judgment {
                verdict: Verdict::NoHistory,
                value: v,
                mean: None,
                sd: None,
                low: None,
                high: None,
                window: 0,
                window_start: i,
                note: None,
            };
        }
        let (mean, var) = mean_var(window);
        let before = &values[seg_start.saturating_sub(n)..seg_start];
        let sd = if window.len() >= opts.min_points || before.len() < 2 {
            var.sqrt()
        } else {
            // A short window: the noise of the level before, or the window's
            // own when larger (3 points or more).
            let own = if window.len() >= 3 { var.sqrt() } else { 0.0 };
            mean_var(before).1.sqrt().max(own)
        };
        let half = (opts.sigmas * sd).max(opts.noise_floor * mean.abs());
        let (low, high) = (mean - half, mean + half);
        let verdict = match (v > high, v < low, better) {
            // The start of a series: too few points for a band.
            _ if window.len() < opts.min_points && before.len() < 2 => Verdict::NoHistory,
            (true, _, Better::Higher) | (_, true, Better::Lower) => Verdict::Improvement,
            (true, _, Better::Lower) | (_, true, Better::Higher) => Verdict::Regression,
            _ => Verdict::Normal,
        };
        Judgment {
            verdict,
            value: v,
            mean: Some(mean),
            sd: Some(sd),
            low: Some(low),
            high: Some(high),
            window: window.len(),
            window_start: from,
            note: None,
        }
    };
    let flagged = |j: &Judgment| matches!(j.verdict, Verdict::Regression | Verdict::Improvement);
    // (start of the provisional level, mean of the level before it)
    let mut provisional: Option<(usize, f64)> = None;
    let mut out: Vec<Judgment> = Vec::with_capacity(values.len());
    for (i, &v) in values.iter().enumerate() {
        let cp_start = change_points
            .iter()
            .copied()
            .filter(|&c| c < i)
            .max()
            .unwrap_or(0);
        if provisional.is_some_and(|(p, _)| cp_start >= p) {
            provisional = None;
        }
        let mut j = match provisional {
            Some((p, old_mean)) => {
                let j = against(i, p.max(cp_start));
                let prov_mean = j.mean.unwrap_or(old_mean);
                if flagged(&j) && (v - old_mean).abs() < (v - prov_mean).abs() {
                    // Nearer the level before the flag: that flag was a
                    // one-off; judged as if it had not opened a level.
                    provisional = None;
                    let mut j = against(i, cp_start);
                    if !flagged(&j) {
                        j.note = Some(format!("back at the level before point {p}"));
                    }
                    j
                } else {
                    j
                }
            }
            None => against(i, cp_start),
        };
        if flagged(&j) {
            provisional = Some((i, j.mean.unwrap_or(v)));
        } else if let Some((p, _)) = provisional {
            j.note = Some(format!("level shift of point {p} accepted"));
        } else if cp_start > 0 && j.note.is_none() {
            j.note = Some(format!("judged since the change point at {cp_start}"));
        }
        out.push(j);
    }
    out
}

/// A new value judged against `history` (the series' earlier values,
/// oldest first) and its change points.
pub fn judge(
    history: &[f64],
    change_points: &[usize],
    new: f64,
    metric: &str,
    opts: &JudgeOptions,
) -> Judgment {
    let mut values = history.to_vec();
    values.push(new);
    let mut all = judge_all(&values, change_points, metric, opts);
    // Invariant: one judgment per value, and `values` has at least one.
    all.pop().expect("a judgment per value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changepoints::tests::series;
    use crate::changepoints::{detect, Options};

    #[test]
    fn senses() {
        // The rule is `orch-stats`'s (tested there); these are the names this
        // crate's tests and docs lean on.
        for m in ["output_throughput", "tflops", "goodput", "tokens_per_s"] {
            assert_eq!(better_for(m), Better::Higher, "{m}");
        }
        for m in [
            "ttft_ms",
            "p99_latency",
            "load_time",
            "duration_s",
            "duration",
            "setup_duration",
        ] {
            assert_eq!(better_for(m), Better::Lower, "{m}");
        }
    }

    #[test]
    fn a_longer_setup_is_a_regression() {
        // `setup_duration` was higher-is-better in `orch-stats`'s old rule and
        // lower in this crate's: one rule now, and a longer setup is worse.
        let h = series(20, &[], 0.01, 4);
        let o = JudgeOptions::default();
        assert_eq!(
            judge(&h, &[], 1150.0, "setup_duration", &o).verdict,
            Verdict::Regression
        );
        assert_eq!(
            judge(&h, &[], 850.0, "setup_duration", &o).verdict,
            Verdict::Improvement
        );
        assert!(o.rule("setup_duration").contains("lower is better"));
    }

    #[test]
    fn a_drop_is_a_regression_of_throughput_and_an_improvement_of_latency() {
        let h = series(20, &[], 0.01, 4);
        let o = JudgeOptions::default();
        assert_eq!(
            judge(&h, &[], 850.0, "output_throughput", &o).verdict,
            Verdict::Regression
        );
        assert_eq!(judge(&h, &[], 850.0, "ttft_ms", &o).verdict, Verdict::Improvement);
        assert_eq!(judge(&h, &[], 1150.0, "ttft_ms", &o).verdict, Verdict::Regression);
        let j = judge(&h, &[], 1005.0, "output_throughput", &o);
        assert_eq!(j.verdict, Verdict::Normal);
        assert_eq!(j.window, 10);
        // The noise floor: a 1.5% move in a noiseless history is normal.
        let flat = vec![1000.0; 10];
        assert_eq!(
            judge(&flat, &[], 985.0, "output_throughput", &o).verdict,
            Verdict::Normal
        );
        assert_eq!(
            judge(&flat, &[], 975.0, "output_throughput", &o).verdict,
            Verdict::Regression
        );
        assert_eq!(judge(&[], &[], 1.0, "x", &o).verdict, Verdict::NoHistory);
        assert!(o.rule("ttft_ms").contains("lower is better"));
    }

    #[test]
    fn re_runs_of_one_regression_are_flagged_once() {
        // 30 points, a 20% drop, 20 re-runs at the new level (1% noise).
        let x = series(51, &[(30, -0.20)], 0.01, 9);
        let o = JudgeOptions::default();
        // Before any change point is known (history too short to find it)...
        let js = judge_all(&x, &[], "output_throughput", &o);
        let flagged: Vec<usize> = js
            .iter()
            .enumerate()
            .filter(|(_, j)| j.verdict == Verdict::Regression)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(
            flagged,
            vec![30],
            "{:?}",
            js.iter().map(|j| j.verdict).collect::<Vec<_>>()
        );
        // ...and with the change point found in the history.
        let cps: Vec<usize> = detect(&x, &Options::default()).iter().map(|c| c.index).collect();
        assert_eq!(cps, vec![30]);
        let js = judge_all(&x, &cps, "output_throughput", &o);
        let flagged: Vec<usize> = js
            .iter()
            .enumerate()
            .filter(|(_, j)| j.verdict == Verdict::Regression)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(flagged, vec![30]);
        assert!(
            js[45]
                .note
                .as_deref()
                .unwrap_or("")
                .contains("change point at 30"),
            "{:?}",
            js[45]
        );
        // A new re-run at the new level, judged against the history.
        let last = judge(&x, &cps, x[40], "output_throughput", &o);
        assert_eq!(last.verdict, Verdict::Normal);
        assert!(last.window_start >= 30);
    }

    #[test]
    fn a_one_off_outlier_is_flagged_once_and_the_level_kept() {
        let mut x = series(30, &[], 0.01, 11);
        x[20] = 700.0;
        let js = judge_all(&x, &[], "output_throughput", &JudgeOptions::default());
        let flagged: Vec<usize> = (1..30)
            .filter(|&i| matches!(js[i].verdict, Verdict::Regression | Verdict::Improvement))
            .collect();
        assert_eq!(flagged, vec![20], "{:#?}", &js[19..23]);
        assert!(js[21].note.as_deref().unwrap_or("").contains("back at the level"));
    }
}
