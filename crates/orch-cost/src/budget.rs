//! The accounting behind `orch run --max-cost USD`.
//!
//! - *accrued*: what finished cells cost (the run's earlier invocations
//!   included);
//! - *spent*: accrued plus what running cells have cost so far
//!   (elapsed × rate);
//! - *committed*: accrued plus, for each running cell, the larger of what it
//!   has cost so far and its estimate (`rate × max(elapsed, estimate)`):
//!   what the running cells will cost at least if they run as estimated;
//! - *look-ahead*: one tick of every running cell (`Σ rate × tick`), what
//!   they spend before the next check.
//!
//! A cell is launched only if `committed + its estimate + look-ahead` stays
//! within the cap. Every tick, when `committed + look-ahead` passes the cap,
//! every running cell is stopped. So spent never passes the cap while cells
//! run unstopped; what a stop adds is the stopped cells' rate times the time
//! they take to stop and be recorded (plus any lateness of the tick).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The budget of a run as its record keeps it (`orch-record`'s).
pub use orch_record::BudgetRecord;

#[derive(Debug, Clone)]
struct Running {
    /// `None` while the cell is admitted but not yet started (waiting for
    /// GPUs): it is committed at its estimate and has spent nothing.
    started: Option<Instant>,
    usd_per_s: f64,
    estimate_s: f64,
}

/// Accounting of one invocation of a run under a cap.
#[derive(Debug, Clone)]
pub struct BudgetTracker {
    max_usd: f64,
    accrued_usd: f64,
    tick: Duration,
    running: BTreeMap<String, Running>,
}

/// Float slack: a committed cost equal to the cap is within it.
const EPS: f64 = 1e-9;

impl BudgetTracker {
    /// `prior_usd`: what the run's already recorded cells cost.
    pub fn new(max_usd: f64, prior_usd: f64, tick: Duration) -> BudgetTracker {
        BudgetTracker {
            max_usd,
            accrued_usd: prior_usd,
            tick,
            running: BTreeMap::new(),
        }
    }

    pub fn max_usd(&self) -> f64 {
        self.max_usd
    }

    pub fn tick(&self) -> Duration {
        self.tick
    }

    pub fn accrued_usd(&self) -> f64 {
        self.accrued_usd
    }

    /// Accrued plus what running cells have cost so far.
    pub fn spent_usd(&self, now: Instant) -> f64 {
        self.accrued_usd
            + self
                .running
                .values()
                .map(|r| elapsed(r, now) * r.usd_per_s)
                .sum::<f64>()
    }

    /// Accrued plus each running cell's cost at the larger of its elapsed
    /// time and its estimate.
    pub fn committed_usd(&self, now: Instant) -> f64 {
        self.accrued_usd
            + self
                .running
                .values()
                .map(|r| elapsed(r, now).max(r.estimate_s) * r.usd_per_s)
                .sum::<f64>()
    }

    fn look_ahead(&self, extra_usd_per_s: f64) -> f64 {
        (self.running.values().map(|r| r.usd_per_s).sum::<f64>() + extra_usd_per_s) * self.tick.as_secs_f64()
    }

    /// May a cell of this rate and estimate start now? `Err` says why not.
    pub fn admit(&self, now: Instant, usd_per_s: f64, estimate_s: f64) -> Result<(), String> {
        let committed = self.committed_usd(now);
        let need = committed + usd_per_s * estimate_s + self.look_ahead(usd_per_s);
        if need > self.max_usd + EPS {
            return Err(format!(
                "the next cell (estimated ${:.4}) would bring the committed cost to ${need:.4}, over the cap of ${:.4} (committed ${committed:.4})",
                usd_per_s * estimate_s,
                self.max_usd
            ));
        }
        Ok(())
    }

    /// A cell was admitted: it is committed at its estimate from now on.
    pub fn reserve(&mut self, cell: &str, usd_per_s: f64, estimate_s: f64) {
        self.running.insert(
            cell.to_string(),
            Running {
                started: None,
                usd_per_s,
                estimate_s,
            },
        );
    }

    /// An admitted cell started: its billing begins.
    pub fn begin(&mut self, cell: &str, now: Instant) {
        if let Some(r) = self.running.get_mut(cell) {
            r.started = Some(now);
        }
    }

    /// A cell was admitted and started at `now`.
    pub fn start(&mut self, cell: &str, now: Instant, usd_per_s: f64, estimate_s: f64) {
        self.reserve(cell, usd_per_s, estimate_s);
        self.begin(cell, now);
    }

    /// A cell was recorded, costing `usd`.
    pub fn finish(&mut self, cell: &str, usd: f64) {
        self.running.remove(cell);
        self.accrued_usd += usd;
    }

    /// Must the running cells stop? `Some(reason)` when committed cost plus
    /// one tick of every running cell passes the cap.
    pub fn check(&self, now: Instant) -> Option<String> {
        if self.running.is_empty() {
            return None;
        }
        let committed = self.committed_usd(now);
        let ahead = self.look_ahead(0.0);
        (committed + ahead > self.max_usd + EPS).then(|| {
            format!(
                "the running cells would pass the cap of ${:.4}: committed ${committed:.4} (spent ${:.4}) + ${ahead:.4} until the next check, {} running",
                self.max_usd,
                self.spent_usd(now),
                self.running.len()
            )
        })
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }
}

fn elapsed(r: &Running, now: Instant) -> f64 {
    r.started
        .map(|s| now.saturating_duration_since(s).as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_within_the_cap_and_stops_before_passing_it() {
        let t0 = Instant::now();
        let tick = Duration::from_millis(250);
        let mut b = BudgetTracker::new(1.0, 0.25, tick);
        // $0.10/s for 5 s = $0.50, + 0.025 look-ahead + 0.25 prior: fits.
        assert!(b.admit(t0, 0.1, 5.0).is_ok());
        // For 8 s it would not.
        assert!(b.admit(t0, 0.1, 8.0).unwrap_err().contains("over the cap"));
        b.start("a", t0, 0.1, 5.0);
        assert!((b.committed_usd(t0) - 0.75).abs() < 1e-12);
        assert!(b.check(t0 + Duration::from_secs(5)).is_none());
        // Running past its estimate: committed grows with elapsed time.
        // Stop once 0.25 + 0.1 t + 0.025 > 1, i.e. t > 7.25 s.
        assert!(b.check(t0 + Duration::from_secs_f64(7.2)).is_none());
        let why = b.check(t0 + Duration::from_secs_f64(7.3)).unwrap();
        assert!(why.contains("cap of $1.0000"), "{why}");
        // Spent at the stop is still within the cap.
        assert!(b.spent_usd(t0 + Duration::from_secs_f64(7.3)) <= 1.0);
        b.finish("a", 0.73);
        assert!((b.accrued_usd() - 0.98).abs() < 1e-12);
        assert!(b.check(t0 + Duration::from_secs(100)).is_none());
        assert!(b.admit(t0, 0.0, 1e9).is_ok(), "a free cell always fits");

        // A reserved cell is committed at its estimate and has spent nothing.
        let mut b = BudgetTracker::new(1.0, 0.0, tick);
        b.reserve("w", 0.1, 4.0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.spent_usd(later), 0.0);
        assert!((b.committed_usd(later) - 0.4).abs() < 1e-12);
        b.begin("w", later);
        assert!((b.spent_usd(later + Duration::from_secs(2)) - 0.2).abs() < 1e-12);
    }
}
