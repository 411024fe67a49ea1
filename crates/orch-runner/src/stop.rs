//! The one internal stop channel handed to every cell's backend: it fires on the caller's
//! cancel (Ctrl-C) or on the budget; the first reason is kept and decides how stopped cells
//! are recorded.

use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// Why the cells of an invocation are being stopped; the first reason wins.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StopReason {
    Interrupted,
    Budget(String),
}

/// The stop channel and why it fired.
pub(crate) struct Stop {
    tx: watch::Sender<bool>,
    reason: Mutex<Option<StopReason>>,
}

impl Stop {
    /// Fire: every cell's backend is told to stop; the first reason is kept.
    pub(crate) fn trigger(&self, why: StopReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
        self.tx.send_replace(true);
    }

    /// The first reason given, if any.
    pub(crate) fn reason(&self) -> Option<StopReason> {
        self.reason.lock().ok().and_then(|r| r.clone())
    }

    /// A stop channel not fired yet, and a receiver of it.
    pub(crate) fn new() -> (Arc<Stop>, watch::Receiver<bool>) {
        let (tx, rx) = watch::channel(false);
        let stop = Arc::new(Stop {
            tx,
            reason: Mutex::new(None),
        });
        (stop, rx)
    }

    /// Keep a reason without stopping the running cells (the budget refused a
    /// launch: the running cells are within it).
    pub(crate) fn note(&self, why: StopReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(why);
        }
    }

    /// Fire on the caller's cancel: a task that relays it.
    pub(crate) fn relay(self: &Arc<Self>, mut cancel: watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        let stop = self.clone();
        tokio::spawn(async move {
            if cancel.wait_for(|c| *c).await.is_ok() {
                stop.trigger(StopReason::Interrupted);
            }
        })
    }
}
