#!/usr/bin/env bash
# Can orch's comparisons be trusted on this machine? A toy OpenAI-compatible
# server whose tokens cost device time and CPU work
# (scripts/bench-compare/toy_server.py) runs as a 3-way comparison:
#   - `base` and `same`: two checkouts of the same commit (A/A): any verdict
#     other than `same` on the primary metric is a false positive;
#   - `faster`: a patch that does 10% less work per token (a known effect):
#     each `faster` verdict against `base` is a find (power).
# RUNS runs at the default settings (5 rounds) and RUNS with `rounds: auto`,
# alternating so the machine's load hits both alike. The percentile bootstrap
# over round means (orch's method before) is applied to the very same rounds,
# side by side. Also one run with a crashing variant and a stale patch (their
# diagnoses). Writes results/bench-compare.json.
#   bash scripts/bench-compare.sh            # RUNS=20 PROMPTS=12 OUTPUT_LEN=32
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
export OUTPUT_LEN
PROMPTS=${PROMPTS:-12}
OUTPUT_LEN=${OUTPUT_LEN:-32}
ROOT=$PWD
if [ -z "${ORCH:-}" ]; then
  cargo build --release --locked -p orch >&2
  ORCH=$ROOT/target/release/orch
fi
cargo build --locked -p orch-stats --example methods >&2
METHODS=$ROOT/target/debug/examples/methods

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-compare.XXXXXX")
trap 'rm -rf "$work"' EXIT
repo=$work/toy
mkdir -p "$repo" "$work/patches"
cp scripts/bench-compare/toy_server.py "$repo/server.py"
git -C "$repo" init -q -b main
git -C "$repo" add server.py
git -C "$repo" -c user.email=bench@orch -c user.name=bench commit -qm toy
# The known effect: 10% less work per token (device time and host work).
sed -i 's/^STEP_MS = 4.0 /STEP_MS = 3.6 /; s/^WORK = 200 /WORK = 180 /' "$repo/server.py"
git -C "$repo" diff > "$work/patches/faster.patch"
git -C "$repo" checkout -q -- server.py
grep -q 'STEP_MS = 3.6' "$work/patches/faster.patch"
grep -q 'WORK = 180' "$work/patches/faster.patch"
# A crash at start, and a patch made on another version of the file.
sed -i 's/^    port = int(sys.argv\[1\])/    raise RuntimeError("CUDA error: out of memory")\n    port = int(sys.argv[1])/' "$repo/server.py"
git -C "$repo" diff > "$work/patches/crash.patch"
git -C "$repo" checkout -q -- server.py
sed -i 's/^WORK = 200 /WORK = 3000 /' "$repo/server.py"
git -C "$repo" diff | sed 's/^-WORK = 200 /-WORK = 5000 /' > "$work/patches/stale.patch"
git -C "$repo" checkout -q -- server.py

port=$((18000 + RANDOM % 2000))
manifest() { # name rounds variants...
  local name=$1 rounds=$2; shift 2
  {
    echo "name: $name"
    echo "benchmarks:"
    echo "  - name: cmp"
    echo "    compare:"
    echo "      repo: $repo"
    echo "      rounds: $rounds"
    echo "      variants:"
    for v in "$@"; do echo "        - $v"; done
    echo "    workload:"
    echo "      server:"
    echo "        command: [python3, server.py, \"$port\"]"
    echo "        ready: {http: /health, port: $port}"
    echo "        startup_timeout: 60s"
    echo "      client:"
    echo "        loadgen: {num_prompts: $PROMPTS, max_concurrency: 4, input_len: 16, output_len: $OUTPUT_LEN}"
  } > "$work/$name.yaml"
}
for rounds in 5 auto; do
  manifest "cmp-$rounds" "$rounds" "{name: base, ref: main}" "{name: same, ref: main}" \
    "{name: faster, ref: main, patch: $work/patches/faster.patch}"
done
manifest broken 3 "{name: base, ref: main}" "{name: faster, ref: main, patch: $work/patches/faster.patch}" \
  "{name: crash, ref: main, patch: $work/patches/crash.patch}" "{name: stale, ref: main, patch: $work/patches/stale.patch}"

mkdir -p "$work/runs"
for i in $(seq 1 "$RUNS"); do
  for kind in cmp-5 cmp-auto; do
    start=$(date +%s%N)
    "$ORCH" run -f "$work/$kind.yaml" --store "$work/store" --json > "$work/runs/$kind-$i.json" 2>"$work/runs/$kind-$i.err" || true
    end=$(date +%s%N)
    echo "{\"wall_s\": $(( (end - start) / 1000000 ))e-3}" > "$work/runs/$kind-$i.time"
    echo "run $i $kind: $(python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
for p in r['cells'][0]['info'].get('pairs') or []:
    if p['base'] == 'base':
        print(p['other'], p['verdict'], 'n', p['n'], 'speedup %.3f' % p['speedup'], end='; ')
" "$work/runs/$kind-$i.json")" >&2
  done
done
"$ORCH" run -f "$work/broken.yaml" --store "$work/store" --json > "$work/runs/broken.json" 2>/dev/null || true

mkdir -p results
python3 - "$work" "$RUNS" "$PROMPTS" "$METHODS" "$ORCH" <<'PY'
import json, os, statistics, subprocess, sys
work, runs, prompts, methods, orch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
out = {
    "command": "bash scripts/bench-compare.sh",
    "orch": os.path.relpath(orch),
    "cpus": os.cpu_count(),
    "load_average_at_end": os.getloadavg(),
    "runs_per_setting": runs,
    "requests_per_round": prompts,
    "output_tokens_per_request": int(os.environ.get("OUTPUT_LEN", "32")),
    "design": "each run is one 3-way cell: base, same (A/A), faster (known effect); seconds are per run, both pairs together",
    "server": "scripts/bench-compare/toy_server.py (per token: 4 ms device time as a sleep + 200 loop iterations under the GIL)",
    "known_effect": "patch: 10% less work per token (STEP_MS 4.0 -> 3.6, WORK 200 -> 180)",
    "primary_metric": "output_throughput",
    "interval": "paired per-round log-ratios, Student t 95%",
    "settings": {},
}
for setting in ("5", "auto"):
  for kind, other in (("aa", "same"), ("effect", "faster")):
    verdicts, ns, walls, speedups, stops, mdes, rows = [], [], [], [], [], [], []
    for i in range(1, runs + 1):
        rec = json.load(open(f"{work}/runs/cmp-{setting}-{i}.json"))
        cell = rec["cells"][0]
        walls.append(json.load(open(f"{work}/runs/cmp-{setting}-{i}.time"))["wall_s"])
        pair = next((p for p in cell["info"].get("pairs") or [] if p["base"] == "base" and p["other"] == other), None)
        if pair is None:
            verdicts.append("error")
            continue
        verdicts.append(pair["verdict"])
        ns.append(pair["n"])
        speedups.append(pair["speedup"])
        mdes.append(pair["mde"])
        stops.append(cell["info"].get("stopped_by"))
        prim = next(c for c in cell["info"]["comparison"] if c["role"] == "primary" and c["base"] == "base" and c["other"] == other)
        rows.append({"metric": prim["metric"], "base": prim["base_values"], "other": prim["other_values"], "noise": cell["info"]["noise"]})
    alt = json.loads(subprocess.run([methods], input=json.dumps(rows), capture_output=True, text=True, check=True).stdout)
    boot = [a["percentile_bootstrap"]["verdict"] if a["percentile_bootstrap"] else "error" for a in alt]
    t_check = [a["student_t"]["verdict"] if a["student_t"] else "error" for a in alt]
    effect = kind == "effect"
    rate = lambda vs: round(sum(v == "faster" for v in vs) / len(vs), 3) if effect else round(sum(v != "same" for v in vs) / len(vs), 3)
    key = "power" if effect else "false_positive_rate"
    s = {
        "pair": f"{other} vs base",
        "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
        key: rate(verdicts),
        "percentile_bootstrap_on_same_rounds": {
            "verdicts": {v: boot.count(v) for v in sorted(set(boot))},
            key: rate(boot),
        },
        "rounds_median": statistics.median(ns) if ns else None,
        "rounds_max": max(ns) if ns else None,
        "stopped_by": {v: stops.count(v) for v in sorted(set(map(str, stops)))},
        "speedup_median": round(statistics.median(speedups), 4) if speedups else None,
        "mde_median": round(statistics.median(mdes), 4) if mdes else None,
        "seconds_per_run_median": round(statistics.median(walls), 1),
        "seconds_total": round(sum(walls), 1),
    }
    if t_check != [v for v in verdicts if v != "error"]:
        s["note"] = "the example's t verdicts differ from orch's"
    out["settings"][f"{kind}-{setting}"] = s
b = json.load(open(f"{work}/runs/broken.json"))
cell = b["cells"][0]
out["broken_variants"] = {
    name: {"status": v["status"], "diagnosis": (v.get("diagnosis") or {}).get("kind")}
    for name, v in cell["info"]["variants"].items()
}
json.dump(out, open("results/bench-compare.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
