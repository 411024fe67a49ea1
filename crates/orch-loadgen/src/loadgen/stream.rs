//! What comes back: streamed chunks and whole answers parsed, tokens
//! counted from the text received, and the checks of each answer.

use super::*;

/// Text of one streamed or whole response chunk.
pub(super) fn chunk_text(v: &Value) -> Option<String> {
    let c = v.get("choices")?.get(0)?;
    c.get("text")
        .and_then(|t| t.as_str())
        .or_else(|| {
            c.get("delta")
                .and_then(|d| d.get("content"))
                .and_then(|t| t.as_str())
        })
        .or_else(|| {
            c.get("message")
                .and_then(|d| d.get("content"))
                .and_then(|t| t.as_str())
        })
        .map(String::from)
}

/// The fields of an answer chunk the client reads (parsed without a `Value`).
#[derive(serde::Deserialize)]
pub(super) struct Chunk {
    #[serde(default)]
    pub(super) choices: Option<Vec<Choice>>,
    #[serde(default)]
    pub(super) usage: Option<Usage>,
}

#[derive(serde::Deserialize)]
pub(super) struct Choice {
    #[serde(default)]
    pub(super) text: Option<String>,
    #[serde(default)]
    pub(super) delta: Option<Content>,
    #[serde(default)]
    pub(super) message: Option<Content>,
}

#[derive(serde::Deserialize)]
pub(super) struct Content {
    #[serde(default)]
    pub(super) content: Option<String>,
}

#[derive(serde::Deserialize)]
pub(super) struct Usage {
    #[serde(default)]
    pub(super) completion_tokens: Option<u64>,
    #[serde(default)]
    pub(super) prompt_tokens: Option<u64>,
}

/// Text and usage counts of one chunk (`None`: not an answer chunk).
pub(super) fn parse_chunk(data: &[u8]) -> Option<(Option<String>, Option<u64>, Option<u64>)> {
    if let Ok(c) = serde_json::from_slice::<Chunk>(data) {
        let text = c.choices.and_then(|v| v.into_iter().next()).and_then(|c| {
            c.text
                .or_else(|| c.delta.and_then(|d| d.content))
                .or_else(|| c.message.and_then(|d| d.content))
        });
        let (out, inp) = c
            .usage
            .map(|u| (u.completion_tokens, u.prompt_tokens))
            .unwrap_or((None, None));
        return Some((text, out, inp));
    }
    let v: Value = serde_json::from_slice(data).ok()?;
    let u = |k: &str| v.get("usage").and_then(|u| u.get(k)).and_then(Value::as_u64);
    Some((chunk_text(&v), u("completion_tokens"), u("prompt_tokens")))
}

/// A request in flight: when it was sent, its last token, a whole body.
#[derive(Default)]
pub(super) struct Acc {
    pub(super) started: Option<Instant>,
    pub(super) last: Option<Instant>,
    pub(super) body: Vec<u8>,
    pub(super) done: bool,
}

/// Counts of a finished sample (see the module): input from the tokenizer,
/// the server's usage or words; output from the usage, the tokenizer or chunks.
pub(super) fn count_tokens(s: &mut Sample, tok: Option<&Tokens>) {
    if !(s.ok || s.error.is_some()) {
        return;
    }
    s.tokenizer_output = tok.and_then(|t| t.count_output(&s.text));
    (s.input_tokens, s.input_from) = match (tok.and_then(|t| t.count_prompt(&s.prompt)), s.usage_input) {
        (Some(n), _) => (n, "tokenizer"),
        (None, Some(n)) => (n, "usage"),
        (None, None) => (s.prompt.split_whitespace().count() as u64, "words"),
    };
    // What the client received is counted; the server's own `usage` is
    // only used where there is nothing to count it with (and is then held
    // to the text and to the baseline's answers, see `crate::lengths`).
    (s.output_tokens, s.output_from) = match (s.tokenizer_output, s.usage_output) {
        (Some(n), _) => (n, "tokenizer"),
        (None, Some(n)) => (n, "usage"),
        (None, None) => (s.chunks, "chunks"),
    };
}

/// The slack between two counts of one text's tokens that is not a
/// disagreement: max(2, 10% of the larger). Re-encoding generated text is
/// not always the identity (merges across the generated pieces), so a count
/// from the text can be a few percent off the ids the model produced.
pub(super) fn count_slack(n: u64) -> u64 {
    (n / 10).max(2)
}

/// Whether an answer is shorter than asked (`ignore_eos` sent): fewer
/// tokens than `max_tokens`, beyond [`count_slack`] when counted from the
/// text.
pub(super) fn is_short(s: &Sample) -> bool {
    let want = s.max_tokens as u64;
    match s.output_from {
        "tokenizer" => s.output_tokens + count_slack(want) < want,
        _ => s.output_tokens < want,
    }
}

/// Whether the server claims more output tokens than its text can hold:
/// every token of generated text decodes to at least one byte, and comes in
/// at most one event each, so a `usage.completion_tokens` above both the
/// text's bytes and its events cannot be true.
pub(super) fn impossible_claim(s: &Sample) -> bool {
    s.usage_output
        .is_some_and(|u| u > (s.text.len() as u64).max(s.chunks))
}
