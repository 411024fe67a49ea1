//! `orch history`: a suite's metrics across the store's runs (folder or S3),
//! one series per benchmark, cell, metric and testbed (backend and GPU
//! identity), with change points and failures on one time line
//! (`orch-history` does the work).

use crate::cli::HistoryArgs;
use crate::error::user;
use orch_history::{analyze, build, load, render, AnalysisOptions, Filter, HistoryError};

/// A history error as it is (its [`orch_protocol::ErrorClass`] gives the
/// exit code); a store error unwrapped, so its own class and text lead.
fn mapped(e: HistoryError) -> anyhow::Error {
    match e {
        HistoryError::Store(e) => e.into(),
        other => other.into(),
    }
}

pub fn history(store: &orch_store::Store, args: HistoryArgs) -> anyhow::Result<i32> {
    let suite = match (&args.suite, &args.file) {
        (Some(s), _) => s.clone(),
        (None, Some(f)) => orch_manifest::load(f, &Default::default())?.suite,
        (None, None) => {
            return Err(user(
                "name a suite\nhint: `orch history SUITE` or `orch history -f SUITE.yaml`",
            ))
        }
    };
    let since = match &args.since {
        Some(t) => {
            let d = orch_history::parse_since(t).map_err(mapped)?;
            Some(chrono::Utc::now() - d)
        }
        None => None,
    };
    let loaded = load(store, &suite, since).map_err(mapped)?;
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    if loaded.records.is_empty() {
        return Err(mapped(HistoryError::NoRuns {
            suite,
            store: store.location(),
        }));
    }
    let filter = Filter {
        benchmark: args.benchmark.clone(),
        metric: args.metric.clone(),
        since,
    };
    let series = build(&loaded.records, &filter);
    if series.is_empty() {
        return Err(user(format!(
            "no series of suite `{suite}` match{}{}\nhint: drop `--benchmark`/`--metric`, or see `orch history {suite}` for the names",
            args.benchmark.as_deref().map(|b| format!(" benchmark `{b}`")).unwrap_or_default(),
            args.metric.as_deref().map(|m| format!(" metric `{m}`")).unwrap_or_default(),
        )));
    }
    let h = analyze(&suite, loaded.records.len(), series, &AnalysisOptions::default());
    if let Some(path) = &args.html {
        std::fs::write(path, render::html(&h)).map_err(|e| {
            user(format!(
                "cannot write `--html {}`: {e}\nhint: name a file in a folder that exists and that you can write",
                path.display()
            ))
        })?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        println!("{}", render::json(&h)?);
    } else if args.csv {
        print!("{}", render::csv(&h));
    } else {
        print!("{}", render::table(&h));
    }
    Ok(0)
}
