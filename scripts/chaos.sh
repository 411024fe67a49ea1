#!/usr/bin/env bash
# The fault tests of `crates/orch/tests/it/store/faults.rs`, longer: random `kill -9` of
# `orch run` and of `orch run --resume` (ITERS kills each, seeded by SEED), two
# writers of one run, a full disk (a tmpfs: needs root, else that scenario is
# skipped with a note), too few open files. Each scenario checks its invariant
# (every cell recorded once, finished records unchanged, the ledger counts each
# attempt once, `orch ls`/`cost`/`show` answer) and fails on a breach.
# Writes results/chaos.json: scenarios, iterations, kills, cells lost, cells run twice.
#   bash scripts/chaos.sh            # ITERS=20 SEED=30
#   ITERS=100 SEED=7 bash scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ITERS=${ITERS:-20}
SEED=${SEED:-30}
out=results/chaos.json
dir=$(mktemp -d "${TMPDIR:-/tmp}/chaos.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir -p results
start=$(date +%s)
status=0
ORCH_CHAOS_DIR="$dir" ORCH_FAULT_ITERS="$ITERS" ORCH_FAULT_SEED="$SEED" \
  cargo test --locked -p orch --test it store::faults:: -- --test-threads=1 >&2 || status=$?
end=$(date +%s)
python3 - "$dir" "$out" "$ITERS" "$SEED" "$((end - start))" "$status" <<'PY'
import json, os, sys
d, out, iters, seed, secs, status = sys.argv[1:]
scenarios = []
for name in sorted(os.listdir(d)):
    with open(os.path.join(d, name)) as f:
        scenarios.append(json.load(f))
summary = {
    "command": "bash scripts/chaos.sh",
    "iterations_per_kill_scenario": int(iters),
    "seed": int(seed),
    "seconds": int(secs),
    "tests_passed": status == "0",
    "scenarios": scenarios,
    "cells_lost": sum(s["cells_lost"] for s in scenarios),
    "cells_run_twice": sum(s["cells_run_twice"] for s in scenarios),
}
with open(out, "w") as f:
    json.dump(summary, f, indent=2)
    f.write("\n")
print(json.dumps({k: summary[k] for k in ("tests_passed", "cells_lost", "cells_run_twice")}))
PY
echo "wrote $out" >&2
exit "$status"
