use crate::cli::LsArgs;
use crate::output;

pub fn ls(store: &orch_store::Store, args: LsArgs) -> anyhow::Result<i32> {
    let runs = store.list()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(0);
    }
    if runs.is_empty() {
        eprintln!("no runs in `{}`", store.root().display());
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.suite.clone(),
                format!("{:?}", r.state).to_lowercase(),
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
