//! The HTML report opened in headless Chromium: its inline script must draw
//! every chart (one bar per cell, one distribution per cell, one interval per
//! comparison row) without error. A broken script fails these tests.
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
    // 3 throughput + 1 cost + 2 latency + 1 comparison charts.
    assert_eq!(r.svgs, 7);

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
