//! `orch-contain`: no process of a workload outlives its cell (the invariant
//! of the same name in `ARCHITECTURE.md`). Used by `orch-agent`, whose `main`
//! (and `orch`'s) calls [`cellinit::dispatch`] first thing.
//!
//! `cellinit.rs`: the cell launcher (`cell-init`, the agent's own binary
//! re-executed): each workload process in a PID namespace of its own whose init
//! dies with the launcher, which dies with the agent, so a SIGKILL of every orch
//! process still ends them; the probe deciding where it can be used (`mode`,
//! `ORCH_CELL_PIDNS=0`); `reaper.rs`: subreaper, workload marks
//! (`ORCH_AGENT_TOKEN`), `/proc` walks, the guard process, process names, waiting
//! for GPU memory to be released; `cgroup.rs`: the cell's cgroup v2 (created
//! where writable, joined by every workload process, killed with `cgroup.kill`).
//! Linux only; `libc` and `std`, no async runtime.

pub mod cellinit;
pub mod cgroup;
pub mod reaper;
