//! Which way is better for a metric, read from its name: the one rule that
//! comparisons (`faster`/`slower`, and so `orch bisect`), `orch history`'s
//! verdicts, `orch show`/`orch report`'s history check and the reports'
//! rankings all use (issue 44: there were two, and they disagreed).
//!
//! # The rule
//!
//! A name is lowercased and cut into words at every character that is not a
//! letter or a digit (`p99_ttft_ms` → `p99`, `ttft`, `ms`). Its part after the
//! last `.` is judged first (`base.output_throughput`: a comparison's variant,
//! `rate_4.failed`: a load stage, `latency.p99`: a nested metrics file);
//! when that part says nothing, the part before it, and so on. Within a part,
//! the words before the first `per` (not counting a leading one) are the
//! *measure*, the words after it the *unit*; the first of these that holds
//! decides:
//!
//! 1. a spread (`std`, `stdev`, `cv`, `variance`, `jitter`, `iqr`) anywhere:
//!    **lower** (less noise is better, whatever it is the spread of:
//!    `std_ttft_ms`, `step_time_cv_pct`, `tokens_per_s_std`);
//! 2. the measure names a harm: a failure (`failed`, `errors`, `oom`,
//!    `short`, `disagreements`, `dropped`, `miss`, ...), money (`cost`,
//!    `usd`), energy or power (`energy`, `j`, `kwh`, `power`, `watts`), a
//!    `loss` or a `temp`erature: **lower** (`short_responses`,
//!    `errors_per_s`, `usd_per_1k_tokens`, `gpu_energy_per_token_j`,
//!    `gpu_power_mean_w`, `final_loss`);
//! 3. the measure names a gain (`throughput`, `goodput`, `*flops`, `mfu`,
//!    `bandwidth`, `gbs`/`gbps`, `util*`, `efficiency`, `attainment`,
//!    `speedup`, `rate`, `completed`, `distinct`, ...), or a size unit
//!    followed by a time unit (`copy_gib_s`): **higher**;
//! 4. the measure names a time (a unit: `ns`, `us`, `ms`, `s`, `sec`,
//!    `hours`, ...; or `time`, `duration`, `latency`, `ttft`, `tpot`, `itl`,
//!    `e2el`, `lag`, `delay`, `wait`, `startup`, `elapsed`, `overhead`):
//!    **lower** (`mean_ttft_ms`, `setup_duration`, `ms_per_token`,
//!    `latency_per_image_ms`);
//! 5. the unit after `per` is a time (also `min`, `h` there) or a harm: a
//!    rate or an efficiency, **higher** (`tokens_per_s`,
//!    `samples_per_s_per_gpu`, `md5_mib_per_s`, `tokens_per_joule`,
//!    `images_per_usd`);
//! 6. the measure names a resource (`memory`, `rss`, `vram`, `cpu`, a size
//!    unit such as `bytes`, `mb`, `gib`): **lower** (`peak_memory_bytes`,
//!    `telemetry_cpu_pct`);
//! 7. none of these, in any part: **higher** (counts and sizes of the work:
//!    `params`, `steps`, `tokens`; ratios such as `distinct_output_ratio`;
//!    clocks).
//!
//! A workload that wants another sense names its metric so (`_per_s` for a
//! rate, not a bare `_s`, which reads as seconds).

use serde::{Deserialize, Serialize};

/// Which direction is better for a metric. Stored in comparison records
/// as `higher`/`lower`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// Words of a spread: lower is better, whatever they measure (rule 1).
const SPREAD: &[&str] = &["std", "stdev", "stddev", "cv", "variance", "jitter", "iqr"];

/// Words of a harm: failures, money, energy and power, loss, heat (rule 2).
const HARM: &[&str] = &[
    // failures and answers that were not generated as asked
    "fail",
    "failed",
    "fails",
    "failure",
    "failures",
    "error",
    "errors",
    "errored",
    "timeout",
    "timeouts",
    "oom",
    "ooms",
    "short",
    "disagreements",
    "impossible",
    "mismatch",
    "mismatches",
    "drop",
    "drops",
    "dropped",
    "rejected",
    "retries",
    "preempted",
    "preemptions",
    "evicted",
    "evictions",
    "aborted",
    "miss",
    "misses",
    // money
    "cost",
    "costs",
    "usd",
    "dollar",
    "dollars",
    "price",
    // energy and power
    "energy",
    "joule",
    "joules",
    "j",
    "kj",
    "wh",
    "kwh",
    "power",
    "watt",
    "watts",
    // model quality and heat
    "loss",
    "perplexity",
    "ppl",
    "temp",
    "temperature",
];

/// Words of a gain: rates of work, utilisation, success (rule 3).
const GAIN: &[&str] = &[
    "throughput",
    "goodput",
    "flops",
    "tflops",
    "gflops",
    "pflops",
    "mfu",
    "bandwidth",
    "gbs",
    "gbps",
    "mbps",
    "util",
    "utilization",
    "utilisation",
    "occupancy",
    "efficiency",
    "attainment",
    "speedup",
    "rate",
    "qps",
    "rps",
    "tps",
    "fps",
    "iops",
    "completed",
    "succeeded",
    "success",
    "accuracy",
    "distinct",
];

/// Words of a time: units and names of durations and latencies (rule 4).
const TIME: &[&str] = &[
    "ns",
    "us",
    "ms",
    "s",
    "sec",
    "secs",
    "second",
    "seconds",
    "minute",
    "minutes",
    "hour",
    "hours",
    "day",
    "days",
    "time",
    "times",
    "duration",
    "durations",
    "latency",
    "latencies",
    "elapsed",
    "wall",
    "lag",
    "delay",
    "wait",
    "startup",
    "overhead",
    "ttft",
    "tpot",
    "itl",
    "tbt",
    "e2e",
    "e2el",
];

/// Short time units that name a time only after `per` (`tokens_per_min`),
/// since alone they are as often a minimum or a count (`step_time_min_ms`).
const TIME_AFTER_PER: &[&str] = &["min", "h", "hr", "hrs"];

/// Size units: a bandwidth before a time unit (rule 3), else a resource (rule 6).
const SIZE: &[&str] = &[
    "bytes", "byte", "kb", "mb", "gb", "tb", "kib", "mib", "gib", "tib",
];

/// Words of a resource used besides sizes: memory, CPU (rule 6).
const RESOURCE: &[&str] = &["memory", "mem", "rss", "vram", "footprint", "cpu"];

/// The sense of a metric by its name (the module's rule).
pub fn better_for(metric: &str) -> Better {
    let m = metric.to_ascii_lowercase();
    m.rsplit('.').find_map(sense).unwrap_or(Better::Higher)
}

/// The sense one `.`-part of a name states, if any.
fn sense(part: &str) -> Option<Better> {
    let words: Vec<&str> = part
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    // A leading `per` (`per_token_latency_ms`) starts no unit.
    let split = words.iter().skip(1).position(|w| *w == "per").map(|i| i + 1);
    let (measure, unit) = match split {
        Some(i) => (&words[..i], &words[i + 1..]),
        None => (&words[..], &[][..]),
    };
    let any = |ws: &[&str], list: &[&str]| ws.iter().any(|w| list.contains(w));
    if any(&words, SPREAD) || any(measure, HARM) {
        Some(Better::Lower)
    } else if any(measure, GAIN)
        || measure
            .windows(2)
            .any(|w| SIZE.contains(&w[0]) && TIME.contains(&w[1]))
    {
        Some(Better::Higher)
    } else if any(measure, TIME) {
        Some(Better::Lower)
    } else if any(unit, TIME) || any(unit, TIME_AFTER_PER) || any(unit, HARM) {
        Some(Better::Higher)
    } else if any(measure, RESOURCE) || any(measure, SIZE) {
        Some(Better::Lower)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Better::{Higher, Lower};

    /// Every metric name the project emits, with where it comes from, and
    /// its sense.
    const EMITTED: &[(&str, Better, &str)] = &[
        // orch-loadgen `loadgen.rs` (the `server` workload's load generator,
        // vLLM `bench serve` names).
        ("duration", Lower, "loadgen: the benchmark's wall time"),
        ("completed", Higher, "loadgen"),
        ("failed", Lower, "loadgen"),
        ("total_input_tokens", Higher, "loadgen: a count of work"),
        ("total_output_tokens", Higher, "loadgen: a count of work"),
        ("request_throughput", Higher, "loadgen"),
        ("output_throughput", Higher, "loadgen"),
        ("total_token_throughput", Higher, "loadgen"),
        ("mean_ttft_ms", Lower, "loadgen"),
        ("median_ttft_ms", Lower, "loadgen"),
        ("std_ttft_ms", Lower, "loadgen"),
        ("p90_ttft_ms", Lower, "loadgen"),
        ("p99_ttft_ms", Lower, "loadgen"),
        ("mean_tpot_ms", Lower, "loadgen"),
        ("p99_tpot_ms", Lower, "loadgen"),
        ("median_itl_ms", Lower, "loadgen"),
        ("std_itl_ms", Lower, "loadgen"),
        ("mean_e2el_ms", Lower, "loadgen"),
        ("p99_e2el_ms", Lower, "loadgen"),
        ("mean_sched_ttft_ms", Lower, "loadgen"),
        ("p99_sched_e2el_ms", Lower, "loadgen"),
        ("mean_schedule_lag_ms", Lower, "loadgen"),
        ("median_schedule_lag_ms", Lower, "loadgen"),
        ("p99_schedule_lag_ms", Lower, "loadgen"),
        ("max_schedule_lag_ms", Lower, "loadgen"),
        ("short_responses", Lower, "loadgen: answers cut short"),
        ("token_count_disagreements", Lower, "loadgen"),
        (
            "impossible_token_counts",
            Lower,
            "loadgen: usage above the text's bytes and events",
        ),
        (
            "usage_output_tokens",
            Higher,
            "loadgen: the server's own count, recorded",
        ),
        (
            "distinct_output_ratio",
            Higher,
            "loadgen: low means replayed answers",
        ),
        ("request_goodput", Higher, "loadgen, with `slo:`"),
        ("output_goodput", Higher, "loadgen, with `slo:`"),
        ("slo_attainment", Higher, "loadgen, with `slo:`"),
        ("client_cpu_s", Lower, "loadgen: the client's own CPU time"),
        ("max_request_throughput", Higher, "loadgen: a sweep"),
        ("saturation_rate", Higher, "loadgen: a saturation search"),
        (
            "saturation_request_throughput",
            Higher,
            "loadgen: a saturation search",
        ),
        (
            "saturation_output_throughput",
            Higher,
            "loadgen: a saturation search",
        ),
        (
            "saturation_request_goodput",
            Higher,
            "loadgen: a saturation search",
        ),
        ("rate_4.failed", Lower, "loadgen: a stage's metric"),
        ("rate_4.output_throughput", Higher, "loadgen: a stage's metric"),
        ("rate_4.mean_ttft_ms", Lower, "loadgen: a stage's metric"),
        ("rate_4.total_input_tokens", Higher, "loadgen: a stage's count"),
        // orch-agent `server.rs`.
        ("server_startup_s", Lower, "server workload"),
        // orch-agent `gpu.rs` (telemetry of every GPU cell).
        ("gpu_peak_memory_bytes", Lower, "telemetry"),
        ("gpu_temp_max_c", Lower, "telemetry"),
        ("gpu_util_mean_pct", Higher, "telemetry"),
        ("gpu_power_mean_w", Lower, "telemetry"),
        ("gpu_sm_clock_mean_mhz", Higher, "telemetry: no throttling"),
        ("gpu_energy_j", Lower, "telemetry"),
        ("gpu_energy_per_step_j", Lower, "telemetry"),
        ("gpu_energy_per_token_j", Lower, "telemetry"),
        ("telemetry_cpu_pct", Lower, "telemetry: its own overhead"),
        // orch-kernels `transformer/` (`orch-workload`'s `stats.rs` summary) and `calibrate.rs`.
        ("step_time_mean_ms", Lower, "transformer"),
        ("step_time_median_ms", Lower, "transformer"),
        ("step_time_p95_ms", Lower, "transformer"),
        ("step_time_p99_ms", Lower, "transformer"),
        ("step_time_std_ms", Lower, "transformer"),
        ("step_time_min_ms", Lower, "transformer"),
        ("step_time_max_ms", Lower, "transformer"),
        ("step_time_cv_pct", Lower, "transformer"),
        ("tokens_per_s", Higher, "transformer"),
        ("params", Higher, "transformer: a size of the work"),
        ("flops_per_step_estimate", Higher, "transformer"),
        ("peak_memory_bytes", Lower, "transformer on the CPU"),
        ("matmul_f32_tflops", Higher, "calibrate"),
        ("matmul_bf16_tflops", Higher, "calibrate"),
        ("matmul_f16_tflops", Higher, "calibrate"),
        ("bandwidth_gbs", Higher, "calibrate"),
        // orch-agent `compare.rs`: `<variant>.<metric>`.
        ("base.output_throughput", Higher, "compare"),
        ("patched.mean_ttft_ms", Lower, "compare"),
        (
            "no-errors.output_throughput",
            Higher,
            "compare: the metric, not the variant",
        ),
        (
            "low-latency.tokens_per_s",
            Higher,
            "compare: the metric, not the variant",
        ),
        // examples/ (the seed suites' programs) and manifests/.
        ("samples_per_s", Higher, "pytorch-train, seed-multigpu"),
        ("model_tflops", Higher, "pytorch-train"),
        ("steps", Higher, "examples: a count of work"),
        ("tokens", Higher, "examples: a count of work"),
        (
            "torch_peak_memory_bytes",
            Lower,
            "pytorch-train, seed-sizes, seed-multigpu",
        ),
        ("final_loss", Lower, "pytorch-train, seed-multigpu"),
        ("samples_per_s_per_gpu", Higher, "seed-multigpu"),
        ("epoch_time_mean_s", Lower, "seed-multigpu"),
        ("epoch_time_std_s", Lower, "seed-multigpu"),
        ("epoch_time_min_s", Lower, "seed-multigpu"),
        ("epoch_time_max_s", Lower, "seed-multigpu"),
        ("world_size", Higher, "seed-multigpu: a size of the work"),
        ("load_s", Lower, "seed-frameworks, seed-vision"),
        ("warmup_s", Lower, "seed-frameworks, seed-vision"),
        ("latency_mean_ms", Lower, "seed-frameworks, seed-vision"),
        ("latency_p99_ms", Lower, "seed-frameworks, seed-vision"),
        ("latency_std_ms", Lower, "seed-frameworks, seed-vision"),
        ("output_tokens_per_s", Higher, "seed-frameworks"),
        ("ms_per_token", Lower, "seed-frameworks"),
        ("excluded", Higher, "seed-frameworks: a count"),
        ("images_per_s", Higher, "seed-vision"),
        ("latency_per_image_ms", Lower, "seed-vision"),
        ("energy_j", Lower, "seed-vision"),
        ("energy_per_image_j", Lower, "seed-vision"),
        ("images", Higher, "seed-vision: a count of work"),
        ("md5_ms", Lower, "manifests/quickstart.yaml"),
        ("md5_mib", Lower, "manifests/quickstart.yaml: a size (constant)"),
        ("md5_mib_per_s", Higher, "manifests/quickstart.yaml"),
        ("answer_tokens_per_s", Higher, "seed-threeway-standin"),
        // orch-report: what the reports derive.
        ("usd_per_1k_tokens", Lower, "report: cost efficiency"),
        ("usd_per_gpu_hour", Lower, "report"),
    ];

    /// Where the two old rules (`orch-stats` and `orch-history`, before
    /// issue 44) disagreed, and names both got wrong.
    const DISAGREED: &[(&str, Better, &str)] = &[
        // stats: higher (only a bare `duration` was a time); history: lower.
        ("setup_duration", Lower, "stats said higher"),
        ("total_duration", Lower, "stats said higher"),
        // stats: lower (ends in `_s`); history: higher (`goodput`).
        ("output_goodput_tok_s", Higher, "stats said lower"),
        // history: higher (`per_step`, `per_sample` contain `per_s`); stats: lower.
        ("time_per_step_ms", Lower, "history said higher"),
        ("latency_per_sample_ms", Lower, "history said higher"),
        // Both said higher.
        ("failed", Lower, "both said higher"),
        ("short_responses", Lower, "both said higher"),
        ("gpu_energy_per_token_j", Lower, "both said higher"),
        ("peak_memory_bytes", Lower, "both said higher"),
        ("ms_per_token", Lower, "both said higher"),
        ("final_loss", Lower, "both said higher"),
        ("latency.p99", Lower, "both said higher: a nested metrics file"),
        ("usd_per_1k_tokens", Lower, "both said higher"),
        // Both said lower.
        ("copy_gib_s", Higher, "both said lower: a bandwidth"),
    ];

    /// Names no workload emits yet that the rule must still read right.
    const OTHERS: &[(&str, Better)] = &[
        ("time_to_first_token", Lower),
        ("per_token_latency_ms", Lower),
        ("tokens_per_second", Higher),
        ("requests_per_min", Higher),
        ("tokens_per_gpu_hour", Higher),
        ("tokens_per_joule", Higher),
        ("images_per_usd", Higher),
        ("tflops_per_watt", Higher),
        ("errors_per_s", Lower),
        ("error_rate", Lower),
        ("cache_hit_rate", Higher),
        ("cache_miss_rate", Lower),
        ("tokens_per_s_std", Lower),
        ("mfu", Higher),
        ("gpu_utilization", Higher),
        ("h2d_bandwidth_gbps", Higher),
        ("memory_per_token_bytes", Lower),
        ("peak_memory_mb", Lower),
        ("cost_usd", Lower),
        ("energy_joules", Lower),
        ("gpu_hours", Lower),
        ("Output_Throughput", Higher),
        ("MEAN_TTFT_MS", Lower),
        ("b.c", Higher),
        ("", Higher),
    ];

    #[test]
    fn every_emitted_name_and_every_old_disagreement() {
        let mut wrong = Vec::new();
        for (name, want, why) in EMITTED.iter().chain(DISAGREED) {
            if better_for(name) != *want {
                wrong.push(format!("{name}: want {want:?} ({why})"));
            }
        }
        for (name, want) in OTHERS {
            if better_for(name) != *want {
                wrong.push(format!("{name}: want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn stored_form() {
        assert_eq!(serde_json::to_string(&Better::Higher).unwrap(), "\"higher\"");
        assert_eq!(serde_json::to_string(&Better::Lower).unwrap(), "\"lower\"");
        let b: Better = serde_json::from_str("\"lower\"").unwrap();
        assert_eq!(b, Better::Lower);
    }
}
