#!/usr/bin/env bash
# The kubernetes backend against the local fake API server (`fake-kube`,
# orch-fake-kube: Kubernetes REST on loopback, a Job controller and a "kubelet"
# running each container chrooted in its image's root folder, in a mount
# namespace of its own: run as root), beside the local backend, in one run:
#  - per-cell overhead: median cell record duration_s of CELLS noop cells
#    (launch to result stored: Secret/Job create, scheduling, the init
#    container installing the agent, the pod log home, Job deletion);
#  - log throughput: one command cell writing LOG_MIB MiB to stdout, MiB/s
#    from its duration (the bytes come home as frames over the pod log on
#    kubernetes; straight to the file on local).
# Writes results/bench-kubernetes.json. Needs the static agent
# (`bash scripts/prepare-docker.sh`): the agent image holds it, and the cells'
# image (debian:bookworm-slim here) is a static busybox.
#   bash scripts/bench-kubernetes.sh            (PROFILE=debug for a debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
AGENT=$PWD/target/$(uname -m)-unknown-linux-gnu/release/orch-agent
[ -x "$AGENT" ] || { echo "error: no static agent at $AGENT: run bash scripts/prepare-docker.sh" >&2; exit 1; }
CELLS=${CELLS:-16}
LOG_MIB=${LOG_MIB:-64}
PROFILE=${PROFILE:-release}
flag=""; [ "$PROFILE" = release ] && flag="--release"
cargo build $flag --locked -p orch -p orch-fake-kube --bin orch --bin fake-kube >&2
ORCH=$PWD/target/$PROFILE/orch
FAKE=$PWD/target/$PROFILE/fake-kube

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-kubernetes.XXXXXX")
mkdir -p "$work/agent-image"
cp "$AGENT" "$work/agent-image/orch-agent"
"$FAKE" "$work/kubeconfig" --image "bench/orch-agent:1=$work/agent-image" \
  --busybox-image "debian:bookworm-slim" > "$work/fake.out" 2>&1 &
fake_pid=$!
trap 'kill $fake_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
export KUBECONFIG=$work/kubeconfig ORCH_AGENT_IMAGE=bench/orch-agent:1

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
for backend in local kubernetes; do
  "$ORCH" run -f "$work/noop.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/noop-$backend.json"
  "$ORCH" run -f "$work/logs.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/logs-$backend.json"
done
mkdir -p results
python3 - "$work" "$CELLS" "$LOG_MIB" "$PROFILE" <<'PY'
import json, os, statistics, sys
work, cells, mib, profile = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out = {"cells": cells, "log_mib": mib, "build": profile, "cpus": os.cpu_count(),
       "server": "fake-kube (orch-fake-kube) on this host: Kubernetes REST on loopback, each container chrooted in its image root (mount namespace), 100 ms scheduling delay",
       "measure": "cell record duration_s (launch to result stored); log MiB/s = bytes of stdout.log / duration"}
for b in ("local", "kubernetes"):
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
out["command"] = "bash scripts/bench-kubernetes.sh"
json.dump(out, open("results/bench-kubernetes.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
