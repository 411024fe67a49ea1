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
use orch_protocol::{CellResult, FailureKind, LoadGen, Phase, RampStrategy, RampUp, Status, TaskSpec};
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

mod driver;
mod prompts;
mod stream;
mod summary;
use driver::*;
pub use prompts::longest_output;
use prompts::*;
use stream::*;
use summary::*;

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

pub fn run(cfg: &LoadGen, task: &TaskSpec, base_url: &str, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let url = format!("{}{}", base_url.trim_end_matches('/'), cfg.endpoint);
    let tok = match crate::tokens::load(
        cfg.tokenizer.as_deref(),
        cfg.model.as_deref(),
        task.weights_dir.as_deref(),
    ) {
        Ok(t) => t.map(Arc::new),
        Err(e) => return CellResult::failed(cell, Status::Failed, FailureKind::InvalidConfig, e.to_string()),
    };
    let all = match prompts(
        cfg,
        cfg.num_prompts as usize + cfg.warmup_requests as usize,
        tok.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => return CellResult::failed(cell, Status::Failed, FailureKind::InvalidConfig, e),
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
            FailureKind::LoadgenFailed,
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
