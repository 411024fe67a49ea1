//! `orch-agent`: runs one cell's workload and reports on it.
//!
//! The agent is deliberately small: no async runtime, no cloud SDK. It reads a
//! [`orch_protocol::TaskSpec`], writes the workload's stdout/stderr into its
//! output folder, prints [`orch_protocol::Event`]s as JSON lines on its own
//! stdout and ends with a [`orch_protocol::CellResult`] (as the last event and as
//! `agent-result.json` in the output folder, never the host record's name).
//!
//! ## What is where
//!
//! `run.rs`: CLI (`orch-agent run --task F --out D`), task checks, signal
//! flags, panic → failed cell; `files.rs`: the files that travel with the cell laid out
//! from their blobs (whole or chunked), each SHA-256 checked, before the workload;
//! `ctx.rs`: phase timing and events; `command.rs`:
//! supervised process group, markers, metrics file, timeout/stop, exit code/signal;
//! `server.rs`: server start, readiness (http/tcp/log) polled with the process every 50
//! ms (a dead server fails the cell at once), client, group teardown until the port is
//! free; `loadgen.rs`: OpenAI-compatible load (gamma arrivals, ramps or a trace's
//! times, multi-turn conversations, sweeps and the saturation search, SLO goodput,
//! latency from the intended send time, nonces and anti-gaming signals, `outputs.jsonl`)
//! with vllm bench serve field names; `evclient.rs`: the one-thread mio HTTP/1.1 client
//! (keep-alive, chunked, SSE lines, timeouts); `tokens.rs`: the model's
//! `tokenizer.json` loaded as `transformers` runs it (padding and truncation off;
//! counts, random prompts of exact lengths as the server counts them); `dataset.rs`: prompt
//! files (lists, ShareGPT, JSONL, traces); `compare.rs`: variants (git checkout, the host tree's uncommitted changes, `git apply --check`
//! with git's report in `patch.log`, install), rounds of the server workload in a seeded
//! per-round shuffled order, `rounds: auto` (until the primary metric's interval is
//! within the noise threshold, `max_rounds` or the cell timeout), pairwise comparisons
//! through `orch-stats`, `warmup_rounds: auto`, the gaming defences (a nonce per
//! round, flags), gates (`output_mismatch`, `flagged`); `outcheck.rs`: the output check
//! before timed rounds (fixed greedy prompts, answers compared with the baseline's,
//! evidence in `output-check/`); `lengths.rs`: each variant's answers paired with the
//! baseline's for the same prompts every round (`shorter_outputs`,
//! `inflated_token_counts`: the defence that does not rest on the server's own
//! `usage`); `capture.rs`: head+tail log capture; `ship.rs`: `--ship`, the
//! output folder and events as numbered frames on stdout; `transformer/`: candle-core
//! decoder-only transformer (fused by default: forward from the fused ops, backward
//! written out op by op; `ORCH_TRANSFORMER_KERNELS=autograd|unfused` for A/B), memory
//! preflight fitted to the fused path, oom; `fused/`: the fused ops with their backward
//! (`kernels.cu`: causal softmax, layer norm, bias+GELU, column sums, cross-entropy,
//! embedding, head layout; `cuda.rs`: NVRTC compile cached per process and launches on
//! candle's storages; `cpu.rs`: the f32 reference; `mod.rs`: tensor-level
//! forward/backward functions and candle `CustomOp`s whose `bwd` calls them; `check.rs`:
//! gradient checks against the unfused composition, run by the tests on the CPU and by
//! `orch-agent check-kernels` on a GPU); `calibrate.rs`: matmul TFLOP/s per dtype and
//! copy bandwidth, judged against the GPU model's expected figures (`degraded_gpu`);
//! `device.rs`: CPU/CUDA device choice, dtypes, and the CUDA memory-pool release
//! threshold; `launch.rs`: which build runs (the static file `exec`s its embedded glibc
//! 2.17 build from a memfd where the image has a loader, after a probe in a child;
//! `probe` subcommand); `gpu.rs`: NVML loaded at run time by the dynamic build only, else
//! GPUs named by `nvidia-smi`, procfs or device nodes (hardware identity narrowed by
//! `CUDA_VISIBLE_DEVICES`, requested-vs-present matching for `hardware_mismatch`, the
//! telemetry sampler thread told of phase changes through a `Ctx` hook); `stats.rs`:
//! mean/median/p95/p99/std/CV; `secrets.rs`: the agent's masker (task's `secret_env`,
//! known credentials, the Hub token file) and the sweep of the cell folder's other files;
//! `cellinit.rs`: the cell launcher (`cell-init`, the agent's own binary re-executed):
//! each workload process in a PID namespace of its own whose init dies with the launcher,
//! which dies with the agent, so a SIGKILL of every orch process still ends them; the probe
//! deciding where it can be used; `reaper.rs`: subreaper, workload marks, `/proc` walks, the
//! guard process, process names, waiting for GPU memory; `cgroup.rs`: the cell's cgroup v2
//! (created where writable, joined by every workload process, killed with `cgroup.kill`); `sysmem.rs`: RSS, total and available memory. It does not: depend on
//! tokio, clap or any cloud SDK; link CUDA unless built with `--features cuda`.

pub mod calibrate;
pub mod capture;
pub mod command;
pub mod compare;
pub mod device;
pub mod files;
pub mod fused;
pub mod gpu;
pub mod launch;
pub mod outcheck;
pub mod run;
pub mod secrets;
pub mod server;
pub mod ship;
pub mod transformer;

// The agent's own crates, under the paths its modules (and `orch`'s `main`:
// `orch_agent::cellinit::dispatch`) use.
pub use orch_contain::{cellinit, cgroup, reaper};
pub use orch_loadgen::{lengths, loadgen, tokens};
pub use orch_workload::{ctx, stats, sysmem};

pub use ctx::Ctx;
pub use run::{run_task, AgentError};

/// The agent's version, reported in every result.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
