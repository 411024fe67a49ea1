//! Warnings gathered while a store is read: a damaged or foreign cell
//! record, a run that cannot be read. Each costs only its own cell or run;
//! the command prints them (`warning: ...` lines) and goes on.

use std::sync::{Arc, Mutex};

/// Shared by a [`crate::Store`] and every [`crate::Run`] opened from it.
#[derive(Clone, Default)]
pub struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    /// Keep one warning (once: the same text twice is said once).
    pub fn push(&self, text: String) {
        if let Ok(mut w) = self.0.lock() {
            if !w.contains(&text) {
                w.push(text);
            }
        }
    }

    /// The warnings so far, in the order they came; the list is emptied.
    pub fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default()
    }
}
