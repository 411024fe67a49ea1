//! The load generator's requests from a dataset file (`prompt_file`), its
//! format found from its content:
//!
//! - a JSON list of strings, or of objects with `prompt` (and optionally
//!   `output_len`/`max_tokens`), or with `messages` (a chat request as is);
//! - `{"prompts": [...]}` (the `benchmark_prompts.json` shape);
//! - ShareGPT: a JSON list of objects with `conversations` (or
//!   `conversation`) of `{from, value}` (or `{role, content}`) turns: the
//!   first human turn is the prompt and, as `vllm bench serve --dataset-name
//!   sharegpt` does, the first reply's length in tokens is the request's
//!   `max_tokens` (words without a tokenizer); entries without a reply are
//!   left out;
//! - JSONL: one such object (or string) a line;
//! - traces: JSONL with `input_length` and `output_length` (and `timestamp`
//!   in milliseconds: the Mooncake trace format), or a CSV with
//!   `TIMESTAMP,ContextTokens,GeneratedTokens` (the Azure LLM inference
//!   traces): each request is a random prompt of that many tokens asking for
//!   that many, sent at its time from the trace's first (the schedule of
//!   `request_rate` is not used).
//!
//! `num_prompts` requests are taken in the file's order, from the start again
//! when the file has fewer (a trace is replayed once: at most its length).
//!
//! Every turn of a conversation (ShareGPT's human turns, a `messages` list's
//! user messages) is kept in [`Req::turns`] for `multi_turn`: the messages
//! before each answer, and the length of the dataset's answer as that turn's
//! `max_tokens` (the entry's own `max_tokens` first); the dataset's answers
//! themselves are not sent, the server's are.

use crate::tokens::Tokens;
use rand::Rng;
use serde_json::Value;

/// One request to send.
#[derive(Debug, Clone, Default)]
pub struct Req {
    /// The prompt (for a chat request, its messages' contents joined).
    pub text: String,
    /// A chat request's messages, sent as they are.
    pub messages: Option<Vec<Value>>,
    /// `max_tokens` when the dataset says it.
    pub max_tokens: Option<u32>,
    /// When to send it, in seconds from the first (traces).
    pub at_s: Option<f64>,
    /// Every turn of a conversation, for `multi_turn` (empty for a single
    /// prompt).
    pub turns: Vec<Turn>,
}

/// One turn of a conversation: the messages the dataset adds before an
/// answer (the user's, with a system prompt before it), and how many tokens
/// to ask for (the entry's `max_tokens`, else the length of the dataset's own
/// answer, else `None`: `output_len`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    pub messages: Vec<Value>,
    pub max_tokens: Option<u32>,
}

impl Req {
    pub fn text(text: String) -> Req {
        Req {
            text,
            ..Default::default()
        }
    }
}

/// What a line or list item of a dataset is.
enum Item {
    Req(Req),
    /// A trace entry: input and output lengths, time in ms.
    Trace {
        input: u32,
        output: u32,
        at_ms: Option<f64>,
    },
    Skip,
}

/// The requests of the dataset at `path`. `make` draws a random prompt of a
/// number of tokens (trace entries).
pub(crate) fn load(
    path: &str,
    n: usize,
    tok: Option<&Tokens>,
    make: &mut dyn FnMut(usize) -> Result<String, String>,
) -> Result<Vec<Req>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("cannot read `prompt_file` `{path}`: {e}"))?;
    let items: Vec<Item> = if path.to_ascii_lowercase().ends_with(".csv") {
        azure_csv(path, &text)?
    } else {
        match serde_json::from_str::<Value>(&text) {
            Ok(Value::Array(a)) => a.iter().map(|v| item(v, tok)).collect(),
            Ok(Value::Object(o)) if o.get("prompts").is_some_and(Value::is_array) => o["prompts"]
                .as_array()
                .map(|a| a.iter().map(|v| item(v, tok)).collect())
                .unwrap_or_default(),
            Ok(v @ Value::Object(_)) => vec![item(&v, tok)],
            _ => {
                let mut out = Vec::new();
                for (i, line) in text.lines().enumerate() {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let v: Value = serde_json::from_str(line).map_err(|e| {
                        format!(
                            "`prompt_file` `{path}` line {}: not JSON ({e}); hint: a JSON list, `{{\"prompts\": [...]}}`, ShareGPT JSON, JSONL, or a trace (JSONL with `input_length`/`output_length`, or Azure's CSV)",
                            i + 1
                        )
                    })?;
                    out.push(item(&v, tok));
                }
                out
            }
        }
    };
    let trace = items.iter().any(|i| matches!(i, Item::Trace { .. }));
    let mut reqs = Vec::new();
    let mut first_ms: Option<f64> = None;
    for it in items {
        match it {
            Item::Req(r) => reqs.push(r),
            Item::Trace { input, output, at_ms } => {
                let at_s = at_ms.map(|t| {
                    let f = *first_ms.get_or_insert(t);
                    ((t - f) / 1000.0).max(0.0)
                });
                reqs.push(Req {
                    text: make(input.max(1) as usize)?,
                    max_tokens: Some(output.max(1)),
                    at_s,
                    ..Default::default()
                });
            }
            Item::Skip => {}
        }
        if trace && reqs.len() >= n {
            break;
        }
    }
    if reqs.is_empty() {
        return Err(format!(
            "`prompt_file` `{path}` has no usable prompts; hint: a JSON list of strings or of objects with `prompt`, `{{\"prompts\": [...]}}`, ShareGPT (`conversations` with a reply), JSONL of those, or a trace"
        ));
    }
    if trace {
        return Ok(reqs);
    }
    Ok((0..n).map(|i| reqs[i % reqs.len()].clone()).collect())
}

fn count(tok: Option<&Tokens>, text: &str) -> u32 {
    tok.and_then(|t| t.count_output(text))
        .unwrap_or_else(|| text.split_whitespace().count() as u64) as u32
}

fn item(v: &Value, tok: Option<&Tokens>) -> Item {
    if let Some(s) = v.as_str() {
        return Item::Req(Req::text(s.to_string()));
    }
    let num = |k: &str| v.get(k).and_then(Value::as_f64);
    if let (Some(i), Some(o)) = (num("input_length"), num("output_length")) {
        return Item::Trace {
            input: i as u32,
            output: o as u32,
            at_ms: num("timestamp"),
        };
    }
    let max_tokens = num("output_len")
        .or_else(|| num("max_tokens"))
        .or_else(|| num("output_tokens"))
        .map(|x| x as u32);
    if let Some(p) = v.get("prompt").and_then(Value::as_str) {
        return Item::Req(Req {
            text: p.to_string(),
            max_tokens,
            ..Default::default()
        });
    }
    if let Some(msgs) = v.get("messages").and_then(Value::as_array) {
        let text = msgs
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n");
        let turns = split_turns(msgs.iter().map(|m| (role(m), m.clone())), max_tokens, tok);
        return Item::Req(Req {
            text,
            messages: Some(msgs.clone()),
            max_tokens,
            at_s: None,
            turns,
        });
    }
    let conv = v
        .get("conversations")
        .or_else(|| v.get("conversation"))
        .and_then(Value::as_array);
    if let Some(turns) = conv {
        let turn = |t: &Value| -> (String, String) {
            let who = t
                .get("from")
                .or_else(|| t.get("role"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_ascii_lowercase();
            let what = t
                .get("value")
                .or_else(|| t.get("content"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            (who, what)
        };
        let turns: Vec<(String, String)> = turns.iter().map(turn).collect();
        let Some(q) = turns.iter().position(|(w, _)| w == "human" || w == "user") else {
            return Item::Skip;
        };
        let Some(reply) = turns[q + 1..]
            .iter()
            .find(|(w, _)| w == "gpt" || w == "assistant" || w == "chatgpt" || w == "bard" || w == "bing")
        else {
            return Item::Skip;
        };
        if turns[q].1.trim().is_empty() || reply.1.trim().is_empty() {
            return Item::Skip;
        }
        let all = split_turns(
            turns.iter().map(|(who, what)| {
                let who = match who.as_str() {
                    "human" | "user" => "user",
                    "system" => "system",
                    _ => "assistant",
                };
                (who.to_string(), serde_json::json!({"role": who, "content": what}))
            }),
            None,
            tok,
        );
        return Item::Req(Req {
            text: turns[q].1.clone(),
            max_tokens: Some(count(tok, &reply.1).max(1)),
            turns: all,
            ..Default::default()
        });
    }
    Item::Skip
}

/// A message's role, in lowercase (`from` in ShareGPT).
fn role(m: &Value) -> String {
    m.get("role")
        .or_else(|| m.get("from"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// Turns of a conversation from its messages (role, message): each answer
/// (`assistant`) closes the turn of the messages before it; a last turn
/// without an answer is kept. Turns without a user message are left out.
fn split_turns(
    msgs: impl Iterator<Item = (String, Value)>,
    max_tokens: Option<u32>,
    tok: Option<&Tokens>,
) -> Vec<Turn> {
    let mut out = Vec::new();
    let mut cur: Vec<Value> = Vec::new();
    let has_user = |c: &[Value]| c.iter().any(|m| role(m) == "user");
    for (who, m) in msgs {
        if who == "assistant" {
            if has_user(&cur) {
                let said = m.get("content").and_then(Value::as_str).unwrap_or("");
                out.push(Turn {
                    messages: std::mem::take(&mut cur),
                    max_tokens: max_tokens
                        .or_else(|| (!said.trim().is_empty()).then(|| count(tok, said).max(1))),
                });
            }
            continue;
        }
        cur.push(m);
    }
    if has_user(&cur) {
        out.push(Turn {
            messages: cur,
            max_tokens,
        });
    }
    out
}

/// Azure's LLM inference trace: `TIMESTAMP,ContextTokens,GeneratedTokens`,
/// the time as `YYYY-MM-DD HH:MM:SS.fffffff`.
fn azure_csv(path: &str, text: &str) -> Result<Vec<Item>, String> {
    let mut lines = text.lines();
    let header: Vec<String> = lines
        .next()
        .unwrap_or("")
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .collect();
    let col = |name: &str| header.iter().position(|h| h == name);
    let (Some(t), Some(i), Some(o)) = (col("timestamp"), col("contexttokens"), col("generatedtokens")) else {
        return Err(format!(
            "`prompt_file` `{path}`: a CSV trace needs the columns `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure's LLM inference trace)"
        ));
    };
    let mut out = Vec::new();
    for (k, line) in lines.enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let bad = || {
            format!(
                "`prompt_file` `{path}` line {}: `{line}` is not a trace row",
                k + 2
            )
        };
        let input: u32 = f.get(i).and_then(|x| x.parse().ok()).ok_or_else(bad)?;
        let output: u32 = f.get(o).and_then(|x| x.parse().ok()).ok_or_else(bad)?;
        let at = f.get(t).and_then(|x| datetime_s(x)).ok_or_else(bad)?;
        out.push(Item::Trace {
            input,
            output,
            at_ms: Some(at * 1000.0),
        });
    }
    Ok(out)
}

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS[.frac]` (UTC), or of a plain number.
fn datetime_s(s: &str) -> Option<f64> {
    if let Ok(x) = s.parse::<f64>() {
        return Some(x);
    }
    let (date, time) = s.split_once([' ', 'T'])?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, dd) = (d.next()??, d.next()??, d.next()??);
    let mut tt = time.trim_end_matches('Z').split(':');
    let (h, mi) = (tt.next()?.parse::<f64>().ok()?, tt.next()?.parse::<f64>().ok()?);
    let sec = tt.next()?.parse::<f64>().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + dd - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some(days as f64 * 86400.0 + h * 3600.0 + mi * 60.0 + sec)
}

/// Prompts of `k` random words (no tokenizer), for traces.
pub fn words(rng: &mut impl Rng, k: usize, vocab: &[&str]) -> String {
    (0..k)
        .map(|_| vocab[rng.random_range(0..vocab.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_text(name: &str, text: &str, n: usize) -> Result<Vec<Req>, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let mut made = 0;
        load(p.to_str().unwrap(), n, None, &mut |k| {
            made += 1;
            Ok(vec!["w"; k].join(" "))
        })
    }

    #[test]
    fn every_format_gives_requests() {
        let r = load_text("a.json", r#"["one", {"prompt": "two", "max_tokens": 7}]"#, 3).unwrap();
        assert_eq!(
            r.iter().map(|r| r.text.as_str()).collect::<Vec<_>>(),
            ["one", "two", "one"]
        );
        assert_eq!(r[1].max_tokens, Some(7));
        let r = load_text("p.json", r#"{"prompts": ["a b", "c"]}"#, 2).unwrap();
        assert_eq!(r[1].text, "c");
        let share = r#"[{"id": "x", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "one two three four"}]},
            {"id": "y", "conversations": [{"from": "human", "value": "no reply"}]}]"#;
        let r = load_text("sg.json", share, 2).unwrap();
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|r| r.text == "hi there" && r.max_tokens == Some(4)));
        let jsonl =
            "{\"prompt\": \"a\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"m\"}]}\n\"s\"\n";
        let r = load_text("x.jsonl", jsonl, 3).unwrap();
        assert_eq!(r[1].messages.as_ref().unwrap().len(), 1);
        assert_eq!(r[2].text, "s");
        let trace = "{\"timestamp\": 1000, \"input_length\": 5, \"output_length\": 3, \"hash_ids\": [1]}\n{\"timestamp\": 1500, \"input_length\": 2, \"output_length\": 9}\n{\"timestamp\": 4000, \"input_length\": 2, \"output_length\": 9}\n";
        let r = load_text("m.jsonl", trace, 2).unwrap();
        assert_eq!(r.len(), 2, "a trace is replayed once, up to num_prompts");
        assert_eq!((r[0].at_s, r[1].at_s), (Some(0.0), Some(0.5)));
        assert_eq!((r[0].text.split(' ').count(), r[0].max_tokens), (5, Some(3)));
        let csv = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n";
        let r = load_text("az.csv", csv, 10).unwrap();
        assert_eq!(r.len(), 2);
        assert!((r[1].at_s.unwrap() - 4.314579).abs() < 1e-6, "{:?}", r[1].at_s);
        assert_eq!(r[1].max_tokens, Some(109));
        assert!(load_text("e.json", "[{\"x\": 1}]", 1)
            .unwrap_err()
            .contains("no usable prompts"));
        assert!(load_text("b.jsonl", "{\"prompt\": \"a\"}\nnot json\n", 1)
            .unwrap_err()
            .contains("line 2"));
    }

    #[test]
    fn conversations_keep_every_turn() {
        let share = r#"[{"conversations": [{"from": "system", "value": "be brief"},
            {"from": "human", "value": "q1"}, {"from": "gpt", "value": "a b"},
            {"from": "human", "value": "q2"}, {"from": "gpt", "value": "a b c"},
            {"from": "human", "value": "q3"}]}]"#;
        let r = load_text("sg.json", share, 1).unwrap();
        assert_eq!((r[0].text.as_str(), r[0].max_tokens), ("q1", Some(2)));
        let t = &r[0].turns;
        assert_eq!(t.len(), 3);
        assert_eq!(
            t[0].messages,
            [
                serde_json::json!({"role": "system", "content": "be brief"}),
                serde_json::json!({"role": "user", "content": "q1"})
            ]
        );
        assert_eq!(
            t[1].messages,
            [serde_json::json!({"role": "user", "content": "q2"})]
        );
        assert_eq!(
            t.iter().map(|t| t.max_tokens).collect::<Vec<_>>(),
            [Some(2), Some(3), None]
        );
        let jsonl = r#"{"messages": [{"role": "user", "content": "m1"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "m2"}], "max_tokens": 9}"#;
        let r = load_text("c.jsonl", jsonl, 1).unwrap();
        assert_eq!(r[0].turns.len(), 2);
        assert!(r[0].turns.iter().all(|t| t.max_tokens == Some(9)));
        // A single prompt has no turns (sent as one).
        assert!(load_text("a.json", r#"["one"]"#, 1).unwrap()[0].turns.is_empty());
    }

    #[test]
    fn dates_count_days_across_months() {
        let a = datetime_s("2024-02-28 23:59:59").unwrap();
        let b = datetime_s("2024-03-01 00:00:01").unwrap();
        assert_eq!(b - a, 86400.0 + 2.0);
        assert_eq!(datetime_s("1970-01-01 00:00:00"), Some(0.0));
    }
}
