//! Launching the fused kernels (`kernels.cu`) on candle's CUDA storages.
//!
//! The source is compiled once per process by NVRTC for the GPU's own compute
//! capability (through the cudarc that candle re-exports) and loaded as one
//! module per device by candle's custom-function cache. Inputs must be
//! contiguous (the callers make them so); outputs are fresh allocations, except
//! where a function says it writes in place.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaFunction;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result};
use std::sync::OnceLock;
use std::time::Instant;

const SRC: &str = include_str!("kernels.cu");
const MODULE: &str = "orch_fused";

static PTX: OnceLock<std::result::Result<(String, f64), String>> = OnceLock::new();

fn err(msg: impl Into<String>) -> candle_core::Error {
    candle_core::Error::Cuda(msg.into().into())
}

fn ptx(dev: &CudaDevice) -> Result<&'static str> {
    let compiled = PTX.get_or_init(|| {
        let t0 = Instant::now();
        let (major, minor) = dev
            .cuda_stream()
            .context()
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e}"))?;
        let opts = CompileOptions {
            options: vec![
                format!("--gpu-architecture=compute_{major}{minor}"),
                "--std=c++17".to_string(),
            ],
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SRC, opts)
            .map_err(|e| format!("compiling the fused kernels with NVRTC: {e:?}"))?;
        Ok((ptx.to_src(), t0.elapsed().as_secs_f64() * 1e3))
    });
    match compiled {
        Ok((src, _)) => Ok(src.as_str()),
        Err(e) => Err(err(e.clone())),
    }
}

/// Milliseconds NVRTC took to compile the kernels in this process, once done.
pub fn compile_ms() -> Option<f64> {
    PTX.get().and_then(|r| r.as_ref().ok()).map(|(_, ms)| *ms)
}

fn func(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(name, MODULE, ptx(dev)?)?
        .into_cuda_function())
}

fn suffix(dt: DType) -> Result<&'static str> {
    match dt {
        DType::F32 => Ok("f32"),
        DType::BF16 => Ok("bf16"),
        other => Err(err(format!("fused kernels support f32 and bf16, not {other:?}"))),
    }
}

/// Elements per 16-byte vector for `dt`.
fn width(dt: DType) -> usize {
    16 / dt.size_in_bytes()
}

fn launch_err(e: impl std::fmt::Display) -> candle_core::Error {
    err(format!("launching a fused kernel: {e}"))
}

fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    let (a, b) = l
        .contiguous_offsets()
        .ok_or_else(|| err("fused kernel input is not contiguous"))?;
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// Whether 16-byte vector loads are safe: every row length a multiple of the
/// vector width and every operand's offset 16-byte aligned (allocations are).
fn vec_ok(dt: DType, lens: &[usize], layouts: &[&Layout]) -> bool {
    let w = width(dt);
    lens.iter().all(|n| n % w == 0) && layouts.iter().all(|l| l.start_offset() % w == 0)
}

fn name(base: &str, dt: DType, vector: Option<bool>) -> Result<String> {
    let s = suffix(dt)?;
    Ok(match vector {
        Some(true) => format!("{base}_{s}_v"),
        Some(false) => format!("{base}_{s}_s"),
        None => format!("{base}_{s}"),
    })
}

/// The softmax kernel for rows of `n`: the register-resident one where a row
/// fits in 4 or 8 vectors a lane, else the looping one.
fn softmax_kernel(base: &str, dt: DType, n: usize, vector: bool) -> Result<String> {
    let per_lane = 32 * width(dt);
    if vector && n <= 4 * per_lane {
        return Ok(format!("{base}_{}_r4", suffix(dt)?));
    }
    if vector && n <= 8 * per_lane {
        return Ok(format!("{base}_{}_r8", suffix(dt)?));
    }
    name(base, dt, Some(vector))
}

fn grid(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(block as usize).max(1) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Rows handled by one warp each: 8 rows a block of 256 threads.
fn warp_rows(rows: usize) -> LaunchConfig {
    grid(rows * 32, 256)
}

fn alloc<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // Every kernel below writes each output element it is given.
    unsafe { dev.alloc::<T>(n) }
}

macro_rules! by_dtype {
    ($dt:expr, $T:ident, $body:block) => {
        match $dt {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            other => Err(err(format!("fused kernels support f32 and bf16, not {other:?}"))),
        }
    };
}

fn dims2(l: &Layout) -> (usize, usize) {
    let n = l.dims().last().copied().unwrap_or(1);
    (l.shape().elem_count() / n.max(1), n)
}

/// Scale + (causal) softmax over the last dimension; `t` is the number of query
/// positions (the second-to-last dimension). With `out`, writes into that
/// storage (which may be `x` itself) instead of a fresh one.
pub fn softmax(
    x: &CudaStorage,
    lx: &Layout,
    scale: f32,
    causal: bool,
    in_place: bool,
) -> Result<Option<CudaStorage>> {
    let dev = x.device().clone();
    let dt = x.dtype();
    let (rows, n) = dims2(lx);
    let t = lx.dims().iter().rev().nth(1).copied().unwrap_or(1);
    let f = func(
        &dev,
        &softmax_kernel("softmax_fwd", dt, n, vec_ok(dt, &[n], &[lx]))?,
    )?;
    by_dtype!(dt, T, {
        let xv = view::<T>(x, lx)?;
        let (rows_i, n_i, t_i, c) = (rows as i64, n as i32, t as i32, i32::from(causal));
        if in_place {
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&xv)
                .arg(&xv)
                .arg(&rows_i)
                .arg(&n_i)
                .arg(&t_i)
                .arg(&scale)
                .arg(&c);
            unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
            Ok(None)
        } else {
            let out = alloc::<T>(&dev, rows * n)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&xv)
                .arg(&out)
                .arg(&rows_i)
                .arg(&n_i)
                .arg(&t_i)
                .arg(&scale)
                .arg(&c);
            unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
            Ok(Some(CudaStorage::wrap_cuda_slice(out, dev)))
        }
    })
}

/// Gradient of [`softmax`] from its output `p` and the output's gradient `dp`;
/// with `in_place` it is written over `dp`.
pub fn softmax_bwd(
    p: &CudaStorage,
    lp: &Layout,
    dp: &CudaStorage,
    ldp: &Layout,
    scale: f32,
    causal: bool,
    in_place: bool,
) -> Result<Option<CudaStorage>> {
    let dev = p.device().clone();
    let dt = p.dtype();
    let (rows, n) = dims2(lp);
    let t = lp.dims().iter().rev().nth(1).copied().unwrap_or(1);
    let f = func(
        &dev,
        &softmax_kernel("softmax_bwd", dt, n, vec_ok(dt, &[n], &[lp, ldp]))?,
    )?;
    by_dtype!(dt, T, {
        let pv = view::<T>(p, lp)?;
        let dv = view::<T>(dp, ldp)?;
        let (rows_i, n_i, t_i, c) = (rows as i64, n as i32, t as i32, i32::from(causal));
        if in_place {
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&pv)
                .arg(&dv)
                .arg(&dv)
                .arg(&rows_i)
                .arg(&n_i)
                .arg(&t_i)
                .arg(&scale)
                .arg(&c);
            unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
            Ok(None)
        } else {
            let out = alloc::<T>(&dev, rows * n)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&f);
            b.arg(&pv)
                .arg(&dv)
                .arg(&out)
                .arg(&rows_i)
                .arg(&n_i)
                .arg(&t_i)
                .arg(&scale)
                .arg(&c);
            unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
            Ok(Some(CudaStorage::wrap_cuda_slice(out, dev)))
        }
    })
}

pub fn layer_norm(
    x: &CudaStorage,
    lx: &Layout,
    g: &CudaStorage,
    lg: &Layout,
    bias: &CudaStorage,
    lb: &Layout,
    eps: f32,
) -> Result<CudaStorage> {
    let dev = x.device().clone();
    let dt = x.dtype();
    let (rows, d) = dims2(lx);
    let f = func(&dev, &name("ln_fwd", dt, Some(vec_ok(dt, &[d], &[lx, lg, lb])))?)?;
    by_dtype!(dt, T, {
        let (xv, gv, bv) = (view::<T>(x, lx)?, view::<T>(g, lg)?, view::<T>(bias, lb)?);
        let out = alloc::<T>(&dev, rows * d)?;
        let (rows_i, d_i) = (rows as i64, d as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&xv)
            .arg(&gv)
            .arg(&bv)
            .arg(&out)
            .arg(&rows_i)
            .arg(&d_i)
            .arg(&eps);
        unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

/// Rows a block of the column-sum kernel covers.
const COL_CHUNK: usize = 256;

#[allow(clippy::too_many_arguments)]
fn col_sums_launch(
    dev: &CudaDevice,
    dt: DType,
    x: u64,
    dy: u64,
    stats: u64,
    acc_g: u64,
    acc_b: u64,
    rows: usize,
    d: usize,
) -> Result<()> {
    let f = func(dev, &name("col_sums", dt, None)?)?;
    let cfg = LaunchConfig {
        grid_dim: (d.div_ceil(32) as u32, rows.div_ceil(COL_CHUNK).max(1) as u32, 1),
        block_dim: (32, 8, 1),
        shared_mem_bytes: 0,
    };
    let (rows_i, d_i, chunk) = (rows as i64, d as i32, COL_CHUNK as i32);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&f);
    b.arg(&x)
        .arg(&dy)
        .arg(&stats)
        .arg(&acc_g)
        .arg(&acc_b)
        .arg(&rows_i)
        .arg(&d_i)
        .arg(&chunk);
    unsafe { b.launch(cfg) }.map_err(launch_err)?;
    Ok(())
}

/// f32 accumulator → a fresh storage of `dt`.
fn from_f32(dev: &CudaDevice, acc: CudaSlice<f32>, dt: DType) -> Result<CudaStorage> {
    let n = acc.len();
    if dt == DType::F32 {
        return Ok(CudaStorage::wrap_cuda_slice(acc, dev.clone()));
    }
    let f = func(dev, &name("from_f32", dt, None)?)?;
    by_dtype!(dt, T, {
        let out = alloc::<T>(dev, n)?;
        let n_i = n as i64;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&acc).arg(&out).arg(&n_i);
        unsafe { b.launch(grid(n, 256)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    })
}

fn ptr<T>(v: &CudaView<'_, T>, dev: &CudaDevice) -> u64 {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let stream = dev.cuda_stream();
    let (p, _sync) = v.device_ptr(&stream);
    p
}

fn ptr_slice<T>(v: &CudaSlice<T>, dev: &CudaDevice) -> u64 {
    use candle_core::cuda_backend::cudarc::driver::DevicePtr;
    let stream = dev.cuda_stream();
    let (p, _sync) = v.device_ptr(&stream);
    p
}

/// (dx, dγ, dβ) of layer norm; dγ and dβ are reduced in f32.
pub fn layer_norm_bwd(
    x: &CudaStorage,
    lx: &Layout,
    g: &CudaStorage,
    lg: &Layout,
    dy: &CudaStorage,
    ldy: &Layout,
    eps: f32,
) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
    let dev = x.device().clone();
    let dt = x.dtype();
    let (rows, d) = dims2(lx);
    let f = func(
        &dev,
        &name("ln_bwd_dx", dt, Some(vec_ok(dt, &[d], &[lx, lg, ldy])))?,
    )?;
    by_dtype!(dt, T, {
        let (xv, gv, dv) = (view::<T>(x, lx)?, view::<T>(g, lg)?, view::<T>(dy, ldy)?);
        let dx = alloc::<T>(&dev, rows * d)?;
        let stats = alloc::<f32>(&dev, rows * 2)?;
        let (rows_i, d_i) = (rows as i64, d as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&f);
        b.arg(&xv)
            .arg(&gv)
            .arg(&dv)
            .arg(&dx)
            .arg(&stats)
            .arg(&rows_i)
            .arg(&d_i)
            .arg(&eps);
        unsafe { b.launch(warp_rows(rows)) }.map_err(launch_err)?;
        let acc_g = dev.alloc_zeros::<f32>(d)?;
        let acc_b = dev.alloc_zeros::<f32>(d)?;
        col_sums_launch(
            &dev,
            dt,
            ptr(&xv, &dev),
            ptr(&dv, &dev),
            ptr_slice(&stats, &dev),
            ptr_slice(&acc_g, &dev),
            ptr_slice(&acc_b, &dev),
            rows,
            d,
        )?;
        Ok((
            CudaStorage::wrap_cuda_slice(dx, dev.clone()),
            from_f32(&dev, acc_g, dt)?,
            from_f32(&dev, acc_b, dt)?,
        ))
    })
}

/// Sum over rows of a [rows, d] storage, accumulated in f32: a bias gradient.
pub fn col_sum(dy: &CudaStorage, ldy: &Layout) -> Result<CudaStorage> {
    let dev = dy.device().clone();
    let dt = dy.dtype();
    let (rows, d) = dims2(ldy);
    by_dtype!(dt, T, {
        let dv = view::<T>(dy, ldy)?;
        let acc = dev.alloc_zeros::<f32>(d)?;
        let p = ptr(&dv, &dev);
        col_sums_launch(&dev, dt, p, p, 0, 0, ptr_slice(&acc, &dev), rows, d)?;
        from_f32(&dev, acc, dt)
    })
}

/// `h + b` (bias broadcast over rows), then tanh-GELU when `gelu`.
pub fn bias_act(
    h: &CudaStorage,
    lh: &Layout,
    bias: &CudaStorage,
    lb: &Layout,
    gelu: bool,
) -> Result<CudaStorage> {
    let dev = h.device().clone();
    let dt = h.dtype();
    let (rows, f) = dims2(lh);
    let vector = vec_ok(dt, &[f], &[lh, lb]);
    let k = func(&dev, &name("bias_act", dt, Some(vector))?)?;
    let per = if vector { width(dt) } else { 1 };
    by_dtype!(dt, T, {
        let (hv, bv) = (view::<T>(h, lh)?, view::<T>(bias, lb)?);
        let out = alloc::<T>(&dev, rows * f)?;
        let (n_i, f_i, mode) = ((rows * f) as i64, f as i32, i32::from(gelu));
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&k);
        b.arg(&hv).arg(&bv).arg(&out).arg(&n_i).arg(&f_i).arg(&mode);
        unsafe { b.launch(grid(rows * f / per, 256)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

/// d(gelu(h + b))/dh · dy.
pub fn bias_gelu_bwd(
    h: &CudaStorage,
    lh: &Layout,
    bias: &CudaStorage,
    lb: &Layout,
    dy: &CudaStorage,
    ldy: &Layout,
) -> Result<CudaStorage> {
    let dev = h.device().clone();
    let dt = h.dtype();
    let (rows, f) = dims2(lh);
    let vector = vec_ok(dt, &[f], &[lh, lb, ldy]);
    let k = func(&dev, &name("bias_gelu_bwd", dt, Some(vector))?)?;
    let per = if vector { width(dt) } else { 1 };
    by_dtype!(dt, T, {
        let (hv, bv, dv) = (view::<T>(h, lh)?, view::<T>(bias, lb)?, view::<T>(dy, ldy)?);
        let out = alloc::<T>(&dev, rows * f)?;
        let (n_i, f_i) = ((rows * f) as i64, f as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&k);
        b.arg(&hv).arg(&bv).arg(&dv).arg(&out).arg(&n_i).arg(&f_i);
        unsafe { b.launch(grid(rows * f / per, 256)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

const CE_BLOCK: u32 = 512;

/// Per-row cross-entropy (f32) of logits [rows, n] against u32 targets.
pub fn cross_entropy(x: &CudaStorage, lx: &Layout, tg: &CudaStorage, ltg: &Layout) -> Result<CudaStorage> {
    let dev = x.device().clone();
    let dt = x.dtype();
    let (rows, n) = dims2(lx);
    let k = func(&dev, &name("ce_fwd", dt, Some(vec_ok(dt, &[n], &[lx])))?)?;
    by_dtype!(dt, T, {
        let xv = view::<T>(x, lx)?;
        let tv = view::<u32>(tg, ltg)?;
        let out = alloc::<f32>(&dev, rows)?;
        let (rows_i, n_i) = (rows as i64, n as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&k);
        b.arg(&xv).arg(&tv).arg(&out).arg(&rows_i).arg(&n_i);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (CE_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

/// d(loss rows)/d(logits) · g, from the logits, targets, the forward's losses and
/// their gradient `g` (f32, one per row).
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_bwd(
    x: &CudaStorage,
    lx: &Layout,
    tg: &CudaStorage,
    ltg: &Layout,
    loss: &CudaStorage,
    lloss: &Layout,
    g: &CudaStorage,
    lgr: &Layout,
) -> Result<CudaStorage> {
    let dev = x.device().clone();
    let dt = x.dtype();
    let (rows, n) = dims2(lx);
    let k = func(&dev, &name("ce_bwd", dt, Some(vec_ok(dt, &[n], &[lx])))?)?;
    by_dtype!(dt, T, {
        let xv = view::<T>(x, lx)?;
        let tv = view::<u32>(tg, ltg)?;
        let lv = view::<f32>(loss, lloss)?;
        let gv = view::<f32>(g, lgr)?;
        let out = alloc::<T>(&dev, rows * n)?;
        let (rows_i, n_i) = (rows as i64, n as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&k);
        b.arg(&xv)
            .arg(&tv)
            .arg(&lv)
            .arg(&gv)
            .arg(&out)
            .arg(&rows_i)
            .arg(&n_i);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (CE_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { b.launch(cfg) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

/// wte[tokens] + wpe[row % t] → [rows, d].
pub fn embed(
    wte: &CudaStorage,
    lwte: &Layout,
    wpe: &CudaStorage,
    lwpe: &Layout,
    tok: &CudaStorage,
    ltok: &Layout,
) -> Result<CudaStorage> {
    let dev = wte.device().clone();
    let dt = wte.dtype();
    let (t, d) = dims2(lwpe);
    let rows = ltok.shape().elem_count();
    let vector = vec_ok(dt, &[d], &[lwte, lwpe]);
    let k = func(&dev, &name("embed_fwd", dt, Some(vector))?)?;
    let per = if vector { width(dt) } else { 1 };
    by_dtype!(dt, T, {
        let (ev, pv, tv) = (
            view::<T>(wte, lwte)?,
            view::<T>(wpe, lwpe)?,
            view::<u32>(tok, ltok)?,
        );
        let out = alloc::<T>(&dev, rows * d)?;
        let (rows_i, d_i, t_i) = (rows as i64, d as i32, t as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&k);
        b.arg(&ev)
            .arg(&pv)
            .arg(&tv)
            .arg(&out)
            .arg(&rows_i)
            .arg(&d_i)
            .arg(&t_i);
        unsafe { b.launch(grid(rows * d / per, 256)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}

/// (dwte [vocab, d], dwpe [t, d]) from dy [rows, d]; dwte is accumulated in f32.
pub fn embed_bwd(
    dy: &CudaStorage,
    ldy: &Layout,
    tok: &CudaStorage,
    ltok: &Layout,
    vocab: usize,
    t: usize,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = dy.device().clone();
    let dt = dy.dtype();
    let (rows, d) = dims2(ldy);
    let kw = func(&dev, &name("embed_bwd_wte", dt, None)?)?;
    let kp = func(&dev, &name("embed_bwd_wpe", dt, None)?)?;
    by_dtype!(dt, T, {
        let (dv, tv) = (view::<T>(dy, ldy)?, view::<u32>(tok, ltok)?);
        let acc = dev.alloc_zeros::<f32>(vocab * d)?;
        let (rows_i, d_i) = (rows as i64, d as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&kw);
        b.arg(&dv).arg(&tv).arg(&acc).arg(&rows_i).arg(&d_i);
        unsafe { b.launch(grid(rows * d, 256)) }.map_err(launch_err)?;
        let dwpe = alloc::<T>(&dev, t * d)?;
        let (batch_i, t_i) = ((rows / t.max(1)) as i32, t as i32);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&kp);
        b.arg(&dv).arg(&dwpe).arg(&batch_i).arg(&t_i).arg(&d_i);
        unsafe { b.launch(grid(t * d, 256)) }.map_err(launch_err)?;
        Ok((
            from_f32(&dev, acc, dt)?,
            CudaStorage::wrap_cuda_slice(dwpe, dev.clone()),
        ))
    })
}

/// `split`: [b, t, parts, h, e] → [parts, b, h, t, e]; else the inverse.
#[allow(clippy::too_many_arguments)]
pub fn heads(
    src: &CudaStorage,
    ls: &Layout,
    b: usize,
    t: usize,
    parts: usize,
    h: usize,
    e: usize,
    split: bool,
) -> Result<CudaStorage> {
    let dev = src.device().clone();
    let dt = src.dtype();
    let n = b * t * parts * h * e;
    let vector = vec_ok(dt, &[e], &[ls]);
    let k = func(&dev, &name("heads", dt, Some(vector))?)?;
    let per = if vector { width(dt) } else { 1 };
    by_dtype!(dt, T, {
        let sv = view::<T>(src, ls)?;
        let out = alloc::<T>(&dev, n)?;
        let args: [i32; 6] = [
            b as i32,
            t as i32,
            parts as i32,
            h as i32,
            e as i32,
            i32::from(split),
        ];
        let stream = dev.cuda_stream();
        let mut l = stream.launch_builder(&k);
        l.arg(&sv).arg(&out);
        for a in &args {
            l.arg(a);
        }
        unsafe { l.launch(grid(n / per, 256)) }.map_err(launch_err)?;
        Ok(CudaStorage::wrap_cuda_slice(out, dev))
    })
}
