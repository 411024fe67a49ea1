//! A scored campaign as text: the headline (`orch show`), markdown, CSV (one
//! row per task), JSON (the whole [`Campaign`]), and a self-contained HTML
//! page (headline, a forest plot of the agent's speedup per task sorted by
//! speedup, the per-task table, the failure table with links to the logs).

use crate::{Campaign, CampaignComparison, Outcome, PairScore, Share, TaskScore};
use std::fmt::Write;

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.1}%", x * 100.0)
    } else {
        "-".into()
    }
}

fn share_text(s: &Share) -> String {
    if s.of == 0 {
        return "- (no task)".into();
    }
    format!(
        "{}/{} = {} [{}, {}]",
        s.count,
        s.of,
        pct(s.rate.value),
        pct(s.rate.ci_low),
        pct(s.rate.ci_high)
    )
}

fn pair_text(p: &Option<PairScore>) -> String {
    match p {
        Some(p) => format!(
            "{:.3}x [{:.3}, {:.3}] {}",
            p.speedup,
            p.ci_low,
            p.ci_high,
            p.verdict.as_str()
        ),
        None => "-".into(),
    }
}

/// The headline in a few lines (`orch show`, the top of every report).
pub fn headline(c: &Campaign) -> String {
    let h = &c.headline;
    let mut s = String::new();
    let _ = writeln!(s, "campaign {} ({}): {} tasks", c.run, c.suite, h.tasks);
    let _ = writeln!(s, "  valid tasks       {}", share_text(&h.valid));
    if h.with_human > 0 {
        let parts: Vec<String> = [Outcome::Won, Outcome::Matched, Outcome::Lost, Outcome::Failed]
            .iter()
            .filter_map(|o| {
                h.iso
                    .get(o)
                    .map(|sh| format!("{} {}", o.as_str(), share_text(sh)))
            })
            .collect();
        let _ = writeln!(
            s,
            "  vs human (ISO-Bench, ±{:.0}%): {}",
            c.options.match_band * 100.0,
            parts.join("; ")
        );
        for (k, sh) in h.opt_at.iter().enumerate() {
            let _ = writeln!(s, "  Opt@{} (GSO)       {}", k + 1, share_text(sh));
        }
    } else {
        let _ = writeln!(s, "  vs human          - (no valid task has a human change)");
    }
    let _ = writeln!(
        s,
        "  SWE-Perf gain     agent {} [{}, {}], human {} [{}, {}] (mean over {} valid tasks)",
        pct(h.swe_perf_agent.value),
        pct(h.swe_perf_agent.ci_low),
        pct(h.swe_perf_agent.ci_high),
        pct(h.swe_perf_human.value),
        pct(h.swe_perf_human.ci_low),
        pct(h.swe_perf_human.ci_high),
        h.valid.count
    );
    if let Some(g) = h.agent_speedup_geomean {
        let _ = writeln!(
            s,
            "  agent speedup     {g:.3}x (geometric mean over correct attempts)"
        );
    }
    let cost = match h.cost_per_valid_usd {
        Some(v) => format!("${:.2} (${v:.2} per valid task)", h.cost_usd),
        None => format!("${:.2} (no valid task)", h.cost_usd),
    };
    let _ = writeln!(s, "  cost              {cost}");
    let with_aa = c.tasks.iter().filter(|t| t.aa.is_some()).count();
    if with_aa > 0 {
        let _ = writeln!(
            s,
            "  A/A               {} of {with_aa} tasks not `same`{}",
            h.aa_alarms.len(),
            if h.aa_alarms.is_empty() {
                String::new()
            } else {
                format!(
                    " ({}): their rounds are noisier than their intervals say",
                    h.aa_alarms.join(", ")
                )
            }
        );
    }
    let removed: Vec<String> = c
        .failures
        .iter()
        .map(|f| {
            format!(
                "{} in {} ({} task{}{})",
                f.kind,
                f.variant,
                f.tasks.len(),
                if f.tasks.len() == 1 { "" } else { "s" },
                if f.invalidates { ", invalid" } else { "" }
            )
        })
        .collect();
    if !removed.is_empty() {
        let _ = writeln!(s, "  causes            {}", removed.join("; "));
    }
    s
}

fn outcome_of(t: &TaskScore) -> &'static str {
    match (t.valid, t.outcome) {
        (false, _) => "invalid",
        (true, Some(o)) => o.as_str(),
        (true, None) => "no human",
    }
}

fn cause_of(t: &TaskScore) -> String {
    t.cause
        .as_ref()
        .or_else(|| t.agent().and_then(|a| a.cause.as_ref()))
        .map(|c| format!("{} in {}", c.kind, c.variant))
        .unwrap_or_default()
}

/// The tasks sorted by the agent's speedup over the baseline (best first;
/// tasks without one last, by id).
fn by_speedup(c: &Campaign) -> Vec<&TaskScore> {
    let key = |t: &TaskScore| {
        t.agent()
            .filter(|a| a.correct)
            .and_then(|a| a.vs_baseline.as_ref())
            .map(|p| p.speedup)
    };
    let mut ts: Vec<&TaskScore> = c.tasks.iter().collect();
    ts.sort_by(|a, b| match (key(a), key(b)) {
        (Some(x), Some(y)) => y.total_cmp(&x),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => a.id.cmp(&b.id),
    });
    ts
}

pub fn markdown(c: &Campaign) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Campaign `{}` ({})\n", c.suite, c.run);
    let _ = writeln!(s, "```\n{}```\n", headline(c));
    let _ = writeln!(s, "## Tasks (by the agent's speedup)\n");
    let _ = writeln!(
        s,
        "| task | gpu | outcome | agent vs baseline | human vs baseline | agent vs human | Opt@1 | gain | cause | cost |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|");
    for t in by_speedup(c) {
        let a = t.agent();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | ${:.2} |",
            t.id,
            t.gpu,
            outcome_of(t),
            pair_text(&a.and_then(|a| a.vs_baseline.clone())),
            pair_text(&t.human_vs_baseline),
            pair_text(&a.and_then(|a| a.vs_human.clone())),
            if t.opt_at.first().copied().unwrap_or(false) {
                "yes"
            } else {
                "no"
            },
            a.map(|a| pct(a.gain)).unwrap_or_else(|| "-".into()),
            cause_of(t),
            t.cost_usd
        );
    }
    let _ = writeln!(s, "\n## Failures\n");
    if c.failures.is_empty() {
        let _ = writeln!(s, "No task failed.");
    } else {
        let _ = writeln!(s, "| cause | variant | tasks | removes the task | which |");
        let _ = writeln!(s, "|---|---|---|---|---|");
        for f in &c.failures {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                f.kind,
                f.variant,
                f.tasks.len(),
                if f.invalidates {
                    "yes (invalid)"
                } else {
                    "no (agent failed)"
                },
                f.tasks.join(", ")
            );
        }
    }
    let _ = writeln!(
        s,
        "\nScores: ISO-Bench's split against the human (±{:.0}%), GSO's Opt@K (> {:.2} of the human's speedup, at least {:.1}x over the baseline), SWE-Perf's gain (Mann-Whitney U, p < {}); 95% bootstrap intervals over tasks ({} resamples). Definitions: docs/campaigns.md.",
        c.options.match_band * 100.0,
        c.options.opt_threshold,
        c.options.opt_min_speedup,
        c.options.swe_perf_alpha,
        c.options.resamples
    );
    s
}

fn csv_field(x: &str) -> String {
    if x.contains([',', '"', '\n']) {
        format!("\"{}\"", x.replace('"', "\"\""))
    } else {
        x.to_string()
    }
}

fn num(x: Option<f64>) -> String {
    x.filter(|v| v.is_finite())
        .map(|v| format!("{v:.6}"))
        .unwrap_or_default()
}

/// One row per task.
pub fn csv(c: &Campaign) -> String {
    let mut s = String::from(
        "task,row,cell,gpu,status,valid,outcome,agent_speedup,agent_ci_low,agent_ci_high,agent_verdict,human_speedup,human_verdict,agent_vs_human,agent_vs_human_verdict,opt_at_1,opt_at_k,agent_gain,human_gain,cause,cause_variant,cost_usd\n",
    );
    for t in &c.tasks {
        let a = t.agent();
        let vb = a.and_then(|a| a.vs_baseline.as_ref());
        let vh = a.and_then(|a| a.vs_human.as_ref());
        let cause = t.cause.as_ref().or_else(|| a.and_then(|a| a.cause.as_ref()));
        let row = [
            t.id.clone(),
            t.row.to_string(),
            t.cell.clone(),
            t.gpu.clone(),
            t.status.as_str().into(),
            t.valid.to_string(),
            outcome_of(t).into(),
            num(vb.map(|p| p.speedup)),
            num(vb.map(|p| p.ci_low)),
            num(vb.map(|p| p.ci_high)),
            vb.map(|p| p.verdict.as_str().to_string()).unwrap_or_default(),
            num(t.human_vs_baseline.as_ref().map(|p| p.speedup)),
            t.human_vs_baseline
                .as_ref()
                .map(|p| p.verdict.as_str().to_string())
                .unwrap_or_default(),
            num(vh.map(|p| p.speedup)),
            vh.map(|p| p.verdict.as_str().to_string()).unwrap_or_default(),
            t.opt_at.first().map(|b| b.to_string()).unwrap_or_default(),
            t.opt_at.last().map(|b| b.to_string()).unwrap_or_default(),
            num(a.map(|a| a.gain)),
            num(t.human_gain),
            cause.map(|c| c.kind.clone()).unwrap_or_default(),
            cause.map(|c| c.variant.clone()).unwrap_or_default(),
            format!("{:.6}", t.cost_usd),
        ];
        let line: Vec<String> = row.iter().map(|f| csv_field(f)).collect();
        s.push_str(&line.join(","));
        s.push('\n');
    }
    s
}

pub fn json(c: &Campaign) -> String {
    // A campaign is plain data: serialising it cannot fail.
    serde_json::to_string_pretty(c).unwrap_or_default()
}

fn esc(x: &str) -> String {
    x.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained page: no script, no outside file; the forest plot is
/// SVG drawn here.
pub fn html(c: &Campaign) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>campaign {}</title><style>\
body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:1em 0}}\
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}pre{{background:#f6f6f6;padding:1em}}\
.won{{color:#1a7f37}}.lost,.failed,.invalid{{color:#b42318}}.matched{{color:#555}}</style></head><body>",
        esc(&c.run)
    );
    let _ = write!(s, "<h1>Campaign <code>{}</code></h1>", esc(&c.suite));
    let _ = write!(s, "<pre id=\"headline\">{}</pre>", esc(&headline(c)));
    // Forest plot: one row per task with a speedup, log scale.
    let rows: Vec<(&TaskScore, &PairScore)> = by_speedup(c)
        .into_iter()
        .filter_map(|t| {
            t.agent()
                .filter(|a| a.correct)
                .and_then(|a| a.vs_baseline.as_ref())
                .filter(|p| p.speedup.is_finite() && p.ci_low > 0.0 && p.ci_high.is_finite())
                .map(|p| (t, p))
        })
        .collect();
    let _ = write!(s, "<h2>The agent's speedup over the baseline, per task</h2>");
    if rows.is_empty() {
        let _ = write!(s, "<p>No task has a correct attempt to plot.</p>");
    } else {
        let lo = rows.iter().map(|(_, p)| p.ci_low.ln()).fold(0.0f64, f64::min) - 0.05;
        let hi = rows.iter().map(|(_, p)| p.ci_high.ln()).fold(0.0f64, f64::max) + 0.05;
        let (w, left, row_h) = (640.0, 160.0, 22.0);
        let height = row_h * rows.len() as f64 + 40.0;
        let x = |v: f64| left + (v.ln() - lo) / (hi - lo) * (w - left - 20.0);
        let _ = write!(
            s,
            "<svg id=\"forest\" width=\"{w}\" height=\"{height}\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"12\">"
        );
        let one = x(1.0);
        let _ = write!(
            s,
            "<line x1=\"{one:.1}\" y1=\"0\" x2=\"{one:.1}\" y2=\"{:.1}\" stroke=\"#999\" stroke-dasharray=\"4\"/>",
            height - 20.0
        );
        for (i, (t, p)) in rows.iter().enumerate() {
            let y = 15.0 + row_h * i as f64;
            let colour = match t.outcome {
                Some(Outcome::Won) => "#1a7f37",
                Some(Outcome::Lost) | Some(Outcome::Failed) => "#b42318",
                _ => "#444",
            };
            let _ = write!(
                s,
                "<g class=\"task\" data-task=\"{}\" data-speedup=\"{:.4}\"><text x=\"4\" y=\"{:.1}\">{}</text>\
<line x1=\"{:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
<circle cx=\"{:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"{colour}\"/></g>",
                esc(&t.id),
                p.speedup,
                y + 4.0,
                esc(&t.id),
                x(p.ci_low),
                x(p.ci_high),
                x(p.speedup)
            );
        }
        let _ = write!(
            s,
            "<text x=\"{one:.1}\" y=\"{:.1}\" text-anchor=\"middle\">1.0x (the baseline)</text></svg>",
            height - 5.0
        );
    }
    let _ = write!(
        s,
        "<h2>Tasks</h2><table id=\"tasks\"><tr><th>task</th><th>gpu</th><th>outcome</th><th>agent vs baseline</th><th>human vs baseline</th><th>agent vs human</th><th>Opt@1</th><th>gain</th><th>cause</th><th>cost</th><th>logs</th></tr>"
    );
    for t in by_speedup(c) {
        let a = t.agent();
        let logs = t
            .folder
            .as_ref()
            .map(|f| format!("<a href=\"{}\">logs</a>", esc(f)))
            .unwrap_or_default();
        let o = outcome_of(t);
        let _ = write!(
            s,
            "<tr class=\"task-row\" data-task=\"{}\"><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>${:.2}</td><td>{}</td></tr>",
            esc(&t.id),
            esc(&t.id),
            esc(&t.gpu),
            o.replace(' ', "-"),
            o,
            esc(&pair_text(&a.and_then(|a| a.vs_baseline.clone()))),
            esc(&pair_text(&t.human_vs_baseline)),
            esc(&pair_text(&a.and_then(|a| a.vs_human.clone()))),
            if t.opt_at.first().copied().unwrap_or(false) { "yes" } else { "no" },
            a.map(|a| pct(a.gain)).unwrap_or_else(|| "-".into()),
            esc(&cause_of(t)),
            t.cost_usd,
            logs
        );
    }
    let _ = write!(s, "</table><h2>Failures</h2>");
    if c.failures.is_empty() {
        let _ = write!(s, "<p>No task failed.</p>");
    } else {
        let _ = write!(
            s,
            "<table id=\"failures\"><tr><th>cause</th><th>variant</th><th>tasks</th><th>removes the task</th><th>which</th></tr>"
        );
        let folder_of = |id: &str| c.tasks.iter().find(|t| t.id == id).and_then(|t| t.folder.clone());
        for f in &c.failures {
            let which: Vec<String> = f
                .tasks
                .iter()
                .map(|id| match folder_of(id) {
                    Some(d) => format!("<a href=\"{}\">{}</a>", esc(&d), esc(id)),
                    None => esc(id),
                })
                .collect();
            let _ = write!(
                s,
                "<tr class=\"failure\" data-kind=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&f.kind),
                esc(&f.kind),
                esc(&f.variant),
                f.tasks.len(),
                if f.invalidates { "yes" } else { "no (agent)" },
                which.join(", ")
            );
        }
        let _ = write!(s, "</table>");
    }
    let _ = writeln!(
        s,
        "<p>Definitions and sources: docs/campaigns.md.</p></body></html>"
    );
    s
}

/// Two campaigns compared task by task.
pub fn comparison(c: &CampaignComparison) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "campaign {} against {} on {} common valid tasks",
        c.b,
        c.a,
        c.tasks.len()
    );
    let _ = writeln!(
        s,
        "  SWE-Perf gain, B - A   {:+.2} points [{:+.2}, {:+.2}], paired sign-flip p = {:.3}",
        c.gain_diff.value * 100.0,
        c.gain_diff.ci_low * 100.0,
        c.gain_diff.ci_high * 100.0,
        c.gain_p
    );
    let _ = writeln!(
        s,
        "  speedup, B / A         {:.3}x [{:.3}, {:.3}], paired sign-flip p = {:.3}",
        c.speedup_ratio.value, c.speedup_ratio.ci_low, c.speedup_ratio.ci_high, c.speedup_p
    );
    let _ = writeln!(
        s,
        "  Opt@1 only in A: {}; only in B: {}",
        if c.opt_only_a.is_empty() {
            "-".into()
        } else {
            c.opt_only_a.join(", ")
        },
        if c.opt_only_b.is_empty() {
            "-".into()
        } else {
            c.opt_only_b.join(", ")
        }
    );
    if !c.only_a.is_empty() || !c.only_b.is_empty() {
        let _ = writeln!(
            s,
            "  valid in one only: A {}; B {}",
            if c.only_a.is_empty() {
                "-".into()
            } else {
                c.only_a.join(", ")
            },
            if c.only_b.is_empty() {
                "-".into()
            } else {
                c.only_b.join(", ")
            }
        );
    }
    let _ = writeln!(s, "  task         A          B");
    for (id, a, b) in &c.outcomes {
        let f = |o: &Option<Outcome>| o.map(|o| o.as_str()).unwrap_or("-");
        let _ = writeln!(s, "  {id:<12} {:<10} {}", f(a), f(b));
    }
    s
}
