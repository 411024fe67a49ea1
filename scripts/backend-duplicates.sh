#!/usr/bin/env bash
# What the backends' host code repeats, measured with `duplicates` (the
# workplace's clone finder) at two revisions side by side: the pairs of
# places of 5+ shared lines where both sides are backend code (the backend
# crates' src/, and the CLI's commands and backend glue), and the lines of
# the first side of each. Writes results/backend-duplicates.json.
#
#   bash scripts/backend-duplicates.sh [BEFORE_REV] [AFTER_REV]   (default: 952e79c and the working tree)
set -euo pipefail
cd "$(dirname "$0")/.."
before="${1:-952e79c}"
after="${2:-}"
command -v duplicates >/dev/null || { echo "error: \`duplicates\` is not installed here" >&2; exit 2; }
measure() {
  local dir="$1"
  duplicates --repo "$dir/crates" --most 200 --seconds 300 --min-lines 5 | python3 -c '
import sys, re, json
pat = re.compile(r"^(orch-backend[^/]*/src/|orch/src/commands/|orch/src/hosts\.rs)")
pairs = lines = exact = 0
rows = []
for l in sys.stdin:
    if not l.startswith("D"):
        continue
    p = l.split()
    a, b = p[1], p[3]
    if pat.match(a) and pat.match(b) and ".proto" not in a:
        s, e = a.rsplit(":", 1)[1].split("-")
        pairs += 1
        lines += int(e) - int(s) + 1
        exact += "shape" not in l
        rows.append(" ".join(p[1:4]))
print(json.dumps({"pairs": pairs, "identical_pairs": exact, "lines": lines, "rows": rows}))
'
}
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/before" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add --detach "$tmp/before" "$before" >/dev/null 2>&1
b=$(measure "$tmp/before")
if [ -n "$after" ]; then
  git worktree add --detach "$tmp/after" "$after" >/dev/null 2>&1
  a=$(measure "$tmp/after"); git worktree remove --force "$tmp/after" >/dev/null 2>&1
else
  a=$(measure "$PWD")
fi
mkdir -p results
python3 - "$before" "${after:-working tree}" "$b" "$a" > results/backend-duplicates.json <<'PY'
import json, sys
before, after, b, a = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
print(json.dumps({"tool": "duplicates --min-lines 5", "scope": "crates/orch-backend*/src, crates/orch/src/commands, crates/orch/src/hosts.rs; pairs with both sides in scope",
                  "before": {"rev": before, **b}, "after": {"rev": after, **a}}, indent=2))
PY
python3 -c 'import json; d=json.load(open("results/backend-duplicates.json")); print("before:", {k: d["before"][k] for k in ("pairs","identical_pairs","lines")}, "after:", {k: d["after"][k] for k in ("pairs","identical_pairs","lines")})'
