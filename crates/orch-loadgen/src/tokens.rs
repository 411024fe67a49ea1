//! Tokens as the model counts them, for the load generator: the model's own
//! `tokenizer.json` (Hugging Face's `tokenizers`), found where the cell's
//! weights are, and random prompts of an exact number of tokens.
//!
//! Where the tokenizer comes from, first found wins:
//! - `loadgen.tokenizer` ending in `.json`: that file (it travels with the cell);
//! - `loadgen.tokenizer`, else `loadgen.model`, as a Hub repo id (`org/name`)
//!   in the Hugging Face cache the cell sees: the task's weights folder,
//!   `$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`
//!   (`models--org--name/snapshots/<refs/main>/tokenizer.json`, else any
//!   snapshot holding one; `orch setup` puts it there).
//!
//! The file is loaded as `transformers` runs it for a plain call: its own
//! `padding` and `truncation` are turned off ([`from_file`]).
//!
//! Counting follows `vllm bench serve` and the server: a prompt's tokens are
//! its encoding with the tokenizer's special tokens (BOS...), as the server
//! counts what it receives, on chat endpoints too (the chat template is not
//! counted); a random prompt of `input_len` tokens is one that counts
//! `input_len` so (its random text is `input_len` less the special tokens,
//! as `vllm bench serve`'s random dataset makes it); a response's tokens
//! are the encoding of the text that arrived, without special tokens (the
//! load generator's count, whatever the server's `usage` says).

use orch_protocol::ErrorClass;
use std::path::{Path, PathBuf};

/// Why a tokenizer that was named did not load; the text is a cell failure's
/// (one line, `; hint:` where there is one).
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file is not a tokenizer `tokenizers` loads.
    #[error("cannot load the tokenizer `{}`: {source}", file.display())]
    Load {
        file: PathBuf,
        source: tokenizers::Error,
    },
    /// The file's own truncation could not be turned off.
    #[error("cannot turn off the truncation of the tokenizer `{}`: {source}", file.display())]
    Truncation {
        file: PathBuf,
        source: tokenizers::Error,
    },
    /// `loadgen.tokenizer` names a Hub repo that no cache the cell sees holds.
    #[error(
        "no `tokenizer.json` of `{repo}` in {}; hint: `orch setup` fetches it with the model's weights, or give `tokenizer: path/to/tokenizer.json`",
        in_backticks(caches)
    )]
    NotFound { repo: String, caches: Vec<PathBuf> },
}

impl ErrorClass for TokensError {
    fn is_user_error(&self) -> bool {
        // A file or repo the suite named; turning off truncation is ours.
        !matches!(self, TokensError::Truncation { .. })
    }
}

fn in_backticks(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|c| format!("`{}`", c.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The model's tokenizer and where it came from.
pub struct Tokens {
    tok: tokenizers::Tokenizer,
    pub source: String,
    clean: std::sync::OnceLock<Vec<u32>>,
}

impl Tokens {
    /// Tokens of a prompt, special tokens included.
    pub fn count_prompt(&self, text: &str) -> Option<u64> {
        self.tok.encode(text, true).ok().map(|e| e.len() as u64)
    }

    /// Tokens of generated text, no special tokens.
    pub fn count_output(&self, text: &str) -> Option<u64> {
        self.tok.encode(text, false).ok().map(|e| e.len() as u64)
    }

    /// A random prompt of `len` tokens (counted as [`Tokens::count_output`]
    /// counts them, no special tokens) after `prefix`, as `vllm bench serve
    /// --dataset-name random` builds them: random ids of the vocabulary,
    /// decoded, re-encoded, and ids dropped or added until the text has the
    /// asked length. Ids are drawn among those that decode alone to clean
    /// text (no special token, no lone byte of a multi-byte character), so
    /// the text re-encodes to about as many tokens. The closest text is
    /// returned where merges across ids make the exact length unreachable
    /// (each request's real count is measured anyway); `None` only for a
    /// tokenizer with no usable id.
    pub fn random_prompt(&self, rng: &mut impl rand::Rng, len: usize, prefix: &[u32]) -> Option<String> {
        self.random_prompt_before(rng, len, prefix, "")
    }

    /// [`Tokens::random_prompt`] for a prompt that will be sent with
    /// `suffix` appended (a nonce tag): the returned text, `suffix` appended,
    /// has `len` tokens after `prefix` (the suffix's own tokens included), so
    /// that the prompt as sent has the asked length. The random part keeps
    /// at least one token.
    pub fn random_prompt_before(
        &self,
        rng: &mut impl rand::Rng,
        len: usize,
        prefix: &[u32],
        suffix: &str,
    ) -> Option<String> {
        // The suffix's own tokens come off the random part (counted once).
        let own = if suffix.is_empty() {
            0
        } else {
            self.count_output(suffix).unwrap_or(0) as usize
        };
        let random = len.saturating_sub(own).max(1);
        self.random_text(rng, random, prefix.len() + random + own, prefix, suffix)
            .map(|t| t.strip_suffix(suffix).map(String::from).unwrap_or(t))
    }

    /// `len` random ids after `prefix`, decoded, with `suffix` appended,
    /// searched until the whole encodes to `target` tokens (the closest
    /// found otherwise).
    fn random_text(
        &self,
        rng: &mut impl rand::Rng,
        len: usize,
        target: usize,
        prefix: &[u32],
        suffix: &str,
    ) -> Option<String> {
        let clean = self.clean_ids();
        if clean.is_empty() {
            return None;
        }
        let draw = |rng: &mut dyn rand::RngCore| clean[(rng.next_u64() % clean.len() as u64) as usize];
        let mut ids: Vec<u32> = prefix.to_vec();
        ids.extend((0..len).map(|_| draw(rng)));
        let mut best: Option<(usize, String)> = None;
        for _ in 0..64 {
            let text = self.tok.decode(&ids, false).ok()? + suffix;
            let n = self.tok.encode(text.as_str(), false).ok()?.len();
            if n == target {
                return Some(text);
            }
            let off = n.abs_diff(target);
            if best.as_ref().is_none_or(|(o, _)| off < *o) {
                best = Some((off, text));
            }
            if n > target {
                let keep = ids.len().saturating_sub(off).max(prefix.len());
                ids.truncate(keep);
            } else {
                ids.extend((0..off).map(|_| draw(rng)));
            }
        }
        best.map(|(_, t)| t)
    }

    /// Ids that decode alone to non-empty text without a replacement
    /// character, special tokens left out (computed once).
    fn clean_ids(&self) -> &[u32] {
        self.clean.get_or_init(|| {
            let special: std::collections::HashSet<u32> = self
                .tok
                .get_added_tokens_decoder()
                .iter()
                .filter(|(_, t)| t.special)
                .map(|(id, _)| *id)
                .collect();
            (0..self.tok.get_vocab_size(true) as u32)
                .filter(|id| !special.contains(id))
                .filter(|id| {
                    self.tok
                        .decode(&[*id], false)
                        .is_ok_and(|t| !t.trim().is_empty() && !t.contains('\u{FFFD}'))
                })
                .collect()
        })
    }

    /// The ids of a text, no special tokens (for a shared prefix).
    pub fn ids(&self, text: &str) -> Vec<u32> {
        self.tok
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .unwrap_or_default()
    }
}

/// The tokenizer for `tokenizer`/`model` (see the module); `Err` says what was
/// looked for when one was named and none loads.
pub fn load(
    tokenizer: Option<&str>,
    model: Option<&str>,
    weights_dir: Option<&str>,
) -> Result<Option<Tokens>, TokensError> {
    if let Some(t) = tokenizer.filter(|t| t.ends_with(".json")) {
        return from_file(Path::new(t)).map(Some);
    }
    let Some(repo) = tokenizer.or(model) else {
        return Ok(None);
    };
    let caches = hub_caches(weights_dir);
    for cache in &caches {
        if let Some(file) = in_cache(cache, repo) {
            return from_file(&file).map(Some);
        }
    }
    if tokenizer.is_some() {
        return Err(TokensError::NotFound {
            repo: repo.to_string(),
            caches,
        });
    }
    Ok(None)
}

/// A `tokenizer.json` as `transformers` runs it for a plain call: the
/// file's own `padding` and `truncation` (many published files set
/// `Fixed(128)` and `max_length: 128`, for the training they came from) are
/// turned off, so that a count is the text's tokens, never a padded or cut
/// length.
pub fn from_file(file: &Path) -> Result<Tokens, TokensError> {
    let mut tok = tokenizers::Tokenizer::from_file(file).map_err(|source| TokensError::Load {
        file: file.to_path_buf(),
        source,
    })?;
    tok.with_padding(None);
    tok.with_truncation(None)
        .map_err(|source| TokensError::Truncation {
            file: file.to_path_buf(),
            source,
        })?;
    Ok(Tokens {
        tok,
        source: file.display().to_string(),
        clean: Default::default(),
    })
}

fn hub_caches(weights_dir: Option<&str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(d) = weights_dir {
        out.push(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("HF_HUB_CACHE") {
        out.push(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("HF_HOME") {
        out.push(PathBuf::from(d).join("hub"));
    }
    if let Some(d) = std::env::var_os("HOME") {
        out.push(PathBuf::from(d).join(".cache/huggingface/hub"));
    }
    out.dedup();
    out
}

/// `tokenizer.json` of `repo` in a Hub cache: the `main` snapshot's, else any.
fn in_cache(cache: &Path, repo: &str) -> Option<PathBuf> {
    if repo.contains("..") || repo.starts_with('/') {
        return None;
    }
    let dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshots = dir.join("snapshots");
    if let Ok(main) = std::fs::read_to_string(dir.join("refs/main")) {
        let f = snapshots.join(main.trim()).join("tokenizer.json");
        if f.is_file() {
            return Some(f);
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .ok()?
        .flatten()
        .map(|e| e.path().join("tokenizer.json"))
        .filter(|f| f.is_file())
        .collect();
    found.sort();
    found.pop()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A small byte-level BPE tokenizer with a BOS added to every encoding
    /// (the shape of Llama's and GPT-2's `tokenizer.json`).
    pub fn tiny_tokenizer_json() -> String {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<s>".into(), 0.into());
        // Byte-level alphabet: the 256 byte characters.
        let bytes: Vec<char> = byte_chars();
        for (i, c) in bytes.iter().enumerate() {
            vocab.insert(c.to_string(), (i + 1).into());
        }
        let merges = [("t", "h"), ("th", "e"), ("Ġ", "the"), ("a", "n"), ("Ġ", "a")];
        let mut m = Vec::new();
        for (next, (a, b)) in (vocab.len()..).zip(merges) {
            vocab.insert(format!("{a}{b}"), next.into());
            m.push(serde_json::json!(format!("{a} {b}")));
        }
        serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "post_processor": {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                "vocab": vocab, "merges": m}
        })
        .to_string()
    }

    /// GPT-2's printable stand-ins for the 256 bytes.
    fn byte_chars() -> Vec<char> {
        let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
            .chain(0xA1..=0xAC)
            .chain(0xAE..=0xFF)
            .collect();
        let mut cs = bs.clone();
        let mut n = 0;
        for b in 0..256u32 {
            if !bs.contains(&b) {
                bs.push(b);
                cs.push(256 + n);
                n += 1;
            }
        }
        let mut pairs: Vec<(u32, u32)> = bs.into_iter().zip(cs).collect();
        pairs.sort();
        pairs.into_iter().filter_map(|(_, c)| char::from_u32(c)).collect()
    }

    #[test]
    fn counts_with_and_without_special_tokens_and_exact_random_prompts() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokenizer.json");
        std::fs::write(&f, tiny_tokenizer_json()).unwrap();
        let t = load(Some(f.to_str().unwrap()), None, None).unwrap().unwrap();
        // "the" is one merged token; BOS is added to a prompt, not to an output.
        assert_eq!(t.count_prompt("the the"), Some(3));
        assert_eq!(t.count_output("the the"), Some(2));
        assert_eq!(t.count_output("xyz"), Some(3));
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for len in [1, 7, 64, 300] {
            let p = t.random_prompt(&mut rng, len, &[]).unwrap();
            assert_eq!(t.count_output(&p), Some(len as u64), "{p:?}");
            assert_eq!(t.count_prompt(&p), Some(len as u64 + 1));
        }
        let prefix = t.ids("the shared prefix");
        let p = t.random_prompt(&mut rng, 10, &prefix).unwrap();
        assert!(p.starts_with("the shared prefix"), "{p}");
        assert_eq!(t.count_output(&p), Some(prefix.len() as u64 + 10));
    }

    /// A file that sets padding and truncation (as many published ones do)
    /// counts as `transformers` runs it: neither applies to a plain call.
    #[test]
    fn a_files_padding_and_truncation_are_off() {
        let mut v: serde_json::Value = serde_json::from_str(&tiny_tokenizer_json()).unwrap();
        v["padding"] = serde_json::json!({"strategy": {"Fixed": 16}, "direction": "Right",
            "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "<s>"});
        v["truncation"] = serde_json::json!({"direction": "Right", "max_length": 8,
            "strategy": "LongestFirst", "stride": 0});
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokenizer.json");
        std::fs::write(&f, v.to_string()).unwrap();
        let t = load(Some(f.to_str().unwrap()), None, None).unwrap().unwrap();
        assert_eq!(t.count_output("the the"), Some(2));
        assert_eq!(t.count_output("xyz xyz xyz xyz"), Some(15));
        assert_eq!(t.count_prompt("xyz xyz xyz xyz"), Some(16));
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let p = t.random_prompt(&mut rng, 48, &[]).unwrap();
        assert_eq!(t.count_output(&p), Some(48));
    }

    /// A prompt sent with a nonce tag has the asked length with the tag.
    #[test]
    fn random_prompts_leave_room_for_the_nonce() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tokenizer.json");
        std::fs::write(&f, tiny_tokenizer_json()).unwrap();
        let t = load(Some(f.to_str().unwrap()), None, None).unwrap().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let tag = " [nonce 3f9a1c-r2-17]";
        for len in [24, 48, 128] {
            let p = t.random_prompt_before(&mut rng, len, &[], tag).unwrap();
            assert!(!p.ends_with(tag), "{p:?}");
            assert_eq!(t.count_output(&format!("{p}{tag}")), Some(len as u64), "{p:?}");
        }
    }

    /// The fixture of the end-to-end tests is this tokenizer.
    #[test]
    fn the_e2e_fixture_is_the_tiny_tokenizer() {
        let f = Path::new(env!("CARGO_MANIFEST_DIR")).join("../orch/tests/fixtures/tiny-tokenizer.json");
        if std::env::var_os("ORCH_WRITE_FIXTURES").is_some() {
            std::fs::write(&f, tiny_tokenizer_json()).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&f).unwrap(), tiny_tokenizer_json());
    }

    #[test]
    fn a_repo_id_is_found_in_the_hub_cache() {
        let dir = tempfile::tempdir().unwrap();
        let snap = dir.path().join("models--org--m/snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(dir.path().join("models--org--m/refs")).unwrap();
        std::fs::write(dir.path().join("models--org--m/refs/main"), "abc").unwrap();
        std::fs::write(snap.join("tokenizer.json"), tiny_tokenizer_json()).unwrap();
        let w = dir.path().to_str();
        let t = load(None, Some("org/m"), w).unwrap().unwrap();
        assert!(t.source.ends_with("snapshots/abc/tokenizer.json"), "{}", t.source);
        // A model without a tokenizer in the cache: counted otherwise, silently.
        assert!(load(None, Some("org/none"), w).unwrap().is_none());
        // A tokenizer named and missing is an error naming where it looked.
        let e = load(Some("org/none"), None, w).err().unwrap().to_string();
        assert!(e.contains("org/none") && e.contains("orch setup"), "{e}");
    }
}
