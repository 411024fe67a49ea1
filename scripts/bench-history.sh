#!/usr/bin/env bash
# `orch history` over a large synthetic history (issue 33), in one run:
#   - RUNS synthetic runs (default 10000) of one suite written into a folder store by
#     `cargo run -p orch-history --features synth --example synth` (one cell, metric
#     `output_throughput` around 1000 with 3% noise, planted level shifts SHIFTS),
#   - `orch history SUITE --json` over the folder store, and over the same runs pushed to
#     an S3 store (s3s-fs on this machine, as scripts/bench-store.sh serves it) when
#     S3=1: the median of REPEAT timings of each (they should be within 2x of each other),
#   - change-point precision and recall against the planted shifts (a found change
#     point within +-1 run of a planted one is a hit).
# Writes results/bench-history.json.
#
#   bash scripts/bench-history.sh        # RUNS=10000 SHIFTS="2500:-0.1 6000:0.08" REPEAT=3 S3=0
#
# SKELETON: the `orch history` subcommand is wired into the CLI by the lead; until it
# exists this script stops after writing the store (the S3 part follows bench-store.sh:
# `orch push` of every run, then `--store s3://bench-history/x`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10000}
SHIFTS=${SHIFTS:-"2500:-0.1 6000:0.08"}
REPEAT=${REPEAT:-3}
SEED=${SEED:-1}
S3=${S3:-0}
SUITE=bench-history

cargo build --release -q -p orch
cargo build --release -q -p orch-history --features synth --example synth
ORCH=$PWD/target/release/orch
SYNTH=$PWD/target/release/examples/synth

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$SYNTH" "$work/store" "$SUITE" "$RUNS" "$SEED" $SHIFTS >/dev/null
t1=$(date +%s.%N)
write_s=$(echo "$t1 - $t0" | bc -l)
echo "wrote $RUNS runs in ${write_s}s" >&2

if ! "$ORCH" history --help >/dev/null 2>&1; then
  echo "\`orch history\` is not in this build yet: stopping after the store was written" >&2
  exit 0
fi

# median wall seconds of REPEAT runs of a command (after one warm-up run)
median() {
  "$@" >/dev/null
  local times=()
  for _ in $(seq "$REPEAT"); do
    local t0 t1
    t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {printf "%.4f", a[int((NR+1)/2)]}'
}

folder_s=$(median "$ORCH" history "$SUITE" --json --store "$work/store")
"$ORCH" history "$SUITE" --json --store "$work/store" >"$work/history.json"

s3_s=null
if [ "$S3" = 1 ]; then
  # TODO(lead): serve s3s-fs and push every run as scripts/bench-store.sh does
  # (`push_all "$work/store" history`), then:
  # s3_s=$(median "$ORCH" history "$SUITE" --json --store s3://bench-history/x)
  echo "S3=1: not wired in this skeleton yet" >&2
fi

mkdir -p results
python3 - "$work/history.json" "$RUNS" "$SHIFTS" "$folder_s" "$s3_s" "$write_s" <<'PY'
import json, sys
path, runs, shifts, folder_s, s3_s, write_s = sys.argv[1:]
planted = [int(s.split(":")[0]) for s in shifts.split()]
h = json.load(open(path))
found = [c["point"] for s in h["series"] for c in s["change_points"]]
hits = [p for p in planted if any(abs(f - p) <= 1 for f in found)]
true_found = [f for f in found if any(abs(f - p) <= 1 for p in planted)]
out = {
    "runs": int(runs),
    "write_store_s": round(float(write_s), 2),
    "history_folder_s": float(folder_s),
    "history_s3_s": None if s3_s == "null" else float(s3_s),
    "planted": planted,
    "found": found,
    "recall": len(hits) / len(planted) if planted else None,
    "precision": len(true_found) / len(found) if found else None,
    "method": h.get("method"),
}
json.dump(out, open("results/bench-history.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
