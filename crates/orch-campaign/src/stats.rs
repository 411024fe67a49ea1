//! The statistics the campaign scores need and `orch-stats` does not hold:
//! the one-sided Mann–Whitney U test (SWE-Perf's per-test gain), the
//! percentile bootstrap over tasks, and the paired sign-flip test of two
//! campaigns. A seeded SplitMix64 keeps every interval reproducible.

/// SplitMix64: small, seeded, good enough for resampling.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// An estimate with its percentile-bootstrap 95% interval.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    pub value: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// The values it is the mean of (tasks).
    pub n: usize,
}

/// The mean of `xs` with a percentile bootstrap 95% interval over its
/// elements (resampled with replacement `resamples` times).
pub fn bootstrap_mean(xs: &[f64], resamples: usize, seed: u64) -> Interval {
    let n = xs.len();
    if n == 0 {
        return Interval {
            value: f64::NAN,
            ci_low: f64::NAN,
            ci_high: f64::NAN,
            n: 0,
        };
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    let mut rng = Rng::new(seed);
    let mut means: Vec<f64> = (0..resamples.max(1))
        .map(|_| (0..n).map(|_| xs[rng.below(n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    Interval {
        value: mean,
        ci_low: quantile(&means, 0.025),
        ci_high: quantile(&means, 0.975),
        n,
    }
}

/// Linear interpolation between order statistics (sorted input).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// One-sided Mann–Whitney U test, alternative "`x` is stochastically greater
/// than `y`", as SciPy's `mannwhitneyu(x, y, alternative='greater')` with
/// its default `method='auto'`: the exact distribution when both samples
/// have at most 8 values and no ties, else the normal approximation with
/// the tie correction and the continuity correction. Returns the p-value.
pub fn mann_whitney_greater(x: &[f64], y: &[f64]) -> f64 {
    let (n1, n2) = (x.len(), y.len());
    if n1 == 0 || n2 == 0 {
        return 1.0;
    }
    // U of x: pairs where x wins, ties counting a half (as ranks do).
    let mut u = 0.0;
    for a in x {
        for b in y {
            if a > b {
                u += 1.0;
            } else if a == b {
                u += 0.5;
            }
        }
    }
    let mut all: Vec<f64> = x.iter().chain(y).copied().collect();
    all.sort_by(f64::total_cmp);
    let ties = all.windows(2).any(|w| w[0] == w[1]);
    if n1 <= 8 && n2 <= 8 && !ties {
        return exact_upper_tail(n1, n2, u);
    }
    let (n1f, n2f) = (n1 as f64, n2 as f64);
    let n = n1f + n2f;
    let mu = n1f * n2f / 2.0;
    // Tie correction: sum of t^3 - t over groups of equal values.
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j] == all[i] {
            j += 1;
        }
        let t = (j - i) as f64;
        tie_term += t * t * t - t;
        i = j;
    }
    let var = n1f * n2f / 12.0 * ((n + 1.0) - tie_term / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = (u - mu - 0.5) / var.sqrt();
    normal_sf(z)
}

/// P(U >= u) under the null, from the count of arrangements by U
/// (the classic recursion over the largest value's sample).
fn exact_upper_tail(n1: usize, n2: usize, u: f64) -> f64 {
    let max_u = n1 * n2;
    // counts[a][b] = distribution of U for samples of a and b values.
    let mut table: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); n2 + 1]; n1 + 1];
    for a in 0..=n1 {
        for b in 0..=n2 {
            table[a][b] = if a == 0 || b == 0 {
                vec![1.0]
            } else {
                let mut d = vec![0.0; a * b + 1];
                // The largest value is x's: it beats all b of y.
                for (k, c) in table[a - 1][b].iter().enumerate() {
                    d[k + b] += c;
                }
                for (k, c) in table[a][b - 1].iter().enumerate() {
                    d[k] += c;
                }
                d
            };
        }
    }
    let dist = &table[n1][n2];
    let total: f64 = dist.iter().sum();
    let from = u.ceil() as usize;
    if from > max_u {
        return 0.0;
    }
    dist[from..].iter().sum::<f64>() / total
}

/// The standard normal's upper tail, P(Z > z).
fn normal_sf(z: f64) -> f64 {
    0.5 * erfc(z / std::f64::consts::SQRT_2)
}

/// `erfc` (W. J. Cody's rational approximations via Numerical Recipes'
/// Chebyshev fit; relative error below 1.2e-7, enough for a p-value
/// compared with 0.1).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// SWE-Perf's per-test gain: the largest `δ` in `[0, 1]` (steps of 0.001)
/// for which the original's times shrunk by `δ` are still significantly
/// slower than the patched times (one-sided Mann–Whitney U, `p < alpha`),
/// after dropping each side's values outside `[Q1 - IQR, Q3 + IQR]`;
/// 0 when even `δ = 0` is not significant (`evaluation/utils.py`,
/// `filter_outliers` and `find_max_significant_improvement`).
pub fn swe_perf_gain(base_times: &[f64], patched_times: &[f64], alpha: f64) -> f64 {
    let base = filter_outliers(base_times);
    let patched = filter_outliers(patched_times);
    let mut last = 0.0;
    let mut step = 0;
    while step <= 1000 {
        let x = step as f64 / 1000.0;
        let shrunk: Vec<f64> = base.iter().map(|b| b * (1.0 - x)).collect();
        if mann_whitney_greater(&shrunk, &patched) >= alpha {
            break;
        }
        last = x;
        step += 1;
    }
    last
}

/// Values within `[Q1 - 1·IQR, Q3 + 1·IQR]` (SWE-Perf's factor is 1).
pub fn filter_outliers(xs: &[f64]) -> Vec<f64> {
    if xs.len() < 4 {
        return xs.to_vec();
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let (q1, q3) = (quantile(&s, 0.25), quantile(&s, 0.75));
    let iqr = q3 - q1;
    xs.iter()
        .copied()
        .filter(|x| *x >= q1 - iqr && *x <= q3 + iqr)
        .collect()
}

/// Two-sided paired sign-flip (permutation) test of the mean difference:
/// exact over all 2^n signs up to 16 pairs, else `resamples` random flips.
pub fn sign_flip_p(diffs: &[f64], resamples: usize, seed: u64) -> f64 {
    let n = diffs.len();
    if n == 0 {
        return 1.0;
    }
    let observed = diffs.iter().sum::<f64>().abs();
    let eps = 1e-12 * (1.0 + observed);
    if n <= 16 {
        let total = 1u64 << n;
        let mut hits = 0u64;
        for mask in 0..total {
            let s: f64 = diffs
                .iter()
                .enumerate()
                .map(|(i, d)| if mask >> i & 1 == 1 { -d } else { *d })
                .sum();
            if s.abs() >= observed - eps {
                hits += 1;
            }
        }
        return hits as f64 / total as f64;
    }
    let mut rng = Rng::new(seed);
    let mut hits = 1usize;
    for _ in 0..resamples {
        let s: f64 = diffs
            .iter()
            .map(|d| if rng.next_u64() & 1 == 1 { -d } else { *d })
            .sum();
        if s.abs() >= observed - eps {
            hits += 1;
        }
    }
    hits as f64 / (resamples + 1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mann_whitney_matches_scipy() {
        // scipy.stats.mannwhitneyu([5,6,7],[1,2,3], alternative='greater').pvalue == 0.05
        assert!((mann_whitney_greater(&[5.0, 6.0, 7.0], &[1.0, 2.0, 3.0]) - 0.05).abs() < 1e-12);
        // ([1,2,3],[5,6,7]) -> 1.0
        assert!((mann_whitney_greater(&[1.0, 2.0, 3.0], &[5.0, 6.0, 7.0]) - 1.0).abs() < 1e-12);
        // ([3,5,7,9],[2,4,6,8]) exact: U=10, p = 0.34285714...
        assert!(
            (mann_whitney_greater(&[3.0, 5.0, 7.0, 9.0], &[2.0, 4.0, 6.0, 8.0]) - 0.342_857_142_857).abs()
                < 1e-9
        );
        // With ties, the normal approximation: SciPy 1.x gives
        // 0.014494959857146368 for ([2,2,3,4,5],[1,1,2,2,1]) greater.
        let p = mann_whitney_greater(&[2.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 1.0, 2.0, 2.0, 1.0]);
        assert!((p - 0.014_494_96).abs() < 1e-5, "{p}");
    }

    #[test]
    fn swe_perf_gain_finds_the_significant_shrink() {
        // Base 10 s, patched 8 s (8 clear rounds each): significant up to ~20%.
        let base = [10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98, 10.0];
        let patched = [8.0, 8.1, 7.9, 8.05, 7.95, 8.02, 7.98, 8.01];
        // SWE-Perf's loop over SciPy gives 0.196 for these.
        let g = swe_perf_gain(&base, &patched, 0.1);
        assert!((g - 0.196).abs() < 0.0015, "{g}");
        // No change: no gain.
        assert_eq!(swe_perf_gain(&base, &base, 0.1), 0.0);
        // Slower: none.
        assert_eq!(swe_perf_gain(&patched, &base, 0.1), 0.0);
    }

    #[test]
    fn bootstrap_covers_the_mean_and_is_seeded() {
        let xs: Vec<f64> = (0..40).map(|i| if i % 4 == 0 { 1.0 } else { 0.0 }).collect();
        let a = bootstrap_mean(&xs, 2000, 7);
        assert_eq!(a, bootstrap_mean(&xs, 2000, 7));
        assert!((a.value - 0.25).abs() < 1e-12);
        assert!(a.ci_low < 0.25 && a.ci_high > 0.25 && a.ci_low >= 0.0 && a.ci_high <= 1.0);
    }

    #[test]
    fn sign_flip_is_exact_for_few_pairs() {
        // All 5 differences positive: only 2 of 32 sign patterns are as extreme.
        assert!((sign_flip_p(&[1.0, 2.0, 1.5, 0.5, 1.0], 0, 0) - 2.0 / 32.0).abs() < 1e-12);
        assert!(sign_flip_p(&[1.0, -1.0, 0.5, -0.5], 0, 0) > 0.9);
    }
}
