#!/usr/bin/env bash
# What secret masking costs the agent's log capture, measured side by side in
# one run: the same `command` workload writes BYTES (default 1 GiB) of
# vLLM-like log lines to stdout through the real agent (`orch-agent run`),
#   - `off` / `on`: `yes` lines; no secrets, or three secrets masked (one
#     listed by the suite, another, and AWS_SECRET_ACCESS_KEY, a known
#     credential) none of which is printed: the usual case;
#   - `hits_off` / `hits_on`: an awk producer where one line in 100 prints
#     a value, not secret or listed as a secret (so masked: every form is
#     searched and the hits are replaced).
# Modes are interleaved, REPEAT (default 5) rounds; the figure is the median
# throughput of each. Writes results/bench-masking.json.
#   bash scripts/bench-masking.sh [AGENT]
set -euo pipefail
cd "$(dirname "$0")/.."
BYTES=${BYTES:-1073741824}
REPEAT=${REPEAT:-5}
agent=${1:-}
if [ -z "$agent" ]; then
  cargo build --release --locked -p orch-agent >&2
  agent=$PWD/target/release/orch-agent
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-masking.XXXXXX")
trap 'rm -rf "$work"' EXIT

python3 - "$agent" "$work" "$BYTES" "$REPEAT" <<'EOF'
import json, os, platform, statistics, subprocess, sys, time
agent, work, nbytes, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
token = "hf_BenchTok3nAbCdEfGhIjKlMnOpQrStUv"
line = "INFO 11-23 00:00:00 [metrics.py:455] Avg prompt throughput: 1234.5 tokens/s, Avg generation throughput: 567.8 tokens/s, Running: 8 reqs, GPU KV cache usage: 12.3%"
quiet = f"yes '{line}' | head -c {nbytes}"
# One line in 100 carries the token.
hits = ("awk -v t=\"$BENCH_VALUE\" -v l='" + line + "' 'BEGIN { n = 0; while (n < " + str(nbytes) +
        ") { s = (NR++ % 100 == 0) ? l \" token=\" t : l; print s; n += length(s) + 1 } }'")
modes = {"off": (quiet, False), "on": (quiet, True), "hits_off": (hits, False), "hits_on": (hits, True)}

def task(script, secrets):
    return {
        "version": 1, "run_id": "bench", "cell_id": "masking", "gpu": "none",
        "params": {}, "env": {}, "secret_env": ["SUITE_SECRET", "BENCH_VALUE"] if secrets else [],
        "workload": {"kind": "command", "argv": ["sh", "-c", script]},
        "measure": {"warmup": 0, "repetitions": 1, "timeout_s": 600.0, "kill_grace_s": 1.0},
    }

def once(mode):
    script, secrets = modes[mode]
    d = os.path.join(work, mode)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "task.json"), "w") as f:
        json.dump(task(script, secrets), f)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN_PATH")}
    env["HF_HOME"] = os.path.join(work, "hf-home")
    env["BENCH_VALUE"] = token  # printed by the `hits` producer; a secret only when listed
    if secrets:
        env["AWS_SECRET_ACCESS_KEY"] = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
        env["SUITE_SECRET"] = "suite-secret-value-42"
    t0 = time.monotonic()
    subprocess.run([agent, "run", "--task", os.path.join(d, "task.json"), "--out", os.path.join(d, "out")],
                   env=env, stdout=subprocess.DEVNULL, check=True)
    dt = time.monotonic() - t0
    res = json.load(open(os.path.join(d, "out", "result.json")))
    assert res["status"] == "succeeded", res
    written = res["stdout"]["bytes"]
    tail = open(os.path.join(d, "out", "stdout.log"), "rb").read()
    if secrets:
        assert token.encode() not in tail, f"{mode}: token in the log"
    if mode == "hits_on":
        assert b"token=***" in tail, "hits_on: no mask in the log"
    return written / dt / 1e6, dt

# The raw producer alone, without the agent: the ceiling.
def producer(script):
    t0 = time.monotonic()
    subprocess.run(["sh", "-c", script + " > /dev/null"], check=True, env={**os.environ, "BENCH_VALUE": token})
    return nbytes / (time.monotonic() - t0) / 1e6

once("off")  # warm the page cache and the binary
rounds = {m: [] for m in modes}
for _ in range(repeat):
    for m in modes:
        rounds[m].append(once(m)[0])
med = {m: statistics.median(v) for m, v in rounds.items()}
out = {
    "what": "agent log capture throughput (MB/s of workload stdout) with and without secret masking",
    "command": "bash scripts/bench-masking.sh",
    "bytes_per_run": nbytes,
    "repeat": repeat,
    "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "load_avg": os.getloadavg()},
    "producer_alone_mb_s": {"quiet": round(producer(quiet), 1), "hits": round(producer(hits), 1)},
    "runs_mb_s": {m: [round(x, 1) for x in v] for m, v in rounds.items()},
    "median_mb_s": {m: round(v, 1) for m, v in med.items()},
    "overhead_pct": {
        "on_vs_off": round(100 * (med["off"] / med["on"] - 1), 2),
        "hits_on_vs_hits_off": round(100 * (med["hits_off"] / med["hits_on"] - 1), 2),
    },
}
os.makedirs("results", exist_ok=True)
with open("results/bench-masking.json", "w") as f:
    json.dump(out, f, indent=2)
    f.write("\n")
print(json.dumps(out, indent=2))
EOF
