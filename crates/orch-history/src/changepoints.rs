//! Change points of a series by E-divisive means (Matteson & James 2014, as
//! Apache Otava uses it): the energy-statistic divergence with α = 1,
//! recursive bisection, a seeded permutation test for each new change
//! point, and Welch's t interval of each shift. The method is written out
//! in the crate docs.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, StudentsT};

/// How change points are searched and tested.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Options {
    /// A change point is accepted when its permutation p-value is below this.
    pub significance: f64,
    /// Shuffles per permutation test (`R`; the smallest p-value is `1/(R+1)`).
    pub permutations: usize,
    /// The fewest points on each side of a change point (at least 2).
    pub min_size: usize,
    /// Seed of the permutation test's RNG: one input, one answer.
    pub seed: u64,
    /// Move each accepted change point to the best mean-shift split (least
    /// squares) within `min_size` points of it, inside its two segments.
    pub refine: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            significance: 0.05,
            permutations: 199,
            min_size: 3,
            seed: 0x6f72_6368,
            refine: true,
        }
    }
}

/// One change point of a series of values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangePoint {
    /// The first value at the new level (an index into the values).
    pub index: usize,
    /// Mean of the segment before (from the previous change point).
    pub mean_before: f64,
    /// Mean of the segment after (to the next change point).
    pub mean_after: f64,
    pub n_before: usize,
    pub n_after: usize,
    /// `(mean_after − mean_before) / |mean_before|`.
    pub shift: f64,
    /// 95% Welch interval of the shift, relative to `|mean_before|`.
    pub shift_low: f64,
    pub shift_high: f64,
    /// The permutation test's p-value when the point was accepted.
    pub p_value: f64,
}

/// The change points of `values` (in order of index).
pub fn detect(values: &[f64], opts: &Options) -> Vec<ChangePoint> {
    let min = opts.min_size.max(2);
    let mut segments: Vec<(usize, usize)> = vec![(0, values.len())];
    let mut found: Vec<(usize, f64)> = Vec::new();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut scratch: Vec<f64> = Vec::new();
    loop {
        let best = segments
            .iter()
            .enumerate()
            .filter_map(|(k, &(s, e))| best_split(&values[s..e], min).map(|(t, q)| (k, s + t, q)))
            .max_by(|a, b| a.2.total_cmp(&b.2));
        let Some((seg, at, q)) = best else { break };
        // The permutation test: the largest Q over every current segment,
        // each segment shuffled within itself. Stops as soon as the p-value
        // can no longer fall under the significance.
        let limit = (opts.significance * (opts.permutations + 1) as f64).ceil() as usize;
        let mut at_least = 0usize;
        let mut done = 0usize;
        // Ranks within a segment do not change when it is shuffled: the
        // (value, rank) pairs are ranked once and shuffled together.
        let mut ranked: Vec<Vec<(f64, usize)>> =
            segments.iter().map(|&(s, e)| with_ranks(&values[s..e])).collect();
        while done < opts.permutations && at_least < limit {
            let mut q_perm = f64::NEG_INFINITY;
            for pairs in &mut ranked {
                pairs.shuffle(&mut rng);
                if let Some((_, q)) = split_ranked(pairs, min, &mut scratch) {
                    q_perm = q_perm.max(q);
                }
            }
            if q_perm >= q {
                at_least += 1;
            }
            done += 1;
        }
        let p = (1 + at_least) as f64 / (done + 1) as f64;
        if at_least >= limit || p >= opts.significance {
            break;
        }
        found.push((at, p));
        let (s, e) = segments[seg];
        segments[seg] = (s, at);
        segments.push((at, e));
    }
    found.sort_by_key(|f| f.0);
    if opts.refine {
        refine(values, &mut found, min);
    }
    describe(values, &found)
}

/// Each change point moved to the split of its two adjacent segments with
/// the largest `mn/(m+n) · (mean_left − mean_right)²` (the least-squares
/// mean shift), at most `min` points away, each side keeping `min` points.
fn refine(values: &[f64], found: &mut [(usize, f64)], min: usize) {
    for k in 0..found.len() {
        let a = if k == 0 { 0 } else { found[k - 1].0 };
        let b = found.get(k + 1).map_or(values.len(), |f| f.0);
        let c = found[k].0;
        let lo = (a + min).max(c.saturating_sub(min));
        let hi = b.saturating_sub(min).min(c + min);
        let seg = &values[a..b];
        let total: f64 = seg.iter().sum();
        let score = |t: usize| {
            let left: f64 = values[a..t].iter().sum();
            let (m, n) = ((t - a) as f64, (b - t) as f64);
            let d = left / m - (total - left) / n;
            m * n / (m + n) * d * d
        };
        if let Some(best) = (lo..=hi).max_by(|&x, &y| {
            score(x)
                .total_cmp(&score(y))
                .then(y.abs_diff(c).cmp(&x.abs_diff(c)))
        }) {
            found[k].0 = best;
        }
    }
}

/// Means, shifts and Welch intervals of accepted change points `(index, p)`.
fn describe(values: &[f64], found: &[(usize, f64)]) -> Vec<ChangePoint> {
    let bounds: Vec<usize> = std::iter::once(0)
        .chain(found.iter().map(|f| f.0))
        .chain(std::iter::once(values.len()))
        .collect();
    found
        .iter()
        .enumerate()
        .map(|(k, &(index, p))| {
            let before = &values[bounds[k]..index];
            let after = &values[index..bounds[k + 2]];
            let (mb, vb) = mean_var(before);
            let (ma, va) = mean_var(after);
            let (nb, na) = (before.len() as f64, after.len() as f64);
            let diff = ma - mb;
            let (sb, sa) = (vb / nb, va / na);
            let se = (sb + sa).sqrt();
            let half = if se > 0.0 {
                // Welch–Satterthwaite degrees of freedom.
                let df = (sb + sa).powi(2) / (sb * sb / (nb - 1.0) + sa * sa / (na - 1.0));
                t_quantile(0.975, df) * se
            } else {
                0.0
            };
            let scale = mb.abs();
            ChangePoint {
                index,
                mean_before: mb,
                mean_after: ma,
                n_before: before.len(),
                n_after: after.len(),
                shift: diff / scale,
                shift_low: (diff - half) / scale,
                shift_high: (diff + half) / scale,
                p_value: p,
            }
        })
        .collect()
}

/// Mean and sample variance (0 for fewer than two values).
pub(crate) fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    if x.is_empty() {
        return (f64::NAN, 0.0);
    }
    let m = x.iter().sum::<f64>() / n;
    if x.len() < 2 {
        return (m, 0.0);
    }
    let v = x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, v)
}

fn t_quantile(p: f64, df: f64) -> f64 {
    match StudentsT::new(0.0, 1.0, df.max(1.0)) {
        Ok(t) => t.inverse_cdf(p),
        // Only for a degenerate df; the normal quantile is the limit.
        Err(_) => 1.959_963_984_540_054,
    }
}

/// The split `τ` of `x` (left `x[..τ]`, right `x[τ..]`, each at least `min`
/// long) with the largest `Q = mn/(m+n) · Ê` (α = 1), and that `Q`.
pub(crate) fn best_split(x: &[f64], min: usize) -> Option<(usize, f64)> {
    split_ranked(&with_ranks(x), min, &mut Vec::new())
}

/// Each value with its rank in `x` (ties in any order: a tie's distance
/// is 0 either way).
fn with_ranks(x: &[f64]) -> Vec<(f64, usize)> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut out = vec![(0.0, 0usize); x.len()];
    for (r, &i) in order.iter().enumerate() {
        out[i] = (x[i], r);
    }
    out
}

/// [`best_split`] of values given with their ranks; `buf` is scratch space.
fn split_ranked(x: &[(f64, usize)], min: usize, buf: &mut Vec<f64>) -> Option<(usize, f64)> {
    let l = x.len();
    if l < 2 * min {
        return None;
    }
    // r[t] = Σ_{i<t} |x_i − x_t|, s[t] = Σ_{j>t} |x_t − x_j|.
    buf.clear();
    buf.resize(2 * l, 0.0);
    let (r, s) = buf.split_at_mut(l);
    let mut bit = Fenwick::new(l);
    for (t, &(v, rank)) in x.iter().enumerate() {
        r[t] = bit.distance_sum(rank, v);
        bit.add(rank, v);
    }
    let mut bit = Fenwick::new(l);
    for (t, &(v, rank)) in x.iter().enumerate().rev() {
        s[t] = bit.distance_sum(rank, v);
        bit.add(rank, v);
    }
    let total: f64 = r.iter().sum();
    // W_L(τ) = Σ_{t<τ} r_t, W_R(τ) = Σ_{t≥τ} s_t (s becomes its suffix sums).
    for t in (0..l - 1).rev() {
        s[t] += s[t + 1];
    }
    let mut w_left = 0.0;
    let mut best: Option<(usize, f64)> = None;
    for tau in 1..l {
        w_left += r[tau - 1];
        if tau < min || l - tau < min {
            continue;
        }
        let w_right = s[tau];
        let between = total - w_left - w_right;
        let (m, n) = (tau as f64, (l - tau) as f64);
        let e = 2.0 * between / (m * n) - w_left / (m * (m - 1.0) / 2.0) - w_right / (n * (n - 1.0) / 2.0);
        let q = m * n / (m + n) * e;
        if best.is_none_or(|(_, b)| q > b) {
            best = Some((tau, q));
        }
    }
    best
}

/// Counts and sums of values inserted by rank.
struct Fenwick {
    count: Vec<f64>,
    sum: Vec<f64>,
    inserted: f64,
    total: f64,
}

impl Fenwick {
    fn new(n: usize) -> Fenwick {
        Fenwick {
            count: vec![0.0; n + 1],
            sum: vec![0.0; n + 1],
            inserted: 0.0,
            total: 0.0,
        }
    }

    fn add(&mut self, rank: usize, v: f64) {
        let mut i = rank + 1;
        while i < self.count.len() {
            self.count[i] += 1.0;
            self.sum[i] += v;
            i += i & i.wrapping_neg();
        }
        self.inserted += 1.0;
        self.total += v;
    }

    /// Count and sum of inserted values of rank ≤ `rank`.
    fn prefix(&self, rank: usize) -> (f64, f64) {
        let (mut c, mut s) = (0.0, 0.0);
        let mut i = rank + 1;
        while i > 0 {
            c += self.count[i];
            s += self.sum[i];
            i -= i & i.wrapping_neg();
        }
        (c, s)
    }

    /// Σ |v − x| over the inserted values x (`rank` is v's own rank).
    fn distance_sum(&self, rank: usize, v: f64) -> f64 {
        let (c, s) = self.prefix(rank);
        (v * c - s) + (self.total - s - v * (self.inserted - c))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::Rng;

    /// A normal draw (Box–Muller).
    pub(crate) fn normal(rng: &mut StdRng) -> f64 {
        let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.random();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// `n` values around 1000 with `noise` relative sd; from each
    /// `(index, shift)` on, the level is multiplied by `1 + shift`.
    pub(crate) fn series(n: usize, shifts: &[(usize, f64)], noise: f64, seed: u64) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|i| {
                let level = shifts
                    .iter()
                    .filter(|(at, _)| *at <= i)
                    .fold(1000.0, |l, (_, s)| l * (1.0 + s));
                level * (1.0 + noise * normal(&mut rng))
            })
            .collect()
    }

    /// Q by the definition, O(L²), to check the Fenwick sums against.
    fn q_naive(x: &[f64], tau: usize) -> f64 {
        let (a, b) = x.split_at(tau);
        let (m, n) = (a.len() as f64, b.len() as f64);
        let between: f64 = a.iter().flat_map(|u| b.iter().map(move |v| (u - v).abs())).sum();
        let within = |y: &[f64]| -> f64 {
            let mut s = 0.0;
            for i in 0..y.len() {
                for j in i + 1..y.len() {
                    s += (y[i] - y[j]).abs();
                }
            }
            s
        };
        let e =
            2.0 * between / (m * n) - within(a) / (m * (m - 1.0) / 2.0) - within(b) / (n * (n - 1.0) / 2.0);
        m * n / (m + n) * e
    }

    #[test]
    fn the_fast_divergence_is_the_definition() {
        let mut x = series(40, &[(25, 0.1)], 0.03, 7);
        x[3] = x[4]; // a tie
        let (tau, q) = best_split(&x, 3).unwrap();
        let naive: Vec<f64> = (3..=37).map(|t| q_naive(&x, t)).collect();
        let (k, best) = naive
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap();
        assert_eq!(tau, k + 3);
        assert!((q - best).abs() < 1e-6 * best.abs(), "{q} vs {best}");
    }

    #[test]
    fn planted_shifts_are_found_within_one_point() {
        // Two planted 10% shifts in 3% noise, in 50 seeded series.
        let (mut hits, mut planted, mut extra) = (0, 0, 0);
        for seed in 0..50 {
            let x = series(60, &[(20, 0.10), (40, -0.10)], 0.03, seed);
            let cps = detect(&x, &Options::default());
            for at in [20usize, 40] {
                planted += 1;
                if cps.iter().any(|c| c.index.abs_diff(at) <= 1) {
                    hits += 1;
                }
            }
            extra += cps
                .iter()
                .filter(|c| c.index.abs_diff(20) > 1 && c.index.abs_diff(40) > 1)
                .count();
        }
        let recall = hits as f64 / planted as f64;
        let unrefined = (0..50)
            .flat_map(|seed| {
                let x = series(60, &[(20, 0.10), (40, -0.10)], 0.03, seed);
                let cps = detect(
                    &x,
                    &Options {
                        refine: false,
                        ..Options::default()
                    },
                );
                [20usize, 40].map(|at| cps.iter().any(|c| c.index.abs_diff(at) <= 1))
            })
            .filter(|hit| *hit)
            .count();
        eprintln!(
            "without the refinement: recall {:.3} within ±1 point",
            unrefined as f64 / 100.0
        );
        eprintln!("planted 10% shifts: recall {recall:.3} within ±1 point, {extra} extra change points in 50 series");
        assert!(recall >= 0.95, "recall {recall}");
        assert!(extra <= 5, "{extra} extra change points");
        // The numbers of one: size, interval, p-value, direction.
        let x = series(60, &[(20, 0.10), (40, -0.10)], 0.03, 1);
        let cps = detect(&x, &Options::default());
        let up = cps.iter().find(|c| c.index.abs_diff(20) <= 1).unwrap();
        assert!(up.shift > 0.05 && up.shift < 0.15, "{up:?}");
        assert!(
            up.shift_low < up.shift && up.shift < up.shift_high && up.shift_low > 0.0,
            "{up:?}"
        );
        assert!(up.p_value < 0.05);
        let down = cps.iter().find(|c| c.index.abs_diff(40) <= 1).unwrap();
        assert!(down.shift < -0.05 && down.shift_high < 0.0, "{down:?}");
    }

    #[test]
    fn a_flat_noisy_series_rarely_raises_a_change_point() {
        let runs = 200;
        let alarms = (0..runs)
            .filter(|&seed| !detect(&series(100, &[], 0.03, 1000 + seed), &Options::default()).is_empty())
            .count();
        let rate = alarms as f64 / runs as f64;
        eprintln!("false-alarm rate on flat series (100 points, 3% noise): {rate:.3} ({alarms}/{runs})");
        assert!(rate < 0.10, "false-alarm rate {rate}");
    }

    #[test]
    fn one_level_shift_is_one_change_point() {
        // 30 points, a 10% drop, 20 more points at the new level.
        let (mut exactly_one, mut near) = (0, 0);
        for seed in 0..100 {
            let x = series(51, &[(30, -0.10)], 0.03, 500 + seed);
            let cps = detect(&x, &Options::default());
            assert!(
                cps.iter().any(|c| c.index.abs_diff(30) <= 3),
                "seed {seed}: {cps:?}"
            );
            if cps.iter().any(|c| c.index.abs_diff(30) <= 1) {
                near += 1;
            }
            if cps.len() == 1 {
                exactly_one += 1;
            }
        }
        eprintln!("one level shift: exactly one change point in {exactly_one}/100 series, within ±1 point in {near}/100");
        // Each further split is tested at 5%: about 95% expected.
        assert!(exactly_one >= 85, "{exactly_one}/100");
        assert!(near >= 95, "{near}/100");
        let x = series(51, &[(30, -0.10)], 0.03, 500);
        assert_eq!(detect(&x, &Options::default()).len(), 1);
    }

    #[test]
    fn runs_after_a_level_shift_raise_no_new_change_point() {
        // The history growing one run at a time after a 10% drop at 30:
        // every analysis from 6 points after the drop on names the same one.
        let (mut stable, mut analyses) = (0, 0);
        for seed in 0..20 {
            let x = series(51, &[(30, -0.10)], 0.03, 700 + seed);
            for end in 36..=51 {
                let cps = detect(&x[..end], &Options::default());
                analyses += 1;
                if cps.len() == 1 && cps[0].index.abs_diff(30) <= 1 {
                    stable += 1;
                }
            }
        }
        eprintln!(
            "growing history after one shift: exactly the one change point in {stable}/{analyses} analyses"
        );
        assert!(stable as f64 >= 0.9 * analyses as f64, "{stable}/{analyses}");
    }

    #[test]
    fn ten_thousand_points() {
        let x = series(10_000, &[(2500, -0.10), (6000, 0.08)], 0.03, 5);
        let t = std::time::Instant::now();
        let cps = detect(&x, &Options::default());
        eprintln!(
            "10,000 points: {:?}, change points at {:?}",
            t.elapsed(),
            cps.iter().map(|c| c.index).collect::<Vec<_>>()
        );
        for at in [2500usize, 6000] {
            assert!(cps.iter().any(|c| c.index.abs_diff(at) <= 1), "{at}: {cps:?}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_answer() {
        let x = series(80, &[(40, 0.05)], 0.03, 3);
        assert_eq!(detect(&x, &Options::default()), detect(&x, &Options::default()));
        assert!(detect(&[], &Options::default()).is_empty());
        assert!(detect(&[1.0; 5], &Options::default()).is_empty());
        assert!(detect(&[1.0; 50], &Options::default()).is_empty());
    }
}
