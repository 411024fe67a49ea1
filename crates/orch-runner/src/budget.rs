//! The cost side of an invocation: the cells' prices ([`CostOptions`]) and the cap
//! (`--max-cost`): each cell admitted only if the committed cost stays within it, a task
//! that stops the running cells when it would be passed, the run's budget record, and the
//! cells recorded as stopped (or not started) by it.

use crate::stop::{Stop, StopReason};
use crate::Progress;
use chrono::Utc;
use orch_cost::{BudgetRecord, BudgetTracker, Rate};
use orch_manifest::CellPlan;
use orch_protocol::{CellResult, Status};
use orch_record::FailureKind;
use orch_store::{CellRecord, Run, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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
pub const BUDGET_FAILURE: FailureKind = FailureKind::Budget;

/// The budget of an invocation with a cap: the tracker the cells report to, and the task
/// that checks it every tick.
pub(crate) struct Budget {
    pub(crate) tracker: Arc<Mutex<BudgetTracker>>,
    monitor: tokio::task::JoinHandle<()>,
    tick: Duration,
}

impl Budget {
    /// Under a cap: the budget recorded in the run, and checked every `tick` (the running
    /// cells are stopped when it would be passed). `None` without a cap.
    pub(crate) fn start(
        run: &mut Run,
        cost: &CostOptions,
        tick: Duration,
        stop: &Arc<Stop>,
    ) -> Result<Option<Budget>, StoreError> {
        let Some(max_usd) = cost.max_usd else {
            return Ok(None);
        };
        let tracker = Arc::new(Mutex::new(BudgetTracker::new(max_usd, cost.prior_usd, tick)));
        run.set_budget(BudgetRecord {
            max_usd,
            estimate_usd: cost.estimate_usd,
            stopped: false,
            reason: None,
            accrued_usd: cost.prior_usd,
            tick_s: tick.as_secs_f64(),
        })?;
        let monitor = {
            let (b, stop) = (tracker.clone(), stop.clone());
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
        };
        Ok(Some(Budget {
            tracker,
            monitor,
            tick,
        }))
    }

    /// Admit a cell: the committed cost, its estimate (its timeout without one) and one
    /// tick must fit; its cost is then reserved. `Err`: why it does not fit.
    pub(crate) fn admit(
        &self,
        cell: &CellPlan,
        rate: Option<&Rate>,
        estimates: &BTreeMap<String, f64>,
    ) -> Result<(), String> {
        let usd_per_s = rate.map(|r| r.usd_per_s).unwrap_or(0.0);
        let estimate_s = estimates
            .get(&cell.id)
            .copied()
            .unwrap_or(cell.task.measure.timeout_s);
        match self.tracker.lock() {
            Ok(mut b) => b
                .admit(Instant::now(), usd_per_s, estimate_s)
                .map(|()| b.reserve(&cell.id, usd_per_s, estimate_s)),
            Err(_) => Err("the budget's accounting failed".to_string()),
        }
    }

    /// Stop checking (every cell has ended).
    pub(crate) fn stop_checking(&self) {
        self.monitor.abort();
    }

    /// The run's budget record at the end: what was accrued, and whether (and why) the
    /// budget stopped the run.
    pub(crate) fn record(
        &self,
        run: &mut Run,
        cost: &CostOptions,
        stopped: Option<String>,
    ) -> Result<(), StoreError> {
        let Some(max_usd) = cost.max_usd else {
            return Ok(());
        };
        let accrued_usd = self.tracker.lock().map(|b| b.accrued_usd()).unwrap_or(f64::NAN);
        run.set_budget(BudgetRecord {
            max_usd,
            estimate_usd: cost.estimate_usd,
            stopped: stopped.is_some(),
            reason: stopped,
            accrued_usd,
            tick_s: self.tick.as_secs_f64(),
        })
    }
}

/// Cells the budget kept from starting are recorded `cancelled` (kind `budget`), so the
/// record says why they did not run; `--resume` runs them.
pub(crate) fn record_not_started(
    run: &mut Run,
    cells: &[CellPlan],
    why: &str,
    rates: &BTreeMap<String, Rate>,
    progress: &mpsc::UnboundedSender<Progress>,
) -> Result<(), StoreError> {
    for cell in cells {
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
        record.cost = rates
            .get(&cell.id)
            .map(|r| orch_cost::cell_cost(r, record.status, 0.0, &record.timings));
        run.finish_cell(&record)?;
        let _ = progress.send(Progress::CellFinished(Box::new(record)));
    }
    Ok(())
}

/// Record a cell as stopped by the budget (its exit code or signal kept).
pub(crate) fn mark_budget(record: &mut CellRecord, message: String) {
    let (exit_code, signal) = record
        .failure
        .as_ref()
        .map(|f| (f.exit_code, f.signal))
        .unwrap_or((None, None));
    record.status = Status::Cancelled;
    record.failure = Some(orch_protocol::Failure {
        kind: BUDGET_FAILURE,
        message,
        exit_code,
        signal,
    });
}
