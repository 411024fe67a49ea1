//! Builtin workload: a decoder-only transformer (GPT-2 style, pre-LayerNorm)
//! with random weights, timed step by step like cs336's `benchmark.py`.
//!
//! A step is one forward pass over a random batch of tokens, plus the backward
//! pass (gradients of a mean cross-entropy loss) when the pass is `train`. No
//! optimizer step is taken: the weights never change.
//!
//! Forward-only cells build their weights as plain (detached) tensors, so
//! candle records no backward graph and frees each layer's intermediates as
//! soon as they are used; `train` cells build them as variables.
//!
//! Seeding: the input tokens always come from `seed`. The weights come from
//! the device's generator, seeded with `seed` where the backend allows it
//! (CUDA); candle's CPU backend cannot be seeded, so CPU weights differ from
//! run to run (`info.weights_seeded` says which). Random weights do not change
//! the work a step does, only its numbers.

use crate::ctx::Ctx;
use crate::device::{default_device, dtype_name, open_device, parse_device, parse_dtype, DeviceKind};
use crate::{fused, stats, sysmem};
use candle_core::{DType, Device, Tensor, Var, D};
use orch_protocol::{CellResult, Pass, Phase, Status, TaskSpec, TransformerConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::time::Instant;

/// Size presets: (name, [d_model, layers, heads, d_ff]).
const PRESETS: &[(&str, [usize; 4])] = &[
    ("nano", [64, 2, 4, 256]),
    ("tiny", [128, 4, 4, 512]),
    ("mini", [256, 4, 8, 1024]),
    ("small", [768, 12, 12, 3072]),
    ("medium", [1024, 24, 16, 4096]),
    ("large", [1280, 36, 20, 5120]),
    ("xl", [1600, 48, 25, 6400]),
    ("2.7B", [2560, 32, 32, 10240]),
];

const DEFAULT_CONTEXT: usize = 512;
const DEFAULT_BATCH: usize = 4;
const DEFAULT_VOCAB: usize = 10_000;
const LN_EPS: f64 = 1e-5;
const INIT_STD: f64 = 0.02;
const GIB: f64 = (1u64 << 30) as f64;

/// The configuration with presets and defaults applied, checked.
#[derive(Debug, Clone, PartialEq)]
struct Resolved {
    preset: Option<&'static str>,
    d_model: usize,
    layers: usize,
    heads: usize,
    d_ff: usize,
    context: usize,
    batch: usize,
    vocab: usize,
    pass: Pass,
    dtype: DType,
    device: DeviceKind,
    seed: u64,
    kernels: Kernels,
}

/// How a step is computed. `Fused` (the default for f32 and bf16): the fused
/// ops of [`crate::fused`], forward and a written-out backward. `Autograd`: the
/// same fused ops as candle custom ops under `Tensor::backward`. `Unfused`:
/// candle's own element-wise ops under `Tensor::backward` (the composition the
/// fused ops are checked against; also used for f16). Chosen with
/// `ORCH_TRANSFORMER_KERNELS` for A/B measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    Fused,
    Autograd,
    Unfused,
}

impl Kernels {
    fn name(self) -> &'static str {
        match self {
            Kernels::Fused => "fused",
            Kernels::Autograd => "fused-autograd",
            Kernels::Unfused => "unfused",
        }
    }

    fn choose(dtype: DType) -> Result<Kernels, String> {
        let wanted = std::env::var("ORCH_TRANSFORMER_KERNELS").unwrap_or_default();
        let k = match wanted.trim() {
            "" | "fused" => Kernels::Fused,
            "autograd" | "fused-autograd" => Kernels::Autograd,
            "unfused" => Kernels::Unfused,
            other => {
                return Err(format!(
                    "`ORCH_TRANSFORMER_KERNELS` is `{other}`: expected `fused`, `autograd` or `unfused`"
                ))
            }
        };
        Ok(if crate::fused::supports(dtype) {
            k
        } else {
            Kernels::Unfused
        })
    }
}

fn known_presets() -> String {
    PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Apply the preset, explicit sizes and defaults; check what results.
fn resolve(cfg: &TransformerConfig, task: &TaskSpec) -> Result<Resolved, String> {
    let (preset, sizes) = match cfg.preset.as_deref() {
        None => (None, None),
        Some(name) => {
            let wanted = name.trim().to_ascii_lowercase();
            match PRESETS.iter().find(|(n, _)| n.to_ascii_lowercase() == wanted) {
                Some((n, s)) => (Some(*n), Some(*s)),
                None => {
                    return Err(format!(
                        "unknown transformer preset `{name}`: known presets are {}",
                        known_presets()
                    ))
                }
            }
        }
    };
    let required = |field: &str, explicit: Option<usize>, idx: usize| -> Result<usize, String> {
        explicit
            .or(sizes.map(|s| s[idx]))
            .ok_or_else(|| format!("transformer `{field}` is required when no `preset` is given"))
    };
    let d_model = required("d_model", cfg.d_model, 0)?;
    let layers = required("layers", cfg.layers, 1)?;
    let heads = required("heads", cfg.heads, 2)?;
    let d_ff = cfg
        .d_ff
        .or(if cfg.d_model.is_some() {
            None
        } else {
            sizes.map(|s| s[3])
        })
        .unwrap_or(4 * d_model);
    let context = cfg.context.unwrap_or(DEFAULT_CONTEXT);
    let batch = cfg.batch.unwrap_or(DEFAULT_BATCH);
    let vocab = cfg.vocab.unwrap_or(DEFAULT_VOCAB);
    for (field, v) in [
        ("d_model", d_model),
        ("layers", layers),
        ("heads", heads),
        ("d_ff", d_ff),
        ("context", context),
        ("batch", batch),
        ("vocab", vocab),
    ] {
        if v == 0 {
            return Err(format!("transformer `{field}` must be at least 1"));
        }
    }
    if d_model % heads != 0 {
        return Err(format!(
            "transformer `d_model` ({d_model}) must be divisible by `heads` ({heads})"
        ));
    }
    if u32::try_from(vocab).is_err() {
        return Err(format!("transformer `vocab` ({vocab}) must fit in 32 bits"));
    }
    let device = match cfg.device.as_deref() {
        Some(s) => parse_device(s, "transformer")?,
        None => default_device(task),
    };
    let dtype = match cfg.dtype.as_deref() {
        Some(s) => parse_dtype(s, "transformer")?,
        None => match device {
            DeviceKind::Cpu => DType::F32,
            DeviceKind::Cuda(_) => DType::BF16,
        },
    };
    Ok(Resolved {
        preset,
        d_model,
        layers,
        heads,
        d_ff,
        context,
        batch,
        vocab,
        pass: cfg.pass.unwrap_or(Pass::Train),
        kernels: Kernels::choose(dtype)?,
        dtype,
        device,
        seed: cfg.seed.unwrap_or(0),
    })
}

impl Resolved {
    fn pass_name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "forward",
            Pass::Train => "train",
        }
    }

    fn train(&self) -> bool {
        self.pass == Pass::Train
    }

    fn tokens(&self) -> usize {
        self.batch * self.context
    }

    /// Number of parameters (every weight, gain and bias; the LM head has no bias).
    fn param_count(&self) -> u64 {
        let (d, ff, v, t, l) = (
            self.d_model as u64,
            self.d_ff as u64,
            self.vocab as u64,
            self.context as u64,
            self.layers as u64,
        );
        // LN1 + LN2 (4d), QKV (3d² + 3d), output proj (d² + d), MLP (2·d·ff + ff + d).
        let per_layer = 4 * d * d + 2 * d * ff + 9 * d + ff;
        v * d + t * d + l * per_layer + 2 * d + d * v
    }

    /// Rough bytes a step needs at its peak, by the kernels it runs with.
    fn estimate_bytes(&self) -> u64 {
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

    fn info(&self) -> BTreeMap<String, Value> {
        let mut info = BTreeMap::new();
        let mut put = |k: &str, v: Value| {
            info.insert(k.to_string(), v);
        };
        put("d_model", json!(self.d_model));
        put("layers", json!(self.layers));
        put("heads", json!(self.heads));
        put("d_ff", json!(self.d_ff));
        put("context", json!(self.context));
        put("batch", json!(self.batch));
        put("vocab", json!(self.vocab));
        put("pass", json!(self.pass_name()));
        put("dtype", json!(dtype_name(self.dtype)));
        put("device", json!(self.device.name()));
        put("preset", json!(self.preset));
        put("seed", json!(self.seed));
        put("kernels", json!(self.kernels.name()));
        info
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB)
}

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

struct Block {
    ln1_g: Tensor,
    ln1_b: Tensor,
    w_qkv: Tensor,
    b_qkv: Tensor,
    w_o: Tensor,
    b_o: Tensor,
    ln2_g: Tensor,
    ln2_b: Tensor,
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

struct Model {
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    lnf_g: Tensor,
    lnf_b: Tensor,
    head: Tensor,
    /// [context, context]: 0 on and below the diagonal, large negative above.
    mask: Tensor,
    d_model: usize,
    heads: usize,
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
fn cross_entropy(logits: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let log_probs = shifted.broadcast_sub(&lse)?;
    log_probs.gather(targets, D::Minus1)?.mean_all()?.neg()
}

impl Model {
    fn build(r: &Resolved, device: &Device) -> candle_core::Result<Model> {
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
    fn params(&self) -> Vec<(String, &Tensor)> {
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

    fn param_count(&self) -> usize {
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
    fn forward(&self, tokens: &Tensor, b: usize, t: usize) -> candle_core::Result<Tensor> {
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
struct Saved {
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
struct Last {
    x: Tensor,
    hf: Tensor,
}

impl Model {
    /// Logits from the fused ops; with `keep`, each block's activations are
    /// pushed there for [`Model::backward_fused`].
    fn forward_fused(
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
    fn backward_fused(
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
    fn forward_autograd(&self, tokens: &Tensor, b: usize, t: usize) -> candle_core::Result<Tensor> {
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

impl Model {
    /// The same model with every parameter passed through `f`.
    fn map(&self, f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>) -> candle_core::Result<Model> {
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

/// The loss and the global gradient norm (f32) of a step.
fn loss_and_norm(t: &Trained) -> candle_core::Result<(f64, f64)> {
    let loss = t.loss.to_dtype(DType::F32)?.to_scalar::<f32>()? as f64;
    let mut sq = 0f64;
    for (_, g) in &t.grads {
        sq += g.to_dtype(DType::F32)?.sqr()?.sum_all()?.to_scalar::<f32>()? as f64;
    }
    Ok((loss, sq.sqrt()))
}

/// Random tokens and targets, from a small seeded generator (splitmix64).
struct Inputs {
    tokens: Tensor,
    targets: Tensor,
}

fn make_inputs(r: &Resolved, device: &Device) -> candle_core::Result<Inputs> {
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
struct Trained {
    loss: Tensor,
    grads: Vec<(String, Tensor)>,
}

/// One step: forward, plus loss and backward when training.
fn step(model: &Model, inputs: &Inputs, r: &Resolved) -> candle_core::Result<Option<Trained>> {
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

/// A candle error and the stage it happened in.
struct BenchError {
    stage: &'static str,
    error: candle_core::Error,
}

fn at(stage: &'static str) -> impl Fn(candle_core::Error) -> BenchError {
    move |error| BenchError { stage, error }
}

enum Outcome {
    Done {
        step_ms: Vec<f64>,
        params: usize,
    },
    Cancelled {
        phase: Phase,
    },
    /// The estimate exceeds the GPU's free memory: nothing was built.
    Oom(String),
}

fn bench(
    r: &Resolved,
    task: &TaskSpec,
    ctx: &mut Ctx,
    info: &mut BTreeMap<String, Value>,
) -> Result<Outcome, BenchError> {
    let device = open_device(r.device).map_err(at("device setup"))?;
    // On a GPU without a `memory_limit`, the preflight is against the free
    // device memory, once the device is open.
    if task.memory_limit_bytes.is_none() {
        if let Some(free) = crate::device::free_bytes(&device) {
            info.insert("available_bytes".to_string(), json!(free));
            let estimate = r.estimate_bytes();
            if estimate > free {
                return Ok(Outcome::Oom(format!(
                    "model needs about {} (estimate), {} free on the GPU",
                    gib(estimate),
                    gib(free)
                )));
            }
        }
    }
    let seeded = device.set_seed(r.seed).is_ok();
    info.insert("weights_seeded".to_string(), json!(seeded));
    let model = Model::build(r, &device).map_err(at("model build"))?;
    let inputs = make_inputs(r, &device).map_err(at("model build"))?;
    device.synchronize().map_err(at("model build"))?;
    let params = model.param_count();
    ctx.message(format!(
        "transformer: {:.1}M params, {} on {} ({}), batch {} x context {}",
        params as f64 / 1e6,
        r.pass_name(),
        r.device.name(),
        dtype_name(r.dtype),
        r.batch,
        r.context
    ));

    let warmup = task.measure.warmup;
    ctx.enter(Phase::Warmup);
    for i in 0..warmup {
        if ctx.stop_requested() {
            ctx.enter(Phase::Teardown);
            return Ok(Outcome::Cancelled { phase: Phase::Warmup });
        }
        drop(step(&model, &inputs, r).map_err(at("warm-up"))?);
        device.synchronize().map_err(at("warm-up"))?;
        ctx.progress(Phase::Warmup, u64::from(i) + 1, u64::from(warmup));
    }

    let reps = task.measure.repetitions;
    device.synchronize().map_err(at("warm-up"))?;
    crate::device::pool_peak_bytes(r.device, true);
    ctx.enter(Phase::Measure);
    let mut step_ms = Vec::with_capacity(reps as usize);
    for i in 0..reps {
        if ctx.stop_requested() {
            ctx.enter(Phase::Teardown);
            return Ok(Outcome::Cancelled {
                phase: Phase::Measure,
            });
        }
        device.synchronize().map_err(at("measure"))?;
        let t0 = Instant::now();
        drop(step(&model, &inputs, r).map_err(at("measure"))?);
        device.synchronize().map_err(at("measure"))?;
        step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        ctx.progress(Phase::Measure, u64::from(i) + 1, u64::from(reps));
    }

    if let Some(peak) = crate::device::pool_peak_bytes(r.device, false) {
        info.insert("gpu_pool_peak_bytes".to_string(), json!(peak));
    }
    // One more step, outside the timing: its loss and gradient norm go into
    // the record (and, with `ORCH_TRANSFORMER_DUMP=FILE`, the weights, inputs
    // and gradients into a safetensors file, for comparison with PyTorch).
    if r.train() {
        if let Some(t) = step(&model, &inputs, r).map_err(at("measure"))? {
            let (loss, norm) = loss_and_norm(&t).map_err(at("measure"))?;
            info.insert("loss".to_string(), json!(loss));
            info.insert("grad_norm".to_string(), json!(norm));
            if let Some(path) = std::env::var_os("ORCH_TRANSFORMER_DUMP") {
                let mut all: HashMap<String, Tensor> = HashMap::new();
                for (name, p) in model.params() {
                    all.insert(format!("param.{name}"), p.clone());
                }
                for (name, g) in t.grads {
                    all.insert(format!("grad.{name}"), g);
                }
                all.insert("tokens".to_string(), inputs.tokens.clone());
                all.insert(
                    "targets".to_string(),
                    inputs.targets.flatten_all().map_err(at("measure"))?,
                );
                candle_core::safetensors::save(&all, &path).map_err(at("measure"))?;
            }
        }
    }
    if let Some(ms) = fused::compile_ms() {
        info.insert("fused_compile_ms".to_string(), json!(ms));
    }

    ctx.enter(Phase::Teardown);
    drop(inputs);
    drop(model);
    device.synchronize().map_err(at("teardown"))?;
    Ok(Outcome::Done { step_ms, params })
}

pub(crate) fn is_oom(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("out of memory") || t.contains("out_of_memory") || t.contains("outofmemory")
}

/// Run the transformer benchmark for one cell. The caller has entered
/// [`Phase::Start`] and collects the phase timings afterwards.
pub fn run(cfg: &TransformerConfig, task: &TaskSpec, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let r = match resolve(cfg, task) {
        Ok(r) => r,
        Err(msg) => return CellResult::failed(cell, Status::Failed, "invalid_config", msg),
    };
    let mut info = r.info();
    let with_info = |mut result: CellResult, info: BTreeMap<String, Value>| {
        result.info.extend(info);
        result
    };
    if task.measure.repetitions == 0 {
        let result = CellResult::failed(
            cell,
            Status::Failed,
            "invalid_config",
            "transformer `repetitions` must be at least 1",
        );
        return with_info(result, info);
    }

    // Memory preflight, before anything is allocated.
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
            return with_info(CellResult::failed(cell, Status::Oom, "oom", msg), info);
        }
    }

    if ctx.stop_requested() {
        let result = CellResult::failed(
            cell,
            Status::Cancelled,
            "cancelled",
            "stop requested before the model was built",
        );
        return with_info(result, info);
    }

    match bench(&r, task, ctx, &mut info) {
        Ok(Outcome::Cancelled { phase }) => {
            let msg = format!("stop requested during {}", phase.as_str());
            with_info(
                CellResult::failed(cell, Status::Cancelled, "cancelled", msg),
                info,
            )
        }
        Ok(Outcome::Oom(msg)) => with_info(CellResult::failed(cell, Status::Oom, "oom", msg), info),
        Err(BenchError { stage, error }) => {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or("").trim();
            let msg = format!("transformer {stage} failed: {first}");
            let result = if is_oom(&text) {
                CellResult::failed(cell, Status::Oom, "oom", msg)
            } else {
                CellResult::failed(cell, Status::Failed, "workload_error", msg)
            };
            with_info(result, info)
        }
        Ok(Outcome::Done { step_ms, params }) => {
            let mut result = CellResult::new(cell, Status::Succeeded);
            if let Some(summary) = stats::summarize(&step_ms) {
                summary.insert_into(&mut result.metrics, "step_time", "_ms");
                if summary.mean > 0.0 {
                    result.metrics.insert(
                        "tokens_per_s".to_string(),
                        r.tokens() as f64 / (summary.mean / 1e3),
                    );
                }
            }
            let params = params as f64;
            result.metrics.insert("params".to_string(), params);
            let factor = if r.train() { 6.0 } else { 2.0 };
            result.metrics.insert(
                "flops_per_step_estimate".to_string(),
                factor * params * r.tokens() as f64,
            );
            if r.device == DeviceKind::Cpu {
                if let Some(peak) = sysmem::peak_rss_bytes() {
                    result
                        .metrics
                        .insert("peak_memory_bytes".to_string(), peak as f64);
                }
            }
            with_info(result, info)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::{BuiltinWorkload, Event, LogLimits, Measure, Workload, PROTOCOL_VERSION};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    fn task(cfg: &TransformerConfig) -> TaskSpec {
        TaskSpec {
            version: PROTOCOL_VERSION,
            run_id: "run".into(),
            cell_id: "cell".into(),
            gpu: "none".into(),
            params: BTreeMap::new(),
            env: BTreeMap::new(),
            secret_env: vec![],
            workload: Workload::Builtin(BuiltinWorkload::Transformer(cfg.clone())),
            measure: Measure {
                warmup: 1,
                repetitions: 2,
                timeout_s: 120.0,
                kill_grace_s: 5.0,
            },
            logs: LogLimits::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
        }
    }

    fn tiny(pass: Pass) -> TransformerConfig {
        TransformerConfig {
            d_model: Some(32),
            layers: Some(2),
            heads: Some(2),
            context: Some(16),
            batch: Some(2),
            vocab: Some(50),
            pass: Some(pass),
            device: Some("cpu".into()),
            ..Default::default()
        }
    }

    fn ctx_with(stop: bool) -> (Ctx, Arc<Mutex<Vec<Event>>>) {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let ctx = Ctx::new(
            Box::new(move |e| sink.lock().unwrap().push(e.clone())),
            Arc::new(AtomicBool::new(stop)),
        );
        (ctx, events)
    }

    fn resolve_err(cfg: TransformerConfig) -> String {
        resolve(&cfg, &task(&cfg)).unwrap_err()
    }

    #[test]
    fn presets_resolve_and_explicit_sizes_override() {
        let cfg = TransformerConfig {
            preset: Some("SMALL".into()),
            ..Default::default()
        };
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        assert_eq!(r.preset, Some("small"));
        assert_eq!((r.d_model, r.layers, r.heads, r.d_ff), (768, 12, 12, 3072));
        assert_eq!((r.context, r.batch, r.vocab), (512, 4, 10_000));
        assert_eq!(r.pass, Pass::Train);
        assert_eq!(r.dtype, DType::F32);
        assert_eq!(r.device, DeviceKind::Cpu);

        let cfg = TransformerConfig {
            preset: Some("2.7b".into()),
            layers: Some(2),
            context: Some(128),
            dtype: Some("bf16".into()),
            ..Default::default()
        };
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        assert_eq!(r.preset, Some("2.7B"));
        assert_eq!((r.d_model, r.layers, r.d_ff, r.context), (2560, 2, 10240, 128));
        assert_eq!(r.dtype, DType::BF16);

        // An explicit d_model without d_ff gets 4 × d_model, not the preset's d_ff.
        let cfg = TransformerConfig {
            preset: Some("nano".into()),
            d_model: Some(96),
            ..Default::default()
        };
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        assert_eq!((r.d_model, r.heads, r.d_ff), (96, 4, 384));

        let info = r.info();
        assert_eq!(info["preset"], json!("nano"));
        assert_eq!(info["pass"], json!("train"));
        assert_eq!(info["device"], json!("cpu"));
    }

    #[test]
    fn invalid_configs_are_refused() {
        let e = resolve_err(TransformerConfig {
            preset: Some("huge".into()),
            ..Default::default()
        });
        assert!(e.starts_with("unknown transformer preset `huge`: known presets are nano, tiny,"));
        assert!(e.contains("2.7B"));

        let e = resolve_err(TransformerConfig {
            d_model: Some(64),
            heads: Some(4),
            ..Default::default()
        });
        assert!(e.contains("`layers`"), "{e}");

        let e = resolve_err(TransformerConfig {
            d_model: Some(65),
            layers: Some(1),
            heads: Some(4),
            ..Default::default()
        });
        assert!(e.contains("divisible"), "{e}");

        let e = resolve_err(TransformerConfig {
            preset: Some("nano".into()),
            batch: Some(0),
            ..Default::default()
        });
        assert!(e.contains("`batch`"), "{e}");

        let e = resolve_err(TransformerConfig {
            preset: Some("nano".into()),
            dtype: Some("f8".into()),
            ..Default::default()
        });
        assert!(e.contains("dtype `f8`"), "{e}");

        let e = resolve_err(TransformerConfig {
            preset: Some("nano".into()),
            device: Some("tpu".into()),
            ..Default::default()
        });
        assert!(e.contains("device `tpu`"), "{e}");

        if !cfg!(feature = "cuda") {
            let e = resolve_err(TransformerConfig {
                preset: Some("nano".into()),
                device: Some("cuda".into()),
                ..Default::default()
            });
            assert!(e.contains("`cuda` feature"), "{e}");
            // A GPU cell on a CPU-only agent falls back to the CPU.
            let cfg = TransformerConfig {
                preset: Some("nano".into()),
                ..Default::default()
            };
            let mut t = task(&cfg);
            t.gpu = "H100:1".into();
            assert_eq!(resolve(&cfg, &t).unwrap().device, DeviceKind::Cpu);
        }

        // Through `run`: a failed result with the right kind.
        let cfg = TransformerConfig {
            preset: Some("huge".into()),
            ..Default::default()
        };
        let (mut ctx, _) = ctx_with(false);
        let res = run(&cfg, &task(&cfg), &mut ctx);
        assert_eq!(res.status, Status::Failed);
        assert_eq!(res.failure.unwrap().kind, "invalid_config");
    }

    #[test]
    fn param_count_matches_hand_computation() {
        let cfg = TransformerConfig {
            d_model: Some(4),
            layers: Some(1),
            heads: Some(2),
            d_ff: Some(8),
            context: Some(3),
            vocab: Some(5),
            ..Default::default()
        };
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        // wte 5·4 = 20, wpe 3·4 = 12,
        // layer: LN1 8 + QKV 4·12 + 12 = 60 + proj 16 + 4 = 20 + LN2 8
        //        + W1 32 + 8 = 40 + W2 32 + 4 = 36  → 172,
        // final LN 8, head 4·5 = 20 → 232.
        assert_eq!(r.param_count(), 232);
        let model = Model::build(&r, &Device::Cpu).unwrap();
        assert_eq!(model.param_count(), 232);
    }

    /// Every fused op's forward and backward against the unfused candle
    /// composition under autograd (CPU, f32 and bf16), and a whole step of the
    /// fused model (written-out backward, and under autograd) against the
    /// unfused model: loss and every gradient. Tolerances in `fused::check`.
    #[test]
    fn fused_ops_and_step_match_the_unfused_composition() {
        for dtype in [DType::F32, DType::BF16] {
            let mut checks = fused::check::run_all(&Device::Cpu, dtype).unwrap();
            checks.extend(check_model(&Device::Cpu, dtype).unwrap());
            assert!(checks.len() > 60, "{}", checks.len());
            let bad: Vec<_> = checks.iter().filter(|c| !c.ok).collect();
            assert!(bad.is_empty(), "{dtype:?}: {bad:#?}");
        }
    }

    /// The checks can fail: a wrong gradient is caught.
    #[test]
    fn a_wrong_gradient_fails_the_check() {
        let want = Tensor::new(&[1f32, -2.0, 3.0], &Device::Cpu).unwrap();
        let got = Tensor::new(&[1f32, -2.0, 3.1], &Device::Cpu).unwrap();
        let c = fused::check::compare("x", &got, &want, 1e-4).unwrap();
        assert!(!c.ok && (c.rel_err - 0.1 / 3.0).abs() < 1e-5, "{c:?}");
        let nan = Tensor::new(&[1f32, f32::NAN, 3.0], &Device::Cpu).unwrap();
        assert!(!fused::check::compare("x", &nan, &want, 1e-4).unwrap().ok);
    }

    /// Finite differences of the fused model's loss agree with its written-out
    /// backward (f32, central differences, a few entries of several parameters).
    #[test]
    fn fused_backward_matches_finite_differences() {
        let cfg = tiny(Pass::Train);
        let r = Resolved {
            kernels: Kernels::Fused,
            ..resolve(&cfg, &task(&cfg)).unwrap()
        };
        let model = Model::build(&r, &Device::Cpu).unwrap();
        let inputs = make_inputs(&r, &Device::Cpu).unwrap();
        let trained = step(&model, &inputs, &r).unwrap().unwrap();
        let loss_of = |m: &Model| {
            let t = step(m, &inputs, &r).unwrap().unwrap();
            t.loss.to_scalar::<f32>().unwrap() as f64
        };
        let eps = 1e-2f64;
        for (name, idx) in [
            ("h0.w_qkv", 5usize),
            ("h1.ln2_g", 3),
            ("h0.b1", 7),
            ("wte", 40),
            ("head", 11),
            ("lnf_b", 2),
        ] {
            let (_, g) = trained.grads.iter().find(|(n, _)| n == name).unwrap();
            let analytic = g.flatten_all().unwrap().to_vec1::<f32>().unwrap()[idx] as f64;
            let bump = |delta: f64| {
                model
                    .map(&|t| {
                        let is_target = model.params().iter().any(|(n, p)| n == name && p.id() == t.id());
                        if !is_target {
                            return Ok(t.clone());
                        }
                        let mut v = t.flatten_all()?.to_vec1::<f32>()?;
                        v[idx] += delta as f32;
                        Tensor::from_vec(v, t.shape(), t.device())
                    })
                    .unwrap()
            };
            let numeric = (loss_of(&bump(eps)) - loss_of(&bump(-eps))) / (2.0 * eps);
            let err = (numeric - analytic).abs() / analytic.abs().max(1e-3);
            assert!(
                err < 2e-2,
                "{name}[{idx}]: numeric {numeric}, analytic {analytic}"
            );
        }
    }

    /// The document of seed-sizes (fp32, context 512, batch 4, a 16 GB card):
    /// small..large fit, xl and 2.7B do not; the fused estimate agrees.
    #[test]
    fn fused_estimate_places_the_16_gib_line_where_the_document_did() {
        let limit = 16u64 << 30;
        for (preset, fits) in [
            ("small", true),
            ("medium", true),
            ("large", true),
            ("xl", false),
            ("2.7B", false),
        ] {
            let cfg = TransformerConfig {
                preset: Some(preset.into()),
                context: Some(512),
                batch: Some(4),
                vocab: Some(10_000),
                dtype: Some("f32".into()),
                device: Some("cpu".into()),
                ..Default::default()
            };
            let r = Resolved {
                kernels: Kernels::Fused,
                ..resolve(&cfg, &task(&cfg)).unwrap()
            };
            let est = r.estimate_bytes();
            assert_eq!(est <= limit, fits, "{preset}: {}", gib(est));
        }
    }

    #[test]
    fn backward_reaches_every_parameter() {
        let cfg = tiny(Pass::Train);
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        let model = Model::build(&r, &Device::Cpu).unwrap();
        let inputs = make_inputs(&r, &Device::Cpu).unwrap();
        let logits = model.forward(&inputs.tokens, r.batch, r.context).unwrap();
        assert_eq!(logits.dims(), &[32, 50]);
        let loss = cross_entropy(&logits, &inputs.targets).unwrap();
        let loss = loss.to_scalar::<f32>().unwrap();
        // Near ln(50) with small random weights.
        assert!((loss - 50f32.ln()).abs() < 0.5, "loss {loss}");

        for kernels in [Kernels::Fused, Kernels::Autograd, Kernels::Unfused] {
            let r = Resolved { kernels, ..r.clone() };
            let model = Model::build(&r, &Device::Cpu).unwrap();
            let trained = step(&model, &inputs, &r)
                .unwrap()
                .expect("train step gives grads");
            assert_eq!(trained.grads.len(), model.params().len(), "{kernels:?}");
            for (name, t) in model.params() {
                let (_, g) = trained
                    .grads
                    .iter()
                    .find(|(n, _)| *n == name)
                    .unwrap_or_else(|| panic!("{kernels:?}: no gradient for {name}"));
                assert_eq!(g.dims(), t.dims(), "{kernels:?} {name}");
                let norm = g.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
                assert!(norm.is_finite(), "{kernels:?} {name}");
                if name == "h0.w_qkv" {
                    assert!(norm > 0.0, "{kernels:?}");
                }
            }
        }

        // Forward-only weights record no graph.
        let r = Resolved {
            pass: Pass::Forward,
            ..r
        };
        let model = Model::build(&r, &Device::Cpu).unwrap();
        assert!(step(&model, &inputs, &r).unwrap().is_none());
        assert!(model
            .forward(&inputs.tokens, r.batch, r.context)
            .unwrap()
            .backward()
            .unwrap()
            .get(&model.wte)
            .is_none());
    }

    #[test]
    fn tiny_runs_succeed_in_both_passes() {
        for pass in [Pass::Forward, Pass::Train] {
            let cfg = tiny(pass);
            let t = task(&cfg);
            let (mut ctx, events) = ctx_with(false);
            ctx.enter(Phase::Start);
            let res = run(&cfg, &t, &mut ctx);
            assert_eq!(res.status, Status::Succeeded, "{:?}", res.failure);
            for k in [
                "step_time_mean_ms",
                "step_time_median_ms",
                "step_time_p95_ms",
                "step_time_min_ms",
                "step_time_max_ms",
                "tokens_per_s",
                "params",
                "flops_per_step_estimate",
            ] {
                let v = res.metrics[k];
                assert!(v.is_finite() && v > 0.0, "{k} = {v}");
            }
            assert!(res.metrics.contains_key("step_time_cv_pct"));
            assert!(res.metrics.contains_key("peak_memory_bytes"));
            assert_eq!(res.info["d_model"], json!(32));
            assert_eq!(res.info["pass"], json!(r_pass(pass)));
            let timings = ctx.take_timings();
            for p in [Phase::Start, Phase::Warmup, Phase::Measure, Phase::Teardown] {
                assert!(timings.contains_key(&p), "{p:?}");
            }
            let measured = events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| {
                    matches!(
                        e,
                        Event::Progress {
                            phase: Phase::Measure,
                            ..
                        }
                    )
                })
                .count();
            assert_eq!(measured, 2);
        }
    }

    fn r_pass(pass: Pass) -> &'static str {
        match pass {
            Pass::Forward => "forward",
            Pass::Train => "train",
        }
    }

    #[test]
    fn memory_limit_gives_oom_before_allocating() {
        let cfg = tiny(Pass::Train);
        let mut t = task(&cfg);
        t.memory_limit_bytes = Some(1024);
        let (mut ctx, events) = ctx_with(false);
        let res = run(&cfg, &t, &mut ctx);
        assert_eq!(res.status, Status::Oom);
        let failure = res.failure.unwrap();
        assert_eq!(failure.kind, "oom");
        assert!(
            failure.message.starts_with("model needs about "),
            "{}",
            failure.message
        );
        assert_eq!(res.info["available_bytes"], json!(1024));
        assert!(res.info["estimated_bytes"].as_u64().unwrap() > 1024);
        // Nothing was built: no phase was entered, no message sent.
        assert!(events.lock().unwrap().is_empty());
    }

    #[test]
    fn stop_before_start_cancels() {
        let cfg = tiny(Pass::Train);
        let (mut ctx, events) = ctx_with(true);
        let res = run(&cfg, &task(&cfg), &mut ctx);
        assert_eq!(res.status, Status::Cancelled);
        assert_eq!(res.failure.unwrap().kind, "cancelled");
        assert!(events.lock().unwrap().is_empty());
    }

    #[test]
    fn attention_is_causal() {
        let cfg = tiny(Pass::Forward);
        let r = resolve(&cfg, &task(&cfg)).unwrap();
        let model = Model::build(&r, &Device::Cpu).unwrap();
        let inputs = make_inputs(&r, &Device::Cpu).unwrap();
        let mut changed = inputs.tokens.to_vec1::<u32>().unwrap();
        let t = r.context;
        // Change the last token of every sequence.
        for s in 0..r.batch {
            let i = s * t + t - 1;
            changed[i] = (changed[i] + 1) % r.vocab as u32;
        }
        let changed = Tensor::from_vec(changed, r.tokens(), &Device::Cpu).unwrap();
        let a = model.forward(&inputs.tokens, r.batch, t).unwrap();
        let b = model.forward(&changed, r.batch, t).unwrap();
        let a = a
            .reshape((r.batch, t, r.vocab))
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        let b = b
            .reshape((r.batch, t, r.vocab))
            .unwrap()
            .to_vec3::<f32>()
            .unwrap();
        for s in 0..r.batch {
            assert_eq!(
                a[s][..t - 1],
                b[s][..t - 1],
                "earlier positions saw a later token"
            );
            assert_ne!(a[s][t - 1], b[s][t - 1]);
        }
    }

    #[test]
    fn oom_texts_are_recognised() {
        assert!(is_oom("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"));
        assert!(is_oom("OutOfMemory"));
        assert!(!is_oom("shape mismatch in matmul"));
    }
}
