//! Headless Chromium for the HTML report's tests: open a file, return the
//! DOM after its scripts ran, and check that the charts were drawn.
//!
//! Without a Chromium the tests skip with a note, except under CI, where a
//! missing browser fails them (`orch_test_support::skip`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The browser: `$ORCH_CHROMIUM`, else `chromium`, `chromium-browser`,
/// `google-chrome` on the PATH.
pub fn find() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("ORCH_CHROMIUM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&path) {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// The browser, or `None` (after a note on stderr) when it is missing outside
/// CI. Panics under CI: there the browser test must run
/// ([`orch_test_support::skip::require`]).
#[track_caller]
pub fn require(test: &str) -> Option<PathBuf> {
    orch_test_support::skip::require(
        test,
        find().ok_or_else(|| {
            "no Chromium found (`chromium` on the PATH or $ORCH_CHROMIUM; \
             `apt-get install -y chromium`), so the HTML report's charts were NOT checked in a browser"
                .to_string()
        }),
    )
}

fn headless(chromium: &Path, profile: &Path) -> Command {
    // coreutils' `timeout` kills a hung browser (a guard, not a timing assertion).
    let mut c = Command::new("timeout");
    c.args(["-k", "10", "180"])
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
            "--hide-scrollbars",
            "--run-all-compositor-stages-before-draw",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .stdin(Stdio::null());
    c
}

fn run(mut cmd: Command, what: &str) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
}

/// The DOM of `html` once its scripts ran.
pub fn dump_dom(chromium: &Path, html: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = headless(chromium, profile.path());
    cmd.arg("--virtual-time-budget=5000")
        .arg("--dump-dom")
        .arg(format!("file://{}", html.canonicalize().unwrap().display()));
    let out = run(cmd, "chromium --dump-dom");
    assert!(
        out.status.success() && !out.stdout.is_empty(),
        "chromium --dump-dom failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A PNG of the page (for people to look at; tests only check it exists).
pub fn screenshot(chromium: &Path, html: &Path, png: &Path, height: u32) {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = headless(chromium, profile.path());
    cmd.arg(format!("--screenshot={}", png.display()))
        .arg(format!("--window-size=1280,{height}"))
        .arg("--virtual-time-budget=5000")
        .arg(format!("file://{}", html.canonicalize().unwrap().display()));
    let out = run(cmd, "chromium --screenshot");
    assert!(
        out.status.success() && png.is_file(),
        "chromium --screenshot failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the charts' script left in the DOM.
#[derive(Debug, Default, PartialEq)]
pub struct Rendered {
    pub throughput_bars: usize,
    pub cost_bars: usize,
    /// Bars of the GPU energy chart (per step, or per token).
    pub energy_bars: usize,
    pub latency_rows: usize,
    pub intervals: usize,
    pub svgs: usize,
}

/// The `<html ...>` start tag of a dumped DOM.
fn html_tag(dom: &str) -> &str {
    let start = dom.find("<html").unwrap_or(0);
    let end = dom[start..].find('>').map(|e| start + e).unwrap_or(dom.len());
    &dom[start..end]
}

/// Ok when the script finished without error: the `<html>` element has
/// `data-rendered="ok"` and no `data-report-error`, the error banner is
/// hidden, and the counts the script wrote match the chart elements.
pub fn check(dom: &str) -> Result<Rendered, String> {
    let tag = html_tag(dom);
    if let Some(i) = tag.find("data-report-error=\"") {
        let rest = &tag[i + 19..];
        return Err(format!(
            "script error: {}",
            &rest[..rest.find('"').unwrap_or(rest.len())]
        ));
    }
    if !tag.contains("data-rendered=\"ok\"") {
        return Err(format!("the charts' script did not finish: {tag}"));
    }
    if !dom.contains("<div id=\"report-error\" hidden=\"\"></div>") {
        return Err("the error banner is shown".into());
    }
    let r = Rendered {
        throughput_bars: dom.matches("class=\"bar throughput\"").count(),
        cost_bars: dom.matches("class=\"bar cost\"").count(),
        energy_bars: dom.matches("class=\"bar energy\"").count(),
        latency_rows: dom.matches("class=\"dist\"").count(),
        intervals: dom.matches("class=\"ci\"").count(),
        svgs: dom.matches("<svg").count(),
    };
    let attr = |name: &str| -> Option<usize> {
        let i = tag.find(&format!("{name}=\""))? + name.len() + 2;
        tag[i..].split('"').next()?.parse().ok()
    };
    if attr("data-bars") != Some(r.throughput_bars + r.cost_bars + r.energy_bars) {
        return Err(format!("data-bars disagrees with the DOM: {tag} vs {r:?}"));
    }
    if attr("data-dists") != Some(r.latency_rows) || attr("data-cis") != Some(r.intervals) {
        return Err(format!(
            "data-dists/data-cis disagree with the DOM: {tag} vs {r:?}"
        ));
    }
    Ok(r)
}
