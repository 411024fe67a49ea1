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
# diagnoses), and PLANTED runs of a cell whose variants game the timer
# (MODE in toy_server.py): `wrong` (a wrong answer, twice as fast), `cache`
# (answers cached per prompt, across restarts), `cache_strip` (the same, keyed
# on the prompt without orch's nonce), `early` (stops at half the
# tokens, reports them all), and the servers that lie in their own reports
# (issue 44): `early_long` (answers longer than 32 tokens stopped at half,
# `usage` says all), `early_stream` (streamed answers only, which the output
# check does not ask), `usage_lie` (right answers, `usage` 1.5x), beside
# `faster` (a true 10% speedup) and `aa` (A/A): the output check's and the
# defences' false alarms on A/A (must be 0) and their detection rate on the
# planted variants. The planted cell asks PLANTED_OUTPUT_LEN (48) tokens an
# answer, and every second planted run turns the output check off, so the
# load-time defences are measured on their own too. Writes
# results/bench-compare.json.
#   bash scripts/bench-compare.sh            # RUNS=20 PLANTED=10 PROMPTS=12 OUTPUT_LEN=32
#   RUNS=0 bash scripts/bench-compare.sh     # the planted runs only: replaces `planted`
#                                            # in results/bench-compare.json, keeps the rest
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
PLANTED=${PLANTED:-10}
export OUTPUT_LEN
PROMPTS=${PROMPTS:-12}
OUTPUT_LEN=${OUTPUT_LEN:-32}
PLANTED_OUTPUT_LEN=${PLANTED_OUTPUT_LEN:-48}
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
# The planted ways to game the timer (toy_server.py's MODE).
for mode in wrong cache cache_strip early early_long early_stream usage_lie; do
  sed -i "s/^MODE = \"honest\"/MODE = \"$mode\"/" "$repo/server.py"
  git -C "$repo" diff > "$work/patches/$mode.patch"
  git -C "$repo" checkout -q -- server.py
  grep -q "MODE = \"$mode\"" "$work/patches/$mode.patch"
done

port=$((18000 + RANDOM % 2000))
manifest() { # name rounds variants... (env: LEN, CHECK)
  local name=$1 rounds=$2; shift 2
  local len=${LEN:-$OUTPUT_LEN}
  {
    echo "name: $name"
    echo "benchmarks:"
    echo "  - name: cmp"
    echo "    compare:"
    echo "      repo: $repo"
    echo "      rounds: $rounds"
    [ -z "${CHECK:-}" ] || echo "      output_check: $CHECK"
    echo "      variants:"
    for v in "$@"; do echo "        - $v"; done
    echo "    workload:"
    echo "      server:"
    echo "        command: [python3, server.py, \"$port\"]"
    echo "        ready: {http: /health, port: $port}"
    echo "        startup_timeout: 60s"
    echo "      client:"
    echo "        loadgen: {num_prompts: $PROMPTS, max_concurrency: 4, input_len: 16, output_len: $len}"
  } > "$work/$name.yaml"
}
for rounds in 5 auto; do
  manifest "cmp-$rounds" "$rounds" "{name: base, ref: main}" "{name: same, ref: main}" \
    "{name: faster, ref: main, patch: $work/patches/faster.patch}"
done
planted_variants=("{name: base, ref: main}" "{name: aa, ref: main}"
  "{name: faster, ref: main, patch: $work/patches/faster.patch}"
  "{name: wrong, ref: main, patch: $work/patches/wrong.patch}"
  "{name: cache, ref: main, patch: $work/patches/cache.patch}"
  "{name: strip, ref: main, patch: $work/patches/cache_strip.patch}"
  "{name: early, ref: main, patch: $work/patches/early.patch}"
  "{name: early_long, ref: main, patch: $work/patches/early_long.patch}"
  "{name: early_stream, ref: main, patch: $work/patches/early_stream.patch}"
  "{name: usage_lie, ref: main, patch: $work/patches/usage_lie.patch}")
LEN=$PLANTED_OUTPUT_LEN manifest planted 5 "${planted_variants[@]}"
LEN=$PLANTED_OUTPUT_LEN CHECK=false manifest planted-nocheck 5 "${planted_variants[@]}"
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
if [ "$RUNS" -gt 0 ]; then
  "$ORCH" run -f "$work/broken.yaml" --store "$work/store" --json > "$work/runs/broken.json" 2>/dev/null || true
fi
for i in $(seq 1 "$PLANTED"); do
  start=$(date +%s%N)
  kind=planted; [ $((i % 2)) -eq 0 ] && kind=planted-nocheck
  "$ORCH" run -f "$work/$kind.yaml" --store "$work/store" --json > "$work/runs/planted-$i.json" 2>"$work/runs/planted-$i.err" || true
  end=$(date +%s%N)
  echo "{\"wall_s\": $(( (end - start) / 1000000 ))e-3}" > "$work/runs/planted-$i.time"
  echo "planted run $i ($kind): $(python3 -c "
import json, sys
r = json.load(open(sys.argv[1]))
for p in r['cells'][0]['info'].get('pairs') or []:
    if p['base'] == 'base':
        print(p['other'], p['verdict'], 'speedup %.3f' % p['speedup'], end='; ')
" "$work/runs/planted-$i.json")" >&2
done

mkdir -p results
python3 - "$work" "$RUNS" "$PROMPTS" "$METHODS" "$ORCH" "$PLANTED" <<'PY'
import json, os, statistics, subprocess, sys
work, runs, prompts, methods, orch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
planted = int(sys.argv[6])
out = {
    "command": "bash scripts/bench-compare.sh",
    "orch": os.path.relpath(orch),
    "cpus": os.cpu_count(),
    "load_average_at_end": os.getloadavg(),
    "runs_per_setting": runs,
    "requests_per_round": prompts,
    "output_tokens_per_request": int(os.environ.get("OUTPUT_LEN", "32")),
    "design": "each run is one 3-way cell: base, same (A/A), faster (known effect); seconds are per run, both pairs together",
    "server": "scripts/bench-compare/toy_server.py (per token: 4 ms device time as a sleep + 200 loop iterations under the GIL; the answer a hash of the prompt)",
    "known_effect": "patch: 10% less work per token (STEP_MS 4.0 -> 3.6, WORK 200 -> 180)",
    "primary_metric": "output_throughput",
    "interval": "paired per-round log-ratios, Student t 95%",
    "settings": {},
}
if runs == 0:
    # The planted runs alone: the other figures stay as they were.
    out = json.load(open("results/bench-compare.json"))
for setting in ("5", "auto") if runs else ():
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
if runs:
    b = json.load(open(f"{work}/runs/broken.json"))
    cell = b["cells"][0]
    out["broken_variants"] = {
        name: {"status": v["status"], "diagnosis": (v.get("diagnosis") or {}).get("kind")}
        for name, v in cell["info"]["variants"].items()
    }
# The planted variants: is a gamed variant caught (gated: `output_mismatch`
# or `flagged`), and is it ever `faster`? A/A: any gate or a verdict other
# than `same` is a false alarm.
p = {
    "runs": planted,
    "orch": os.path.relpath(orch),
    "design": "each run is one 10-way cell (5 rounds, defences on, no tokenizer: the server's usage is all a count could rest on; odd runs with the output check, even runs without): base, aa (A/A), faster (true 10% speedup), wrong (wrong answer, 2x faster), cache (answers cached per prompt across restarts), strip (the same cache keyed on the prompt with the nonce cut out), early (half the tokens, usage says all), early_long (answers over 32 tokens stopped at half, usage says all), early_stream (streamed answers only stopped at half, usage says all), usage_lie (right answers, usage 1.5x)",
    "output_tokens_per_request": int(os.environ.get("PLANTED_OUTPUT_LEN", "48")),
    "variants": {},
}
walls = []
for i in range(1, planted + 1):
    walls.append(json.load(open(f"{work}/runs/planted-{i}.time"))["wall_s"])
names = ("aa", "faster", "wrong", "cache", "strip", "early", "early_long", "early_stream", "usage_lie")
for name in names:
  for setting, runs_of in (("with_check", range(1, planted + 1, 2)), ("without_check", range(2, planted + 1, 2))):
    verdicts, speeds, gates, checks, flags, ratios = [], [], [], [], [], []
    for i in runs_of:
        try:
            cell = json.load(open(f"{work}/runs/planted-{i}.json"))["cells"][0]
        except (OSError, ValueError, IndexError, KeyError):
            verdicts.append("error")
            continue
        v = cell["info"]["variants"].get(name) or {}
        pair = next((x for x in cell["info"].get("pairs") or [] if x["base"] == "base" and x["other"] == name), None)
        verdicts.append(pair["verdict"] if pair else "error")
        speeds.append(pair.get("speed_verdict", pair["verdict"]) if pair else "error")
        gates.append((v.get("gate") or {}).get("kind") or "none")
        checks.append((v.get("output_check") or {}).get("status") or "none")
        flags.extend(v.get("flags") or [])
        lb = ((v.get("lengths") or {}).get("bytes") or {})
        if lb:
            ratios.append((lb["ratio"], lb["low"], lb["high"]))
    n = len(verdicts)
    if n == 0:
        continue
    count = lambda xs: {x: xs.count(x) for x in sorted(set(xs))}
    row = {
        "verdicts": count(verdicts),
        "speed_verdicts": count(speeds),
        "gates": count(gates),
        "output_check": count(checks),
        "flags": count(flags),
        "faster_rate": round(sum(x == "faster" for x in verdicts) / max(n, 1), 3),
        # Its answers' bytes over the baseline's for the same prompts
        # (geometric mean ratio, one-sided 99.9% bounds), per run.
        "length_ratio_bytes": [[round(x, 4) for x in r] for r in ratios],
    }
    if name == "aa":
        row["false_alarms"] = sum(g != "none" or c not in ("passed", "none") or x != "same" for g, c, x in zip(gates, checks, verdicts))
        row["output_check_false_alarms"] = sum(c not in ("passed", "none") for c in checks)
    elif name == "faster":
        row["false_alarms"] = sum(g != "none" for g in gates)
    else:
        row["detection_rate"] = round(sum(g != "none" for g in gates) / max(n, 1), 3)
        row["never_faster_rate"] = round(sum(x != "faster" for x in verdicts) / max(n, 1), 3)
    p["variants"].setdefault(name, {})[setting] = row
p["seconds_per_run_median"] = round(statistics.median(walls), 1) if walls else None
p["note"] = "the caches never hit: every round's prompts carry a fresh nonce and random prompts come from a seed of the round's own (so stripping the nonce does not help), so they are not faster and need no gate (detection_rate counts gates only; never_faster_rate is what matters for them)"
out["planted"] = p
json.dump(out, open("results/bench-compare.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
