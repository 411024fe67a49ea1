//! `orch compare RUN_A RUN_B`: the same cells of two runs with their cost.

use super::report::lift;
use crate::cli::CompareArgs;
use orch_report::{CompareOptions, RunComparison};

pub fn compare(store: &orch_store::Store, args: CompareArgs) -> anyhow::Result<i32> {
    let a = store.open_run(&args.run_a)?.record()?;
    let b = store.open_run(&args.run_b)?.record()?;
    let options = CompareOptions { metric: args.metric };
    let cmp = RunComparison::build(&a, &b, &options).map_err(lift)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&cmp)?);
    } else {
        print!("{}", cmp.to_text());
    }
    Ok(0)
}
