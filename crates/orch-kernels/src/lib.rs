//! `orch-kernels`: the agent's GPU work, and the only crate that depends on
//! candle-core (and carries the `cuda` feature: `orch-agent --features cuda`
//! turns it on here).
//!
//! `transformer/`: the builtin candle-core decoder-only transformer (fused by
//! default: forward from the fused ops, backward written out op by op;
//! `ORCH_TRANSFORMER_KERNELS=autograd|unfused` for A/B), memory preflight fitted
//! to the fused path, oom; `fused/`: the fused ops with their backward
//! (`kernels.cu`: causal softmax, layer norm, bias+GELU, column sums,
//! cross-entropy, embedding, head layout; `cuda.rs`: NVRTC compile cached per
//! process and launches on candle's storages; `cpu.rs`: the f32 reference;
//! `mod.rs`: tensor-level forward/backward functions and candle `CustomOp`s
//! whose `bwd` calls them; `check.rs`: gradient checks against the unfused
//! composition, run by the tests on the CPU and by [`check_kernels`]
//! (`orch-agent check-kernels`) on a GPU); `calibrate.rs`: the `calibrate`
//! workload's measurements (matmul TFLOP/s per dtype and copy bandwidth; the
//! agent judges them against the GPU model); `device.rs`: CPU/CUDA device
//! choice, dtypes, and the CUDA memory-pool release threshold. Workloads report
//! through `orch-workload`'s `Ctx`; no async runtime, clap or cloud SDK.

pub mod calibrate;
pub mod device;
pub mod fused;
pub mod transformer;

/// Whether this build runs the builtin workloads on CUDA (feature `cuda`).
pub const CUDA: bool = cfg!(feature = "cuda");

/// `orch-agent check-kernels [cpu|cuda]`: the fused ops' gradient checks (and
/// the model's) on `device` (`cuda` when not named), in f32 and bf16, one JSON
/// object per line on stdout. Returns the exit code: 1 when a check is out of
/// tolerance or could not run.
pub fn check_kernels(device: Option<&str>) -> i32 {
    use candle_core::{DType, Device};
    let device = match device.unwrap_or("cuda") {
        "cpu" => Ok(Device::Cpu),
        _ => Device::new_cuda(0),
    };
    let device = match device {
        Ok(d) => d,
        Err(e) => {
            eprintln!("orch-agent: error: opening the device: {e}");
            return 1;
        }
    };
    let mut failed = 0;
    for dtype in [DType::F32, DType::BF16] {
        let checks = fused::check::run_all(&device, dtype).and_then(|mut c| {
            c.extend(transformer::check_model(&device, dtype)?);
            Ok(c)
        });
        match checks {
            Ok(checks) => {
                for c in checks {
                    failed += usize::from(!c.ok);
                    let line = serde_json::json!({"dtype": format!("{dtype:?}").to_lowercase(), "check": c});
                    println!("{line}");
                }
            }
            Err(e) => {
                eprintln!("orch-agent: error: kernel checks in {dtype:?}: {e}");
                failed += 1;
            }
        }
    }
    i32::from(failed > 0)
}
