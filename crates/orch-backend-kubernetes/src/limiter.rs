//! Client-side rate limiting of every request to the API server, as
//! client-go's token bucket does, and the server's own throttling obeyed.
//!
//! One bucket per `orch` process ([`shared`]), in front of every client
//! [`crate::connect`] makes: [`DEFAULT_QPS`] requests a second on average,
//! [`DEFAULT_BURST`] at once (`ORCH_KUBERNETES_QPS`, `ORCH_KUBERNETES_BURST`).
//! client-go's default (5 a second, 10 at once) is for controllers that
//! watch and rarely write; `kubectl` asks 50 a second (burst 300). With one
//! watch per run a cell costs a handful of requests (its Job created and
//! deleted, its log), so 50 a second starts about ten cells a second, and a
//! burst of 100 is what a shared API server's Priority and Fairness admits
//! for the `workload-low` level without queueing; a 1,000-cell run spreads
//! its Jobs over 20 s instead of sending them at once.
//!
//! A `429 Too Many Requests` (Priority and Fairness, its
//! `X-Kubernetes-PF-FlowSchema-UID`/`X-Kubernetes-PF-PriorityLevel-UID`
//! headers naming the level that refused it; or the max-in-flight filter)
//! stops every request of the process for its `Retry-After` (1 s when it
//! names none), empties the bucket and lowers its burst to one (told once
//! that the server is busy, orch sends evenly at its QPS, never in a burst
//! again), then the request is
//! sent again (a body that cannot be sent twice leaves the 429 to the
//! caller, which retries it: [`crate::backend::transient`]).
//!
//! kube-client's own retry layer, which sits below this one, is turned off
//! where the client is made: with it on, a refused request was sent again
//! past the bucket, together with every other one refused at that moment,
//! and this layer never saw the 429.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use kube::client::Body;

/// Requests a second, on average, unless [`QPS_ENV`] says otherwise.
pub const DEFAULT_QPS: f64 = 50.0;
/// Requests at once after a quiet while, unless [`BURST_ENV`] says otherwise.
pub const DEFAULT_BURST: f64 = 100.0;
pub const QPS_ENV: &str = "ORCH_KUBERNETES_QPS";
pub const BURST_ENV: &str = "ORCH_KUBERNETES_BURST";

/// How often one request is sent again after a 429 before the caller gets it.
const RETRIES_429: u32 = 8;

/// A token bucket with the server's pauses.
pub struct Limiter {
    qps: f64,
    state: Mutex<State>,
    /// Creators, one at a time ([`Limiter::turn`]).
    creators: tokio::sync::Mutex<()>,
}

struct State {
    burst: f64,
    tokens: f64,
    /// Tokens accrue from here (after a pause: its end).
    last: Instant,
    /// No request before this (the server's `Retry-After`).
    paused_until: Option<Instant>,
    throttled: u64,
    /// The priority level that refused last (`X-Kubernetes-PF-PriorityLevel-UID`).
    level: Option<String>,
}

/// What the limiter has seen: 429s received and the level that sent the last.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Throttling {
    pub refused: u64,
    pub priority_level: Option<String>,
}

impl Limiter {
    pub fn new(qps: f64, burst: f64) -> Limiter {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            DEFAULT_QPS
        };
        let burst = if burst.is_finite() && burst >= 1.0 {
            burst
        } else {
            qps.max(1.0)
        };
        Limiter {
            qps,
            state: Mutex::new(State {
                burst,
                tokens: burst,
                last: Instant::now(),
                paused_until: None,
                throttled: 0,
                level: None,
            }),
            creators: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A holder that panicked left plain numbers.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long until a token, or `None`: one is free (taken when `take`).
    fn wait(&self, take: bool) -> Option<Duration> {
        let mut st = self.lock();
        let now = Instant::now();
        if let Some(until) = st.paused_until {
            if now < until {
                return Some(until - now);
            }
            st.paused_until = None;
        }
        let accrued = now.saturating_duration_since(st.last).as_secs_f64() * self.qps;
        st.tokens = (st.tokens + accrued).min(st.burst);
        st.last = st.last.max(now);
        if st.tokens >= 1.0 {
            if take {
                st.tokens -= 1.0;
            }
            return None;
        }
        Some(Duration::from_secs_f64((1.0 - st.tokens) / self.qps))
    }

    /// Until a request may go (a token taken).
    pub async fn acquire(&self) {
        while let Some(d) = self.wait(true) {
            tokio::time::sleep(d).await;
        }
    }

    /// Until a request could go, without taking its token: a creator
    /// waits here (outside its call's timeout) before it sends.
    pub async fn ready(&self) {
        while let Some(d) = self.wait(false) {
            tokio::time::sleep(d).await;
        }
    }

    /// A creator's turn (Jobs, Services): creators go one at a time (in
    /// the order they came), each once a token is free, and hold the turn
    /// while their create is sent, so a thousand cells starting together
    /// create their Jobs at the bucket's pace, not in a burst that then waits
    /// inside every call's timeout.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let g = self.creators.lock().await;
        self.ready().await;
        g
    }

    /// The server said to wait `after`: no request until then, none saved
    /// up, and no burst after.
    pub fn told(&self, after: Duration, level: Option<String>) {
        let mut st = self.lock();
        let until = Instant::now() + after;
        st.paused_until = Some(st.paused_until.map_or(until, |u| u.max(until)));
        st.tokens = 0.0;
        st.last = st.last.max(until);
        st.burst = 1.0;
        st.throttled += 1;
        if level.is_some() {
            st.level = level;
        }
    }

    pub fn throttling(&self) -> Throttling {
        let st = self.lock();
        Throttling {
            refused: st.throttled,
            priority_level: st.level.clone(),
        }
    }
}

/// The process's one limiter, from [`QPS_ENV`] and [`BURST_ENV`] at first use.
pub fn shared() -> Arc<Limiter> {
    static ONE: OnceLock<Arc<Limiter>> = OnceLock::new();
    ONE.get_or_init(|| {
        let env = |k: &str, d: f64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0)
                .unwrap_or(d)
        };
        Arc::new(Limiter::new(
            env(QPS_ENV, DEFAULT_QPS),
            env(BURST_ENV, DEFAULT_BURST),
        ))
    })
    .clone()
}

/// `Retry-After` in whole seconds (an HTTP date or nothing: 1 s).
pub fn retry_after<B>(r: &Response<B>) -> Duration {
    let secs = r
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(1);
    Duration::from_secs(secs.clamp(1, 600))
}

/// The layer that puts a [`Limiter`] in front of a client's requests.
#[derive(Clone)]
pub struct RateLimitLayer(pub Arc<Limiter>);

impl<S> tower_layer::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;
    fn layer(&self, inner: S) -> RateLimited<S> {
        RateLimited {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            limiter: self.0.clone(),
        }
    }
}

/// A service whose requests wait for the [`Limiter`] and obey 429s.
pub struct RateLimited<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    limiter: Arc<Limiter>,
}

impl<S> Clone for RateLimited<S> {
    fn clone(&self) -> Self {
        RateLimited {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

/// A request again (its body only when it can be sent twice).
fn again(r: &Request<Body>) -> Option<Request<Body>> {
    let body = r.body().try_clone()?;
    let mut b = Request::builder()
        .method(r.method().clone())
        .uri(r.uri().clone())
        .version(r.version());
    if let Some(h) = b.headers_mut() {
        *h = r.headers().clone();
    }
    b.body(body).ok()
}

impl<S, B> tower_service::Service<Request<Body>> for RateLimited<S>
where
    S: tower_service::Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        // Readiness is waited for in `call`, with the limiter's turn.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let mut req = req;
            let mut n = 0;
            loop {
                let next = if n < RETRIES_429 { again(&req) } else { None };
                // The token is taken last, in the dispatch's turn: requests
                // leave at the bucket's pace, not bunched behind a slow one.
                let fut = {
                    let mut svc = inner.lock().await;
                    std::future::poll_fn(|cx| svc.poll_ready(cx)).await?;
                    limiter.acquire().await;
                    svc.call(req)
                };
                let resp = fut.await?;
                if resp.status() != StatusCode::TOO_MANY_REQUESTS {
                    return Ok(resp);
                }
                let level = resp
                    .headers()
                    .get("X-Kubernetes-PF-PriorityLevel-UID")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                limiter.told(retry_after(&resp), level);
                match next {
                    Some(r) => req = r,
                    None => return Ok(resp),
                }
                n += 1;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_spends_its_burst_then_paces_at_the_qps() {
        let l = Limiter::new(10.0, 5.0);
        for _ in 0..5 {
            assert_eq!(l.wait(true), None);
        }
        let w = l.wait(false).expect("empty after the burst");
        assert!(
            w > Duration::from_millis(50) && w <= Duration::from_millis(100),
            "{w:?}"
        );
    }

    #[test]
    fn a_429_pauses_every_request_empties_the_bucket_and_lowers_the_burst() {
        let l = Limiter::new(10.0, 100.0);
        l.told(Duration::from_secs(2), Some("workload-low".into()));
        let w = l.wait(false).expect("paused");
        assert!(
            w > Duration::from_millis(1900) && w <= Duration::from_secs(2),
            "{w:?}"
        );
        let st = l.lock();
        assert_eq!(st.tokens, 0.0);
        assert_eq!(st.burst, 1.0);
        drop(st);
        assert_eq!(
            l.throttling(),
            Throttling {
                refused: 1,
                priority_level: Some("workload-low".into())
            }
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_defaults_to_one() {
        let r = Response::builder().header("Retry-After", "3").body(()).unwrap();
        assert_eq!(retry_after(&r), Duration::from_secs(3));
        let r = Response::builder()
            .header("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT")
            .body(())
            .unwrap();
        assert_eq!(retry_after(&r), Duration::from_secs(1));
        let r = Response::builder().body(()).unwrap();
        assert_eq!(retry_after(&r), Duration::from_secs(1));
    }
}
