use crate::cli::PlanArgs;
use crate::commands::setup::{human_bytes, requests_of};
use crate::error::user;
use crate::output;
use orch_hub::safetensors::{fit, Fit};
use orch_hub::RepoCache;
use orch_manifest::{ExpandOptions, GpuSpec, Plan};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct ModelCheck {
    pub repo: String,
    pub revision: String,
    /// Every file of the pinned revision is in the weights volume.
    pub complete: bool,
    pub commit: Option<String>,
    pub bytes: Option<u64>,
    /// Parameters and bytes from the safetensors headers.
    pub params: Option<u64>,
    pub weights_bytes: Option<u64>,
    pub fit: Vec<FitCheck>,
}

#[derive(Debug, Serialize)]
pub struct FitCheck {
    pub gpu: String,
    pub fits: bool,
    /// The smallest count of this GPU type that fits, when `gpu` does not.
    pub needs: Option<String>,
}

/// Check every model of the plan against the weights volume (offline).
pub fn check_models(plan: &Plan, weights_dir: &Path) -> Vec<ModelCheck> {
    let gpus: BTreeSet<String> = plan
        .cells
        .iter()
        .filter(|c| !c.gpu.is_cpu())
        .map(|c| c.gpu.to_string())
        .collect();
    requests_of(plan)
        .into_iter()
        .map(|req| {
            let cache = RepoCache::new(weights_dir, &req.repo, &req.repo_type);
            let marker = cache.complete(&req.revision);
            let (params, weights) = match &marker {
                Some(m) => match orch_hub::safetensors::weights_in_dir(&cache.snapshot_dir(&m.commit)) {
                    Ok((p, b, n)) if n > 0 => (Some(p), Some(b)),
                    _ => (None, None),
                },
                None => (None, None),
            };
            let fit = match weights {
                Some(bytes) => gpus
                    .iter()
                    .filter_map(|g| GpuSpec::parse(g).ok())
                    .filter_map(|g| g.gpu.map(|t| (g, t)))
                    .map(|(g, t)| {
                        let f = fit(
                            bytes,
                            t.memory_gib,
                            g.count,
                            orch_manifest::gpu::MAX_GPUS_PER_CELL,
                        );
                        FitCheck {
                            gpu: g.to_string(),
                            fits: f == Fit::Fits,
                            needs: match f {
                                Fit::Fits => None,
                                Fit::NeedsCount(n) => Some(format!("{}:{n}", t.name)),
                                Fit::TooLarge => Some(format!(
                                    "more than {} x {}",
                                    orch_manifest::gpu::MAX_GPUS_PER_CELL,
                                    t.name
                                )),
                            },
                        }
                    })
                    .collect(),
                None => vec![],
            };
            ModelCheck {
                repo: req.repo,
                revision: req.revision,
                complete: marker.is_some(),
                commit: marker.as_ref().map(|m| m.commit.clone()),
                bytes: marker.as_ref().map(|m| m.files.iter().map(|f| f.1).sum()),
                params,
                weights_bytes: weights,
                fit,
            }
        })
        .collect()
}

pub fn plan(store: &orch_store::Store, prices_file: Option<&Path>, args: PlanArgs) -> anyhow::Result<i32> {
    if !orch_cost::catalog::BACKENDS.contains(&args.backend.as_str()) {
        return Err(user(format!(
            "unknown backend `{}`\nhint: the backends are {}",
            args.backend,
            orch_cost::catalog::BACKENDS.join(", ")
        )));
    }
    let prices = orch_cost::Prices::load(prices_file)?;
    let gpus = match &args.gpu {
        Some(text) => Some(
            GpuSpec::parse_list(text)
                .map_err(|e| user(format!("`--gpu {text}`: {e}\nhint: e.g. `--gpu H100:8,L4`")))?,
        ),
        None => None,
    };
    let plan = orch_manifest::load(&args.file, &ExpandOptions { gpus })?;
    // A cell that asks for more GPUs than this host has (local, docker) would be refused by `run`.
    crate::commands::run::host_gpus(&args.backend, &plan)?;
    let weights_dir = match args.backend.as_str() {
        "slurm" => crate::commands::slurm::weights_dir(plan.slurm.as_ref(), args.weights_dir.as_ref()),
        _ => args
            .weights_dir
            .clone()
            .unwrap_or_else(orch_hub::default_weights_dir),
    };
    let mut models = check_models(&plan, &weights_dir);
    if args.backend == "kubernetes" {
        // The weights are on a PVC of the cluster: a short Job reads them there.
        models = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(crate::commands::kubernetes::check_models(
                &plan,
                args.context.as_deref(),
                args.namespace.as_deref(),
            ))
        })?;
    }
    if args.backend == "modal" {
        // The weights volume is Modal's: read its refs and markers there.
        models = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(crate::commands::modal::check_models(&plan))
        })?;
    }
    let missing = models.iter().any(|m| !m.complete);
    let misfit = models.iter().any(|m| m.fit.iter().any(|f| !f.fits));
    let estimates = crate::commands::cost::estimate_cells(store, &plan, &args.backend, &prices)?;
    let total = plan_total(&estimates, &args.backend);
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
                })
            })
            .collect();
        let out = serde_json::json!({
            "suite": plan.suite,
            "cells": cells,
            "estimate": total,
            "weights_dir": weights_dir,
            "models": models,
            "ready": !missing && !misfit,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("suite {}: {} cells", plan.suite, plan.cells.len());
        let rows: Vec<Vec<String>> = plan
            .cells
            .iter()
            .zip(&estimates)
            .map(|(c, e)| {
                vec![
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
                ]
            })
            .collect();
        print!(
            "{}",
            output::table(
                &["CELL", "GPU", "BENCHMARK", "EST TIME", "EST COST", "BASIS"],
                &rows
            )
        );
        println!("{}", total_text(&total));
        if !models.is_empty() {
            println!("\nmodels (weights volume {}):", weights_dir.display());
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
