"""Forward + backward timing of a decoder-only transformer, small..2.7B, in PyTorch (seed document 003).

The model is ../pytorch-train/train.py's GPT-2-style decoder with the builtin
transformer's presets (d_model/layers/heads/d_ff), random weights, random
tokens. Protocol of the document: `--warmup-steps` unmeasured steps, then
`--measure-steps` steps each timed between `torch.cuda.synchronize()` calls;
mean, std and CV% (std / mean). FP32 by default, as in the document.

`--vram-gib N` caps what PyTorch may allocate on the GPU at N GiB
(`torch.cuda.set_per_process_memory_fraction`), to reproduce a smaller card's
limit on a larger one (the document ran on a 16 GB laptop RTX 4090). A size
that does not fit dies with PyTorch's `OutOfMemoryError`; orch records the cell
`oom` and the sweep goes on.

    python3 benchmark.py --model-size small --context-length 512 --batch-size 4
"""

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pytorch-train"))
from train import PRESETS, Model  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-size", required=True, choices=sorted(PRESETS))
    ap.add_argument("--context-length", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--vocab-size", type=int, default=10000)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--measure-steps", type=int, default=10)
    ap.add_argument("--pass-type", choices=["forward", "train"], default="train")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--vram-gib", type=float, default=None, help="cap on PyTorch's GPU memory")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    dev = torch.device("cuda", torch.cuda.current_device())
    if a.vram_gib:
        total = torch.cuda.get_device_properties(dev).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.vram_gib * 2**30 / total), dev)
    torch.manual_seed(0)
    d, layers, heads, ff = PRESETS[a.model_size]
    model = Model(a.vocab_size, a.context_length, d, layers, heads, ff).to(dev)
    params = sum(p.numel() for p in model.parameters())
    print(f"{a.model_size}: {params / 1e6:.1f}M parameters on {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    tokens = torch.randint(0, a.vocab_size, (a.batch_size, a.context_length), device=dev)
    targets = torch.randint(0, a.vocab_size, (a.batch_size, a.context_length), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            if a.pass_type == "forward":
                with torch.no_grad():
                    return model(tokens)
            logits = model(tokens)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab_size), targets.view(-1))
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss

    print("ORCH_PHASE warmup", flush=True)
    for _ in range(a.warmup_steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    print("ORCH_PHASE measure", flush=True)
    times = []
    for _ in range(a.measure_steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    print("ORCH_PHASE teardown", flush=True)

    s = sorted(times)
    mean = statistics.fmean(s)
    std = statistics.stdev(s) if len(s) > 1 else 0.0
    tok = a.batch_size * a.context_length
    metrics = {
        "step_time_mean_ms": mean,
        "step_time_median_ms": statistics.median(s),
        "step_time_p95_ms": s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)],
        "step_time_std_ms": std,
        "step_time_min_ms": s[0],
        "step_time_max_ms": s[-1],
        "step_time_cv_pct": 100 * std / mean,
        "tokens_per_s": tok / (mean / 1000),
        "steps": a.measure_steps,
        "tokens": a.measure_steps * tok,
        "params": params,
        "torch_peak_memory_bytes": torch.cuda.max_memory_allocated(),
    }
    print("ORCH_METRIC " + " ".join(f"{k}={v}" for k, v in metrics.items()), flush=True)


if __name__ == "__main__":
    main()
