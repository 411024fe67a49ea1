//! The output check of a comparison: before any timed round, every variant
//! answers the same fixed prompts (greedy: `temperature: 0`, the load
//! generator's `seed`, `ignore_eos`, non-streaming, one at a time so that
//! batching cannot change the numerics), and each variant's answers are
//! compared with the baseline's (the first variant's): exact match rate, the
//! position of the first divergence (in tokens with the model's tokenizer,
//! else in whitespace-separated words), and a pass when every answer matches
//! (or shares at least `min_match_prefix` leading tokens and is as long,
//! within max(2, 10%) of the baseline's length in the same unit). Answers are
//! asked at the longest `output_len` the timed load asks for (at least the
//! check's own `max_tokens`), so a patch that cuts only long answers is seen
//! here; the full texts are compared. The evidence
//! (prompts, answers, the first differing pair) goes to
//! `output-check/<variant>.json` in the cell folder.
//!
//! What it stops: a patch that answers wrong (garbage, a smaller model, a
//! skipped layer) faster, or stops generating early, would otherwise be
//! timed as a speedup. The prompts carry the cell's nonce (with the
//! defences on), so a patch cannot recognise the check's prompts and answer
//! them alone correctly.

use crate::tokens::Tokens;
use orch_protocol::{LoadGen, OutputCheck};
use serde::Serialize;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// Fixed prompts (varied topics, so answers differ between prompts).
const PROMPTS: &[&str] = &[
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain in one paragraph how a refrigerator keeps food cold.",
    "List the first ten prime numbers:",
    "Translate into German: The weather is nice today.",
    "def fibonacci(n):",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "What is the boiling point of water at sea level, in kelvin?",
    "Once upon a time, in a village at the edge of a forest,",
    "Give three tips for writing clear technical documentation.",
    "The derivative of sin(x) * x^2 with respect to x is",
    "Describe the colour blue to someone who has never seen it.",
];

/// The check's `n` prompts; with a nonce, each ends `[check <nonce>-<i>]`.
pub fn prompts(n: u32, nonce: Option<&str>) -> Vec<String> {
    (0..n as usize)
        .map(|i| {
            let base = PROMPTS[i % PROMPTS.len()];
            let round = i / PROMPTS.len();
            let mut p = if round == 0 {
                base.to_string()
            } else {
                format!("{base} ({})", round + 1)
            };
            if let Some(n) = nonce {
                p.push_str(&format!(" [check {n}-{i}]"));
            }
            p
        })
        .collect()
}

/// One answer of one variant.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Answer {
    pub prompt: String,
    /// `None` when the request failed (`error` says why).
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The server's `usage.completion_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<u64>,
}

/// The request body of one check prompt (as the load generator sends, but
/// greedy, seeded and not streamed).
fn body(lg: &LoadGen, check: &OutputCheck, prompt: &str) -> Value {
    let mut b = if lg.endpoint.contains("chat") {
        json!({"messages": [{"role": "user", "content": prompt}]})
    } else {
        json!({ "prompt": prompt })
    };
    b["max_tokens"] = json!(check.max_tokens);
    b["temperature"] = json!(0.0);
    b["seed"] = json!(lg.seed);
    b["stream"] = json!(false);
    b["ignore_eos"] = json!(true);
    if let Some(m) = &lg.model {
        b["model"] = json!(m);
    }
    b
}

/// The generated text of a non-streamed completion (`text`, or a chat
/// message's `content`).
fn text_of(v: &Value) -> Option<String> {
    let c = v.get("choices")?.get(0)?;
    c.get("text")
        .or_else(|| c.get("message").and_then(|m| m.get("content")))
        .and_then(|t| t.as_str())
        .map(String::from)
}

/// Ask every prompt of `prompts`, one after the other, of the server at
/// `base_url` (`http://host:port`).
pub fn ask(base_url: &str, lg: &LoadGen, check: &OutputCheck, prompts: &[String]) -> Vec<Answer> {
    let url = format!("{}{}", base_url.trim_end_matches('/'), lg.endpoint);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(600)))
        .http_status_as_error(true)
        .build()
        .into();
    prompts
        .iter()
        .map(|p| {
            let mut a = Answer {
                prompt: p.clone(),
                ..Default::default()
            };
            let resp = agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body(lg, check, p).to_string());
            match resp.map_err(|e| e.to_string()).and_then(|mut r| {
                let text = r
                    .body_mut()
                    .read_to_string()
                    .map_err(|e| format!("the answer broke off: {e}"))?;
                serde_json::from_str::<Value>(&text).map_err(|e| format!("the answer is not JSON: {e}"))
            }) {
                Ok(v) => {
                    a.completion_tokens = v["usage"]["completion_tokens"].as_u64();
                    a.text = text_of(&v);
                    if a.text.is_none() {
                        a.error = Some("the answer has no `choices[0].text` or `message.content`".into());
                    }
                }
                Err(e) => a.error = Some(e),
            }
            a
        })
        .collect()
}

/// How one variant's answers compare with the baseline's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub passed: bool,
    /// Answers identical to the baseline's, of those compared.
    pub exact: usize,
    pub compared: usize,
    pub exact_match_rate: f64,
    /// `tokens` (the model's tokenizer) or `words` (whitespace).
    pub unit: &'static str,
    /// The shortest common prefix over the answers, in `unit`s (the first
    /// divergence); `None` when every answer matches.
    pub first_divergence: Option<usize>,
    /// `exact`, or the leading tokens each answer must share.
    pub rule: String,
    /// The first answer that fails the rule, beside the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<Value>,
}

fn pieces(text: &str, tok: Option<&Tokens>) -> Vec<String> {
    match tok {
        Some(t) => t.ids(text).iter().map(|i| i.to_string()).collect(),
        None => text.split_whitespace().map(String::from).collect(),
    }
}

/// Compare `other`'s answers with `base`'s, prompt by prompt. A prompt the
/// baseline could not answer is left out; one the other could not answer
/// fails.
pub fn judge(
    base: &[Answer],
    other: &[Answer],
    min_match_prefix: Option<u32>,
    tok: Option<&Tokens>,
) -> Outcome {
    let unit = if tok.is_some() { "tokens" } else { "words" };
    let (mut exact, mut compared, mut passed) = (0, 0, true);
    let mut first_divergence: Option<usize> = None;
    let mut first_difference = None;
    for (i, (b, o)) in base.iter().zip(other).enumerate() {
        let Some(bt) = &b.text else { continue };
        compared += 1;
        let (ok, common, diverges) = match &o.text {
            None => (false, 0, true),
            Some(ot) => {
                let (bp, op) = (pieces(bt, tok), pieces(ot, tok));
                let common = bp.iter().zip(&op).take_while(|(x, y)| x == y).count();
                let same = bt == ot;
                if same {
                    exact += 1;
                }
                // Under `min_match_prefix` the rest may differ (numerics),
                // not the length: an answer cut short is not the answer.
                let slack = (bp.len() / 10).max(2);
                let ok = same
                    || min_match_prefix.is_some_and(|n| {
                        common >= (n as usize).min(bp.len()) && op.len() + slack >= bp.len()
                    });
                (ok, common, !same)
            }
        };
        if diverges {
            first_divergence = Some(first_divergence.map_or(common, |f| f.min(common)));
        }
        if !ok {
            passed = false;
            if first_difference.is_none() {
                first_difference = Some(json!({
                    "prompt_index": i,
                    "prompt": b.prompt,
                    "baseline": bt,
                    "variant": o.text,
                    "variant_error": o.error,
                    "common_prefix": common,
                }));
            }
        }
    }
    Outcome {
        passed,
        exact,
        compared,
        exact_match_rate: if compared == 0 {
            0.0
        } else {
            exact as f64 / compared as f64
        },
        unit,
        first_divergence,
        rule: match min_match_prefix {
            Some(n) => format!("at least {n} leading {unit} shared"),
            None => "exact".into(),
        },
        first_difference,
    }
}

/// Write `output-check/<variant>.json` under `cell_dir`; `Err` says why not.
pub fn write_evidence(
    cell_dir: &Path,
    variant: &str,
    answers: &[Answer],
    outcome: Option<&Outcome>,
) -> Result<String, String> {
    let dir = cell_dir.join("output-check");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let rel = format!("output-check/{variant}.json");
    let doc = json!({
        "variant": variant,
        "outcome": outcome,
        "answers": answers,
    });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(cell_dir.join(&rel), text).map_err(|e| format!("cannot write `{rel}`: {e}"))?;
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ans(texts: &[Option<&str>]) -> Vec<Answer> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| Answer {
                prompt: format!("p{i}"),
                text: t.map(String::from),
                error: t.is_none().then(|| "refused".to_string()),
                completion_tokens: None,
            })
            .collect()
    }

    #[test]
    fn prompts_are_fixed_and_carry_the_nonce() {
        let p = prompts(14, Some("ab12"));
        assert_eq!(p.len(), 14);
        assert!(p[0].starts_with("The capital of France is [check ab12-0]"));
        assert!(p[12].contains("(2) [check ab12-12]"));
        assert_eq!(prompts(3, None), prompts(3, None));
        let distinct: std::collections::BTreeSet<_> = p.iter().collect();
        assert_eq!(distinct.len(), 14);
    }

    #[test]
    fn exact_answers_pass_and_the_first_divergence_is_found() {
        let base = ans(&[Some("a b c d"), Some("x y z")]);
        let o = judge(&base, &base, None, None);
        assert!(o.passed && o.exact == 2 && o.first_divergence.is_none(), "{o:?}");
        assert_eq!(o.exact_match_rate, 1.0);
        let other = ans(&[Some("a b c d"), Some("x q z")]);
        let o = judge(&base, &other, None, None);
        assert!(!o.passed);
        assert_eq!((o.exact, o.first_divergence, o.unit), (1, Some(1), "words"));
        assert_eq!(o.first_difference.as_ref().unwrap()["prompt_index"], 1);
        assert_eq!(o.first_difference.as_ref().unwrap()["variant"], "x q z");
        // A prefix of 1 word is enough under `min_match_prefix: 1`, not 2.
        assert!(judge(&base, &other, Some(1), None).passed);
        assert!(!judge(&base, &other, Some(2), None).passed);
    }

    #[test]
    fn early_stops_and_errors_fail() {
        let base = ans(&[Some("a b c d")]);
        // Shorter: shares the whole prefix, still not the answer.
        let o = judge(&base, &ans(&[Some("a b")]), None, None);
        assert!(!o.passed && o.first_divergence == Some(2));
        assert!(!judge(&base, &ans(&[Some("a b")]), Some(3), None).passed);
        assert!(!judge(&base, &ans(&[None]), Some(1), None).passed);
        // Under `min_match_prefix` the rest may differ, not the length: an
        // answer that shares the prefix and stops at half is no answer.
        let long = ans(&[Some("a b c d e f g h i j k l m n o p q r s t")]);
        assert!(!judge(&long, &ans(&[Some("a b c d e f g h i j")]), Some(4), None).passed);
        let diverged = ans(&[Some("a b c d x x x x x x x x x x x x x x x x")]);
        assert!(judge(&long, &diverged, Some(4), None).passed);
        // A prompt the baseline could not answer is not held against others.
        let o = judge(
            &ans(&[None, Some("q")]),
            &ans(&[Some("z"), Some("q")]),
            None,
            None,
        );
        assert!(o.passed && o.compared == 1);
    }

    #[test]
    fn answers_are_read_from_completions_and_chat() {
        assert_eq!(
            text_of(&json!({"choices": [{"text": "hi"}]})).as_deref(),
            Some("hi")
        );
        assert_eq!(
            text_of(&json!({"choices": [{"message": {"role": "assistant", "content": "yo"}}]})).as_deref(),
            Some("yo")
        );
        assert!(text_of(&json!({"choices": []})).is_none());
    }
}
