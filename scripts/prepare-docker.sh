#!/usr/bin/env bash
# What the docker backend needs on this machine, made locally (no registry):
#  - a static orch-agent (runs in any image: old glibc, or none);
#  - a static busybox in containers/quickstart/ for the quickstart image.
#   bash scripts/prepare-docker.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(uname -m)-unknown-linux-gnu"
# --target keeps the static flag away from build scripts and proc macros.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p orch-agent --target "$target" >&2
agent="target/$target/release/orch-agent"
if ldd "$agent" 2>&1 | grep -q "=>"; then
  echo "error: $agent is not static" >&2; exit 1
fi
if [ ! -x /bin/busybox ] || ! ldd /bin/busybox 2>&1 | grep -q "not a dynamic"; then
  if command -v apt-get >/dev/null; then
    apt-get install -y -q busybox-static >&2 || { apt-get update -q >&2 && apt-get install -y -q busybox-static >&2; }
  fi
fi
cp /bin/busybox containers/quickstart/busybox
echo "static agent: $agent"
echo "busybox:      containers/quickstart/busybox"
