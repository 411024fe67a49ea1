#!/usr/bin/env bash
# How many steps and how long `orch bisect` takes on a toy repository (issue 33):
# 32 commits of the toy OpenAI-compatible server (scripts/bench-compare/toy_server.py,
# its host-side loop off: a token costs a 20 ms sleep), commit SLOW (20) planting a
# 10% slowdown per token (STEP_MS 20 -> 22 ms), commit BROKEN (15) whose server exits
# before it is ready (a `git bisect skip`). `orch bisect --good <root> --bad main` on
# the local backend, RUNS times (a fresh store each); each time: steps, skipped
# steps, wall time, the culprit found and whether it is the planted commit. Also a
# flat range (no planted change) once: the verdict must be "no significant change".
# Writes results/bench-bisect.json (scripts/bench-history.sh includes it when present).
#   bash scripts/bench-bisect.sh          # RUNS=3
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SLOW=${SLOW:-20}
BROKEN=${BROKEN:-15}
COMMITS=32
ROOT=$PWD
if [ -z "${ORCH:-}" ]; then
  cargo build --release --locked -p orch >&2
  ORCH=$ROOT/target/release/orch
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-bisect.XXXXXX")
trap 'rm -rf "$work"' EXIT
repo=$work/toy
mkdir -p "$repo"
git -C "$repo" init -q -b main
shas=()
for k in $(seq 0 $((COMMITS - 1))); do
  sed 's/^WORK = 200 /WORK = 0 /; s/^STEP_MS = 4.0 /STEP_MS = 20.0 /' scripts/bench-compare/toy_server.py > "$repo/server.py"
  if [ "$k" -ge "$SLOW" ]; then sed -i 's/^STEP_MS = 20.0 /STEP_MS = 22.0 /' "$repo/server.py"; fi
  if [ "$k" -eq "$BROKEN" ]; then sed -i '1i raise SystemExit("this commit does not start")' "$repo/server.py"; fi
  echo "# revision $k" >> "$repo/server.py"
  git -C "$repo" add server.py
  git -C "$repo" -c user.email=bench@orch -c user.name=bench commit -qm "revision $k"
  shas+=("$(git -C "$repo" rev-parse HEAD)")
done
grep -q 'WORK = 0 ' "$repo/server.py"
grep -q 'STEP_MS = 22.0 ' "$repo/server.py"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/suite.yaml" <<EOF
name: toybisect
benchmarks:
  - name: serve
    compare:
      repo: $repo
      rounds: auto
      max_rounds: 8
      warmup_rounds: 1
      noise: 0.03
      output_check: {prompts: 2, max_tokens: 4}
      variants:
        - {name: baseline, ref: main}
        - {name: latest, ref: main}
    workload:
      server:
        command: [python3, server.py, "$port"]
        ready: {http: /health, port: $port}
        startup_timeout: 30s
      client:
        loadgen: {num_prompts: 8, max_concurrency: 4, input_len: 8, output_len: 16, seed: 5}
EOF
runs_json=()
for i in $(seq 1 "$RUNS"); do
  store=$work/store-$i
  t0=$(date +%s.%N)
  "$ORCH" --store "$store" bisect -f "$work/suite.yaml" --good "${shas[0]}" --bad main --json \
    > "$work/out-$i.json" 2> "$work/err-$i.log" || { cat "$work/err-$i.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  runs_json+=("$(python3 - "$work/out-$i.json" "$t0" "$t1" "${shas[$SLOW]}" "${shas[$BROKEN]}" <<'PY'
import json, sys
v = json.load(open(sys.argv[1]))
t0, t1, slow, broken = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
o = v["outcome"]
steps = v["bisection"]["steps"]
print(json.dumps({
    "outcome": o["kind"],
    "culprit": o.get("commit"),
    "correct": o.get("commit") == slow,
    "effect": o.get("effect"),
    "steps": len(steps),
    "skipped": sum(1 for s in steps if s["class"] == "skip"),
    "broken_commit_skipped": any(s["commit"] == broken and s["class"] == "skip" for s in steps),
    "wall_s": round(t1 - t0, 2),
    "step_wall_s": [round(s["wall_s"], 2) for s in steps],
}))
PY
)")
  echo "run $i: ${runs_json[-1]}" >&2
done
# A flat range: commits 1..10 change nothing that costs time.
t0=$(date +%s.%N)
"$ORCH" --store "$work/store-flat" bisect -f "$work/suite.yaml" --good "${shas[1]}" --bad "${shas[10]}" --json \
  > "$work/flat.json" 2> "$work/flat.log" || { cat "$work/flat.log" >&2; exit 1; }
t1=$(date +%s.%N)
mkdir -p results
python3 - "$work/flat.json" "$t0" "$t1" "$RUNS" "$SLOW" "$BROKEN" "$(nproc)" "${runs_json[@]}" > results/bench-bisect.json <<'PY'
import json, math, sys, platform
flat = json.load(open(sys.argv[1]))
t0, t1 = float(sys.argv[2]), float(sys.argv[3])
runs = [json.loads(x) for x in sys.argv[8:]]
print(json.dumps({
    "what": "orch bisect on a toy repository of 32 commits (local backend): one planted 10% slowdown per token, one commit whose server does not start",
    "command": "orch bisect -f suite.yaml --good <commit 0> --bad main",
    "commits": 32,
    "planted_slow_commit": int(sys.argv[5]),
    "broken_commit": int(sys.argv[6]),
    "log2_commits": math.ceil(math.log2(31)),
    "settings": {"rounds": "auto (3 to 8)", "warmup_rounds": 1, "noise": 0.03, "num_prompts": 8, "output_len": 16, "step_ms": "20.0 -> 22.0"},
    "machine": {"cpus": int(sys.argv[7]), "platform": platform.platform()},
    "runs": runs,
    "found_right": sum(1 for r in runs if r["correct"]),
    "of": len(runs),
    "mean_steps": sum(r["steps"] for r in runs) / max(1, len(runs)),
    "mean_wall_s": round(sum(r["wall_s"] for r in runs) / max(1, len(runs)), 2),
    "flat_range": {
        "outcome": flat["outcome"]["kind"],
        "steps": len(flat["bisection"]["steps"]),
        "wall_s": round(t1 - t0, 2),
    },
}, indent=2))
PY
cat results/bench-bisect.json
