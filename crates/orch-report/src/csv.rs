//! CSV: one row per cell, for spreadsheets and pandas. Fixed columns first,
//! then `param.<name>` for every parameter and `metric.<name>` for every
//! metric any cell reported (GPU telemetry and calibration figures
//! included: `metric.gpu_energy_j`, `metric.matmul_bf16_tflops`, ...). A
//! run with calibration figures also gets `calibration_threshold`,
//! `calibration_below` and `calibration.<figure>.{expected,ratio}` after the
//! fixed columns.

use crate::model::Report;
use orch_record::CellStatus;
use std::collections::BTreeSet;

/// RFC 4180: quoted when it holds a comma, a quote or a line break.
fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn f(v: Option<f64>) -> String {
    // Read by programs: 12 significant digits (no `0.0014999999999999998`
    // from arithmetic noise), shortest form.
    v.filter(|x| x.is_finite())
        .map(|x| format!("{x:.11e}").parse::<f64>().unwrap_or(x).to_string())
        .unwrap_or_default()
}

pub const FIXED_COLUMNS: &[&str] = &[
    "run",
    "cell",
    "benchmark",
    "status",
    "gpu",
    "duration_s",
    "throughput_metric",
    "throughput",
    "throughput_rank",
    "token_rate_metric",
    "token_rate",
    "usd_per_1k_tokens",
    "cost_rank",
    "latency",
    "latency_unit",
    "latency_mean",
    "latency_median",
    "latency_p95",
    "latency_p99",
    "latency_std",
    "cost_usd",
    "cost_wasted",
    "cost_usd_per_s",
    "usd_per_gpu_hour",
    "billed_s",
    "billed_gpus",
    "gpu_type",
    "price_source",
    "hardware_gpus",
    "driver",
    "cuda",
    "flags",
    "failure_kind",
    "failure_message",
    "diagnosis",
    "hint",
];

pub fn render(r: &Report) -> String {
    let params: BTreeSet<&String> = r.cells.iter().flat_map(|c| c.params.keys()).collect();
    let metrics: BTreeSet<&String> = r.cells.iter().flat_map(|c| c.metrics.keys()).collect();
    let mut figures: Vec<&str> = Vec::new();
    for f in r.calibration.iter().flat_map(|c| &c.figures) {
        if f.expected.is_some() && !figures.contains(&f.metric.as_str()) {
            figures.push(&f.metric);
        }
    }
    let calibrated = !r.calibration.is_empty();
    let mut header: Vec<String> = FIXED_COLUMNS.iter().map(|s| s.to_string()).collect();
    if calibrated {
        header.push("calibration_threshold".into());
        header.push("calibration_below".into());
        for f in &figures {
            header.push(format!("calibration.{f}.expected"));
            header.push(format!("calibration.{f}.ratio"));
        }
    }
    header.extend(params.iter().map(|p| format!("param.{p}")));
    header.extend(metrics.iter().map(|m| format!("metric.{m}")));
    let mut out = String::new();
    out.push_str(&header.iter().map(|h| field(h)).collect::<Vec<_>>().join(","));
    out.push('\n');
    for c in &r.cells {
        let l = c.latency.as_ref();
        let k = c.cost.as_ref();
        let h = c.hardware.as_ref();
        let mut row: Vec<String> = vec![
            r.run.id.clone(),
            c.id.clone(),
            c.benchmark.clone(),
            c.status.to_string(),
            c.gpu.clone(),
            f(c.duration_s),
            c.throughput.as_ref().map(|t| t.name.clone()).unwrap_or_default(),
            f(c.throughput.as_ref().map(|t| t.value)),
            c.throughput_rank.map(|x| x.to_string()).unwrap_or_default(),
            c.token_rate.as_ref().map(|t| t.name.clone()).unwrap_or_default(),
            f(c.token_rate.as_ref().map(|t| t.value)),
            f(c.usd_per_1k_tokens),
            c.cost_rank.map(|x| x.to_string()).unwrap_or_default(),
            l.map(|l| l.family.clone()).unwrap_or_default(),
            l.map(|l| l.unit.clone()).unwrap_or_default(),
            f(l.and_then(|l| l.mean)),
            f(l.and_then(|l| l.median)),
            f(l.and_then(|l| l.p95)),
            f(l.and_then(|l| l.p99)),
            f(l.and_then(|l| l.std)),
            f(k.map(|k| k.usd)),
            k.map(|k| (k.wasted || c.status != CellStatus::Succeeded).to_string())
                .unwrap_or_default(),
            f(k.map(|k| k.usd_per_s)),
            f(c.usd_per_gpu_hour),
            f(k.map(|k| k.billed_s)),
            k.map(|k| k.gpus.to_string()).unwrap_or_default(),
            k.and_then(|k| k.gpu_type.clone()).unwrap_or_default(),
            k.map(|k| k.price_source.clone()).unwrap_or_default(),
            h.map(crate::text::hardware_text).unwrap_or_default(),
            h.and_then(|h| h.driver_version.clone()).unwrap_or_default(),
            h.and_then(|h| h.cuda_version.clone()).unwrap_or_default(),
            c.flags.join(";"),
            c.failure.as_ref().map(|x| x.kind.to_string()).unwrap_or_default(),
            c.failure.as_ref().map(|x| x.message.clone()).unwrap_or_default(),
            c.diagnosis
                .as_ref()
                .map(|d| d.kind.to_string())
                .unwrap_or_default(),
            c.diagnosis.as_ref().map(|d| d.hint.clone()).unwrap_or_default(),
        ];
        if calibrated {
            let cal = r.calibration.iter().find(|x| x.cell == c.id);
            row.push(f(cal.and_then(|x| x.threshold)));
            row.push(
                cal.map(|x| {
                    x.figures
                        .iter()
                        .filter(|g| g.below == Some(true))
                        .map(|g| g.metric.as_str())
                        .collect::<Vec<_>>()
                        .join(";")
                })
                .unwrap_or_default(),
            );
            for name in &figures {
                let g = cal.and_then(|x| x.figures.iter().find(|g| g.metric == *name));
                row.push(f(g.and_then(|g| g.expected)));
                row.push(f(g.and_then(|g| g.ratio)));
            }
        }
        for p in &params {
            row.push(match c.params.get(*p) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => String::new(),
            });
        }
        for m in &metrics {
            row.push(f(c.metrics.get(*m).copied()));
        }
        out.push_str(&row.iter().map(|x| field(x)).collect::<Vec<_>>().join(","));
        out.push('\n');
    }
    out
}
