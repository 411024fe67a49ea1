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
//! The figures are judged against the GPU model's expected ones by the agent
//! (`orch-agent`'s `calibrate.rs`, which knows the GPU's identity).

use crate::device::{default_device, dtype_name, open_device, parse_device, parse_dtype, DeviceKind};
use candle_core::{DType, Device, Tensor};
use orch_protocol::{CalibrateConfig, CellResult, FailureKind, Phase, Status, TaskSpec};
use orch_workload::ctx::Ctx;
use orch_workload::stats;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Instant;

/// Minimum wall time of one timed repetition.
const REP_SECONDS: f64 = 0.02;

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
        Err(msg) => return CellResult::failed(cell, Status::Failed, FailureKind::WorkloadError, msg),
    };
    let mut result = match measure(&plan, task, ctx) {
        Ok(Some(r)) => r,
        Ok(None) => {
            ctx.enter(Phase::Teardown);
            CellResult::failed(
                cell,
                Status::Cancelled,
                FailureKind::Cancelled,
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
                    FailureKind::Oom
                } else {
                    FailureKind::WorkloadError
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_calibration_runs() {
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
        let r = run(&cfg, &task, &mut ctx);
        assert_eq!(r.status, Status::Succeeded, "{:?}", r.failure);
        assert!(r.metrics["matmul_f32_tflops"] > 0.0);
        assert!(r.metrics["bandwidth_gbs"] > 0.0);
        assert_eq!(r.info["device"], json!("cpu"));
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
