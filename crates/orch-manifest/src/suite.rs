//! The suite manifest as written in YAML. Every struct denies unknown fields:
//! a typo is an error with its line and column, never a silently ignored key.
//! `docs/manifest.md` documents each field; keep the two in step.

use crate::gpu::GpuSpec;
use crate::units::{Bytes, Seconds};
use orch_protocol::{CalibrateConfig, TransformerConfig};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    /// Suite name: letters, digits, `-`, `_`, `.`.
    pub name: Spanned<String>,
    #[serde(default)]
    pub description: Option<String>,
    /// Models the suite needs (weights are set up by `orch setup`).
    #[serde(default)]
    pub models: Vec<ModelRef>,
    /// GPU axis of the matrix for every benchmark (default `[none]`).
    #[serde(default)]
    pub gpus: Option<Vec<GpuSpec>>,
    /// Environment for every cell.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of host environment variables passed to every cell as secrets:
    /// never written to the store or shown.
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub measure: MeasureDef,
    #[serde(default)]
    pub logs: LogsDef,
    /// Memory a cell may use (builtin workloads refuse larger sizes as `oom`).
    #[serde(default)]
    pub memory_limit: Option<Bytes>,
    /// Cells run at once (default 1, so cells never share a GPU).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Container image of every cell on container backends.
    #[serde(default)]
    pub image: Option<ImageDef>,
    pub benchmarks: Vec<Benchmark>,
}

/// `image: vllm/vllm-openai:v0.6.3` (any image), or `image: {build: NAME}`
/// (built by `orch build` from `containers/NAME/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ImageDef {
    Ref(String),
    Build(BuildDef),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildDef {
    /// Folder name under `containers/`.
    pub build: String,
    #[serde(default)]
    pub dockerfile: Option<String>,
    #[serde(default)]
    pub args: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRef {
    /// `org/name` on the Hugging Face hub.
    pub repo: String,
    /// Branch, tag or commit (default `main`).
    #[serde(default)]
    pub revision: Option<String>,
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
    /// `model` (default), `dataset` or `space`.
    #[serde(default)]
    pub repo_type: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasureDef {
    #[serde(default)]
    pub warmup: Option<u32>,
    #[serde(default)]
    pub repetitions: Option<u32>,
    #[serde(default)]
    pub timeout: Option<Seconds>,
    #[serde(default)]
    pub kill_grace: Option<Seconds>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsDef {
    /// Bytes kept from the start of each stream.
    #[serde(default)]
    pub head: Option<Bytes>,
    /// Bytes kept from the end of each stream.
    #[serde(default)]
    pub tail: Option<Bytes>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Benchmark {
    pub name: Spanned<String>,
    pub workload: Spanned<WorkloadDef>,
    /// Named parameters, each a list of values; cells are the cartesian
    /// product (times the GPU list).
    #[serde(default)]
    pub matrix: Option<Spanned<BTreeMap<String, Vec<serde_json::Value>>>>,
    /// Combinations to leave out: each entry matches cells whose parameters
    /// (and `gpu`) equal all of its values.
    #[serde(default)]
    pub exclude: Vec<BTreeMap<String, serde_json::Value>>,
    /// Overrides the suite's GPU list for this benchmark.
    #[serde(default)]
    pub gpus: Option<Vec<GpuSpec>>,
    #[serde(default)]
    pub measure: MeasureDef,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub memory_limit: Option<Bytes>,
    /// Overrides the suite's image for this benchmark.
    #[serde(default)]
    pub image: Option<ImageDef>,
    /// Run the `server` workload for several variants in interleaved rounds
    /// and compare them (baseline vs human patch vs agent patch).
    #[serde(default)]
    pub compare: Option<CompareDef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareDef {
    /// Git repository of the variants (relative: to the manifest's folder).
    #[serde(default)]
    pub repo: Option<String>,
    pub variants: Vec<VariantDef>,
    /// Measured rounds (default 5).
    #[serde(default)]
    pub rounds: Option<u32>,
    /// Rounds run first and not measured (default 1).
    #[serde(default)]
    pub warmup_rounds: Option<u32>,
    /// Relative difference under which a comparison is `same` (default 0.02).
    #[serde(default)]
    pub noise: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariantDef {
    pub name: String,
    #[serde(default, rename = "ref")]
    pub git_ref: Option<String>,
    #[serde(default)]
    pub patch: Option<String>,
    #[serde(default)]
    pub install: Option<String>,
}

/// Exactly one of `command`, `shell`, `transformer`, `calibrate`, `server`, `noop`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadDef {
    /// Program and arguments (no shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// A script run with `sh -c`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Working directory of `command`/`shell` (relative: to the manifest's folder).
    #[serde(default)]
    pub workdir: Option<String>,
    /// The builtin decoder-only transformer benchmark.
    #[serde(default)]
    pub transformer: Option<TransformerConfig>,
    /// The builtin GPU calibration (matmul TFLOP/s, memory bandwidth).
    #[serde(default)]
    pub calibrate: Option<CalibrateConfig>,
    /// A workload that does nothing (per-cell overhead).
    #[serde(default)]
    pub noop: Option<bool>,
    /// A server, watched until ready (fails fast when it dies), then `client`.
    #[serde(default)]
    pub server: Option<ServerDef>,
    /// What runs against the ready server (with `ORCH_SERVER_URL`).
    #[serde(default)]
    pub client: Option<ClientDef>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerDef {
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    pub ready: ReadyDef,
    /// How long the server may take to become ready (default 10m).
    #[serde(default)]
    pub startup_timeout: Option<Seconds>,
}

/// Exactly one of `http` (with `port`), `tcp`, `log`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadyDef {
    /// Path answering 2xx when ready (`/health`).
    #[serde(default)]
    pub http: Option<String>,
    #[serde(default)]
    pub port: Option<u16>,
    /// Port accepting TCP connections when ready.
    #[serde(default)]
    pub tcp: Option<u16>,
    /// Regex matching a log line printed when ready.
    #[serde(default)]
    pub log: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientDef {
    #[serde(default)]
    pub command: Option<Vec<String>>,
    #[serde(default)]
    pub shell: Option<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    /// The built-in load generator for OpenAI-compatible servers.
    #[serde(default)]
    pub loadgen: Option<LoadGenDef>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadGenDef {
    /// `/v1/completions` (default) or `/v1/chat/completions`.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    pub num_prompts: u32,
    /// Requests per second, or `inf` (default: all at once).
    #[serde(default)]
    pub request_rate: Option<serde_json::Value>,
    #[serde(default)]
    pub burstiness: Option<f64>,
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    #[serde(default)]
    pub input_len: Option<u32>,
    #[serde(default)]
    pub output_len: Option<u32>,
    #[serde(default)]
    pub prompt_file: Option<String>,
    #[serde(default)]
    pub warmup_requests: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub seed: Option<u64>,
}
