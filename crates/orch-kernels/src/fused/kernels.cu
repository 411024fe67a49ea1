// orch's fused transformer kernels, compiled at run time by NVRTC (fused/cuda.rs).
// Every kernel exists for f32 (`_f32`) and bf16 (`_bf16`, stored as raw 16-bit words);
// arithmetic is in f32. `V` is the vector width in elements: 16 bytes per load when the
// row length and the pointers allow it (checked by the caller), else 1.
typedef unsigned short bf16;
typedef unsigned int u32;
#define FULL 0xffffffffu
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float tof(float v) { return v; }
__device__ __forceinline__ float tof(bf16 v) { return __uint_as_float(((u32)v) << 16); }
template <typename T> __device__ __forceinline__ T fromf(float v);
template <> __device__ __forceinline__ float fromf<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 fromf<bf16>(float v) {
  u32 u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                              // round to nearest even
  return (bf16)(u >> 16);
}

template <typename T, int V> __device__ __forceinline__ void load(const T* p, long i, float* out) {
  if constexpr (V * sizeof(T) == 16) {
    union { uint4 v; T e[V]; } u;
    u.v = *reinterpret_cast<const uint4*>(p + i);
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = tof(u.e[k]);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = tof(p[i + k]);
  }
}

template <typename T, int V> __device__ __forceinline__ void store(T* p, long i, const float* in) {
  if constexpr (V * sizeof(T) == 16) {
    union { uint4 v; T e[V]; } u;
#pragma unroll
    for (int k = 0; k < V; k++) u.e[k] = fromf<T>(in[k]);
    *reinterpret_cast<uint4*>(p + i) = u.v;
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) p[i + k] = fromf<T>(in[k]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[w] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : 0.f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* shared) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[w] = v;
  __syncthreads();
  v = lane < nw ? shared[lane] : NEG_INF;
  return warp_max(v);
}

// ---- scale + causal mask + softmax over rows of length n (one warp per row) ----
// Row r is query position r % t; with `causal`, keys j > r % t get probability 0
// (the mask is computed from the indices, never read). In place is allowed (y == x).
template <typename T, int V>
__device__ void softmax_fwd(const T* x, T* y, long rows, int n, int t, float scale, int causal) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  int valid = causal ? min(n, (int)(row % t) + 1) : n;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float m = NEG_INF, s = 0.f, v[V];
  for (int j = lane * V; j < valid; j += 32 * V) {
    load<T, V>(xr, j, v);
    float lm = NEG_INF;
#pragma unroll
    for (int k = 0; k < V; k++) if (j + k < valid) lm = fmaxf(lm, v[k] * scale);
    if (lm > m) { s *= __expf(m - lm); m = lm; }
#pragma unroll
    for (int k = 0; k < V; k++) if (j + k < valid) s += __expf(v[k] * scale - m);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(FULL, m, o), s2 = __shfl_xor_sync(FULL, s, o);
    float mm = fmaxf(m, m2);
    s = (m == NEG_INF ? 0.f : s * __expf(m - mm)) + (m2 == NEG_INF ? 0.f : s2 * __expf(m2 - mm));
    m = mm;
  }
  float inv = 1.f / s, o[V];
  for (int j = lane * V; j < n; j += 32 * V) {
    if (j < valid) {
      load<T, V>(xr, j, v);
#pragma unroll
      for (int k = 0; k < V; k++) o[k] = j + k < valid ? __expf(v[k] * scale - m) * inv : 0.f;
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) o[k] = 0.f;
    }
    store<T, V>(yr, j, o);
  }
}

// ds = scale * p * (dp - sum(p * dp)); masked keys have p == 0 and get 0.
template <typename T, int V>
__device__ void softmax_bwd(const T* p, const T* dp, T* ds, long rows, int n, int t, float scale, int causal) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  int valid = causal ? min(n, (int)(row % t) + 1) : n;
  const T* pr = p + row * n;
  const T* dr = dp + row * n;
  T* sr = ds + row * n;
  float a[V], b[V], o[V], dot = 0.f;
  for (int j = lane * V; j < valid; j += 32 * V) {
    load<T, V>(pr, j, a);
    load<T, V>(dr, j, b);
#pragma unroll
    for (int k = 0; k < V; k++) if (j + k < valid) dot += a[k] * b[k];
  }
  dot = warp_sum(dot);
  for (int j = lane * V; j < n; j += 32 * V) {
    if (j < valid) {
      load<T, V>(pr, j, a);
      load<T, V>(dr, j, b);
#pragma unroll
      for (int k = 0; k < V; k++) o[k] = j + k < valid ? scale * a[k] * (b[k] - dot) : 0.f;
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) o[k] = 0.f;
    }
    store<T, V>(sr, j, o);
  }
}

// The same two kernels with the row held in registers (R vectors a lane), for rows
// of at most 32 * V * R elements: one read of the row instead of two (three in the
// backward). Lane l holds vectors l, l + 32, ... so that every load is coalesced.
template <typename T, int V, int R>
__device__ void softmax_fwd_reg(const T* x, T* y, long rows, int n, int t, float scale, int causal) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  int valid = causal ? min(n, (int)(row % t) + 1) : n;
  const T* xr = x + row * n;
  T* yr = y + row * n;
  float v[R][V];
  float m = NEG_INF;
#pragma unroll
  for (int r = 0; r < R; r++) {
    int j = (r * 32 + lane) * V;
    if (j < valid) {
      load<T, V>(xr, j, v[r]);
#pragma unroll
      for (int k = 0; k < V; k++) {
        v[r][k] = j + k < valid ? v[r][k] * scale : NEG_INF;
        m = fmaxf(m, v[r][k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) v[r][k] = NEG_INF;
    }
  }
  m = warp_max(m);
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int k = 0; k < V; k++) {
      float e = v[r][k] == NEG_INF ? 0.f : __expf(v[r][k] - m);
      v[r][k] = e;
      s += e;
    }
  float inv = 1.f / warp_sum(s);
#pragma unroll
  for (int r = 0; r < R; r++) {
    int j = (r * 32 + lane) * V;
    if (j < n) {
#pragma unroll
      for (int k = 0; k < V; k++) v[r][k] *= inv;
      store<T, V>(yr, j, v[r]);
    }
  }
}

template <typename T, int V, int R>
__device__ void softmax_bwd_reg(const T* p, const T* dp, T* ds, long rows, int n, int t, float scale, int causal) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  int valid = causal ? min(n, (int)(row % t) + 1) : n;
  const T* pr = p + row * n;
  const T* dr = dp + row * n;
  T* sr = ds + row * n;
  float a[R][V], b[R][V];
  float dot = 0.f;
#pragma unroll
  for (int r = 0; r < R; r++) {
    int j = (r * 32 + lane) * V;
    if (j < valid) {
      load<T, V>(pr, j, a[r]);
      load<T, V>(dr, j, b[r]);
#pragma unroll
      for (int k = 0; k < V; k++) {
        if (j + k >= valid) a[r][k] = 0.f;
        dot += a[r][k] * b[r][k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) { a[r][k] = 0.f; b[r][k] = 0.f; }
    }
  }
  dot = warp_sum(dot);
#pragma unroll
  for (int r = 0; r < R; r++) {
    int j = (r * 32 + lane) * V;
    if (j < n) {
#pragma unroll
      for (int k = 0; k < V; k++) a[r][k] = scale * a[r][k] * (b[r][k] - dot);
      store<T, V>(sr, j, a[r]);
    }
  }
}

// ---- layer norm over rows of length d (one warp per row) ----
template <typename T, int V>
__device__ __forceinline__ void row_stats(const T* xr, int d, float eps, float* mean, float* rstd) {
  int lane = threadIdx.x & 31;
  float v[V], s = 0.f;
  for (int j = lane * V; j < d; j += 32 * V) {
    load<T, V>(xr, j, v);
#pragma unroll
    for (int k = 0; k < V; k++) s += v[k];
  }
  float mu = warp_sum(s) / d, q = 0.f;
  for (int j = lane * V; j < d; j += 32 * V) {
    load<T, V>(xr, j, v);
#pragma unroll
    for (int k = 0; k < V; k++) { float c = v[k] - mu; q += c * c; }
  }
  *mean = mu;
  *rstd = rsqrtf(warp_sum(q) / d + eps);
}

template <typename T, int V>
__device__ void ln_fwd(const T* x, const T* g, const T* b, T* y, long rows, int d, float eps) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  const T* xr = x + row * d;
  T* yr = y + row * d;
  float mu, rs, v[V], gv[V], bv[V], o[V];
  row_stats<T, V>(xr, d, eps, &mu, &rs);
  for (int j = lane * V; j < d; j += 32 * V) {
    load<T, V>(xr, j, v);
    load<T, V>(g, j, gv);
    load<T, V>(b, j, bv);
#pragma unroll
    for (int k = 0; k < V; k++) o[k] = (v[k] - mu) * rs * gv[k] + bv[k];
    store<T, V>(yr, j, o);
  }
}

// dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)); writes (mean, rstd) per row.
template <typename T, int V>
__device__ void ln_bwd_dx(const T* x, const T* g, const T* dy, T* dx, float* stats, long rows, int d, float eps) {
  long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  int lane = threadIdx.x & 31;
  const T* xr = x + row * d;
  const T* dr = dy + row * d;
  T* or_ = dx + row * d;
  float mu, rs, v[V], gv[V], dv[V], o[V], s1 = 0.f, s2 = 0.f;
  row_stats<T, V>(xr, d, eps, &mu, &rs);
  for (int j = lane * V; j < d; j += 32 * V) {
    load<T, V>(xr, j, v);
    load<T, V>(g, j, gv);
    load<T, V>(dr, j, dv);
#pragma unroll
    for (int k = 0; k < V; k++) { float dg = dv[k] * gv[k]; s1 += dg; s2 += dg * (v[k] - mu) * rs; }
  }
  s1 = warp_sum(s1) / d;
  s2 = warp_sum(s2) / d;
  for (int j = lane * V; j < d; j += 32 * V) {
    load<T, V>(xr, j, v);
    load<T, V>(g, j, gv);
    load<T, V>(dr, j, dv);
#pragma unroll
    for (int k = 0; k < V; k++) o[k] = rs * (dv[k] * gv[k] - s1 - (v[k] - mu) * rs * s2);
    store<T, V>(or_, j, o);
  }
  if (lane == 0) { stats[2 * row] = mu; stats[2 * row + 1] = rs; }
}

// Column sums over row chunks, added atomically into f32 accumulators (zeroed by the caller).
// Block (32, 8): x walks 32 adjacent columns (coalesced), y 8 rows; gridDim.y chunks of rows.
// dg[c] += sum dy*xhat, db[c] += sum dy (xhat from stats); or, without stats, db[c] += sum dy.
template <typename T>
__device__ void col_sums(const T* x, const T* dy, const float* stats, float* dg, float* db, long rows, int d, int chunk) {
  __shared__ float sg[8][33], sb[8][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  long r0 = (long)blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
  float ag = 0.f, ab = 0.f;
  if (c < d) {
    for (long r = r0 + threadIdx.y; r < r1; r += 8) {
      float dv = tof(dy[r * d + c]);
      ab += dv;
      if (stats) ag += dv * (tof(x[r * d + c]) - stats[2 * r]) * stats[2 * r + 1];
    }
  }
  sg[threadIdx.y][threadIdx.x] = ag;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    float tg = 0.f, tb = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) { tg += sg[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
    atomicAdd(db + c, tb);
    if (stats) atomicAdd(dg + c, tg);
  }
}

// ---- element-wise over [rows, f] with a per-column bias ----
__device__ __forceinline__ float gelu(float u) {
  return 0.5f * u * (1.f + tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u)));
}
__device__ __forceinline__ float gelu_grad(float u) {
  float th = tanhf(0.7978845608028654f * (u + 0.044715f * u * u * u));
  return 0.5f * (1.f + th) + 0.5f * u * (1.f - th * th) * 0.7978845608028654f * (1.f + 3.f * 0.044715f * u * u);
}

// mode 0: y = h + b; mode 1: y = gelu(h + b)
template <typename T, int V>
__device__ void bias_act(const T* h, const T* b, T* y, long n, int f, int mode) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float hv[V], bv[V], o[V];
  load<T, V>(h, i, hv);
  load<T, V>(b, (int)(i % f), bv);
#pragma unroll
  for (int k = 0; k < V; k++) { float u = hv[k] + bv[k]; o[k] = mode ? gelu(u) : u; }
  store<T, V>(y, i, o);
}

// dh = dy * gelu'(h + b)
template <typename T, int V>
__device__ void bias_gelu_bwd(const T* h, const T* b, const T* dy, T* dh, long n, int f) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  float hv[V], bv[V], dv[V], o[V];
  load<T, V>(h, i, hv);
  load<T, V>(b, (int)(i % f), bv);
  load<T, V>(dy, i, dv);
#pragma unroll
  for (int k = 0; k < V; k++) o[k] = dv[k] * gelu_grad(hv[k] + bv[k]);
  store<T, V>(dh, i, o);
}

template <typename T>
__device__ void from_f32(const float* x, T* y, long n) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = fromf<T>(x[i]);
}

// ---- cross-entropy over rows of logits (one block per row) ----
// loss[r] = logsumexp(x[r]) - x[r, target[r]], in f32.
template <typename T, int V>
__device__ void ce_fwd(const T* x, const u32* target, float* loss, long rows, int n) {
  __shared__ float sh[32];
  long row = blockIdx.x;
  const T* xr = x + row * n;
  float m = NEG_INF, s = 0.f, v[V];
  for (int j = threadIdx.x * V; j < n; j += blockDim.x * V) {
    load<T, V>(xr, j, v);
    float lm = v[0];
#pragma unroll
    for (int k = 1; k < V; k++) lm = fmaxf(lm, v[k]);
    if (lm > m) { s *= __expf(m - lm); m = lm; }
#pragma unroll
    for (int k = 0; k < V; k++) s += __expf(v[k] - m);
  }
  float gm = block_max(m, sh);
  s = m == NEG_INF ? 0.f : s * __expf(m - gm);
  s = block_sum(s, sh);
  if (threadIdx.x == 0) loss[row] = gm + __logf(s) - tof(xr[target[row]]);
}

// dx[r, j] = (softmax(x[r])_j - [j == target]) * g[r]; logsumexp from the forward's loss.
template <typename T, int V>
__device__ void ce_bwd(const T* x, const u32* target, const float* loss, const float* g, T* dx, long rows, int n) {
  long row = blockIdx.x;
  const T* xr = x + row * n;
  T* dr = dx + row * n;
  u32 tg = target[row];
  float lse = loss[row] + tof(xr[tg]), gr = g[row], v[V], o[V];
  for (int j = threadIdx.x * V; j < n; j += blockDim.x * V) {
    load<T, V>(xr, j, v);
#pragma unroll
    for (int k = 0; k < V; k++) o[k] = (__expf(v[k] - lse) - ((u32)(j + k) == tg ? 1.f : 0.f)) * gr;
    store<T, V>(dr, j, o);
  }
}

// ---- embeddings: y[r] = wte[tok[r]] + wpe[r % t] ----
template <typename T, int V>
__device__ void embed_fwd(const T* wte, const T* wpe, const u32* tok, T* y, long rows, int d, int t) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (i >= rows * d) return;
  long r = i / d;
  int c = (int)(i % d);
  float a[V], b[V];
  load<T, V>(wte, (long)tok[r] * d + c, a);
  load<T, V>(wpe, (r % t) * d + c, b);
#pragma unroll
  for (int k = 0; k < V; k++) a[k] += b[k];
  store<T, V>(y, i, a);
}

// dwte (f32, zeroed) += dy at each token's row.
template <typename T>
__device__ void embed_bwd_wte(const T* dy, const u32* tok, float* acc, long rows, int d) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * d) return;
  atomicAdd(acc + (long)tok[i / d] * d + i % d, tof(dy[i]));
}

// dwpe[p, c] = sum over the batch of dy[b*t + p, c].
template <typename T>
__device__ void embed_bwd_wpe(const T* dy, T* dwpe, int batch, int t, int d) {
  long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long)t * d) return;
  float s = 0.f;
  for (int b = 0; b < batch; b++) s += tof(dy[(long)b * t * d + i]);
  dwpe[i] = fromf<T>(s);
}

// ---- head layout: [b, t, parts, h, e] <-> [parts, b, h, t, e] ----
template <typename T, int V>
__device__ void heads(const T* src, T* dst, int b, int t, int parts, int h, int e, int split) {
  long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * V;
  long n = (long)b * t * parts * h * e;
  if (i >= n) return;
  // i indexes the [parts, b, h, t, e] side.
  int ei = (int)(i % e);
  long r = i / e;
  int ti = (int)(r % t); r /= t;
  int hi = (int)(r % h); r /= h;
  int bi = (int)(r % b);
  int pi = (int)(r / b);
  long j = ((((long)bi * t + ti) * parts + pi) * h + hi) * e + ei;
  float v[V];
  if (split) { load<T, V>(src, j, v); store<T, V>(dst, i, v); }
  else { load<T, V>(src, i, v); store<T, V>(dst, j, v); }
}

// Entry points: `_v` takes 16-byte vectors, `_s` single elements.
#define ENTRY(T, TN, VW, SUF) \
  extern "C" __global__ void softmax_fwd_##TN##SUF(const T* x, T* y, long rows, int n, int t, float scale, int causal) { softmax_fwd<T, VW>(x, y, rows, n, t, scale, causal); } \
  extern "C" __global__ void softmax_bwd_##TN##SUF(const T* p, const T* dp, T* ds, long rows, int n, int t, float scale, int causal) { softmax_bwd<T, VW>(p, dp, ds, rows, n, t, scale, causal); } \
  extern "C" __global__ void ln_fwd_##TN##SUF(const T* x, const T* g, const T* b, T* y, long rows, int d, float eps) { ln_fwd<T, VW>(x, g, b, y, rows, d, eps); } \
  extern "C" __global__ void ln_bwd_dx_##TN##SUF(const T* x, const T* g, const T* dy, T* dx, float* stats, long rows, int d, float eps) { ln_bwd_dx<T, VW>(x, g, dy, dx, stats, rows, d, eps); } \
  extern "C" __global__ void bias_act_##TN##SUF(const T* h, const T* b, T* y, long n, int f, int mode) { bias_act<T, VW>(h, b, y, n, f, mode); } \
  extern "C" __global__ void bias_gelu_bwd_##TN##SUF(const T* h, const T* b, const T* dy, T* dh, long n, int f) { bias_gelu_bwd<T, VW>(h, b, dy, dh, n, f); } \
  extern "C" __global__ void ce_fwd_##TN##SUF(const T* x, const u32* tg, float* loss, long rows, int n) { ce_fwd<T, VW>(x, tg, loss, rows, n); } \
  extern "C" __global__ void ce_bwd_##TN##SUF(const T* x, const u32* tg, const float* loss, const float* g, T* dx, long rows, int n) { ce_bwd<T, VW>(x, tg, loss, g, dx, rows, n); } \
  extern "C" __global__ void embed_fwd_##TN##SUF(const T* wte, const T* wpe, const u32* tok, T* y, long rows, int d, int t) { embed_fwd<T, VW>(wte, wpe, tok, y, rows, d, t); } \
  extern "C" __global__ void heads_##TN##SUF(const T* src, T* dst, int b, int t, int parts, int h, int e, int split) { heads<T, VW>(src, dst, b, t, parts, h, e, split); }

ENTRY(float, f32, 4, _v)
ENTRY(float, f32, 1, _s)
ENTRY(bf16, bf16, 8, _v)
ENTRY(bf16, bf16, 1, _s)

#define ENTRY1(T, TN) \
  extern "C" __global__ void col_sums_##TN(const T* x, const T* dy, const float* stats, float* dg, float* db, long rows, int d, int chunk) { col_sums<T>(x, dy, stats, dg, db, rows, d, chunk); } \
  extern "C" __global__ void from_f32_##TN(const float* x, T* y, long n) { from_f32<T>(x, y, n); } \
  extern "C" __global__ void embed_bwd_wte_##TN(const T* dy, const u32* tok, float* acc, long rows, int d) { embed_bwd_wte<T>(dy, tok, acc, rows, d); } \
  extern "C" __global__ void embed_bwd_wpe_##TN(const T* dy, T* dwpe, int batch, int t, int d) { embed_bwd_wpe<T>(dy, dwpe, batch, t, d); }

#define ENTRY_REG(T, TN, VW, R) \
  extern "C" __global__ void softmax_fwd_##TN##_r##R(const T* x, T* y, long rows, int n, int t, float scale, int causal) { softmax_fwd_reg<T, VW, R>(x, y, rows, n, t, scale, causal); } \
  extern "C" __global__ void softmax_bwd_##TN##_r##R(const T* p, const T* dp, T* ds, long rows, int n, int t, float scale, int causal) { softmax_bwd_reg<T, VW, R>(p, dp, ds, rows, n, t, scale, causal); }

ENTRY_REG(float, f32, 4, 4)
ENTRY_REG(float, f32, 4, 8)
ENTRY_REG(bf16, bf16, 8, 4)
ENTRY_REG(bf16, bf16, 8, 8)

ENTRY1(float, f32)
ENTRY1(bf16, bf16)
