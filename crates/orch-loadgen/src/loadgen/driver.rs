//! Sending a load: the schedule (rate, burstiness, ramp-up), the event-loop
//! driver of requests and conversations, whether the client fell behind.

use super::*;

/// Intended send times (seconds from the start): gamma intervals (shape =
/// burstiness, mean = 1 / rate) summed; all at 0 without a rate. With
/// `ramp_up`, the interval before request i has the rate at its progress
/// i / (n - 1) (`vllm bench serve --ramp-up-strategy`).
pub(super) fn schedule(cfg: &LoadGen, reqs: &[Req], rate: Option<f64>) -> Vec<f64> {
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
pub(super) fn ramp_rate(r: &RampUp, i: usize, n: usize) -> f64 {
    let p = i as f64 / n.saturating_sub(1).max(1) as f64;
    match r.strategy {
        RampStrategy::Linear => r.start_rps + (r.end_rps - r.start_rps) * p,
        RampStrategy::Exponential => r.start_rps * (r.end_rps / r.start_rps.max(1e-9)).powf(p),
    }
}

/// One conversation (or single request) of a stage.
pub(super) struct Conv {
    pub(super) req: Req,
    /// Its turns (`multi_turn`; else empty).
    pub(super) turns: Vec<Turn>,
    /// The index of its first request.
    pub(super) first: usize,
    /// The messages so far, answers as the server gave them.
    pub(super) history: Vec<Value>,
}

/// The event loop's handler: samples from the answers, next turns.
pub(super) struct Driver<'a> {
    pub(super) cfg: &'a LoadGen,
    pub(super) start: Instant,
    pub(super) convs: Vec<Conv>,
    /// Request index → (conversation, turn).
    pub(super) owner: Vec<(usize, usize)>,
    /// The turn's own messages as sent (multi-turn), by request index.
    pub(super) sent_msgs: Vec<Vec<Value>>,
    pub(super) samples: Vec<Sample>,
    pub(super) accs: Vec<Acc>,
    pub(super) done: u64,
    pub(super) ctx: &'a mut Ctx,
    pub(super) phase: Phase,
    pub(super) shown: Instant,
}

impl Driver<'_> {
    pub(super) fn secs(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.start).as_secs_f64()
    }

    /// The job of turn `k` of conversation `c`, due at `due_s`.
    pub(super) fn job(&mut self, c: usize, k: usize, due_s: f64) -> evclient::Job {
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

    pub(super) fn progress(&mut self) {
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
pub(super) fn drive(
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
pub(super) fn client_behind(cfg: &LoadGen, rate: Option<f64>, lags_ms: &[f64]) -> Option<String> {
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
