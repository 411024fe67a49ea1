//! The timed loop of a cell: the device opened and its free memory checked,
//! the model built, warm-up and measured steps, one untimed step for the
//! record, teardown.

use super::config::Resolved;
use super::memory::preflight_gpu;
use super::model::Model;
use super::step::{loss_and_norm, make_inputs, step, Inputs, Trained};
use crate::device::{dtype_name, open_device};
use crate::fused;
use candle_core::{Device, Tensor};
use orch_protocol::{Phase, TaskSpec};
use orch_workload::ctx::Ctx;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::time::Instant;

/// A candle error and the stage it happened in.
pub(super) struct BenchError {
    pub(super) stage: &'static str,
    pub(super) error: candle_core::Error,
}

fn at(stage: &'static str) -> impl Fn(candle_core::Error) -> BenchError {
    move |error| BenchError { stage, error }
}

pub(super) enum Outcome {
    Done {
        step_ms: Vec<f64>,
        params: usize,
    },
    Cancelled {
        phase: Phase,
    },
    /// The estimate exceeds the GPU's free memory: nothing was built.
    Oom(String),
}

pub(super) fn bench(
    r: &Resolved,
    task: &TaskSpec,
    ctx: &mut Ctx,
    info: &mut BTreeMap<String, Value>,
) -> Result<Outcome, BenchError> {
    let device = open_device(r.device).map_err(at("device setup"))?;
    if let Err(msg) = preflight_gpu(r, task, &device, info) {
        return Ok(Outcome::Oom(msg));
    }
    let seeded = device.set_seed(r.seed).is_ok();
    info.insert("weights_seeded".to_string(), json!(seeded));
    let model = Model::build(r, &device).map_err(at("model build"))?;
    let inputs = make_inputs(r, &device).map_err(at("model build"))?;
    device.synchronize().map_err(at("model build"))?;
    let params = model.param_count();
    ctx.message(format!(
        "transformer: {:.1}M params, {} on {} ({}), batch {} x context {}",
        params as f64 / 1e6,
        r.pass_name(),
        r.device.name(),
        dtype_name(r.dtype),
        r.batch,
        r.context
    ));

    if !warm_up(r, task, ctx, &device, &model, &inputs)? {
        return Ok(Outcome::Cancelled { phase: Phase::Warmup });
    }
    let Some(step_ms) = measure(r, task, ctx, &device, &model, &inputs)? else {
        return Ok(Outcome::Cancelled {
            phase: Phase::Measure,
        });
    };

    if let Some(peak) = crate::device::pool_peak_bytes(r.device, false) {
        info.insert("gpu_pool_peak_bytes".to_string(), json!(peak));
    }
    record_last_step(r, &model, &inputs, info)?;
    if let Some(ms) = fused::compile_ms() {
        info.insert("fused_compile_ms".to_string(), json!(ms));
    }

    ctx.enter(Phase::Teardown);
    drop(inputs);
    drop(model);
    device.synchronize().map_err(at("teardown"))?;
    Ok(Outcome::Done { step_ms, params })
}

/// The warm-up steps, untimed. `false`: a stop was requested (and the
/// teardown phase entered).
fn warm_up(
    r: &Resolved,
    task: &TaskSpec,
    ctx: &mut Ctx,
    device: &Device,
    model: &Model,
    inputs: &Inputs,
) -> Result<bool, BenchError> {
    let warmup = task.measure.warmup;
    ctx.enter(Phase::Warmup);
    for i in 0..warmup {
        if ctx.stop_requested() {
            ctx.enter(Phase::Teardown);
            return Ok(false);
        }
        drop(step(model, inputs, r).map_err(at("warm-up"))?);
        device.synchronize().map_err(at("warm-up"))?;
        ctx.progress(Phase::Warmup, u64::from(i) + 1, u64::from(warmup));
    }
    device.synchronize().map_err(at("warm-up"))?;
    Ok(true)
}

/// The measured steps, each timed between two device synchronisations, from
/// a reset memory-pool peak. `None`: a stop was requested (and the teardown
/// phase entered).
fn measure(
    r: &Resolved,
    task: &TaskSpec,
    ctx: &mut Ctx,
    device: &Device,
    model: &Model,
    inputs: &Inputs,
) -> Result<Option<Vec<f64>>, BenchError> {
    let reps = task.measure.repetitions;
    crate::device::pool_peak_bytes(r.device, true);
    ctx.enter(Phase::Measure);
    let mut step_ms = Vec::with_capacity(reps as usize);
    for i in 0..reps {
        if ctx.stop_requested() {
            ctx.enter(Phase::Teardown);
            return Ok(None);
        }
        device.synchronize().map_err(at("measure"))?;
        let t0 = Instant::now();
        drop(step(model, inputs, r).map_err(at("measure"))?);
        device.synchronize().map_err(at("measure"))?;
        step_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        ctx.progress(Phase::Measure, u64::from(i) + 1, u64::from(reps));
    }
    Ok(Some(step_ms))
}

/// One more step, outside the timing: its loss and gradient norm go into
/// the record (and, with `ORCH_TRANSFORMER_DUMP=FILE`, the weights, inputs
/// and gradients into a safetensors file, for comparison with PyTorch).
fn record_last_step(
    r: &Resolved,
    model: &Model,
    inputs: &Inputs,
    info: &mut BTreeMap<String, Value>,
) -> Result<(), BenchError> {
    if r.train() {
        if let Some(t) = step(model, inputs, r).map_err(at("measure"))? {
            let (loss, norm) = loss_and_norm(&t).map_err(at("measure"))?;
            info.insert("loss".to_string(), json!(loss));
            info.insert("grad_norm".to_string(), json!(norm));
            if let Some(path) = std::env::var_os("ORCH_TRANSFORMER_DUMP") {
                dump(model, inputs, t, &path)?;
            }
        }
    }
    Ok(())
}

/// The weights, inputs and gradients of a step into a safetensors file.
fn dump(model: &Model, inputs: &Inputs, t: Trained, path: &OsStr) -> Result<(), BenchError> {
    let mut all: HashMap<String, Tensor> = HashMap::new();
    for (name, p) in model.params() {
        all.insert(format!("param.{name}"), p.clone());
    }
    for (name, g) in t.grads {
        all.insert(format!("grad.{name}"), g);
    }
    all.insert("tokens".to_string(), inputs.tokens.clone());
    all.insert(
        "targets".to_string(),
        inputs.targets.flatten_all().map_err(at("measure"))?,
    );
    candle_core::safetensors::save(&all, path).map_err(at("measure"))
}
