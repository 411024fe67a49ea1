//! Throttling as Modal answers it, under a configurable rate ([`RateLimit`]), and the count
//! of calls by method, so tests can prove the limits are honoured.
//!
//! The answer is what Modal's official client reads as "wait and send again":
//! `RESOURCE_EXHAUSTED` whose `grpc-status-details-bin` (an `RPCStatus`) carries an
//! `RPCRetryPolicy` with `retry_after_secs`. `modal/_utils/grpc_utils.py`
//! (`_retry_transient_errors`, `get_server_retry_policy`, modal 1.6.4) sleeps
//! `max(retry_after_secs, 0.1)` and sends the same request again under the same
//! `x-idempotency-key` with `x-throttle-retry-attempt` counted up; the sandbox command
//! router's loop (`modal/sandbox/_task_command_router_client.py`) honours it only on
//! `RESOURCE_EXHAUSTED`, hence that code.
//!
//! Each limited method has a bucket of `burst` calls refilled at `per_s` (GCRA). A call
//! over the rate is refused with the time its own slot comes (the slot is kept for its
//! idempotency key), so a client that waits as told and sends the same call again is
//! admitted then; one that comes back earlier is refused again and counted
//! ([`Throttling::early`]). Calls without an idempotency key (streams) are not limited.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A rate limit on unary calls ([`super::Scenario::rate_limit`]).
#[derive(Debug, Clone)]
pub struct RateLimit {
    /// Calls per second, per method.
    pub per_s: f64,
    /// Calls admitted at once before the rate applies.
    pub burst: u32,
    /// The methods limited (`SandboxCreate`); empty: every unary call but `AuthTokenGet`.
    pub methods: Vec<String>,
}

/// What the limit did, for assertions ([`super::FakeModal::throttling`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Throttling {
    /// Calls answered "wait" (each told a retry-after), by method.
    pub told: BTreeMap<String, usize>,
    /// Calls sent again under a key told to wait, before its retry-after had passed
    /// (refused again).
    pub early: usize,
    /// Calls sent again after waiting as told (admitted).
    pub waited: usize,
}

#[derive(Default)]
pub(super) struct Limiter {
    /// Per method: the theoretical arrival time of the next call (GCRA).
    tat: HashMap<String, Instant>,
    /// (method, idempotency key) → when its slot comes.
    slots: HashMap<(String, String), Instant>,
    pub(super) stats: Throttling,
}

impl Limiter {
    /// `None`: admitted; `Some(wait)`: refused, to be sent again after `wait`.
    pub(super) fn check(&mut self, limit: &RateLimit, method: &str, key: Option<&str>) -> Option<Duration> {
        let limited = if limit.methods.is_empty() {
            method != "AuthTokenGet"
        } else {
            limit.methods.iter().any(|m| m == method)
        };
        let key = key.filter(|_| limited && limit.per_s > 0.0)?;
        let now = Instant::now();
        let slot_key = (method.to_string(), key.to_string());
        if let Some(at) = self.slots.get(&slot_key).copied() {
            if now >= at {
                self.slots.remove(&slot_key);
                self.stats.waited += 1;
                return None;
            }
            self.stats.early += 1;
            return Some(at - now);
        }
        let interval = Duration::from_secs_f64(1.0 / limit.per_s);
        let tolerance = interval * limit.burst.saturating_sub(1);
        let tat = self.tat.get(method).copied().unwrap_or(now).max(now);
        // Its slot: now if within the burst, else when the bucket has room again.
        let slot = tat.checked_sub(tolerance).unwrap_or(now).max(now);
        self.tat.insert(method.to_string(), tat + interval);
        if slot <= now {
            return None;
        }
        self.slots.insert(slot_key, slot);
        *self.stats.told.entry(method.to_string()).or_default() += 1;
        Some(slot - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_slots_kept_for_their_keys() {
        let limit = RateLimit {
            per_s: 10.0,
            burst: 2,
            methods: vec!["SandboxCreate".into()],
        };
        let mut l = Limiter::default();
        assert_eq!(l.check(&limit, "SandboxCreate", Some("a")), None);
        assert_eq!(l.check(&limit, "SandboxCreate", Some("b")), None);
        let wait_c = l.check(&limit, "SandboxCreate", Some("c")).unwrap();
        let wait_d = l.check(&limit, "SandboxCreate", Some("d")).unwrap();
        assert!(
            wait_d > wait_c && wait_c <= Duration::from_millis(100),
            "{wait_c:?} {wait_d:?}"
        );
        // Other methods, and calls without a key, are not limited.
        assert_eq!(l.check(&limit, "SandboxWait", Some("e")), None);
        assert_eq!(l.check(&limit, "SandboxCreate", None), None);
        // Early: refused again; after its wait: admitted on its own slot.
        assert!(l.check(&limit, "SandboxCreate", Some("c")).is_some());
        std::thread::sleep(wait_c);
        assert_eq!(l.check(&limit, "SandboxCreate", Some("c")), None);
        assert_eq!(l.stats.early, 1);
        assert_eq!(l.stats.waited, 1);
        assert_eq!(l.stats.told["SandboxCreate"], 2);
    }
}
