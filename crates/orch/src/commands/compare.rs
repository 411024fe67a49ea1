//! `orch compare RUN_A RUN_B`: the same cells of two runs with their cost;
//! two campaigns task by task.

use super::report::lift;
use crate::cli::CompareArgs;
use orch_report::{CompareOptions, RunComparison};

pub fn compare(store: &orch_store::Store, args: CompareArgs) -> anyhow::Result<i32> {
    let (run_a, run_b) = (store.open_run(&args.run_a)?, store.open_run(&args.run_b)?);
    // Two campaigns: task by task, with a paired test.
    let opts = super::campaign::options(&args.score)?;
    if let (Some(ca), Some(cb)) = (
        super::campaign::load(&run_a, &opts)?,
        super::campaign::load(&run_b, &opts)?,
    ) {
        let cmp = orch_campaign::compare(&ca, &cb, &opts)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&cmp)?);
        } else {
            print!("{}", orch_campaign::render::comparison(&cmp));
        }
        return Ok(0);
    }
    let a = run_a.record()?;
    let b = run_b.record()?;
    let options = CompareOptions { metric: args.metric };
    let cmp = RunComparison::build(&a, &b, &options).map_err(lift)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cmp)?);
    } else {
        print!("{}", cmp.to_text());
    }
    Ok(0)
}
