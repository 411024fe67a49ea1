//! The one internal stop channel handed to every cell's backend: it fires on the caller's
//! cancel (Ctrl-C) or on the budget; the first reason is kept and decides how stopped cells
//! are recorded. Apart from it, a halt (a store or host failure) only stops
//! new cells from starting.

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
    /// Why no new cell may start (a store or host failure), if one is said;
    /// running cells go on and are recorded if they can be.
    halt: Mutex<Option<String>>,
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
            halt: Mutex::new(None),
        });
        (stop, rx)
    }

    /// No new cell starts: the store (or this host) failed; the first
    /// reason is kept.
    pub(crate) fn halt(&self, why: String) {
        if let Ok(mut h) = self.halt.lock() {
            h.get_or_insert(why);
        }
    }

    /// Why no new cell starts, if [`Stop::halt`] was called.
    pub(crate) fn halted(&self) -> Option<String> {
        self.halt.lock().ok().and_then(|h| h.clone())
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
