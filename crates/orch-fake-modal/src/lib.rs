//! A fake Modal server speaking Modal's gRPC protocol (`modal.client.ModalClient`,
//! the RPCs orch and Modal's official clients use to run a sandbox), for tests.
//!
//! - each sandbox's entrypoint runs in its image's root folder as a container
//!   runtime would run it ([`crate::container`]: a mount namespace, `chroot`,
//!   a writable layer of its own; needs root), in its own process group, so
//!   the real agent runs there and its stdout/stderr become the sandbox's
//!   logs, with entry ids a client can resume from; its environment is the
//!   image's `ENV` and the secrets, nothing of this host's;
//! - volumes are host folders (`ROOT/volumes/NAME`) bind-mounted at their
//!   mount paths (read-only when asked), mount files are content-addressed
//!   blobs (`ROOT/blobs/SHA256`) bind-mounted read-only at their file names
//!   (`/orch/agent`); no path is translated: a program that needs a library
//!   the image lacks fails as it would on Modal;
//! - images come from `dockerfile_commands`: `FROM REF` is the root folder
//!   the builder maps REF to ([`FakeModalBuilder::image`]; `scratch` is an
//!   empty one; an unmapped REF fails the build at that step, as a registry
//!   without the image does), `COPY`/`ADD` copy context files, `RUN` runs in
//!   the image's root (copied first: mapped roots never change), `ENV` and
//!   `WORKDIR` reach its sandboxes; the build log names each step;
//! - GPU sandboxes (`gpu_config`) get the NVIDIA container toolkit's
//!   injection when the builder has an NVML library
//!   ([`FakeModalBuilder::nvml_stub`]): the library at `libnvidia-ml.so.1`
//!   and `NVIDIA_VISIBLE_DEVICES=0,..,N-1`;
//! - images may take their context from a mount (`context_mount_id`, files at
//!   `/PATH`, as the official client sends `COPY` sources) as well as inline
//!   (`context_files`); what each build got is recorded
//!   ([`FakeModal::image_contexts`]);
//! - large files go through `BlobCreate` and an HTTP store on a local port
//!   that answers as S3 does (`modal/_utils/blob_utils.py` is the client
//!   side): a single `PUT` (`Content-MD5` checked when sent), or, when
//!   [`Scenario::multipart_part_bytes`] asks, a `PUT` per part and the
//!   `CompleteMultipartUpload` `POST`; ETags are the MD5s S3 answers, the
//!   whole is checked against the length and MD5 `BlobCreate` declared, and
//!   each blob is recorded ([`FakeModal::blobs`]); every file whose bytes a
//!   `MountPutFile` carried is counted ([`FakeModal::uploads`]), so a test
//!   can tell that a mount of files the server already has uploaded nothing;
//! - requests without `x-modal-token-id`/`x-modal-token-secret` (or with
//!   other values than the server's) are `UNAUTHENTICATED`;
//! - [`Scenario`] knobs: an image build that fails at a step, GPU types with
//!   no capacity (the sandbox is never scheduled), sandboxes killed for OOM
//!   or terminated mid-run, transient `UNAVAILABLE` answers, log streams that
//!   drop after every batch, throttled `SandboxCreate` (`RESOURCE_EXHAUSTED`
//!   with a retry-after), slow ingestion of uploaded files (`exists: false`
//!   for a few asks after the upload), multipart blob uploads, blob `PUT`s
//!   answered `503 Slow Down`, requests over a size limit refused
//!   `RESOURCE_EXHAUSTED` (each also a flag of the `fake-modal` binary), a
//!   rate limit on unary calls answered as Modal throttles (`limit.rs`: a slot per
//!   refused call, [`FakeModal::throttling`] says whether clients waited as told);
//! - every call is recorded ([`FakeModal::calls`], counted by method in
//!   [`FakeModal::counts`]) with its idempotency key,
//!   retry and throttle-retry attempts, client type and encoded size
//!   ([`FakeModal::largest_request`]); every sandbox with its `network_access`.
//!
//! The files: `grpc.rs` (the service: every RPC, after the auth check), `images.rs` (image
//! RPCs and builds), `sandboxes.rs` (sandbox RPCs and runs), `limit.rs` (the rate limit),
//! `volumes.rs` (volumes, mounts,
//! blobs and the upload server), `state.rs` (what the server knows), this file (the server,
//! its builder and the public types).
//!
//! Not shared: the fake depends on no `orch` crate (so `orch-backend-modal` tests against it
//! without a cycle) and on no other fake but `orch-fake-containers` (how a sandbox runs); the
//! protocol is `orch-modal-proto`'s, the one the backend speaks. Its state is reached only over
//! gRPC and the blob store's HTTP, as Modal's is. The `fake-modal` binary serves it for scripts
//! (`scripts/bench-modal.sh`).

mod grpc;
mod images;
mod limit;
mod sandboxes;
mod state;
mod volumes;

use grpc::Svc;
pub use limit::{RateLimit, Throttling};
use orch_fake_containers::container;
use orch_modal_proto::{generic_result::GenericStatus, modal_client_server::ModalClientServer};
pub use state::sha256_hex;
use state::{now_s, Inner, Sandbox, State};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use volumes::serve_blobs;

// Mutexes are `lock().unwrap()`ed throughout: a poisoned lock means a handler already
// panicked, and a test fake can do no better than fail the test that uses it.

/// Failure knobs, changeable while the server runs ([`FakeModal::scenario`]).
#[derive(Debug, Clone, Default)]
pub struct Scenario {
    /// An image whose Dockerfile command contains this fails to build at that step.
    pub build_fail: Option<String>,
    /// GPU types (`H100`, `A100-80GB`) with no capacity: sandboxes asking
    /// for them are never scheduled.
    pub unavailable_gpus: Vec<String>,
    /// Sandboxes whose `orch.cell` tag (or entrypoint) contains one of these
    /// are killed for OOM after `kill_after`.
    pub oom: Vec<String>,
    /// ... or terminated after `kill_after`.
    pub terminate: Vec<String>,
    pub kill_after: Duration,
    /// The next N unary calls answer `UNAVAILABLE`.
    pub transient_failures: u32,
    /// Log streams end (without EOF) after every batch.
    pub drop_log_streams: bool,
    /// Throttling: the next N `SandboxCreate` calls answer `RESOURCE_EXHAUSTED`
    /// with a retry-after of [`Scenario::throttle_after`] (an `RPCRetryPolicy`
    /// in the status details, as Modal sends it); [`Call::idempotency_key`] and
    /// [`Call::throttle_attempt`] tell whether the client sent the same call again.
    pub throttle_sandbox_creates: u32,
    pub throttle_after: Duration,
    /// Slow ingestion: after a file's bytes arrive, `MountPutFile` answers
    /// `exists: false` for it (the upload itself, then the next N asks) and a
    /// mount naming it fails `FAILED_PRECONDITION` until then.
    pub slow_ingestion: u32,
    /// Uploads Modal needs again: the next N `MountPutFile` calls that carry
    /// a file's bytes are answered `exists: false` and the bytes dropped, so
    /// only a request that carries them again stores the file (the official
    /// client sends the data-carrying request again until `exists: true`;
    /// a question by digest alone stays `false`).
    pub drop_uploads: u32,
    /// Multipart blob uploads: `BlobCreate` answers a multipart upload with
    /// parts of this many bytes (one URL per part, a completion URL), as Modal
    /// does for large blobs; `None`: one upload URL.
    pub multipart_part_bytes: Option<u64>,
    /// The next N blob `PUT`s (whole or part) answer `503 Slow Down`, as S3
    /// does under load; the client must send them again.
    pub fail_blob_puts: u32,
    /// Requests larger than this (encoded) are refused `RESOURCE_EXHAUSTED`, as a
    /// gRPC server refuses a message over its limit; `None`: no limit.
    pub max_request_bytes: Option<usize>,
    /// Unary calls over this rate are throttled as Modal throttles them
    /// (`RESOURCE_EXHAUSTED` with an `RPCRetryPolicy`), each told when its slot
    /// comes ([`RateLimit`], [`FakeModal::throttling`]); `None`: no limit.
    pub rate_limit: Option<RateLimit>,
}

/// A blob `BlobCreate` made, and how its upload went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobRecord {
    pub id: String,
    /// `content_length` as the client declared it.
    pub size: u64,
    /// The parts asked for (0: a single upload).
    pub parts: usize,
    /// `PUT`s received for it (failed ones included).
    pub puts: u32,
    /// The bytes arrived whole (single `PUT`, or the completion of every part).
    pub completed: bool,
}

/// One file of an image build's context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextFile {
    /// As the build sees it (`app.py`, `data/big.bin`).
    pub name: String,
    pub sha256: String,
    pub size: u64,
    /// Inline in `ImageGetOrCreate` (`context_files`) rather than in the context mount.
    pub inline: bool,
}

/// The context an image build got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageContext {
    pub image_id: String,
    /// `context_mount_id` of the image definition (empty: none).
    pub mount_id: String,
    pub files: Vec<ContextFile>,
}

/// One RPC the server answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub token_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub retry_attempt: Option<String>,
    /// `x-throttle-retry-attempt` (the official client's count of throttled retries).
    pub throttle_attempt: Option<String>,
    /// `x-modal-client-type` (`9`: Modal's Go client).
    pub client_type: Option<String>,
    /// `x-modal-libmodal-version`.
    pub libmodal_version: Option<String>,
    /// The request's encoded size (what travelled in the gRPC message).
    pub request_bytes: usize,
    /// What the server saw or answered, for assertions: `SandboxCreate`:
    /// `network_access=N` (the definition's `network_access_type`, `1` is `OPEN`;
    /// `none` without one); `MountPutFile`: `exists=BOOL` as answered.
    pub detail: Option<String>,
    /// When it came.
    pub at: std::time::Instant,
}

/// A file's bytes received by `MountPutFile` (inline, or from a blob upload).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub sha256: String,
    pub size: u64,
    /// Through `BlobCreate` and the HTTP upload (a large file).
    pub via_blob: bool,
}

/// What the server knows of a sandbox (for assertions).
#[derive(Debug, Clone)]
pub struct SandboxRecord {
    pub id: String,
    pub app_id: String,
    pub tags: BTreeMap<String, String>,
    pub gpu: Option<(String, u32)>,
    pub milli_cpu: u32,
    pub memory_mb: u32,
    pub entrypoint: Vec<String>,
    pub volume_mounts: Vec<(String, String, bool)>,
    pub secret_keys: Vec<String>,
    pub mount_files: Vec<String>,
    pub timeout_secs: u32,
    /// The definition's `network_access_type` (`Some(1)`: `OPEN`); `None` without one.
    pub network_access: Option<i32>,
    pub scheduled: bool,
    pub result: Option<(i32, i32)>,
}

impl SandboxRecord {
    /// The task orch handed the sandbox: the JSON of the entrypoint's
    /// `--task-b64` argument, if it has one.
    pub fn task(&self) -> Option<serde_json::Value> {
        use base64::Engine;
        let at = self.entrypoint.iter().position(|a| a == "--task-b64")?;
        let b64 = self.entrypoint.get(at + 1)?;
        let json = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        serde_json::from_slice(&json).ok()
    }
}

/// The fake server, on 127.0.0.1 (gRPC) plus a small HTTP server for blob uploads.
pub struct FakeModal {
    inner: Arc<Inner>,
    url: String,
    _shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    root_guard: Option<PathBuf>,
}

pub struct FakeModalBuilder {
    root: Option<PathBuf>,
    port: u16,
    token: Option<(String, String)>,
    scenario: Scenario,
    images: BTreeMap<String, PathBuf>,
    nvml: Option<PathBuf>,
}

impl FakeModalBuilder {
    /// Folder for volumes, blobs and sandbox working folders (default: a new temporary one).
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = Some(root.into());
        self
    }
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }
    /// Accept only this token (default: any non-empty token id and secret).
    pub fn token(mut self, id: &str, secret: &str) -> Self {
        self.token = Some((id.into(), secret.into()));
        self
    }
    pub fn scenario(mut self, s: Scenario) -> Self {
        self.scenario = s;
        self
    }

    /// A registry image (`FROM REFERENCE`, as `Image.from_registry` sends it; matched as
    /// written, else by its normalized name: `debian:bookworm-slim` is
    /// `docker.io/library/debian:bookworm-slim`) → its root folder on this host (see
    /// [`crate::container::busybox_root`]). An image built `FROM` a reference with no root
    /// fails to build, naming the reference, as an image that is not in the registry does.
    /// Sandboxes never change the folder: each writes to a layer of its own.
    pub fn image(mut self, reference: &str, root: impl Into<PathBuf>) -> Self {
        self.images.insert(reference.to_string(), root.into());
        self
    }

    /// The NVML library (`orch_fake_containers::gpu::nvml_stub()`, or any file) that GPU sandboxes
    /// get at `libnvidia-ml.so.1`, with `NVIDIA_VISIBLE_DEVICES` naming their GPUs (`0..N-1`).
    pub fn nvml_stub(mut self, lib: impl Into<PathBuf>) -> Self {
        self.nvml = Some(lib.into());
        self
    }

    pub fn start(self) -> std::io::Result<FakeModal> {
        let (root, guard) = match self.root {
            Some(r) => (r, None),
            None => {
                // Tests start servers at the same instant on several
                // threads: a counter keeps their folders apart (one server's
                // cleanup must never remove another's blobs).
                static NEXT: AtomicU64 = AtomicU64::new(0);
                let r = std::env::temp_dir().join(format!(
                    "fake-modal-{}-{}-{}",
                    std::process::id(),
                    NEXT.fetch_add(1, Ordering::Relaxed),
                    now_s().to_bits()
                ));
                (r.clone(), Some(r))
            }
        };
        std::fs::create_dir_all(root.join("blobs"))?;
        std::fs::create_dir_all(root.join("volumes"))?;
        let std_listener = std::net::TcpListener::bind(("127.0.0.1", self.port))?;
        let addr = std_listener.local_addr()?;
        std_listener.set_nonblocking(true)?;
        // Blob uploads: plain HTTP PUT on a second port.
        let blob_listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let blob_url = format!("http://{}/blob", blob_listener.local_addr()?);
        let inner = Arc::new(Inner {
            root: root.clone(),
            image_roots: self.images,
            nvml: self.nvml,
            token: self.token,
            state: Mutex::new(State::default()),
            scenario: Mutex::new(self.scenario),
            blob_url,
            ids: AtomicU64::new(0),
            limiter: Mutex::new(limit::Limiter::default()),
        });
        {
            let inner = inner.clone();
            std::thread::spawn(move || serve_blobs(blob_listener, inner));
        }
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = Svc(inner.clone());
        let thread = std::thread::spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("fake-modal: no runtime: {e}");
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("fake-modal: {e}");
                        return;
                    }
                };
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(
                        ModalClientServer::new(svc)
                            .max_decoding_message_size(200 * 1024 * 1024)
                            .max_encoding_message_size(200 * 1024 * 1024),
                    )
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = rx.await;
                    })
                    .await;
            });
        });
        Ok(FakeModal {
            inner,
            url: format!("http://{addr}"),
            _shutdown: Some(tx),
            thread: Some(thread),
            root_guard: guard,
        })
    }
}

impl FakeModal {
    pub fn builder() -> FakeModalBuilder {
        FakeModalBuilder {
            root: None,
            port: 0,
            token: None,
            scenario: Scenario::default(),
            images: BTreeMap::new(),
            nvml: None,
        }
    }

    /// A server with the default builder: no registry image has a root, so only images built
    /// `FROM scratch` run sandboxes (see [`FakeModalBuilder::image`]).
    pub fn start() -> FakeModal {
        Self::builder().start().expect("start the fake Modal server")
    }

    /// `http://127.0.0.1:PORT`, for `MODAL_SERVER_URL`.
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The host folder of a volume (made if missing).
    pub fn volume_dir(&self, name: &str) -> PathBuf {
        self.inner.root.join("volumes").join(name)
    }

    /// Change the failure knobs.
    pub fn scenario(&self, f: impl FnOnce(&mut Scenario)) {
        f(&mut self.inner.scenario.lock().unwrap());
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.state.lock().unwrap().calls.clone()
    }

    pub fn count(&self, method: &str) -> usize {
        self.calls().iter().filter(|c| c.method == method).count()
    }

    /// Calls answered (refused ones included), by method.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        let mut by = BTreeMap::new();
        for c in self.inner.state.lock().unwrap().calls.iter() {
            *by.entry(c.method).or_default() += 1;
        }
        by
    }

    /// What [`Scenario::rate_limit`] did: calls told to wait, sent again too early, or
    /// after waiting as told.
    pub fn throttling(&self) -> Throttling {
        self.inner.limiter.lock().unwrap().stats.clone()
    }

    /// The largest request answered: (method, encoded bytes).
    pub fn largest_request(&self) -> Option<(&'static str, usize)> {
        self.calls()
            .iter()
            .map(|c| (c.method, c.request_bytes))
            .max_by_key(|(_, n)| *n)
    }

    /// Every blob `BlobCreate` made, in order.
    pub fn blobs(&self) -> Vec<BlobRecord> {
        self.inner.state.lock().unwrap().blob_records.clone()
    }

    /// The context of every image the server started to build, in order.
    pub fn image_contexts(&self) -> Vec<ImageContext> {
        self.inner.state.lock().unwrap().image_contexts.clone()
    }

    /// Every file stored from bytes that reached the server (`MountPutFile` with
    /// data; bytes sent again for a file already stored are not counted), in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.inner.state.lock().unwrap().uploads.clone()
    }

    pub fn sandboxes(&self) -> Vec<SandboxRecord> {
        self.inner
            .state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .map(|s| s.rec.lock().unwrap().clone())
            .collect()
    }

    /// Sandboxes still running (or waiting for a GPU).
    pub fn running(&self) -> Vec<String> {
        self.inner
            .state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .filter(|s| s.done().is_none())
            .map(|s| s.rec.lock().unwrap().id.clone())
            .collect()
    }

    /// Terminate a sandbox from outside (as `modal sandbox terminate` would).
    pub fn terminate(&self, id: &str) {
        if let Ok(sb) = self.inner.sandbox(id) {
            sb.kill(GenericStatus::Terminated);
        }
    }
}

impl Drop for FakeModal {
    fn drop(&mut self) {
        let ids: Vec<Arc<Sandbox>> = self
            .inner
            .state
            .lock()
            .unwrap()
            .sandboxes
            .values()
            .cloned()
            .collect();
        for sb in ids {
            if sb.done().is_none() {
                sb.kill(GenericStatus::Terminated);
            }
        }
        drop(self._shutdown.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(r) = self.root_guard.take() {
            let _ = std::fs::remove_dir_all(r);
        }
    }
}
