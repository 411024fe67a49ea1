//! Secret masking: every value of a secret, and its common encodings, is
//! replaced by [`MASK`] in text orch writes or prints.
//!
//! One [`Masker`] is built from the secret values a cell receives. It finds
//! every form at once (Aho-Corasick, leftmost-longest):
//!
//! - the value itself, and as a JSON string body (`"` and `\` escaped);
//! - base64 (standard and URL-safe) at each of the three byte alignments the
//!   value can have inside a longer encoded stream: only the characters that
//!   depend on the value's bytes alone are matched, so the value is found in
//!   `base64(prefix + value + suffix)` whatever the prefix;
//! - URL-encoded (RFC 3986, Python's `quote` which keeps `/`, every
//!   non-alphanumeric byte encoded, `+` for spaces; upper- and lowercase hex).
//!
//! [`StreamMasker`] masks a byte stream read in chunks: a value split across
//! two reads is still found (it holds back the last `longest pattern - 1`
//! bytes until the next chunk or the end).
//!
//! A value shorter than [`MIN_SECRET_LEN`] characters cannot be masked
//! without masking ordinary text (`a`, `1234`): [`Masker::new`] refuses it,
//! [`Masker::lenient`] skips it and says which.
//!
//! No IO here: callers collect the values (environment, token files).

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine;
use std::borrow::Cow;
use std::fmt;

/// What a secret is replaced with.
pub const MASK: &str = "***";

/// Shortest secret value (in characters) that can be masked.
pub const MIN_SECRET_LEN: usize = 6;

/// Environment variables whose values are secrets wherever orch or its agent
/// sees them, listed or not (the Hub token, cloud credentials).
pub const KNOWN_SECRET_ENV: &[&str] = &[
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "MODAL_TOKEN_SECRET",
    "AZURE_CLIENT_SECRET",
    "GITHUB_TOKEN",
];

/// The files where `huggingface_hub` looks for a token, from the
/// environment (`get`): `$HF_TOKEN_PATH`, then `$HF_HOME/token`
/// (`$XDG_CACHE_HOME/huggingface`, `~/.cache/huggingface` by default).
pub fn hub_token_paths(get: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<std::path::PathBuf> {
    use std::path::PathBuf;
    let mut out = Vec::new();
    if let Some(p) = get("HF_TOKEN_PATH").filter(|p| !p.is_empty()) {
        out.push(PathBuf::from(p));
    }
    let home = get("HF_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            get("XDG_CACHE_HOME")
                .filter(|p| !p.is_empty())
                .map(|c| PathBuf::from(c).join("huggingface"))
        })
        .or_else(|| get("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface")));
    if let Some(h) = home {
        out.push(h.join("token"));
    }
    out
}

/// Shortest encoded fragment matched (a 6-character value gives 7 or more).
const MIN_PATTERN_LEN: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaskError {
    #[error("secret `{name}` is {len} characters long: a secret shorter than {min} characters cannot be masked in logs\nhint: use the real credential in `{name}`, or do not list `{name}` under `secrets:` if it is not secret", min = MIN_SECRET_LEN)]
    TooShort { name: String, len: usize },
}

/// Finds and replaces secret values and their encodings. Cheap to clone.
#[derive(Clone, Default)]
pub struct Masker {
    ac: Option<AhoCorasick>,
    longest: usize,
    /// The forms searched for (a stream holds back only a tail that may
    /// start one of them). Never shown.
    patterns: Vec<Vec<u8>>,
}

impl fmt::Debug for Masker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the patterns: they are the secrets.
        write!(
            f,
            "Masker({} patterns)",
            self.ac.as_ref().map(|a| a.patterns_len()).unwrap_or(0)
        )
    }
}

impl Masker {
    /// A masker of `(name, value)` secrets; an empty value (unset) is
    /// ignored, a short one is an error naming its variable.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Masker, MaskError> {
        let mut values = Vec::new();
        for (name, value) in secrets {
            check(name, value)?;
            if !value.is_empty() {
                values.push(value);
            }
        }
        Ok(Masker::from_values(&values))
    }

    /// Like [`Masker::new`], but short values are skipped; the names of the
    /// skipped secrets are returned with it.
    pub fn lenient<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a str)>) -> (Masker, Vec<String>) {
        let mut values = Vec::new();
        let mut skipped = Vec::new();
        for (name, value) in secrets {
            match check(name, value) {
                Ok(()) if !value.is_empty() => values.push(value),
                Ok(()) => {}
                Err(_) => skipped.push(name.to_string()),
            }
        }
        (Masker::from_values(&values), skipped)
    }

    fn from_values(values: &[&str]) -> Masker {
        let mut patterns: Vec<String> = Vec::new();
        for v in values {
            patterns.extend(forms(v));
        }
        patterns.retain(|p| p.len() >= MIN_PATTERN_LEN);
        patterns.sort();
        patterns.dedup();
        if patterns.is_empty() {
            return Masker::default();
        }
        let longest = patterns.iter().map(String::len).max().unwrap_or(0);
        let ac = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok();
        Masker {
            longest: if ac.is_some() { longest } else { 0 },
            patterns: patterns.into_iter().map(String::into_bytes).collect(),
            ac,
        }
    }

    /// True when there is nothing to mask.
    pub fn is_empty(&self) -> bool {
        self.ac.is_none()
    }

    /// Text with every secret form replaced.
    pub fn mask_str<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match &self.ac {
            Some(ac) if ac.is_match(text) => {
                let mut out = String::with_capacity(text.len());
                ac.replace_all_with(text, &mut out, |_, _, dst| {
                    dst.push_str(MASK);
                    true
                });
                Cow::Owned(out)
            }
            _ => Cow::Borrowed(text),
        }
    }

    /// Bytes with every secret form replaced.
    pub fn mask_bytes<'t>(&self, bytes: &'t [u8]) -> Cow<'t, [u8]> {
        match &self.ac {
            Some(ac) if ac.is_match(bytes) => {
                let mut out = Vec::with_capacity(bytes.len());
                replace_into(ac, bytes, &mut out);
                Cow::Owned(out)
            }
            _ => Cow::Borrowed(bytes),
        }
    }

    /// Mask every string (and object key) of a JSON value in place.
    pub fn mask_json(&self, value: &mut serde_json::Value) {
        if self.is_empty() {
            return;
        }
        match value {
            serde_json::Value::String(s) => {
                if let Cow::Owned(m) = self.mask_str(s) {
                    *s = m;
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|v| self.mask_json(v)),
            serde_json::Value::Object(map) => {
                let old = std::mem::take(map);
                for (k, mut v) in old {
                    self.mask_json(&mut v);
                    map.insert(self.mask_str(&k).into_owned(), v);
                }
            }
            _ => {}
        }
    }

    /// A copy of any serialisable value with its strings masked (through
    /// JSON, so the result stays valid whatever the secret's characters).
    /// A value that does not round-trip is returned unchanged.
    pub fn mask_value<T>(&self, value: &T) -> Option<T>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if self.is_empty() {
            return None;
        }
        let mut json = serde_json::to_value(value).ok()?;
        self.mask_json(&mut json);
        serde_json::from_value(json).ok()
    }

    /// Mask `value` in place through JSON (see [`Masker::mask_value`]).
    pub fn mask_in_place<T>(&self, value: &mut T)
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        if let Some(m) = self.mask_value(value) {
            *value = m;
        }
    }

    /// A masker for one stream read in chunks.
    pub fn stream(&self) -> StreamMasker {
        StreamMasker {
            masker: self.clone(),
            carry: Vec::new(),
        }
    }
}

fn check(name: &str, value: &str) -> Result<(), MaskError> {
    let len = value.chars().count();
    if len > 0 && len < MIN_SECRET_LEN {
        return Err(MaskError::TooShort {
            name: name.to_string(),
            len,
        });
    }
    Ok(())
}

fn replace_into(ac: &AhoCorasick, bytes: &[u8], out: &mut Vec<u8>) {
    let mut pos = 0;
    for m in ac.find_iter(bytes) {
        out.extend_from_slice(&bytes[pos..m.start()]);
        out.extend_from_slice(MASK.as_bytes());
        pos = m.end();
    }
    out.extend_from_slice(&bytes[pos..]);
}

/// Masks a stream of chunks: a secret split across chunks is still found.
/// Output lags the input by at most the longest pattern less one byte, and
/// only while the input's last bytes could begin a secret;
/// [`StreamMasker::finish`] flushes it.
#[derive(Debug, Clone)]
pub struct StreamMasker {
    masker: Masker,
    carry: Vec<u8>,
}

impl StreamMasker {
    /// Mask `chunk` (after what was held back) into `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let Some(ac) = &self.masker.ac else {
            out.extend_from_slice(chunk);
            return;
        };
        let owned;
        let buf: &[u8] = if self.carry.is_empty() {
            chunk
        } else {
            self.carry.extend_from_slice(chunk);
            owned = std::mem::take(&mut self.carry);
            &owned
        };
        // A match starting before `cut` ends inside `buf` (no pattern is
        // longer than `longest`), so it is final; one starting later may
        // still grow or appear with the next chunk.
        let cut = buf.len().saturating_sub(self.masker.longest - 1);
        let mut pos = 0;
        for m in ac.find_iter(buf) {
            if m.start() >= cut {
                break;
            }
            out.extend_from_slice(&buf[pos..m.start()]);
            out.extend_from_slice(MASK.as_bytes());
            pos = m.end();
        }
        // Of the last bytes, hold back only what may begin a secret: a log
        // line that cannot be the start of one is written at once (a live
        // log does not lag by a secret's length).
        let from = pos.max(cut);
        let hold = (from..buf.len())
            .find(|&i| {
                let rest = &buf[i..];
                self.masker
                    .patterns
                    .iter()
                    .any(|p| p.starts_with(rest) || rest.starts_with(p))
            })
            .unwrap_or(buf.len());
        out.extend_from_slice(&buf[pos..hold]);
        self.carry.clear();
        self.carry.extend_from_slice(&buf[hold..]);
    }

    /// The held-back bytes, masked; the stream is over.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let rest = std::mem::take(&mut self.carry);
        match &self.masker.ac {
            Some(ac) => replace_into(ac, &rest, out),
            None => out.extend_from_slice(&rest),
        }
    }
}

/// Every form of `value` that is searched for.
fn forms(value: &str) -> Vec<String> {
    let mut out = vec![value.to_string()];
    if let Ok(json) = serde_json::to_string(value) {
        out.push(json[1..json.len() - 1].to_string());
    }
    let bytes = value.as_bytes();
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for k in 0..3usize {
            // The value at offset `k` of a 3-byte group: characters wholly
            // made of its bits are j in [ceil(8k/6), floor(8(k+n)/6)).
            let mut shifted = vec![0u8; k];
            shifted.extend_from_slice(bytes);
            let enc = engine.encode(&shifted);
            let start = (8 * k).div_ceil(6);
            let end = (8 * (k + bytes.len())) / 6;
            if end > start && end <= enc.len() {
                out.push(enc[start..end].to_string());
            }
        }
    }
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const RFC3986: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    const PY_QUOTE: &AsciiSet = &RFC3986.remove(b'/');
    for set in [RFC3986, PY_QUOTE, NON_ALPHANUMERIC] {
        let upper = utf8_percent_encode(value, set).to_string();
        out.push(upper.replace("%20", "+"));
        out.push(lower_hex(&upper));
        out.push(lower_hex(&upper).replace("%20", "+"));
        out.push(upper);
    }
    out
}

/// `%2F` -> `%2f`.
fn lower_hex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut after_pct = 0;
    for c in s.chars() {
        if c == '%' {
            after_pct = 2;
            out.push(c);
        } else if after_pct > 0 {
            after_pct -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};

    const TOKEN: &str = "hf_CanaryTok3n/With+Odd chars&=?";

    fn masker() -> Masker {
        Masker::new([("HF_TOKEN", TOKEN)]).unwrap()
    }

    #[test]
    fn plain_json_and_url_forms_are_masked() {
        let m = masker();
        assert_eq!(m.mask_str(&format!("token={TOKEN}!")), "token=***!");
        let json = serde_json::to_string(TOKEN).unwrap();
        assert_eq!(m.mask_str(&json), "\"***\"");
        for enc in [
            "hf_CanaryTok3n%2FWith%2BOdd%20chars%26%3D%3F",
            "hf_CanaryTok3n/With%2BOdd%20chars%26%3D%3F",
            "hf_CanaryTok3n%2fWith%2bOdd+chars%26%3d%3f",
        ] {
            assert_eq!(
                m.mask_str(&format!("GET /x?t={enc} HTTP")),
                "GET /x?t=*** HTTP",
                "{enc}"
            );
        }
        assert_eq!(m.mask_str("nothing here"), "nothing here");
        assert!(matches!(m.mask_str("nothing"), Cow::Borrowed(_)));
    }

    #[test]
    fn base64_is_masked_at_every_alignment() {
        let m = masker();
        for prefix in ["", "a", "ab", "abc", "Authorization: Basic user:"] {
            for suffix in ["", "x", "xy", "\n"] {
                let raw = format!("{prefix}{TOKEN}{suffix}");
                for enc in [STANDARD.encode(&raw), URL_SAFE.encode(&raw)] {
                    let masked = m.mask_str(&enc).into_owned();
                    assert!(masked.contains(MASK), "{prefix:?}{suffix:?}: {enc}");
                    // What is left cannot be decoded back to the token.
                    assert!(!masked.contains(&enc[enc.len() / 2 - 2..enc.len() / 2 + 2]));
                }
            }
        }
    }

    #[test]
    fn short_values_are_refused_and_named() {
        let e = Masker::new([("API_KEY", "abc")]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`API_KEY`") && msg.contains("hint:"), "{msg}");
        assert!(!msg.contains("abc"), "{msg}");
        let (m, skipped) = Masker::lenient([("A", "abc"), ("B", ""), ("C", "long-enough")]);
        assert_eq!(skipped, vec!["A".to_string()]);
        assert_eq!(m.mask_str("abc long-enough"), "abc ***");
        assert!(Masker::new([("EMPTY", "")]).unwrap().is_empty());
        assert!(!format!("{:?}", masker()).contains("Canary"));
    }

    #[test]
    fn a_live_line_that_cannot_start_a_secret_is_not_held_back() {
        let mut st = masker().stream();
        let mut out = Vec::new();
        st.push(b"first\n", &mut out);
        assert_eq!(out, b"first\n");
        // A tail that may begin the token waits for the next chunk.
        out.clear();
        st.push(b"token: hf_Can", &mut out);
        assert_eq!(out, b"token: ");
        st.push(b"aryTok3n/With+Odd chars&=? done\n", &mut out);
        st.finish(&mut out);
        assert_eq!(String::from_utf8(out).unwrap(), "token: *** done\n");
    }

    #[test]
    fn a_secret_split_across_chunks_is_masked() {
        let m = masker();
        let text = format!(
            "line one\nTraceback: {TOKEN} end\nb64 {}\n",
            STANDARD.encode(TOKEN)
        );
        let bytes = text.as_bytes();
        let whole = m.mask_bytes(bytes).into_owned();
        for split in 0..=bytes.len() {
            for step in [1usize, 3, 7, 4096] {
                let mut s = m.stream();
                let mut out = Vec::new();
                let (a, b) = bytes.split_at(split);
                for part in [a, b] {
                    for c in part.chunks(step) {
                        s.push(c, &mut out);
                    }
                }
                s.finish(&mut out);
                assert_eq!(out, whole, "split {split} step {step}");
            }
        }
        assert!(!String::from_utf8_lossy(&whole).contains("Canary"));
    }

    #[test]
    fn json_values_stay_valid() {
        let m = masker();
        let mut v = serde_json::json!({ TOKEN: [format!("x {TOKEN}"), 1], "k": {"n": TOKEN} });
        m.mask_json(&mut v);
        let s = v.to_string();
        assert!(!s.contains("Canary"), "{s}");
        assert_eq!(v["k"]["n"], "***");
        let empty = Masker::default();
        let mut out = Vec::new();
        let mut st = empty.stream();
        st.push(b"abc", &mut out);
        st.finish(&mut out);
        assert_eq!(out, b"abc");
    }
}
