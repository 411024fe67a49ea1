//! One cell's task: its GPUs from the pool, its attempt claimed in the store, the backend's
//! run, and its record (budget stop, diagnosis, cost, masking) written the moment it ends.
//!
//! No cell is skipped silently: a cell whose attempt cannot be claimed, whose agent cannot
//! start for want of this host's resources (open files, disk space), or whose record cannot
//! be written is announced at once ([`Progress::CellNotRun`]), left without a record (so
//! `--resume` runs it), and halts the launching of new cells; the run ends `interrupted`.

use crate::budget::mark_budget;
use crate::diagnosis::{diagnose_cell, diagnose_variants, oom_from_diagnosis};
use crate::gpu::GpuPool;
use crate::recorder::Recorder;
use crate::stop::{Stop, StopReason};
use crate::{Progress, RunnerError};
use chrono::Utc;
use orch_backend::{Backend, CellEvent, CellLaunch};
use orch_cost::{BudgetTracker, Rate};
use orch_manifest::CellPlan;
use orch_protocol::mask::Masker;
use orch_protocol::{CellResult, Status};
use orch_record::FailureKind;
use orch_store::{CellRecord, Run, StoreError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};

/// What every cell task of an invocation shares.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    /// The agents' events, relayed (masked) to the progress channel.
    pub(crate) events: mpsc::UnboundedSender<CellEvent>,
    /// The stop channel every cell's backend gets.
    pub(crate) stop_rx: watch::Receiver<bool>,
    pub(crate) stop: Arc<Stop>,
    pub(crate) progress: mpsc::UnboundedSender<Progress>,
    /// Secret environment handed to every cell.
    pub(crate) secrets: Vec<(String, String)>,
    pub(crate) weights_dir: Option<PathBuf>,
    pub(crate) pool: Arc<GpuPool>,
    pub(crate) rules: orch_diagnose::Rules,
    /// Cell tasks only use the run's folder and plan, which do not change.
    pub(crate) run: Arc<Run>,
    /// The run's one writer of records (a group commit).
    pub(crate) recorder: Recorder,
    pub(crate) budget: Option<Arc<Mutex<BudgetTracker>>>,
    /// Every secret value (and its encodings), masked in records.
    pub(crate) masker: Masker,
    /// The files that travel with cells (backends that ship files).
    pub(crate) files: Option<Arc<orch_files::Files>>,
}

impl Shared {
    /// The cell's cost settled in the budget, when there is one.
    fn settle(&self, cell: &str, usd: f64) {
        if let Some(b) = &self.budget {
            if let Ok(mut b) = b.lock() {
                b.finish(cell, usd);
            }
        }
    }
}

/// Run one cell on the backend and record it; `None` when another `orch` runs or recorded
/// it (theirs to record).
pub(crate) async fn run_cell(
    shared: Arc<Shared>,
    cell: CellPlan,
    rate: Option<Rate>,
    image: Option<String>,
    permit: OwnedSemaphorePermit,
) -> Result<Option<Status>, RunnerError> {
    // Held until the cell's record is written.
    let devices = shared.pool.acquire(cell.gpu.count as usize).await;
    // The store is called off the runtime's workers (an object store's
    // claim is a request), on the capped blocking pool.
    let (run, id) = (shared.run.clone(), cell.id.clone());
    let prepared = match tokio::task::spawn_blocking(move || run.prepare_cell(&id)).await {
        Ok(p) => p,
        Err(e) => {
            shared.settle(&cell.id, 0.0);
            return Err(RunnerError::Join(e.to_string()));
        }
    };
    let (dir, attempt) = match prepared {
        Ok(x) => x,
        // Another `orch` (a resume on another machine) runs this
        // cell now, or recorded it since: it is theirs to record.
        Err(StoreError::Claimed { .. } | StoreError::RecordedElsewhere { .. }) => {
            shared.settle(&cell.id, 0.0);
            return Ok(None);
        }
        Err(e) => {
            shared.settle(&cell.id, 0.0);
            not_run(&shared, &cell.id, format!("cannot start: {e}"));
            return Err(e.into());
        }
    };
    let dir_for_diagnosis = dir.clone();
    let _ = shared.progress.send(Progress::CellStarted {
        cell_id: cell.id.clone(),
        attempt,
    });
    let started = Utc::now();
    if let Some(b) = &shared.budget {
        if let Ok(mut b) = b.lock() {
            b.begin(&cell.id, Instant::now());
        }
    }
    // What travels with the cell, staged once per set of paths (cheap for
    // every cell after the first of a suite).
    let files = match (&shared.files, shared.backend.ships_files()) {
        (Some(f), true) => Some(f.shipment(&cell.task)),
        _ => None,
    }
    .transpose();
    let launch = CellLaunch {
        task: cell.task.clone(),
        cell_dir: dir,
        secrets: shared.secrets.clone(),
        weights_dir: shared.weights_dir.clone(),
        image,
        devices: devices.as_ref().map(|d| d.ids.clone()).unwrap_or_default(),
        files: files.as_ref().ok().cloned().flatten(),
    };
    let result = match (&devices, files) {
        (_, Err(e)) => CellResult::failed(&cell.id, Status::Failed, FailureKind::FilesError, e.to_string()),
        (devices, Ok(_)) => match devices {
        Err(total) => CellResult::failed(
            &cell.id,
            Status::Failed,
            FailureKind::NotEnoughGpus,
            format!(
                "the cell asks for {} GPUs and this host has {total}: it does not run on fewer or shared ones",
                cell.gpu.count
            ),
        ),
        Ok(_) => match shared
            .backend
            .run_cell(launch, shared.events.clone(), shared.stop_rx.clone())
            .await
        {
            Ok(r) => r,
            // This host ran out of something (open files, disk): not the
            // cell's failure; it stays unrecorded for `--resume`.
            Err(e) if host_resource(&e) => {
                shared.settle(&cell.id, 0.0);
                not_run(&shared, &cell.id, format!("cannot start: {e}"));
                return Err(e.into());
            }
            Err(e) => CellResult::failed(&cell.id, Status::Failed, FailureKind::Backend, e.to_string()),
        },
        },
    };
    let mut record = CellRecord::from_result(&cell, result, started, Utc::now(), attempt);
    complete_record(
        &mut record,
        &dir_for_diagnosis,
        &shared.stop,
        &shared.rules,
        rate.as_ref(),
    );
    shared.settle(&cell.id, record.cost.as_ref().map(|c| c.usd).unwrap_or(0.0));
    // The cell's place among `--jobs` is given back once the platform is
    // done with it (its cost settled for the budget), not held while its
    // record waits for the store: a cell ending just after a batch of
    // records started does not keep the next cell waiting for that batch.
    drop(permit);
    shared.masker.mask_in_place(&mut record);
    match shared.recorder.record(record.clone()).await {
        Ok(()) => {}
        // Another `orch` recorded the cell first; this attempt's
        // record is kept as an earlier attempt (its cost was spent).
        Err(StoreError::RecordedElsewhere { .. }) => return Ok(None),
        Err(e) => {
            not_run(
                &shared,
                &cell.id,
                format!("ended `{}` but its record cannot be written: {e}", record.status),
            );
            return Err(e.into());
        }
    }
    let _ = shared
        .progress
        .send(Progress::CellFinished(Box::new(record.clone())));
    Ok(Some(record.status))
}

/// Say at once why `cell` has no record, and start no new cell.
fn not_run(shared: &Shared, cell: &str, why: String) {
    shared.stop.halt(format!("cell `{cell}` {why}"));
    let _ = shared.progress.send(Progress::CellNotRun {
        cell_id: cell.to_string(),
        why,
    });
}

/// Whether a backend failed for want of this host's resources: too many
/// open files (the process's or the system's), no space or quota left.
fn host_resource(e: &orch_backend::BackendError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            if matches!(
                io.raw_os_error(),
                Some(libc::EMFILE | libc::ENFILE | libc::ENOSPC | libc::EDQUOT)
            ) {
                return true;
            }
        }
        cause = c.source();
    }
    false
}

/// What the runner adds to a finished cell's record: the budget as the cause of a
/// cancelled cell, the diagnosis (the cell's and each failed variant's), `oom` named from
/// the diagnosis, and the cost at the cell's rate.
fn complete_record(
    record: &mut CellRecord,
    dir: &Path,
    stop: &Stop,
    rules: &orch_diagnose::Rules,
    rate: Option<&Rate>,
) {
    if record.status == Status::Cancelled {
        if let Some(StopReason::Budget(why)) = stop.reason() {
            mark_budget(record, format!("stopped by the budget: {why}"));
        }
    }
    record.diagnosis = diagnose_cell(record, dir, rules);
    diagnose_variants(record, dir, rules);
    oom_from_diagnosis(record);
    // Billed from the platform's start of the container (none without one).
    record.cost = rate.map(|r| orch_cost::record_cost(r, record));
}
