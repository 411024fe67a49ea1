//! The result store: a directory with one folder per run.
//!
//! ```text
//! <store>/<run-id>/
//!   run.json              run metadata (suite, environment, backend, state)
//!   manifest.yaml         the manifest as given
//!   plan.json             the resolved, expanded plan (what `--resume` runs)
//!   cells/<cell-id>/      task.json, stdout.log, stderr.log, events.jsonl, agent.log
//!   cells/<cell-id>/result.json   the cell's record; its presence means "done"
//!   interrupted/<cell-id>.<n>/    earlier attempts that never finished
//!   costs.jsonl           the cost ledger, a cache of the records
//!   .writer.lock, writer.json   the one writer's lock and name (host, pid, since)
//! ```
//!
//! Invariant: a cell's `result.json` is written last, atomically (temporary
//! file, fsync, rename, fsync of the folder), and only by the host. A run
//! killed at any moment has every finished cell's record whole, and no
//! half-written one. What else may sit at that path (the agent's own
//! `result.json`, left when `orch` was killed between the agent's end and
//! the record; a file cut short or edited) is not a record: the cell counts
//! as not run, a warning names the file ([`Warnings`]), `--resume` runs the
//! cell again and keeps the file in `interrupted/` (renamed
//! `result.unrecorded.json`). One such file costs its own cell only.
//!
//! One writer per run: `orch run` and `--resume` hold the run's writer lock
//! (`lock.rs`; folder store), so two processes never run or record the same
//! cells; the ledger drops a line it has twice (same cell and attempt).
//!
//! The shapes stored (`RunMeta`, `CellRecord`, `RunRecord`, ...) are
//! `orch-record`'s, re-exported here. The parts:
//!
//! - `store.rs`: [`Store`], the store commands use: create, open (by id,
//!   prefix or `latest`), list, and the cost ledgers of every run;
//! - `run.rs`: [`Run`], an open run: its cells' records, files and state,
//!   and the run record built from them; [`Run::finish_cells`] stores a
//!   batch of records at once (the runner's group commit: the folder store
//!   syncs the batch's records side by side and appends the ledger once);
//! - `resume.rs`: resume bookkeeping: the cells `--resume` runs, a clean
//!   folder for each new attempt (an unfinished one moved to `interrupted/`);
//! - `backend.rs`: [`StoreBackend`], the one interface of a store kind;
//!   `folder.rs`: [`FolderStore`], the folder store;
//! - `ledger.rs`: the cost ledger (`costs.jsonl`) and estimates' history;
//! - `names.rs`: [`check_name`]/[`check_relative`], ids and file names that
//!   stay inside the run;
//! - `lock.rs`: the writer lock of a run; `warnings.rs`: what was
//!   skipped while reading (damaged or foreign records, unreadable runs);
//! - `ids.rs`: new run ids; `files.rs`: atomic writes and JSON files;
//!   `environment.rs`: the host's [`Environment`]; `error.rs`: [`StoreError`].

mod backend;
mod environment;
mod error;
mod files;
mod folder;
mod ids;
mod ledger;
mod lock;
mod names;
mod resume;
mod run;
mod store;
#[cfg(test)]
mod test_support;
mod warnings;

pub use backend::StoreBackend;
pub use environment::host_environment;
pub use error::{held_cells, Result, StoreError};
pub use files::{read_json, write_atomic, write_json};
pub use folder::{FolderStore, UNRECORDED};
pub use ledger::{cell_model, parallel_map, parallel_map_with, LEDGER_FILE};
pub use lock::{hostname, Writer, WriterLock, LOCK_FILE, WRITER_FILE};
pub use names::{check_name, check_relative};
pub use orch_record::{
    CellRecord, CellStatus, CellView, Environment, RunMeta, RunRecord, RunState, RunSummary,
};
pub use run::Run;
pub use store::Store;
pub use warnings::Warnings;

pub(crate) use error::io;

pub const DEFAULT_STORE: &str = "results";
