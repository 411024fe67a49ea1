//! The `docker` backend: one container per cell, through the Docker Engine API.
//!
//! - the image is any image (a stock `vllm/vllm-openai` works): the agent is a
//!   static binary bind-mounted read-only at `/orch/agent` and used as the
//!   entrypoint, so images with an old glibc, or none, run it;
//! - the cell folder is bind-mounted at `/orch/cell`: the agent writes the
//!   workload's `stdout.log`/`stderr.log` and `result.json` there while the
//!   container runs, so logs outlive the container;
//! - the container's stdout is the agent's event stream, its stderr goes to
//!   `agent.log`;
//! - GPUs become an NVIDIA device request (device ids when the runner
//!   assigned them, else a count) with host IPC and unlimited memlock, fit
//!   for NCCL; `none` asks for no GPU;
//! - the weights volume (`orch-weights`, filled by `orch setup --backend
//!   docker`) is mounted read-only at `/weights` with `HF_HUB_CACHE` set;
//! - secrets are container environment only;
//! - labels `orch.run` and `orch.cell` mark every container; a container is
//!   removed once its result is stored (unless `keep`), and `cleanup` removes
//!   whatever a run left.

use crate::{Backend, BackendError, CellEvent, CellLaunch};
use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, KillContainerOptionsBuilder,
    ListContainersOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures::StreamExt;
use orch_protocol::{CellResult, Failure, Status};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

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

/// The static agent for containers: `ORCH_AGENT_STATIC`, else
/// `orch-agent-static` beside `orch`, else the static build in the cargo
/// target folder beside `orch` (`scripts/build-agent.sh` makes it).
pub fn find_static_agent() -> Result<PathBuf, BackendError> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("ORCH_AGENT_STATIC").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("orch-agent-static"));
            // target/{debug,release}/orch -> target/x86_64-unknown-linux-gnu/release/orch-agent
            if let Some(target) = dir.parent() {
                candidates.push(target.join(format!(
                    "{}-unknown-linux-gnu/release/orch-agent",
                    std::env::consts::ARCH
                )));
            }
            if let Some(target) = dir.parent().and_then(|d| d.parent()) {
                candidates.push(target.join(format!(
                    "{}-unknown-linux-gnu/release/orch-agent",
                    std::env::consts::ARCH
                )));
            }
        }
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| BackendError::Unavailable {
            backend: "docker",
            message: format!(
                "no static agent found (looked at {})",
                candidates
                    .iter()
                    .map(|p| format!("`{}`", p.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            hint: "build it with `bash scripts/prepare-docker.sh`, or set `ORCH_AGENT_STATIC`".into(),
        })
}

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

    async fn run_cell(
        &self,
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<CellResult, BackendError> {
        let cell_id = launch.task.cell_id.clone();
        let mut relay = crate::EventRelay::new(&cell_id, events);
        let run_id = launch.task.run_id.clone();
        let dir = launch.cell_dir.clone();
        let Some(image) = launch.image.clone() else {
            return Ok(CellResult::failed(
                &cell_id,
                Status::Failed,
                "no_image",
                "the cell names no `image`; container backends need one (`image: REF` or `image: {build: NAME}`)",
            ));
        };
        let io = |action: String| move |source: std::io::Error| BackendError::Io { action, source };

        // The agent in the container may run as any user: let it write here.
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                .map_err(io(format!("open up `{}`", dir.display())))?;
        }
        let mut task = launch.task.clone();
        let weights = self.weights_volume().await;
        task.weights_dir = weights.then(|| WEIGHTS_MOUNT.to_string());
        let task_json = serde_json::to_vec_pretty(&task).map_err(|e| BackendError::Io {
            action: "serialise the task".into(),
            source: std::io::Error::other(e),
        })?;
        tokio::fs::write(dir.join("task.json"), task_json)
            .await
            .map_err(io("write task.json".into()))?;
        let mut agent_log = tokio::fs::File::create(dir.join("agent.log"))
            .await
            .map_err(io("create agent.log".into()))?;
        let mut events_file = tokio::fs::File::create(dir.join("events.jsonl"))
            .await
            .map_err(io("create events.jsonl".into()))?;

        let gpus: u32 = launch
            .task
            .gpu
            .split(':')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(1);
        let wants_gpu = launch.task.gpu != "none";
        let mut host = HostConfig {
            binds: Some(vec![
                format!("{}:/orch/agent:ro", self.agent.display()),
                format!("{}:/orch/cell", dir.display()),
            ]),
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
        let mut env: Vec<String> = launch.secrets.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push("ORCH_IN_CONTAINER=1".into());
        if wants_gpu {
            if self.has_nvidia_runtime().await {
                // The NVIDIA runtime (a runc wrapper) gives the GPUs named
                // here and injects the driver's libraries.
                host.runtime = Some("nvidia".into());
                let ids = if launch.devices.is_empty() {
                    (0..gpus).map(|i| i.to_string()).collect::<Vec<_>>()
                } else {
                    launch.devices.clone()
                };
                // NVIDIA_DRIVER_CAPABILITIES stays the image's (its default
                // is `compute,utility`; NGC images add `video`).
                env.push(format!("NVIDIA_VISIBLE_DEVICES={}", ids.join(",")));
            } else {
                // `--gpus`: the engine's NVIDIA device driver (the toolkit's hook).
                host.device_requests = Some(vec![DeviceRequest {
                    count: launch.devices.is_empty().then_some(gpus as i64),
                    device_ids: (!launch.devices.is_empty()).then(|| launch.devices.clone()),
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
        }
        if let Some(limit) = launch.task.memory_limit_bytes {
            host.memory = Some(limit as i64);
            host.memory_swap = Some(limit as i64); // no swap: over the limit is an OOM kill
        }
        if !wants_gpu && self.has_nvidia_runtime().await {
            // A CPU cell gets no GPU, also where `nvidia` is the default
            // runtime and the image says `NVIDIA_VISIBLE_DEVICES=all`.
            env.push("NVIDIA_VISIBLE_DEVICES=void".into());
        }
        let labels: HashMap<String, String> = [
            ("orch.run".to_string(), run_id.clone()),
            ("orch.cell".to_string(), cell_id.clone()),
        ]
        .into();
        let body = ContainerCreateBody {
            image: Some(image.clone()),
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
        };
        let name = container_name(&run_id, &cell_id);
        // A container of the same name left by a killed orch goes first.
        self.remove(&name).await;
        // What the engine cannot give is dropped, said and recorded, and the
        // container made again: GPU devices where the engine has no NVIDIA
        // toolkit (the agent then flags the cell `hardware_mismatch`), the
        // NCCL ulimits where the daemon may not raise them.
        let mut body = body;
        let mut notes: Vec<String> = Vec::new();
        let id = loop {
            let created = match self
                .docker
                .create_container(
                    Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                    body.clone(),
                )
                .await
            {
                Ok(c) => c,
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, message }) => {
                    return Ok(CellResult::failed(
                        &cell_id,
                        Status::Failed,
                        "no_image",
                        format!("image `{image}` is not in the engine ({message}); hint: `orch build -f SUITE` builds it, or `docker pull {image}`"),
                    ))
                }
                Err(e) => return Err(engine_err(e)),
            };
            let Err(e) = self.docker.start_container(&created.id, None).await else {
                break created.id;
            };
            self.remove(&created.id).await;
            let msg = e.to_string();
            let h = body.host_config.get_or_insert_with(Default::default);
            let note = if msg.contains(NO_GPU_DRIVER) && h.device_requests.take().is_some() {
                format!("the Docker engine cannot attach GPUs ({msg}); the cell runs without GPU devices; hint: install the NVIDIA container toolkit and run `nvidia-ctk runtime configure --runtime=docker`")
            } else if msg.contains("setting rlimit") && h.ulimits.take().is_some() {
                format!("the Docker daemon may not raise the container's memlock/stack limits ({msg}); the cell runs with the daemon's limits (NCCL may need them raised)")
            } else {
                return Ok(CellResult::failed(
                    &cell_id,
                    Status::Failed,
                    "container_start",
                    format!("the container did not start: {msg}"),
                ));
            };
            relay.message(&note);
            notes.push(note);
        };
        let gpu_attach = (!notes.is_empty()).then(|| notes.join("; "));

        let mut logs = self.docker.logs(
            &id,
            Some(
                LogsOptionsBuilder::default()
                    .follow(true)
                    .stdout(true)
                    .stderr(true)
                    .build(),
            ),
        );
        let grace = launch.task.measure.kill_grace_s.max(1.0);
        let deadline = tokio::time::Instant::now()
            + Duration::from_secs_f64(launch.task.measure.timeout_s + grace)
            + Duration::from_secs(30);
        let mut pending = String::new();
        let masker = crate::host_masker(&launch.secrets);
        let mut log_mask = masker.stream();
        let mut masked: Vec<u8> = Vec::new();
        let mut result: Option<CellResult> = None;
        let mut by_host: Option<Status> = None;
        loop {
            tokio::select! {
                item = logs.next() => match item {
                    Some(Ok(bollard::container::LogOutput::StdOut { message })) => {
                        pending.push_str(&String::from_utf8_lossy(&message));
                        while let Some(nl) = pending.find('\n') {
                            let line: String = pending.drain(..=nl).collect();
                            // Masked again on the host (see `host_masker`).
                            let line = crate::secrets::mask_event_line(&masker, line.trim_end_matches('\n'));
                            let _ = events_file.write_all(line.as_bytes()).await;
                            let _ = events_file.write_all(b"\n").await;
                            if let Some(r) = relay.line(&line) {
                                result = Some(r);
                            }
                        }
                    }
                    Some(Ok(bollard::container::LogOutput::StdErr { message })) => {
                        masked.clear();
                        log_mask.push(&message, &mut masked);
                        let _ = agent_log.write_all(&masked).await;
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => break,
                },
                changed = cancel.changed(), if by_host.is_none() => {
                    if changed.is_err() || *cancel.borrow() {
                        by_host = Some(Status::Cancelled);
                        let _ = self.docker.stop_container(&id, Some(StopContainerOptionsBuilder::default().t(grace.ceil() as i32).build())).await;
                    }
                }
                _ = tokio::time::sleep_until(deadline), if by_host.is_none() => {
                    by_host = Some(Status::Timeout);
                    let _ = self.docker.kill_container(&id, Some(KillContainerOptionsBuilder::default().signal("SIGKILL").build())).await;
                }
            }
        }
        if !pending.is_empty() {
            let line = crate::secrets::mask_event_line(&masker, &pending);
            let _ = events_file.write_all(line.as_bytes()).await;
        }
        masked.clear();
        log_mask.finish(&mut masked);
        let _ = agent_log.write_all(&masked).await;
        let _ = events_file.flush().await;
        let _ = agent_log.flush().await;
        // The log stream ends when the container stops; wait for its state.
        let mut state = None;
        for _ in 0..50 {
            match self
                .docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
            {
                Ok(info) => {
                    let s = info.state.unwrap_or_default();
                    if s.running != Some(true) {
                        state = Some(s);
                        break;
                    }
                }
                Err(_) => break,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !self.keep {
            // Removal (slow on some storage drivers) need not delay the
            // record: it goes on in the background, and `cleanup` at the end
            // of the run waits for whatever is left.
            let docker = self.docker.clone();
            let id = id.clone();
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
        let oom_killed = state.as_ref().and_then(|s| s.oom_killed).unwrap_or(false);
        let exit_code = state.as_ref().and_then(|s| s.exit_code).map(|c| c as i32);

        let mut result = match result {
            Some(r) => r,
            None => match tokio::fs::read(dir.join("result.json"))
                .await
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            {
                Some(r) => r,
                None => {
                    let (status, kind, message) = match by_host {
                        Some(Status::Timeout) => (
                            Status::Timeout,
                            "timeout",
                            "the container did not finish in time and was killed".to_string(),
                        ),
                        Some(_) => (
                            Status::Cancelled,
                            "cancelled",
                            "the container was stopped".to_string(),
                        ),
                        None if oom_killed
                            || (exit_code == Some(137) && launch.task.memory_limit_bytes.is_some()) =>
                        {
                            (
                                Status::Oom,
                                "oom",
                                "the container was killed for using more memory than its limit".to_string(),
                            )
                        }
                        None if exit_code == Some(137) => (
                            Status::Failed,
                            "container_killed",
                            "the container ended without a result (exit code 137): killed (SIGKILL) from outside".to_string(),
                        ),
                        None => {
                            let mut r = CellResult::new(&cell_id, Status::Failed);
                            r.failure = Some(crate::agent_crash(&dir, "the container", exit_code, None));
                            return Ok(relay.stamp(with_container_info(r, &image, exit_code, gpu_attach)));
                        }
                    };
                    let mut r = CellResult::failed(&cell_id, status, kind, message);
                    if let Some(f) = r.failure.as_mut() {
                        f.exit_code = exit_code;
                    }
                    r
                }
            },
        };
        // The kernel's OOM killer took the workload (or the agent) inside the
        // container's memory limit: that is `oom`, whatever the agent saw.
        if oom_killed && result.status != Status::Succeeded && result.status != Status::Cancelled {
            result.status = Status::Oom;
            result.failure = Some(Failure {
                kind: "oom".into(),
                message: format!(
                    "killed for exceeding the container memory limit{}",
                    launch
                        .task
                        .memory_limit_bytes
                        .map(|b| format!(" ({b} bytes)"))
                        .unwrap_or_default()
                ),
                exit_code,
                signal: result.failure.as_ref().and_then(|f| f.signal),
            });
        }
        Ok(relay.stamp(with_container_info(result, &image, exit_code, gpu_attach)))
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

/// The image, the container's exit code and what the engine could not give
/// (GPU devices, ulimits), into the result's `info`.
fn with_container_info(
    mut result: CellResult,
    image: &str,
    exit_code: Option<i32>,
    gpu_attach: Option<String>,
) -> CellResult {
    result.info.insert("container_image".into(), image.into());
    result.info.insert("container_exit_code".into(), exit_code.into());
    if let Some(note) = gpu_attach {
        result.info.insert("container_notes".into(), note.into());
    }
    result
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
