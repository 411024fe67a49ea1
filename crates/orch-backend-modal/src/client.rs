//! A connection to Modal's API: the generated `ModalClient` stub with the
//! headers Modal's Go client (`libmodal`'s `modal-go`) sends (client type
//! `CLIENT_TYPE_LIBMODAL_GO` = 9, client version `1.0.0`,
//! `x-modal-libmodal-version: modal-go/orch-VERSION`, the token, an auth
//! token from `AuthTokenGet`), and unary calls retried under one idempotency
//! key per logical call:
//!
//! - transient codes (`UNAVAILABLE`, `INTERNAL`, ...) with exponential
//!   backoff ([`Retry::attempts`], [`Retry::base`], [`Retry::max`]), as the Go
//!   client does;
//! - throttling, as the official Python client reads it: an error (typically
//!   `RESOURCE_EXHAUSTED`) whose details (`grpc-status-details-bin`, an
//!   `RPCStatus`) carry an `RPCRetryPolicy` is sent again, same request and
//!   same `x-idempotency-key`, after its `retry_after_secs` (at least 0.1 s),
//!   with `x-throttle-retry-attempt`/`x-throttle-retry-delay`; at most
//!   [`Retry::throttle_attempts`] times and while the total wait stays under
//!   [`Retry::throttle_wait`] (`MODAL_MAX_THROTTLE_WAIT` seconds, the
//!   official client's setting; `0` turns throttle retries off). Then the
//!   throttled status is the call's answer: [`retry_after`] tells it from a
//!   plain `RESOURCE_EXHAUSTED` (a GPU refusal);
//! - pacing ([`Pacer`]): calls of a paced method (`SandboxCreate`, whose rate
//!   Modal throttles) leave through one limiter shared by every clone of the
//!   client, at most [`Pacing::per_s`] a second after a burst of
//!   [`Pacing::burst`] (`ORCH_MODAL_CREATE_RATE=PER_S[:BURST]`, default 5:10;
//!   `0` turns it off), and a throttled answer to one holds them all until its
//!   retry-after, so a run of hundreds of cells does not meet the throttle
//!   once per cell.
//!
//! The official Python client (`modal/_utils/grpc_utils.py`,
//! `_retry_transient_errors`, modal 1.6.4) does the same per call: it retries
//! `DEADLINE_EXCEEDED`, `UNAVAILABLE`, `CANCELLED`, `INTERNAL` and `UNKNOWN`
//! 3 times after 0.1 s doubling to at most 1 s; any error whose details carry
//! an `RPCRetryPolicy` is sent again after `max(retry_after_secs, 0.1)` with
//! no cap on the count, while the time since the first attempt stays under
//! `MODAL_MAX_THROTTLE_WAIT` (no limit by default; orch's is 600 s).

use crate::config::Credentials;
use crate::proto::modal_client_client::ModalClientClient;
use crate::proto::AuthTokenGetRequest;
use crate::ModalError;
pub use orch_modal_proto::status::{retry_after, throttled, AnyDetail, RpcStatus};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

/// `CLIENT_TYPE_LIBMODAL_GO` in Modal's `ClientType`, what Modal's Go
/// client sends (`proto::ClientType`; checked by a test).
pub const CLIENT_TYPE: &str = "9";
/// The Python client version whose behaviour ours follows (Modal's Go
/// client sends the same).
pub const CLIENT_VERSION: &str = "1.0.0";
/// `x-modal-libmodal-version`: the Go client sends `modal-go/VERSION`; orch
/// follows it, naming itself in the version.
pub const LIBMODAL_VERSION: &str = concat!("modal-go/orch-", env!("CARGO_PKG_VERSION"));
const MAX_MESSAGE: usize = 100 * 1024 * 1024;
/// The least wait before a throttled call goes again (the official client's).
pub const MIN_THROTTLE_WAIT: Duration = Duration::from_millis(100);

/// A method's rate through the client ([`Pacer`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Calls a second once the burst is spent.
    pub per_s: f64,
    /// Calls that may leave at once.
    pub burst: u32,
}

impl Pacing {
    /// `SandboxCreate`'s default: 5 a second after 10 at once. Modal publishes no
    /// number for its sandbox-creation throttle; this keeps a 1,000-cell run's
    /// creations to a steady trickle while a few cells still start at once.
    pub const CREATE: Pacing = Pacing {
        per_s: 5.0,
        burst: 10,
    };

    /// `PER_S[:BURST]`; `0`: no pacing (`None`).
    pub fn parse(text: &str) -> Result<Option<Pacing>, String> {
        let bad =
            || format!("`{text}` is not a rate: write `PER_S` or `PER_S:BURST` (`5:10`), or `0` for none");
        let (rate, burst) = text.trim().split_once(':').unwrap_or((text.trim(), ""));
        let per_s: f64 = rate.trim().parse().map_err(|_| bad())?;
        if !per_s.is_finite() || per_s < 0.0 {
            return Err(bad());
        }
        if per_s == 0.0 {
            return Ok(None);
        }
        let burst = if burst.trim().is_empty() {
            1
        } else {
            burst.trim().parse::<u32>().map_err(|_| bad())?.max(1)
        };
        Ok(Some(Pacing { per_s, burst }))
    }
}

/// One method's calls, paced: a slot each (a token bucket of [`Pacing::burst`]
/// refilled at [`Pacing::per_s`], kept as the next call's theoretical time),
/// and none before a throttled answer's retry-after ([`Pacer::hold`]).
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    tolerance: Duration,
    next: std::sync::Mutex<tokio::time::Instant>,
}

impl Pacer {
    pub fn new(p: Pacing) -> Pacer {
        let interval = Duration::from_secs_f64(1.0 / p.per_s.max(1e-3));
        Pacer {
            interval,
            tolerance: interval * p.burst.saturating_sub(1),
            next: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// Take a slot and wait for it.
    pub async fn wait(&self) {
        let slot = self.take(tokio::time::Instant::now());
        tokio::time::sleep_until(slot).await;
    }

    /// The slot of a call asked for at `now` (taken).
    fn take(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        // A poisoned lock only means another caller panicked while holding a plain
        // `Instant`; its value is still whole.
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let tat = (*next).max(now);
        *next = tat + self.interval;
        tat.checked_sub(self.tolerance).unwrap_or(now).max(now)
    }

    /// No slot before `until` (a throttled answer's retry-after).
    pub fn hold(&self, until: tokio::time::Instant) {
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        *next = (*next).max(until + self.tolerance);
    }
}

/// Retry policy of unary calls.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all on transient codes (the first included).
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
    /// Throttled answers (with a retry-after) retried at most this many times...
    pub throttle_attempts: u32,
    /// ... and only while the call's total wait, the next one included, stays under this.
    pub throttle_wait: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            // The official client's `Retry()`: 3 retries, 0.1 s doubling to 1 s.
            attempts: 4,
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
            // No cap on the count (as the official client), only on the time.
            throttle_attempts: u32::MAX,
            throttle_wait: Duration::from_secs(600),
        }
    }
}

/// Codes worth another try (Modal's clients retry the same ones).
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled | Code::Internal | Code::Unknown
    )
}

#[derive(Clone)]
pub struct Modal {
    stub: ModalClientClient<Channel>,
    creds: Arc<Credentials>,
    auth: Arc<Mutex<Option<(String, Instant)>>>,
    pub retry: Retry,
    /// Paced methods, shared by every clone ([`Pacer`]).
    pacers: Arc<std::collections::HashMap<&'static str, Pacer>>,
}

impl std::fmt::Debug for Modal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Modal")
            .field("server", &self.creds.server_url)
            .finish()
    }
}

impl Modal {
    /// Connect (lazily: the first call opens the connection).
    pub fn connect(creds: Credentials) -> Result<Modal, ModalError> {
        let url = creds.server_url.clone();
        let bad = |why: String| ModalError::Unavailable {
            message: format!("`MODAL_SERVER_URL` `{url}` is not usable: {why}"),
            hint: "write it as `https://api.modal.com` or `http://127.0.0.1:PORT`".into(),
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(Duration::from_secs(20))
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        if url.starts_with("https://") {
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().with_native_roots())
                .map_err(|e| bad(e.to_string()))?;
        } else if !url.starts_with("http://") {
            return Err(bad("the scheme must be `https://` or `http://`".into()));
        }
        let stub = ModalClientClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let mut retry = Retry::default();
        // The official client's setting: the most seconds to wait out throttling.
        if let Some(s) = std::env::var("MODAL_MAX_THROTTLE_WAIT")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            retry.throttle_wait = Duration::from_secs(s);
        }
        let create = match std::env::var("ORCH_MODAL_CREATE_RATE") {
            Ok(v) => Pacing::parse(&v).map_err(|why| ModalError::Unavailable {
                message: format!("`ORCH_MODAL_CREATE_RATE`: {why}"),
                hint: "set `ORCH_MODAL_CREATE_RATE=5:10` (sandboxes a second, at once), or unset it".into(),
            })?,
            Err(_) => Some(Pacing::CREATE),
        };
        Ok(Modal {
            stub,
            creds: Arc::new(creds),
            auth: Arc::new(Mutex::new(None)),
            retry,
            pacers: Arc::new(
                create
                    .map(|p| ("SandboxCreate", Pacer::new(p)))
                    .into_iter()
                    .collect(),
            ),
        })
    }

    /// The pacing of `method`'s calls, if any.
    pub fn pacer(&self, method: &str) -> Option<&Pacer> {
        self.pacers.get(method)
    }

    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    pub fn environment(&self) -> &str {
        &self.creds.environment
    }

    /// A request with Modal's headers.
    fn request<T>(&self, msg: T, auth: Option<&str>) -> Request<T> {
        let mut req = Request::new(msg);
        let md = req.metadata_mut();
        md.insert("x-modal-client-type", MetadataValue::from_static(CLIENT_TYPE));
        md.insert(
            "x-modal-client-version",
            MetadataValue::from_static(CLIENT_VERSION),
        );
        md.insert(
            "x-modal-libmodal-version",
            MetadataValue::from_static(LIBMODAL_VERSION),
        );
        // Token ids and secrets are ASCII; one that is not cannot be sent and
        // the server answers `Unauthenticated`, which names the problem.
        if let Ok(v) = MetadataValue::try_from(self.creds.token_id.as_str()) {
            md.insert("x-modal-token-id", v);
        }
        if let Ok(v) = MetadataValue::try_from(self.creds.token_secret.as_str()) {
            md.insert("x-modal-token-secret", v);
        }
        if let Some(token) = auth {
            if let Ok(v) = MetadataValue::try_from(token) {
                md.insert("x-modal-auth-token", v);
            }
        }
        req
    }

    /// The short-lived auth token (`AuthTokenGet`), refreshed before it
    /// expires; a server without it (older or fake) gets none.
    async fn auth_token(&self) -> Option<String> {
        let mut slot = self.auth.lock().await;
        if let Some((token, until)) = slot.as_ref() {
            if Instant::now() < *until {
                return Some(token.clone());
            }
        }
        let mut stub = self.stub.clone();
        match stub
            .auth_token_get(self.request(AuthTokenGetRequest {}, None))
            .await
        {
            Ok(resp) => {
                let token = resp.into_inner().token;
                if token.is_empty() {
                    return None;
                }
                let ttl = jwt_ttl(&token).unwrap_or(Duration::from_secs(15 * 60));
                // Refresh five minutes early (or at half-life for short tokens).
                let early = Duration::from_secs(300).min(ttl / 2);
                *slot = Some((token.clone(), Instant::now() + ttl - early));
                Some(token)
            }
            Err(_) => None,
        }
    }

    /// A request ready to send, for streaming calls (no retry here: the
    /// caller resumes from the last entry id).
    pub async fn stream_request<T>(&self, msg: T) -> Request<T> {
        let token = self.auth_token().await;
        self.request(msg, token.as_deref())
    }

    pub fn stub(&self) -> ModalClientClient<Channel> {
        self.stub.clone()
    }

    /// One unary call, retried on transient codes with backoff and after a
    /// throttled answer's retry-after (see the module docs); every attempt
    /// carries the same `x-idempotency-key`.
    pub async fn call<T, R, F, Fut>(&self, what: &'static str, msg: T, f: F) -> Result<R, Status>
    where
        T: Clone,
        F: Fn(ModalClientClient<Channel>, Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let key = uuid::Uuid::new_v4().to_string();
        let started = Instant::now();
        let mut delay = self.retry.base;
        let mut attempt = 0u32;
        let mut throttled = 0u32;
        let pacer = self.pacers.get(what);
        // A call sent again after its retry-after goes at once: it was told its time.
        let mut told = false;
        loop {
            if let Some(p) = pacer.filter(|_| !told) {
                p.wait().await;
            }
            told = false;
            let token = self.auth_token().await;
            let mut req = self.request(msg.clone(), token.as_deref());
            let md = req.metadata_mut();
            if let Ok(v) = MetadataValue::try_from(key.as_str()) {
                md.insert("x-idempotency-key", v);
            }
            if let Ok(v) = MetadataValue::try_from(attempt.to_string()) {
                md.insert("x-retry-attempt", v);
            }
            let elapsed = format!("{:.3}", started.elapsed().as_secs_f64());
            if let Ok(v) = MetadataValue::try_from(elapsed.as_str()) {
                if attempt > 0 {
                    md.insert("x-retry-delay", v.clone());
                }
                if throttled > 0 {
                    md.insert("x-throttle-retry-delay", v);
                }
            }
            if let Ok(v) = MetadataValue::try_from(throttled.to_string()) {
                md.insert("x-throttle-retry-attempt", v);
            }
            match f(self.stub.clone(), req).await {
                Ok(resp) => return Ok(resp.into_inner()),
                Err(status) if retry_after(&status).is_some() => {
                    let wait = retry_after(&status).unwrap_or_default().max(MIN_THROTTLE_WAIT);
                    // As the official client: given up when the time since the first
                    // attempt would pass the limit after this wait.
                    if throttled >= self.retry.throttle_attempts
                        || started.elapsed() + wait >= self.retry.throttle_wait
                    {
                        return Err(status);
                    }
                    // Told to wait: so is every other call of a paced method.
                    let until = tokio::time::Instant::now() + wait;
                    if let Some(p) = pacer {
                        p.hold(until);
                    }
                    tokio::time::sleep_until(until).await;
                    throttled += 1;
                    told = true;
                }
                Err(status) if is_transient(status.code()) && attempt + 1 < self.retry.attempts => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.retry.max);
                    attempt += 1;
                }
                Err(status) => return Err(status),
            }
        }
    }
}

/// Seconds until a JWT's `exp`, read from its payload (no verification:
/// the server verifies; we only schedule the refresh).
fn jwt_ttl(token: &str) -> Option<Duration> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = v.get("exp")?.as_f64()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    (exp > now).then(|| Duration::from_secs_f64(exp - now))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_retry_policy_is_read_from_the_status_details() {
        let s = super::throttled(
            tonic::Code::ResourceExhausted,
            "slow down",
            Duration::from_millis(1500),
        );
        assert_eq!(super::retry_after(&s), Some(Duration::from_millis(1500)));
        // Through the wire form (the `grpc-status-details-bin` header) too.
        let mut h = tonic::codegen::http::HeaderMap::new();
        s.add_header(&mut h).unwrap();
        let back = tonic::Status::from_header_map(&h).unwrap();
        assert_eq!(back.code(), tonic::Code::ResourceExhausted);
        assert_eq!(super::retry_after(&back), Some(Duration::from_millis(1500)));
        // A plain refusal carries none.
        assert_eq!(
            super::retry_after(&tonic::Status::resource_exhausted("no GPU")),
            None
        );
    }

    #[test]
    fn pacing_is_read_and_paces_after_its_burst_and_holds_when_told() {
        use super::{Pacer, Pacing};
        assert_eq!(
            Pacing::parse("5:10"),
            Ok(Some(Pacing {
                per_s: 5.0,
                burst: 10
            }))
        );
        assert_eq!(Pacing::parse(" 2 "), Ok(Some(Pacing { per_s: 2.0, burst: 1 })));
        assert_eq!(Pacing::parse("0"), Ok(None));
        assert!(Pacing::parse("fast").unwrap_err().contains("`fast`"));
        assert!(Pacing::parse("-1").is_err());
        let p = Pacer::new(Pacing {
            per_s: 10.0,
            burst: 3,
        });
        let t0 = tokio::time::Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // The burst at once, then one per 100 ms.
        assert_eq!([p.take(t0), p.take(t0), p.take(t0)], [t0, t0, t0]);
        assert_eq!(p.take(t0), ms(100));
        assert_eq!(p.take(t0), ms(200));
        // Room again after a quiet second: a burst again.
        assert_eq!(p.take(ms(1500)), ms(1500));
        // Told to wait until 3 s: nothing leaves before then, and no burst after.
        p.hold(ms(3000));
        assert_eq!(p.take(ms(1600)), ms(3000));
        assert_eq!(p.take(ms(1600)), ms(3100));
    }

    #[test]
    fn the_client_type_is_the_go_clients() {
        assert_eq!(
            super::CLIENT_TYPE,
            (crate::proto::ClientType::LibmodalGo as i32).to_string()
        );
    }

    #[test]
    fn jwt_expiry_is_read_from_the_payload() {
        use base64::Engine;
        let exp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"exp\":{exp}}}"));
        let ttl = super::jwt_ttl(&format!("x.{payload}.y")).unwrap();
        assert!((3500..=3600).contains(&ttl.as_secs()));
        assert!(super::jwt_ttl("not-a-jwt").is_none());
    }
}
