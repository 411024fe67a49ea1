#!/usr/bin/env bash
# Accuracy of `orch diagnose` on the corpus of real logs (crates/orch-diagnose/tests/real),
# side by side with the rules of a base revision (default: main) on the same logs and engine.
# Writes results/diagnose-eval.json.
#
#   scripts/diagnose-eval.sh [BASE_REV]        (ORCH=path/to/orch skips the release build)
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-main}"
corpus=crates/orch-diagnose/tests/real
if [ -z "${ORCH:-}" ]; then cargo build --release -q -p orch; fi
orch="${ORCH:-target/release/orch}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$orch" diagnose --eval "$corpus" --json >"$tmp/now.json"
if git show "$base:crates/orch-diagnose/rules/default.yaml" >"$tmp/base-rules.yaml" 2>/dev/null; then
  "$orch" diagnose --eval "$corpus" --json --rules "$tmp/base-rules.yaml" --no-default-rules >"$tmp/base.json"
else
  echo '{}' >"$tmp/base.json"
fi
mkdir -p results
python3 - "$tmp/now.json" "$tmp/base.json" "$base" "$(git rev-parse HEAD)" results/diagnose-holdout-first.json >results/diagnose-eval.json <<'PY'
import json, sys
now, base, base_rev, head, first = sys.argv[1:6]
now = json.load(open(now))
base = json.load(open(base))
def summary(r):
    if not r:
        return None
    return {"total": r["total"], "by_split": r["by_split"],
            "by_kind": r["by_kind"], "false_kind_on_unknown": r["false_kind_on_unknown"]}
try:
    first = json.load(open(first))
except OSError:
    first = None
out = {
    "command": "scripts/diagnose-eval.sh " + base_rev,
    "commit": head,
    "corpus": "crates/orch-diagnose/tests/real (tune: gathered first; holdout, holdout2, ...: gathered later, each scored before the rules saw it)",
    "logs": now["total"]["logs"],
    "sources": now["sources"],
    "now": summary(now),
    "base_rules": {"rev": base_rev, **(summary(base) or {})},
    "first_seen_holdouts": first,
    "single_source_patterns": now["single_source_patterns"],
    "misses": now["misses"],
}
print(json.dumps(out, indent=2))
PY
python3 -c "
import json; r = json.load(open('results/diagnose-eval.json'))
n, b = r['now']['total'], r['base_rules'].get('total')
print(f\"now:  {n['correct']}/{n['logs']} = {100*n['accuracy']:.1f}%  leave-one-source-out {100*n['accuracy_loso']:.1f}%\")
if b: print(f\"base: {b['correct']}/{b['logs']} = {100*b['accuracy']:.1f}%  ({r['base_rules']['rev']} rules)\")
"
