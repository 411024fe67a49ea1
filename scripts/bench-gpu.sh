#!/usr/bin/env bash
# orch's agent side by side with PyTorch on one GPU, in one run (see
# scripts/gpu/bench_gpu.py). Run on a machine with an NVIDIA GPU and PyTorch:
#   bash scripts/bench-gpu.sh [--transformer-only] [ORCH_BIN] [CUDA_AGENT_BIN]
# Build here: `cargo build --release -p orch` and, with a CUDA toolkit,
# `cargo build --release -p orch-agent --features cuda`.
# Writes results/gpu-<model>.json and results/gpu-train-<model>.json; with
# `--transformer-only` (no `orch` needed), only the builtin transformer's
# kernel checks, agreement with PyTorch and preset sweep, to
# results/gpu-<model>-transformer.json.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=()
if [ "${1:-}" = --transformer-only ]; then mode=(--transformer-only); shift; fi
orch=${1:-target/release/orch}
agent=${2:-target-cuda/release/orch-agent}
need=("$agent")
[ ${#mode[@]} -eq 0 ] && need+=("$orch")
for f in "${need[@]}"; do
  [ -x "$f" ] || { echo "error: \`$f\` is not an executable; build it first (see the header of this script)" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null || { echo "error: no \`nvidia-smi\`: run this on a machine with an NVIDIA GPU" >&2; exit 2; }
# The CUDA agent links the CUDA runtime libraries (cublas, cudart, curand)
# dynamically: use PyTorch's copies when the system has none.
if ldd "$agent" | grep -q 'not found'; then
  libs=$(python3 -c 'import os, nvidia; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
  export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ldd "$agent" | grep 'not found' && { echo "error: the agent's libraries are missing" >&2; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
PYTHONUNBUFFERED=1 python3 scripts/gpu/bench_gpu.py "${mode[@]}" --orch "$orch" --agent "$agent" --out results
