//! The built-in load generator for OpenAI-compatible servers
//! (`/v1/completions`, `/v1/chat/completions`, streaming or not).
//!
//! Requests go through [`crate::evclient`]: one thread with an event loop,
//! any number in flight (`max_concurrency` caps them), kept-alive connections;
//! this file builds the bodies and turns the answers into samples.
//!
//! Arrivals: all at once (`request_rate` unset), or a gamma process with the
//! given rate and burstiness (1.0 = Poisson), as `vllm bench serve` does; or
//! `ramp_up` (`linear`/`exponential` from `start_rps` to `end_rps`): the
//! interval before request i has the rate at its progress i / (n - 1), as
//! `vllm bench serve --ramp-up-strategy` does.
//!
//! Multi-turn (`multi_turn`): each dataset entry is a conversation whose
//! first turn starts on the schedule; turn k+1 is sent `turn_delay_ms` after
//! turn k's answer came, with the whole history (the dataset's user turns, the
//! server's own answers). Every turn is a request (`conversation`, `turn` in
//! `requests.jsonl`); a failed turn fails the rest of its conversation.
//! Per request: time to first token (TTFT), inter-token latencies (ITL),
//! time per output token (TPOT, excluding the first) and end-to-end latency.
//! The summary uses `vllm bench serve --save-result` field names
//! (`mean_ttft_ms`, `p99_itl_ms`, `output_throughput`, ...) and is written to
//! `loadgen.json` in the cell folder.
//!
//! Coordinated omission: every request has an intended send time (its
//! arrival in the schedule; all at `0` without a rate) and is sent no
//! earlier. TTFT and end-to-end latency are reported from the send (as
//! `vllm bench serve` does: `mean_ttft_ms`) and from the intended send time
//! (`mean_sched_ttft_ms`, `p99_sched_e2el_ms`, ...), which include the time a
//! request waited because the client, or a concurrency cap, held it back.
//! The schedule lag (send − intended) is a metric (`*_schedule_lag_ms`); a run
//! with a rate whose median lag passes 10 ms or p99 lag 100 ms is flagged
//! `client_behind` with a note saying why.
//!
//! Goodput: with `slo: {ttft_ms, tpot_ms, e2el_ms}` a request is good when it
//! succeeded and each given bound holds (latencies from the send, as `vllm
//! bench serve --goodput`); `request_goodput` (good requests per second),
//! `output_goodput` (their output tokens per second) and `slo_attainment`
//! (good / all requests) are metrics.
//!
//! Token counts come from what the client received, not from what the
//! server says of itself: with the model's tokenizer ([`crate::tokens`],
//! padding and truncation off), a prompt's tokens are its encoding with
//! special tokens and an answer's the encoding of the text that arrived,
//! without them; these counts make `output_throughput`, TPOT and the totals.
//! Without a tokenizer, the server's `usage` (`prompt_tokens`,
//! `completion_tokens`) is used where sent, else the events that carried
//! text (output) and the prompt's words (input), and a comparison holds each
//! variant's answers to the baseline's ([`crate::lengths`]).
//! `loadgen.json`'s `token_counts` says how many requests were counted each
//! way. Every measured request is a line of `requests.jsonl` (times from
//! the start of the measured phase, in seconds) with what arrived
//! (`output_bytes`, `output_events`, `counted_output_tokens`) beside what the
//! server claimed (`usage_output_tokens`, `usage_input_tokens`).
//!
//! Signs of a server not doing the work asked (for comparisons): `nonce`
//! appends ` [nonce <text>-<i>]` to every prompt (i: the request's index), so
//! answers cached from another round cannot match; each stage has
//! `short_responses` (successful answers with fewer tokens than `max_tokens`
//! while `ignore_eos` is sent; beyond max(2, 10%) when counted from the
//! text, whose re-encoding is not always the ids generated),
//! `token_count_disagreements` (the server's `usage.completion_tokens` off
//! the tokenizer's count of the text by more than max(2, 10%)),
//! `impossible_token_counts` (a `usage.completion_tokens` above both the
//! bytes and the events of its text) and `distinct_output_ratio` (distinct
//! answers / successful requests); `usage_output_tokens` (the server's
//! own count) is recorded beside the counts. `outputs.jsonl` holds
//! the last stage's successful answers ([`crate::lengths::Answer`]: index,
//! the SHA-256 of the prompt text as sent, bytes, events, the tokens used and
//! where from, `usage`, the tokenizer's count, the text cut at 4096
//! characters).

use crate::dataset::{Req, Turn};
use crate::evclient;
use crate::tokens::Tokens;
use orch_protocol::{CellResult, LoadGen, Phase, RampStrategy, RampUp, Status, TaskSpec};
use orch_workload::ctx::Ctx;
use orch_workload::stats;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;
use serde_json::{json, Value};
use sha2::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A request still unanswered this long after its send fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// One request's measurements.
#[derive(Debug, Clone, Default)]
struct Sample {
    ok: bool,
    error: Option<String>,
    ttft_s: f64,
    itl_s: Vec<f64>,
    e2e_s: f64,
    output_tokens: u64,
    input_tokens: u64,
    /// Where the counts came from: `tokenizer`, `usage` (the server's),
    /// `words` (input) or `chunks` (output).
    input_from: &'static str,
    output_from: &'static str,
    /// Seconds from the phase's start: when it was due, when it was sent.
    scheduled_s: f64,
    sent_s: f64,
    /// The prompt text as sent (a chat request's message contents, one a
    /// line), nonce included.
    prompt: String,
    /// The generated text.
    text: String,
    /// The tokens asked for (`max_tokens`).
    max_tokens: u32,
    /// The server's `usage` counts, when it sent them.
    usage_output: Option<u64>,
    usage_input: Option<u64>,
    /// The tokenizer's count of `text`, when there is a tokenizer.
    tokenizer_output: Option<u64>,
    /// Chunks with text.
    chunks: u64,
    /// Conversation and turn (`multi_turn`).
    conversation: Option<(usize, usize)>,
}

impl Sample {
    fn lag_s(&self) -> f64 {
        (self.sent_s - self.scheduled_s).max(0.0)
    }
    fn tpot_s(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) as f64)
    }
    /// Whether the request met every bound of `slo` (failed ones never do).
    fn meets(&self, slo: &orch_protocol::Slo) -> bool {
        let ok_ms = |bound: Option<f64>, v: Option<f64>| match (bound, v) {
            (None, _) => true,
            (Some(b), Some(v)) => v * 1000.0 <= b,
            // No TPOT for a one-token answer: nothing to hold against.
            (Some(_), None) => true,
        };
        self.ok
            && ok_ms(slo.ttft_ms, Some(self.ttft_s))
            && ok_ms(slo.tpot_ms, self.tpot_s())
            && ok_ms(slo.e2el_ms, Some(self.e2e_s))
    }
}

const WORDS: &[&str] = &[
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

fn prompts(cfg: &LoadGen, n: usize, tok: Option<&Tokens>) -> Result<Vec<Req>, String> {
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
fn nonce_tag(cfg: &LoadGen, i: usize) -> String {
    cfg.nonce
        .as_ref()
        .map(|n| format!(" [nonce {n}-{i}]"))
        .unwrap_or_default()
}

/// Appends `tag` to the text of the last user message.
fn tag_messages(msgs: &mut [Value], tag: &str) {
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
fn contents(msgs: &[Value]) -> String {
    msgs.iter()
        .filter_map(|m| m.get("content").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sampling fields every request carries, as `vllm bench serve` sends them.
fn finish_body(cfg: &LoadGen, mut b: Value, max_tokens: u32) -> Value {
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
fn body(cfg: &LoadGen, req: &Req, i: usize) -> (Value, String, u32) {
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
fn conv_turns(req: &Req) -> Vec<Turn> {
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
fn turn_body(cfg: &LoadGen, history: &[Value], turn: &Turn, i: usize) -> (Value, String, u32, Vec<Value>) {
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

/// Text of one streamed or whole response chunk.
fn chunk_text(v: &Value) -> Option<String> {
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
struct Chunk {
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(serde::Deserialize)]
struct Choice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<Content>,
    #[serde(default)]
    message: Option<Content>,
}

#[derive(serde::Deserialize)]
struct Content {
    #[serde(default)]
    content: Option<String>,
}

#[derive(serde::Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

/// Text and usage counts of one chunk (`None`: not an answer chunk).
fn parse_chunk(data: &[u8]) -> Option<(Option<String>, Option<u64>, Option<u64>)> {
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
struct Acc {
    started: Option<Instant>,
    last: Option<Instant>,
    body: Vec<u8>,
    done: bool,
}

/// Counts of a finished sample (see the module): input from the tokenizer,
/// the server's usage or words; output from the usage, the tokenizer or chunks.
fn count_tokens(s: &mut Sample, tok: Option<&Tokens>) {
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
fn count_slack(n: u64) -> u64 {
    (n / 10).max(2)
}

/// Whether an answer is shorter than asked (`ignore_eos` sent): fewer
/// tokens than `max_tokens`, beyond [`count_slack`] when counted from the
/// text.
fn is_short(s: &Sample) -> bool {
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
fn impossible_claim(s: &Sample) -> bool {
    s.usage_output
        .is_some_and(|u| u > (s.text.len() as u64).max(s.chunks))
}

/// Intended send times (seconds from the start): gamma intervals (shape =
/// burstiness, mean = 1 / rate) summed; all at 0 without a rate. With
/// `ramp_up`, the interval before request i has the rate at its progress
/// i / (n - 1) (`vllm bench serve --ramp-up-strategy`).
fn schedule(cfg: &LoadGen, reqs: &[Req], rate: Option<f64>) -> Vec<f64> {
    // A trace's own times.
    if !reqs.is_empty() && reqs.iter().all(|r| r.at_s.is_some()) {
        return reqs.iter().map(|r| r.at_s.unwrap_or(0.0)).collect();
    }
    let n = reqs.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x5eed);
    let b = cfg.burstiness.max(1e-3);
    let draw = |rng: &mut rand::rngs::StdRng, r: f64| -> f64 {
        rand_distr::Gamma::new(b, 1.0 / (r.max(1e-9) * b))
            .map(|g| g.sample(rng))
            .unwrap_or(1.0 / r.max(1e-9))
    };
    if let Some(ramp) = &cfg.ramp_up {
        let mut t = 0.0;
        return (0..n)
            .map(|i| {
                if i > 0 {
                    t += draw(&mut rng, ramp_rate(ramp, i, n));
                }
                t
            })
            .collect();
    }
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let at = t;
            if let Some(r) = rate {
                t += draw(&mut rng, r);
            }
            at
        })
        .collect()
}

/// The ramp's rate for request `i` of `n`.
fn ramp_rate(r: &RampUp, i: usize, n: usize) -> f64 {
    let p = i as f64 / n.saturating_sub(1).max(1) as f64;
    match r.strategy {
        RampStrategy::Linear => r.start_rps + (r.end_rps - r.start_rps) * p,
        RampStrategy::Exponential => r.start_rps * (r.end_rps / r.start_rps.max(1e-9)).powf(p),
    }
}

/// One conversation (or single request) of a stage.
struct Conv {
    req: Req,
    /// Its turns (`multi_turn`; else empty).
    turns: Vec<Turn>,
    /// The index of its first request.
    first: usize,
    /// The messages so far, answers as the server gave them.
    history: Vec<Value>,
}

/// The event loop's handler: samples from the answers, next turns.
struct Driver<'a> {
    cfg: &'a LoadGen,
    start: Instant,
    convs: Vec<Conv>,
    /// Request index → (conversation, turn).
    owner: Vec<(usize, usize)>,
    /// The turn's own messages as sent (multi-turn), by request index.
    sent_msgs: Vec<Vec<Value>>,
    samples: Vec<Sample>,
    accs: Vec<Acc>,
    done: u64,
    ctx: &'a mut Ctx,
    phase: Phase,
    shown: Instant,
}

impl Driver<'_> {
    fn secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// The job of turn `k` of conversation `c`, due at `due_s`.
    fn job(&mut self, c: usize, k: usize, due_s: f64) -> evclient::Job {
        let i = self.convs[c].first + k;
        let (b, prompt, max) = if self.cfg.multi_turn {
            let conv = &self.convs[c];
            let (b, prompt, max, own) = turn_body(self.cfg, &conv.history, &conv.turns[k], i);
            self.sent_msgs[i] = own;
            (b, prompt, max)
        } else {
            body(self.cfg, &self.convs[c].req, i)
        };
        let s = &mut self.samples[i];
        s.prompt = prompt;
        s.max_tokens = max;
        s.scheduled_s = due_s;
        if self.cfg.multi_turn {
            s.conversation = Some((c, k));
        }
        evclient::Job {
            id: i,
            due: Duration::from_secs_f64(due_s.max(0.0)),
            body: b.to_string().into_bytes(),
        }
    }

    fn progress(&mut self) {
        let total = self.samples.len() as u64;
        if self.done >= total || self.shown.elapsed() >= Duration::from_millis(200) {
            self.ctx.progress(self.phase, self.done, total);
            self.shown = Instant::now();
        }
    }
}

impl evclient::Handler for Driver<'_> {
    fn sent(&mut self, id: usize, at: Instant) {
        self.samples[id].sent_s = self.secs(at);
        self.accs[id].started = Some(at);
    }

    fn line(&mut self, id: usize, at: Instant, line: &[u8]) {
        let (acc, s) = (&mut self.accs[id], &mut self.samples[id]);
        if !self.cfg.stream {
            acc.body.extend_from_slice(line);
            acc.body.push(b'\n');
            return;
        }
        if acc.done {
            return;
        }
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            acc.done = true;
            return;
        }
        let Some((text, out, inp)) = parse_chunk(data) else {
            return;
        };
        s.usage_output = out.or(s.usage_output);
        s.usage_input = inp.or(s.usage_input);
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            match acc.last {
                None => s.ttft_s = acc.started.map(|t0| (at - t0).as_secs_f64()).unwrap_or(0.0),
                Some(prev) => s.itl_s.push((at - prev).as_secs_f64()),
            }
            acc.last = Some(at);
            s.chunks += 1;
            s.text.push_str(&text);
        }
    }

    fn end(&mut self, id: usize, at: Instant, result: Result<(), String>) -> Vec<evclient::Job> {
        let acc = std::mem::take(&mut self.accs[id]);
        let s = &mut self.samples[id];
        s.e2e_s = acc.started.map(|t0| (at - t0).as_secs_f64()).unwrap_or(0.0);
        match result {
            Err(e) => s.error = Some(e),
            Ok(()) => {
                if !self.cfg.stream {
                    // The whole body, else line by line (JSON lines).
                    let parts: Vec<&[u8]> = match parse_chunk(&acc.body) {
                        Some(_) => vec![&acc.body[..]],
                        None => acc.body.split(|b| *b == b'\n').collect(),
                    };
                    for p in parts {
                        if let Some((text, out, inp)) = parse_chunk(p) {
                            s.usage_output = out.or(s.usage_output);
                            s.usage_input = inp.or(s.usage_input);
                            if let Some(t) = text.filter(|t| !t.is_empty()) {
                                s.chunks += 1;
                                s.text.push_str(&t);
                            }
                        }
                    }
                    s.ttft_s = s.e2e_s;
                }
                if s.chunks == 0 {
                    s.error = Some("no tokens in the response".into());
                } else {
                    s.ok = true;
                }
            }
        }
        self.done += 1;
        let (c, k) = self.owner[id];
        let mut next = Vec::new();
        if self.cfg.multi_turn && k + 1 < self.convs[c].turns.len() {
            if self.samples[id].ok {
                let answer = json!({"role": "assistant", "content": self.samples[id].text});
                let own = std::mem::take(&mut self.sent_msgs[id]);
                self.convs[c].history.extend(own);
                self.convs[c].history.push(answer);
                let due = self.secs(at) + self.cfg.turn_delay_ms.max(0.0) / 1000.0;
                next.push(self.job(c, k + 1, due));
            } else {
                // The rest of the conversation is not sent: those turns failed.
                let t = self.secs(at);
                for j in k + 1..self.convs[c].turns.len() {
                    let i = self.convs[c].first + j;
                    let s = &mut self.samples[i];
                    s.error = Some(format!("not sent: turn {k} of the conversation failed"));
                    s.conversation = Some((c, j));
                    s.scheduled_s = t;
                    s.sent_s = t;
                    self.done += 1;
                }
            }
        }
        self.progress();
        next
    }
}

/// Send `prompts` (conversations with `multi_turn`) with the configured
/// arrivals and concurrency through the event-loop client.
fn drive(
    cfg: &LoadGen,
    url: &str,
    prompts: Vec<Req>,
    rate: Option<f64>,
    tok: &Option<Arc<Tokens>>,
    ctx: &mut Ctx,
    phase: Phase,
) -> (Vec<Sample>, f64) {
    let due = schedule(cfg, &prompts, rate);
    let mut convs = Vec::new();
    let mut owner = Vec::new();
    for (c, req) in prompts.into_iter().enumerate() {
        let turns = if cfg.multi_turn {
            conv_turns(&req)
        } else {
            Vec::new()
        };
        let first = owner.len();
        for k in 0..turns.len().max(1) {
            owner.push((c, k));
        }
        convs.push(Conv {
            req,
            turns,
            first,
            history: Vec::new(),
        });
    }
    let n = owner.len();
    let start = Instant::now();
    let mut d = Driver {
        cfg,
        start,
        convs,
        owner,
        sent_msgs: vec![Vec::new(); if cfg.multi_turn { n } else { 0 }],
        samples: vec![Sample::default(); n],
        accs: (0..n).map(|_| Acc::default()).collect(),
        done: 0,
        ctx,
        phase,
        shown: start,
    };
    let jobs: Vec<evclient::Job> = (0..d.convs.len()).map(|c| d.job(c, 0, due[c])).collect();
    let stop = d.ctx.stop_flag();
    let opts = evclient::Options {
        max_concurrency: cfg.max_concurrency.map(|c| c as usize),
        timeout: REQUEST_TIMEOUT,
    };
    let res = evclient::Target::parse(url)
        .and_then(|target| evclient::run(&target, jobs, &opts, &stop, start, &mut d));
    if let Err(e) = res {
        for s in d.samples.iter_mut().filter(|s| !s.ok && s.error.is_none()) {
            s.error = Some(e.clone());
        }
    }
    let duration = start.elapsed().as_secs_f64();
    let mut samples = d.samples;
    for s in &mut samples {
        count_tokens(s, tok.as_deref());
    }
    (samples, duration)
}

/// Whether the client sent late (see the module), and why in words.
fn client_behind(cfg: &LoadGen, rate: Option<f64>, lags_ms: &[f64]) -> Option<String> {
    if rate.is_none() && cfg.ramp_up.is_none() {
        return None;
    }
    let mut sorted = lags_ms.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p50 = stats::percentile(&sorted, 50.0);
    let p99 = stats::percentile(&sorted, 99.0);
    if !(p50 > 10.0 || p99 > 100.0) {
        return None;
    }
    let why = match cfg.max_concurrency {
        Some(c) => format!("requests waited for one of the {c} concurrency slots (`max_concurrency`)"),
        None => "the client could not keep the schedule".to_string(),
    };
    Some(format!(
        "requests were sent late (median schedule lag {p50:.1} ms, p99 {p99:.1} ms): {why}; latencies from the send understate the server's queueing, read `*_sched_*` (from the intended send time)"
    ))
}

fn request_line(i: usize, s: &Sample, slo: Option<&orch_protocol::Slo>) -> Value {
    let mut v = json!({
        "i": i,
        "ok": s.ok,
        "scheduled_s": s.scheduled_s,
        "sent_s": s.sent_s,
        "input_tokens": s.input_tokens,
        "input_tokens_from": s.input_from,
        "output_tokens": s.output_tokens,
        "output_tokens_from": s.output_from,
        "output_bytes": s.text.len(),
        "output_events": s.chunks,
    });
    if let Some(u) = s.usage_output {
        v["usage_output_tokens"] = json!(u);
    }
    if let Some(u) = s.usage_input {
        v["usage_input_tokens"] = json!(u);
    }
    if let Some(t) = s.tokenizer_output {
        v["counted_output_tokens"] = json!(t);
    }
    if s.ok {
        v["ttft_ms"] = json!(s.ttft_s * 1000.0);
        v["e2el_ms"] = json!(s.e2e_s * 1000.0);
        v["sched_ttft_ms"] = json!((s.ttft_s + s.lag_s()) * 1000.0);
        v["sched_e2el_ms"] = json!((s.e2e_s + s.lag_s()) * 1000.0);
        if let Some(t) = s.tpot_s() {
            v["tpot_ms"] = json!(t * 1000.0);
        }
    }
    if let Some(e) = &s.error {
        v["error"] = json!(e);
    }
    if let Some((c, t)) = s.conversation {
        v["conversation"] = json!(c);
        v["turn"] = json!(t);
    }
    if let Some(slo) = slo {
        v["slo_met"] = json!(s.meets(slo));
    }
    v
}

/// One stage's load: arrivals (`None`: all at once) and the concurrency cap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Load {
    rate: Option<f64>,
    concurrency: Option<u32>,
}

/// A number as a metric-name part: `4`, `2p5`, `inf`.
fn name_num(v: Option<f64>) -> String {
    match v {
        None => "inf".into(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
        Some(x) => format!("{x}").replace('.', "p"),
    }
}

/// What one stage measured.
struct StageOut {
    name: String,
    load: Load,
    metrics: BTreeMap<String, f64>,
    behind: Option<String>,
    samples: Vec<Sample>,
}

/// The summary of a stage's samples (the module's metric names).
fn summarize(cfg: &LoadGen, samples: &[Sample], duration: f64) -> (BTreeMap<String, f64>, Vec<f64>) {
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.ok).collect();
    let mut m: BTreeMap<String, f64> = BTreeMap::new();
    let total_in: u64 = ok.iter().map(|s| s.input_tokens).sum();
    let total_out: u64 = ok.iter().map(|s| s.output_tokens).sum();
    m.insert("duration".into(), duration);
    m.insert("completed".into(), ok.len() as f64);
    m.insert("failed".into(), (samples.len() - ok.len()) as f64);
    m.insert("total_input_tokens".into(), total_in as f64);
    m.insert("total_output_tokens".into(), total_out as f64);
    m.insert("request_throughput".into(), ok.len() as f64 / duration.max(1e-9));
    m.insert("output_throughput".into(), total_out as f64 / duration.max(1e-9));
    m.insert(
        "total_token_throughput".into(),
        (total_in + total_out) as f64 / duration.max(1e-9),
    );
    let ms = |v: Vec<f64>| v.into_iter().map(|x| x * 1000.0).collect::<Vec<_>>();
    let tpot: Vec<f64> = ok.iter().filter_map(|s| s.tpot_s()).collect();
    let sent: Vec<&Sample> = samples.iter().filter(|s| s.ok || s.error.is_some()).collect();
    let lags = ms(sent.iter().map(|s| s.lag_s()).collect());
    let series = [
        ("ttft", ms(ok.iter().map(|s| s.ttft_s).collect())),
        ("tpot", ms(tpot)),
        ("itl", ms(ok.iter().flat_map(|s| s.itl_s.clone()).collect())),
        ("e2el", ms(ok.iter().map(|s| s.e2e_s).collect())),
        (
            "sched_ttft",
            ms(ok.iter().map(|s| s.ttft_s + s.lag_s()).collect()),
        ),
        ("sched_e2el", ms(ok.iter().map(|s| s.e2e_s + s.lag_s()).collect())),
    ];
    for (name, values) in &series {
        if let Some(sum) = stats::summarize(values) {
            let mut sorted = values.clone();
            sorted.sort_by(|a, b| a.total_cmp(b));
            m.insert(format!("mean_{name}_ms"), sum.mean);
            m.insert(format!("median_{name}_ms"), sum.median);
            m.insert(format!("std_{name}_ms"), sum.std);
            m.insert(format!("p90_{name}_ms"), stats::percentile(&sorted, 90.0));
            m.insert(format!("p99_{name}_ms"), sum.p99);
        }
    }
    if let Some(sum) = stats::summarize(&lags) {
        m.insert("mean_schedule_lag_ms".into(), sum.mean);
        m.insert("median_schedule_lag_ms".into(), sum.median);
        m.insert("p99_schedule_lag_ms".into(), sum.p99);
        m.insert(
            "max_schedule_lag_ms".into(),
            lags.iter().copied().fold(0.0, f64::max),
        );
    }
    // Signs of answers that were not generated as asked (see the module).
    let short = ok.iter().filter(|s| cfg.ignore_eos && is_short(s)).count();
    m.insert("short_responses".into(), short as f64);
    let disagree = ok
        .iter()
        .filter(|s| match (s.usage_output, s.tokenizer_output) {
            (Some(u), Some(t)) => u.abs_diff(t) > count_slack(u.max(t)),
            _ => false,
        })
        .count();
    m.insert("token_count_disagreements".into(), disagree as f64);
    let impossible = ok.iter().filter(|s| impossible_claim(s)).count();
    m.insert("impossible_token_counts".into(), impossible as f64);
    // The server's own count beside the client's, for the record.
    let usage_out: Vec<u64> = ok.iter().filter_map(|s| s.usage_output).collect();
    if !usage_out.is_empty() {
        m.insert("usage_output_tokens".into(), usage_out.iter().sum::<u64>() as f64);
    }

    if !ok.is_empty() {
        let distinct: BTreeSet<&str> = ok.iter().map(|s| s.text.as_str()).collect();
        m.insert(
            "distinct_output_ratio".into(),
            distinct.len() as f64 / ok.len() as f64,
        );
    }
    if let Some(slo) = &cfg.slo {
        let good: Vec<&Sample> = samples.iter().filter(|s| s.meets(slo)).collect();
        let good_out: u64 = good.iter().map(|s| s.output_tokens).sum();
        m.insert("request_goodput".into(), good.len() as f64 / duration.max(1e-9));
        m.insert("output_goodput".into(), good_out as f64 / duration.max(1e-9));
        m.insert(
            "slo_attainment".into(),
            good.len() as f64 / samples.len().max(1) as f64,
        );
    }
    (m, lags)
}

/// CPU seconds (user + system) this process has used: the client's own cost
/// (`client_cpu_s` of a stage; the agent's other threads are idle meanwhile).
fn process_cpu_s() -> Option<f64> {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Some(t(ru.ru_utime) + t(ru.ru_stime))
}

#[allow(clippy::too_many_arguments)]
fn run_stage(
    cfg: &LoadGen,
    url: &str,
    prompts: &[Req],
    name: String,
    load: Load,
    tok: &Option<Arc<Tokens>>,
    ctx: &mut Ctx,
) -> StageOut {
    let mut c = cfg.clone();
    c.request_rate = load.rate;
    c.max_concurrency = load.concurrency;
    ctx.message(format!(
        "load stage `{name}`: request_rate {}, max_concurrency {}",
        name_num(load.rate),
        load.concurrency
            .map(|c| c.to_string())
            .unwrap_or_else(|| "unlimited".into())
    ));
    let cpu0 = process_cpu_s();
    let (samples, duration) = drive(&c, url, prompts.to_vec(), load.rate, tok, ctx, Phase::Measure);
    let (mut metrics, lags) = summarize(&c, &samples, duration);
    if let (Some(a), Some(b)) = (cpu0, process_cpu_s()) {
        metrics.insert("client_cpu_s".into(), b - a);
    }
    let behind = client_behind(&c, load.rate, &lags);
    StageOut {
        name,
        load,
        metrics,
        behind,
        samples,
    }
}

/// Whether a stage met the SLO at its p99 (TTFT, TPOT, E2EL) with no failed request.
fn stage_meets(slo: &orch_protocol::Slo, m: &BTreeMap<String, f64>) -> bool {
    let within = |bound: Option<f64>, key: &str| bound.is_none_or(|b| m.get(key).is_none_or(|v| *v <= b));
    m.get("failed").copied().unwrap_or(0.0) == 0.0
        && m.get("completed").copied().unwrap_or(0.0) > 0.0
        && within(slo.ttft_ms, "p99_ttft_ms")
        && within(slo.tpot_ms, "p99_tpot_ms")
        && within(slo.e2el_ms, "p99_e2el_ms")
}

pub fn run(cfg: &LoadGen, task: &TaskSpec, base_url: &str, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let url = format!("{}{}", base_url.trim_end_matches('/'), cfg.endpoint);
    let tok = match crate::tokens::load(
        cfg.tokenizer.as_deref(),
        cfg.model.as_deref(),
        task.weights_dir.as_deref(),
    ) {
        Ok(t) => t.map(Arc::new),
        Err(e) => return CellResult::failed(cell, Status::Failed, "invalid_config", e.to_string()),
    };
    let all = match prompts(
        cfg,
        cfg.num_prompts as usize + cfg.warmup_requests as usize,
        tok.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return CellResult::failed(cell, Status::Failed, "invalid_config", e),
    };
    let (warm, measured) = all.split_at(cfg.warmup_requests as usize);
    if !warm.is_empty() {
        ctx.enter(Phase::Warmup);
        // All at once, one turn each, whatever the measured load.
        let mut w = cfg.clone();
        w.ramp_up = None;
        w.multi_turn = false;
        drive(&w, &url, warm.to_vec(), None, &tok, ctx, Phase::Warmup);
    }
    ctx.enter(Phase::Measure);
    let base = Load {
        rate: cfg.request_rate,
        concurrency: cfg.max_concurrency,
    };
    let stop = ctx.stop_flag();
    let stopped = || stop.load(std::sync::atomic::Ordering::Relaxed);
    let mut stages: Vec<StageOut> = Vec::new();
    let mut saturation: Option<(Option<f64>, String)> = None;
    if let Some(sw) = &cfg.sweep {
        let loads: Vec<(String, Load)> = if !sw.request_rate.is_empty() {
            sw.request_rate
                .iter()
                .map(|r| (format!("rate_{}", name_num(*r)), Load { rate: *r, ..base }))
                .collect()
        } else {
            sw.max_concurrency
                .iter()
                .map(|c| {
                    (
                        format!("concurrency_{c}"),
                        Load {
                            concurrency: Some(*c),
                            ..base
                        },
                    )
                })
                .collect()
        };
        for (name, load) in loads {
            if stopped() {
                break;
            }
            stages.push(run_stage(cfg, &url, measured, name, load, &tok, ctx));
        }
    } else if let (Some(sat), Some(slo)) = (&cfg.saturation, &cfg.slo) {
        // Double the rate until the SLO breaks (or `max_rate`), then bisect
        // between the last rate that met it and the first that did not.
        let mut good: Option<f64> = None;
        let mut bad: Option<f64> = None;
        let mut rate = sat.start_rate;
        let mut reason = String::new();
        loop {
            if stopped() {
                reason = "stopped".into();
                break;
            }
            let name = format!("rate_{}", name_num(Some(rate)));
            let out = run_stage(
                cfg,
                &url,
                measured,
                name,
                Load {
                    rate: Some(rate),
                    ..base
                },
                &tok,
                ctx,
            );
            let meets = stage_meets(slo, &out.metrics);
            stages.push(out);
            if meets {
                good = Some(rate);
                if rate >= sat.max_rate {
                    reason = format!("the SLO held up to `max_rate` {}", sat.max_rate);
                    break;
                }
                rate = (rate * 2.0).min(sat.max_rate);
            } else {
                bad = Some(rate);
                break;
            }
        }
        if let (Some(b), true) = (bad, reason.is_empty()) {
            let mut lo = good;
            let mut hi = b;
            for _ in 0..sat.steps {
                if stopped() {
                    reason = "stopped".into();
                    break;
                }
                let mid = match lo {
                    Some(l) => (l + hi) / 2.0,
                    None => hi / 2.0,
                };
                let mid = (mid * 1000.0).round() / 1000.0;
                if mid <= 0.0 || lo.is_some_and(|l| mid <= l) || mid >= hi {
                    break;
                }
                let name = format!("rate_{}", name_num(Some(mid)));
                let out = run_stage(
                    cfg,
                    &url,
                    measured,
                    name,
                    Load {
                        rate: Some(mid),
                        ..base
                    },
                    &tok,
                    ctx,
                );
                if stage_meets(slo, &out.metrics) {
                    lo = Some(mid);
                } else {
                    hi = mid;
                }
                stages.push(out);
            }
            good = lo;
            if reason.is_empty() {
                reason = match good {
                    Some(g) => format!(
                        "the SLO broke at {} requests/s; {} steps of bisection between {} and {}",
                        name_num(Some(hi)),
                        sat.steps,
                        name_num(Some(g)),
                        name_num(Some(hi))
                    ),
                    None => format!(
                        "the SLO broke at every rate tried, down to {} requests/s",
                        name_num(Some(hi))
                    ),
                };
            }
        }
        saturation = Some((good, reason));
    } else {
        stages.push(run_stage(cfg, &url, measured, String::new(), base, &tok, ctx));
    }

    // Per-request lines of every stage.
    let several = stages.len() > 1 || cfg.sweep.is_some() || cfg.saturation.is_some();
    let mut lines: Vec<u8> = Vec::new();
    for st in &stages {
        for (i, s) in st.samples.iter().enumerate() {
            let mut v = request_line(i, s, cfg.slo.as_ref());
            if several {
                v["stage"] = json!(st.name);
            }
            lines.extend(v.to_string().into_bytes());
            lines.push(b'\n');
        }
    }
    let _ = std::fs::write(out_dir.join("requests.jsonl"), lines);
    // The answers of the last stage, for comparisons across variants.
    let mut outs: Vec<u8> = Vec::new();
    if let Some(st) = stages.last() {
        for (i, s) in st.samples.iter().enumerate().filter(|(_, s)| s.ok) {
            let text: String = s.text.chars().take(4096).collect();
            let sha = sha2::Sha256::digest(s.prompt.as_bytes());
            let hex: String = sha.iter().map(|b| format!("{b:02x}")).collect();
            let v = crate::lengths::Answer {
                i,
                prompt_sha256: hex,
                bytes: s.text.len() as u64,
                events: s.chunks,
                claimed: s.output_tokens,
                claimed_from: s.output_from.to_string(),
                usage: s.usage_output,
                counted: s.tokenizer_output,
                text,
            };
            let Ok(v) = serde_json::to_value(&v) else { continue };
            outs.extend(v.to_string().into_bytes());
            outs.push(b'\n');
        }
    }
    let _ = std::fs::write(out_dir.join("outputs.jsonl"), outs);

    // The cell's metrics: the last stage's (the heaviest load of a sweep, the
    // last step of a search) unprefixed, and every stage's under its name.
    let mut m: BTreeMap<String, f64> = stages.last().map(|s| s.metrics.clone()).unwrap_or_default();
    if several {
        for st in &stages {
            for (k, v) in &st.metrics {
                m.insert(format!("{}.{k}", st.name), *v);
            }
        }
        let best = stages
            .iter()
            .filter_map(|s| s.metrics.get("request_throughput"))
            .copied()
            .fold(0.0, f64::max);
        m.insert("max_request_throughput".into(), best);
    }
    if let Some((Some(g), _)) = &saturation {
        m.insert("saturation_rate".into(), *g);
        if let Some(st) = stages.iter().find(|s| s.load.rate == Some(*g)) {
            for k in ["request_throughput", "output_throughput", "request_goodput"] {
                if let Some(v) = st.metrics.get(k) {
                    m.insert(format!("saturation_{k}"), *v);
                }
            }
        }
    }
    let all_samples: Vec<&Sample> = stages.iter().flat_map(|s| s.samples.iter()).collect();
    let ok: Vec<&&Sample> = all_samples.iter().filter(|s| s.ok).collect();
    let behind = stages
        .iter()
        .filter_map(|s| {
            s.behind.as_ref().map(|b| {
                if several {
                    format!("stage `{}`: {b}", s.name)
                } else {
                    b.clone()
                }
            })
        })
        .collect::<Vec<_>>();
    let behind = (!behind.is_empty()).then(|| behind.join("; "));
    let errors: Vec<String> = all_samples
        .iter()
        .filter_map(|s| s.error.clone())
        .take(5)
        .collect();
    let top = stages.last().map(|s| s.metrics.clone()).unwrap_or_default();
    let mut saved: serde_json::Map<String, Value> = top.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    saved.insert("backend".into(), json!("openai"));
    saved.insert("endpoint".into(), json!(cfg.endpoint));
    saved.insert("num_prompts".into(), json!(cfg.num_prompts));
    saved.insert(
        "request_rate".into(),
        json!(cfg
            .request_rate
            .map(|r| r.to_string())
            .unwrap_or_else(|| "inf".into())),
    );
    saved.insert("burstiness".into(), json!(cfg.burstiness));
    if let Some(r) = &cfg.ramp_up {
        saved.insert("ramp_up_strategy".into(), json!(r.strategy));
        saved.insert("ramp_up_start_rps".into(), json!(r.start_rps));
        saved.insert("ramp_up_end_rps".into(), json!(r.end_rps));
    }
    if cfg.multi_turn {
        saved.insert("multi_turn".into(), json!(true));
        saved.insert("turn_delay_ms".into(), json!(cfg.turn_delay_ms));
    }
    if let Some(n) = &cfg.nonce {
        saved.insert("nonce".into(), json!(n));
    }
    saved.insert("max_concurrency".into(), json!(cfg.max_concurrency));
    saved.insert("errors".into(), json!(errors));
    if let Some(slo) = &cfg.slo {
        saved.insert("slo".into(), json!(slo));
    }
    if several {
        let list: Vec<Value> = stages
            .iter()
            .map(|s| {
                json!({
                    "name": s.name,
                    "request_rate": s.load.rate.map(|r| json!(r)).unwrap_or(json!("inf")),
                    "max_concurrency": s.load.concurrency,
                    "metrics": s.metrics,
                    "slo_met": cfg.slo.as_ref().map(|slo| stage_meets(slo, &s.metrics)),
                })
            })
            .collect();
        saved.insert("stages".into(), json!(list));
    }
    if let Some((good, reason)) = &saturation {
        saved.insert(
            "saturation".into(),
            json!({"rate": good, "stop": reason, "search": cfg.saturation}),
        );
    }
    let mut inputs: BTreeMap<&str, usize> = BTreeMap::new();
    let mut outputs: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &ok {
        *inputs.entry(s.input_from).or_default() += 1;
        *outputs.entry(s.output_from).or_default() += 1;
    }
    saved.insert("token_counts".into(), json!({"input": inputs, "output": outputs}));
    if let Some(t) = &tok {
        saved.insert("tokenizer".into(), json!(t.source));
    }
    if let Some(why) = &behind {
        saved.insert("client_behind".into(), json!(why));
    }
    let _ = std::fs::write(
        out_dir.join("loadgen.json"),
        serde_json::to_vec_pretty(&Value::Object(saved)).unwrap_or_default(),
    );

    let mut r = CellResult::new(cell, Status::Succeeded);
    r.metrics = m;
    if let Some((_, reason)) = &saturation {
        r.info.insert("saturation_stop".into(), json!(reason));
        ctx.message(format!("saturation search: {reason}"));
    }
    if let Some(why) = behind {
        ctx.message(format!("warning: {why}"));
        r.flags.push(orch_protocol::FLAG_CLIENT_BEHIND.into());
        r.info.insert("client_behind".into(), json!(why));
    }
    if ok.is_empty() {
        r.status = Status::Failed;
        r.failure = Some(orch_protocol::Failure::new(
            "loadgen_failed",
            format!(
                "no request succeeded against {url}: {}",
                errors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "no requests were sent".into())
            ),
        ));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: Value) -> LoadGen {
        let mut v = json!({"endpoint": "/v1/completions", "num_prompts": 6, "input_len": 5});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ramps_change_the_rate_with_progress_as_vllm_does() {
        let reqs = vec![Req::text("x".into()); 101];
        for (strategy, mid) in [("linear", 55.0), ("exponential", 10.0 * 10f64.sqrt())] {
            let c = cfg(json!({
                "burstiness": 1e6,
                "ramp_up": {"strategy": strategy, "start_rps": 10.0, "end_rps": 100.0}
            }));
            let r = c.ramp_up.as_ref().unwrap();
            assert_eq!(ramp_rate(r, 0, 101), 10.0);
            assert!((ramp_rate(r, 50, 101) - mid).abs() < 1e-9, "{strategy}");
            assert!((ramp_rate(r, 100, 101) - 100.0).abs() < 1e-9);
            // Burstiness 1e6: intervals are 1 / rate, the rate at each request's progress.
            let at = schedule(&c, &reqs, None);
            assert_eq!(at[0], 0.0);
            for i in 1..101 {
                let want = 1.0 / ramp_rate(r, i, 101);
                let got = at[i] - at[i - 1];
                assert!(
                    (got - want).abs() < want * 0.01,
                    "{strategy} {i}: {got} vs {want}"
                );
            }
        }
        // Poisson intervals (burstiness 1): the last tenth is much denser than the first.
        let c =
            cfg(json!({"ramp_up": {"strategy": "linear", "start_rps": 5.0, "end_rps": 500.0}, "seed": 3}));
        let reqs = vec![Req::text("x".into()); 1000];
        let at = schedule(&c, &reqs, None);
        let (first, last) = (at[100] - at[0], at[999] - at[899]);
        assert!(first > 5.0 * last, "{first} {last}");
        assert!(at.windows(2).all(|w| w[1] >= w[0]));
    }

    fn sample(
        ok: bool,
        text: &str,
        max: u32,
        out: u64,
        usage: Option<u64>,
        tokenizer: Option<u64>,
    ) -> Sample {
        Sample {
            ok,
            error: (!ok).then(|| "x".to_string()),
            text: text.into(),
            max_tokens: max,
            output_tokens: out,
            usage_output: usage,
            tokenizer_output: tokenizer,
            ..Default::default()
        }
    }

    #[test]
    fn anti_gaming_signals_count_short_miscounted_and_repeated_answers() {
        let samples = vec![
            sample(true, "a b c", 3, 3, Some(3), Some(3)),
            // Stopped early under ignore_eos.
            sample(true, "a", 3, 1, Some(1), Some(1)),
            // The server claims 3 tokens for text of 10: a disagreement (> max(2, 10%)).
            sample(true, "a b c", 3, 3, Some(3), Some(10)),
            // Off by 2 of 3: within max(2, 10%).
            sample(true, "d", 3, 3, Some(3), Some(1)),
            sample(false, "", 3, 0, None, None),
        ];
        let (m, _) = summarize(&cfg(json!({})), &samples, 1.0);
        assert_eq!(m["short_responses"], 1.0);
        assert_eq!(m["token_count_disagreements"], 1.0);
        assert_eq!(m["distinct_output_ratio"], 3.0 / 4.0);
        let (m, _) = summarize(&cfg(json!({"ignore_eos": false})), &samples, 1.0);
        assert_eq!(m["short_responses"], 0.0);
    }

    #[test]
    fn the_nonce_tags_every_prompt_and_ignore_eos_is_sent_as_vllm_does() {
        let c = cfg(json!({"nonce": "r2"}));
        let (b, prompt, max) = body(&c, &Req::text("hello".into()), 7);
        assert_eq!(b["prompt"], "hello [nonce r2-7]");
        assert_eq!(prompt, "hello [nonce r2-7]");
        assert_eq!((max, &b["ignore_eos"]), (128, &json!(true)));
        let c = cfg(json!({"endpoint": "/v1/chat/completions", "nonce": "r2", "ignore_eos": false}));
        let req = Req {
            text: "s\nq".into(),
            messages: Some(vec![
                json!({"role": "system", "content": "s"}),
                json!({"role": "user", "content": "q"}),
            ]),
            ..Default::default()
        };
        let (b, prompt, _) = body(&c, &req, 0);
        assert_eq!(b["messages"][1]["content"], "q [nonce r2-0]");
        assert_eq!(b["messages"][0]["content"], "s");
        assert_eq!(prompt, "s\nq [nonce r2-0]");
        assert!(b.get("ignore_eos").is_none());
    }

    #[test]
    fn prompts_share_one_prefix_per_group() {
        let c = cfg(json!({"prefix_len": 4, "prefix_groups": 3, "seed": 1}));
        let p = prompts(&c, 7, None).unwrap();
        let head = |r: &Req| r.text.split(' ').take(4).collect::<Vec<_>>().join(" ");
        for i in 0..7 {
            assert_eq!(head(&p[i]), head(&p[i % 3]), "{i}");
            assert_eq!(p[i].text.split(' ').count(), 9);
        }
        // The groups differ (three random 4-word prefixes of 20 words).
        let distinct: std::collections::BTreeSet<String> = p.iter().map(head).collect();
        assert_eq!(distinct.len(), 3, "{distinct:?}");
        // Without groups, one prefix for all.
        let one = prompts(&cfg(json!({"prefix_len": 4})), 5, None).unwrap();
        assert!(one.iter().all(|r| head(r) == head(&one[0])));
    }
}
