//! The workload's configuration: size presets, defaults, the kernels a step
//! runs with, and [`resolve`] (presets and defaults applied, checked).

use crate::device::{default_device, dtype_name, parse_device, parse_dtype, DeviceKind};
use candle_core::DType;
use orch_protocol::{Pass, TaskSpec, TransformerConfig};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Size presets: (name, [d_model, layers, heads, d_ff]).
const PRESETS: &[(&str, [usize; 4])] = &[
    ("nano", [64, 2, 4, 256]),
    ("tiny", [128, 4, 4, 512]),
    ("mini", [256, 4, 8, 1024]),
    ("small", [768, 12, 12, 3072]),
    ("medium", [1024, 24, 16, 4096]),
    ("large", [1280, 36, 20, 5120]),
    ("xl", [1600, 48, 25, 6400]),
    ("2.7B", [2560, 32, 32, 10240]),
];

const DEFAULT_CONTEXT: usize = 512;
const DEFAULT_BATCH: usize = 4;
const DEFAULT_VOCAB: usize = 10_000;

/// The configuration with presets and defaults applied, checked.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Resolved {
    pub(super) preset: Option<&'static str>,
    pub(super) d_model: usize,
    pub(super) layers: usize,
    pub(super) heads: usize,
    pub(super) d_ff: usize,
    pub(super) context: usize,
    pub(super) batch: usize,
    pub(super) vocab: usize,
    pub(super) pass: Pass,
    pub(super) dtype: DType,
    pub(super) device: DeviceKind,
    pub(super) seed: u64,
    pub(super) kernels: Kernels,
}

/// How a step is computed. `Fused` (the default for f32 and bf16): the fused
/// ops of [`crate::fused`], forward and a written-out backward. `Autograd`: the
/// same fused ops as candle custom ops under `Tensor::backward`. `Unfused`:
/// candle's own element-wise ops under `Tensor::backward` (the composition the
/// fused ops are checked against; also used for f16). Chosen with
/// `ORCH_TRANSFORMER_KERNELS` for A/B measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    Fused,
    Autograd,
    Unfused,
}

impl Kernels {
    pub(super) fn name(self) -> &'static str {
        match self {
            Kernels::Fused => "fused",
            Kernels::Autograd => "fused-autograd",
            Kernels::Unfused => "unfused",
        }
    }

    fn choose(dtype: DType) -> Result<Kernels, String> {
        let wanted = std::env::var("ORCH_TRANSFORMER_KERNELS").unwrap_or_default();
        let k = match wanted.trim() {
            "" | "fused" => Kernels::Fused,
            "autograd" | "fused-autograd" => Kernels::Autograd,
            "unfused" => Kernels::Unfused,
            other => {
                return Err(format!(
                    "`ORCH_TRANSFORMER_KERNELS` is `{other}`: expected `fused`, `autograd` or `unfused`"
                ))
            }
        };
        Ok(if crate::fused::supports(dtype) {
            k
        } else {
            Kernels::Unfused
        })
    }
}

fn known_presets() -> String {
    PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Apply the preset, explicit sizes and defaults; check what results.
pub(super) fn resolve(cfg: &TransformerConfig, task: &TaskSpec) -> Result<Resolved, String> {
    let (preset, sizes) = match cfg.preset.as_deref() {
        None => (None, None),
        Some(name) => {
            let wanted = name.trim().to_ascii_lowercase();
            match PRESETS.iter().find(|(n, _)| n.to_ascii_lowercase() == wanted) {
                Some((n, s)) => (Some(*n), Some(*s)),
                None => {
                    return Err(format!(
                        "unknown transformer preset `{name}`: known presets are {}",
                        known_presets()
                    ))
                }
            }
        }
    };
    let required = |field: &str, explicit: Option<usize>, idx: usize| -> Result<usize, String> {
        explicit
            .or(sizes.map(|s| s[idx]))
            .ok_or_else(|| format!("transformer `{field}` is required when no `preset` is given"))
    };
    let d_model = required("d_model", cfg.d_model, 0)?;
    let layers = required("layers", cfg.layers, 1)?;
    let heads = required("heads", cfg.heads, 2)?;
    let d_ff = cfg
        .d_ff
        .or(if cfg.d_model.is_some() {
            None
        } else {
            sizes.map(|s| s[3])
        })
        .unwrap_or(4 * d_model);
    let context = cfg.context.unwrap_or(DEFAULT_CONTEXT);
    let batch = cfg.batch.unwrap_or(DEFAULT_BATCH);
    let vocab = cfg.vocab.unwrap_or(DEFAULT_VOCAB);
    for (field, v) in [
        ("d_model", d_model),
        ("layers", layers),
        ("heads", heads),
        ("d_ff", d_ff),
        ("context", context),
        ("batch", batch),
        ("vocab", vocab),
    ] {
        if v == 0 {
            return Err(format!("transformer `{field}` must be at least 1"));
        }
    }
    if d_model % heads != 0 {
        return Err(format!(
            "transformer `d_model` ({d_model}) must be divisible by `heads` ({heads})"
        ));
    }
    if u32::try_from(vocab).is_err() {
        return Err(format!("transformer `vocab` ({vocab}) must fit in 32 bits"));
    }
    let device = match cfg.device.as_deref() {
        Some(s) => parse_device(s, "transformer")?,
        None => default_device(task),
    };
    let dtype = match cfg.dtype.as_deref() {
        Some(s) => parse_dtype(s, "transformer")?,
        None => match device {
            DeviceKind::Cpu => DType::F32,
            DeviceKind::Cuda(_) => DType::BF16,
        },
    };
    Ok(Resolved {
        preset,
        d_model,
        layers,
        heads,
        d_ff,
        context,
        batch,
        vocab,
        pass: cfg.pass.unwrap_or(Pass::Train),
        kernels: Kernels::choose(dtype)?,
        dtype,
        device,
        seed: cfg.seed.unwrap_or(0),
    })
}

impl Resolved {
    pub(super) fn pass_name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "forward",
            Pass::Train => "train",
        }
    }

    pub(super) fn train(&self) -> bool {
        self.pass == Pass::Train
    }

    pub(super) fn tokens(&self) -> usize {
        self.batch * self.context
    }

    /// Number of parameters (every weight, gain and bias; the LM head has no bias).
    pub(super) fn param_count(&self) -> u64 {
        let (d, ff, v, t, l) = (
            self.d_model as u64,
            self.d_ff as u64,
            self.vocab as u64,
            self.context as u64,
            self.layers as u64,
        );
        // LN1 + LN2 (4d), QKV (3d² + 3d), output proj (d² + d), MLP (2·d·ff + ff + d).
        let per_layer = 4 * d * d + 2 * d * ff + 9 * d + ff;
        v * d + t * d + l * per_layer + 2 * d + d * v
    }

    pub(super) fn info(&self) -> BTreeMap<String, Value> {
        let mut info = BTreeMap::new();
        let mut put = |k: &str, v: Value| {
            info.insert(k.to_string(), v);
        };
        put("d_model", json!(self.d_model));
        put("layers", json!(self.layers));
        put("heads", json!(self.heads));
        put("d_ff", json!(self.d_ff));
        put("context", json!(self.context));
        put("batch", json!(self.batch));
        put("vocab", json!(self.vocab));
        put("pass", json!(self.pass_name()));
        put("dtype", json!(dtype_name(self.dtype)));
        put("device", json!(self.device.name()));
        put("preset", json!(self.preset));
        put("seed", json!(self.seed));
        put("kernels", json!(self.kernels.name()));
        info
    }
}
