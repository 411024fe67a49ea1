//! One step: random inputs, the forward (plus the loss and every gradient
//! when training) by the chosen kernels, and the loss and gradient norm of a
//! step.

use super::config::{Kernels, Resolved};
use super::model::{cross_entropy, Model};
use crate::fused;
use candle_core::{DType, Device, Tensor};

/// The loss and the global gradient norm (f32) of a step.
pub(super) fn loss_and_norm(t: &Trained) -> candle_core::Result<(f64, f64)> {
    let loss = t.loss.to_dtype(DType::F32)?.to_scalar::<f32>()? as f64;
    let mut sq = 0f64;
    for (_, g) in &t.grads {
        sq += g.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    }
    Ok((loss, sq.sqrt()))
}

/// Random tokens and targets, from a small seeded generator (splitmix64).
pub(super) struct Inputs {
    pub(super) tokens: Tensor,
    pub(super) targets: Tensor,
}

pub(super) fn make_inputs(r: &Resolved, device: &Device) -> candle_core::Result<Inputs> {
    let mut state = r.seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = r.tokens();
    let vocab = r.vocab as u64;
    // `resolve` checked that `vocab` fits in u32, so every value below does.
    let mut draw = |_| (next() % vocab) as u32;
    let tokens: Vec<u32> = (0..n).map(&mut draw).collect();
    let targets: Vec<u32> = (0..n).map(&mut draw).collect();
    Ok(Inputs {
        tokens: Tensor::from_vec(tokens, n, device)?,
        targets: Tensor::from_vec(targets, (n, 1), device)?,
    })
}

/// A training step's loss (f32 scalar) and every parameter's gradient, named as
/// [`Model::params`].
pub(super) struct Trained {
    pub(super) loss: Tensor,
    pub(super) grads: Vec<(String, Tensor)>,
}

/// One step: forward, plus loss and backward when training.
pub(super) fn step(model: &Model, inputs: &Inputs, r: &Resolved) -> candle_core::Result<Option<Trained>> {
    let (b, t) = (r.batch, r.context);
    match r.kernels {
        Kernels::Fused => {
            let mut acts = r.train().then(Vec::new);
            let (logits, last) = model.forward_fused(&inputs.tokens, b, t, acts.as_mut())?;
            match acts {
                None => Ok(None),
                Some(acts) => model.backward_fused(logits, last, acts, inputs, b, t).map(Some),
            }
        }
        Kernels::Autograd | Kernels::Unfused => {
            let logits = if r.kernels == Kernels::Autograd {
                model.forward_autograd(&inputs.tokens, b, t)?
            } else {
                model.forward(&inputs.tokens, b, t)?
            };
            if !r.train() {
                return Ok(None);
            }
            let loss = if r.kernels == Kernels::Autograd {
                logits
                    .apply_op2(&inputs.targets.flatten_all()?, fused::CrossEntropy)?
                    .mean_all()?
            } else {
                cross_entropy(&logits, &inputs.targets)?
            };
            let store = loss.backward()?;
            let grads = model
                .params()
                .into_iter()
                .filter_map(|(name, p)| store.get(p).map(|g| (name, g.clone())))
                .collect();
            Ok(Some(Trained { loss, grads }))
        }
    }
}
