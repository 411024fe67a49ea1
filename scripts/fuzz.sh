#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 15) from its committed
# corpus (`fuzz/corpus/<target>`; new inputs go to a scratch folder, so the
# committed corpus never changes). A crash fails the script and leaves the
# input under `fuzz/artifacts/<target>/`.
#
# `cargo fuzz` needs nightly flags; stable Rust accepts them with
# RUSTC_BOOTSTRAP=1. `cargo install cargo-fuzz --locked` provides it.
# No sanitizer: the targets are safe Rust, and what is looked for is a
# panic; building without ASan keeps CI's build short.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-15}"
export RUSTC_BOOTSTRAP=1
targets=(manifest event_line diagnose metrics_file)
(cd fuzz && cargo fuzz build --sanitizer none)
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  echo "fuzz: $t for ${secs}s"
  if ! (cd fuzz && cargo fuzz run --sanitizer none "$t" "$scratch/$t" "corpus/$t" -- \
      -max_total_time="$secs" -print_final_stats=1 >"$scratch/$t.log" 2>&1); then
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$scratch/$t.log" >&2 || tail -20 "$scratch/$t.log" >&2
    echo "fuzz: $t failed; the input is under fuzz/artifacts/$t/" >&2
    exit 1
  fi
  grep -E '^stat::(number_of_executed_units|new_units_added)' "$scratch/$t.log" | tr '\n' ' '; echo
done
