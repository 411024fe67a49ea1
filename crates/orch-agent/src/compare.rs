//! The `compare` workload: variants of one server (baseline, human patch,
//! agent patch, ...) set up side by side, then run in interleaved rounds
//! (B H A, B H A, ...) after warm-up rounds, so drift hits all alike.
//!
//! Per variant: a checkout of the repository at its ref, its patch applied
//! with `git apply` (a patch that does not apply fails that variant, with
//! git's report of the rejected hunks, before any server starts), its install
//! command. Per round: the server workload (start, readiness, client,
//! teardown) in `variants/<name>/round-<n>/`. A variant that fails is
//! reported failed; the others go on. At the end every pair is compared per
//! metric (ratio, bootstrap 95% interval, verdict) into `info.comparison`.

use crate::ctx::Ctx;
use orch_protocol::{CellResult, CompareWorkload, Failure, Phase, Status, TaskSpec, Variant};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

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
fn setup(v: &Variant, repo: Option<&str>, root: &Path) -> Result<PathBuf, String> {
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
    if let Some(patch) = &v.patch {
        // `--check` first: nothing is applied unless all of it applies.
        git(&["apply", "--check", "--verbose", patch], Some(&src))
            .map_err(|e| format!("the patch `{patch}` does not apply: {e}"))?;
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

pub fn run(cmp: &CompareWorkload, task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let mut variants: Vec<VariantState> = Vec::new();
    for v in &cmp.variants {
        ctx.message(format!("setting up variant `{}`", v.name));
        let (dir, failed) = match setup(v, cmp.repo.as_deref(), out_dir) {
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

    let total = cmp.warmup_rounds + cmp.rounds;
    for round in 0..total {
        let warm = round < cmp.warmup_rounds;
        for v in variants.iter_mut().filter(|v| v.failed.is_none()) {
            if ctx.stop_requested() {
                break;
            }
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
            ctx.message(format!(
                "round {}/{}{}: {}",
                round + 1,
                total,
                if warm { " (warm-up)" } else { "" },
                v.name
            ));
            let r = crate::server::run(&srv, task, &rdir, ctx);
            if r.status != Status::Succeeded {
                let why = r
                    .failure
                    .map(|f| f.message)
                    .unwrap_or_else(|| r.status.to_string());
                ctx.message(format!(
                    "variant `{}` failed in round {}: {why}",
                    v.name,
                    round + 1
                ));
                v.failed = Some(format!("round {}: {why}", round + 1));
                continue;
            }
            let headline: Vec<String> = ["output_throughput", "mean_ttft_ms", "median_itl_ms"]
                .iter()
                .filter_map(|k| r.metrics.get(*k).map(|x| format!("{k}={x:.2}")))
                .collect();
            ctx.message(format!(
                "round {}/{} {}: {}",
                round + 1,
                total,
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
    }
    ctx.enter(Phase::Teardown);

    // Means per variant, and every pair compared.
    let mut result = CellResult::new(cell, Status::Succeeded);
    let mut info_variants = serde_json::Map::new();
    for v in &variants {
        let mut means = BTreeMap::new();
        if let Some(first) = v.rounds.first() {
            for k in first.keys() {
                let vals: Vec<f64> = v.rounds.iter().filter_map(|r| r.get(k).copied()).collect();
                let mean = vals.iter().sum::<f64>() / vals.len().max(1) as f64;
                means.insert(k.clone(), mean);
                result.metrics.insert(format!("{}.{k}", v.name), mean);
            }
        }
        info_variants.insert(
            v.name.clone(),
            json!({
                "status": if v.failed.is_some() { "failed" } else { "succeeded" },
                "failure": v.failed,
                "rounds": v.rounds.len(),
                "logs": format!("variants/{}", v.name),
            }),
        );
    }
    let mut comparisons = Vec::new();
    for (i, a) in variants.iter().enumerate() {
        for b in variants.iter().skip(i + 1) {
            if a.failed.is_some() || b.failed.is_some() || a.rounds.is_empty() || b.rounds.is_empty() {
                continue;
            }
            for metric in a.rounds[0].keys() {
                let xa: Vec<f64> = a.rounds.iter().filter_map(|r| r.get(metric).copied()).collect();
                let xb: Vec<f64> = b.rounds.iter().filter_map(|r| r.get(metric).copied()).collect();
                let seed = (metric.len() * 31 + i) as u64;
                if let Some(c) = orch_compare::compare(metric, &xa, &xb, cmp.noise, 2000, seed) {
                    let mut v = serde_json::to_value(&c).unwrap_or(Value::Null);
                    v["base"] = json!(a.name);
                    v["other"] = json!(b.name);
                    comparisons.push(v);
                }
            }
        }
    }
    result
        .info
        .insert("variants".into(), Value::Object(info_variants));
    result.info.insert("comparison".into(), Value::Array(comparisons));
    result.info.insert("rounds".into(), json!(cmp.rounds));
    result.info.insert("noise".into(), json!(cmp.noise));
    let failed: Vec<String> = variants
        .iter()
        .filter_map(|v| v.failed.as_ref().map(|f| format!("`{}`: {f}", v.name)))
        .collect();
    if ctx.stop_requested() {
        result.status = Status::Cancelled;
        result.failure = Some(Failure {
            kind: "cancelled".into(),
            message: "stopped on request".into(),
            exit_code: None,
            signal: None,
        });
    } else if !failed.is_empty() {
        result.status = Status::Failed;
        result.failure = Some(Failure {
            kind: "variant_failed".into(),
            message: failed.join("; "),
            exit_code: None,
            signal: None,
        });
    }
    result
}
