//! The report of one run, built from its [`RunRecord`]: what every format
//! renders. Pure: no IO.

use crate::metrics::{self, Latency};
use crate::ReportError;
use chrono::{DateTime, Utc};
use orch_protocol::{Failure, Hardware};
use orch_record::compare::{self, CompareInfo, VariantCheck};
use orch_record::{BudgetRecord, CellCost, CellStatus, CellView, Diagnosis, RunRecord};
use orch_stats::Better;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bumped when a field of the JSON report changes meaning or goes away.
pub const REPORT_VERSION: u32 = 1;

/// What the caller chose (`--metric`, `--latency`); `None` is the default
/// order of [`crate::metrics`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// The throughput metric to rank by.
    pub metric: Option<String>,
    /// The latency family to summarise (`step_time`, `ttft`, ...).
    pub latency: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub report_version: u32,
    pub run: RunInfo,
    pub options: Options,
    pub totals: Totals,
    /// One ranking per throughput metric (cells with the same metric rank together).
    pub rankings: Vec<Ranking>,
    /// Succeeded cells with a cost and an output-token rate, cheapest first.
    pub cost_ranking: Vec<CostEntry>,
    pub cells: Vec<CellRow>,
    pub comparisons: Vec<CompareCell>,
    pub failures: Vec<FailureRow>,
    /// GPU telemetry of the cells that recorded any (`gpu_*` metrics), in
    /// plan order; absent when none did (CPU runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub telemetry: Vec<TelemetryRow>,
    /// Calibration figures (`matmul_*_tflops`, `bandwidth_gbs`) against the
    /// GPU model's expected figures; absent when no cell measured any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calibration: Vec<CalibrationCell>,
    /// The throughput-latency curve of each cell whose load generator ran
    /// stages (a sweep or a saturation search), in plan order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_curves: Vec<LoadCurve>,
    /// The run judged against the earlier runs of its suite (issue 33):
    /// set by the caller that reads the store ([`Report::build`] leaves it
    /// `None`); absent in JSON when not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<crate::history::HistoryCheck>,
}

/// A cell's load stages (`rate_<r>.*` or `concurrency_<c>.*` metrics), by
/// increasing load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadCurve {
    pub cell: String,
    pub gpu: String,
    /// `rate` or `concurrency`.
    pub by: String,
    pub points: Vec<CurvePoint>,
    /// The highest rate meeting the SLO, where a saturation search ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation_rate: Option<f64>,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// The stage's metric prefix (`rate_4`).
    pub stage: String,
    /// Its load (`4`, `inf`, `2.5`).
    pub load: String,
    pub request_throughput: Option<f64>,
    pub output_throughput: Option<f64>,
    pub median_ttft_ms: Option<f64>,
    pub p99_ttft_ms: Option<f64>,
    pub p99_tpot_ms: Option<f64>,
    pub p99_e2el_ms: Option<f64>,
    pub request_goodput: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub id: String,
    pub suite: String,
    pub state: String,
    pub backend: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub hostname: String,
    pub orch_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_commit: Option<String>,
    /// Cells per status.
    pub counts: BTreeMap<String, usize>,
    /// The cap of `orch run --max-cost`, and whether it stopped the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRecord>,
}

/// What the run cost: the store's run-level sum when it has one (it counts
/// earlier attempts of resumed cells too), else the cells' costs summed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Dollars of every recorded attempt with a cost; `None` when none has one.
    pub usd: Option<f64>,
    /// Dollars of attempts that did not succeed.
    pub wasted_usd: Option<f64>,
    /// Part of `usd` spent on earlier attempts of resumed cells.
    pub earlier_attempts_usd: f64,
    /// GPU-hours billed (the cells' current records).
    pub gpu_hours: Option<f64>,
    /// Dollars per phase, summed.
    pub by_phase: BTreeMap<String, f64>,
    /// Cells whose record has a cost.
    pub cells_with_cost: usize,
    /// Cells with a cost whose GPU type has no known price on their backend.
    pub unpriced_cells: usize,
    /// Finished cells recorded without a cost (older records).
    pub cells_without_cost: usize,
}

/// A metric's value in a cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricValue {
    pub name: String,
    pub value: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRow {
    pub id: String,
    pub benchmark: String,
    pub status: CellStatus,
    /// The GPUs asked for (`H100:8`, `none`).
    pub gpu: String,
    pub params: BTreeMap<String, serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// The throughput metric (see [`metrics::THROUGHPUT_ORDER`]).
    pub throughput: Option<MetricValue>,
    /// The output-token rate that $ per 1k tokens is computed from.
    pub token_rate: Option<MetricValue>,
    /// The latency family summarised (see [`metrics::LATENCY_ORDER`]).
    pub latency: Option<Latency>,
    /// `cost.usd_per_s / token rate × 1000`, for a succeeded cell with both.
    pub usd_per_1k_tokens: Option<f64>,
    /// `cost.usd_per_gpu_s × 3600`, for a cell with GPUs and a cost.
    pub usd_per_gpu_hour: Option<f64>,
    /// Rank in its throughput ranking (1 = best).
    pub throughput_rank: Option<usize>,
    /// Rank in the cost-efficiency ranking (1 = cheapest per 1k tokens).
    pub cost_rank: Option<usize>,
    pub cost: Option<CellCost>,
    pub hardware: Option<Hardware>,
    pub flags: Vec<String>,
    pub failure: Option<Failure>,
    pub diagnosis: Option<Diagnosis>,
    /// Every metric the cell reported.
    pub metrics: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranking {
    pub metric: String,
    /// The metric's sense ([`orch_stats::better_for`]): entries best first.
    pub better: Better,
    /// What one unit of the metric is (`output tokens`, `requests`).
    pub unit: String,
    pub entries: Vec<RankEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankEntry {
    /// Competition ranking: equal values share a rank (1, 1, 3).
    pub rank: usize,
    pub cell: String,
    pub gpu: String,
    pub value: f64,
    pub usd_per_1k_tokens: Option<f64>,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostEntry {
    pub rank: usize,
    pub cell: String,
    pub gpu: String,
    pub usd_per_1k_tokens: f64,
    pub token_metric: String,
    pub token_rate: f64,
    pub usd_per_gpu_hour: Option<f64>,
    pub flags: Vec<String>,
}

/// A `compare` cell: its pairwise comparisons and its variants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareCell {
    pub cell: String,
    pub gpu: String,
    pub status: CellStatus,
    pub rounds: Option<u64>,
    pub noise: Option<f64>,
    /// The metric that decides each pair's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_metric: Option<String>,
    /// The interval method (`student_t`; older records: a bootstrap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// `auto` or the fixed count asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds_requested: Option<String>,
    /// Why the rounds stopped (`rounds`, `precision`, `max_rounds`, `timeout`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    /// Seed of the per-round variant order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The warm-up: `3 warm-up rounds (auto: steady)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<String>,
    pub rows: Vec<CompareRow>,
    pub variants: Vec<VariantRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    pub base: String,
    pub other: String,
    pub metric: String,
    /// mean(other) / mean(base).
    pub ratio: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// > 1: `other` is better, whatever the metric's direction.
    pub speedup: f64,
    pub verdict: String,
    /// One of the headline serving metrics (shown first; the text formats
    /// show only these when there are any).
    pub key: bool,
    /// The primary metric: its verdict is the pair's.
    #[serde(default)]
    pub primary: bool,
    /// Paired rounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Minimum detectable effect at this n (fraction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mde: Option<f64>,
    /// p-value (Holm-adjusted for secondary metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p: Option<f64>,
    /// The verdict on speed alone, where a gate (`output_mismatch`,
    /// `flagged`) took the verdict's place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_verdict: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantRow {
    pub name: String,
    pub status: CellStatus,
    pub rounds: Option<u64>,
    pub failure: Option<String>,
    pub diagnosis: Option<Diagnosis>,
    /// The primary metric's value in each measured round.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<f64>,
    /// Why the variant gets no verdict on speed: `output_mismatch` or
    /// `flagged`, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate_why: Option<String>,
    /// The defences' flags (`short_responses`, `token_count_disagreements`,
    /// `identical_outputs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// The output check in words (`passed: 8 of 8 answers exact`,
    /// `output_mismatch: 2 of 8 answers exact, first divergence at token 3`,
    /// `reference`), from `info.variants.<name>.output_check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_check: Option<String>,
    /// The drift of the primary metric over the measured rounds: slope per
    /// round as a fraction of the mean, with its 95% interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
}

/// A slope per round (fraction of the mean) with its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    pub slope: f64,
    pub ci_low: f64,
    pub ci_high: f64,
}

impl Drift {
    /// `+1.2%/round [-0.3, +2.7]`.
    pub fn text(&self) -> String {
        format!(
            "{:+.1}%/round [{:+.1}, {:+.1}]",
            self.slope * 100.0,
            self.ci_low * 100.0,
            self.ci_high * 100.0
        )
    }
}

/// A cell that did not succeed, with its named cause.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRow {
    pub cell: String,
    pub status: CellStatus,
    pub gpu: String,
    pub failure: Option<Failure>,
    pub diagnosis: Option<Diagnosis>,
    /// What the cell cost (all of it waste), when recorded.
    pub wasted_usd: Option<f64>,
}

/// What the agent's GPU sampler recorded for a cell (docs/results.md,
/// "Hardware, telemetry and flags"). Utilisation, power, energy and SM
/// clock cover the measured phase; peak memory and temperature the whole
/// cell. Energy is of all the cell's GPUs together, in joules.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TelemetryRow {
    pub cell: String,
    pub gpu: String,
    pub status: CellStatus,
    pub util_mean_pct: Option<f64>,
    pub power_mean_w: Option<f64>,
    pub energy_j: Option<f64>,
    pub energy_per_step_j: Option<f64>,
    pub energy_per_token_j: Option<f64>,
    pub peak_memory_bytes: Option<f64>,
    pub sm_clock_mean_mhz: Option<f64>,
    pub temp_max_c: Option<f64>,
    pub flags: Vec<String>,
}

/// A cell's calibration figures, checked against its GPU model's expected
/// figures (`info.calibration_check`) when the agent knew them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationCell {
    pub cell: String,
    /// The GPUs asked for.
    pub gpu: String,
    pub status: CellStatus,
    /// The GPU found (`NVIDIA H100 80GB HBM3`), from the check.
    pub gpu_name: Option<String>,
    /// The model whose expected figures were used (`H100`).
    pub model: Option<String>,
    /// A figure under `threshold` × expected is below (flag `degraded_gpu`).
    pub threshold: Option<f64>,
    pub figures: Vec<CalibrationFigure>,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationFigure {
    /// `matmul_bf16_tflops`, `bandwidth_gbs`, ...
    pub metric: String,
    /// `TFLOP/s`, `GB/s`.
    pub unit: String,
    pub measured: f64,
    pub expected: Option<f64>,
    /// measured / expected.
    pub ratio: Option<f64>,
    /// Under the threshold; `None` without an expected figure.
    pub below: Option<bool>,
}

/// Calibration figures in the order the report shows them; any other
/// `matmul_*_tflops` follows by name.
pub const CALIBRATION_ORDER: &[&str] = &[
    "matmul_bf16_tflops",
    "matmul_f16_tflops",
    "matmul_f32_tflops",
    "bandwidth_gbs",
];

/// Is a metric a calibration figure?
pub fn is_calibration_metric(name: &str) -> bool {
    name == "bandwidth_gbs" || (name.starts_with("matmul_") && name.ends_with("_tflops"))
}

/// The unit of a calibration figure, from its name.
pub fn calibration_unit(name: &str) -> &'static str {
    if name.ends_with("_tflops") {
        "TFLOP/s"
    } else if name.ends_with("_gbs") {
        "GB/s"
    } else {
        ""
    }
}

/// What the comparison tables' columns mean (md and html).
pub const COMPARE_NOTE: &str = "ratio = other / base; speedup > 1: `other` is better whatever the metric's direction; the primary metric decides the pair's verdict, the other metrics' p-values are Holm-adjusted; MDE: the smallest difference found 80% of the time at this n.";

/// The facts of a comparison under its title: primary metric, method,
/// how the rounds ended, the order seed.
pub fn compare_facts(c: &CompareCell) -> Vec<String> {
    let mut f = Vec::new();
    if let Some(m) = &c.primary_metric {
        f.push(format!("primary metric {m}"));
    }
    match c.method.as_deref() {
        Some("student_t") => f.push("paired log-ratios, Student t".into()),
        Some(m) => f.push(m.to_string()),
        None => f.push("bootstrap interval".into()),
    }
    if c.rounds_requested.as_deref() == Some("auto") {
        f.push("rounds: auto".into());
    }
    if let Some(w) = &c.warmup {
        f.push(w.clone());
    }
    if let Some(s) = &c.stopped_by {
        f.push(format!("stopped by {s}"));
    }
    if let Some(s) = c.seed {
        f.push(format!("order seed {s}"));
    }
    f
}

/// Headline metrics of a comparison, as `orch show` prints them.
pub const KEY_COMPARE_METRICS: &[&str] = &[
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_itl_ms",
    "mean_tpot_ms",
    "mean_e2el_ms",
];

/// $ per 1k output tokens: the cell's cost rate over its token rate.
pub fn usd_per_1k_tokens(usd_per_s: f64, tokens_per_s: f64) -> Option<f64> {
    (usd_per_s.is_finite() && tokens_per_s.is_finite() && tokens_per_s > 0.0 && usd_per_s >= 0.0)
        .then(|| usd_per_s / tokens_per_s * 1000.0)
}

/// Competition ranks of values already sorted best first: equal values
/// share a rank, the next rank skips (1, 1, 3).
pub fn competition_ranks(sorted: &[f64]) -> Vec<usize> {
    let mut out = Vec::with_capacity(sorted.len());
    for (i, v) in sorted.iter().enumerate() {
        if i > 0 && sorted[i - 1] == *v {
            out.push(out[i - 1]);
        } else {
            out.push(i + 1);
        }
    }
    out
}

fn better_first(better: Better) -> impl Fn(&f64, &f64) -> std::cmp::Ordering {
    move |a, b| match better {
        Better::Higher => b.total_cmp(a),
        Better::Lower => a.total_cmp(b),
    }
}

/// Every metric name any cell reported, for hints: the workloads' own
/// first, the agent's telemetry (`gpu_*`, `telemetry_*`) after them, so a
/// long list cut short still shows what ranks.
fn metric_names(rec: &RunRecord) -> Vec<String> {
    let mut names: Vec<String> = rec.cells.iter().flat_map(|c| c.metrics.keys().cloned()).collect();
    let agent = |n: &str| n.starts_with("gpu_") || n.starts_with("telemetry_");
    names.sort_by(|a, b| agent(a).cmp(&agent(b)).then(a.cmp(b)));
    names.dedup();
    names
}

impl Report {
    /// Build the report of a run. Errors only for a `--metric` or
    /// `--latency` that no cell has.
    pub fn build(rec: &RunRecord, options: &Options) -> Result<Report, ReportError> {
        check_choice(rec, options)?;
        let compares = compare_infos(rec)?;
        let mut cells: Vec<CellRow> = rec.cells.iter().map(|c| cell_row(c, options)).collect();

        // Throughput rankings, one per metric, groups in plan order.
        let mut rankings: Vec<Ranking> = Vec::new();
        for c in cells.iter().filter(|c| c.status == CellStatus::Succeeded) {
            let Some(t) = &c.throughput else { continue };
            if !rankings.iter().any(|r| r.metric == t.name) {
                rankings.push(Ranking {
                    metric: t.name.clone(),
                    better: orch_stats::better_for(&t.name),
                    unit: metrics::work_unit(&t.name),
                    entries: Vec::new(),
                });
            }
        }
        // A comparison ranks each measured variant (`cell[variant]`) by its
        // primary metric.
        let variant_entries = variant_rank_entries(&compares, options);
        for (metric, _) in &variant_entries {
            if !rankings.iter().any(|r| &r.metric == metric) {
                rankings.push(Ranking {
                    metric: metric.clone(),
                    better: orch_stats::better_for(metric),
                    unit: metrics::work_unit(metric),
                    entries: Vec::new(),
                });
            }
        }
        for r in &mut rankings {
            let mut members: Vec<RankEntry> = cells
                .iter()
                .filter(|c| {
                    c.status == CellStatus::Succeeded
                        && c.throughput.as_ref().is_some_and(|t| t.name == r.metric)
                })
                .map(|c| RankEntry {
                    rank: 0,
                    cell: c.id.clone(),
                    gpu: c.gpu.clone(),
                    value: value(c),
                    usd_per_1k_tokens: c.usd_per_1k_tokens,
                    flags: c.flags.clone(),
                })
                .chain(
                    variant_entries
                        .iter()
                        .filter(|(m, _)| *m == r.metric)
                        .map(|(_, e)| e.clone()),
                )
                .collect();
            let order = better_first(r.better);
            members.sort_by(|a, b| order(&a.value, &b.value));
            let values: Vec<f64> = members.iter().map(|e| e.value).collect();
            for (e, rank) in members.iter_mut().zip(competition_ranks(&values)) {
                e.rank = rank;
            }
            r.entries = members;
        }

        // Cost-efficiency: $ per 1k output tokens, cheapest first.
        let mut priced: Vec<&CellRow> = cells.iter().filter(|c| c.usd_per_1k_tokens.is_some()).collect();
        priced.sort_by(|a, b| per_1k(a).total_cmp(&per_1k(b)));
        let values: Vec<f64> = priced.iter().map(|c| per_1k(c)).collect();
        let cost_ranking: Vec<CostEntry> = priced
            .iter()
            .zip(competition_ranks(&values))
            .filter_map(|(c, rank)| {
                let t = c.token_rate.as_ref()?;
                Some(CostEntry {
                    rank,
                    cell: c.id.clone(),
                    gpu: c.gpu.clone(),
                    usd_per_1k_tokens: per_1k(c),
                    token_metric: t.name.clone(),
                    token_rate: t.value,
                    usd_per_gpu_hour: c.usd_per_gpu_hour,
                    flags: c.flags.clone(),
                })
            })
            .collect();

        for c in &mut cells {
            c.throughput_rank = rankings
                .iter()
                .flat_map(|r| r.entries.iter())
                .find(|e| e.cell == c.id)
                .map(|e| e.rank);
            c.cost_rank = cost_ranking.iter().find(|e| e.cell == c.id).map(|e| e.rank);
        }

        Ok(Report {
            report_version: REPORT_VERSION,
            run: RunInfo {
                id: rec.id.clone(),
                suite: rec.suite.clone(),
                state: serde_json::to_value(rec.state)
                    .ok()
                    .and_then(|v| v.as_str().map(String::from))
                    .unwrap_or_default(),
                backend: rec.backend.clone(),
                created_at: rec.created_at,
                updated_at: rec.updated_at,
                hostname: rec.environment.hostname.clone(),
                orch_version: rec.environment.orch_version.clone(),
                git_commit: rec.environment.git_commit.clone(),
                counts: rec.counts.clone(),
                budget: rec.budget.clone(),
            },
            options: options.clone(),
            totals: totals(rec),
            rankings,
            cost_ranking,
            comparisons: compares.iter().map(|(c, info)| compare_cell(c, info)).collect(),
            failures: rec
                .cells
                .iter()
                .filter(|c| !matches!(c.status, CellStatus::Succeeded | CellStatus::Pending))
                .map(|c| FailureRow {
                    cell: c.id.clone(),
                    status: c.status,
                    gpu: c.gpu.clone(),
                    failure: c.failure.clone(),
                    diagnosis: c.diagnosis.clone(),
                    wasted_usd: c.cost.as_ref().map(|k| k.usd),
                })
                .collect(),
            telemetry: rec.cells.iter().filter_map(telemetry_row).collect(),
            calibration: rec.cells.iter().filter_map(calibration_cell).collect(),
            load_curves: rec.cells.iter().filter_map(load_curve).collect(),
            history: None,
            cells,
        })
    }

    /// Does any cell carry a cost?
    pub fn has_cost(&self) -> bool {
        self.totals.cells_with_cost > 0
    }

    /// The energy figure the HTML chart shows: per step when any cell has
    /// it, else per token when any has that; `None` without either.
    pub fn energy_chart_figure(&self) -> Option<&'static str> {
        if self.telemetry.iter().any(|t| t.energy_per_step_j.is_some()) {
            Some("energy_per_step_j")
        } else if self.telemetry.iter().any(|t| t.energy_per_token_j.is_some()) {
            Some("energy_per_token_j")
        } else {
            None
        }
    }

    /// Does any cell carry hardware or flags?
    pub fn has_hardware(&self) -> bool {
        self.cells
            .iter()
            .any(|c| c.hardware.is_some() || !c.flags.is_empty())
    }
}

fn finite_metric(c: &CellView, name: &str) -> Option<f64> {
    c.metrics.get(name).copied().filter(|v| v.is_finite())
}

/// The load stages of a cell (see [`LoadCurve`]); `None` without stages.
pub fn load_curve(c: &CellView) -> Option<LoadCurve> {
    let mut stages: Vec<(String, String, String, f64)> = Vec::new();
    for k in c.metrics.keys() {
        let Some((stage, _)) = k.split_once('.') else {
            continue;
        };
        let Some((by, load)) = stage.split_once('_') else {
            continue;
        };
        if by != "rate" && by != "concurrency" {
            continue;
        }
        let value = if load == "inf" {
            f64::INFINITY
        } else {
            match load.replace('p', ".").parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            }
        };
        if !stages.iter().any(|(s, ..)| s == stage) {
            let shown = if load == "inf" {
                "inf".to_string()
            } else {
                load.replace('p', ".")
            };
            stages.push((stage.to_string(), by.to_string(), shown, value));
        }
    }
    let by = stages.first()?.1.clone();
    stages.retain(|s| s.1 == by);
    stages.sort_by(|a, b| a.3.total_cmp(&b.3));
    let m = |stage: &str, name: &str| finite_metric(c, &format!("{stage}.{name}"));
    Some(LoadCurve {
        cell: c.id.clone(),
        gpu: c.gpu.clone(),
        by,
        points: stages
            .iter()
            .map(|(stage, _, load, _)| CurvePoint {
                stage: stage.clone(),
                load: load.clone(),
                request_throughput: m(stage, "request_throughput"),
                output_throughput: m(stage, "output_throughput"),
                median_ttft_ms: m(stage, "median_ttft_ms"),
                p99_ttft_ms: m(stage, "p99_ttft_ms"),
                p99_tpot_ms: m(stage, "p99_tpot_ms"),
                p99_e2el_ms: m(stage, "p99_e2el_ms"),
                request_goodput: m(stage, "request_goodput"),
            })
            .collect(),
        saturation_rate: finite_metric(c, "saturation_rate"),
        flags: c.flags.clone(),
    })
}

fn telemetry_row(c: &CellView) -> Option<TelemetryRow> {
    if !c.metrics.keys().any(|k| k.starts_with("gpu_")) {
        return None;
    }
    let m = |name: &str| finite_metric(c, name);
    Some(TelemetryRow {
        cell: c.id.clone(),
        gpu: c.gpu.clone(),
        status: c.status,
        util_mean_pct: m("gpu_util_mean_pct"),
        power_mean_w: m("gpu_power_mean_w"),
        energy_j: m("gpu_energy_j"),
        energy_per_step_j: m("gpu_energy_per_step_j"),
        energy_per_token_j: m("gpu_energy_per_token_j"),
        peak_memory_bytes: m("gpu_peak_memory_bytes"),
        sm_clock_mean_mhz: m("gpu_sm_clock_mean_mhz"),
        temp_max_c: m("gpu_temp_max_c"),
        flags: c.flags.clone(),
    })
}

fn calibration_cell(c: &CellView) -> Option<CalibrationCell> {
    let check = c.info.get("calibration_check");
    let checks = check.and_then(|x| x.get("checks")).and_then(|x| x.as_object());
    let below_list: Vec<&str> = check
        .and_then(|x| x.get("below"))
        .and_then(|x| x.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let threshold = check.and_then(|x| x.get("threshold")).and_then(|x| x.as_f64());
    // Every figure the cell measured, and any the check names.
    let mut names: Vec<String> = c
        .metrics
        .keys()
        .filter(|k| is_calibration_metric(k))
        .cloned()
        .collect();
    for k in checks.into_iter().flat_map(|o| o.keys()) {
        if !names.contains(k) {
            names.push(k.clone());
        }
    }
    let rank = |n: &str| {
        CALIBRATION_ORDER
            .iter()
            .position(|x| *x == n)
            .unwrap_or(usize::MAX)
    };
    names.sort_by(|a, b| rank(a).cmp(&rank(b)).then(a.cmp(b)));
    let figures: Vec<CalibrationFigure> = names
        .into_iter()
        .filter_map(|name| {
            let chk = checks.and_then(|o| o.get(&name));
            let num = |k: &str| chk.and_then(|x| x.get(k)).and_then(|x| x.as_f64());
            let measured = finite_metric(c, &name).or_else(|| num("measured"))?;
            let expected = num("expected").filter(|e| e.is_finite() && *e > 0.0);
            let ratio = num("ratio")
                .filter(|r| r.is_finite())
                .or_else(|| expected.map(|e| measured / e));
            let below = if below_list.contains(&name.as_str()) {
                Some(true)
            } else {
                match (ratio, threshold) {
                    (Some(r), Some(t)) => Some(r < t),
                    _ => None,
                }
            };
            Some(CalibrationFigure {
                unit: calibration_unit(&name).to_string(),
                metric: name,
                measured,
                expected,
                ratio,
                below,
            })
        })
        .collect();
    if figures.is_empty() {
        return None;
    }
    let text = |k: &str| {
        check
            .and_then(|x| x.get(k))
            .and_then(|x| x.as_str())
            .map(String::from)
    };
    Some(CalibrationCell {
        cell: c.id.clone(),
        gpu: c.gpu.clone(),
        status: c.status,
        gpu_name: text("gpu"),
        model: text("model"),
        threshold,
        figures,
        flags: c.flags.clone(),
    })
}

fn value(c: &CellRow) -> f64 {
    c.throughput.as_ref().map(|t| t.value).unwrap_or(f64::NAN)
}

fn per_1k(c: &CellRow) -> f64 {
    c.usd_per_1k_tokens.unwrap_or(f64::NAN)
}

fn check_choice(rec: &RunRecord, options: &Options) -> Result<(), ReportError> {
    if let Some(m) = &options.metric {
        if !rec.cells.iter().any(|c| c.metrics.contains_key(m)) {
            return Err(ReportError::UnknownMetric {
                flag: "--metric",
                name: m.clone(),
                run: rec.id.clone(),
                available: metric_names(rec),
            });
        }
    }
    if let Some(l) = &options.latency {
        let has = rec.cells.iter().any(|c| {
            metrics::latency_families(&c.metrics)
                .iter()
                .any(|f| &f.family == l)
        });
        if !has {
            let mut fams: Vec<String> = rec
                .cells
                .iter()
                .flat_map(|c| metrics::latency_families(&c.metrics))
                .map(|f| f.family)
                .collect();
            fams.sort();
            fams.dedup();
            return Err(ReportError::UnknownMetric {
                flag: "--latency",
                name: l.clone(),
                run: rec.id.clone(),
                available: fams,
            });
        }
    }
    Ok(())
}

fn finite(m: Option<(&str, f64)>) -> Option<MetricValue> {
    m.filter(|(_, v)| v.is_finite()).map(|(n, v)| MetricValue {
        name: n.to_string(),
        value: v,
    })
}

fn cell_row(c: &CellView, options: &Options) -> CellRow {
    let succeeded = c.status == CellStatus::Succeeded;
    let throughput = finite(metrics::throughput_metric(&c.metrics, options.metric.as_deref()));
    let token_rate = finite(metrics::token_rate(&c.metrics));
    let families = metrics::latency_families(&c.metrics);
    let latency = match &options.latency {
        Some(l) => families.into_iter().find(|f| &f.family == l),
        None => families.into_iter().next(),
    };
    // An unpriced cost (no price known for the GPU on its backend) is no rate.
    let priced = c.cost.as_ref().filter(|k| k.priced);
    let usd_per_1k_tokens = match (priced, &token_rate) {
        (Some(cost), Some(t)) if succeeded => usd_per_1k_tokens(cost.usd_per_s, t.value),
        _ => None,
    };
    let usd_per_gpu_hour = priced.filter(|k| k.gpus > 0).map(|k| k.usd_per_gpu_s * 3600.0);
    CellRow {
        id: c.id.clone(),
        benchmark: c.benchmark.clone(),
        status: c.status,
        gpu: c.gpu.clone(),
        params: c.params.clone(),
        duration_s: c.duration_s,
        throughput,
        token_rate,
        latency,
        usd_per_1k_tokens,
        usd_per_gpu_hour,
        throughput_rank: None,
        cost_rank: None,
        cost: c.cost.clone(),
        hardware: c.hardware.clone(),
        flags: c.flags.clone(),
        failure: c.failure.clone(),
        diagnosis: c.diagnosis.clone(),
        metrics: c.metrics.clone(),
    }
}

fn totals(rec: &RunRecord) -> Totals {
    let mut t = Totals::default();
    let (mut usd, mut wasted, mut gpu_s) = (0.0, 0.0, 0.0);
    for c in &rec.cells {
        match &c.cost {
            Some(k) => {
                t.cells_with_cost += 1;
                if !k.priced {
                    t.unpriced_cells += 1;
                }
                usd += k.usd;
                if k.wasted || c.status != CellStatus::Succeeded {
                    wasted += k.usd;
                }
                gpu_s += k.billed_s * k.gpus as f64;
                for (p, v) in &k.by_phase {
                    *t.by_phase.entry(p.clone()).or_insert(0.0) += v;
                }
            }
            None if c.status != CellStatus::Pending => t.cells_without_cost += 1,
            None => {}
        }
    }
    if t.cells_with_cost > 0 {
        t.usd = Some(usd);
        t.wasted_usd = Some(wasted);
        t.gpu_hours = Some(gpu_s / 3600.0);
    }
    // The store's sum also counts earlier attempts (moved aside by a resume).
    if let Some(rc) = &rec.cost {
        t.usd = Some(rc.usd);
        t.wasted_usd = Some(rc.wasted_usd);
        t.earlier_attempts_usd = rc.earlier_attempts_usd;
        t.by_phase = rc.by_phase.clone();
    }
    t
}

/// The comparison cells of a run with their `info` read as
/// [`CompareInfo`]; one that does not read is an error naming the cell.
fn compare_infos(rec: &RunRecord) -> Result<Vec<(&CellView, CompareInfo)>, ReportError> {
    rec.cells
        .iter()
        .filter_map(|c| {
            CompareInfo::from_info(&c.info).map(|info| {
                info.map(|info| (c, info))
                    .map_err(|source| ReportError::Comparison {
                        run: rec.id.clone(),
                        cell: c.id.clone(),
                        source,
                    })
            })
        })
        .collect()
}

/// Ranking entries of comparison cells: each variant that measured the
/// cell's primary metric (or `--metric`), by its mean over the rounds.
fn variant_rank_entries(
    compares: &[(&CellView, CompareInfo)],
    options: &Options,
) -> Vec<(String, RankEntry)> {
    let mut out = Vec::new();
    for (c, info) in compares {
        let Some(primary) = options.metric.as_deref().or(info.primary_metric.as_deref()) else {
            continue;
        };
        for (name, v) in &info.variants {
            if v.status != orch_protocol::Status::Succeeded {
                continue;
            }
            if let Some(value) = c.metrics.get(&format!("{name}.{primary}")) {
                out.push((
                    primary.to_string(),
                    RankEntry {
                        rank: 0,
                        cell: format!("{}[{name}]", c.id),
                        gpu: c.gpu.clone(),
                        value: *value,
                        usd_per_1k_tokens: None,
                        flags: c.flags.clone(),
                    },
                ));
            }
        }
    }
    out
}

impl CompareCell {
    /// The comparison's gates and drift in plain lines (for `orch show`):
    /// each variant's gate and why, output check, flags and drift; each
    /// pair's verdict on the primary metric, its speed verdict where a gate
    /// took its place, and the drift of both sides.
    pub fn checks_text(&self) -> Vec<String> {
        let mut out = Vec::new();
        for v in &self.variants {
            let mut parts = Vec::new();
            if let Some(g) = &v.gate {
                parts.push(format!(
                    "{g}, no verdict on speed: {}",
                    v.gate_why.as_deref().unwrap_or("")
                ));
            }
            if let Some(c) = &v.output_check {
                parts.push(format!("output check {c}"));
            }
            if !v.flags.is_empty() {
                parts.push(format!("flags {}", v.flags.join(", ")));
            }
            if let Some(d) = &v.drift {
                parts.push(format!("drift {}", d.text()));
            }
            if parts.is_empty() {
                continue;
            }
            out.push(format!("variant {}: {}", v.name, parts.join("; ")));
        }
        let drift_of = |name: &str| {
            self.variants
                .iter()
                .find(|v| v.name == name)
                .and_then(|v| v.drift)
                .map(|d| d.text())
                .unwrap_or_else(|| "-".into())
        };
        for x in self.rows.iter().filter(|x| x.primary) {
            let mut s = format!("pair {} vs {}: {}", x.other, x.base, x.verdict);
            if let Some(sv) = &x.speed_verdict {
                s.push_str(&format!(" (speed: {sv})"));
            }
            s.push_str(&format!(
                ", ratio {:.3} [{:.3}, {:.3}], speedup {:.3}; drift {} {}, {} {}",
                x.ratio,
                x.ci_low,
                x.ci_high,
                x.speedup,
                x.base,
                drift_of(&x.base),
                x.other,
                drift_of(&x.other)
            ));
            out.push(s);
        }
        out
    }
}

/// `info.variants.<name>.output_check` in words.
pub fn output_check_text(check: &VariantCheck) -> String {
    let mut s = check.status().to_string();
    match check {
        VariantCheck::NotAsked { .. } => {}
        VariantCheck::Reference { answered, .. } => return format!("reference ({answered} answers)"),
        VariantCheck::Answers(a) => {
            s.push_str(&format!(": {} of {} answers exact", a.exact, a.compared));
            if let Some(d) = a.first_divergence {
                s.push_str(&format!(", first divergence at {} {d}", a.unit));
            }
            if a.rule != "exact" {
                s.push_str(&format!(" (rule: {})", a.rule));
            }
            s.push_str(&format!("; evidence {}", a.evidence));
        }
        VariantCheck::Command(_) => {}
    }
    s
}

fn compare_cell(c: &CellView, info: &CompareInfo) -> CompareCell {
    let mut rows: Vec<CompareRow> = info
        .comparison
        .iter()
        .map(|x| CompareRow {
            key: KEY_COMPARE_METRICS.contains(&x.metric.as_str()),
            primary: x.is_primary(),
            n: x.n.map(|n| n as u64),
            mde: x.mde,
            p: x.p_adjusted.or(x.p_value),
            base: x.base.clone(),
            other: x.other.clone(),
            ratio: x.ratio,
            ci_low: x.ci_low,
            ci_high: x.ci_high,
            speedup: x.speedup,
            verdict: x.verdict.to_string(),
            speed_verdict: x.speed_verdict.map(|v| v.to_string()),
            metric: x.metric.clone(),
        })
        .collect();
    // Per pair: the primary metric, the headline metrics in their documented
    // order, the rest by name.
    let pos = |m: &str| {
        KEY_COMPARE_METRICS
            .iter()
            .position(|k| *k == m)
            .unwrap_or(usize::MAX)
    };
    rows.sort_by(|a, b| {
        (
            a.base.as_str(),
            a.other.as_str(),
            !a.primary,
            pos(&a.metric),
            a.metric.as_str(),
        )
            .cmp(&(
                b.base.as_str(),
                b.other.as_str(),
                !b.primary,
                pos(&b.metric),
                b.metric.as_str(),
            ))
    });
    let primary_metric = info.primary_metric.clone();
    let variants = info
        .variants
        .iter()
        .map(|(name, v)| VariantRow {
            name: name.clone(),
            status: v.status.into(),
            rounds: Some(v.rounds as u64),
            failure: v.failure.clone(),
            diagnosis: v.diagnosis.clone(),
            values: primary_metric
                .as_deref()
                .and_then(|m| v.values.get(m))
                .cloned()
                .unwrap_or_default(),
            gate: v.gate.as_ref().map(|g| g.kind.to_string()),
            gate_why: v.gate.as_ref().map(|g| g.why.clone()),
            output_check: v.output_check.as_ref().map(output_check_text),
            flags: v.flags.clone(),
            drift: v.drift.map(|d: compare::Drift| Drift {
                slope: d.slope_per_round,
                ci_low: d.ci_low,
                ci_high: d.ci_high,
            }),
        })
        .collect();
    CompareCell {
        cell: c.id.clone(),
        gpu: c.gpu.clone(),
        status: c.status,
        rounds: Some(u64::from(info.rounds)),
        noise: Some(info.noise),
        method: info.method.map(|m| m.to_string()),
        rounds_requested: info.rounds_requested.map(|r| r.to_string()),
        stopped_by: info.stopped_by.map(|s| s.to_string()),
        seed: info.seed,
        warmup: info.warmup_stopped_by.map(|why| {
            format!(
                "{} warm-up rounds (auto: {})",
                info.warmup_rounds,
                why.map_or("?", |w| w.as_str())
            )
        }),
        primary_metric,
        rows,
        variants,
    }
}

/// The columns of the GPU telemetry table, the same in every format.
pub const TELEMETRY_COLUMNS: &[&str] = &[
    "cell",
    "GPU",
    "util %",
    "power W",
    "energy J",
    "J/step",
    "mJ/token",
    "peak memory",
    "SM MHz",
    "max °C",
];
/// The columns of a load curve's table after its first (the load), one a
/// [`CurvePoint`] figure in order; every column is a number.
pub const CURVE_COLUMNS: &[&str] = &[
    "requests/s",
    "output tok/s",
    "median TTFT ms",
    "p99 TTFT ms",
    "p99 TPOT ms",
    "p99 E2EL ms",
    "goodput req/s",
];

impl LoadCurve {
    /// The table's header: the load column, then [`CURVE_COLUMNS`].
    pub fn header(&self) -> Vec<&'static str> {
        let first = if self.by == "rate" {
            "request rate"
        } else {
            "concurrency"
        };
        std::iter::once(first)
            .chain(CURVE_COLUMNS.iter().copied())
            .collect()
    }
}

impl CurvePoint {
    /// The figures of [`CURVE_COLUMNS`], in order.
    pub fn figures(&self) -> [Option<f64>; 7] {
        [
            self.request_throughput,
            self.output_throughput,
            self.median_ttft_ms,
            self.p99_ttft_ms,
            self.p99_tpot_ms,
            self.p99_e2el_ms,
            self.request_goodput,
        ]
    }
}

/// Which [`TELEMETRY_COLUMNS`] hold numbers (right-aligned).
pub const TELEMETRY_NUMERIC: &[bool] = &[false, false, true, true, true, true, true, true, true, true];
