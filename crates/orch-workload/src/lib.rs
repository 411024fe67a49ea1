//! `orch-workload`: what every workload of the agent shares, so that the load
//! generator (`orch-loadgen`), the builtin transformer and calibration
//! (`orch-kernels`) and the agent itself (`orch-agent`) see one agent.
//!
//! `ctx.rs`: [`Ctx`], what a workload sees of the agent (phase bookkeeping and
//! timings, events through a sink, progress and messages, the stop flag, a hook
//! told of phase changes); `stats.rs`: mean/median/p95/p99/std/CV of repeated
//! measurements; `sysmem.rs`: RSS, total and available memory (`/proc`, the
//! cgroup's `memory.max`). No IO beyond reading those files; no async runtime.

pub mod ctx;
pub mod stats;
pub mod sysmem;

pub use ctx::Ctx;
