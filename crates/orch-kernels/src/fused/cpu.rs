//! The fused ops on the CPU, in f32: the reference the CUDA kernels are
//! checked against, and the CPU path of the builtin transformer.

pub(super) fn gelu(u: f32) -> f32 {
    0.5 * u * (1.0 + (0.797_884_6 * (u + 0.044_715 * u * u * u)).tanh())
}

fn gelu_grad(u: f32) -> f32 {
    let th = (0.797_884_6 * (u + 0.044_715 * u * u * u)).tanh();
    0.5 * (1.0 + th) + 0.5 * u * (1.0 - th * th) * 0.797_884_6 * (1.0 + 3.0 * 0.044_715 * u * u)
}

/// Keys a row may see: all of them, or up to its query position (`row % t`).
fn valid(row: usize, n: usize, t: usize, causal: bool) -> usize {
    if causal {
        n.min(row % t + 1)
    } else {
        n
    }
}

pub fn softmax(x: &[f32], n: usize, t: usize, scale: f32, causal: bool) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (row, (xr, yr)) in x.chunks(n).zip(y.chunks_mut(n)).enumerate() {
        let m = valid(row, n, t, causal);
        let max = xr[..m].iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v * scale));
        let mut sum = 0f32;
        for j in 0..m {
            yr[j] = (xr[j] * scale - max).exp();
            sum += yr[j];
        }
        yr[..m].iter_mut().for_each(|v| *v /= sum);
    }
    y
}

pub fn softmax_bwd(p: &[f32], dp: &[f32], n: usize, t: usize, scale: f32, causal: bool) -> Vec<f32> {
    let mut ds = vec![0f32; p.len()];
    for (row, ((pr, dr), sr)) in p.chunks(n).zip(dp.chunks(n)).zip(ds.chunks_mut(n)).enumerate() {
        let m = valid(row, n, t, causal);
        let dot: f32 = (0..m).map(|j| pr[j] * dr[j]).sum();
        for j in 0..m {
            sr[j] = scale * pr[j] * (dr[j] - dot);
        }
    }
    ds
}

fn stats(xr: &[f32], eps: f32) -> (f32, f32) {
    let d = xr.len() as f32;
    let mean = xr.iter().sum::<f32>() / d;
    let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
    (mean, 1.0 / (var + eps).sqrt())
}

pub fn layer_norm(x: &[f32], g: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
    let d = g.len();
    let mut y = vec![0f32; x.len()];
    for (xr, yr) in x.chunks(d).zip(y.chunks_mut(d)) {
        let (mean, rstd) = stats(xr, eps);
        for j in 0..d {
            yr[j] = (xr[j] - mean) * rstd * g[j] + b[j];
        }
    }
    y
}

/// (dx, dg, db)
pub fn layer_norm_bwd(x: &[f32], g: &[f32], dy: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let d = g.len();
    let (mut dx, mut dg, mut db) = (vec![0f32; x.len()], vec![0f32; d], vec![0f32; d]);
    for ((xr, dr), or) in x.chunks(d).zip(dy.chunks(d)).zip(dx.chunks_mut(d)) {
        let (mean, rstd) = stats(xr, eps);
        let xhat: Vec<f32> = xr.iter().map(|v| (v - mean) * rstd).collect();
        let (mut s1, mut s2) = (0f32, 0f32);
        for j in 0..d {
            let dgj = dr[j] * g[j];
            s1 += dgj;
            s2 += dgj * xhat[j];
            dg[j] += dr[j] * xhat[j];
            db[j] += dr[j];
        }
        let (s1, s2) = (s1 / d as f32, s2 / d as f32);
        for j in 0..d {
            or[j] = rstd * (dr[j] * g[j] - s1 - xhat[j] * s2);
        }
    }
    (dx, dg, db)
}

pub fn bias_act(h: &[f32], b: &[f32], gelu_on: bool) -> Vec<f32> {
    let f = b.len();
    h.iter()
        .enumerate()
        .map(|(i, v)| {
            let u = v + b[i % f];
            if gelu_on {
                gelu(u)
            } else {
                u
            }
        })
        .collect()
}

pub fn bias_gelu_bwd(h: &[f32], b: &[f32], dy: &[f32]) -> Vec<f32> {
    let f = b.len();
    h.iter()
        .zip(dy)
        .enumerate()
        .map(|(i, (v, d))| d * gelu_grad(v + b[i % f]))
        .collect()
}

pub fn col_sum(x: &[f32], d: usize) -> Vec<f32> {
    let mut out = vec![0f32; d];
    for r in x.chunks(d) {
        out.iter_mut().zip(r).for_each(|(o, v)| *o += v);
    }
    out
}

pub fn cross_entropy(x: &[f32], targets: &[u32], n: usize) -> Vec<f32> {
    x.chunks(n)
        .zip(targets)
        .map(|(r, &t)| {
            let max = r.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
            let lse = max + r.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
            lse - r[t as usize]
        })
        .collect()
}

pub fn cross_entropy_bwd(x: &[f32], targets: &[u32], loss: &[f32], g: &[f32], n: usize) -> Vec<f32> {
    let mut dx = vec![0f32; x.len()];
    for (row, (r, o)) in x.chunks(n).zip(dx.chunks_mut(n)).enumerate() {
        let t = targets[row] as usize;
        let lse = loss[row] + r[t];
        for j in 0..n {
            o[j] = ((r[j] - lse).exp() - if j == t { 1.0 } else { 0.0 }) * g[row];
        }
    }
    dx
}

pub fn embed(wte: &[f32], wpe: &[f32], tokens: &[u32], d: usize, t: usize) -> Vec<f32> {
    let mut y = vec![0f32; tokens.len() * d];
    for (row, (yr, &tok)) in y.chunks_mut(d).zip(tokens).enumerate() {
        let (e, p) = (&wte[tok as usize * d..][..d], &wpe[(row % t) * d..][..d]);
        for j in 0..d {
            yr[j] = e[j] + p[j];
        }
    }
    y
}

/// (dwte [vocab, d], dwpe [t, d])
pub fn embed_bwd(dy: &[f32], tokens: &[u32], vocab: usize, d: usize, t: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut dwte, mut dwpe) = (vec![0f32; vocab * d], vec![0f32; t * d]);
    for (row, (dr, &tok)) in dy.chunks(d).zip(tokens).enumerate() {
        let e = &mut dwte[tok as usize * d..][..d];
        e.iter_mut().zip(dr).for_each(|(o, v)| *o += v);
        let p = &mut dwpe[(row % t) * d..][..d];
        p.iter_mut().zip(dr).for_each(|(o, v)| *o += v);
    }
    (dwte, dwpe)
}
