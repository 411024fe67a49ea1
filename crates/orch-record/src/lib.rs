//! The run record schema: the shapes a store writes and every reader
//! (reports, `orch show`, `orch ls`, `orch compare`, the cost ledger) reads.
//!
//! - [`run`]: a run's metadata as stored ([`RunMeta`], [`RunState`],
//!   [`Environment`]), the whole run as printed and reported ([`RunRecord`])
//!   and its line in `orch ls` ([`RunSummary`]);
//! - [`cell`]: one finished cell's record ([`CellRecord`], the cell's
//!   `result.json`), the seconds a platform bills for it
//!   ([`CellRecord::billed_s`]: from its container's start,
//!   [`CONTAINER_STARTED_AT`]) and a cell as a run record shows it
//!   ([`CellView`]: its record, or `pending`);
//! - [`diagnosis`]: the named cause of a failure ([`Diagnosis`]), as
//!   `orch-diagnose` finds it in a cell's logs; its kind is a [`FailureKind`]
//!   (defined in `orch-protocol`, where a cell's `Failure` names one too,
//!   and re-exported here: every reader and writer of a kind uses it);
//! - [`compare`]: a comparison cell's `info` ([`CompareInfo`]: its variants,
//!   gates, pairs, verdicts and per-metric comparisons), as the agent writes
//!   it and every reader reads it;
//! - [`cost`]: what a cell and a run cost ([`CellCost`], [`RunCost`]) and the
//!   budget of `--max-cost` ([`BudgetRecord`]), as `orch-cost` computes them.
//!
//! Contract: these are the files of every store (`run.json`,
//! `cells/<id>/result.json`) and the JSON of `orch show --json`: add fields
//! (with a serde default), never rename or remove one.
//!
//! No IO, no store and no rules: the crates that compute these values
//! (`orch-diagnose`, `orch-cost`) and the one that writes them
//! (`orch-store`) depend on this one and re-export its types under their
//! old paths. The `plan` feature adds [`CellRecord::from_result`] (a record
//! from a planned cell of `orch-manifest`).

pub mod cell;
pub mod compare;
pub mod cost;
pub mod diagnosis;
pub mod run;

pub use cell::{CellRecord, CellStatus, CellView, CONTAINER_STARTED_AT};
pub use compare::CompareInfo;
pub use cost::{BudgetRecord, CellCost, RunCost, OTHER_PHASE};
pub use diagnosis::Diagnosis;
pub use orch_protocol::FailureKind;
pub use run::{run_id, Environment, RunMeta, RunRecord, RunState, RunSummary};
