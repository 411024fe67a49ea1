#!/usr/bin/env bash
# The kubernetes backend against the local fake API server (`fake-kube`,
# orch-fake-kube: Kubernetes REST on loopback, a Job controller and a "kubelet"
# running each container chrooted in its image's root folder, in a mount
# namespace of its own: run as root), beside the local backend and the bare
# platform, in one run:
#  - per-cell overhead: median cell record duration_s of CELLS noop cells
#    started at once, ROUNDS times (launch to result stored: the run's watch,
#    the Job's create, the fake's 100 ms scheduling delay, the agent image
#    mounted as an image volume (the fake is Kubernetes 1.35 on containerd
#    2.1, so `agent_delivery: auto` picks it), the agent's noop run, its
#    frames home over the pod log, the pod seen ended, the Job's deletion
#    answered); and the same suite with `agent_delivery: init-container`
#    (variant `kubernetes_init`: an init container copies the agent in, as on
#    clusters without image volumes);
#  - the bare platform (scripts/bench-bare/kube_jobs.py, the official Python
#    client, in the same rounds, interleaved with orch's): the same CELLS Jobs
#    at once, timed from their create to their pod seen `Succeeded` in one
#    watch and their deletion answered. Shape `orch`: the very Jobs orch
#    submits (`orch run --dry-run`: the same image volume, the same agent
#    running the same noop task), so `kubernetes_overhead_over_bare_ms` is
#    orch's own host side (its watch, the log home, the record); shape
#    `orch_init`: the init-container variant's Jobs, beside its orch runs
#    (`kubernetes_init_overhead_over_bare_init_ms`); shape `true`: a plain
#    one-container Job running `true` in the same image, so
#    `..._over_bare_true_ms` adds what orch runs in the pod (the agent, and
#    for the variant the init container) to it;
#  - log throughput: one command cell writing LOG_MIB MiB to stdout, MiB/s
#    from its duration (the bytes come home as frames over the pod log on
#    kubernetes; straight to the file on local).
# Writes results/bench-kubernetes.json. Needs the static agent
# (`bash scripts/prepare-docker.sh`): the agent image holds it, and the cells'
# image (debian:bookworm-slim here) is a static busybox; and python3 with
# `kubernetes` (PyPI). Builds into CARGO_TARGET_DIR when set.
#   bash scripts/bench-kubernetes.sh            (PROFILE=debug for a debug build)
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
[ -n "${SKIP_BUILD:-}" ] || cargo build $flag --locked -p orch -p orch-fake-kube --bin orch --bin fake-kube >&2
python3 -c 'import kubernetes' 2>/dev/null \
  || python3 -m pip install -q --disable-pip-version-check 'kubernetes>=30,<40' >&2
ORCH=$TARGET/$PROFILE/orch
FAKE=$TARGET/$PROFILE/fake-kube

load_start=$(cut -d' ' -f1 /proc/loadavg)
work=$(mktemp -d "${TMPDIR:-/tmp}/bench-kubernetes.XXXXXX")
mkdir -p "$work/agent-image"
cp "$AGENT" "$work/agent-image/orch-agent"
"$FAKE" "$work/kubeconfig" --image "bench/orch-agent:1=$work/agent-image" \
  --busybox-image "debian:bookworm-slim" --kubernetes-version 1.35 \
  --container-runtime containerd://2.1.4 > "$work/fake.out" 2>&1 &
fake_pid=$!
trap 'kill $fake_pid 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do [ -s "$work/kubeconfig" ] && break; sleep 0.1; done
export KUBECONFIG=$work/kubeconfig ORCH_AGENT_IMAGE=bench/orch-agent:1

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
# The dry runs name the delivery (a dry run asks no cluster, so `auto` would
# print the init container): the Jobs `auto` submits here, and the variant's.
sed 's/^name: overhead$/name: overhead\nkubernetes: {agent_delivery: image-volume}/' "$work/noop.yaml" > "$work/noop-volume.yaml"
sed 's/^name: overhead$/name: overhead\nkubernetes: {agent_delivery: init-container}/' "$work/noop.yaml" > "$work/noop-init.yaml"
"$ORCH" run -f "$work/noop-volume.yaml" --backend kubernetes --dry-run > "$work/dry-run.yaml"
"$ORCH" run -f "$work/noop-init.yaml" --backend kubernetes --dry-run > "$work/dry-run-init.yaml"
grep -q 'reference: bench/orch-agent:1' "$work/dry-run.yaml" || { echo "error: the dry run has no image volume" >&2; exit 1; }
for r in $(seq "$ROUNDS"); do
  for backend in local kubernetes; do
    "$ORCH" run -f "$work/noop.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/noop-$backend-$r.json"
  done
  "$ORCH" run -f "$work/noop-init.yaml" --backend kubernetes --store "$work/kubernetes" --json > "$work/noop-kubernetes_init-$r.json"
  python3 scripts/bench-bare/kube_jobs.py "$KUBECONFIG" orch "$CELLS" "$work/dry-run.yaml" > "$work/bare-orch-$r.json"
  python3 scripts/bench-bare/kube_jobs.py "$KUBECONFIG" orch_init "$CELLS" "$work/dry-run-init.yaml" > "$work/bare-orch_init-$r.json"
  python3 scripts/bench-bare/kube_jobs.py "$KUBECONFIG" true "$CELLS" > "$work/bare-true-$r.json"
done
# `auto` picked the image volume in every orch run of the default suite.
python3 - "$work" "$ROUNDS" <<'PY'
import json, sys
work, rounds = sys.argv[1], int(sys.argv[2])
for r in range(1, rounds + 1):
    for name, want in (("kubernetes", "image-volume"), ("kubernetes_init", "init-container")):
        for c in json.load(open(f"{work}/noop-{name}-{r}.json"))["cells"]:
            got = c["info"].get("kubernetes_agent_delivery")
            assert got == want, (name, r, c["id"], got)
PY
for backend in local kubernetes; do
  "$ORCH" run -f "$work/logs.yaml" --backend "$backend" --store "$work/$backend" --json > "$work/logs-$backend.json"
done
mkdir -p results
VARIANTS=kubernetes_init python3 scripts/bench-bare/report.py kubernetes "$work" "$CELLS" "$LOG_MIB" "$PROFILE" "$ROUNDS" "$load_start" \
  results/bench-kubernetes.json "$(cat <<'JSON'
{"server": "fake-kube (orch-fake-kube) on this host: Kubernetes 1.35 REST on loopback, nodes on containerd 2.1 (image volumes), each container chrooted in its image root (mount namespace), 100 ms scheduling delay", "measure": "cell record duration_s (launch to result stored), medians over every cell of every round; bare: the official Python client's create to pod Succeeded (one watch) to Job deletion answered, the same count at once, interleaved with orch's rounds; log MiB/s = bytes of stdout.log / duration", "bare": "scripts/bench-bare/kube_jobs.py: shape orch = the Jobs of `orch run --dry-run` with agent_delivery image-volume (what auto picks here: the agent image as an image volume, the agent's noop task); shape orch_init = the same with agent_delivery init-container; shape true = one container running `true` in the same image", "variants": {"kubernetes": "agent_delivery auto (image-volume here)", "kubernetes_init": "agent_delivery init-container"}}
JSON
)" "orch:" "orch_init:_init:kubernetes_init" "true:_true" "true:_true:kubernetes_init"
