//! Builtin workload: a decoder-only transformer (GPT-2 style, pre-LayerNorm)
//! with random weights, timed step by step like cs336's `benchmark.py`.
//!
//! A step is one forward pass over a random batch of tokens, plus the backward
//! pass (gradients of a mean cross-entropy loss) when the pass is `train`. No
//! optimizer step is taken: the weights never change.
//!
//! Forward-only cells build their weights as plain (detached) tensors, so
//! candle records no backward graph and frees each layer's intermediates as
//! soon as they are used; `train` cells build them as variables.
//!
//! Seeding: the input tokens always come from `seed`. The weights come from
//! the device's generator, seeded with `seed` where the backend allows it
//! (CUDA); candle's CPU backend cannot be seeded, so CPU weights differ from
//! run to run (`info.weights_seeded` says which). Random weights do not change
//! the work a step does, only its numbers.
//!
//! The module's files: `config.rs` (presets, defaults, [`Kernels`],
//! `resolve`), `memory.rs` (the peak estimate and the preflights),
//! `model.rs` (parameters and the unfused forward), `backward.rs` (the fused
//! forward and its written-out backward, the fused ops under autograd),
//! `step.rs` (inputs and one step), `bench.rs` (the timed loop), `check.rs`
//! ([`check_model`]).

mod backward;
mod bench;
mod check;
mod config;
mod memory;
mod model;
mod step;
#[cfg(test)]
mod tests;

pub use check::check_model;
pub use config::Kernels;

use crate::device::DeviceKind;
use bench::{bench, BenchError, Outcome};
use config::{resolve, Resolved};
use orch_protocol::{CellResult, FailureKind, Status, TaskSpec, TransformerConfig};
use orch_workload::ctx::Ctx;
use orch_workload::{stats, sysmem};
use serde_json::Value;
use std::collections::BTreeMap;

pub(crate) fn is_oom(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("out of memory") || t.contains("out_of_memory") || t.contains("outofmemory")
}

/// Run the transformer benchmark for one cell. The caller has entered
/// [`Phase::Start`](orch_protocol::Phase::Start) and collects the phase timings afterwards.
pub fn run(cfg: &TransformerConfig, task: &TaskSpec, ctx: &mut Ctx) -> CellResult {
    let cell = task.cell_id.as_str();
    let r = match resolve(cfg, task) {
        Ok(r) => r,
        Err(msg) => return CellResult::failed(cell, Status::Failed, FailureKind::InvalidConfig, msg),
    };
    let mut info = r.info();
    let with_info = |mut result: CellResult, info: BTreeMap<String, Value>| {
        result.info.extend(info);
        result
    };
    if task.measure.repetitions == 0 {
        let result = CellResult::failed(
            cell,
            Status::Failed,
            FailureKind::InvalidConfig,
            "transformer `repetitions` must be at least 1",
        );
        return with_info(result, info);
    }

    // Memory preflight, before anything is allocated.
    if let Err(msg) = memory::preflight(&r, task, &mut info) {
        return with_info(CellResult::failed(cell, Status::Oom, FailureKind::Oom, msg), info);
    }

    if ctx.stop_requested() {
        let result = CellResult::failed(
            cell,
            Status::Cancelled,
            FailureKind::Cancelled,
            "stop requested before the model was built",
        );
        return with_info(result, info);
    }

    let result = result_of(&r, cell, bench(&r, task, ctx, &mut info));
    with_info(result, info)
}

/// The cell's result from what the timed loop gave.
fn result_of(r: &Resolved, cell: &str, outcome: Result<Outcome, BenchError>) -> CellResult {
    match outcome {
        Ok(Outcome::Cancelled { phase }) => {
            let msg = format!("stop requested during {}", phase.as_str());
            CellResult::failed(cell, Status::Cancelled, FailureKind::Cancelled, msg)
        }
        Ok(Outcome::Oom(msg)) => CellResult::failed(cell, Status::Oom, FailureKind::Oom, msg),
        Err(BenchError { stage, error }) => {
            let text = error.to_string();
            let first = text.lines().next().unwrap_or("").trim();
            let msg = format!("transformer {stage} failed: {first}");
            if is_oom(&text) {
                CellResult::failed(cell, Status::Oom, FailureKind::Oom, msg)
            } else {
                CellResult::failed(cell, Status::Failed, FailureKind::WorkloadError, msg)
            }
        }
        Ok(Outcome::Done { step_ms, params }) => succeeded(r, cell, &step_ms, params),
    }
}

/// A finished cell's metrics: step time statistics, tokens per second, the
/// parameter count, the FLOPs estimate and (on the CPU) the peak memory.
fn succeeded(r: &Resolved, cell: &str, step_ms: &[f64], params: usize) -> CellResult {
    let mut result = CellResult::new(cell, Status::Succeeded);
    if let Some(summary) = stats::summarize(step_ms) {
        summary.insert_into(&mut result.metrics, "step_time", "_ms");
        if summary.mean > 0.0 {
            result.metrics.insert(
                "tokens_per_s".to_string(),
                r.tokens() as f64 / (summary.mean / 1e3),
            );
        }
    }
    let params = params as f64;
    result.metrics.insert("params".to_string(), params);
    let factor = if r.train() { 6.0 } else { 2.0 };
    result.metrics.insert(
        "flops_per_step_estimate".to_string(),
        factor * params * r.tokens() as f64,
    );
    if r.device == DeviceKind::Cpu {
        if let Some(peak) = sysmem::peak_rss_bytes() {
            result
                .metrics
                .insert("peak_memory_bytes".to_string(), peak as f64);
        }
    }
    result
}
