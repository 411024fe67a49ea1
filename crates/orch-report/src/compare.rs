//! `orch compare RUN_A RUN_B`: the same cells in two runs (the same sweep on
//! different GPUs, say), side by side with their cost. Cells match by
//! benchmark and parameters (and by GPU too when both runs ran several GPUs
//! of the same cell).

use crate::fmt::{num, params, ratio, usd};
use crate::metrics;
use crate::model::usd_per_1k_tokens;
use crate::ReportError;
use orch_record::{CellStatus, CellView, RunRecord};
use orch_stats::Better;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Relative difference of $ per unit under which neither run is cheaper.
pub const SAME_COST: f64 = 0.01;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompareOptions {
    /// The metric to compare (default: each cell's throughput metric).
    pub metric: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunComparison {
    pub a: RunSide,
    pub b: RunSide,
    pub metric: Option<String>,
    pub pairs: Vec<Pair>,
    /// Cells of A with no match in B, and the other way round.
    pub only_a: Vec<String>,
    pub only_b: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSide {
    pub id: String,
    pub suite: String,
    pub backend: String,
    /// Dollars of every cell with a cost; `None` when none has one.
    pub usd: Option<f64>,
    pub wasted_usd: Option<f64>,
}

/// One cell of A against its match in B.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    pub benchmark: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub cell_a: String,
    pub cell_b: String,
    pub gpu_a: String,
    pub gpu_b: String,
    pub status_a: CellStatus,
    pub status_b: CellStatus,
    /// The metric compared; `None` when the two cells share none.
    pub metric: Option<String>,
    /// The metric's sense ([`orch_stats::better_for`]).
    pub better: Option<Better>,
    /// What one unit of the metric is (`output tokens`).
    pub unit: Option<String>,
    pub value_a: Option<f64>,
    pub value_b: Option<f64>,
    /// B / A.
    pub ratio: Option<f64>,
    /// > 1: B is better, whatever the metric's direction.
    pub speedup: Option<f64>,
    pub usd_per_gpu_hour_a: Option<f64>,
    pub usd_per_gpu_hour_b: Option<f64>,
    /// Dollars per 1k units of the metric's work (a rate metric, with a cost).
    pub usd_per_1k_a: Option<f64>,
    pub usd_per_1k_b: Option<f64>,
    /// B's $ per unit / A's.
    pub cost_ratio: Option<f64>,
    /// `a`, `b` or `same`: which run does the same work for less.
    pub cheaper: Option<String>,
    /// What each cell cost in all.
    pub usd_a: Option<f64>,
    pub usd_b: Option<f64>,
}

fn side(r: &RunRecord) -> RunSide {
    let costs: Vec<(&CellView, f64)> = r
        .cells
        .iter()
        .filter_map(|c| c.cost.as_ref().map(|k| (c, k.usd)))
        .collect();
    let any = !costs.is_empty();
    // The store's run-level sum counts earlier attempts too; prefer it.
    RunSide {
        id: r.id.clone(),
        suite: r.suite.clone(),
        backend: r.backend.clone(),
        usd: r
            .cost
            .as_ref()
            .map(|k| k.usd)
            .or_else(|| any.then(|| costs.iter().map(|(_, u)| u).sum())),
        wasted_usd: r.cost.as_ref().map(|k| k.wasted_usd).or_else(|| {
            any.then(|| {
                costs
                    .iter()
                    .filter(|(c, _)| {
                        c.status != CellStatus::Succeeded || c.cost.as_ref().is_some_and(|k| k.wasted)
                    })
                    .map(|(_, u)| u)
                    .sum()
            })
        }),
    }
}

fn key(c: &CellView) -> (String, String) {
    (
        c.benchmark.clone(),
        serde_json::to_string(&c.params).unwrap_or_default(),
    )
}

/// Cells of A and B that are the same work: first by benchmark, parameters
/// and GPU; then the remaining cells by benchmark and parameters where each
/// run has exactly one left.
pub fn match_cells<'a>(a: &'a RunRecord, b: &'a RunRecord) -> Vec<(&'a CellView, &'a CellView)> {
    let mut used_a = vec![false; a.cells.len()];
    let mut used_b = vec![false; b.cells.len()];
    let mut out: Vec<(usize, usize)> = Vec::new();
    for (i, ca) in a.cells.iter().enumerate() {
        if let Some(j) = b
            .cells
            .iter()
            .enumerate()
            .position(|(j, cb)| !used_b[j] && key(cb) == key(ca) && cb.gpu == ca.gpu)
        {
            used_a[i] = true;
            used_b[j] = true;
            out.push((i, j));
        }
    }
    for (i, ca) in a.cells.iter().enumerate() {
        if used_a[i] {
            continue;
        }
        let k = key(ca);
        let left_a = a
            .cells
            .iter()
            .enumerate()
            .filter(|(x, c)| !used_a[*x] && key(c) == k)
            .count();
        let left_b: Vec<usize> = b
            .cells
            .iter()
            .enumerate()
            .filter(|(y, c)| !used_b[*y] && key(c) == k)
            .map(|(y, _)| y)
            .collect();
        if left_a == 1 && left_b.len() == 1 {
            used_a[i] = true;
            used_b[left_b[0]] = true;
            out.push((i, left_b[0]));
        }
    }
    out.sort();
    out.into_iter().map(|(i, j)| (&a.cells[i], &b.cells[j])).collect()
}

fn per_1k_units(c: &CellView, value: f64) -> Option<f64> {
    let k = c.cost.as_ref().filter(|k| k.priced)?;
    if c.status != CellStatus::Succeeded {
        return None;
    }
    usd_per_1k_tokens(k.usd_per_s, value)
}

fn pair(ca: &CellView, cb: &CellView, wanted: Option<&str>) -> Pair {
    let metric = match wanted {
        Some(m) => (ca.metrics.contains_key(m) || cb.metrics.contains_key(m)).then(|| m.to_string()),
        None => [
            metrics::throughput_metric(&ca.metrics, None),
            metrics::throughput_metric(&cb.metrics, None),
        ]
        .into_iter()
        .flatten()
        .map(|(n, _)| n.to_string())
        .find(|n| ca.metrics.contains_key(n) && cb.metrics.contains_key(n)),
    };
    let get = |c: &CellView| {
        metric
            .as_ref()
            .and_then(|m| c.metrics.get(m).copied())
            .filter(|v| v.is_finite())
    };
    let (value_a, value_b) = (get(ca), get(cb));
    let better = metric.as_deref().map(orch_stats::better_for);
    let ratio = match (value_a, value_b) {
        (Some(x), Some(y)) if x != 0.0 => Some(y / x),
        _ => None,
    };
    let speedup = match (ratio, better) {
        (Some(r), Some(Better::Higher)) => Some(r),
        (Some(r), Some(Better::Lower)) if r != 0.0 => Some(1.0 / r),
        _ => None,
    };
    let rate = better == Some(Better::Higher);
    let usd_per_1k_a = value_a.filter(|_| rate).and_then(|v| per_1k_units(ca, v));
    let usd_per_1k_b = value_b.filter(|_| rate).and_then(|v| per_1k_units(cb, v));
    let (cost_ratio, cheaper) = match (usd_per_1k_a, usd_per_1k_b) {
        (Some(x), Some(y)) => {
            let r = (x > 0.0).then(|| y / x);
            let which = if x == y || (x > 0.0 && ((y - x) / x).abs() < SAME_COST) {
                "same"
            } else if y < x {
                "b"
            } else {
                "a"
            };
            (r, Some(which.to_string()))
        }
        _ => (None, None),
    };
    let gpu_hour = |c: &CellView| {
        c.cost
            .as_ref()
            .filter(|k| k.gpus > 0 && k.priced)
            .map(|k| k.usd_per_gpu_s * 3600.0)
    };
    Pair {
        benchmark: ca.benchmark.clone(),
        params: ca.params.clone(),
        cell_a: ca.id.clone(),
        cell_b: cb.id.clone(),
        gpu_a: ca.gpu.clone(),
        gpu_b: cb.gpu.clone(),
        status_a: ca.status,
        status_b: cb.status,
        unit: metric.as_deref().map(metrics::work_unit),
        metric,
        better,
        value_a,
        value_b,
        ratio,
        speedup,
        usd_per_gpu_hour_a: gpu_hour(ca),
        usd_per_gpu_hour_b: gpu_hour(cb),
        usd_per_1k_a,
        usd_per_1k_b,
        cost_ratio,
        cheaper,
        usd_a: ca.cost.as_ref().map(|k| k.usd),
        usd_b: cb.cost.as_ref().map(|k| k.usd),
    }
}

impl RunComparison {
    /// Compare two runs. Errors when they share no cell, or when
    /// `--metric` names a metric neither run has.
    pub fn build(
        a: &RunRecord,
        b: &RunRecord,
        options: &CompareOptions,
    ) -> Result<RunComparison, ReportError> {
        if let Some(m) = &options.metric {
            let has = |r: &RunRecord| r.cells.iter().any(|c| c.metrics.contains_key(m));
            if !has(a) && !has(b) {
                let mut names: Vec<String> = a
                    .cells
                    .iter()
                    .chain(&b.cells)
                    .flat_map(|c| c.metrics.keys().cloned())
                    .collect();
                names.sort();
                names.dedup();
                return Err(ReportError::UnknownMetric {
                    flag: "--metric",
                    name: m.clone(),
                    run: format!("{}` or `{}", a.id, b.id),
                    available: names,
                });
            }
        }
        let matched = match_cells(a, b);
        if matched.is_empty() {
            return Err(ReportError::NothingInCommon {
                a: a.id.clone(),
                b: b.id.clone(),
            });
        }
        let in_a: Vec<&str> = matched.iter().map(|(x, _)| x.id.as_str()).collect();
        let in_b: Vec<&str> = matched.iter().map(|(_, y)| y.id.as_str()).collect();
        Ok(RunComparison {
            a: side(a),
            b: side(b),
            metric: options.metric.clone(),
            pairs: matched
                .iter()
                .map(|(x, y)| pair(x, y, options.metric.as_deref()))
                .collect(),
            only_a: a
                .cells
                .iter()
                .filter(|c| !in_a.contains(&c.id.as_str()))
                .map(|c| c.id.clone())
                .collect(),
            only_b: b
                .cells
                .iter()
                .filter(|c| !in_b.contains(&c.id.as_str()))
                .map(|c| c.id.clone())
                .collect(),
        })
    }

    /// The text table `orch compare` prints.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (name, s) in [("A", &self.a), ("B", &self.b)] {
            let cost = match (s.usd, s.wasted_usd) {
                (Some(u), Some(w)) if w > 0.0 => format!("cost {} ({} wasted)", usd(u), usd(w)),
                (Some(u), _) => format!("cost {}", usd(u)),
                _ => "no cost recorded".into(),
            };
            let _ = writeln!(
                out,
                "{name}  {}  suite {}  backend {}  {cost}",
                s.id, s.suite, s.backend
            );
        }
        out.push('\n');
        let o = |v: Option<f64>, f: fn(f64) -> String| v.map(f).unwrap_or_else(|| "-".into());
        let rows: Vec<Vec<String>> = self
            .pairs
            .iter()
            .map(|p| {
                let name = if p.params.is_empty() {
                    p.benchmark.clone()
                } else {
                    format!("{} {}", p.benchmark, params(&p.params))
                };
                let status = |s: CellStatus| {
                    if s == CellStatus::Succeeded {
                        String::new()
                    } else {
                        format!(" ({s})")
                    }
                };
                vec![
                    name,
                    format!("{}{}", p.gpu_a, status(p.status_a)),
                    format!("{}{}", p.gpu_b, status(p.status_b)),
                    p.metric.clone().unwrap_or_else(|| "-".into()),
                    o(p.value_a, num),
                    o(p.value_b, num),
                    o(p.ratio, ratio),
                    o(p.usd_per_gpu_hour_a, usd),
                    o(p.usd_per_gpu_hour_b, usd),
                    o(p.usd_per_1k_a, usd),
                    o(p.usd_per_1k_b, usd),
                    match (p.cheaper.as_deref(), p.cost_ratio) {
                        (Some("same"), _) => "same".into(),
                        (Some("b"), Some(r)) => format!("B ({}× the cost)", ratio(r)),
                        (Some("a"), Some(r)) => format!("A (B costs {}×)", ratio(r)),
                        (Some(w), _) => w.to_uppercase(),
                        (None, _) => "-".into(),
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "CELL",
                "GPU A",
                "GPU B",
                "METRIC",
                "A",
                "B",
                "B/A",
                "$/GPU-H A",
                "$/GPU-H B",
                "$/1K A",
                "$/1K B",
                "CHEAPER",
            ],
            &rows,
        ));
        let units: Vec<String> = {
            let mut u: Vec<String> = self
                .pairs
                .iter()
                .filter(|p| p.usd_per_1k_a.is_some() || p.usd_per_1k_b.is_some())
                .filter_map(|p| Some(format!("{} → 1k {}", p.metric.as_ref()?, p.unit.as_ref()?)))
                .collect();
            u.sort();
            u.dedup();
            u
        };
        out.push_str("\nB/A: B's value over A's. $/1K: dollars per 1k units of work (cost per second / throughput × 1000)");
        if !units.is_empty() {
            let _ = write!(out, ": {}", units.join(", "));
        }
        out.push_str(". CHEAPER: the run that does the same work for less.\n");
        if !self.only_a.is_empty() {
            let _ = writeln!(out, "only in A: {}", self.only_a.join(", "));
        }
        if !self.only_b.is_empty() {
            let _ = writeln!(out, "only in B: {}", self.only_b.join(", "));
        }
        out
    }
}

/// Left-aligned columns, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths
                    .get(i)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(c.chars().count());
                format!("{c}{}", " ".repeat(pad))
            })
            .collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}
