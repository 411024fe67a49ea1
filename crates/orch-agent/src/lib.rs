//! `orch-agent`: runs one cell's workload and reports on it.
//!
//! The agent is deliberately small: no async runtime, no cloud SDK. It reads a
//! [`orch_protocol::TaskSpec`], writes the workload's stdout/stderr into its
//! output folder, prints [`orch_protocol::Event`]s as JSON lines on its own
//! stdout and ends with a [`orch_protocol::CellResult`] (as the last event and as
//! `result.json` in the output folder).

pub mod calibrate;
pub mod capture;
pub mod command;
pub mod compare;
pub mod ctx;
pub mod device;
pub mod fused;
pub mod gpu;
pub mod launch;
pub mod loadgen;
pub mod reaper;
pub mod run;
pub mod secrets;
pub mod server;
pub mod ship;
pub mod stats;
pub mod sysmem;
pub mod transformer;

pub use ctx::Ctx;
pub use run::{run_task, AgentError};

/// The agent's version, reported in every result.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
