//! Which metric of a cell is its throughput, its token rate and its latency.
//!
//! Workloads name their metrics differently: the builtin transformer reports
//! `tokens_per_s` and `step_time_{mean,median,p95,p99,std,min,max}_ms`; the
//! load generator uses `vllm bench serve` names (`output_throughput`,
//! `mean_ttft_ms`, `p99_itl_ms`, ...); a command reports what it likes. The
//! orders below are the documented defaults (docs/report.md); `--metric` and
//! `--latency` override them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Throughput metrics, most preferred first. When a cell has none of them,
/// its first metric (by name) that reads as a rate is taken: a name ending in
/// `_per_s`, `_per_sec`, `_per_second`, or containing `throughput`. Names
/// with a `.` (a comparison's per-variant means) are never picked by default.
pub const THROUGHPUT_ORDER: &[&str] = &[
    "output_throughput",
    "tokens_per_s",
    "output_tokens_per_s",
    "total_token_throughput",
    "request_throughput",
    "samples_per_s",
];

/// Output-token rates ($ per 1k output tokens is computed from the first
/// one a cell has).
pub const TOKEN_RATE_ORDER: &[&str] = &[
    "output_throughput",
    "output_tokens_per_s",
    "tokens_per_s",
    "output_tokens_per_second",
    "tokens_per_second",
];

/// Latency families, most preferred first; then any other family a cell
/// has, by name.
pub const LATENCY_ORDER: &[&str] = &["step_time", "ttft", "tpot", "itl", "e2el", "latency"];

/// Statistics recognised in a latency family's metric names.
const STATS: &[&str] = &["mean", "median", "p50", "p90", "p95", "p99", "std", "min", "max"];
const UNITS: &[&str] = &["_ms", "_us", "_s"];

/// Is a name a rate (fallback rule of [`THROUGHPUT_ORDER`])?
pub fn reads_as_rate(name: &str) -> bool {
    !name.contains('.')
        && (name.ends_with("_per_s")
            || name.ends_with("_per_sec")
            || name.ends_with("_per_second")
            || name.contains("throughput"))
}

/// The throughput metric of a cell: `wanted` if given (and present), else
/// the default order.
pub fn throughput_metric<'a>(
    metrics: &'a BTreeMap<String, f64>,
    wanted: Option<&str>,
) -> Option<(&'a str, f64)> {
    if let Some(w) = wanted {
        return metrics.get_key_value(w).map(|(k, v)| (k.as_str(), *v));
    }
    THROUGHPUT_ORDER
        .iter()
        .find_map(|k| metrics.get_key_value(*k))
        .or_else(|| metrics.iter().find(|(k, _)| reads_as_rate(k)))
        .map(|(k, v)| (k.as_str(), *v))
}

/// The output-token rate of a cell, per [`TOKEN_RATE_ORDER`].
pub fn token_rate(metrics: &BTreeMap<String, f64>) -> Option<(&'static str, f64)> {
    TOKEN_RATE_ORDER
        .iter()
        .find_map(|k| metrics.get(*k).map(|v| (*k, *v)))
}

/// What one unit of a throughput metric is: `output tokens` for
/// `tokens_per_s`, `requests` for `request_throughput`, `md5_mib` for
/// `md5_mib_per_s`.
pub fn work_unit(metric: &str) -> String {
    if TOKEN_RATE_ORDER.contains(&metric) {
        return "output tokens".into();
    }
    match metric {
        "total_token_throughput" => "tokens".into(),
        "request_throughput" => "requests".into(),
        "samples_per_s" => "samples".into(),
        m => ["_per_second", "_per_sec", "_per_s"]
            .iter()
            .find_map(|s| m.strip_suffix(s))
            .map(String::from)
            .unwrap_or_else(|| "units".into()),
    }
}

/// One latency family of a cell: the statistics it reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// `step_time`, `ttft`, ...
    pub family: String,
    /// `ms`, `us`, `s`, or empty when the names carry no unit.
    pub unit: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p95: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub std: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
}

impl Latency {
    fn new(family: &str, unit: &str) -> Latency {
        Latency {
            family: family.into(),
            unit: unit.into(),
            mean: None,
            median: None,
            p90: None,
            p95: None,
            p99: None,
            std: None,
            min: None,
            max: None,
        }
    }

    fn set(&mut self, stat: &str, v: f64) {
        let slot = match stat {
            "mean" => &mut self.mean,
            "median" | "p50" => &mut self.median,
            "p90" => &mut self.p90,
            "p95" => &mut self.p95,
            "p99" => &mut self.p99,
            "std" => &mut self.std,
            "min" => &mut self.min,
            "max" => &mut self.max,
            _ => return,
        };
        if slot.is_none() {
            *slot = Some(v);
        }
    }

    fn count(&self) -> usize {
        [
            self.mean,
            self.median,
            self.p90,
            self.p95,
            self.p99,
            self.std,
            self.min,
            self.max,
        ]
        .iter()
        .filter(|x| x.is_some())
        .count()
    }

    /// `step_time (ms)`.
    pub fn label(&self) -> String {
        if self.unit.is_empty() {
            self.family.clone()
        } else {
            format!("{} ({})", self.family, self.unit)
        }
    }
}

/// Split a metric name into (family, stat, unit): `step_time_p95_ms` →
/// (`step_time`, `p95`, `ms`); `mean_ttft_ms` → (`ttft`, `mean`, `ms`).
fn split(name: &str) -> Option<(&str, &str, &str)> {
    if name.contains('.') {
        return None;
    }
    let (stem, unit) = UNITS
        .iter()
        .find_map(|u| name.strip_suffix(u).map(|s| (s, &u[1..])))
        .unwrap_or((name, ""));
    for s in STATS {
        if let Some(f) = stem.strip_prefix(s).and_then(|r| r.strip_prefix('_')) {
            if !f.is_empty() {
                return Some((f, s, unit));
            }
        }
        if let Some(f) = stem.strip_suffix(s).and_then(|r| r.strip_suffix('_')) {
            if !f.is_empty() {
                return Some((f, s, unit));
            }
        }
    }
    None
}

/// Every latency family of a cell (two statistics at least, one of them
/// the mean or the median), in [`LATENCY_ORDER`] then by name.
pub fn latency_families(metrics: &BTreeMap<String, f64>) -> Vec<Latency> {
    let mut found: BTreeMap<(String, String), Latency> = BTreeMap::new();
    for (name, v) in metrics {
        if let Some((family, stat, unit)) = split(name) {
            found
                .entry((family.to_string(), unit.to_string()))
                .or_insert_with(|| Latency::new(family, unit))
                .set(stat, *v);
        }
    }
    let mut out: Vec<Latency> = found
        .into_values()
        .filter(|l| l.count() >= 2 && (l.mean.is_some() || l.median.is_some()))
        .collect();
    let rank = |f: &str| LATENCY_ORDER.iter().position(|x| *x == f).unwrap_or(usize::MAX);
    out.sort_by(|a, b| {
        rank(&a.family)
            .cmp(&rank(&b.family))
            .then(a.family.cmp(&b.family))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn throughput_defaults_and_override() {
        let vllm = m(&[
            ("request_throughput", 2.0),
            ("output_throughput", 500.0),
            ("total_token_throughput", 900.0),
            ("mean_ttft_ms", 30.0),
        ]);
        assert_eq!(throughput_metric(&vllm, None), Some(("output_throughput", 500.0)));
        assert_eq!(
            throughput_metric(&vllm, Some("request_throughput")),
            Some(("request_throughput", 2.0))
        );
        assert_eq!(throughput_metric(&vllm, Some("nope")), None);
        let transformer = m(&[("tokens_per_s", 2485.0), ("step_time_mean_ms", 51.5)]);
        assert_eq!(
            throughput_metric(&transformer, None),
            Some(("tokens_per_s", 2485.0))
        );
        // A command's own rate; a comparison's per-variant means are skipped.
        let cmd = m(&[("md5_mib", 256.0), ("md5_mib_per_s", 400.0), ("md5_ms", 640.0)]);
        assert_eq!(throughput_metric(&cmd, None), Some(("md5_mib_per_s", 400.0)));
        let cmp = m(&[("baseline.output_throughput", 1.0)]);
        assert_eq!(throughput_metric(&cmp, None), None);
        assert_eq!(token_rate(&vllm), Some(("output_throughput", 500.0)));
        assert_eq!(token_rate(&cmd), None);
        assert_eq!(work_unit("tokens_per_s"), "output tokens");
        assert_eq!(work_unit("md5_mib_per_s"), "md5_mib");
        assert_eq!(work_unit("request_throughput"), "requests");
    }

    #[test]
    fn latency_families_of_real_workloads() {
        let t = m(&[
            ("step_time_mean_ms", 51.5),
            ("step_time_median_ms", 50.0),
            ("step_time_p95_ms", 60.0),
            ("step_time_p99_ms", 61.0),
            ("step_time_std_ms", 3.0),
            ("step_time_cv_pct", 5.8),
            ("tokens_per_s", 10.0),
            ("md5_ms", 3.0),
        ]);
        let fams = latency_families(&t);
        assert_eq!(fams.len(), 1);
        let l = &fams[0];
        assert_eq!((l.family.as_str(), l.unit.as_str()), ("step_time", "ms"));
        assert_eq!(
            (l.mean, l.median, l.p95, l.p99, l.std),
            (Some(51.5), Some(50.0), Some(60.0), Some(61.0), Some(3.0))
        );

        let v = m(&[
            ("mean_e2el_ms", 900.0),
            ("median_e2el_ms", 880.0),
            ("mean_ttft_ms", 30.0),
            ("median_ttft_ms", 28.0),
            ("p90_ttft_ms", 40.0),
            ("p99_ttft_ms", 55.0),
            ("std_ttft_ms", 4.0),
            ("mean_itl_ms", 9.0),
            ("p99_itl_ms", 20.0),
        ]);
        let fams: Vec<String> = latency_families(&v).into_iter().map(|l| l.family).collect();
        assert_eq!(fams, ["ttft", "itl", "e2el"]);
        let ttft = &latency_families(&v)[0];
        assert_eq!((ttft.p90, ttft.p95, ttft.p99), (Some(40.0), None, Some(55.0)));

        // A command's own family, without a unit suffix.
        let c = m(&[
            ("latency_mean", 1.0),
            ("latency_p99", 2.0),
            ("queue_mean_s", 1.0),
            ("queue_max_s", 3.0),
        ]);
        let fams: Vec<(String, String)> = latency_families(&c)
            .into_iter()
            .map(|l| (l.family, l.unit))
            .collect();
        assert_eq!(
            fams,
            [("latency".into(), "".into()), ("queue".into(), "s".into())]
        );
    }
}
