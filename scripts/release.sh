#!/usr/bin/env bash
# Everything a user installs, from this checkout, into dist/:
#
#   bash scripts/release.sh
#
#  - orch-<version>-py3-none-manylinux2014_<arch>.manylinux_2_17_<arch>.whl
#    (maturin, `bindings = "bin"`):
#    `pip install` / `uv tool install` / `pipx install` put `orch` and
#    `orch-agent-static` into the environment's bin/;
#  - orch-<version>-<arch>-linux.tar.gz: orch, orch-agent-static, shell
#    completions and the README;
#  - a .sha256 file beside each (`sha256sum -c` reads it).
#
# `orch` is static (`+crt-static`): it runs on any Linux of the architecture
# (manylinux2014 and older glibc alike) and is itself the static `orch` that
# remote setups run (modal sandboxes, the kubernetes agent image). The agent
# for containers comes from scripts/build-agent.sh (static, carrying the
# glibc 2.17 dynamic one). Tools are installed once under
# ${ORCH_TOOLS:-~/.cache/orch-tools}: maturin (PyPI) in a venv of its own,
# plus what build-agent.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
arch="$(uname -m)"
target="$arch-unknown-linux-gnu"
tools="${ORCH_TOOLS:-$HOME/.cache/orch-tools}"
maturin_version="1.16.0"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
dist="${ORCH_DIST:-dist}"

if ! "$tools/maturin-venv/bin/maturin" --version >/dev/null 2>&1; then
  echo "release: installing maturin $maturin_version (PyPI) into $tools/maturin-venv" >&2
  python3 -m venv "$tools/maturin-venv"
  "$tools/maturin-venv/bin/pip" install -q --disable-pip-version-check "maturin==$maturin_version"
fi
maturin="$tools/maturin-venv/bin/maturin"

# 1. The static agent for containers.
agent=$(bash scripts/build-agent.sh)

# 2. The wheel: maturin builds the static orch (--target keeps the static
# flag away from build scripts and proc macros) and packs it with the agent.
# Its `cargo rustc` flags differ from a plain `cargo build`'s, so the archive
# takes the wheel's orch rather than building orch a second time.
rm -rf target/wheel-data && mkdir -p target/wheel-data/scripts "$dist"
cp "$agent" target/wheel-data/scripts/orch-agent-static
rm -f "$dist"/orch-"$version"-*.whl "$dist"/orch-"$version"-*.whl.sha256
RUSTFLAGS="-C target-feature=+crt-static" \
  "$maturin" build --release --locked --target "$target" --compatibility manylinux2014 --out "$dist" >&2
wheel=$(ls "$dist"/orch-"$version"-*.whl)
orch="target/release-stage/orch"
mkdir -p target/release-stage
python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
  "$wheel" "orch-$version.data/scripts/orch" "$orch"
chmod +x "$orch"
if ldd "$orch" 2>&1 | grep -q "=>"; then
  echo "error: the wheel's orch is not static" >&2; rm -f "$wheel"; exit 1
fi

# 3. The archive: orch, the agent, completions, the README.
name="orch-$version-$arch-linux"
stage="target/release-stage/$name"
rm -rf "$stage" && mkdir -p "$stage/completions"
cp "$orch" "$stage/orch"
cp "$agent" "$stage/orch-agent-static"
cp README.md "$stage/README.md"
"$stage/orch" completions bash > "$stage/completions/orch.bash"
"$stage/orch" completions zsh > "$stage/completions/_orch"
"$stage/orch" completions fish > "$stage/completions/orch.fish"
tar -C "target/release-stage" -czf "$dist/$name.tar.gz" "$name"

# 4. Checksums, and what the archive's orch says of itself.
(
  cd "$dist"
  for f in "$name.tar.gz" orch-"$version"-*.whl; do
    [ -f "$f" ] && sha256sum "$f" > "$f.sha256"
  done
)
"$stage/orch" --version >&2
ls -l "$dist" >&2
echo "$dist/$name.tar.gz"
