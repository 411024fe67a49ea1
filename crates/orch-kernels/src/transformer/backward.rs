//! The fused path: the forward from the fused ops of [`crate::fused`] (keeping
//! each block's activations when training), its backward written out op by
//! op, and the same fused ops as candle custom ops under `Tensor::backward`.

use super::model::Model;
use super::step::{Inputs, Trained};
use crate::fused;
use candle_core::Tensor;

/// Backward of `x · w + b` given the output's gradient `dy`: pushes the
/// bias and weight gradients under their names, returns `x`'s gradient.
fn linear_bwd(
    x: &Tensor,
    w: &Tensor,
    dy: &Tensor,
    w_name: &str,
    b_name: &str,
    grads: &mut Vec<(String, Tensor)>,
) -> candle_core::Result<Tensor> {
    grads.push((b_name.to_string(), fused::col_sum(dy)?));
    grads.push((w_name.to_string(), x.t()?.matmul(dy)?));
    dy.matmul(&w.t()?)
}

/// What the fused forward keeps of one block for the backward.
pub(super) struct Saved {
    x_in: Tensor,
    h1: Tensor,
    qkv: Tensor,
    attn: Tensor,
    x_mid: Tensor,
    h2: Tensor,
    u: Tensor,
    m: Tensor,
}

/// The fused forward's last activations: the final block's output (the final
/// layer norm's input) and that norm's output.
pub(super) struct Last {
    x: Tensor,
    hf: Tensor,
}

impl Model {
    /// Logits from the fused ops; with `keep`, each block's activations are
    /// pushed there for [`Model::backward_fused`].
    pub(super) fn forward_fused(
        &self,
        tokens: &Tensor,
        b: usize,
        t: usize,
        mut keep: Option<&mut Vec<Saved>>,
    ) -> candle_core::Result<(Tensor, Last)> {
        let mut x = fused::embed(&self.wte, &self.wpe, tokens)?;
        for blk in &self.blocks {
            let h1 = fused::layer_norm(&x, &blk.ln1_g, &blk.ln1_b)?;
            let qkv = fused::bias_add(&h1.matmul(&blk.w_qkv)?, &blk.b_qkv)?;
            let attn = fused::attention(&qkv, b, t, self.heads)?;
            let x_mid = (&x + fused::bias_add(&attn.matmul(&blk.w_o)?, &blk.b_o)?)?;
            let h2 = fused::layer_norm(&x_mid, &blk.ln2_g, &blk.ln2_b)?;
            let u = h2.matmul(&blk.w1)?;
            let m = fused::bias_gelu(&u, &blk.b1)?;
            let x_out = (&x_mid + fused::bias_add(&m.matmul(&blk.w2)?, &blk.b2)?)?;
            if let Some(keep) = keep.as_deref_mut() {
                keep.push(Saved {
                    x_in: x,
                    h1,
                    qkv,
                    attn,
                    x_mid,
                    h2,
                    u,
                    m,
                });
            }
            x = x_out;
        }
        let hf = fused::layer_norm(&x, &self.lnf_g, &self.lnf_b)?;
        let logits = hf.matmul(&self.head)?;
        Ok((logits, Last { x, hf }))
    }

    /// The loss and every gradient of the fused forward, written out op by op
    /// (each op's backward from [`crate::fused`]); activations are released as
    /// soon as the backward is past them.
    pub(super) fn backward_fused(
        &self,
        logits: Tensor,
        last: Last,
        mut acts: Vec<Saved>,
        inputs: &Inputs,
        b: usize,
        t: usize,
    ) -> candle_core::Result<Trained> {
        let n = b * t;
        let targets = inputs.targets.flatten_all()?;
        let rows = fused::cross_entropy(&logits, &targets)?;
        let loss = rows.mean_all()?;
        let g = Tensor::full(1.0f32 / n as f32, n, logits.device())?;
        let dlogits = fused::cross_entropy_bwd(&logits, &targets, &rows, &g)?;
        drop(logits);
        let mut grads: Vec<(String, Tensor)> = Vec::with_capacity(12 * self.blocks.len() + 5);
        grads.push(("head".into(), last.hf.t()?.matmul(&dlogits)?));
        let dhf = dlogits.matmul(&self.head.t()?)?;
        drop(dlogits);
        let (mut dx, dg, db) = fused::layer_norm_bwd(&last.x, &self.lnf_g, &dhf)?;
        grads.push(("lnf_b".into(), db));
        grads.push(("lnf_g".into(), dg));
        for (i, blk) in self.blocks.iter().enumerate().rev() {
            // The loop walks the blocks backwards, popping each one's activations.
            let Some(s) = acts.pop() else {
                candle_core::bail!("fused backward: block {i} has no saved activations")
            };
            // x_out = x_mid + (m · w2 + b2)
            let dm = linear_bwd(
                &s.m,
                &blk.w2,
                &dx,
                &format!("h{i}.w2"),
                &format!("h{i}.b2"),
                &mut grads,
            )?;
            // m = gelu(u + b1), u = h2 · w1
            let du = fused::bias_gelu_bwd(&s.u, &blk.b1, &dm)?;
            drop(dm);
            let dh2 = linear_bwd(
                &s.h2,
                &blk.w1,
                &du,
                &format!("h{i}.w1"),
                &format!("h{i}.b1"),
                &mut grads,
            )?;
            drop(du);
            let (dxm, dg2, db2) = fused::layer_norm_bwd(&s.x_mid, &blk.ln2_g, &dh2)?;
            grads.push((format!("h{i}.ln2_b"), db2));
            grads.push((format!("h{i}.ln2_g"), dg2));
            dx = (dx + dxm)?;
            // x_mid = x_in + (attn · w_o + b_o)
            let dattn = linear_bwd(
                &s.attn,
                &blk.w_o,
                &dx,
                &format!("h{i}.w_o"),
                &format!("h{i}.b_o"),
                &mut grads,
            )?;
            let dqkv = fused::attention_bwd(&s.qkv, &dattn, b, t, self.heads)?;
            drop(dattn);
            let dh1 = linear_bwd(
                &s.h1,
                &blk.w_qkv,
                &dqkv,
                &format!("h{i}.w_qkv"),
                &format!("h{i}.b_qkv"),
                &mut grads,
            )?;
            drop(dqkv);
            let (dxi, dg1, db1) = fused::layer_norm_bwd(&s.x_in, &blk.ln1_g, &dh1)?;
            grads.push((format!("h{i}.ln1_b"), db1));
            grads.push((format!("h{i}.ln1_g"), dg1));
            dx = (dx + dxi)?;
        }
        let (dwte, dwpe) = fused::embed_bwd(&dx, &inputs.tokens, self.wte.dim(0)?, t)?;
        grads.push(("wpe".into(), dwpe));
        grads.push(("wte".into(), dwte));
        Ok(Trained { loss, grads })
    }

    /// Logits from the fused ops as candle custom ops, so that
    /// `Tensor::backward` differentiates through them.
    pub(super) fn forward_autograd(
        &self,
        tokens: &Tensor,
        b: usize,
        t: usize,
    ) -> candle_core::Result<Tensor> {
        let attention = || fused::Attention {
            batch: b,
            context: t,
            heads: self.heads,
        };
        let add = || fused::BiasAct { gelu: false };
        let mut x = self.wte.apply_op3(&self.wpe, tokens, fused::Embed)?;
        for blk in &self.blocks {
            let h = x.apply_op3(&blk.ln1_g, &blk.ln1_b, fused::LayerNorm)?;
            let qkv = h.matmul(&blk.w_qkv)?.apply_op2(&blk.b_qkv, add())?;
            let a = qkv.apply_op1(attention())?;
            x = (x + a.matmul(&blk.w_o)?.apply_op2(&blk.b_o, add())?)?;
            let h = x.apply_op3(&blk.ln2_g, &blk.ln2_b, fused::LayerNorm)?;
            let m = h
                .matmul(&blk.w1)?
                .apply_op2(&blk.b1, fused::BiasAct { gelu: true })?;
            x = (x + m.matmul(&blk.w2)?.apply_op2(&blk.b2, add())?)?;
        }
        x.apply_op3(&self.lnf_g, &self.lnf_b, fused::LayerNorm)?
            .matmul(&self.head)
    }
}
