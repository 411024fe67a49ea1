"""Where the builtin transformer's GPU time goes: one measured training step under
Nsight Compute, kernel time summed by kernel name, as a Markdown table.

    python3 scripts/gpu/profile_transformer.py AGENT > results/gpu-h100-transformer-profile.md
    python3 scripts/gpu/profile_transformer.py --csv ncu.csv > ...   # re-render a saved run

Needs `ncu` on PATH and the CUDA agent (see scripts/bench-gpu.sh). The cell runs no
warm-up and one measured step, then the after-measure step that records the loss and
gradient norm; the table covers the measured step only: the launches from its first
kernel (`embed_fwd`) to the next step's first."""

import collections
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time

CFG = {"preset": "small", "context": 1024, "batch": 8, "vocab": 50304}


def run_ncu(agent):
    sys.path.insert(0, os.path.dirname(__file__))
    import bench_gpu  # needs torch: only where the profile is taken

    d = tempfile.mkdtemp(prefix="orch-ncu-")
    with open(os.path.join(d, "task.json"), "w") as f:
        json.dump(bench_gpu.transformer_task(CFG, 0, 1), f)
    cmd = ["ncu", "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base",
           agent, "run", "--task", os.path.join(d, "task.json"), "--out", d]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, ORCH_TELEMETRY_HZ="0"))
    keep = os.environ.get("OUT")
    if keep:  # the raw table, for a second look
        with open(os.path.join(keep, "ncu.csv"), "w") as f:
            f.write(proc.stdout)
    return proc.stdout


def render(text):
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    rows = [r for r in csv.DictReader(io.StringIO("\n".join(lines[start:])))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    firsts = [i for i, r in enumerate(rows) if r["Kernel Name"].startswith("embed_fwd")]
    step = rows[firsts[0]:firsts[1]] if len(firsts) >= 2 else rows
    by = collections.defaultdict(lambda: [0.0, 0])
    for r in step:
        name = r["Kernel Name"].split("(")[0]
        by[name][0] += float(r["Metric Value"].replace(",", "")) / 1e6  # ns -> ms
        by[name][1] += 1
    total = sum(v[0] for v in by.values())
    out = [f"# Where the builtin transformer's GPU time goes (H100, {time.strftime('%Y-%m-%d')})\n",
           "`transformer` cell (preset small, context 1024, batch 8, vocab 50304, bf16, train, fused",
           "kernels), one measured training step under Nsight Compute:\n",
           "    python3 scripts/gpu/profile_transformer.py target-cuda/release/orch-agent\n",
           f"Kernel time of the step summed by kernel name: {total:.1f} ms in {len(step)} launches",
           "(kernels run one at a time under the profiler; the step takes 30.3 ms without it,",
           "PyTorch eager 45.0 ms and PyTorch with `scaled_dot_product_attention` 28.1 ms:",
           "`results/gpu-h100.json`, `transformer.sweep.small`, same day).\n",
           "| share | ms | kernel | launches |", "|---|---|---|---|"]
    small = [0.0, 0]
    for name, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        if ms / total < 0.005:
            small[0] += ms
            small[1] += n
            continue
        out.append(f"| {100 * ms / total:.1f}% | {ms:.2f} | `{name}` | {n} |")
    out.append(f"| {100 * small[0] / total:.1f}% | {small[0]:.2f} | (kernels under 0.5% each) | {small[1]} |")
    cublas = sum(ms for name, (ms, _) in by.items() if name.startswith(("nvjet", "sm90_", "cutlass")))
    out.append(f"\ncuBLAS matmuls: {100 * cublas / total:.0f}% of the step; orch's fused kernels and candle's "
               "copies, casts and adds: the rest.")
    return "\n".join(out)


def main():
    if sys.argv[1] == "--csv":
        with open(sys.argv[2]) as f:
            text = f.read()
    else:
        text = run_ncu(sys.argv[1])
    print(render(text))


if __name__ == "__main__":
    main()
