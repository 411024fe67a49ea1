//! `orch history` before the CLI has it: a suite's history from a folder
//! store, as a table (default), `--json`, `--csv` or `--html`; the time to
//! load and to analyse goes to stderr.
//! `cargo run -p orch-history --example history -- STORE SUITE [--json|--csv|--html]`

use orch_history::{analyze, build, load, render, AnalysisOptions, Filter};
use std::error::Error;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        return Err("usage: history STORE SUITE [--json|--csv|--html]".into());
    }
    let store = orch_store::Store::new(&args[0]);
    let t = Instant::now();
    let loaded = load(&store, &args[1], None)?;
    let load_s = t.elapsed().as_secs_f64();
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    let t = Instant::now();
    let series = build(&loaded.records, &Filter::default());
    let h = analyze(
        &args[1],
        loaded.records.len(),
        series,
        &AnalysisOptions::default(),
    );
    let analyse_s = t.elapsed().as_secs_f64();
    eprintln!(
        "{} runs: load {load_s:.3}s, series and change points {analyse_s:.3}s",
        loaded.records.len()
    );
    match args.get(2).map(String::as_str) {
        Some("--json") => println!("{}", render::json(&h)?),
        Some("--csv") => print!("{}", render::csv(&h)),
        Some("--html") => print!("{}", render::html(&h)),
        _ => print!("{}", render::table(&h)),
    }
    Ok(())
}
