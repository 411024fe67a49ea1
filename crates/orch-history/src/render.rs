//! A [`History`] printed: a text table ([`table`]), JSON ([`json`]), CSV
//! with one row per point ([`csv`]), and a self-contained HTML page with
//! one inline SVG chart per series ([`html`]: a point's `<title>` names its
//! run, commit and value; change points are dashed lines with class
//! `changepoint`; failures are red crosses on the time line; no script).

use crate::analysis::{History, SeriesReport};
use crate::judge::Verdict;
use orch_record::CellStatus;

/// The series table, then one line per change point.
pub fn table(h: &History) -> String {
    let header = [
        "BENCHMARK",
        "PARAMS",
        "METRIC",
        "TESTBED",
        "POINTS",
        "FAILED",
        "LAST",
        "CHANGES",
        "LATEST",
    ];
    let rows: Vec<Vec<String>> = h
        .series
        .iter()
        .map(|s| {
            let last = s
                .points
                .iter()
                .rev()
                .find_map(|p| p.point.value)
                .map(num)
                .unwrap_or_else(|| "-".into());
            vec![
                s.benchmark.clone(),
                or_dash(s.params_label()),
                s.metric.clone(),
                s.testbed_label.clone(),
                s.points.len().to_string(),
                s.failures.to_string(),
                last,
                s.change_points.len().to_string(),
                s.latest
                    .as_ref()
                    .map(|j| j.verdict.as_str().to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let mut out = format!(
        "suite `{}`: {} runs, {} series\n",
        h.suite,
        h.runs,
        h.series.len()
    );
    out.push_str(&grid(&header, &rows));
    let changes: Vec<Vec<String>> = h
        .series
        .iter()
        .flat_map(|s| {
            s.change_points.iter().map(move |c| {
                vec![
                    format!("{} {} {}", s.benchmark, or_dash(s.params_label()), s.metric),
                    s.testbed_label.clone(),
                    format!("{} -> {}", c.run_before, c.run_after),
                    format!(
                        "{} -> {}",
                        c.commit_before.as_deref().map(short).unwrap_or("-"),
                        c.commit_after.as_deref().map(short).unwrap_or("-")
                    ),
                    format!("{} -> {}", num(c.stats.mean_before), num(c.stats.mean_after)),
                    format!(
                        "{} [{}, {}]",
                        pct(c.stats.shift),
                        pct(c.stats.shift_low),
                        pct(c.stats.shift_high)
                    ),
                    format!("{:.3}", c.stats.p_value),
                ]
            })
        })
        .collect();
    if !changes.is_empty() {
        out.push_str("\nchange points:\n");
        out.push_str(&grid(
            &["SERIES", "TESTBED", "RUNS", "COMMITS", "MEAN", "SHIFT [95%]", "P"],
            &changes,
        ));
    }
    out.push_str(&format!("\nmethod: {}\n", h.method));
    out
}

/// The history as pretty JSON.
pub fn json(h: &History) -> serde_json::Result<String> {
    serde_json::to_string_pretty(h)
}

/// The CSV header of [`csv`].
pub const CSV_HEADER: &str =
    "benchmark,params,metric,testbed,run_id,created_at,commit,value,status,failure_kind,verdict,change_point";

/// One row per point of every series; `change_point` is 1 on the first
/// point of a new level.
pub fn csv(h: &History) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for s in &h.series {
        let params = s.params_label();
        for (i, p) in s.points.iter().enumerate() {
            let pt = &p.point;
            let status = pt.failure.as_ref().map_or(CellStatus::Succeeded, |f| f.status);
            let fields = [
                s.benchmark.clone(),
                params.clone(),
                s.metric.clone(),
                s.testbed_label.clone(),
                pt.run_id.clone(),
                pt.created_at.to_rfc3339(),
                pt.commit.clone().unwrap_or_default(),
                pt.value.map(|v| v.to_string()).unwrap_or_default(),
                status.to_string(),
                pt.failure
                    .as_ref()
                    .and_then(|f| f.kind.as_ref().map(|k| k.to_string()))
                    .unwrap_or_default(),
                p.verdict.map(|v| v.as_str().to_string()).unwrap_or_default(),
                if s.change_points.iter().any(|c| c.point == i) {
                    "1"
                } else {
                    "0"
                }
                .to_string(),
            ];
            let line: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
            out.push_str(&line.join(","));
            out.push('\n');
        }
    }
    out
}

fn csv_field(f: &str) -> String {
    if f.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", f.replace('"', "\"\""))
    } else {
        f.to_string()
    }
}

/// A self-contained HTML page: one chart per series.
pub fn html(h: &History) -> String {
    let mut out = String::new();
    out.push_str("<!doctype html>\n<html><head><meta charset=\"utf-8\">\n");
    out.push_str(&format!("<title>orch history: {}</title>\n", esc(&h.suite)));
    out.push_str(
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
         h2{font-size:1.05em;margin-top:2em}.meta{color:#555;font-size:.9em}\
         svg{background:#fafafa;border:1px solid #ddd}\
         .pt{fill:#1f6feb}.pt.regression{fill:#d73a49}.pt.improvement{fill:#2da44e}\
         .fail{stroke:#d73a49;stroke-width:2}.changepoint{stroke:#8250df;stroke-width:1.5;stroke-dasharray:5 4}\
         .level{stroke:#8250df;stroke-width:1;opacity:.5}.axis{fill:#555;font-size:11px}\
         table{border-collapse:collapse;font-size:.9em}td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}</style>\n",
    );
    out.push_str("</head><body>\n");
    out.push_str(&format!(
        "<h1>History of suite <code>{}</code></h1>\n<p class=\"meta\">{} runs, {} series. Change points: {}. \
         Blue dots are runs, red crosses failures, dashed lines change points; hover a mark for its run and commit.</p>\n",
        esc(&h.suite),
        h.runs,
        h.series.len(),
        esc(&h.method)
    ));
    for s in &h.series {
        out.push_str(&format!(
            "<h2>{} <code>{}</code> {} — {}</h2>\n",
            esc(&s.benchmark),
            esc(&or_dash(s.params_label())),
            esc(&s.metric),
            esc(&s.testbed_label)
        ));
        out.push_str(&chart(s));
        if !s.change_points.is_empty() {
            out.push_str(
                "<table><tr><th>runs</th><th>commits</th><th>mean</th><th>shift [95%]</th><th>p</th></tr>\n",
            );
            for c in &s.change_points {
                out.push_str(&format!(
                    "<tr><td>{} → {}</td><td>{} → {}</td><td>{} → {}</td><td>{} [{}, {}]</td><td>{:.3}</td></tr>\n",
                    esc(&c.run_before),
                    esc(&c.run_after),
                    esc(c.commit_before.as_deref().map(short).unwrap_or("-")),
                    esc(c.commit_after.as_deref().map(short).unwrap_or("-")),
                    num(c.stats.mean_before),
                    num(c.stats.mean_after),
                    pct(c.stats.shift),
                    pct(c.stats.shift_low),
                    pct(c.stats.shift_high),
                    c.stats.p_value
                ));
            }
            out.push_str("</table>\n");
        }
        if let Some(j) = &s.latest {
            out.push_str(&format!(
                "<p class=\"meta\">latest: <b>{}</b>{}. Rule: {}.</p>\n",
                j.verdict.as_str(),
                j.note
                    .as_deref()
                    .map(|n| format!(" ({})", esc(n)))
                    .unwrap_or_default(),
                esc(&s.rule)
            ));
        }
    }
    out.push_str("</body></html>\n");
    out
}

const W: f64 = 760.0;
const H: f64 = 240.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 15.0;
const TOP: f64 = 15.0;
/// The band under the plot where failures sit.
const FAIL_BAND: f64 = 22.0;
const BOTTOM: f64 = 40.0;

/// One series as an SVG: points spaced evenly in time order.
fn chart(s: &SeriesReport) -> String {
    let n = s.points.len();
    let values: Vec<f64> = s.points.iter().filter_map(|p| p.point.value).collect();
    let (mut lo, mut hi) = values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(*v), b.max(*v))
        });
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-12 * hi.abs().max(1.0) {
        (lo, hi) = (
            lo - 0.5 * lo.abs().max(1.0) * 0.05,
            hi + 0.5 * hi.abs().max(1.0) * 0.05,
        );
    }
    let pad = (hi - lo) * 0.08;
    let (lo, hi) = (lo - pad, hi + pad);
    let plot_bottom = H - BOTTOM - FAIL_BAND;
    let x = |i: usize| {
        if n <= 1 {
            LEFT + (W - LEFT - RIGHT) / 2.0
        } else {
            LEFT + (W - LEFT - RIGHT) * i as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| TOP + (plot_bottom - TOP) * (hi - v) / (hi - lo);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\">\n"
    );
    // Axes: the value range and the first and last dates.
    svg.push_str(&format!(
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{plot_bottom}\" stroke=\"#999\"/>\n\
         <text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n\
         <text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
        LEFT - 4.0,
        y(hi - pad) + 4.0,
        num(hi - pad),
        LEFT - 4.0,
        y(lo + pad) + 4.0,
        num(lo + pad)
    ));
    if let (Some(first), Some(last)) = (s.points.first(), s.points.last()) {
        svg.push_str(&format!(
            "<text class=\"axis\" x=\"{LEFT}\" y=\"{}\">{}</text>\n<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
            H - 8.0,
            first.point.created_at.format("%Y-%m-%d %H:%M"),
            W - RIGHT,
            H - 8.0,
            last.point.created_at.format("%Y-%m-%d %H:%M")
        ));
    }
    // Segment means between change points.
    let mut bounds: Vec<usize> = vec![0];
    bounds.extend(s.change_points.iter().map(|c| c.point));
    bounds.push(n);
    for (k, w) in bounds.windows(2).enumerate() {
        let mean = if k < s.change_points.len() {
            s.change_points[k].stats.mean_before
        } else if let Some(c) = s.change_points.last() {
            c.stats.mean_after
        } else {
            continue;
        };
        if w[1] > w[0] && mean.is_finite() {
            svg.push_str(&format!(
                "<line class=\"level\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>\n",
                x(w[0]),
                y(mean),
                x(w[1] - 1),
                y(mean)
            ));
        }
    }
    for c in &s.change_points {
        let cx = (x(c.point) + x(c.point.saturating_sub(1))) / 2.0;
        svg.push_str(&format!(
            "<line class=\"changepoint\" x1=\"{cx:.1}\" y1=\"{TOP}\" x2=\"{cx:.1}\" y2=\"{plot_bottom}\"><title>change point: {} → {}, {} → {}, shift {} [{}, {}], p = {:.3}</title></line>\n",
            esc(&c.run_before),
            esc(&c.run_after),
            esc(c.commit_before.as_deref().map(short).unwrap_or("-")),
            esc(c.commit_after.as_deref().map(short).unwrap_or("-")),
            pct(c.stats.shift),
            pct(c.stats.shift_low),
            pct(c.stats.shift_high),
            c.stats.p_value
        ));
    }
    let r = if n > 400 { 1.5 } else { 3.0 };
    for (i, p) in s.points.iter().enumerate() {
        let pt = &p.point;
        let commit = pt.commit.as_deref().map(short).unwrap_or("-");
        match (pt.value, &pt.failure) {
            (Some(v), _) => {
                let class = match p.verdict {
                    Some(Verdict::Regression) => "pt regression",
                    Some(Verdict::Improvement) => "pt improvement",
                    _ => "pt",
                };
                svg.push_str(&format!(
                    "<circle class=\"{class}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"{r}\"><title>run {}\ncommit {}\n{} = {}{}</title></circle>\n",
                    x(i),
                    y(v),
                    esc(&pt.run_id),
                    esc(commit),
                    esc(&s.metric),
                    num(v),
                    p.verdict
                        .filter(|v| matches!(v, Verdict::Regression | Verdict::Improvement))
                        .map(|v| format!(" ({})", v.as_str()))
                        .unwrap_or_default()
                ));
            }
            (None, f) => {
                let (cx, cy) = (x(i), plot_bottom + FAIL_BAND / 2.0);
                let what = f
                    .as_ref()
                    .map(|f| match &f.kind {
                        Some(k) => format!("{} ({k})", f.status),
                        None => f.status.to_string(),
                    })
                    .unwrap_or_else(|| "no value".into());
                svg.push_str(&format!(
                    "<g class=\"fail\"><title>run {}\ncommit {}\n{}</title><line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/><line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/></g>\n",
                    esc(&pt.run_id),
                    esc(commit),
                    esc(&what),
                    cx - 4.0,
                    cy - 4.0,
                    cx + 4.0,
                    cy + 4.0,
                    cx - 4.0,
                    cy + 4.0,
                    cx + 4.0,
                    cy - 4.0
                ));
            }
        }
    }
    svg.push_str("</svg>\n");
    svg
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn short(c: &str) -> &str {
    c.get(..12).unwrap_or(c)
}

fn or_dash(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

fn pct(f: f64) -> String {
    if f.is_finite() {
        format!("{:+.1}%", f * 100.0)
    } else {
        "-".into()
    }
}

/// Rows under a header, columns padded to their widest cell.
fn grid(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| -> String {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(|c| c.as_str()).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{analyze, AnalysisOptions};
    use crate::changepoints::tests::series;
    use crate::series::tests::{cell, hw, run};
    use crate::series::{build, Filter};

    /// 40 H100 runs with a 15% drop at 20 and an OOM at 25, 5 H200 runs.
    fn history() -> History {
        let values = series(40, &[(20, -0.15)], 0.02, 21);
        let mut runs: Vec<_> = values
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let c = if i == 25 {
                    cell("oom", None, Some(hw("NVIDIA H100 80GB HBM3", 1)))
                } else {
                    cell("succeeded", Some(*v), Some(hw("NVIDIA H100 80GB HBM3", 1)))
                };
                run(i as i64, vec![c])
            })
            .collect();
        for i in 40..45 {
            runs.push(run(
                i,
                vec![cell("succeeded", Some(2000.0), Some(hw("NVIDIA H200", 1)))],
            ));
        }
        let s = build(&runs, &Filter::default());
        analyze("s", runs.len(), s, &AnalysisOptions::default())
    }

    #[test]
    fn json_and_csv_shapes() {
        let h = history();
        assert_eq!(h.series.len(), 2);
        let v: serde_json::Value = serde_json::from_str(&json(&h).unwrap()).unwrap();
        let s0 = &v["series"][0];
        assert_eq!(s0["metric"], "output_throughput");
        assert_eq!(s0["better"], "higher");
        assert_eq!(s0["testbed"]["gpu_model"], "NVIDIA H100 80GB HBM3");
        assert_eq!(s0["points"].as_array().unwrap().len(), 40);
        assert_eq!(s0["points"][25]["failure"]["status"], "oom");
        assert_eq!(s0["points"][0]["commit"], "c0000");
        assert!(s0["points"][1]["value"].is_number());
        let cp = &s0["change_points"][0];
        for k in [
            "point",
            "run_before",
            "run_after",
            "mean_before",
            "mean_after",
            "shift",
            "shift_low",
            "shift_high",
            "p_value",
        ] {
            assert!(!cp[k].is_null(), "{k} missing: {cp}");
        }
        assert!(cp["shift"].as_f64().unwrap() < -0.1);
        // Round trip.
        let back: History = serde_json::from_value(v).unwrap();
        // Equal up to the last bit of a float (serde_json's default parser).
        fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
            use serde_json::Value::*;
            match (a, b) {
                (Number(x), Number(y)) => {
                    let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                    (x - y).abs() <= 1e-12 * x.abs().max(1.0)
                }
                (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| close(x, y)),
                (Object(x), Object(y)) => {
                    x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| close(v, w)))
                }
                _ => a == b,
            }
        }
        assert!(close(
            &serde_json::to_value(&back).unwrap(),
            &serde_json::to_value(&h).unwrap()
        ));

        let text = csv(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], CSV_HEADER);
        assert_eq!(lines.len(), 1 + 40 + 5);
        let cols = CSV_HEADER.split(',').count();
        for l in &lines[1..] {
            // `params` is `x=1`: no quoting needed in these rows.
            assert_eq!(l.split(',').count(), cols, "{l}");
        }
        let oom: Vec<&str> = lines[26].split(',').collect();
        assert_eq!(oom[4], "run-0025");
        assert_eq!(oom[7], "");
        assert_eq!(oom[8], "oom");
        assert_eq!(oom[9], "cuda_oom");
        let marked = lines.iter().filter(|l| l.ends_with(",1")).count();
        assert_eq!(marked, h.series[0].change_points.len());
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
        let t = table(&h);
        assert!(t.contains("change points:") && t.contains("NVIDIA H200"), "{t}");
    }

    #[test]
    fn the_page_marks_every_change_point_and_failure() {
        let h = history();
        let page = html(&h);
        let cps: usize = h.series.iter().map(|s| s.change_points.len()).sum();
        assert!(cps >= 1);
        assert_eq!(page.matches("class=\"changepoint\"").count(), cps);
        assert_eq!(page.matches("<g class=\"fail\">").count(), 1);
        assert_eq!(page.matches("<circle").count(), 39 + 5);
        assert!(page.contains("<title>run run-0003\ncommit c0003\noutput_throughput = "));
        assert!(page.contains("oom (cuda_oom)"));
        assert!(!page.contains("<script"));
        assert_eq!(page.matches("<svg").count(), 2);
    }
}
