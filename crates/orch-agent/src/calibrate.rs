//! Builtin workload `calibrate`: what this GPU (or CPU) actually delivers.
//!
//! - matmul: `n x n` by `n x n` products per dtype (bf16, f16, f32 on CUDA;
//!   f32 on the CPU), TFLOP/s = 2n^3 / time;
//! - bandwidth: a device-to-device copy of `copy_bytes`, GB/s counting the
//!   bytes read and the bytes written (as `torch.clone` benchmarks do).
//!
//! Each repetition is timed between device synchronisations and holds enough
//! products (or copies) to last at least 20 ms (and together
//! `seconds_per_metric`), so launch and sync overheads are noise and the
//! GPU's utilisation and power readings settle. The figure of a metric is the
//! median over repetitions.
//!
//! A GPU model with an expected figure (see [`EXPECTED`]) is judged: a figure
//! under `threshold` (0.8 by default) of the expected one flags the cell
//! `degraded_gpu`.

use crate::ctx::Ctx;
use crate::device::{default_device, dtype_name, open_device, parse_device, parse_dtype, DeviceKind};
use crate::stats;
use candle_core::{DType, Device, Tensor};
use orch_protocol::{CalibrateConfig, CellResult, Hardware, Phase, Status, TaskSpec, FLAG_DEGRADED_GPU};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

const DEFAULT_THRESHOLD: f64 = 0.8;
/// Minimum wall time of one timed repetition.
const REP_SECONDS: f64 = 0.02;

/// Healthy figures per GPU model, as this workload measures them: matmul
/// TFLOP/s for bf16 / f16 / f32 (no TF32) and copy bandwidth in GB/s (read +
/// written). H100 SXM and H200: measured here with PyTorch on healthy GPUs
/// (KINDS.md of the device tool; scripts/bench-gpu.sh). The others: about 80%
/// of the datasheet's dense peak, where well-tuned GEMMs land; treat them as
/// approximate. Matched by whole words of the NVML name, first match wins.
pub const EXPECTED: &[(&str, Expected)] = &[
    (
        "H200",
        Expected {
            bf16: 780.0,
            f16: 780.0,
            f32: 50.0,
            bandwidth_gbs: 4300.0,
        },
    ),
    (
        "H100 PCIe",
        Expected {
            bf16: 600.0,
            f16: 600.0,
            f32: 40.0,
            bandwidth_gbs: 1800.0,
        },
    ),
    (
        "H100",
        Expected {
            bf16: 760.0,
            f16: 760.0,
            f32: 50.0,
            bandwidth_gbs: 3000.0,
        },
    ),
    (
        "A100 80GB",
        Expected {
            bf16: 260.0,
            f16: 260.0,
            f32: 18.0,
            bandwidth_gbs: 1700.0,
        },
    ),
    (
        "A100",
        Expected {
            bf16: 260.0,
            f16: 260.0,
            f32: 18.0,
            bandwidth_gbs: 1350.0,
        },
    ),
    (
        "L40S",
        Expected {
            bf16: 290.0,
            f16: 290.0,
            f32: 70.0,
            bandwidth_gbs: 750.0,
        },
    ),
    (
        "L4",
        Expected {
            bf16: 95.0,
            f16: 95.0,
            f32: 24.0,
            bandwidth_gbs: 240.0,
        },
    ),
    (
        "A10G",
        Expected {
            bf16: 55.0,
            f16: 55.0,
            f32: 25.0,
            bandwidth_gbs: 480.0,
        },
    ),
    (
        "T4",
        Expected {
            bf16: 0.0,
            f16: 50.0,
            f32: 7.0,
            bandwidth_gbs: 250.0,
        },
    ),
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Expected {
    pub bf16: f64,
    pub f16: f64,
    pub f32: f64,
    pub bandwidth_gbs: f64,
}

/// The expected figures of a GPU by its NVML name, if known.
pub fn expected_for(name: &str) -> Option<(&'static str, Expected)> {
    let words = crate::gpu::name_words(name);
    EXPECTED
        .iter()
        .find(|(key, _)| {
            key.split(' ')
                .all(|k| words.iter().any(|w| w.eq_ignore_ascii_case(k)))
        })
        .map(|(k, e)| (*k, *e))
}

#[derive(Debug)]
struct Plan {
    device: DeviceKind,
    n: usize,
    dtypes: Vec<DType>,
    copy_bytes: u64,
    seconds_per_metric: f64,
}

fn resolve(cfg: &CalibrateConfig, task: &TaskSpec) -> Result<Plan, String> {
    let device = match cfg.device.as_deref() {
        Some(s) => parse_device(s, "calibrate")?,
        None => default_device(task),
    };
    let gpu = device != DeviceKind::Cpu;
    let dtypes = match &cfg.dtypes {
        Some(list) if list.is_empty() => return Err("calibrate `dtypes` is empty".into()),
        Some(list) => list
            .iter()
            .map(|s| parse_dtype(s, "calibrate"))
            .collect::<Result<Vec<_>, _>>()?,
        None if gpu => vec![DType::BF16, DType::F16, DType::F32],
        None => vec![DType::F32],
    };
    let n = cfg.matmul_size.unwrap_or(if gpu { 8192 } else { 1024 });
    if n == 0 {
        return Err("calibrate `matmul_size` must be at least 1".into());
    }
    let copy_bytes = cfg.copy_bytes.unwrap_or(if gpu { 4 << 30 } else { 256 << 20 });
    if copy_bytes < 4 {
        return Err("calibrate `copy_bytes` must be at least 4".into());
    }
    let seconds_per_metric = cfg.seconds_per_metric.unwrap_or(if gpu { 2.0 } else { 0.1 });
    if !(seconds_per_metric.is_finite() && seconds_per_metric >= 0.0) {
        return Err("calibrate `seconds_per_metric` must be a number of seconds, 0 or more".into());
    }
    Ok(Plan {
        device,
        n,
        dtypes,
        copy_bytes,
        seconds_per_metric,
    })
}

pub fn run(cfg: &CalibrateConfig, task: &TaskSpec, ctx: &mut Ctx) -> CellResult {
    let cell = &task.cell_id;
    let plan = match resolve(cfg, task) {
        Ok(p) => p,
        Err(msg) => return CellResult::failed(cell, Status::Failed, "workload_error", msg),
    };
    let mut result = match measure(&plan, task, ctx) {
        Ok(Some(r)) => r,
        Ok(None) => {
            ctx.enter(Phase::Teardown);
            CellResult::failed(
                cell,
                Status::Cancelled,
                "cancelled",
                "stopped before the calibration finished",
            )
        }
        Err(e) => {
            ctx.enter(Phase::Teardown);
            let text = e.to_string();
            let status = if crate::transformer::is_oom(&text) {
                Status::Oom
            } else {
                Status::Failed
            };
            CellResult::failed(
                cell,
                status,
                if status == Status::Oom {
                    "oom"
                } else {
                    "workload_error"
                },
                format!("calibration failed: {text}"),
            )
        }
    };
    result.info.insert("device".into(), json!(plan.device.name()));
    result.info.insert("matmul_size".into(), json!(plan.n));
    result.info.insert("copy_bytes".into(), json!(plan.copy_bytes));
    result
        .info
        .insert("seconds_per_metric".into(), json!(plan.seconds_per_metric));
    result
}

/// Time `reps` repetitions of `op`, each repeating it `inner` times between
/// synchronisations. Returns seconds per single `op`.
fn timed<F: FnMut() -> candle_core::Result<()>>(
    device: &Device,
    reps: u32,
    inner: usize,
    mut op: F,
) -> candle_core::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        device.synchronize()?;
        let t = Instant::now();
        for _ in 0..inner {
            op()?;
        }
        device.synchronize()?;
        out.push(t.elapsed().as_secs_f64() / inner as f64);
    }
    Ok(out)
}

/// How many ops make one repetition last `rep_s` (at least [`REP_SECONDS`]),
/// from the time of a single op.
fn inner_count(single_s: f64, rep_s: f64) -> usize {
    ((rep_s.max(REP_SECONDS) / single_s.max(1e-7)).ceil() as usize).clamp(1, 100_000)
}

fn measure(plan: &Plan, task: &TaskSpec, ctx: &mut Ctx) -> candle_core::Result<Option<CellResult>> {
    let device = open_device(plan.device)?;
    let warmup = task.measure.warmup.max(1);
    let reps = task.measure.repetitions.max(1);
    let rep_s = plan.seconds_per_metric / f64::from(reps);
    let n = plan.n;

    // Operands for every dtype, and the copy source, made before warm-up.
    let mut operands = Vec::new();
    for &dt in &plan.dtypes {
        let a = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(dt)?;
        let b = Tensor::randn(0f32, 1.0, (n, n), &device)?.to_dtype(dt)?;
        operands.push((dt, a, b));
    }
    let elems = (plan.copy_bytes / 4) as usize;
    let src = Tensor::ones(elems, DType::F32, &device)?;
    device.synchronize()?;

    ctx.enter(Phase::Warmup);
    let mut inner = BTreeMap::new();
    for (i, (dt, a, b)) in operands.iter().enumerate() {
        if ctx.stop_requested() {
            return Ok(None);
        }
        let single = timed(&device, warmup, 1, || a.matmul(b).map(drop))?;
        inner.insert(dtype_name(*dt), inner_count(stats::median(&single), rep_s));
        ctx.progress(Phase::Warmup, i as u64 + 1, operands.len() as u64 + 1);
    }
    let single = timed(&device, warmup, 1, || src.copy().map(drop))?;
    let copy_inner = inner_count(stats::median(&single), rep_s);

    ctx.enter(Phase::Measure);
    let mut metrics = BTreeMap::new();
    let mut detail = serde_json::Map::new();
    let flops = 2.0 * (n as f64).powi(3);
    let total = operands.len() as u64 + 1;
    for (i, (dt, a, b)) in operands.iter().enumerate() {
        if ctx.stop_requested() {
            return Ok(None);
        }
        let name = dtype_name(*dt);
        let k = inner.get(name).copied().unwrap_or(1);
        let secs = timed(&device, reps, k, || a.matmul(b).map(drop))?;
        let tflops: Vec<f64> = secs.iter().map(|s| flops / s / 1e12).collect();
        metrics.insert(format!("matmul_{name}_tflops"), stats::median(&tflops));
        detail.insert(format!("matmul_{name}"), json!({"tflops": tflops, "per_rep": k}));
        ctx.progress(Phase::Measure, i as u64 + 1, total);
    }
    if ctx.stop_requested() {
        return Ok(None);
    }
    let secs = timed(&device, reps, copy_inner, || src.copy().map(drop))?;
    let moved = 2.0 * (elems * 4) as f64;
    let gbs: Vec<f64> = secs.iter().map(|s| moved / s / 1e9).collect();
    metrics.insert("bandwidth_gbs".into(), stats::median(&gbs));
    detail.insert("bandwidth".into(), json!({"gbs": gbs, "per_rep": copy_inner}));
    ctx.progress(Phase::Measure, total, total);
    ctx.enter(Phase::Teardown);
    drop(operands);
    drop(src);

    let mut r = CellResult::new(&task.cell_id, Status::Succeeded);
    r.metrics = metrics;
    r.info.insert("calibration".into(), Value::Object(detail));
    Ok(Some(r))
}

/// Compare a calibration with the GPU model's expected figures; a figure
/// under `threshold` of its expectation flags the cell `degraded_gpu`.
/// Records the judgement in `info.calibration_check`.
pub fn judge(result: &mut CellResult, hardware: &Hardware, cfg: &CalibrateConfig) {
    if result.status != Status::Succeeded || result.info.get("device").and_then(Value::as_str) == Some("cpu")
    {
        return;
    }
    let Some(gpu) = hardware.gpus.first() else {
        return;
    };
    let threshold = cfg.threshold.unwrap_or(DEFAULT_THRESHOLD);
    let Some((model, exp)) = expected_for(&gpu.name) else {
        result.info.insert(
            "calibration_check".into(),
            json!({"gpu": gpu.name, "note": "no expected figures for this GPU model"}),
        );
        return;
    };
    let pairs = [
        ("matmul_bf16_tflops", exp.bf16),
        ("matmul_f16_tflops", exp.f16),
        ("matmul_f32_tflops", exp.f32),
        ("bandwidth_gbs", exp.bandwidth_gbs),
    ];
    let mut checks = serde_json::Map::new();
    let mut low = Vec::new();
    for (metric, expected) in pairs {
        let Some(&got) = result.metrics.get(metric) else {
            continue;
        };
        if expected <= 0.0 {
            continue;
        }
        let ratio = got / expected;
        checks.insert(
            metric.into(),
            json!({"measured": got, "expected": expected, "ratio": ratio}),
        );
        if ratio < threshold {
            low.push(format!(
                "`{metric}` {got:.1} is {:.0}% of {expected:.0}",
                ratio * 100.0
            ));
        }
    }
    result.info.insert(
        "calibration_check".into(),
        json!({"gpu": gpu.name, "model": model, "threshold": threshold, "checks": checks, "below": low}),
    );
    if !low.is_empty() && !result.flags.iter().any(|f| f == FLAG_DEGRADED_GPU) {
        result.flags.push(FLAG_DEGRADED_GPU.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::GpuInfo;

    #[test]
    fn expected_figures_by_name() {
        assert_eq!(expected_for("NVIDIA H100 80GB HBM3").unwrap().0, "H100");
        assert_eq!(expected_for("NVIDIA H100 PCIe").unwrap().0, "H100 PCIe");
        assert_eq!(expected_for("NVIDIA H200").unwrap().0, "H200");
        assert_eq!(expected_for("NVIDIA A100-SXM4-80GB").unwrap().0, "A100 80GB");
        assert_eq!(expected_for("NVIDIA A100-SXM4-40GB").unwrap().0, "A100");
        assert_eq!(expected_for("NVIDIA L4").unwrap().0, "L4");
        assert_eq!(expected_for("NVIDIA L40S").unwrap().0, "L40S");
        assert!(expected_for("NVIDIA GeForce RTX 4090").is_none());
    }

    fn calibrated(bf16: f64, bw: f64) -> CellResult {
        let mut r = CellResult::new("c", Status::Succeeded);
        r.metrics.insert("matmul_bf16_tflops".into(), bf16);
        r.metrics.insert("bandwidth_gbs".into(), bw);
        r.info.insert("device".into(), json!("cuda"));
        r
    }

    fn h100() -> Hardware {
        Hardware {
            gpus: vec![GpuInfo {
                name: "NVIDIA H100 80GB HBM3".into(),
                ..GpuInfo::default()
            }],
            ..Hardware::default()
        }
    }

    #[test]
    fn a_slow_gpu_is_flagged_degraded() {
        let cfg = CalibrateConfig::default();
        let mut ok = calibrated(780.0, 3000.0);
        judge(&mut ok, &h100(), &cfg);
        assert!(ok.flags.is_empty(), "{:?}", ok.info);
        let mut slow = calibrated(400.0, 3000.0);
        judge(&mut slow, &h100(), &cfg);
        assert_eq!(slow.flags, vec![FLAG_DEGRADED_GPU.to_string()]);
        let below = &slow.info["calibration_check"]["below"];
        assert!(
            below[0].as_str().unwrap().contains("matmul_bf16_tflops"),
            "{below}"
        );
        // A stricter threshold flags what the default let pass.
        let mut strict = calibrated(700.0, 3000.0);
        judge(
            &mut strict,
            &h100(),
            &CalibrateConfig {
                threshold: Some(0.95),
                ..Default::default()
            },
        );
        assert_eq!(strict.flags.len(), 1);
    }

    #[test]
    fn cpu_calibration_runs_and_is_not_judged() {
        let task = orch_protocol::TaskSpec {
            version: orch_protocol::PROTOCOL_VERSION,
            run_id: "r".into(),
            cell_id: "c".into(),
            gpu: "none".into(),
            params: Default::default(),
            env: Default::default(),
            secret_env: vec![],
            workload: orch_protocol::Workload::Builtin(orch_protocol::BuiltinWorkload::Noop),
            measure: orch_protocol::Measure {
                warmup: 1,
                repetitions: 3,
                ..Default::default()
            },
            logs: Default::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
            files: None,
        };
        let cfg = CalibrateConfig {
            matmul_size: Some(128),
            copy_bytes: Some(1 << 20),
            ..Default::default()
        };
        let mut ctx = Ctx::new(Box::new(|_| {}), Default::default());
        ctx.enter(Phase::Start);
        let mut r = run(&cfg, &task, &mut ctx);
        assert_eq!(r.status, Status::Succeeded, "{:?}", r.failure);
        assert!(r.metrics["matmul_f32_tflops"] > 0.0);
        assert!(r.metrics["bandwidth_gbs"] > 0.0);
        judge(&mut r, &h100(), &cfg);
        assert!(r.flags.is_empty());
        let bad = resolve(
            &CalibrateConfig {
                dtypes: Some(vec!["f8".into()]),
                ..Default::default()
            },
            &task,
        );
        assert!(bad.unwrap_err().contains("dtype `f8`"));
    }
}
