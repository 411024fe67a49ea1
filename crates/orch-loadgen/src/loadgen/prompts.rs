//! The requests of a load: prompts (random text, a dataset, multi-turn
//! conversations), the nonce tag of each round, request bodies.

use super::*;

pub(super) const WORDS: &[&str] = &[
    "the",
    "model",
    "of",
    "a",
    "benchmark",
    "runs",
    "on",
    "many",
    "gpus",
    "and",
    "measures",
    "time",
    "token",
    "server",
    "cost",
    "fast",
    "slow",
    "cache",
    "memory",
    "batch",
];

pub(super) fn prompts(cfg: &LoadGen, n: usize, tok: Option<&Tokens>) -> Result<Vec<Req>, String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed);
    if let Some(path) = &cfg.prompt_file {
        let mut make = |k: usize| match tok {
            Some(t) => t
                .random_prompt(&mut rng, k, &[])
                .ok_or_else(|| format!("the tokenizer `{}` cannot make a prompt of {k} tokens", t.source)),
            None => Ok(crate::dataset::words(&mut rng, k, WORDS)),
        };
        return crate::dataset::load(path, n, tok, &mut make);
    }
    // Lengths uniform in [len * (1 - r), len * (1 + r)], as `vllm bench serve
    // --random-range-ratio` draws them.
    let r = cfg.range_ratio.clamp(0.0, 1.0);
    let lo = ((cfg.input_len as f64) * (1.0 - r)).round().max(1.0) as usize;
    let hi = ((cfg.input_len as f64) * (1.0 + r)).round().max(lo as f64) as usize;
    // Shared prefixes: `prefix_groups` of them, prompt i gets group i mod k
    // (prefix caching across groups of requests).
    let groups = cfg.prefix_groups.max(1) as usize;
    if let Some(t) = tok {
        let mut prefixes: Vec<Vec<u32>> = Vec::new();
        for _ in 0..groups {
            prefixes.push(match cfg.prefix_len {
                0 => vec![],
                k => {
                    let text = t.random_prompt(&mut rng, k as usize, &[]).ok_or_else(|| {
                        format!("the tokenizer `{}` cannot make a prefix of {k} tokens", t.source)
                    })?;
                    t.ids(&text)
                }
            });
        }
        // A prompt of `input_len` tokens is one the server counts as
        // `input_len`: its special tokens (BOS, or BERT's [CLS] and [SEP])
        // come off the random text, as `vllm bench serve`'s random dataset
        // takes `num_special_tokens_to_add` off it; so does the nonce tag a
        // prompt is sent with (prompt k is request k of the warm-up, then
        // request k - warm-up of the load).
        let specials = t.count_prompt("").unwrap_or(0) as usize;
        let warm = cfg.warmup_requests as usize;
        return (0..n)
            .map(|i| {
                let len = rng.random_range(lo..=hi);
                let tag = nonce_tag(cfg, i.checked_sub(warm).unwrap_or(i));
                let text_len = len.saturating_sub(specials).max(1);
                t.random_prompt_before(&mut rng, text_len, &prefixes[i % groups], &tag)
                    .map(Req::text)
                    .ok_or_else(|| {
                        format!(
                            "the tokenizer `{}` cannot make a prompt of {len} tokens",
                            t.source
                        )
                    })
            })
            .collect();
    }
    let prefixes: Vec<Vec<&str>> = (0..groups)
        .map(|_| {
            (0..cfg.prefix_len)
                .map(|_| WORDS[rng.random_range(0..WORDS.len())])
                .collect()
        })
        .collect();
    Ok((0..n)
        .map(|i| {
            let len = rng.random_range(lo..=hi);
            prefixes[i % groups]
                .iter()
                .copied()
                .chain((0..len).map(|_| WORDS[rng.random_range(0..WORDS.len())]))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .map(Req::text)
        .collect())
}

/// The most tokens any request of `cfg`'s load asks for: `output_len`, or
/// a prompt file's own `max_tokens` (per entry or per turn) where larger.
pub fn longest_output(cfg: &LoadGen, tok: Option<&Tokens>) -> u32 {
    let mut longest = cfg.output_len;
    if cfg.prompt_file.is_some() {
        if let Ok(reqs) = prompts(cfg, cfg.num_prompts as usize, tok) {
            for r in &reqs {
                let turns = r.turns.iter().filter_map(|t| t.max_tokens);
                longest = r.max_tokens.into_iter().chain(turns).fold(longest, u32::max);
            }
        }
    }
    longest
}

/// The tag request `i` gets with `nonce`: ` [nonce <text>-<i>]`.
pub(super) fn nonce_tag(cfg: &LoadGen, i: usize) -> String {
    cfg.nonce
        .as_ref()
        .map(|n| format!(" [nonce {n}-{i}]"))
        .unwrap_or_default()
}

/// Appends `tag` to the text of the last user message.
pub(super) fn tag_messages(msgs: &mut [Value], tag: &str) {
    if tag.is_empty() {
        return;
    }
    let user = msgs
        .iter_mut()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
    if let Some(m) = user {
        if let Some(c) = m.get("content").and_then(Value::as_str) {
            m["content"] = json!(format!("{c}{tag}"));
        }
    }
}

/// The messages' text contents, one a line (a chat request's prompt text).
pub(super) fn contents(msgs: &[Value]) -> String {
    msgs.iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sampling fields every request carries, as `vllm bench serve` sends them.
pub(super) fn finish_body(cfg: &LoadGen, mut b: Value, max_tokens: u32) -> Value {
    b["max_tokens"] = json!(max_tokens);
    b["stream"] = json!(cfg.stream);
    if cfg.ignore_eos {
        b["ignore_eos"] = json!(true);
    }
    b["temperature"] = json!(0.0);
    if cfg.stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if let Some(m) = &cfg.model {
        b["model"] = json!(m);
    }
    b
}

/// Request `i`'s body, its prompt text as sent, and the tokens asked for.
pub(super) fn body(cfg: &LoadGen, req: &Req, i: usize) -> (Value, String, u32) {
    let tag = nonce_tag(cfg, i);
    let max = req.max_tokens.unwrap_or(cfg.output_len);
    if cfg.endpoint.contains("chat") {
        let msgs = match &req.messages {
            Some(m) => {
                let mut m = m.clone();
                tag_messages(&mut m, &tag);
                m
            }
            None => vec![json!({"role": "user", "content": format!("{}{tag}", req.text)})],
        };
        let prompt = contents(&msgs);
        (finish_body(cfg, json!({ "messages": msgs }), max), prompt, max)
    } else {
        let prompt = format!("{}{tag}", req.text);
        (finish_body(cfg, json!({ "prompt": prompt }), max), prompt, max)
    }
}

/// A conversation's turns (`multi_turn`): the dataset's, else the request as one.
pub(super) fn conv_turns(req: &Req) -> Vec<Turn> {
    if !req.turns.is_empty() {
        return req.turns.clone();
    }
    vec![Turn {
        messages: req
            .messages
            .clone()
            .unwrap_or_else(|| vec![json!({"role": "user", "content": req.text})]),
        max_tokens: req.max_tokens,
    }]
}

/// A turn's body after `history` (request `i`): the body, the prompt text,
/// the tokens asked for and the turn's own messages as sent.
pub(super) fn turn_body(
    cfg: &LoadGen,
    history: &[Value],
    turn: &Turn,
    i: usize,
) -> (Value, String, u32, Vec<Value>) {
    let mut own = turn.messages.clone();
    tag_messages(&mut own, &nonce_tag(cfg, i));
    let all: Vec<Value> = history.iter().chain(own.iter()).cloned().collect();
    let max = turn.max_tokens.unwrap_or(cfg.output_len);
    let prompt = contents(&all);
    (
        finish_body(cfg, json!({ "messages": all }), max),
        prompt,
        max,
        own,
    )
}
