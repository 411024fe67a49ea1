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

use chrono::Utc;
use orch_backend::{Backend, CellEvent, CellLaunch};
use orch_cost::{BudgetRecord, BudgetTracker, Rate};
use orch_manifest::CellPlan;
use orch_protocol::{CellResult, Status};
use orch_store::{CellRecord, Run, RunState, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};

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
}

/// Prices of the cells and the cap of an invocation.
#[derive(Debug, Clone, Default)]
pub struct CostOptions {
    /// Price per second of each cell, by cell id; a cell without one is
    /// recorded without a cost.
    pub rates: BTreeMap<String, Rate>,
    /// Expected seconds of each cell, by cell id (for the budget; a cell
    /// without one is committed at its timeout).
    pub estimates: BTreeMap<String, f64>,
    /// The cap (`--max-cost`), in US dollars, for the whole run.
    pub max_usd: Option<f64>,
    /// What the run's records already cost (earlier invocations).
    pub prior_usd: f64,
    /// The estimate of the cells this invocation runs (kept in the record).
    pub estimate_usd: f64,
    /// Time between two budget checks (default [`BUDGET_TICK`]).
    pub tick: Option<Duration>,
}

/// Default time between two budget checks of the running cells.
pub const BUDGET_TICK: Duration = Duration::from_millis(250);

/// Failure kind of a cell stopped (or not launched) by the budget.
pub const BUDGET_FAILURE: &str = "budget";

/// Why the cells of an invocation are being stopped; the first reason wins.
#[derive(Debug, Clone, PartialEq)]
enum StopReason {
    Interrupted,
    Budget(String),
}

struct Stop {
    tx: watch::Sender<bool>,
    reason: Mutex<Option<StopReason>>,
}

impl Stop {
    fn trigger(&self, why: StopReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
        self.tx.send_replace(true);
    }

    fn reason(&self) -> Option<StopReason> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }
}

/// For a comparison, name the cause of each failed variant from its own logs
/// (the rounds' server and client logs, its install log) into
/// `info.variants.<name>.diagnosis`; the first one is the cell's diagnosis.
pub fn diagnose_variants(record: &mut CellRecord, dir: &std::path::Path, rules: &orch_diagnose::Rules) {
    let Some(serde_json::Value::Object(variants)) = record.info.get_mut("variants") else {
        return;
    };
    let mut first = None;
    for (name, v) in variants.iter_mut() {
        // Variant names come from the agent: one that is not a plain name
        // (`../..`) never names a folder to read.
        if v["status"] != "failed" || orch_store::check_name("variant name", name).is_err() {
            continue;
        }
        let vdir = dir.join("variants").join(name);
        let mut logs = Vec::new();
        let mut stack = vec![vdir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() && p.file_name().map(|n| n != "src").unwrap_or(true) {
                    stack.push(p);
                } else if p.extension().map(|x| x == "log").unwrap_or(false) {
                    logs.push(p);
                }
            }
        }
        logs.sort();
        let mut text: String = logs
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect::<Vec<_>>()
            .join("\n");
        if let Some(f) = v["failure"].as_str() {
            text.push('\n');
            text.push_str(f);
        }
        let d = orch_diagnose::diagnose(&text, rules);
        v["diagnosis"] = serde_json::to_value(&d).unwrap_or_default();
        first.get_or_insert(d);
    }
    if first.is_some() {
        record.diagnosis = first;
    }
}

/// Diagnosis kinds that mean "the work does not fit the device's memory".
const OOM_KINDS: &[&str] = &["cuda_oom"];

/// A command cell that failed because it ran out of GPU memory (a PyTorch
/// `OutOfMemoryError`, a CUDA allocation failure: the diagnosis named it) is
/// `oom`, like a builtin workload that does not fit: a size that does not fit
/// is a result of a sweep, not a broken cell. The failure is kept; its kind
/// becomes `oom`.
pub fn oom_from_diagnosis(record: &mut CellRecord) {
    let is_oom = record
        .diagnosis
        .as_ref()
        .is_some_and(|d| OOM_KINDS.contains(&d.kind.as_str()));
    // Only a program that ended on its own (a command's exit code or signal):
    // a server that dies at start keeps `server_exited`, its cause named.
    let ended = record
        .failure
        .as_ref()
        .is_some_and(|f| matches!(f.kind.as_str(), "exit_code" | "signal"));
    if record.status == Status::Failed && is_oom && ended {
        record.status = Status::Oom;
        if let Some(f) = record.failure.as_mut() {
            f.kind = "oom".into();
        }
    }
}

/// Name the cause of a cell that did not succeed, from its logs (server or
/// command output, the client's, and the agent's own).
pub fn diagnose_cell(
    record: &CellRecord,
    dir: &std::path::Path,
    rules: &orch_diagnose::Rules,
) -> Option<orch_diagnose::Diagnosis> {
    if matches!(record.status, Status::Succeeded | Status::Cancelled) {
        return None;
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let stdout = [read("stdout.log"), read("client.stdout.log")].join("\n");
    let failure = record.failure.as_ref();
    // A builtin workload's `oom` (its memory preflight, an allocation that
    // failed) is in no log: its message is the evidence.
    let message = failure
        .filter(|f| f.kind == "oom")
        .map(|f| f.message.clone())
        .unwrap_or_default();
    let stderr = [
        read("stderr.log"),
        read("client.stderr.log"),
        read("agent.log"),
        message,
    ]
    .join("\n");
    let exit = orch_diagnose::ExitInfo {
        code: failure.and_then(|f| f.exit_code),
        signal: failure.and_then(|f| f.signal),
        timed_out: record.status == Status::Timeout,
    };
    Some(orch_diagnose::diagnose_output(
        &stdout,
        &stderr,
        Some(&exit),
        rules,
    ))
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

/// Run every unfinished cell of `run` on `backend`.
pub async fn execute(
    run: &mut Run,
    backend: Arc<dyn Backend>,
    opts: RunnerOptions,
    progress: mpsc::UnboundedSender<Progress>,
    cancel: watch::Receiver<bool>,
) -> Result<Outcome, RunnerError> {
    backend.preflight().await?;
    let todo: Vec<String> = run.unfinished_cells()?;
    let skipped = run.plan.cells.len() - todo.len();
    let _ = progress.send(Progress::Planned {
        total: todo.len(),
        skipped,
    });
    let cells: Vec<CellPlan> = run
        .plan
        .cells
        .iter()
        .filter(|c| todo.contains(&c.id))
        .cloned()
        .collect();

    let semaphore = Arc::new(Semaphore::new(opts.concurrency.max(1)));
    let pool = Arc::new(GpuPool::new(opts.gpu_devices.clone()));
    let rules = Arc::new(opts.diagnose_rules.clone().unwrap_or_default());
    // Every secret value (and its encodings) is masked in what the runner
    // passes on (events shown live) and records (diagnosis included), on
    // top of the agent's and the backend's own masking.
    let masker = orch_backend::host_masker(&opts.secrets);
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

    // One stop channel for every cell: the caller's cancel or the budget.
    // The sender lives until every cell is joined (a dropped sender reads as
    // a cancel to the backends).
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop = Arc::new(Stop {
        tx: stop_tx,
        reason: Mutex::new(None),
    });
    let relay = {
        let stop = stop.clone();
        let mut cancel = cancel.clone();
        tokio::spawn(async move {
            if cancel.wait_for(|c| *c).await.is_ok() {
                stop.trigger(StopReason::Interrupted);
            }
        })
    };
    let cost = Arc::new(opts.cost.clone());
    let tick = opts.cost.tick.unwrap_or(BUDGET_TICK);
    let budget = opts
        .cost
        .max_usd
        .map(|max| Arc::new(Mutex::new(BudgetTracker::new(max, opts.cost.prior_usd, tick))));
    if let Some(max_usd) = opts.cost.max_usd {
        run.set_budget(BudgetRecord {
            max_usd,
            estimate_usd: opts.cost.estimate_usd,
            stopped: false,
            reason: None,
            accrued_usd: opts.cost.prior_usd,
            tick_s: tick.as_secs_f64(),
        })?;
    }
    let monitor = budget.as_ref().map(|b| {
        let (b, stop) = (b.clone(), stop.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let why = b.lock().ok().and_then(|b| b.check(Instant::now()));
                if let Some(why) = why {
                    stop.trigger(StopReason::Budget(why));
                    break;
                }
            }
        })
    });

    // Cell tasks only use the run's folder and plan, which do not change.
    let run_shared = Arc::new(run.clone());
    let mut tasks = tokio::task::JoinSet::new();
    let mut not_launched: Vec<CellPlan> = Vec::new();
    let mut stop_wait = stop_rx.clone();
    for (i, cell) in cells.iter().enumerate() {
        let permit = tokio::select! {
            p = semaphore.clone().acquire_owned() => p.map_err(|e| RunnerError::Join(e.to_string()))?,
            _ = stop_wait.wait_for(|c| *c) => { not_launched = cells[i..].to_vec(); break; }
        };
        if *stop_rx.borrow() || *cancel.borrow() {
            not_launched = cells[i..].to_vec();
            break;
        }
        let rate = cost.rates.get(&cell.id).cloned();
        if let Some(b) = &budget {
            let usd_per_s = rate.as_ref().map(|r| r.usd_per_s).unwrap_or(0.0);
            let estimate_s = cost
                .estimates
                .get(&cell.id)
                .copied()
                .unwrap_or(cell.task.measure.timeout_s);
            let admitted = match b.lock() {
                Ok(mut b) => b
                    .admit(Instant::now(), usd_per_s, estimate_s)
                    .map(|()| b.reserve(&cell.id, usd_per_s, estimate_s)),
                Err(_) => Err("the budget's accounting failed".to_string()),
            };
            if let Err(why) = admitted {
                // Stop launching; the running cells are within the budget.
                if let Ok(mut r) = stop.reason.lock() {
                    r.get_or_insert(StopReason::Budget(why));
                }
                not_launched = cells[i..].to_vec();
                break;
            }
        }
        let backend = backend.clone();
        let ev_tx = ev_tx.clone();
        let cell_stop = stop_rx.clone();
        let progress = progress.clone();
        let secrets = opts.secrets.clone();
        let weights_dir = opts.weights_dir.clone();
        let image = opts.images.get(&cell.id).cloned();
        let pool = pool.clone();
        let rules = rules.clone();
        let cell = cell.clone();
        let handle = run_shared.clone();
        let budget = budget.clone();
        let stop = stop.clone();
        let masker = masker.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let settle = |usd: f64| {
                if let Some(b) = &budget {
                    if let Ok(mut b) = b.lock() {
                        b.finish(&cell.id, usd);
                    }
                }
            };
            // Held until the cell's record is written.
            let devices = pool.acquire(cell.gpu.count as usize).await;
            let (dir, attempt) = match handle.prepare_cell(&cell.id) {
                Ok(x) => x,
                // Another `orch` (a resume on another machine) runs this
                // cell now, or recorded it since: it is theirs to record.
                Err(StoreError::Claimed { .. } | StoreError::RecordedElsewhere { .. }) => {
                    settle(0.0);
                    return Ok(None);
                }
                Err(e) => {
                    settle(0.0);
                    return Err(e.into());
                }
            };
            let dir_for_diagnosis = dir.clone();
            let _ = progress.send(Progress::CellStarted {
                cell_id: cell.id.clone(),
                attempt,
            });
            let started = Utc::now();
            if let Some(b) = &budget {
                if let Ok(mut b) = b.lock() {
                    b.begin(&cell.id, Instant::now());
                }
            }
            let launch = CellLaunch {
                task: cell.task.clone(),
                cell_dir: dir,
                secrets,
                weights_dir,
                image,
                devices: devices.as_ref().map(|d| d.ids.clone()).unwrap_or_default(),
            };
            let result = match &devices {
                Err(total) => CellResult::failed(
                    &cell.id,
                    Status::Failed,
                    "not_enough_gpus",
                    format!(
                        "the cell asks for {} GPUs and this host has {total}: it does not run on fewer or shared ones",
                        cell.gpu.count
                    ),
                ),
                Ok(_) => match backend.run_cell(launch, ev_tx, cell_stop).await {
                    Ok(r) => r,
                    Err(e) => CellResult::failed(&cell.id, Status::Failed, "backend", e.to_string()),
                },
            };
            let mut record = CellRecord::from_result(&cell, result, started, Utc::now(), attempt);
            if record.status == Status::Cancelled {
                if let Some(StopReason::Budget(why)) = stop.reason() {
                    mark_budget(&mut record, format!("stopped by the budget: {why}"));
                }
            }
            record.diagnosis = diagnose_cell(&record, &dir_for_diagnosis, &rules);
            diagnose_variants(&mut record, &dir_for_diagnosis, &rules);
            oom_from_diagnosis(&mut record);
            record.cost = rate
                .as_ref()
                .map(|r| orch_cost::cell_cost(r, record.status, record.duration_s, &record.timings));
            settle(record.cost.as_ref().map(|c| c.usd).unwrap_or(0.0));
            masker.mask_in_place(&mut record);
            match handle.finish_cell(&record) {
                Ok(()) => {}
                // Another `orch` recorded the cell first; this attempt's
                // record is kept as an earlier attempt (its cost was spent).
                Err(StoreError::RecordedElsewhere { .. }) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let _ = progress.send(Progress::CellFinished(Box::new(record.clone())));
            Ok::<Option<Status>, RunnerError>(Some(record.status))
        });
    }
    drop(ev_tx);
    let mut counts = BTreeMap::new();
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(Some(status))) => *counts.entry(status).or_insert(0) += 1,
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(RunnerError::Join(e.to_string()));
            }
        }
    }
    if let Some(m) = monitor {
        m.abort();
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
    // Cells the budget kept from starting are recorded `cancelled` (kind
    // `budget`), so the record says why they did not run; `--resume` runs them.
    if let Some(why) = &budget_stopped {
        for cell in &not_launched {
            let (_, attempt) = run.prepare_cell(&cell.id)?;
            let now = Utc::now();
            let mut record = CellRecord::from_result(
                cell,
                CellResult::new(&cell.id, Status::Cancelled),
                now,
                now,
                attempt,
            );
            mark_budget(&mut record, format!("not started: {why}"));
            record.cost = cost
                .rates
                .get(&cell.id)
                .map(|r| orch_cost::cell_cost(r, record.status, 0.0, &record.timings));
            run.finish_cell(&record)?;
            let _ = progress.send(Progress::CellFinished(Box::new(record)));
        }
    }
    if let (Some(b), Some(max_usd)) = (&budget, opts.cost.max_usd) {
        let accrued_usd = b.lock().map(|b| b.accrued_usd()).unwrap_or(f64::NAN);
        run.set_budget(BudgetRecord {
            max_usd,
            estimate_usd: opts.cost.estimate_usd,
            stopped: budget_stopped.is_some(),
            reason: budget_stopped.clone(),
            accrued_usd,
            tick_s: tick.as_secs_f64(),
        })?;
    }
    let cancelled = *cancel.borrow() || reason == Some(StopReason::Interrupted);
    let all_done = run.unfinished_cells()?.is_empty();
    run.set_state(if all_done {
        RunState::Complete
    } else if cancelled || budget_stopped.is_some() {
        RunState::Interrupted
    } else {
        RunState::Running
    })?;
    Ok(Outcome {
        counts,
        not_started: not_launched.len(),
        cancelled,
        budget_stopped,
    })
}

/// Record a cell as stopped by the budget (its exit code or signal kept).
fn mark_budget(record: &mut CellRecord, message: String) {
    let (exit_code, signal) = record
        .failure
        .as_ref()
        .map(|f| (f.exit_code, f.signal))
        .unwrap_or((None, None));
    record.status = Status::Cancelled;
    record.failure = Some(orch_protocol::Failure {
        kind: BUDGET_FAILURE.into(),
        message,
        exit_code,
        signal,
    });
}

/// Who assigns a cell's GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GpuDevices {
    /// The platform (a cluster's scheduler, Modal): nothing to hand out here.
    #[default]
    Platform,
    /// This host's, not known (no `nvidia-smi`): GPU cells take turns.
    Unknown,
    /// This host's (`0`, `1`, ...).
    Known(Vec<String>),
}

/// GPUs handed out to running cells, so that no two share one. Where the
/// host's GPUs are not known, GPU cells run one at a time: the backend gives
/// each all it sees, and two such cells would share them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PoolMode {
    Platform,
    Unknown,
    Known,
}

struct GpuPool {
    free: tokio::sync::Mutex<Vec<String>>,
    changed: tokio::sync::Notify,
    mode: PoolMode,
    total: usize,
    /// Held by the one GPU cell running on unknown GPUs.
    unknown: Arc<tokio::sync::Mutex<()>>,
}

/// GPUs held by one cell; returned to the pool on drop.
struct Lease {
    ids: Vec<String>,
    pool: Option<Arc<GpuPool>>,
    _all: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let ids = std::mem::take(&mut self.ids);
            // Drop cannot await: return the GPUs from a task.
            tokio::spawn(async move {
                pool.free.lock().await.extend(ids);
                pool.changed.notify_waiters();
            });
        }
    }
}

impl GpuPool {
    fn new(devices: GpuDevices) -> GpuPool {
        let (mode, devices) = match devices {
            GpuDevices::Platform => (PoolMode::Platform, vec![]),
            GpuDevices::Unknown => (PoolMode::Unknown, vec![]),
            GpuDevices::Known(d) => (PoolMode::Known, d),
        };
        GpuPool {
            mode,
            total: devices.len(),
            free: tokio::sync::Mutex::new(devices),
            changed: tokio::sync::Notify::new(),
            unknown: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Wait until `n` GPUs are free and take them. `Err` (the host's count)
    /// when the host has fewer than `n`: such a cell never runs on fewer GPUs
    /// or on shared ones. With unknown devices nothing is assigned and GPU
    /// cells take turns; the platform's are not ours to count.
    async fn acquire(self: &Arc<Self>, n: usize) -> Result<Lease, usize> {
        if n == 0 || self.mode == PoolMode::Platform {
            return Ok(Lease {
                ids: vec![],
                pool: None,
                _all: None,
            });
        }
        if self.mode == PoolMode::Unknown {
            return Ok(Lease {
                ids: vec![],
                pool: None,
                _all: Some(self.unknown.clone().lock_owned().await),
            });
        }
        if n > self.total {
            return Err(self.total);
        }
        loop {
            let notified = self.changed.notified();
            {
                let mut free = self.free.lock().await;
                if free.len() >= n {
                    let ids: Vec<String> = free.drain(..n).collect();
                    return Ok(Lease {
                        ids,
                        pool: Some(self.clone()),
                        _all: None,
                    });
                }
            }
            notified.await;
        }
    }
}
