#!/usr/bin/env bash
# Copy the seed suites' scripts into the build context of containers/seed-ml
# (an image's context cannot reach outside its folder), so that
# `orch build -f manifests/seed-<name>.yaml` bakes them into the image at
# /seeds/examples, where the cells find them. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
dst=containers/seed-ml/examples
rm -rf "$dst"
mkdir -p "$dst"
for d in examples/seed-* examples/pytorch-train; do
  cp -r "$d" "$dst/"
done
find "$dst" -name __pycache__ -prune -exec rm -rf {} +
echo "copied $(ls "$dst" | wc -l) example folders into $dst"
