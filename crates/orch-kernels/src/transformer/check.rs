//! The whole-step check of the fused kernels against the unfused composition
//! (run by the tests on the CPU and by `orch-agent check-kernels` on a GPU).

use super::config::{Kernels, Resolved};
use super::model::Model;
use super::step::{make_inputs, step, Inputs};
use crate::device::DeviceKind;
use crate::fused;
use candle_core::{DType, Device, Var};
use orch_protocol::Pass;

/// A whole training step of a small model on `device` in `dtype`, fused
/// (written-out backward) and fused under candle's autograd, against the
/// unfused composition under candle's autograd on the CPU in f32 with the same
/// weights: the loss and every parameter's gradient.
pub fn check_model(device: &Device, dtype: DType) -> candle_core::Result<Vec<fused::check::Check>> {
    let r = Resolved {
        preset: None,
        d_model: 32,
        layers: 2,
        heads: 2,
        d_ff: 128,
        context: 16,
        batch: 3,
        vocab: 56,
        pass: Pass::Train,
        dtype,
        device: DeviceKind::Cpu,
        seed: 7,
        kernels: Kernels::Fused,
    };
    // Seeded CPU weights (rounded to `dtype`), moved to the device.
    let seed = std::cell::Cell::new(100u64);
    let base = Model::build(
        &Resolved {
            dtype: DType::F32,
            kernels: Kernels::Unfused,
            ..r.clone()
        },
        &Device::Cpu,
    )?;
    // Every parameter seeded (candle's CPU generator cannot be), the causal
    // mask kept; all rounded to `dtype` so both sides see the same values.
    let mask_id = base.mask.id();
    let base = base.map(&|t| {
        seed.set(seed.get() + 1);
        let fresh = if t.id() == mask_id {
            t.clone()
        } else {
            fused::check::randn(seed.get(), t.shape().clone(), 0.1)?
        };
        fresh.to_dtype(dtype)?.to_dtype(DType::F32)
    })?;
    let tol = fused::check::tolerance(device, dtype);
    let reference = base.map(&|t| Ok(Var::from_tensor(t)?.as_tensor().clone()))?;
    let inputs_cpu = make_inputs(&r, &Device::Cpu)?;
    let want = step(
        &reference,
        &inputs_cpu,
        &Resolved {
            dtype: DType::F32,
            kernels: Kernels::Unfused,
            ..r.clone()
        },
    )?
    .ok_or_else(|| candle_core::Error::Msg("no reference gradients".into()))?;
    let mut out = Vec::new();
    for kernels in [Kernels::Fused, Kernels::Autograd] {
        let model = base.map(&|t| {
            let t = t.to_dtype(dtype)?.to_device(device)?;
            if kernels == Kernels::Autograd {
                Ok(Var::from_tensor(&t)?.as_tensor().clone())
            } else {
                Ok(t)
            }
        })?;
        let inputs = Inputs {
            tokens: inputs_cpu.tokens.to_device(device)?,
            targets: inputs_cpu.targets.to_device(device)?,
        };
        let got = step(&model, &inputs, &Resolved { kernels, ..r.clone() })?
            .ok_or_else(|| candle_core::Error::Msg("no gradients".into()))?;
        let k = kernels.name();
        out.push(fused::check::compare(
            &format!("step[{k}].loss"),
            &got.loss,
            &want.loss,
            tol,
        )?);
        for (name, g) in &got.grads {
            let Some((_, w)) = want.grads.iter().find(|(n, _)| n == name) else {
                candle_core::bail!("the reference has no gradient for `{name}`")
            };
            out.push(fused::check::compare(&format!("step[{k}].{name}"), g, w, tol)?);
        }
        if got.grads.len() != want.grads.len() {
            candle_core::bail!(
                "{k} step gave {} gradients, the reference {}",
                got.grads.len(),
                want.grads.len()
            );
        }
    }
    Ok(out)
}
