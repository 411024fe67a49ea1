//! `orch report RUN`: the run's report in markdown, CSV, JSON and HTML.

use crate::cli::ReportArgs;
use orch_report::{Format, Options, Report, ReportError};

/// A report error, classified by the exit code (`crate::error::exit_code`).
pub(crate) fn lift(e: ReportError) -> anyhow::Error {
    anyhow::Error::new(e)
}

pub fn report(store: &orch_store::Store, args: ReportArgs) -> anyhow::Result<i32> {
    // Bad flags are reported before the store is read.
    let formats = Format::parse_list(&args.format).map_err(lift)?;
    let run = store.open_run(&args.run)?;
    let record = run.record()?;
    let options = Options {
        metric: args.metric,
        latency: args.latency,
    };
    let report = Report::build(&record, &options).map_err(lift)?;
    let dir = match (&args.output, formats.as_slice()) {
        (None, [one]) => {
            print!("{}", orch_report::render(&report, *one).map_err(lift)?);
            return Ok(0);
        }
        (Some(dir), _) => dir.clone(),
        (None, _) => run.dir().join("report"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        crate::error::user(format!(
            "cannot create the folder `{}` (`-o`): {e}\nhint: give `-o` a folder you can write to",
            dir.display()
        ))
    })?;
    for format in formats {
        let text = orch_report::render(&report, format).map_err(lift)?;
        let path = dir.join(format!("{}.{}", record.id, format.extension()));
        orch_store::write_atomic(&path, text.as_bytes())?;
        println!("{}", path.display());
    }
    Ok(0)
}
