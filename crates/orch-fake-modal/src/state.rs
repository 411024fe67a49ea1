//! The server's state: sandboxes (record, log entries, result, process group), images
//! (build log, result, root folder, `ENV`, `WORKDIR`), apps, secrets, volumes, mounts,
//! blobs, the calls answered, and the auth check every RPC starts with.

use super::{BlobRecord, Call, ImageContext, SandboxRecord, Scenario, Upload};
use orch_modal_proto::{self as proto, generic_result::GenericStatus, GenericResult};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tonic::{Request, Status};

pub(super) type Stream<T> = Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send>>;

pub(super) struct LogEntry {
    pub(super) id: u64,
    pub(super) fd: i32,
    pub(super) data: String,
}

pub(super) struct Sandbox {
    pub(super) rec: Mutex<SandboxRecord>,
    pub(super) created_at: f64,
    pub(super) logs: Mutex<Vec<LogEntry>>,
    pub(super) next_entry: AtomicU64,
    /// Bumped on every new log entry and at the end.
    pub(super) changed: watch::Sender<u64>,
    pub(super) result: Mutex<Option<GenericResult>>,
    pub(super) pgid: Mutex<Option<i32>>,
    /// Why the host killed it, if it did.
    pub(super) killed_as: Mutex<Option<GenericStatus>>,
}

impl Sandbox {
    pub(super) fn push(&self, fd: i32, data: String) {
        let id = self.next_entry.fetch_add(1, Ordering::SeqCst) + 1;
        self.logs.lock().unwrap().push(LogEntry { id, fd, data });
        self.changed.send_modify(|v| *v += 1);
    }

    pub(super) fn finish(&self, r: GenericResult) {
        let mut slot = self.result.lock().unwrap();
        if slot.is_none() {
            self.rec.lock().unwrap().result = Some((r.status, r.exitcode));
            *slot = Some(r);
        }
        drop(slot);
        self.changed.send_modify(|v| *v += 1);
    }

    pub(super) fn done(&self) -> Option<GenericResult> {
        self.result.lock().unwrap().clone()
    }

    pub(super) fn kill(&self, why: GenericStatus) {
        let mut k = self.killed_as.lock().unwrap();
        if k.is_none() {
            *k = Some(why);
        }
        drop(k);
        if let Some(pg) = *self.pgid.lock().unwrap() {
            // SAFETY: kill(2) on a process group this server started.
            unsafe {
                libc::kill(-pg, libc::SIGKILL);
            }
        } else {
            // Never started: it ends now.
            self.finish(GenericResult {
                status: why as i32,
                ..Default::default()
            });
        }
    }
}

/// An image: its build log and result, and what sandboxes of it get.
pub(super) struct Image {
    pub(super) build: Mutex<ImageBuild>,
    /// Bumped on every build log line and at the end.
    pub(super) changed: watch::Sender<u64>,
}

#[derive(Default)]
pub(super) struct ImageBuild {
    pub(super) log: Vec<String>,
    pub(super) result: Option<GenericResult>,
    /// A request already started (or joined) the build: later ones get the result directly.
    pub(super) built_once: bool,
    /// The image's root folder (`None` until built, or when the build failed).
    pub(super) root: Option<PathBuf>,
    /// `ENV` of the Dockerfile.
    pub(super) env: BTreeMap<String, String>,
    /// `WORKDIR` of the Dockerfile (`/` by default).
    pub(super) workdir: String,
}

impl Image {
    pub(super) fn log(&self, line: String) {
        self.build.lock().unwrap().log.push(line);
        self.changed.send_modify(|v| *v += 1);
    }

    pub(super) fn finish(&self, result: GenericResult, root: Option<PathBuf>) {
        let mut b = self.build.lock().unwrap();
        b.result = Some(result);
        b.root = root;
        drop(b);
        self.changed.send_modify(|v| *v += 1);
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) apps: HashMap<(String, String), String>,
    pub(super) images: HashMap<String, Arc<Image>>,
    pub(super) secrets: HashMap<String, BTreeMap<String, String>>,
    pub(super) volumes: HashMap<String, String>,
    pub(super) volume_dirs: HashMap<String, PathBuf>,
    pub(super) mounts: HashMap<String, Vec<proto::MountFile>>,
    pub(super) blobs: HashMap<String, PathBuf>,
    /// Blobs asked for by `BlobCreate` (and how their upload went).
    pub(super) blob_records: Vec<BlobRecord>,
    /// What `BlobCreate` was told of each blob: its length and MD5 (base64).
    pub(super) blob_claims: HashMap<String, (u64, String)>,
    /// The context each image build got.
    pub(super) image_contexts: Vec<ImageContext>,
    /// Every `MountPutFile` that carried a file's bytes.
    pub(super) uploads: Vec<Upload>,
    /// Slow ingestion: files received but not yet ingested → asks left before they are.
    pub(super) ingesting: HashMap<String, u32>,
    pub(super) sandboxes: BTreeMap<String, Arc<Sandbox>>,
    pub(super) calls: Vec<Call>,
}

pub(super) struct Inner {
    pub(super) root: PathBuf,
    /// Image reference (as in `FROM`) → root folder.
    pub(super) image_roots: BTreeMap<String, PathBuf>,
    /// The NVML library GPU sandboxes get.
    pub(super) nvml: Option<PathBuf>,
    pub(super) token: Option<(String, String)>,
    pub(super) state: Mutex<State>,
    pub(super) scenario: Mutex<Scenario>,
    pub(super) blob_url: String,
    pub(super) ids: AtomicU64,
    /// The rate limit's buckets and what it did ([`super::limit`]).
    pub(super) limiter: Mutex<super::limit::Limiter>,
}

impl Inner {
    pub(super) fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{:08x}", self.ids.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Auth, the call record and the transient-failure knob.
    pub(super) fn enter<T: orch_modal_proto::prost::Message>(
        &self,
        method: &'static str,
        req: &Request<T>,
    ) -> Result<(), Status> {
        let md = req.metadata();
        let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).map(String::from);
        let request_bytes = req.get_ref().encoded_len();
        self.state.lock().unwrap().calls.push(Call {
            method,
            token_id: get("x-modal-token-id"),
            idempotency_key: get("x-idempotency-key"),
            retry_attempt: get("x-retry-attempt"),
            throttle_attempt: get("x-throttle-retry-attempt"),
            client_type: get("x-modal-client-type"),
            libmodal_version: get("x-modal-libmodal-version"),
            request_bytes,
            detail: None,
            at: std::time::Instant::now(),
        });
        let (id, secret) = (get("x-modal-token-id"), get("x-modal-token-secret"));
        match (&self.token, id, secret) {
            (_, None, _) | (_, _, None) => return Err(Status::unauthenticated("missing token")),
            (Some((want_id, want_secret)), Some(id), Some(secret))
                if *want_id != id || *want_secret != secret =>
            {
                return Err(Status::unauthenticated("token not recognised"))
            }
            _ => {}
        }
        let mut sc = self.scenario.lock().unwrap();
        if let Some(limit) = &sc.rate_limit {
            let key = get("x-idempotency-key");
            if let Some(wait) = self.limiter.lock().unwrap().check(limit, method, key.as_deref()) {
                return Err(orch_modal_proto::status::throttled(
                    tonic::Code::ResourceExhausted,
                    &format!("fake: `{method}` is rate limited, slow down"),
                    wait,
                ));
            }
        }
        if let Some(max) = sc.max_request_bytes.filter(|m| request_bytes > *m) {
            // What a gRPC server answers a message over its limit.
            return Err(Status::resource_exhausted(format!(
                "fake: request of {request_bytes} bytes is larger than the {max} this server accepts"
            )));
        }
        if sc.transient_failures > 0 && method != "AuthTokenGet" {
            sc.transient_failures -= 1;
            return Err(Status::unavailable("fake: transient failure"));
        }
        if sc.throttle_sandbox_creates > 0 && method == "SandboxCreate" {
            sc.throttle_sandbox_creates -= 1;
            return Err(orch_modal_proto::status::throttled(
                tonic::Code::ResourceExhausted,
                "fake: too many sandbox creations, slow down",
                sc.throttle_after,
            ));
        }
        Ok(())
    }

    /// Note a detail on the last call of `method` (what a test may check).
    pub(super) fn note(&self, method: &str, detail: String) {
        let mut st = self.state.lock().unwrap();
        if let Some(c) = st.calls.iter_mut().rev().find(|c| c.method == method) {
            c.detail = Some(detail);
        }
    }

    pub(super) fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, Status> {
        self.state
            .lock()
            .unwrap()
            .sandboxes
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("sandbox {id} not found")))
    }
}

pub(super) fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The SHA-256 of `data` in hex, as mounts and `MountPutFile` name files.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
