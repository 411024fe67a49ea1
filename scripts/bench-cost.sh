#!/usr/bin/env bash
# `orch cost --by gpu --json` on a synthetic store of CELLS cells (default
# 100000) in RUNS runs, written through the real store code (run folders,
# plans, atomic records, cost ledgers) into a temporary folder.
# Times the command with the ledgers in place (the normal case) and once
# with every ledger removed (each rebuilt from the records on the way).
# Writes results/bench-cost.json (seconds, cells, command).
#   bash scripts/bench-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CELLS=${CELLS:-100000}
RUNS=${RUNS:-20}
REPEAT=${REPEAT:-5}
cargo build --release --locked -p orch -p orch-store --bin orch --example synth-store >&2
ORCH=$PWD/target/release/orch
SYNTH=$PWD/target/release/examples/synth-store

# The store goes to tmpfs when there is one: writing 100k records with two
# fsyncs each takes minutes on a disk, and the figure is about reading.
base=${BENCH_DIR:-}
if [ -z "$base" ]; then
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=/dev/shm; else base=${TMPDIR:-/tmp}; fi
fi
work=$(mktemp -d "$base/bench-cost.XXXXXX")
trap 'rm -rf "$work"' EXIT
store="$work/store"
start=$(date +%s.%N)
written=$("$SYNTH" "$store" "$CELLS" "$RUNS")
end=$(date +%s.%N)
echo "wrote $written cells in $RUNS runs in $(echo "$end - $start" | bc) s" >&2

fs=$(stat -f -c %T "$work")
python3 - "$ORCH" "$store" "$written" "$RUNS" "$REPEAT" "$fs" <<'PY'
import glob, json, os, statistics, subprocess, sys, time
orch, store, cells, runs, repeat, fs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
cmd = [orch, "cost", "--by", "gpu", "--json", "--store", store]

def timed():
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t, json.loads(out.stdout)

_, first = timed()
assert first["total"]["cells"] == cells, first["total"]
times = [timed()[0] for _ in range(repeat)]

# Ledgers gone: each is rebuilt from the records while the command runs.
for p in glob.glob(os.path.join(store, "*", "costs.jsonl")):
    os.remove(p)
rebuild, again = timed()
assert again["total"]["cells"] == cells
assert abs(again["total"]["usd"] - first["total"]["usd"]) < 1e-6 * max(1.0, first["total"]["usd"])
after = timed()[0]

out = {
    "cells": cells,
    "runs": runs,
    "seconds": round(statistics.median(times), 3),
    "seconds_runs": [round(t, 3) for t in times],
    "rebuild_seconds": round(rebuild, 3),
    "seconds_after_rebuild": round(after, 3),
    "total_usd": round(first["total"]["usd"], 2),
    "wasted_usd": round(first["total"]["wasted_usd"], 2),
    "groups": len(first["groups"]),
    "store_filesystem": fs,
    "cpus": os.cpu_count(),
    "command": "orch cost --by gpu --json --store STORE",
    "script": "bash scripts/bench-cost.sh",
    "note": f"median of {repeat} runs, page cache warm, runs read in parallel on every core; rebuild_seconds: every costs.jsonl removed first, so each run's ledger is rebuilt from its result.json files",
}
os.makedirs("results", exist_ok=True)
json.dump(out, open("results/bench-cost.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
