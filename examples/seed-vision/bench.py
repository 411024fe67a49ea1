"""Inference throughput, latency, peak memory and energy of a vision model in JAX or PyTorch (seed document 002).

PyTorch runs torchvision's own definitions; JAX runs the Flax definitions in
flax_models.py (same architectures). Weights are random (no download), inputs
are random 224x224 images, compute is bf16 with float32 weights in both
(`torch.autocast` / Flax `dtype`), BatchNorm in inference mode.

Each measured iteration is one batch, timed between device synchronisations.
Energy per image comes from NVML's energy counter of the cell's GPU over the
measured loop (the document's method); orch also samples the GPU itself.

    python3 bench.py --framework pytorch --model resnet50 --batch-size 128
"""

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np


def nvml_energy():
    """A function reading the cell's GPU energy counter in joules, or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        if first.isdigit():
            h = pynvml.nvmlDeviceGetHandleByIndex(int(first))
        else:
            h = pynvml.nvmlDeviceGetHandleByUUID(first)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
        return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
    except Exception as e:  # no NVML, no GPU, or a GPU without the counter
        print(f"no NVML energy counter: {e}", file=sys.stderr)
        return None


def pytorch_runner(model_name, batch, device):
    import torch
    import torchvision

    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, model_name)(weights=None).to(dev).eval()
    model = model.to(memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn(batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    cuda = dev.type == "cuda"

    def step():
        with torch.inference_mode(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            return model(x)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def peak():
        return torch.cuda.max_memory_allocated(dev) if cuda else None

    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    return step, sync, peak, params, f"torch {torch.__version__}, torchvision {torchvision.__version__}"


def jax_runner(model_name, batch):
    import jax
    import jax.numpy as jnp

    from flax_models import MODELS

    on_gpu = jax.default_backend() == "gpu"
    model = MODELS[model_name](dtype=jnp.bfloat16 if on_gpu else jnp.float32)
    x = jax.random.normal(jax.random.key(1), (batch, 224, 224, 3), jnp.float32)
    # Random weights without tracing the model for initialisation (that
    # compiles a whole forward pass, up to a minute for ViT-B): the variables'
    # shapes, then normal(0, 0.02) weights; BatchNorm scales and running
    # variances 1, biases and running means 0.
    shapes = jax.eval_shape(model.init, jax.random.key(0), x[:1])
    leaves, tree = jax.tree_util.tree_flatten_with_path(shapes)
    keys = jax.random.split(jax.random.key(0), len(leaves))

    def fill(path, leaf, key):
        name = str(path[-1])
        if "scale" in name or "var" in name:
            return jnp.ones(leaf.shape, leaf.dtype)
        if "bias" in name or "mean" in name:
            return jnp.zeros(leaf.shape, leaf.dtype)
        return 0.02 * jax.random.normal(key, leaf.shape, leaf.dtype)

    variables = jax.tree_util.tree_unflatten(tree, [fill(p, l, k) for (p, l), k in zip(leaves, keys)])
    params = sum(int(np.prod(a.shape)) for a in jax.tree_util.tree_leaves(variables["params"]))
    fwd = jax.jit(model.apply)
    out = [None]

    def step():
        out[0] = fwd(variables, x)
        return out[0]

    def sync():
        if out[0] is not None:
            out[0].block_until_ready()

    def peak():
        stats = jax.devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")

    return step, sync, peak, params, f"jax {jax.__version__}"


def pct(s, q):
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def metric(**kv):
    print("ORCH_METRIC " + " ".join(f"{k}={v:.6g}" for k, v in kv.items() if v is not None), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", choices=["jax", "pytorch"], required=True)
    ap.add_argument("--model", choices=["resnet50", "vit_b_16", "mobilenet_v3_small", "efficientnet_b0"], required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--device", default=None, help="pytorch: cuda or cpu (default: cuda when present)")
    a = ap.parse_args()

    t0 = time.perf_counter()
    if a.framework == "pytorch":
        step, sync, peak, params, version = pytorch_runner(a.model, a.batch_size, a.device)
    else:
        step, sync, peak, params, version = jax_runner(a.model, a.batch_size)
    print(f"{version}: {a.model} {params / 1e6:.2f}M parameters, batch {a.batch_size}", flush=True)
    metric(params=params, load_s=time.perf_counter() - t0)

    print("ORCH_PHASE warmup", flush=True)
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        step()
        sync()
    metric(warmup_s=time.perf_counter() - t0)

    energy = nvml_energy()
    print("ORCH_PHASE measure", flush=True)
    e0 = energy() if energy else None
    times = []
    for _ in range(a.iters):
        sync()
        t = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    e1 = energy() if energy else None

    s = sorted(times)
    images = a.batch_size * a.iters
    metric(
        images_per_s=images / (sum(times) / 1000),
        latency_mean_ms=statistics.fmean(s),
        latency_median_ms=pct(s, 0.5),
        latency_p95_ms=pct(s, 0.95),
        latency_p99_ms=pct(s, 0.99),
        latency_std_ms=statistics.stdev(s) if len(s) > 1 else 0.0,
        latency_min_ms=s[0],
        latency_max_ms=s[-1],
        latency_per_image_ms=statistics.fmean(s) / a.batch_size,
        peak_memory_bytes=peak(),
        energy_j=(e1 - e0) if energy else None,
        energy_per_image_j=(e1 - e0) / images if energy else None,
        steps=a.iters,
        images=images,
    )


if __name__ == "__main__":
    main()
