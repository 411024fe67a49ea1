//! The series of a suite's runs: one per (benchmark, cell params, metric,
//! testbed), each point a run (its id, time, commit, and value or failure).
//! Also the filters (`--benchmark`, `--metric`, `--since 30d`).

use crate::HistoryError;
use chrono::{DateTime, Duration, Utc};
use orch_record::{CellStatus, CellView, FailureKind, RunRecord};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The metric name of a series that holds only failures (a cell that never
/// succeeded on its testbed, so no metric is known).
pub const NO_METRIC: &str = "(no metric)";

/// Where a cell ran, as far as numbers compare: the backend and the hardware.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Testbed {
    pub backend: String,
    /// The GPU model (`NVIDIA H100 80GB HBM3`; several models joined by
    /// `+`), `cpu` on a host without GPU; `None` without hardware identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_count: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The cell's GPU request (`H100:8`), the key when no hardware was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<String>,
}

impl Testbed {
    /// The testbed of a cell of a run on `backend`.
    pub fn of(backend: &str, cell: &CellView) -> Testbed {
        match &cell.hardware {
            Some(hw) => {
                let models: BTreeSet<&str> = hw.gpus.iter().map(|g| g.name.as_str()).collect();
                let model = if models.is_empty() {
                    "cpu".to_string()
                } else {
                    models.into_iter().collect::<Vec<_>>().join("+")
                };
                Testbed {
                    backend: backend.to_string(),
                    gpu_model: Some(model),
                    gpu_count: Some(hw.gpus.len()),
                    driver: hw.driver_version.clone(),
                    requested: None,
                }
            }
            None => Testbed {
                backend: backend.to_string(),
                gpu_model: None,
                gpu_count: None,
                driver: None,
                requested: Some(cell.gpu.clone()),
            },
        }
    }

    /// `local · NVIDIA H100 80GB HBM3 x8 · driver 580.1`, `local · gpu H100:8`.
    pub fn label(&self) -> String {
        match &self.gpu_model {
            Some(model) => {
                let mut s = format!("{} · {} x{}", self.backend, model, self.gpu_count.unwrap_or(0));
                if let Some(d) = &self.driver {
                    s.push_str(&format!(" · driver {d}"));
                }
                s
            }
            None => format!(
                "{} · gpu {}",
                self.backend,
                self.requested.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// Why a point has no value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointFailure {
    /// `failed`, `oom`, `timeout`, `cancelled`.
    pub status: CellStatus,
    /// The diagnosis kind (`cuda_oom`, `nccl_timeout`), when one was named;
    /// else the failure's own kind (`exit_code`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<FailureKind>,
}

/// One run of a series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub run_id: String,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// The metric's value; `None` when the cell did not succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<PointFailure>,
}

/// One metric of one cell on one testbed, across runs (oldest first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    pub suite: String,
    pub benchmark: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metric: String,
    pub testbed: Testbed,
    pub points: Vec<Point>,
}

impl Series {
    /// The values of the succeeded points, in order, with their indices
    /// into [`Series::points`].
    pub fn values(&self) -> (Vec<f64>, Vec<usize>) {
        let mut v = Vec::new();
        let mut at = Vec::new();
        for (i, p) in self.points.iter().enumerate() {
            if let Some(x) = p.value {
                v.push(x);
                at.push(i);
            }
        }
        (v, at)
    }

    /// `x=1,tp=2` (params sorted by name), empty without params.
    pub fn params_label(&self) -> String {
        params_label(&self.params)
    }
}

pub(crate) fn params_label(params: &BTreeMap<String, serde_json::Value>) -> String {
    params
        .iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Which series to build.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub benchmark: Option<String>,
    pub metric: Option<String>,
    /// Only runs created at or after this time.
    pub since: Option<DateTime<Utc>>,
}

/// `30d`, `12h`, `90m`, `2w`, `45s` as a duration.
pub fn parse_since(text: &str) -> Result<Duration, HistoryError> {
    let bad = || HistoryError::BadSince {
        text: text.to_string(),
    };
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let n: i64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(secs)
        .and_then(Duration::try_seconds)
        .ok_or_else(bad)
}

/// The series key without the metric.
type CellKey = (String, String, Testbed);

/// Split `runs` (of one suite) into series: one per benchmark, params,
/// metric and testbed, points oldest first (by `created_at`, then run id).
/// Pending cells are left out. A cell that did not succeed is a failure
/// point in every series of its cell and testbed; one without hardware
/// identity goes to the series of its cell whose runs asked for the same
/// GPUs (`gpu` string), else to its own series keyed on the request.
/// Series come sorted by benchmark, params, metric and testbed.
pub fn build(runs: &[RunRecord], filter: &Filter) -> Vec<Series> {
    let mut order: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| filter.since.is_none_or(|s| r.created_at >= s))
        .collect();
    order.sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
    let wanted_cell = |c: &CellView| {
        c.status != CellStatus::Pending && filter.benchmark.as_ref().is_none_or(|b| *b == c.benchmark)
    };
    let wanted_metric = |m: &str| filter.metric.as_ref().is_none_or(|w| w == m);

    // Pass 1: the metrics of each cell and testbed, and the GPU requests
    // seen on each testbed.
    let mut metrics: BTreeMap<CellKey, BTreeSet<String>> = BTreeMap::new();
    let mut requests: BTreeMap<CellKey, BTreeSet<String>> = BTreeMap::new();
    let mut params_of: BTreeMap<(String, String), BTreeMap<String, serde_json::Value>> = BTreeMap::new();
    for run in &order {
        for c in run.cells.iter().filter(|c| wanted_cell(c)) {
            let pl = params_label(&c.params);
            params_of
                .entry((c.benchmark.clone(), pl.clone()))
                .or_insert_with(|| c.params.clone());
            let key = (c.benchmark.clone(), pl, Testbed::of(&run.backend, c));
            if c.status == CellStatus::Succeeded {
                let set = metrics.entry(key.clone()).or_default();
                set.extend(c.metrics.keys().filter(|m| wanted_metric(m)).cloned());
                requests.entry(key).or_default().insert(c.gpu.clone());
            }
        }
    }

    // Pass 2: the points.
    let mut out: BTreeMap<(CellKey, String), Vec<Point>> = BTreeMap::new();
    for run in &order {
        for c in run.cells.iter().filter(|c| wanted_cell(c)) {
            let pl = params_label(&c.params);
            let testbed = Testbed::of(&run.backend, c);
            let base = Point {
                run_id: run.id.clone(),
                created_at: run.created_at,
                commit: run.environment.git_commit.clone(),
                value: None,
                failure: None,
            };
            if c.status == CellStatus::Succeeded {
                let key = (c.benchmark.clone(), pl, testbed);
                for (m, v) in c
                    .metrics
                    .iter()
                    .filter(|(m, v)| wanted_metric(m) && v.is_finite())
                {
                    out.entry((key.clone(), m.clone())).or_default().push(Point {
                        value: Some(*v),
                        ..base.clone()
                    });
                }
                continue;
            }
            let failure = PointFailure {
                status: c.status,
                kind: c
                    .diagnosis
                    .as_ref()
                    .map(|d| d.kind.clone())
                    .or_else(|| c.failure.as_ref().map(|f| f.kind.clone())),
            };
            let point = Point {
                failure: Some(failure),
                ..base
            };
            // The testbeds this failure belongs to.
            let own = (c.benchmark.clone(), pl.clone(), testbed.clone());
            let keys: Vec<CellKey> = if metrics.contains_key(&own) || c.hardware.is_some() {
                vec![own]
            } else {
                let matching: Vec<CellKey> = requests
                    .iter()
                    .filter(|((b, p, t), reqs)| {
                        *b == c.benchmark && *p == pl && t.backend == run.backend && reqs.contains(&c.gpu)
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                if matching.is_empty() {
                    vec![own]
                } else {
                    matching
                }
            };
            for key in keys {
                let names: Vec<String> = match metrics.get(&key) {
                    Some(set) if !set.is_empty() => set.iter().cloned().collect(),
                    _ => vec![filter.metric.clone().unwrap_or_else(|| NO_METRIC.to_string())],
                };
                for m in names {
                    out.entry((key.clone(), m)).or_default().push(point.clone());
                }
            }
        }
    }

    let suite = order.first().map(|r| r.suite.clone()).unwrap_or_default();
    out.into_iter()
        .map(|(((benchmark, pl, testbed), metric), points)| Series {
            suite: suite.clone(),
            params: params_of
                .get(&(benchmark.clone(), pl))
                .cloned()
                .unwrap_or_default(),
            benchmark,
            metric,
            testbed,
            points,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use orch_protocol::{GpuInfo, Hardware};
    use orch_record::{Diagnosis, Environment, RunState};

    pub(crate) fn hw(model: &str, n: usize) -> Hardware {
        Hardware {
            gpus: (0..n)
                .map(|i| GpuInfo {
                    index: i as u32,
                    name: model.to_string(),
                    ..GpuInfo::default()
                })
                .collect(),
            driver_version: Some("580.1".into()),
            ..Hardware::default()
        }
    }

    pub(crate) fn cell(status: &str, value: Option<f64>, hardware: Option<Hardware>) -> CellView {
        CellView {
            id: "a-x1".into(),
            benchmark: "a".into(),
            status: status.parse().unwrap(),
            gpu: "H100:1".into(),
            params: [("x".to_string(), serde_json::json!(1))].into(),
            metrics: value
                .map(|v| [("output_throughput".to_string(), v)].into())
                .unwrap_or_default(),
            timings: BTreeMap::new(),
            failure: None,
            duration_s: Some(1.0),
            info: BTreeMap::new(),
            diagnosis: (status != "succeeded").then(|| Diagnosis {
                kind: FailureKind::CudaOom,
                evidence: vec![],
                hint: String::new(),
            }),
            hardware,
            flags: vec![],
            cost: None,
        }
    }

    pub(crate) fn run(i: i64, cells: Vec<CellView>) -> RunRecord {
        let t = DateTime::from_timestamp(1_700_000_000 + i * 3600, 0).unwrap();
        RunRecord {
            id: format!("run-{i:04}"),
            suite: "s".into(),
            state: RunState::Complete,
            created_at: t,
            updated_at: t,
            backend: "local".into(),
            environment: Environment {
                hostname: "h".into(),
                os: "linux".into(),
                arch: "x86_64".into(),
                cpus: 1,
                orch_version: "0".into(),
                git_commit: Some(format!("c{i:04}")),
                argv: vec![],
            },
            counts: BTreeMap::new(),
            cells,
            cost: None,
            budget: None,
        }
    }

    #[test]
    fn an_h100_and_an_h200_run_are_two_series() {
        let runs = vec![
            run(
                0,
                vec![cell(
                    "succeeded",
                    Some(100.0),
                    Some(hw("NVIDIA H100 80GB HBM3", 1)),
                )],
            ),
            run(
                1,
                vec![cell("succeeded", Some(150.0), Some(hw("NVIDIA H200", 1)))],
            ),
            run(
                2,
                vec![cell(
                    "succeeded",
                    Some(101.0),
                    Some(hw("NVIDIA H100 80GB HBM3", 1)),
                )],
            ),
        ];
        let s = build(&runs, &Filter::default());
        assert_eq!(s.len(), 2, "{s:#?}");
        let h100 = s
            .iter()
            .find(|s| s.testbed.gpu_model.as_deref() == Some("NVIDIA H100 80GB HBM3"))
            .unwrap();
        let ids: Vec<&str> = h100.points.iter().map(|p| p.run_id.as_str()).collect();
        assert_eq!(ids, ["run-0000", "run-0002"]);
        assert_eq!(h100.points[1].commit.as_deref(), Some("c0002"));
        let h200 = s.iter().find(|s| s.testbed != h100.testbed).unwrap();
        assert_eq!(h200.points.len(), 1);
        assert_eq!(h200.points[0].value, Some(150.0));
        // Count and driver are part of the key too.
        let mut other = hw("NVIDIA H100 80GB HBM3", 1);
        other.driver_version = Some("590.0".into());
        let runs = vec![
            run(
                0,
                vec![cell(
                    "succeeded",
                    Some(100.0),
                    Some(hw("NVIDIA H100 80GB HBM3", 1)),
                )],
            ),
            run(
                1,
                vec![cell(
                    "succeeded",
                    Some(100.0),
                    Some(hw("NVIDIA H100 80GB HBM3", 2)),
                )],
            ),
            run(2, vec![cell("succeeded", Some(100.0), Some(other))]),
            run(3, vec![cell("succeeded", Some(100.0), None)]),
        ];
        let s = build(&runs, &Filter::default());
        assert_eq!(s.len(), 4);
        assert!(s.iter().any(|s| s.testbed.requested.as_deref() == Some("H100:1")));
    }

    #[test]
    fn failures_join_the_series_of_their_cell() {
        let h = || Some(hw("NVIDIA H100 80GB HBM3", 1));
        let runs = vec![
            run(0, vec![cell("succeeded", Some(100.0), h())]),
            // Failed before the agent read the hardware: joins by request.
            run(1, vec![cell("oom", None, None)]),
            run(2, vec![cell("failed", None, h())]),
            run(3, vec![cell("pending", None, None)]),
        ];
        let s = build(&runs, &Filter::default());
        assert_eq!(s.len(), 1, "{s:#?}");
        let p = &s[0].points;
        assert_eq!(p.len(), 3);
        assert_eq!(p[1].failure.as_ref().unwrap().status, CellStatus::Oom);
        assert_eq!(p[1].failure.as_ref().unwrap().kind, Some(FailureKind::CudaOom));
        assert!(p[2].failure.is_some() && p[2].value.is_none());
    }

    #[test]
    fn filters_and_durations() {
        let runs: Vec<RunRecord> = (0..48)
            .map(|i| run(i, vec![cell("succeeded", Some(100.0), None)]))
            .collect();
        let last = runs.last().unwrap().created_at;
        let since = last - parse_since("12h").unwrap();
        let s = build(
            &runs,
            &Filter {
                since: Some(since),
                ..Filter::default()
            },
        );
        assert_eq!(s[0].points.len(), 13);
        let none = build(
            &runs,
            &Filter {
                metric: Some("ttft_ms".into()),
                ..Filter::default()
            },
        );
        assert!(none.is_empty());
        let none = build(
            &runs,
            &Filter {
                benchmark: Some("b".into()),
                ..Filter::default()
            },
        );
        assert!(none.is_empty());
        assert_eq!(parse_since("30d").unwrap(), Duration::days(30));
        assert_eq!(parse_since("2w").unwrap(), Duration::days(14));
        for bad in ["", "d", "30", "30y", "-3d", "1.5h"] {
            let e = parse_since(bad).unwrap_err().to_string();
            assert!(e.contains("hint:"), "{bad}: {e}");
        }
    }
}
