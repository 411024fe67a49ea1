//! Gradient checks of the fused ops: each op's forward and backward on a device
//! (CPU or CUDA, f32 or bf16) against the unfused candle composition
//! differentiated by candle's autograd, computed on the CPU in f32 from the
//! same inputs. Run by the unit tests (CPU) and by `orch-agent check-kernels`
//! on a GPU (scripts/bench-gpu.sh).

use super::*;
use candle_core::{Var, D};

/// One compared output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub op: String,
    /// max |fused - reference| / max(|reference|, 1e-6): error relative to the output's scale.
    pub rel_err: f64,
    pub tolerance: f64,
    pub ok: bool,
}

/// Tolerance for a device and dtype: f32 on the CPU sums in the same order as
/// the reference but not the same association; on a GPU `__expf` and warp-order
/// sums differ by a few ulps; bf16 keeps 8 bits of mantissa.
pub fn tolerance(device: &Device, dtype: DType) -> f64 {
    match (dtype, device.is_cpu()) {
        (DType::BF16, _) => 3e-2,
        (_, true) => 1e-4,
        (_, false) => 2e-3,
    }
}

pub(crate) fn compare(op: &str, got: &Tensor, want: &Tensor, tol: f64) -> Result<Check> {
    let vec = |t: &Tensor| -> Result<Vec<f32>> {
        t.to_device(&Device::Cpu)?
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()
    };
    let (got, want) = (vec(got)?, vec(want)?);
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs() as f64)).max(1e-6);
    // A NaN anywhere, or a shape mismatch, is an infinite error (a plain max
    // would skip NaNs).
    let diff = if got.len() != want.len() {
        f64::INFINITY
    } else {
        got.iter().zip(&want).fold(0f64, |m, (a, b)| {
            let d = (*a as f64 - *b as f64).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                m.max(d)
            }
        })
    };
    let rel_err = diff / scale;
    Ok(Check {
        op: op.to_string(),
        rel_err,
        tolerance: tol,
        ok: rel_err <= tol,
    })
}

/// Seeded normal values on the CPU, f32 (candle's CPU generator cannot be seeded).
pub(crate) fn randn(seed: u64, shape: impl Into<Shape>, std: f32) -> Result<Tensor> {
    use rand::SeedableRng;
    use rand_distr::{Distribution, Normal};
    let shape = shape.into();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let normal = Normal::new(0f32, std).map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    let v: Vec<f32> = (0..shape.elem_count()).map(|_| normal.sample(&mut rng)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
}

/// Values as the device would hold them: rounded to `dtype` and back, so the
/// reference sees exactly the fused op's inputs.
fn held(t: &Tensor, dtype: DType) -> Result<Tensor> {
    t.to_dtype(dtype)?.to_dtype(DType::F32)
}

fn on(t: &Tensor, device: &Device, dtype: DType) -> Result<Tensor> {
    t.to_dtype(dtype)?.to_device(device)
}

/// Reference gradients: `f` of the variables, differentiated against the
/// upstream gradient `up` (loss = sum(f(..) · up)).
fn reference(
    vars: &[Tensor],
    up: &Tensor,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) -> Result<(Tensor, Vec<Tensor>)> {
    let vars: Vec<Var> = vars.iter().map(Var::from_tensor).collect::<Result<_>>()?;
    let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
    let y = f(&ts)?;
    let loss = (y.clone() * up)?.sum_all()?;
    let g = loss.backward()?;
    let grads = ts
        .iter()
        .map(|t| {
            g.get(t)
                .cloned()
                .ok_or_else(|| candle_core::Error::Msg("reference has no gradient".into()))
        })
        .collect::<Result<_>>()?;
    Ok((y.detach(), grads))
}

fn ref_layer_norm(x: &Tensor, g: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let c = x.broadcast_sub(&mean)?;
    let var = c.sqr()?.mean_keepdim(D::Minus1)?;
    c.broadcast_div(&(var + LN_EPS as f64)?.sqrt()?)?
        .broadcast_mul(g)?
        .broadcast_add(b)
}

fn causal_mask(t: usize) -> Result<Tensor> {
    let m: Vec<f32> = (0..t * t)
        .map(|i| if i % t > i / t { -1e9 } else { 0.0 })
        .collect();
    Tensor::from_vec(m, (t, t), &Device::Cpu)
}

fn ref_softmax(s: &Tensor, scale: f64, mask: &Tensor) -> Result<Tensor> {
    let x = (s * scale)?.broadcast_add(mask)?;
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(D::Minus1)?)
}

fn ref_gelu(u: &Tensor) -> Result<Tensor> {
    // candle's `gelu` is the tanh approximation.
    u.gelu()
}

fn ref_attention(qkv: &Tensor, b: usize, t: usize, h: usize) -> Result<Tensor> {
    let d = qkv.dim(1)? / 3;
    let e = d / h;
    let x = qkv.reshape((b, t, 3, h, e))?;
    let part = |i: usize| x.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2)?.contiguous();
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    let s = q.matmul(&k.t()?)?;
    let p = ref_softmax(&s, 1.0 / (e as f64).sqrt(), &causal_mask(t)?)?;
    p.matmul(&v)?.transpose(1, 2)?.contiguous()?.reshape((b * t, d))
}

fn ref_cross_entropy(x: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let s = x.broadcast_sub(&max)?;
    let lse = s.exp()?.sum_keepdim(D::Minus1)?.log()?;
    s.broadcast_sub(&lse)?
        .gather(&targets.unsqueeze(1)?, D::Minus1)?
        .squeeze(1)?
        .neg()
}

/// Every op, forward and backward, on `device` in `dtype`: once with sizes
/// that take the kernels' 16-byte vector path, once with odd sizes that take
/// the element-by-element one.
pub fn run_all(device: &Device, dtype: DType) -> Result<Vec<Check>> {
    let mut out = run_sizes(device, dtype, (2, 24, 2, 8), 40, "")?;
    out.extend(run_sizes(device, dtype, (3, 13, 3, 5), 37, "odd.")?);
    // Long rows (no mask): the CUDA softmax keeps a row of up to 1024 (f32) or
    // 2048 (bf16) elements in registers and loops over longer ones.
    let tol = tolerance(device, dtype);
    for n in [1600usize, 2400] {
        let s = held(&randn(20 + n as u64, (2, 3, n), 2.0)?, dtype)?;
        let up = held(&randn(21 + n as u64, (2, 3, n), 1.0)?, dtype)?;
        let zeros = Tensor::zeros(n, DType::F32, &Device::Cpu)?;
        let (y, gr) = reference(std::slice::from_ref(&s), &up, |v| ref_softmax(&v[0], 0.5, &zeros))?;
        let (sd, ud) = (on(&s, device, dtype)?, on(&up, device, dtype)?);
        let p = softmax(&sd, 0.5, false)?;
        out.push(compare(&format!("softmax.n{n}"), &p, &y, tol)?);
        out.push(compare(
            &format!("softmax.n{n}.dx"),
            &softmax_bwd(&p, &ud, 0.5, false)?,
            &gr[0],
            tol,
        )?);
    }
    Ok(out)
}

fn run_sizes(
    device: &Device,
    dtype: DType,
    (b, t, h, e): (usize, usize, usize, usize),
    vocab: usize,
    tag: &str,
) -> Result<Vec<Check>> {
    let tol = tolerance(device, dtype);
    let mut out = Vec::new();
    let (d, f, rows) = (h * e, 4 * h * e, b * t);

    // Layer norm.
    let x = held(&randn(1, (rows, d), 1.0)?.affine(1.0, 0.3)?, dtype)?;
    let g = held(&randn(2, d, 0.2)?.affine(1.0, 1.0)?, dtype)?;
    let bb = held(&randn(3, d, 0.2)?, dtype)?;
    let up = held(&randn(4, (rows, d), 1.0)?, dtype)?;
    let (y, gr) = reference(&[x.clone(), g.clone(), bb.clone()], &up, |v| {
        ref_layer_norm(&v[0], &v[1], &v[2])
    })?;
    let (xd, gd, bd, ud) = (
        on(&x, device, dtype)?,
        on(&g, device, dtype)?,
        on(&bb, device, dtype)?,
        on(&up, device, dtype)?,
    );
    out.push(compare(
        &format!("{tag}layer_norm"),
        &layer_norm(&xd, &gd, &bd)?,
        &y,
        tol,
    )?);
    let (dx, dg, db) = layer_norm_bwd(&xd, &gd, &ud)?;
    out.push(compare(&format!("{tag}layer_norm.dx"), &dx, &gr[0], tol)?);
    out.push(compare(&format!("{tag}layer_norm.dgain"), &dg, &gr[1], tol)?);
    out.push(compare(&format!("{tag}layer_norm.dbias"), &db, &gr[2], tol)?);

    // Bias + GELU, bias add.
    let hh = held(&randn(5, (rows, f), 1.0)?, dtype)?;
    let bf = held(&randn(6, f, 0.5)?, dtype)?;
    let upf = held(&randn(7, (rows, f), 1.0)?, dtype)?;
    let (hd, bfd, upd) = (
        on(&hh, device, dtype)?,
        on(&bf, device, dtype)?,
        on(&upf, device, dtype)?,
    );
    let (y, gr) = reference(&[hh.clone(), bf.clone()], &upf, |v| {
        ref_gelu(&v[0].broadcast_add(&v[1])?)
    })?;
    out.push(compare(
        &format!("{tag}bias_gelu"),
        &bias_gelu(&hd, &bfd)?,
        &y,
        tol,
    )?);
    let dh = bias_gelu_bwd(&hd, &bfd, &upd)?;
    out.push(compare(&format!("{tag}bias_gelu.dh"), &dh, &gr[0], tol)?);
    out.push(compare(
        &format!("{tag}bias_gelu.dbias"),
        &col_sum(&dh)?,
        &gr[1],
        tol,
    )?);
    let (y, gr) = reference(&[hh.clone(), bf.clone()], &upf, |v| v[0].broadcast_add(&v[1]))?;
    out.push(compare(
        &format!("{tag}bias_add"),
        &bias_add(&hd, &bfd)?,
        &y,
        tol,
    )?);
    out.push(compare(
        &format!("{tag}bias_add.dbias"),
        &col_sum(&upd)?,
        &gr[1],
        tol,
    )?);

    // Scale + causal mask + softmax over [b, h, t, t].
    let s = held(&randn(8, (b, h, t, t), 2.0)?, dtype)?;
    let ups = held(&randn(9, (b, h, t, t), 1.0)?, dtype)?;
    let scale = 0.35f32;
    let (y, gr) = reference(std::slice::from_ref(&s), &ups, |v| {
        ref_softmax(&v[0], scale as f64, &causal_mask(t)?)
    })?;
    let (sd, upsd) = (on(&s, device, dtype)?, on(&ups, device, dtype)?);
    let p = softmax(&sd, scale, true)?;
    out.push(compare(&format!("{tag}causal_softmax"), &p, &y, tol)?);
    out.push(compare(
        "causal_softmax.dx",
        &softmax_bwd(&p, &upsd, scale, true)?,
        &gr[0],
        tol,
    )?);

    // Attention over qkv [b·t, 3d].
    let qkv = held(&randn(10, (rows, 3 * d), 1.0)?, dtype)?;
    let upa = held(&randn(11, (rows, d), 1.0)?, dtype)?;
    let (y, gr) = reference(std::slice::from_ref(&qkv), &upa, |v| {
        ref_attention(&v[0], b, t, h)
    })?;
    let (qd, uad) = (on(&qkv, device, dtype)?, on(&upa, device, dtype)?);
    out.push(compare(
        &format!("{tag}attention"),
        &attention(&qd, b, t, h)?,
        &y,
        tol,
    )?);
    out.push(compare(
        "attention.dqkv",
        &attention_bwd(&qd, &uad, b, t, h)?,
        &gr[0],
        tol,
    )?);

    // Cross-entropy (rows weighted by an upstream gradient).
    let logits = held(&randn(12, (rows, vocab), 2.0)?, dtype)?;
    let targets: Vec<u32> = (0..rows).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
    let targets = Tensor::from_vec(targets, rows, &Device::Cpu)?;
    let upl = randn(13, rows, 1.0)?;
    let (y, gr) = reference(std::slice::from_ref(&logits), &upl, |v| {
        ref_cross_entropy(&v[0], &targets)
    })?;
    let (ld, td) = (on(&logits, device, dtype)?, targets.to_device(device)?);
    let loss = cross_entropy(&ld, &td)?;
    out.push(compare(&format!("{tag}cross_entropy"), &loss, &y, tol)?);
    let dl = cross_entropy_bwd(&ld, &td, &loss, &upl.to_device(device)?)?;
    out.push(compare(&format!("{tag}cross_entropy.dlogits"), &dl, &gr[0], tol)?);

    // Token + position embedding.
    let wte = held(&randn(14, (vocab, d), 1.0)?, dtype)?;
    let wpe = held(&randn(15, (t, d), 1.0)?, dtype)?;
    let upe = held(&randn(16, (rows, d), 1.0)?, dtype)?;
    let (y, gr) = reference(&[wte.clone(), wpe.clone()], &upe, |v| {
        v[0].index_select(&targets, 0)?
            .reshape((b, t, d))?
            .broadcast_add(&v[1])?
            .reshape((rows, d))
    })?;
    let (ed, pd, ued) = (
        on(&wte, device, dtype)?,
        on(&wpe, device, dtype)?,
        on(&upe, device, dtype)?,
    );
    out.push(compare(&format!("{tag}embed"), &embed(&ed, &pd, &td)?, &y, tol)?);
    let (dwte, dwpe) = embed_bwd(&ued, &td, vocab, t)?;
    out.push(compare(&format!("{tag}embed.dwte"), &dwte, &gr[0], tol)?);
    out.push(compare(&format!("{tag}embed.dwpe"), &dwpe, &gr[1], tol)?);

    // The custom ops under candle's autograd give the same gradients.
    let xv = Var::from_tensor(&xd)?;
    let y = xv.as_tensor().apply_op3(&gd, &bd, LayerNorm)?;
    let g = (y * &ud)?.sum_all()?.backward()?;
    let (dx, _, _) = layer_norm_bwd(&xd, &gd, &ud)?;
    let got = g
        .get(xv.as_tensor())
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg("no gradient".into()))?;
    out.push(compare(&format!("{tag}layer_norm.autograd"), &got, &dx, tol)?);
    let qv = Var::from_tensor(&qd)?;
    let y = qv.as_tensor().apply_op1(Attention {
        batch: b,
        context: t,
        heads: h,
    })?;
    let g = (y * &uad)?.sum_all()?.backward()?;
    let got = g
        .get(qv.as_tensor())
        .cloned()
        .ok_or_else(|| candle_core::Error::Msg("no gradient".into()))?;
    out.push(compare(
        "attention.autograd",
        &got,
        &attention_bwd(&qd, &uad, b, t, h)?,
        tol,
    )?);
    Ok(out)
}
