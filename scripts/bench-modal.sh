#!/usr/bin/env bash
# The modal backend against the local fake Modal server (`fake-modal`), beside
# the local backend, in one run:
#  - per-cell overhead: median cell record duration_s of CELLS noop cells;
#  - log throughput: one command cell writing LOG_MIB MiB to stdout, MiB/s
#    from its duration (the bytes come home as frames over the sandbox's
#    stdout on modal; straight to the file on local).
# Writes results/bench-modal.json. The fake runs each sandbox chrooted in its
# image's root folder (a mount namespace: run as root); the agent is the
# static one (`bash scripts/prepare-docker.sh`), the image a static busybox.
#   bash scripts/bench-modal.sh            (PROFILE=debug for a debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
AGENT=$PWD/target/$(uname -m)-unknown-linux-gnu/release/orch-agent
[ -x "$AGENT" ] || { echo "error: no static agent at $AGENT: run bash scripts/prepare-docker.sh" >&2; exit 1; }
CELLS=${CELLS:-16}
LOG_MIB=${LOG_MIB:-64}
PROFILE=${PROFILE:-release}
flag=""; [ "$PROFILE" = release ] && flag="--release"
cargo build $flag --locked -p orch -p orch-fake-modal --bin orch --bin fake-modal >&2
ORCH=$PWD/target/$PROFILE/orch
FAKE=$PWD/target/$PROFILE/fake-modal

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-modal.XXXXXX")
"$FAKE" --root "$work/fake" --busybox-image debian:bookworm-slim > "$work/fake.out" &
fake_pid=$!
trap 'kill $fake_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do grep -q '^url ' "$work/fake.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^url //p' "$work/fake.out")
export MODAL_SERVER_URL=$url MODAL_TOKEN_ID=ak-bench MODAL_TOKEN_SECRET=as-bench ORCH_AGENT_STATIC=$AGENT

values=$(seq -s, 1 "$CELLS")
cat > "$work/noop.yaml" <<YAML
name: overhead
image: debian:bookworm-slim
benchmarks:
  - name: noop
    workload: {noop: true}
    matrix:
      i: [$values]
YAML
cat > "$work/logs.yaml" <<YAML
name: logs
image: debian:bookworm-slim
logs: {head: 1GiB, tail: 1GiB}
benchmarks:
  - name: spew
    workload: {shell: 'head -c $((LOG_MIB * 1048576)) /dev/zero | tr "\\\\0" "a" | fold -w 99'}
YAML
for backend in local modal; do
  "$ORCH" run -f "$work/noop.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/noop-$backend.json"
  "$ORCH" run -f "$work/logs.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/logs-$backend.json"
done
mkdir -p results
python3 - "$work" "$CELLS" "$LOG_MIB" "$PROFILE" <<'PY'
import json, os, statistics, sys
work, cells, mib, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {"cells": cells, "log_mib": mib, "build": profile,
       "server": "fake-modal (orch-fake-modal) on this host: gRPC on loopback, each sandbox chrooted in its image root (mount namespace)",
       "measure": "cell record duration_s (launch to result stored); log MiB/s = bytes of stdout.log / duration"}
for b in ("local", "modal"):
    rec = json.load(open(f"{work}/noop-{b}.json"))
    assert all(c["status"] == "succeeded" for c in rec["cells"]), (b, rec)
    ds = sorted(c["duration_s"] * 1000 for c in rec["cells"])
    out[f"{b}_overhead_ms"] = round(statistics.median(ds), 1)
    out[f"{b}_overhead_p90_ms"] = round(ds[int(0.9 * (len(ds) - 1))], 1)
    rec = json.load(open(f"{work}/logs-{b}.json"))
    c = rec["cells"][0]
    assert c["status"] == "succeeded", (b, c)
    size = os.path.getsize(f"{work}/{b}/{rec['id']}/cells/{c['id']}/stdout.log")
    out[f"{b}_log_bytes"] = size
    out[f"{b}_log_s"] = round(c["duration_s"], 3)
    out[f"{b}_log_mib_per_s"] = round(size / 1048576 / c["duration_s"], 1)
out["command"] = "bash scripts/bench-modal.sh"
json.dump(out, open("results/bench-modal.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
