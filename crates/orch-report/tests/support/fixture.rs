//! A run record as the store would hand it over: a transformer sweep on
//! three GPUs, a vLLM-style serving cell, a 3-way comparison, an OOM cell
//! with its diagnosis, and an older cell without cost or hardware. The
//! H100, A100 and serving cells carry GPU telemetry; [`run_with_calibration`]
//! adds a `calibrate` cell with a figure below its threshold.
#![allow(dead_code)]

use chrono::{TimeZone, Utc};
use orch_protocol::{Failure, GpuInfo, Hardware};
use orch_record::{CellCost, CellView, Environment, FailureKind, RunRecord, RunState};
use serde_json::json;
use std::collections::BTreeMap;

pub fn metrics(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

pub fn cost(gpu_type: Option<&str>, gpus: u32, usd_per_s: f64, billed_s: f64, wasted: bool) -> CellCost {
    CellCost {
        usd: usd_per_s * billed_s,
        wasted,
        gpus,
        gpu_type: gpu_type.map(String::from),
        usd_per_gpu_s: if gpus > 0 { usd_per_s / gpus as f64 } else { 0.0 },
        usd_per_s,
        billed_s,
        by_phase: [
            ("start".to_string(), usd_per_s * billed_s * 0.25),
            ("measure".to_string(), usd_per_s * billed_s * 0.75),
        ]
        .into_iter()
        .collect(),
        price_source: "catalog: test, 2026-11-01".into(),
        priced: true,
        backend: "modal".into(),
    }
}

pub fn hardware(name: &str, n: u32, mem_gib: u64) -> Hardware {
    Hardware {
        gpus: (0..n)
            .map(|i| GpuInfo {
                index: i,
                name: name.into(),
                uuid: format!("GPU-{i}"),
                memory_bytes: mem_gib << 30,
                pci_bus_id: None,
                compute_capability: Some("9.0".into()),
                power_limit_w: Some(700.0),
            })
            .collect(),
        driver_version: Some("580.159.04".into()),
        cuda_version: Some("13.0".into()),
        gpu_note: None,
        cpu_model: Some("AMD EPYC 9654".into()),
        cpus: 32,
        memory_bytes: 256 << 30,
        mismatch: None,
    }
}

pub fn cell(id: &str, benchmark: &str, gpu: &str, status: &str) -> CellView {
    CellView {
        id: id.into(),
        benchmark: benchmark.into(),
        status: status.parse().unwrap(),
        gpu: gpu.into(),
        params: BTreeMap::new(),
        metrics: BTreeMap::new(),
        timings: BTreeMap::new(),
        failure: None,
        duration_s: Some(60.0),
        info: BTreeMap::new(),
        diagnosis: None,
        hardware: None,
        flags: vec![],
        cost: None,
    }
}

fn transformer(gpu: &str, slug: &str, tokens_per_s: f64, step_ms: f64, usd_per_s: f64, hw: &str) -> CellView {
    let mut c = cell(
        &format!("transformer.{slug}.preset-small"),
        "transformer",
        gpu,
        "succeeded",
    );
    c.params.insert("preset".into(), json!("small"));
    c.metrics = metrics(&[
        ("tokens_per_s", tokens_per_s),
        ("step_time_mean_ms", step_ms),
        ("step_time_median_ms", step_ms * 0.98),
        ("step_time_p95_ms", step_ms * 1.10),
        ("step_time_p99_ms", step_ms * 1.20),
        ("step_time_std_ms", step_ms * 0.05),
        ("step_time_min_ms", step_ms * 0.90),
        ("step_time_max_ms", step_ms * 1.25),
        ("step_time_cv_pct", 5.0),
        ("params", 128.6e6),
    ]);
    let gpu_type = gpu.split(':').next().unwrap_or(gpu);
    c.cost = Some(cost(Some(gpu_type), 1, usd_per_s, 100.0, false));
    c.hardware = Some(hardware(hw, 1, 80));
    c
}

#[allow(clippy::too_many_arguments)]
pub fn telemetry(
    util: f64,
    power: f64,
    energy: f64,
    per_step: Option<f64>,
    per_token: Option<f64>,
    peak_gib: u64,
    clock: f64,
    temp: f64,
) -> BTreeMap<String, f64> {
    let mut m = metrics(&[
        ("gpu_util_mean_pct", util),
        ("gpu_power_mean_w", power),
        ("gpu_energy_j", energy),
        ("gpu_peak_memory_bytes", (peak_gib << 30) as f64),
        ("gpu_sm_clock_mean_mhz", clock),
        ("gpu_temp_max_c", temp),
        ("telemetry_cpu_pct", 3.0),
    ]);
    if let Some(v) = per_step {
        m.insert("gpu_energy_per_step_j".into(), v);
    }
    if let Some(v) = per_token {
        m.insert("gpu_energy_per_token_j".into(), v);
    }
    m
}

/// A `calibrate` cell on an H100 whose f16 matmul is at 0.75 of the
/// expected 760 TFLOP/s (threshold 0.8): flagged `degraded_gpu`.
/// bf16 700/760 = 0.921053, f32 50/50 = 1, bandwidth 3000/3000 = 1.
pub fn calibrate() -> CellView {
    let mut c = cell("calibrate.h100", "calibrate", "H100", "succeeded");
    c.metrics = metrics(&[
        ("matmul_bf16_tflops", 700.0),
        ("matmul_f16_tflops", 570.0),
        ("matmul_f32_tflops", 50.0),
        ("bandwidth_gbs", 3000.0),
    ]);
    c.metrics
        .extend(telemetry(98.0, 625.0, 5600.0, None, None, 10, 1630.0, 73.0));
    c.flags = vec!["degraded_gpu".into()];
    c.hardware = Some(hardware("NVIDIA H100 80GB HBM3", 1, 80));
    c.info.insert(
        "calibration_check".into(),
        json!({
            "gpu": "NVIDIA H100 80GB HBM3", "model": "H100", "threshold": 0.8,
            "checks": {
                "matmul_bf16_tflops": {"measured": 700.0, "expected": 760.0, "ratio": 700.0 / 760.0},
                "matmul_f16_tflops": {"measured": 570.0, "expected": 760.0, "ratio": 0.75},
                "matmul_f32_tflops": {"measured": 50.0, "expected": 50.0, "ratio": 1.0},
                "bandwidth_gbs": {"measured": 3000.0, "expected": 3000.0, "ratio": 1.0}
            },
            "below": ["matmul_f16_tflops"]
        }),
    );
    c
}

/// The fixture run plus [`calibrate`] as its last cell.
pub fn run_with_calibration() -> RunRecord {
    let mut run = run();
    run.cells.push(calibrate());
    *run.counts.entry("succeeded".into()).or_insert(0) += 1;
    run
}

/// The run with every `gpu_*` metric removed (as a CPU run records it).
pub fn without_telemetry(mut run: RunRecord) -> RunRecord {
    for c in &mut run.cells {
        c.metrics.retain(|k, _| !k.starts_with("gpu_"));
    }
    run
}

/// The fixture run. Hand-computed expectations (see tests/report.rs):
/// - tokens/s: H100 1000, A100 400, L4 200 (+ serve 500 output tok/s on H100:2)
/// - $/s: H100 0.002, A100 0.001, L4 0.0003, serve 0.004
/// - $/1k tokens: H100 0.002, A100 0.0025, L4 0.0015, serve 0.008
pub fn run() -> RunRecord {
    let mut cells = vec![
        transformer("H100", "h100", 1000.0, 8.0, 0.002, "NVIDIA H100 80GB HBM3"),
        transformer(
            "A100-80GB",
            "a100-80gb",
            400.0,
            20.0,
            0.001,
            "NVIDIA A100-SXM4-80GB",
        ),
        transformer("L4", "l4", 200.0, 40.0, 0.0003, "NVIDIA L4"),
    ];
    // The L4 cell got another GPU than it asked for.
    cells[2].flags = vec!["hardware_mismatch".into()];
    if let Some(h) = cells[2].hardware.as_mut() {
        h.mismatch = Some("asked L4, found 1× NVIDIA T4".into());
    }

    let mut serve = cell("serve.h100x2.rate-4", "serve", "H100:2", "succeeded");
    serve.params.insert("rate".into(), json!(4));
    serve.metrics = metrics(&[
        ("output_throughput", 500.0),
        ("total_token_throughput", 1500.0),
        ("request_throughput", 2.0),
        ("mean_ttft_ms", 120.0),
        ("median_ttft_ms", 100.0),
        ("p90_ttft_ms", 180.0),
        ("p99_ttft_ms", 260.0),
        ("std_ttft_ms", 40.0),
        ("mean_tpot_ms", 12.0),
        ("median_tpot_ms", 11.0),
        ("mean_e2el_ms", 2400.0),
        ("median_e2el_ms", 2300.0),
    ]);
    serve.cost = Some(cost(Some("H100"), 2, 0.004, 300.0, false));
    serve.hardware = Some(hardware("NVIDIA H100 80GB HBM3", 2, 80));

    let mut oom = cell("transformer.l4.preset-2.7b", "transformer", "L4", "oom");
    oom.params.insert("preset".into(), json!("2.7B"));
    oom.failure = Some(Failure {
        kind: FailureKind::Oom,
        message: "transformer build failed: CUDA out of memory".into(),
        exit_code: None,
        signal: None,
    });
    oom.diagnosis = Some(orch_record::Diagnosis {
        kind: FailureKind::CudaOom,
        evidence: vec![
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB <GPU 0>".into(),
        ],
        hint: "use a GPU with more memory, or a smaller batch | context".into(),
    });
    oom.cost = Some(cost(Some("L4"), 1, 0.0003, 40.0, true));

    let mut cmp = cell("vllm-3way.h100x2", "vllm-3way", "H100:2", "failed");
    cmp.metrics = metrics(&[
        ("baseline.output_throughput", 500.0),
        ("human.output_throughput", 560.0),
    ]);
    cmp.failure = Some(Failure {
        kind: FailureKind::VariantFailed,
        message: "`agent`: round 1: server exited".into(),
        exit_code: None,
        signal: None,
    });
    cmp.info.insert(
        "variants".into(),
        json!({
            "baseline": {"status": "succeeded", "failure": null, "rounds": 5},
            "human": {"status": "succeeded", "failure": null, "rounds": 5},
            "agent": {"status": "failed", "failure": "round 1: server exited", "rounds": 0,
                      "diagnosis": {"kind": "gated_repo", "evidence": ["401 Client Error"], "hint": "accept the licence"}}
        }),
    );
    cmp.info.insert(
        "comparison".into(),
        json!([
            {"metric": "output_throughput", "better": "higher", "ratio": 1.12, "ci_low": 1.08, "ci_high": 1.16,
             "speedup": 1.12, "verdict": "faster", "n_base": 5, "n_other": 5, "base": "baseline", "other": "human"},
            {"metric": "mean_ttft_ms", "better": "lower", "ratio": 1.01, "ci_low": 0.97, "ci_high": 1.05,
             "speedup": 0.990099, "verdict": "same", "n_base": 5, "n_other": 5, "base": "baseline", "other": "human"},
            {"metric": "completed", "better": "higher", "ratio": 1.0, "ci_low": 1.0, "ci_high": 1.0,
             "speedup": 1.0, "verdict": "same", "n_base": 5, "n_other": 5, "base": "baseline", "other": "human"}
        ]),
    );
    cmp.info.insert("rounds".into(), json!(5));
    cmp.info.insert("noise".into(), json!(0.02));
    cmp.cost = Some(cost(Some("H100"), 2, 0.004, 1000.0, true));

    // An older record: no cost, no hardware.
    let mut old = cell("command.cpu", "command", "none", "succeeded");
    old.metrics = metrics(&[("md5_mib_per_s", 400.0), ("md5_ms", 640.0)]);

    // GPU telemetry (hand-written; energy per step = energy / steps, per
    // token = energy / tokens):
    // H100 620 W × 8 s = 4960 J over 1000 steps of 400 tokens: 4.96 J/step, 12.4 mJ/token.
    // A100 350 W × 20 s = 7000 J over 500 steps: 14 J/step, 35 mJ/token.
    // serve H100:2 900 W × 60 s = 54000 J over 150000 tokens: 360 mJ/token, no steps.
    cells[0].metrics.extend(telemetry(
        97.5,
        620.0,
        4960.0,
        Some(4.96),
        Some(0.0124),
        36,
        1980.0,
        71.0,
    ));
    cells[1].metrics.extend(telemetry(
        95.0,
        350.0,
        7000.0,
        Some(14.0),
        Some(0.035),
        32,
        1410.0,
        64.0,
    ));
    serve.metrics.extend(telemetry(
        60.0,
        900.0,
        54000.0,
        None,
        Some(0.36),
        70,
        1755.0,
        68.0,
    ));

    cells.extend([serve, oom, cmp, old]);
    let mut counts = BTreeMap::new();
    for c in &cells {
        *counts.entry(c.status.to_string()).or_insert(0) += 1;
    }
    RunRecord {
        id: "20261122-061502-lm-sweep-3fa2".into(),
        suite: "lm-sweep".into(),
        state: RunState::Complete,
        created_at: Utc.with_ymd_and_hms(2026, 11, 22, 6, 15, 2).unwrap(),
        updated_at: Utc.with_ymd_and_hms(2026, 11, 22, 7, 0, 0).unwrap(),
        backend: "modal".into(),
        environment: Environment {
            hostname: "bench-host".into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            cpus: 32,
            orch_version: "0.1.0".into(),
            git_commit: Some("0123456789abcdef0123".into()),
            argv: vec!["orch".into(), "run".into()],
        },
        counts,
        cells,
        cost: None,
        budget: None,
    }
}
