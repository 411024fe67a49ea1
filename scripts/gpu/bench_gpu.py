"""orch's agent side by side with PyTorch on one GPU, in one run.

Run by scripts/bench-gpu.sh on a machine with an NVIDIA GPU and PyTorch:

1. `orch run -f manifests/gpu-h100.yaml` with the CUDA agent: calibration
   (matmul bf16/f16/f32, copy bandwidth), the builtin bf16 transformer training
   step, and a PyTorch training script as a `command` cell; every cell with
   its hardware (NVML), telemetry and energy.
2. The same calibration and the same transformer step (same shapes, same
   math: pre-LN GPT-2 block, explicit causal softmax attention, tanh GELU,
   bf16 weights, f32 cross-entropy, forward + backward, no optimizer) in PyTorch.
3. Telemetry overhead: the builtin transformer run by the agent alone with
   sampling off and at 10 Hz, alternated.

Writes results/gpu-<model>.json (every figure, and `ratios`: orch / PyTorch
throughput, 1.0 = parity) and results/gpu-train-<model>.json (the PyTorch
training cells as orch recorded them).
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

REP_SECONDS = 0.02  # as the agent's calibrate: each timed repetition lasts >= 20 ms


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def timed(fn, reps, inner):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1000 / inner)
    return out


def inner_count(single_s, rep_s):
    return max(1, min(100000, math.ceil(max(rep_s, REP_SECONDS) / max(single_s, 1e-7))))


def torch_calibrate(n, copy_bytes, warmup, reps, seconds_per_metric):
    rep_s = seconds_per_metric / reps
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for name, dt in (("bf16", torch.bfloat16), ("f16", torch.float16), ("f32", torch.float32)):
        a = torch.randn(n, n, device="cuda").to(dt)
        b = torch.randn(n, n, device="cuda").to(dt)
        k = inner_count(median(timed(lambda: a @ b, warmup, 1)), rep_s)
        secs = timed(lambda: a @ b, reps, k)
        out[f"matmul_{name}_tflops"] = median([2 * n**3 / s / 1e12 for s in secs])
        del a, b
    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device="cuda")
    k = inner_count(median(timed(lambda: src.clone(), warmup, 1)), rep_s)
    secs = timed(lambda: src.clone(), reps, k)
    out["bandwidth_gbs"] = median([2 * (copy_bytes // 4) * 4 / s / 1e9 for s in secs])
    del src
    torch.cuda.empty_cache()
    return out


PRESETS = {"nano": (64, 2, 4, 256), "tiny": (128, 4, 4, 512), "mini": (256, 4, 8, 1024),
           "small": (768, 12, 12, 3072), "medium": (1024, 24, 16, 4096), "large": (1280, 36, 20, 5120),
           "xl": (1600, 48, 25, 6400), "2.7B": (2560, 32, 32, 10240)}


def torch_model(cfg, weights=None):
    """The agent's builtin transformer, op for op, in eager PyTorch (bf16 weights).

    `weights`: tensors by the agent's parameter names (from ORCH_TRANSFORMER_DUMP);
    else fresh seeded ones. Returns (named params, forward(attention) -> logits)."""
    d, layers, heads, ff = PRESETS[cfg["preset"]]
    t, b, vocab = cfg["context"], cfg["batch"], cfg["vocab"]
    dt = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)

    def normal(*shape):
        return (torch.randn(*shape, device="cuda", generator=g) * 0.02).to(dt).requires_grad_()

    def ones(n):
        return torch.ones(n, device="cuda", dtype=dt, requires_grad=True)

    def zeros(n):
        return torch.zeros(n, device="cuda", dtype=dt, requires_grad=True)

    if weights is None:
        p = {"wte": normal(vocab, d), "wpe": normal(t, d), "lnf_g": ones(d), "lnf_b": zeros(d), "head": normal(d, vocab)}
        for i in range(layers):
            for k, v in dict(ln1_g=ones(d), ln1_b=zeros(d), w_qkv=normal(d, 3 * d), b_qkv=zeros(3 * d),
                             w_o=normal(d, d), b_o=zeros(d), ln2_g=ones(d), ln2_b=zeros(d),
                             w1=normal(d, ff), b1=zeros(ff), w2=normal(ff, d), b2=zeros(d)).items():
                p[f"h{i}.{k}"] = v
    else:
        p = {k: v.to("cuda", dt).requires_grad_() for k, v in weights.items()}
    mask = torch.triu(torch.full((t, t), -1e9, device="cuda"), diagonal=1).to(dt)
    hd = d // heads

    def forward(tokens, attention="explicit"):
        x = (p["wte"][tokens].view(b, t, d) + p["wpe"]).view(b * t, d)
        for i in range(layers):
            w = lambda k: p[f"h{i}.{k}"]
            h = F.layer_norm(x, (d,), w("ln1_g"), w("ln1_b"), 1e-5)
            qkv = (h @ w("w_qkv") + w("b_qkv")).view(b, t, 3, heads, hd)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
            if attention == "sdpa":
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q * (1.0 / hd**0.5)) @ k.transpose(-1, -2) + mask
                a = torch.softmax(scores, dim=-1) @ v
            x = x + (a.transpose(1, 2).reshape(b * t, d) @ w("w_o") + w("b_o"))
            h = F.layer_norm(x, (d,), w("ln2_g"), w("ln2_b"), 1e-5)
            x = x + (F.gelu(h @ w("w1") + w("b1"), approximate="tanh") @ w("w2") + w("b2"))
        return F.layer_norm(x, (d,), p["lnf_g"], p["lnf_b"], 1e-5) @ p["head"]

    return p, forward


def torch_transformer(cfg, warmup, reps, attention="explicit", train=True):
    """Step times and peak allocated memory of the same step in PyTorch."""
    b, t, vocab = cfg["batch"], cfg["context"], cfg["vocab"]
    torch.cuda.empty_cache()
    params, forward = torch_model(cfg)
    tokens = torch.randint(0, vocab, (b * t,), device="cuda")
    targets = torch.randint(0, vocab, (b * t,), device="cuda")

    def step():
        if not train:
            with torch.no_grad():
                forward(tokens, attention)
            return
        loss = F.cross_entropy(forward(tokens, attention).float(), targets)
        loss.backward()
        for p in params.values():
            p.grad = None

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    peak = torch.cuda.max_memory_allocated()
    del params, forward
    torch.cuda.empty_cache()
    return {"step_time_median_ms": median(times), "step_time_mean_ms": statistics.fmean(times),
            "tokens_per_s": b * t / (statistics.fmean(times) / 1000), "peak_allocated_bytes": peak,
            "step_times_ms": times}


def transformer_task(cfg, warmup, reps, pass_="train"):
    return {"version": 1, "run_id": "bench", "cell_id": f"transformer.{cfg['preset']}", "gpu": "H100",
            "workload": {"kind": "builtin", "name": "transformer", "preset": cfg["preset"], "context": cfg["context"],
                         "batch": cfg["batch"], "vocab": cfg["vocab"], "pass": pass_, "dtype": "bf16"},
            "measure": {"warmup": warmup, "repetitions": reps, "timeout_s": 600.0, "kill_grace_s": 5.0}}


def kernel_checks(agent):
    """`orch-agent check-kernels`: every fused op and a whole step against the unfused composition."""
    proc = subprocess.run([agent, "check-kernels", "cuda"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checks = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    worst = {}
    for c in checks:
        key = c["dtype"]
        worst[key] = max(worst.get(key, 0.0), c["check"]["rel_err"])
    return {"exit_code": proc.returncode, "count": len(checks), "failed": [c for c in checks if not c["check"]["ok"]],
            "worst_rel_err": worst, "stderr": proc.stderr[-2000:]}


def pytorch_agreement(agent, cfg):
    """One step of the agent's model and of PyTorch's on the same weights and tokens: loss, gradient norm,
    and each parameter's gradient (relative error = |a - b|_2 / |b|_2)."""
    from safetensors.torch import load_file
    d = tempfile.mkdtemp(prefix="orch-dump-")
    path = os.path.join(d, "step.safetensors")
    r = run_agent(agent, transformer_task(cfg, 0, 1), {"ORCH_TRANSFORMER_DUMP": path, "ORCH_TELEMETRY_HZ": "0"})
    dump = load_file(path, device="cuda")
    weights = {k[len("param."):]: v for k, v in dump.items() if k.startswith("param.")}
    params, forward = torch_model(cfg, weights)
    tokens, targets = dump["tokens"].long(), dump["targets"].long()
    loss = F.cross_entropy(forward(tokens).float(), targets)
    loss.backward()
    rel = {}
    sq = 0.0
    for k, p in params.items():
        g, a = p.grad.float(), dump["grad." + k].float()
        sq += float((g * g).sum())
        rel[k] = float((a - g).norm() / g.norm().clamp_min(1e-12))
    torch_norm = math.sqrt(sq)
    shutil.rmtree(d, ignore_errors=True)
    worst = sorted(rel.items(), key=lambda kv: -kv[1])[:5]
    return {"agent_loss": r["info"].get("loss"), "torch_loss": float(loss),
            "agent_grad_norm": r["info"].get("grad_norm"), "torch_grad_norm": torch_norm,
            "loss_rel_diff": abs(r["info"]["loss"] - float(loss)) / abs(float(loss)),
            "grad_norm_rel_diff": abs(r["info"]["grad_norm"] - torch_norm) / torch_norm,
            "grad_rel_err_median": median(list(rel.values())), "grad_rel_err_worst": dict(worst),
            "note": "both bf16; the agent's backward is written out, PyTorch's is autograd"}


def transformer_sweep(agent, presets, warmup, reps, pass_="train"):
    """The fused agent against PyTorch eager (explicit softmax) and SDPA per preset: step time, peak memory,
    and the agent's memory estimate (its `oom` preflight) against what it used."""
    out = {}
    for preset in presets:
        cfg = {"preset": preset, "context": 1024, "batch": 8, "vocab": 50304}
        row = {"config": cfg | {"pass": pass_}}
        try:
            r = run_agent(agent, transformer_task(cfg, warmup, reps, pass_), {"ORCH_TELEMETRY_HZ": "0"})
            row["orch"] = {"status": r["status"], "step_time_median_ms": r["metrics"].get("step_time_median_ms"),
                           "peak_pool_bytes": r["info"].get("gpu_pool_peak_bytes"),
                           "estimated_bytes": r["info"].get("estimated_bytes"), "kernels": r["info"].get("kernels"),
                           "fused_compile_ms": r["info"].get("fused_compile_ms"),
                           "failure": (r.get("failure") or {}).get("message") if isinstance(r.get("failure"), dict) else r.get("failure")}
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            row["orch"] = {"error": str(e)}
        for name, attn in (("pytorch_eager", "explicit"), ("pytorch_sdpa", "sdpa")):
            try:
                tr = torch_transformer(cfg, warmup, reps, attn, train=pass_ == "train")
                row[name] = {k: v for k, v in tr.items() if k != "step_times_ms"}
            except torch.OutOfMemoryError as e:
                row[name] = {"error": "out of memory"}
                torch.cuda.empty_cache()
        o, e = row["orch"], row.get("pytorch_eager", {})
        if o.get("step_time_median_ms") and e.get("step_time_median_ms"):
            row["ratio_vs_eager"] = e["step_time_median_ms"] / o["step_time_median_ms"]
        if o.get("step_time_median_ms") and row.get("pytorch_sdpa", {}).get("step_time_median_ms"):
            row["ratio_vs_sdpa"] = row["pytorch_sdpa"]["step_time_median_ms"] / o["step_time_median_ms"]
        if o.get("peak_pool_bytes") and e.get("peak_allocated_bytes"):
            row["memory_ratio_vs_eager"] = o["peak_pool_bytes"] / e["peak_allocated_bytes"]
        if o.get("peak_pool_bytes") and o.get("estimated_bytes"):
            row["estimate_error"] = o["estimated_bytes"] / o["peak_pool_bytes"] - 1
        print(f"  {preset}: {json.dumps({k: v for k, v in row.items() if k.startswith(('ratio', 'memory', 'estimate'))})}", file=sys.stderr)
        out[preset if pass_ == "train" else f"{preset}.{pass_}"] = row
    return out


def run_agent(agent, task, env_extra):
    d = tempfile.mkdtemp(prefix="orch-agent-")
    path = os.path.join(d, "task.json")
    with open(path, "w") as f:
        json.dump(task, f)
    env = dict(os.environ, **env_extra)
    subprocess.run([agent, "run", "--task", path, "--out", d], check=True, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(d, "result.json")) as f:
        r = json.load(f)
    shutil.rmtree(d, ignore_errors=True)
    return r


def transformer_report(a):
    """Kernel checks, agreement with PyTorch on the same weights, and the preset sweep."""
    small = {"preset": "small", "context": 1024, "batch": 8, "vocab": 50304}
    print("kernel checks...", file=sys.stderr)
    checks = kernel_checks(a.agent)
    print(f"  {checks['count']} checks, {len(checks['failed'])} failed, worst {checks['worst_rel_err']}", file=sys.stderr)
    print("agreement with PyTorch...", file=sys.stderr)
    agreement = pytorch_agreement(a.agent, small)
    print(f"  {json.dumps({k: v for k, v in agreement.items() if 'diff' in k or 'median' in k})}", file=sys.stderr)
    print("preset sweep...", file=sys.stderr)
    sweep = transformer_sweep(a.agent, [p for p in a.presets.split(",") if p], 5, 20)
    sweep |= transformer_sweep(a.agent, [p for p in a.memory_presets.split(",") if p], 1, 3)
    sweep |= transformer_sweep(a.agent, ["small"], 5, 20, pass_="forward")
    return {"kernel_checks": checks, "pytorch_agreement": agreement, "sweep": sweep}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orch", required=True)
    ap.add_argument("--agent", required=True)
    ap.add_argument("--manifest", default="manifests/gpu-h100.yaml")
    ap.add_argument("--out", default="results")
    ap.add_argument("--gpu", default=None, help="GPU spec for the suite (default: from the device name)")
    ap.add_argument("--transformer-only", action="store_true",
                    help="only the builtin transformer: kernel checks, PyTorch agreement, preset sweep")
    ap.add_argument("--presets", default="small,medium,large", help="presets timed against PyTorch")
    ap.add_argument("--memory-presets", default="xl,2.7B", help="presets run briefly for memory and the oom estimate")
    a = ap.parse_args()

    name = torch.cuda.get_device_name()
    model = next((m for m in ("H200", "H100", "A100", "L40S", "L4", "A10G", "T4") if re.search(rf"\b{m}\b", name)), "gpu")
    slug = model.lower()
    transformer = transformer_report(a)
    if a.transformer_only:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"gpu-{slug}-transformer.json"), "w") as f:
            json.dump({"gpu": name, "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
                       "command": "bash scripts/bench-gpu.sh --transformer-only"} | transformer, f, indent=2)
        return
    spec = a.gpu or model
    store = tempfile.mkdtemp(prefix="orch-store-")
    env = dict(os.environ, ORCH_AGENT=a.agent)
    t0 = time.time()
    proc = subprocess.run([a.orch, "--store", store, "run", "-f", a.manifest, "--gpu", spec, "--json"],
                          env=env, stdout=subprocess.PIPE, text=True)
    orch_wall = time.time() - t0
    print(f"orch run exited {proc.returncode} in {orch_wall:.1f} s", file=sys.stderr)
    record = json.loads(proc.stdout)
    cells = {c["benchmark"] + ("." + str(c["params"].get("preset")) if c["params"] else ""): c for c in record["cells"]}
    for cid, c in cells.items():
        print(f"  {cid}: {c['status']} flags={c.get('flags', [])}", file=sys.stderr)
    cal = cells["calibrate"]
    tr = cells["transformer"]

    with open(os.path.join(store, record["id"], "plan.json")) as f:
        plan = json.load(f)
    cal_task = next(c["task"] for c in plan["cells"] if c["benchmark"] == "calibrate")
    tr_task = next(c["task"] for c in plan["cells"] if c["benchmark"] == "transformer")
    n = cal["info"].get("matmul_size", 8192)
    copy_bytes = cal["info"].get("copy_bytes", 4 << 30)
    tcfg = dict(tr_task["workload"])
    tcfg = {"preset": tcfg["preset"], "context": tcfg["context"], "batch": tcfg["batch"], "vocab": tcfg["vocab"]}

    torch_cal = torch_calibrate(n, copy_bytes, cal_task["measure"]["warmup"], cal_task["measure"]["repetitions"],
                                cal["info"].get("seconds_per_metric", 2.0))
    torch_tr = torch_transformer(tcfg, tr_task["measure"]["warmup"], tr_task["measure"]["repetitions"])

    # Telemetry overhead: the same agent transformer cell, sampling off vs 10 Hz, alternated.
    overhead = {"off_ms": [], "on_ms": []}
    for _ in range(2):
        for key, hz in (("off_ms", "0"), ("on_ms", "10")):
            r = run_agent(a.agent, tr_task, {"ORCH_TELEMETRY_HZ": hz})
            overhead[key].append(r["metrics"]["step_time_median_ms"])
    off, on = median(overhead["off_ms"]), median(overhead["on_ms"])
    overhead["step_time_change_pct"] = (on - off) / off * 100
    overhead["sampler_cpu_pct"] = tr["metrics"].get("telemetry_cpu_pct")
    overhead["sample_cost_us"] = tr["info"].get("telemetry", {}).get("sample_cost_us")

    agent_tr = tr["metrics"]
    ratios = {
        "matmul_bf16": cal["metrics"]["matmul_bf16_tflops"] / torch_cal["matmul_bf16_tflops"],
        "matmul_f16": cal["metrics"]["matmul_f16_tflops"] / torch_cal["matmul_f16_tflops"],
        "matmul_f32": cal["metrics"]["matmul_f32_tflops"] / torch_cal["matmul_f32_tflops"],
        "bandwidth": cal["metrics"]["bandwidth_gbs"] / torch_cal["bandwidth_gbs"],
        "transformer_step": torch_tr["step_time_median_ms"] / agent_tr["step_time_median_ms"],
    }
    hw = cal.get("hardware") or {}
    out = {
        "gpu": name,
        "model": model,
        "date": time.strftime("%Y-%m-%d"),
        "command": "bash scripts/bench-gpu.sh",
        "ratio_definition": "orch throughput / PyTorch throughput (TFLOP/s, GB/s, steps/s); 1.0 = parity, higher = orch faster",
        "software": {"torch": torch.__version__, "cuda_runtime_torch": torch.version.cuda, "python": platform.python_version(),
                     "driver": hw.get("driver_version"), "cuda_driver": hw.get("cuda_version")},
        "hardware": hw,
        "flags": {cid: c.get("flags", []) for cid, c in cells.items()},
        "orch": {
            "calibrate": cal["metrics"],
            "calibration_check": cal["info"].get("calibration_check"),
            "transformer": {k: v for k, v in agent_tr.items()},
            "transformer_config": tcfg | {"dtype": "bf16", "pass": "train"},
        },
        "pytorch": {"calibrate": torch_cal, "transformer": {k: v for k, v in torch_tr.items() if k != "step_times_ms"}},
        "ratios": ratios,
        "transformer": transformer,
        "telemetry_overhead": overhead,
        "telemetry_during_calibration": {k: cal["metrics"].get(k) for k in (
            "gpu_util_mean_pct", "gpu_power_mean_w", "gpu_energy_j", "gpu_sm_clock_mean_mhz", "gpu_peak_memory_bytes", "gpu_temp_max_c")},
        "orch_run": {"exit_code": proc.returncode, "wall_s": orch_wall, "counts": record.get("counts")},
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"gpu-{slug}.json"), "w") as f:
        json.dump(out, f, indent=2)
    train = {cid: {k: c.get(k) for k in ("status", "gpu", "params", "metrics", "timings", "flags", "hardware", "cost", "diagnosis", "duration_s")}
             | {"telemetry": c.get("info", {}).get("telemetry")}
             for cid, c in cells.items() if c["benchmark"] == "pytorch-train"}
    with open(os.path.join(a.out, f"gpu-train-{slug}.json"), "w") as f:
        json.dump({"gpu": name, "date": out["date"], "manifest": a.manifest, "command": "bash scripts/bench-gpu.sh", "cells": train}, f, indent=2)
    # Keep the whole run folder (logs, telemetry.jsonl) for inspection.
    keep = os.environ.get("OUT")
    if keep:
        shutil.make_archive(os.path.join(keep, "gpu-run"), "gztar", store)
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
