#!/usr/bin/env bash
# What the remote backends need on this machine, made locally:
#  - the agent for containers (scripts/build-agent.sh: static, carrying the
#    glibc 2.17 dynamic agent; mounted into every modal sandbox, content-addressed,
#    and put into the kubernetes agent image by `orch build --agent`);
#  - a static `orch`, run where weights are set up remotely: inside the sandbox of
#    `orch setup --backend modal`, and in the Job of `orch setup --backend kubernetes`
#    (`orch build --agent` puts it into the agent image beside the agent).
#   bash scripts/prepare-modal.sh
set -euo pipefail
cd "$(dirname "$0")/.."
agent=$(bash scripts/build-agent.sh)
target="$(uname -m)-unknown-linux-gnu"
# --target keeps the static flag away from build scripts and proc macros.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p orch --target "$target" >&2
if ldd "target/$target/release/orch" 2>&1 | grep -q "=>"; then
  echo "error: target/$target/release/orch is not static" >&2; exit 1
fi
echo "agent:       $agent"
echo "static orch: target/$target/release/orch"
