//! A blocking face over the async S3 client: the few object operations the
//! store needs, run on the client's own runtime so that the store's
//! synchronous interface can be called from anywhere (inside `orch`'s
//! runtime, a plain thread, a test).
//!
//! Every request has timeouts and is retried with backoff by the SDK's own
//! machinery ([`Settings`]: `TimeoutConfig` for connect, read, attempt and
//! the whole operation; `RetryConfig` standard or adaptive, with a retry
//! token bucket that never runs dry): refused or dropped connections,
//! timeouts, 5xx and `503 SlowDown` are retried until the operation's budget
//! (60 s unless `ORCH_S3_TIMEOUT_S` says otherwise) is spent. A body cut
//! short after its headers (which the SDK does not retry for streamed
//! reads) is read again here within the same budget. A refused credential
//! or a missing bucket is not retried: the error is the user's to fix.

use aws_sdk_s3::error::ProvideErrorMetadata;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use futures::StreamExt;
use orch_store::StoreError;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::outage::Outage;

/// Objects this size and larger go up in parts.
pub const MULTIPART_THRESHOLD: u64 = 16 << 20;
/// Size of one part of a multipart upload (S3's minimum is 5 MiB).
pub const PART_SIZE: u64 = 8 << 20;
/// How long a request may try once the outage budget is spent: a probe
/// that ends the outage if the store answers.
pub const PROBE: Duration = Duration::from_secs(1);
/// Requests in flight at once for batch reads.
pub const PARALLEL: usize = 32;

/// Seconds one operation is tried, all its attempts and backoff together.
pub const TIMEOUT_ENV: &str = "ORCH_S3_TIMEOUT_S";
/// Seconds one attempt may take (connect, send, the reply's headers).
pub const ATTEMPT_TIMEOUT_ENV: &str = "ORCH_S3_ATTEMPT_TIMEOUT_S";
/// Seconds to open a connection.
pub const CONNECT_TIMEOUT_ENV: &str = "ORCH_S3_CONNECT_TIMEOUT_S";
/// Attempts per operation at most (the time budget usually ends them first).
pub const MAX_ATTEMPTS_ENV: &str = "ORCH_S3_MAX_ATTEMPTS";
/// `standard` (the default) or `adaptive` (a client-side rate limiter too).
pub const RETRY_MODE_ENV: &str = "ORCH_S3_RETRY_MODE";

/// Timeouts and retries of every request. The defaults ride out an outage
/// of tens of seconds and give up after [`Settings::budget`].
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// One operation with all its attempts and the backoff between them.
    pub budget: Duration,
    /// One attempt: connect, send, the reply's headers (and, for reads,
    /// each body read here).
    pub attempt_timeout: Duration,
    pub connect_timeout: Duration,
    pub max_attempts: u32,
    /// The SDK's adaptive retry mode (a client-side rate limiter that
    /// slows down on throttling) instead of the standard one.
    pub adaptive: bool,
    /// Backoff between attempts: exponential from `initial_backoff`, at
    /// most `max_backoff`, with full jitter (the SDK's standard backoff).
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    /// The endpoint, instead of the AWS chain's (`AWS_ENDPOINT_URL`): tests.
    pub endpoint: Option<String>,
    /// An access key id and secret, instead of the AWS chain's: tests that
    /// must not touch the process environment.
    pub credentials: Option<(String, String)>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            budget: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            max_attempts: 40,
            adaptive: false,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(4),
            endpoint: None,
            credentials: None,
        }
    }
}

impl Settings {
    /// The defaults, overridden by `ORCH_S3_TIMEOUT_S`,
    /// `ORCH_S3_ATTEMPT_TIMEOUT_S`, `ORCH_S3_CONNECT_TIMEOUT_S`,
    /// `ORCH_S3_MAX_ATTEMPTS` and `ORCH_S3_RETRY_MODE`. A bad value is a
    /// user error naming the variable.
    pub fn from_env() -> Result<Settings, StoreError> {
        Settings::from_vars(|k| std::env::var(k).ok())
    }

    fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Settings, StoreError> {
        let mut s = Settings::default();
        let bad = |k: &str, v: &str, what: &str| StoreError::Remote {
            message: format!("`{k}={v}`: {what}"),
            hint: format!("unset `{k}` for the default, or give {what}"),
            user: true,
        };
        let secs = |k: &str, into: &mut Duration| -> Result<(), StoreError> {
            if let Some(v) = var(k).filter(|v| !v.trim().is_empty()) {
                match v.trim().parse::<f64>() {
                    Ok(x) if x.is_finite() && x > 0.0 && x <= 86_400.0 => *into = Duration::from_secs_f64(x),
                    _ => return Err(bad(k, &v, "a number of seconds above 0 and at most 86400")),
                }
            }
            Ok(())
        };
        secs(TIMEOUT_ENV, &mut s.budget)?;
        secs(ATTEMPT_TIMEOUT_ENV, &mut s.attempt_timeout)?;
        secs(CONNECT_TIMEOUT_ENV, &mut s.connect_timeout)?;
        if let Some(v) = var(MAX_ATTEMPTS_ENV).filter(|v| !v.trim().is_empty()) {
            s.max_attempts = match v.trim().parse::<u32>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => return Err(bad(MAX_ATTEMPTS_ENV, &v, "a whole number from 1 to 1000")),
            };
        }
        if let Some(v) = var(RETRY_MODE_ENV).filter(|v| !v.trim().is_empty()) {
            s.adaptive = match v.trim() {
                "standard" => false,
                "adaptive" => true,
                _ => return Err(bad(RETRY_MODE_ENV, &v, "`standard` or `adaptive`")),
            };
        }
        Ok(s.clamped())
    }

    /// No attempt or connect longer than the whole budget.
    pub fn clamped(mut self) -> Settings {
        self.attempt_timeout = self.attempt_timeout.min(self.budget);
        self.connect_timeout = self.connect_timeout.min(self.attempt_timeout);
        self
    }

    fn timeout_config(&self) -> aws_sdk_s3::config::timeout::TimeoutConfig {
        aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.connect_timeout)
            .read_timeout(self.attempt_timeout)
            .operation_attempt_timeout(self.attempt_timeout)
            .operation_timeout(self.budget)
            .build()
    }

    fn retry_config(&self) -> aws_sdk_s3::config::retry::RetryConfig {
        use aws_sdk_s3::config::retry::RetryConfig;
        let c = if self.adaptive {
            RetryConfig::adaptive()
        } else {
            RetryConfig::standard()
        };
        c.with_max_attempts(self.max_attempts)
            .with_initial_backoff(self.initial_backoff)
            .with_max_backoff(self.max_backoff)
    }

    /// The settings of a segment upload while a cell runs: short (a failed
    /// segment goes up with the next flush), so that stopping the follower
    /// at the cell's end never waits out a whole budget.
    fn segment(&self) -> Settings {
        Settings {
            budget: self.budget.min(Duration::from_secs(10)),
            attempt_timeout: self.attempt_timeout.min(Duration::from_secs(5)),
            max_attempts: self.max_attempts.min(3),
            ..self.clone()
        }
        .clamped()
    }
}

/// How a conditional create ended.
#[derive(Debug, PartialEq)]
pub enum Created {
    /// The object is ours (written now, or by an earlier try of this writer
    /// whose reply was lost).
    Ours,
    /// Another writer created it first; its bytes.
    Theirs(Vec<u8>),
}

/// One listed object.
#[derive(Debug, Clone)]
pub struct Listed {
    pub key: String,
    pub size: u64,
}

/// Where the credentials come from, for error messages (never their value).
pub fn credential_source() -> String {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if set("AWS_ACCESS_KEY_ID") {
        "the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`)".into()
    } else if let Ok(p) = std::env::var("AWS_PROFILE") {
        format!("the profile `{p}` (`AWS_PROFILE`, ~/.aws/config and ~/.aws/credentials, SSO)")
    } else if set("AWS_WEB_IDENTITY_TOKEN_FILE") {
        "web identity (`AWS_WEB_IDENTITY_TOKEN_FILE`)".into()
    } else {
        "the default chain (the `default` profile in ~/.aws, SSO, container or instance metadata)".into()
    }
}

/// Remove every credential value of this environment from a text.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for k in ["AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"] {
        if let Ok(v) = std::env::var(k) {
            if v.len() >= 4 {
                out = out.replace(&v, "***");
            }
        }
    }
    out
}

/// The S3 client from the standard AWS configuration chain (environment,
/// profiles, SSO, `AWS_ENDPOINT_URL`, region), and the endpoint's name. A
/// custom endpoint gets path-style addressing and checksums only where
/// required (S3-compatible servers).
async fn load(settings: Settings, tally: crate::outage::Tally) -> (Client, String) {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    // A region is required to sign; S3-compatible servers accept any.
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
        loader = loader
            .region(aws_config::meta::region::RegionProviderChain::default_provider().or_else("us-east-1"));
    }
    // Keys in the environment come first in the default chain anyway; taken
    // directly, the chain's other providers (web identity builds an STS
    // client, which reads every root certificate) are not built at all.
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if set("AWS_ACCESS_KEY_ID") && set("AWS_SECRET_ACCESS_KEY") {
        loader = loader.credentials_provider(
            aws_config::environment::credentials::EnvironmentVariableCredentialsProvider::new(),
        );
    }
    if let Some((id, secret)) = &settings.credentials {
        loader = loader.credentials_provider(aws_sdk_s3::config::Credentials::new(
            id.clone(),
            secret.clone(),
            None,
            None,
            "orch-settings",
        ));
    }
    if let Some(e) = &settings.endpoint {
        loader = loader.endpoint_url(e);
    }
    let shared = loader.load().await;
    let endpoint = shared.endpoint_url().map(String::from);
    let mut conf = aws_sdk_s3::config::Builder::from(&shared)
        .timeout_config(settings.timeout_config())
        .retry_config(settings.retry_config())
        .interceptor(tally)
        // The SDK's retry quota (a token bucket shared by the process,
        // drained 5 to 10 tokens a retry) would stop every retry after a
        // few dozen failures: an outage of seconds fails many requests at
        // once. The time budget bounds the retries instead.
        .retry_partition(
            aws_sdk_s3::config::retry::RetryPartition::custom("orch-s3")
                .token_bucket(aws_sdk_s3::config::retry::TokenBucket::unlimited())
                .build(),
        );
    if endpoint.as_deref().is_some_and(|e| e.starts_with("http://")) {
        // Plain HTTP (a server on the local network): no TLS, so no reading
        // of the system's root certificates (milliseconds on every command).
        // Credential providers keep the default client for their HTTPS calls.
        if let Some(client) = plain_http_client() {
            conf = conf.http_client(client);
        }
    }
    if endpoint.is_some() {
        conf = conf
            .force_path_style(true)
            .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired);
    }
    (
        Client::from_conf(conf.build()),
        endpoint.unwrap_or_else(|| "AWS S3".into()),
    )
}

/// The SDK's own HTTP client with an empty trust store: it loads no root
/// certificate, and could complete no TLS handshake (it only speaks to
/// `http://` endpoints).
fn plain_http_client() -> Option<aws_sdk_s3::config::SharedHttpClient> {
    use aws_smithy_http_client::tls;
    let ctx = tls::TlsContext::builder()
        .with_trust_store(tls::TrustStore::empty().with_native_roots(false))
        .build()
        .ok()?;
    Some(
        aws_smithy_http_client::Builder::new()
            .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
            .tls_context(ctx)
            .build_https(),
    )
}

/// Wait for a reply from the client's runtime without blocking a runtime
/// of the caller's (`orch`'s own) in a way it forbids.
fn wait<T>(rx: std::sync::mpsc::Receiver<T>) -> Option<T> {
    let recv = move || rx.recv().ok();
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(recv)
        }
        _ => recv(),
    }
}

/// `ORCH_S3_TRACE=1`: every request (or batch) on stderr with its time,
/// to see where a slow store spends it. Keys only, never a credential.
struct Trace {
    what: Option<(&'static str, String, std::time::Instant)>,
}

impl Trace {
    fn new(op: &'static str, key: &str) -> Trace {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let on = *ON.get_or_init(|| std::env::var("ORCH_S3_TRACE").is_ok_and(|v| v == "1"));
        Trace {
            what: on.then(|| (op, key.to_string(), std::time::Instant::now())),
        }
    }
}

impl Drop for Trace {
    fn drop(&mut self) {
        if let Some((op, key, t)) = &self.what {
            eprintln!("s3 {op} {key} {:.1} ms", t.elapsed().as_secs_f64() * 1000.0);
        }
    }
}

/// Keys asked for per listing page. S3 answers at most 1,000 whatever is
/// asked (a client follows the pages anyway); a server that keeps objects
/// as files (s3s-fs) walks the folder once per page, so a long listing
/// (`.orch/runs/` of 10,000 runs) is one walk instead of ten. A server
/// that refuses the number (400) is asked for its default from then on.
pub const LIST_PAGE: i32 = 100_000;

pub struct Objects {
    /// The outage this process is in, shared by every request (`outage.rs`).
    pub outage: Arc<Outage>,
    /// Whether listings still ask for [`LIST_PAGE`] keys a page.
    long_pages: std::sync::atomic::AtomicBool,
    rt: Option<tokio::runtime::Runtime>,
    client: Client,
    pub bucket: String,
    pub endpoint: String,
    pub settings: Settings,
}

impl Drop for Objects {
    fn drop(&mut self) {
        // A runtime may not be dropped where blocking is forbidden (inside
        // `orch`'s own runtime): let its threads go in the background.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// The code given here to a request that timed out (no server code has it).
const TIMED_OUT: &str = "orch:timeout";

/// Whether an error is the object store being away (unreachable, silent,
/// failing) rather than refusing us (credentials, bucket): a finished
/// cell's record is then kept on local disk and the run goes on.
pub fn is_outage(e: &StoreError) -> bool {
    match e {
        StoreError::Unreachable { .. } => true,
        StoreError::Remote { user, .. } => !user,
        _ => false,
    }
}

/// What failed, classified: the user's to fix (credentials, bucket,
/// endpoint), the store away (unreachable, silent, failing: named by what
/// it answered in the outage, `answered`, never by the SDK's text), or
/// another failure.
#[allow(clippy::too_many_arguments)]
fn remote(
    bucket: &str,
    endpoint: &str,
    op: &str,
    key: &str,
    code: Option<&str>,
    status: Option<u16>,
    message: String,
    answered: Option<String>,
    budget: Duration,
) -> StoreError {
    let away = |what: String| unreachable_error(bucket, endpoint, op, key, Some(what), budget);
    let message = redact(&message);
    let cred = || credential_source();
    match (code, status) {
        (Some("NoSuchBucket"), _) => StoreError::Remote {
            message: format!("the bucket `{bucket}` does not exist at {endpoint}"),
            hint: "create it, or check the name in `--store s3://BUCKET/PREFIX` and `AWS_ENDPOINT_URL`".into(),
            user: true,
        },
        (Some("InvalidBucketName"), _) => StoreError::Remote {
            message: format!("the object store at {endpoint} refuses the bucket name `{bucket}`"),
            hint: "bucket names are 3 to 63 lowercase letters, digits, dots and hyphens: check `--store s3://BUCKET/PREFIX`".into(),
            user: true,
        },
        (Some("InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied" | "InvalidToken" | "ExpiredToken" | "AllAccessDisabled"), _)
        | (_, Some(401 | 403)) => StoreError::Remote {
            message: format!(
                "access to the bucket `{bucket}` was refused ({}) for {op} `{key}`, with credentials from {}",
                code.unwrap_or("403"),
                cred()
            ),
            hint: "check the credentials (or `AWS_PROFILE`) and that they may read and write the bucket".into(),
            user: true,
        },
        // The chain found nothing, or its last provider (instance metadata,
        // SSO) failed: either way there are no credentials to sign with.
        _ if message.contains("no credentials")
            || message.contains("NoCredentials")
            || message.contains("credentials provider")
            || message.contains("loading credentials") => StoreError::Remote {
            message: format!("no credentials for the bucket `{bucket}`: none found in {}", cred()),
            hint: "set `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`, or run `aws sso login`".into(),
            user: true,
        },
        (Some(TIMED_OUT), _) => away(answered.unwrap_or_else(|| "no reply in time".into())),
        (None, None) => away(answered.unwrap_or_else(|| crate::outage::words_of(&message))),
        (_, Some(s)) if s >= 500 || s == 429 => away(answered.unwrap_or_else(|| match code {
            Some(c) => format!("`{s} {c}`"),
            None => format!("`{s}`"),
        })),
        _ => StoreError::Remote {
            message: format!(
                "{op} `{key}` in the bucket `{bucket}` failed ({}): {message}",
                code.map(String::from).or(status.map(|s| s.to_string())).unwrap_or_default()
            ),
            hint: "retry; if it persists the object store is failing".into(),
            user: false,
        },
    }
}

/// The store away: what it answered in the outage (`for 61 s: `503
/// SlowDown` ×289`), the request given up, and what to do.
fn unreachable_error(
    bucket: &str,
    endpoint: &str,
    op: &str,
    key: &str,
    answered: Option<String>,
    budget: Duration,
) -> StoreError {
    let answered = answered.unwrap_or_else(|| "no answer".into());
    let answered = if answered.starts_with("for ") {
        format!("failed every request {answered}")
    } else {
        format!("answered {answered}")
    };
    StoreError::Unreachable {
        message: format!("the object store at {endpoint} {answered}; gave up on {op} `{key}` in `{bucket}`"),
        hint: format!(
            "check `AWS_ENDPOINT_URL` (or the region) and the network; an outage is ridden out for `{TIMEOUT_ENV}` (now {}) from its first failed request",
            crate::outage::secs(budget)
        ),
    }
}

type SdkErr<E> = aws_sdk_s3::error::SdkError<E, aws_sdk_s3::config::http::HttpResponse>;

/// A failed request, as [`remote`] classifies it.
#[derive(Debug)]
struct Failure {
    code: Option<String>,
    status: Option<u16>,
    message: String,
}

impl Failure {
    fn of<E: ProvideErrorMetadata + std::error::Error + 'static>(e: &SdkErr<E>) -> Failure {
        use aws_sdk_s3::error::SdkError;
        let timed_out = match e {
            SdkError::TimeoutError(_) => true,
            SdkError::DispatchFailure(d) => d.is_timeout(),
            _ => false,
        };
        if timed_out {
            return Failure {
                code: Some(TIMED_OUT.into()),
                status: None,
                message: text_of(e),
            };
        }
        let (code, message) = match e.as_service_error() {
            Some(s) => (
                s.code().map(String::from),
                s.message().unwrap_or_default().to_string(),
            ),
            None => (None, text_of(e)),
        };
        Failure {
            code,
            status: status_of(e),
            message,
        }
    }

    /// A body cut short or not read in time (after the reply's headers).
    fn body(message: String, timed_out: bool) -> Failure {
        Failure {
            code: timed_out.then(|| TIMED_OUT.to_string()),
            status: (!timed_out).then_some(500),
            message,
        }
    }
}

/// A read: the body (`None`: no such object), or why not.
type Read = Result<Option<Vec<u8>>, Failure>;

/// GET `key` from `offset` on, the body read whole. The SDK retries the
/// request; a body cut short (a connection dropped mid-reply) or silent
/// past one attempt's time is read again here until the budget is spent.
async fn read_object(
    c: Client,
    bucket: String,
    key: String,
    offset: u64,
    s: Settings,
    outage: Arc<Outage>,
) -> Read {
    let start = Instant::now();
    let mut tries = 0u32;
    loop {
        let mut req = c.get_object().bucket(&bucket).key(&key);
        if offset > 0 {
            req = req.range(format!("bytes={offset}-"));
        }
        let out = match req.send().await {
            Ok(out) => out,
            Err(e) => {
                let status = status_of(&e);
                let code = e.as_service_error().and_then(|s| s.code().map(String::from));
                if code.as_deref() == Some("NoSuchBucket") {
                    return Err(Failure::of(&e));
                }
                if e.as_service_error().is_some_and(|s| s.is_no_such_key()) || status == Some(404) {
                    return Ok(None);
                }
                if status == Some(416) {
                    // The range starts at the end: nothing new.
                    return Ok(Some(Vec::new()));
                }
                return Err(Failure::of(&e));
            }
        };
        let failure = match tokio::time::timeout(s.attempt_timeout, out.body.collect()).await {
            Ok(Ok(d)) => return Ok(Some(d.into_bytes().to_vec())),
            Ok(Err(e)) => Failure::body(format!("the reply was cut short: {e}"), false),
            Err(_) => Failure::body(format!("no reply body within {:?}", s.attempt_timeout), true),
        };
        outage.failed(if failure.code.is_some() {
            "reply body cut off by a timeout"
        } else {
            "reply cut short"
        });
        tries += 1;
        // The SDK's backoff, by hand: exponential with full jitter.
        let backoff = s
            .initial_backoff
            .saturating_mul(1 << tries.min(16))
            .min(s.max_backoff)
            .mul_f64(jitter());
        if tries >= s.max_attempts || start.elapsed() + backoff >= s.budget {
            return Err(failure);
        }
        tokio::time::sleep(backoff).await;
    }
}

/// A number in [0, 1) from the clock (enough for backoff jitter).
fn jitter() -> f64 {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (n % 1000) as f64 / 1000.0
}

fn status_of<E>(e: &SdkErr<E>) -> Option<u16> {
    e.raw_response().map(|r| r.status().as_u16())
}

fn text_of<E: std::error::Error + 'static>(e: &SdkErr<E>) -> String {
    aws_sdk_s3::error::DisplayErrorContext(e).to_string()
}

impl Objects {
    /// A client for `bucket` from the standard AWS configuration chain
    /// (environment, profiles, SSO, `AWS_ENDPOINT_URL`, region). A custom
    /// endpoint gets path-style addressing and checksums only where required.
    pub fn connect(bucket: &str) -> Result<Objects, StoreError> {
        Objects::connect_with(bucket, Settings::from_env()?)
    }

    /// [`Objects::connect`] with these timeouts and retries.
    pub fn connect_with(bucket: &str, settings: Settings) -> Result<Objects, StoreError> {
        let settings = settings.clamped();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            // Name lookups of new connections; tokio's default (512) would
            // follow the requests at once.
            .max_blocking_threads(8)
            .thread_name("orch-s3")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Remote {
                message: format!("cannot start the object store's runtime: {e}"),
                hint: "the system is out of threads or memory".into(),
                user: false,
            })?;
        let (tx, rx) = std::sync::mpsc::channel();
        let s = settings.clone();
        let outage = Arc::new(Outage::new(settings.budget));
        let tally = crate::outage::Tally {
            outage: outage.clone(),
            attempt_timeout: settings.attempt_timeout,
        };
        rt.spawn(async move {
            let _ = tx.send(load(s, tally).await);
        });
        // The task only ends by sending (a panic in the SDK would be a bug).
        let (client, endpoint) = wait(rx).unwrap_or_else(|| panic!("loading the AWS configuration panicked"));
        Ok(Objects {
            outage,
            long_pages: std::sync::atomic::AtomicBool::new(true),
            rt: Some(rt),
            client,
            bucket: bucket.to_string(),
            endpoint,
            settings,
        })
    }

    /// Run `f` (the request `op` of `key`) on the client's runtime and
    /// wait for it, within the budget of the outage the process is in
    /// (`outage.rs`): a request in flight is given up when that is spent,
    /// and once it is, a request is only a short probe ([`PROBE`]): the
    /// store that answers it ends the outage, else it fails at once.
    fn block<F>(&self, op: &str, key: &str, f: F) -> Result<F::Output, StoreError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let probe = self.outage.spent().then(|| Instant::now() + PROBE);
        let (tx, rx) = std::sync::mpsc::channel();
        let Some(rt) = self.rt.as_ref() else {
            unreachable!("the runtime lives until drop")
        };
        let outage = self.outage.clone();
        rt.spawn(async move {
            tokio::pin!(f);
            loop {
                // An outage may start (or end) while this request waits:
                // look again at least every second.
                let soon = Instant::now() + Duration::from_secs(1);
                let deadline = outage.deadline().map(|d| probe.map_or(d, |p| d.max(p)));
                let wake = deadline.map_or(soon, |d| d.min(soon));
                tokio::select! {
                    out = &mut f => {
                        let _ = tx.send(Some(out));
                        return;
                    }
                    _ = tokio::time::sleep_until(wake.into()) => {
                        if outage.spent() && probe.is_none_or(|p| Instant::now() >= p) {
                            let _ = tx.send(None);
                            return;
                        }
                    }
                }
            }
        });
        // The task only ends by sending; a panic in it is a bug of the SDK.
        match wait(rx) {
            Some(Some(out)) => Ok(out),
            Some(None) => Err(self.gave_up(op, key)),
            None => panic!("an object store request panicked"),
        }
    }

    /// The request `op` of `key` given up: the outage outlasted the budget.
    fn gave_up(&self, op: &str, key: &str) -> StoreError {
        unreachable_error(
            &self.bucket,
            &self.endpoint,
            op,
            key,
            self.outage.describe(),
            self.outage.budget(),
        )
    }

    fn err<E: ProvideErrorMetadata + std::error::Error + 'static>(
        &self,
        op: &str,
        key: &str,
        e: &SdkErr<E>,
    ) -> StoreError {
        self.failed(op, key, Failure::of(e))
    }

    fn failed(&self, op: &str, key: &str, f: Failure) -> StoreError {
        remote(
            &self.bucket,
            &self.endpoint,
            op,
            key,
            f.code.as_deref(),
            f.status,
            f.message,
            self.outage.describe(),
            self.outage.budget(),
        )
    }

    /// The object's bytes from `offset` on, or `None` when there is none.
    pub fn get(&self, key: &str, offset: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let _trace = Trace::new("GET", key);
        let (c, b, k, st) = (
            self.client.clone(),
            self.bucket.clone(),
            key.to_string(),
            self.settings.clone(),
        );
        let outage = self.outage.clone();
        self.block("read", key, read_object(c, b, k, offset, st, outage))?
            .map_err(|f| self.failed("read", key, f))
    }

    /// Write an object (overwriting): only caches and files are written this way.
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.put_with(key, bytes, None)
    }

    /// [`Objects::put`] of a segment of a running cell's file: tried for a
    /// short while only (the next flush sends it again).
    pub fn put_segment(&self, key: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.put_with(key, bytes, Some(self.settings.segment()))
    }

    fn put_with(&self, key: &str, bytes: Vec<u8>, over: Option<Settings>) -> Result<(), StoreError> {
        let _trace = Trace::new("PUT", key);
        let (c, b, k) = (self.client.clone(), self.bucket.clone(), key.to_string());
        let r = self.block("write", key, async move {
            let req = c.put_object().bucket(b).key(k).body(ByteStream::from(bytes));
            match over {
                Some(s) => {
                    req.customize()
                        .config_override(
                            aws_sdk_s3::config::Builder::new()
                                .timeout_config(s.timeout_config())
                                .retry_config(s.retry_config()),
                        )
                        .send()
                        .await
                }
                None => req.send().await,
            }
        })?;
        r.map(|_| ()).map_err(|e| self.err("write", key, &e))
    }

    /// Create an object that must not exist (`If-None-Match: *`). `token`
    /// is a string unique to this writer found inside `bytes`: on a
    /// conflict the object is read back, and if it holds our token the
    /// conflict was our own earlier try whose reply was lost.
    pub fn create(&self, key: &str, bytes: Vec<u8>, token: &str) -> Result<Created, StoreError> {
        let _trace = Trace::new("CREATE", key);
        let (c, b, k) = (self.client.clone(), self.bucket.clone(), key.to_string());
        let r = self.block("create", key, async move {
            c.put_object()
                .bucket(b)
                .key(k)
                .if_none_match("*")
                .body(ByteStream::from(bytes))
                .send()
                .await
        })?;
        match r {
            Ok(_) => Ok(Created::Ours),
            Err(e) => {
                let status = status_of(&e);
                let code = e.as_service_error().and_then(|s| s.code().map(String::from));
                // 412: it exists. 409 ConditionalRequestConflict: a create
                // of the same key is in flight; either way, read it back.
                if status == Some(412) || status == Some(409) || code.as_deref() == Some("PreconditionFailed")
                {
                    let mut theirs = self.get(key, 0)?;
                    if theirs.is_none() && status == Some(409) {
                        std::thread::sleep(std::time::Duration::from_millis(200));
                        theirs = self.get(key, 0)?;
                    }
                    return Ok(match theirs {
                        Some(t) if contains(&t, token.as_bytes()) => Created::Ours,
                        Some(t) => Created::Theirs(t),
                        None => Created::Theirs(Vec::new()),
                    });
                }
                Err(self.err("create", key, &e))
            }
        }
    }

    /// Every object under `prefix` (all pages), in key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        Ok(self.list_with(prefix, None, None, None)?.0)
    }

    /// The objects directly under `prefix` (as [`Objects::list_dir`]) whose
    /// keys sort after `start_after`, at most `max` of them (the first ones
    /// in key order), in key order.
    pub fn list_dir_after(
        &self,
        prefix: &str,
        start_after: Option<&str>,
        max: Option<usize>,
    ) -> Result<Vec<Listed>, StoreError> {
        Ok(self.list_with(prefix, Some("/"), start_after, max)?.0)
    }

    /// The objects directly under `prefix` (a "folder" of our layout that
    /// holds no deeper keys): the same answer as [`Objects::list`] there,
    /// asked with a `/` delimiter, which lets a server that keeps objects
    /// as files (s3s-fs) skip every folder outside the prefix.
    pub fn list_dir(&self, prefix: &str) -> Result<Vec<Listed>, StoreError> {
        Ok(self.list_with(prefix, Some("/"), None, None)?.0)
    }

    /// The "folders" directly under `prefix` (keys grouped at the next `/`).
    pub fn list_dirs(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        Ok(self.list_with(prefix, Some("/"), None, None)?.1)
    }

    fn list_with(
        &self,
        prefix: &str,
        delimiter: Option<&str>,
        start_after: Option<&str>,
        max: Option<usize>,
    ) -> Result<(Vec<Listed>, Vec<String>), StoreError> {
        let _trace = Trace::new(if delimiter.is_some() { "LIST/" } else { "LIST" }, prefix);
        let mut objects = Vec::new();
        let mut dirs = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (c, b, p, d, t) = (
                self.client.clone(),
                self.bucket.clone(),
                prefix.to_string(),
                delimiter.map(String::from),
                token.take(),
            );
            // `start-after` counts on the first page only; later pages follow the token.
            let after = if t.is_none() {
                start_after.map(String::from)
            } else {
                None
            };
            let long = self.long_pages.load(std::sync::atomic::Ordering::Relaxed);
            let page = match max {
                Some(m) => Some(m.saturating_sub(objects.len()).clamp(1, 1000) as i32),
                None => long.then_some(LIST_PAGE),
            };
            let again = t.clone();
            let out = self.block("list", prefix, async move {
                c.list_objects_v2()
                    .bucket(b)
                    .prefix(p)
                    .set_delimiter(d)
                    .set_start_after(after)
                    .set_max_keys(page)
                    .set_continuation_token(t)
                    .send()
                    .await
            })?;
            let out = match out {
                Ok(out) => out,
                Err(e) if page == Some(LIST_PAGE) && Failure::of(&e).status == Some(400) => {
                    // This page again, at the server's own size.
                    self.long_pages.store(false, std::sync::atomic::Ordering::Relaxed);
                    token = again;
                    continue;
                }
                Err(e) => return Err(self.err("list", prefix, &e)),
            };
            for o in out.contents() {
                if let Some(k) = o.key() {
                    objects.push(Listed {
                        key: k.to_string(),
                        size: o.size().unwrap_or(0).max(0) as u64,
                    });
                }
            }
            for p in out.common_prefixes() {
                if let Some(p) = p.prefix() {
                    dirs.push(p.to_string());
                }
            }
            if max.is_some_and(|m| objects.len() >= m) {
                break;
            }
            match out.next_continuation_token() {
                Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_string()),
                _ => break,
            }
        }
        objects.sort_by(|a, b| a.key.cmp(&b.key));
        if let Some(m) = max {
            objects.truncate(m);
        }
        Ok((objects, dirs))
    }

    /// Read many objects at once (missing ones are `None`), in order.
    pub fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let _trace = Trace::new("GET*", keys.first().map_or("", |k| k.as_str()));
        let (c, b, st) = (self.client.clone(), self.bucket.clone(), self.settings.clone());
        let keys2 = keys.to_vec();
        let outage = self.outage.clone();
        let first = keys.first().map_or("", |k| k.as_str());
        let results = self.block("read", first, async move {
            futures::stream::iter(keys2.into_iter().enumerate())
                .map(|(i, k)| {
                    let (c, b, st, o) = (c.clone(), b.clone(), st.clone(), outage.clone());
                    async move { (i, read_object(c, b, k, 0, st, o).await) }
                })
                .buffer_unordered(PARALLEL)
                .collect::<Vec<_>>()
                .await
        })?;
        let mut out: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
        for (i, r) in results {
            match r {
                Ok(v) => out[i] = v,
                Err(f) => return Err(self.failed("read", &keys[i], f)),
            }
        }
        Ok(out)
    }

    /// Delete objects (missing ones are fine).
    pub fn delete(&self, keys: &[String]) -> Result<(), StoreError> {
        for k in keys {
            let (c, b, key) = (self.client.clone(), self.bucket.clone(), k.clone());
            self.block("delete", k, async move {
                c.delete_object().bucket(b).key(key).send().await
            })?
            .map_err(|e| self.err("delete", k, &e))?;
        }
        Ok(())
    }

    /// Upload a local file as one object: in one request when small, in
    /// [`PART_SIZE`] parts (several at once) when large.
    pub fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let io = |e: std::io::Error| StoreError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: e,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size < MULTIPART_THRESHOLD {
            let bytes = std::fs::read(path).map_err(io)?;
            let n = bytes.len() as u64;
            self.put(key, bytes)?;
            return Ok(n);
        }
        let (c, b, k, p) = (
            self.client.clone(),
            self.bucket.clone(),
            key.to_string(),
            path.to_path_buf(),
        );
        let r: Result<(), (String, Failure)> = self.block("write", key, async move {
            use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
            let up = c
                .create_multipart_upload()
                .bucket(&b)
                .key(&k)
                .send()
                .await
                .map_err(|e| ("start a multipart upload of".to_string(), Failure::of(&e)))?;
            let Some(id) = up.upload_id().map(String::from) else {
                return Err((
                    "start a multipart upload of".into(),
                    Failure::body("no upload id in the reply".into(), false),
                ));
            };
            let parts = size.div_ceil(PART_SIZE);
            let results = futures::stream::iter(0..parts)
                .map(|i| {
                    let (c, b, k, id, p) = (c.clone(), b.clone(), k.clone(), id.clone(), p.clone());
                    async move {
                        let len = PART_SIZE.min(size - i * PART_SIZE);
                        let body = ByteStream::read_from()
                            .path(&p)
                            .offset(i * PART_SIZE)
                            .length(aws_sdk_s3::primitives::Length::Exact(len))
                            .build()
                            .await
                            .map_err(|e| ("read".to_string(), Failure::body(e.to_string(), false)))?;
                        let out = c
                            .upload_part()
                            .bucket(b)
                            .key(k)
                            .upload_id(id)
                            .part_number(i as i32 + 1)
                            .body(body)
                            .send()
                            .await
                            .map_err(|e| ("upload a part of".to_string(), Failure::of(&e)))?;
                        Ok::<_, (String, Failure)>(
                            CompletedPart::builder()
                                .part_number(i as i32 + 1)
                                .set_e_tag(out.e_tag().map(String::from))
                                .build(),
                        )
                    }
                })
                .buffered(4)
                .collect::<Vec<_>>()
                .await;
            let mut done = Vec::new();
            for r in results {
                match r {
                    Ok(p) => done.push(p),
                    Err(e) => {
                        let _ = c
                            .abort_multipart_upload()
                            .bucket(&b)
                            .key(&k)
                            .upload_id(&id)
                            .send()
                            .await;
                        return Err(e);
                    }
                }
            }
            c.complete_multipart_upload()
                .bucket(&b)
                .key(&k)
                .upload_id(&id)
                .multipart_upload(CompletedMultipartUpload::builder().set_parts(Some(done)).build())
                .send()
                .await
                .map_err(|e| ("complete the multipart upload of".to_string(), Failure::of(&e)))?;
            Ok(())
        })?;
        r.map_err(|(op, f)| self.failed(&op, key, f))?;
        Ok(size)
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(code: Option<&str>, status: Option<u16>, message: &str) -> StoreError {
        remote(
            "team",
            "http://127.0.0.1:9000",
            "list",
            "x/",
            code,
            status,
            message.to_string(),
            None,
            Duration::from_secs(60),
        )
    }

    #[test]
    fn failures_the_user_must_fix_are_told_apart() {
        let err = classify(Some("InvalidBucketName"), Some(400), "");
        assert!(err.is_user_error() && err.to_string().contains("`team`"), "{err}");
        let err = classify(Some("NoSuchBucket"), Some(404), "");
        assert!(
            err.is_user_error() && err.to_string().contains("does not exist"),
            "{err}"
        );
        let err = classify(Some("SignatureDoesNotMatch"), Some(403), "");
        assert!(
            err.is_user_error() && err.to_string().contains("refused"),
            "{err}"
        );
        // What the SDK says when the chain's last provider (instance
        // metadata, here refused) failed: no credentials, not a network fault.
        let err = classify(
            None,
            None,
            "dispatch failure: other: an error occurred while loading credentials: failed to load IMDS session token",
        );
        let text = err.to_string();
        assert!(
            err.is_user_error() && text.starts_with("no credentials for the bucket `team`"),
            "{text}"
        );
        let err = classify(Some("InternalError"), Some(500), "boom");
        assert!(!err.is_user_error() && is_outage(&err), "{err}");
        // The store away: named by what it answered, never the SDK's text.
        let err = classify(Some("SlowDown"), Some(503), "internal SDK words");
        let text = err.to_string();
        assert!(
            matches!(err, StoreError::Unreachable { .. }) && text.contains("`503 SlowDown`"),
            "{text}"
        );
        assert!(
            !text.contains("internal SDK words") && text.contains("`ORCH_S3_TIMEOUT_S` (now 60 s)"),
            "{text}"
        );
        let err = classify(
            None,
            None,
            "dispatch failure: io error: tcp connect error: Connection refused (os error 111)",
        );
        let text = err.to_string();
        assert!(
            text.contains("answered connection refused;") && !text.contains("os error"),
            "{text}"
        );
        assert!(!err.is_user_error() && is_outage(&err), "{err}");
    }
}
