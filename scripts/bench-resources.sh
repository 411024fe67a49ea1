#!/usr/bin/env bash
# Host resources of the `orch` process with N cells at once, and the store's write of
# many cells ending in the same instant (issue 47 item 3). Writes results/bench-resources.json.
#
#  - resources: `orch run --jobs N` of N cells each sleeping SLEEP s (N in NS, default
#    10 100 1000), on the local backend and on the fake cluster (fake-kube: run as root,
#    it chroots; the agent image holds the static agent of `bash scripts/prepare-docker.sh`);
#    the orch process sampled every 50 ms: peak RSS (VmHWM), threads, open fds, sockets,
#    pipes; growth per cell running at once (least squares over N);
#  - store: STORE_CELLS (default 1000) cells on the local backend that each wait on one
#    FIFO, released at once: time from the release (and from the first record) to the
#    last record stored, folder store and S3 store (s3s-fs's storage on this host,
#    served with TCP_NODELAY by scripts/s3s-nodelay).
#
#   bash scripts/bench-resources.sh
#   NS="10 100" BACKENDS=local STORES=folder bash scripts/bench-resources.sh   (a quick look)
#   BEFORE_BIN=/path/to/earlier/orch BEFORE_NOTE="commit X" bash scripts/bench-resources.sh   (before/after)
set -euo pipefail
cd "$(dirname "$0")/.."
NS=${NS:-"10 100 1000"}
# KUBE_NS: the sizes on the fake cluster (each running pod holds a copy of the agent).
KUBE_NS=${KUBE_NS:-$NS}
SLEEP=${SLEEP:-5}
STORE_CELLS=${STORE_CELLS:-1000}
BACKENDS=${BACKENDS:-"local kubernetes"}
STORES=${STORES:-"folder s3"}
PROFILE=${PROFILE:-release}
OUT=${OUT:-results/bench-resources.json}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
flag=""; [ "$PROFILE" = release ] && flag="--release"
# SKIP_BUILD=1: use the binaries already built
[ -n "${SKIP_BUILD:-}" ] || cargo build $flag --locked -q -p orch -p orch-fake-kube --bin orch --bin fake-kube >&2
# BEFORE_BIN: an earlier `orch` measured first, the same way ("before"; this build is "after")
ORCH=$TARGET/$PROFILE/orch
FAKE=$TARGET/$PROFILE/fake-kube
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-resources.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

kube_json='{}'
fake_pid=0
if [[ " $BACKENDS " == *" kubernetes "* ]]; then
  # The static agent of `bash scripts/prepare-docker.sh` when it is built (the agent
  # image holds it alone, the cells' image is a static busybox); else this build's
  # `orch-agent` with its libraries in both image roots (roots.py).
  AGENT=$TARGET/$(uname -m)-unknown-linux-gnu/release/orch-agent
  images=()
  if [ -x "$AGENT" ]; then
    mkdir -p "$work/agent-image"
    cp "$AGENT" "$work/agent-image/orch-agent"
    images=(--image "bench/orch-agent:1=$work/agent-image" --busybox-image "debian:bookworm-slim")
  else
    cargo build $flag --locked -q -p orch-agent --bin orch-agent >&2
    echo "bench-resources: no static agent at $AGENT: the fake cluster runs $TARGET/$PROFILE/orch-agent" >&2
    python3 scripts/bench-resources/roots.py "$TARGET/$PROFILE/orch-agent" "$work/cell-image" "$work/agent-image"
    images=(--image "bench/orch-agent:1=$work/agent-image" --image "debian:bookworm-slim=$work/cell-image")
  fi
  "$FAKE" "$work/kubeconfig" "${images[@]}" > "$work/fake.out" 2>&1 &
  pids+=($!)
  fake_pid=$!
  for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
  # The client-side rate limit (50/s, issue 47 item 2) would spread 1,000 Jobs over
  # 20 s; here the cells are to overlap, so it is raised.
  kube_json='{"ORCH_KUBERNETES_QPS": "2000", "ORCH_KUBERNETES_BURST": "4000"}'
fi

s3_url=""
if [[ " $STORES " == *" s3 "* ]]; then
  cargo build --release -q --manifest-path scripts/s3s-nodelay/Cargo.toml --target-dir "$TARGET/s3s-nodelay" >&2
  NODELAY=$TARGET/s3s-nodelay/release/s3s-nodelay
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$work/s3root/bench-burst"
  "$NODELAY" 127.0.0.1 "$port" benchkey benchsecret-0123456789 "$work/s3root" >/dev/null 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=benchkey \
    AWS_SECRET_ACCESS_KEY=benchsecret-0123456789 AWS_REGION=us-east-1 AWS_CONFIG_FILE=/nonexistent \
    AWS_SHARED_CREDENTIALS_FILE=/nonexistent AWS_EC2_METADATA_DISABLED=true ORCH_S3_WORKDIR=$work/s3work
  s3_url=s3://bench-burst/x
fi
unset ORCH_STORE

mkdir -p "$(dirname "$OUT")"
cfg=$(python3 - <<PY
import json
print(json.dumps({
  "work": "$work", "orch": "$ORCH", "profile": "$PROFILE", "sleep": $SLEEP,
  "ns": [int(x) for x in "$NS".split()], "kube_ns": [int(x) for x in "$KUBE_NS".split()], "backends": "$BACKENDS".split(), "stores": "$STORES".split(),
  "store_cells": $STORE_CELLS, "kubeconfig": "$work/kubeconfig", "agent_image": "bench/orch-agent:1",
  "image": "debian:bookworm-slim", "kube_env": $kube_json, "s3_url": "$s3_url",
  "s3_root": "$work/s3root", "out": "$OUT", "note": """${NOTE:-}""",
  "before": "${BEFORE_BIN:-}", "fake_pid": $fake_pid, "before_note": """${BEFORE_NOTE:-}""",
}))
PY
)
python3 scripts/bench-resources/bench.py "$cfg"
