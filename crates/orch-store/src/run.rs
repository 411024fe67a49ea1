//! [`Run`]: an open run, the handle commands and the runner use: its cells'
//! records and files, its state, and the run record built from them.

use crate::{
    check_name, check_relative, CellRecord, CellView, Result, RunMeta, RunRecord, RunState, StoreBackend,
    StoreError, Warnings,
};
use chrono::Utc;
use orch_manifest::{CellPlan, Plan};
use orch_record::{BudgetRecord, CellStatus, RunCost};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open run.
#[derive(Clone)]
pub struct Run {
    pub(crate) backend: Arc<dyn StoreBackend>,
    /// The run's folder on this host: the run itself in a folder store, a
    /// working copy (cells being run, reports) for an object store.
    pub(crate) dir: PathBuf,
    /// What reading skipped; the store's own list.
    pub(crate) warnings: Warnings,
    pub meta: RunMeta,
    pub plan: Plan,
}

impl Run {
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The run's folder on this host (see the field).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Say that reading this run skipped something (a damaged record).
    pub fn warn(&self, text: String) {
        self.warnings.push(text);
    }

    /// Where the run is stored, for messages: a folder or `s3://...`.
    pub fn location(&self) -> String {
        self.backend.run_location(&self.meta.id)
    }

    pub fn cell_dir(&self, cell: &str) -> PathBuf {
        self.dir.join("cells").join(cell)
    }

    /// The finished record of a cell, if it has one.
    pub fn cell_record(&self, cell: &str) -> Result<Option<CellRecord>> {
        check_name("cell id", cell)?;
        self.backend.cell_record(self, cell)
    }

    /// Store a finished cell. Atomic: the record is whole or absent.
    pub fn finish_cell(&self, record: &CellRecord) -> Result<()> {
        check_name("cell id", &record.id)?;
        self.backend.finish_cell(self, record)
    }

    /// Store several finished cells in one write (a group commit, see
    /// [`StoreBackend::finish_cells`]): each one's outcome, in order; each
    /// stored record is whole and durable when this returns.
    pub fn finish_cells(&self, records: &[CellRecord]) -> Vec<Result<()>> {
        let checked: Vec<Result<()>> = records.iter().map(|r| check_name("cell id", &r.id)).collect();
        if checked.iter().all(|c| c.is_ok()) {
            return self.backend.finish_cells(self, records);
        }
        // The records with a safe id are written; the others get their error.
        let ok: Vec<CellRecord> = records
            .iter()
            .zip(&checked)
            .filter(|(_, c)| c.is_ok())
            .map(|(r, _)| r.clone())
            .collect();
        let mut written = self.backend.finish_cells(self, &ok).into_iter();
        checked
            .into_iter()
            .map(|c| match c {
                Ok(()) => written.next().unwrap_or_else(|| {
                    Err(StoreError::Io {
                        action: "record a cell in",
                        path: self.dir.clone(),
                        source: std::io::Error::other("the store gave no outcome for the record"),
                    })
                }),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Update the run's state (and the time of the update).
    pub fn set_state(&mut self, state: RunState) -> Result<()> {
        self.meta.state = state;
        self.meta.updated_at = Utc::now();
        self.backend.save_meta(&self.meta)
    }

    /// Keep the budget of the run (`--max-cost`) in its metadata.
    pub fn set_budget(&mut self, budget: BudgetRecord) -> Result<()> {
        self.meta.budget = Some(budget);
        self.meta.updated_at = Utc::now();
        self.backend.save_meta(&self.meta)
    }

    /// The run as printed by `orch show --json`.
    pub fn record(&self) -> Result<RunRecord> {
        let (records, earlier) = self.backend.all_records(self)?;
        Ok(self.record_from(records, &earlier))
    }

    /// The run record from the current records (in plan order) and the
    /// earlier attempts' records.
    pub fn record_from(&self, records: Vec<Option<CellRecord>>, earlier: &[CellRecord]) -> RunRecord {
        let mut cells = Vec::with_capacity(self.plan.cells.len());
        let mut counts = BTreeMap::new();
        let mut cost = RunCost::default();
        for (c, record) in self.plan.cells.iter().zip(records) {
            if let Some(c) = record.as_ref().and_then(|r| r.cost.as_ref()) {
                cost.add(c, false);
            }
            let view = match record {
                Some(r) => CellView::from(r),
                None => pending(c),
            };
            *counts.entry(view.status.to_string()).or_insert(0) += 1;
            cells.push(view);
        }
        for r in earlier {
            if let Some(c) = &r.cost {
                cost.add(c, true);
            }
        }
        let all_done = cells.iter().all(|c| c.status.is_finished());
        let state = match self.meta.state {
            RunState::Running if all_done => RunState::Complete,
            s => s,
        };
        RunRecord {
            id: self.meta.id.clone(),
            suite: self.meta.suite.clone(),
            state,
            created_at: self.meta.created_at,
            updated_at: self.meta.updated_at,
            backend: self.meta.backend.clone(),
            environment: self.meta.environment.clone(),
            counts,
            cells,
            cost: (cost.cells > 0).then_some(cost),
            budget: self.meta.budget.clone(),
        }
    }

    /// Fail with [`StoreError::NoSuchCell`] unless `cell` is in the plan.
    pub fn check_cell(&self, cell: &str) -> Result<()> {
        if !self.plan.cells.iter().any(|c| c.id == cell) {
            return Err(StoreError::NoSuchCell {
                run: self.meta.id.clone(),
                cell: cell.to_string(),
            });
        }
        Ok(())
    }

    /// Path of a cell's log stream (`stdout` or `stderr`) on this host.
    pub fn log_path(&self, cell: &str, stream: &str) -> Result<PathBuf> {
        self.check_cell(cell)?;
        Ok(self.cell_dir(cell).join(format!("{stream}.log")))
    }

    /// Bytes of a file of a cell's current attempt (`stdout.log`), from
    /// byte `offset` on; `None` when the cell has no such file (yet). For an
    /// object store this includes what a running cell has uploaded so far.
    pub fn read_cell_file(&self, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        self.check_cell(cell)?;
        check_relative("file name", name)?;
        self.backend.read_cell_file(self, cell, name, offset)
    }
}

/// A planned cell without a record, as the run record shows it.
fn pending(c: &CellPlan) -> CellView {
    CellView {
        id: c.id.clone(),
        benchmark: c.benchmark.clone(),
        status: CellStatus::Pending,
        gpu: c.gpu.to_string(),
        params: c.params.clone(),
        metrics: BTreeMap::new(),
        timings: BTreeMap::new(),
        failure: None,
        duration_s: None,
        info: BTreeMap::new(),
        diagnosis: None,
        hardware: None,
        flags: Vec::new(),
        cost: None,
    }
}
