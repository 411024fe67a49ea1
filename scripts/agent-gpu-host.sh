#!/usr/bin/env bash
# The agent exactly as it ships into containers, on a GPU host whose OS is not
# the build machine's: a GPU cell (bf16 matmuls in PyTorch), a CPU cell, and
# the GPU cell again with the static build forced (`ORCH_AGENT_FLAVOR=static`).
# Writes what each recorded (which build ran on what glibc, the GPUs' identity,
# telemetry, energy) as JSON.
#
#   bash scripts/agent-gpu-host.sh [AGENT] [OUT.json]
#     AGENT   default target/x86_64-unknown-linux-gnu/release/orch-agent (scripts/build-agent.sh)
#     OUT     default results/agent-gpu-host.json
#   PYTHON    a Python with PyTorch and CUDA (default /opt/torch/.venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."
agent="${1:-target/$(uname -m)-unknown-linux-gnu/release/orch-agent}"
out="${2:-results/agent-gpu-host.json}"
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x /opt/torch/.venv/bin/python ]; then python=/opt/torch/.venv/bin/python; else python=python3; fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"

python3 - "$work" "$python" <<'EOF'
import json, sys
work, python = sys.argv[1], sys.argv[2]
gpu_prog = r'''
import time, torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    y = x @ x
torch.cuda.synchronize()
print("ORCH_PHASE measure", flush=True)
t0, n = time.time(), 0
while time.time() - t0 < 8:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
    n += 20
dt = time.time() - t0
print(f"ORCH_METRIC steps={n} matmul_tflops={2 * 8192**3 * n / dt / 1e12:.1f}", flush=True)
'''
def task(cell, gpu, argv, env):
    return {
        "version": 1, "run_id": "agent-gpu-host", "cell_id": cell, "gpu": gpu,
        "params": {}, "env": env, "secret_env": [],
        "workload": {"kind": "command", "argv": argv, "workdir": None},
        "measure": {"warmup": 0, "repetitions": 1, "timeout_s": 300.0, "kill_grace_s": 5.0},
        "logs": {"head_bytes": 1 << 20, "tail_bytes": 1 << 20},
        "memory_limit_bytes": None, "weights_dir": None, "strict_hardware": False,
    }
cells = {
    "gpu": task("gpu", "any:1", [python, "-c", gpu_prog], {"ORCH_TELEMETRY_HZ": "10"}),
    "cpu.none": task("cpu.none", "none", ["sh", "-c", "echo ORCH_METRIC x=1"], {}),
    "gpu.static": task("gpu.static", "any:1", [python, "-c", gpu_prog],
                            {"ORCH_TELEMETRY_HZ": "10", "ORCH_AGENT_FLAVOR": "static"}),
}
for name, t in cells.items():
    json.dump(t, open(f"{work}/{name}.json", "w"))
EOF

for cell in gpu cpu.none gpu.static; do
  set +e
  CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" "$agent" run --task "$work/$cell.json" --out "$work/$cell" \
    >"$work/$cell.events" 2>"$work/$cell.stderr"
  echo $? >"$work/$cell.rc"
  set -e
done

python3 - "$work" "$agent" "$out" <<'EOF'
import hashlib, json, os, platform, subprocess, sys
work, agent, out = sys.argv[1:4]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:
        return f"error: {e}"
os_release = dict(
    l.split("=", 1) for l in open("/etc/os-release").read().splitlines() if "=" in l
)
doc = {
    "command": "bash scripts/agent-gpu-host.sh " + agent,
    "host": {
        "os": os_release.get("PRETTY_NAME", "").strip('"'),
        "glibc": platform.libc_ver()[1],
        "kernel": platform.release(),
        "nvidia_smi": sh("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1"),
    },
    "agent": {
        "path": agent,
        "sha256": hashlib.sha256(open(agent, "rb").read()).hexdigest(),
        "bytes": os.path.getsize(agent),
        "version": sh(f"{agent} version"),
        "ldd": sh(f"ldd {agent} 2>&1"),
    },
    "cells": {},
}
for cell in ["gpu", "cpu.none", "gpu.static"]:
    rc = int(open(f"{work}/{cell}.rc").read().strip() or -1)
    entry = {"agent_exit_code": rc}
    try:
        r = json.load(open(f"{work}/{cell}/result.json"))
    except Exception as e:
        entry["error"] = f"no result.json: {e}"
        entry["stderr_tail"] = open(f"{work}/{cell}.stderr").read()[-2000:]
        doc["cells"][cell] = entry
        continue
    info = r.get("info", {})
    tel = info.get("telemetry", {})
    entry.update({
        "status": r["status"],
        "failure": r.get("failure"),
        "agent": info.get("agent"),
        "gpu_source": info.get("gpu_source"),
        "gpu_probe": info.get("gpu_probe"),
        "hardware": r.get("hardware"),
        "flags": r.get("flags", []),
        "metrics": {k: v for k, v in r["metrics"].items()},
        "telemetry_samples": tel.get("samples"),
        "telemetry_sample_cost_us": tel.get("sample_cost_us"),
        "timings_s": r.get("timings"),
    })
    doc["cells"][cell] = entry
json.dump(doc, open(out, "w"), indent=2)
print(json.dumps({c: {k: v.get(k) for k in ("status", "gpu_source")} for c, v in doc["cells"].items()}))
EOF
echo "wrote $out" >&2
