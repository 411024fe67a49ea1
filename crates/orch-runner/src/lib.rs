//! Runs the cells of a stored run on a backend.
//!
//! - at most `concurrency` cells at once, launched in plan order;
//! - each finished cell is recorded in the store the moment it ends (so a
//!   crash of `orch` loses no finished cell);
//! - on cancel, no new cell starts, running ones are stopped by their backend
//!   and recorded `cancelled`;
//! - a backend error for one cell is that cell's failure, never the sweep's end;
//! - each record gets its cost from the cell's price ([`CostOptions`]); under
//!   a cap (`--max-cost`) a cell is launched only if the committed cost stays
//!   within it, and running cells are stopped (recorded `cancelled`, failure
//!   kind `budget`) when it would be passed (see [`orch_cost::budget`]).
//!
//! Stopping: one internal stop channel is handed to every cell's backend.
//! It fires on the caller's cancel (Ctrl-C) or on the budget; the first
//! reason is kept and decides how stopped cells are recorded.
//!
//! The files: this one ([`execute`] and its steps), `cell.rs` (one cell's task),
//! `recorder.rs` (the run's one writer of records: a group commit), `gpu.rs` (the GPU
//! pool), `diagnosis.rs` (causes named from logs), `budget.rs` (prices and the cap),
//! `stop.rs` (the stop channel).
//!
//! Host resources: a cell is a task and its state (kilobytes), never a thread. The
//! store is called off the runtime's workers: a cell's claim on the blocking pool (which
//! `orch` caps), its record through the recorder, which writes every record pending at
//! once in one batch ([`orch_store::Run::finish_cells`]) and answers each cell when its
//! record is stored.
//!
//! ## What is where
//!
//! `execute`: launches unfinished cells in plan order under a semaphore,
//! hands each GPU cell its own devices from a pool (when the host's GPUs are known),
//! names the cause of each failed cell (and of each failed variant of a comparison) from
//! its logs (`orch-diagnose`) into its record (a command that failed with the cause
//! `cuda_oom` becomes `oom`), records each cell's cost, enforces `--max-cost` (admission
//! and stop) through one internal stop channel (cancel or budget), records each finished
//! cell (through the recorder: cells ending together are one write), stops launching on cancel or on a store/host failure (each cell it leaves without
//! a record announced at once, `Progress::CellNotRun`), sets the run state (`interrupted`
//! when it fails, `store_unreachable` when the store could not be reached); `Progress` events for the UI. It does not: print anything.

mod budget;
mod cell;
mod diagnosis;
mod gpu;
mod recorder;
mod stop;

pub use budget::{CostOptions, BUDGET_FAILURE, BUDGET_TICK};
pub use diagnosis::{diagnose_cell, diagnose_variants, oom_from_diagnosis};
pub use gpu::GpuDevices;

use budget::{record_not_started, Budget};
use cell::{run_cell, Shared};
use gpu::GpuPool;
use orch_backend::{Backend, CellEvent};
use orch_manifest::CellPlan;
use orch_protocol::mask::Masker;
use orch_protocol::Status;
use orch_store::{CellRecord, Run, RunState, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;
use stop::{Stop, StopReason};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

/// What the runner reports while it works.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // an agent's result event, once per cell
pub enum Progress {
    /// The cells this invocation will run (after skipping finished ones).
    Planned {
        total: usize,
        skipped: usize,
    },
    CellStarted {
        cell_id: String,
        attempt: u32,
    },
    Agent(CellEvent),
    CellFinished(Box<CellRecord>),
    /// A cell that could not start, or whose record could not be written
    /// (a store or host failure): it has no record and `--resume` runs it.
    /// Sent the moment it happens; no new cell starts after it.
    CellNotRun {
        cell_id: String,
        why: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Backend(#[from] orch_backend::BackendError),
    #[error("a cell task failed to complete: {0}")]
    Join(String),
}

pub struct RunnerOptions {
    pub concurrency: usize,
    /// Secret environment handed to every cell.
    pub secrets: Vec<(String, String)>,
    /// The weights volume (hub cache) on the backend's side.
    pub weights_dir: Option<std::path::PathBuf>,
    /// Resolved image per cell id (container backends).
    pub images: BTreeMap<String, String>,
    /// Who gives cells their GPUs: this host's (each GPU cell gets its
    /// own, so no two running cells share a GPU), or the platform's.
    pub gpu_devices: GpuDevices,
    /// Rules that name the cause of a failed cell (default: the built-in ones).
    pub diagnose_rules: Option<orch_diagnose::Rules>,
    /// Prices of the cells, and the budget.
    pub cost: CostOptions,
    /// The files that travel with cells, for a backend that ships them
    /// (`Backend::ships_files`); `None`: none travel.
    pub files: Option<Arc<orch_files::Files>>,
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub counts: BTreeMap<Status, usize>,
    /// Cells that were not started because of a cancel or the budget.
    pub not_started: usize,
    pub cancelled: bool,
    /// Why the budget stopped the run, when it did.
    pub budget_stopped: Option<String>,
}

impl Outcome {
    /// True when every cell of this invocation succeeded.
    pub fn all_succeeded(&self) -> bool {
        !self.cancelled
            && self.budget_stopped.is_none()
            && self.not_started == 0
            && self.counts.keys().all(|s| *s == Status::Succeeded)
    }
}

/// Run every unfinished cell of `run` on `backend`. When it fails (the
/// store or the backend), the run is left `interrupted`, or
/// `store_unreachable` when the store could not be reached (if the store
/// still takes that), never `running`: `--resume` runs the rest.
pub async fn execute(
    run: &mut Run,
    backend: Arc<dyn Backend>,
    opts: RunnerOptions,
    progress: mpsc::UnboundedSender<Progress>,
    cancel: watch::Receiver<bool>,
) -> Result<Outcome, RunnerError> {
    let out = execute_cells(run, backend, opts, progress, cancel).await;
    if run.meta.state == RunState::Running {
        let state = match &out {
            Ok(_) => None,
            Err(RunnerError::Store(e)) if e.is_outage() => Some(RunState::StoreUnreachable),
            Err(_) => Some(RunState::Interrupted),
        };
        if let Some(state) = state {
            // Best effort: a store that refuses this too leaves the run
            // `running`, which `--resume` treats the same way (an object
            // store keeps the state on this host and writes it later).
            let _ = run.set_state(state);
        }
    }
    out
}

async fn execute_cells(
    run: &mut Run,
    backend: Arc<dyn Backend>,
    opts: RunnerOptions,
    progress: mpsc::UnboundedSender<Progress>,
    cancel: watch::Receiver<bool>,
) -> Result<Outcome, RunnerError> {
    // The backend passed its preflight when its host made it
    // (`Host::backend`): once per run, before the run was created.
    let cells = cells_to_run(run, &progress)?;

    // Every secret value (and its encodings) is masked in what the runner
    // passes on (events shown live) and records (diagnosis included), on
    // top of the agent's and the backend's own masking.
    let masker = orch_backend::host_masker(&opts.secrets);
    let (events, forward) = forward_events(&progress, &masker);

    // One stop channel for every cell: the caller's cancel or the budget.
    // The sender lives until every cell is joined (a dropped sender is no
    // cancel: the lifecycle waits for `true`, see `orch_backend::lifecycle`).
    let (stop, stop_rx) = Stop::new();
    let relay = stop.relay(cancel.clone());
    let tick = opts.cost.tick.unwrap_or(BUDGET_TICK);
    let budget = Budget::start(run, &opts.cost, tick, &stop)?;

    // Cells' records go through one writer (a group commit), off the runtime's workers.
    let run_now = Arc::new(run.clone());
    let (recorder, writer) = recorder::Recorder::start(run_now.clone());
    let shared = Arc::new(Shared {
        backend: backend.clone(),
        events,
        stop_rx: stop_rx.clone(),
        stop: stop.clone(),
        progress: progress.clone(),
        secrets: opts.secrets.clone(),
        weights_dir: opts.weights_dir.clone(),
        pool: Arc::new(GpuPool::new(opts.gpu_devices.clone())),
        rules: opts.diagnose_rules.clone().unwrap_or_default(),
        run: run_now,
        recorder,
        budget: budget.as_ref().map(|b| b.tracker.clone()),
        masker,
        files: opts.files.clone(),
    });
    let mut tally = Tally::default();
    let (mut tasks, not_launched) = launch_cells(
        &cells,
        &shared,
        &opts,
        (&cancel, &stop_rx),
        budget.as_ref(),
        &mut tally,
    )
    .await?;
    // The last cell to end drops the event sender: the relay of events ends.
    drop(shared);
    while let Some(joined) = tasks.join_next().await {
        tally.add(joined);
    }
    let Tally { counts, first_error } = tally;
    // Every cell was answered: the writer ends with the last of them.
    let _ = writer.await;
    if let Some(b) = &budget {
        b.stop_checking();
    }
    relay.abort();
    let _ = forward.await;
    if let Some(e) = first_error {
        return Err(e);
    }
    let reason = stop.reason();
    let budget_stopped = match &reason {
        Some(StopReason::Budget(why)) => Some(why.clone()),
        _ => None,
    };
    if let Some(why) = &budget_stopped {
        record_not_started(run, &not_launched, why, &opts.cost.rates, &progress)?;
    }
    if let Some(b) = &budget {
        b.record(run, &opts.cost, budget_stopped.clone())?;
    }
    let cancelled = *cancel.borrow() || reason == Some(StopReason::Interrupted);
    set_final_state(run, cancelled || budget_stopped.is_some())?;
    Ok(Outcome {
        counts,
        not_started: not_launched.len(),
        cancelled,
        budget_stopped,
    })
}

/// The cells this invocation runs (the unfinished ones, in plan order), announced on
/// `progress` with the number skipped.
fn cells_to_run(run: &Run, progress: &mpsc::UnboundedSender<Progress>) -> Result<Vec<CellPlan>, RunnerError> {
    let todo: Vec<String> = run.unfinished_cells()?;
    let skipped = run.plan.cells.len() - todo.len();
    let _ = progress.send(Progress::Planned {
        total: todo.len(),
        skipped,
    });
    Ok(run
        .plan
        .cells
        .iter()
        .filter(|c| todo.contains(&c.id))
        .cloned()
        .collect())
}

/// The channel of the agents' events and the task that relays them, masked, to `progress`
/// (it ends once every sender is dropped).
fn forward_events(
    progress: &mpsc::UnboundedSender<Progress>,
    masker: &Masker,
) -> (mpsc::UnboundedSender<CellEvent>, JoinHandle<()>) {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<CellEvent>();
    let forward = {
        let progress = progress.clone();
        let masker = masker.clone();
        tokio::spawn(async move {
            while let Some(mut e) = ev_rx.recv().await {
                masker.mask_in_place(&mut e.event);
                let _ = progress.send(Progress::Agent(e));
            }
        })
    };
    (ev_tx, forward)
}

/// The running cells' tasks.
type CellTasks = JoinSet<Result<Option<Status>, RunnerError>>;

/// Launch the cells in plan order, at most `concurrency` at once, until a stop (cancel or
/// budget) or a cell the budget does not admit. Returns the launched cells' tasks and the
/// cells not launched.
async fn launch_cells(
    cells: &[CellPlan],
    shared: &Arc<Shared>,
    opts: &RunnerOptions,
    (cancel, stop_rx): (&watch::Receiver<bool>, &watch::Receiver<bool>),
    budget: Option<&Budget>,
    tally: &mut Tally,
) -> Result<(CellTasks, Vec<CellPlan>), RunnerError> {
    let semaphore = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    let mut not_launched: Vec<CellPlan> = Vec::new();
    let mut stop_wait = stop_rx.clone();
    for (i, cell) in cells.iter().enumerate() {
        // Finished cells are joined as the run goes: a task is one
        // allocation the size of its future, held until it is joined, so
        // joining only at the run's end kept every finished cell's.
        while let Some(joined) = tasks.try_join_next() {
            tally.add(joined);
        }
        let permit = tokio::select! {
            p = semaphore.clone().acquire_owned() => p.map_err(|e| RunnerError::Join(e.to_string()))?,
            _ = stop_wait.wait_for(|c| *c) => { not_launched = cells[i..].to_vec(); break; }
        };
        if *stop_rx.borrow() || *cancel.borrow() || shared.stop.halted().is_some() {
            not_launched = cells[i..].to_vec();
            break;
        }
        let rate = opts.cost.rates.get(&cell.id).cloned();
        if let Some(b) = budget {
            if let Err(why) = b.admit(cell, rate.as_ref(), &opts.cost.estimates) {
                // Stop launching; the running cells are within the budget.
                shared.stop.note(StopReason::Budget(why));
                not_launched = cells[i..].to_vec();
                break;
            }
        }
        let image = opts.images.get(&cell.id).cloned();
        tasks.spawn(run_cell(shared.clone(), cell.clone(), rate, image, permit));
    }
    Ok((tasks, not_launched))
}

/// The joined cells: the count of each recorded status, and the first error.
#[derive(Default)]
struct Tally {
    counts: BTreeMap<Status, usize>,
    first_error: Option<RunnerError>,
}

impl Tally {
    fn add(&mut self, joined: Result<Result<Option<Status>, RunnerError>, tokio::task::JoinError>) {
        match joined {
            Ok(Ok(Some(status))) => *self.counts.entry(status).or_insert(0) += 1,
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                self.first_error.get_or_insert(e);
            }
            Err(e) => {
                self.first_error.get_or_insert(RunnerError::Join(e.to_string()));
            }
        }
    }
}

/// The run's state at the end: complete when no cell is left unfinished, interrupted when
/// this invocation was stopped (cancel or budget), else still running.
fn set_final_state(run: &mut Run, stopped: bool) -> Result<(), RunnerError> {
    let all_done = run.unfinished_cells()?.is_empty();
    run.set_state(if all_done {
        RunState::Complete
    } else if stopped {
        RunState::Interrupted
    } else {
        RunState::Running
    })?;
    Ok(())
}

impl orch_protocol::ErrorClass for RunnerError {
    fn is_user_error(&self) -> bool {
        match self {
            RunnerError::Store(e) => e.is_user_error(),
            RunnerError::Backend(e) => e.is_user_error(),
            RunnerError::Join(_) => false,
        }
    }

    fn is_outage(&self) -> bool {
        matches!(self, RunnerError::Store(e) if e.is_outage())
    }
}
