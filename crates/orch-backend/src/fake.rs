//! A recording fake backend for tests of everything above the backends: it
//! runs no agent, records every launch, and returns scripted results.

use crate::{Backend, BackendError, Cancel, CellEvent, CellLaunch, Events, Ran};
use async_trait::async_trait;
use orch_protocol::{CellResult, Event, FailureKind, Phase, Status};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
pub struct FakeBackend {
    /// Status to report per cell id (default `succeeded`).
    pub outcomes: BTreeMap<String, Status>,
    /// How long each cell "runs".
    pub delay: Duration,
    launched: Mutex<Vec<String>>,
    running: Mutex<(usize, usize)>, // (now, most at once)
}

impl FakeBackend {
    pub fn new(delay: Duration) -> FakeBackend {
        FakeBackend {
            delay,
            ..Default::default()
        }
    }

    pub fn with_outcome(mut self, cell: &str, status: Status) -> FakeBackend {
        self.outcomes.insert(cell.to_string(), status);
        self
    }

    /// Cell ids in launch order.
    pub fn launched(&self) -> Vec<String> {
        self.launched.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Cells running now (launched, not yet returned).
    pub fn running_now(&self) -> usize {
        self.running.lock().map(|r| r.0).unwrap_or(0)
    }

    /// Most cells that ran at the same time.
    pub fn max_parallel_seen(&self) -> usize {
        self.running.lock().map(|r| r.1).unwrap_or(0)
    }
}

#[async_trait]
impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }

    /// Cells run here, where the task's paths are.
    fn ships_files(&self) -> bool {
        false
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn run_cell(&self, launch: CellLaunch, events: Events, mut cancel: Cancel) -> Ran {
        let id = launch.task.cell_id.clone();
        if let Ok(mut l) = self.launched.lock() {
            l.push(id.clone());
        }
        if let Ok(mut r) = self.running.lock() {
            r.0 += 1;
            r.1 = r.1.max(r.0);
        }
        let _ = events.send(CellEvent {
            cell_id: id.clone(),
            event: Event::Phase {
                phase: Phase::Measure,
                t: 0.0,
            },
        });
        let cancelled = tokio::select! {
            _ = tokio::time::sleep(self.delay) => false,
            _ = cancel.wait_for(|c| *c) => true,
        };
        if let Ok(mut r) = self.running.lock() {
            r.0 -= 1;
        }
        let status = if cancelled {
            Status::Cancelled
        } else {
            self.outcomes.get(&id).copied().unwrap_or(Status::Succeeded)
        };
        let mut r = if status == Status::Succeeded {
            CellResult::new(&id, status)
        } else {
            CellResult::failed(
                &id,
                status,
                FailureKind::of_status(status),
                format!("scripted {status}"),
            )
        };
        r.metrics.insert("fake".into(), 1.0);
        Ok(r)
    }

    async fn cleanup(&self, _run_id: &str) -> Result<(), BackendError> {
        Ok(())
    }
}
