//! The contract between the host (`orch`) and the agent (`orch-agent`).
//!
//! The host hands the agent a [`TaskSpec`] (one cell's work) as a JSON file. The
//! agent writes [`Event`]s as JSON lines on its stdout while it works, the
//! workload's logs into its output folder, and finally a [`CellResult`]
//! (also sent as the last event). Everything here is plain data: no IO.
//!
//! Versioning: [`PROTOCOL_VERSION`] is bumped on any incompatible change. The
//! agent refuses a task whose version it does not speak, so an old agent baked
//! into an image fails loudly instead of misreading a newer task.
//!
//! ## What is where
//!
//! `TaskSpec` (one cell's work, versioned by `PROTOCOL_VERSION`),
//! `Workload`, `Measure`, `LogLimits`, `Event`, `CellResult`, `Status`, `Phase`, the
//! `ORCH_METRIC`/`ORCH_PHASE`/`ORCH_METRICS_FILE` names, `Event::from_line` and
//! `parse_metrics_json` (the decoders the fuzz targets exercise); `kind.rs`: `FailureKind`,
//! the named cause of a failure (every built-in kind a variant, a user rule's kind
//! `Other`; its string on the wire); `mask.rs`: the one
//! secret `Masker` (forms, `StreamMasker` across chunks, JSON-safe masking, the
//! 6-character minimum, `KNOWN_SECRET_ENV`, the Hub token file's paths); `ship.rs`: the
//! frames of the shipping stream (events, file chunks, digests) and result summaries. It
//! does not: IO of any kind.

pub mod error;
pub mod gpu;
pub mod kind;
pub mod mask;
pub mod paths;

pub use error::ErrorClass;
pub use gpu::GpuRequest;
pub use kind::FailureKind;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod ship;

/// Version of the task/event/result schema.
pub const PROTOCOL_VERSION: u32 = 1;

/// Environment variable through which a command workload finds where to write
/// its metrics JSON.
pub const METRICS_FILE_ENV: &str = "ORCH_METRICS_FILE";
/// Prefix of a stdout line that carries metrics: `ORCH_METRIC name=value [name=value ...]`.
pub const METRIC_LINE_PREFIX: &str = "ORCH_METRIC";
/// Prefix of a stdout line that marks a phase change: `ORCH_PHASE warmup|measure|teardown`.
pub const PHASE_LINE_PREFIX: &str = "ORCH_PHASE";

/// The file the agent writes its [`CellResult`] to, in the cell's output
/// folder. It is never `result.json`, the name of the host's record in a
/// folder store: a host killed between the agent's end and its own write
/// leaves the agent's file beside the record's place, never in it.
pub const AGENT_RESULT_FILE: &str = "agent-result.json";

/// One cell's work, as handed to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    pub version: u32,
    pub run_id: String,
    pub cell_id: String,
    /// The GPU request in normalised form (`H100:8`, `none`).
    pub gpu: GpuRequest,
    /// Matrix parameters of this cell, for the record and for `ORCH_PARAM_*`.
    #[serde(default)]
    pub params: BTreeMap<String, serde_json::Value>,
    /// Environment added to the workload (already merged suite/benchmark/cell).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Names of variables in `env` whose values are secrets: never logged.
    #[serde(default)]
    pub secret_env: Vec<String>,
    pub workload: Workload,
    pub measure: Measure,
    #[serde(default)]
    pub logs: LogLimits,
    /// Memory the workload may use, in bytes (builtin workloads refuse sizes
    /// that do not fit and report `oom`). `None`: what the machine has.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// The weights volume as the agent sees it: a Hugging Face hub cache.
    /// The agent sets `HF_HUB_CACHE` to it and `HF_HUB_OFFLINE=1` for every
    /// workload, so weights load from it and never from the network.
    #[serde(default)]
    pub weights_dir: Option<String>,
    /// Fail the cell (`hardware_mismatch`) when the GPUs present differ from
    /// the GPUs asked for; without it the mismatch is only flagged.
    #[serde(default)]
    pub strict_hardware: bool,
    /// Alternatives to `gpu`, tried in order when a backend cannot get it
    /// (Modal: no capacity for the type). The backend sets `gpu` to the
    /// alternative it runs, so the agent checks the hardware against that.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_fallback: Vec<GpuRequest>,
    /// The host files that travel with the cell (its workdir, patches,
    /// prompt file, local repository as a git bundle, `sync:` paths): the
    /// agent lays them out, checking each digest, before the workload runs.
    /// `None`: the cell runs where the task's paths are (the local backend).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<FileSet>,
}

/// Files the agent lays out before the workload runs: each from the blob
/// named by its SHA-256 in `blobs` (or its chunks `<sha256>.0`, `.1`, ...,
/// concatenated), checked against the digest, copied to `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSet {
    /// The folder of the blobs as the cell sees it.
    pub blobs: String,
    /// Where the files land (the prefix of every `path`), for messages.
    pub root: String,
    pub files: Vec<FileEntry>,
}

/// One file of a [`FileSet`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Where it lands in the cell (absolute).
    pub path: String,
    /// Lowercase hex SHA-256 of its content.
    pub sha256: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub executable: bool,
}

// One workload per cell, made once and serialized into its task: the
// comparison's larger size costs nothing worth a box (and a box would change
// every match on it).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Workload {
    /// Any program: argv, with stdout/stderr captured.
    Command(CommandWorkload),
    /// A workload compiled into the agent.
    Builtin(BuiltinWorkload),
    /// A long-running server, watched from start to readiness, then a client
    /// against it, then teardown.
    Server(ServerWorkload),
    /// Variants of one server (baseline, human patch, agent patch...) in
    /// interleaved rounds, compared metric by metric.
    Compare(CompareWorkload),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareWorkload {
    /// Git repository the variants come from (path or URL).
    #[serde(default)]
    pub repo: Option<String>,
    pub variants: Vec<Variant>,
    /// Measured rounds; with `max_rounds` set (`rounds: auto`), the fewest.
    pub rounds: u32,
    pub warmup_rounds: u32,
    /// Relative difference under which a comparison is `same` (0.02 = 2%).
    pub noise: f64,
    /// `rounds: auto`: rounds are added until the primary metric's interval
    /// is within `noise` (half-width), up to this many, or the cell timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rounds: Option<u32>,
    /// The metric that decides each pair's verdict (default: the headline
    /// rate the rounds report, `output_throughput` for the load generator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_metric: Option<String>,
    /// Seed of the per-round order of the variants (default: drawn at run
    /// time; recorded either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// The server and client every variant runs (relative paths are in the
    /// variant's checkout).
    pub server: ServerWorkload,
    /// The uncommitted changes of a local `repo` (`sync: {dirty: patch}`):
    /// applied to the checkout of every variant that names no `ref`, before
    /// the variant's own patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree_patch: Option<String>,
    /// `warmup_rounds: auto`: warm-up rounds go on (at least `warmup_rounds`)
    /// until every variant's primary metric shows no trend, up to this many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_warmup_rounds: Option<u32>,
    /// Every variant answers fixed prompts before the timed rounds; answers
    /// unlike the first variant's are `output_mismatch` (load generator
    /// clients only; `None`: no check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_check: Option<OutputCheck>,
    /// Run (`sh -c`) in each variant's checkout after the first round;
    /// a non-zero exit is `output_mismatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<String>,
    /// Defences against timer gaming: a fresh nonce on every prompt each
    /// round, flags for short responses, token counts that disagree with the
    /// text, and identical outputs across different prompts.
    #[serde(default)]
    pub defences: bool,
    /// A folder (on the machine the agent runs on) where each variant
    /// checkout with an `install` is installed once per (commit, patches,
    /// install command) and reused by later cells: `orch bisect` sets it on
    /// the local backend, where the good commit runs in every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_cache: Option<String>,
}

/// The output check of a comparison: greedy, seeded, non-streaming answers
/// to fixed prompts, compared with the first variant's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputCheck {
    pub prompts: u32,
    pub max_tokens: u32,
    /// Leading tokens every answer must share with the baseline's; `None`:
    /// the whole answer (exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_match_prefix: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub name: String,
    /// Ref to check out (branch, tag, commit).
    #[serde(default)]
    pub git_ref: Option<String>,
    /// Patch applied with `git apply` (absolute path).
    #[serde(default)]
    pub patch: Option<String>,
    /// Command run in the checkout before the server (`pip install ...`).
    #[serde(default)]
    pub install: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerWorkload {
    pub argv: Vec<String>,
    #[serde(default)]
    pub workdir: Option<String>,
    pub ready: Readiness,
    /// Seconds the server may take to become ready.
    pub startup_timeout_s: f64,
    /// Run once the server is ready (gets `ORCH_SERVER_URL`); its metrics
    /// are the cell's. Without one, the cell measures startup only.
    #[serde(default)]
    pub client: Option<Client>,
}

/// What runs against a ready server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
#[allow(clippy::large_enum_variant)] // one per task, read once: boxing buys nothing
pub enum Client {
    Command(CommandWorkload),
    /// The built-in load generator for OpenAI-compatible servers.
    Loadgen(LoadGen),
}

/// Load for an OpenAI-compatible server; results use the field names of
/// `vllm bench serve --save-result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadGen {
    /// `/v1/completions` or `/v1/chat/completions`.
    pub endpoint: String,
    #[serde(default)]
    pub model: Option<String>,
    pub num_prompts: u32,
    /// Requests per second; `None` sends all at once.
    #[serde(default)]
    pub request_rate: Option<f64>,
    /// 1.0 is a Poisson process; lower is burstier (gamma intervals).
    #[serde(default = "one")]
    pub burstiness: f64,
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    #[serde(default = "default_input_len")]
    pub input_len: u32,
    #[serde(default = "default_output_len")]
    pub output_len: u32,
    /// JSON file of prompts: a list of strings, or of objects with `prompt`.
    #[serde(default)]
    pub prompt_file: Option<String>,
    #[serde(default)]
    pub warmup_requests: u32,
    #[serde(default = "yes")]
    pub stream: bool,
    #[serde(default)]
    pub seed: u64,
    /// Service-level objectives: a request meets them when each given
    /// bound holds; `request_goodput` counts those (as `vllm bench serve
    /// --goodput` does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<Slo>,
    /// The model's `tokenizer.json` (a path ending in `.json`) or a Hub repo
    /// id found in the weights cache; unset: `model`'s, where the cache has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// Random prompt lengths uniform in `input_len * [1 - r, 1 + r]`.
    #[serde(default)]
    pub range_ratio: f64,
    /// Tokens (words without a tokenizer) of a random prefix every prompt shares.
    #[serde(default)]
    pub prefix_len: u32,
    /// Distinct prefixes of `prefix_len`: prompt i gets prefix i mod this
    /// (0 or 1: one prefix for all).
    #[serde(default)]
    pub prefix_groups: u32,
    /// Stages of one cell, each sending the `num_prompts` requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
    /// The highest rate whose p99 latencies meet `slo`, searched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturation: Option<Saturation>,
    /// A rate that changes with the requests' progress (instead of
    /// `request_rate`), as `vllm bench serve --ramp-up-strategy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ramp_up: Option<RampUp>,
    /// Conversations replayed turn by turn on `/v1/chat/completions`, each
    /// turn with the history as the server answered it; `false`: the first
    /// turn of each entry only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi_turn: bool,
    /// Milliseconds between an answer and the conversation's next turn.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub turn_delay_ms: f64,
    /// Appended to every prompt as ` [nonce <text>-<i>]` (i: the request's
    /// index), so that answers cached from another round cannot match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Sends `ignore_eos: true` (as `vllm bench serve` does by default), so
    /// that every answer has `max_tokens` tokens.
    #[serde(default = "yes")]
    pub ignore_eos: bool,
}

/// A list of loads for one cell: request rates (`None`: all at once) or
/// concurrency caps; exactly one list is given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_rate: Vec<Option<f64>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub max_concurrency: Vec<u32>,
}

/// A bounded search for the highest request rate whose p99 TTFT, TPOT and
/// E2EL meet the SLO with no failed request: doubling from `start_rate`
/// until it breaks (or `max_rate`), then `steps` bisections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Saturation {
    pub start_rate: f64,
    pub max_rate: f64,
    pub steps: u32,
}

/// A request rate ramped from `start_rps` to `end_rps` over the requests:
/// request i of n is sent at the rate for progress i / (n - 1), its interval
/// from the one before drawn from the gamma distribution of `burstiness`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampUp {
    pub strategy: RampStrategy,
    pub start_rps: f64,
    pub end_rps: f64,
}

/// How a ramp goes from its start rate to its end rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RampStrategy {
    /// `start + (end - start) * progress`.
    Linear,
    /// `start * (end / start) ^ progress`.
    Exponential,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Per-request latency bounds, in milliseconds (TTFT, TPOT and end-to-end
/// latency measured from the request's send, as `vllm bench serve` does).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2el_ms: Option<f64>,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_input_len() -> u32 {
    128
}
fn default_output_len() -> u32 {
    128
}

/// When a server counts as ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Readiness {
    /// `GET http://127.0.0.1:<port><path>` answers 2xx.
    Http { port: u16, path: String },
    /// A TCP connection to the port succeeds.
    Tcp { port: u16 },
    /// A line of the server's stdout or stderr matches this regex.
    Log { regex: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandWorkload {
    pub argv: Vec<String>,
    #[serde(default)]
    pub workdir: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
#[allow(clippy::large_enum_variant)] // built once per cell; boxing buys nothing
pub enum BuiltinWorkload {
    Transformer(TransformerConfig),
    /// Measures the GPU: matmul TFLOP/s per dtype and device memory
    /// bandwidth, compared with the GPU model's expected figures.
    Calibrate(CalibrateConfig),
    /// Does nothing and succeeds: used to measure per-cell overhead.
    Noop,
}

/// Sizes of the calibration. Defaults are large enough to reach a data-centre
/// GPU's peak (8192^3 matmuls, 4 GiB copies).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrateConfig {
    /// Square matmul size (m = n = k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_size: Option<usize>,
    /// Dtypes whose matmul is measured (`bf16`, `f16`, `f32`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtypes: Option<Vec<String>>,
    /// Bytes copied per bandwidth measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_bytes: Option<u64>,
    /// Seconds each figure is measured for, over all repetitions (default 2
    /// on CUDA, long enough for utilisation and power readings to settle;
    /// 0.1 on the CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_per_metric: Option<f64>,
    /// A figure below this fraction of the GPU model's expected one flags
    /// the cell `degraded_gpu` (default 0.8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// `cpu` or `cuda` (default: `cuda` when the cell asks for a GPU and the
    /// agent was built with CUDA, else `cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

/// Decoder-only transformer with random weights. `preset` fills the sizes;
/// any explicit size overrides the preset.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_model: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d_ff: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<usize>,
    /// `forward` or `train` (forward + backward).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<Pass>,
    /// `f32` (default on CPU), `bf16`, `f16`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<String>,
    /// `cpu` or `cuda` (default: `cuda` when the cell asks for a GPU and the
    /// agent was built with CUDA, else `cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    Train,
}

/// Measurement protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measure {
    /// Warm-up steps, not measured.
    pub warmup: u32,
    /// Measured steps.
    pub repetitions: u32,
    /// Wall-clock limit for the whole cell, in seconds.
    pub timeout_s: f64,
    /// Grace period between SIGTERM and SIGKILL on stop, in seconds.
    #[serde(default = "default_grace")]
    pub kill_grace_s: f64,
}

fn default_grace() -> f64 {
    5.0
}

impl Default for Measure {
    fn default() -> Self {
        Measure {
            warmup: 2,
            repetitions: 5,
            timeout_s: 600.0,
            kill_grace_s: default_grace(),
        }
    }
}

/// How much of a huge log is kept: the first `head_bytes` and the last
/// `tail_bytes`; what lies between is dropped and the drop recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogLimits {
    pub head_bytes: u64,
    pub tail_bytes: u64,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            head_bytes: 8 << 20,
            tail_bytes: 8 << 20,
        }
    }
}

/// Final state of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Succeeded,
    Failed,
    Oom,
    Timeout,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Oom => "oom",
            Status::Timeout => "timeout",
            Status::Cancelled => "cancelled",
        }
    }

    /// A finished cell is never run again by `--resume`. A cancelled cell
    /// did not finish its work, so it is.
    pub fn is_finished(self) -> bool {
        !matches!(self, Status::Cancelled)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Named wall-clock phases of a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Measured by the host: from the launch of the cell until the agent
    /// started (container create, image pull, scheduling).
    Provision,
    /// From the agent's start until the workload is ready (process spawned,
    /// model built).
    Start,
    /// Model weights loading (a command marks it with `ORCH_PHASE load`).
    Load,
    /// A server workload's server, from spawn until ready.
    ServerStart,
    Warmup,
    Measure,
    Teardown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Provision => "provision",
            Phase::Start => "start",
            Phase::Load => "load",
            Phase::ServerStart => "server_start",
            Phase::Warmup => "warmup",
            Phase::Measure => "measure",
            Phase::Teardown => "teardown",
        }
    }

    pub fn parse(s: &str) -> Option<Phase> {
        match s.trim().to_ascii_lowercase().as_str() {
            "provision" => Some(Phase::Provision),
            "start" => Some(Phase::Start),
            "load" | "weights" | "weight_load" => Some(Phase::Load),
            "server_start" | "server-start" => Some(Phase::ServerStart),
            "warmup" | "warm-up" | "warm_up" => Some(Phase::Warmup),
            "measure" => Some(Phase::Measure),
            "teardown" => Some(Phase::Teardown),
            _ => None,
        }
    }
}

/// Why a cell did not succeed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// Short machine-readable cause (`exit_code`, `signal`, `oom`, `timeout`,
    /// `cancelled`, `spawn`, `agent_crashed`, `workload_error`, ...; its
    /// string on the wire).
    pub kind: FailureKind,
    /// One-line human message.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
}

impl Failure {
    /// A failure of `kind` with its message, no exit status.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
            exit_code: None,
            signal: None,
        }
    }

    /// The same, with the exit code and signal of the process that ended.
    pub fn exited(mut self, exit_code: Option<i32>, signal: Option<i32>) -> Failure {
        self.exit_code = exit_code;
        self.signal = signal;
        self
    }
}

/// The name of a Linux signal (`SIGFPE` for 8), for the signals a process
/// dies of; `None` for others.
pub fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return None,
    })
}

/// `SIGFPE (signal 8)`, or `signal 40` for one without a name.
pub fn describe_signal(signal: i32) -> String {
    match signal_name(signal) {
        Some(n) => format!("{n} (signal {signal})"),
        None => format!("signal {signal}"),
    }
}

/// The signal a container's exit code stands for: runtimes report a process
/// killed by signal N as exit code 128 + N (`136` is SIGFPE).
pub fn signal_of_exit_code(code: i32) -> Option<i32> {
    (129..=159).contains(&code).then_some(code - 128)
}

/// Per-stream capture facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamInfo {
    /// Bytes the workload wrote.
    pub bytes: u64,
    /// Bytes dropped from the middle because the stream was over the limits.
    pub truncated_bytes: u64,
}

/// What the agent reports for one cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub version: u32,
    pub cell_id: String,
    pub status: Status,
    /// Numbers the workload measured (name -> value).
    pub metrics: BTreeMap<String, f64>,
    /// Wall-clock seconds per phase.
    pub timings: BTreeMap<Phase, f64>,
    pub failure: Option<Failure>,
    #[serde(default)]
    pub stdout: StreamInfo,
    #[serde(default)]
    pub stderr: StreamInfo,
    /// Facts about what ran (model parameters, device, dtype, agent version...).
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
    /// The hardware the cell ran on, as the agent saw it (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<Hardware>,
    /// Conditions that make the numbers suspect without failing the cell:
    /// `hardware_mismatch`, `degraded_gpu`, `client_behind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
}

/// Flag: the GPUs present differ from the GPUs asked for.
pub const FLAG_HARDWARE_MISMATCH: &str = "hardware_mismatch";
/// Flag: a calibration figure is below the threshold of the GPU model's expected one.
pub const FLAG_DEGRADED_GPU: &str = "degraded_gpu";
/// The load generator sent its requests late (schedule lag past its
/// bounds): latencies from the send understate the server's queueing; read
/// the ones from the intended send time (`*_sched_*`).
pub const FLAG_CLIENT_BEHIND: &str = "client_behind";

/// What the agent found on the machine it ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hardware {
    /// Visible GPUs, in device order; empty on a CPU-only host.
    pub gpus: Vec<GpuInfo>,
    /// NVIDIA driver version (`580.159.04`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports (`13.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// Why no GPU was read, when none was (`NVML not found`): informative, not an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_note: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    pub cpus: usize,
    pub memory_bytes: u64,
    /// What was asked (`H100:8`) against what is present, when they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch: Option<String>,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    /// `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub uuid: String,
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// `9.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// Power limit in watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f64>,
}

impl CellResult {
    pub fn new(cell_id: &str, status: Status) -> Self {
        CellResult {
            version: PROTOCOL_VERSION,
            cell_id: cell_id.to_string(),
            status,
            metrics: BTreeMap::new(),
            timings: BTreeMap::new(),
            failure: None,
            stdout: StreamInfo::default(),
            stderr: StreamInfo::default(),
            info: BTreeMap::new(),
            hardware: None,
            flags: Vec::new(),
        }
    }

    pub fn failed(cell_id: &str, status: Status, kind: FailureKind, message: impl Into<String>) -> Self {
        let mut r = CellResult::new(cell_id, status);
        r.failure = Some(Failure::new(kind, message));
        r
    }
}

/// A line of the agent's event stream (its stdout, JSON lines).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // the result is sent once per cell; boxing buys nothing
pub enum Event {
    /// The agent accepted the task.
    Started {
        cell_id: String,
        agent_version: String,
        pid: u32,
    },
    /// A phase began; `t` is seconds since the agent started.
    Phase { phase: Phase, t: f64 },
    /// Progress inside a phase (steps done of total).
    Progress { phase: Phase, done: u64, total: u64 },
    /// A free-form note worth showing live.
    Message { text: String },
    /// The last event: the cell's result.
    Result { result: CellResult },
}

impl Event {
    /// One JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Serialising these plain data types cannot fail: every map key is a
        // string and no value is a non-finite float written by serde_json's
        // float path (it writes `null` for those).
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }

    /// Decode one line of the event stream (surrounding whitespace ignored).
    pub fn from_line(line: &str) -> Result<Event, serde_json::Error> {
        serde_json::from_str(line.trim())
    }
}

/// The metrics file a workload writes at `$ORCH_METRICS_FILE`: one JSON
/// object; numbers kept, nested objects flattened with `.`, `{"value": x}`
/// objects taken as `x`, other values ignored. `Err` is the message for the
/// cell's failure.
pub fn parse_metrics_json(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "the metrics file `${METRICS_FILE_ENV}` is not valid JSON ({e}); hint: write one JSON object of name -> number"
        )
    })?;
    if !value.is_object() {
        return Err(format!(
            "the metrics file `${METRICS_FILE_ENV}` holds JSON that is not an object; hint: write one JSON object of name -> number"
        ));
    }
    let mut out = BTreeMap::new();
    flatten_metrics("", &value, &mut out);
    Ok(out)
}

fn flatten_metrics(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
    match v {
        serde_json::Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|f| f.is_finite()) {
                out.insert(prefix.to_string(), f);
            }
        }
        serde_json::Value::Object(map) => {
            if let Some(val) = map.get("value").and_then(|v| v.as_f64()) {
                if !prefix.is_empty() {
                    if val.is_finite() {
                        out.insert(prefix.to_string(), val);
                    }
                    return;
                }
            }
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_metrics(&key, v, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_round_trips_and_rejects_unknown_fields() {
        let task = TaskSpec {
            version: PROTOCOL_VERSION,
            run_id: "r".into(),
            cell_id: "c".into(),
            gpu: "none".into(),
            params: BTreeMap::new(),
            env: BTreeMap::new(),
            secret_env: vec![],
            workload: Workload::Builtin(BuiltinWorkload::Transformer(TransformerConfig {
                preset: Some("nano".into()),
                ..Default::default()
            })),
            measure: Measure::default(),
            logs: LogLimits::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
            files: None,
        };
        let json = serde_json::to_string(&task).unwrap();
        let back: TaskSpec = serde_json::from_str(&json).unwrap();
        assert_eq!(task, back);
        let bad = json.replacen("\"run_id\"", "\"bogus\":1,\"run_id\"", 1);
        assert!(serde_json::from_str::<TaskSpec>(&bad).is_err());
    }

    #[test]
    fn event_lines_are_tagged() {
        let e = Event::Phase {
            phase: Phase::Warmup,
            t: 1.5,
        };
        assert_eq!(e.to_line(), r#"{"event":"phase","phase":"warmup","t":1.5}"#);
        let r = Event::Result {
            result: CellResult::new("c", Status::Oom),
        };
        let back: Event = serde_json::from_str(&r.to_line()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn cancelled_is_not_finished() {
        assert!(!Status::Cancelled.is_finished());
        assert!(Status::Failed.is_finished());
        assert!(Status::Oom.is_finished());
    }
}
