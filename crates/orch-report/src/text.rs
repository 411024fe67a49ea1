//! Plain-text phrases the markdown and the HTML report share (and the CSV's
//! hardware column): each format escapes them its own way.

use crate::fmt::{gib, num, usd};
use crate::model::{CalibrationCell, Report};
use orch_protocol::Hardware;
use orch_stats::Better;
use std::fmt::Write;

/// `higher is better`, `lower is better`.
pub(crate) fn better_text(b: Better) -> &'static str {
    match b {
        Better::Higher => "higher is better",
        Better::Lower => "lower is better",
    }
}

/// The GPUs a cell ran on, identical ones grouped: `8× NVIDIA H100 80GB HBM3 (80 GiB)`.
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

/// What the run cost, wasted and GPU-hours in one line.
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

/// `3 succeeded, 1 oom`.
pub(crate) fn counts_text(r: &Report) -> String {
    r.run
        .counts
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
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
