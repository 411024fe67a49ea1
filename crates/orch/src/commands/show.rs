//! `orch show RUN`: the run's cells, comparisons (with each variant's gate,
//! output check and drift, each pair's verdict), hardware, failures and
//! cost, and the run judged against the earlier runs of its suite.

use crate::cli::ShowArgs;
use crate::output;
use orch_record::CellStatus;

/// The lines `orch show` adds under the run's table: the gates and drift of
/// every comparison, and the history verdicts.
fn checks_text(store: &orch_store::Store, record: &orch_record::RunRecord) -> String {
    let mut out = String::new();
    let options = orch_report::Options::default();
    // Without `--metric`/`--latency`, building the report fails only on a
    // comparison that does not read, which `output::run_text` warned of.
    if let Ok(report) = orch_report::Report::build(record, &options) {
        for cmp in &report.comparisons {
            let lines = cmp.checks_text();
            if lines.is_empty() {
                continue;
            }
            out.push_str(&format!("\ngates and drift in {}:\n", cmp.cell));
            for l in lines {
                out.push_str(&format!("  {l}\n"));
            }
        }
    }
    if let Some(h) = crate::commands::report::history_check(store, record, &options) {
        let flagged: Vec<_> = h.flagged().collect();
        out.push_str(&format!("\nhistory: {}\n", h.summary()));
        if !flagged.is_empty() {
            for v in flagged {
                out.push_str(&format!("  {}\n", v.text()));
            }
            out.push_str(&format!("  rule: {}\n", h.rule));
        }
    }
    out
}

pub fn show(store: &orch_store::Store, args: ShowArgs) -> anyhow::Result<i32> {
    let run = store.open_run(&args.run)?;
    let record = run.record()?;
    let campaign = super::campaign::load(&run, &super::campaign::options(&args.score)?)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!(
            "{}",
            output::run_text(&record, std::path::Path::new(&run.location()))
        );
        print!("{}", checks_text(store, &record));
        if let Some(c) = &campaign {
            print!("\n{}", orch_campaign::render::headline(c));
        }
    }
    Ok(
        if record.cells.iter().all(|c| c.status == CellStatus::Succeeded) {
            0
        } else {
            1
        },
    )
}
