//! The HTML report opened in headless Chromium: its inline script must draw
//! every chart (one bar per cell, one distribution per cell, one interval per
//! comparison row, one energy bar per cell with the figure) without error. A broken script fails these tests.
//!
//! Set `ORCH_REPORT_SAMPLE_DIR` to keep the page and a screenshot there.

#[path = "support/browser.rs"]
mod browser;
#[path = "support/fixture.rs"]
mod fixture;

use orch_report::{render, Format, Options, Report};
use std::path::Path;

fn page(dir: &Path, name: &str, html: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, html).unwrap();
    p
}

#[test]
fn charts_render_in_chromium() {
    let Some(chromium) = browser::require("charts_render_in_chromium") else {
        return;
    };
    let report = Report::build(&fixture::run(), &Options::default()).unwrap();
    let html = render(&report, Format::Html).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = page(tmp.path(), "report.html", &html);
    let dom = browser::dump_dom(&chromium, &file);
    let r = browser::check(&dom).unwrap_or_else(|e| panic!("{e}\n--- DOM ---\n{dom}"));

    // One throughput bar per ranked cell, one cost bar per priced cell.
    let ranked: usize = report.rankings.iter().map(|k| k.entries.len()).sum();
    assert_eq!(ranked, 5);
    assert_eq!(r.throughput_bars, ranked);
    assert_eq!(r.cost_bars, report.cost_ranking.len());
    assert_eq!(r.cost_bars, 4);
    // Each bar is tied to its cell.
    for c in report.rankings.iter().flat_map(|k| &k.entries) {
        assert!(
            dom.contains(&format!("class=\"bar throughput\" data-cell=\"{}\"", c.cell)),
            "no bar for {}",
            c.cell
        );
    }
    // A latency distribution per succeeded cell with one (3 step_time, 1 ttft).
    assert_eq!(r.latency_rows, 4);
    // The comparison's headline rows: output_throughput and mean_ttft_ms.
    assert_eq!(r.intervals, 2);
    assert!(dom.contains("data-verdict=\"faster\""));
    // GPU energy per step: one bar per cell that has the figure (H100 and
    // A100; the serving cell has energy per token only).
    let per_step: Vec<&str> = report
        .telemetry
        .iter()
        .filter(|t| t.energy_per_step_j.is_some())
        .map(|t| t.cell.as_str())
        .collect();
    assert_eq!(per_step.len(), 2);
    assert_eq!(r.energy_bars, per_step.len());
    for c in &per_step {
        assert!(
            dom.contains(&format!("class=\"bar energy\" data-cell=\"{c}\"")),
            "no energy bar for {c}"
        );
    }
    assert!(!dom.contains("class=\"bar energy\" data-cell=\"serve.h100x2.rate-4\""));
    // 3 throughput + 1 cost + 2 latency + 1 comparison + 1 energy charts.
    assert_eq!(r.svgs, 8);

    if let Some(dir) = std::env::var_os("ORCH_REPORT_SAMPLE_DIR") {
        let dir = Path::new(&dir);
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("fixture.html"), &html).unwrap();
        std::fs::write(dir.join("fixture.md"), render(&report, Format::Md).unwrap()).unwrap();
        std::fs::write(dir.join("fixture.csv"), render(&report, Format::Csv).unwrap()).unwrap();
        browser::screenshot(&chromium, &file, &dir.join("fixture.png"), 3400);
    }
}

#[test]
fn a_run_without_cost_still_draws_its_throughput() {
    let Some(chromium) = browser::require("a_run_without_cost_still_draws_its_throughput") else {
        return;
    };
    let mut run = fixture::run();
    for c in &mut run.cells {
        c.cost = None;
    }
    let report = Report::build(&run, &Options::default()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let file = page(tmp.path(), "r.html", &render(&report, Format::Html).unwrap());
    let dom = browser::dump_dom(&chromium, &file);
    let r = browser::check(&dom).unwrap_or_else(|e| panic!("{e}\n--- DOM ---\n{dom}"));
    assert_eq!((r.throughput_bars, r.cost_bars), (5, 0));
}

#[test]
fn energy_per_token_when_no_cell_has_per_step() {
    let Some(chromium) = browser::require("energy_per_token_when_no_cell_has_per_step") else {
        return;
    };
    // With the calibrate cell (its table renders too) and no per-step figure:
    // the chart shows energy per token, one bar per cell that has it.
    let mut run = fixture::run_with_calibration();
    for c in &mut run.cells {
        c.metrics.remove("gpu_energy_per_step_j");
    }
    let report = Report::build(&run, &Options::default()).unwrap();
    let with_token = report
        .telemetry
        .iter()
        .filter(|t| t.energy_per_token_j.is_some())
        .count();
    assert_eq!((report.telemetry.len(), with_token), (4, 3));
    let tmp = tempfile::tempdir().unwrap();
    let file = page(tmp.path(), "r.html", &render(&report, Format::Html).unwrap());
    let dom = browser::dump_dom(&chromium, &file);
    let r = browser::check(&dom).unwrap_or_else(|e| panic!("{e}\n--- DOM ---\n{dom}"));
    assert_eq!(r.energy_bars, with_token);
    assert!(!dom.contains("class=\"bar energy\" data-cell=\"calibrate.h100\""));
    assert!(dom.contains("id=\"calibration\""));

    // A CPU run: no telemetry, no energy chart, and the page still renders.
    let report = Report::build(&fixture::without_telemetry(fixture::run()), &Options::default()).unwrap();
    let file = page(tmp.path(), "cpu.html", &render(&report, Format::Html).unwrap());
    let dom = browser::dump_dom(&chromium, &file);
    let r = browser::check(&dom).unwrap_or_else(|e| panic!("{e}\n--- DOM ---\n{dom}"));
    assert_eq!((r.energy_bars, r.svgs), (0, 7));
}

/// The check is worth something only if a broken script fails it.
#[test]
fn a_broken_script_fails_the_check() {
    let Some(chromium) = browser::require("a_broken_script_fails_the_check") else {
        return;
    };
    let report = Report::build(&fixture::run(), &Options::default()).unwrap();
    let html = render(&report, Format::Html).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let breakages = [
        // A syntax error: nothing runs.
        ("function barChart(host,", "function barChart(host,,"),
        // A runtime error while drawing.
        ("var max = niceMax(", "var max = nicemax("),
        // Data the script cannot read.
        ("id=\"orch-report-data\">{", "id=\"orch-report-data\">{,"),
    ];
    for (i, (from, to)) in breakages.iter().enumerate() {
        assert!(html.contains(from), "the page no longer contains `{from}`");
        let broken = html.replacen(from, to, 1);
        let file = page(tmp.path(), &format!("broken-{i}.html"), &broken);
        let dom = browser::dump_dom(&chromium, &file);
        let err = browser::check(&dom).expect_err(&format!("a page broken by `{to}` passed the check"));
        assert!(!err.is_empty());
    }
}
