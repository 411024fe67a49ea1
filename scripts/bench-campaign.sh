#!/usr/bin/env bash
# A campaign against the same tasks run one `orch run` at a time, in one run
# (issue 46, item 8), and the scoring's own cost on a store of 1,000 tasks:
#  - campaign: `orch run -f manifests/campaign-standin.yaml --jobs JOBS`, its
#    wall time and cost (from the run record);
#  - one at a time: the same twelve tasks, each its own one-row campaign run
#    by its own `orch run` (what a user without campaigns writes: a loop),
#    wall time and cost summed;
#  - scoring: the campaign's run copied into a store of TASKS (default 1,000)
#    tasks (rows repeated under new ids), then `orch report RUN --format json`
#    timed (median of 3): it reads every record and scores every task.
# Writes results/bench-campaign.json.
#   bash scripts/bench-campaign.sh                  (CPU: --gpu none, JOBS=2)
#   GPU=H200:1 JOBS=2 bash scripts/bench-campaign.sh  (one GPU per task)
# PRICES=FILE prices the cells (examples/seed-frameworks/modal-prices.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=${GPU:-none}
JOBS=${JOBS:-2}
TASKS=${TASKS:-1000}
ORCH=${ORCH:-}
if [ -z "$ORCH" ]; then
  cargo build --release --locked -p orch >&2
  ORCH=$PWD/target/release/orch
fi
prices=()
[ -n "${PRICES:-}" ] && prices=(--prices "$PRICES")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-campaign.XXXXXX")
trap 'rm -rf "$work"' EXIT
ex=$PWD/examples/campaign-standin
bash "$ex/make-repo.sh" "$work/repo" >&2
cp -r "$ex/patches" "$work/patches"
cp "$ex/tasks.jsonl" "$work/tasks.jsonl"
sed -e 's#tasks: ../examples/campaign-standin/tasks.jsonl#tasks: tasks.jsonl#' \
    -e 's#repo: ../examples/campaign-standin/repo#repo: repo#' \
    manifests/campaign-standin.yaml > "$work/campaign.yaml"

now() { python3 -c 'import time; print(time.monotonic())'; }
cost_of() { # run folder -> dollars
  python3 - "$1" <<'PY'
import json, pathlib, sys
total = 0.0
for r in pathlib.Path(sys.argv[1]).glob("cells/*/result.json"):
    c = json.loads(r.read_text()).get("cost") or {}
    total += c.get("usd", 0.0)
print(total)
PY
}

echo "campaign: 12 tasks, --jobs $JOBS, --gpu $GPU" >&2
t0=$(now)
"$ORCH" --store "$work/store-campaign" "${prices[@]}" run -f "$work/campaign.yaml" --gpu "$GPU" --jobs "$JOBS" >/dev/null 2>"$work/campaign.err" || true
t1=$(now)
run=$(ls "$work/store-campaign" | grep -v '^\.' | head -1)
campaign_s=$(python3 -c "print($t1 - $t0)")
campaign_usd=$(cost_of "$work/store-campaign/$run")

echo "one at a time: 12 runs of one task" >&2
t0=$(now)
single_usd=0
while IFS= read -r row; do
  case "$row" in "#"*|"") continue ;; esac
  id=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["id"])' "$row")
  d="$work/single/$id"
  mkdir -p "$d"
  printf '%s\n' "$row" > "$d/tasks.jsonl"
  ln -s "$work/repo" "$d/repo"
  ln -s "$work/patches" "$d/patches"
  cp "$work/campaign.yaml" "$d/campaign.yaml"
  "$ORCH" --store "$work/store-single" "${prices[@]}" run -f "$d/campaign.yaml" --gpu "$GPU" >/dev/null 2>>"$work/single.err" || true
done < "$work/tasks.jsonl"
t1=$(now)
single_s=$(python3 -c "print($t1 - $t0)")
for r in "$work"/store-single/*/; do
  single_usd=$(python3 -c "print($single_usd + $(cost_of "$r"))")
done

echo "scoring: $TASKS stored tasks" >&2
python3 - "$work/store-campaign/$run" "$work/store-big" "$TASKS" <<'PY'
import json, pathlib, shutil, sys
src, dst, n = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
run = dst / src.name
shutil.copytree(src, run, ignore=shutil.ignore_patterns("cells", "report"))
plan = json.loads((src / "plan.json").read_text())
cells, out = plan["cells"], []
for i in range(n):
    c = json.loads(json.dumps(cells[i % len(cells)]))
    old = c["id"]
    tid = f"{c['campaign']['id']}-{i:05d}"
    c["id"] = old.replace("task-" + c["campaign"]["id"], "task-" + tid)
    c["params"]["task"] = tid
    c["task"]["cell_id"] = c["id"]
    c["task"]["params"]["task"] = tid
    c["campaign"]["id"] = tid
    out.append(c)
    rec = src / "cells" / old / "result.json"
    if rec.is_file():
        d = run / "cells" / c["id"]
        d.mkdir(parents=True)
        r = json.loads(rec.read_text())
        r["id"] = c["id"]
        r["params"]["task"] = tid
        (d / "result.json").write_text(json.dumps(r))
plan["cells"] = out
(run / "plan.json").write_text(json.dumps(plan))
PY
times=()
for _ in 1 2 3; do
  t0=$(now)
  "$ORCH" --store "$work/store-big" report "$run" --format json > "$work/big.json"
  t1=$(now)
  times+=("$(python3 -c "print($t1 - $t0)")")
done
scored=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["headline"]["tasks"])' "$work/big.json")

mkdir -p results
python3 - "$campaign_s" "$campaign_usd" "$single_s" "$single_usd" "$TASKS" "$scored" "$GPU" "$JOBS" "${times[@]}" <<'PY'
import json, platform, statistics, sys, datetime
a = sys.argv[1:]
times = [float(x) for x in a[8:]]
out = {
    "what": "the stand-in campaign (12 tasks) as one `orch run --jobs J` against one `orch run` per task, and `orch report` of a stored campaign of N tasks",
    "command": "bash scripts/bench-campaign.sh",
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "host": platform.node(),
    "gpu": a[6],
    "jobs": int(a[7]),
    "campaign": {"wall_s": round(float(a[0]), 2), "usd": round(float(a[1]), 4)},
    "one_run_per_task": {"wall_s": round(float(a[2]), 2), "usd": round(float(a[3]), 4)},
    "speedup": round(float(a[2]) / float(a[0]), 2),
    "scoring": {"tasks": int(a[4]), "scored": int(a[5]), "report_s_median": round(statistics.median(times), 3), "report_s": [round(t, 3) for t in times]},
}
path = "results/bench-campaign.json"
open(path, "w").write(json.dumps(out, indent=2) + "\n")
print(json.dumps(out, indent=2))
PY
