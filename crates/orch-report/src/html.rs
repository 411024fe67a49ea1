//! A self-contained HTML page: tables rendered here, charts drawn in the
//! browser by inline JS (report.js) from the report embedded as JSON. No
//! network: CSS, JS and data are inline; charts are SVG.

use crate::fmt::{num, params, ratio, usd};
use crate::model::{CellRow, CompareCell, Report};
use crate::text::{
    below_text, better_text, budget_text, calibration_gpu, cost_summary, counts_text, cpu_text, free_note,
    hardware_text, mj, peak_gib, TELEMETRY_NOTE,
};
use crate::ReportError;
use orch_record::CellStatus;
use std::fmt::Write;

const CSS: &str = include_str!("report.css");
const JS: &str = include_str!("report.js");

/// Text safe in HTML content and attribute values.
fn h(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// JSON safe inside `<script type="application/json">`: no `<`, `>` or `&`
/// (so no `</script>`), no line separators.
fn script_json(json: &str) -> String {
    json.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

fn code(s: &str) -> String {
    format!("<code>{}</code>", h(s))
}

struct Table {
    out: String,
    numeric: Vec<bool>,
    wrap: Vec<bool>,
}

impl Table {
    fn new(header: &[&str], numeric: &[bool]) -> Table {
        let mut out = String::from("<div class=\"scroll\"><table><thead><tr>");
        for (i, c) in header.iter().enumerate() {
            let cls = if numeric.get(i).copied().unwrap_or(false) {
                " class=\"n\""
            } else {
                ""
            };
            let _ = write!(out, "<th{cls}>{}</th>", h(c));
        }
        out.push_str("</tr></thead><tbody>\n");
        Table {
            out,
            numeric: numeric.to_vec(),
            wrap: Vec::new(),
        }
    }

    /// Columns whose text may wrap (long free text).
    fn wrap(mut self, cols: &[usize]) -> Table {
        for c in cols {
            if self.wrap.len() <= *c {
                self.wrap.resize(c + 1, false);
            }
            self.wrap[*c] = true;
        }
        self
    }

    /// A row of already-escaped HTML fragments.
    fn row(&mut self, class: &str, cells: &[String]) {
        if class.is_empty() {
            self.out.push_str("<tr>");
        } else {
            let _ = write!(self.out, "<tr class=\"{class}\">");
        }
        for (i, c) in cells.iter().enumerate() {
            let cls = if self.numeric.get(i).copied().unwrap_or(false) {
                " class=\"n\""
            } else if self.wrap.get(i).copied().unwrap_or(false) {
                " class=\"wrap\""
            } else {
                ""
            };
            let _ = write!(self.out, "<td{cls}>{c}</td>");
        }
        self.out.push_str("</tr>\n");
    }

    fn end(mut self) -> String {
        self.out.push_str("</tbody></table></div>\n");
        self.out
    }
}

fn opt(v: Option<f64>, f: fn(f64) -> String) -> String {
    v.map(f).unwrap_or_default()
}

fn flags_html(f: &[String]) -> String {
    if f.is_empty() {
        String::new()
    } else {
        format!("<span class=\"flag\">⚠ {}</span>", h(&f.join(", ")))
    }
}

fn status(s: &str) -> String {
    format!("<span class=\"status-{0}\">{0}</span>", h(s))
}

fn flagged(f: &[String]) -> &'static str {
    if f.is_empty() {
        ""
    } else {
        "flagged"
    }
}

fn cost_cell(c: &CellRow) -> String {
    match &c.cost {
        Some(k) if c.status != CellStatus::Succeeded || k.wasted => {
            format!("<span class=\"status-failed\">{} wasted</span>", h(&usd(k.usd)))
        }
        Some(k) => h(&usd(k.usd)),
        None => String::new(),
    }
}

/// GPU telemetry: the energy chart, then the table.
fn telemetry(o: &mut String, r: &Report) {
    if r.telemetry.is_empty() {
        return;
    }
    o.push_str("<section id=\"telemetry\">\n<h2>GPU telemetry</h2>\n");
    let _ = writeln!(o, "<p class=\"note\">{}</p>", h(TELEMETRY_NOTE));
    if let Some(figure) = r.energy_chart_figure() {
        let what = if figure == "energy_per_step_j" {
            "GPU energy per measured step (J)"
        } else {
            "GPU energy per measured token (mJ)"
        };
        let _ = writeln!(
            o,
            "<h3>{what} <span class=\"note\">(lower is better; one bar per cell that has it, coloured by GPU)</span></h3>\n\
             <div class=\"chart\" data-chart=\"energy\" data-figure=\"{figure}\"></div>"
        );
    }
    let mut t = Table::new(crate::model::TELEMETRY_COLUMNS, crate::model::TELEMETRY_NUMERIC);
    for x in &r.telemetry {
        t.row(
            flagged(&x.flags),
            &[
                format!("{} {}", code(&x.cell), flags_html(&x.flags)),
                h(&x.gpu),
                opt(x.util_mean_pct, num),
                opt(x.power_mean_w, num),
                opt(x.energy_j, num),
                opt(x.energy_per_step_j, num),
                opt(x.energy_per_token_j, mj),
                opt(x.peak_memory_bytes, peak_gib),
                opt(x.sm_clock_mean_mhz, num),
                opt(x.temp_max_c, num),
            ],
        );
    }
    o.push_str(&t.end());
    o.push_str("</section>\n");
}

/// Each load curve: a chart of p99 and median TTFT against the throughput
/// reached (one point a stage, labelled with its load), then its table.
fn load_curves(o: &mut String, r: &Report) {
    if r.load_curves.is_empty() {
        return;
    }
    o.push_str("<section id=\"load-curves\">\n<h2>Load curves</h2>\n");
    o.push_str("<p class=\"note\">one point a load stage of the cell, by increasing load; x: requests per second reached, y: time to first token (p99 solid, median dashed).</p>\n");
    for c in &r.load_curves {
        let sat = c
            .saturation_rate
            .map(|s| format!(", highest rate meeting the SLO: {}", num(s)))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "<h3>{} <span class=\"note\">(by {}{})</span></h3>",
            code(&c.cell),
            h(&c.by),
            h(&sat)
        );
        o.push_str(&curve_svg(c));
        let header = c.header();
        let mut t = Table::new(&header, &vec![true; header.len()]);
        for p in &c.points {
            let cells: Vec<String> = std::iter::once(h(&p.load))
                .chain(p.figures().into_iter().map(|v| opt(v, num)))
                .collect();
            t.row("", &cells);
        }
        o.push_str(&t.end());
    }
    o.push_str("</section>\n");
}

/// A curve point: requests/s, p99 TTFT, median TTFT, the load's label.
type CurveXY<'a> = (f64, f64, Option<f64>, &'a str);

/// An inline SVG of a load curve (no script needed).
fn curve_svg(c: &crate::model::LoadCurve) -> String {
    let pts: Vec<CurveXY> = c
        .points
        .iter()
        .filter_map(|p| {
            Some((
                p.request_throughput?,
                p.p99_ttft_ms?,
                p.median_ttft_ms,
                p.load.as_str(),
            ))
        })
        .collect();
    if pts.is_empty() {
        return String::new();
    }
    let (w, ht, pad) = (560.0, 260.0, 48.0);
    let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-9) * 1.1;
    let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let x = |v: f64| pad + v / xmax * (w - 2.0 * pad);
    let y = |v: f64| ht - pad + -(v / ymax) * (ht - 2.0 * pad);
    let mut svg = format!(
        "<svg class=\"curve\" viewBox=\"0 0 {w} {ht}\" width=\"{w}\" height=\"{ht}\" role=\"img\" aria-label=\"TTFT against throughput\">\n"
    );
    let _ = writeln!(
        svg,
        "<line x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/><line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"#888\"/>",
        b = ht - pad,
        r = w - pad
    );
    let _ = writeln!(
        svg,
        "<text x=\"{}\" y=\"{}\" font-size=\"11\" text-anchor=\"middle\">requests/s (max {})</text><text x=\"12\" y=\"{}\" font-size=\"11\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">TTFT ms (max {})</text>",
        w / 2.0,
        ht - 12.0,
        h(&num(xmax / 1.1)),
        ht / 2.0,
        ht / 2.0,
        h(&num(ymax / 1.1))
    );
    let line = |sel: &dyn Fn(&CurveXY) -> Option<f64>| {
        pts.iter()
            .filter_map(|p| sel(p).map(|v| format!("{:.1},{:.1}", x(p.0), y(v))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let _ = writeln!(
        svg,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\"/>",
        line(&|p| Some(p.1))
    );
    let _ = writeln!(
        svg,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#2471a3\" stroke-width=\"2\" stroke-dasharray=\"5 4\"/>",
        line(&|p| p.2)
    );
    for p in &pts {
        let _ = writeln!(
            svg,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#c0392b\"><title>load {}: {} requests/s, p99 TTFT {} ms</title></circle><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
            x(p.0),
            y(p.1),
            h(p.3),
            h(&num(p.0)),
            h(&num(p.1)),
            x(p.0) + 5.0,
            y(p.1) - 5.0,
            h(p.3)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Calibration figures against the GPU model's expected figures.
fn calibration(o: &mut String, r: &Report) {
    if r.calibration.is_empty() {
        return;
    }
    o.push_str("<section id=\"calibration\">\n<h2>Calibration</h2>\n");
    o.push_str("<p class=\"note\">ratio = measured / the GPU model's expected figure; a figure below the threshold flags the cell <code>degraded_gpu</code>.</p>\n");
    let mut t = Table::new(
        &[
            "cell", "GPU", "figure", "measured", "expected", "ratio", "unit", "check",
        ],
        &[false, false, false, true, true, true, false, false],
    );
    for c in &r.calibration {
        for f in &c.figures {
            let check = below_text(f.below, c.threshold);
            let check = if f.below == Some(true) {
                format!("<span class=\"flag\">{}</span>", h(&check))
            } else {
                h(&check)
            };
            t.row(
                if f.below == Some(true) { "flagged" } else { "" },
                &[
                    format!("{} {}", code(&c.cell), flags_html(&c.flags)),
                    h(&calibration_gpu(c)),
                    code(&f.metric),
                    num(f.measured),
                    opt(f.expected, num),
                    opt(f.ratio, ratio),
                    h(&f.unit),
                    check,
                ],
            );
        }
    }
    o.push_str(&t.end());
    o.push_str("</section>\n");
}

/// The report as one HTML page: one section after another, the report's
/// JSON embedded for the charts.
pub fn render(r: &Report) -> Result<String, ReportError> {
    let data = script_json(&serde_json::to_string(r)?);
    let mut o = String::new();
    head(&mut o, r);
    header(&mut o, r);
    history(&mut o, r);
    throughput(&mut o, r);
    cost_efficiency(&mut o, r);
    latency(&mut o, r);
    cells(&mut o, r);
    telemetry(&mut o, r);
    calibration(&mut o, r);
    load_curves(&mut o, r);
    comparisons(&mut o, r);
    failures(&mut o, r);
    hardware(&mut o, r);
    footer(&mut o, &data);
    Ok(o)
}

/// From the doctype to the opening `<main>`: the styles and the hook that
/// marks the page when a script fails.
fn head(o: &mut String, r: &Report) {
    let _ = write!(
        o,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"orch-report {}\">\n<title>orch report · {}</title>\n\
         <style>\n{CSS}</style>\n\
         <script>window.addEventListener('error',function(e){{document.documentElement.setAttribute('data-report-error',String(e.message||'script error'));}});</script>\n\
         </head>\n<body>\n<main>\n",
        env!("CARGO_PKG_VERSION"),
        h(&r.run.id)
    );
}

/// What ran and what it cost: the title, the facts, the key figures, the
/// section links and the cost and budget notes.
fn header(o: &mut String, r: &Report) {
    let run = &r.run;
    let _ = writeln!(o, "<h1>Report of {}</h1>", code(&run.id));
    let mut facts = vec![
        format!("suite {}", code(&run.suite)),
        format!("backend {}", code(&run.backend)),
        h(&run.state),
        h(&run.created_at.format("%Y-%m-%d %H:%M UTC").to_string()),
        format!("host {}", code(&run.hostname)),
        format!("orch {}", h(&run.orch_version)),
    ];
    if let Some(c) = &run.git_commit {
        facts.push(format!("commit {}", code(&c[..c.len().min(12)])));
    }
    let _ = writeln!(o, "<p class=\"facts\">{}</p>", facts.join(" · "));
    o.push_str("<div id=\"report-error\" hidden></div>\n");
    kpis(o, r);
    nav(o, r);
    let _ = writeln!(o, "<p class=\"note\">cost: {}</p>", h(&cost_summary(r)));
    if let Some(b) = budget_text(r) {
        let _ = writeln!(o, "<p class=\"note\">budget: {}</p>", h(&b));
    }
}

/// One key figure: a big number and what it is.
fn kpi(o: &mut String, class: &str, big: &str, small: &str) {
    let _ = writeln!(
        o,
        "<div class=\"kpi {class}\"><b>{}</b><span>{}</span></div>",
        h(big),
        h(small)
    );
}

/// The key figures: cells, cost, waste, the best throughput, the cheapest
/// cell, failures.
fn kpis(o: &mut String, r: &Report) {
    o.push_str("<div class=\"kpis\">\n");
    let failed = r.failures.len();
    kpi(
        o,
        "",
        &r.cells.len().to_string(),
        &format!("cells: {}", counts_text(r)),
    );
    if let Some(t) = r.totals.usd {
        kpi(o, "", &usd(t), "total cost");
        if let Some(w) = r.totals.wasted_usd {
            kpi(o, if w > 0.0 { "bad" } else { "" }, &usd(w), "wasted by failures");
        }
    } else {
        kpi(o, "", "–", "no cost recorded");
    }
    if let Some(best) = r
        .rankings
        .first()
        .and_then(|rk| rk.entries.first().map(|e| (rk, e)))
    {
        kpi(
            o,
            "",
            &num(best.1.value),
            &format!("best {} ({})", best.0.metric, best.1.cell),
        );
    }
    if let Some(c) = r.cost_ranking.first() {
        kpi(
            o,
            "",
            &usd(c.usd_per_1k_tokens),
            &format!("cheapest per 1k output tokens ({})", c.cell),
        );
    }
    if failed > 0 {
        kpi(o, "bad", &failed.to_string(), "cells failed");
    }
    o.push_str("</div>\n");
}

/// Links to the sections the page has.
fn nav(o: &mut String, r: &Report) {
    o.push_str("<nav>");
    if r.history.is_some() {
        o.push_str("<a href=\"#history\">history</a>");
    }
    o.push_str("<a href=\"#throughput\">throughput</a><a href=\"#cost\">cost</a>");
    if r.cells.iter().any(|c| c.latency.is_some()) {
        o.push_str("<a href=\"#latency\">latency</a>");
    }
    o.push_str("<a href=\"#cells\">cells</a>");
    if !r.telemetry.is_empty() {
        o.push_str("<a href=\"#telemetry\">telemetry</a>");
    }
    if !r.calibration.is_empty() {
        o.push_str("<a href=\"#calibration\">calibration</a>");
    }
    if !r.comparisons.is_empty() {
        o.push_str("<a href=\"#comparisons\">comparisons</a>");
    }
    if !r.failures.is_empty() {
        o.push_str("<a href=\"#failures\">failures</a>");
    }
    o.push_str("<a href=\"#hardware\">hardware</a></nav>\n");
}

/// One chart and table per throughput metric.
fn throughput(o: &mut String, r: &Report) {
    o.push_str("<section id=\"throughput\">\n<h2>Ranking by throughput</h2>\n");
    if r.rankings.is_empty() {
        o.push_str("<p class=\"note\">No succeeded cell reported a throughput metric.</p>\n");
    }
    for rk in &r.rankings {
        let _ = writeln!(
            o,
            "<h3>{} <span class=\"note\">({}; one bar per cell, coloured by GPU)</span></h3>",
            code(&rk.metric),
            better_text(rk.better)
        );
        let _ = writeln!(
            o,
            "<div class=\"chart\" data-chart=\"throughput\" data-metric=\"{}\"></div>",
            h(&rk.metric)
        );
        let mut t = Table::new(
            &["#", "cell", "GPU", &rk.metric, "$/1k tokens"],
            &[true, false, false, true, true],
        );
        for e in &rk.entries {
            t.row(
                flagged(&e.flags),
                &[
                    e.rank.to_string(),
                    format!("{} {}", code(&e.cell), flags_html(&e.flags)),
                    h(&e.gpu),
                    num(e.value),
                    opt(e.usd_per_1k_tokens, usd),
                ],
            );
        }
        o.push_str(&t.end());
    }
    o.push_str("</section>\n");
}

/// The ranking by $ per 1k output tokens: its chart and table.
fn cost_efficiency(o: &mut String, r: &Report) {
    o.push_str("<section id=\"cost\">\n<h2>Ranking by cost-efficiency ($ per 1k output tokens)</h2>\n");
    if r.cost_ranking.is_empty() {
        let _ = writeln!(
            o,
            "<p class=\"note\">{}</p>",
            if r.has_cost() {
                "No succeeded cell has both a cost and an output-token rate."
            } else {
                "No cell has a cost (records made before cost tracking): cost columns are empty."
            }
        );
    } else {
        o.push_str("<p class=\"note\">$/1k tokens = the cell's cost per second / its output tokens per second × 1000; cheapest first.</p>\n");
        if let Some(n) = free_note(r) {
            let _ = writeln!(o, "<p class=\"note\"><b>{}</b></p>", h(&n));
        }
        o.push_str("<div class=\"chart\" data-chart=\"cost\"></div>\n");
        let mut t = Table::new(
            &["#", "cell", "GPU", "$/1k tokens", "output tokens/s", "$/GPU-hour"],
            &[true, false, false, true, true, true],
        );
        for e in &r.cost_ranking {
            t.row(
                flagged(&e.flags),
                &[
                    e.rank.to_string(),
                    format!("{} {}", code(&e.cell), flags_html(&e.flags)),
                    h(&e.gpu),
                    usd(e.usd_per_1k_tokens),
                    format!("{} {}", num(e.token_rate), code(&e.token_metric)),
                    opt(e.usd_per_gpu_hour, usd),
                ],
            );
        }
        o.push_str(&t.end());
    }
    o.push_str("</section>\n");
}

/// Latency distributions, one chart per family.
fn latency(o: &mut String, r: &Report) {
    let mut families: Vec<(String, String)> = Vec::new();
    for c in r.cells.iter().filter(|c| c.status == CellStatus::Succeeded) {
        if let Some(l) = &c.latency {
            if !families.iter().any(|(f, _)| *f == l.family) {
                families.push((l.family.clone(), l.label()));
            }
        }
    }
    if families.is_empty() {
        return;
    }
    o.push_str("<section id=\"latency\">\n<h2>Latency distributions</h2>\n");
    o.push_str("<p class=\"note\">Per cell: line from min to max (or to p99), box from median to p95 (or p90), thick mark at the median, thin mark at p99, dot at the mean.</p>\n");
    for (f, label) in &families {
        let _ = writeln!(
            o,
            "<h3>{}</h3>\n<div class=\"chart\" data-chart=\"latency\" data-family=\"{}\"></div>",
            code(label),
            h(f)
        );
    }
    o.push_str("</section>\n");
}

/// Every cell: what it did and cost first, its latency statistics after.
fn cells(o: &mut String, r: &Report) {
    o.push_str("<section id=\"cells\">\n<h2>Cells</h2>\n");
    let mut t = Table::new(
        &[
            "cell",
            "status",
            "GPU",
            "throughput",
            "$/1k tokens",
            "cost",
            "time",
            "latency",
            "mean",
            "median",
            "p95",
            "p99",
            "std",
            "flags",
        ],
        &[
            false, false, false, true, true, true, true, false, true, true, true, true, true, false,
        ],
    )
    .wrap(&[13]);
    for c in &r.cells {
        let l = c.latency.as_ref();
        t.row(
            flagged(&c.flags),
            &[
                format!("<code title=\"{}\">{}</code>", h(&params(&c.params)), h(&c.id)),
                status(c.status.as_str()),
                h(&c.gpu),
                c.throughput
                    .as_ref()
                    .map(|x| format!("{} {}", num(x.value), code(&x.name)))
                    .unwrap_or_default(),
                opt(c.usd_per_1k_tokens, usd),
                cost_cell(c),
                c.duration_s.map(|d| format!("{d:.1}s")).unwrap_or_default(),
                l.map(|l| h(&l.label())).unwrap_or_default(),
                opt(l.and_then(|l| l.mean), num),
                opt(l.and_then(|l| l.median), num),
                opt(l.and_then(|l| l.p95), num),
                opt(l.and_then(|l| l.p99), num),
                opt(l.and_then(|l| l.std), num),
                flags_html(&c.flags),
            ],
        );
    }
    o.push_str(&t.end());
    o.push_str("</section>\n");
}

/// The comparisons of variants, one subsection per comparison cell.
fn comparisons(o: &mut String, r: &Report) {
    if r.comparisons.is_empty() {
        return;
    }
    o.push_str("<section id=\"comparisons\">\n<h2>Comparisons</h2>\n");
    o.push_str("<p class=\"note\">Speedup of the other variant over the base with its 95% interval (1× = no change; > 1× better, whatever the metric's direction). Verdict: faster, slower, or same (within the noise threshold or the interval); the primary metric decides a pair's verdict.</p>\n");
    for cmp in &r.comparisons {
        comparison(o, cmp);
    }
    o.push_str("</section>\n");
}

/// One comparison cell: its chart and pairs' verdicts, the primary metric
/// per round, the variants that failed.
fn comparison(o: &mut String, cmp: &CompareCell) {
    let mut facts = vec![h(&cmp.gpu), status(cmp.status.as_str())];
    if let Some(n) = cmp.rounds {
        facts.push(format!("{n} rounds"));
    }
    if let Some(n) = cmp.noise {
        facts.push(format!("noise threshold {}%", num(n * 100.0)));
    }
    facts.extend(crate::model::compare_facts(cmp).iter().map(|f| h(f)));
    let _ = writeln!(
        o,
        "<h3>{} <span class=\"note\">({})</span></h3>",
        code(&cmp.cell),
        facts.join(", ")
    );
    if !cmp.rows.is_empty() {
        let _ = writeln!(
            o,
            "<div class=\"chart\" data-chart=\"comparison\" data-cell=\"{}\"></div>",
            h(&cmp.cell)
        );
        let mut t = Table::new(
            &[
                "pair", "metric", "n", "ratio", "95% CI", "speedup", "MDE", "p", "verdict",
            ],
            &[false, false, true, true, true, true, true, true, false],
        );
        for x in &cmp.rows {
            t.row(
                "",
                &[
                    format!("{} vs {}", code(&x.other), code(&x.base)),
                    format!("{}{}", code(&x.metric), if x.primary { " (primary)" } else { "" }),
                    x.n.map(|n| n.to_string()).unwrap_or_default(),
                    ratio(x.ratio),
                    format!("[{}, {}]", ratio(x.ci_low), ratio(x.ci_high)),
                    ratio(x.speedup),
                    x.mde.map(|m| format!("{}%", num(m * 100.0))).unwrap_or_default(),
                    x.p.map(|p| format!("{p:.3}")).unwrap_or_default(),
                    match &x.speed_verdict {
                        Some(sv) => format!(
                            "<span class=\"verdict-{0}\">{0}</span> (speed: {1})",
                            h(&x.verdict),
                            h(sv)
                        ),
                        None => format!("<span class=\"verdict-{0}\">{0}</span>", h(&x.verdict)),
                    },
                ],
            );
        }
        o.push_str(&t.end());
        let _ = writeln!(o, "<p class=\"note\">{}</p>", h(crate::model::COMPARE_NOTE));
        if let Some(m) = &cmp.primary_metric {
            for v in cmp.variants.iter().filter(|v| !v.values.is_empty()) {
                let vals: Vec<String> = v.values.iter().map(|x| num(*x)).collect();
                let drift = v
                    .drift
                    .map(|d| format!(" (drift {})", h(&d.text())))
                    .unwrap_or_default();
                let _ = writeln!(
                    o,
                    "<p class=\"note\">{} per round, {}: {}{drift}</p>",
                    code(m),
                    code(&v.name),
                    vals.join(", ")
                );
            }
        }
    } else {
        o.push_str("<p class=\"note\">No pair of variants was compared (a variant failed or measured nothing).</p>\n");
    }
    for v in cmp.variants.iter().filter(|v| v.gate.is_some()) {
        let _ = writeln!(
            o,
            "<p>variant {} <strong>{}</strong>, no verdict on speed: {}</p>",
            code(&v.name),
            h(v.gate.as_deref().unwrap_or("")),
            h(v.gate_why.as_deref().unwrap_or(""))
        );
    }
    for v in cmp
        .variants
        .iter()
        .filter(|v| v.output_check.is_some() || !v.flags.is_empty())
    {
        let mut parts = Vec::new();
        if let Some(c) = &v.output_check {
            parts.push(format!("output check {}", h(c)));
        }
        if !v.flags.is_empty() {
            parts.push(format!("flags {}", h(&v.flags.join(", "))));
        }
        let _ = writeln!(
            o,
            "<p class=\"note\">variant {}: {}</p>",
            code(&v.name),
            parts.join("; ")
        );
    }
    for v in cmp.variants.iter().filter(|v| v.status != CellStatus::Succeeded) {
        let _ = write!(
            o,
            "<p>variant {} {}: {}",
            code(&v.name),
            status(v.status.as_str()),
            h(v.failure.as_deref().unwrap_or(""))
        );
        if let Some(d) = &v.diagnosis {
            let _ = write!(o, "<br>cause {}; hint: {}", code(d.kind.as_str()), h(&d.hint));
        }
        o.push_str("</p>\n");
    }
}

/// The run against its history: the flagged metrics with band and window,
/// else one line; nothing when the run was not judged.
fn history(o: &mut String, r: &Report) {
    let Some(hc) = &r.history else { return };
    o.push_str("<section id=\"history\">\n<h2>Against history</h2>\n");
    let flagged: Vec<_> = hc.flagged().collect();
    if !flagged.is_empty() {
        let mut t = Table::new(
            &[
                "cell",
                "metric",
                "verdict",
                "value",
                "window mean",
                "change",
                "band",
                "window",
                "testbed",
            ],
            &[false, false, false, true, true, true, true, false, false],
        );
        for v in flagged {
            t.row(
                "",
                &[
                    code(&v.cell),
                    code(&v.metric),
                    format!("<strong class=\"history-{0}\">{0}</strong>", h(&v.verdict)),
                    num(v.value),
                    num(v.mean),
                    format!("{:+.1}%", v.change() * 100.0),
                    format!("[{}, {}]", num(v.low), num(v.high)),
                    format!(
                        "{} runs: {} .. {}{}",
                        v.window,
                        code(&v.window_first_run),
                        code(&v.window_last_run),
                        v.note
                            .as_deref()
                            .map(|n| format!(" ({})", h(n)))
                            .unwrap_or_default()
                    ),
                    h(&v.testbed),
                ],
            );
        }
        o.push_str(&t.end());
    }
    let _ = writeln!(
        o,
        "<p class=\"note\">{}; rule: {}</p>\n</section>",
        h(&hc.summary()),
        h(&hc.rule)
    );
}

/// Each failed cell: its failure, its cause and hint, what it wasted.
fn failures(o: &mut String, r: &Report) {
    if r.failures.is_empty() {
        return;
    }
    o.push_str("<section id=\"failures\">\n<h2>Failures</h2>\n");
    for f in &r.failures {
        let _ = writeln!(
            o,
            "<div class=\"failure\"><h3>{} {} <span class=\"note\">{}</span></h3>",
            code(&f.cell),
            status(f.status.as_str()),
            h(&f.gpu)
        );
        if let Some(x) = &f.failure {
            let _ = writeln!(
                o,
                "<p><b>failure</b> {}: {}</p>",
                code(x.kind.as_str()),
                h(&x.message)
            );
        }
        match &f.diagnosis {
            Some(d) => {
                let _ = writeln!(o, "<p><b>cause</b> {}</p>", code(d.kind.as_str()));
                if !d.evidence.is_empty() {
                    let ev: Vec<String> = d.evidence.iter().take(5).map(|e| h(e)).collect();
                    let _ = writeln!(o, "<pre>{}</pre>", ev.join("\n"));
                }
                let _ = writeln!(o, "<p><b>hint</b> {}</p>", h(&d.hint));
            }
            None => o.push_str("<p><b>cause</b> not diagnosed</p>\n"),
        }
        if let Some(w) = f.wasted_usd {
            let _ = writeln!(o, "<p><b>wasted</b> {}</p>", h(&usd(w)));
        }
        let _ = writeln!(
            o,
            "<p class=\"note\">logs: {}</p></div>",
            code(&format!("orch logs {} {}", r.run.id, f.cell))
        );
    }
    o.push_str("</section>\n");
}

/// The hardware every cell ran on.
fn hardware(o: &mut String, r: &Report) {
    o.push_str("<section id=\"hardware\">\n<h2>Hardware</h2>\n");
    if !r.has_hardware() {
        o.push_str(
            "<p class=\"note\">No cell recorded its hardware (records made before hardware identity).</p>\n",
        );
    } else {
        let mut t = Table::new(
            &["cell", "asked", "GPUs", "driver", "CUDA", "CPU", "flags"],
            &[false; 7],
        )
        .wrap(&[5, 6]);
        for c in &r.cells {
            let hw = c.hardware.as_ref();
            let mut fl = flags_html(&c.flags);
            if let Some(m) = hw.and_then(|x| x.mismatch.as_deref()) {
                let _ = write!(fl, " {}", h(m));
            }
            t.row(
                flagged(&c.flags),
                &[
                    code(&c.id),
                    h(&c.gpu),
                    hw.map(|x| h(&hardware_text(x))).unwrap_or_default(),
                    h(hw.and_then(|x| x.driver_version.as_deref()).unwrap_or("")),
                    h(hw.and_then(|x| x.cuda_version.as_deref()).unwrap_or("")),
                    hw.map(|x| h(&cpu_text(x))).unwrap_or_default(),
                    fl,
                ],
            );
        }
        o.push_str(&t.end());
    }
    o.push_str("</section>\n");
}

/// The footer, the report's JSON (`data`, made safe for a script element)
/// and the script that draws the charts from it.
fn footer(o: &mut String, data: &str) {
    let _ = write!(
        o,
        "<footer>orch report v{} · generated from the run record; the JSON below holds every number.</footer>\n</main>\n\
         <script type=\"application/json\" id=\"orch-report-data\">{data}</script>\n<script>\n{JS}</script>\n</body>\n</html>\n",
        crate::model::REPORT_VERSION
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(h("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        let j = script_json(r#"{"m":"</script><b>&"}"#);
        assert!(!j.contains("</script>") && !j.contains('<') && !j.contains('&'));
        let back: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(back["m"], "</script><b>&");
    }
}
