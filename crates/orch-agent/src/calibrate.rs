//! The `calibrate` workload's judgement: its figures (measured by
//! `orch-kernels`' `calibrate.rs`, re-exported here as [`run`]) against the GPU
//! model's expected ones.
//!
//! A GPU model with an expected figure (see [`EXPECTED`]) is judged: a figure
//! under `threshold` (0.8 by default) of the expected one flags the cell
//! `degraded_gpu`.

pub use orch_kernels::calibrate::run;
use orch_protocol::{CalibrateConfig, CellResult, Hardware, Status, FLAG_DEGRADED_GPU};
use serde_json::{json, Value};

const DEFAULT_THRESHOLD: f64 = 0.8;

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
    use orch_protocol::{GpuInfo, Phase};
    use orch_workload::Ctx;

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
    fn cpu_calibration_is_not_judged() {
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
    }
}
