//! A suite's history analysed: each series with its change points (named by
//! the runs around them) and the verdict on every point; the one shape the
//! renderers print and `--json` writes.

use crate::changepoints::{self, ChangePoint};
use crate::judge::{better_for, judge_all, Better, JudgeOptions, Judgment, Verdict};
use crate::series::{Point, Series, Testbed};
use chrono::{DateTime, Utc};
use orch_record::{CellStatus, RunRecord};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a history is analysed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct AnalysisOptions {
    pub change_points: changepoints::Options,
    pub judge: JudgeOptions,
}

/// A change point of a series, placed among its points.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangePointReport {
    /// The first point at the new level (an index into the series' points).
    pub point: usize,
    /// The last run before and the first run after the change.
    pub run_before: String,
    pub run_after: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_before: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_after: Option<String>,
    pub created_at: DateTime<Utc>,
    /// The statistics; its `index` counts succeeded points only.
    #[serde(flatten)]
    pub stats: ChangePoint,
}

/// One point and its verdict (`None` for a failure).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PointReport {
    #[serde(flatten)]
    pub point: Point,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<Verdict>,
}

/// One series analysed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesReport {
    pub benchmark: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metric: String,
    pub better: Better,
    pub testbed: Testbed,
    /// `local · NVIDIA H100 80GB HBM3 x8 · driver 580.1`.
    pub testbed_label: String,
    pub points: Vec<PointReport>,
    pub failures: usize,
    pub change_points: Vec<ChangePointReport>,
    /// The verdict on the newest succeeded point against its history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest: Option<Judgment>,
    /// The rule of the verdicts, in words.
    pub rule: String,
}

impl SeriesReport {
    pub fn params_label(&self) -> String {
        crate::series::params_label(&self.params)
    }
}

/// A suite's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct History {
    pub suite: String,
    /// Runs read (after `--since`).
    pub runs: usize,
    pub method: String,
    pub series: Vec<SeriesReport>,
}

/// The method line of reports.
pub fn method_text(o: &AnalysisOptions) -> String {
    format!(
        "E-divisive means (energy statistic, alpha = 1), permutation test with {} shuffles, p < {}, \
         at least {} points per segment; shift intervals: Welch t, 95%",
        o.change_points.permutations, o.change_points.significance, o.change_points.min_size
    )
}

/// Change points and verdicts of every series.
pub fn analyze(suite: &str, runs: usize, series: Vec<Series>, opts: &AnalysisOptions) -> History {
    let out = series.into_iter().map(|s| analyze_one(s, opts)).collect();
    History {
        suite: suite.to_string(),
        runs,
        method: method_text(opts),
        series: out,
    }
}

fn analyze_one(s: Series, opts: &AnalysisOptions) -> SeriesReport {
    let (values, at) = s.values();
    let cps = changepoints::detect(&values, &opts.change_points);
    let idx: Vec<usize> = cps.iter().map(|c| c.index).collect();
    let judged = judge_all(&values, &idx, &s.metric, &opts.judge);
    let change_points = cps
        .into_iter()
        .map(|c| {
            let after = &s.points[at[c.index]];
            let before = &s.points[at[c.index - 1]];
            ChangePointReport {
                point: at[c.index],
                run_before: before.run_id.clone(),
                run_after: after.run_id.clone(),
                commit_before: before.commit.clone(),
                commit_after: after.commit.clone(),
                created_at: after.created_at,
                stats: c,
            }
        })
        .collect();
    let mut verdicts: Vec<Option<Verdict>> = vec![None; s.points.len()];
    for (k, j) in judged.iter().enumerate() {
        verdicts[at[k]] = Some(j.verdict);
    }
    let failures = s.points.iter().filter(|p| p.value.is_none()).count();
    SeriesReport {
        better: better_for(&s.metric),
        testbed_label: s.testbed.label(),
        rule: opts.judge.rule(&s.metric),
        latest: judged.last().cloned(),
        points: s
            .points
            .into_iter()
            .zip(verdicts)
            .map(|(point, verdict)| PointReport { point, verdict })
            .collect(),
        failures,
        change_points,
        benchmark: s.benchmark,
        params: s.params,
        metric: s.metric,
        testbed: s.testbed,
    }
}

/// The verdict on one metric of one cell of a new run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellJudgment {
    pub cell: String,
    pub benchmark: String,
    pub metric: String,
    pub testbed_label: String,
    /// Earlier succeeded points of the series (0: no history).
    pub history: usize,
    pub judgment: Judgment,
    /// The first and last run of the window the value was judged against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_first_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_last_run: Option<String>,
    pub rule: String,
}

impl CellJudgment {
    /// A `regression` or an `improvement`.
    pub fn flagged(&self) -> bool {
        matches!(self.judgment.verdict, Verdict::Regression | Verdict::Improvement)
    }
}

/// The most recent points of a series searched for change points when a new
/// run is judged: the window is the last [`JudgeOptions::window`] points
/// since the last change point, so only a change point among the last few
/// points matters, and a bounded tail keeps `orch show` quick on a history
/// of 10,000 runs.
pub const JUDGE_TAIL: usize = 200;

/// Is `r` older than `new` (in the order of the history: `created_at`, then
/// run id)?
fn older(r: &RunRecord, new: &RunRecord) -> bool {
    (r.created_at, r.id.as_str()) < (new.created_at, new.id.as_str())
}

/// Every metric of every succeeded cell of `new` judged against the series
/// of `history` it belongs to (same benchmark, params, metric and
/// testbed), with the change points of that series; see [`judge_run_with`].
pub fn judge_run(history: &[RunRecord], new: &RunRecord, opts: &AnalysisOptions) -> Vec<CellJudgment> {
    judge_run_with(history, new, opts, |c| c.metrics.keys().cloned().collect())
}

/// The metrics `select` names of every succeeded cell of `new` judged
/// against their series in `history` (for `orch show`/`orch report`, which
/// judge each cell's primary metrics). Only runs older than `new`
/// (`created_at`, then id) count; `new` itself never does. The series' last
/// [`JUDGE_TAIL`] values are searched for change points, then the value is
/// judged by [`crate::judge::judge`]. A metric with fewer than
/// `opts.judge.min_history` earlier values gets `no_history` (too few
/// comparable runs to say anything).
pub fn judge_run_with(
    history: &[RunRecord],
    new: &RunRecord,
    opts: &AnalysisOptions,
    select: impl Fn(&orch_record::CellView) -> Vec<String>,
) -> Vec<CellJudgment> {
    let earlier: Vec<RunRecord> = history.iter().filter(|r| older(r, new)).cloned().collect();
    let series = crate::series::build(&earlier, &crate::series::Filter::default());
    let by_key: BTreeMap<(String, String, String, Testbed), &Series> = series
        .iter()
        .map(|s| {
            (
                (
                    s.benchmark.clone(),
                    s.params_label(),
                    s.metric.clone(),
                    s.testbed.clone(),
                ),
                s,
            )
        })
        .collect();
    let mut out = Vec::new();
    for c in new.cells.iter().filter(|c| c.status == CellStatus::Succeeded) {
        let testbed = Testbed::of(&new.backend, c);
        let pl = crate::series::params_label(&c.params);
        for metric in select(c) {
            let Some(v) = c.metrics.get(&metric).copied().filter(|v| v.is_finite()) else {
                continue;
            };
            let key = (c.benchmark.clone(), pl.clone(), metric.clone(), testbed.clone());
            let (all, at, points) = match by_key.get(&key) {
                Some(s) => {
                    let (values, at) = s.values();
                    (values, at, s.points.as_slice())
                }
                None => (Vec::new(), Vec::new(), &[][..]),
            };
            let from = all.len().saturating_sub(JUDGE_TAIL);
            let values = &all[from..];
            let cps: Vec<usize> = changepoints::detect(values, &opts.change_points)
                .iter()
                .map(|c| c.index)
                .collect();
            let mut judgment = crate::judge::judge(values, &cps, v, &metric, &opts.judge);
            if all.len() < opts.judge.min_history {
                judgment.verdict = Verdict::NoHistory;
            }
            let run_at = |k: usize| {
                at.get(from + k)
                    .and_then(|&i| points.get(i))
                    .map(|p| p.run_id.clone())
            };
            let (first, last) = if judgment.window > 0 {
                (
                    run_at(judgment.window_start),
                    run_at(judgment.window_start + judgment.window - 1),
                )
            } else {
                (None, None)
            };
            out.push(CellJudgment {
                cell: c.id.clone(),
                benchmark: c.benchmark.clone(),
                metric: metric.clone(),
                testbed_label: testbed.label(),
                history: all.len(),
                window_first_run: first,
                window_last_run: last,
                rule: opts.judge.rule(&metric),
                judgment,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::changepoints::tests::series;
    use crate::series::tests::{cell, hw, run};

    #[test]
    fn a_new_run_is_judged_against_its_own_testbed() {
        let h100 = || Some(hw("NVIDIA H100 80GB HBM3", 1));
        let values = series(15, &[], 0.01, 3);
        let mut runs: Vec<RunRecord> = values
            .iter()
            .enumerate()
            .map(|(i, v)| run(i as i64, vec![cell("succeeded", Some(*v), h100())]))
            .collect();
        // An H200 run much faster: a series of its own, never an improvement.
        runs.push(run(
            15,
            vec![cell("succeeded", Some(2000.0), Some(hw("NVIDIA H200", 1)))],
        ));
        let o = AnalysisOptions::default();
        let slow = run(16, vec![cell("succeeded", Some(800.0), h100())]);
        let js = judge_run(&runs, &slow, &o);
        assert_eq!(js.len(), 1);
        assert_eq!(js[0].judgment.verdict, Verdict::Regression);
        assert_eq!(js[0].history, 15);
        assert!(js[0].rule.contains("higher is better"));
        // The window's runs: the last `window` before the new one (point 14
        // of this series is a 2.6σ low, flagged, so a level of its own).
        let w = js[0].judgment.window;
        assert!(w >= 1, "{:?}", js[0]);
        let first = format!("run-{:04}", 15 - w);
        assert_eq!(js[0].window_first_run.as_deref(), Some(first.as_str()));
        assert_eq!(js[0].window_last_run.as_deref(), Some("run-0014"));
        // Only older runs count: a run judged in the middle of the history
        // sees the runs before it, not the ones after.
        let mut mid_later = run(7, vec![cell("succeeded", Some(800.0), h100())]);
        mid_later.id = "run-0007b".into();
        assert_eq!(judge_run(&runs, &mid_later, &o)[0].history, 8);
        let h200 = run(
            17,
            vec![cell("succeeded", Some(2010.0), Some(hw("NVIDIA H200", 1)))],
        );
        let js = judge_run(&runs, &h200, &o);
        // One earlier H200 point: too little history to judge.
        assert_eq!(js[0].judgment.verdict, Verdict::NoHistory);
        assert_eq!(js[0].history, 1);
        let new_gpu = run(18, vec![cell("succeeded", Some(5.0), Some(hw("NVIDIA B200", 1)))]);
        assert_eq!(
            judge_run(&runs, &new_gpu, &o)[0].judgment.verdict,
            Verdict::NoHistory
        );
        // A run is never judged against itself.
        runs.push(slow.clone());
        assert_eq!(judge_run(&runs, &slow, &o)[0].history, 15);
    }
}
