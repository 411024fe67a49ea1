//! The `docker` backend: one container per cell, through the Docker Engine API.
//!
//! - the image is any image (a stock `vllm/vllm-openai` works): the agent is a
//!   static binary bind-mounted read-only at `/orch/agent` and used as the
//!   entrypoint, so images with an old glibc, or none, run it;
//! - the cell folder is bind-mounted at `/orch/cell`: the agent writes the
//!   workload's `stdout.log`/`stderr.log` and `agent-result.json` there while the
//!   container runs, so logs outlive the container;
//! - the container's stdout is the agent's event stream, its stderr goes to
//!   `agent.log`;
//! - GPUs become an NVIDIA device request (device ids when the runner
//!   assigned them, else a count) with host IPC and unlimited memlock, fit
//!   for NCCL; `none` asks for no GPU;
//! - the weights volume (`orch-weights`, filled by `orch setup --backend
//!   docker`) is mounted read-only at `/weights` with `HF_HUB_CACHE` set;
//! - the files a cell names (workdir, patches, prompt file, a local repo as
//!   a git bundle, `sync:` paths) travel as the host cache's folder of
//!   content-addressed blobs, bind-mounted read-only at `/orch/blobs`; the
//!   task names their places under `/orch/files` (a tmpfs any user may
//!   write), where the agent copies them and checks each digest
//!   (`orch-files`);
//! - secrets are container environment only;
//! - labels `orch.run` and `orch.cell` mark every container; a container is
//!   removed once its result is stored (unless `keep`), and `cleanup` removes
//!   whatever a run left.

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use orch_backend::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

pub use orch_backend::find_static_agent;

pub mod host;
pub use host::DockerHost;

/// Name of the weights volume.
pub const WEIGHTS_VOLUME: &str = "orch-weights";
/// Where the weights volume is mounted in a container.
pub const WEIGHTS_MOUNT: &str = "/weights";

pub struct DockerBackend {
    docker: Docker,
    agent: PathBuf,
    keep: bool,
    /// Does the engine have the NVIDIA runtime registered (`nvidia-ctk
    /// runtime configure`)? Asked once.
    nvidia_runtime: tokio::sync::OnceCell<bool>,
}

/// The engine's answer to a GPU request it has no driver for (no NVIDIA
/// container toolkit on the host).
const NO_GPU_DRIVER: &str = "could not select device driver";

fn engine_err(e: bollard::errors::Error) -> BackendError {
    BackendError::Unavailable {
        backend: "docker",
        message: format!("the Docker engine failed: {e}"),
        hint: "check that Docker runs (`docker info`), or set `DOCKER_HOST`".into(),
    }
}

impl DockerBackend {
    pub fn connect(agent: PathBuf, keep: bool) -> Result<DockerBackend, BackendError> {
        let docker = Docker::connect_with_local_defaults().map_err(engine_err)?;
        Ok(DockerBackend {
            docker,
            agent,
            keep,
            nvidia_runtime: tokio::sync::OnceCell::new(),
        })
    }

    /// GPUs through the `nvidia` runtime? `ORCH_DOCKER_GPUS=runtime|request`
    /// chooses; else the runtime when the engine has one, a device request
    /// (`--gpus`) when not.
    async fn has_nvidia_runtime(&self) -> bool {
        *self
            .nvidia_runtime
            .get_or_init(|| async {
                match std::env::var("ORCH_DOCKER_GPUS").as_deref().map(str::trim) {
                    Ok("runtime") => return true,
                    Ok("request") => return false,
                    _ => {}
                }
                self.docker
                    .info()
                    .await
                    .ok()
                    .and_then(|i| i.runtimes)
                    .is_some_and(|r| r.contains_key("nvidia"))
            })
            .await
    }

    pub fn client(&self) -> &Docker {
        &self.docker
    }

    async fn weights_volume(&self) -> bool {
        self.docker.inspect_volume(WEIGHTS_VOLUME).await.is_ok()
    }

    async fn remove(&self, id: &str) {
        let _ = self
            .docker
            .remove_container(
                id,
                Some(
                    RemoveContainerOptionsBuilder::default()
                        .force(true)
                        .v(true)
                        .build(),
                ),
            )
            .await;
    }
}

/// The host folder behind the weights volume, made if missing (`orch setup
/// --backend docker` writes the hub cache there). Works with a local engine.
pub async fn weights_volume_dir(create: bool) -> Result<Option<PathBuf>, BackendError> {
    let docker = Docker::connect_with_local_defaults().map_err(engine_err)?;
    let vol = match docker.inspect_volume(WEIGHTS_VOLUME).await {
        Ok(v) => v,
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) if create => docker
            .create_volume(bollard::models::VolumeCreateRequest {
                name: Some(WEIGHTS_VOLUME.into()),
                labels: Some([("orch.weights".to_string(), "1".to_string())].into()),
                ..Default::default()
            })
            .await
            .map_err(engine_err)?,
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
        Err(e) => return Err(engine_err(e)),
    };
    let dir = PathBuf::from(vol.mountpoint);
    if !dir.is_dir() {
        return Err(BackendError::Unavailable {
            backend: "docker",
            message: format!(
                "the weights volume's folder `{}` is not reachable from here",
                dir.display()
            ),
            hint: "run orch on the Docker host as a user who can write Docker's volume folders (e.g. root)"
                .into(),
        });
    }
    Ok(Some(dir))
}

/// A container name from run and cell ids.
fn container_name(run: &str, cell: &str) -> String {
    let raw = format!("orch-{run}-{cell}");
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(200)
        .collect()
}

#[async_trait]
impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        self.docker.ping().await.map_err(engine_err)?;
        if !self.agent.is_file() {
            return Err(BackendError::Unavailable {
                backend: "docker",
                message: format!(
                    "the agent for containers `{}` does not exist",
                    self.agent.display()
                ),
                hint: "build it with `bash scripts/prepare-docker.sh`, or set `ORCH_AGENT_STATIC`".into(),
            });
        }
        Ok(())
    }

    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran {
        let cell = Cell::with_events(launch, events)?;
        let mut container = Container {
            backend: self,
            image: cell.launch.image.clone().unwrap_or_default(),
            id: None,
            notes: Vec::new(),
            logs: None,
            pending: String::new(),
            lines: VecDeque::new(),
            agent_log: None,
            log_mask: cell.masker.stream(),
            exit_code: None,
        };
        Ok(lifecycle::drive(&mut container, cell, cancel).await)
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let filters: HashMap<String, Vec<String>> =
            [("label".to_string(), vec![format!("orch.run={run_id}")])].into();
        // Remove what is listed until nothing is; removals already under way
        // in the background make a container linger a moment (bounded wait).
        for _ in 0..100 {
            let left = self
                .docker
                .list_containers(Some(
                    ListContainersOptionsBuilder::default()
                        .all(true)
                        .filters(&filters)
                        .build(),
                ))
                .await
                .map_err(engine_err)?;
            if left.is_empty() {
                break;
            }
            for id in left.into_iter().filter_map(|c| c.id) {
                self.remove(&id).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

type LogStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<bollard::container::LogOutput, bollard::errors::Error>> + Send>,
>;

/// One cell's container: the docker backend's platform.
struct Container<'a> {
    backend: &'a DockerBackend,
    image: String,
    /// Once created.
    id: Option<String>,
    /// What the engine could not give (GPU devices, ulimits).
    notes: Vec<String>,
    logs: Option<LogStream>,
    /// A stdout line not ended yet, and lines not handed out yet.
    pending: String,
    lines: VecDeque<String>,
    /// `agent.log`, opened only to append.
    agent_log: Option<std::path::PathBuf>,
    log_mask: orch_protocol::mask::StreamMasker,
    exit_code: Option<i32>,
}

impl Container<'_> {
    /// The container's definition for a cell.
    async fn body(backend: &DockerBackend, image: &str, cell: &Cell, weights: bool) -> ContainerCreateBody {
        let task = &cell.task;
        let devices = &cell.launch.devices;
        let gpus = task.gpu.count();
        let wants_gpu = !task.gpu.is_cpu();
        // Absolute host paths: the engine takes a relative one for a volume
        // name (the default store `results` is relative to the suite's folder).
        let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut binds = vec![
            format!("{}:/orch/agent:ro", abs(&backend.agent).display()),
            format!("{}:/orch/cell", abs(&cell.dir).display()),
        ];
        // The files that travel: the cache's folder of blobs, read-only (the
        // agent copies each to its place and checks its digest).
        if let Some(dir) = cell.launch.files.as_ref().and_then(|f| {
            f.blobs()
                .first()
                .and_then(|(_, p, _)| p.parent().map(|d| d.to_path_buf()))
        }) {
            binds.push(format!("{}:{}:ro", abs(&dir).display(), orch_files::CELL_BLOBS));
        }
        let files = cell.launch.files.as_ref().is_some_and(|f| !f.is_empty());
        let mut host = HostConfig {
            binds: Some(binds),
            // Where the agent lays the files out, writable whatever user
            // the image runs as (`/` is root's), executable scripts allowed.
            tmpfs: files.then(|| {
                HashMap::from([(orch_files::CELL_ROOT.to_string(), "rw,exec,mode=1777".to_string())])
            }),
            ..Default::default()
        };
        if weights {
            host.mounts = Some(vec![Mount {
                target: Some(WEIGHTS_MOUNT.into()),
                source: Some(WEIGHTS_VOLUME.into()),
                typ: Some(MountType::VOLUME),
                read_only: Some(true),
                ..Default::default()
            }]);
        }
        let mut env: Vec<String> = cell
            .launch
            .secrets
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push("ORCH_IN_CONTAINER=1".into());
        let nvidia_runtime = backend.has_nvidia_runtime().await;
        if wants_gpu {
            if nvidia_runtime {
                // The NVIDIA runtime (a runc wrapper) gives the GPUs named
                // here and injects the driver's libraries.
                host.runtime = Some("nvidia".into());
                let ids = if devices.is_empty() {
                    (0..gpus).map(|i| i.to_string()).collect::<Vec<_>>()
                } else {
                    devices.clone()
                };
                // NVIDIA_DRIVER_CAPABILITIES stays the image's (its default
                // is `compute,utility`; NGC images add `video`).
                env.push(format!("NVIDIA_VISIBLE_DEVICES={}", ids.join(",")));
            } else {
                // `--gpus`: the engine's NVIDIA device driver (the toolkit's hook).
                host.device_requests = Some(vec![DeviceRequest {
                    count: devices.is_empty().then_some(gpus as i64),
                    device_ids: (!devices.is_empty()).then(|| devices.clone()),
                    capabilities: Some(vec![vec!["gpu".into()]]),
                    ..Default::default()
                }]);
            }
            // NCCL: shared memory and pinned memory without limits.
            host.ipc_mode = Some("host".into());
            host.ulimits = Some(vec![
                ResourcesUlimits {
                    name: Some("memlock".into()),
                    soft: Some(-1),
                    hard: Some(-1),
                },
                ResourcesUlimits {
                    name: Some("stack".into()),
                    soft: Some(67_108_864),
                    hard: Some(67_108_864),
                },
            ]);
        } else if nvidia_runtime {
            // A CPU cell gets no GPU, also where `nvidia` is the default
            // runtime and the image says `NVIDIA_VISIBLE_DEVICES=all`.
            env.push("NVIDIA_VISIBLE_DEVICES=void".into());
        }
        if let Some(limit) = task.memory_limit_bytes {
            host.memory = Some(limit as i64);
            host.memory_swap = Some(limit as i64); // no swap: over the limit is an OOM kill
        }
        let labels: HashMap<String, String> = [
            ("orch.run".to_string(), task.run_id.clone()),
            ("orch.cell".to_string(), task.cell_id.clone()),
        ]
        .into();
        ContainerCreateBody {
            image: Some(image.to_string()),
            entrypoint: Some(vec!["/orch/agent".into()]),
            cmd: Some(vec![
                "run".into(),
                "--task".into(),
                "/orch/cell/task.json".into(),
                "--out".into(),
                "/orch/cell".into(),
            ]),
            env: Some(env),
            labels: Some(labels),
            host_config: Some(host),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        }
    }

    /// Write the task into the cell folder (open to the container's user).
    fn write_task(cell: &Cell, weights: bool) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        // The agent in the container may run as any user: let it write here.
        std::fs::set_permissions(&cell.dir, std::fs::Permissions::from_mode(0o777))?;
        let mut task = cell.task.clone();
        task.weights_dir = weights.then(|| WEIGHTS_MOUNT.to_string());
        if let Some(files) = &cell.launch.files {
            files.apply(&mut task, orch_files::CELL_ROOT, orch_files::CELL_BLOBS);
        }
        let json = serde_json::to_vec_pretty(&task).map_err(std::io::Error::other)?;
        std::fs::write(cell.dir.join("task.json"), json)
    }
}

#[async_trait]
impl Platform for Container<'_> {
    fn what(&self) -> &'static str {
        "the container"
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        if self.image.is_empty() {
            return Err(Early::failed(
                FailureKind::NoImage,
                "the cell names no `image`; container backends need one (`image: REF` or `image: {build: NAME}`)",
            ));
        }
        let weights = self.backend.weights_volume().await;
        Self::write_task(cell, weights).map_err(|e| {
            Early::failed(
                FailureKind::CellFolder,
                format!("cannot write the task into `{}`: {e}", cell.dir.display()),
            )
        })?;
        let agent_log = cell.dir.join("agent.log");
        std::fs::File::create(&agent_log)
            .map_err(|e| Early::failed(FailureKind::CellFolder, format!("cannot create `agent.log`: {e}")))?;
        self.agent_log = Some(agent_log);
        let backend = self.backend;
        let mut body = Self::body(backend, &self.image, cell, weights).await;
        let name = container_name(&cell.task.run_id, &cell.id);
        let docker = &self.backend.docker;
        // A container of the same name left by a killed orch goes first.
        self.backend.remove(&name).await;
        // What the engine cannot give is dropped, said and recorded, and the
        // container made again: GPU devices where the engine has no NVIDIA
        // toolkit (the agent then flags the cell `hardware_mismatch`), the
        // NCCL ulimits where the daemon may not raise them.
        let id = loop {
            let created = match docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                    body.clone(),
                )
                .await
            {
                Ok(c) => c,
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, message }) => {
                    return Err(Early::failed(
                        FailureKind::NoImage,
                        format!(
                            "image `{}` is not in the engine ({message}); hint: `orch build -f SUITE` builds it, or `docker pull {}`",
                            self.image, self.image
                        ),
                    ))
                }
                Err(e) => return Err(Early::failed(FailureKind::ContainerCreate, format!("the Docker engine failed: {e}"))),
            };
            self.id = Some(created.id.clone());
            let Err(e) = docker.start_container(&created.id, None).await else {
                break created.id;
            };
            self.backend.remove(&created.id).await;
            self.id = None;
            let msg = e.to_string();
            let h = body.host_config.get_or_insert_with(Default::default);
            let note = if msg.contains(NO_GPU_DRIVER) && h.device_requests.take().is_some() {
                format!("the Docker engine cannot attach GPUs ({msg}); the cell runs without GPU devices; hint: install the NVIDIA container toolkit and run `nvidia-ctk runtime configure --runtime=docker`")
            } else if msg.contains("setting rlimit") && h.ulimits.take().is_some() {
                format!("the Docker daemon may not raise the container's memlock/stack limits ({msg}); the cell runs with the daemon's limits (NCCL may need them raised)")
            } else {
                return Err(Early::failed(
                    FailureKind::ContainerStart,
                    format!("the container did not start: {msg}"),
                ));
            };
            cell.message(&note);
            self.notes.push(note);
        };
        self.logs = Some(Box::pin(
            docker.logs(
                &id,
                Some(
                    LogsOptionsBuilder::default()
                        .follow(true)
                        .stdout(true)
                        .stderr(true)
                        .build(),
                ),
            ),
        ));
        Ok(())
    }

    async fn next_line(&mut self, _cell: &mut Cell) -> Option<String> {
        loop {
            if let Some(line) = self.lines.pop_front() {
                return Some(line);
            }
            let logs = self.logs.as_mut()?;
            match logs.next().await {
                Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                    self.pending.push_str(&String::from_utf8_lossy(&message));
                    while let Some(nl) = self.pending.find('\n') {
                        let line: String = self.pending.drain(..=nl).collect();
                        self.lines.push_back(line.trim_end_matches('\n').to_string());
                    }
                }
                Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                    // The agent's own stderr, masked on its way to agent.log.
                    let mut masked = Vec::new();
                    self.log_mask.push(&message, &mut masked);
                    if let Some(p) = self.agent_log.as_ref() {
                        let _ = orch_backend::append(p, &masked);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    self.logs = None;
                    if !self.pending.is_empty() {
                        return Some(std::mem::take(&mut self.pending));
                    }
                    return None;
                }
            }
        }
    }

    async fn stop(&mut self, cell: &mut Cell, _why: Stop, kill: bool) {
        let Some(id) = &self.id else { return };
        let docker = &self.backend.docker;
        if kill {
            let _ = docker
                .kill_container(
                    id,
                    Some(KillContainerOptionsBuilder::default().signal("SIGKILL").build()),
                )
                .await;
        } else {
            // SIGTERM, then the engine's own SIGKILL after the grace period.
            let grace = lifecycle::grace(&cell.task.measure).as_secs_f64().ceil() as i32;
            let _ = docker
                .stop_container(id, Some(StopContainerOptionsBuilder::default().t(grace).build()))
                .await;
        }
    }

    async fn end(&mut self, cell: &mut Cell, _stopped: Option<Stop>) -> PlatformEnd {
        let mut masked = Vec::new();
        self.log_mask.finish(&mut masked);
        if let Some(p) = self.agent_log.take() {
            let _ = orch_backend::append(&p, &masked);
        }
        // The log stream ends when the container stops; wait for its state.
        let mut state = None;
        if let Some(id) = &self.id {
            for _ in 0..50 {
                match self
                    .backend
                    .docker
                    .inspect_container(id, None::<InspectContainerOptions>)
                    .await
                {
                    Ok(info) => {
                        let s = info.state.unwrap_or_default();
                        // Billing starts when the engine started the container.
                        if let Some(at) = s.started_at.as_deref() {
                            cell.container_started_rfc3339(at);
                        }
                        if s.running != Some(true) {
                            state = Some(s);
                            break;
                        }
                    }
                    Err(_) => break,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let oom_killed = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
        let exit_code = state.as_ref().and_then(|s| s.exit_code).map(|c| c as i32);
        self.exit_code = exit_code;
        let limit = cell.task.memory_limit_bytes;
        // The kernel's OOM killer took the workload (or the agent) inside
        // the container's memory limit: that is `oom`, whatever the agent saw.
        let verdict = (oom_killed || (exit_code == Some(137) && limit.is_some())).then(|| {
            (
                Status::Oom,
                Failure::new(
                    FailureKind::Oom,
                    format!(
                        "the container was killed for using more memory than its limit{}",
                        limit.map(|b| format!(" ({b} bytes)")).unwrap_or_default()
                    ),
                )
                .exited(exit_code, None),
            )
        });
        let words = (exit_code == Some(137)).then(|| {
            (
                Status::Failed,
                Failure::new(
                    FailureKind::ContainerKilled,
                    "the container ended without a result (exit code 137): killed (SIGKILL) from outside",
                )
                .exited(exit_code, None),
            )
        });
        PlatformEnd {
            result: Cell::result_file(&cell.dir),
            exit_code,
            signal: None,
            verdict,
            words,
        }
    }

    async fn finish(&mut self, cell: &mut Cell, result: &mut CellResult) {
        if !self.image.is_empty() {
            result
                .info
                .insert("container_image".into(), self.image.clone().into());
        }
        if self.id.is_some() {
            result
                .info
                .insert("container_exit_code".into(), self.exit_code.into());
        }
        if !self.notes.is_empty() {
            result
                .info
                .insert("container_notes".into(), self.notes.join("; ").into());
        }
        let _ = cell;
        if let (Some(id), false) = (self.id.clone(), self.backend.keep) {
            // Removal (slow on some storage drivers) need not delay the
            // record: it goes on in the background, and `cleanup` at the end
            // of the run waits for whatever is left.
            let docker = self.backend.docker.clone();
            tokio::spawn(async move {
                let _ = docker
                    .remove_container(
                        &id,
                        Some(
                            RemoveContainerOptionsBuilder::default()
                                .force(true)
                                .v(true)
                                .build(),
                        ),
                    )
                    .await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn container_names_are_valid() {
        assert_eq!(
            super::container_name("20261122-0615-q-ab", "t.cpu.preset-2.7b"),
            "orch-20261122-0615-q-ab-t.cpu.preset-2.7b"
        );
        assert_eq!(super::container_name("r", "a/b c"), "orch-r-a_b_c");
    }
}
