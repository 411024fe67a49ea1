#!/usr/bin/env bash
# `orch history` over a large synthetic history (issue 33, item 5), in one run:
#   - RUNS synthetic runs (default 10000) of one suite written into a folder store by
#     `cargo run -p orch-history --features synth --example synth` (one cell, metric
#     `output_throughput` around 1000 with 3% noise, planted level shifts SHIFTS),
#   - the same runs in an S3 store: s3s-fs's storage served by scripts/s3s-nodelay on
#     this machine (as scripts/bench-store.sh serves it). The first run goes up with
#     `orch push`; the others are written straight into the bucket folder as copies of
#     its objects with the run's own id, time, commit and value (`orch push` of 10,000
#     runs would take about 2 hours here: 0.64 s a run, results/bench-store.json),
#   - `orch history SUITE --json` over each store: the median of REPEAT timings after a
#     warm-up (they must be within 2x of each other), and both answers compared,
#   - `orch show` of the newest run (judged against its history) on each store,
#   - change-point precision and recall on the 10,000-run series (a change point within
#     +-1 run of a planted one is a hit) and on many planted series with shifts of known
#     sizes and on flat noisy series (the false-alarm rate):
#     `cargo run -p orch-history --example cp-eval -- CP_SERIES SEED`,
#   - results/bench-bisect.json (scripts/bench-bisect.sh) under `bisect` when it exists.
# Writes results/bench-history.json.
#
#   bash scripts/bench-history.sh        # RUNS=10000 SHIFTS="2500:-0.1 6000:0.08" REPEAT=3 CP_SERIES=100 PROFILE=release
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10000}
SHIFTS=${SHIFTS:-"2500:-0.1 6000:0.08"}
REPEAT=${REPEAT:-3}
SEED=${SEED:-1}
CP_SERIES=${CP_SERIES:-100}
# S3=0: the folder store only (the S3 fields are null)
S3=${S3:-1}
SUITE=bench-history

# PROFILE=debug: the debug builds (quicker to build; slower to run, both stores alike)
PROFILE=${PROFILE:-release}
flag=--release; [ "$PROFILE" = release ] || flag=
# SKIP_BUILD=1: use the binaries already built
if [ -z "${SKIP_BUILD:-}" ]; then
  cargo build $flag -q -p orch
  cargo build $flag -q -p orch-history --features synth --example synth --example cp-eval
fi
# the test server is the release build whatever PROFILE says: it is not what is measured
cargo build --release -q --manifest-path scripts/s3s-nodelay/Cargo.toml --target-dir target/s3s-nodelay
dir=$PROFILE; [ "$PROFILE" = release ] || dir=debug
ORCH=$PWD/target/$dir/orch
SYNTH=$PWD/target/$dir/examples/synth
CPEVAL=$PWD/target/$dir/examples/cp-eval
NODELAY=$PWD/target/s3s-nodelay/release/s3s-nodelay

work=$(mktemp -d)
[ -n "${KEEP:-}" ] && echo "work folder: $work (KEEP)" >&2
server=
trap '[ -n "$server" ] && kill $server 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
unset ORCH_STORE

t0=$(date +%s.%N)
# shellcheck disable=SC2086
"$SYNTH" "$work/store" "$SUITE" "$RUNS" "$SEED" $SHIFTS >/dev/null
t1=$(date +%s.%N)
write_s=$(echo "$t1 - $t0" | bc -l)
echo "wrote $RUNS runs in ${write_s}s" >&2

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

echo "folder store: orch history" >&2
folder_s=$(median "$ORCH" history "$SUITE" --json --store "$work/store")
"$ORCH" history "$SUITE" --json --store "$work/store" >"$work/history.json"
# the newest run by time (ids sort by the wall clock of their writing, not by `created_at`)
newest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["series"][0]["points"][-1]["run_id"])' "$work/history.json")
t0=$(date +%s.%N); "$ORCH" show "$newest" --store "$work/store" >"$work/show-folder.txt"; t1=$(date +%s.%N)
show_folder_s=$(echo "$t1 - $t0" | bc -l)

s3_s=null; push_one_s=0; copy_s=0; show_s3_s=null
echo "{\"runs\": 0, \"series\": []}" >"$work/history-s3.json"
if [ "$S3" = 1 ]; then
echo "S3 store: $RUNS runs into the bucket" >&2
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
mkdir -p "$work/s3root/bench-history"
"$NODELAY" 127.0.0.1 "$port" benchkey benchsecret-0123456789 "$work/s3root" >/dev/null 2>&1 &
server=$!
for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=benchkey AWS_SECRET_ACCESS_KEY=benchsecret-0123456789 \
  AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_EC2_METADATA_DISABLED=true \
  ORCH_S3_WORKDIR=$work/s3work
first=$(cd "$work/store" && ls -d */ | tr -d / | sort | awk 'NR == 1')
t0=$(date +%s.%N)
"$ORCH" push "$first" --to s3://bench-history/x --store "$work/store" >/dev/null 2>&1
t1=$(date +%s.%N)
push_one_s=$(echo "$t1 - $t0" | bc -l)
t0=$(date +%s.%N)
# Every other run of the folder store written into the bucket folder as a copy of
# the pushed run's objects, with the run's own id, creation time, commit and metric
# value substituted (the same fill as scripts/bench-scale.sh's store at scale).
python3 scripts/bench-scale.py s3fill "$work/store" "$work/s3root" bench-history x "$first"
t1=$(date +%s.%N)
copy_s=$(echo "$t1 - $t0" | bc -l)

echo "S3 store: orch history" >&2
s3_s=$(median "$ORCH" history "$SUITE" --json --store s3://bench-history/x)
"$ORCH" history "$SUITE" --json --store s3://bench-history/x >"$work/history-s3.json"
t0=$(date +%s.%N); "$ORCH" show "$newest" --store s3://bench-history/x >"$work/show-s3.txt"; t1=$(date +%s.%N)
show_s3_s=$(echo "$t1 - $t0" | bc -l)

fi

echo "change points on planted series" >&2
"$CPEVAL" "$CP_SERIES" "$SEED" >"$work/cp-eval.json"

mkdir -p results
python3 - "$work" "$RUNS" "$SHIFTS" "$folder_s" "$s3_s" "$write_s" "$push_one_s" "$copy_s" "$show_folder_s" "$show_s3_s" "$REPEAT" "$PROFILE" <<'PY'
import json, os, platform, sys
work, runs, shifts, folder_s, s3_s, write_s, push_one_s, copy_s, show_f, show_s3, repeat, profile = sys.argv[1:]
planted = [int(s.split(":")[0]) for s in shifts.split()]
h = json.load(open(os.path.join(work, "history.json")))
h3 = json.load(open(os.path.join(work, "history-s3.json")))
def cps(h):
    return [{"point": c["point"], "shift": round(c["shift"], 4), "shift_ci": [round(c["shift_low"], 4), round(c["shift_high"], 4)],
             "p_value": c["p_value"], "run_after": c["run_after"]} for s in h["series"] for c in s["change_points"]]
found = [c["point"] for c in cps(h)]
hits = [p for p in planted if any(abs(f - p) <= 1 for f in found)]
true_found = [f for f in found if any(abs(f - p) <= 1 for p in planted)]
def tail(p):
    return [l for l in open(p).read().splitlines() if l.startswith("history") or l.startswith("  ")][-3:]
out = {
    "what": "orch history SUITE --json over RUNS synthetic runs of one suite (one cell, output_throughput ~1000, 3% noise, planted shifts), folder store vs S3 store (s3s-fs storage served by scripts/s3s-nodelay on 127.0.0.1); median of REPEAT after a warm-up",
    "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    "runs": int(runs),
    "repeat": int(repeat),
    "build_profile": profile,
    "write_folder_store_s": round(float(write_s), 2),
    "s3_fill": {"push_first_run_s": round(float(push_one_s), 2), "copy_other_runs_s": round(float(copy_s), 2),
                "how": "the first run by `orch push`, the others as copies of its objects with their own id, time, commit and value"},
    "history_folder_s": float(folder_s),
    "history_s3_s": None if s3_s == "null" else float(s3_s),
    "s3_over_folder": None if s3_s == "null" else round(float(s3_s) / float(folder_s), 2),
    "within_2x": None if s3_s == "null" else float(s3_s) <= 2 * float(folder_s),
    "same_answer": {"runs": [h["runs"], h3["runs"]], "change_points": [c["point"] for c in cps(h3)] == found},
    "show_newest_s": {"folder": round(float(show_f), 3), "s3": None if show_s3 == "null" else round(float(show_s3), 3)},
    "show_newest_history_lines": tail(os.path.join(work, "show-folder.txt")),
    "store_series": {
        "planted": planted,
        "change_points": cps(h),
        "recall": len(hits) / len(planted) if planted else None,
        "precision": len(true_found) / len(found) if found else None,
        "hit_tolerance_points": 1,
    },
    "planted_series": json.load(open(os.path.join(work, "cp-eval.json"))),
    "method": h.get("method"),
}
b = "results/bench-bisect.json"
if os.path.exists(b):
    out["bisect"] = json.load(open(b))
json.dump(out, open("results/bench-history.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
