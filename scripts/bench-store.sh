#!/usr/bin/env bash
# The S3 store against the folder store on the same data, in one run:
#   - `orch ls` over RUNS runs (default 1000),
#   - `orch show` of one SHOW_CELLS-cell run (default 500),
#   - `orch cost` over COST_CELLS cells (default 100000, in 20 runs),
#   - log upload throughput: a LOG_MIB MiB log (default 256) pushed up (multipart),
#     beside a local copy of the same file.
# The S3 side is s3s-fs's storage (real SigV4) on this machine, served two ways on
# the same bucket folders: by `scripts/s3s-nodelay` (TCP_NODELAY, as production
# servers set it) and by the stock `s3s-fs` binary, which leaves Nagle's algorithm on
# so that every response longer than one TCP segment waits about 40 ms for the
# client's delayed ACK. Writes results/bench-store.json.
#
#   bash scripts/bench-store.sh            # RUNS=1000 SHOW_CELLS=500 COST_CELLS=100000 REPEAT=5
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000}
SHOW_CELLS=${SHOW_CELLS:-500}
COST_CELLS=${COST_CELLS:-100000}
LOG_MIB=${LOG_MIB:-256}
REPEAT=${REPEAT:-5}

S3S=$(command -v s3s-fs || echo "$HOME/.cargo/bin/s3s-fs")
[ -x "$S3S" ] || { echo "s3s-fs is required: cargo install --locked --features binary s3s-fs@0.14.1" >&2; exit 1; }
cargo build --release -q -p orch
cargo build --release -q -p orch-store --example synth-store
cargo build --release -q --manifest-path scripts/s3s-nodelay/Cargo.toml --target-dir target/s3s-nodelay
ORCH=$PWD/target/release/orch
SYNTH=$PWD/target/release/examples/synth-store
NODELAY=$PWD/target/s3s-nodelay/release/s3s-nodelay

work=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port=$(free_port)
stock_port=$(free_port)
# One bucket per phase: s3s-fs answers a prefix listing by walking its whole bucket
# folder (s3s-fs 0.14.1 `list_objects_recursive`), so a shared bucket would charge
# each phase for the objects of the others.
mkdir -p "$work/s3root/bench-ls" "$work/s3root/bench-show" "$work/s3root/bench-cost" "$work/s3root/bench-log"
"$NODELAY" 127.0.0.1 "$port" benchkey benchsecret-0123456789 "$work/s3root" >/dev/null 2>&1 &
server=$!
"$S3S" --host 127.0.0.1 --port "$stock_port" --access-key benchkey --secret-key benchsecret-0123456789 "$work/s3root" >/dev/null 2>&1 &
stock=$!
trap 'kill $server $stock 2>/dev/null; rm -rf "$work"' EXIT
for p in $port $stock_port; do
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done
# `stock CMD...`: the same command against the stock s3s-fs binary
stock() { AWS_ENDPOINT_URL=http://127.0.0.1:$stock_port "$@"; }
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=benchkey AWS_SECRET_ACCESS_KEY=benchsecret-0123456789 \
  AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_EC2_METADATA_DISABLED=true \
  ORCH_S3_WORKDIR=$work/s3work
unset ORCH_STORE

# median wall seconds of REPEAT runs of a command (after one warm-up run); exit 1 is
# an answer (`orch show` exits 1 when a cell of the run did not succeed)
median() {
  local rc=0
  "$@" >/dev/null 2>&1 || rc=$?
  [ "$rc" -le 1 ] || { echo "failed ($rc): $*" >&2; "$@" >&2 || true; exit 1; }
  local times=()
  for _ in $(seq "$REPEAT"); do
    local t0 t1
    t0=$(date +%s.%N); "$@" >/dev/null 2>&1 || true; t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | awk '{a[NR]=$1} END {printf "%.4f", a[int((NR+1)/2)]}'
}

# Every run of a folder store pushed to the bucket in one `orch push`.
push_all() { # folder prefix
  local ids
  ids=$(cd "$1" && ls -d */ | tr -d /)
  # shellcheck disable=SC2086
  "$ORCH" push $ids --to "s3://bench-$2/x" --store "$1" 2>/dev/null
}

echo "ls: $RUNS runs" >&2
"$SYNTH" "$work/ls" $((RUNS * 2)) "$RUNS" >/dev/null
t0=$(date +%s.%N); push_all "$work/ls" ls; t1=$(date +%s.%N)
push_ls_s=$(echo "$t1 - $t0" | bc -l)
ls_folder=$(median "$ORCH" ls --store "$work/ls")
ls_s3=$(median "$ORCH" ls --store s3://bench-ls/x)
ls_stock=$(median stock "$ORCH" ls --store s3://bench-ls/x)

echo "show: one run of $SHOW_CELLS cells" >&2
"$SYNTH" "$work/show" "$SHOW_CELLS" 1 >/dev/null
push_all "$work/show" show
show_id=$(cd "$work/show" && ls -d */ | tr -d / | head -1)
show_folder=$(median "$ORCH" show "$show_id" --store "$work/show")
show_s3=$(median "$ORCH" show "$show_id" --store s3://bench-show/x)
show_stock=$(median stock "$ORCH" show "$show_id" --store s3://bench-show/x)

echo "cost: $COST_CELLS cells in 20 runs" >&2
"$SYNTH" "$work/cost" "$COST_CELLS" 20 >/dev/null
t0=$(date +%s.%N); push_all "$work/cost" cost; t1=$(date +%s.%N)
push_cost_s=$(echo "$t1 - $t0" | bc -l)
cost_folder=$(median "$ORCH" cost --store "$work/cost")
cost_s3=$(median "$ORCH" cost --store s3://bench-cost/x)
cost_stock=$(median stock "$ORCH" cost --store s3://bench-cost/x)

echo "logs: $LOG_MIB MiB" >&2
"$SYNTH" "$work/log" 1 1 >/dev/null
log_id=$(cd "$work/log" && ls -d */ | tr -d / | head -1)
cell_dir=$(ls -d "$work/log/$log_id"/cells/*/ | head -1)
# (the last `head` closes the pipe early: base64's SIGPIPE is expected, the size is checked)
{ head -c $((LOG_MIB * 1048576)) /dev/urandom | base64 -w 120 | head -c $((LOG_MIB * 1048576)) > "$cell_dir/stdout.log"; } || true
[ "$(stat -c %s "$cell_dir/stdout.log")" -eq $((LOG_MIB * 1048576)) ] || { echo "could not write the $LOG_MIB MiB log" >&2; exit 1; }
t0=$(date +%s.%N); cp "$cell_dir/stdout.log" "$work/copy.log"; sync "$work/copy.log"; t1=$(date +%s.%N)
copy_s=$(echo "$t1 - $t0" | bc -l)
t0=$(date +%s.%N); "$ORCH" push "$log_id" --to s3://bench-log/x --store "$work/log" 2>/dev/null; t1=$(date +%s.%N)
upload_s=$(echo "$t1 - $t0" | bc -l)

mkdir -p results
python3 - "$@" <<EOF
import json, platform, os
def side(folder, s3, stock):
    return {"folder_s": round(float(folder), 4), "s3_s": round(float(s3), 4), "ratio": round(float(s3) / float(folder), 2),
            "s3_stock_s3s_fs_s": round(float(stock), 4), "ratio_stock_s3s_fs": round(float(stock) / float(folder), 2)}
out = {
    "what": "orch ls/show/cost on the same runs in a folder store and in a local s3s-fs server; median of $REPEAT after a warm-up",
    "server": "s3s-fs 0.14.1's storage on 127.0.0.1 (SigV4), same machine, a bucket per phase. s3_s: served by scripts/s3s-nodelay (TCP_NODELAY); s3_stock_s3s_fs_s: the same bucket folders served by the stock s3s-fs binary (Nagle on: about 40 ms per multi-segment response). Its nested listings walk the whole bucket folder.",
    "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
    "defaults": {"runs": 1000, "show_cells": 500, "cost_cells": 100000},
    "note": os.environ.get("BENCH_NOTE", ""),
    "ls": {"runs": $RUNS, **side("$ls_folder", "$ls_s3", "$ls_stock")},
    "show": {"cells": $SHOW_CELLS, **side("$show_folder", "$show_s3", "$show_stock")},
    "cost": {"cells": $COST_CELLS, "runs": 20, **side("$cost_folder", "$cost_s3", "$cost_stock")},
    "push": {"ls_runs_s": round(float("$push_ls_s"), 2), "cost_cells_s": round(float("$push_cost_s"), 2)},
    "log_upload": {
        "mib": $LOG_MIB,
        "s3_push_s": round(float("$upload_s"), 3),
        "s3_mib_per_s": round($LOG_MIB / float("$upload_s"), 1),
        "local_copy_s": round(float("$copy_s"), 3),
        "local_copy_mib_per_s": round($LOG_MIB / float("$copy_s"), 1),
        "note": "multipart (8 MiB parts, 4 in flight); the push also lists and verifies",
    },
}
json.dump(out, open("results/bench-store.json", "w"), indent=2)
print(json.dumps(out, indent=2))
EOF
