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
//! The agent is composed of four crates of its own: `orch-workload` (`ctx.rs`:
//! phase timing and events; `stats.rs`: mean/median/p95/p99/std/CV; `sysmem.rs`:
//! RSS, total and available memory), `orch-loadgen` (the load generator: `loadgen.rs`,
//! the event-loop client `evclient.rs`, `tokens.rs`, `dataset.rs`, `lengths.rs`; no
//! candle), `orch-kernels` (`transformer/`, `fused/`, `device.rs` and `calibrate.rs`'s
//! measurements: the only crate on candle-core, and the one the `cuda` feature reaches)
//! and `orch-contain` (`cellinit.rs`, `reaper.rs`, `cgroup.rs`: no process of a
//! workload outlives its cell). The modules of theirs that the agent uses are
//! re-exported here under the paths it has always used (`orch_agent::cellinit`,
//! `orch_agent::loadgen`, `orch_agent::transformer`, ...).
//!
//! Here: `run.rs`: CLI (`orch-agent run --task F --out D`), task checks, signal
//! flags, panic → failed cell; `files.rs`: the files that travel with the cell laid out
//! from their blobs (whole or chunked), each SHA-256 checked, before the workload;
//! `command.rs`: supervised process group, markers, metrics file, timeout/stop, exit
//! code/signal; `server.rs`: server start, readiness (http/tcp/log) polled with the
//! process every 50 ms (a dead server fails the cell at once), client, group teardown
//! until the port is free; `compare.rs`: variants (git checkout, the host tree's
//! uncommitted changes, `git apply --check` with git's report in `patch.log`,
//! install), rounds of the server workload in a seeded per-round shuffled order,
//! `rounds: auto` (until the primary metric's interval is within the noise threshold,
//! `max_rounds` or the cell timeout), pairwise comparisons through `orch-stats`,
//! `warmup_rounds: auto`, the gaming defences (a nonce per round, flags, the answers'
//! lengths of `orch-loadgen`'s `lengths.rs`), gates (`output_mismatch`, `flagged`);
//! `outcheck.rs`: the output check before timed rounds (fixed greedy prompts, answers
//! compared with the baseline's, evidence in `output-check/`); `capture.rs`: head+tail
//! log capture; `ship.rs`: `--ship`, the output folder and events as numbered frames
//! on stdout; `calibrate.rs`: the `calibrate` workload's figures judged against the
//! GPU model's expected ones (`degraded_gpu`); `launch.rs`: which build runs (the
//! static file `exec`s its embedded glibc 2.17 build from a memfd where the image has
//! a loader, after a probe in a child; `probe` subcommand); `gpu.rs`: NVML loaded at
//! run time by the dynamic build only, else GPUs named by `nvidia-smi`, procfs or
//! device nodes (hardware identity narrowed by `CUDA_VISIBLE_DEVICES`,
//! requested-vs-present matching for `hardware_mismatch`, the telemetry sampler thread
//! told of phase changes through a `Ctx` hook); `secrets.rs`: the agent's masker
//! (task's `secret_env`, known credentials, the Hub token file) and the sweep of the
//! cell folder's other files. It does not: depend on tokio, clap or any cloud SDK; link
//! CUDA unless built with `--features cuda`.

pub mod calibrate;
pub mod capture;
pub mod command;
pub mod compare;
pub mod files;
pub mod gpu;
pub mod launch;
pub mod outcheck;
pub mod run;
pub mod secrets;
pub mod server;
pub mod ship;

// The agent's own crates, under the paths its modules (and `orch`'s `main`:
// `orch_agent::cellinit::dispatch`) use.
pub use orch_contain::{cellinit, cgroup, reaper};
pub use orch_kernels::transformer;
pub use orch_loadgen::{lengths, loadgen, tokens};
pub use orch_workload::{ctx, sysmem};

pub use ctx::Ctx;
pub use run::{run_task, AgentError};

/// The agent's version, reported in every result.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
