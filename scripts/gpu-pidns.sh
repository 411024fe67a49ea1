#!/bin/bash
# On a GPU machine: the PID-namespace launcher with a real GPU workload (local backend):
# a PyTorch matmul cell, then `pkill -9 orch` while a workload and a detached (setsid)
# child hold GPU memory; afterwards no process of the workload and no GPU memory may be
# left. Output: $OUT/run.json (the record), the process and nvidia-smi listings on stdout.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The orch binary: $ORCH, or devrun/orch.xz carried to the GPU machine (73 MB unpacked).
if [ -n "${ORCH:-}" ]; then cp "$ORCH" /tmp/orch; else xz -dc devrun/orch.xz > /tmp/orch; fi && chmod +x /tmp/orch
nvidia-smi --query-gpu=name,memory.used --format=csv
W=$(mktemp -d)
cat > $W/gpu.py <<'PY'
import os, sys, time, subprocess, torch
print("pid", os.getpid(), "ns-pid-ok", os.path.exists(f"/proc/{os.getpid()}"), flush=True)
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t = time.time(); n = 50
for _ in range(n):
    y = x @ x
torch.cuda.synchronize()
dt = time.time() - t
print(f"ORCH_METRIC tflops={2*8192**3*n/dt/1e12:.1f}", flush=True)
if len(sys.argv) > 1:
    # A detached GPU process that would outlive its parent without containment.
    subprocess.Popen(["setsid", sys.executable, "-c",
        "import torch,time; a=torch.empty(4<<30, dtype=torch.uint8, device='cuda'); time.sleep(1000.4242)"])
    time.sleep(600)
PY
cat > $W/suite.yaml <<EOF2
name: pidns-gpu
gpus: ["H100:1"]
benchmarks:
  - name: mm
    workload: {command: [python3, $W/gpu.py]}
EOF2
cd $W
/tmp/orch run -f suite.yaml --store $W/s --json > $OUT/run.json 2> $OUT/run.err; echo "run rc $?"
python3 - <<'PY' "$OUT/run.json"
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["cells"]:
    print(c["id"], c["status"], c.get("metrics", {}).get("tflops"), c.get("info", {}).get("containment"),
          (c.get("hardware") or {}).get("gpus", [{}])[0].get("name") if c.get("hardware") else None)
PY
# pkill -9 of every orch process while a GPU workload and a detached GPU child run.
cat > suite2.yaml <<EOF2
name: pidns-kill
gpus: ["H100:1"]
benchmarks:
  - name: hold
    workload: {command: [python3, $W/gpu.py, detach]}
EOF2
/tmp/orch run -f suite2.yaml --store $W/s2 > $OUT/kill.log 2>&1 &
sleep 25
echo "before kill:"; ps -eo pid,comm,args | grep -E "orch|1000.4242|gpu.py" | grep -v grep
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
pkill -9 orch
sleep 5
echo "after pkill -9 orch:"; ps -eo pid,comm,args | grep -E "orch|1000.4242|gpu.py" | grep -v grep || echo "no process left"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv
nvidia-smi --query-gpu=memory.used --format=csv
