#!/usr/bin/env bash
# orch's built-in load generator side by side with `vllm bench serve` and
# GuideLLM, against one fast OpenAI-compatible server (fast-openai):
# agreement of counts and latencies, the highest request rate each client
# sustains, CPU per request, and the client's own TTFT overhead at 1, 100 and
# 1,000 streams. Writes results/bench-loadgen.json.
#
#   bash scripts/bench-loadgen.sh            # about 15 minutes on 2 cores
#   bash scripts/bench-loadgen.sh --quick    # fewer requests and rates
#
# vllm (with its `bench` extra) and GuideLLM come from PyPI into venvs under
# ${ORCH_TOOLS:-~/.cache/orch-tools} (vllm's is about 10 GB, once); not CI's.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${ORCH_TOOLS:-$HOME/.cache/orch-tools}"
vllm_version="0.33.0"
guidellm_version="0.8.1"
mkdir -p "$tools" results
if ! "$tools/vllm-venv/bin/python" -c "import vllm, pandas" 2>/dev/null; then
  echo "bench-loadgen: installing vllm[bench]==$vllm_version into $tools/vllm-venv" >&2
  python3 -m venv "$tools/vllm-venv"
  "$tools/vllm-venv/bin/pip" install -q --disable-pip-version-check "vllm[bench]==$vllm_version"
fi
if ! "$tools/guidellm-venv/bin/python" -c "import guidellm" 2>/dev/null; then
  echo "bench-loadgen: installing guidellm==$guidellm_version into $tools/guidellm-venv" >&2
  python3 -m venv "$tools/guidellm-venv"
  "$tools/guidellm-venv/bin/pip" install -q --disable-pip-version-check "guidellm==$guidellm_version"
fi
cargo build --release --locked -q -p orch --bin orch -p orch-testkit --bin fast-openai >&2
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One tokenizer for every client: the test fixture (a WordPiece tokenizer.json),
# with the two small files transformers' AutoTokenizer wants beside it.
mkdir -p "$work/tok"
cp crates/orch/tests/fixtures/tiny-tokenizer.json "$work/tok/tokenizer.json"
echo '{"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1000000}' > "$work/tok/tokenizer_config.json"
echo '{"model_type": "gpt2"}' > "$work/tok/config.json"
# 30,000 prompts of 20 to 200 words (seeded), as JSONL `{"prompt": ...}`.
python3 - "$work/prompts.jsonl" <<'PY'
import json, random, sys
random.seed(7)
vocab = "the of and to in is was for on that with as by at from his her an which be this are were had not but their they or have one all been has more its who also when two first into after new other some time there can would".split()
with open(sys.argv[1], "w") as f:
    for _ in range(30000):
        f.write(json.dumps({"prompt": " ".join(random.choice(vocab) for _ in range(random.randint(20, 200)))}) + "\n")
PY
python3 scripts/bench-loadgen/bench.py \
  --orch target/release/orch --server target/release/fast-openai \
  --tokenizer "$work/tok" --prompts "$work/prompts.jsonl" \
  --vllm-python "$tools/vllm-venv/bin/python" --guidellm-python "$tools/guidellm-venv/bin/python" \
  --out results/bench-loadgen.json "$@"
