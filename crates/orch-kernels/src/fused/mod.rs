//! Fused transformer ops with their backward: scale + causal mask + softmax,
//! layer norm, bias + tanh-GELU, bias add (its gradient a column sum),
//! cross-entropy, token + position embedding, and causal self-attention built
//! from them.
//!
//! Each op has a forward and a backward function on tensors (detached: no
//! candle graph is recorded) with a CUDA path (kernels.cu, f32 and bf16 with
//! f32 arithmetic) and a CPU path (f32 loops in `cpu.rs`), and a candle
//! `CustomOp` whose `bwd` calls the same backward, so the ops also work under
//! `Tensor::backward`. The builtin transformer calls the forward and backward
//! functions directly (its backward is written out, see transformer.rs).

pub mod check;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::{op::BackpropOp, Storage};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor,
};

/// Layer-norm epsilon, as PyTorch's default.
pub const LN_EPS: f32 = 1e-5;

/// Whether the fused path serves this dtype (f16 and others use the unfused
/// composition).
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16)
}

/// Milliseconds NVRTC took to compile the kernels in this process (CUDA only,
/// once they have been compiled).
pub fn compile_ms() -> Option<f64> {
    #[cfg(feature = "cuda")]
    {
        cuda::compile_ms()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

// ---- helpers ----

fn f32s(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()
}

fn u32s(t: &Tensor) -> Result<Vec<u32>> {
    t.flatten_all()?.to_vec1::<u32>()
}

fn cpu_tensor(v: Vec<f32>, shape: impl Into<Shape>, dtype: DType) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)
}

fn last2(t: &Tensor) -> Result<(usize, usize)> {
    let n = t.dim(candle_core::D::Minus1)?;
    Ok((t.elem_count() / n.max(1), n))
}

#[cfg(feature = "cuda")]
fn cuda_tensor(s: candle_core::CudaStorage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Storage::Cuda(s), shape, BackpropOp::none(), false)
}

/// Runs `$body` with `$s`/`$l` bound to the CUDA storage and layout of each
/// tensor when the first is on a CUDA device; evaluates to `None` otherwise.
macro_rules! on_cuda {
    ($first:ident, [$(($t:ident, $s:ident, $l:ident)),*], $body:block) => {{
        #[cfg(feature = "cuda")]
        {
            if $first.device().is_cuda() {
                $(
                    let $t = $t.contiguous()?;
                    let (guard, $l) = $t.storage_and_layout();
                    let $s = match &*guard {
                        Storage::Cuda(s) => s,
                        _ => candle_core::bail!("fused op: operands on different devices"),
                    };
                )*
                Some($body)
            } else {
                None
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            None::<Result<Tensor>>
        }
    }};
}

// ---- softmax ----

/// softmax(scale · x) over the last dimension; with `causal`, position j of a
/// row whose query position (second-to-last index) is i gets 0 when j > i.
pub fn softmax(x: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    let shape = x.shape().clone();
    if let Some(r) = on_cuda!(x, [(x, s, l)], {
        let out = cuda::softmax(s, l, scale, causal, false)?;
        out.map(|o| cuda_tensor(o, shape.clone()))
            .ok_or_else(|| candle_core::Error::Msg("softmax produced nothing".into()))
    }) {
        return r;
    }
    let (_, n) = last2(x)?;
    let t = x.dims().iter().rev().nth(1).copied().unwrap_or(1);
    cpu_tensor(cpu::softmax(&f32s(x)?, n, t, scale, causal), shape, x.dtype())
}

/// [`softmax`] written over `x` itself on CUDA (the caller owns `x` alone).
fn softmax_in_place(x: Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() && x.is_contiguous() {
        {
            let (guard, l) = x.storage_and_layout();
            if let Storage::Cuda(s) = &*guard {
                cuda::softmax(s, l, scale, causal, true)?;
            }
        }
        return Ok(x);
    }
    softmax(&x, scale, causal)
}

/// Gradient of [`softmax`]'s input from its output `p` and `dp`.
pub fn softmax_bwd(p: &Tensor, dp: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    let shape = p.shape().clone();
    if let Some(r) = on_cuda!(p, [(p, ps, pl), (dp, ds, dl)], {
        let out = cuda::softmax_bwd(ps, pl, ds, dl, scale, causal, false)?;
        out.map(|o| cuda_tensor(o, shape.clone()))
            .ok_or_else(|| candle_core::Error::Msg("softmax_bwd produced nothing".into()))
    }) {
        return r;
    }
    let (_, n) = last2(p)?;
    let t = p.dims().iter().rev().nth(1).copied().unwrap_or(1);
    let out = cpu::softmax_bwd(&f32s(p)?, &f32s(dp)?, n, t, scale, causal);
    cpu_tensor(out, shape, p.dtype())
}

/// [`softmax_bwd`] written over `dp` on CUDA (the caller owns `dp` alone).
fn softmax_bwd_in_place(p: &Tensor, dp: Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if dp.device().is_cuda() && dp.is_contiguous() {
        let p = p.contiguous()?;
        {
            let (pg, pl) = p.storage_and_layout();
            let (dg, dl) = dp.storage_and_layout();
            if let (Storage::Cuda(ps), Storage::Cuda(ds)) = (&*pg, &*dg) {
                cuda::softmax_bwd(ps, pl, ds, dl, scale, causal, true)?;
            }
        }
        return Ok(dp);
    }
    softmax_bwd(p, &dp, scale, causal)
}

// ---- layer norm ----

/// Layer norm over the last dimension with gain `g` and bias `b`.
pub fn layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let shape = x.shape().clone();
    if let Some(r) = on_cuda!(x, [(x, xs, xl), (g, gs, gl), (b, bs, bl)], {
        Ok(cuda_tensor(
            cuda::layer_norm(xs, xl, gs, gl, bs, bl, LN_EPS)?,
            shape.clone(),
        ))
    }) {
        return r;
    }
    let out = cpu::layer_norm(&f32s(x)?, &f32s(g)?, &f32s(b)?, LN_EPS);
    cpu_tensor(out, shape, x.dtype())
}

/// (dx, dg, db) of [`layer_norm`]; dg and db are reduced in f32.
pub fn layer_norm_bwd(x: &Tensor, g: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (shape, gshape, dt) = (x.shape().clone(), g.shape().clone(), x.dtype());
    #[cfg(feature = "cuda")]
    if x.device().is_cuda() {
        let (x, g, dy) = (x.contiguous()?, g.contiguous()?, dy.contiguous()?);
        let (xg, xl) = x.storage_and_layout();
        let (gg, gl) = g.storage_and_layout();
        let (dg_, dl) = dy.storage_and_layout();
        if let (Storage::Cuda(xs), Storage::Cuda(gs), Storage::Cuda(ds)) = (&*xg, &*gg, &*dg_) {
            let (dx, dgain, dbias) = cuda::layer_norm_bwd(xs, xl, gs, gl, ds, dl, LN_EPS)?;
            return Ok((
                cuda_tensor(dx, shape),
                cuda_tensor(dgain, gshape.clone()),
                cuda_tensor(dbias, gshape),
            ));
        }
        candle_core::bail!("fused op: operands on different devices")
    }
    let (dx, dg, db) = cpu::layer_norm_bwd(&f32s(x)?, &f32s(g)?, &f32s(dy)?, LN_EPS);
    Ok((
        cpu_tensor(dx, shape, dt)?,
        cpu_tensor(dg, gshape.clone(), dt)?,
        cpu_tensor(db, gshape, dt)?,
    ))
}

// ---- bias, GELU ----

fn bias_act(h: &Tensor, b: &Tensor, gelu: bool) -> Result<Tensor> {
    let shape = h.shape().clone();
    if let Some(r) = on_cuda!(h, [(h, hs, hl), (b, bs, bl)], {
        Ok(cuda_tensor(cuda::bias_act(hs, hl, bs, bl, gelu)?, shape.clone()))
    }) {
        return r;
    }
    cpu_tensor(cpu::bias_act(&f32s(h)?, &f32s(b)?, gelu), shape, h.dtype())
}

/// `h + b`, `b` broadcast over the rows of `h` [rows, f].
pub fn bias_add(h: &Tensor, b: &Tensor) -> Result<Tensor> {
    bias_act(h, b, false)
}

/// tanh-GELU of `h + b`.
pub fn bias_gelu(h: &Tensor, b: &Tensor) -> Result<Tensor> {
    bias_act(h, b, true)
}

/// Gradient of [`bias_gelu`] with respect to `h` (the bias gradient is its [`col_sum`]).
pub fn bias_gelu_bwd(h: &Tensor, b: &Tensor, dy: &Tensor) -> Result<Tensor> {
    let shape = h.shape().clone();
    if let Some(r) = on_cuda!(h, [(h, hs, hl), (b, bs, bl), (dy, ds, dl)], {
        Ok(cuda_tensor(
            cuda::bias_gelu_bwd(hs, hl, bs, bl, ds, dl)?,
            shape.clone(),
        ))
    }) {
        return r;
    }
    cpu_tensor(
        cpu::bias_gelu_bwd(&f32s(h)?, &f32s(b)?, &f32s(dy)?),
        shape,
        h.dtype(),
    )
}

/// Sum over the rows of `x` [rows, d], accumulated in f32: a bias gradient.
pub fn col_sum(x: &Tensor) -> Result<Tensor> {
    let d = x.dim(candle_core::D::Minus1)?;
    if let Some(r) = on_cuda!(x, [(x, xs, xl)], { Ok(cuda_tensor(cuda::col_sum(xs, xl)?, d)) }) {
        return r;
    }
    cpu_tensor(cpu::col_sum(&f32s(x)?, d), d, x.dtype())
}

// ---- cross-entropy ----

/// Per-row cross-entropy (f32, [rows]) of `logits` [rows, vocab] against u32 `targets` [rows].
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (rows, n) = last2(logits)?;
    if let Some(r) = on_cuda!(logits, [(logits, xs, xl), (targets, ts, tl)], {
        Ok(cuda_tensor(cuda::cross_entropy(xs, xl, ts, tl)?, rows))
    }) {
        return r;
    }
    let loss = cpu::cross_entropy(&f32s(logits)?, &u32s(targets)?, n);
    cpu_tensor(loss, rows, DType::F32)
}

/// Gradient of the per-row losses' weighted sum (weights `g`, f32 [rows]) with
/// respect to the logits, from the forward's losses.
pub fn cross_entropy_bwd(logits: &Tensor, targets: &Tensor, loss: &Tensor, g: &Tensor) -> Result<Tensor> {
    let shape = logits.shape().clone();
    if let Some(r) = on_cuda!(
        logits,
        [(logits, xs, xl), (targets, ts, tl), (loss, ls, ll), (g, gs, gl)],
        {
            Ok(cuda_tensor(
                cuda::cross_entropy_bwd(xs, xl, ts, tl, ls, ll, gs, gl)?,
                shape.clone(),
            ))
        }
    ) {
        return r;
    }
    let (_, n) = last2(logits)?;
    let out = cpu::cross_entropy_bwd(&f32s(logits)?, &u32s(targets)?, &f32s(loss)?, &f32s(g)?, n);
    cpu_tensor(out, shape, logits.dtype())
}

// ---- embeddings ----

/// `wte[tokens] + wpe[i % t]` for token i: [tokens, d], with t the rows of `wpe`.
pub fn embed(wte: &Tensor, wpe: &Tensor, tokens: &Tensor) -> Result<Tensor> {
    let (t, d) = wpe.dims2()?;
    let rows = tokens.elem_count();
    if let Some(r) = on_cuda!(wte, [(wte, es, el), (wpe, ps, pl), (tokens, ts, tl)], {
        Ok(cuda_tensor(cuda::embed(es, el, ps, pl, ts, tl)?, (rows, d)))
    }) {
        return r;
    }
    let out = cpu::embed(&f32s(wte)?, &f32s(wpe)?, &u32s(tokens)?, d, t);
    cpu_tensor(out, (rows, d), wte.dtype())
}

/// (dwte, dwpe) of [`embed`].
pub fn embed_bwd(dy: &Tensor, tokens: &Tensor, vocab: usize, t: usize) -> Result<(Tensor, Tensor)> {
    let d = dy.dim(1)?;
    #[cfg(feature = "cuda")]
    if dy.device().is_cuda() {
        let (dy, tokens) = (dy.contiguous()?, tokens.contiguous()?);
        let (dg, dl) = dy.storage_and_layout();
        let (tg, tl) = tokens.storage_and_layout();
        if let (Storage::Cuda(ds), Storage::Cuda(ts)) = (&*dg, &*tg) {
            let (a, b) = cuda::embed_bwd(ds, dl, ts, tl, vocab, t)?;
            return Ok((cuda_tensor(a, (vocab, d)), cuda_tensor(b, (t, d))));
        }
        candle_core::bail!("fused op: operands on different devices")
    }
    let (a, b) = cpu::embed_bwd(&f32s(dy)?, &u32s(tokens)?, vocab, d, t);
    Ok((
        cpu_tensor(a, (vocab, d), dy.dtype())?,
        cpu_tensor(b, (t, d), dy.dtype())?,
    ))
}

// ---- attention ----

/// [b·t, parts·h·e] → [parts, b, h, t, e] (contiguous).
fn split_heads(x: &Tensor, b: usize, t: usize, parts: usize, h: usize) -> Result<Tensor> {
    let e = x.dim(1)? / (parts * h);
    if let Some(r) = on_cuda!(x, [(x, xs, xl)], {
        Ok(cuda_tensor(
            cuda::heads(xs, xl, b, t, parts, h, e, true)?,
            (parts, b, h, t, e),
        ))
    }) {
        return r;
    }
    x.reshape((b, t, parts, h, e))?
        .permute((2, 0, 3, 1, 4))?
        .contiguous()
}

/// [parts, b, h, t, e] → [b·t, parts·h·e].
fn merge_heads(x: &Tensor) -> Result<Tensor> {
    let (parts, b, h, t, e) = x.dims5()?;
    if let Some(r) = on_cuda!(x, [(x, xs, xl)], {
        Ok(cuda_tensor(
            cuda::heads(xs, xl, b, t, parts, h, e, false)?,
            (b * t, parts * h * e),
        ))
    }) {
        return r;
    }
    x.permute((1, 3, 0, 2, 4))?
        .contiguous()?
        .reshape((b * t, parts * h * e))
}

/// Causal self-attention of `qkv` [b·t, 3·d] (queries, keys, values side by
/// side, `heads` heads each) → [b·t, d]. The probabilities are not kept: the
/// backward recomputes them (one batched matmul and a softmax).
pub fn attention(qkv: &Tensor, b: usize, t: usize, heads: usize) -> Result<Tensor> {
    let parts = split_heads(qkv, b, t, 3, heads)?;
    let (q, k, v) = (parts.get(0)?, parts.get(1)?, parts.get(2)?);
    let scale = 1.0 / (q.dim(3)? as f32).sqrt();
    let p = softmax_in_place(q.matmul(&k.t()?)?, scale, true)?;
    merge_heads(&p.matmul(&v)?.unsqueeze(0)?)
}

/// Gradient of [`attention`] with respect to `qkv`, from the output's gradient `da` [b·t, d].
pub fn attention_bwd(qkv: &Tensor, da: &Tensor, b: usize, t: usize, heads: usize) -> Result<Tensor> {
    let parts = split_heads(qkv, b, t, 3, heads)?;
    let (q, k, v) = (parts.get(0)?, parts.get(1)?, parts.get(2)?);
    let scale = 1.0 / (q.dim(3)? as f32).sqrt();
    let p = softmax_in_place(q.matmul(&k.t()?)?, scale, true)?;
    let d_o = split_heads(da, b, t, 1, heads)?.squeeze(0)?;
    let dv = p.t()?.matmul(&d_o)?;
    let ds = softmax_bwd_in_place(&p, d_o.matmul(&v.t()?)?, scale, true)?;
    drop(p);
    let dq = ds.matmul(&k)?;
    let dk = ds.t()?.matmul(&q)?;
    drop(ds);
    merge_heads(&Tensor::stack(&[dq, dk, dv], 0)?)
}

// ---- candle custom ops (forward and backward) ----

/// Runs a tensor-level forward on a CPU storage (a copy: the CPU path is the
/// reference, not the fast one).
fn cpu_input(s: &CpuStorage, l: &Layout) -> Result<Tensor> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| candle_core::Error::Msg("fused op input is not contiguous".into()))?;
    let shape = l.shape().clone();
    match s {
        CpuStorage::F32(v) => Tensor::from_slice(&v[a..b], shape, &Device::Cpu),
        CpuStorage::BF16(v) => Tensor::from_slice(&v[a..b], shape, &Device::Cpu),
        CpuStorage::U32(v) => Tensor::from_slice(&v[a..b], shape, &Device::Cpu),
        other => candle_core::bail!(
            "fused ops support f32, bf16 and u32 inputs, not {:?}",
            other.dtype()
        ),
    }
}

fn cpu_output(t: Tensor) -> Result<(CpuStorage, Shape)> {
    let shape = t.shape().clone();
    let flat = t.flatten_all()?;
    let s = match t.dtype() {
        DType::F32 => CpuStorage::F32(flat.to_vec1()?),
        DType::BF16 => CpuStorage::BF16(flat.to_vec1()?),
        other => candle_core::bail!("fused op produced {other:?}"),
    };
    Ok((s, shape))
}

#[cfg(feature = "cuda")]
fn cuda_input(s: &candle_core::CudaStorage, l: &Layout) -> Result<Tensor> {
    // A view of the caller's storage would need shared ownership candle does not
    // expose; a device copy is cheap next to the kernels and only the autograd
    // route (not the builtin transformer) takes it.
    use candle_core::backend::{BackendDevice, BackendStorage};
    let mut out = s.device().zeros_impl(l.shape(), s.dtype())?;
    s.copy_strided_src(&mut out, 0, l)?;
    Ok(cuda_tensor(out, l.shape().clone()))
}

#[cfg(feature = "cuda")]
fn cuda_output(t: Tensor) -> Result<(candle_core::CudaStorage, Shape)> {
    use candle_core::backend::{BackendDevice, BackendStorage};
    let t = t.contiguous()?;
    let shape = t.shape().clone();
    let (g, l) = t.storage_and_layout();
    match &*g {
        Storage::Cuda(s) => {
            let mut out = unsafe { s.device().alloc_uninit(&shape, s.dtype())? };
            s.copy_strided_src(&mut out, 0, l)?;
            Ok((out, shape))
        }
        _ => candle_core::bail!("fused op output left the GPU"),
    }
}

/// Causal softmax of `scale · x` as a candle op with a backward.
pub struct CausalSoftmax {
    pub scale: f32,
}

impl CustomOp1 for CausalSoftmax {
    fn name(&self) -> &'static str {
        "orch-causal-softmax"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_output(softmax(&cpu_input(s, l)?, self.scale, true)?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = cuda::softmax(s, l, self.scale, true, false)?
            .ok_or_else(|| candle_core::Error::Msg("softmax produced nothing".into()))?;
        Ok((out, l.shape().clone()))
    }
    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(softmax_bwd(
            &res.detach(),
            &grad.detach(),
            self.scale,
            true,
        )?))
    }
}

/// Layer norm (x, gain, bias) as a candle op with a backward.
pub struct LayerNorm;

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "orch-layer-norm"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_output(layer_norm(
            &cpu_input(s1, l1)?,
            &cpu_input(s2, l2)?,
            &cpu_input(s3, l3)?,
        )?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            cuda::layer_norm(s1, l1, s2, l2, s3, l3, LN_EPS)?,
            l1.shape().clone(),
        ))
    }
    fn bwd(
        &self,
        x: &Tensor,
        g: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dg, db) = layer_norm_bwd(&x.detach(), &g.detach(), &grad.detach())?;
        Ok((Some(dx), Some(dg), Some(db)))
    }
}

/// `h + b` (gelu: false) or tanh-GELU(`h + b`) as a candle op with a backward.
pub struct BiasAct {
    pub gelu: bool,
}

impl CustomOp2 for BiasAct {
    fn name(&self) -> &'static str {
        if self.gelu {
            "orch-bias-gelu"
        } else {
            "orch-bias-add"
        }
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_output(bias_act(&cpu_input(s1, l1)?, &cpu_input(s2, l2)?, self.gelu)?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cuda::bias_act(s1, l1, s2, l2, self.gelu)?, l1.shape().clone()))
    }
    fn bwd(
        &self,
        h: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.detach();
        let dh = if self.gelu {
            bias_gelu_bwd(&h.detach(), &b.detach(), &grad)?
        } else {
            grad
        };
        let db = col_sum(&dh)?;
        Ok((Some(dh), Some(db)))
    }
}

/// Per-row cross-entropy (logits, u32 targets) → f32 [rows], as a candle op with a backward.
pub struct CrossEntropy;

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "orch-cross-entropy"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_output(cross_entropy(&cpu_input(s1, l1)?, &cpu_input(s2, l2)?)?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let rows = l1.shape().elem_count() / l1.dims().last().copied().unwrap_or(1).max(1);
        Ok((cuda::cross_entropy(s1, l1, s2, l2)?, Shape::from(rows)))
    }
    fn bwd(
        &self,
        x: &Tensor,
        t: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = cross_entropy_bwd(
            &x.detach(),
            &t.detach(),
            &res.detach(),
            &grad.detach().to_dtype(DType::F32)?,
        )?;
        Ok((Some(dx), None))
    }
}

/// Token + position embedding (wte, wpe, u32 tokens) as a candle op with a backward.
pub struct Embed;

impl CustomOp3 for Embed {
    fn name(&self) -> &'static str {
        "orch-embed"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        cpu_output(embed(
            &cpu_input(s1, l1)?,
            &cpu_input(s2, l2)?,
            &cpu_input(s3, l3)?,
        )?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let d = l2.dims().last().copied().unwrap_or(1);
        Ok((
            cuda::embed(s1, l1, s2, l2, s3, l3)?,
            Shape::from((l3.shape().elem_count(), d)),
        ))
    }
    fn bwd(
        &self,
        wte: &Tensor,
        wpe: &Tensor,
        tokens: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dwte, dwpe) = embed_bwd(&grad.detach(), &tokens.detach(), wte.dim(0)?, wpe.dim(0)?)?;
        Ok((Some(dwte), Some(dwpe), None))
    }
}

/// Causal self-attention over `qkv` [b·t, 3·d] as a candle op with a backward.
pub struct Attention {
    pub batch: usize,
    pub context: usize,
    pub heads: usize,
}

impl CustomOp1 for Attention {
    fn name(&self) -> &'static str {
        "orch-attention"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        cpu_output(attention(
            &cpu_input(s, l)?,
            self.batch,
            self.context,
            self.heads,
        )?)
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        cuda_output(attention(
            &cuda_input(s, l)?,
            self.batch,
            self.context,
            self.heads,
        )?)
    }
    fn bwd(&self, qkv: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let d = attention_bwd(
            &qkv.detach(),
            &grad.detach(),
            self.batch,
            self.context,
            self.heads,
        )?;
        Ok(Some(d))
    }
}
