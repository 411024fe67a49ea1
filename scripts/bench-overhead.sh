#!/usr/bin/env bash
# Per-cell overhead of the local and docker backends on a workload that does
# nothing: from cell start to result stored (each cell record's duration_s),
# medians over CELLS cells per backend, both measured in this one run.
# Writes results/bench-overhead.json (local_ms, docker_ms).
#   bash scripts/bench-overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
CELLS=${CELLS:-24}
cargo build --release --locked -p orch >&2
bash scripts/prepare-docker.sh >&2
ORCH=$PWD/target/release/orch
"$ORCH" build -f manifests/quickstart.yaml >&2
tag=$("$ORCH" build -f manifests/quickstart.yaml 2>/dev/null | tail -1)

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-overhead.XXXXXX")
trap 'rm -rf "$work"' EXIT
values=$(seq -s, 1 "$CELLS")
cat > "$work/noop.yaml" <<YAML
name: overhead
image: $tag
benchmarks:
  - name: noop
    workload: {noop: true}
    matrix:
      i: [$values]
YAML
for backend in local docker; do
  "$ORCH" run -f "$work/noop.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/$backend.json"
done
mkdir -p results
python3 - "$work" "$CELLS" <<'PY'
import json, statistics, sys
work, cells = sys.argv[1], int(sys.argv[2])
out = {"cells_per_backend": cells, "workload": "builtin noop", "measure": "cell record duration_s: launch to result stored"}
for b in ("local", "docker"):
    rec = json.load(open(f"{work}/{b}.json"))
    ds = [c["duration_s"] * 1000 for c in rec["cells"]]
    assert all(c["status"] == "succeeded" for c in rec["cells"]), b
    out[f"{b}_ms"] = round(statistics.median(ds), 1)
    out[f"{b}_p90_ms"] = round(sorted(ds)[int(0.9 * (len(ds) - 1))], 1)
out["command"] = "bash scripts/bench-overhead.sh"
json.dump(out, open("results/bench-overhead.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
