//! What a workload sees of the agent: phase bookkeeping, events, stop requests.

use orch_protocol::{Event, Phase};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// Where events go (the agent's stdout in production, a vector in tests).
pub type EventSink = Box<dyn FnMut(&Event) + Send>;

pub struct Ctx {
    started: Instant,
    sink: EventSink,
    stop: Arc<AtomicBool>,
    timings: BTreeMap<Phase, f64>,
    current: Option<(Phase, Instant)>,
    /// Told of every phase change (the GPU telemetry sampler).
    phase_hook: Option<PhaseHook>,
}

/// A phase change as a [`PhaseHook`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseChange {
    /// A new phase began now.
    Enter(Phase),
    /// The open phase was renamed: its time so far belongs to this phase.
    Relabel(Phase),
}

/// Called whenever the phase changes.
pub type PhaseHook = Box<dyn FnMut(PhaseChange) + Send>;

impl Ctx {
    pub fn new(sink: EventSink, stop: Arc<AtomicBool>) -> Self {
        Ctx {
            started: Instant::now(),
            sink,
            stop,
            timings: BTreeMap::new(),
            current: None,
            phase_hook: None,
        }
    }

    /// Have `hook` told of every phase change from now on (and of the phase
    /// open now).
    pub fn set_phase_hook(&mut self, mut hook: PhaseHook) {
        if let Some(p) = self.phase() {
            hook(PhaseChange::Enter(p));
        }
        self.phase_hook = Some(hook);
    }

    /// Stop telling the hook of phase changes.
    pub fn clear_phase_hook(&mut self) {
        self.phase_hook = None;
    }

    fn notify(&mut self, change: PhaseChange) {
        if let Some(h) = self.phase_hook.as_mut() {
            h(change);
        }
    }

    /// Send one event.
    pub fn emit(&mut self, event: Event) {
        (self.sink)(&event);
    }

    /// Close the current phase (adding its wall-clock time) and open `phase`.
    pub fn enter(&mut self, phase: Phase) {
        self.close_phase();
        self.current = Some((phase, Instant::now()));
        self.notify(PhaseChange::Enter(phase));
        let t = self.started.elapsed().as_secs_f64();
        self.emit(Event::Phase { phase, t });
    }

    /// Give the open phase another name without closing it (its time so far
    /// counts for the new name).
    pub fn relabel(&mut self, phase: Phase) {
        if let Some((p, _)) = self.current.as_mut() {
            *p = phase;
            self.notify(PhaseChange::Relabel(phase));
        }
    }

    /// The phase now open, if any.
    pub fn phase(&self) -> Option<Phase> {
        self.current.map(|(p, _)| p)
    }

    fn close_phase(&mut self) {
        if let Some((p, since)) = self.current.take() {
            *self.timings.entry(p).or_insert(0.0) += since.elapsed().as_secs_f64();
        }
    }

    /// Seconds spent in `phase` so far (the open phase included).
    pub fn phase_seconds(&self, phase: Phase) -> f64 {
        let open = match self.current {
            Some((p, since)) if p == phase => since.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        self.timings.get(&phase).copied().unwrap_or(0.0) + open
    }

    /// Close the open phase and return the seconds spent per phase.
    pub fn take_timings(&mut self) -> BTreeMap<Phase, f64> {
        self.close_phase();
        std::mem::take(&mut self.timings)
    }

    pub fn progress(&mut self, phase: Phase, done: u64, total: u64) {
        self.emit(Event::Progress { phase, done, total });
    }

    pub fn message(&mut self, text: impl Into<String>) {
        self.emit(Event::Message { text: text.into() });
    }

    /// True once the host asked the agent to stop (SIGTERM/SIGINT).
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Seconds since the agent started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
