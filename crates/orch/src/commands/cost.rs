//! `orch cost`: spend across the runs in the store (from each run's cost
//! ledger), and the cost lines of `orch show`.

use crate::cli::{CostArgs, CostBy};
use crate::error::user;
use crate::output;
use orch_cost::{fmt_usd, GroupBy, Spend, SpendGroup};
use orch_record::RunRecord;

fn group_by(by: CostBy) -> GroupBy {
    match by {
        CostBy::Gpu => GroupBy::Gpu,
        CostBy::Backend => GroupBy::Backend,
        CostBy::Suite => GroupBy::Suite,
        CostBy::Status => GroupBy::Status,
        CostBy::Model => GroupBy::Model,
        CostBy::Run => GroupBy::Run,
    }
}

pub fn cost(store: &orch_store::Store, args: CostArgs) -> anyhow::Result<i32> {
    let since = match &args.since {
        Some(text) => {
            let d = humantime::parse_duration(text).map_err(|e| {
                user(format!(
                    "`--since {text}`: {e}\nhint: write a duration such as `7d`, `24h` or `30m`"
                ))
            })?;
            let d = chrono::Duration::from_std(d)
                .map_err(|_| user(format!("`--since {text}` is too long\nhint: e.g. `365d`")))?;
            Some(chrono::Utc::now() - d)
        }
        None => None,
    };
    let lines = store.cost_lines(since)?;
    let runs = {
        let mut ids: Vec<&str> = lines.iter().map(|l| l.run.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    };
    let spend = Spend::aggregate(group_by(args.by), &lines);
    if args.json {
        let out = serde_json::json!({
            "store": store.location(),
            "since": since,
            "by": spend.by,
            "runs": runs,
            "groups": spend.groups,
            "total": spend.total,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(0);
    }
    let head = [
        spend.by.as_str(),
        "cells",
        "wasted_cells",
        "billed_s",
        "gpu_s",
        "usd",
        "wasted_usd",
        "unpriced_cells",
    ];
    if args.csv {
        println!("{}", head.join(","));
        for g in spend.groups.iter().chain(std::iter::once(&spend.total)) {
            println!(
                "{},{},{},{:.3},{:.3},{:.6},{:.6},{}",
                csv_field(&g.key),
                g.cells,
                g.wasted_cells,
                g.billed_s,
                g.gpu_s,
                g.usd,
                g.wasted_usd,
                g.unpriced_cells
            );
        }
        return Ok(0);
    }
    let row = |g: &SpendGroup| {
        vec![
            g.key.clone(),
            g.cells.to_string(),
            format!("{:.2}", g.gpu_s / 3600.0),
            fmt_usd(g.usd),
            format!("{} ({} cells)", fmt_usd(g.wasted_usd), g.wasted_cells),
            if g.unpriced_cells > 0 {
                g.unpriced_cells.to_string()
            } else {
                String::new()
            },
        ]
    };
    let mut rows: Vec<Vec<String>> = spend.groups.iter().map(row).collect();
    rows.push(row(&spend.total));
    let key = spend.by.as_str().to_uppercase();
    print!(
        "{}",
        output::table(&[&key, "CELLS", "GPU-HOURS", "USD", "WASTED", "UNPRICED"], &rows)
    );
    let period = match &args.since {
        Some(s) => format!(" in the last {s}"),
        None => String::new(),
    };
    println!(
        "{runs} runs{period}; wasted = spent on cells that did not succeed; unpriced = cells with no price for their GPU (`orch prices`)"
    );
    Ok(0)
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A cell's cost for the cells table of `orch show` (empty without one).
pub fn cell_cost_text(c: &orch_record::CellView) -> String {
    match &c.cost {
        Some(cost) if !cost.priced => "unpriced".into(),
        Some(cost) => fmt_usd(cost.usd),
        None => String::new(),
    }
}

/// The run's cost and budget lines of `orch show` (empty when neither).
pub fn run_cost_text(rec: &RunRecord) -> String {
    let mut out = String::new();
    if let Some(cost) = &rec.cost {
        out.push_str(&format!(
            "cost: {} ({} wasted on cells that did not succeed",
            fmt_usd(cost.usd),
            fmt_usd(cost.wasted_usd)
        ));
        if cost.earlier_attempts_usd > 0.0 {
            out.push_str(&format!(
                "; {} on earlier attempts",
                fmt_usd(cost.earlier_attempts_usd)
            ));
        }
        if cost.unpriced_cells > 0 {
            out.push_str(&format!("; {} cells unpriced", cost.unpriced_cells));
        }
        out.push_str(")\n");
        // In the order phases happen; names this version does not know last.
        const ORDER: &[&str] = &[
            "provision",
            "start",
            "load",
            "server_start",
            "warmup",
            "measure",
            "teardown",
            orch_cost::OTHER_PHASE,
        ];
        let mut parts: Vec<(&String, &f64)> = cost.by_phase.iter().filter(|(_, usd)| **usd > 0.0).collect();
        parts.sort_by_key(|(p, _)| ORDER.iter().position(|o| o == p).unwrap_or(ORDER.len()));
        let phases: Vec<String> = parts
            .iter()
            .map(|(p, usd)| format!("{p} {}", fmt_usd(**usd)))
            .collect();
        if !phases.is_empty() {
            out.push_str(&format!("  by phase: {}\n", phases.join(", ")));
        }
    }
    if let Some(b) = &rec.budget {
        out.push_str(&format!(
            "budget: {} cap, {} accrued, estimate {}",
            fmt_usd(b.max_usd),
            fmt_usd(b.accrued_usd),
            fmt_usd(b.estimate_usd)
        ));
        match &b.reason {
            Some(why) if b.stopped => out.push_str(&format!("; STOPPED: {why}\n")),
            _ => out.push('\n'),
        }
    }
    out
}

/// One cell's price and estimate.
pub(crate) struct CellEstimate {
    pub id: String,
    pub rate: orch_cost::Rate,
    pub estimate: orch_cost::Estimate,
}

/// Price and estimate every cell of `plan` on `backend`, from the prices
/// and the earlier runs of the suite in the store.
pub(crate) fn estimate_cells(
    store: &orch_store::Store,
    plan: &orch_manifest::Plan,
    host: &dyn orch_backend::Host,
    prices: &orch_cost::Prices,
) -> anyhow::Result<Vec<CellEstimate>> {
    let backend = host.kind().as_str();
    // Prices may be per partition (slurm).
    let partition = host.price_partition(plan);
    let history = store.history(&plan.suite)?;
    Ok(plan
        .cells
        .iter()
        .map(|c| {
            // A multi-node cell bills every node.
            let mut rate = prices.rate_in(backend, partition, &c.gpu, c.task.memory_limit_bytes);
            if c.nodes > 1 {
                rate.usd_per_s *= f64::from(c.nodes);
                rate.gpus *= c.nodes;
            }
            let estimate = history.estimate(
                &c.id,
                &c.benchmark,
                &c.gpu.to_string(),
                c.task.measure.timeout_s,
                &rate,
            );
            CellEstimate {
                id: c.id.clone(),
                rate,
                estimate,
            }
        })
        .collect())
}

/// The runner's prices and budget for the cells `todo` of a run; refuses
/// (exit 2) when `prior_usd` plus their estimate is over `max_cost`.
pub(crate) fn cost_options(
    cells: &[CellEstimate],
    todo: &[String],
    max_cost: Option<f64>,
    prior_usd: f64,
) -> anyhow::Result<orch_runner::CostOptions> {
    let mut estimate_usd = 0.0;
    let mut upper_bound = 0;
    let mut opts = orch_runner::CostOptions::default();
    for c in cells {
        opts.rates.insert(c.id.clone(), c.rate.clone());
        if todo.contains(&c.id) {
            opts.estimates.insert(c.id.clone(), c.estimate.seconds);
            estimate_usd += c.estimate.usd;
            if c.estimate.basis == orch_cost::Basis::TimeoutUpperBound {
                upper_bound += 1;
            }
        }
    }
    opts.estimate_usd = estimate_usd;
    opts.prior_usd = prior_usd;
    if let Some(max) = max_cost {
        if !max.is_finite() || max <= 0.0 {
            return Err(user(format!(
                "`--max-cost {max}` must be a positive number of US dollars\nhint: e.g. `--max-cost 25`"
            )));
        }
        if prior_usd + estimate_usd > max {
            let basis = if upper_bound > 0 {
                format!(
                    "; {upper_bound} of the {} cells have no earlier run and are counted at their timeout, an upper bound",
                    todo.len()
                )
            } else {
                String::new()
            };
            let spent = if prior_usd > 0.0 {
                format!(" plus {} already spent by this run", fmt_usd(prior_usd))
            } else {
                String::new()
            };
            return Err(user(format!(
                "the estimated cost {}{spent} is over `--max-cost {max}`{basis}\nhint: raise `--max-cost`, run fewer cells (`--gpu`, a smaller matrix), or shorten `measure.timeout`; `orch plan -f FILE --backend B` shows each cell's estimate",
                fmt_usd(estimate_usd)
            )));
        }
        opts.max_usd = Some(max);
    }
    Ok(opts)
}
