//! Requests counted by verb and resource, and a rate limit answered as the API server's
//! Priority and Fairness answers a client past its share: `429 Too Many Requests` with
//! `Retry-After` (whole seconds), the `X-Kubernetes-PF-*` headers and a `Status` whose
//! `details.retryAfterSeconds` says the same.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::store::lock;

/// A token bucket: `qps` requests a second on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: f64,
}

/// One request refused with `429`.
#[derive(Debug, Clone)]
pub struct Throttled {
    /// When it was refused.
    pub at: Instant,
    /// The `Retry-After` it was told.
    pub retry_after: Duration,
    /// `"METHOD /path?query"`.
    pub request: String,
}

struct Bucket {
    limit: RateLimit,
    tokens: f64,
    last: Instant,
}

pub(crate) struct Limits {
    counts: Mutex<BTreeMap<(String, String), u64>>,
    /// Requests in each second since `started`.
    per_second: Mutex<Vec<u64>>,
    started: Instant,
    bucket: Mutex<Option<Bucket>>,
    throttled: Mutex<Vec<Throttled>>,
}

impl Limits {
    pub fn new(limit: Option<RateLimit>) -> Limits {
        Limits {
            counts: Mutex::default(),
            per_second: Mutex::default(),
            started: Instant::now(),
            bucket: Mutex::new(limit.map(|limit| Bucket {
                limit,
                tokens: limit.burst,
                last: Instant::now(),
            })),
            throttled: Mutex::default(),
        }
    }

    /// Count a request (`verb`: get, list, watch, create, ...; `resource`: `pods`,
    /// `pods/log`, `jobs`, ...).
    pub fn count(&self, verb: &str, resource: &str) {
        *lock(&self.counts)
            .entry((verb.to_string(), resource.to_string()))
            .or_default() += 1;
        let second = self.started.elapsed().as_secs() as usize;
        let mut per = lock(&self.per_second);
        if per.len() <= second {
            per.resize(second + 1, 0);
        }
        per[second] += 1;
    }

    /// Admit a request, or the seconds it is told to wait.
    pub fn admit(&self, request: &str) -> Result<(), u64> {
        let mut b = lock(&self.bucket);
        let Some(b) = b.as_mut() else {
            return Ok(());
        };
        let now = Instant::now();
        let rate = b.limit.qps.max(1e-3);
        b.tokens = (b.tokens + now.duration_since(b.last).as_secs_f64() * rate).min(b.limit.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        let secs = ((1.0 - b.tokens) / rate).ceil().max(1.0) as u64;
        lock(&self.throttled).push(Throttled {
            at: now,
            retry_after: Duration::from_secs(secs),
            request: request.to_string(),
        });
        Err(secs)
    }

    pub fn counts(&self) -> BTreeMap<(String, String), u64> {
        lock(&self.counts).clone()
    }

    pub fn per_second(&self) -> Vec<u64> {
        lock(&self.per_second).clone()
    }

    pub fn throttled(&self) -> Vec<Throttled> {
        lock(&self.throttled).clone()
    }
}

/// The `Status` of a refused request.
pub(crate) fn too_many(secs: u64) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Too many requests, please try again later.",
        "reason": "TooManyRequests", "details": {"retryAfterSeconds": secs}, "code": 429,
    })
}
