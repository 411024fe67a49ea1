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
    /// The most cells the suite may expand to (default
    /// [`crate::plan::DEFAULT_MAX_CELLS`]); counted before the matrix is
    /// expanded, so a matrix too large is refused without building it.
    #[serde(default)]
    pub max_cells: Option<u64>,
    /// Cells run at once (default 1, so cells never share a GPU).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Container image of every cell on container backends.
    #[serde(default)]
    pub image: Option<ImageDef>,
    /// GPU alternatives, tried in order when a backend cannot get a cell's
    /// GPU (Modal: no capacity): `{"H100:2": ["A100-80GB:2", "L40S:2"]}`.
    #[serde(default)]
    pub gpu_fallback: BTreeMap<String, Vec<GpuSpec>>,
    /// How cells run on a Slurm cluster (`--backend slurm`).
    #[serde(default)]
    pub slurm: Option<SlurmDef>,
    /// How cells run on a Kubernetes cluster (`--backend kubernetes`).
    #[serde(default)]
    pub kubernetes: Option<Spanned<KubernetesSection>>,
    /// What travels with cells that run away from this machine, besides
    /// the files they name (workdirs, patches, prompt files, a local repo).
    #[serde(default)]
    pub sync: Option<SyncDef>,
    pub benchmarks: Vec<Benchmark>,
}

/// `sync: {paths: [../common], ignore: ["*.ckpt"], max_size: 200MiB, dirty: patch}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncDef {
    /// Files and folders that travel too (relative to the suite file).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Patterns (gitignore syntax) left home, on top of `.gitignore`,
    /// `.dockerignore` and `.orchignore`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore: Vec<String>,
    /// The most one cell's files may come to (default 1 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<Bytes>,
    /// A local `compare.repo` with uncommitted changes: `refuse` (the
    /// default) or `patch` (applied on top of HEAD's checkouts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty: Option<DirtyDef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DirtyDef {
    Refuse,
    Patch,
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
    /// Nodes per cell (multi-node cells; `slurm` backend), default 1.
    #[serde(default)]
    pub nodes: Option<Spanned<u32>>,
    /// Run the `server` workload for several variants in interleaved rounds
    /// and compare them (baseline vs human patch vs agent patch).
    #[serde(default)]
    pub compare: Option<CompareDef>,
    /// A campaign: a task file whose rows fill `compare` (one compare cell
    /// per task: baseline, human, the agent's attempts); `tasks.rs`.
    #[serde(default)]
    pub tasks: Option<Spanned<crate::tasks::TasksDef>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompareDef {
    /// Git repository of the variants (relative: to the manifest's folder).
    #[serde(default)]
    pub repo: Option<String>,
    /// The variants (none with `tasks:`: each row names its own).
    #[serde(default)]
    pub variants: Vec<VariantDef>,
    /// The install command of every variant that names none (and of every
    /// task row without `install`).
    #[serde(default)]
    pub install: Option<String>,
    /// Measured rounds (default 5), or `auto`: rounds are added until the
    /// primary metric's interval is within `noise`, up to `max_rounds`.
    #[serde(default)]
    pub rounds: Option<Rounds>,
    /// With `rounds: auto`: the most measured rounds (default 12).
    #[serde(default)]
    pub max_rounds: Option<u32>,
    /// The metric that decides each pair's verdict (default: `output_throughput`
    /// for the load generator, else the workload's headline rate).
    #[serde(default)]
    pub primary_metric: Option<String>,
    /// Seed of the per-round shuffle of the variants (default: drawn at run
    /// time and recorded).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Rounds run first and not measured (default 1), or `auto`: warm-up
    /// goes on until the primary metric shows no trend over the last 4
    /// rounds, up to `max_warmup_rounds`.
    #[serde(default)]
    pub warmup_rounds: Option<WarmupRounds>,
    /// With `warmup_rounds: auto`: the most warm-up rounds (default 6).
    #[serde(default)]
    pub max_warmup_rounds: Option<u32>,
    /// Relative difference under which a comparison is `same` (default 0.02).
    #[serde(default)]
    pub noise: Option<f64>,
    /// The output check before the timed rounds (load generator clients):
    /// on by default (8 prompts, 32 tokens, exact); `false` turns it off.
    #[serde(default)]
    pub output_check: Option<OutputCheckDef>,
    /// A shell command run in each variant's checkout after its first
    /// round (`ORCH_VARIANT`, `ORCH_VARIANT_DIR`, `ORCH_BASELINE_DIR`,
    /// `ORCH_ROUND_DIR`); a non-zero exit is `output_mismatch`.
    #[serde(default)]
    pub check: Option<String>,
    /// Defences against timer gaming (default `true`).
    #[serde(default)]
    pub defences: Option<bool>,
}

/// `warmup_rounds:` of a comparison: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmupRounds {
    Fixed(u32),
    Auto,
}

impl<'de> Deserialize<'de> for WarmupRounds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Rounds::deserialize(d) {
            Ok(Rounds::Fixed(n)) => Ok(WarmupRounds::Fixed(n)),
            Ok(Rounds::Auto) => Ok(WarmupRounds::Auto),
            Err(_) => Err(serde::de::Error::custom(
                "invalid `warmup_rounds`: write a number of rounds (`1`) or `auto`",
            )),
        }
    }
}

/// `output_check:` of a comparison: `false`/`true`, or its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputCheckDef {
    Off,
    On(OutputCheckSettings),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputCheckSettings {
    /// Fixed prompts every variant answers (default 8).
    #[serde(default)]
    pub prompts: Option<u32>,
    /// Tokens per answer (default 32).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// `exact` (the default) or the leading tokens an answer must share
    /// with the baseline's (for patches that change numerics).
    #[serde(default)]
    pub min_match_prefix: Option<MatchPrefix>,
}

/// `min_match_prefix:` a count of tokens, or `exact`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchPrefix {
    Exact,
    Tokens(u32),
}

impl<'de> Deserialize<'de> for MatchPrefix {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u32),
            Text(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Num(n)) => Ok(MatchPrefix::Tokens(n)),
            Ok(Raw::Text(t)) if t.trim() == "exact" => Ok(MatchPrefix::Exact),
            _ => Err(serde::de::Error::custom(
                "invalid `min_match_prefix`: write a number of tokens (`16`) or `exact`",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for OutputCheckDef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Settings(OutputCheckSettings),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Flag(false)) => Ok(OutputCheckDef::Off),
            Ok(Raw::Flag(true)) => Ok(OutputCheckDef::On(OutputCheckSettings::default())),
            Ok(Raw::Settings(s)) => Ok(OutputCheckDef::On(s)),
            Err(_) => Err(serde::de::Error::custom(
                "invalid `output_check`: write `false`, or `{prompts: 8, max_tokens: 32, min_match_prefix: exact}` (each optional)",
            )),
        }
    }
}

/// `rounds:` of a comparison: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounds {
    Fixed(u32),
    Auto,
}

impl<'de> Deserialize<'de> for Rounds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u32),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => Ok(Rounds::Fixed(n)),
            Raw::Text(t) if t.trim() == "auto" => Ok(Rounds::Auto),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "invalid `rounds` `{t}`: write a number of rounds (`5`) or `auto`"
            ))),
        }
    }
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
    /// `slo: {ttft_ms, tpot_ms, e2el_ms}`: bounds a request must meet to
    /// count towards goodput.
    #[serde(default)]
    pub slo: Option<SloDef>,
    /// The model's `tokenizer.json` (relative to the manifest) or a Hub repo id.
    #[serde(default)]
    pub tokenizer: Option<String>,
    #[serde(default)]
    pub range_ratio: Option<f64>,
    #[serde(default)]
    pub prefix_len: Option<u32>,
    /// Distinct shared prefixes (each of `prefix_len`), assigned round-robin.
    #[serde(default)]
    pub prefix_groups: Option<u32>,
    /// `sweep: {request_rate: [1, 2, inf]}` or `sweep: {max_concurrency: [1, 8]}`.
    #[serde(default)]
    pub sweep: Option<SweepDef>,
    /// `saturation: {start_rate, max_rate, steps}` (needs `slo`).
    #[serde(default)]
    pub saturation: Option<SaturationDef>,
    /// `ramp_up: {strategy: linear|exponential, start_rps, end_rps}` (instead
    /// of `request_rate`).
    #[serde(default)]
    pub ramp_up: Option<RampUpDef>,
    /// Replay conversations turn by turn (chat endpoint).
    #[serde(default)]
    pub multi_turn: Option<bool>,
    /// Milliseconds between an answer and the next turn.
    #[serde(default)]
    pub turn_delay_ms: Option<f64>,
    /// Text tagged onto every prompt with the request's index.
    #[serde(default)]
    pub nonce: Option<String>,
    /// Send `ignore_eos: true` (default true).
    #[serde(default)]
    pub ignore_eos: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampUpDef {
    #[serde(default)]
    pub strategy: Option<String>,
    #[serde(default)]
    pub start_rps: Option<f64>,
    #[serde(default)]
    pub end_rps: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepDef {
    #[serde(default)]
    pub request_rate: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    pub max_concurrency: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaturationDef {
    #[serde(default)]
    pub start_rate: Option<f64>,
    #[serde(default)]
    pub max_rate: Option<f64>,
    #[serde(default)]
    pub steps: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloDef {
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    #[serde(default)]
    pub tpot_ms: Option<f64>,
    #[serde(default)]
    pub e2el_ms: Option<f64>,
}

/// `slurm:` — how cells run as batch jobs on a Slurm cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// `--constraint` (node features: `h100&ib`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraint: Option<String>,
    /// Further `sbatch` options, each starting with `-`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_args: Vec<String>,
    /// A folder the login node and the compute nodes share: the agent and
    /// the job folders go there when the store is elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_dir: Option<String>,
    /// The weights volume (a hub cache) on the shared filesystem (default
    /// `<shared_dir>/weights`, else the local default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_dir: Option<String>,
    /// A cell pending longer than this fails (`pending_too_long`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<Seconds>,
    /// CPUs per node of a cell (`--cpus-per-task`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// GRES type per GPU type (`{H100: h100_80gb}`); default: the name in lowercase.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_types: BTreeMap<String, String>,
    /// `gres` (`--gres=gpu:TYPE:N`, the default) or `gpus` (`--gpus-per-node=TYPE:N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_request: Option<String>,
    /// Time between two `squeue` calls (default 2s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<Seconds>,
}

/// `kubernetes:` — how cells run as Jobs on a Kubernetes cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesDef {
    /// Namespace of the Jobs (default: `--namespace`, else the kubeconfig context's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// kubeconfig context (default: `--context`, else the current one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Every pod's `nodeSelector`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations added to the `nvidia.com/gpu` one GPU cells always get.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<TolerationDef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// Names of Secrets of type `kubernetes.io/dockerconfigjson`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// `/dev/shm` size (a memory `emptyDir`; NCCL needs more than the 64 MiB default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Bytes>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// The node label naming the GPU type (default: GPU Feature Discovery's
    /// `nvidia.com/gpu.product`, GKE's and Karpenter's labels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_label: Option<String>,
    /// Label values per GPU type (`{H100: [NVIDIA-H100-80GB-HBM3]}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpu_types: BTreeMap<String, Vec<String>>,
    /// Whether a GPU cell's pod asks for nodes of its GPU type by label
    /// (default `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_affinity: Option<GpuAffinity>,
    /// A PersistentVolumeClaim holding the weights (a hub cache), mounted read-only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_pvc: Option<String>,
    /// An existing Secret holding the suite's `secrets:` under their names
    /// (default: orch creates one per run from the host's environment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Registry the suite's built images were pushed to (`orch build --push
    /// REGISTRY`): `image: {build: NAME}` runs `REGISTRY/orch/NAME:HASH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<String>,
    /// The agent image (`orch build --agent --push REGISTRY` publishes it;
    /// default `ORCH_AGENT_IMAGE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image: Option<String>,
    /// How the agent reaches a cell's container (default `auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_delivery: Option<AgentDelivery>,
    /// A pod that makes no progress (pending, pulling) this long fails the cell (default 15m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending: Option<Seconds>,
    /// How long an unschedulable pod waits for an autoscaler's word before
    /// it fails (default 90s); the cluster autoscaler's `NotTriggerScaleUp`
    /// fails it at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable_grace: Option<Seconds>,
    /// How long a pod an autoscaler adds a node for (`TriggeredScaleUp`,
    /// Karpenter's `Nominated`) waits for that node (default 15m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up_timeout: Option<Seconds>,
    /// CPU request and limit of a cell (`8`, `500m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
}

/// The `kubernetes:` section as written: [`KubernetesDef`] with the
/// positions of the values checked against the API server's rules
/// ([`crate::plan`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSection {
    #[serde(default)]
    pub namespace: Option<Spanned<String>>,
    #[serde(default)]
    pub context: Option<String>,
    #[serde(default)]
    pub node_selector: BTreeMap<String, Spanned<String>>,
    #[serde(default)]
    pub tolerations: Vec<Spanned<TolerationDef>>,
    #[serde(default)]
    pub service_account: Option<Spanned<String>>,
    #[serde(default)]
    pub image_pull_secrets: Vec<Spanned<String>>,
    #[serde(default)]
    pub shm_size: Option<Bytes>,
    #[serde(default)]
    pub runtime_class: Option<Spanned<String>>,
    #[serde(default)]
    pub gpu_label: Option<Spanned<String>>,
    #[serde(default)]
    pub gpu_types: BTreeMap<String, Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    pub gpu_affinity: Option<GpuAffinity>,
    #[serde(default)]
    pub weights_pvc: Option<Spanned<String>>,
    #[serde(default)]
    pub secret: Option<Spanned<String>>,
    #[serde(default)]
    pub registry: Option<String>,
    #[serde(default)]
    pub agent_image: Option<String>,
    #[serde(default)]
    pub agent_delivery: Option<AgentDelivery>,
    #[serde(default)]
    pub max_pending: Option<Seconds>,
    #[serde(default)]
    pub unschedulable_grace: Option<Seconds>,
    #[serde(default)]
    pub scale_up_timeout: Option<Seconds>,
    #[serde(default)]
    pub cpu: Option<Spanned<String>>,
}

impl KubernetesSection {
    /// The section without its positions.
    pub fn into_def(self) -> KubernetesDef {
        let v = |s: Spanned<String>| s.value;
        KubernetesDef {
            namespace: self.namespace.map(v),
            context: self.context,
            node_selector: self
                .node_selector
                .into_iter()
                .map(|(k, s)| (k, s.value))
                .collect(),
            tolerations: self.tolerations.into_iter().map(|t| t.value).collect(),
            service_account: self.service_account.map(v),
            image_pull_secrets: self.image_pull_secrets.into_iter().map(v).collect(),
            shm_size: self.shm_size,
            runtime_class: self.runtime_class.map(v),
            gpu_label: self.gpu_label.map(v),
            gpu_types: self
                .gpu_types
                .into_iter()
                .map(|(k, l)| (k, l.value.into_iter().map(v).collect()))
                .collect(),
            gpu_affinity: self.gpu_affinity,
            weights_pvc: self.weights_pvc.map(v),
            secret: self.secret.map(v),
            registry: self.registry,
            agent_image: self.agent_image,
            agent_delivery: self.agent_delivery,
            max_pending: self.max_pending,
            unschedulable_grace: self.unschedulable_grace,
            scale_up_timeout: self.scale_up_timeout,
            cpu: self.cpu.map(v),
        }
    }
}

/// `kubernetes.gpu_affinity`: how a GPU cell's pod picks nodes of its GPU
/// type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuAffinity {
    /// A node affinity on the GPU-type labels, except on a cluster whose GPU
    /// nodes carry none of them (then none: the record's hardware identity
    /// says what ran).
    #[default]
    Auto,
    /// Always the node affinity.
    Required,
    /// Never: the pod asks for `nvidia.com/gpu` only (pick nodes with
    /// `node_selector`).
    Off,
}

/// `kubernetes.agent_delivery`: how the agent (a static binary in the agent
/// image) reaches a cell's container, whatever its image.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentDelivery {
    /// `image-volume` where the cluster has image volumes (the API server
    /// keeps them, and every node's kubelet is 1.35 or later on containerd
    /// 2.1 or CRI-O 1.31 or later), else `init-container`.
    #[default]
    Auto,
    /// The agent image mounted read-only as an `image` volume (KEP-4639):
    /// no second container per pod.
    ImageVolume,
    /// An init container of the agent image copies the agent into an
    /// `emptyDir` (any cluster).
    InitContainer,
}

/// A pod toleration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TolerationDef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// `Exists` or `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute` (empty: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<String>,
}
