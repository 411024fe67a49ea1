//! `--backend modal`: a sandbox per cell.
//!
//! Once per run, at `preflight` (before the first cell starts): the app
//! `orch` (get-or-create), the static agent as a content-addressed mount at
//! `/orch/agent`, the weights volume looked up, the image builder's version.
//! For each cell: the cell's image (built by Modal, build log into
//! `image-build.log`; a Dockerfile's context as a context mount,
//! [`crate::ops::context_mount`]; built once per run), the secrets as an
//! app-owned secret, the weights volume (read-only at `/weights`) when it
//! exists, then a sandbox running `/orch/agent run --task-b64 ... --ship` with the GPU
//! asked (`H100:8` → `GPUConfig {gpu_type: "H100", count: 8}`; `H100!` under
//! `--strict-hardware`), tagged `orch.run`/`orch.cell`. Its stdout is the
//! agent's frame stream, read until EOF and resumed from the last entry id,
//! fed to the shared [`orch_backend::home::Home`], which writes the cell's
//! files and events live; its stderr goes to `sandbox.log`.
//!
//! The cell's files (`launch.files`: a workdir, a local repository as a git
//! bundle, patches, a prompt file, `sync.paths`; see [`orch_files`]) travel
//! as a second content-addressed mount: every blob once at
//! `/orch/blobs/<sha256>` ([`orch_files::CELL_BLOBS`]), offered to Modal by
//! its digest and uploaded only when Modal lacks it (inline under 4 MiB,
//! through the blob store above: [`crate::blob`], multipart when Modal
//! asks), the mount made once per set of blobs in a run (the cells of a suite that name the same files share it). The task
//! the sandbox gets is rewritten by [`orch_files::Shipment::apply`]: its
//! paths point under `/orch/files` ([`orch_files::CELL_ROOT`]), where the
//! agent lays the files out from the blobs, checking each SHA-256, before
//! the workload runs; no host path is in it. A GPU type that
//! gets no capacity within the scheduling wait is given up for the cell's
//! next alternative (`gpu_fallback`). A sandbox that ends without a result
//! (OOM kill, terminated, timeout) is a failed cell with what came home and
//! a named cause.

use crate::client::Modal;
use crate::ops::{self, ImageSpec, MountSource, Scheduled};
use crate::proto::{self, generic_result::GenericStatus, GenericResult};
use crate::{ModalError, AGENT_PATH, APP_NAME, WEIGHTS_MOUNT};
use async_trait::async_trait;
use orch_backend::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_files::{Shipment, CELL_BLOBS, CELL_ROOT};
use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Mutex};

/// Settings of the backend beyond the connection.
#[derive(Debug, Clone)]
pub struct ModalOptions {
    pub app_name: String,
    /// The weights volume mounted read-only at `/weights` (if it exists).
    pub weights_volume: String,
    /// How long a sandbox may wait for a GPU before the next alternative is
    /// tried (`ORCH_MODAL_SCHEDULE_TIMEOUT`, seconds; default 600).
    pub schedule_timeout: Duration,
    /// CPU cores and memory requested per sandbox (Modal bills max(requested, used)).
    pub cpu: Option<f64>,
    pub memory_mb: Option<u32>,
}

impl Default for ModalOptions {
    fn default() -> Self {
        let schedule = std::env::var("ORCH_MODAL_SCHEDULE_TIMEOUT")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .unwrap_or(600.0);
        ModalOptions {
            app_name: APP_NAME.into(),
            weights_volume: crate::WEIGHTS_VOLUME.into(),
            schedule_timeout: Duration::from_secs_f64(schedule),
            cpu: None,
            memory_mb: None,
        }
    }
}

/// The mount of one set of blobs (the cell's files), shared by the cells
/// that ship the same set: its id once made.
type MountSlot = Arc<Mutex<Option<String>>>;

/// One image's build, shared by the cells that need it: (id, build seconds)
/// or the build's failure message.
type ImageSlot = Arc<Mutex<Option<Result<(String, f64), String>>>>;

#[derive(Default)]
struct Cache {
    app_id: Option<String>,
    builder_version: Option<String>,
    agent_mount: Option<String>,
    /// Weights volume id (`Some(None)`: looked up, absent).
    volume: Option<Option<String>>,
    images: HashMap<ImageSpec, ImageSlot>,
    /// The files' mounts, by the sorted digests of their blobs.
    files_mounts: HashMap<Vec<String>, MountSlot>,
}

pub struct ModalBackend {
    modal: Modal,
    agent: PathBuf,
    opts: ModalOptions,
    /// Image of each launch's `image` key.
    images: HashMap<String, ImageSpec>,
    cache: Mutex<Cache>,
}

impl ModalBackend {
    pub fn new(
        modal: Modal,
        agent: PathBuf,
        images: HashMap<String, ImageSpec>,
        opts: ModalOptions,
    ) -> ModalBackend {
        ModalBackend {
            modal,
            agent,
            opts,
            images,
            cache: Mutex::new(Cache::default()),
        }
    }

    pub fn modal(&self) -> &Modal {
        &self.modal
    }

    async fn app_id(&self) -> Result<String, ModalError> {
        let mut c = self.cache.lock().await;
        if let Some(id) = &c.app_id {
            return Ok(id.clone());
        }
        let id = ops::app(&self.modal, &self.opts.app_name).await?;
        c.app_id = Some(id.clone());
        Ok(id)
    }

    async fn agent_mount(&self, app_id: &str) -> Result<String, ModalError> {
        let mut c = self.cache.lock().await;
        if let Some(id) = &c.agent_mount {
            return Ok(id.clone());
        }
        let id = ops::mount(
            &self.modal,
            app_id,
            &[MountSource {
                remote_path: AGENT_PATH,
                local: &self.agent,
                mode: 0o755,
            }],
        )
        .await?;
        c.agent_mount = Some(id.clone());
        Ok(id)
    }

    /// The mount holding every blob of `shipment` at `/orch/blobs/<sha256>`;
    /// made once per set of blobs (cells shipping the same files wait for
    /// the first one's, and the blobs are offered to Modal once).
    async fn files_mount(&self, app_id: &str, shipment: &Shipment) -> Result<String, ModalError> {
        let blobs = shipment.blobs();
        let mut key: Vec<String> = blobs.iter().map(|(sha, _, _)| sha.to_string()).collect();
        key.sort();
        let slot = self
            .cache
            .lock()
            .await
            .files_mounts
            .entry(key)
            .or_default()
            .clone();
        let mut guard = slot.lock().await;
        if let Some(id) = guard.as_ref() {
            return Ok(id.clone());
        }
        let remote: Vec<String> = blobs
            .iter()
            .map(|(sha, _, _)| format!("{}/{sha}", CELL_BLOBS.trim_end_matches('/')))
            .collect();
        let sources: Vec<MountSource<'_>> = blobs
            .iter()
            .zip(&remote)
            .map(|((_, local, _), remote_path)| MountSource {
                remote_path,
                local,
                mode: 0o644,
            })
            .collect();
        let id = ops::mount(&self.modal, app_id, &sources).await?;
        *guard = Some(id.clone());
        Ok(id)
    }

    async fn volume(&self) -> Result<Option<String>, ModalError> {
        let mut c = self.cache.lock().await;
        if let Some(v) = &c.volume {
            return Ok(v.clone());
        }
        let v = ops::volume(&self.modal, &self.opts.weights_volume, false).await?;
        c.volume = Some(v.clone());
        Ok(v)
    }

    /// The image id; the first cell that needs an image builds it (its log
    /// goes to that cell's `image-build.log`), the others wait for it.
    async fn image(&self, spec: &ImageSpec, log_path: &std::path::Path) -> Result<(String, f64), ModalError> {
        let (slot, builder) = {
            let mut c = self.cache.lock().await;
            if c.builder_version.is_none() {
                c.builder_version = Some(ops::builder_version(&self.modal).await);
            }
            let slot = c.images.entry(spec.clone()).or_default().clone();
            (slot, c.builder_version.clone().unwrap_or_default())
        };
        let mut guard = slot.lock().await;
        if let Some(done) = guard.as_ref() {
            return match done {
                Ok((id, _)) => Ok((id.clone(), 0.0)),
                Err(m) => Err(ModalError::ImageBuild {
                    image: spec.label.clone(),
                    step: None,
                    message: m.clone(),
                }),
            };
        }
        let app_id = self.app_id().await?;
        let mut log = std::fs::File::create(log_path).ok();
        let r = ops::image(&self.modal, &app_id, spec, &builder, |text| {
            if let Some(f) = log.as_mut() {
                let _ = f.write_all(text.as_bytes());
            }
        })
        .await;
        match &r {
            Ok(b) => *guard = Some(Ok((b.image_id.clone(), b.build_s))),
            Err(ModalError::ImageBuild { message, step, .. }) => {
                *guard = Some(Err(format!(
                    "{message}{}",
                    step.as_ref()
                        .map(|s| format!(" (at step `{s}`)"))
                        .unwrap_or_default()
                )))
            }
            Err(_) => {}
        }
        r.map(|b| (b.image_id, b.build_s))
    }
}

/// The GPU alternatives of a task, in order: its `gpu`, then `gpu_fallback`.
fn gpu_choices(task: &orch_protocol::TaskSpec) -> Vec<orch_protocol::GpuRequest> {
    let mut v = vec![task.gpu.clone()];
    for g in &task.gpu_fallback {
        if !v.contains(g) {
            v.push(g.clone());
        }
    }
    v
}

/// The `orch: modal ...` line for a sandbox's end (the diagnosis rules match it).
fn note_line(f: &Failure) -> String {
    let what = match f.kind {
        FailureKind::Oom => "modal sandbox killed for running out of memory",
        FailureKind::SandboxTerminated => "modal sandbox terminated",
        FailureKind::Timeout => "modal sandbox timed out",
        FailureKind::Cancelled => "modal sandbox cancelled",
        _ => "modal sandbox failed",
    };
    format!("{what}: {}", f.message)
}

/// What a sandbox's end says, when the agent sent no result.
fn ended_without_result(result: &GenericResult, by_host: Option<Status>) -> (Status, Failure) {
    let status = GenericStatus::try_from(result.status).unwrap_or(GenericStatus::Unspecified);
    let exit_code = (result.exitcode != 0).then_some(result.exitcode);
    let detail = if result.exception.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", result.exception.trim())
    };
    let (st, kind, message) = match (by_host, status) {
        (Some(Status::Cancelled), _) => (
            Status::Cancelled,
            FailureKind::Cancelled,
            "the sandbox was terminated by orch (cancel)".to_string(),
        ),
        (Some(Status::Timeout), _) | (_, GenericStatus::Timeout) => (
            Status::Timeout,
            FailureKind::Timeout,
            format!("the sandbox timed out before the agent sent a result{detail}"),
        ),
        (
            _,
            GenericStatus::KernelOomKill
            | GenericStatus::MemoryManagerEviction
            | GenericStatus::MemoryThrashingEviction,
        ) => (
            Status::Oom,
            FailureKind::Oom,
            format!(
                "the sandbox was killed for running out of memory ({}){detail}",
                status.as_str_name()
            ),
        ),
        (_, GenericStatus::Terminated) => (
            Status::Failed,
            FailureKind::SandboxTerminated,
            format!("the sandbox was terminated before the agent sent a result{detail}"),
        ),
        (_, GenericStatus::InitFailure) => (
            Status::Failed,
            FailureKind::SandboxInitFailed,
            format!("the sandbox failed to start{detail}"),
        ),
        _ => (
            Status::Failed,
            FailureKind::SandboxFailed,
            format!(
                "the sandbox ended without a result ({}, exit code {}){detail}",
                status.as_str_name(),
                result.exitcode
            ),
        ),
    };
    (
        st,
        Failure {
            kind,
            message,
            exit_code,
            signal: None,
        },
    )
}

/// gRPC errors of `SandboxCreate` that mean "this GPU type cannot be had".
/// A `RESOURCE_EXHAUSTED` carrying a retry-after is throttling, not a
/// refusal: the client waited it out and sent the call again
/// ([`Modal::call`]); one still throttled after that is no reason to try
/// another GPU either.
fn gpu_refused(s: &tonic::Status) -> bool {
    let m = s.message().to_ascii_lowercase();
    if crate::client::retry_after(s).is_some() {
        return false;
    }
    matches!(s.code(), tonic::Code::ResourceExhausted)
        || (matches!(
            s.code(),
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition
        ) && m.contains("gpu"))
}

#[async_trait]
impl Backend for ModalBackend {
    fn name(&self) -> &'static str {
        "modal"
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        if !self.agent.is_file() {
            return Err(BackendError::Unavailable {
                backend: "modal",
                message: format!(
                    "the agent for containers `{}` does not exist",
                    self.agent.display()
                ),
                hint: "build it with `bash scripts/prepare-modal.sh`, or set `ORCH_AGENT_STATIC`".into(),
            });
        }
        // Credentials and reachability: the app is needed by every cell anyway.
        let app_id = self.app_id().await?;
        // What every cell of the run shares, made once before the first
        // starts (not while every cell of the run waits for it): the agent's
        // mount (its digest read from 25 MB, offered to Modal), the weights
        // volume looked up, the image builder's version.
        self.agent_mount(&app_id).await?;
        self.volume().await?;
        let mut c = self.cache.lock().await;
        if c.builder_version.is_none() {
            c.builder_version = Some(ops::builder_version(&self.modal).await);
        }
        Ok(())
    }

    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran {
        let cell = Cell::with_frames(launch, events)?;
        // Created now, appended to as lines come (no descriptor kept per cell).
        let sandbox_log = cell.dir.join("sandbox.log");
        std::fs::File::create(&sandbox_log).map_err(|e| BackendError::Io {
            action: "create sandbox.log".into(),
            source: e,
        })?;
        let mut sandbox = Sandbox {
            backend: self,
            log: Some(sandbox_log),
            id: None,
            label: None,
            info: Vec::new(),
            lines: None,
            out_task: None,
            err_task: None,
            waited: false,
            end_status: GenericStatus::Unspecified,
            end_code: 0,
        };
        Ok(lifecycle::drive(&mut sandbox, cell, cancel).await)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let app_id = self.app_id().await?;
        for _ in 0..50 {
            let ids = ops::sandbox_list(&self.modal, &app_id, &[("orch.run", run_id)]).await?;
            if ids.is_empty() {
                return Ok(());
            }
            for id in ids {
                let _ = ops::sandbox_terminate(&self.modal, &id).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}

/// One cell's sandbox: the modal backend's platform.
struct Sandbox<'a> {
    backend: &'a ModalBackend,
    /// `sandbox.log`, opened only to append.
    log: Option<std::path::PathBuf>,
    /// Once created (the one that runs, or the one waiting for a GPU).
    id: Option<String>,
    /// The image's label, for the record.
    label: Option<String>,
    info: Vec<(&'static str, serde_json::Value)>,
    lines: Option<mpsc::UnboundedReceiver<String>>,
    out_task: Option<tokio::task::JoinHandle<Result<(), ModalError>>>,
    err_task: Option<tokio::task::JoinHandle<()>>,
    /// The sandbox's end was waited for.
    waited: bool,
    end_status: GenericStatus,
    end_code: i32,
}

impl Sandbox<'_> {
    fn log(&mut self, line: &str) {
        if let Some(p) = self.log.as_ref() {
            let _ = orch_backend::append(p, format!("orch: {line}\n").as_bytes());
        }
    }

    /// Build (or find) the image, the agent's mount, the secret and the
    /// volume, then try the GPU alternatives in order until one is scheduled.
    async fn create(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let backend = self.backend;
        let modal = &backend.modal;
        let backend_err =
            |e: ModalError| Early::failed(FailureKind::Backend, BackendError::from(e).to_string());
        let Some(spec) = cell
            .launch
            .image
            .as_ref()
            .and_then(|k| backend.images.get(k))
            .cloned()
        else {
            return Err(Early::failed(
                FailureKind::NoImage,
                "the cell names no `image`; the modal backend needs one (`image: REF` or `image: {build: NAME}`)",
            ));
        };
        self.label = Some(spec.label.clone());
        let app_id = backend.app_id().await.map_err(backend_err)?;
        let build_log = cell.dir.join("image-build.log");
        let (image_id, build_s) = match backend.image(&spec, &build_log).await {
            Ok(v) => v,
            Err(ModalError::ImageBuild { image, step, message }) => {
                let tail: Vec<String> = std::fs::read_to_string(&build_log)
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(20)
                    .map(String::from)
                    .collect();
                let at = step
                    .as_ref()
                    .map(|s| format!(" at step `{s}`"))
                    .unwrap_or_default();
                cell.note(&format!(
                    "modal image build failed{at}: {message}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
                if let Some(s) = step {
                    self.info.push(("image_build_failed_step", s.into()));
                }
                return Err(Early::failed(
                    FailureKind::ImageBuildFailed,
                    format!("the image `{image}` did not build{at}: {message}"),
                ));
            }
            Err(e) => return Err(backend_err(e)),
        };
        self.info.push(("modal_image_id", image_id.clone().into()));
        self.info.push(("modal_image_build_s", build_s.into()));
        let mut mount_ids = vec![backend.agent_mount(&app_id).await.map_err(backend_err)?];
        let shipment = cell.launch.files.clone().filter(|s| !s.is_empty());
        if let Some(s) = &shipment {
            if !s.items.is_empty() {
                let id = backend.files_mount(&app_id, s).await.map_err(|e| {
                    Early::failed(
                        FailureKind::FilesError,
                        format!("the cell's files did not reach Modal: {}", BackendError::from(e)),
                    )
                })?;
                self.log(&format!(
                    "{} file{} ({}) in mount {id} at `{CELL_BLOBS}`",
                    s.items.len(),
                    if s.items.len() == 1 { "" } else { "s" },
                    orch_files::human_bytes(s.total_bytes())
                ));
                mount_ids.push(id);
            }
        }
        let secret_ids = if cell.launch.secrets.is_empty() {
            vec![]
        } else {
            vec![ops::secret(modal, &app_id, &cell.launch.secrets)
                .await
                .map_err(backend_err)?]
        };
        let volume = backend.volume().await.map_err(backend_err)?;
        let out_dir = format!("/tmp/orch/{}/{}", cell.task.run_id, cell.id);
        let mut tried: Vec<String> = Vec::new();
        for gpu in gpu_choices(&cell.task) {
            let mut task = cell.task.clone();
            task.gpu = gpu.clone();
            task.weights_dir = volume.as_ref().map(|_| WEIGHTS_MOUNT.to_string());
            if let Some(s) = &shipment {
                s.apply(&mut task, CELL_ROOT, CELL_BLOBS);
            }
            let definition = proto::Sandbox {
                entrypoint_args: vec![
                    AGENT_PATH.into(),
                    "run".into(),
                    "--task-b64".into(),
                    orch_backend::home::task_b64(&task),
                    "--out".into(),
                    out_dir.clone(),
                    "--ship".into(),
                ],
                mount_ids: mount_ids.clone(),
                image_id: image_id.clone(),
                secret_ids: secret_ids.clone(),
                resources: Some(proto::Resources {
                    memory_mb: backend
                        .opts
                        .memory_mb
                        .or(task.memory_limit_bytes.map(|b| (b >> 20) as u32))
                        .unwrap_or(0),
                    milli_cpu: backend.opts.cpu.map(|c| (c * 1000.0) as u32).unwrap_or(0),
                    gpu_config: ops::gpu_config(&gpu, task.strict_hardware),
                    memory_mb_max: task.memory_limit_bytes.map(|b| (b >> 20) as u32).unwrap_or(0),
                    milli_cpu_max: 0,
                }),
                // The platform's limit, and a minute for the image's start.
                timeout_secs: (lifecycle::platform_limit(&task.measure).as_secs_f64() + 60.0).ceil() as u32,
                workdir: String::new(),
                volume_mounts: volume
                    .iter()
                    .map(|v| proto::VolumeMount {
                        volume_id: v.clone(),
                        mount_path: WEIGHTS_MOUNT.into(),
                        allow_background_commits: false,
                        read_only: true,
                    })
                    .collect(),
                network_access: Some(ops::open_network()),
                name: String::new(),
            };
            let tags = [
                ("orch.run", task.run_id.as_str()),
                ("orch.cell", cell.id.as_str()),
            ];
            let asked = Instant::now();
            let id = match ops::sandbox_create(modal, &app_id, definition, &tags).await {
                Ok(id) => id,
                Err(s) if gpu_refused(&s) => {
                    self.log(&format!("GPU `{gpu}` refused by Modal: {}", s.message()));
                    tried.push(format!("{gpu} (refused: {})", s.message()));
                    continue;
                }
                Err(s) => return Err(backend_err(ModalError::rpc("SandboxCreate")(s))),
            };
            self.id = Some(id.clone());
            self.log(&format!("sandbox {id} asks for GPU `{gpu}`"));
            match ops::sandbox_scheduled(modal, &id, backend.opts.schedule_timeout)
                .await
                .map_err(backend_err)?
            {
                Scheduled::Running | Scheduled::Ended(_) => {
                    // The sandbox has its task: Modal started its container (billing
                    // starts here; a sandbox never created or scheduled costs nothing).
                    cell.container_started(std::time::SystemTime::now());
                    self.info.push(("modal_sandbox_id", id.into()));
                    self.info.push(("modal_gpu", gpu.to_string().into()));
                    self.info
                        .push(("modal_scheduling_s", asked.elapsed().as_secs_f64().into()));
                    if !tried.is_empty() {
                        self.info.push(("modal_gpus_tried", tried.into()));
                    }
                    return Ok(());
                }
                Scheduled::NotScheduled => {
                    let _ = ops::sandbox_terminate(modal, &id).await;
                    self.id = None;
                    let wait = backend.opts.schedule_timeout.as_secs_f64();
                    self.log(&format!("no `{gpu}` within {wait:.0}s; sandbox {id} terminated"));
                    tried.push(format!("{gpu} (not scheduled within {wait:.0}s)"));
                }
            }
        }
        cell.note(&format!("no GPU could be had on modal: {}", tried.join(", ")));
        self.info.push(("modal_gpus_tried", tried.clone().into()));
        Err(Early::failed(
            FailureKind::GpuUnavailable,
            format!("no GPU could be had on Modal: {}", tried.join(", ")),
        ))
    }
}

#[async_trait]
impl Platform for Sandbox<'_> {
    fn what(&self) -> &'static str {
        "the sandbox"
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        self.create(cell).await?;
        let Some(id) = self.id.clone() else {
            return Err(Early::failed(FailureKind::Backend, "no sandbox was created"));
        };
        let modal = self.backend.modal.clone();
        // Stderr (the agent's own) into sandbox.log, in the background.
        if let Some(p) = self.log.take() {
            let (modal, id) = (modal.clone(), id.clone());
            self.err_task = Some(tokio::spawn(async move {
                let _ = ops::sandbox_logs(&modal, &id, proto::FileDescriptor::Stderr, |t| {
                    let _ = orch_backend::append(&p, t.as_bytes());
                })
                .await;
            }));
        }
        // Stdout, the agent's frames, line by line.
        let (line_tx, line_rx) = mpsc::unbounded_channel::<String>();
        self.lines = Some(line_rx);
        self.out_task = Some(tokio::spawn(async move {
            let mut pending = String::new();
            let r = ops::sandbox_logs(&modal, &id, proto::FileDescriptor::Stdout, |t| {
                pending.push_str(t);
                while let Some(nl) = pending.find('\n') {
                    let line: String = pending.drain(..=nl).collect();
                    let _ = line_tx.send(line);
                }
            })
            .await;
            if !pending.is_empty() {
                let _ = line_tx.send(pending);
            }
            r
        }));
        Ok(())
    }

    async fn next_line(&mut self, _cell: &mut Cell) -> Option<String> {
        self.lines.as_mut()?.recv().await
    }

    async fn stop(&mut self, _cell: &mut Cell, _why: Stop, _kill: bool) {
        // Terminating is Modal's SIGTERM then SIGKILL after its grace.
        if let Some(id) = &self.id {
            let _ = ops::sandbox_terminate(&self.backend.modal, id).await;
        }
    }

    async fn end(&mut self, cell: &mut Cell, stopped: Option<Stop>) -> PlatformEnd {
        let modal = &self.backend.modal;
        let Some(id) = self.id.clone() else {
            return PlatformEnd::default();
        };
        let stream = match self.out_task.take() {
            Some(t) => t.await.ok(),
            None => None,
        };
        // Frames missing in the middle (a stream resumed past them): read
        // the whole log again; frames already seen are dropped by number.
        if let Some(home) = cell.stream.home() {
            if home.result().is_none() && home.gaps() {
                let mut all = String::new();
                let _ =
                    ops::sandbox_logs(modal, &id, proto::FileDescriptor::Stdout, |t| all.push_str(t)).await;
                for line in all.lines() {
                    let _ = home.line(line);
                }
            }
        }
        let recovered = cell.stream.home().and_then(|h| h.result().cloned());
        let end = match tokio::time::timeout(Duration::from_secs(120), ops::sandbox_wait(modal, &id)).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => GenericResult::default(),
            Err(_) => {
                let _ = ops::sandbox_terminate(modal, &id).await;
                GenericResult::default()
            }
        };
        if let Some(t) = self.err_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        self.waited = true;
        self.end_status = GenericStatus::try_from(end.status).unwrap_or(GenericStatus::Unspecified);
        self.end_code = end.exitcode;
        let (status, mut failure) = ended_without_result(&end, stopped.map(Stop::status));
        if let Some(Err(e)) = stream {
            failure
                .message
                .push_str(&format!(" (the log stream failed: {e})"));
        }
        // The exit status is the agent's own only where the sandbox failed by
        // itself (not terminated, timed out or killed for memory).
        let exit_code = failure
            .exit_code
            .filter(|_| failure.kind == FailureKind::SandboxFailed);
        // Modal's OOM kill is `oom`, whatever the agent managed to say;
        // other ends are Modal's words (a signal in the exit code of a
        // failed sandbox is the agent's crash).
        PlatformEnd::named(recovered, exit_code, (status, failure), &[FailureKind::Oom])
    }

    fn note_line(&self, f: &Failure) -> Option<String> {
        // Noted with their own words when they happened.
        (!matches!(
            f.kind,
            FailureKind::ImageBuildFailed | FailureKind::GpuUnavailable
        ))
        .then(|| note_line(f))
    }

    async fn finish(&mut self, _cell: &mut Cell, result: &mut CellResult) {
        for (k, v) in self.info.drain(..) {
            result.info.insert(k.into(), v);
        }
        if self.waited {
            result
                .info
                .insert("modal_exit_status".into(), self.end_status.as_str_name().into());
            result.info.insert("modal_exit_code".into(), self.end_code.into());
        }
        if let Some(label) = &self.label {
            result.info.insert("container_image".into(), label.clone().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttling_is_not_a_gpu_refusal() {
        let t = crate::client::throttled(
            tonic::Code::ResourceExhausted,
            "rate limited",
            std::time::Duration::from_secs(1),
        );
        assert!(!gpu_refused(&t));
        assert!(gpu_refused(&tonic::Status::resource_exhausted(
            "no capacity for H100"
        )));
        assert!(gpu_refused(&tonic::Status::invalid_argument("unknown GPU type")));
        assert!(!gpu_refused(&tonic::Status::invalid_argument("bad image")));
    }

    #[test]
    fn sandbox_ends_are_named() {
        let r = GenericResult {
            status: GenericStatus::KernelOomKill as i32,
            exitcode: 137,
            ..Default::default()
        };
        let (s, f) = ended_without_result(&r, None);
        assert_eq!((s, f.kind.as_str()), (Status::Oom, "oom"));
        let r = GenericResult {
            status: GenericStatus::Terminated as i32,
            ..Default::default()
        };
        assert_eq!(
            ended_without_result(&r, None).1.kind,
            FailureKind::SandboxTerminated
        );
        assert_eq!(
            ended_without_result(&r, Some(Status::Cancelled)).0,
            Status::Cancelled
        );
        let r = GenericResult {
            status: GenericStatus::Timeout as i32,
            ..Default::default()
        };
        assert_eq!(ended_without_result(&r, None).0, Status::Timeout);
    }

    #[test]
    fn gpu_refusals_are_recognised() {
        assert!(gpu_refused(&tonic::Status::resource_exhausted("no capacity")));
        assert!(gpu_refused(&tonic::Status::invalid_argument(
            "GPU type `X` unavailable"
        )));
        assert!(!gpu_refused(&tonic::Status::invalid_argument("bad image")));
    }
}
