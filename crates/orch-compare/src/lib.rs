//! Comparing two variants measured over interleaved rounds (baseline vs a
//! patch, say): the ratio of means, a bootstrap 95% confidence interval, and
//! a verdict — `faster`, `slower` or `same` (within the noise threshold, or
//! not distinguishable from noise).
//!
//! Rounds are paired when both sides have the same count (round i of A and
//! round i of B ran back to back, so drift hits both): the bootstrap then
//! resamples round indices. Otherwise each side is resampled on its own.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Which direction is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// Throughputs are better higher; times and latencies (`*_ms`, `*_s`,
/// `duration`, `latency`) lower. Unknown metrics: higher.
pub fn better_for(metric: &str) -> Better {
    let m = metric.to_ascii_lowercase();
    if m.contains("throughput") || m.ends_with("per_s") || m.contains("tokens_per") {
        Better::Higher
    } else if m.ends_with("_ms")
        || m.ends_with("_s")
        || m.contains("latency")
        || m == "duration"
        || m.contains("time")
    {
        Better::Lower
    } else {
        Better::Higher
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Faster,
    Slower,
    Same,
}

/// `other` against `base` for one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub metric: String,
    pub better: Better,
    /// mean(other) / mean(base).
    pub ratio: f64,
    /// 95% bootstrap interval of the ratio.
    pub ci_low: f64,
    pub ci_high: f64,
    /// How much faster `other` is (>1 faster, <1 slower), whatever the
    /// metric's direction.
    pub speedup: f64,
    pub verdict: Verdict,
    pub n_base: usize,
    pub n_other: usize,
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Compare `other` with `base`. `noise` is the relative threshold (0.02 =
/// 2%) under which a difference is `same`.
pub fn compare(
    metric: &str,
    base: &[f64],
    other: &[f64],
    noise: f64,
    iterations: usize,
    seed: u64,
) -> Option<Comparison> {
    if base.is_empty() || other.is_empty() || mean(base) == 0.0 {
        return None;
    }
    let ratio = mean(other) / mean(base);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let paired = base.len() == other.len();
    let mut ratios = Vec::with_capacity(iterations);
    for _ in 0..iterations.max(100) {
        let (mut sb, mut so) = (0.0, 0.0);
        if paired {
            for _ in 0..base.len() {
                let i = rng.random_range(0..base.len());
                sb += base[i];
                so += other[i];
            }
            sb /= base.len() as f64;
            so /= other.len() as f64;
        } else {
            for _ in 0..base.len() {
                sb += base[rng.random_range(0..base.len())];
            }
            for _ in 0..other.len() {
                so += other[rng.random_range(0..other.len())];
            }
            sb /= base.len() as f64;
            so /= other.len() as f64;
        }
        if sb != 0.0 {
            ratios.push(so / sb);
        }
    }
    ratios.sort_by(|a, b| a.total_cmp(b));
    let pick = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
    let (ci_low, ci_high) = (pick(0.025), pick(0.975));
    let better = better_for(metric);
    let (speedup, s_low, s_high) = match better {
        Better::Higher => (ratio, ci_low, ci_high),
        Better::Lower => (1.0 / ratio, 1.0 / ci_high, 1.0 / ci_low),
    };
    let verdict = if speedup > 1.0 + noise && s_low > 1.0 {
        Verdict::Faster
    } else if speedup < 1.0 - noise && s_high < 1.0 {
        Verdict::Slower
    } else {
        Verdict::Same
    };
    Some(Comparison {
        metric: metric.to_string(),
        better,
        ratio,
        ci_low,
        ci_high,
        speedup,
        verdict,
        n_base: base.len(),
        n_other: other.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noisy(center: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| center * (1.0 + rng.random_range(-0.01..0.01)))
            .collect()
    }

    #[test]
    fn directions() {
        assert_eq!(better_for("output_throughput"), Better::Higher);
        assert_eq!(better_for("mean_ttft_ms"), Better::Lower);
        assert_eq!(better_for("tokens_per_s"), Better::Higher);
        assert_eq!(better_for("step_time_mean_ms"), Better::Lower);
    }

    #[test]
    fn a_a_is_same() {
        for seed in 0..20 {
            let a = noisy(100.0, 8, seed);
            let b = noisy(100.0, 8, seed + 1000);
            let c = compare("output_throughput", &a, &b, 0.02, 2000, seed).unwrap();
            assert_eq!(c.verdict, Verdict::Same, "{c:?}");
        }
    }

    #[test]
    fn clear_differences_get_a_verdict() {
        let base = noisy(100.0, 6, 1);
        // 30% more throughput: faster.
        let c = compare("output_throughput", &base, &noisy(130.0, 6, 2), 0.02, 2000, 7).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        assert!((c.ratio - 1.3).abs() < 0.03 && c.ci_low < c.ratio && c.ratio < c.ci_high);
        // 20% more latency: slower.
        let c = compare("mean_ttft_ms", &base, &noisy(120.0, 6, 3), 0.02, 2000, 7).unwrap();
        assert_eq!(c.verdict, Verdict::Slower);
        assert!((c.speedup - 1.0 / 1.2).abs() < 0.03);
        // 20% less latency: faster.
        let c = compare("mean_ttft_ms", &base, &noisy(80.0, 6, 4), 0.02, 2000, 7).unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        // 1% better is within the 2% threshold: same.
        let c = compare("output_throughput", &base, &noisy(101.0, 6, 5), 0.02, 2000, 7).unwrap();
        assert_eq!(c.verdict, Verdict::Same);
    }

    #[test]
    fn unpaired_and_empty() {
        let c = compare(
            "x_throughput",
            &noisy(100.0, 5, 1),
            &noisy(150.0, 7, 2),
            0.02,
            1000,
            1,
        )
        .unwrap();
        assert_eq!(c.verdict, Verdict::Faster);
        assert!(compare("x", &[], &[1.0], 0.02, 100, 1).is_none());
    }
}
