#!/usr/bin/env bash
# What `--backend modal` needs on this machine, made locally:
#  - the static orch-agent (mounted into every cell's sandbox, content-addressed);
#  - a static `orch` (run inside the sandbox of `orch setup --backend modal`).
#   bash scripts/prepare-modal.sh
set -euo pipefail
cd "$(dirname "$0")/.."
target="$(uname -m)-unknown-linux-gnu"
# --target keeps the static flag away from build scripts and proc macros.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked -p orch-agent -p orch --target "$target" >&2
for bin in orch-agent orch; do
  if ldd "target/$target/release/$bin" 2>&1 | grep -q "=>"; then
    echo "error: target/$target/release/$bin is not static" >&2; exit 1
  fi
done
echo "static agent: target/$target/release/orch-agent"
echo "static orch:  target/$target/release/orch"
