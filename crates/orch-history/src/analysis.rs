//! A suite's history analysed: each series with its change points (named by
//! the runs around them) and the verdict on every point; the one shape the
//! renderers print and `--json` writes.

use crate::changepoints::{self, ChangePoint};
use crate::judge::{better_for, judge_all, Better, JudgeOptions, Judgment, Verdict};
use crate::series::{Point, Series, Testbed};
use chrono::{DateTime, Utc};
use orch_record::RunRecord;
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
    pub rule: String,
}

/// Every metric of every succeeded cell of `new` judged against the series
/// of `history` it belongs to (same benchmark, params, metric and
/// testbed; `new` itself left out of the history; only runs created before
/// it count), with the change points of that series. For `orch show` and
/// `orch report`: the cells flagged are those whose verdict is
/// `regression` or `improvement`.
pub fn judge_run(history: &[RunRecord], new: &RunRecord, opts: &AnalysisOptions) -> Vec<CellJudgment> {
    let earlier: Vec<RunRecord> = history
        .iter()
        .filter(|r| r.id != new.id && r.created_at <= new.created_at)
        .cloned()
        .collect();
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
    for c in new.cells.iter().filter(|c| c.status == "succeeded") {
        let testbed = Testbed::of(&new.backend, c);
        let pl = crate::series::params_label(&c.params);
        for (metric, &v) in c.metrics.iter().filter(|(_, v)| v.is_finite()) {
            let key = (c.benchmark.clone(), pl.clone(), metric.clone(), testbed.clone());
            let (values, cps) = match by_key.get(&key) {
                Some(s) => {
                    let (values, _) = s.values();
                    let cps: Vec<usize> = changepoints::detect(&values, &opts.change_points)
                        .iter()
                        .map(|c| c.index)
                        .collect();
                    (values, cps)
                }
                None => (Vec::new(), Vec::new()),
            };
            out.push(CellJudgment {
                cell: c.id.clone(),
                benchmark: c.benchmark.clone(),
                metric: metric.clone(),
                testbed_label: testbed.label(),
                history: values.len(),
                judgment: crate::judge::judge(&values, &cps, v, metric, &opts.judge),
                rule: opts.judge.rule(metric),
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
        let h200 = run(
            17,
            vec![cell("succeeded", Some(2010.0), Some(hw("NVIDIA H200", 1)))],
        );
        let js = judge_run(&runs, &h200, &o);
        assert_eq!(js[0].judgment.verdict, Verdict::Normal);
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
