//! What people read: live progress, tables, run summaries.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orch_protocol::{Event, Phase};
use orch_record::compare::{CompareInfo, Method, Role, Rounds};
use orch_record::RunRecord;
use orch_runner::Progress;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;

/// Live progress: a bar on a terminal, plain lines otherwise (both on stderr).
pub struct Reporter {
    bar: Option<ProgressBar>,
    total: usize,
    done: usize,
    running: BTreeMap<String, String>,
}

impl Reporter {
    pub fn new(run_id: &str, store: &Path, cells: usize, resumed: bool) -> Reporter {
        let verb = if resumed { "resuming" } else { "run" };
        eprintln!(
            "{verb} {run_id} ({cells} cells) in {}",
            store.join(run_id).display()
        );
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(cells as u64), ProgressDrawTarget::stderr());
            // The template is a constant known to be valid.
            let style =
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
            b.set_style(style);
            b.enable_steady_tick(std::time::Duration::from_millis(120));
            b
        });
        Reporter {
            bar,
            total: cells,
            done: 0,
            running: BTreeMap::new(),
        }
    }

    fn line(&self, text: String) {
        match &self.bar {
            Some(b) => b.println(text),
            None => eprintln!("{text}"),
        }
    }

    fn refresh(&self) {
        if let Some(b) = &self.bar {
            b.set_position(self.done as u64);
            let msg: Vec<String> = self.running.iter().map(|(c, s)| format!("{c} {s}")).collect();
            b.set_message(msg.join(" | "));
        }
    }

    pub fn handle(&mut self, p: Progress) {
        match p {
            Progress::Planned { total, skipped } => {
                self.total = total + skipped;
                self.done = skipped;
                if skipped > 0 {
                    self.line(format!("{skipped} cells already finished; running {total}"));
                }
            }
            Progress::CellStarted { cell_id, attempt } => {
                let again = if attempt > 1 {
                    format!(" (attempt {attempt})")
                } else {
                    String::new()
                };
                if self.bar.is_none() {
                    self.line(format!(
                        "[{}/{}] start {cell_id}{again}",
                        self.done + 1,
                        self.total
                    ));
                }
                self.running.insert(cell_id, "start".into());
            }
            Progress::Agent(e) => {
                let state = match &e.event {
                    Event::Phase { phase, .. } => Some(phase.as_str().to_string()),
                    Event::Progress { phase, done, total } => {
                        Some(format!("{} {done}/{total}", phase.as_str()))
                    }
                    Event::Message { text } => {
                        self.line(format!("  {}: {text}", e.cell_id));
                        None
                    }
                    _ => None,
                };
                if let Some(s) = state {
                    if self.bar.is_none() {
                        if let Event::Phase { phase, .. } = &e.event {
                            if *phase != Phase::Start {
                                self.line(format!("  {} {}", e.cell_id, s));
                            }
                        }
                    }
                    self.running.insert(e.cell_id, s);
                }
            }
            Progress::CellFinished(r) => {
                self.done += 1;
                self.running.remove(&r.id);
                let mut text = format!(
                    "[{}/{}] {} {} ({:.1}s)",
                    self.done, self.total, r.status, r.id, r.duration_s
                );
                if let Some(c) = r.cost.as_ref().filter(|c| c.usd > 0.0) {
                    text.push_str(&format!(" {}", orch_cost::fmt_usd(c.usd)));
                }
                if let Some(m) = headline_metrics(&r.metrics) {
                    text.push_str(&format!(" {m}"));
                }
                if let Some(f) = &r.failure {
                    text.push_str(&format!("\n    {}: {}", f.kind, f.message));
                }
                if let Some(d) = &r.diagnosis {
                    text.push_str(&format!("\n    cause: {} (hint: {})", d.kind, d.hint));
                }
                self.line(text);
            }
            Progress::CellNotRun { cell_id, why } => {
                self.running.remove(&cell_id);
                self.line(format!("error: cell `{cell_id}` {why}"));
            }
        }
        self.refresh();
    }

    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// The two or three numbers worth a glance: the builtin transformer's, a
/// comparison's primary metric per variant, else the workload's own metrics
/// (rates first) before the agent's telemetry (`gpu_*`, `telemetry_*`).
fn headline_metrics(m: &BTreeMap<String, f64>) -> Option<String> {
    let preferred = ["step_time_mean_ms", "step_time_cv_pct", "tokens_per_s", "params"];
    let mut parts: Vec<String> = preferred
        .iter()
        .filter_map(|k| m.get(*k).map(|v| format!("{k}={}", fmt_num(*v))))
        .collect();
    if parts.is_empty() {
        // A comparison's per-variant means (`<variant>.<metric>`).
        if let Some(p) = orch_stats::PRIMARY_ORDER
            .iter()
            .find(|p| m.keys().any(|k| k.split_once('.').is_some_and(|(_, x)| x == **p)))
        {
            parts = m
                .iter()
                .filter(|(k, _)| k.split_once('.').is_some_and(|(_, x)| x == *p))
                .map(|(k, v)| format!("{k}={}", fmt_num(*v)))
                .collect();
        }
    }
    if parts.is_empty() {
        let telemetry = |k: &str| k.starts_with("gpu_") || k.starts_with("telemetry_");
        let rate = |k: &str| k.ends_with("_per_s") || k.contains("throughput");
        let mut names: Vec<&String> = m.keys().collect();
        names.sort_by_key(|k| (telemetry(k), !rate(k), k.as_str()));
        parts = names
            .into_iter()
            .take(3)
            .map(|k| format!("{k}={}", fmt_num(m[k])))
            .collect();
    }
    (!parts.is_empty()).then(|| parts.join(" "))
}

pub fn fmt_num(v: f64) -> String {
    if v != 0.0 && (v.abs() >= 1e6 || v.abs() < 1e-3) {
        format!("{v:.3e}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

pub fn counts_text(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Left-aligned columns.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut push = |cells: Vec<&str>| {
        let line: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{:<w$}", c, w = widths.get(i).copied().unwrap_or(0)))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    };
    push(header.to_vec());
    for r in rows {
        push(r.iter().map(String::as_str).collect());
    }
    out
}

/// `orch show` and the end of `orch run`.
pub fn run_text(rec: &RunRecord, dir: &Path) -> String {
    let mut out = format!(
        "run {}  suite {}  backend {}  {}\n",
        rec.id, rec.suite, rec.backend, rec.state
    );
    let rows: Vec<Vec<String>> = rec
        .cells
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.status.to_string(),
                c.gpu.clone(),
                c.duration_s.map(|d| format!("{d:.1}s")).unwrap_or_default(),
                crate::commands::cost::cell_cost_text(c),
                headline_metrics(&c.metrics).unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["CELL", "STATUS", "GPU", "TIME", "COST", "METRICS"],
        &rows,
    ));
    for c in &rec.cells {
        out.push_str(&comparison_text(c));
    }
    out.push_str(&hardware_text(rec));
    let failures: Vec<_> = rec
        .cells
        .iter()
        .filter_map(|c| c.failure.as_ref().map(|f| (c, f)))
        .collect();
    if !failures.is_empty() {
        out.push_str("\nfailures:\n");
        for (c, f) in failures {
            out.push_str(&format!("  {} ({}): {}\n", c.id, f.kind, f.message));
            if let Some(d) = &c.diagnosis {
                out.push_str(&format!("    cause: {}\n", d.kind));
                for e in d.evidence.iter().take(3) {
                    out.push_str(&format!("      | {e}\n"));
                }
                out.push_str(&format!("    hint: {}\n", d.hint));
            }
        }
        out.push_str(&format!("logs: orch logs {}\n", rec.id));
    }
    out.push_str(&crate::commands::cost::run_cost_text(rec));
    out.push_str(&format!(
        "{} — stored in {}\n",
        counts_text(&rec.counts),
        dir.display()
    ));
    out
}

/// The machines the cells got (one line per distinct machine) and the cells
/// whose numbers are suspect (`hardware_mismatch`, `degraded_gpu`).
fn hardware_text(rec: &RunRecord) -> String {
    let mut machines: Vec<String> = Vec::new();
    for hw in rec.cells.iter().filter_map(|c| c.hardware.as_ref()) {
        let gpus = if hw.gpus.is_empty() {
            "no GPU".to_string()
        } else {
            let mut names: Vec<&str> = hw.gpus.iter().map(|g| g.name.as_str()).collect();
            names.dedup();
            format!("{} x {}", hw.gpus.len(), names.join(" + "))
        };
        let mut line = format!("{gpus}, {} CPUs", hw.cpus);
        if let Some(d) = &hw.driver_version {
            line.push_str(&format!(", driver {d}"));
        }
        if let Some(c) = &hw.cuda_version {
            line.push_str(&format!(", CUDA {c}"));
        }
        if !machines.contains(&line) {
            machines.push(line);
        }
    }
    let mut out = String::new();
    if !machines.is_empty() {
        out.push_str(&format!("hardware: {}\n", machines.join("; ")));
    }
    let flagged: Vec<_> = rec.cells.iter().filter(|c| !c.flags.is_empty()).collect();
    if !flagged.is_empty() {
        out.push_str("flags:\n");
        for c in flagged {
            let why = c
                .hardware
                .as_ref()
                .and_then(|h| h.mismatch.clone())
                .or_else(|| {
                    c.info
                        .get("calibration_check")
                        .and_then(|v| v["below"].as_array())
                        .map(|b| b.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join("; "))
                })
                .unwrap_or_default();
            out.push_str(&format!("  {} [{}] {}\n", c.id, c.flags.join(", "), why));
        }
    }
    out
}

/// The comparison table of a `compare` cell (empty for other cells): per
/// pair the primary metric (which decides the verdict) with its n, interval,
/// minimum detectable effect and per-round values, then the headline
/// secondary metrics with Holm-adjusted p-values. A comparison whose `info`
/// does not read is a warning on stderr.
fn comparison_text(c: &orch_record::CellView) -> String {
    let info = match CompareInfo::from_info(&c.info) {
        None => return String::new(),
        Some(Ok(info)) => info,
        Some(Err(e)) => {
            eprintln!("warning: cannot read the comparison of cell `{}`: {e}", c.id);
            return String::new();
        }
    };
    let list = &info.comparison;
    let key = [
        "output_throughput",
        "request_throughput",
        "mean_ttft_ms",
        "median_itl_ms",
        "mean_tpot_ms",
        "mean_e2el_ms",
    ];
    let has_key = list.iter().any(|x| key.contains(&x.metric.as_str()));
    let pct = |v: Option<f64>| v.map(|m| format!("{:.1}%", m * 100.0)).unwrap_or_default();
    let rows: Vec<Vec<String>> = list
        .iter()
        .filter(|x| x.is_primary() || !has_key || key.contains(&x.metric.as_str()))
        .map(|x| {
            let p = x.p_adjusted.or(x.p_value);
            vec![
                format!("{} vs {}", x.other, x.base),
                format!("{}{}", x.metric, if x.is_primary() { " (primary)" } else { "" }),
                x.n.map(|n| n.to_string()).unwrap_or_default(),
                format!("{:.3}", x.ratio),
                format!("[{:.3}, {:.3}]", x.ci_low, x.ci_high),
                pct(x.mde),
                p.map(|p| format!("{p:.3}")).unwrap_or_default(),
                x.verdict.to_string(),
            ]
        })
        .collect();
    let mut facts = Vec::new();
    if let Some(m) = &info.primary_metric {
        facts.push(format!("primary metric {m}"));
    }
    match info.method {
        Some(Method::StudentT) => facts.push("paired log-ratios, Student t 95%".to_string()),
        Some(m) => facts.push(format!("{m} 95%")),
        None => facts.push("95% bootstrap interval".to_string()),
    }
    let mut r = format!("{} rounds", info.rounds);
    if info.rounds_requested == Some(Rounds::Auto) {
        r.push_str(&format!(" (auto, at most {})", info.max_rounds.unwrap_or(0)));
    }
    if let Some(why) = info.stopped_by {
        r.push_str(&format!(", stopped by {why}"));
    }
    facts.push(r);
    if let Some(seed) = info.seed {
        facts.push(format!("order seed {seed}"));
    }
    let mut out = format!("\ncomparison in {} ({}):\n", c.id, facts.join("; "));
    out.push_str(&table(
        &["PAIR", "METRIC", "N", "RATIO", "95% CI", "MDE", "P", "VERDICT"],
        &rows,
    ));
    if list.iter().any(|x| x.role == Some(Role::Secondary)) {
        out.push_str(
            "ratio = other / base; the primary metric decides the verdict; other metrics: p adjusted (Holm) over the pair's metrics; MDE: smallest difference found 80% of the time at this n\n",
        );
    }
    // The primary metric's value in every round, per variant.
    if let Some(m) = &info.primary_metric {
        for (name, v) in &info.variants {
            if let Some(vals) = v.values.get(m).filter(|a| !a.is_empty()) {
                let vals: Vec<String> = vals.iter().map(|x| format!("{x:.2}")).collect();
                out.push_str(&format!("  {m} per round, {name}: {}\n", vals.join(" ")));
            }
        }
    }
    for (name, v) in &info.variants {
        if v.failed() {
            out.push_str(&format!(
                "variant {name} failed: {}\n",
                v.failure.as_deref().unwrap_or("")
            ));
            if let Some(d) = &v.diagnosis {
                out.push_str(&format!("  cause: {}; hint: {}\n", d.kind, d.hint));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn headline_puts_the_workloads_metrics_before_telemetry() {
        let got = headline_metrics(&m(&[
            ("gpu_energy_j", 5.0),
            ("gpu_util_mean_pct", 90.0),
            ("step_ms", 12.5),
            ("samples_per_s", 80.0),
        ]))
        .unwrap();
        assert_eq!(got, "samples_per_s=80 step_ms=12.500 gpu_energy_j=5");
    }

    #[test]
    fn headline_of_a_comparison_is_its_primary_metric_per_variant() {
        let got = headline_metrics(&m(&[
            ("base.completed", 12.0),
            ("base.output_throughput", 800.0),
            ("faster.completed", 12.0),
            ("faster.output_throughput", 880.5),
        ]))
        .unwrap();
        assert_eq!(got, "base.output_throughput=800 faster.output_throughput=880.500");
    }
}
