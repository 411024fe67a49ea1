//! The one interface of a result store. [`crate::Store`] and [`crate::Run`]
//! are the types commands use; they hold an `Arc<dyn StoreBackend>`: the
//! folder store ([`crate::FolderStore`]) or an object store (the
//! `orch-store-s3` crate). Run and cell ids reaching an implementation have
//! been checked with [`crate::check_name`].

use crate::{CellRecord, Result, Run, RunMeta, RunSummary, Store, StoreError, WriterLock};
use chrono::{DateTime, Utc};
use orch_cost::{History, LedgerLine};
use orch_manifest::Plan;
use std::path::{Path, PathBuf};

pub trait StoreBackend: Send + Sync {
    /// Where the store is, for messages (`results`, `s3://bucket/prefix`).
    fn location(&self) -> String;

    /// Where one run is, for messages.
    fn run_location(&self, id: &str) -> String;

    /// The store's folder, when it is one.
    fn folder(&self) -> Option<&Path> {
        None
    }

    /// The run's folder on this host: the run itself for a folder store, a
    /// working copy (running cells' files, reports) for an object store.
    fn local_dir(&self, id: &str) -> PathBuf;

    /// The ids of the runs (any order; unsafe names are dropped by the caller).
    fn run_ids(&self) -> Result<Vec<String>>;

    /// Whether a run with exactly this id exists.
    fn has_run(&self, id: &str) -> Result<bool> {
        Ok(self.run_ids()?.iter().any(|i| i == id))
    }

    /// Store a new run: its metadata, manifest text and resolved plan.
    fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()>;

    /// The metadata (latest state) and plan of a run.
    fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)>;

    /// Become the one writer of a run (see `lock.rs`); a store without a
    /// run-wide lock (an object store, whose cells are claimed one by one)
    /// answers no lock.
    fn lock_run(&self, _run: &Run) -> Result<WriterLock> {
        Ok(WriterLock::none())
    }

    /// Open these runs only to read them (`orch history` over a whole
    /// store), in the order of `ids`: each as [`Store::open_exact`] opens
    /// it, or with fewer requests where the store can tell from what it
    /// reads once that a run is finished (an object store's caches). A run
    /// still being written is opened as `open_exact` opens it.
    fn open_to_read(&self, store: &Store, ids: &[String]) -> Vec<Result<Run>> {
        crate::parallel_map(ids, |id| store.open_exact(id))
    }

    /// Every run of the store (as [`Store::run_ids`] lists them) opened as
    /// [`StoreBackend::open_to_read`] opens them, each with its id.
    #[allow(clippy::type_complexity)]
    fn open_all_to_read(&self, store: &Store) -> Result<Vec<(String, Result<Run>)>> {
        let ids = store.run_ids()?;
        let runs = self.open_to_read(store, &ids);
        Ok(ids.into_iter().zip(runs).collect())
    }

    /// Record a change of the run's state, budget or resume count.
    fn save_meta(&self, meta: &RunMeta) -> Result<()>;

    /// Where this host keeps what could not be written to the store (an
    /// object store's spool of records and state), when something is kept.
    fn kept_locally(&self, _id: &str) -> Option<PathBuf> {
        None
    }

    /// The current record of one cell (finished, or the last cancelled one).
    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>>;

    /// The current record of every cell of the plan, in plan order.
    fn cell_records(&self, run: &Run) -> Result<Vec<Option<CellRecord>>> {
        run.plan
            .cells
            .iter()
            .map(|c| self.cell_record(run, &c.id))
            .collect()
    }

    /// The records of earlier attempts (superseded by a later attempt).
    fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>>;

    /// Both at once: the current records (plan order) and the earlier ones,
    /// for a store that reads them in one pass.
    #[allow(clippy::type_complexity)]
    fn all_records(&self, run: &Run) -> Result<(Vec<Option<CellRecord>>, Vec<CellRecord>)> {
        Ok((self.cell_records(run)?, self.earlier_records(run)?))
    }

    /// A clean local folder for a new attempt at `cell`, and its number.
    fn prepare_cell(&self, run: &Run, cell: &str) -> Result<(PathBuf, u32)>;

    /// Store a finished attempt's record (and, for an object store, the
    /// attempt's files that are not up yet).
    fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()>;

    /// Store several finished attempts' records in one write (a group
    /// commit: the cells that ended while the previous write was under
    /// way): each record as durable as [`StoreBackend::finish_cell`] makes
    /// it before this returns, and each one's own outcome, in order. What
    /// the run keeps beside the records (a ledger, an index) is written
    /// once for the whole batch, not once per record.
    fn finish_cells(&self, run: &Run, records: &[CellRecord]) -> Vec<Result<()>> {
        records.iter().map(|r| self.finish_cell(run, r)).collect()
    }

    /// The run's cost ledger (one line per recorded attempt).
    fn ledger(&self, run: &Run) -> Result<Vec<LedgerLine>>;

    /// Bytes of a file of the cell's current attempt from `offset` on.
    fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>>;

    /// One summary per readable run, and the errors of the damaged ones.
    fn summaries(&self, store: &Store) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        let mut out = Vec::new();
        let mut damaged = Vec::new();
        for id in store.run_ids()? {
            match store.summary_of(&id) {
                Ok(s) => out.push(s),
                Err(e) => damaged.push(e),
            }
        }
        Ok((out, damaged))
    }

    /// Ledger lines of every run, with `since` only those finished after it.
    fn cost_lines(&self, store: &Store, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        let mut out = Vec::new();
        for id in store.run_ids()? {
            let run = store.open_exact(&id)?;
            out.extend(
                run.ledger()?
                    .into_iter()
                    .filter(|l| since.is_none_or(|s| l.finished_at >= s)),
            );
        }
        Ok(out)
    }

    /// Durations of the succeeded cells of earlier runs of `suite`.
    fn history(&self, store: &Store, suite: &str) -> Result<History> {
        let mut h = History::new();
        for l in self.cost_lines(store, None)? {
            if l.suite == suite {
                h.add(&l);
            }
        }
        Ok(h)
    }
}
