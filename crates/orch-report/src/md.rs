//! Markdown: the report people paste into a pull request or a wiki.

use crate::fmt::{gib, num, params, ratio, usd};
use crate::model::{CalibrationCell, CellRow, Report};
use orch_compare::Better;
use orch_protocol::Hardware;
use std::fmt::Write;

/// Text safe inside a markdown table cell.
pub(crate) fn esc(s: &str) -> String {
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

pub(crate) fn better_text(b: Better) -> &'static str {
    match b {
        Better::Higher => "higher is better",
        Better::Lower => "lower is better",
    }
}

pub(crate) fn hardware_text(h: &Hardware) -> String {
    if h.gpus.is_empty() {
        // The note's gist (`NVML not available`); the whole note is in the JSON.
        let gist = h
            .gpu_note
            .as_deref()
            .map(|n| n.trim_start_matches("no GPU").trim_start_matches([':', ' ']))
            .map(|n| n.split(" (").next().unwrap_or(n).trim())
            .filter(|n| !n.is_empty())
            .map(|n| n.chars().take(60).collect::<String>());
        return match gist {
            Some(g) => format!("no GPU ({g})"),
            None => "no GPU".into(),
        };
    }
    // Group identical GPUs: `8× NVIDIA H100 80GB HBM3 (80 GiB)`.
    let mut groups: Vec<(String, u64, usize)> = Vec::new();
    for g in &h.gpus {
        match groups
            .iter_mut()
            .find(|(n, m, _)| *n == g.name && *m == g.memory_bytes)
        {
            Some(x) => x.2 += 1,
            None => groups.push((g.name.clone(), g.memory_bytes, 1)),
        }
    }
    groups
        .iter()
        .map(|(n, m, k)| format!("{k}× {n} ({})", gib(*m)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// When every ranked cell cost nothing (a free backend), say so: the
/// cost-efficiency ranking is then all ties.
pub(crate) fn free_note(r: &Report) -> Option<String> {
    if r.cost_ranking.is_empty() || r.cost_ranking.iter().any(|e| e.usd_per_1k_tokens != 0.0) {
        return None;
    }
    let source = r
        .cells
        .iter()
        .find_map(|c| c.cost.as_ref().map(|k| k.price_source.clone()))
        .unwrap_or_default();
    Some(format!(
        "Every cell here cost $0 ({source}): they tie on cost-efficiency."
    ))
}

/// `AMD EPYC 9654, 32 CPUs, 256 GiB`.
pub(crate) fn cpu_text(h: &Hardware) -> String {
    let mut parts: Vec<String> = h.cpu_model.iter().cloned().collect();
    if h.cpus > 0 {
        parts.push(format!("{} CPUs", h.cpus));
    }
    if h.memory_bytes > 0 {
        parts.push(gib(h.memory_bytes));
    }
    parts.join(", ")
}

pub(crate) fn cost_summary(r: &Report) -> String {
    let t = &r.totals;
    let Some(total) = t.usd else {
        return "no cost recorded (cells recorded before cost tracking)".into();
    };
    let mut s = format!("{} total", usd(total));
    if let Some(w) = t.wasted_usd {
        let _ = write!(s, ", {} wasted by failures", usd(w));
    }
    if let Some(h) = t.gpu_hours.filter(|h| *h > 0.0) {
        let _ = write!(s, ", {} GPU-hours", num(h));
    }
    if t.earlier_attempts_usd > 0.0 {
        let _ = write!(
            s,
            " (earlier attempts of resumed cells: {})",
            usd(t.earlier_attempts_usd)
        );
    }
    if t.unpriced_cells > 0 {
        let _ = write!(
            s,
            "; {} cells on GPUs with no known price count as $0",
            t.unpriced_cells
        );
    }
    if t.cells_without_cost > 0 {
        let _ = write!(s, " ({} cells recorded without a cost)", t.cells_without_cost);
    }
    s
}

/// `budget $50 (estimate $42): stopped: ...`.
pub(crate) fn budget_text(r: &Report) -> Option<String> {
    let b = r.run.budget.as_ref()?;
    let mut s = format!(
        "cap {} (estimate {}, spent {})",
        usd(b.max_usd),
        usd(b.estimate_usd),
        usd(b.accrued_usd)
    );
    if b.stopped {
        let _ = write!(s, ": stopped the run");
        if let Some(why) = &b.reason {
            let _ = write!(s, " ({why})");
        }
    }
    Some(s)
}

pub(crate) fn counts_text(r: &Report) -> String {
    r.run
        .counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn cost_cell(c: &CellRow) -> String {
    match &c.cost {
        Some(k) if c.status != "succeeded" || k.wasted => format!("{} wasted", usd(k.usd)),
        Some(k) => usd(k.usd),
        None => String::new(),
    }
}

/// Peak memory in GiB, one decimal: `35.6 GiB`.
pub(crate) fn peak_gib(bytes: f64) -> String {
    if bytes.is_finite() && bytes >= 0.0 {
        gib(bytes as u64)
    } else {
        String::new()
    }
}

/// Joules per token shown as millijoules (`20.18`).
pub(crate) fn mj(joules: f64) -> String {
    num(joules * 1000.0)
}

/// The note under the telemetry table.
pub(crate) const TELEMETRY_NOTE: &str = "Utilisation, power, energy and SM clock cover the measured phase; peak memory and temperature the whole cell. Energy is of all the cell's GPUs together: J per measured step, mJ (millijoules) per measured token.";

/// A calibration figure's verdict against its threshold.
pub(crate) fn below_text(below: Option<bool>, threshold: Option<f64>) -> String {
    match below {
        Some(true) => match threshold {
            Some(t) => format!("⚠ below {}×", num(t)),
            None => "⚠ below".into(),
        },
        Some(false) => match threshold {
            Some(t) => format!("ok (≥ {}×)", num(t)),
            None => "ok".into(),
        },
        None => "no expected figure".into(),
    }
}

/// The GPU a calibration was checked as: `H100 (NVIDIA H100 80GB HBM3)`.
pub(crate) fn calibration_gpu(c: &CalibrationCell) -> String {
    match (&c.model, &c.gpu_name) {
        (Some(m), Some(n)) if m != n => format!("{m} ({n})"),
        (Some(m), _) => m.clone(),
        (None, Some(n)) => n.clone(),
        (None, None) => c.gpu.clone(),
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

pub fn render(r: &Report) -> String {
    let mut out = String::new();
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

    // Rankings.
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
            &mut out,
            &["#", "cell", "GPU", &metric, "$/1k tokens"],
            &[true, false, false, true, true],
            &rows,
        );
    }

    out.push_str("## Ranking by cost-efficiency ($ per 1k output tokens)\n\n");
    if r.cost_ranking.is_empty() {
        out.push_str(if r.has_cost() {
            "No succeeded cell has both a cost and an output-token rate.\n\n"
        } else {
            "No cell has a cost (records made before cost tracking): cost columns are empty.\n\n"
        });
    } else {
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
            &mut out,
            &["#", "cell", "GPU", "$/1k tokens", "output tokens/s", "$/GPU-hour"],
            &[true, false, false, true, true, true],
            &rows,
        );
        out.push_str("$/1k tokens = the cell's cost per second / its output tokens per second × 1000.\n\n");
        if let Some(n) = free_note(r) {
            let _ = writeln!(out, "{}\n", esc(&n));
        }
    }

    // Every cell.
    out.push_str("## Cells\n\n");
    let rows: Vec<Vec<String>> = r
        .cells
        .iter()
        .map(|c| {
            let l = c.latency.as_ref();
            vec![
                code(&c.id),
                c.status.clone(),
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
        &mut out,
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
        table(&mut out, &["cell", "benchmark", "parameters"], &[false; 3], &rows);
        out.push_str("</details>\n\n");
    }

    telemetry(&mut out, r);
    calibration(&mut out, r);

    // Comparisons.
    if !r.comparisons.is_empty() {
        out.push_str("## Comparisons\n\n");
        for cmp in &r.comparisons {
            let mut facts = vec![esc(&cmp.gpu), cmp.status.clone()];
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
                        if x.primary || !any_primary {
                            format!("**{}**", esc(&x.verdict))
                        } else {
                            esc(&x.verdict)
                        },
                    ]
                })
                .collect();
            if rows.is_empty() {
                out.push_str("No pair of variants was compared (a variant failed or measured nothing).\n\n");
            } else {
                table(
                    &mut out,
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
                        let _ = writeln!(out, "- `{m}` per round, `{}`: {}", v.name, vals.join(", "));
                    }
                    if cmp.variants.iter().any(|v| !v.values.is_empty()) {
                        out.push('\n');
                    }
                }
            }
            for v in cmp.variants.iter().filter(|v| v.status != "succeeded") {
                let _ = writeln!(
                    out,
                    "- variant `{}` {}: {}",
                    v.name,
                    esc(&v.status),
                    esc(v.failure.as_deref().unwrap_or(""))
                );
                if let Some(d) = &v.diagnosis {
                    let _ = writeln!(out, "  - cause `{}`; hint: {}", d.kind, esc(&d.hint));
                }
            }
            if cmp.variants.iter().any(|v| v.status != "succeeded") {
                out.push('\n');
            }
        }
    }

    // Failures.
    if !r.failures.is_empty() {
        out.push_str("## Failures\n\n");
        for f in &r.failures {
            let _ = writeln!(out, "### `{}`: {}\n", f.cell, esc(&f.status));
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

    // Hardware.
    out.push_str("## Hardware\n\n");
    if !r.has_hardware() {
        out.push_str("No cell recorded its hardware (records made before hardware identity).\n");
    } else {
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
            &mut out,
            &["cell", "asked", "GPUs", "driver", "CUDA", "CPU", "flags"],
            &[false; 7],
            &rows,
        );
    }
    out
}
