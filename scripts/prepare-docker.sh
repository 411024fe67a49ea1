#!/usr/bin/env bash
# What the docker backend needs on this machine, made locally (no registry):
#  - the agent for containers (scripts/build-agent.sh: static, carrying the
#    glibc 2.17 dynamic agent; runs in any image, reads NVML where it can);
#  - a static busybox in containers/quickstart/ for the quickstart image.
#   bash scripts/prepare-docker.sh
set -euo pipefail
cd "$(dirname "$0")/.."
agent=$(bash scripts/build-agent.sh)
if [ ! -x /bin/busybox ] || ! ldd /bin/busybox 2>&1 | grep -q "not a dynamic"; then
  if command -v apt-get >/dev/null; then
    apt-get install -y -q busybox-static >&2 || { apt-get update -q >&2 && apt-get install -y -q busybox-static >&2; }
  fi
fi
cp /bin/busybox containers/quickstart/busybox
echo "agent:   $agent"
echo "busybox: containers/quickstart/busybox"
