//! The `compare` workload: variants of one server (baseline, human patch,
//! agent patch, ...) set up side by side, then run in interleaved rounds
//! after warm-up rounds, so drift hits all alike. Each round runs every
//! variant once, in an order shuffled per round (seeded; the seed and the
//! orders are recorded), so a position effect (a warm cache, clock boost, a
//! neighbour's load at the start of a round) cannot pass for a difference.
//!
//! Per variant: a checkout of the repository at its ref, its patch applied
//! with `git apply` (a patch that does not apply fails that variant, with
//! git's report of the rejected hunks, before any server starts), its install
//! command. Per round: the server workload (start, readiness, client,
//! teardown) in `variants/<name>/round-<n>/`. A variant that fails is
//! reported failed; the others go on. With `max_rounds` (`rounds: auto`)
//! rounds are added until every pair's primary-metric interval is within the
//! noise threshold, `max_rounds` is reached, or another round would not fit
//! in the cell timeout; `info.stopped_by` says which. At the end every pair
//! is compared per metric (`orch_stats::compare_pair`: paired log-ratios,
//! Student-t 95% interval, the primary metric's verdict, Holm-corrected
//! secondary verdicts) into `info.comparison`.
//!
//! # The phases, in order
//!
//! `run` reads as this list: `setup_variants` (per variant: checkout, patch,
//! install), `plan_output_check` (what the first round asks), then
//! `run_rounds`, each round of it `RoundsSoFar::next` (a stop, else the live
//! variants shuffled and the round's nonce), every variant once in `measure`
//! (`serve`: its server started, loaded and stopped; then its metrics kept
//! and the defences' flags raised), `after_round` (the answers paired with
//! the baseline's; after the first round the output check judged and the
//! `check:` command run) and, after a warm-up round,
//! `RoundsSoFar::end_warmup_round` (does warm-up go on). Then the teardown:
//! `judge_lengths` (the answers' lengths against the baseline's),
//! `gate_flagged` (flags into gates), and `verdicts`: `variant_entries`
//! (means, drift), `compare_pairs` (every pair on every metric, a gate
//! overriding the speed's verdict), `info` and the cell's status.
//!
//! # Outputs before speed, and defences against timer gaming
//!
//! A comparison judges patches, more and more of them written by agents; a
//! patch must not win on the timer by not doing the work. Each defence below
//! names the attack it stops; a variant caught by one is *gated*: its speed
//! is still measured and shown, but every pair it is in gets the gate
//! (`output_mismatch` or `flagged`) as its verdict instead of
//! `faster`/`slower`/`same` (the speed's verdict kept as `speed_verdict`),
//! and `info.variants.<name>.gate` says why.
//!
//! - **Output check** (`output_check`, on by default, load generator
//!   clients; [`crate::outcheck`]): in the first round, each variant's
//!   server answers fixed prompts greedily (one at a time, seeded); answers
//!   unlike the baseline's (the first variant's) are `output_mismatch`.
//!   Stops: a wrong answer that is faster (garbage, a skipped layer, lower
//!   precision that changes the tokens), an early stop. The server is
//!   asked in the first round ([`crate::server::run_with`]): once the
//!   variant's server is ready, before the round's load (billed as
//!   `warmup`), so the check costs no server start of its own; the answers
//!   are judged once every variant has run that round. Evidence in
//!   `output-check/<name>.json`.
//! - **`check:` command**: run (`sh -c`) in each variant's checkout after
//!   the first round, with `ORCH_VARIANT`, `ORCH_VARIANT_DIR`,
//!   `ORCH_BASELINE_DIR`, `ORCH_ROUND_DIR` and `ORCH_BASELINE_ROUND_DIR`; a
//!   non-zero exit is `output_mismatch`, its output kept in
//!   `output-check/<name>.log`. Stops: the same for command clients, whose
//!   outputs only the benchmark knows how to compare.
//! - **A fresh nonce per round** (`defences`, on by default): every prompt
//!   of round `r` ends with `[nonce <random>-r<r>-<i>]` (the same for every
//!   variant of the round, so the rounds stay paired), and random prompts
//!   are drawn from a seed of the round's own. Stops: an answer cache keyed
//!   on the prompt (in memory or on disk across restarts), which would
//!   serve every round after the first from the cache, even one that strips
//!   the nonce (prompts from a `prompt_file` repeat across rounds: only the
//!   nonce tells them apart there).
//! - **Short responses** (`short_responses > 0` in a round: fewer tokens
//!   than `max_tokens` although `ignore_eos` is sent) flag the variant.
//!   Stops: an early stop that ends generation before the asked length.
//! - **Tokens counted from what arrived.** With the model's tokenizer, the
//!   load generator counts every answer's tokens from its text and uses
//!   that count for throughput and TPOT; the server's `usage` is kept beside
//!   it. `token_count_disagreements > 0` (the `usage` count off the text's
//!   count by more than max(2, 10%)) flags the variant. Stops: a server that
//!   reports the asked token count while generating fewer.
//! - **Claims the text cannot hold** (`impossible_token_counts > 0`: a
//!   `usage.completion_tokens` above both the bytes and the events of its
//!   answer) flag it, with or without a tokenizer. Stops: a grossly
//!   inflated `usage`.
//! - **Answers held to the baseline's** ([`crate::lengths`]): every round's
//!   answers are paired with the baseline's for the same prompts;
//!   systematically shorter answers (`shorter_outputs`) or more tokens
//!   claimed per byte of text (`inflated_token_counts`) flag the variant,
//!   evidence in `lengths/<name>.json`. Stops, without a tokenizer: an
//!   early stop that reports the full count, on long or streamed answers
//!   only (which the output check may not ask), and a `usage` inflated on
//!   answers of the right length.
//! - **Identical outputs across different prompts**
//!   (`distinct_output_ratio < 0.5`; the nonce makes every prompt distinct)
//!   flag it. Stops: a canned or cached answer served for every prompt.
//!
//! A flag the baseline shows too gates no variant (the server, not a
//! patch, does it: a test server that ignores prompts, or one that never
//! honours `ignore_eos`); it is still listed. `defences: false` turns the
//! nonce and the flags off; `output_check:
//! false` the output check.
//!
//! # Warm-up until steady
//!
//! `warmup_rounds: auto` (`max_warmup_rounds` set) keeps warming up (at
//! least [`orch_stats::STEADY_WINDOW`] rounds) until every variant's primary
//! metric shows no trend over the last rounds ([`orch_stats::steady`]: the
//! slope's 95% interval holds 0 and the slope is under half the noise
//! threshold per round, or the whole interval is), or `max_warmup_rounds`
//! is reached (`info.warmup_stopped_by`). The drift the measured rounds
//! still show (slope per round as a fraction of the mean, with its
//! interval: [`orch_stats::trend`]) is recorded per variant
//! (`info.variants.<name>.drift`) and beside each pair's verdict.

use crate::ctx::Ctx;
use crate::lengths;
use crate::outcheck;
use orch_protocol::{
    CellResult, Client, CompareWorkload, Failure, FailureKind, LoadGen, OutputCheck, Phase, ServerWorkload,
    Status, TaskSpec, Variant,
};
use orch_record::compare::{
    AnswersCheck, Better, CheckPlan as CheckPlanInfo, CheckStatus, CommandCheck, CompareInfo, Drift, Gate,
    GateKind, LengthRatio, Lengths, MatchRule, Method, MetricComparison, Pair, PairDrift, PairGate, Role,
    Rounds, SpeedVerdict, StoppedBy, VariantCheck, VariantEntry, WarmupStop,
};
use orch_stats::Options;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct VariantState {
    name: String,
    dir: PathBuf,
    failed: Option<String>,
    /// Measured rounds' metrics.
    rounds: Vec<BTreeMap<String, f64>>,
    /// The primary metric in each warm-up round.
    warm: Vec<f64>,
    /// Flags of the defences (sorted, once each).
    flags: Vec<String>,
    /// Why the variant gets no verdict on speed.
    gate: Option<Gate>,
    /// What the output check found.
    check: Option<VariantCheck>,
    /// Its answers paired with the baseline's, prompt by prompt, every
    /// round ([`crate::lengths`]).
    lengths: Vec<lengths::Pair>,
}

/// A metric of the load generator, the flag it raises, and when.
type FlagRule = (&'static str, &'static str, fn(f64) -> bool);

/// Metrics of the load generator that flag a variant (defences), with the
/// flag each raises: (metric, flag, raised when).
const FLAG_METRICS: &[FlagRule] = &[
    ("short_responses", "short_responses", |x| x > 0.0),
    ("token_count_disagreements", "token_count_disagreements", |x| {
        x > 0.0
    }),
    ("distinct_output_ratio", "identical_outputs", |x| x < 0.5),
    ("impossible_token_counts", "impossible_token_counts", |x| x > 0.0),
];

/// The server workload of one variant: the shared one, run in its checkout.
fn server_of(cmp: &CompareWorkload, v: &VariantState) -> ServerWorkload {
    let mut srv = cmp.server.clone();
    srv.workdir = Some(match &srv.workdir {
        Some(w) if Path::new(w).is_absolute() => w.clone(),
        Some(w) => v.dir.join(w).to_string_lossy().into_owned(),
        None => v.dir.to_string_lossy().into_owned(),
    });
    srv
}

/// `lg` for round `round`: every prompt carries `nonce` (the load
/// generator appends ` [nonce <nonce>-<i>]`), and random prompts are drawn
/// from the round's own seed (the same for every variant of the round), so
/// a cache that strips the nonce still never sees a prompt twice.
fn with_nonce(lg: &LoadGen, nonce: &str, round: u32) -> LoadGen {
    let mut lg = lg.clone();
    lg.nonce = Some(nonce.to_string());
    if lg.prompt_file.is_none() {
        lg.seed = lg
            .seed
            .wrapping_add(u64::from(round).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    lg
}

/// The output check of a comparison, asked in its first round.
struct CheckPlan<'a> {
    /// The suite's check, asked at the longest answer the load asks for.
    check: OutputCheck,
    lg: &'a LoadGen,
    prompts: Vec<String>,
    tok: Option<crate::tokens::Tokens>,
    /// Each variant's answers (index of `variants`), once asked.
    answers: Vec<Option<Vec<outcheck::Answer>>>,
}

/// Judge every variant's check answers against the reference (the first
/// variant, in the suite's order, that answered): gate those that differ
/// and keep the evidence in `output-check/<name>.json`.
fn judge_output_check(plan: &mut CheckPlan, variants: &mut [VariantState], out_dir: &Path, ctx: &mut Ctx) {
    let mut base_answers: Option<Vec<outcheck::Answer>> = None;
    for (i, v) in variants.iter_mut().enumerate() {
        let Some(answers) = plan.answers[i].take() else {
            if v.failed.is_none() {
                v.check = Some(VariantCheck::NotAsked {
                    why: "the server was not ready for the output check".into(),
                });
            }
            continue;
        };
        let outcome = match &base_answers {
            None => {
                let answered = answers.iter().filter(|a| a.text.is_some()).count();
                ctx.message(format!(
                    "output check: `{}` is the reference ({answered} of {} prompts answered)",
                    v.name,
                    answers.len()
                ));
                base_answers = Some(answers.clone());
                None
            }
            Some(base) => {
                let o = outcheck::judge(base, &answers, plan.check.min_match_prefix, plan.tok.as_ref());
                ctx.message(format!(
                    "output check: `{}` {} ({} of {} answers exact{})",
                    v.name,
                    if o.passed { "passed" } else { "output_mismatch" },
                    o.exact,
                    o.compared,
                    o.first_divergence
                        .map(|d| format!(", first divergence at {} {d}", o.unit))
                        .unwrap_or_default()
                ));
                Some(o)
            }
        };
        let evidence = outcheck::write_evidence(out_dir, &v.name, &answers, outcome.as_ref())
            .unwrap_or_else(|e| format!("not written: {e}"));
        if let Some(o) = outcome.as_ref().filter(|o| !o.passed) {
            v.gate = Some(Gate {
                kind: GateKind::OutputMismatch,
                why: format!(
                    "{} of {} answers to the output check differ from the baseline's ({}; {})",
                    o.compared - o.exact,
                    o.compared,
                    o.rule,
                    evidence
                ),
            });
        }
        v.check = Some(match outcome {
            None => VariantCheck::Reference {
                answered: answers.iter().filter(|a| a.text.is_some()).count(),
                evidence: Some(evidence),
            },
            Some(o) => VariantCheck::Answers(answers_check(o, evidence)),
        });
    }
}

/// The output check's outcome as `info.variants.<name>.output_check` keeps it.
fn answers_check(o: outcheck::Outcome, evidence: String) -> AnswersCheck {
    let outcheck::Outcome {
        passed,
        exact,
        compared,
        exact_match_rate,
        unit,
        first_divergence,
        rule,
        first_difference,
    } = o;
    AnswersCheck {
        status: if passed {
            CheckStatus::Passed
        } else {
            CheckStatus::OutputMismatch
        },
        passed,
        exact,
        compared,
        exact_match_rate,
        unit: unit.to_string(),
        first_divergence,
        rule,
        first_difference,
        evidence,
    }
}

/// The lengths' judgement as `info.variants.<name>.lengths` keeps it.
fn lengths_entry(j: lengths::Judgement, evidence: String) -> Lengths {
    let ratio = |r: Option<lengths::Ratio>| {
        r.map(
            |lengths::Ratio {
                 ratio,
                 low,
                 high,
                 total,
             }| LengthRatio {
                ratio,
                low,
                high,
                total,
            },
        )
    };
    let lengths::Judgement {
        pairs,
        rounds,
        bytes,
        counted_tokens,
        events,
        claimed_per_byte,
        threshold,
        flags,
    } = j;
    Lengths {
        pairs,
        rounds,
        bytes: ratio(bytes),
        counted_tokens: ratio(counted_tokens),
        events: ratio(events),
        claimed_per_byte: ratio(claimed_per_byte),
        threshold,
        flags,
        evidence,
    }
}

/// The verdict on speed of `orch_stats`, as records keep it.
fn speed_verdict(v: orch_stats::Verdict) -> SpeedVerdict {
    match v {
        orch_stats::Verdict::Faster => SpeedVerdict::Faster,
        orch_stats::Verdict::Slower => SpeedVerdict::Slower,
        orch_stats::Verdict::Same => SpeedVerdict::Same,
    }
}

fn method_of(m: orch_stats::Method) -> Method {
    match m {
        orch_stats::Method::StudentT => Method::StudentT,
        orch_stats::Method::PercentileBootstrap => Method::PercentileBootstrap,
    }
}

/// One metric of the pair `base` vs `other`, as `info.comparison[]` keeps it
/// (no gate or drift yet).
fn metric_comparison(c: orch_stats::Comparison, base: &str, other: &str) -> MetricComparison {
    let orch_stats::Comparison {
        metric,
        better,
        ratio,
        ci_low,
        ci_high,
        speedup,
        verdict,
        n_base,
        n_other,
        n,
        method,
        confidence,
        p_value,
        p_adjusted,
        role,
        mde,
        precision,
        base_values,
        other_values,
    } = c;
    MetricComparison {
        base: base.to_string(),
        other: other.to_string(),
        metric,
        better: match better {
            orch_stats::Better::Higher => Better::Higher,
            orch_stats::Better::Lower => Better::Lower,
        },
        ratio,
        ci_low,
        ci_high,
        speedup,
        verdict: speed_verdict(verdict).into(),
        n_base,
        n_other,
        n: Some(n),
        method: Some(method_of(method)),
        confidence: Some(confidence),
        p_value: Some(p_value),
        p_adjusted,
        role: Some(match role {
            orch_stats::Role::Primary => Role::Primary,
            orch_stats::Role::Secondary => Role::Secondary,
        }),
        mde,
        precision: Some(precision),
        base_values: Some(base_values),
        other_values: Some(other_values),
        speed_verdict: None,
        gate: None,
        drift: None,
    }
}

/// Pair each variant's answers of `round` with the baseline's (the first
/// variant's, when it answered that round), from the `outputs.jsonl` the
/// load generator wrote in each round folder.
fn pair_round(variants: &mut [VariantState], out_dir: &Path, round: u32) {
    let file = |name: &str| {
        out_dir
            .join("variants")
            .join(name)
            .join(format!("round-{round}"))
            .join("outputs.jsonl")
    };
    let Some((base, rest)) = variants.split_first_mut() else {
        return;
    };
    if base.failed.is_some() {
        return;
    }
    let base_answers = lengths::read(&file(&base.name));
    if base_answers.is_empty() {
        return;
    }
    for v in rest.iter_mut().filter(|v| v.failed.is_none()) {
        let answers = lengths::read(&file(&v.name));
        v.lengths.extend(lengths::pair(&base_answers, &answers, round));
    }
}

/// Write `lengths/<variant>.json` (the judgement and every paired answer);
/// the path, or why it was not written.
fn write_lengths(out_dir: &Path, variant: &str, j: &lengths::Judgement, pairs: &[lengths::Pair]) -> String {
    let rel = format!("lengths/{variant}.json");
    let doc = json!({"variant": variant, "judgement": j, "pairs": pairs});
    let written = std::fs::create_dir_all(out_dir.join("lengths"))
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::to_string_pretty(&doc).map_err(|e| e.to_string()))
        .and_then(|t| std::fs::write(out_dir.join(&rel), t).map_err(|e| e.to_string()));
    match written {
        Ok(()) => rel,
        Err(e) => format!("not written: {e}"),
    }
}

/// Run the `check:` command in `v`'s checkout; `Err` is why it failed
/// (its output is in `output-check/<name>.log`).
fn run_check_command(
    command: &str,
    v: &VariantState,
    baseline: &VariantState,
    out_dir: &Path,
    first_round: u32,
) -> Result<(), String> {
    let dir = out_dir.join("output-check");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let round_dir = |x: &VariantState| {
        out_dir
            .join("variants")
            .join(&x.name)
            .join(format!("round-{first_round}"))
    };
    let out = Command::new("sh")
        .args(["-c", command])
        .current_dir(&v.dir)
        .env("ORCH_VARIANT", &v.name)
        .env("ORCH_VARIANT_DIR", &v.dir)
        .env("ORCH_BASELINE_DIR", &baseline.dir)
        .env("ORCH_ROUND_DIR", round_dir(v))
        .env("ORCH_BASELINE_ROUND_DIR", round_dir(baseline))
        .output()
        .map_err(|e| format!("cannot run the `check` command: {e}"))?;
    let log = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let _ = std::fs::write(dir.join(format!("{}.log", v.name)), &log);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "the `check` command failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&log).lines().last().unwrap_or("")
        ))
    }
}

/// A fresh random nonce (not from the comparison's seed, which a patch may
/// know from the manifest).
fn fresh_nonce() -> String {
    format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff)
}

/// The drift of a series of measured rounds, for `info`.
fn drift(values: &[f64]) -> Option<Drift> {
    orch_stats::trend(values, orch_stats::CONFIDENCE).map(|t| Drift {
        slope_per_round: t.slope,
        ci_low: t.ci_low,
        ci_high: t.ci_high,
        p_value: t.p_value,
        n: t.n,
    })
}

fn git(args: &[&str], dir: Option<&Path>) -> Result<String, String> {
    let mut c = Command::new("git");
    if let Some(d) = dir {
        c.arg("-C").arg(d);
    }
    let out = c
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .map_err(|e| format!("cannot run `git`: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("`git {}` failed:\n{}", args.join(" "), text.trim()))
    }
}

/// Checkout, patch, install. `Err` is the reason the variant cannot run.
fn setup(
    v: &Variant,
    repo: Option<&str>,
    worktree: Option<&str>,
    root: &Path,
    cache: Option<&Path>,
) -> Result<PathBuf, String> {
    let vdir = root.join("variants").join(&v.name);
    let src = vdir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&vdir).map_err(|e| format!("cannot create `{}`: {e}", vdir.display()))?;
    match repo {
        Some(repo) => {
            git(
                &["clone", "--quiet", "--no-checkout", repo, &src.to_string_lossy()],
                None,
            )?;
            let r = v.git_ref.as_deref().unwrap_or("HEAD");
            git(
                &["-c", "advice.detachedHead=false", "checkout", "--quiet", r],
                Some(&src),
            )?;
        }
        None => {
            std::fs::create_dir_all(&src).map_err(|e| format!("cannot create `{}`: {e}", src.display()))?
        }
    }
    // The uncommitted changes of the host's tree go on HEAD's checkouts.
    let worktree = worktree.filter(|_| repo.is_some() && v.git_ref.is_none());
    for patch in worktree.into_iter().chain(v.patch.as_deref()) {
        // `--check` first: nothing is applied unless all of it applies.
        if let Err(e) = git(&["apply", "--check", "--verbose", patch], Some(&src)) {
            // git's report, kept beside the variant's other logs.
            let _ = std::fs::write(vdir.join("patch.log"), &e);
            return Err(format!("the patch `{patch}` does not apply: {e}"));
        }
        git(&["apply", patch], Some(&src))?;
    }
    if let (Some(install), Some(cache)) = (&v.install, cache) {
        return cached_install(install, &src, &vdir, cache);
    }
    if let Some(install) = &v.install {
        install_in(install, &src, &vdir)?;
    }
    Ok(src)
}

/// `src` (checked out and patched) installed once per key in `cache`:
/// the key is the commit, the patched tree's diff and the install command.
/// The first cell with a key moves its checkout there and installs it
/// (under a lock, so two cells never install one key at once); later cells
/// run in that folder without installing. The checkout runs where it was
/// installed, so editable installs (`pip install -e .`) stay valid.
fn cached_install(install: &str, src: &Path, vdir: &Path, cache: &Path) -> Result<PathBuf, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::io::AsRawFd;
    let head = git(&["rev-parse", "HEAD"], Some(src))?;
    let diff = git(&["diff", "HEAD"], Some(src))?;
    let mut h = Sha256::new();
    for part in [head.trim(), diff.as_str(), install] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    let key: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
    std::fs::create_dir_all(cache).map_err(|e| format!("cannot create `{}`: {e}", cache.display()))?;
    let dir = cache.join(&key);
    let lock = std::fs::File::create(cache.join(format!("{key}.lock")))
        .map_err(|e| format!("cannot create the install cache's lock: {e}"))?;
    // SAFETY: flock on an open file descriptor we own; released on drop.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(format!(
            "cannot lock `{}`: {}",
            cache.display(),
            std::io::Error::last_os_error()
        ));
    }
    let done = dir.join(".orch-installed");
    if done.exists() {
        let _ = std::fs::remove_dir_all(src);
        let _ = std::fs::write(
            vdir.join("install.log"),
            format!(
                "orch: `{install}` reused: installed before in `{}` (commit {})\n",
                dir.display(),
                head.trim()
            ),
        );
        return Ok(dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::rename(src, &dir).is_err() {
        // Another filesystem: no cache, install where it is.
        let _ = std::fs::remove_dir_all(&dir);
        return install_in(install, src, vdir).map(|()| src.to_path_buf());
    }
    install_in(install, &dir, vdir)?;
    std::fs::write(&done, head.trim())
        .map_err(|e| format!("cannot mark `{}` installed: {e}", dir.display()))?;
    Ok(dir)
}

/// Run `install` in `src`, its output in `install.log`.
fn install_in(install: &str, src: &Path, vdir: &Path) -> Result<(), String> {
    let out = Command::new("sh")
        .args(["-c", install])
        .current_dir(src)
        .output()
        .map_err(|e| format!("cannot run the install command: {e}"))?;
    let log = [out.stdout.as_slice(), out.stderr.as_slice()].concat();
    let _ = std::fs::write(vdir.join("install.log"), &log);
    if !out.status.success() {
        return Err(format!(
            "the install command failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&log).lines().last().unwrap_or("")
        ));
    }
    Ok(())
}

/// Per-metric values of two variants over the rounds both measured, in
/// round order (round `i` of both ran in the same block).
fn paired(a: &VariantState, b: &VariantState) -> BTreeMap<String, (Vec<f64>, Vec<f64>)> {
    let mut out: BTreeMap<String, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for (ra, rb) in a.rounds.iter().zip(&b.rounds) {
        for (k, va) in ra {
            if let Some(vb) = rb.get(k) {
                let e = out.entry(k.clone()).or_default();
                e.0.push(*va);
                e.1.push(*vb);
            }
        }
    }
    out
}

/// Why the rounds stopped.
fn should_stop(
    cmp: &CompareWorkload,
    variants: &[VariantState],
    primary: Option<&str>,
    measured: u32,
    elapsed_s: f64,
    round_s: f64,
    timeout_s: f64,
) -> Option<StoppedBy> {
    let Some(max) = cmp.max_rounds else {
        return (measured >= cmp.rounds).then_some(StoppedBy::Rounds);
    };
    if measured >= max {
        return Some(StoppedBy::MaxRounds);
    }
    if measured >= cmp.rounds {
        if let Some(p) = primary {
            let live: Vec<&VariantState> = variants.iter().filter(|v| v.failed.is_none()).collect();
            let precise = live.iter().enumerate().all(|(i, a)| {
                live.iter().skip(i + 1).all(|b| {
                    let v = paired(a, b);
                    v.get(p)
                        .and_then(|(x, y)| orch_stats::precision(x, y, orch_stats::CONFIDENCE))
                        .is_some_and(|h| h <= cmp.noise)
                })
            });
            if precise {
                return Some(StoppedBy::Precision);
            }
        }
    }
    // Another round (with a margin for its spread and the teardown) must
    // fit before the host's timeout stops the cell.
    (elapsed_s + 1.5 * round_s + 5.0 > timeout_s).then_some(StoppedBy::Timeout)
}

fn default_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What every phase of a comparison reads: the workload, the cell's task,
/// the cell folder, and the load generator when it is the client.
struct Comparison<'a> {
    cmp: &'a CompareWorkload,
    task: &'a TaskSpec,
    out_dir: &'a Path,
    loadgen: Option<&'a LoadGen>,
}

impl Comparison<'_> {
    /// The defences that read the load generator's answers are on.
    fn defended(&self) -> bool {
        self.cmp.defences && self.loadgen.is_some()
    }
}

/// The rounds so far: warm-up, then measured rounds, until a stop.
struct RoundsSoFar<'a> {
    rng: rand::rngs::StdRng,
    /// The output check, asked in the first round (its answers, as they come).
    check: Option<CheckPlan<'a>>,
    /// Each round's order of the variants' names, and each round's nonce.
    orders: Vec<Vec<String>>,
    nonces: Vec<String>,
    /// The metric the verdicts go by (the suite's, else chosen from the
    /// first round's), and why the rounds do not report it.
    primary: Option<String>,
    primary_missing: Option<String>,
    /// Each round's wall time.
    round_s: Vec<f64>,
    /// Rounds run so far, warm-up ones included.
    round: u32,
    /// Warm-up rounds run so far, whether warm-up goes on, and why it ended.
    warmed: u32,
    warming: bool,
    warmup_stopped_by: Option<WarmupStop>,
    /// `/N` or ` (auto, at most N)`: the progress labels' limits.
    limit: String,
    warm_limit: String,
}

/// One round about to run.
struct Round {
    index: u32,
    warm: bool,
    /// `warm-up round 2/3`, `round 4 (auto, at most 20)`.
    label: String,
    /// The round's nonce (the same for every variant of the round).
    nonce: Option<String>,
}

/// A comparison, in its phases: the variants set up, the output check
/// planned, the rounds (warm-up, then measured), the answers' lengths
/// judged, flags turned into gates, then the verdicts.
pub fn run(cmp: &CompareWorkload, task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    let mut variants = setup_variants(cmp, out_dir, ctx);
    let loadgen = match &cmp.server.client {
        Some(Client::Loadgen(lg)) => Some(lg),
        _ => None,
    };
    let c = Comparison {
        cmp,
        task,
        out_dir,
        loadgen,
    };
    let (check_info, check) = plan_output_check(&c, variants.len());
    let seed = cmp.seed.unwrap_or_else(default_seed);
    let (rounds, stopped_by) = run_rounds(&c, &mut variants, check, seed, ctx);
    ctx.enter(Phase::Teardown);
    let measured = rounds.round.saturating_sub(rounds.warmed);
    ctx.message(format!("{measured} measured rounds; stopped by {stopped_by}"));
    let length_info = judge_lengths(&c, &mut variants, ctx);
    gate_flagged(&mut variants);
    verdicts(
        &c,
        &variants,
        Ended {
            rounds,
            stopped_by,
            seed,
            check_info,
            length_info,
        },
        ctx,
    )
}

/// Each variant checked out, patched and installed ([`setup`]); one that
/// cannot be is failed, and the others go on.
fn setup_variants(cmp: &CompareWorkload, out_dir: &Path, ctx: &mut Ctx) -> Vec<VariantState> {
    let mut variants: Vec<VariantState> = Vec::new();
    for v in &cmp.variants {
        ctx.message(format!("setting up variant `{}`", v.name));
        let (dir, failed) = match setup(
            v,
            cmp.repo.as_deref(),
            cmp.worktree_patch.as_deref(),
            out_dir,
            cmp.install_cache.as_deref().map(Path::new),
        ) {
            Ok(d) => (d, None),
            Err(e) => {
                ctx.message(format!("variant `{}` failed: {e}", v.name));
                (PathBuf::new(), Some(e))
            }
        };
        variants.push(VariantState {
            name: v.name.clone(),
            dir,
            failed,
            rounds: vec![],
            warm: vec![],
            flags: vec![],
            gate: None,
            check: None,
            lengths: Vec::new(),
        });
    }
    variants
}

/// The output check, as `info.output_check` records it, and its plan when
/// it is asked. It rides on the first round: each variant's server, once
/// ready, answers the check's prompts before the round's load (no server
/// start of its own); the answers are judged against the baseline's once
/// every variant has run that round.
fn plan_output_check<'a>(
    c: &Comparison<'a>,
    variants: usize,
) -> (Option<CheckPlanInfo>, Option<CheckPlan<'a>>) {
    let Some(check) = &c.cmp.output_check else {
        return (None, None);
    };
    let Some(lg) = c.loadgen else {
        let info = CheckPlanInfo::Skipped {
            why: "the client is not the load generator; a `check:` command checks a command client's outputs"
                .into(),
        };
        return (Some(info), None);
    };
    let nonce = c.cmp.defences.then(fresh_nonce);
    let prompts = outcheck::prompts(check.prompts, nonce.as_deref());
    let tok = crate::tokens::load(
        lg.tokenizer.as_deref(),
        lg.model.as_deref(),
        c.task.weights_dir.as_deref(),
    )
    .ok()
    .flatten();
    // Asked at the longest answer the timed load asks for, so a
    // patch that cuts long answers only is seen here too.
    let longest = crate::loadgen::longest_output(lg, tok.as_ref());
    let check = OutputCheck {
        max_tokens: check.max_tokens.max(longest),
        ..check.clone()
    };
    let info = CheckPlanInfo::Ran {
        prompts: check.prompts,
        max_tokens: check.max_tokens,
        rule: match check.min_match_prefix {
            Some(n) => MatchRule::Prefix(n),
            None => MatchRule::Exact,
        },
        unit: if tok.is_some() { "tokens" } else { "words" }.into(),
        nonce,
        when: Some("first round, before its load".into()),
    };
    let plan = CheckPlan {
        check,
        lg,
        prompts,
        tok,
        answers: vec![None; variants],
    };
    (Some(info), Some(plan))
}

/// The rounds, warm-up then measured, each running every live variant once
/// in a shuffled order, until a stop ([`RoundsSoFar::next`]); the rounds' state
/// and why they stopped.
fn run_rounds<'a>(
    c: &Comparison<'a>,
    variants: &mut [VariantState],
    check: Option<CheckPlan<'a>>,
    seed: u64,
    ctx: &mut Ctx,
) -> (RoundsSoFar<'a>, StoppedBy) {
    let cmp = c.cmp;
    let mut s = RoundsSoFar {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        check,
        orders: Vec::new(),
        nonces: Vec::new(),
        primary: cmp.primary_metric.clone(),
        primary_missing: None,
        round_s: Vec::new(),
        round: 0,
        warmed: 0,
        warming: cmp.warmup_rounds > 0 || cmp.max_warmup_rounds.is_some(),
        warmup_stopped_by: None,
        limit: match cmp.max_rounds {
            Some(m) => format!(" (auto, at most {m})"),
            None => format!("/{}", cmp.rounds),
        },
        warm_limit: match cmp.max_warmup_rounds {
            Some(m) => format!(" (auto, at most {m})"),
            None => format!("/{}", cmp.warmup_rounds),
        },
    };
    let stopped_by = loop {
        let (round, order) = match s.next(c, variants, ctx) {
            Ok(next) => next,
            Err(why) => break why,
        };
        let t0 = Instant::now();
        for idx in order {
            if ctx.stop_requested() {
                break;
            }
            if !measure(c, &mut s, &round, &mut variants[idx], idx, ctx) {
                break;
            }
        }
        s.round_s.push(t0.elapsed().as_secs_f64());
        after_round(c, &mut s, variants, ctx);
        s.round += 1;
        if round.warm {
            s.end_warmup_round(cmp, variants, ctx);
        }
    };
    (s, stopped_by)
}

impl RoundsSoFar<'_> {
    /// The next round and its variants in their shuffled order (recorded,
    /// with its nonce), or why the rounds stop: a cancel, fewer than two
    /// live variants, a primary metric the rounds do not report, or (once
    /// warm) [`should_stop`].
    fn next(
        &mut self,
        c: &Comparison,
        variants: &[VariantState],
        ctx: &Ctx,
    ) -> Result<(Round, Vec<usize>), StoppedBy> {
        if ctx.stop_requested() {
            return Err(StoppedBy::Cancelled);
        }
        let live: Vec<usize> = (0..variants.len())
            .filter(|&i| variants[i].failed.is_none())
            .collect();
        if live.len() < 2 {
            return Err(StoppedBy::VariantsFailed);
        }
        if self.primary_missing.is_some() {
            return Err(StoppedBy::PrimaryMetricMissing);
        }
        let warm = self.warming;
        if !warm {
            let mean_round = self.round_s.iter().sum::<f64>() / self.round_s.len().max(1) as f64;
            if let Some(why) = should_stop(
                c.cmp,
                variants,
                self.primary.as_deref(),
                self.round - self.warmed,
                ctx.elapsed(),
                mean_round,
                c.task.measure.timeout_s,
            ) {
                return Err(why);
            }
        }
        let mut order = live;
        order.shuffle(&mut self.rng);
        self.orders
            .push(order.iter().map(|&i| variants[i].name.clone()).collect());
        let round = self.round;
        // One nonce per round, the same for every variant: rounds stay paired.
        let nonce = c.defended().then(|| format!("{}-r{round}", fresh_nonce()));
        if let Some(n) = &nonce {
            self.nonces.push(n.clone());
        }
        let label = if warm {
            format!("warm-up round {}{}", self.warmed + 1, self.warm_limit)
        } else {
            format!("round {}{}", round - self.warmed + 1, self.limit)
        };
        let round = Round {
            index: round,
            warm,
            label,
            nonce,
        };
        Ok((round, order))
    }

    /// After a warm-up round: whether warm-up goes on (a fixed count, or
    /// `warmup_rounds: auto` until every live variant is steady or
    /// `max_warmup_rounds`), and why it ended.
    fn end_warmup_round(&mut self, cmp: &CompareWorkload, variants: &[VariantState], ctx: &mut Ctx) {
        self.warmed += 1;
        let warmed = self.warmed;
        self.warming = match cmp.max_warmup_rounds {
            None => warmed < cmp.warmup_rounds,
            Some(max) => {
                let steady = || {
                    variants.iter().filter(|v| v.failed.is_none()).all(|v| {
                        orch_stats::steady(&v.warm, cmp.noise / 2.0, orch_stats::CONFIDENCE).unwrap_or(false)
                    })
                };
                if warmed >= max {
                    self.warmup_stopped_by = Some(WarmupStop::MaxWarmupRounds);
                    false
                } else if warmed >= cmp.warmup_rounds && steady() {
                    self.warmup_stopped_by = Some(WarmupStop::Steady);
                    false
                } else {
                    true
                }
            }
        };
        if !self.warming {
            if let Some(why) = self.warmup_stopped_by {
                ctx.message(format!("warm-up ended after {warmed} rounds: {why}"));
            }
        }
    }
}

/// Variant `v` (index `idx`) in `round`: its server run ([`serve`]), its
/// metrics kept (a warm-up round keeps the primary metric only), the
/// defences' flags raised. `false`: the rounds do not report the primary
/// metric, and the round stops.
fn measure(
    c: &Comparison,
    s: &mut RoundsSoFar,
    round: &Round,
    v: &mut VariantState,
    idx: usize,
    ctx: &mut Ctx,
) -> bool {
    let Some(r) = serve(c, s, round, v, idx, ctx) else {
        return true;
    };
    match &s.primary {
        None => s.primary = orch_stats::default_primary(r.metrics.keys().map(String::as_str)),
        Some(p) if !r.metrics.contains_key(p) => {
            s.primary_missing = Some(format!(
                "the primary metric `{p}` is not among the metrics the rounds report ({}); hint: set `primary_metric` to one of them",
                r.metrics.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            return false;
        }
        Some(_) => {}
    }
    let label = &round.label;
    let mut keys: Vec<&str> = s.primary.iter().map(String::as_str).collect();
    for k in ["mean_ttft_ms", "median_itl_ms"] {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let headline: Vec<String> = keys
        .iter()
        .filter_map(|k| r.metrics.get(*k).map(|x| format!("{k}={x:.2}")))
        .collect();
    ctx.message(format!(
        "{label} {}: {}",
        v.name,
        if headline.is_empty() {
            "done".to_string()
        } else {
            headline.join(" ")
        }
    ));
    // The defences look at every round, warm-up included.
    if c.defended() {
        for (metric, flag, raised) in FLAG_METRICS {
            if r.metrics.get(*metric).is_some_and(|x| raised(*x)) && !v.flags.iter().any(|f| f == flag) {
                ctx.message(format!(
                    "variant `{}` flagged: `{metric}` = {} in {label}",
                    v.name, r.metrics[*metric]
                ));
                v.flags.push(flag.to_string());
            }
        }
    }
    if round.warm {
        if let Some(x) = s.primary.as_deref().and_then(|p| r.metrics.get(p)) {
            v.warm.push(*x);
        }
    } else {
        v.rounds.push(r.metrics);
    }
    true
}

/// Variant `v`'s server started, loaded and stopped for `round`
/// ([`crate::server::run_with`]) in `variants/<name>/round-<n>/`; in the
/// first round its server also answers the output check, once ready. The
/// server's result, or `None` when the variant failed (`v.failed` says why).
fn serve(
    c: &Comparison,
    s: &mut RoundsSoFar,
    round: &Round,
    v: &mut VariantState,
    idx: usize,
    ctx: &mut Ctx,
) -> Option<CellResult> {
    let (label, index) = (&round.label, round.index);
    let rdir = c
        .out_dir
        .join("variants")
        .join(&v.name)
        .join(format!("round-{index}"));
    if let Err(e) = std::fs::create_dir_all(&rdir) {
        v.failed = Some(format!("cannot create `{}`: {e}", rdir.display()));
        return None;
    }
    let mut srv = server_of(c.cmp, v);
    if let (Some(n), Some(Client::Loadgen(lg))) = (&round.nonce, &srv.client) {
        srv.client = Some(Client::Loadgen(with_nonce(lg, n, index)));
    }
    ctx.message(format!("{label}: {}", v.name));
    let r = match s.check.as_mut().filter(|_| index == 0) {
        Some(plan) => {
            let (lg, check, prompts) = (plan.lg, &plan.check, &plan.prompts);
            let mut got: Option<Vec<outcheck::Answer>> = None;
            let mut ask = |url: &str| got = Some(outcheck::ask(url, lg, check, prompts));
            let r = crate::server::run_with(&srv, c.task, &rdir, ctx, Some(&mut ask));
            plan.answers[idx] = got;
            r
        }
        None => crate::server::run(&srv, c.task, &rdir, ctx),
    };
    if r.status != Status::Succeeded {
        let why = r
            .failure
            .map(|f| f.message)
            .unwrap_or_else(|| r.status.to_string());
        ctx.message(format!("variant `{}` failed in {label}: {why}", v.name));
        v.failed = Some(format!("round {}: {why}", index + 1));
        return None;
    }
    Some(r)
}

/// Once every variant has run a round: its answers paired with the
/// baseline's; after the first round, the output check's answers judged
/// and the `check:` command run.
fn after_round(c: &Comparison, s: &mut RoundsSoFar, variants: &mut [VariantState], ctx: &mut Ctx) {
    let round = s.round;
    // Every variant's answers this round, paired with the baseline's.
    if c.defended() {
        pair_round(variants, c.out_dir, round);
    }
    // The output check's answers, judged against the baseline's (the
    // first variant that answered), once every variant has run round 0.
    if round == 0 {
        if let Some(plan) = s.check.as_mut() {
            judge_output_check(plan, variants, c.out_dir, ctx);
        }
    }
    // The `check:` command, once every variant has run its first round.
    if round == 0 {
        if let Some(command) = &c.cmp.check {
            check_commands(command, variants, c.out_dir, round, ctx);
        }
    }
}

/// The `check:` command run in every live variant's checkout (none when
/// the baseline failed); a failure gates the variant `output_mismatch`.
fn check_commands(command: &str, variants: &mut [VariantState], out_dir: &Path, round: u32, ctx: &mut Ctx) {
    let base = &variants[0];
    let results: Vec<(usize, Result<(), String>)> = (0..variants.len())
        .filter(|&i| variants[i].failed.is_none() && base.failed.is_none())
        .map(|i| (i, run_check_command(command, &variants[i], base, out_dir, round)))
        .collect();
    for (i, res) in results {
        let v = &mut variants[i];
        let log = format!("output-check/{}.log", v.name);
        match res {
            Ok(()) => {
                v.check = Some(VariantCheck::Command(CommandCheck {
                    status: CheckStatus::Passed,
                    command: command.to_string(),
                    log,
                    why: None,
                }))
            }
            Err(why) => {
                ctx.message(format!("variant `{}`: output_mismatch: {why}", v.name));
                v.gate = Some(Gate {
                    kind: GateKind::OutputMismatch,
                    why: format!("{why} (`{log}`)"),
                });
                v.check = Some(VariantCheck::Command(CommandCheck {
                    status: CheckStatus::OutputMismatch,
                    command: command.to_string(),
                    log,
                    why: Some(why),
                }));
            }
        }
    }
}

/// The answers' lengths against the baseline's, over every round
/// ([`lengths::judge`]): each variant's flags raised, its evidence in
/// `lengths/<name>.json`, and its entry by name.
fn judge_lengths(c: &Comparison, variants: &mut [VariantState], ctx: &mut Ctx) -> BTreeMap<String, Lengths> {
    let mut length_info: BTreeMap<String, Lengths> = BTreeMap::new();
    if !c.defended() {
        return length_info;
    }
    for v in variants.iter_mut().skip(1) {
        if v.lengths.is_empty() {
            continue;
        }
        let j = lengths::judge(&v.lengths, c.cmp.noise);
        let evidence = write_lengths(c.out_dir, &v.name, &j, &v.lengths);
        for (flag, why) in &j.flags {
            ctx.message(format!("variant `{}` flagged: `{flag}`: {why}", v.name));
            if !v.flags.contains(flag) {
                v.flags.push(flag.clone());
            }
        }
        length_info.insert(v.name.clone(), lengths_entry(j, evidence));
    }
    length_info
}

/// Flags gate a variant that passed its output check, where the baseline
/// (the reference) does not show them too: a server that always answers
/// alike, or never honours `ignore_eos`, is what is compared, not a patch.
fn gate_flagged(variants: &mut [VariantState]) {
    for v in variants.iter_mut() {
        v.flags.sort();
    }
    let base_flags = variants.first().map(|v| v.flags.clone()).unwrap_or_default();
    for v in variants.iter_mut().skip(1) {
        let own: Vec<&String> = v.flags.iter().filter(|f| !base_flags.contains(f)).collect();
        if v.gate.is_none() && !own.is_empty() {
            let own: Vec<&str> = own.iter().map(|f| f.as_str()).collect();
            v.gate = Some(Gate {
                kind: GateKind::Flagged,
                why: format!(
                    "its rounds were flagged by the defences (the baseline's were not): {}",
                    own.join(", ")
                ),
            });
        }
    }
}

/// What the rounds and the judgements after them leave for the verdicts.
struct Ended<'a> {
    rounds: RoundsSoFar<'a>,
    stopped_by: StoppedBy,
    seed: u64,
    check_info: Option<CheckPlanInfo>,
    length_info: BTreeMap<String, Lengths>,
}

/// The cell's result: each variant's means as metrics, `info` (every
/// variant's entry, every pair compared, how the rounds went), and its
/// status: cancelled, `invalid_config` (no primary metric), `variant_failed`,
/// else succeeded.
fn verdicts(c: &Comparison, variants: &[VariantState], ended: Ended, ctx: &Ctx) -> CellResult {
    let cmp = c.cmp;
    let Ended {
        rounds,
        stopped_by,
        seed,
        check_info,
        mut length_info,
    } = ended;
    let primary = rounds.primary.as_deref();
    let mut result = CellResult::new(c.task.cell_id.as_str(), Status::Succeeded);
    let (entries, drifts) = variant_entries(variants, primary, &mut length_info, &mut result);
    let (comparisons, pairs) = match primary.filter(|_| rounds.primary_missing.is_none()) {
        Some(p) => compare_pairs(cmp, variants, p, seed, &drifts),
        None => (Vec::new(), Vec::new()),
    };
    CompareInfo {
        variants: entries,
        comparison: comparisons,
        pairs,
        rounds: rounds.round.saturating_sub(rounds.warmed),
        rounds_requested: Some(match cmp.max_rounds {
            Some(_) => Rounds::Auto,
            None => Rounds::Fixed(cmp.rounds),
        }),
        max_rounds: cmp.max_rounds,
        stopped_by: Some(stopped_by),
        warmup_rounds: rounds.warmed,
        warmup_rounds_requested: cmp.max_warmup_rounds.map(|_| Rounds::Auto),
        max_warmup_rounds: cmp.max_warmup_rounds,
        warmup_stopped_by: cmp.max_warmup_rounds.map(|_| rounds.warmup_stopped_by),
        output_check: check_info,
        defences: cmp.defences,
        nonces: rounds.nonces,
        noise: cmp.noise,
        primary_metric: rounds.primary.clone(),
        method: Some(method_of(orch_stats::Method::StudentT)),
        confidence: Some(orch_stats::CONFIDENCE),
        seed: Some(seed),
        order: rounds.orders,
    }
    .write_into(&mut result.info);
    let failed: Vec<String> = variants
        .iter()
        .filter_map(|v| v.failed.as_ref().map(|f| format!("`{}`: {f}", v.name)))
        .collect();
    if ctx.stop_requested() {
        result.status = Status::Cancelled;
        result.failure = Some(Failure::new(FailureKind::Cancelled, "stopped on request"));
    } else if let Some(why) = rounds.primary_missing {
        result.status = Status::Failed;
        result.failure = Some(Failure::new(FailureKind::InvalidConfig, why));
    } else if !failed.is_empty() {
        result.status = Status::Failed;
        result.failure = Some(Failure::new(FailureKind::VariantFailed, failed.join("; ")));
    }
    result
}

/// Each variant's entry of `info.variants` and its means (`<name>.<metric>`
/// into `result`'s metrics), with the drift of its primary metric.
fn variant_entries(
    variants: &[VariantState],
    primary: Option<&str>,
    length_info: &mut BTreeMap<String, Lengths>,
    result: &mut CellResult,
) -> (BTreeMap<String, VariantEntry>, BTreeMap<String, Option<Drift>>) {
    let mut entries: BTreeMap<String, VariantEntry> = BTreeMap::new();
    let mut drifts: BTreeMap<String, Option<Drift>> = BTreeMap::new();
    for v in variants {
        let mut names: Vec<&String> = v.rounds.iter().flat_map(|r| r.keys()).collect();
        names.sort();
        names.dedup();
        let mut values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut d = None;
        for k in names {
            let vals: Vec<f64> = v.rounds.iter().filter_map(|r| r.get(k).copied()).collect();
            let mean = vals.iter().sum::<f64>() / vals.len().max(1) as f64;
            result.metrics.insert(format!("{}.{k}", v.name), mean);
            if primary == Some(k.as_str()) {
                d = drift(&vals);
                values.insert(k.clone(), vals);
            }
        }
        drifts.insert(v.name.clone(), d);
        entries.insert(
            v.name.clone(),
            VariantEntry {
                status: if v.failed.is_some() {
                    Status::Failed
                } else {
                    Status::Succeeded
                },
                failure: v.failed.clone(),
                rounds: v.rounds.len(),
                values,
                warmup_values: v.warm.clone(),
                drift: d,
                output_check: v.check.clone(),
                flags: v.flags.clone(),
                lengths: length_info.remove(&v.name),
                gate: v.gate.clone(),
                logs: format!("variants/{}", v.name),
                diagnosis: None,
            },
        );
    }
    (entries, drifts)
}

/// Every pair of variants that both measured compared on every metric
/// (`orch_stats::compare_pair`) into `info.comparison`, and on the primary
/// metric into `info.pairs`; a gated pair's verdict is its gate's.
fn compare_pairs(
    cmp: &CompareWorkload,
    variants: &[VariantState],
    primary: &str,
    seed: u64,
    drifts: &BTreeMap<String, Option<Drift>>,
) -> (Vec<MetricComparison>, Vec<Pair>) {
    let gate_of = |name: &str| {
        variants
            .iter()
            .find(|v| v.name == name)
            .and_then(|v| v.gate.clone())
    };
    // The gate of a pair: the other's, else the base's; `output_mismatch` first.
    let pair_gate = |a: &str, b: &str| -> Option<PairGate> {
        let mut gs: Vec<PairGate> = [b, a]
            .iter()
            .filter_map(|n| {
                gate_of(n).map(|g| PairGate {
                    kind: g.kind,
                    variant: n.to_string(),
                    why: g.why,
                })
            })
            .collect();
        gs.sort_by_key(|g| g.kind != GateKind::OutputMismatch);
        gs.into_iter().next()
    };
    let drift_of = |name: &str| drifts.get(name).copied().flatten();
    let mut comparisons = Vec::new();
    let mut pairs = Vec::new();
    let opts = Options {
        seed,
        ..Options::new(cmp.noise)
    };
    for (i, a) in variants.iter().enumerate() {
        for b in variants.iter().skip(i + 1) {
            if a.failed.is_some() || b.failed.is_some() || a.rounds.is_empty() || b.rounds.is_empty() {
                continue;
            }
            let gate = pair_gate(&a.name, &b.name);
            for c in orch_stats::compare_pair(&paired(a, b), primary, &opts) {
                let (n, method, speed) = (c.n, method_of(c.method), speed_verdict(c.verdict));
                let mut m = metric_comparison(c, &a.name, &b.name);
                if let Some(g) = &gate {
                    // The speed stays; the verdict is the gate's.
                    m.speed_verdict = Some(speed);
                    m.verdict = g.kind.into();
                    m.gate = Some(g.clone());
                }
                if m.is_primary() {
                    let drift = PairDrift {
                        base: drift_of(&a.name),
                        other: drift_of(&b.name),
                    };
                    pairs.push(Pair {
                        base: a.name.clone(),
                        other: b.name.clone(),
                        metric: m.metric.clone(),
                        verdict: m.verdict,
                        speedup: m.speedup,
                        ci_low: m.ci_low,
                        ci_high: m.ci_high,
                        n,
                        mde: m.mde,
                        method,
                        drift,
                        speed_verdict: m.speed_verdict,
                        gate: m.gate.clone(),
                    });
                    m.drift = Some(drift);
                }
                comparisons.push(m);
            }
        }
    }
    (comparisons, pairs)
}
