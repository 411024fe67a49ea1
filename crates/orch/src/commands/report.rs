//! `orch report RUN`: the run's report in markdown, CSV, JSON and HTML, with
//! the run judged against the earlier runs of its suite (issue 33).

use crate::cli::ReportArgs;
use orch_history::{judge_run_with, AnalysisOptions, Verdict};
use orch_record::RunRecord;
use orch_report::{primary_metrics, Format, HistoryCheck, HistoryVerdict, Options, Report, ReportError};

/// A report error, classified by the exit code (`crate::error::exit_code`).
pub(crate) fn lift(e: ReportError) -> anyhow::Error {
    anyhow::Error::new(e)
}

/// The rule of the history verdicts, in words (docs/history.md).
fn rule(o: &AnalysisOptions) -> String {
    format!(
        "a value outside mean ± max({}σ, {}% of mean) of the last {} comparable runs (same suite, cell, \
         backend, GPU model, count and driver; only runs older than this one) since the last change point \
         (E-divisive means over the last {} points) or since a flagged run whose level the re-runs kept \
         (an accepted shift); judged with at least {} comparable runs",
        o.judge.sigmas,
        o.judge.noise_floor * 100.0,
        o.judge.window,
        orch_history::JUDGE_TAIL,
        o.judge.min_history
    )
}

/// `record` judged against the earlier runs of its suite in `store`: each
/// cell's primary metric(s) (`orch_report::primary_metrics`). `None` when
/// no cell has a primary metric, or the store cannot be listed (a warning
/// on stderr: the report goes on without it).
pub(crate) fn history_check(
    store: &orch_store::Store,
    record: &RunRecord,
    options: &Options,
) -> Option<HistoryCheck> {
    let loaded = match orch_history::load(store, &record.suite, None) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("warning: the run is not judged against its history: {e}");
            return None;
        }
    };
    let opts = AnalysisOptions::default();
    let judged = judge_run_with(&loaded.records, record, &opts, |c| primary_metrics(c, options));
    let earlier_runs = loaded
        .records
        .iter()
        .filter(|r| (r.created_at, r.id.as_str()) < (record.created_at, record.id.as_str()))
        .count();
    let mut check = HistoryCheck {
        earlier_runs,
        min_history: opts.judge.min_history,
        rule: rule(&opts),
        judged: Vec::new(),
        too_little_history: 0,
    };
    for j in judged {
        let g = &j.judgment;
        let (Some(mean), Some(sd), Some(low), Some(high)) = (g.mean, g.sd, g.low, g.high) else {
            check.too_little_history += 1;
            continue;
        };
        if g.verdict == Verdict::NoHistory {
            check.too_little_history += 1;
            continue;
        }
        check.judged.push(HistoryVerdict {
            cell: j.cell,
            metric: j.metric,
            testbed: j.testbed_label,
            verdict: g.verdict.as_str().to_string(),
            value: g.value,
            mean,
            sd,
            low,
            high,
            window: g.window,
            window_first_run: j.window_first_run.unwrap_or_default(),
            window_last_run: j.window_last_run.unwrap_or_default(),
            history: j.history,
            note: g.note.clone(),
        });
    }
    if check.judged.is_empty() && check.too_little_history == 0 {
        return None;
    }
    Some(check)
}

pub fn report(store: &orch_store::Store, args: ReportArgs) -> anyhow::Result<i32> {
    // Bad flags are reported before the store is read.
    let formats = Format::parse_list(&args.format).map_err(lift)?;
    let run = store.open_run(&args.run)?;
    if let Some(c) = super::campaign::load(&run, &super::campaign::options(&args.score)?)? {
        return campaign_report(&run, &c, &formats, args.output.as_deref());
    }
    let record = run.record()?;
    let options = Options {
        metric: args.metric,
        latency: args.latency,
    };
    let mut report = Report::build(&record, &options).map_err(lift)?;
    report.history = history_check(store, &record, &options);
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

/// A campaign's report: the headline, the per-task table and forest plot,
/// the failure table (`orch_campaign::render`).
fn campaign_report(
    run: &orch_store::Run,
    c: &orch_campaign::Campaign,
    formats: &[Format],
    output: Option<&std::path::Path>,
) -> anyhow::Result<i32> {
    use orch_campaign::render;
    let text = |f: Format| match f {
        Format::Md => render::markdown(c),
        Format::Csv => render::csv(c),
        Format::Json => render::json(c),
        Format::Html => render::html(c),
    };
    let dir = match (output, formats) {
        (None, [one]) => {
            print!("{}", text(*one));
            return Ok(0);
        }
        (Some(dir), _) => dir.to_path_buf(),
        (None, _) => run.dir().join("report"),
    };
    std::fs::create_dir_all(&dir).map_err(|e| {
        crate::error::user(format!(
            "cannot create the folder `{}` (`-o`): {e}\nhint: give `-o` a folder you can write to",
            dir.display()
        ))
    })?;
    for format in formats {
        let path = dir.join(format!("{}.{}", run.id(), format.extension()));
        orch_store::write_atomic(&path, text(*format).as_bytes())?;
        println!("{}", path.display());
    }
    Ok(0)
}
