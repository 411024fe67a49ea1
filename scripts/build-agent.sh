#!/usr/bin/env bash
# The agent that containers get: one static file that carries the dynamic one.
#
#   bash scripts/build-agent.sh             # for this machine's architecture
#
# 1. The dynamic agent, linked against glibc 2.17 (the manylinux2014 baseline)
#    with cargo-zigbuild and zig from PyPI: it runs on the image's own loader
#    and glibc in every image with glibc >= 2.17, and loads NVML there.
#    target/agent-gnu/<arch>-unknown-linux-gnu/release/orch-agent
# 2. The static agent (`+crt-static`) with the dynamic one embedded
#    (`ORCH_AGENT_EMBED`): it runs in any image, and at `run` starts the
#    embedded one where the image has a glibc loader (crates/orch-agent/src/launch.rs).
#    target/<arch>-unknown-linux-gnu/release/orch-agent   <- what backends ship
#
# Tools are installed once under ${ORCH_TOOLS:-~/.cache/orch-tools}: a venv with
# `ziglang` and `cargo-zigbuild` (cargo install). Prints the static agent's path.
#
# Both agents are kept under ${ORCH_AGENT_CACHE:-$ORCH_TOOLS/agent-cache}/<key>,
# the key a SHA-256 of every input of the two builds: the files of orch-agent and of
# each workspace crate it depends on (`cargo tree`), Cargo.lock, the workspace
# Cargo.toml, `.cargo/config.toml` and a toolchain file where there are, this
# script, `rustc -vV`, `RUSTFLAGS` and the tool versions. A clean clone
# whose agent sources did not change copies them instead of building them (two
# release builds: about 5 minutes of CI). `ORCH_AGENT_CACHE=off` always builds;
# the newest 4 keys are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="$(uname -m)"
target="$arch-unknown-linux-gnu"
tools="${ORCH_TOOLS:-$HOME/.cache/orch-tools}"
zig_version="0.17.1"
zigbuild_version="0.24.1"

if ! "$tools/zig-venv/bin/python" -c 'import ziglang' 2>/dev/null; then
  echo "build-agent: installing ziglang $zig_version (PyPI) into $tools/zig-venv" >&2
  python3 -m venv "$tools/zig-venv"
  "$tools/zig-venv/bin/pip" install -q --disable-pip-version-check "ziglang==$zig_version"
fi
export PATH="$tools/zig-venv/bin:$PATH"
if ! command -v cargo-zigbuild >/dev/null; then
  echo "build-agent: installing cargo-zigbuild $zigbuild_version" >&2
  cargo install -q --locked "cargo-zigbuild@$zigbuild_version"
fi

gnu="target/agent-gnu/$target/release/orch-agent"
agent="target/$target/release/orch-agent"
cache="${ORCH_AGENT_CACHE:-$tools/agent-cache}"
if [ "$cache" != off ]; then
  crates=$(cargo tree -p orch-agent -e normal,build --prefix none --locked \
    | sed -n 's/^[^ ]* [^ ]* (\(\/[^)]*\)).*/\1/p' | sort -u)
  [ -n "$crates" ] || { echo "build-agent: cargo tree listed no crate of orch-agent" >&2; exit 1; }
  key=$( {
    rustc -vV
    echo "$target zig=$zig_version zigbuild=$zigbuild_version"
    # The environment's compiler flags reach the dynamic build.
    echo "RUSTFLAGS=${RUSTFLAGS:-} CARGO_ENCODED_RUSTFLAGS=${CARGO_ENCODED_RUSTFLAGS:-}"
    sha256sum Cargo.lock Cargo.toml scripts/build-agent.sh
    for f in .cargo/config.toml .cargo/config rust-toolchain.toml rust-toolchain; do
      [ ! -f "$f" ] || sha256sum "$f"
    done
    for c in $crates; do
      (cd "$c" && find . -type f -not -path './target/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    done
  } | sha256sum | cut -c1-24)
  hit="$cache/$key"
  if [ -x "$hit/orch-agent" ] && [ -x "$hit/orch-agent-gnu" ]; then
    mkdir -p "$(dirname "$gnu")" "$(dirname "$agent")"
    cp "$hit/orch-agent-gnu" "$gnu.tmp" && mv -f "$gnu.tmp" "$gnu"
    cp "$hit/orch-agent" "$agent.tmp" && mv -f "$agent.tmp" "$agent"
    touch "$hit"
    echo "build-agent: the agents of these sources, from $hit" >&2
    "$agent" version >&2
    echo "$agent"
    exit 0
  fi
fi

# 1. Dynamic, glibc 2.17. Its own target folder: the static build's flags
# differ, and sharing one folder would rebuild both every time.
cargo zigbuild --release --locked -p orch-agent --target "$target.2.17" --target-dir target/agent-gnu >&2
need=$(objdump -T "$gnu" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n 1)
case "$need" in
  GLIBC_2.1[0-7]|GLIBC_2.[0-9]|GLIBC_2.[0-9].*|GLIBC_2.1[0-7].*) ;;
  *) echo "error: $gnu needs $need, more than the glibc 2.17 baseline" >&2; exit 1 ;;
esac

# 2. Static, with the dynamic one inside. --target keeps the static flag away
# from build scripts and proc macros.
ORCH_AGENT_EMBED="$PWD/$gnu" RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked -p orch-agent --target "$target" >&2
if ldd "$agent" 2>&1 | grep -q "=>"; then
  echo "error: $agent is not static" >&2; exit 1
fi
"$agent" version >&2
echo "dynamic agent (glibc 2.17, needs $need): $gnu ($(du -h "$gnu" | cut -f1))" >&2
if [ "$cache" != off ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.new.XXXXXX")
  cp "$gnu" "$tmp/orch-agent-gnu" && cp "$agent" "$tmp/orch-agent"
  rm -rf "${hit:?}" && mv "$tmp" "$hit"
  # The newest 4 keys stay.
  ls -1t "$cache" | tail -n +5 | while read -r old; do rm -rf "${cache:?}/$old"; done
fi
echo "$agent"
