//! Comparing variants measured over interleaved rounds (baseline vs a patch,
//! say): how much faster one is, an interval that says how sure that is, and
//! a verdict — `faster`, `slower` or `same` (within the noise threshold, or not
//! distinguishable from noise).
//!
//! # The method, and why
//!
//! Round `i` of every variant runs in the same block of time (the variants
//! in a shuffled order), so drift and a neighbour's load hit all of them
//! alike. Each round therefore gives one *paired* log-ratio
//! `d_i = ln(other_i / base_i)`; the estimate is their mean (the geometric
//! mean of the per-round ratios) and the interval is Student's t on them:
//! `exp(mean(d) ± t(1 - α/2, n - 1) · sd(d) / √n)` ([`Method::StudentT`]).
//!
//! Chosen because it holds its nominal coverage at 3-10 rounds, where the
//! alternatives do not (the tests below simulate it; `scripts/bench-compare.sh`
//! measures it on real A/A runs):
//!
//! - a percentile bootstrap over 3-10 round means ([`Method::PercentileBootstrap`],
//!   what orch used before) draws from at most `C(2n-1, n)` distinct resamples
//!   and its spread is the plug-in `sd·√((n-1)/n)` with normal quantiles: at
//!   n = 5 its "95%" interval covers about 80-85% of the time, so an A/A pair
//!   is called different several times more often than the 5% it promises;
//!   BCa corrects bias and skew, not this small-sample narrowness;
//! - an exact sign-flip permutation test has only `2^n` arrangements: at
//!   n = 5 the smallest two-sided p-value is 1/16 > 0.05, so it can never find
//!   a difference at 5 rounds or fewer;
//! - logs make the ratio symmetric (2x and 0.5x are equally far from 1),
//!   tame the right skew of throughput and latency, and pairing removes the
//!   round-to-round drift that unpaired intervals count as noise.
//!
//! # Verdicts and multiple comparisons
//!
//! One metric per pair is *primary* (by default the server's output
//! throughput, else the workload's headline rate: [`default_primary`]); its
//! verdict is the pair's: `faster` when the speedup exceeds `1 + noise` and
//! the interval lies above 1, `slower` symmetrically, `same` otherwise. The
//! other metrics are secondary: their p-values are adjusted with Holm's
//! step-down method over the pair's tested secondary metrics, and a
//! secondary verdict needs its adjusted p-value under α (so one report of
//! twenty metrics does not produce a "significant" one by chance).
//!
//! The minimum detectable effect ([`Comparison::mde`]) is the smallest true
//! difference this n and this noise would find 80% of the time at α:
//! `(t(1 - α/2) + t(0.8)) · sd(d) / √n`, as a fraction.
//!
//! ## What is where
//!
//! the statistics of comparisons: paired per-round log-ratios, Student-t
//! 95% interval (why not a bootstrap or a permutation test: its crate docs and
//! `docs/comparisons.md`), p-values, minimum detectable effect, Holm adjustment,
//! the direction of each metric by its name (`direction.rs`: [`better_for`], the
//! workspace's one rule, also `orch-history`'s and `orch-report`'s: throughputs up;
//! times, memory, energy, cost and failures down), the default primary metric,
//! verdict `faster`/`slower`/`same` with a noise threshold; the percentile bootstrap kept
//! only to compare with (`examples/methods.rs`). It does not: IO (the example reads
//! stdin).

pub mod direction;

pub use direction::{better_for, Better};

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};
use std::collections::BTreeMap;

/// Confidence of every interval (α = 0.05).
pub const CONFIDENCE: f64 = 0.95;
/// Power at which the minimum detectable effect is stated.
pub const MDE_POWER: f64 = 0.8;

/// Headline metrics, most preferred first: the primary metric of a
/// comparison when the manifest names none.
pub const PRIMARY_ORDER: &[&str] = &[
    "output_throughput",
    "tokens_per_s",
    "output_tokens_per_s",
    "samples_per_s",
    "total_token_throughput",
    "request_throughput",
];

/// The primary metric among `names`: the first of [`PRIMARY_ORDER`], else
/// the first (by name) that reads as a rate (`*_per_s`, `*throughput*`),
/// else the first name.
pub fn default_primary<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Option<String> {
    let has = |k: &str| names.clone().into_iter().any(|n| n == k);
    if let Some(k) = PRIMARY_ORDER.iter().find(|k| has(k)) {
        return Some(k.to_string());
    }
    let mut sorted: Vec<&str> = names.into_iter().collect();
    sorted.sort_unstable();
    sorted
        .iter()
        .find(|n| n.ends_with("_per_s") || n.ends_with("_per_second") || n.contains("throughput"))
        .or(sorted.first())
        .map(|n| n.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Faster,
    Slower,
    Same,
}

/// How an interval is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// Student's t on the paired per-round log-ratios (what orch uses).
    StudentT,
    /// Percentile bootstrap of the ratio of round means, resampling round
    /// indices (kept to show, side by side, why it is not used).
    PercentileBootstrap,
}

/// Whether a metric decides the pair's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Primary,
    /// Verdict from a Holm-adjusted p-value.
    Secondary,
}

/// `other` against `base` for one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub metric: String,
    pub better: Better,
    /// other / base: the geometric mean of the per-round ratios.
    pub ratio: f64,
    /// The 95% interval of the ratio.
    pub ci_low: f64,
    pub ci_high: f64,
    /// How much faster `other` is (>1 faster, <1 slower), whatever the
    /// metric's direction.
    pub speedup: f64,
    pub verdict: Verdict,
    /// Rounds of each side that were measured (pairs: the smaller).
    pub n_base: usize,
    pub n_other: usize,
    /// Paired rounds the interval is computed from.
    pub n: usize,
    pub method: Method,
    pub confidence: f64,
    /// Two-sided p-value of "no difference".
    pub p_value: f64,
    /// Holm-adjusted p-value (secondary metrics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_adjusted: Option<f64>,
    pub role: Role,
    /// Minimum detectable effect at this n (fraction: 0.05 = 5%), at 80%
    /// power and α = 0.05; `None` below 2 rounds.
    pub mde: Option<f64>,
    /// Half-width of the interval as a fraction of the estimate.
    pub precision: f64,
    /// The per-round values.
    pub base_values: Vec<f64>,
    pub other_values: Vec<f64>,
}

/// The interval of `other / base` over paired rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub ratio: f64,
    pub low: f64,
    pub high: f64,
    pub p_value: f64,
    pub n: usize,
    /// Standard deviation of the per-round log-ratios.
    pub sd: f64,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Quantile `q` of Student's t with `df` degrees of freedom.
pub fn t_quantile(q: f64, df: f64) -> f64 {
    match StudentsT::new(0.0, 1.0, df) {
        Ok(t) => t.inverse_cdf(q),
        // df > 0 is checked by callers; a normal quantile is the limit.
        Err(_) => f64::NAN,
    }
}

fn t_two_sided_p(stat: f64, df: f64) -> f64 {
    match StudentsT::new(0.0, 1.0, df) {
        Ok(t) => (2.0 * t.sf(stat.abs())).min(1.0),
        Err(_) => f64::NAN,
    }
}

/// Paired log-ratios, on the first `min(len)` rounds. `None` when a value
/// is not positive (a count of 0, say: no ratio).
fn log_ratios(base: &[f64], other: &[f64]) -> Option<Vec<f64>> {
    let n = base.len().min(other.len());
    (0..n)
        .map(|i| {
            let (b, o) = (base[i], other[i]);
            (b > 0.0 && o > 0.0 && b.is_finite() && o.is_finite()).then(|| (o / b).ln())
        })
        .collect()
}

/// The paired Student-t interval of `other / base` (at least 2 rounds).
pub fn t_interval(base: &[f64], other: &[f64], confidence: f64) -> Option<Interval> {
    let d = log_ratios(base, other)?;
    let n = d.len();
    if n < 2 {
        return None;
    }
    let m = mean(&d);
    let sd = (d.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let se = sd / (n as f64).sqrt();
    let df = (n - 1) as f64;
    let (half, p) = if se > 0.0 {
        (
            t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * se,
            t_two_sided_p(m / se, df),
        )
    } else {
        // Every round gave the same ratio: no spread to speak of.
        (0.0, if m == 0.0 { 1.0 } else { 0.0 })
    };
    Some(Interval {
        ratio: m.exp(),
        low: (m - half).exp(),
        high: (m + half).exp(),
        p_value: p,
        n,
        sd,
    })
}

/// The percentile bootstrap of the ratio of means over resampled round
/// indices (paired). Its `p_value` is twice the smaller tail at 1.
pub fn bootstrap_interval(
    base: &[f64],
    other: &[f64],
    confidence: f64,
    iterations: usize,
    seed: u64,
) -> Option<Interval> {
    let n = base.len().min(other.len());
    if n < 2 || mean(&base[..n]) == 0.0 {
        return None;
    }
    let (base, other) = (&base[..n], &other[..n]);
    let ratio = mean(other) / mean(base);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut ratios = Vec::with_capacity(iterations.max(100));
    for _ in 0..iterations.max(100) {
        let (mut sb, mut so) = (0.0, 0.0);
        for _ in 0..n {
            let i = rng.random_range(0..n);
            sb += base[i];
            so += other[i];
        }
        if sb != 0.0 {
            ratios.push(so / sb);
        }
    }
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let a = (1.0 - confidence) / 2.0;
    let below = ratios.iter().filter(|r| **r <= 1.0).count() as f64 / ratios.len() as f64;
    let d = log_ratios(base, other).unwrap_or_default();
    let m = mean(&d);
    let sd = (d.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    Some(Interval {
        ratio,
        low: pick(a),
        high: pick(1.0 - a),
        p_value: (2.0 * below.min(1.0 - below)).min(1.0),
        n,
        sd,
    })
}

/// Minimum detectable effect (fraction) with `n` rounds whose log-ratios
/// have standard deviation `sd`: 80% power, two-sided α = 1 - confidence.
pub fn mde(sd: f64, n: usize, confidence: f64) -> Option<f64> {
    if n < 2 {
        return None;
    }
    let df = (n - 1) as f64;
    let k = t_quantile(1.0 - (1.0 - confidence) / 2.0, df) + t_quantile(MDE_POWER, df);
    Some((k * sd / (n as f64).sqrt()).exp() - 1.0)
}

/// Holm's step-down adjustment: adjusted p-values in the input order.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut idx: Vec<usize> = (0..m).collect();
    idx.sort_by(|a, b| p[*a].total_cmp(&p[*b]));
    let mut out = vec![1.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in idx.iter().enumerate() {
        let adj = ((m - rank) as f64 * p[i]).min(1.0);
        running = running.max(adj);
        out[i] = running;
    }
    out
}

/// How to compare.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Options {
    /// Relative difference under which a verdict is `same` (0.02 = 2%).
    pub noise: f64,
    pub method: Method,
    pub confidence: f64,
    /// Bootstrap only.
    pub iterations: usize,
    pub seed: u64,
}

impl Options {
    pub fn new(noise: f64) -> Options {
        Options {
            noise,
            method: Method::StudentT,
            confidence: CONFIDENCE,
            iterations: 4000,
            seed: 0,
        }
    }
}

fn interval(base: &[f64], other: &[f64], o: &Options) -> Option<Interval> {
    match o.method {
        Method::StudentT => t_interval(base, other, o.confidence),
        Method::PercentileBootstrap => bootstrap_interval(base, other, o.confidence, o.iterations, o.seed),
    }
}

/// The verdict of a speedup with its interval (on the speedup scale) when
/// the difference is (or is not) significant.
fn verdict(speedup: f64, s_low: f64, s_high: f64, significant: bool, noise: f64) -> Verdict {
    if significant && speedup > 1.0 + noise && s_low > 1.0 {
        Verdict::Faster
    } else if significant && speedup < 1.0 - noise && s_high < 1.0 {
        Verdict::Slower
    } else {
        Verdict::Same
    }
}

/// Compare `other` with `base` on one metric, as a primary metric.
/// `None` with fewer than 2 paired rounds or non-positive values.
pub fn compare(metric: &str, base: &[f64], other: &[f64], o: &Options) -> Option<Comparison> {
    let iv = interval(base, other, o)?;
    let better = better_for(metric);
    let (speedup, s_low, s_high) = match better {
        Better::Higher => (iv.ratio, iv.low, iv.high),
        Better::Lower => (1.0 / iv.ratio, 1.0 / iv.high, 1.0 / iv.low),
    };
    Some(Comparison {
        metric: metric.to_string(),
        better,
        ratio: iv.ratio,
        ci_low: iv.low,
        ci_high: iv.high,
        speedup,
        verdict: verdict(speedup, s_low, s_high, true, o.noise),
        n_base: base.len(),
        n_other: other.len(),
        n: iv.n,
        method: o.method,
        confidence: o.confidence,
        p_value: iv.p_value,
        p_adjusted: None,
        role: Role::Primary,
        mde: mde(iv.sd, iv.n, o.confidence),
        precision: (iv.high / iv.ratio).max(iv.ratio / iv.low) - 1.0,
        base_values: base.to_vec(),
        other_values: other.to_vec(),
    })
}

/// Every metric of one pair: `primary` decides the pair's verdict; the
/// others are secondary, with Holm-adjusted p-values and verdicts. A metric
/// whose rounds are identical on both sides (a request count) is reported
/// but not counted in the correction. Metrics that cannot be compared (fewer
/// than 2 rounds, a value of 0) are left out.
pub fn compare_pair(
    values: &BTreeMap<String, (Vec<f64>, Vec<f64>)>,
    primary: &str,
    o: &Options,
) -> Vec<Comparison> {
    let mut out: Vec<Comparison> = values
        .iter()
        .filter_map(|(m, (b, x))| compare(m, b, x, o))
        .collect();
    let tested: Vec<usize> = (0..out.len())
        .filter(|&i| out[i].metric != primary && !(out[i].ratio == 1.0 && out[i].ci_low == out[i].ci_high))
        .collect();
    let adjusted = holm(&tested.iter().map(|&i| out[i].p_value).collect::<Vec<_>>());
    for c in out.iter_mut().filter(|c| c.metric != primary) {
        c.role = Role::Secondary;
        c.p_adjusted = Some(1.0);
        c.verdict = Verdict::Same;
    }
    for (&i, p) in tested.iter().zip(adjusted) {
        let c = &mut out[i];
        c.p_adjusted = Some(p);
        let (s_low, s_high) = match c.better {
            Better::Higher => (c.ci_low, c.ci_high),
            Better::Lower => (1.0 / c.ci_high, 1.0 / c.ci_low),
        };
        c.verdict = verdict(c.speedup, s_low, s_high, p < 1.0 - o.confidence, o.noise);
    }
    // Primary first, then by name.
    out.sort_by(|a, b| (a.role != Role::Primary, &a.metric).cmp(&(b.role != Role::Primary, &b.metric)));
    out
}

/// Half-width of the primary metric's interval as a fraction: what
/// `rounds: auto` compares with the noise threshold.
pub fn precision(base: &[f64], other: &[f64], confidence: f64) -> Option<f64> {
    let iv = t_interval(base, other, confidence)?;
    Some((iv.high / iv.ratio).max(iv.ratio / iv.low) - 1.0)
}

/// The linear trend of a series of rounds: the least-squares slope of the
/// values against the round index, as a fraction of the series' mean per
/// round, with its Student-t interval (`n - 2` degrees of freedom).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Trend {
    /// Slope per round as a fraction of the mean (0.01 = +1% per round).
    pub slope: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_value: f64,
    /// Rounds fitted.
    pub n: usize,
    pub confidence: f64,
}

impl Trend {
    /// Whether the interval holds 0 (no trend this series can show).
    pub fn holds_zero(&self) -> bool {
        self.ci_low <= 0.0 && 0.0 <= self.ci_high
    }
}

/// The trend of `values` (in round order) at `confidence`. `None` below 3
/// values, or with a mean of 0 or a value that is not finite.
pub fn trend(values: &[f64], confidence: f64) -> Option<Trend> {
    let n = values.len();
    if n < 3 || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let my = mean(values);
    if my == 0.0 {
        return None;
    }
    let mx = (n - 1) as f64 / 2.0;
    let sxx: f64 = (0..n).map(|i| (i as f64 - mx).powi(2)).sum();
    let sxy: f64 = values
        .iter()
        .enumerate()
        .map(|(i, y)| (i as f64 - mx) * (y - my))
        .sum();
    let b = sxy / sxx;
    let sse: f64 = values
        .iter()
        .enumerate()
        .map(|(i, y)| (y - (my + b * (i as f64 - mx))).powi(2))
        .sum();
    let df = (n - 2) as f64;
    let se = (sse / df / sxx).sqrt();
    let (half, p) = if se > 0.0 {
        (
            t_quantile(1.0 - (1.0 - confidence) / 2.0, df) * se,
            t_two_sided_p(b / se, df),
        )
    } else {
        // A perfect line: no spread to speak of.
        (0.0, if b == 0.0 { 1.0 } else { 0.0 })
    };
    let scale = my.abs();
    Some(Trend {
        slope: b / scale,
        ci_low: (b - half) / scale,
        ci_high: (b + half) / scale,
        p_value: p,
        n,
        confidence,
    })
}

/// Rounds the steadiness test looks back over (`warmup_rounds: auto`).
pub const STEADY_WINDOW: usize = 4;

/// Whether warm-up may end: over the last [`STEADY_WINDOW`] values the
/// trend's interval holds 0 and its slope is within `tolerance` per round
/// (a fraction of the mean), or the whole interval is within `±tolerance`
/// (a trend too small to matter). `None` with fewer values than the window
/// (not decided yet).
pub fn steady(values: &[f64], tolerance: f64, confidence: f64) -> Option<bool> {
    if values.len() < STEADY_WINDOW {
        return None;
    }
    let t = trend(&values[values.len() - STEADY_WINDOW..], confidence)?;
    let small = t.slope.abs() <= tolerance;
    let negligible = t.ci_low >= -tolerance && t.ci_high <= tolerance;
    Some((t.holds_zero() && small) || negligible)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_distr::Distribution;

    fn noisy(center: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| center * (1.0 + rng.random_range(-0.01..0.01)))
            .collect()
    }

    fn opts() -> Options {
        Options::new(0.02)
    }

    #[test]
    fn t_quantiles_match_tables() {
        // Student's t, two-sided 95%: df 2, 4, 9 (any statistics table).
        for (df, q) in [(2.0, 4.303), (4.0, 2.776), (9.0, 2.262)] {
            assert!((t_quantile(0.975, df) - q).abs() < 1e-3, "df {df}");
        }
        assert!((t_two_sided_p(2.776, 4.0) - 0.05).abs() < 1e-3);
    }

    #[test]
    fn hand_computed_interval() {
        // log-ratios ln(1.1), ln(1.2), ln(1.0): mean 0.09255, sd 0.09117.
        let c = compare(
            "output_throughput",
            &[100.0, 100.0, 100.0],
            &[110.0, 120.0, 100.0],
            &opts(),
        )
        .unwrap();
        let m = (1.1f64.ln() + 1.2f64.ln()) / 3.0;
        assert!((c.ratio - m.exp()).abs() < 1e-9);
        let sd = [1.1f64.ln() - m, 1.2f64.ln() - m, -m]
            .iter()
            .map(|x| x * x)
            .sum::<f64>()
            .sqrt()
            / 2f64.sqrt();
        let half = 4.302653 * sd / 3f64.sqrt();
        assert!((c.ci_low - (m - half).exp()).abs() < 1e-4, "{c:?}");
        assert!((c.ci_high - (m + half).exp()).abs() < 1e-4);
        // The interval holds 1: not distinguishable from noise at n = 3.
        assert_eq!(c.verdict, Verdict::Same);
        assert_eq!((c.n, c.method), (3, Method::StudentT));
        assert!(c.mde.unwrap() > 0.2);
    }

    #[test]
    fn a_a_is_same() {
        for seed in 0..20 {
            let a = noisy(100.0, 8, seed);
            let b = noisy(100.0, 8, seed + 1000);
            let c = compare("output_throughput", &a, &b, &opts()).unwrap();
            assert_eq!(c.verdict, Verdict::Same, "{c:?}");
        }
    }

    #[test]
    fn clear_differences_get_a_verdict() {
        let base = noisy(100.0, 6, 1);
        let c = compare("output_throughput", &base, &noisy(130.0, 6, 2), &opts()).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        assert!((c.ratio - 1.3).abs() < 0.03 && c.ci_low < c.ratio && c.ratio < c.ci_high);
        let c = compare("mean_ttft_ms", &base, &noisy(120.0, 6, 3), &opts()).unwrap();
        assert_eq!(c.verdict, Verdict::Slower);
        assert!((c.speedup - 1.0 / 1.2).abs() < 0.03);
        let c = compare("mean_ttft_ms", &base, &noisy(80.0, 6, 4), &opts()).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        // 1% better is within the 2% threshold: same.
        let c = compare("output_throughput", &base, &noisy(101.0, 6, 5), &opts()).unwrap();
        assert_eq!(c.verdict, Verdict::Same);
        assert!(compare("x", &[], &[1.0], &opts()).is_none());
        assert!(compare("x", &[1.0, 0.0], &[1.0, 2.0], &opts()).is_none());
    }

    #[test]
    fn holm_matches_hand_computation() {
        // Sorted 0.01, 0.02, 0.04 with m = 3: 0.03, 0.04, 0.04 (monotone).
        let adj = holm(&[0.04, 0.01, 0.02]);
        assert!((adj[1] - 0.03).abs() < 1e-12);
        assert!((adj[2] - 0.04).abs() < 1e-12);
        assert!((adj[0] - 0.04).abs() < 1e-12);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn pair_has_one_primary_and_corrected_secondaries() {
        let mut v = BTreeMap::new();
        v.insert(
            "output_throughput".to_string(),
            (noisy(100.0, 5, 1), noisy(120.0, 5, 2)),
        );
        v.insert("mean_ttft_ms".to_string(), (noisy(50.0, 5, 3), noisy(40.0, 5, 4)));
        v.insert("completed".to_string(), (vec![12.0; 5], vec![12.0; 5]));
        let out = compare_pair(&v, "output_throughput", &opts());
        assert_eq!(out[0].metric, "output_throughput");
        assert_eq!(out[0].role, Role::Primary);
        assert_eq!(out[0].verdict, Verdict::Faster);
        let ttft = out.iter().find(|c| c.metric == "mean_ttft_ms").unwrap();
        assert_eq!(ttft.role, Role::Secondary);
        assert!(ttft.p_adjusted.unwrap() >= ttft.p_value);
        let done = out.iter().find(|c| c.metric == "completed").unwrap();
        assert_eq!((done.verdict, done.ratio), (Verdict::Same, 1.0));
    }

    #[test]
    fn default_primary_prefers_output_throughput_then_rates() {
        let names = ["mean_ttft_ms", "request_throughput", "output_throughput"];
        assert_eq!(default_primary(names).unwrap(), "output_throughput");
        assert_eq!(
            default_primary(["b_ms", "md5_mib_per_s"]).unwrap(),
            "md5_mib_per_s"
        );
        assert_eq!(default_primary(["b_ms", "a_ms"]).unwrap(), "a_ms");
        assert!(default_primary([]).is_none());
    }

    /// Coverage of the 95% intervals at 3-10 rounds, by simulation: per
    /// round a shared drift (hits both sides) and each side's own noise,
    /// normal and heavy-tailed (Student t with 3 df). The t interval on
    /// log-ratios holds 95%; the percentile bootstrap does not.
    fn coverage(method: Method, n: usize, heavy: bool) -> f64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(n as u64 * 7 + heavy as u64);
        let normal = rand_distr::Normal::new(0.0, 0.04).unwrap();
        let t3 = rand_distr::StudentT::new(3.0).unwrap();
        let trials = 1000;
        let mut covered = 0;
        for trial in 0..trials {
            let mut e = || -> f64 {
                if heavy {
                    0.03 * t3.sample(&mut rng)
                } else {
                    normal.sample(&mut rng)
                }
            };
            let mut base = Vec::new();
            let mut other = Vec::new();
            for _ in 0..n {
                let drift: f64 = e();
                base.push(100.0 * (drift + e()).exp());
                other.push(100.0 * (drift + e()).exp());
            }
            let o = Options {
                method,
                iterations: 400,
                seed: trial,
                ..opts()
            };
            let iv = interval(&base, &other, &o).unwrap();
            if iv.low <= 1.0 && 1.0 <= iv.high {
                covered += 1;
            }
        }
        covered as f64 / trials as f64
    }

    #[test]
    fn t_interval_holds_its_coverage_at_3_to_10_rounds() {
        for n in [3, 4, 5, 7, 10] {
            for heavy in [false, true] {
                let t = coverage(Method::StudentT, n, heavy);
                let b = coverage(Method::PercentileBootstrap, n, heavy);
                println!("n {n:2} heavy {heavy:5}: student t {t:.3}, percentile bootstrap {b:.3}");
                assert!(t >= 0.93, "t interval, n {n}, heavy {heavy}: {t}");
                if n <= 5 {
                    assert!(b < 0.90, "bootstrap, n {n}, heavy {heavy}: {b}");
                }
            }
        }
    }
    #[test]
    fn trend_of_a_line_and_of_noise() {
        // 100, 102, 104, 106, 108: slope 2 per round, mean 104.
        let t = trend(&[100.0, 102.0, 104.0, 106.0, 108.0], CONFIDENCE).unwrap();
        assert!((t.slope - 2.0 / 104.0).abs() < 1e-12, "{t:?}");
        assert!(
            (t.ci_low - t.slope).abs() < 1e-9 && (t.ci_high - t.slope).abs() < 1e-9,
            "{t:?}"
        );
        assert_eq!(t.n, 5);
        assert!(!t.holds_zero());
        // Hand-computed: 10, 12, 11, 13 → slope 0.8, sse 1.8, se √(1.8 / 2 / 5), t(0.975, 2) 4.303.
        let t = trend(&[10.0, 12.0, 11.0, 13.0], CONFIDENCE).unwrap();
        let m = 11.5;
        assert!((t.slope - 0.8 / m).abs() < 1e-12);
        assert!(
            (t.ci_high - (0.8 + 4.302653 * 0.18f64.sqrt()) / m).abs() < 1e-5,
            "{t:?}"
        );
        assert!(t.holds_zero());
        assert!(trend(&[1.0, 2.0], CONFIDENCE).is_none());
        assert!(trend(&[0.0, 0.0, 0.0], CONFIDENCE).is_none());
    }
    #[test]
    fn steady_series_are_steady_and_trends_are_not() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let normal = rand_distr::Normal::new(0.0, 0.01).unwrap();
        let (mut steady_called, mut trend_called) = (0, 0);
        for _ in 0..200 {
            // Flat with 1% noise.
            let flat: Vec<f64> = (0..6).map(|_| 100.0 * (1.0 + normal.sample(&mut rng))).collect();
            if steady(&flat, 0.01, CONFIDENCE) == Some(true) {
                steady_called += 1;
            }
            // Warming up: +8% per round, 1% noise.
            let warming: Vec<f64> = (0..6)
                .map(|i| 100.0 * (1.0 + 0.08 * i as f64) * (1.0 + normal.sample(&mut rng)))
                .collect();
            if steady(&warming, 0.01, CONFIDENCE) == Some(true) {
                trend_called += 1;
            }
        }
        assert!(
            steady_called >= 170,
            "flat series called steady {steady_called}/200"
        );
        assert!(
            trend_called <= 10,
            "trending series called steady {trend_called}/200"
        );
        // Too few rounds: not decided.
        assert_eq!(steady(&[1.0, 2.0, 3.0], 0.01, CONFIDENCE), None);
        // A warm-up that levels off: steady once the window is past the climb.
        let levels = [50.0, 80.0, 95.0, 100.0, 100.5, 99.8, 100.2, 100.1];
        assert_eq!(steady(&levels[..5], 0.01, CONFIDENCE), Some(false));
        assert_eq!(steady(&levels, 0.01, CONFIDENCE), Some(true));
    }
}
