//! Markdown: the report people paste into a pull request or a wiki.

use crate::fmt::{num, params, ratio, usd};
use crate::model::{CellRow, CompareCell, Report};
use crate::text::{
    below_text, better_text, budget_text, calibration_gpu, cost_summary, counts_text, cpu_text, free_note,
    hardware_text, mj, peak_gib, TELEMETRY_NOTE,
};
use orch_record::CellStatus;
use std::fmt::Write;

/// Text safe inside a markdown table cell.
fn esc(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('|', "\\|")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace(['\r', '\n'], " ")
}

fn code(s: &str) -> String {
    format!("`{}`", s.replace('`', "'").replace('|', "\\|"))
}

fn opt(v: Option<f64>, f: fn(f64) -> String) -> String {
    v.map(f).unwrap_or_default()
}

fn table(out: &mut String, header: &[&str], right: &[bool], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let sep: Vec<&str> = right.iter().map(|r| if *r { "--:" } else { "---" }).collect();
    let _ = writeln!(out, "|{}|", sep.join("|"));
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

fn flags(f: &[String]) -> String {
    if f.is_empty() {
        String::new()
    } else {
        format!("⚠ {}", esc(&f.join(", ")))
    }
}

/// `H100:8` plus a warning sign when the cell's numbers are suspect.
fn cell_name(id: &str, f: &[String]) -> String {
    if f.is_empty() {
        code(id)
    } else {
        format!("{} ⚠", code(id))
    }
}

fn cost_cell(c: &CellRow) -> String {
    match &c.cost {
        Some(k) if c.status != CellStatus::Succeeded || k.wasted => format!("{} wasted", usd(k.usd)),
        Some(k) => usd(k.usd),
        None => String::new(),
    }
}

fn telemetry(out: &mut String, r: &Report) {
    if r.telemetry.is_empty() {
        return;
    }
    out.push_str("## GPU telemetry\n\n");
    let rows: Vec<Vec<String>> = r
        .telemetry
        .iter()
        .map(|t| {
            vec![
                cell_name(&t.cell, &t.flags),
                esc(&t.gpu),
                opt(t.util_mean_pct, num),
                opt(t.power_mean_w, num),
                opt(t.energy_j, num),
                opt(t.energy_per_step_j, num),
                opt(t.energy_per_token_j, mj),
                opt(t.peak_memory_bytes, peak_gib),
                opt(t.sm_clock_mean_mhz, num),
                opt(t.temp_max_c, num),
            ]
        })
        .collect();
    table(
        out,
        crate::model::TELEMETRY_COLUMNS,
        crate::model::TELEMETRY_NUMERIC,
        &rows,
    );
    let _ = writeln!(out, "{TELEMETRY_NOTE}\n");
}

fn calibration(out: &mut String, r: &Report) {
    if r.calibration.is_empty() {
        return;
    }
    out.push_str("## Calibration\n\n");
    let mut rows: Vec<Vec<String>> = Vec::new();
    for c in &r.calibration {
        for f in &c.figures {
            rows.push(vec![
                cell_name(&c.cell, &c.flags),
                esc(&calibration_gpu(c)),
                code(&f.metric),
                num(f.measured),
                opt(f.expected, num),
                opt(f.ratio, ratio),
                esc(&f.unit),
                below_text(f.below, c.threshold),
            ]);
        }
    }
    table(
        out,
        &[
            "cell", "GPU", "figure", "measured", "expected", "ratio", "unit", "check",
        ],
        &[false, false, false, true, true, true, false, false],
        &rows,
    );
    out.push_str("ratio = measured / the GPU model's expected figure; a figure below the threshold flags the cell `degraded_gpu`.\n\n");
}

/// Each load curve as a table, by increasing load.
fn load_curves(out: &mut String, r: &Report) {
    if r.load_curves.is_empty() {
        return;
    }
    out.push_str("## Load curves\n\n");
    for c in &r.load_curves {
        let mut facts = vec![format!("by {}", c.by)];
        if let Some(s) = c.saturation_rate {
            facts.push(format!("highest rate meeting the SLO: {}", num(s)));
        }
        let _ = writeln!(out, "### `{}` ({})\n", c.cell, esc(&facts.join(", ")));
        let rows: Vec<Vec<String>> = c
            .points
            .iter()
            .map(|p| {
                std::iter::once(esc(&p.load))
                    .chain(p.figures().into_iter().map(|v| opt(v, num)))
                    .collect()
            })
            .collect();
        let header = c.header();
        table(out, &header, &vec![true; header.len()], &rows);
    }
}

/// The report as markdown: one section after another.
pub fn render(r: &Report) -> String {
    let mut out = String::new();
    header(&mut out, r);
    history(&mut out, r);
    throughput(&mut out, r);
    cost_efficiency(&mut out, r);
    cells(&mut out, r);
    telemetry(&mut out, r);
    calibration(&mut out, r);
    load_curves(&mut out, r);
    comparisons(&mut out, r);
    failures(&mut out, r);
    hardware(&mut out, r);
    out
}

/// The title, the run's facts and its totals (cells, cost, budget, flags).
fn header(out: &mut String, r: &Report) {
    let run = &r.run;
    let _ = writeln!(out, "# Report of `{}`\n", run.id);
    let mut facts = vec![
        format!("suite `{}`", run.suite),
        format!("backend `{}`", run.backend),
        run.state.clone(),
        run.created_at.format("%Y-%m-%d %H:%M UTC").to_string(),
        format!("host `{}`", run.hostname),
        format!("orch {}", run.orch_version),
    ];
    if let Some(c) = &run.git_commit {
        facts.push(format!("commit `{}`", &c[..c.len().min(12)]));
    }
    let _ = writeln!(out, "{}\n", facts.join(" · "));
    let _ = writeln!(out, "- **cells**: {}", counts_text(r));
    let _ = writeln!(out, "- **cost**: {}", cost_summary(r));
    if let Some(b) = budget_text(r) {
        let _ = writeln!(out, "- **budget**: {}", esc(&b));
    }
    if !r.totals.by_phase.is_empty() {
        let phases: Vec<String> = r
            .totals
            .by_phase
            .iter()
            .filter(|(_, v)| **v > 0.0)
            .map(|(k, v)| format!("{k} {}", usd(*v)))
            .collect();
        if !phases.is_empty() {
            let _ = writeln!(out, "- **cost by phase**: {}", phases.join(", "));
        }
    }
    let flagged = r.cells.iter().filter(|c| !c.flags.is_empty()).count();
    if flagged > 0 {
        let _ = writeln!(
            out,
            "- **⚠ {flagged} cells flagged** (`hardware_mismatch`, `degraded_gpu`, ...): their numbers are suspect"
        );
    }
    out.push('\n');
}

/// The run against its history: each flagged metric with its band and
/// window, else one line; nothing when the caller did not judge the run.
fn history(out: &mut String, r: &Report) {
    let Some(h) = &r.history else { return };
    let flagged: Vec<_> = h.flagged().collect();
    if flagged.is_empty() {
        let _ = writeln!(out, "History: {}.\n", esc(&h.summary()));
        return;
    }
    out.push_str("## Against history\n\n");
    let rows: Vec<Vec<String>> = flagged
        .iter()
        .map(|v| {
            vec![
                code(&v.cell),
                code(&v.metric),
                format!("**{}**", esc(&v.verdict)),
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
                        .map(|n| format!(" ({})", esc(n)))
                        .unwrap_or_default()
                ),
                esc(&v.testbed),
            ]
        })
        .collect();
    table(
        out,
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
        &rows,
    );
    let _ = writeln!(out, "{}; rule: {}.\n", esc(&h.summary()), esc(&h.rule));
}

/// One ranking per throughput metric.
fn throughput(out: &mut String, r: &Report) {
    out.push_str("## Ranking by throughput\n\n");
    if r.rankings.is_empty() {
        out.push_str("No succeeded cell reported a throughput metric.\n\n");
    }
    for rk in &r.rankings {
        let _ = writeln!(out, "### `{}` ({})\n", rk.metric, better_text(rk.better));
        let rows: Vec<Vec<String>> = rk
            .entries
            .iter()
            .map(|e| {
                vec![
                    e.rank.to_string(),
                    cell_name(&e.cell, &e.flags),
                    esc(&e.gpu),
                    num(e.value),
                    opt(e.usd_per_1k_tokens, usd),
                ]
            })
            .collect();
        let metric = esc(&rk.metric);
        table(
            out,
            &["#", "cell", "GPU", &metric, "$/1k tokens"],
            &[true, false, false, true, true],
            &rows,
        );
    }
}

/// The ranking by $ per 1k output tokens.
fn cost_efficiency(out: &mut String, r: &Report) {
    out.push_str("## Ranking by cost-efficiency ($ per 1k output tokens)\n\n");
    if r.cost_ranking.is_empty() {
        out.push_str(if r.has_cost() {
            "No succeeded cell has both a cost and an output-token rate.\n\n"
        } else {
            "No cell has a cost (records made before cost tracking): cost columns are empty.\n\n"
        });
        return;
    }
    let rows: Vec<Vec<String>> = r
        .cost_ranking
        .iter()
        .map(|e| {
            vec![
                e.rank.to_string(),
                cell_name(&e.cell, &e.flags),
                esc(&e.gpu),
                usd(e.usd_per_1k_tokens),
                format!("{} {}", num(e.token_rate), code(&e.token_metric)),
                opt(e.usd_per_gpu_hour, usd),
            ]
        })
        .collect();
    table(
        out,
        &["#", "cell", "GPU", "$/1k tokens", "output tokens/s", "$/GPU-hour"],
        &[true, false, false, true, true, true],
        &rows,
    );
    out.push_str("$/1k tokens = the cell's cost per second / its output tokens per second × 1000.\n\n");
    if let Some(n) = free_note(r) {
        let _ = writeln!(out, "{}\n", esc(&n));
    }
}

/// Every cell, then the parameters of those that have any.
fn cells(out: &mut String, r: &Report) {
    out.push_str("## Cells\n\n");
    let rows: Vec<Vec<String>> = r
        .cells
        .iter()
        .map(|c| {
            let l = c.latency.as_ref();
            vec![
                code(&c.id),
                c.status.to_string(),
                esc(&c.gpu),
                c.throughput
                    .as_ref()
                    .map(|t| format!("{} {}", num(t.value), code(&t.name)))
                    .unwrap_or_default(),
                l.map(|l| code(&l.label())).unwrap_or_default(),
                opt(l.and_then(|l| l.mean), num),
                opt(l.and_then(|l| l.median), num),
                opt(l.and_then(|l| l.p95), num),
                opt(l.and_then(|l| l.p99), num),
                opt(l.and_then(|l| l.std), num),
                cost_cell(c),
                opt(c.usd_per_1k_tokens, usd),
                flags(&c.flags),
            ]
        })
        .collect();
    table(
        out,
        &[
            "cell",
            "status",
            "GPU",
            "throughput",
            "latency",
            "mean",
            "median",
            "p95",
            "p99",
            "std",
            "cost",
            "$/1k tokens",
            "flags",
        ],
        &[
            false, false, false, true, false, true, true, true, true, true, true, true, false,
        ],
        &rows,
    );
    let with_params: Vec<&CellRow> = r.cells.iter().filter(|c| !c.params.is_empty()).collect();
    if !with_params.is_empty() {
        out.push_str("<details><summary>parameters</summary>\n\n");
        let rows: Vec<Vec<String>> = with_params
            .iter()
            .map(|c| vec![code(&c.id), code(&c.benchmark), esc(&params(&c.params))])
            .collect();
        table(out, &["cell", "benchmark", "parameters"], &[false; 3], &rows);
        out.push_str("</details>\n\n");
    }
}

/// The comparisons of variants, one subsection per comparison cell.
fn comparisons(out: &mut String, r: &Report) {
    if r.comparisons.is_empty() {
        return;
    }
    out.push_str("## Comparisons\n\n");
    for cmp in &r.comparisons {
        comparison(out, cmp);
    }
}

/// One comparison cell: its pairs' verdicts, the primary metric per round,
/// the variants that failed.
fn comparison(out: &mut String, cmp: &CompareCell) {
    let mut facts = vec![esc(&cmp.gpu), cmp.status.to_string()];
    if let Some(n) = cmp.rounds {
        facts.push(format!("{n} rounds"));
    }
    if let Some(n) = cmp.noise {
        facts.push(format!("noise threshold {}%", num(n * 100.0)));
    }
    facts.extend(crate::model::compare_facts(cmp));
    let _ = writeln!(out, "### `{}` ({})\n", cmp.cell, facts.join(", "));
    let any_key = cmp.rows.iter().any(|x| x.key);
    // Records from before primary metrics: every verdict stands alone.
    let any_primary = cmp.rows.iter().any(|x| x.primary);
    let rows: Vec<Vec<String>> = cmp
        .rows
        .iter()
        .filter(|x| x.primary || !any_key || x.key)
        .map(|x| {
            vec![
                format!("{} vs {}", code(&x.other), code(&x.base)),
                format!("{}{}", code(&x.metric), if x.primary { " (primary)" } else { "" }),
                x.n.map(|n| n.to_string()).unwrap_or_default(),
                ratio(x.ratio),
                format!("[{}, {}]", ratio(x.ci_low), ratio(x.ci_high)),
                ratio(x.speedup),
                x.mde.map(|m| format!("{}%", num(m * 100.0))).unwrap_or_default(),
                x.p.map(|p| format!("{p:.3}")).unwrap_or_default(),
                {
                    let v = if x.primary || !any_primary {
                        format!("**{}**", esc(&x.verdict))
                    } else {
                        esc(&x.verdict)
                    };
                    match &x.speed_verdict {
                        Some(sv) => format!("{v} (speed: {})", esc(sv)),
                        None => v,
                    }
                },
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No pair of variants was compared (a variant failed or measured nothing).\n\n");
    } else {
        table(
            out,
            &[
                "pair", "metric", "n", "ratio", "95% CI", "speedup", "MDE", "p", "verdict",
            ],
            &[false, false, true, true, true, true, true, true, false],
            &rows,
        );
        out.push_str(crate::model::COMPARE_NOTE);
        out.push_str("\n\n");
        if let Some(m) = &cmp.primary_metric {
            for v in cmp.variants.iter().filter(|v| !v.values.is_empty()) {
                let vals: Vec<String> = v.values.iter().map(|x| num(*x)).collect();
                let drift = v
                    .drift
                    .map(|d| format!(" (drift {})", d.text()))
                    .unwrap_or_default();
                let _ = writeln!(out, "- `{m}` per round, `{}`: {}{drift}", v.name, vals.join(", "));
            }
            if cmp.variants.iter().any(|v| !v.values.is_empty()) {
                out.push('\n');
            }
        }
    }
    for v in cmp.variants.iter().filter(|v| v.gate.is_some()) {
        let _ = writeln!(
            out,
            "- variant `{}` **{}**, no verdict on speed: {}",
            v.name,
            esc(v.gate.as_deref().unwrap_or("")),
            esc(v.gate_why.as_deref().unwrap_or(""))
        );
    }
    for v in cmp
        .variants
        .iter()
        .filter(|v| v.output_check.is_some() || !v.flags.is_empty())
    {
        let mut parts = Vec::new();
        if let Some(c) = &v.output_check {
            parts.push(format!("output check {}", esc(c)));
        }
        if !v.flags.is_empty() {
            parts.push(format!("flags {}", esc(&v.flags.join(", "))));
        }
        let _ = writeln!(out, "- variant `{}`: {}", v.name, parts.join("; "));
    }
    if cmp
        .variants
        .iter()
        .any(|v| v.gate.is_some() || v.output_check.is_some() || !v.flags.is_empty())
    {
        out.push('\n');
    }
    for v in cmp.variants.iter().filter(|v| v.status != CellStatus::Succeeded) {
        let _ = writeln!(
            out,
            "- variant `{}` {}: {}",
            v.name,
            esc(v.status.as_str()),
            esc(v.failure.as_deref().unwrap_or(""))
        );
        if let Some(d) = &v.diagnosis {
            let _ = writeln!(out, "  - cause `{}`; hint: {}", d.kind, esc(&d.hint));
        }
    }
    if cmp.variants.iter().any(|v| v.status != CellStatus::Succeeded) {
        out.push('\n');
    }
}

/// Each failed cell: its failure, its cause and hint, what it wasted.
fn failures(out: &mut String, r: &Report) {
    if r.failures.is_empty() {
        return;
    }
    out.push_str("## Failures\n\n");
    for f in &r.failures {
        let _ = writeln!(out, "### `{}`: {}\n", f.cell, esc(f.status.as_str()));
        if let Some(x) = &f.failure {
            let _ = writeln!(out, "- **failure** `{}`: {}", x.kind, esc(&x.message));
        }
        match &f.diagnosis {
            Some(d) => {
                let _ = writeln!(out, "- **cause** `{}`", d.kind);
                if !d.evidence.is_empty() {
                    out.push_str("\n  ```\n");
                    for e in d.evidence.iter().take(5) {
                        let _ = writeln!(out, "  {}", e.replace("```", "'''"));
                    }
                    out.push_str("  ```\n\n");
                }
                let _ = writeln!(out, "- **hint**: {}", esc(&d.hint));
            }
            None => out.push_str("- **cause**: not diagnosed\n"),
        }
        if let Some(w) = f.wasted_usd {
            let _ = writeln!(out, "- **wasted**: {}", usd(w));
        }
        let _ = writeln!(out, "- **logs**: `orch logs {} {}`\n", r.run.id, f.cell);
    }
}

/// The hardware every cell ran on.
fn hardware(out: &mut String, r: &Report) {
    out.push_str("## Hardware\n\n");
    if !r.has_hardware() {
        out.push_str("No cell recorded its hardware (records made before hardware identity).\n");
        return;
    }
    let rows: Vec<Vec<String>> = r
        .cells
        .iter()
        .map(|c| {
            let h = c.hardware.as_ref();
            vec![
                code(&c.id),
                esc(&c.gpu),
                h.map(|h| esc(&hardware_text(h))).unwrap_or_default(),
                esc(h.and_then(|h| h.driver_version.as_deref()).unwrap_or("")),
                esc(h.and_then(|h| h.cuda_version.as_deref()).unwrap_or("")),
                h.map(|h| esc(&cpu_text(h))).unwrap_or_default(),
                [
                    flags(&c.flags),
                    h.and_then(|h| h.mismatch.as_deref()).map(esc).unwrap_or_default(),
                ]
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect::<Vec<_>>()
                .join(": "),
            ]
        })
        .collect();
    table(
        out,
        &["cell", "asked", "GPUs", "driver", "CUDA", "CPU", "flags"],
        &[false; 7],
        &rows,
    );
}
