//! The model: its parameters ([`Init`], [`Block`], [`Model`]), the unfused
//! forward from candle's own element-wise ops (the composition the fused ops
//! are checked against), and [`Model::map`].

use super::config::{Kernels, Resolved};
use candle_core::{DType, Device, Tensor, Var, D};

const LN_EPS: f64 = 1e-5;
const INIT_STD: f64 = 0.02;

/// Makes parameters: variables when training (so `backward` reaches them),
/// plain tensors otherwise (so no graph is recorded).
struct Init<'a> {
    device: &'a Device,
    dtype: DType,
    track: bool,
}

impl Init<'_> {
    fn finish(&self, var: Var) -> Tensor {
        if self.track {
            var.into_inner()
        } else {
            var.as_detached_tensor()
        }
    }

    fn normal(&self, rows: usize, cols: usize) -> candle_core::Result<Tensor> {
        let var = Var::randn_f64(0.0, INIT_STD, (rows, cols), self.dtype, self.device)?;
        Ok(self.finish(var))
    }

    fn ones(&self, n: usize) -> candle_core::Result<Tensor> {
        Ok(self.finish(Var::ones(n, self.dtype, self.device)?))
    }

    fn zeros(&self, n: usize) -> candle_core::Result<Tensor> {
        Ok(self.finish(Var::zeros(n, self.dtype, self.device)?))
    }
}

pub(super) struct Block {
    pub(super) ln1_g: Tensor,
    pub(super) ln1_b: Tensor,
    pub(super) w_qkv: Tensor,
    pub(super) b_qkv: Tensor,
    pub(super) w_o: Tensor,
    pub(super) b_o: Tensor,
    pub(super) ln2_g: Tensor,
    pub(super) ln2_b: Tensor,
    pub(super) w1: Tensor,
    pub(super) b1: Tensor,
    pub(super) w2: Tensor,
    pub(super) b2: Tensor,
}

pub(super) struct Model {
    pub(super) wte: Tensor,
    pub(super) wpe: Tensor,
    pub(super) blocks: Vec<Block>,
    pub(super) lnf_g: Tensor,
    pub(super) lnf_b: Tensor,
    pub(super) head: Tensor,
    /// [context, context]: 0 on and below the diagonal, large negative above.
    pub(super) mask: Tensor,
    pub(super) d_model: usize,
    pub(super) heads: usize,
}

/// `x` [n, d_in] × `w` [d_in, d_out] + `b` [d_out].
fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    x.matmul(w)?.broadcast_add(b)
}

/// LayerNorm over the last dimension.
fn layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + LN_EPS)?.sqrt()?)?;
    normed.broadcast_mul(g)?.broadcast_add(b)
}

/// Softmax over the last dimension. The row maximum is a constant shift
/// (its gradient cancels), so it is detached.
fn softmax_last(x: &Tensor) -> candle_core::Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    e.broadcast_div(&sum)
}

/// Mean cross-entropy of `logits` [n, vocab] against `targets` [n, 1] (u32),
/// computed in f32 as mixed-precision training would.
pub(super) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let log_probs = shifted.broadcast_sub(&lse)?;
    log_probs.gather(targets, D::Minus1)?.mean_all()?.neg()
}

impl Model {
    pub(super) fn build(r: &Resolved, device: &Device) -> candle_core::Result<Model> {
        let init = Init {
            device,
            dtype: r.dtype,
            // The fused path writes its backward out: no graph to record.
            track: r.train() && r.kernels != Kernels::Fused,
        };
        let (d, ff) = (r.d_model, r.d_ff);
        let wte = init.normal(r.vocab, d)?;
        let wpe = init.normal(r.context, d)?;
        let mut blocks = Vec::with_capacity(r.layers);
        for _ in 0..r.layers {
            blocks.push(Block {
                ln1_g: init.ones(d)?,
                ln1_b: init.zeros(d)?,
                w_qkv: init.normal(d, 3 * d)?,
                b_qkv: init.zeros(3 * d)?,
                w_o: init.normal(d, d)?,
                b_o: init.zeros(d)?,
                ln2_g: init.ones(d)?,
                ln2_b: init.zeros(d)?,
                w1: init.normal(d, ff)?,
                b1: init.zeros(ff)?,
                w2: init.normal(ff, d)?,
                b2: init.zeros(d)?,
            });
        }
        let lnf_g = init.ones(d)?;
        let lnf_b = init.zeros(d)?;
        let head = init.normal(d, r.vocab)?;
        // f16 cannot hold -1e9; -1e4 still gives exp(...) == 0 there.
        let neg = if r.dtype == DType::F16 { -1e4f32 } else { -1e9f32 };
        let t = r.context;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| if i % t > i / t { neg } else { 0.0 })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), device)?.to_dtype(r.dtype)?;
        Ok(Model {
            wte,
            wpe,
            blocks,
            lnf_g,
            lnf_b,
            head,
            mask,
            d_model: d,
            heads: r.heads,
        })
    }

    /// Every parameter tensor, named.
    pub(super) fn params(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![("wte".to_string(), &self.wte), ("wpe".to_string(), &self.wpe)];
        for (i, b) in self.blocks.iter().enumerate() {
            for (n, t) in [
                ("ln1_g", &b.ln1_g),
                ("ln1_b", &b.ln1_b),
                ("w_qkv", &b.w_qkv),
                ("b_qkv", &b.b_qkv),
                ("w_o", &b.w_o),
                ("b_o", &b.b_o),
                ("ln2_g", &b.ln2_g),
                ("ln2_b", &b.ln2_b),
                ("w1", &b.w1),
                ("b1", &b.b1),
                ("w2", &b.w2),
                ("b2", &b.b2),
            ] {
                out.push((format!("h{i}.{n}"), t));
            }
        }
        out.push(("lnf_g".to_string(), &self.lnf_g));
        out.push(("lnf_b".to_string(), &self.lnf_b));
        out.push(("head".to_string(), &self.head));
        out
    }

    pub(super) fn param_count(&self) -> usize {
        self.params().iter().map(|(_, t)| t.elem_count()).sum()
    }

    /// Causal self-attention of `h` [b·t, d]; returns [b·t, d].
    fn attention(&self, h: &Tensor, blk: &Block, b: usize, t: usize) -> candle_core::Result<Tensor> {
        let (d, nh) = (self.d_model, self.heads);
        let hd = d / nh;
        let qkv = linear(h, &blk.w_qkv, &blk.b_qkv)?.reshape((b, t, 3, nh, hd))?;
        // [b, nh, t, hd] each.
        let part = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous()
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let q = part(0)?.affine(scale, 0.0)?;
        let k = part(1)?;
        let v = part(2)?;
        let scores = q.matmul(&k.t()?)?.broadcast_add(&self.mask)?;
        let probs = softmax_last(&scores)?;
        let out = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * t, d))?;
        linear(&out, &blk.w_o, &blk.b_o)
    }

    /// Logits [b·t, vocab] for `tokens` [b·t] (u32).
    pub(super) fn forward(&self, tokens: &Tensor, b: usize, t: usize) -> candle_core::Result<Tensor> {
        let d = self.d_model;
        let x = self
            .wte
            .index_select(tokens, 0)?
            .reshape((b, t, d))?
            .broadcast_add(&self.wpe)?;
        let mut x = x.reshape((b * t, d))?;
        for blk in &self.blocks {
            let h = layer_norm(&x, &blk.ln1_g, &blk.ln1_b)?;
            x = (x + self.attention(&h, blk, b, t)?)?;
            let h = layer_norm(&x, &blk.ln2_g, &blk.ln2_b)?;
            let m = linear(&h, &blk.w1, &blk.b1)?.gelu()?;
            x = (x + linear(&m, &blk.w2, &blk.b2)?)?;
        }
        layer_norm(&x, &self.lnf_g, &self.lnf_b)?.matmul(&self.head)
    }
}

impl Model {
    /// The same model with every parameter passed through `f`.
    pub(super) fn map(
        &self,
        f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Model> {
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    ln1_g: f(&b.ln1_g)?,
                    ln1_b: f(&b.ln1_b)?,
                    w_qkv: f(&b.w_qkv)?,
                    b_qkv: f(&b.b_qkv)?,
                    w_o: f(&b.w_o)?,
                    b_o: f(&b.b_o)?,
                    ln2_g: f(&b.ln2_g)?,
                    ln2_b: f(&b.ln2_b)?,
                    w1: f(&b.w1)?,
                    b1: f(&b.b1)?,
                    w2: f(&b.w2)?,
                    b2: f(&b.b2)?,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Model {
            wte: f(&self.wte)?,
            wpe: f(&self.wpe)?,
            blocks,
            lnf_g: f(&self.lnf_g)?,
            lnf_b: f(&self.lnf_b)?,
            head: f(&self.head)?,
            mask: f(&self.mask)?,
            d_model: self.d_model,
            heads: self.heads,
        })
    }
}
