use orch_backend_modal::proto::{
    self,
    generic_result::GenericStatus,
    modal_client_server::{ModalClient, ModalClientServer},
    GenericResult, ObjectCreationType,
};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

use crate::container;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

// Mutexes are `lock().unwrap()`ed throughout: a poisoned lock means a handler already
// panicked, and a test fake can do no better than fail the test that uses it.

type Stream<T> = Pin<Box<dyn futures_util::Stream<Item = Result<T, Status>> + Send>>;

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
}

/// One RPC the server answered.
#[derive(Debug, Clone)]
pub struct Call {
    pub method: &'static str,
    pub token_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub retry_attempt: Option<String>,
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
    pub scheduled: bool,
    pub result: Option<(i32, i32)>,
}

struct LogEntry {
    id: u64,
    fd: i32,
    data: String,
}

struct Sandbox {
    rec: Mutex<SandboxRecord>,
    created_at: f64,
    logs: Mutex<Vec<LogEntry>>,
    next_entry: AtomicU64,
    /// Bumped on every new log entry and at the end.
    changed: watch::Sender<u64>,
    result: Mutex<Option<GenericResult>>,
    pgid: Mutex<Option<i32>>,
    /// Why the host killed it, if it did.
    killed_as: Mutex<Option<GenericStatus>>,
}

impl Sandbox {
    fn push(&self, fd: i32, data: String) {
        let id = self.next_entry.fetch_add(1, Ordering::SeqCst) + 1;
        self.logs.lock().unwrap().push(LogEntry { id, fd, data });
        self.changed.send_modify(|v| *v += 1);
    }

    fn finish(&self, r: GenericResult) {
        let mut slot = self.result.lock().unwrap();
        if slot.is_none() {
            self.rec.lock().unwrap().result = Some((r.status, r.exitcode));
            *slot = Some(r);
        }
        drop(slot);
        self.changed.send_modify(|v| *v += 1);
    }

    fn done(&self) -> Option<GenericResult> {
        self.result.lock().unwrap().clone()
    }

    fn kill(&self, why: GenericStatus) {
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
struct Image {
    build: Mutex<ImageBuild>,
    /// Bumped on every build log line and at the end.
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct ImageBuild {
    log: Vec<String>,
    result: Option<GenericResult>,
    /// A request already started (or joined) the build: later ones get the result directly.
    built_once: bool,
    /// The image's root folder (`None` until built, or when the build failed).
    root: Option<PathBuf>,
    /// `ENV` of the Dockerfile.
    env: BTreeMap<String, String>,
    /// `WORKDIR` of the Dockerfile (`/` by default).
    workdir: String,
}

impl Image {
    fn log(&self, line: String) {
        self.build.lock().unwrap().log.push(line);
        self.changed.send_modify(|v| *v += 1);
    }

    fn finish(&self, result: GenericResult, root: Option<PathBuf>) {
        let mut b = self.build.lock().unwrap();
        b.result = Some(result);
        b.root = root;
        drop(b);
        self.changed.send_modify(|v| *v += 1);
    }
}

#[derive(Default)]
struct State {
    apps: HashMap<(String, String), String>,
    images: HashMap<String, Arc<Image>>,
    secrets: HashMap<String, BTreeMap<String, String>>,
    volumes: HashMap<String, String>,
    volume_dirs: HashMap<String, PathBuf>,
    mounts: HashMap<String, Vec<proto::MountFile>>,
    blobs: HashMap<String, PathBuf>,
    sandboxes: BTreeMap<String, Arc<Sandbox>>,
    calls: Vec<Call>,
}

struct Inner {
    root: PathBuf,
    /// Image reference (as in `FROM`) → root folder.
    image_roots: BTreeMap<String, PathBuf>,
    /// The NVML library GPU sandboxes get.
    nvml: Option<PathBuf>,
    token: Option<(String, String)>,
    state: Mutex<State>,
    scenario: Mutex<Scenario>,
    blob_url: String,
    ids: AtomicU64,
}

impl Inner {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{:08x}", self.ids.fetch_add(1, Ordering::SeqCst) + 1)
    }

    /// Auth, the call record and the transient-failure knob.
    fn enter<T>(&self, method: &'static str, req: &Request<T>) -> Result<(), Status> {
        let md = req.metadata();
        let get = |k: &str| md.get(k).and_then(|v| v.to_str().ok()).map(String::from);
        self.state.lock().unwrap().calls.push(Call {
            method,
            token_id: get("x-modal-token-id"),
            idempotency_key: get("x-idempotency-key"),
            retry_attempt: get("x-retry-attempt"),
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
        if sc.transient_failures > 0 && method != "AuthTokenGet" {
            sc.transient_failures -= 1;
            return Err(Status::unavailable("fake: transient failure"));
        }
        Ok(())
    }

    fn sandbox(&self, id: &str) -> Result<Arc<Sandbox>, Status> {
        self.state
            .lock()
            .unwrap()
            .sandboxes
            .get(id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("sandbox {id} not found")))
    }
}

#[derive(Clone)]
struct Svc(Arc<Inner>);

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tonic::async_trait]
impl ModalClient for Svc {
    async fn client_hello(&self, req: Request<()>) -> Result<Response<proto::ClientHelloResponse>, Status> {
        self.0.enter("ClientHello", &req)?;
        Ok(Response::new(proto::ClientHelloResponse {
            warning: String::new(),
            image_builder_version: "2025.06".into(),
        }))
    }

    async fn auth_token_get(
        &self,
        req: Request<proto::AuthTokenGetRequest>,
    ) -> Result<Response<proto::AuthTokenGetResponse>, Status> {
        self.0.enter("AuthTokenGet", &req)?;
        use base64::Engine;
        let exp = now_s() as u64 + 3600;
        let b = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let token = format!(
            "{}.{}.fake",
            b.encode(r#"{"alg":"none","typ":"JWT"}"#),
            b.encode(format!(r#"{{"exp":{exp}}}"#))
        );
        Ok(Response::new(proto::AuthTokenGetResponse { token }))
    }

    async fn environment_get_or_create(
        &self,
        req: Request<proto::EnvironmentGetOrCreateRequest>,
    ) -> Result<Response<proto::EnvironmentGetOrCreateResponse>, Status> {
        self.0.enter("EnvironmentGetOrCreate", &req)?;
        let r = req.into_inner();
        let name = if r.deployment_name.is_empty() {
            "main".to_string()
        } else {
            r.deployment_name
        };
        Ok(Response::new(proto::EnvironmentGetOrCreateResponse {
            environment_id: format!("en-{name}"),
            metadata: Some(proto::EnvironmentMetadata {
                name,
                settings: Some(proto::EnvironmentSettings {
                    image_builder_version: "2025.06".into(),
                    webhook_suffix: String::new(),
                }),
            }),
        }))
    }

    async fn app_get_or_create(
        &self,
        req: Request<proto::AppGetOrCreateRequest>,
    ) -> Result<Response<proto::AppGetOrCreateResponse>, Status> {
        self.0.enter("AppGetOrCreate", &req)?;
        let r = req.into_inner();
        let mut st = self.0.state.lock().unwrap();
        let key = (r.environment_name.clone(), r.app_name.clone());
        let id = match st.apps.get(&key) {
            Some(id) => id.clone(),
            None if r.object_creation_type == ObjectCreationType::CreateIfMissing as i32
                || r.object_creation_type == ObjectCreationType::Ephemeral as i32 =>
            {
                let id = self.0.id("ap");
                st.apps.insert(key, id.clone());
                id
            }
            None => return Err(Status::not_found(format!("app `{}` not found", r.app_name))),
        };
        Ok(Response::new(proto::AppGetOrCreateResponse { app_id: id }))
    }

    async fn image_get_or_create(
        &self,
        req: Request<proto::ImageGetOrCreateRequest>,
    ) -> Result<Response<proto::ImageGetOrCreateResponse>, Status> {
        self.0.enter("ImageGetOrCreate", &req)?;
        let r = req.into_inner();
        let image = r.image.unwrap_or_default();
        let mut key = image.dockerfile_commands.join("\n");
        for f in &image.context_files {
            key.push_str(&format!("\n{}:{}", f.filename, sha256_hex(&f.data)));
        }
        for b in &image.base_images {
            key.push_str(&format!("\nbase:{}", b.image_id));
        }
        let id = format!("im-{}", &sha256_hex(key.as_bytes())[..16]);
        let fail = self.0.scenario.lock().unwrap().build_fail.clone();
        let mut st = self.0.state.lock().unwrap();
        let (img, new) = match st.images.get(&id) {
            Some(img) => (img.clone(), false),
            None => {
                let img = Arc::new(Image {
                    build: Mutex::new(ImageBuild {
                        workdir: "/".into(),
                        ..Default::default()
                    }),
                    changed: watch::Sender::new(0),
                });
                st.images.insert(id.clone(), img.clone());
                (img, true)
            }
        };
        let base = image
            .base_images
            .first()
            .and_then(|b| st.images.get(&b.image_id).cloned());
        drop(st);
        if new {
            tokio::spawn(build_image(
                self.0.clone(),
                id.clone(),
                img.clone(),
                image,
                base,
                fail,
            ));
        }
        // The first request starts the build (no result yet: join the
        // stream); later ones find it built.
        let mut b = img.build.lock().unwrap();
        let result = if b.built_once { b.result.clone() } else { None };
        b.built_once = true;
        let workdir = b.workdir.clone();
        drop(b);
        Ok(Response::new(proto::ImageGetOrCreateResponse {
            image_id: id,
            result,
            metadata: Some(proto::ImageMetadata {
                python_version_info: "3.11.7 (fake)".into(),
                workdir,
                libc_version_info: "glibc 2.36".into(),
                image_builder_version: "2025.06".into(),
            }),
        }))
    }

    type ImageJoinStreamingStream = Stream<proto::ImageJoinStreamingResponse>;

    async fn image_join_streaming(
        &self,
        req: Request<proto::ImageJoinStreamingRequest>,
    ) -> Result<Response<Self::ImageJoinStreamingStream>, Status> {
        self.0.enter("ImageJoinStreaming", &req)?;
        let r = req.into_inner();
        let img = self
            .0
            .state
            .lock()
            .unwrap()
            .images
            .get(&r.image_id)
            .cloned()
            .ok_or_else(|| Status::not_found("image not found"))?;
        // Wait for the build's end (up to the request's timeout), then send what is there:
        // without a result the client joins again from the last entry id.
        let timeout = Duration::from_secs_f32(if r.timeout > 0.0 {
            r.timeout.min(60.0)
        } else {
            55.0
        });
        let mut rx = img.changed.subscribe();
        let _ = tokio::time::timeout(timeout, async {
            loop {
                rx.borrow_and_update();
                if img.build.lock().unwrap().result.is_some() {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let b = img.build.lock().unwrap();
        let from: usize = r.last_entry_id.parse().unwrap_or(0);
        let mut out = Vec::new();
        for (i, line) in b.log.iter().enumerate().skip(from) {
            out.push(Ok(proto::ImageJoinStreamingResponse {
                result: None,
                task_logs: vec![proto::TaskLogs {
                    data: line.clone(),
                    task_state: 0,
                    timestamp: now_s(),
                    file_descriptor: proto::FileDescriptor::Stderr as i32,
                }],
                entry_id: (i + 1).to_string(),
                eof: false,
                metadata: None,
            }));
        }
        if let Some(result) = &b.result {
            out.push(Ok(proto::ImageJoinStreamingResponse {
                result: Some(result.clone()),
                task_logs: vec![],
                entry_id: b.log.len().to_string(),
                eof: true,
                metadata: Some(proto::ImageMetadata {
                    python_version_info: "3.11.7 (fake)".into(),
                    workdir: b.workdir.clone(),
                    libc_version_info: "glibc 2.36".into(),
                    image_builder_version: "2025.06".into(),
                }),
            }));
        }
        Ok(Response::new(Box::pin(futures_util::stream::iter(out))))
    }

    async fn secret_get_or_create(
        &self,
        req: Request<proto::SecretGetOrCreateRequest>,
    ) -> Result<Response<proto::SecretGetOrCreateResponse>, Status> {
        self.0.enter("SecretGetOrCreate", &req)?;
        let r = req.into_inner();
        let id = self.0.id("st");
        self.0
            .state
            .lock()
            .unwrap()
            .secrets
            .insert(id.clone(), r.env_dict.into_iter().collect());
        Ok(Response::new(proto::SecretGetOrCreateResponse { secret_id: id }))
    }

    async fn volume_get_or_create(
        &self,
        req: Request<proto::VolumeGetOrCreateRequest>,
    ) -> Result<Response<proto::VolumeGetOrCreateResponse>, Status> {
        self.0.enter("VolumeGetOrCreate", &req)?;
        let r = req.into_inner();
        let mut st = self.0.state.lock().unwrap();
        let name = if r.deployment_name.is_empty() {
            // Ephemeral / anonymous volumes get a name of their own.
            self.0.id("anon")
        } else {
            r.deployment_name.clone()
        };
        let id = match st.volumes.get(&name) {
            Some(id) => id.clone(),
            None => {
                let creates = r.object_creation_type != ObjectCreationType::Unspecified as i32;
                let dir = self.0.root.join("volumes").join(&name);
                if !creates && !dir.is_dir() {
                    return Err(Status::not_found(format!("Volume '{name}' not found")));
                }
                std::fs::create_dir_all(&dir).map_err(|e| Status::internal(e.to_string()))?;
                let id = self.0.id("vo");
                st.volumes.insert(name, id.clone());
                st.volume_dirs.insert(id.clone(), dir);
                id
            }
        };
        Ok(Response::new(proto::VolumeGetOrCreateResponse {
            volume_id: id,
            version: proto::VolumeFsVersion::V2 as i32,
        }))
    }

    async fn volume_get_file2(
        &self,
        req: Request<proto::VolumeGetFile2Request>,
    ) -> Result<Response<proto::VolumeGetFile2Response>, Status> {
        self.0.enter("VolumeGetFile2", &req)?;
        let r = req.into_inner();
        let dir = self
            .0
            .state
            .lock()
            .unwrap()
            .volume_dirs
            .get(&r.volume_id)
            .cloned()
            .ok_or_else(|| Status::not_found("volume not found"))?;
        let rel = r.path.trim_start_matches('/');
        if rel.split('/').any(|p| p == "..") {
            return Err(Status::invalid_argument("bad path"));
        }
        let meta = std::fs::metadata(dir.join(rel))
            .map_err(|_| Status::not_found(format!("{} not found", r.path)))?;
        let base = self.0.blob_url.trim_end_matches("/blob");
        Ok(Response::new(proto::VolumeGetFile2Response {
            get_urls: vec![format!("{base}/vol/{}/{rel}", r.volume_id)],
            size: meta.len(),
            start: 0,
            len: meta.len(),
        }))
    }

    async fn mount_get_or_create(
        &self,
        req: Request<proto::MountGetOrCreateRequest>,
    ) -> Result<Response<proto::MountGetOrCreateResponse>, Status> {
        self.0.enter("MountGetOrCreate", &req)?;
        let r = req.into_inner();
        let blobs = self.0.root.join("blobs");
        for f in &r.files {
            if !blobs.join(&f.sha256_hex).is_file() {
                return Err(Status::failed_precondition(format!(
                    "file {} ({}) was not uploaded",
                    f.filename, f.sha256_hex
                )));
            }
        }
        let mut key = String::new();
        for f in &r.files {
            key.push_str(&format!("{}:{}:{}\n", f.filename, f.sha256_hex, f.mode));
        }
        let digest = sha256_hex(key.as_bytes());
        let id = format!("mo-{}", &digest[..16]);
        self.0.state.lock().unwrap().mounts.insert(id.clone(), r.files);
        Ok(Response::new(proto::MountGetOrCreateResponse {
            mount_id: id,
            handle_metadata: Some(proto::MountHandleMetadata {
                content_checksum_sha256_hex: digest,
            }),
        }))
    }

    async fn mount_put_file(
        &self,
        req: Request<proto::MountPutFileRequest>,
    ) -> Result<Response<proto::MountPutFileResponse>, Status> {
        self.0.enter("MountPutFile", &req)?;
        let r = req.into_inner();
        let dir = self.0.root.join("blobs");
        let path = dir.join(&r.sha256_hex);
        let data = match r.data_oneof {
            None => {
                return Ok(Response::new(proto::MountPutFileResponse {
                    exists: path.is_file(),
                }))
            }
            Some(proto::mount_put_file_request::DataOneof::Data(d)) => d,
            Some(proto::mount_put_file_request::DataOneof::DataBlobId(b)) => {
                let p = self
                    .0
                    .state
                    .lock()
                    .unwrap()
                    .blobs
                    .get(&b)
                    .cloned()
                    .ok_or_else(|| Status::not_found(format!("blob {b} was not uploaded")))?;
                std::fs::read(p).map_err(|e| Status::internal(e.to_string()))?
            }
        };
        if sha256_hex(&data) != r.sha256_hex {
            return Err(Status::invalid_argument("sha256 mismatch"));
        }
        write_exec(&path, &data).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(proto::MountPutFileResponse { exists: true }))
    }

    async fn blob_create(
        &self,
        req: Request<proto::BlobCreateRequest>,
    ) -> Result<Response<proto::BlobCreateResponse>, Status> {
        self.0.enter("BlobCreate", &req)?;
        let id = self.0.id("bl");
        Ok(Response::new(proto::BlobCreateResponse {
            blob_id: id.clone(),
            upload_type_oneof: Some(proto::blob_create_response::UploadTypeOneof::UploadUrl(format!(
                "{}/{id}",
                self.0.blob_url
            ))),
        }))
    }

    async fn sandbox_create(
        &self,
        req: Request<proto::SandboxCreateRequest>,
    ) -> Result<Response<proto::SandboxCreateResponse>, Status> {
        self.0.enter("SandboxCreate", &req)?;
        let r = req.into_inner();
        let def = r.definition.unwrap_or_default();
        if def.entrypoint_args.is_empty() {
            return Err(Status::invalid_argument("no entrypoint"));
        }
        let id = self.0.id("sb");
        let res = def.resources.clone().unwrap_or_default();
        let gpu = res
            .gpu_config
            .as_ref()
            .filter(|g| g.count > 0 || !g.gpu_type.is_empty())
            .map(|g| (g.gpu_type.clone(), g.count.max(1)));
        let (mount_files, mut mounts, volumes, secret_env, image) = {
            let st = self.0.state.lock().unwrap();
            let image = st
                .images
                .get(&def.image_id)
                .cloned()
                .ok_or_else(|| Status::not_found(format!("image {} not found", def.image_id)))?;
            let mut files = Vec::new();
            let mut mounts = Vec::new();
            for m in &def.mount_ids {
                let list = st
                    .mounts
                    .get(m)
                    .ok_or_else(|| Status::not_found(format!("mount {m} not found")))?;
                for f in list {
                    files.push(f.filename.clone());
                    mounts.push(container::Mount {
                        host: self.0.root.join("blobs").join(&f.sha256_hex),
                        target: f.filename.clone(),
                        read_only: true,
                    });
                }
            }
            let mut volumes = Vec::new();
            for v in &def.volume_mounts {
                let dir = st
                    .volume_dirs
                    .get(&v.volume_id)
                    .ok_or_else(|| Status::not_found(format!("volume {} not found", v.volume_id)))?;
                volumes.push((v.volume_id.clone(), v.mount_path.clone(), v.read_only));
                mounts.push(container::Mount {
                    host: dir.clone(),
                    target: v.mount_path.clone(),
                    read_only: v.read_only,
                });
            }
            let mut env = BTreeMap::new();
            for s in &def.secret_ids {
                let vars = st
                    .secrets
                    .get(s)
                    .ok_or_else(|| Status::not_found(format!("secret {s} not found")))?;
                env.extend(vars.clone());
            }
            (files, mounts, volumes, env, image)
        };
        let (image_root, mut env, image_workdir) = {
            let b = image.build.lock().unwrap();
            match (&b.result, &b.root) {
                (Some(r), Some(root)) if r.status == GenericStatus::Success as i32 => {
                    (root.clone(), b.env.clone(), b.workdir.clone())
                }
                (None, _) => {
                    return Err(Status::failed_precondition(format!(
                        "image {} is still building",
                        def.image_id
                    )))
                }
                _ => {
                    return Err(Status::failed_precondition(format!(
                        "image {} failed to build",
                        def.image_id
                    )))
                }
            }
        };
        env.extend(secret_env);
        mounts.sort_by_key(|m| m.target.len());
        let rec = SandboxRecord {
            id: id.clone(),
            app_id: r.app_id.clone(),
            tags: r
                .tags
                .iter()
                .map(|t| (t.tag_name.clone(), t.tag_value.clone()))
                .collect(),
            gpu: gpu.clone(),
            milli_cpu: res.milli_cpu,
            memory_mb: res.memory_mb,
            entrypoint: def.entrypoint_args.clone(),
            volume_mounts: volumes,
            secret_keys: {
                let mut k: Vec<String> = def
                    .secret_ids
                    .iter()
                    .filter_map(|id| self.0.state.lock().unwrap().secrets.get(id).cloned())
                    .flat_map(|vars| vars.into_keys())
                    .collect();
                k.sort();
                k.dedup();
                k
            },
            mount_files,
            timeout_secs: def.timeout_secs,
            scheduled: false,
            result: None,
        };
        let (tx, _) = watch::channel(0u64);
        let sb = Arc::new(Sandbox {
            rec: Mutex::new(rec),
            created_at: now_s(),
            logs: Mutex::new(Vec::new()),
            next_entry: AtomicU64::new(0),
            changed: tx,
            result: Mutex::new(None),
            pgid: Mutex::new(None),
            killed_as: Mutex::new(None),
        });
        self.0
            .state
            .lock()
            .unwrap()
            .sandboxes
            .insert(id.clone(), sb.clone());
        let sc = self.0.scenario.lock().unwrap().clone();
        let unavailable = gpu.as_ref().is_some_and(|(t, _)| {
            let t = t.trim_end_matches('!');
            sc.unavailable_gpus.iter().any(|u| u.eq_ignore_ascii_case(t))
        });
        if !unavailable {
            let args = def.entrypoint_args.clone();
            let gpu = match (&self.0.nvml, &gpu) {
                (Some(lib), Some((_, n))) => Some(container::Gpu {
                    nvml_lib: lib.clone(),
                    visible_devices: (0..*n).map(|i| i.to_string()).collect::<Vec<_>>().join(","),
                }),
                _ => None,
            };
            let spec = container::Spec {
                root: image_root,
                mounts,
                gpu,
                workdir: if def.workdir.is_empty() {
                    image_workdir
                } else {
                    def.workdir.clone()
                },
                layer: Some(self.0.root.join("sandboxes").join(&id).join("layer")),
            };
            let cell = sb
                .rec
                .lock()
                .unwrap()
                .tags
                .get("orch.cell")
                .cloned()
                .unwrap_or_default();
            let hit = |list: &[String]| {
                list.iter()
                    .any(|p| cell.contains(p.as_str()) || args.iter().any(|a| a.contains(p.as_str())))
            };
            let kill = if hit(&sc.oom) {
                Some((GenericStatus::KernelOomKill, sc.kill_after))
            } else if hit(&sc.terminate) {
                Some((GenericStatus::Terminated, sc.kill_after))
            } else {
                None
            };
            tokio::spawn(run_sandbox(sb, spec, args, env, def.timeout_secs, kill));
        }
        Ok(Response::new(proto::SandboxCreateResponse { sandbox_id: id }))
    }

    async fn sandbox_get_task_id(
        &self,
        req: Request<proto::SandboxGetTaskIdRequest>,
    ) -> Result<Response<proto::SandboxGetTaskIdResponse>, Status> {
        self.0.enter("SandboxGetTaskId", &req)?;
        let r = req.into_inner();
        let sb = self.0.sandbox(&r.sandbox_id)?;
        let deadline = Instant::now() + Duration::from_secs_f32(r.timeout.clamp(0.0, 60.0));
        let mut rx = sb.changed.subscribe();
        loop {
            let scheduled = sb.rec.lock().unwrap().scheduled;
            let done = sb.done();
            if scheduled || done.is_some() {
                return Ok(Response::new(proto::SandboxGetTaskIdResponse {
                    task_id: if scheduled {
                        format!("ta-{}", r.sandbox_id)
                    } else {
                        String::new()
                    },
                    task_result: if scheduled { None } else { done },
                }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Response::new(proto::SandboxGetTaskIdResponse::default()));
            }
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
    }

    type SandboxGetLogsStream = Stream<proto::TaskLogsBatch>;

    async fn sandbox_get_logs(
        &self,
        req: Request<proto::SandboxGetLogsRequest>,
    ) -> Result<Response<Self::SandboxGetLogsStream>, Status> {
        self.0.enter("SandboxGetLogs", &req)?;
        let r = req.into_inner();
        let sb = self.0.sandbox(&r.sandbox_id)?;
        let drop_streams = self.0.scenario.lock().unwrap().drop_log_streams;
        let timeout = Duration::from_secs_f32(if r.timeout > 0.0 {
            r.timeout.min(300.0)
        } else {
            55.0
        });
        let start: u64 = r.last_entry_id.parse().unwrap_or(0);
        let fd = if r.file_descriptor == 0 {
            proto::FileDescriptor::Stdout as i32
        } else {
            r.file_descriptor
        };
        let id = r.sandbox_id.clone();
        let rx = sb.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        let state = (sb, rx, start, false);
        let stream = futures_util::stream::unfold(state, move |(sb, mut rx, last, ended)| {
            let id = id.clone();
            async move {
                if ended {
                    return None;
                }
                loop {
                    // Mark what we have seen before reading, so a change after
                    // the read wakes us.
                    rx.borrow_and_update();
                    let done = sb.done().is_some();
                    let (items, top) = {
                        let logs = sb.logs.lock().unwrap();
                        let mut top = last;
                        let mut items = Vec::new();
                        for e in logs.iter().filter(|e| e.id > last) {
                            top = e.id;
                            if e.fd == fd {
                                items.push(proto::TaskLogs {
                                    data: e.data.clone(),
                                    task_state: proto::TaskState::Active as i32,
                                    timestamp: now_s(),
                                    file_descriptor: fd,
                                });
                            }
                        }
                        (items, top)
                    };
                    if !items.is_empty() || (done && top > last) {
                        let batch = proto::TaskLogsBatch {
                            task_id: format!("ta-{id}"),
                            items,
                            entry_id: top.to_string(),
                            app_done: false,
                            image_id: String::new(),
                            eof: false,
                            sandbox_id: id.clone(),
                        };
                        return Some((Ok(batch), (sb, rx, top, drop_streams)));
                    }
                    if done {
                        let batch = proto::TaskLogsBatch {
                            task_id: format!("ta-{id}"),
                            items: vec![],
                            entry_id: last.to_string(),
                            app_done: true,
                            image_id: String::new(),
                            eof: true,
                            sandbox_id: id.clone(),
                        };
                        return Some((Ok(batch), (sb, rx, last, true)));
                    }
                    if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                        return None;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn sandbox_wait(
        &self,
        req: Request<proto::SandboxWaitRequest>,
    ) -> Result<Response<proto::SandboxWaitResponse>, Status> {
        self.0.enter("SandboxWait", &req)?;
        let r = req.into_inner();
        let sb = self.0.sandbox(&r.sandbox_id)?;
        let mut rx = sb.changed.subscribe();
        let deadline = Instant::now() + Duration::from_secs_f32(r.timeout.clamp(0.0, 60.0));
        loop {
            if let Some(res) = sb.done() {
                return Ok(Response::new(proto::SandboxWaitResponse { result: Some(res) }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Response::new(proto::SandboxWaitResponse { result: None }));
            }
            let _ = tokio::time::timeout(left, rx.changed()).await;
        }
    }

    async fn sandbox_terminate(
        &self,
        req: Request<proto::SandboxTerminateRequest>,
    ) -> Result<Response<proto::SandboxTerminateResponse>, Status> {
        self.0.enter("SandboxTerminate", &req)?;
        let r = req.into_inner();
        let sb = self.0.sandbox(&r.sandbox_id)?;
        let existing = sb.done();
        if existing.is_none() {
            sb.kill(GenericStatus::Terminated);
        }
        Ok(Response::new(proto::SandboxTerminateResponse {
            existing_result: existing,
        }))
    }

    async fn sandbox_list(
        &self,
        req: Request<proto::SandboxListRequest>,
    ) -> Result<Response<proto::SandboxListResponse>, Status> {
        self.0.enter("SandboxList", &req)?;
        let r = req.into_inner();
        let st = self.0.state.lock().unwrap();
        let mut out = Vec::new();
        for sb in st.sandboxes.values() {
            let rec = sb.rec.lock().unwrap();
            if !r.app_id.is_empty() && rec.app_id != r.app_id {
                continue;
            }
            if !r.include_finished && sb.done().is_some() {
                continue;
            }
            if r.before_timestamp > 0.0 && sb.created_at >= r.before_timestamp {
                continue;
            }
            if !r
                .tags
                .iter()
                .all(|t| rec.tags.get(&t.tag_name) == Some(&t.tag_value))
            {
                continue;
            }
            out.push(proto::SandboxInfo {
                id: rec.id.clone(),
                created_at: sb.created_at,
                app_id: rec.app_id.clone(),
                tags: rec
                    .tags
                    .iter()
                    .map(|(k, v)| proto::SandboxTag {
                        tag_name: k.clone(),
                        tag_value: v.clone(),
                    })
                    .collect(),
            });
        }
        Ok(Response::new(proto::SandboxListResponse { sandboxes: out }))
    }
}

/// `Step N/M : ...` failed: what the build log says after it.
type StepError = Vec<String>;

/// Builds an image as Modal's builder would, here: `FROM` picks the root folder the builder
/// maps the reference to (`scratch`: an empty one; no root: the build fails, as a pull of an
/// image the registry does not have does), a layered image starts from its base image's root,
/// `COPY`/`ADD` copy context files, `RUN` runs in the image's root as a container (so a step
/// fails as it would there), `ENV` and `WORKDIR` are kept for the image's sandboxes; other
/// instructions are recorded only. The root is copied to `ROOT/images/ID/rootfs` before the
/// first step that changes it: mapped roots never change.
async fn build_image(
    inner: Arc<Inner>,
    id: String,
    img: Arc<Image>,
    image: proto::Image,
    base: Option<Arc<Image>>,
    fail: Option<String>,
) {
    let failed = |img: &Image, lines: StepError| {
        for l in lines {
            img.log(l);
        }
        img.finish(
            GenericResult {
                status: GenericStatus::Failure as i32,
                exception: format!("Image build for {id} failed. See build logs for more details."),
                exitcode: 1,
                ..Default::default()
            },
            None,
        );
    };
    let mut b = Build {
        root: None,
        own: None,
        rootfs: inner.root.join("images").join(&id).join("rootfs"),
        env: BTreeMap::new(),
        workdir: "/".into(),
    };
    if let Some(base) = base {
        let mut rx = base.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if base.build.lock().unwrap().result.is_some() || rx.changed().await.is_err() {
                break;
            }
        }
        let bb = base.build.lock().unwrap();
        match &bb.root {
            Some(r) => {
                b.root = Some(r.clone());
                b.env = bb.env.clone();
                b.workdir = bb.workdir.clone();
            }
            None => {
                drop(bb);
                failed(&img, vec!["ERROR: the base image did not build\n".into()]);
                return;
            }
        }
    }
    let context: BTreeMap<String, Vec<u8>> = image
        .context_files
        .into_iter()
        .map(|f| (f.filename.trim_start_matches("./").to_string(), f.data))
        .collect();
    let n = image.dockerfile_commands.len();
    for (i, c) in image.dockerfile_commands.iter().enumerate() {
        img.log(format!("Step {}/{} : {}\n", i + 1, n, c));
        if fail.as_deref().is_some_and(|f| c.contains(f)) {
            failed(
                &img,
                vec![format!(
                    "ERROR: process \"/bin/sh -c {}\" did not complete successfully: exit code: 1\n",
                    c.trim_start_matches("RUN ")
                )],
            );
            return;
        }
        let (instr, rest) = c.trim().split_once(char::is_whitespace).unwrap_or((c.trim(), ""));
        let rest = rest.trim();
        let r = match instr.to_ascii_uppercase().as_str() {
            "FROM" => b.from(&inner, rest),
            "COPY" | "ADD" => b.copy(rest, &context).await,
            "RUN" => b.run(&img, rest).await,
            "ENV" => {
                b.set_env(rest);
                Ok(())
            }
            "WORKDIR" => {
                b.workdir = abs(&b.workdir, rest);
                Ok(())
            }
            // LABEL, ARG, EXPOSE, CMD, ENTRYPOINT, USER, ...: nothing a sandbox sees here.
            _ => Ok(()),
        };
        match r {
            Ok(()) => img.log(" ---> done\n".into()),
            Err(lines) => {
                failed(&img, lines);
                return;
            }
        }
    }
    let root = match b.own.clone().or(b.root.clone()) {
        Some(r) => r,
        None => match b.materialize().await {
            Ok(r) => r,
            Err(e) => {
                failed(&img, e);
                return;
            }
        },
    };
    {
        let mut bb = img.build.lock().unwrap();
        bb.env = b.env;
        bb.workdir = b.workdir;
    }
    img.finish(
        GenericResult {
            status: GenericStatus::Success as i32,
            ..Default::default()
        },
        Some(root),
    );
}

/// A container path from a Dockerfile (absolute, or relative to the working folder).
fn abs(workdir: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{}/{p}", workdir.trim_end_matches('/'))
    }
}

/// Shell-like words: whitespace-separated, double or single quotes grouping.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => {
                quote = Some(ch);
                any = true;
            }
            (_, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (_, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The state of one image build.
struct Build {
    /// The root the image starts from (a mapped folder or a base image's).
    root: Option<PathBuf>,
    /// The image's own copy, once a step changed it.
    own: Option<PathBuf>,
    rootfs: PathBuf,
    env: BTreeMap<String, String>,
    workdir: String,
}

impl Build {
    fn from(&mut self, inner: &Inner, rest: &str) -> Result<(), StepError> {
        let reference = rest
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or_default()
            .to_string();
        self.own = None;
        self.env.clear();
        self.workdir = "/".into();
        if reference == "scratch" {
            self.root = None;
            return Ok(());
        }
        let full = container::normalize_image(&reference);
        let found = inner.image_roots.get(&reference).or_else(|| {
            inner
                .image_roots
                .iter()
                .find(|(k, _)| container::normalize_image(k) == full)
                .map(|(_, v)| v)
        });
        match found {
            Some(r) => {
                self.root = Some(r.clone());
                Ok(())
            }
            None => Err(vec![
                format!("ERROR: failed to resolve source metadata for {full}: {full}: not found\n"),
                format!("fake-modal: no root folder is mapped to `{reference}` (FakeModalBuilder::image)\n"),
            ]),
        }
    }

    /// The image's own root, copied from where it starts the first time.
    async fn materialize(&mut self) -> Result<PathBuf, StepError> {
        if let Some(o) = &self.own {
            return Ok(o.clone());
        }
        let (from, to) = (self.root.clone(), self.rootfs.clone());
        let r = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&to);
            std::fs::create_dir_all(&to)?;
            if let Some(from) = from {
                copy_tree(&from, &to)?;
            }
            Ok(())
        })
        .await;
        match r {
            Ok(Ok(())) => {
                self.own = Some(self.rootfs.clone());
                Ok(self.rootfs.clone())
            }
            Ok(Err(e)) => Err(vec![format!("ERROR: cannot prepare the image's root: {e}\n")]),
            Err(e) => Err(vec![format!("ERROR: cannot prepare the image's root: {e}\n")]),
        }
    }

    async fn copy(&mut self, rest: &str, context: &BTreeMap<String, Vec<u8>>) -> Result<(), StepError> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut args: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str(rest).map_err(|e| vec![format!("ERROR: bad JSON in `{rest}`: {e}\n")])?
        } else {
            words(rest)
        };
        let mut chmod = None;
        let mut flags = Vec::new();
        args.retain(|a| {
            if a.starts_with("--") {
                flags.push(a.clone());
                false
            } else {
                true
            }
        });
        for f in flags {
            if let Some(m) = f.strip_prefix("--chmod=") {
                chmod = u32::from_str_radix(m, 8).ok();
            } else if f.starts_with("--from") {
                return Err(vec![format!(
                    "ERROR: fake-modal builds no multi-stage images ({f})\n"
                )]);
            }
        }
        if args.len() < 2 {
            return Err(vec!["ERROR: COPY requires at least two arguments\n".into()]);
        }
        let Some(dst) = args.pop() else {
            return Err(vec!["ERROR: COPY requires at least two arguments\n".into()]);
        };
        let root = self.materialize().await?;
        let many = args.len() > 1;
        for src in &args {
            if src.contains("://") {
                return Err(vec![format!("ERROR: fake-modal does not download `{src}`\n")]);
            }
            let s = src.trim_start_matches("./").trim_end_matches('/');
            let s = if s == "." { "" } else { s };
            let matches: Vec<(&String, &Vec<u8>)> = context
                .iter()
                .filter(|(name, _)| s.is_empty() || *name == s || name.starts_with(&format!("{s}/")))
                .collect();
            if matches.is_empty() {
                return Err(vec![format!(
                    "ERROR: failed to compute cache key: failed to calculate checksum of ref: \"/{s}\": not found\n"
                )]);
            }
            for (name, data) in matches {
                let from_dir = s.is_empty() || name.as_str() != s;
                let rel = if s.is_empty() {
                    name.as_str()
                } else if from_dir {
                    &name[s.len() + 1..]
                } else {
                    name.rsplit('/').next().unwrap_or(name)
                };
                let dst_abs = abs(&self.workdir, &dst);
                let into_dir = dst.ends_with('/')
                    || many
                    || from_dir
                    || container::host_path(&root, &dst_abs).is_ok_and(|p| p.is_dir());
                let target = if into_dir {
                    format!("{}/{rel}", dst_abs.trim_end_matches('/'))
                } else {
                    dst_abs
                };
                let host = container::host_path(&root, &target)
                    .map_err(|e| vec![format!("ERROR: {target}: {e}\n")])?;
                let mode = chmod.unwrap_or(if data.starts_with(b"\x7fELF") || data.starts_with(b"#!") {
                    0o755
                } else {
                    0o644
                });
                let write = || -> std::io::Result<()> {
                    if let Some(d) = host.parent() {
                        std::fs::create_dir_all(d)?;
                    }
                    std::fs::write(&host, data)?;
                    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode))
                };
                write().map_err(|e| vec![format!("ERROR: copy to {target}: {e}\n")])?;
            }
        }
        Ok(())
    }

    async fn run(&mut self, img: &Image, rest: &str) -> Result<(), StepError> {
        let argv: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str(rest).map_err(|e| vec![format!("ERROR: bad JSON in `{rest}`: {e}\n")])?
        } else {
            vec!["/bin/sh".into(), "-c".into(), rest.to_string()]
        };
        let shown = if rest.starts_with('[') {
            argv.join(" ")
        } else {
            format!("/bin/sh -c {rest}")
        };
        if !container::supported() {
            return Err(vec![format!(
                "ERROR: process \"{shown}\": fake-modal runs RUN steps in a container, which needs root here\n"
            )]);
        }
        let root = self.materialize().await?;
        let mut spec = container::Spec::new(root);
        spec.workdir = self.workdir.clone();
        let out = match container::command(&spec, &argv, &self.env) {
            Ok(mut cmd) => {
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                cmd.output().await
            }
            Err(e) => Err(e),
        };
        let out = out.map_err(|e| {
            vec![format!(
                "ERROR: process \"{shown}\" did not complete successfully: exec: \"{}\": {e}\n",
                argv.first().map(String::as_str).unwrap_or_default()
            )]
        })?;
        for stream in [&out.stdout, &out.stderr] {
            for l in String::from_utf8_lossy(stream).lines() {
                img.log(format!("{l}\n"));
            }
        }
        if !out.status.success() {
            use std::os::unix::process::ExitStatusExt as _;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
            return Err(vec![format!(
                "ERROR: process \"{shown}\" did not complete successfully: exit code: {code}\n"
            )]);
        }
        Ok(())
    }

    /// `ENV K=V K2="v 2"` or the legacy `ENV K value with spaces`.
    fn set_env(&mut self, rest: &str) {
        let first = rest.split_whitespace().next().unwrap_or_default();
        if first.contains('=') {
            for w in words(rest) {
                if let Some((k, v)) = w.split_once('=') {
                    self.env.insert(k.to_string(), v.to_string());
                }
            }
        } else if let Some((k, v)) = rest.split_once(char::is_whitespace) {
            self.env.insert(k.to_string(), v.trim().to_string());
        }
    }
}

/// A copy of a folder tree: files (with their modes), folders and symbolic links as they are.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if t.is_dir() {
            std::fs::create_dir_all(&dst)?;
            std::fs::set_permissions(&dst, std::fs::metadata(&src)?.permissions())?;
            copy_tree(&src, &dst)?;
        } else if t.is_file() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

fn write_exec(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(tmp, path)
}

async fn run_sandbox(
    sb: Arc<Sandbox>,
    spec: container::Spec,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    timeout_secs: u32,
    kill: Option<(GenericStatus, Duration)>,
) {
    sb.rec.lock().unwrap().scheduled = true;
    sb.changed.send_modify(|v| *v += 1);
    let spawned = container::command(&spec, &args, &env).and_then(|mut cmd| {
        cmd.stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        cmd.spawn()
    });
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            sb.push(
                proto::FileDescriptor::Stderr as i32,
                format!("fake-modal: cannot start `{}`: {e}\n", args[0]),
            );
            sb.finish(GenericResult {
                status: GenericStatus::InitFailure as i32,
                exception: format!("cannot start the entrypoint: {e}"),
                ..Default::default()
            });
            return;
        }
    };
    *sb.pgid.lock().unwrap() = child.id().map(|p| p as i32);
    let pump = |r: Option<tokio::process::ChildStdout>,
                e: Option<tokio::process::ChildStderr>,
                sb: Arc<Sandbox>| async move {
        let fd_out = proto::FileDescriptor::Stdout as i32;
        let fd_err = proto::FileDescriptor::Stderr as i32;
        let a = async {
            if let Some(r) = r {
                read_lines(tokio::io::BufReader::new(r), fd_out, &sb).await;
            }
        };
        let b = async {
            if let Some(e) = e {
                read_lines(tokio::io::BufReader::new(e), fd_err, &sb).await;
            }
        };
        tokio::join!(a, b);
    };
    let io = tokio::spawn(pump(child.stdout.take(), child.stderr.take(), sb.clone()));
    if let Some((why, after)) = kill {
        let sb2 = sb.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            if sb2.done().is_none() {
                sb2.kill(why);
            }
        });
    }
    let limit = if timeout_secs == 0 { 300 } else { timeout_secs };
    let status = match tokio::time::timeout(Duration::from_secs(u64::from(limit)), child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            sb.kill(GenericStatus::Timeout);
            child.wait().await.ok()
        }
    };
    let _ = io.await;
    let code = status.and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().or(s.signal().map(|g| 128 + g))
    });
    let killed = *sb.killed_as.lock().unwrap();
    let r = match killed {
        Some(why) => GenericResult {
            status: why as i32,
            exitcode: code.unwrap_or(137),
            exception: match why {
                GenericStatus::KernelOomKill => "Sandbox was killed by the kernel OOM killer".into(),
                GenericStatus::Timeout => "Sandbox timed out".into(),
                _ => "Sandbox was terminated".into(),
            },
            ..Default::default()
        },
        None if code == Some(0) => GenericResult {
            status: GenericStatus::Success as i32,
            ..Default::default()
        },
        None => GenericResult {
            status: GenericStatus::Failure as i32,
            exitcode: code.unwrap_or(-1),
            exception: format!("Sandbox exited with code {}", code.unwrap_or(-1)),
            ..Default::default()
        },
    };
    sb.finish(r);
}

async fn read_lines<R: tokio::io::AsyncBufRead + Unpin>(mut r: R, fd: i32, sb: &Sandbox) {
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => sb.push(fd, String::from_utf8_lossy(&buf).into_owned()),
        }
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

    /// The NVML library (`orch_testkit::gpu::nvml_stub()`, or any file) that GPU sandboxes
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

/// `PUT /blob/ID` with `Content-Length` (and `Content-MD5` checked when given).
fn serve_blobs(listener: std::net::TcpListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let inner = inner.clone();
        std::thread::spawn(move || {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
                if head.len() > 64 * 1024 {
                    return;
                }
            }
            let text = String::from_utf8_lossy(&head).to_string();
            let mut lines = text.split("\r\n");
            let first = lines.next().unwrap_or_default().to_string();
            let mut len = 0usize;
            let mut md5 = None;
            for l in lines {
                if let Some((k, v)) = l.split_once(':') {
                    match k.trim().to_ascii_lowercase().as_str() {
                        "content-length" => len = v.trim().parse().unwrap_or(0),
                        "content-md5" => md5 = Some(v.trim().to_string()),
                        _ => {}
                    }
                }
            }
            let mut body = vec![0u8; len];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let parts: Vec<&str> = first.split_whitespace().collect();
            if parts.first() == Some(&"GET") {
                let path = parts.get(1).copied().unwrap_or_default();
                let data = path.strip_prefix("/vol/").and_then(|rest| {
                    let (vid, rel) = rest.split_once('/')?;
                    if rel.split('/').any(|p| p == "..") {
                        return None;
                    }
                    let dir = inner.state.lock().unwrap().volume_dirs.get(vid).cloned()?;
                    std::fs::read(dir.join(rel)).ok()
                });
                match data {
                    Some(d) => {
                        let _ = write!(
                            s,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            d.len()
                        );
                        let _ = s.write_all(&d);
                    }
                    None => {
                        let _ = write!(
                            s,
                            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                    }
                }
                return;
            }
            let ok = parts.first() == Some(&"PUT")
                && parts.get(1).is_some_and(|p| p.starts_with("/blob/"))
                && md5.as_ref().is_none_or(|m| {
                    use base64::Engine;
                    use md5::Digest;
                    *m == base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body))
                });
            let status = if ok {
                let id = parts[1].trim_start_matches("/blob/").to_string();
                let path = inner.root.join("uploads").join(&id);
                let _ = std::fs::create_dir_all(inner.root.join("uploads"));
                if std::fs::write(&path, &body).is_ok() {
                    inner.state.lock().unwrap().blobs.insert(id, path);
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                }
            } else {
                "400 Bad Request"
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_backend_modal::ops::{self, ImageSpec, MountSource};
    use orch_backend_modal::{Credentials, Modal, ModalError};

    fn client(fake: &FakeModal) -> Modal {
        Modal::connect(Credentials {
            token_id: "ak-t".into(),
            token_secret: "as-t".into(),
            server_url: fake.url().into(),
            environment: String::new(),
            source: "test".into(),
        })
        .unwrap()
    }

    async fn build(m: &Modal, app: &str, spec: &ImageSpec) -> (Result<String, ModalError>, String) {
        let mut log = String::new();
        let r = ops::image(m, app, spec, "2025.06", |l| log.push_str(l)).await;
        (r.map(|b| b.image_id), log)
    }

    /// Runs `sh -c SCRIPT` in a sandbox of `image`: (exit status, stdout).
    async fn sandbox(
        m: &Modal,
        app: &str,
        image: &str,
        script: &str,
        extra: proto::Sandbox,
    ) -> (i32, String) {
        let def = proto::Sandbox {
            entrypoint_args: vec!["sh".into(), "-c".into(), script.into()],
            image_id: image.into(),
            timeout_secs: 60,
            ..extra
        };
        let id = ops::sandbox_create(m, app, def, &[]).await.unwrap();
        let mut out = String::new();
        ops::sandbox_logs(m, &id, proto::FileDescriptor::Stdout, |c| out.push_str(c))
            .await
            .unwrap();
        let r = ops::sandbox_wait(m, &id).await.unwrap();
        (r.status, out)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn images_build_in_their_roots_and_sandboxes_see_only_them() {
        if !container::available_or_skip("the fake Modal's sandboxes") {
            return;
        }
        let busybox_bin = container::host_busybox().unwrap();
        let lib = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(lib.path(), "stub-nvml").unwrap();
        let fake = FakeModal::builder()
            .image("debian:bookworm-slim", container::busybox_root().unwrap())
            .nvml_stub(lib.path())
            .start()
            .unwrap();
        let m = client(&fake);
        let app = ops::app(&m, "t").await.unwrap();

        // A registry image the fake has no root for does not build, naming the step.
        let (r, log) = build(&m, &app, &ImageSpec::registry("nosuch/image:v9")).await;
        match r {
            Err(ModalError::ImageBuild { step, .. }) => {
                assert_eq!(step.as_deref(), Some("FROM nosuch/image:v9"), "{log}")
            }
            other => panic!("{other:?}\n{log}"),
        }
        assert!(log.contains("docker.io/nosuch/image:v9: not found"), "{log}");

        // A RUN step runs in the image: python is not in a busybox image.
        let spec = ImageSpec::dockerfile("py", "FROM debian:bookworm-slim\nRUN python3 -c 1\n", vec![]);
        let (r, log) = build(&m, &app, &spec).await;
        assert!(matches!(r, Err(ModalError::ImageBuild { .. })), "{log}");
        assert!(log.contains("exit code: 127"), "{log}");

        // FROM scratch + COPY + RUN + ENV + WORKDIR, as containers/quickstart builds.
        let ctx = tempfile::tempdir().unwrap();
        std::fs::copy(&busybox_bin, ctx.path().join("busybox")).unwrap();
        let spec = ImageSpec::dockerfile(
            "qs",
            "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\nENV PATH=/bin GREETING=\"hi there\"\nWORKDIR /work\n",
            vec![("busybox".into(), ctx.path().join("busybox"))],
        );
        let (r, log) = build(&m, &app, &spec).await;
        let qs = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
        assert!(log.contains("Step 3/5 : RUN"), "{log}");

        let file = ctx.path().join("note.txt");
        std::fs::write(&file, "mounted-file").unwrap();
        let mount = ops::mount(
            &m,
            &app,
            &[MountSource {
                remote_path: "/orch/note.txt",
                local: &file,
                mode: 0o644,
            }],
        )
        .await
        .unwrap();
        let vol = ops::volume(&m, "v", true).await.unwrap().unwrap();
        std::fs::write(fake.volume_dir("v").join("in-volume"), "x").unwrap();
        let script = "echo \"path=$PATH greet=$GREETING pwd=$(pwd) home=$HOME\"; cat /orch/note.txt; echo; ls /data; \
            test -e /root/.cargo && echo LEAK; test -e /work/main && echo LEAK; echo \"gpu=${NVIDIA_VISIBLE_DEVICES-none}\"; \
            echo w > /data/out; echo z > /orch/note.txt || echo read-only-mount";
        let (status, out) = sandbox(
            &m,
            &app,
            &qs,
            script,
            proto::Sandbox {
                mount_ids: vec![mount],
                volume_mounts: vec![proto::VolumeMount {
                    volume_id: vol,
                    mount_path: "/data".into(),
                    allow_background_commits: false,
                    read_only: false,
                }],
                ..Default::default()
            },
        )
        .await;
        assert_eq!(status, GenericStatus::Success as i32, "{out}");
        assert!(
            out.starts_with("path=/bin greet=hi there pwd=/work home=/root\nmounted-file\nin-volume\n"),
            "{out}"
        );
        assert!(
            !out.contains("LEAK") && out.contains("gpu=none") && out.contains("read-only-mount"),
            "{out}"
        );
        assert_eq!(
            std::fs::read_to_string(fake.volume_dir("v").join("out")).unwrap(),
            "w\n"
        );

        // A GPU sandbox: the library and its devices.
        let deb = ops::image(
            &m,
            &app,
            &ImageSpec::registry("debian:bookworm-slim"),
            "2025.06",
            |_| {},
        )
        .await
        .unwrap()
        .image_id;
        let (status, out) = sandbox(
            &m,
            &app,
            &deb,
            "echo \"gpu=$NVIDIA_VISIBLE_DEVICES\"; cat /usr/lib64/libnvidia-ml.so.1",
            proto::Sandbox {
                resources: Some(proto::Resources {
                    gpu_config: ops::gpu_config("H100:2", false),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await;
        assert_eq!(status, GenericStatus::Success as i32, "{out}");
        assert_eq!(out, "gpu=0,1\nstub-nvml");
        // The mapped root did not change.
        assert!(!container::busybox_root()
            .unwrap()
            .join("usr/lib64/libnvidia-ml.so.1")
            .exists());
    }
}
