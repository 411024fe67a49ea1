//! A campaign run (a suite with `tasks:`) scored from its stored plan and
//! records (`orch_campaign`): what `orch report`, `orch show` and
//! `orch compare` print for one. Re-scoring reads the store; nothing runs.

use crate::cli::ScoreArgs;
use orch_campaign::{Campaign, Options, TaskCell};

/// The scores' thresholds from the flags (each defaults to its paper's).
pub(crate) fn options(args: &ScoreArgs) -> anyhow::Result<Options> {
    let d = Options::default();
    let check = |name: &str, v: f64, ok: bool| -> anyhow::Result<f64> {
        if ok && v.is_finite() {
            Ok(v)
        } else {
            Err(crate::error::user(format!(
                "`--{name} {v}` is out of range\nhint: see `orch report --help` for each score's range"
            )))
        }
    };
    Ok(Options {
        match_band: match args.match_band {
            Some(v) => check("match-band", v, (0.0..1.0).contains(&v))?,
            None => d.match_band,
        },
        opt_threshold: match args.opt_threshold {
            Some(v) => check("opt-threshold", v, v > 0.0)?,
            None => d.opt_threshold,
        },
        opt_min_speedup: match args.opt_min_speedup {
            Some(v) => check("opt-min-speedup", v, v > 0.0)?,
            None => d.opt_min_speedup,
        },
        ..d
    })
}

/// The run scored as a campaign; `None` when its plan has no task cells.
pub(crate) fn load(run: &orch_store::Run, opts: &Options) -> anyhow::Result<Option<Campaign>> {
    if !run.plan.cells.iter().any(|c| c.campaign.is_some()) {
        return Ok(None);
    }
    let record = run.record()?;
    // By id: a campaign of thousands of tasks is looked up once per task.
    let views: std::collections::HashMap<&str, &orch_record::CellView> =
        record.cells.iter().map(|v| (v.id.as_str(), v)).collect();
    let cells: Vec<TaskCell> = run
        .plan
        .cells
        .iter()
        .filter_map(|p| {
            let task = p.campaign.clone()?;
            let view = (*views.get(p.id.as_str())?).clone();
            Some(TaskCell {
                task,
                view,
                folder: Some(run.cell_dir(&p.id).to_string_lossy().into_owned()),
            })
        })
        .collect();
    Ok(Some(orch_campaign::score(
        run.id(),
        &run.plan.suite,
        &cells,
        opts,
    )?))
}
