use crate::cli::LsArgs;
use crate::output;

pub fn ls(store: &orch_store::Store, args: LsArgs) -> anyhow::Result<i32> {
    let (runs, damaged) = store.list_checked()?;
    // A damaged run is named with its file; the others are still listed.
    for e in &damaged {
        eprintln!("warning: {e}");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(0);
    }
    if runs.is_empty() {
        eprintln!("no runs in `{}`", store.location());
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.suite.clone(),
                r.state.to_string(),
                r.backend.clone(),
                r.cells.to_string(),
                output::counts_text(&r.counts),
                r.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(
            &[
                "RUN",
                "SUITE",
                "STATE",
                "BACKEND",
                "CELLS",
                "STATUS",
                "CREATED (UTC)"
            ],
            &rows
        )
    );
    Ok(0)
}
