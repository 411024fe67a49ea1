#!/usr/bin/env bash
# Per-cell overhead of the slurm backend on a real (one-node, local) Slurm
# cluster, beside the local backend and beside Slurm itself, in one run:
#   local_ms   orch, local backend: launch to result stored (cell duration_s)
#   slurm_ms   orch, slurm backend: sbatch, scheduling, srun, agent, result
#   sbatch_ms  Slurm alone: `sbatch --wait` of a job whose `srun` runs `true`
# medians (and p90) over CELLS cells each; the workload does nothing.
# Writes results/bench-slurm.json. Needs slurm-wlm and munge, and root.
#   bash scripts/bench-slurm.sh            (PROFILE=dev: the debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
CELLS=${CELLS:-20}
PROFILE=${PROFILE:-release}
cargo build --profile "$PROFILE" --locked -p orch -p orch-fake-slurm --bin orch --bin slurm-cluster >&2
dir=$PROFILE; [ "$PROFILE" = dev ] && dir=debug
ORCH=$PWD/target/$dir/orch
CLUSTER=$PWD/target/$dir/slurm-cluster

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-slurm.XXXXXX")
trap 'rm -rf "$work"' EXIT
values=$(seq -s, 1 "$CELLS")
cat > "$work/noop.yaml" <<YAML
name: overhead
slurm: {poll: 0.5s}
benchmarks:
  - name: noop
    workload: {noop: true}
    matrix:
      i: [$values]
YAML
"$ORCH" run -f "$work/noop.yaml" --backend local --store "$work/local" --json > "$work/local.json"
"$CLUSTER" -- bash -c '
  set -euo pipefail
  "$0" run -f "$1/noop.yaml" --backend slurm --store "$1/slurm" --json > "$1/slurm.json"
  for i in $(seq 1 "$2"); do
    s=$(date +%s.%N)
    sbatch --wait --quiet -o /dev/null --wrap "srun true" >/dev/null
    e=$(date +%s.%N)
    echo "$s $e" >> "$1/sbatch.txt"
  done
' "$ORCH" "$work" "$CELLS"
mkdir -p results
python3 - "$work" "$CELLS" "$PROFILE" <<'PY'
import json, statistics, sys
work, cells, profile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def stats(ds):
    ds = sorted(ds)
    return round(statistics.median(ds), 1), round(ds[int(0.9 * (len(ds) - 1))], 1)
out = {"cells_per_backend": cells, "workload": "builtin noop",
       "measure": "cell record duration_s (launch to result stored); sbatch: wall time of `sbatch --wait --wrap 'srun true'`",
       "cluster": "one node on this machine (orch_fake_slurm), SchedulerType=sched/backfill, slurm poll 0.5s"}
for b in ("local", "slurm"):
    rec = json.load(open(f"{work}/{b}.json"))
    assert all(c["status"] == "succeeded" for c in rec["cells"]), b
    out[f"{b}_ms"], out[f"{b}_p90_ms"] = stats([c["duration_s"] * 1000 for c in rec["cells"]])
    if b == "slurm":
        out["slurm_provision_ms"], _ = stats([c["timings"].get("provision", 0) * 1000 for c in rec["cells"]])
pairs = [tuple(map(float, l.split())) for l in open(f"{work}/sbatch.txt")]
out["sbatch_ms"], out["sbatch_p90_ms"] = stats([(e - s) * 1000 for s, e in pairs])
out["slurm_over_sbatch_ms"] = round(out["slurm_ms"] - out["sbatch_ms"], 1)
out["build_profile"] = profile
out["command"] = "bash scripts/bench-slurm.sh" if profile == "release" else f"PROFILE={profile} bash scripts/bench-slurm.sh"
json.dump(out, open("results/bench-slurm.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
