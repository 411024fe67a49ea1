#!/usr/bin/env bash
# orch at scale, simulated on this machine (issue 47, item 6): one run of SIZE short cells
# on each platform, for each SIZE of SIZES, against
#  - kubernetes: the fake cluster (`fake-kube`: K8S_NODES GPU nodes of K8S_GPUS GPUs, every
#    request answered K8S_LATENCY_MS late, lists and watches served from memory as a watch
#    cache serves them, a rate limit of K8S_QPS a second in a bucket of K8S_BURST answered
#    with 429 and Retry-After); each cell asks for one H100;
#  - modal: the fake Modal (`fake-modal`) with its throttle (`--rate-limit MODAL_RATE`:
#    unary calls of each method past the rate answered RESOURCE_EXHAUSTED with a retry-after);
#  - slurm: a real one-node Slurm cluster with accounting whose user may have at most
#    SLURM_MAX_SUBMIT jobs queued or running (`MaxSubmitJobs`; `slurm-cluster
#    --max-submit-jobs`); the Slurm commands orch runs go through logging shims;
# with orch's defaults (`--jobs` as `orch plan` says, its own client-side pacing), and for
# each: wall time, the platform's requests per cell by verb (the fakes count them; on
# Slurm, the commands), peak requests per second, 429s (throttled calls; refused `sbatch`),
# orch's peak RSS, open fds, sockets and threads (/proc, every 100 ms), time to first
# result (first cell record stored), per-cell overhead (median cell duration minus the
# workload's own time). Then `orch ls`, `orch history` and `orch cost` over a STORE_RUNS-run
# store, folder and S3 (s3s-fs's storage served by scripts/s3s-nodelay, filled as
# scripts/bench-history.sh fills it).
# Writes results/bench-scale.json and results/bench-scale.svg (the README's "At scale").
#
#   bash scripts/bench-scale.sh                       # SIZES="100 1000 5000"
#   SIZES=100 STORE_RUNS=0 bash scripts/bench-scale.sh   # a quick look
#   SIZES=none bash scripts/bench-scale.sh                # the store at scale alone
# MERGE=1 keeps the cases (and the store's figures) of results/bench-scale.json that this run
# does not measure again.
# Knobs: BACKENDS="kubernetes modal slurm", WORKLOAD=sleep|noop (cells run `sleep 1`, or
# nothing), MAX_CELLS_MODAL=1000 MAX_CELLS_SLURM=1000 MAX_CELLS_KUBERNETES (larger sizes are skipped on those,
# with the reason in the JSON), JOBS (a `--jobs` for every run), PROFILE=release.
# Needs root (the fakes chroot their containers), the static agent
# (`bash scripts/prepare-docker.sh`), slurm-wlm, munge, slurmdbd, mariadb-server.
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"100 1000 5000"}
SIZES=${SIZES//,/ }
[ "$SIZES" = none ] && SIZES=""   # SIZES=none: the store at scale alone
BACKENDS=${BACKENDS:-"kubernetes modal slurm"}
WORKLOAD=${WORKLOAD:-sleep}
K8S_NODES=${K8S_NODES:-200}
K8S_GPUS=${K8S_GPUS:-8}
K8S_LATENCY_MS=${K8S_LATENCY_MS:-30}
K8S_QPS=${K8S_QPS:-50}
K8S_BURST=${K8S_BURST:-100}
MODAL_RATE=${MODAL_RATE:-20:5}
SLURM_MAX_SUBMIT=${SLURM_MAX_SUBMIT:-200}
MAX_CELLS_MODAL=${MAX_CELLS_MODAL:-1000}
MAX_CELLS_SLURM=${MAX_CELLS_SLURM:-1000}
MAX_CELLS_KUBERNETES=${MAX_CELLS_KUBERNETES:-1000000}
STORE_RUNS=${STORE_RUNS:-100000}
REPEAT=${REPEAT:-3}
JOBS=${JOBS:-}
PROFILE=${PROFILE:-release}
T=${CARGO_TARGET_DIR:-$PWD/target}
flag=""; [ "$PROFILE" = release ] && flag="--release"
dir=$PROFILE; [ "$PROFILE" = release ] || dir=debug
AGENT=${AGENT:-$T/$(uname -m)-unknown-linux-gnu/release/orch-agent}
[ -x "$AGENT" ] || { echo "error: no static agent at $AGENT: run bash scripts/prepare-docker.sh" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "error: run as root (the fakes chroot their containers)" >&2; exit 1; }
# SKIP_BUILD=1: use the binaries already built
[ -n "${SKIP_BUILD:-}" ] || cargo build $flag --locked -p orch -p orch-fake-kube -p orch-fake-modal -p orch-fake-slurm \
  --bin orch --bin fake-kube --bin fake-modal --bin slurm-cluster >&2
ORCH=$T/$dir/orch
HELP=$PWD/scripts/bench-scale.py
case $WORKLOAD in
  sleep) workload="{shell: 'sleep 1'}"; workload_s=1 ;;
  noop) workload="{noop: true}"; workload_s=0 ;;
  *) echo "error: WORKLOAD is sleep or noop" >&2; exit 2 ;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-scale.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "${KEEP:-}" ] && { echo "work folder: $work (KEEP)" >&2; return; }
  rm -rf "$work"
}
trap cleanup EXIT
unset ORCH_STORE

suite() { # FILE NAME CELLS GPUS
  local values
  values=$(seq -s, 1 "$3")
  {
    echo "name: $2"
    echo "image: debian:bookworm-slim"
    [ -n "$4" ] && echo "gpus: [\"$4\"]"
    echo "benchmarks:"
    echo "  - name: cell"
    echo "    workload: $workload"
    echo "    matrix:"
    echo "      i: [$values]"
  } > "$1"
}

# meta CASE_DIR BACKEND CELLS T0 T1 EXIT: what the report reads beside the run's outputs
meta() {
  local jobs jobs_why
  jobs=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("jobs",""))' "$1/plan.json" 2>/dev/null || echo "")
  jobs_why=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("jobs_why",""))' "$1/plan.json" 2>/dev/null || echo "")
  python3 - "$@" "$workload_s" "$jobs" "$jobs_why" "$1/store" <<'PY'
import json, sys
d, backend, cells, t0, t1, rc, work, jobs, why, store = sys.argv[1:]
json.dump({"backend": backend, "cells": int(cells), "t0": float(t0), "t1": float(t1), "orch_exit": int(rc),
           "workload_s": float(work), "jobs": int(jobs) if jobs else None, "jobs_why": why, "store": store},
          open(d + "/meta.json", "w"))
PY
}

skip() { # BACKEND CELLS WHY
  mkdir -p "$work/$1-$2"
  python3 -c 'import json,sys; json.dump({"backend": sys.argv[1], "cells": int(sys.argv[2]), "why": sys.argv[3]}, open(sys.argv[4], "w"))' \
    "$1" "$2" "$3" "$work/$1-$2/skipped.json"
  echo "skipped $1 at $2 cells: $3" >&2
}

# run_orch CASE_DIR BACKEND: `orch plan`, then `orch run` sampled; T0, T1, RC set
run_orch() {
  local d=$1 b=$2 jobs_flag=()
  [ -n "$JOBS" ] && jobs_flag=(--jobs "$JOBS")
  "$ORCH" plan -f "$d/suite.yaml" --backend "$b" --json "${jobs_flag[@]}" > "$d/plan.json" 2>/dev/null || true
  cut -d' ' -f1-3 /proc/loadavg > "$d/loadavg-before.txt"
  T0=$(date +%s.%N)
  "$ORCH" run -f "$d/suite.yaml" --backend "$b" --store "$d/store" --json "${jobs_flag[@]}" \
    > "$d/run.json" 2> "$d/orch.err" &
  local pid=$!
  python3 "$HELP" sample "$pid" "$d/sample.json" &
  local spid=$!
  RC=0
  wait "$pid" || RC=$?
  T1=$(date +%s.%N)
  cut -d' ' -f1-3 /proc/loadavg > "$d/loadavg-after.txt"
  wait "$spid" || true
}

kubernetes() { # CELLS
  local n=$1 d=$work/kubernetes-$1
  mkdir -p "$d/agent-image"
  cp "$AGENT" "$d/agent-image/orch-agent"
  suite "$d/suite.yaml" "scale-k8s-$n" "$n" "H100:1"
  "$T/$dir/fake-kube" "$d/kubeconfig" --image "bench/orch-agent:1=$d/agent-image" \
    --busybox-image debian:bookworm-slim --nodes "$K8S_NODES" --gpus-per-node "$K8S_GPUS" \
    --latency-ms "$K8S_LATENCY_MS" --rate-limit "$K8S_QPS:$K8S_BURST" --stats "$d/fake-stats.json" \
    > "$d/fake.out" 2>&1 &
  local fake=$!
  pids+=("$fake")
  for _ in $(seq 100); do [ -s "$d/kubeconfig" ] && break; sleep 0.1; done
  KUBECONFIG=$d/kubeconfig ORCH_AGENT_IMAGE=bench/orch-agent:1 run_orch "$d" kubernetes
  kill -TERM "$fake"; wait "$fake" || true
  meta "$d" kubernetes "$n" "$T0" "$T1" "$RC"
}

modal() { # CELLS
  local n=$1 d=$work/modal-$1
  mkdir -p "$d"
  suite "$d/suite.yaml" "scale-modal-$n" "$n" ""
  "$T/$dir/fake-modal" --root "$d/fake" --busybox-image debian:bookworm-slim \
    --rate-limit "$MODAL_RATE" --stats "$d/fake-stats.json" > "$d/fake.out" 2>&1 &
  local fake=$!
  pids+=("$fake")
  for _ in $(seq 100); do grep -q '^url ' "$d/fake.out" 2>/dev/null && break; sleep 0.1; done
  local url
  url=$(sed -n 's/^url //p' "$d/fake.out")
  MODAL_SERVER_URL=$url MODAL_TOKEN_ID=ak-bench MODAL_TOKEN_SECRET=as-bench ORCH_AGENT_STATIC=$AGENT \
    run_orch "$d" modal
  kill -TERM "$fake"; wait "$fake" || true
  meta "$d" modal "$n" "$T0" "$T1" "$RC"
}

slurm() { # CELLS
  local n=$1 d=$work/slurm-$1
  mkdir -p "$d"
  suite "$d/suite.yaml" "scale-slurm-$n" "$n" ""
  # Inside the cluster: the Slurm commands behind logging shims, then orch, sampled.
  cat > "$d/inside.sh" <<'SH'
set -uo pipefail
d=$1
python3 "$HELP" shims "$d/shims" "$d/slurm-calls.log" sbatch squeue sacct scontrol scancel sacctmgr sinfo
export PATH=$d/shims:$PATH
run_orch "$d" slurm
echo "$T0 $T1 $RC" > "$d/times.txt"
# slurmctld's refusals of submissions past a limit (its log, beside SLURM_CONF)
grep -c -i "submit limit\|MaxSubmitJob" "$(dirname "$SLURM_CONF")/slurmctld.log" > "$d/slurmctld-refusals.txt" || true
SH
  export -f run_orch
  export ORCH HELP JOBS
  "$T/$dir/slurm-cluster" --max-submit-jobs "$SLURM_MAX_SUBMIT" -- bash "$d/inside.sh" "$d" \
    > "$d/cluster.out" 2>&1 || echo "slurm-cluster exited $?: $(tail -5 "$d/cluster.out")" >&2
  [ -s "$d/times.txt" ] || { skip slurm "$n" "the cluster did not start: $(tail -3 "$d/cluster.out" | tr '\n' ' ')"; return; }
  read -r T0 T1 RC < "$d/times.txt"
  meta "$d" slurm "$n" "$T0" "$T1" "$RC"
}

# What the report says of the setup (written first: a report of the cases done so far can be
# made from a kept work folder with `python3 scripts/bench-scale.py report WORK JSON SVG`).
python3 - "$work/bench.json" <<PY
import json, os, platform, sys
json.dump({
  "what": "orch at scale on simulated platforms (issue 47 item 6): one run of N short cells per platform and size; a benchmark, not a test",
  "command": "SIZES=\"$SIZES\" PROFILE=$PROFILE STORE_RUNS=$STORE_RUNS WORKLOAD=$WORKLOAD bash scripts/bench-scale.sh",
  "note": "${BENCH_NOTE:-}",
  "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
  "build_profile": "$PROFILE",
  "workload": "$WORKLOAD", "workload_s": $workload_s,
  "kubernetes": {"server": "fake-kube (orch-fake-kube) on 127.0.0.1: Kubernetes REST, a Job controller, a scheduler, a kubelet running each container chrooted in its image root",
                 "nodes": $K8S_NODES, "gpus_per_node": $K8S_GPUS, "latency_ms": $K8S_LATENCY_MS,
                 "rate_limit": {"qps": $K8S_QPS, "burst": $K8S_BURST, "answer": "429 with Retry-After and the X-Kubernetes-PF-* headers"},
                 "watch_cache": "lists and watches served from memory with resourceVersion semantics (a list's version; a watch from it replays every later change; 410 Gone before the compacted version)",
                 "cells": "one H100 each (gpus: [H100:1])"},
  "modal": {"server": "fake-modal (orch-fake-modal) on 127.0.0.1: Modal's gRPC API, each sandbox chrooted in its image root",
            "rate_limit": "$MODAL_RATE", "rate_limit_means": "PER_S[:BURST[:METHOD,...]]: unary calls of each method past PER_S a second (bursts of BURST) answered RESOURCE_EXHAUSTED with a retry-after, as Modal throttles",
            "cells": "CPU cells (no GPU: orch's Modal default is then 100 at once; GPU cells would run 10 at once)"},
  "slurm": {"cluster": "a real one-node Slurm (orch-fake-slurm: munged, slurmctld, slurmd, slurmdbd on its own MariaDB), CPUs=16 declared, gpu:h100:8",
            "max_submit_jobs": $SLURM_MAX_SUBMIT, "requests": "the Slurm commands orch ran (sbatch, squeue, sacct, scontrol, scancel, sacctmgr, sinfo), through logging shims on PATH"},
  "measures": {
    "wall_s": "orch run, launch to exit",
    "requests_per_cell": "requests the platform answered (refused ones included) / cells; by verb (kubernetes: get/list/watch/create/delete...; modal: RPC method; slurm: command)",
    "peak_requests_per_s": "the most requests in one second of the server's clock",
    "throttled": "requests refused for the rate: 429s (kubernetes), RESOURCE_EXHAUSTED with a retry-after (modal), sbatch refused (slurm)",
    "orch_peak_rss_mib": "the orch process's VmHWM (/proc), sampled every 100 ms with its fds, sockets and threads",
    "first_result_s": "launch to the first cell record stored (result.json's mtime)",
    "overhead_median_ms": "median cell duration_s (launch to result stored) minus the workload's own time; it includes the platform's own queueing (Slurm runs 16 jobs at once here) and this machine's contention: the fakes run every container here, on 2 CPUs (loadavg_before/after of each case say how loaded the machine was)"},
}, open(sys.argv[1], "w"), indent=2)
PY

for n in $SIZES; do
  for b in $BACKENDS; do
    case $b in
      modal) [ "$n" -le "$MAX_CELLS_MODAL" ] || { skip modal "$n" "over MAX_CELLS_MODAL=$MAX_CELLS_MODAL: orch paces SandboxCreate at 5 a second (ORCH_MODAL_CREATE_RATE default), so $n cells take at least $((n / 5)) s, and each running sandbox is a chrooted process tree on this 2-core machine"; continue; } ;;
      kubernetes) [ "$n" -le "$MAX_CELLS_KUBERNETES" ] || { skip kubernetes "$n" "over MAX_CELLS_KUBERNETES=$MAX_CELLS_KUBERNETES (a time budget for the run): every pod of the fake cluster is a chrooted process tree on this machine (an init container copying the 26 MB agent, the agent, the cell), $(nproc) CPUs for all of them"; continue; } ;;
      slurm) [ "$n" -le "$MAX_CELLS_SLURM" ] || { skip slurm "$n" "over MAX_CELLS_SLURM=$MAX_CELLS_SLURM: one slurmd on this 2-core machine runs 16 jobs at once (CPUs=16 declared), every job a real sbatch/srun/agent process tree"; continue; } ;;
    esac
    echo "$b: $n cells" >&2
    "$b" "$n"
    python3 "$HELP" case "$work/$b-$n" | python3 -c 'import json,sys; c=json.load(sys.stdin); print({k: c.get(k) for k in ("backend","cells","orch_exit","cells_by_status","wall_s","requests_per_cell","peak_requests_per_s","throttled","orch_peak_rss_mib","orch_peak_fds","overhead_median_ms","first_result_s")})' >&2 || true
  done
done

# The store at scale: ls, history and cost over STORE_RUNS runs, folder and S3.
if [ "$STORE_RUNS" -gt 0 ]; then
  S3S_DIR=$T/s3s-nodelay
  cargo build $flag -q -p orch-history --features synth --example synth >&2
  cargo build --release -q --manifest-path scripts/s3s-nodelay/Cargo.toml --target-dir "$S3S_DIR" >&2
  SYNTH=$T/$dir/examples/synth
  NODELAY=$S3S_DIR/release/s3s-nodelay
  s=$work/store
  mkdir -p "$s/s3root/bench-scale"
  echo "store: $STORE_RUNS runs" >&2
  t0=$(date +%s.%N); "$SYNTH" "$s/folder" scale-history "$STORE_RUNS" 1 >/dev/null; t1=$(date +%s.%N)
  write_s=$(echo "$t1 - $t0" | bc -l)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$NODELAY" 127.0.0.1 "$port" benchkey benchsecret-0123456789 "$s/s3root" >/dev/null 2>&1 &
  pids+=("$!")
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/"$port") 2>/dev/null && break; sleep 0.1; done
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=benchkey AWS_SECRET_ACCESS_KEY=benchsecret-0123456789 \
    AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_EC2_METADATA_DISABLED=true \
    ORCH_S3_WORKDIR=$s/s3work
  # (not a glob: 100,000 run folders are past the argument list's limit)
  first=$(python3 -c 'import os, sys; d = sys.argv[1]; print(min(e for e in os.listdir(d) if not e.startswith(".") and os.path.isfile(os.path.join(d, e, "run.json"))))' "$s/folder")
  "$ORCH" push "$first" --to s3://bench-scale/x --store "$s/folder" >/dev/null 2>&1
  t0=$(date +%s.%N); python3 "$HELP" s3fill "$s/folder" "$s/s3root" bench-scale x "$first"; t1=$(date +%s.%N)
  fill_s=$(echo "$t1 - $t0" | bc -l)
  # median wall seconds of REPEAT runs (after a warm-up); exit 1 is an answer
  # (the warm-up's own wall seconds go to $s/warm, one line a call: the first call on S3
  # reads every run and writes the catalog the next ones read)
  median() {
    local rc=0 a z
    a=$(date +%s.%N); "$@" >/dev/null 2>"$s/last.err" || rc=$?; z=$(date +%s.%N)
    echo "$z - $a" | bc -l >>"$s/warm"
    [ "$rc" -le 1 ] || { echo "failed ($rc): $* $(tail -3 "$s/last.err")" >&2; echo null; return; }
    for _ in $(seq "$REPEAT"); do
      local a z
      a=$(date +%s.%N); "$@" >/dev/null 2>&1 || true; z=$(date +%s.%N)
      echo "$z - $a" | bc -l
    done | sort -g | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'
  }
  declare -A tm
  for where in folder s3; do
    st=$s/folder; [ "$where" = s3 ] && st=s3://bench-scale/x
    echo "store: $where" >&2
    tm[ls_$where]=$(median "$ORCH" ls --store "$st")
    tm[history_$where]=$(median "$ORCH" history scale-history --json --store "$st")
    tm[cost_$where]=$(median "$ORCH" cost --store "$st")
  done
  python3 - "$work/s3.json" "$STORE_RUNS" "$write_s" "$fill_s" "$REPEAT" "$s/warm" \
    "${tm[ls_folder]}" "${tm[ls_s3]}" "${tm[history_folder]}" "${tm[history_s3]}" "${tm[cost_folder]}" "${tm[cost_s3]}" <<'PY'
import json, sys
path, runs, write_s, fill_s, repeat, warm, *t = sys.argv[1:]
warm = [round(float(w), 3) for w in open(warm).read().split()]
num = lambda v: None if v in ("null", "") else float(v)
names = ["ls", "history", "cost"]
out = {"runs": int(runs), "repeat": int(repeat),
       "what": "median wall seconds (of REPEAT, after a warm-up whose own time is first_call_*) of `orch ls`, `orch history SUITE --json`, `orch cost` over RUNS one-cell runs of one suite (orch-history's synth example), in a folder store and in an S3 store (s3s-fs's storage served by scripts/s3s-nodelay on 127.0.0.1; the first run pushed, the others copied into the bucket folder as scripts/bench-history.sh does)",
       "write_folder_store_s": round(float(write_s), 1), "fill_bucket_s": round(float(fill_s), 1)}
for i, n in enumerate(names):
    f, s = num(t[2 * i]), num(t[2 * i + 1])
    out[n] = {"folder_s": f, "s3_s": s, "s3_over_folder": round(s / f, 2) if f and s else None,
              "first_call_folder_s": warm[i] if len(warm) == 6 else None,
              "first_call_s3_s": warm[3 + i] if len(warm) == 6 else None}
json.dump(out, open(path, "w"), indent=2)
PY
fi


mkdir -p results
python3 "$HELP" report "$work" results/bench-scale.json results/bench-scale.svg
echo "wrote results/bench-scale.json and results/bench-scale.svg" >&2
