//! Answers held to the baseline's, prompt by prompt: the defence of a
//! comparison that does not rest on what a server says about itself.
//!
//! Within a round every variant is sent the same prompts (the same seed, the
//! same nonce), and the load generator asks greedily (`temperature: 0`). A
//! correct optimisation therefore returns, for each prompt, the baseline's
//! text, or (where numerics differ) a text of about its length. The load
//! generator writes, per answered request, what arrived (`outputs.jsonl`:
//! bytes of text, events, tokens counted from the text with the model's
//! tokenizer where there is one) beside what the server claimed
//! (`usage.completion_tokens`). Here each variant's answers are paired with
//! the baseline's of the same round by request index and prompt hash, over
//! every round (warm-up included), and two questions are asked of the
//! per-prompt log-ratios:
//!
//! - **`shorter_outputs`**: are its answers systematically shorter than the
//!   baseline's (in bytes, and in counted tokens where counted)? Stops: an
//!   early stop (of every answer, of long ones only, of streamed ones only)
//!   that the output check did not see, whatever the server's `usage` says.
//! - **`inflated_token_counts`**: does it claim more tokens per byte of text
//!   than the baseline does for the same prompts? Stops: a `usage` (or an
//!   event count) inflated on answers of the right length, which would
//!   otherwise raise the token throughput where no tokenizer recounts it.
//!
//! A variant is flagged when the effect passes [`MIN_EFFECT`] (or the
//! comparison's noise threshold, if larger) and its one-sided
//! [`CONFIDENCE`] bound excludes no effect: the paired per-prompt
//! log-ratios' mean, with a Student-t bound. Both conditions matter: the
//! bound keeps a noisy A/A pair (different lengths from batch-dependent
//! numerics) from being flagged, the floor keeps a large sample from
//! flagging a difference too small to move a verdict. An A/A pair of the
//! same server gives identical lengths under greedy decoding (ratio 1, no
//! spread: measured in `scripts/bench-compare.sh`), and two independent
//! draws of lengths flag one pair in 200 at most
//! (`aa_pairs_of_random_lengths_are_not_flagged`). Fewer than
//! [`MIN_PAIRS`] paired answers judge nothing (recorded as too few).

use serde::{Deserialize, Serialize};
use std::path::Path;

/// Paired answers below which nothing is judged.
pub const MIN_PAIRS: usize = 8;
/// The smallest systematic difference flagged (3%), unless the comparison's
/// noise threshold is larger.
pub const MIN_EFFECT: f64 = 0.03;
/// One-sided confidence of the bound that must exclude no difference.
pub const CONFIDENCE: f64 = 0.999;

/// One answered request as `outputs.jsonl` keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    /// The request's index in its round's load.
    pub i: usize,
    /// SHA-256 of the prompt text as sent (nonce included).
    pub prompt_sha256: String,
    /// Bytes of generated text received.
    #[serde(default)]
    pub bytes: u64,
    /// Events (chunks) that carried text.
    #[serde(default)]
    pub events: u64,
    /// The output tokens the load generator used for this request.
    #[serde(default)]
    pub claimed: u64,
    /// Where `claimed` came from: `tokenizer`, `usage` or `chunks`.
    #[serde(default)]
    pub claimed_from: String,
    /// The server's `usage.completion_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<u64>,
    /// Tokens of the text, counted with the model's tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted: Option<u64>,
    /// The text (cut at 4096 characters).
    #[serde(default)]
    pub text: String,
}

/// The answers of `outputs.jsonl` (lines that do not parse are skipped).
pub fn read(path: &Path) -> Vec<Answer> {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
        .unwrap_or_default()
}

/// One prompt answered by both: (baseline, variant).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pair {
    pub round: u32,
    pub bytes: (u64, u64),
    pub events: (u64, u64),
    pub claimed: (u64, u64),
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted: Option<(u64, u64)>,
}

/// Pair `other`'s answers with `base`'s of the same round: same request
/// index and same prompt (a prompt only one of them answered is left out;
/// failed requests are judged by the failure count, not here).
pub fn pair(base: &[Answer], other: &[Answer], round: u32) -> Vec<Pair> {
    let by_i: std::collections::HashMap<usize, &Answer> = base.iter().map(|a| (a.i, a)).collect();
    other
        .iter()
        .filter_map(|o| {
            let b = by_i.get(&o.i).filter(|b| b.prompt_sha256 == o.prompt_sha256)?;
            Some(Pair {
                round,
                bytes: (b.bytes, o.bytes),
                events: (b.events, o.events),
                claimed: (b.claimed, o.claimed),
                counted: b.counted.zip(o.counted),
            })
        })
        .collect()
}

/// A paired log-ratio summary: the geometric mean ratio and its one-sided
/// bounds at [`CONFIDENCE`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ratio {
    /// exp(mean of the per-prompt log-ratios).
    pub ratio: f64,
    /// exp(lower bound), exp(upper bound), each one-sided.
    pub low: f64,
    pub high: f64,
    /// Σ variant / Σ baseline (for the record).
    pub total: f64,
}

fn ln_ratio(b: u64, o: u64) -> f64 {
    ((o as f64 + 1.0) / (b as f64 + 1.0)).ln()
}

fn summarize(d: &[f64], total: f64) -> Option<Ratio> {
    if d.len() < MIN_PAIRS {
        return None;
    }
    let n = d.len() as f64;
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let half = orch_stats::t_quantile(CONFIDENCE, n - 1.0) * (var / n).sqrt();
    Some(Ratio {
        ratio: mean.exp(),
        low: (mean - half).exp(),
        high: (mean + half).exp(),
        total,
    })
}

fn total(pairs: &[Pair], f: impl Fn(&Pair) -> (u64, u64)) -> f64 {
    let (b, o) = pairs
        .iter()
        .map(&f)
        .fold((0u64, 0u64), |(sb, so), (b, o)| (sb + b, so + o));
    if b == 0 {
        f64::NAN
    } else {
        o as f64 / b as f64
    }
}

/// What the lengths say of one variant against the baseline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    pub pairs: usize,
    pub rounds: usize,
    /// The variant's bytes of text over the baseline's, per prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<Ratio>,
    /// Its tokens counted from the text over the baseline's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_tokens: Option<Ratio>,
    /// Its events over the baseline's (evidence only: a server may send
    /// several tokens an event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Ratio>,
    /// Its claimed tokens per byte over the baseline's claimed tokens per
    /// byte, per prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claimed_per_byte: Option<Ratio>,
    /// The smallest difference flagged.
    pub threshold: f64,
    /// `(flag, why)` for each finding.
    pub flags: Vec<(String, String)>,
}

/// Judge the paired answers (see the module); `noise` is the comparison's
/// noise threshold.
pub fn judge(pairs: &[Pair], noise: f64) -> Judgement {
    let threshold = MIN_EFFECT.max(noise);
    let mut rounds: Vec<u32> = pairs.iter().map(|p| p.round).collect();
    rounds.sort_unstable();
    rounds.dedup();
    let d = |f: &dyn Fn(&Pair) -> f64| pairs.iter().map(f).collect::<Vec<f64>>();
    let bytes = summarize(&d(&|p| ln_ratio(p.bytes.0, p.bytes.1)), total(pairs, |p| p.bytes));
    let counted_pairs: Vec<Pair> = pairs.iter().filter(|p| p.counted.is_some()).copied().collect();
    let counted = summarize(
        &counted_pairs
            .iter()
            .filter_map(|p| p.counted.map(|(b, o)| ln_ratio(b, o)))
            .collect::<Vec<_>>(),
        total(&counted_pairs, |p| p.counted.unwrap_or((0, 0))),
    );
    let events = summarize(
        &d(&|p| ln_ratio(p.events.0, p.events.1)),
        total(pairs, |p| p.events),
    );
    let claimed_per_byte = summarize(
        &d(&|p| ln_ratio(p.claimed.0, p.claimed.1) - ln_ratio(p.bytes.0, p.bytes.1)),
        total(pairs, |p| p.claimed) / total(pairs, |p| p.bytes),
    );
    let mut flags = Vec::new();
    let shorter = |r: &Option<Ratio>| r.filter(|r| r.ratio < 1.0 - threshold && r.high < 1.0);
    let pct = |x: f64| (x - 1.0) * 100.0;
    if let Some(r) = shorter(&bytes).or(shorter(&counted)) {
        let unit = if shorter(&bytes).is_some() {
            "bytes of text"
        } else {
            "tokens counted from the text"
        };
        flags.push((
            "shorter_outputs".to_string(),
            format!(
                "its answers are {:.1}% shorter than the baseline's for the same prompts, in {unit} (bound {:+.1}%, {} answers paired over {} rounds)",
                -pct(r.ratio),
                pct(r.high),
                pairs.len(),
                rounds.len()
            ),
        ));
    }
    if let Some(r) = claimed_per_byte.filter(|r| r.ratio > 1.0 + threshold && r.low > 1.0) {
        flags.push((
            "inflated_token_counts".to_string(),
            format!(
                "it claims {:.1}% more tokens per byte of text than the baseline for the same prompts (bound {:+.1}%, {} answers paired)",
                pct(r.ratio),
                pct(r.low),
                pairs.len()
            ),
        ));
    }
    Judgement {
        pairs: pairs.len(),
        rounds: rounds.len(),
        bytes,
        counted_tokens: counted,
        events,
        claimed_per_byte,
        threshold,
        flags,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn p(bytes: (u64, u64), claimed: (u64, u64)) -> Pair {
        Pair {
            round: 0,
            bytes,
            events: claimed,
            claimed,
            counted: None,
        }
    }

    #[test]
    fn identical_answers_are_not_flagged() {
        let pairs: Vec<Pair> = (0..64).map(|i| p((400 + i, 400 + i), (64, 64))).collect();
        let j = judge(&pairs, 0.02);
        assert!(j.flags.is_empty(), "{j:?}");
        assert_eq!(j.bytes.unwrap().ratio, 1.0);
    }

    /// The attack of issue 44: long answers stopped at half their length,
    /// `usage` still the full count.
    #[test]
    fn half_length_answers_with_a_lying_usage_are_shorter_and_inflated() {
        let pairs: Vec<Pair> = (0..64).map(|i| p((512 + i, 256 + i / 2), (128, 128))).collect();
        let j = judge(&pairs, 0.02);
        let names: Vec<&str> = j.flags.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(names, ["shorter_outputs", "inflated_token_counts"], "{j:?}");
        assert!(j.flags[0].1.contains("50.0% shorter"), "{}", j.flags[0].1);
    }

    /// A `usage` inflated on answers of the right length.
    #[test]
    fn an_inflated_usage_on_right_length_answers_is_flagged_alone() {
        let pairs: Vec<Pair> = (0..64).map(|i| p((512 + i, 512 + i), (128, 160))).collect();
        let j = judge(&pairs, 0.02);
        let names: Vec<&str> = j.flags.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(names, ["inflated_token_counts"], "{j:?}");
    }

    #[test]
    fn shorter_by_less_than_the_threshold_or_too_few_is_not_flagged() {
        let pairs: Vec<Pair> = (0..64).map(|i| p((1000 + i, 985 + i), (128, 128))).collect();
        assert!(judge(&pairs, 0.02).flags.is_empty());
        let few: Vec<Pair> = (0..MIN_PAIRS as u64 - 1)
            .map(|i| p((500 + i, 100), (128, 128)))
            .collect();
        let j = judge(&few, 0.02);
        assert!(j.flags.is_empty() && j.bytes.is_none(), "{j:?}");
    }

    /// Two independent draws of lengths (an A/A pair whose answers differ by
    /// batch-dependent numerics, or a server without `ignore_eos`): at most
    /// one pair in 200 is flagged, from 16 to 512 paired answers.
    #[test]
    fn aa_pairs_of_random_lengths_are_not_flagged() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(44);
        let mut flagged = 0;
        let trials = 1000;
        for t in 0..trials {
            let n = [16, 64, 256, 512][t % 4];
            let pairs: Vec<Pair> = (0..n)
                .map(|_| {
                    let (b, o) = (rng.random_range(10..2000u64), rng.random_range(10..2000u64));
                    let mut tok = |x: u64| x / rng.random_range(3..6u64);
                    p((b, o), (tok(b), tok(o)))
                })
                .collect();
            if !judge(&pairs, 0.02).flags.is_empty() {
                flagged += 1;
            }
        }
        assert!(flagged <= trials / 200, "{flagged} of {trials} A/A pairs flagged");
    }

    #[test]
    fn answers_pair_by_index_and_prompt() {
        let a = |i: usize, sha: &str, bytes: u64| Answer {
            i,
            prompt_sha256: sha.into(),
            bytes,
            ..Default::default()
        };
        let base = vec![a(0, "x", 10), a(1, "y", 20), a(2, "z", 30)];
        let other = vec![a(1, "y", 5), a(2, "other prompt", 30), a(3, "w", 1)];
        let got = pair(&base, &other, 4);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].round, got[0].bytes), (4, (20, 5)));
        // An `outputs.jsonl` of the previous format (no lengths) still reads.
        let old: Answer = serde_json::from_str(r#"{"i": 3, "prompt_sha256": "ab", "text": "hi"}"#).unwrap();
        assert_eq!((old.i, old.bytes, old.usage), (3, 0, None));
    }
}
