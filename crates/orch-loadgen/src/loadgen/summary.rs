//! A stage's numbers: the per-request lines, the metrics of a stage (with
//! SLOs), the client's own CPU.

use super::*;

pub(super) fn request_line(i: usize, s: &Sample, slo: Option<&orch_protocol::Slo>) -> Value {
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
pub(super) struct Load {
    pub(super) rate: Option<f64>,
    pub(super) concurrency: Option<u32>,
}

/// A number as a metric-name part: `4`, `2p5`, `inf`.
pub(super) fn name_num(v: Option<f64>) -> String {
    match v {
        None => "inf".into(),
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{}", x as i64),
        Some(x) => format!("{x}").replace('.', "p"),
    }
}

/// What one stage measured.
pub(super) struct StageOut {
    pub(super) name: String,
    pub(super) load: Load,
    pub(super) metrics: BTreeMap<String, f64>,
    pub(super) behind: Option<String>,
    pub(super) samples: Vec<Sample>,
}

/// The summary of a stage's samples (the module's metric names).
pub(super) fn summarize(
    cfg: &LoadGen,
    samples: &[Sample],
    duration: f64,
) -> (BTreeMap<String, f64>, Vec<f64>) {
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
pub(super) fn process_cpu_s() -> Option<f64> {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    Some(t(ru.ru_utime) + t(ru.ru_stime))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_stage(
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
pub(super) fn stage_meets(slo: &orch_protocol::Slo, m: &BTreeMap<String, f64>) -> bool {
    let within = |bound: Option<f64>, key: &str| bound.is_none_or(|b| m.get(key).is_none_or(|v| *v <= b));
    m.get("failed").copied().unwrap_or(0.0) == 0.0
        && m.get("completed").copied().unwrap_or(0.0) > 0.0
        && within(slo.ttft_ms, "p99_ttft_ms")
        && within(slo.tpot_ms, "p99_tpot_ms")
        && within(slo.e2el_ms, "p99_e2el_ms")
}
