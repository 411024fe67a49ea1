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

use crate::ctx::Ctx;
use orch_protocol::{CellResult, CompareWorkload, Failure, Phase, Status, TaskSpec, Variant};
use orch_stats::Options;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct VariantState {
    name: String,
    dir: PathBuf,
    failed: Option<String>,
    rounds: Vec<BTreeMap<String, f64>>,
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
fn setup(v: &Variant, repo: Option<&str>, worktree: Option<&str>, root: &Path) -> Result<PathBuf, String> {
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
    if let Some(install) = &v.install {
        let out = Command::new("sh")
            .args(["-c", install])
            .current_dir(&src)
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
    }
    Ok(src)
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
) -> Option<&'static str> {
    let Some(max) = cmp.max_rounds else {
        return (measured >= cmp.rounds).then_some("rounds");
    };
    if measured >= max {
        return Some("max_rounds");
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
                return Some("precision");
            }
        }
    }
    // Another round (with a margin for its spread and the teardown) must
    // fit before the host's timeout stops the cell.
    (elapsed_s + 1.5 * round_s + 5.0 > timeout_s).then_some("timeout")
}

fn default_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn run(cmp: &CompareWorkload, task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let mut variants: Vec<VariantState> = Vec::new();
    for v in &cmp.variants {
        ctx.message(format!("setting up variant `{}`", v.name));
        let (dir, failed) = match setup(v, cmp.repo.as_deref(), cmp.worktree_patch.as_deref(), out_dir) {
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
        });
    }

    let seed = cmp.seed.unwrap_or_else(default_seed);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut orders: Vec<Vec<String>> = Vec::new();
    let mut primary: Option<String> = cmp.primary_metric.clone();
    let mut primary_missing: Option<String> = None;
    let mut round_s: Vec<f64> = Vec::new();
    let mut round: u32 = 0;
    let limit = match cmp.max_rounds {
        Some(m) => format!(" (auto, at most {m})"),
        None => format!("/{}", cmp.rounds),
    };
    let stopped_by = loop {
        if ctx.stop_requested() {
            break "cancelled";
        }
        let live: Vec<usize> = (0..variants.len())
            .filter(|&i| variants[i].failed.is_none())
            .collect();
        if live.len() < 2 {
            break "variants_failed";
        }
        if primary_missing.is_some() {
            break "primary_metric_missing";
        }
        let warm = round < cmp.warmup_rounds;
        if !warm {
            let mean_round = round_s.iter().sum::<f64>() / round_s.len().max(1) as f64;
            if let Some(why) = should_stop(
                cmp,
                &variants,
                primary.as_deref(),
                round - cmp.warmup_rounds,
                ctx.elapsed(),
                mean_round,
                task.measure.timeout_s,
            ) {
                break why;
            }
        }
        let mut order = live;
        order.shuffle(&mut rng);
        orders.push(order.iter().map(|&i| variants[i].name.clone()).collect());
        let label = if warm {
            format!("warm-up round {}/{}", round + 1, cmp.warmup_rounds)
        } else {
            format!("round {}{limit}", round - cmp.warmup_rounds + 1)
        };
        let t0 = Instant::now();
        for idx in order {
            if ctx.stop_requested() {
                break;
            }
            let v = &mut variants[idx];
            let rdir = out_dir
                .join("variants")
                .join(&v.name)
                .join(format!("round-{round}"));
            if let Err(e) = std::fs::create_dir_all(&rdir) {
                v.failed = Some(format!("cannot create `{}`: {e}", rdir.display()));
                continue;
            }
            let mut srv = cmp.server.clone();
            srv.workdir = Some(match &srv.workdir {
                Some(w) if Path::new(w).is_absolute() => w.clone(),
                Some(w) => v.dir.join(w).to_string_lossy().into_owned(),
                None => v.dir.to_string_lossy().into_owned(),
            });
            ctx.message(format!("{label}: {}", v.name));
            let r = crate::server::run(&srv, task, &rdir, ctx);
            if r.status != Status::Succeeded {
                let why = r
                    .failure
                    .map(|f| f.message)
                    .unwrap_or_else(|| r.status.to_string());
                ctx.message(format!("variant `{}` failed in {label}: {why}", v.name));
                v.failed = Some(format!("round {}: {why}", round + 1));
                continue;
            }
            match &primary {
                None => primary = orch_stats::default_primary(r.metrics.keys().map(String::as_str)),
                Some(p) if !r.metrics.contains_key(p) => {
                    primary_missing = Some(format!(
                        "the primary metric `{p}` is not among the metrics the rounds report ({}); hint: set `primary_metric` to one of them",
                        r.metrics.keys().cloned().collect::<Vec<_>>().join(", ")
                    ));
                    break;
                }
                Some(_) => {}
            }
            let mut keys: Vec<&str> = primary.iter().map(String::as_str).collect();
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
            if !warm {
                v.rounds.push(r.metrics);
            }
        }
        round_s.push(t0.elapsed().as_secs_f64());
        round += 1;
    };
    ctx.enter(Phase::Teardown);
    let measured = round.saturating_sub(cmp.warmup_rounds);
    ctx.message(format!("{measured} measured rounds; stopped by {stopped_by}"));

    // Means per variant, and every pair compared.
    let mut result = CellResult::new(cell, Status::Succeeded);
    let mut info_variants = serde_json::Map::new();
    for v in &variants {
        let mut names: Vec<&String> = v.rounds.iter().flat_map(|r| r.keys()).collect();
        names.sort();
        names.dedup();
        let mut values = serde_json::Map::new();
        for k in names {
            let vals: Vec<f64> = v.rounds.iter().filter_map(|r| r.get(k).copied()).collect();
            let mean = vals.iter().sum::<f64>() / vals.len().max(1) as f64;
            result.metrics.insert(format!("{}.{k}", v.name), mean);
            if primary.as_deref() == Some(k.as_str()) {
                values.insert(k.clone(), json!(vals));
            }
        }
        info_variants.insert(
            v.name.clone(),
            json!({
                "status": if v.failed.is_some() { "failed" } else { "succeeded" },
                "failure": v.failed,
                "rounds": v.rounds.len(),
                "values": values,
                "logs": format!("variants/{}", v.name),
            }),
        );
    }
    let mut comparisons = Vec::new();
    let mut pairs = Vec::new();
    if let Some(p) = primary.as_deref().filter(|_| primary_missing.is_none()) {
        let opts = Options {
            seed,
            ..Options::new(cmp.noise)
        };
        for (i, a) in variants.iter().enumerate() {
            for b in variants.iter().skip(i + 1) {
                if a.failed.is_some() || b.failed.is_some() || a.rounds.is_empty() || b.rounds.is_empty() {
                    continue;
                }
                for c in orch_stats::compare_pair(&paired(a, b), p, &opts) {
                    let mut v = serde_json::to_value(&c).unwrap_or(Value::Null);
                    v["base"] = json!(a.name);
                    v["other"] = json!(b.name);
                    if c.role == orch_stats::Role::Primary {
                        pairs.push(json!({
                            "base": a.name,
                            "other": b.name,
                            "metric": c.metric,
                            "verdict": c.verdict,
                            "speedup": c.speedup,
                            "ci_low": c.ci_low,
                            "ci_high": c.ci_high,
                            "n": c.n,
                            "mde": c.mde,
                            "method": c.method,
                        }));
                    }
                    comparisons.push(v);
                }
            }
        }
    }
    result
        .info
        .insert("variants".into(), Value::Object(info_variants));
    result.info.insert("comparison".into(), Value::Array(comparisons));
    result.info.insert("pairs".into(), Value::Array(pairs));
    result.info.insert("rounds".into(), json!(measured));
    result.info.insert(
        "rounds_requested".into(),
        match cmp.max_rounds {
            Some(_) => json!("auto"),
            None => json!(cmp.rounds),
        },
    );
    if let Some(m) = cmp.max_rounds {
        result.info.insert("max_rounds".into(), json!(m));
    }
    result.info.insert("stopped_by".into(), json!(stopped_by));
    result
        .info
        .insert("warmup_rounds".into(), json!(cmp.warmup_rounds));
    result.info.insert("noise".into(), json!(cmp.noise));
    result.info.insert("primary_metric".into(), json!(primary));
    result
        .info
        .insert("method".into(), json!(orch_stats::Method::StudentT));
    result
        .info
        .insert("confidence".into(), json!(orch_stats::CONFIDENCE));
    result.info.insert("seed".into(), json!(seed));
    result.info.insert("order".into(), json!(orders));
    let failed: Vec<String> = variants
        .iter()
        .filter_map(|v| v.failed.as_ref().map(|f| format!("`{}`: {f}", v.name)))
        .collect();
    if ctx.stop_requested() {
        result.status = Status::Cancelled;
        result.failure = Some(Failure::new("cancelled", "stopped on request"));
    } else if let Some(why) = primary_missing {
        result.status = Status::Failed;
        result.failure = Some(Failure::new("invalid_config", why));
    } else if !failed.is_empty() {
        result.status = Status::Failed;
        result.failure = Some(Failure::new("variant_failed", failed.join("; ")));
    }
    result
}
