//! Calls to the API server through its absences.
//!
//! Every call is made again, with backoff (0.25 s doubling to 2 s), after an
//! error that the API server's absence explains: connection refused or
//! reset, a stream cut, no answer within 15 s, a 5xx or 429. A watch of the
//! pod, a log follow, the Job's deletion and the run's cleanup all go on
//! through such a gap, and a running cell keeps its state (the log is read
//! again from its start; frames already home are dropped by number). orch
//! gives up only after the **API budget**: 180 s without one answer in a row
//! ([`super::DEFAULT_API_BUDGET`], `ORCH_KUBERNETES_API_BUDGET=SECONDS` sets it).
//! The cell then fails `api_unreachable` (never `pod_lost`: the pod may run
//! on), its Job's deletion is tried for one more budget, and what is left
//! stops by itself (every Job has `activeDeadlineSeconds`) or goes with
//! `orch down`, which finds it by the run's label. An error that is an
//! answer (403, 404, 422) is not retried: a 403 names the verb and resource
//! the Role lacks (`deploy/kubernetes/orch-role.yaml` is the minimal Role).
//! ConfigMaps and Secrets are the run's, shared by its cells: an owner
//! reference to one cell's Job would delete them under the others, so they
//! go by label (`cleanup`, `orch down`).

use super::{API_BUDGET_ENV, API_TIMEOUT, DEFAULT_API_BUDGET};
use crate::KubeError;
use std::time::{Duration, Instant};

/// An error that the API server's absence explains (a connection refused
/// or reset, a stream cut, a 5xx, throttling): the call is made again.
pub fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429,
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::ReadEvents(_)
        | kube::Error::SerdeError(_)
        | kube::Error::FromUtf8(_) => true,
        _ => false,
    }
}

/// The wait before attempt `n + 1` of a call.
pub(super) fn backoff(n: u32) -> Duration {
    Duration::from_millis(250u64.saturating_mul(1 << n.min(4))).min(Duration::from_secs(2))
}

/// Why a call gave up.
#[derive(Debug)]
pub(super) enum CallError {
    /// The API server answered with an error.
    Api(kube::Error),
    /// No answer for the whole budget: the last error.
    Unreachable(String),
}

impl CallError {
    pub(super) fn into_kube(self, call: &str, budget: Duration) -> KubeError {
        match self {
            CallError::Api(e) => KubeError::api(call)(e),
            CallError::Unreachable(last) => KubeError::Io {
                action: format!("`{call}`"),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, unreachable_message(budget, &last)),
            },
        }
    }
}

/// The words of an API server that stayed away past the budget.
pub(super) fn unreachable_message(budget: Duration, last: &str) -> String {
    format!(
        "the Kubernetes API server could not be reached for {}s (the API budget, `{API_BUDGET_ENV}`): {last}",
        budget.as_secs()
    )
}

/// The API budget from the environment, else [`DEFAULT_API_BUDGET`].
pub(super) fn api_budget_from_env() -> Duration {
    std::env::var(API_BUDGET_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_API_BUDGET)
}

/// Make one API call, again with [`backoff`] after a [`transient`] error or
/// no answer within [`API_TIMEOUT`], until `budget` passed without an answer.
pub(super) async fn call<T, F, Fut>(budget: Duration, mut f: F) -> Result<T, CallError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let started = Instant::now();
    let mut n = 0;
    loop {
        let last = match tokio::time::timeout(API_TIMEOUT, f()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if !transient(&e) => return Err(CallError::Api(e)),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {}s", API_TIMEOUT.as_secs()),
        };
        if started.elapsed() >= budget {
            return Err(CallError::Unreachable(last));
        }
        tokio::time::sleep(backoff(n).min(budget.saturating_sub(started.elapsed()))).await;
        n += 1;
    }
}

/// A run of failed calls: since when, and the last error.
#[derive(Debug, Default)]
pub(super) struct Down(pub(super) Option<(Instant, String)>);

impl Down {
    /// One more failure; `true` once the budget is spent.
    pub(super) fn failed(&mut self, error: String, budget: Duration) -> bool {
        let since = self.0.as_ref().map_or_else(Instant::now, |d| d.0);
        self.0 = Some((since, error));
        since.elapsed() >= budget
    }
    pub(super) fn ok(&mut self) {
        self.0 = None;
    }
    pub(super) fn attempts_wait(&self, n: u32) -> Duration {
        if self.0.is_some() {
            backoff(n)
        } else {
            Duration::from_millis(300)
        }
    }
    pub(super) fn last(&self) -> String {
        self.0.as_ref().map(|d| d.1.clone()).unwrap_or_default()
    }
}
