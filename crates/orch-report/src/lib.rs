//! Reports people read: the report of one run (rankings by throughput and by
//! $ per 1k output tokens, per-cell statistics, 3-way comparisons with
//! intervals and verdicts, failures with their causes, hardware) rendered as
//! markdown, CSV, JSON and a self-contained HTML page with charts; and the
//! comparison of two runs with their cost.
//!
//! Pure: built from [`orch_record::RunRecord`]s, rendered to strings. Reading
//! the store and writing files is the caller's business.
//!
//! ## What is where
//!
//! `model.rs`: a run's report from its `RunRecord` (throughput rankings
//! per metric, cost-efficiency in $ per 1k output tokens, per-cell latency stats,
//! comparison tables from `info.comparison`, failures with diagnosis, hardware, totals);
//! `metrics.rs`: which metric is throughput / token rate / latency (documented orders,
//! `--metric`/`--latency`); `md.rs`, `csv.rs`, `html.rs` + `report.css`/`report.js`
//! (self-contained page, SVG charts drawn from embedded JSON); `history.rs`: the run
//! judged against the earlier runs of its suite (`Report::history`, filled by the caller
//! from `orch-history`, and which metrics are judged); `compare.rs`: two runs
//! matched by benchmark + params, $/GPU-hour, $ per unit of work. Which way is better
//! for a metric (rankings, speedups) is `orch_stats::better_for`, the workspace's one
//! rule. It does not: read the store or write files.

pub mod compare;
mod csv;
pub mod fmt;
pub mod history;
mod html;
mod md;
pub mod metrics;
pub mod model;
mod text;

pub use compare::{CompareOptions, RunComparison};
pub use history::{primary_metrics, HistoryCheck, HistoryVerdict};
pub use model::{Options, Report};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(
        "no cell of run `{run}` has `{name}` (`{flag}`)\nhint: {}",
        available_hint(available)
    )]
    UnknownMetric {
        flag: &'static str,
        name: String,
        run: String,
        available: Vec<String>,
    },
    #[error("unknown report format `{0}` (`--format`)\nhint: formats are `md`, `csv`, `json` and `html`, comma-separated")]
    UnknownFormat(String),
    #[error("runs `{a}` and `{b}` have no cell in common\nhint: cells match by benchmark and parameters: compare runs of the same suite (on different GPUs, say)")]
    NothingInCommon { a: String, b: String },
    #[error("cannot serialise the report: {0}")]
    Json(#[from] serde_json::Error),
    /// A comparison cell whose `info` does not read as
    /// `orch_record::CompareInfo` (a record of another schema).
    #[error("cannot read the comparison of cell `{cell}` in run `{run}`: {source}")]
    Comparison {
        run: String,
        cell: String,
        source: serde_json::Error,
    },
}

impl ReportError {
    /// True when the user asked for something that is not there.
    pub fn is_user_error(&self) -> bool {
        !matches!(self, ReportError::Json(_) | ReportError::Comparison { .. })
    }
}

fn available_hint(available: &[String]) -> String {
    if available.is_empty() {
        return "this run has none: its cells reported no such metrics".into();
    }
    const MAX: usize = 30;
    let mut s: Vec<String> = available.iter().take(MAX).map(|a| format!("`{a}`")).collect();
    if available.len() > MAX {
        s.push(format!("and {} more", available.len() - MAX));
    }
    format!("this run has {}", s.join(", "))
}

/// A report format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Md,
    Csv,
    Json,
    Html,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Md, Format::Csv, Format::Json, Format::Html];

    pub fn extension(self) -> &'static str {
        match self {
            Format::Md => "md",
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Html => "html",
        }
    }

    pub fn parse(s: &str) -> Result<Format, ReportError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "md" | "markdown" => Ok(Format::Md),
            "csv" => Ok(Format::Csv),
            "json" => Ok(Format::Json),
            "html" => Ok(Format::Html),
            _ => Err(ReportError::UnknownFormat(s.trim().to_string())),
        }
    }

    /// `md,csv,html` → the formats, each once, in the order given; `all` is
    /// every format.
    pub fn parse_list(s: &str) -> Result<Vec<Format>, ReportError> {
        let mut out = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let fs = if part.trim() == "all" {
                Format::ALL.to_vec()
            } else {
                vec![Format::parse(part)?]
            };
            for f in fs {
                if !out.contains(&f) {
                    out.push(f);
                }
            }
        }
        if out.is_empty() {
            return Err(ReportError::UnknownFormat(s.to_string()));
        }
        Ok(out)
    }
}

/// Render a report in one format.
pub fn render(report: &Report, format: Format) -> Result<String, ReportError> {
    Ok(match format {
        Format::Md => md::render(report),
        Format::Csv => csv::render(report),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(report)?;
            s.push('\n');
            s
        }
        Format::Html => html::render(report)?,
    })
}

impl orch_protocol::ErrorClass for ReportError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse() {
        assert_eq!(
            Format::parse_list("md, csv,md,html").unwrap(),
            [Format::Md, Format::Csv, Format::Html]
        );
        assert_eq!(Format::parse_list("all").unwrap().len(), 4);
        let e = Format::parse_list("md,pdf").unwrap_err();
        assert!(e.is_user_error());
        let text = e.to_string();
        assert!(
            text.contains("`pdf`") && text.contains("`--format`") && text.contains("\nhint: "),
            "{text}"
        );
        assert!(Format::parse_list(",").is_err());
    }
}
