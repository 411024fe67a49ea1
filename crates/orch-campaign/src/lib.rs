//! Campaigns: the compare cells of a task list (`tasks:`, see
//! `orch_manifest::tasks`) scored as the agent-performance benchmarks score
//! them, from the stored records alone (re-scoring rents nothing).
//!
//! ## What is where
//!
//! `lib.rs`: a task's outcome from its cell ([`score`]), the campaign's
//! headline (valid tasks; ISO-Bench's split against the human; GSO's Opt@K;
//! SWE-Perf's mean gain; each with a bootstrap interval over tasks), the
//! failure table, and two campaigns compared task by task ([`compare`]);
//! `stats.rs`: Mann–Whitney U, the bootstrap, the sign-flip test;
//! `render.rs`: markdown, CSV, JSON and self-contained HTML.
//!
//! The definitions, with their sources, are in `docs/campaigns.md`. In
//! short, on the comparison's primary metric (its speedup: how much faster,
//! whatever the metric's direction):
//! - a task is **valid** when its baseline (and its human change, if it has
//!   one) ran, passed the checks and were measured;
//! - **ISO-Bench** (arXiv:2602.19594, "Hard metrics"): the agent against
//!   the human: `won` when more than `match_band` (5%) faster, `lost` when
//!   more than 5% slower, `matched` between, `failed` when the agent's patch
//!   failed, changed the outputs or was flagged (it stays in the denominator);
//! - **Opt@K** (GSO, arXiv:2505.23671; `gso/harness/grading/metrics.py`):
//!   a task succeeds when one of its first K attempts is correct, at least
//!   1.2x faster than the baseline (rounded to one decimal) and more than
//!   0.95 of the human's speed (`T_human / T_agent > 0.95`);
//! - **SWE-Perf** (arXiv:2507.12415; `evaluation/check_evaluation.py`): the
//!   per-task gain is the largest time reduction still significant by a
//!   one-sided Mann–Whitney U test at p < 0.1 over the measured rounds;
//!   the performance is its sum over correct tasks divided by all valid
//!   tasks (failed ones count 0).

pub mod render;
pub mod stats;

use orch_manifest::tasks::TaskInfo;
use orch_record::compare::{Better, CompareInfo, GateKind, VariantEntry, Verdict};
use orch_record::{CellStatus, CellView, FailureKind};
use serde::{Deserialize, Serialize};
use stats::Interval;
use std::collections::BTreeMap;

/// The thresholds of the scores; every one has the paper's default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// ISO-Bench's band: within it of the human is `matched` (0.05 = ±5%).
    pub match_band: f64,
    /// GSO's share of the human's speedup an attempt must exceed (0.95).
    pub opt_threshold: f64,
    /// GSO's least speedup over the baseline (1.2, rounded to 0.1).
    pub opt_min_speedup: f64,
    /// SWE-Perf's significance level (0.1).
    pub swe_perf_alpha: f64,
    /// Bootstrap resamples (10,000).
    pub resamples: usize,
    /// Seed of the bootstrap.
    pub seed: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            match_band: 0.05,
            opt_threshold: 0.95,
            opt_min_speedup: 1.2,
            swe_perf_alpha: 0.1,
            resamples: 10_000,
            seed: 0x5eed,
        }
    }
}

/// One campaign cell as the scoring reads it: the task the plan names
/// and the cell's view in the run record.
#[derive(Debug, Clone)]
pub struct TaskCell {
    pub task: TaskInfo,
    pub view: CellView,
    /// The cell's folder (for links to its logs), if known.
    pub folder: Option<String>,
}

/// Why a task (or one attempt) has no score: a named cause and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Cause {
    /// A diagnosis kind (`cuda_oom`, `patch_does_not_apply`,
    /// `startup_timeout`, ...), a gate (`output_mismatch`, `flagged`), or
    /// the cell's failure kind (`timeout`, `weights_missing`, `not_run`).
    pub kind: String,
    /// The variant it hit (`baseline`, `human`, `agent`, ...), or `cell`.
    pub variant: String,
}

/// How the agent's first attempt did against the human's change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Won,
    Matched,
    Lost,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Won => "won",
            Outcome::Matched => "matched",
            Outcome::Lost => "lost",
            Outcome::Failed => "failed",
        }
    }
}

/// One pair of variants on the primary metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairScore {
    /// How much faster `other` is than `base` (> 1: faster).
    pub speedup: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// The comparison's verdict (`faster`, `same`, `slower`, or its gate).
    pub verdict: Verdict,
}

/// One attempt of the agent at a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub variant: String,
    /// Ran, measured, same outputs, not flagged.
    pub correct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_baseline: Option<PairScore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_human: Option<PairScore>,
    /// GSO's condition met.
    pub opt: bool,
    /// SWE-Perf's gain (0 when not correct).
    pub gain: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

/// A task's scores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskScore {
    pub id: String,
    pub row: usize,
    pub cell: String,
    pub gpu: String,
    pub status: CellStatus,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The baseline (and human) ran and were measured.
    pub valid: bool,
    /// Why the task is not valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_vs_baseline: Option<PairScore>,
    /// The A/A pair (`tasks: {aa: true}`): the baseline against itself,
    /// which must come out `same`; anything else says the task's rounds
    /// are noisier than its verdicts assume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aa: Option<PairScore>,
    /// SWE-Perf's gain of the human change (the expert's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human_gain: Option<f64>,
    pub attempts: Vec<Attempt>,
    /// ISO-Bench's outcome of the first attempt (valid tasks with a human
    /// change only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// Whether one of the first k attempts met GSO's condition, k = 1..K.
    #[serde(default)]
    pub opt_at: Vec<bool>,
    /// What the cell cost (dollars).
    pub cost_usd: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
}

impl TaskScore {
    /// The first attempt.
    pub fn agent(&self) -> Option<&Attempt> {
        self.attempts.first()
    }
}

/// A share of tasks with its interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub count: usize,
    pub of: usize,
    /// `count / of` with its bootstrap interval over tasks.
    pub rate: Interval,
}

/// One line of the failure table: a cause, the tasks it removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRow {
    pub kind: String,
    pub variant: String,
    /// Tasks it made invalid (baseline, human, cell) or failed (agent).
    pub tasks: Vec<String>,
    /// Whether it removes the task from the valid ones (not an agent's).
    pub invalidates: bool,
}

/// The campaign's headline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    pub tasks: usize,
    pub valid: Share,
    /// Valid tasks with a human change: ISO-Bench's and GSO's denominator.
    pub with_human: usize,
    /// ISO-Bench's split of the agent against the human.
    pub iso: BTreeMap<Outcome, Share>,
    /// GSO's Opt@k, k = 1..K.
    pub opt_at: Vec<Share>,
    /// SWE-Perf's performance: the mean gain over valid tasks (failed = 0).
    pub swe_perf_agent: Interval,
    pub swe_perf_human: Interval,
    /// The agent's speedup over the baseline: geometric mean over valid
    /// tasks where it was correct.
    pub agent_speedup_geomean: Option<f64>,
    pub cost_usd: f64,
    /// Dollars per valid task.
    pub cost_per_valid_usd: Option<f64>,
    /// Valid tasks whose A/A pair came out other than `same` (with `aa`).
    #[serde(default)]
    pub aa_alarms: Vec<String>,
}

/// A scored campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Campaign {
    pub run: String,
    pub suite: String,
    pub options: Options,
    pub headline: Headline,
    pub failures: Vec<FailureRow>,
    pub tasks: Vec<TaskScore>,
}

#[derive(Debug, thiserror::Error)]
pub enum CampaignError {
    #[error("run `{0}` is not a campaign: its plan has no `tasks:`\nhint: `orch report` shows a run's cells; a campaign's suite has a benchmark with `tasks: FILE`")]
    NotACampaign(String),
    #[error("cell `{cell}`: its comparison does not read as this version's schema: {why}\nhint: the record was written by another version of orch")]
    Record { cell: String, why: String },
    #[error("the campaigns share no task\nhint: compare two runs of the same task list")]
    NoCommonTasks,
}

impl orch_protocol::ErrorClass for CampaignError {
    fn is_user_error(&self) -> bool {
        matches!(
            self,
            CampaignError::NotACampaign(_) | CampaignError::NoCommonTasks
        )
    }
}

/// Score every task of a campaign run.
pub fn score(run: &str, suite: &str, cells: &[TaskCell], opts: &Options) -> Result<Campaign, CampaignError> {
    if cells.is_empty() {
        return Err(CampaignError::NotACampaign(run.to_string()));
    }
    let mut tasks = Vec::with_capacity(cells.len());
    for c in cells {
        tasks.push(score_task(c, opts)?);
    }
    let headline = headline(&tasks, opts);
    let failures = failure_table(&tasks);
    Ok(Campaign {
        run: run.to_string(),
        suite: suite.to_string(),
        options: *opts,
        headline,
        failures,
        tasks,
    })
}

/// A variant's failure named: its diagnosis, else its failure's first word.
fn variant_cause(name: &str, v: &VariantEntry) -> Option<Cause> {
    if v.failed() {
        let kind = v
            .diagnosis
            .as_ref()
            .map(|d| d.kind.to_string())
            .or_else(|| {
                v.failure
                    .as_deref()
                    .filter(|f| f.contains("patch") && f.contains("apply"))
                    .map(|_| FailureKind::PatchDoesNotApply.to_string())
            })
            .unwrap_or_else(|| FailureKind::VariantFailed.to_string());
        return Some(Cause {
            kind,
            variant: name.to_string(),
        });
    }
    if let Some(g) = &v.gate {
        let kind = match g.kind {
            GateKind::OutputMismatch => g.kind.as_str().to_string(),
            GateKind::Flagged => match v.flags.first() {
                Some(f) => format!("{}: {f}", g.kind.as_str()),
                None => g.kind.as_str().to_string(),
            },
        };
        return Some(Cause {
            kind,
            variant: name.to_string(),
        });
    }
    if v.rounds == 0 {
        return Some(Cause {
            kind: "no_measurement".into(),
            variant: name.to_string(),
        });
    }
    None
}

fn pair(info: &CompareInfo, base: &str, other: &str) -> Option<PairScore> {
    if let Some(p) = info.pair(base, other) {
        return Some(PairScore {
            speedup: p.speedup,
            ci_low: p.ci_low,
            ci_high: p.ci_high,
            verdict: p.verdict,
        });
    }
    // The pair the other way round: its speedup inverted.
    info.pair(other, base).map(|p| PairScore {
        speedup: 1.0 / p.speedup,
        ci_low: 1.0 / p.ci_high,
        ci_high: 1.0 / p.ci_low,
        verdict: match p.verdict {
            Verdict::Faster => Verdict::Slower,
            Verdict::Slower => Verdict::Faster,
            v => v,
        },
    })
}

/// A variant's rounds on the primary metric as times (lower is better).
fn times(info: &CompareInfo, name: &str) -> Vec<f64> {
    let Some(metric) = info.primary_metric.as_deref() else {
        return Vec::new();
    };
    let Some(v) = info.variants.get(name) else {
        return Vec::new();
    };
    let higher = info
        .comparison
        .iter()
        .find(|m| m.metric == metric)
        .map(|m| m.better == Better::Higher)
        .unwrap_or(true);
    v.values
        .get(metric)
        .map(|xs| {
            xs.iter()
                .filter(|x| x.is_finite() && **x > 0.0)
                .map(|x| if higher { 1.0 / x } else { *x })
                .collect()
        })
        .unwrap_or_default()
}

fn score_task(c: &TaskCell, opts: &Options) -> Result<TaskScore, CampaignError> {
    let t = &c.task;
    let mut s = TaskScore {
        id: t.id.clone(),
        row: t.row,
        cell: c.view.id.clone(),
        gpu: c.view.gpu.clone(),
        status: c.view.status,
        labels: t.labels.clone(),
        model: t.model.clone(),
        valid: false,
        cause: None,
        human_vs_baseline: None,
        aa: None,
        human_gain: None,
        attempts: Vec::new(),
        outcome: None,
        opt_at: Vec::new(),
        cost_usd: c.view.cost.as_ref().map(|c| c.usd).unwrap_or(0.0),
        folder: c.folder.clone(),
    };
    let cell_cause = |kind: String| Cause {
        kind,
        variant: "cell".into(),
    };
    if c.view.status == CellStatus::Pending {
        s.cause = Some(cell_cause("not_run".into()));
        return Ok(s);
    }
    let info = match CompareInfo::from_info(&c.view.info) {
        Some(Ok(i)) => i,
        Some(Err(e)) => {
            return Err(CampaignError::Record {
                cell: c.view.id.clone(),
                why: e.to_string(),
            })
        }
        None => {
            // The cell stopped before its comparison: its own cause.
            let kind = c
                .view
                .diagnosis
                .as_ref()
                .map(|d| d.kind.to_string())
                .or_else(|| c.view.failure.as_ref().map(|f| f.kind.to_string()))
                .unwrap_or_else(|| c.view.status.as_str().to_string());
            s.cause = Some(cell_cause(kind));
            return Ok(s);
        }
    };
    let baseline = orch_manifest::tasks::BASELINE;
    let entry = |name: &str| info.variants.get(name);
    let missing = |name: &str| Cause {
        kind: match c.view.status {
            CellStatus::Succeeded => "no_measurement".into(),
            st => c
                .view
                .diagnosis
                .as_ref()
                .map(|d| d.kind.to_string())
                .unwrap_or_else(|| st.as_str().to_string()),
        },
        variant: name.to_string(),
    };
    // The references first: a task whose baseline or human change did not
    // run cleanly measures nothing of the agent.
    let mut refs = vec![baseline.to_string()];
    refs.extend(t.human.clone());
    for r in &refs {
        let cause = match entry(r) {
            None => Some(missing(r)),
            Some(v) => variant_cause(r, v),
        };
        if let Some(cause) = cause {
            s.cause = Some(cause);
            return Ok(s);
        }
    }
    // Both references ran, yet no metric decides a pair: nothing to score.
    if info.primary_metric.is_none() {
        s.cause = Some(cell_cause("no_measurement".into()));
        return Ok(s);
    }
    s.valid = true;
    s.aa = t.aa.as_ref().and_then(|a| pair(&info, baseline, a));
    let base_times = times(&info, baseline);
    if let Some(h) = &t.human {
        s.human_vs_baseline = pair(&info, baseline, h);
        s.human_gain = Some(stats::swe_perf_gain(
            &base_times,
            &times(&info, h),
            opts.swe_perf_alpha,
        ));
    }
    for a in &t.agents {
        let cause = match entry(a) {
            None => Some(missing(a)),
            Some(v) => variant_cause(a, v),
        };
        let vs_baseline = pair(&info, baseline, a);
        let vs_human = t.human.as_ref().and_then(|h| pair(&info, h, a));
        let correct = cause.is_none() && vs_baseline.is_some();
        let opt = correct
            && match (&vs_baseline, &vs_human) {
                (Some(b), Some(h)) => {
                    (b.speedup * 10.0).round() / 10.0 >= opts.opt_min_speedup
                        && b.speedup > 1.0
                        && h.speedup > opts.opt_threshold
                }
                _ => false,
            };
        let gain = if correct {
            stats::swe_perf_gain(&base_times, &times(&info, a), opts.swe_perf_alpha)
        } else {
            0.0
        };
        s.attempts.push(Attempt {
            variant: a.clone(),
            correct,
            vs_baseline,
            vs_human,
            opt,
            gain,
            cause: cause.or_else(|| (!correct).then(|| cell_cause("no_measurement".into()))),
        });
    }
    if t.human.is_some() {
        s.outcome = s.attempts.first().map(|a| match (&a.vs_human, a.correct) {
            (Some(h), true) if h.speedup > 1.0 + opts.match_band => Outcome::Won,
            (Some(h), true) if h.speedup < 1.0 - opts.match_band => Outcome::Lost,
            (Some(_), true) => Outcome::Matched,
            _ => Outcome::Failed,
        });
        let mut any = false;
        s.opt_at = s
            .attempts
            .iter()
            .map(|a| {
                any |= a.opt;
                any
            })
            .collect();
    }
    Ok(s)
}

fn share(flags: &[bool], opts: &Options, salt: u64) -> Share {
    let xs: Vec<f64> = flags.iter().map(|b| if *b { 1.0 } else { 0.0 }).collect();
    Share {
        count: flags.iter().filter(|b| **b).count(),
        of: flags.len(),
        rate: stats::bootstrap_mean(&xs, opts.resamples, opts.seed ^ salt),
    }
}

fn headline(tasks: &[TaskScore], opts: &Options) -> Headline {
    let valid_flags: Vec<bool> = tasks.iter().map(|t| t.valid).collect();
    let scored: Vec<&TaskScore> = tasks.iter().filter(|t| t.valid && t.outcome.is_some()).collect();
    let mut iso = BTreeMap::new();
    for (i, o) in [Outcome::Won, Outcome::Matched, Outcome::Lost, Outcome::Failed]
        .into_iter()
        .enumerate()
    {
        let flags: Vec<bool> = scored.iter().map(|t| t.outcome == Some(o)).collect();
        iso.insert(o, share(&flags, opts, 0x150 + i as u64));
    }
    let k_max = scored.iter().map(|t| t.opt_at.len()).max().unwrap_or(0);
    let opt_at = (1..=k_max)
        .map(|k| {
            // A task with fewer attempts than k keeps its last answer.
            let flags: Vec<bool> = scored
                .iter()
                .map(|t| t.opt_at.get(k - 1).or(t.opt_at.last()).copied().unwrap_or(false))
                .collect();
            share(&flags, opts, 0x0_97 + k as u64)
        })
        .collect();
    let valid: Vec<&TaskScore> = tasks.iter().filter(|t| t.valid).collect();
    let agent_gains: Vec<f64> = valid
        .iter()
        .map(|t| t.agent().map(|a| a.gain).unwrap_or(0.0))
        .collect();
    let human_gains: Vec<f64> = valid.iter().filter_map(|t| t.human_gain).collect();
    let logs: Vec<f64> = valid
        .iter()
        .filter_map(|t| t.agent())
        .filter(|a| a.correct)
        .filter_map(|a| a.vs_baseline.as_ref())
        .map(|p| p.speedup.ln())
        .filter(|x| x.is_finite())
        .collect();
    let cost: f64 = tasks.iter().map(|t| t.cost_usd).sum();
    let n_valid = valid.len();
    Headline {
        tasks: tasks.len(),
        valid: share(&valid_flags, opts, 0x7a1),
        with_human: scored.len(),
        iso,
        opt_at,
        swe_perf_agent: stats::bootstrap_mean(&agent_gains, opts.resamples, opts.seed ^ 0x5e),
        swe_perf_human: stats::bootstrap_mean(&human_gains, opts.resamples, opts.seed ^ 0x5f),
        agent_speedup_geomean: (!logs.is_empty())
            .then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp()),
        cost_usd: cost,
        cost_per_valid_usd: (n_valid > 0).then(|| cost / n_valid as f64),
        aa_alarms: valid
            .iter()
            .filter(|t| t.aa.as_ref().is_some_and(|p| p.verdict != Verdict::Same))
            .map(|t| t.id.clone())
            .collect(),
    }
}

/// Causes across tasks: what made tasks invalid (baseline, human, cell),
/// then what failed the agent's first attempt; most tasks first.
fn failure_table(tasks: &[TaskScore]) -> Vec<FailureRow> {
    let mut rows: BTreeMap<(bool, Cause), Vec<String>> = BTreeMap::new();
    for t in tasks {
        if let Some(c) = &t.cause {
            rows.entry((true, c.clone())).or_default().push(t.id.clone());
        } else if let Some(c) = t.agent().and_then(|a| a.cause.as_ref()) {
            rows.entry((false, c.clone())).or_default().push(t.id.clone());
        }
    }
    let mut out: Vec<FailureRow> = rows
        .into_iter()
        .map(|((invalidates, c), tasks)| FailureRow {
            kind: c.kind,
            variant: c.variant,
            tasks,
            invalidates,
        })
        .collect();
    out.sort_by(|a, b| {
        b.invalidates
            .cmp(&a.invalidates)
            .then(b.tasks.len().cmp(&a.tasks.len()))
            .then(a.kind.cmp(&b.kind))
    });
    out
}

/// Two campaigns on the same tasks, task by task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CampaignComparison {
    pub a: String,
    pub b: String,
    /// Tasks valid in both.
    pub tasks: Vec<String>,
    /// Tasks of one campaign missing (or invalid) in the other.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
    /// Mean of B's SWE-Perf gain minus A's over the common tasks.
    pub gain_diff: Interval,
    /// Two-sided paired sign-flip test of that difference.
    pub gain_p: f64,
    /// Mean of the log speedup over the baseline, B minus A (a failed
    /// attempt counts as no speedup), exponentiated: B's speed relative to A's.
    pub speedup_ratio: Interval,
    pub speedup_p: f64,
    /// Tasks where only A's first attempt met GSO's condition, and only B's.
    pub opt_only_a: Vec<String>,
    pub opt_only_b: Vec<String>,
    /// Per task: (id, A's outcome, B's outcome).
    pub outcomes: Vec<(String, Option<Outcome>, Option<Outcome>)>,
}

/// B against A, paired by task id.
pub fn compare(a: &Campaign, b: &Campaign, opts: &Options) -> Result<CampaignComparison, CampaignError> {
    let by_id = |c: &Campaign| -> BTreeMap<String, TaskScore> {
        c.tasks
            .iter()
            .filter(|t| t.valid)
            .map(|t| (t.id.clone(), t.clone()))
            .collect()
    };
    let (ma, mb) = (by_id(a), by_id(b));
    let common: Vec<String> = ma.keys().filter(|k| mb.contains_key(*k)).cloned().collect();
    if common.is_empty() {
        return Err(CampaignError::NoCommonTasks);
    }
    let speed = |t: &TaskScore| {
        t.agent()
            .filter(|a| a.correct)
            .and_then(|a| a.vs_baseline.as_ref())
            .map(|p| p.speedup.ln())
            .filter(|x| x.is_finite())
            .unwrap_or(0.0)
    };
    let gain = |t: &TaskScore| t.agent().map(|a| a.gain).unwrap_or(0.0);
    let opt1 = |t: &TaskScore| t.opt_at.first().copied().unwrap_or(false);
    let gd: Vec<f64> = common.iter().map(|k| gain(&mb[k]) - gain(&ma[k])).collect();
    let sd: Vec<f64> = common.iter().map(|k| speed(&mb[k]) - speed(&ma[k])).collect();
    let sr = stats::bootstrap_mean(&sd, opts.resamples, opts.seed ^ 0xc0);
    Ok(CampaignComparison {
        a: a.run.clone(),
        b: b.run.clone(),
        only_a: ma.keys().filter(|k| !mb.contains_key(*k)).cloned().collect(),
        only_b: mb.keys().filter(|k| !ma.contains_key(*k)).cloned().collect(),
        gain_diff: stats::bootstrap_mean(&gd, opts.resamples, opts.seed ^ 0xc1),
        gain_p: stats::sign_flip_p(&gd, opts.resamples, opts.seed ^ 0xc2),
        speedup_ratio: Interval {
            value: sr.value.exp(),
            ci_low: sr.ci_low.exp(),
            ci_high: sr.ci_high.exp(),
            n: sr.n,
        },
        speedup_p: stats::sign_flip_p(&sd, opts.resamples, opts.seed ^ 0xc3),
        opt_only_a: common
            .iter()
            .filter(|k| opt1(&ma[*k]) && !opt1(&mb[*k]))
            .cloned()
            .collect(),
        opt_only_b: common
            .iter()
            .filter(|k| opt1(&mb[*k]) && !opt1(&ma[*k]))
            .cloned()
            .collect(),
        outcomes: common
            .iter()
            .map(|k| (k.clone(), ma[k].outcome, mb[k].outcome))
            .collect(),
        tasks: common,
    })
}

#[cfg(test)]
mod tests;
