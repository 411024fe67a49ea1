#!/usr/bin/env bash
# The modal backend against the local fake Modal server (`fake-modal`), beside
# the local backend and the bare platform, in one run:
#  - per-cell overhead: median cell record duration_s of CELLS noop cells
#    started at once, ROUNDS times (launch to result stored: the app, image
#    and agent mount looked up, `SandboxCreate` (paced: `ORCH_MODAL_CREATE_RATE`,
#    5 a second after 10 at once), the sandbox's start, the agent's noop run,
#    its frames home over the sandbox's stdout, its end waited for). A one-cell
#    run before, not counted, makes the image, as the bare side's warm-up does;
#  - the bare platform (scripts/bench-bare/modal_sandboxes.py, Modal's official Python
#    client, in the same rounds, interleaved with orch's): CELLS sandboxes
#    running `true` in the same image at once, timed from `Sandbox.create` to
#    `wait()` returning. `modal_overhead_over_bare_ms` is orch's host side and
#    what it runs in the sandbox (the agent's noop run: about the local
#    backend's figure);
#  - log throughput: one command cell writing LOG_MIB MiB to stdout, MiB/s
#    from its duration (the bytes come home as frames over the sandbox's
#    stdout on modal; straight to the file on local).
# Writes results/bench-modal.json. The fake runs each sandbox chrooted in its
# image's root folder (a mount namespace: run as root); the agent is the
# static one (`bash scripts/prepare-docker.sh`), the image a static busybox;
# python3 with `modal` (PyPI). Builds into CARGO_TARGET_DIR when set.
#   bash scripts/bench-modal.sh            (PROFILE=debug for a debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
AGENT=$TARGET/$(uname -m)-unknown-linux-gnu/release/orch-agent
[ -x "$AGENT" ] || AGENT=$PWD/target/$(uname -m)-unknown-linux-gnu/release/orch-agent
[ -x "$AGENT" ] || { echo "error: no static agent at $AGENT: run bash scripts/prepare-docker.sh" >&2; exit 1; }
CELLS=${CELLS:-16}
ROUNDS=${ROUNDS:-3}
LOG_MIB=${LOG_MIB:-64}
PROFILE=${PROFILE:-release}
flag=""; [ "$PROFILE" = release ] && flag="--release"
# SKIP_BUILD=1: use the binaries already built
[ -n "${SKIP_BUILD:-}" ] || cargo build $flag --locked -p orch -p orch-fake-modal --bin orch --bin fake-modal >&2
python3 -c 'import modal' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check 'modal>=1.0,<2' >&2
ORCH=$TARGET/$PROFILE/orch
FAKE=$TARGET/$PROFILE/fake-modal

load_start=$(cut -d' ' -f1 /proc/loadavg)
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-modal.XXXXXX")
"$FAKE" --root "$work/fake" --busybox-image debian:bookworm-slim > "$work/fake.out" &
fake_pid=$!
trap 'kill $fake_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 50); do grep -q '^url ' "$work/fake.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^url //p' "$work/fake.out")
export MODAL_SERVER_URL=$url MODAL_TOKEN_ID=ak-bench MODAL_TOKEN_SECRET=as-bench ORCH_AGENT_STATIC=$AGENT

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
cat > "$work/warm.yaml" <<YAML
name: warm
image: debian:bookworm-slim
benchmarks:
  - name: noop
    workload: {noop: true}
YAML
"$ORCH" run -f "$work/warm.yaml" --backend modal --store "$work/warm" --json > /dev/null
mkdir -p "$work/home"
for r in $(seq "$ROUNDS"); do
  for backend in local modal; do
    "$ORCH" run -f "$work/noop.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/noop-$backend-$r.json"
  done
  HOME=$work/home python3 scripts/bench-bare/modal_sandboxes.py "$CELLS" > "$work/bare-true-$r.json"
done
for backend in local modal; do
  "$ORCH" run -f "$work/logs.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/logs-$backend.json"
done
mkdir -p results
python3 scripts/bench-bare/report.py modal "$work" "$CELLS" "$LOG_MIB" "$PROFILE" "$ROUNDS" "$load_start" \
  results/bench-modal.json "$(cat <<'JSON'
{"server": "fake-modal (orch-fake-modal) on this host: gRPC on loopback, each sandbox chrooted in its image root (mount namespace)", "measure": "cell record duration_s (launch to result stored), medians over every cell of every round; bare: the official Python client's Sandbox.create to wait() returning, the same count at once, interleaved with orch's rounds; log MiB/s = bytes of stdout.log / duration", "bare": "scripts/bench-bare/modal_sandboxes.py: sandboxes running `true` in the same image"}
JSON
)" "true:"
