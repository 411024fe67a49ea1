//! Summary statistics of repeated measurements.

use std::collections::BTreeMap;

/// Summary of a sample (values in the sample's unit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    pub median: f64,
    pub p95: f64,
    pub p99: f64,
    pub std: f64,
    /// Coefficient of variation, percent (std / mean * 100).
    pub cv_pct: f64,
    pub min: f64,
    pub max: f64,
}

/// Percentile by linear interpolation between closest ranks (numpy's default).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p / 100.0) * (sorted.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    let frac = rank - lo as f64;
    sorted[lo] + (sorted[hi] - sorted[lo]) * frac
}

/// Median of a sample (NaN when it is empty).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    percentile(&sorted, 50.0)
}

/// Summarise a sample; `None` when it is empty.
pub fn summarize(values: &[f64]) -> Option<Summary> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let n = sorted.len();
    let mean = sorted.iter().sum::<f64>() / n as f64;
    // Sample standard deviation (n - 1), as numpy.std(ddof=1) and statistics.stdev.
    let std = if n > 1 {
        (sorted.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    } else {
        0.0
    };
    Some(Summary {
        n,
        mean,
        median: percentile(&sorted, 50.0),
        p95: percentile(&sorted, 95.0),
        p99: percentile(&sorted, 99.0),
        std,
        cv_pct: if mean != 0.0 { std / mean * 100.0 } else { 0.0 },
        min: sorted[0],
        max: sorted[n - 1],
    })
}

impl Summary {
    /// Insert `<prefix>_mean<suffix>` and friends into a metrics map.
    pub fn insert_into(&self, metrics: &mut BTreeMap<String, f64>, prefix: &str, suffix: &str) {
        let mut put = |name: &str, v: f64| {
            metrics.insert(format!("{prefix}_{name}{suffix}"), v);
        };
        put("mean", self.mean);
        put("median", self.median);
        put("p95", self.p95);
        put("p99", self.p99);
        put("std", self.std);
        put("min", self.min);
        put("max", self.max);
        metrics.insert(format!("{prefix}_cv_pct"), self.cv_pct);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_summary() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0, 5.0]).unwrap();
        assert_eq!(s.n, 5);
        assert!((s.mean - 3.0).abs() < 1e-12);
        assert!((s.median - 3.0).abs() < 1e-12);
        // ddof=1: var = 10/4 = 2.5
        assert!((s.std - 2.5f64.sqrt()).abs() < 1e-12);
        // rank 0.95*4 = 3.8 -> 4 + 0.8*(5-4)
        assert!((s.p95 - 4.8).abs() < 1e-12);
        assert!((s.p99 - 4.96).abs() < 1e-12);
        assert!((s.cv_pct - 2.5f64.sqrt() / 3.0 * 100.0).abs() < 1e-9);
    }

    #[test]
    fn empty_and_single() {
        assert!(summarize(&[]).is_none());
        let s = summarize(&[7.0]).unwrap();
        assert_eq!(s.std, 0.0);
        assert_eq!(s.p99, 7.0);
    }
}
