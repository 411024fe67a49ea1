//! A local Hugging Face Hub-compatible HTTP server.
//!
//! Serves every `org/name` folder under a root directory as a model repo (and
//! `root/datasets/org/name`, `root/spaces/org/name` as dataset/space repos) with the endpoints
//! `huggingface_hub` (Python) and the `hf-hub` crate use for downloads:
//!
//! - `GET /api/{models|datasets|spaces}/{org}/{name}[/revision/{rev}]` — repo info
//! - `GET /api/{type}/{org}/{name}/tree/{rev}[/{path}]?recursive=true&expand=true` — tree listing
//! - `POST /api/{type}/{org}/{name}/paths-info/{rev}` — JSON `{"paths": [...]}` or form `paths=...`
//! - `HEAD|GET /[{datasets|spaces}/]{org}/{name}/resolve/{rev}/{path}` — file, with `Range` support
//!
//! The server runs on its own thread and tokio runtime, so synchronous tests can use it; it stops
//! when the [`HubServer`] is dropped. [`fixtures`] writes the repos it serves: generated,
//! realistic model repositories; [`hashing`] the oids the Hub reports.
//!
//! ```no_run
//! use orch_fake_hub::{fixtures, HubServer};
//! let root = tempfile_like_dir();
//! # fn tempfile_like_dir() -> std::path::PathBuf { std::env::temp_dir().join("hub-root") }
//! let model = fixtures::write_test_model(&root, "acme/tiny-llama", &fixtures::ModelOptions::tiny()).unwrap();
//! let server = HubServer::builder(&root).gated("acme/tiny-llama", "hf_valid").start().unwrap();
//! std::env::set_var("HF_ENDPOINT", server.endpoint());
//! # let _ = model;
//! ```
//!
//! Not shared: the fake depends on no `orch` crate and on no other fake; it serves files from a
//! folder over HTTP and nothing else (no uploads, no auth beyond a gated repo's one token). The
//! `fake-hub` binary serves it for scripts (`scripts/bench-setup.sh`).

/// Generated model repositories (`orch-fixtures`), under their old path.
pub use orch_fixtures as fixtures;
pub mod hashing;
mod index;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{self, SeekFrom};
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Empty, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
use tokio_util::io::ReaderStream;

use index::{Repo, RepoFile};
pub use index::{RepoType, LFS_THRESHOLD};

/// The per-repo marker file the server reads and never serves (`orch-fixtures` writes it).
pub use orch_fixtures::MARKER_FILE;

type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Fixed timestamp reported as `lastModified` / `createdAt`.
pub const TIMESTAMP: &str = "2026-01-01T00:00:00.000Z";

/// What a request was, for [`HubServer::count`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// `GET /api/{type}/{repo}[/revision/{rev}]`
    Info,
    /// `GET /api/{type}/{repo}/tree/...`
    Tree,
    /// `POST /api/{type}/{repo}/paths-info/{rev}`
    PathsInfo,
    /// `HEAD .../resolve/...`
    ResolveHead,
    /// `GET .../resolve/...` (a file download, full or ranged)
    ResolveGet,
    /// Anything else (answered 404).
    Other,
}

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    /// Raw (still percent-encoded) path.
    pub path: String,
    pub query: Option<String>,
    /// The `Range` request header, if any.
    pub range: Option<String>,
    /// Whether an `Authorization` header was sent.
    pub authorization: bool,
    pub kind: RequestKind,
    pub status: u16,
}

/// Builder for [`HubServer`].
#[derive(Debug, Clone)]
pub struct HubServerBuilder {
    root: PathBuf,
    port: u16,
    gated: HashMap<String, String>,
    log: bool,
    worker_threads: usize,
}

impl HubServerBuilder {
    /// Port to bind on 127.0.0.1 (default 0: a free port).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Gate `repo` (`org/name`, any repo type) behind the bearer token `token`.
    pub fn gated(mut self, repo: impl Into<String>, token: impl Into<String>) -> Self {
        self.gated.insert(repo.into(), token.into());
        self
    }

    /// Print one line per request to stderr.
    pub fn log_requests(mut self, on: bool) -> Self {
        self.log = on;
        self
    }

    /// Tokio worker threads (default 4).
    pub fn worker_threads(mut self, n: usize) -> Self {
        self.worker_threads = n.max(1);
        self
    }

    /// Scan and hash the root, bind, and start serving on a background thread.
    pub fn start(self) -> io::Result<HubServer> {
        let repos = load_repos(&self.root, &self.gated)?;
        let listener = StdTcpListener::bind(("127.0.0.1", self.port))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            root: self.root.clone(),
            gated: self.gated.clone(),
            repos: RwLock::new(Arc::new(repos)),
            log: Mutex::new(Vec::new()),
            bytes_served: Arc::new(AtomicU64::new(0)),
            print: AtomicBool::new(self.log),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(self.worker_threads)
            .thread_name("fake-hub")
            .enable_all()
            .build()?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let st = state.clone();
        let thread = std::thread::Builder::new()
            .name("fake-hub-main".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, st, rx));
                rt.shutdown_timeout(Duration::from_secs(1));
            })?;
        Ok(HubServer {
            addr,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }
}

type RepoMap = HashMap<(RepoType, String), Arc<Repo>>;

fn load_repos(root: &Path, gated: &HashMap<String, String>) -> io::Result<RepoMap> {
    Ok(index::load(root, gated)?
        .into_iter()
        .map(|r| ((r.kind, r.id.clone()), Arc::new(r)))
        .collect())
}

struct State {
    root: PathBuf,
    gated: HashMap<String, String>,
    repos: RwLock<Arc<RepoMap>>,
    log: Mutex<Vec<RequestRecord>>,
    /// Shared with body streams, which outlive the request handler.
    bytes_served: Arc<AtomicU64>,
    print: AtomicBool,
}

impl State {
    fn repo(&self, kind: RepoType, id: &str) -> Option<Arc<Repo>> {
        let map = self.repos.read().unwrap_or_else(|e| e.into_inner()).clone();
        map.get(&(kind, id.to_string())).cloned()
    }
}

/// A running fake Hub. Stops (and joins its thread) on drop.
pub struct HubServer {
    addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for HubServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubServer")
            .field("addr", &self.addr)
            .field("root", &self.state.root)
            .finish()
    }
}

impl HubServer {
    /// A builder serving `root`.
    pub fn builder(root: impl AsRef<Path>) -> HubServerBuilder {
        HubServerBuilder {
            root: root.as_ref().to_path_buf(),
            port: 0,
            gated: HashMap::new(),
            log: false,
            worker_threads: 4,
        }
    }

    /// Serve `root` on a free port (gating only via marker files). Panics if it cannot start
    /// (test helper; use [`HubServer::builder`] to handle the error).
    pub fn start(root: &Path) -> HubServer {
        match HubServer::builder(root).start() {
            Ok(s) => s,
            Err(e) => panic!("fake hub failed to start on {}: {e}", root.display()),
        }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash): the value for `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn root(&self) -> &Path {
        &self.state.root
    }

    /// Every request answered so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.state.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Number of requests of `kind` answered so far (any status).
    pub fn count(&self, kind: RequestKind) -> usize {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| r.kind == kind)
            .count()
    }

    /// Number of `GET .../resolve/...` requests that carried a `Range` header.
    pub fn ranged_gets(&self) -> usize {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|r| r.kind == RequestKind::ResolveGet && r.range.is_some())
            .count()
    }

    /// Forget recorded requests (and reset [`HubServer::bytes_served`]).
    pub fn clear_requests(&self) {
        self.state.log.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.state.bytes_served.store(0, Ordering::Relaxed);
    }

    /// File body bytes sent so far.
    pub fn bytes_served(&self) -> u64 {
        self.state.bytes_served.load(Ordering::Relaxed)
    }

    /// Ids (`org/name`) of the model repos served.
    pub fn models(&self) -> Vec<String> {
        let map = self.state.repos.read().unwrap_or_else(|e| e.into_inner()).clone();
        let mut v: Vec<String> = map
            .keys()
            .filter(|(k, _)| *k == RepoType::Model)
            .map(|(_, id)| id.clone())
            .collect();
        v.sort();
        v
    }

    /// The fake commit sha of a model repo.
    pub fn commit(&self, repo: &str) -> Option<String> {
        self.state.repo(RepoType::Model, repo).map(|r| r.commit.clone())
    }

    /// The ETag (without quotes) served for a model repo file: sha256 for LFS files, else the git blob oid.
    pub fn etag(&self, repo: &str, path: &str) -> Option<String> {
        self.state
            .repo(RepoType::Model, repo)
            .and_then(|r| r.files.get(path).map(|f| f.etag().to_string()))
    }

    /// Re-scan and re-hash the root (after tests changed files); commits change accordingly.
    pub fn rescan(&self) -> io::Result<()> {
        let repos = load_repos(&self.state.root, &self.state.gated)?;
        *self.state.repos.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(repos);
        Ok(())
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn accept_loop(
    listener: StdTcpListener,
    state: Arc<State>,
    mut shutdown: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake-hub: cannot register listener: {e}");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            acc = listener.accept() => match acc {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let state = state.clone();
                    tokio::spawn(async move {
                        let svc = service_fn(move |req| handle(state.clone(), req));
                        let _ = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .keep_alive(true)
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                // E.g. too many open files: back off briefly instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

fn header_str(h: &HeaderMap, name: header::HeaderName) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let range = header_str(req.headers(), header::RANGE);
    let authorization = req.headers().contains_key(header::AUTHORIZATION);
    let (kind, resp) = route(&state, req).await;
    let rec = RequestRecord {
        method: method.to_string(),
        path,
        query,
        range,
        authorization,
        kind,
        status: resp.status().as_u16(),
    };
    if state.print.load(Ordering::Relaxed) {
        eprintln!(
            "fake-hub: {} {}{}{} -> {}",
            rec.method,
            rec.path,
            rec.query.as_deref().map(|q| format!("?{q}")).unwrap_or_default(),
            rec.range
                .as_deref()
                .map(|r| format!(" [{r}]"))
                .unwrap_or_default(),
            rec.status
        );
    }
    state.log.lock().unwrap_or_else(|e| e.into_inner()).push(rec);
    Ok(resp)
}

fn decode(seg: &str) -> String {
    percent_encoding::percent_decode_str(seg)
        .decode_utf8_lossy()
        .into_owned()
}

/// Query pairs, decoded (`+` as space).
fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    parse_form(q.unwrap_or(""))
}

fn parse_form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

fn truthy(v: &str) -> bool {
    matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes")
}

async fn route(state: &State, req: Request<Incoming>) -> (RequestKind, Response<Body>) {
    let segs: Vec<String> = {
        let mut v: Vec<String> = req.uri().path().split('/').skip(1).map(decode).collect();
        while v.last().is_some_and(|s| s.is_empty()) {
            v.pop();
        }
        v
    };
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    let method = req.method().clone();
    let query = parse_query(req.uri().query());
    let token = bearer(req.headers());
    let is_get = method == Method::GET;
    let is_head = method == Method::HEAD;

    match s.as_slice() {
        ["api", plural, org, name] if is_get || is_head => match RepoType::from_plural(plural) {
            Some(kind) => (RequestKind::Info, info(state, kind, org, name, None, &query)),
            None => (RequestKind::Other, not_found()),
        },
        ["api", plural, org, name, "revision", rev] if is_get || is_head => {
            match RepoType::from_plural(plural) {
                Some(kind) => (RequestKind::Info, info(state, kind, org, name, Some(rev), &query)),
                None => (RequestKind::Other, not_found()),
            }
        }
        ["api", plural, org, name, "tree", rev, rest @ ..] if is_get => match RepoType::from_plural(plural) {
            Some(kind) => {
                let recursive = query.iter().any(|(k, v)| k == "recursive" && truthy(v));
                let expand = query.iter().any(|(k, v)| k == "expand" && truthy(v));
                let path = rest.join("/");
                (
                    RequestKind::Tree,
                    tree(
                        state,
                        kind,
                        org,
                        name,
                        rev,
                        &path,
                        recursive,
                        expand,
                        token.as_deref(),
                    ),
                )
            }
            None => (RequestKind::Other, not_found()),
        },
        ["api", plural, org, name, "paths-info", rev] if method == Method::POST => {
            match RepoType::from_plural(plural) {
                Some(kind) => {
                    let (kind, org, name, rev) = (kind, org.to_string(), name.to_string(), rev.to_string());
                    let ctype = header_str(req.headers(), header::CONTENT_TYPE).unwrap_or_default();
                    let body = match Limited::new(req.into_body(), 16 << 20).collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(e) => {
                            return (
                                RequestKind::PathsInfo,
                                error(StatusCode::BAD_REQUEST, None, &e.to_string()),
                            )
                        }
                    };
                    let resp = paths_info(state, kind, &org, &name, &rev, &ctype, &body, token.as_deref());
                    (RequestKind::PathsInfo, resp)
                }
                None => (RequestKind::Other, not_found()),
            }
        }
        [plural @ ("datasets" | "spaces"), org, name, "resolve", rev, rest @ ..]
            if (is_get || is_head) && !rest.is_empty() =>
        {
            let kind = RepoType::from_plural(plural).unwrap_or(RepoType::Dataset);
            let k = if is_head {
                RequestKind::ResolveHead
            } else {
                RequestKind::ResolveGet
            };
            (
                k,
                resolve(
                    state,
                    kind,
                    org,
                    name,
                    rev,
                    &rest.join("/"),
                    is_head,
                    req.headers(),
                    token.as_deref(),
                )
                .await,
            )
        }
        [org, name, "resolve", rev, rest @ ..] if (is_get || is_head) && !rest.is_empty() => {
            let k = if is_head {
                RequestKind::ResolveHead
            } else {
                RequestKind::ResolveGet
            };
            let resp = resolve(
                state,
                RepoType::Model,
                org,
                name,
                rev,
                &rest.join("/"),
                is_head,
                req.headers(),
                token.as_deref(),
            )
            .await;
            (k, resp)
        }
        _ => (RequestKind::Other, not_found()),
    }
}

fn bearer(h: &HeaderMap) -> Option<String> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, tok) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| tok.trim().to_string())
}

fn header_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or_else(|_| {
        let clean: String = s
            .chars()
            .map(|c| if c.is_ascii_graphic() || c == ' ' { c } else { '?' })
            .collect();
        // Only visible ASCII and spaces remain, which is always a valid header value.
        HeaderValue::from_str(&clean).expect("sanitized header value")
    })
}

fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

fn response(status: StatusCode, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r
}

fn json_response(v: &Value) -> Response<Body> {
    let body = v.to_string();
    let mut r = response(StatusCode::OK, full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    r
}

fn error(status: StatusCode, code: Option<&str>, msg: &str) -> Response<Body> {
    let mut r = response(status, full(json!({ "error": msg }).to_string()));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json; charset=utf-8"),
    );
    if let Some(code) = code {
        h.insert("x-error-code", header_value(code));
    }
    h.insert("x-error-message", header_value(msg));
    r
}

fn not_found() -> Response<Body> {
    error(StatusCode::NOT_FOUND, None, "Not Found")
}

/// A Hub API error: status, `X-Error-Code`, `X-Error-Message` (and `{"error": message}` body).
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn response(self) -> Response<Body> {
        error(self.status, Some(self.code), &self.message)
    }
}

fn repo_not_found() -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "RepoNotFound", "Repository not found")
}

fn revision_not_found(rev: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "RevisionNotFound",
        format!("Invalid rev id: {rev}"),
    )
}

fn entry_not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "EntryNotFound", "Entry not found")
}

/// Gated-repo check for file/tree access.
fn check_access(repo: &Repo, token: Option<&str>) -> Result<(), ApiError> {
    let Some(expected) = repo.gated_token.as_deref() else {
        return Ok(());
    };
    let id = &repo.id;
    let word = repo.kind.word();
    match token {
        Some(t) if t == expected => Ok(()),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "GatedRepo",
            format!(
                "Access to {word} {id} is restricted. You must have access to it and be authenticated to \
                 access it. Please log in."
            ),
        )),
        Some(_) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "GatedRepo",
            format!(
                "Access to {word} {id} is restricted and you are not in the authorized list. Visit \
                 https://huggingface.co/{id} to ask for access."
            ),
        )),
    }
}

fn rev_ok(repo: &Repo, rev: &str) -> bool {
    rev == "main" || rev == "refs/heads/main" || rev == repo.commit
}

/// Look up repo + check access + revision, in the Hub's order.
fn open_repo(
    state: &State,
    kind: RepoType,
    org: &str,
    name: &str,
    rev: &str,
    token: Option<&str>,
) -> Result<Arc<Repo>, ApiError> {
    let repo = state
        .repo(kind, &format!("{org}/{name}"))
        .ok_or_else(repo_not_found)?;
    check_access(&repo, token)?;
    if !rev_ok(&repo, rev) {
        return Err(revision_not_found(rev));
    }
    Ok(repo)
}

fn lfs_json(f: &RepoFile) -> Option<Value> {
    f.lfs.as_ref().map(|l| {
        json!({
            "oid": l.sha256,
            "sha256": l.sha256,
            "size": f.size,
            "pointerSize": l.pointer_size,
            "pointer_size": l.pointer_size,
        })
    })
}

fn file_entry(repo: &Repo, f: &RepoFile, expand: bool) -> Value {
    let mut v = json!({ "type": "file", "oid": f.blob_oid, "size": f.size, "path": f.path });
    if let Some(l) = lfs_json(f) {
        v["lfs"] = l;
    }
    if expand {
        v["lastCommit"] = json!({ "id": repo.commit, "title": "Upload model", "date": TIMESTAMP });
    }
    v
}

fn dir_entry(repo: &Repo, d: &str, expand: bool) -> Value {
    let mut v = json!({ "type": "directory", "oid": repo.dir_oid(d), "size": 0, "path": d });
    if expand {
        v["lastCommit"] = json!({ "id": repo.commit, "title": "Upload model", "date": TIMESTAMP });
    }
    v
}

fn info(
    state: &State,
    kind: RepoType,
    org: &str,
    name: &str,
    rev: Option<&str>,
    query: &[(String, String)],
) -> Response<Body> {
    let id = format!("{org}/{name}");
    let Some(repo) = state.repo(kind, &id) else {
        return repo_not_found().response();
    };
    if let Some(rev) = rev {
        if !rev_ok(&repo, rev) {
            return revision_not_found(rev).response();
        }
    }
    let blobs = query.iter().any(|(k, v)| {
        (k == "blobs" && truthy(v)) || ((k == "expand" || k == "expand[]") && (v == "siblings" || truthy(v)))
    });
    let siblings: Vec<Value> = repo
        .files
        .values()
        .map(|f| {
            let mut s = json!({ "rfilename": f.path });
            if blobs {
                s["size"] = json!(f.size);
                s["blobId"] = json!(f.blob_oid);
                if let Some(l) = lfs_json(f) {
                    s["lfs"] = l;
                }
            }
            s
        })
        .collect();
    let gated = if repo.gated_token.is_some() {
        json!("manual")
    } else {
        json!(false)
    };
    let mut v = json!({
        "_id": &repo.commit[..24],
        "id": id,
        "author": org,
        "sha": repo.commit,
        "lastModified": TIMESTAMP,
        "createdAt": TIMESTAMP,
        "private": false,
        "gated": gated,
        "disabled": false,
        "downloads": 0,
        "likes": 0,
        "tags": [],
        "siblings": siblings,
        "usedStorage": repo.used_storage(),
    });
    if kind == RepoType::Model {
        v["modelId"] = json!(id);
        v["library_name"] = json!("transformers");
        v["pipeline_tag"] = json!("text-generation");
        if let Some(cfg) = repo.files.get("config.json") {
            if let Ok(c) = std::fs::read(&cfg.abs)
                .map_err(|_| ())
                .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|_| ()))
            {
                v["config"] = json!({
                    "architectures": c.get("architectures").cloned().unwrap_or(Value::Null),
                    "model_type": c.get("model_type").cloned().unwrap_or(Value::Null),
                });
            }
        }
    }
    if kind == RepoType::Space {
        v["sdk"] = json!("static");
    }
    json_response(&v)
}

#[allow(clippy::too_many_arguments)]
fn tree(
    state: &State,
    kind: RepoType,
    org: &str,
    name: &str,
    rev: &str,
    path: &str,
    recursive: bool,
    expand: bool,
    token: Option<&str>,
) -> Response<Body> {
    let repo = match open_repo(state, kind, org, name, rev, token) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let prefix = path.trim_matches('/');
    if !prefix.is_empty() && !repo.dirs.contains(prefix) {
        return entry_not_found().response();
    }
    let in_scope = |p: &str| -> bool {
        let rest = if prefix.is_empty() {
            Some(p)
        } else {
            p.strip_prefix(prefix).and_then(|r| r.strip_prefix('/'))
        };
        match rest {
            Some(r) => recursive || !r.contains('/'),
            None => false,
        }
    };
    let mut entries: Vec<(String, Value)> = Vec::new();
    for d in repo.dirs.iter().filter(|d| in_scope(d)) {
        entries.push((d.clone(), dir_entry(&repo, d, expand)));
    }
    for f in repo.files.values().filter(|f| in_scope(&f.path)) {
        entries.push((f.path.clone(), file_entry(&repo, f, expand)));
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    json_response(&Value::Array(entries.into_iter().map(|(_, v)| v).collect()))
}

#[allow(clippy::too_many_arguments)]
fn paths_info(
    state: &State,
    kind: RepoType,
    org: &str,
    name: &str,
    rev: &str,
    content_type: &str,
    body: &[u8],
    token: Option<&str>,
) -> Response<Body> {
    let repo = match open_repo(state, kind, org, name, rev, token) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let (paths, expand) = if content_type.starts_with("application/json") {
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => {
                let paths = match v.get("paths") {
                    Some(Value::Array(a)) => {
                        a.iter().filter_map(|p| p.as_str().map(str::to_string)).collect()
                    }
                    Some(Value::String(s)) => vec![s.clone()],
                    _ => Vec::new(),
                };
                let expand = v
                    .get("expand")
                    .is_some_and(|e| e.as_bool() == Some(true) || e == "true");
                (paths, expand)
            }
            Err(e) => return error(StatusCode::BAD_REQUEST, None, &format!("invalid JSON body: {e}")),
        }
    } else {
        let form = parse_form(&String::from_utf8_lossy(body));
        let paths = form
            .iter()
            .filter(|(k, _)| k == "paths" || k == "paths[]")
            .map(|(_, v)| v.clone())
            .collect();
        let expand = form.iter().any(|(k, v)| k == "expand" && truthy(v));
        (paths, expand)
    };
    let mut out = Vec::new();
    for p in paths {
        let p = p.trim_matches('/');
        if let Some(f) = repo.files.get(p) {
            out.push(file_entry(&repo, f, expand));
        } else if repo.dirs.contains(p) {
            out.push(dir_entry(&repo, p, expand));
        }
    }
    json_response(&Value::Array(out))
}

/// A parsed `Range` header against a file of known size.
#[derive(Debug, PartialEq, Eq)]
enum RangeReq {
    Full,
    /// Inclusive byte positions.
    Partial(u64, u64),
    Unsatisfiable,
}

fn parse_range(h: Option<&str>, size: u64) -> RangeReq {
    let Some(h) = h else { return RangeReq::Full };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return RangeReq::Full;
    };
    if spec.contains(',') {
        // Multiple ranges: allowed to ignore (RFC 9110 §14.2).
        return RangeReq::Full;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return RangeReq::Unsatisfiable;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        // Suffix range: the last n bytes.
        return match b.parse::<u64>() {
            Ok(n) if n > 0 && size > 0 => RangeReq::Partial(size - n.min(size), size - 1),
            _ => RangeReq::Unsatisfiable,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeReq::Unsatisfiable;
    };
    if start >= size {
        return RangeReq::Unsatisfiable;
    }
    if b.is_empty() {
        return RangeReq::Partial(start, size - 1);
    }
    match b.parse::<u64>() {
        Ok(end) if end >= start => RangeReq::Partial(start, end.min(size - 1)),
        _ => RangeReq::Unsatisfiable,
    }
}

fn etag_matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t.strip_prefix("W/").unwrap_or(t).trim_matches('"') == etag
    })
}

#[allow(clippy::too_many_arguments)]
async fn resolve(
    state: &State,
    kind: RepoType,
    org: &str,
    name: &str,
    rev: &str,
    path: &str,
    head: bool,
    req_headers: &HeaderMap,
    token: Option<&str>,
) -> Response<Body> {
    let repo = match open_repo(state, kind, org, name, rev, token) {
        Ok(r) => r,
        Err(e) => return e.response(),
    };
    let Some(f) = repo.files.get(path).cloned() else {
        return entry_not_found().response();
    };
    let etag = format!("\"{}\"", f.etag());

    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, header_value(&etag));
    headers.insert("x-repo-commit", header_value(&repo.commit));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=0, must-revalidate"),
    );
    if let Some(inm) = header_str(req_headers, header::IF_NONE_MATCH) {
        if etag_matches(&inm, f.etag()) {
            let mut r = response(StatusCode::NOT_MODIFIED, empty());
            *r.headers_mut() = headers;
            return r;
        }
    }

    let range = parse_range(header_str(req_headers, header::RANGE).as_deref(), f.size);
    // The Hub sends X-Linked-* on the (redirect) resolve response of LFS files. Clients (hf-hub)
    // prefer X-Linked-Size over Content-Length as "the size of what follows", so a 206 carries only
    // Content-Length/Content-Range, like the CDN response the real Hub redirects to.
    if f.lfs.is_some() && !matches!(range, RangeReq::Partial(..)) {
        headers.insert("x-linked-etag", header_value(&etag));
        headers.insert("x-linked-size", HeaderValue::from(f.size));
    }
    let (status, start, len) = match range {
        RangeReq::Full => (StatusCode::OK, 0, f.size),
        RangeReq::Partial(a, b) => {
            headers.insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes {a}-{b}/{}", f.size)),
            );
            (StatusCode::PARTIAL_CONTENT, a, b - a + 1)
        }
        RangeReq::Unsatisfiable => {
            let mut r = error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                None,
                "Requested Range Not Satisfiable",
            );
            r.headers_mut().insert(
                header::CONTENT_RANGE,
                header_value(&format!("bytes */{}", f.size)),
            );
            return r;
        }
    };
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));

    let body = if head || len == 0 {
        empty()
    } else {
        match open_at(&f.abs, start).await {
            Ok(file) => {
                let counter = state.bytes_served.clone();
                let stream = ReaderStream::with_capacity(file.take(len), 256 * 1024).map(move |r| {
                    r.map(|b| {
                        counter.fetch_add(b.len() as u64, Ordering::Relaxed);
                        Frame::data(b)
                    })
                });
                StreamBody::new(stream).boxed_unsync()
            }
            Err(e) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    None,
                    &format!("cannot read {path}: {e}"),
                );
            }
        }
    };
    let mut r = response(status, body);
    *r.headers_mut() = headers;
    r
}

async fn open_at(path: &Path, start: u64) -> io::Result<tokio::fs::File> {
    let mut file = tokio::fs::File::open(path).await?;
    if start > 0 {
        file.seek(SeekFrom::Start(start)).await?;
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range(None, 10), RangeReq::Full);
        assert_eq!(parse_range(Some("bytes=0-3"), 10), RangeReq::Partial(0, 3));
        assert_eq!(parse_range(Some("bytes=5-"), 10), RangeReq::Partial(5, 9));
        assert_eq!(parse_range(Some("bytes=5-100"), 10), RangeReq::Partial(5, 9));
        assert_eq!(parse_range(Some("bytes=-3"), 10), RangeReq::Partial(7, 9));
        assert_eq!(parse_range(Some("bytes=10-"), 10), RangeReq::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=4-2"), 10), RangeReq::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=x-2"), 10), RangeReq::Unsatisfiable);
        assert_eq!(parse_range(Some("items=0-1"), 10), RangeReq::Full);
    }
}
