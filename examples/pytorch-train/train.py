"""A seed-003/004-style training benchmark in PyTorch, run by orch as a `command` workload.

A GPT-2-style decoder (pre-LayerNorm) trained on random tokens with AdamW under
bf16 autocast: warm-up steps, then measured steps, each timed between CUDA
synchronisations. It tells orch its phases and numbers on stdout:

    ORCH_PHASE warmup | ORCH_PHASE measure
    ORCH_METRIC name=value ...

`steps` and `tokens` are what the measured phase did: orch divides the GPU
energy it measured over that phase by them (gpu_energy_per_step_j, _per_token_j).
A model that does not fit exits with PyTorch's OutOfMemoryError, which orch
records as the cause.
"""

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # d_model, layers, heads, d_ff (the agent's builtin presets)
    "small": (768, 12, 12, 3072),
    "medium": (1024, 24, 16, 4096),
    "large": (1280, 36, 20, 5120),
    "xl": (1600, 48, 25, 6400),
    "2.7B": (2560, 32, 32, 10240),
}


class Block(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, vocab, context, d, layers, heads, ff):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, ff) for _ in range(layers))
        self.lnf = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.lnf(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--preset", default="small", choices=sorted(PRESETS))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50304)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=50)
    a = p.parse_args()

    dev = torch.device("cuda")
    torch.manual_seed(0)
    d, layers, heads, ff = PRESETS[a.preset]
    model = Model(a.vocab, a.context, d, layers, heads, ff).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"{a.preset}: {params / 1e6:.1f}M parameters on {torch.cuda.get_device_name()}", flush=True)
    tokens = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
            loss = F.cross_entropy(logits.float().view(-1, a.vocab), targets.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    print("ORCH_PHASE warmup", flush=True)
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()

    print("ORCH_PHASE measure", flush=True)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    print("ORCH_PHASE teardown", flush=True)

    times.sort()
    mean = statistics.fmean(times)
    tok = a.batch * a.context
    # 6 * params * tokens: forward + backward matmul FLOPs (attention not counted).
    mfu_tflops = 6 * params * tok / (mean / 1000) / 1e12
    metrics = {
        "step_time_mean_ms": mean,
        "step_time_median_ms": statistics.median(times),
        "step_time_p95_ms": times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)],
        "step_time_std_ms": statistics.pstdev(times),
        "tokens_per_s": tok / (mean / 1000),
        "samples_per_s": a.batch / (mean / 1000),
        "model_tflops": mfu_tflops,
        "steps": a.steps,
        "tokens": a.steps * tok,
        "params": params,
        "torch_peak_memory_bytes": torch.cuda.max_memory_allocated(),
        "final_loss": float(loss),
    }
    print("ORCH_METRIC " + " ".join(f"{k}={v}" for k, v in metrics.items()), flush=True)


if __name__ == "__main__":
    main()
