use crate::cli::PlanArgs;
use crate::commands::setup::human_bytes;
use crate::error::user;
use crate::output;
use orch_backend::host::Flags;
use orch_manifest::{ExpandOptions, GpuSpec};
use serde::Serialize;
use std::path::Path;

pub async fn plan(
    store: &orch_store::Store,
    prices_file: Option<&Path>,
    args: PlanArgs,
) -> anyhow::Result<i32> {
    let host = crate::hosts::host(
        args.backend,
        Flags {
            weights_dir: args.weights_dir.clone(),
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            keep: false,
        },
    );
    let host = host.as_ref();
    let prices = orch_cost::Prices::load(prices_file)?;
    let gpus = match &args.gpu {
        Some(text) => Some(
            GpuSpec::parse_list(text)
                .map_err(|e| user(format!("`--gpu {text}`: {e}\nhint: e.g. `--gpu H100:8,L4`")))?,
        ),
        None => None,
    };
    let plan = orch_manifest::load(
        &args.file,
        &ExpandOptions {
            gpus,
            ..Default::default()
        },
    )?;
    // A cell that asks for more GPUs than this host has (local, docker) would be refused by `run`.
    let devices = crate::commands::run::host_gpus(host, &plan)?;
    let jobs = jobs(host, &plan, None, &devices).await;
    let weights = host.weights(Some(&plan), false).await?;
    let models = host.check_models(&plan, &weights).await?;
    let missing = models.iter().any(|m| !m.complete);
    let misfit = models.iter().any(|m| m.fit.iter().any(|f| !f.fits));
    let estimates = crate::commands::cost::estimate_cells(store, &plan, host, &prices)?;
    let total = plan_total(&estimates, args.backend.as_str());
    if args.json {
        let cells: Vec<_> = plan
            .cells
            .iter()
            .zip(&estimates)
            .map(|(c, e)| {
                serde_json::json!({
                    "id": c.id,
                    "gpu": c.gpu.to_string(),
                    "params": c.params,
                    "estimate": e.estimate,
                    "usd_per_s": e.rate.usd_per_s,
                    "price_source": e.rate.source,
                    "task": c.campaign.as_ref().map(|t| &t.id),
                    "model": c.campaign.as_ref().and_then(|t| t.model.as_ref()),
                })
            })
            .collect();
        let out = serde_json::json!({
            "suite": plan.suite,
            "cells": cells,
            "estimate": total,
            "weights_dir": weights.folder(),
            "weights": weights.to_string(),
            "jobs": jobs.jobs,
            "jobs_why": jobs.why,
            "models": models,
            "ready": !missing && !misfit,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let campaign = plan.cells.iter().any(|c| c.campaign.is_some());
        if campaign {
            let tasks: std::collections::BTreeSet<&str> = plan
                .cells
                .iter()
                .filter_map(|c| c.campaign.as_ref().map(|t| t.id.as_str()))
                .collect();
            println!(
                "suite {}: a campaign of {} tasks, {} cells",
                plan.suite,
                tasks.len(),
                plan.cells.len()
            );
        } else {
            println!("suite {}: {} cells", plan.suite, plan.cells.len());
        }
        // A task's weights: its model's state, `-` without a model.
        let weights_of = |c: &orch_manifest::CellPlan| -> String {
            match c.campaign.as_ref().and_then(|t| t.model.as_ref()) {
                None => "-".into(),
                Some(repo) => match models.iter().find(|m| &m.repo == repo) {
                    Some(m) if m.complete => "present".into(),
                    Some(_) => "MISSING".into(),
                    None => "?".into(),
                },
            }
        };
        let rows: Vec<Vec<String>> = plan
            .cells
            .iter()
            .zip(&estimates)
            .map(|(c, e)| {
                let mut row = vec![
                    c.id.clone(),
                    c.gpu.to_string(),
                    c.benchmark.clone(),
                    if e.estimate.seconds < 10.0 {
                        format!("{:.1}s", e.estimate.seconds)
                    } else {
                        format!("{:.0}s", e.estimate.seconds)
                    },
                    if e.estimate.priced {
                        orch_cost::fmt_usd(e.estimate.usd)
                    } else {
                        "unpriced".into()
                    },
                    e.estimate.basis.as_str().to_string(),
                ];
                if campaign {
                    row.push(weights_of(c));
                }
                row
            })
            .collect();
        let mut header = vec!["CELL", "GPU", "BENCHMARK", "EST TIME", "EST COST", "BASIS"];
        if campaign {
            header.push("WEIGHTS");
        }
        print!("{}", output::table(&header, &rows));
        println!("{}", total_text(&total));
        println!(
            "jobs: {} at a time ({}; `--jobs N` to change)",
            jobs.jobs, jobs.why
        );
        if !models.is_empty() {
            println!("\nmodels (weights volume {weights}):");
            for m in &models {
                let state = if m.complete { "complete" } else { "MISSING" };
                let size = m.bytes.map(human_bytes).unwrap_or_else(|| "?".into());
                let weights = match (m.params, m.weights_bytes) {
                    (Some(p), Some(b)) => {
                        format!(", {:.2}B params, {} of weights", p as f64 / 1e9, human_bytes(b))
                    }
                    _ => String::new(),
                };
                println!("  {}@{}: {state}, {size}{weights}", m.repo, m.revision);
                let tasks: Vec<&str> = plan
                    .cells
                    .iter()
                    .filter_map(|c| c.campaign.as_ref())
                    .filter(|t| t.model.as_deref() == Some(m.repo.as_str()))
                    .map(|t| t.id.as_str())
                    .collect();
                if !tasks.is_empty() && !m.complete {
                    println!(
                        "    sinks task{} {} until set up",
                        if tasks.len() == 1 { "" } else { "s" },
                        tasks.join(", ")
                    );
                }
                for f in &m.fit {
                    match &f.needs {
                        None => println!("    fits {}", f.gpu),
                        Some(n) => println!("    does NOT fit {}: needs {n}", f.gpu),
                    }
                }
            }
            if missing {
                println!(
                    "\nhint: `orch setup -f {}` downloads the missing weights",
                    args.file.display()
                );
            }
        }
    }
    Ok(if missing || misfit { 1 } else { 0 })
}

/// Cells at once for a run of `plan`: `--jobs`, else the suite's
/// `concurrency`, else the backend's default; with why, in words.
pub async fn jobs(
    host: &dyn orch_backend::host::Host,
    plan: &orch_manifest::Plan,
    flag: Option<usize>,
    devices: &orch_runner::GpuDevices,
) -> orch_backend::host::DefaultJobs {
    use orch_backend::host::DefaultJobs;
    if let Some(n) = flag {
        return DefaultJobs::new(n, "`--jobs`");
    }
    if let Some(n) = plan.concurrency {
        return DefaultJobs::new(n, "the suite's `concurrency`");
    }
    let gpus = match devices {
        orch_runner::GpuDevices::Known(d) => Some(d.len()),
        _ => None,
    };
    let d = host.default_jobs(plan, gpus).await;
    DefaultJobs::new(d.jobs, format!("{} default: {}", host.kind(), d.why))
}

/// The estimate of a whole plan.
#[derive(Debug, Serialize)]
pub struct PlanEstimate {
    pub backend: String,
    pub usd: f64,
    /// Cell-seconds (the cells' durations added up, as if run one at a time).
    pub seconds: f64,
    /// Cells counted at their timeout (no earlier run): `usd` is then an upper bound for them.
    pub upper_bound_cells: usize,
    pub history_cells: usize,
    pub similar_cells: usize,
    /// Cells whose GPU type has no price on the backend (not in `usd`).
    pub unpriced_cells: usize,
}

fn plan_total(cells: &[crate::commands::cost::CellEstimate], backend: &str) -> PlanEstimate {
    use orch_cost::Basis;
    let count = |b: Basis| cells.iter().filter(|c| c.estimate.basis == b).count();
    PlanEstimate {
        backend: backend.to_string(),
        usd: cells.iter().map(|c| c.estimate.usd).sum(),
        seconds: cells.iter().map(|c| c.estimate.seconds).sum(),
        upper_bound_cells: count(Basis::TimeoutUpperBound),
        history_cells: count(Basis::History),
        similar_cells: count(Basis::Similar),
        unpriced_cells: cells.iter().filter(|c| !c.estimate.priced).count(),
    }
}

fn total_text(t: &PlanEstimate) -> String {
    let mut out = format!(
        "estimate on {}: {} for {:.0}s of cell time",
        t.backend,
        orch_cost::fmt_usd(t.usd),
        t.seconds
    );
    let mut basis = Vec::new();
    if t.history_cells > 0 {
        basis.push(format!("{} from the same cell's earlier run", t.history_cells));
    }
    if t.similar_cells > 0 {
        basis.push(format!("{} from similar cells", t.similar_cells));
    }
    if t.upper_bound_cells > 0 {
        basis.push(format!(
            "{} at their timeout (no earlier run): an UPPER BOUND",
            t.upper_bound_cells
        ));
    }
    if !basis.is_empty() {
        out.push_str(&format!(" ({})", basis.join("; ")));
    }
    if t.unpriced_cells > 0 {
        out.push_str(&format!(
            "\n{} cells have no price on `{}`: set one in your prices file (`orch prices`, docs/cost.md)",
            t.unpriced_cells, t.backend
        ));
    }
    out
}
