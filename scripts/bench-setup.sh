#!/usr/bin/env bash
# `orch setup` against huggingface_hub's `hf download`, side by side, on the
# same local Hub-compatible server (fake-hub from crates/orch-fake-hub),
# fresh caches each time, alternating which goes first, ROUNDS rounds.
# Writes results/bench-setup.json: both medians and ratio = hf / orch.
#   bash scripts/bench-setup.sh            # 2 GiB model in 12 files, 3 rounds
#   SIZE_MB=512 ROUNDS=3 bash scripts/bench-setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SIZE_MB=${SIZE_MB:-2048}
FILES=${FILES:-12}
ROUNDS=${ROUNDS:-3}
REPO=bench/model

command -v hf >/dev/null || python3 -m pip install -q huggingface_hub >&2
cargo build --release --locked -p orch -p orch-fake-hub >&2
ORCH=$PWD/target/release/orch
HUB=$PWD/target/release/fake-hub

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-setup.XXXXXX")
hub_pid=
cleanup() { [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

mkdir -p "$work/root"
"$HUB" --root "$work/root" --generate "$REPO" --size-mb "$SIZE_MB" --files "$FILES" > "$work/hub.out" 2> "$work/hub.err" &
hub_pid=$!
for _ in $(seq 1 600); do
  grep -q '^endpoint ' "$work/hub.out" 2>/dev/null && break
  kill -0 "$hub_pid" 2>/dev/null || { cat "$work/hub.err" >&2; exit 1; }
  sleep 0.5
done
endpoint=$(awk '/^endpoint / {print $2; exit}' "$work/hub.out")
echo "serving $REPO ($SIZE_MB MB in $FILES weight files) at $endpoint" >&2
export HF_ENDPOINT=$endpoint HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 HF_HUB_DISABLE_PROGRESS_BARS=1
unset HF_TOKEN

now() { python3 -c 'import time; print(time.monotonic())'; }
run_orch() {
  local dir=$work/orch-$1; rm -rf "$dir"
  local t0; t0=$(now)
  "$ORCH" setup --model "$REPO" --weights-dir "$dir" > /dev/null 2> "$work/orch.err" || { cat "$work/orch.err" >&2; exit 1; }
  local t1; t1=$(now)
  python3 -c "print($t1 - $t0)"
  rm -rf "$dir"
}
run_hf() {
  local dir=$work/hf-$1; rm -rf "$dir"
  local t0; t0=$(now)
  hf download "$REPO" --cache-dir "$dir" > /dev/null 2> "$work/hf.err" || { cat "$work/hf.err" >&2; exit 1; }
  local t1; t1=$(now)
  python3 -c "print($t1 - $t0)"
  rm -rf "$dir"
}

orch_times=()
hf_times=()
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then
    o=$(run_orch "$r"); h=$(run_hf "$r")
  else
    h=$(run_hf "$r"); o=$(run_orch "$r")
  fi
  echo "round $r: orch ${o}s, hf ${h}s" >&2
  orch_times+=("$o"); hf_times+=("$h")
done

mkdir -p results
hf_version=$(python3 -c 'import huggingface_hub; print(huggingface_hub.__version__)')
python3 - "$SIZE_MB" "$FILES" "$ROUNDS" "$hf_version" "$(nproc)" "${orch_times[*]}" "${hf_times[*]}" <<'PY'
import json, statistics, sys
size_mb, files, rounds, hf_version, cpus = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
orch = [float(x) for x in sys.argv[6].split()]
hf = [float(x) for x in sys.argv[7].split()]
om, hm = statistics.median(orch), statistics.median(hf)
out = {
    "benchmark": "model download into a fresh Hugging Face cache from a local Hub-compatible server",
    "model": {"size_mb": int(size_mb), "weight_files": int(files)},
    "rounds": int(rounds),
    "orch_seconds": orch,
    "hf_seconds": hf,
    "orch_median_s": round(om, 3),
    "hf_median_s": round(hm, 3),
    "ratio": round(hm / om, 3),
    "hf_tool": f"huggingface_hub {hf_version} `hf download` (HF_HUB_DISABLE_XET=1)",
    "cpus": int(cpus),
    "command": "bash scripts/bench-setup.sh",
}
json.dump(out, open("results/bench-setup.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
