"""Greedy token generation with one decoder model in JAX or PyTorch (seed document 000).

The same GPT-style decoder (pre-LayerNorm, learned positions, GELU MLP, random
weights drawn once in NumPy from a fixed seed, so both frameworks run the very
same numbers) generates `--max-new-tokens` tokens for each prompt of a prompt
set, one prompt at a time, with a key/value cache, in bf16.

Protocol of the document:
  * warm-up: 5 iterations x 5 prompt lengths (10, 20, 30, 40, 50 tokens), so
    that JIT compilation (JAX) and kernel selection / allocation (PyTorch) are
    done; PyTorch's cache is emptied after it;
  * the first 5 measured inferences are excluded;
  * every inference is timed between device synchronisations
    (`block_until_ready` / `torch.cuda.synchronize`);
  * latency mean/median/p95/p99/std, output tokens per second.

It talks to orch on stdout: `ORCH_PHASE warmup|measure` and
`ORCH_METRIC name=value ...`; `steps` and `tokens` let orch divide the energy
of the measured phase per inference and per token.

    python3 generate.py --framework jax --prompts prompts.json --num-prompts 100
"""

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np

WARMUP_LENGTHS = (10, 20, 30, 40, 50)
WARMUP_ITERS = 5
EXCLUDED = 5
BOS = 256  # byte-level tokens are 0..255


def weights(cfg, seed):
    """The model's weights as float32 NumPy arrays (GPT-2 style init)."""
    rng = np.random.default_rng(seed)
    d, ff, v = cfg["d_model"], cfg["d_ff"], cfg["vocab"]

    def n(*shape, std=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)

    layers = []
    for _ in range(cfg["layers"]):
        layers.append(
            {
                "ln1_g": np.ones(d, np.float32),
                "ln1_b": np.zeros(d, np.float32),
                "wqkv": n(d, 3 * d),
                "bqkv": np.zeros(3 * d, np.float32),
                "wo": n(d, d, std=0.02 / math.sqrt(2 * cfg["layers"])),
                "bo": np.zeros(d, np.float32),
                "ln2_g": np.ones(d, np.float32),
                "ln2_b": np.zeros(d, np.float32),
                "w1": n(d, ff),
                "b1": np.zeros(ff, np.float32),
                "w2": n(ff, d, std=0.02 / math.sqrt(2 * cfg["layers"])),
                "b2": np.zeros(d, np.float32),
            }
        )
    return {
        "wte": n(v, d),
        "wpe": n(cfg["max_len"], d, std=0.01),
        "lnf_g": np.ones(d, np.float32),
        "lnf_b": np.zeros(d, np.float32),
        "head": n(d, v),
        "layers": layers,
    }


def params_count(w):
    total = sum(a.size for k, a in w.items() if k != "layers")
    return total + sum(a.size for layer in w["layers"] for a in layer.values())


class Torch:
    """The decoder in PyTorch eager mode (what a HuggingFace user runs)."""

    def __init__(self, w, cfg, device):
        import torch
        import torch.nn.functional as F

        self.torch, self.F, self.cfg = torch, F, cfg
        self.dev = torch.device(device)
        self.dtype = torch.bfloat16 if self.dev.type == "cuda" else torch.float32
        t = lambda a: torch.from_numpy(a).to(self.dev, self.dtype)  # noqa: E731
        self.w = {k: t(a) for k, a in w.items() if k != "layers"}
        self.layers = [{k: t(a) for k, a in layer.items()} for layer in w["layers"]]
        h = cfg["heads"]
        self.cache_shape = (1, h, cfg["max_len"], cfg["d_model"] // h)

    def sync(self):
        if self.dev.type == "cuda":
            self.torch.cuda.synchronize()

    def after_warmup(self):
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()

    def _forward(self, tokens, pos, caches):
        F, d, h = self.F, self.cfg["d_model"], self.cfg["heads"]
        b, t = tokens.shape
        x = self.w["wte"][tokens] + self.w["wpe"][pos : pos + t]
        for p, (ck, cv) in zip(self.layers, caches):
            y = F.layer_norm(x, (d,), p["ln1_g"], p["ln1_b"])
            q, k, v = (y @ p["wqkv"] + p["bqkv"]).view(b, t, 3, h, d // h).permute(2, 0, 3, 1, 4)
            ck[:, :, pos : pos + t] = k
            cv[:, :, pos : pos + t] = v
            a = F.scaled_dot_product_attention(q, ck[:, :, : pos + t], cv[:, :, : pos + t], is_causal=t > 1)
            x = x + a.transpose(1, 2).reshape(b, t, d) @ p["wo"] + p["bo"]
            y = F.layer_norm(x, (d,), p["ln2_g"], p["ln2_b"])
            x = x + F.gelu(y @ p["w1"] + p["b1"], approximate="tanh") @ p["w2"] + p["b2"]
        x = F.layer_norm(x[:, -1], (d,), self.w["lnf_g"], self.w["lnf_b"])
        return (x @ self.w["head"]).argmax(-1, keepdim=True)

    def generate(self, ids, n_new):
        torch = self.torch
        with torch.inference_mode():
            caches = [
                (
                    torch.empty(self.cache_shape, device=self.dev, dtype=self.dtype),
                    torch.empty(self.cache_shape, device=self.dev, dtype=self.dtype),
                )
                for _ in self.layers
            ]
            tokens = torch.tensor([ids], device=self.dev)
            tok = self._forward(tokens, 0, caches)
            out = [tok]
            for i in range(n_new - 1):
                tok = self._forward(tok, len(ids) + i, caches)
                out.append(tok)
            return out, lambda: torch.cat(out, 1)[0].tolist()


class Jax:
    """The decoder in JAX: a jitted prefill (prompts padded to one bucket) and
    a jitted one-token step over a donated key/value cache."""

    def __init__(self, w, cfg, bucket):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp, self.cfg, self.bucket = jax, jnp, cfg, bucket
        on_gpu = jax.default_backend() == "gpu"
        self.dtype = jnp.bfloat16 if on_gpu else jnp.float32
        self.p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, self.dtype), w)
        self.prefill = jax.jit(self._prefill)
        self.step = jax.jit(self._step, donate_argnums=(1,))

    def sync(self):
        pass

    def after_warmup(self):
        pass

    def _ln(self, x, g, b):
        jnp = self.jnp
        x32 = x.astype(jnp.float32)
        m = x32.mean(-1, keepdims=True)
        v = ((x32 - m) ** 2).mean(-1, keepdims=True)
        return ((x32 - m) * self.jax.lax.rsqrt(v + 1e-5) * g + b).astype(self.dtype)

    def _forward(self, p, tokens, pos, caches):
        jax, jnp, cfg = self.jax, self.jnp, self.cfg
        d, h, tmax = cfg["d_model"], cfg["heads"], cfg["max_len"]
        b, t = tokens.shape
        x = p["wte"][tokens] + jax.lax.dynamic_slice_in_dim(p["wpe"], pos, t)[None]
        qpos = pos + jnp.arange(t)[:, None]
        visible = jnp.arange(tmax)[None, :] <= qpos  # [t, tmax]
        new = []
        for lp, (ck, cv) in zip(p["layers"], caches):
            y = self._ln(x, lp["ln1_g"], lp["ln1_b"])
            qkv = (y @ lp["wqkv"] + lp["bqkv"]).reshape(b, t, 3, h, d // h).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            ck = jax.lax.dynamic_update_slice(ck, k, (0, 0, pos, 0))
            cv = jax.lax.dynamic_update_slice(cv, v, (0, 0, pos, 0))
            s = (q @ ck.transpose(0, 1, 3, 2)).astype(jnp.float32) / math.sqrt(d // h)
            s = jnp.where(visible, s, -jnp.inf)
            a = (jax.nn.softmax(s, axis=-1).astype(self.dtype) @ cv).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + a @ lp["wo"] + lp["bo"]
            y = self._ln(x, lp["ln2_g"], lp["ln2_b"])
            x = x + jax.nn.gelu(y @ lp["w1"] + lp["b1"], approximate=True) @ lp["w2"] + lp["b2"]
            new.append((ck, cv))
        return x, new

    def _logits_token(self, p, x):
        x = self._ln(x, p["lnf_g"], p["lnf_b"])
        return (x @ p["head"]).argmax(-1).astype(self.jnp.int32)

    def _prefill(self, p, tokens, length):
        jnp, cfg = self.jnp, self.cfg
        h = cfg["heads"]
        shape = (1, h, cfg["max_len"], cfg["d_model"] // h)
        caches = [(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype)) for _ in p["layers"]]
        x, caches = self._forward(p, tokens, 0, caches)
        last = self.jax.lax.dynamic_index_in_dim(x, length - 1, axis=1, keepdims=False)
        return self._logits_token(p, last)[:, None], caches

    def _step(self, p, caches, tok, pos):
        x, caches = self._forward(p, tok, pos, caches)
        return self._logits_token(p, x[:, -1])[:, None], caches

    def generate(self, ids, n_new):
        jnp = self.jnp
        padded = np.zeros((1, self.bucket), np.int32)
        padded[0, : len(ids)] = ids
        tok, caches = self.prefill(self.p, jnp.asarray(padded), len(ids))
        out = [tok]
        for i in range(n_new - 1):
            tok, caches = self.step(self.p, caches, tok, len(ids) + i)
            out.append(tok)
        out[-1].block_until_ready()
        return out, lambda: [int(t[0, 0]) for t in out]


def encode(text, limit):
    return [BOS] + list(text.encode("utf-8"))[: limit - 1]


def stats_ms(xs):
    s = sorted(xs)

    def pct(q):
        # linear interpolation between closest ranks (numpy's default)
        k = (len(s) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {
        "mean": statistics.fmean(s),
        "median": pct(0.5),
        "p95": pct(0.95),
        "p99": pct(0.99),
        "std": statistics.stdev(s) if len(s) > 1 else 0.0,
        "min": s[0],
        "max": s[-1],
    }


def metric(**kv):
    print("ORCH_METRIC " + " ".join(f"{k}={v:.6g}" for k, v in kv.items()), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=["jax", "pytorch"], required=True)
    ap.add_argument("--prompts", default="prompts.json")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--prompt-bucket", type=int, default=128, help="longest prompt in tokens (JAX pads to it)")
    ap.add_argument("--device", default=None, help="pytorch: cuda or cpu (default: cuda when present)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    cfg = {
        "d_model": a.d_model,
        "layers": a.layers,
        "heads": a.heads,
        "d_ff": 4 * a.d_model,
        "vocab": a.vocab,
        "max_len": a.prompt_bucket + a.max_new_tokens,
    }
    with open(a.prompts) as f:
        prompts = json.load(f)["prompts"]
    if not prompts:
        sys.exit("the prompt file has no prompts")

    t0 = time.perf_counter()
    w = weights(cfg, a.seed)
    if a.framework == "pytorch":
        import torch

        dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = Torch(w, cfg, dev)
        version = torch.__version__
    else:
        import jax

        model = Jax(w, cfg, a.prompt_bucket)
        version = jax.__version__
    model.sync()
    print(f"{a.framework} {version}: {params_count(w) / 1e6:.1f}M parameters, loaded in {time.perf_counter() - t0:.1f}s", flush=True)
    metric(params=params_count(w), load_s=time.perf_counter() - t0)

    print("ORCH_PHASE warmup", flush=True)
    t0 = time.perf_counter()
    filler = encode(" ".join(prompts), 10_000)
    for length in WARMUP_LENGTHS:
        for _ in range(WARMUP_ITERS):
            out, _ = model.generate(filler[:length], a.max_new_tokens)
            model.sync()
    model.after_warmup()
    metric(warmup_s=time.perf_counter() - t0)

    print("ORCH_PHASE measure", flush=True)
    latencies, first = [], None
    n = a.num_prompts + EXCLUDED
    for i in range(n):
        ids = encode(prompts[i % len(prompts)], a.prompt_bucket)
        model.sync()
        t = time.perf_counter()
        out, tokens = model.generate(ids, a.max_new_tokens)
        model.sync()
        dt = time.perf_counter() - t
        if i >= EXCLUDED:
            latencies.append(dt * 1000)
        if first is None:
            first = tokens()
    st = stats_ms(latencies)
    total_tokens = a.max_new_tokens * len(latencies)
    print(f"first generated ids: {first[:16]}", flush=True)
    metric(**{f"latency_{k}_ms": v for k, v in st.items()})
    metric(
        output_tokens_per_s=total_tokens / (sum(latencies) / 1000),
        ms_per_token=st["mean"] / a.max_new_tokens,
        steps=len(latencies),
        tokens=total_tokens,
        excluded=EXCLUDED,
    )


if __name__ == "__main__":
    main()
