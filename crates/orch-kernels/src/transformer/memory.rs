//! Memory preflight: a step's peak bytes estimated by the kernels it runs
//! with (the fused estimate fitted to an H100's memory pool), checked against
//! the task's `memory_limit` or the free memory before anything is allocated.

use super::config::{Kernels, Resolved};
use crate::device::DeviceKind;
use candle_core::Device;
use orch_protocol::TaskSpec;
use orch_workload::sysmem;
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub(super) const GIB: f64 = (1u64 << 30) as f64;

impl Resolved {
    /// Rough bytes a step needs at its peak, by the kernels it runs with.
    pub(super) fn estimate_bytes(&self) -> u64 {
        let total = match self.kernels {
            Kernels::Fused => self.estimate_fused(),
            Kernels::Autograd | Kernels::Unfused => self.estimate_unfused(),
        };
        if total >= u64::MAX as f64 {
            u64::MAX
        } else {
            total as u64
        }
    }

    /// The fused path at its peak, fitted to the memory pool's high-water mark
    /// on an H100 for presets small to 2.7B (results/gpu-h100.json,
    /// `transformer.sweep`), plus 5%. Training peaks as the backward starts:
    /// the weights, every block's kept activations (8·d + 2·d_ff values a
    /// token), and the larger transient of the logits with their gradient and
    /// the head's gradient, or one block's attention buffers (three
    /// score-sized tensors) with its MLP gradients; gradients then grow while
    /// activations are released, so where the weights outweigh the activations
    /// (few tokens) the end of the backward, with every gradient, is the peak.
    /// Forward only: the weights and the larger of the logits or one block's
    /// temporaries.
    fn estimate_fused(&self) -> f64 {
        let s = self.dtype.size_in_bytes() as f64;
        let (b, t, d, ff, h, v, l) = (
            self.batch as f64,
            self.context as f64,
            self.d_model as f64,
            self.d_ff as f64,
            self.heads as f64,
            self.vocab as f64,
            self.layers as f64,
        );
        let n = b * t;
        let params = self.param_count() as f64 * s;
        let scores = b * h * t * t * s;
        let block = n * (8.0 * d + 2.0 * ff) * s;
        let peak = if self.train() {
            let logits = 2.0 * n * v * s + d * v * s + 8.0 * n;
            let attention = 3.0 * scores + 4.0 * n * ff.max(3.0 * d) * s;
            // Gradients grow as activations are released: with few tokens the
            // end of the backward (every gradient) is the peak.
            params + (l * block).max(params) + logits.max(attention)
        } else {
            params + (n * v * s + 2.0 * n * d * s).max(block + 2.0 * scores)
        };
        peak * 1.05
    }

    /// The unfused composition (and the fused ops under autograd) at its peak: Parameters (times 4 when
    /// training: weights, gradients, slack), activations kept for backward
    /// (one layer's worth when only running forward), attention scores with
    /// their softmax temporaries, and the logits (with the f32 loss copies
    /// when training).
    fn estimate_unfused(&self) -> f64 {
        let s = self.dtype.size_in_bytes() as f64;
        let train = self.train();
        let (b, t, d, ff, h, v) = (
            self.batch as f64,
            self.context as f64,
            self.d_model as f64,
            self.d_ff as f64,
            self.heads as f64,
            self.vocab as f64,
        );
        let kept_layers = if train { self.layers as f64 } else { 1.0 };
        let weights = self.param_count() as f64 * s * if train { 4.0 } else { 1.0 };
        let activations = b * t * kept_layers * (16.0 * d + 2.0 * ff) * s;
        let scores = b * h * t * t * kept_layers * s * 3.0;
        let logit_size = if train { s.max(4.0) } else { s };
        let logits = b * t * v * logit_size * 3.0;
        weights + activations + scores + logits
    }
}

pub(super) fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

/// The memory preflight, before anything is allocated: the estimate against
/// the task's `memory_limit`, else (on the CPU) the available memory. `Err`:
/// the `oom` message.
pub(super) fn preflight(
    r: &Resolved,
    task: &TaskSpec,
    info: &mut BTreeMap<String, Value>,
) -> Result<(), String> {
    let estimate = r.estimate_bytes();
    info.insert("estimated_bytes".to_string(), json!(estimate));
    let available = task.memory_limit_bytes.or(match r.device {
        DeviceKind::Cpu => sysmem::available_bytes(),
        DeviceKind::Cuda(_) => None,
    });
    if let Some(avail) = available {
        info.insert("available_bytes".to_string(), json!(avail));
        if estimate > avail {
            let msg = format!(
                "model needs about {} (estimate), {} available",
                gib(estimate),
                gib(avail)
            );
            return Err(msg);
        }
    }
    Ok(())
}

/// On a GPU without a `memory_limit`, the preflight is against the free
/// device memory, once the device is open. `Err`: the `oom` message.
pub(super) fn preflight_gpu(
    r: &Resolved,
    task: &TaskSpec,
    device: &Device,
    info: &mut BTreeMap<String, Value>,
) -> Result<(), String> {
    if task.memory_limit_bytes.is_none() {
        if let Some(free) = crate::device::free_bytes(device) {
            info.insert("available_bytes".to_string(), json!(free));
            let estimate = r.estimate_bytes();
            if estimate > free {
                return Err(format!(
                    "model needs about {} (estimate), {} free on the GPU",
                    gib(estimate),
                    gib(free)
                ));
            }
        }
    }
    Ok(())
}
