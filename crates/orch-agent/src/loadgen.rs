//! The built-in load generator for OpenAI-compatible servers
//! (`/v1/completions`, `/v1/chat/completions`, streaming or not).
//!
//! Arrivals: all at once (`request_rate` unset), or a gamma process with the
//! given rate and burstiness (1.0 = Poisson), as `vllm bench serve` does.
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
//! Token counts: the server's `usage` (`prompt_tokens`, `completion_tokens`)
//! when it sends one, else the streamed chunks for output and the prompt's
//! words for input; `loadgen.json`'s `token_counts` says how many requests
//! were counted each way. Every measured request is a line of
//! `requests.jsonl` (times from the start of the measured phase, in seconds).

use crate::ctx::Ctx;
use crate::dataset::Req;
use crate::stats;
use crate::tokens::Tokens;
use orch_protocol::{CellResult, LoadGen, Phase, Status, TaskSpec};
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

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
        return (0..n)
            .map(|i| {
                let len = rng.random_range(lo..=hi);
                t.random_prompt(&mut rng, len, &prefixes[i % groups])
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

fn body(cfg: &LoadGen, req: &Req) -> Value {
    let mut b = if cfg.endpoint.contains("chat") {
        match &req.messages {
            Some(m) => json!({ "messages": m }),
            None => json!({"messages": [{"role": "user", "content": req.text}]}),
        }
    } else {
        json!({"prompt": req.text})
    };
    b["max_tokens"] = json!(req.max_tokens.unwrap_or(cfg.output_len));
    b["stream"] = json!(cfg.stream);
    b["ignore_eos"] = json!(true);
    b["temperature"] = json!(0.0);
    if cfg.stream {
        b["stream_options"] = json!({"include_usage": true});
    }
    if let Some(m) = &cfg.model {
        b["model"] = json!(m);
    }
    b
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

fn one_request(agent: &ureq::Agent, url: &str, cfg: &LoadGen, req: &Req, tok: Option<&Tokens>) -> Sample {
    let prompt = req.text.as_str();
    let mut s = Sample {
        input_tokens: prompt.split_whitespace().count() as u64,
        ..Default::default()
    };
    let start = Instant::now();
    let resp = agent
        .post(url)
        .header("Content-Type", "application/json")
        .send(body(cfg, req).to_string());
    let resp = match resp {
        Ok(r) => r,
        Err(e) => {
            s.error = Some(e.to_string());
            return s;
        }
    };
    let reader = BufReader::new(resp.into_body().into_reader());
    let mut last: Option<Instant> = None;
    let mut usage_tokens = None;
    let mut usage_prompt = None;
    let mut generated = String::new();
    for line in reader.lines() {
        let Ok(line) = line else {
            s.error = Some("the response broke off".into());
            return s;
        };
        let data = if cfg.stream {
            match line.strip_prefix("data:") {
                Some(d) => d.trim().to_string(),
                None => continue,
            }
        } else {
            line
        };
        if data == "[DONE]" {
            break;
        }
        let Ok(v) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        if let Some(n) = v
            .get("usage")
            .and_then(|u| u.get("completion_tokens"))
            .and_then(|n| n.as_u64())
        {
            usage_tokens = Some(n);
        }
        if let Some(n) = v
            .get("usage")
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(|n| n.as_u64())
        {
            usage_prompt = Some(n);
        }
        if let Some(text) = chunk_text(&v) {
            if text.is_empty() {
                continue;
            }
            let now = Instant::now();
            match last {
                None => s.ttft_s = (now - start).as_secs_f64(),
                Some(prev) => s.itl_s.push((now - prev).as_secs_f64()),
            }
            last = Some(now);
            s.output_tokens += 1;
            generated.push_str(&text);
        }
    }
    s.e2e_s = start.elapsed().as_secs_f64();
    // Input: the tokenizer, as `vllm bench serve` counts a prompt; else the
    // server's count; else words. Output: the server's count; else the
    // tokenizer on the text; else one a streamed chunk.
    (s.input_tokens, s.input_from) = match (tok.and_then(|t| t.count_prompt(prompt)), usage_prompt) {
        (Some(n), _) => (n, "tokenizer"),
        (None, Some(n)) => (n, "usage"),
        (None, None) => (s.input_tokens, "words"),
    };
    (s.output_tokens, s.output_from) = match (usage_tokens, tok.and_then(|t| t.count_output(&generated))) {
        (Some(n), _) => (n, "usage"),
        (None, Some(n)) => (n, "tokenizer"),
        (None, None) => (s.output_tokens, "chunks"),
    };
    if last.is_none() {
        s.error = Some("no tokens in the response".into());
        return s;
    }
    if !cfg.stream {
        s.ttft_s = s.e2e_s;
    }
    s.ok = true;
    s
}

/// Intended send times (seconds from the start): gamma intervals (shape =
/// burstiness, mean = 1 / rate) summed; all at 0 without a rate.
fn schedule(cfg: &LoadGen, reqs: &[Req], rate: Option<f64>) -> Vec<f64> {
    // A trace's own times.
    if !reqs.is_empty() && reqs.iter().all(|r| r.at_s.is_some()) {
        return reqs.iter().map(|r| r.at_s.unwrap_or(0.0)).collect();
    }
    let n = reqs.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x5eed);
    let gamma = rate.and_then(|r| {
        rand_distr::Gamma::new(cfg.burstiness.max(1e-3), 1.0 / (r * cfg.burstiness.max(1e-3))).ok()
    });
    let mut t = 0.0;
    (0..n)
        .map(|_| {
            let at = t;
            if let Some(g) = &gamma {
                t += g.sample(&mut rng);
            }
            at
        })
        .collect()
}

/// Send `prompts` with the configured arrivals and concurrency.
fn drive(
    cfg: &LoadGen,
    url: &str,
    prompts: Vec<Req>,
    rate: Option<f64>,
    tok: &Option<Arc<Tokens>>,
    ctx: &mut Ctx,
    phase: Phase,
) -> (Vec<Sample>, f64) {
    let n = prompts.len();
    let workers = cfg
        .max_concurrency
        .map(|c| c as usize)
        .unwrap_or(n)
        .clamp(1, 512)
        .min(n.max(1));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(3600)))
        .http_status_as_error(true)
        .build()
        .into();
    let start = Instant::now();
    let (job_tx, job_rx) = mpsc::channel::<(usize, Req, f64)>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (res_tx, res_rx) = mpsc::channel::<(usize, Sample)>();
    let mut handles = Vec::new();
    for _ in 0..workers {
        let job_rx = job_rx.clone();
        let res_tx = res_tx.clone();
        let agent = agent.clone();
        let url = url.to_string();
        let cfg = cfg.clone();
        let tok = tok.clone();
        handles.push(thread::spawn(move || loop {
            let job = match job_rx.lock() {
                Ok(rx) => rx.recv(),
                Err(_) => return,
            };
            let Ok((i, prompt, due)) = job else { return };
            let sent = start.elapsed().as_secs_f64();
            let mut sample = one_request(&agent, &url, &cfg, &prompt, tok.as_deref());
            sample.scheduled_s = due;
            sample.sent_s = sent;
            let _ = res_tx.send((i, sample));
        }));
    }
    drop(res_tx);
    let due = schedule(cfg, &prompts, rate);
    let dispatcher = {
        let stop = ctx.stop_flag();
        thread::spawn(move || {
            for ((i, p), at) in prompts.into_iter().enumerate().zip(due) {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                // Absolute times: a late wake-up is not carried into the next.
                let wait = at - start.elapsed().as_secs_f64();
                if wait > 0.0 {
                    thread::sleep(crate::command::secs(wait));
                }
                if job_tx.send((i, p, at)).is_err() {
                    break;
                }
            }
        })
    };
    let mut samples = vec![Sample::default(); n];
    let mut done = 0;
    for (i, s) in res_rx.iter() {
        samples[i] = s;
        done += 1;
        ctx.progress(phase, done, n as u64);
    }
    let _ = dispatcher.join();
    for h in handles {
        let _ = h.join();
    }
    (samples, start.elapsed().as_secs_f64())
}

/// Whether the client sent late (see the module), and why in words.
fn client_behind(cfg: &LoadGen, rate: Option<f64>, lags_ms: &[f64]) -> Option<String> {
    rate?;
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
    });
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
    let (samples, duration) = drive(&c, url, prompts.to_vec(), load.rate, tok, ctx, Phase::Measure);
    let (metrics, lags) = summarize(&c, &samples, duration);
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
        Err(e) => return CellResult::failed(cell, Status::Failed, "invalid_config", e),
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
        drive(cfg, &url, warm.to_vec(), None, &tok, ctx, Phase::Warmup);
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
