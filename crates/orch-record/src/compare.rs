//! A comparison cell's `info` (the `compare` workload) as types: what the
//! agent writes into `CellResult::info` (`crates/orch-agent/src/compare.rs`)
//! and what every reader (reports, `orch show`, `orch bisect`, history, the
//! runner's diagnosis of failed variants) reads.
//!
//! - [`CompareInfo`]: the keys a comparison adds to `info` ([`CompareInfo::KEYS`]);
//!   the same map holds other keys of the agent's (`hostname`, `telemetry`,
//!   ...), so it is read with [`CompareInfo::from_info`] and written with
//!   [`CompareInfo::write_into`];
//! - [`VariantEntry`]: `info.variants.<name>` (its status, rounds, gate,
//!   output check, flags, lengths, drift, the diagnosis the runner adds);
//! - [`Pair`]: `info.pairs[]`, each pair's primary metric and verdict;
//! - [`MetricComparison`]: `info.comparison[]`, each pair on each metric.
//!
//! The JSON is the one stored runs hold: serialising a value read from a
//! record gives that record's JSON back (`tests/seeds.rs`). Every struct
//! denies unknown fields, so a key renamed on one side fails to read rather
//! than reading as absent; fields that older records lack carry a serde
//! default, so those records still read.

use crate::Diagnosis;
use orch_protocol::Status;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::collections::BTreeMap;

/// A comparison cell's `info`, less the keys other parts of the agent add.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareInfo {
    /// Each variant by name.
    pub variants: BTreeMap<String, VariantEntry>,
    /// Every pair (`base` before `other` in the suite's order) on every
    /// metric both measured, the primary metric first.
    pub comparison: Vec<MetricComparison>,
    /// Each pair's primary metric and verdict.
    #[serde(default)]
    pub pairs: Vec<Pair>,
    /// Measured rounds.
    pub rounds: u32,
    /// `auto` or the fixed count the suite asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rounds_requested: Option<Rounds>,
    /// The cap of `rounds: auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    /// Why the measured rounds stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<StoppedBy>,
    /// Warm-up rounds run.
    #[serde(default)]
    pub warmup_rounds: u32,
    /// `auto` when the warm-up ran until steady (`warmup_rounds: auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_rounds_requested: Option<Rounds>,
    /// The cap of `warmup_rounds: auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_warmup_rounds: Option<u32>,
    /// Present with `warmup_rounds: auto`: why the warm-up ended, `None`
    /// (`null`) when it never did (the cell stopped during it).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "present_or_null")]
    pub warmup_stopped_by: Option<Option<WarmupStop>>,
    /// The output check as planned (`null` without one).
    #[serde(default)]
    pub output_check: Option<CheckPlan>,
    /// Whether the defences (nonces, flags) were on.
    #[serde(default)]
    pub defences: bool,
    /// The nonce of each round (none without defences or a load generator).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nonces: Vec<String>,
    /// The noise threshold (0.02 = 2%) under which a difference is `same`.
    pub noise: f64,
    /// The metric that decides each pair's verdict (`null`: none measured).
    #[serde(default)]
    pub primary_metric: Option<String>,
    /// The interval's method; older records have none (a bootstrap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    /// Seed of the per-round variant order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The variants' order in each round.
    #[serde(default)]
    pub order: Vec<Vec<String>>,
}

impl CompareInfo {
    /// The keys of `info` a comparison writes.
    pub const KEYS: &'static [&'static str] = &[
        "variants",
        "comparison",
        "pairs",
        "rounds",
        "rounds_requested",
        "max_rounds",
        "stopped_by",
        "warmup_rounds",
        "warmup_rounds_requested",
        "max_warmup_rounds",
        "warmup_stopped_by",
        "output_check",
        "defences",
        "nonces",
        "noise",
        "primary_metric",
        "method",
        "confidence",
        "seed",
        "order",
    ];

    /// The comparison in a cell's `info`: `None` for a cell that is not a
    /// comparison (no `variants` or `comparison`), an error for one whose
    /// keys do not read as this schema (a key renamed, a value retyped).
    pub fn from_info(info: &BTreeMap<String, Value>) -> Option<Result<CompareInfo, serde_json::Error>> {
        if !info.contains_key("variants") && !info.contains_key("comparison") {
            return None;
        }
        let keys: serde_json::Map<String, Value> = Self::KEYS
            .iter()
            .filter_map(|k| info.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        Some(serde_json::from_value(Value::Object(keys)))
    }

    /// Its keys into a cell's `info` (other keys are left as they are).
    pub fn write_into(&self, info: &mut BTreeMap<String, Value>) {
        // A struct of string-keyed maps, strings and numbers always
        // serialises to a JSON object.
        if let Ok(Value::Object(map)) = serde_json::to_value(self) {
            info.extend(map);
        }
    }

    /// Only its `variants` into a cell's `info` (the runner adds the
    /// diagnoses of failed variants), the other keys left as they were
    /// written, whatever format wrote them.
    pub fn write_variants_into(&self, info: &mut BTreeMap<String, Value>) {
        // String-keyed maps of structs always serialise.
        if let Ok(v) = serde_json::to_value(&self.variants) {
            info.insert("variants".into(), v);
        }
    }

    /// The pair `base` vs `other`, if it was compared.
    pub fn pair(&self, base: &str, other: &str) -> Option<&Pair> {
        self.pairs.iter().find(|p| p.base == base && p.other == other)
    }
}

/// `info.variants.<name>`: one variant of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantEntry {
    /// `succeeded` or `failed`.
    pub status: Status,
    /// Why it failed (setup, a round).
    #[serde(default)]
    pub failure: Option<String>,
    /// Measured rounds it ran.
    pub rounds: usize,
    /// The primary metric's value in each measured round (by metric name).
    #[serde(default)]
    pub values: BTreeMap<String, Vec<f64>>,
    /// The primary metric in each warm-up round.
    #[serde(default)]
    pub warmup_values: Vec<f64>,
    /// The primary metric's drift over the measured rounds.
    #[serde(default)]
    pub drift: Option<Drift>,
    /// What its output check found.
    #[serde(default)]
    pub output_check: Option<VariantCheck>,
    /// The defences' flags, sorted (`short_responses`, `identical_outputs`,
    /// `shorter_outputs`, ...).
    #[serde(default)]
    pub flags: Vec<String>,
    /// Its answers' lengths against the baseline's.
    #[serde(default)]
    pub lengths: Option<Lengths>,
    /// Why it gets no verdict on speed.
    #[serde(default)]
    pub gate: Option<Gate>,
    /// Its folder in the cell's (`variants/<name>`).
    #[serde(default)]
    pub logs: String,
    /// The named cause of its failure, from its own logs (the runner adds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
}

impl VariantEntry {
    pub fn failed(&self) -> bool {
        self.status == Status::Failed
    }
}

/// The linear trend of a series of rounds (`orch_stats::trend`): slope per
/// round as a fraction of the mean, with its interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drift {
    #[serde(deserialize_with = "nan_if_null")]
    pub slope_per_round: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_high: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p_value: f64,
    pub n: usize,
}

/// The drift of both sides of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairDrift {
    pub base: Option<Drift>,
    pub other: Option<Drift>,
}

/// Why a variant gets no verdict on speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    /// Its outputs differ from the baseline's (output check, `check:`).
    OutputMismatch,
    /// The defences flagged its rounds, and not the baseline's.
    Flagged,
}

impl GateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::OutputMismatch => "output_mismatch",
            GateKind::Flagged => "flagged",
        }
    }
}

/// `info.variants.<name>.gate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gate {
    pub kind: GateKind,
    pub why: String,
}

/// The gate of a pair: the gated variant's (the other's first, an
/// `output_mismatch` before a `flagged`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairGate {
    pub kind: GateKind,
    /// The gated variant.
    pub variant: String,
    pub why: String,
}

/// The verdict on speed alone (`orch_stats::Verdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedVerdict {
    Faster,
    Slower,
    Same,
}

impl SpeedVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            SpeedVerdict::Faster => "faster",
            SpeedVerdict::Slower => "slower",
            SpeedVerdict::Same => "same",
        }
    }
}

/// A pair's verdict: on speed, or a gate in its place.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Faster,
    Slower,
    Same,
    OutputMismatch,
    Flagged,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Faster => "faster",
            Verdict::Slower => "slower",
            Verdict::Same => "same",
            Verdict::OutputMismatch => "output_mismatch",
            Verdict::Flagged => "flagged",
        }
    }
}

impl From<SpeedVerdict> for Verdict {
    fn from(v: SpeedVerdict) -> Verdict {
        match v {
            SpeedVerdict::Faster => Verdict::Faster,
            SpeedVerdict::Slower => Verdict::Slower,
            SpeedVerdict::Same => Verdict::Same,
        }
    }
}

impl From<GateKind> for Verdict {
    fn from(g: GateKind) -> Verdict {
        match g {
            GateKind::OutputMismatch => Verdict::OutputMismatch,
            GateKind::Flagged => Verdict::Flagged,
        }
    }
}

/// Which way is better for a metric (`orch_stats::Better`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// How an interval was computed (`orch_stats::Method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    StudentT,
    PercentileBootstrap,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::StudentT => "student_t",
            Method::PercentileBootstrap => "percentile_bootstrap",
        }
    }
}

/// Whether a metric decides the pair's verdict (`orch_stats::Role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Primary,
    Secondary,
}

/// `info.pairs[]`: a pair's primary metric and verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    pub base: String,
    pub other: String,
    pub metric: String,
    pub verdict: Verdict,
    #[serde(deserialize_with = "nan_if_null")]
    pub speedup: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_high: f64,
    pub n: usize,
    pub mde: Option<f64>,
    pub method: Method,
    pub drift: PairDrift,
    /// The verdict on speed, where a gate took its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_verdict: Option<SpeedVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<PairGate>,
}

/// `info.comparison[]`: `other` against `base` on one metric
/// (`orch_stats::Comparison`, with the pair's names, gate and drift).
/// Older records lack the fields that are options here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricComparison {
    pub base: String,
    pub other: String,
    pub metric: String,
    pub better: Better,
    /// other / base: the geometric mean of the per-round ratios.
    #[serde(deserialize_with = "nan_if_null")]
    pub ratio: f64,
    /// The interval of the ratio.
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub ci_high: f64,
    /// How much faster `other` is, whatever the metric's direction.
    #[serde(deserialize_with = "nan_if_null")]
    pub speedup: f64,
    /// On speed, or the pair's gate in its place.
    pub verdict: Verdict,
    pub n_base: usize,
    pub n_other: usize,
    /// Paired rounds the interval is computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<Method>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    /// Holm-adjusted p-value (secondary metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_adjusted: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// Minimum detectable effect (fraction); `null` below 2 rounds.
    #[serde(default)]
    pub mde: Option<f64>,
    /// Half-width of the interval as a fraction of the estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_values: Option<Vec<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_values: Option<Vec<f64>>,
    /// The verdict on speed, where a gate took its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_verdict: Option<SpeedVerdict>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<PairGate>,
    /// Both sides' drift (the primary metric only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<PairDrift>,
}

impl MetricComparison {
    /// The metric that decides the pair's verdict.
    pub fn is_primary(&self) -> bool {
        self.role == Some(Role::Primary)
    }
}

/// A count of rounds as the suite asked for it: `auto` or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounds {
    Auto,
    Fixed(u32),
}

impl std::fmt::Display for Rounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rounds::Auto => f.write_str("auto"),
            Rounds::Fixed(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Rounds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Rounds::Auto => s.serialize_str("auto"),
            Rounds::Fixed(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Rounds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Rounds, D::Error> {
        Ok(word_or_number(d, "auto")?.map_or(Rounds::Auto, Rounds::Fixed))
    }
}

/// Why the measured rounds stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedBy {
    /// The fixed count was reached.
    Rounds,
    /// `rounds: auto`: every pair's interval is within the noise.
    Precision,
    /// `rounds: auto`: `max_rounds` was reached.
    MaxRounds,
    /// Another round would not fit in the cell's timeout.
    Timeout,
    /// Stopped on request.
    Cancelled,
    /// Fewer than two variants were left.
    VariantsFailed,
    /// The rounds do not report the primary metric.
    PrimaryMetricMissing,
}

impl StoppedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            StoppedBy::Rounds => "rounds",
            StoppedBy::Precision => "precision",
            StoppedBy::MaxRounds => "max_rounds",
            StoppedBy::Timeout => "timeout",
            StoppedBy::Cancelled => "cancelled",
            StoppedBy::VariantsFailed => "variants_failed",
            StoppedBy::PrimaryMetricMissing => "primary_metric_missing",
        }
    }
}

/// Why `warmup_rounds: auto` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmupStop {
    /// Every variant's primary metric showed no trend.
    Steady,
    MaxWarmupRounds,
}

impl WarmupStop {
    pub fn as_str(self) -> &'static str {
        match self {
            WarmupStop::Steady => "steady",
            WarmupStop::MaxWarmupRounds => "max_warmup_rounds",
        }
    }
}

/// `info.output_check`: the output check as planned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum CheckPlan {
    /// Not asked: the client is not the load generator.
    Skipped { why: String },
    /// Asked in the first round.
    Ran {
        prompts: u32,
        max_tokens: u32,
        rule: MatchRule,
        /// `tokens` (the model's tokenizer) or `words`.
        unit: String,
        /// The check's nonce (`null` without defences).
        nonce: Option<String>,
        /// When it was asked; older records have none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        when: Option<String>,
    },
}

/// What an answer must share with the baseline's: all of it, or its
/// leading tokens (`min_match_prefix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchRule {
    Exact,
    Prefix(u32),
}

impl Serialize for MatchRule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MatchRule::Exact => s.serialize_str("exact"),
            MatchRule::Prefix(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for MatchRule {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<MatchRule, D::Error> {
        Ok(word_or_number(d, "exact")?.map_or(MatchRule::Exact, MatchRule::Prefix))
    }
}

/// `passed` or `output_mismatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Passed,
    OutputMismatch,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Passed => "passed",
            CheckStatus::OutputMismatch => "output_mismatch",
        }
    }
}

/// `info.variants.<name>.output_check`: what the output check found.
#[derive(Debug, Clone, PartialEq)]
pub enum VariantCheck {
    /// The server was not ready to be asked.
    NotAsked { why: String },
    /// The first variant that answered: the others are held to its answers.
    Reference {
        answered: usize,
        /// Where its answers are (`output-check/<name>.json`).
        evidence: Option<String>,
    },
    /// Its answers against the reference's.
    Answers(AnswersCheck),
    /// The suite's `check:` command, run in its checkout.
    Command(CommandCheck),
}

impl VariantCheck {
    /// `not_asked`, `reference`, `passed` or `output_mismatch`.
    pub fn status(&self) -> &'static str {
        match self {
            VariantCheck::NotAsked { .. } => "not_asked",
            VariantCheck::Reference { .. } => "reference",
            VariantCheck::Answers(a) => a.status.as_str(),
            VariantCheck::Command(c) => c.status.as_str(),
        }
    }
}

/// A variant's answers to the output check against the reference's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswersCheck {
    pub status: CheckStatus,
    pub passed: bool,
    /// Answers identical to the reference's, of those compared.
    pub exact: usize,
    pub compared: usize,
    #[serde(deserialize_with = "nan_if_null")]
    pub exact_match_rate: f64,
    /// `tokens` or `words`.
    pub unit: String,
    /// The shortest common prefix over the answers, in `unit`s.
    pub first_divergence: Option<usize>,
    /// `exact`, or the leading tokens each answer must share.
    pub rule: String,
    /// The first answer that fails the rule, beside the reference's
    /// (evidence, shown as it is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<Value>,
    /// Where the answers are (`output-check/<name>.json`).
    pub evidence: String,
}

/// The `check:` command's outcome in a variant's checkout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandCheck {
    pub status: CheckStatus,
    pub command: String,
    /// Its output (`output-check/<name>.log`).
    pub log: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The two shapes of a variant's output check without a body of their own.
#[derive(Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
enum Plain {
    NotAsked {
        why: String,
    },
    Reference {
        answered: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        evidence: Option<String>,
    },
}

impl Serialize for VariantCheck {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            VariantCheck::NotAsked { why } => Plain::NotAsked { why: why.clone() }.serialize(s),
            VariantCheck::Reference { answered, evidence } => Plain::Reference {
                answered: *answered,
                evidence: evidence.clone(),
            }
            .serialize(s),
            VariantCheck::Answers(a) => a.serialize(s),
            VariantCheck::Command(c) => c.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for VariantCheck {
    /// By its `status`, and for `passed`/`output_mismatch` by whether a
    /// `command` ran.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<VariantCheck, D::Error> {
        let v = Value::deserialize(d)?;
        let status = v.get("status").and_then(Value::as_str).unwrap_or("");
        let check = match status {
            "not_asked" | "reference" => serde_json::from_value(v).map(|p| match p {
                Plain::NotAsked { why } => VariantCheck::NotAsked { why },
                Plain::Reference { answered, evidence } => VariantCheck::Reference { answered, evidence },
            }),
            "passed" | "output_mismatch" if v.get("command").is_some() => {
                serde_json::from_value(v).map(VariantCheck::Command)
            }
            "passed" | "output_mismatch" => serde_json::from_value(v).map(VariantCheck::Answers),
            other => {
                return Err(de::Error::custom(format!(
                    "unknown output check status `{other}`, expected `not_asked`, `reference`, `passed` or `output_mismatch`"
                )))
            }
        };
        check.map_err(de::Error::custom)
    }
}

/// `info.variants.<name>.lengths`: its answers' lengths against the
/// baseline's for the same prompts, over every round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lengths {
    /// Answers paired.
    pub pairs: usize,
    pub rounds: usize,
    /// Its bytes of text over the baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<LengthRatio>,
    /// Its tokens counted from the text over the baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_tokens: Option<LengthRatio>,
    /// Its events over the baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<LengthRatio>,
    /// Its claimed tokens per byte over the baseline's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_per_byte: Option<LengthRatio>,
    /// The smallest difference flagged.
    #[serde(deserialize_with = "nan_if_null")]
    pub threshold: f64,
    /// `(flag, why)` for each finding.
    pub flags: Vec<(String, String)>,
    /// Where every paired answer is (`lengths/<name>.json`).
    pub evidence: String,
}

/// A paired log-ratio summary: the geometric mean ratio, its one-sided
/// bounds, and the ratio of the totals.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthRatio {
    #[serde(deserialize_with = "nan_if_null")]
    pub ratio: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub low: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub high: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub total: f64,
}

/// `Display` as the JSON word.
macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(
    GateKind,
    SpeedVerdict,
    Verdict,
    Method,
    StoppedBy,
    WarmupStop,
    CheckStatus
);

/// A number, or `null` for what JSON cannot hold (NaN, an infinity: what
/// `serde_json` writes for them).
fn nan_if_null<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// `None` for `word`, `Some(n)` for a number.
fn word_or_number<'de, D: Deserializer<'de>>(d: D, word: &'static str) -> Result<Option<u32>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Number(u32),
        Word(String),
    }
    match Wire::deserialize(d) {
        Ok(Wire::Number(n)) => Ok(Some(n)),
        Ok(Wire::Word(w)) if w == word => Ok(None),
        Ok(Wire::Word(w)) => Err(de::Error::custom(format!(
            "expected `{word}` or a number, not `{w}`"
        ))),
        Err(_) => Err(de::Error::custom(format!("expected `{word}` or a number"))),
    }
}

/// A field that is absent (`None`), `null` (`Some(None)`) or a value.
mod present_or_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, T: Serialize>(v: &Option<Option<T>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(inner) => inner.serialize(s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn variant() -> Value {
        json!({
            "status": "succeeded", "failure": null, "rounds": 3,
            "values": {"output_throughput": [1.0, 2.0, 3.0]}, "warmup_values": [1.5],
            "drift": {"slope_per_round": 0.01, "ci_low": -0.1, "ci_high": 0.2, "p_value": 0.4, "n": 3},
            "output_check": {"status": "reference", "answered": 8, "evidence": "output-check/a.json"},
            "flags": [], "lengths": null, "gate": null, "logs": "variants/a"
        })
    }

    fn info_with(variant: Value) -> BTreeMap<String, Value> {
        BTreeMap::from([
            ("variants".to_string(), json!({ "a": variant })),
            ("comparison".to_string(), json!([])),
            ("rounds".to_string(), json!(3)),
            ("noise".to_string(), json!(0.02)),
            ("hostname".to_string(), json!("not a comparison key")),
        ])
    }

    #[test]
    fn a_cell_without_variants_is_no_comparison() {
        let info = BTreeMap::from([("hostname".to_string(), json!("h"))]);
        assert!(CompareInfo::from_info(&info).is_none());
    }

    #[test]
    fn the_other_keys_of_info_are_left_alone() {
        let mut info = info_with(variant());
        let c = CompareInfo::from_info(&info).unwrap().unwrap();
        assert_eq!(c.variants["a"].rounds, 3);
        c.write_into(&mut info);
        assert_eq!(info["hostname"], "not a comparison key");
        assert_eq!(info["variants"]["a"], variant());
    }

    #[test]
    fn an_unknown_key_fails_to_read() {
        // In a variant, its drift, its output check; in a pair; in the plan.
        for (path, key) in [
            (vec![], "rounds_asked"),
            (vec!["drift"], "slope"),
            (vec!["output_check"], "answred"),
        ] {
            let mut v = variant();
            let mut at = &mut v;
            for p in &path {
                at = &mut at[*p];
            }
            at[key] = json!(1);
            let e = CompareInfo::from_info(&info_with(v)).unwrap().unwrap_err();
            assert!(e.to_string().contains(key), "{path:?}.{key}: {e}");
        }
        let pair = json!({"base": "a", "other": "b", "metric": "m", "verdict": "faster", "speedup": 1.2,
            "ci_low": 1.1, "ci_high": 1.3, "n": 3, "mde": 0.1, "method": "student_t",
            "drift": {"base": null, "other": null}, "gate_kind": "flagged"});
        let mut info = info_with(variant());
        info.insert("pairs".into(), json!([pair]));
        let e = CompareInfo::from_info(&info).unwrap().unwrap_err();
        assert!(e.to_string().contains("gate_kind"), "{e}");
        let mut info = info_with(variant());
        info.insert(
            "output_check".into(),
            json!({"status": "skipped", "why": "x", "reason": "y"}),
        );
        let e = CompareInfo::from_info(&info).unwrap().unwrap_err();
        assert!(e.to_string().contains("reason"), "{e}");
    }

    #[test]
    fn an_unknown_verdict_or_gate_fails_to_read() {
        let mut v = variant();
        v["gate"] = json!({"kind": "lying", "why": "x"});
        assert!(CompareInfo::from_info(&info_with(v)).unwrap().is_err());
        let mut v = variant();
        v["output_check"] = json!({"status": "maybe"});
        let e = CompareInfo::from_info(&info_with(v)).unwrap().unwrap_err();
        assert!(e.to_string().contains("maybe"), "{e}");
    }

    #[test]
    fn every_key_written_is_one_of_the_keys() {
        let mut c = CompareInfo::from_info(&info_with(variant())).unwrap().unwrap();
        c.rounds_requested = Some(Rounds::Auto);
        c.max_rounds = Some(9);
        c.stopped_by = Some(StoppedBy::Precision);
        c.warmup_rounds_requested = Some(Rounds::Auto);
        c.max_warmup_rounds = Some(4);
        c.warmup_stopped_by = Some(None);
        c.output_check = Some(CheckPlan::Skipped { why: "x".into() });
        c.nonces = vec!["n-r0".into()];
        c.method = Some(Method::StudentT);
        c.confidence = Some(0.95);
        c.seed = Some(7);
        let mut info = BTreeMap::new();
        c.write_into(&mut info);
        let mut written: Vec<&str> = info.keys().map(String::as_str).collect();
        let mut keys = CompareInfo::KEYS.to_vec();
        written.sort_unstable();
        keys.sort_unstable();
        assert_eq!(written, keys);
        // Present and null, absent: both read back as written.
        assert_eq!(info["warmup_stopped_by"], Value::Null);
        let back = CompareInfo::from_info(&info).unwrap().unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn rounds_and_rules_read_as_a_word_or_a_number() {
        assert_eq!(
            serde_json::from_value::<Rounds>(json!("auto")).unwrap(),
            Rounds::Auto
        );
        assert_eq!(
            serde_json::from_value::<Rounds>(json!(5)).unwrap(),
            Rounds::Fixed(5)
        );
        assert!(serde_json::from_value::<Rounds>(json!("many")).is_err());
        assert_eq!(serde_json::to_value(MatchRule::Prefix(32)).unwrap(), json!(32));
        assert_eq!(serde_json::to_value(MatchRule::Exact).unwrap(), json!("exact"));
    }

    #[test]
    fn a_number_json_cannot_hold_reads_as_nan() {
        let r: LengthRatio =
            serde_json::from_value(json!({"ratio": 1.0, "low": 1.0, "high": 1.0, "total": null})).unwrap();
        assert!(r.total.is_nan());
        assert_eq!(serde_json::to_value(r).unwrap()["total"], Value::Null);
    }
}
