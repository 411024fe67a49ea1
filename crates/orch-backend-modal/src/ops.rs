//! Modal operations orch needs, each as Modal's own clients perform it.
//!
//! An image built from a Dockerfile sends its context as the official client
//! does (`modal/_image.py`'s `_create_context_mount`): the context files in a
//! mount at `/PATH` ([`context_mount`]), the mount's id as the image's
//! `context_mount_id`, nothing in `context_files`; a mount's files of
//! [`LARGE_FILE_LIMIT`] bytes or more go through the blob store
//! ([`crate::blob`]), so no request carries a large file.

use crate::client::Modal;
use crate::proto::{self, generic_result::GenericStatus, GenericResult, ObjectCreationType};
use crate::ModalError;
use sha2::Digest;
use std::path::Path;
use std::time::Duration;

pub use crate::blob::LARGE_FILE_LIMIT;
/// How long a file Modal has not yet ingested (`MountPutFile` answered
/// `exists: false` after its upload) is waited for, sending it again (the
/// official client waits as long: `MOUNT_PUT_FILE_CLIENT_TIMEOUT`).
pub const INGEST_WAIT: Duration = Duration::from_secs(600);
/// The first pause between those questions; it doubles up to [`INGEST_POLL_MAX`].
pub const INGEST_POLL: Duration = Duration::from_millis(100);
pub const INGEST_POLL_MAX: Duration = Duration::from_secs(2);
/// The image builder version when Modal does not say
/// (`MODAL_IMAGE_BUILDER_VERSION` overrides it).
pub const DEFAULT_BUILDER_VERSION: &str = "2024.10";

/// `AppGetOrCreate`: the app orch's sandboxes belong to.
pub async fn app(modal: &Modal, name: &str) -> Result<String, ModalError> {
    let req = proto::AppGetOrCreateRequest {
        app_name: name.into(),
        environment_name: modal.environment().into(),
        object_creation_type: ObjectCreationType::CreateIfMissing as i32,
    };
    let resp = modal
        .call("AppGetOrCreate", req, |mut c, r| async move {
            c.app_get_or_create(r).await
        })
        .await
        .map_err(ModalError::rpc("AppGetOrCreate"))?;
    Ok(resp.app_id)
}

/// The builder version: `MODAL_IMAGE_BUILDER_VERSION`, else the
/// environment's setting (`EnvironmentGetOrCreate`, as Modal's clients read
/// it), else what `ClientHello` says, else [`DEFAULT_BUILDER_VERSION`].
pub async fn builder_version(modal: &Modal) -> String {
    if let Ok(v) = std::env::var("MODAL_IMAGE_BUILDER_VERSION") {
        if !v.is_empty() {
            return v;
        }
    }
    let req = proto::EnvironmentGetOrCreateRequest {
        deployment_name: modal.environment().into(),
        object_creation_type: ObjectCreationType::Unspecified as i32,
    };
    if let Ok(r) = modal
        .call("EnvironmentGetOrCreate", req, |mut c, r| async move {
            c.environment_get_or_create(r).await
        })
        .await
    {
        if let Some(v) = r
            .metadata
            .and_then(|m| m.settings)
            .map(|s| s.image_builder_version)
            .filter(|v| !v.is_empty())
        {
            return v;
        }
    }
    match modal
        .call(
            "ClientHello",
            (),
            |mut c, r| async move { c.client_hello(r).await },
        )
        .await
    {
        Ok(h) if !h.image_builder_version.is_empty() => h.image_builder_version,
        _ => DEFAULT_BUILDER_VERSION.into(),
    }
}

/// An image as Modal builds it: Dockerfile instructions (the first is
/// `FROM`) and the context files they may `COPY`, sent as the image's
/// context mount ([`image`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageSpec {
    /// What the user wrote (`vllm/vllm-openai:v0.6.3`, `{build: quickstart}`), for messages.
    pub label: String,
    pub commands: Vec<String>,
    /// (name in the context, file on this host).
    pub context: Vec<(String, std::path::PathBuf)>,
}

impl ImageSpec {
    /// `Image.from_registry(tag)`.
    pub fn registry(tag: &str) -> ImageSpec {
        ImageSpec {
            label: tag.into(),
            commands: vec![format!("FROM {tag}")],
            context: vec![],
        }
    }

    /// A Dockerfile's instructions (comments and blank lines dropped,
    /// continuation lines joined) with its context files.
    pub fn dockerfile(label: &str, text: &str, context: Vec<(String, std::path::PathBuf)>) -> ImageSpec {
        let mut commands = Vec::new();
        let mut cur = String::new();
        for line in text.lines() {
            let t = line.trim();
            if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
                continue;
            }
            if let Some(head) = t.strip_suffix('\\') {
                cur.push_str(head.trim_end());
                cur.push(' ');
                continue;
            }
            if !t.starts_with('#') {
                cur.push_str(t);
            }
            if !cur.trim().is_empty() {
                commands.push(cur.trim().to_string());
            }
            cur.clear();
        }
        if !cur.trim().is_empty() {
            commands.push(cur.trim().to_string());
        }
        ImageSpec {
            label: label.into(),
            commands,
            context,
        }
    }
}

/// What an image build left: its id, or the failure with the log.
#[derive(Debug)]
pub struct Built {
    pub image_id: String,
    /// Seconds spent waiting for the build (0 when Modal had it cached).
    pub build_s: f64,
}

/// Whether the Dockerfile reads its context: a `COPY` or `ADD` not `--from`
/// another stage (the official client makes a context mount only for
/// `COPY`; `ADD` of a local file needs one as much).
pub fn reads_context(commands: &[String]) -> bool {
    commands.iter().any(|c| {
        let mut w = c.split_whitespace();
        let instr = w.next().unwrap_or_default().to_ascii_uppercase();
        (instr == "COPY" || instr == "ADD") && !w.any(|a| a.starts_with("--from"))
    })
}

/// The image's context mount, as the official client makes it
/// (`_create_context_mount`: the context folder mounted at `/`, each file at
/// `/PATH`, its mode the file's permission bits); the files through
/// [`mount`], so a large one goes as a blob. Empty (no mount) when the
/// Dockerfile copies nothing or the context has no files.
pub async fn context_mount(modal: &Modal, app_id: &str, spec: &ImageSpec) -> Result<String, ModalError> {
    use std::os::unix::fs::PermissionsExt;
    if spec.context.is_empty() || !reads_context(&spec.commands) {
        return Ok(String::new());
    }
    let mut names = Vec::with_capacity(spec.context.len());
    for (name, path) in &spec.context {
        let meta = tokio::fs::metadata(path).await.map_err(|e| ModalError::Io {
            action: format!("read the image context file `{}`", path.display()),
            source: e,
        })?;
        names.push((
            format!("/{}", name.trim_start_matches("./").trim_start_matches('/')),
            meta.permissions().mode() & 0o7777,
        ));
    }
    let sources: Vec<MountSource<'_>> = names
        .iter()
        .zip(&spec.context)
        .map(|((remote, mode), (_, path))| MountSource {
            remote_path: remote,
            local: path,
            mode: *mode,
        })
        .collect();
    mount(modal, app_id, &sources).await
}

/// `ImageGetOrCreate` (the context as a mount: [`context_mount`]), then
/// `ImageJoinStreaming` until the build has a result, resuming from the
/// last entry id; every build log line goes to `log` as it arrives.
pub async fn image(
    modal: &Modal,
    app_id: &str,
    spec: &ImageSpec,
    builder_version: &str,
    mut log: impl FnMut(&str),
) -> Result<Built, ModalError> {
    let started = std::time::Instant::now();
    let context_mount_id = context_mount(modal, app_id, spec).await?;
    let req = proto::ImageGetOrCreateRequest {
        image: Some(proto::Image {
            base_images: vec![],
            dockerfile_commands: spec.commands.clone(),
            context_files: vec![],
            version: builder_version.into(),
            secret_ids: vec![],
            context_mount_id,
        }),
        app_id: app_id.into(),
        force_build: false,
        builder_version: builder_version.into(),
    };
    let resp = modal
        .call("ImageGetOrCreate", req, |mut c, r| async move {
            c.image_get_or_create(r).await
        })
        .await
        .map_err(ModalError::rpc("ImageGetOrCreate"))?;
    let image_id = resp.image_id;
    let mut result = resp
        .result
        .filter(|r| r.status != GenericStatus::Unspecified as i32);
    let mut last_entry_id = String::new();
    let mut text = String::new();
    let mut failures = 0;
    while result.is_none() {
        let req = proto::ImageJoinStreamingRequest {
            image_id: image_id.clone(),
            timeout: 55.0,
            last_entry_id: last_entry_id.clone(),
            include_logs_for_finished: true,
        };
        let req = modal.stream_request(req).await;
        let mut stream = match modal.stub().image_join_streaming(req).await {
            Ok(s) => s.into_inner(),
            Err(s) if crate::client::retry_after(&s).is_some() => {
                tokio::time::sleep(throttle_wait(&s)).await;
                continue;
            }
            Err(s) if crate::client::is_transient(s.code()) && failures < 10 => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(200 * failures)).await;
                continue;
            }
            Err(s) => return Err(ModalError::rpc("ImageJoinStreaming")(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(item)) => {
                    if !item.entry_id.is_empty() {
                        last_entry_id = item.entry_id.clone();
                    }
                    for l in &item.task_logs {
                        if !l.data.is_empty() {
                            log(&l.data);
                            text.push_str(&l.data);
                        }
                    }
                    if let Some(r) = item
                        .result
                        .filter(|r| r.status != GenericStatus::Unspecified as i32)
                    {
                        result = Some(r);
                        break;
                    }
                    if item.eof {
                        break;
                    }
                }
                Ok(None) => break,
                Err(s) if crate::client::is_transient(s.code()) && failures < 10 => {
                    failures += 1;
                    break;
                }
                Err(s) => return Err(ModalError::rpc("ImageJoinStreaming")(s)),
            }
        }
    }
    // `while` ended: a result is there.
    let result = result.unwrap_or_default();
    if result.status == GenericStatus::Success as i32 {
        return Ok(Built {
            image_id,
            build_s: if text.is_empty() {
                0.0
            } else {
                started.elapsed().as_secs_f64()
            },
        });
    }
    let status = GenericStatus::try_from(result.status).unwrap_or(GenericStatus::Failure);
    let message = match status {
        GenericStatus::Timeout => "the build timed out".to_string(),
        GenericStatus::Terminated => "the build was terminated".to_string(),
        _ if !result.exception.is_empty() => result.exception.trim().to_string(),
        _ => format!("status {}", status.as_str_name()),
    };
    Err(ModalError::ImageBuild {
        image: spec.label.clone(),
        step: failing_step(&text, &spec.commands),
        message,
    })
}

/// The step a build log says failed: the last `Step N/M : CMD` (or
/// `=> [N/M] CMD` of BuildKit, or `RUN ...` echo) before the error; else the
/// last of our Dockerfile commands named in the log.
pub fn failing_step(log: &str, commands: &[String]) -> Option<String> {
    let mut last = None;
    for line in log.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("Step ") {
            if let Some((_, cmd)) = rest.split_once(" : ") {
                last = Some(cmd.trim().to_string());
            }
        } else if let Some(idx) = l.find("] ") {
            if l.starts_with("=>") || l.starts_with('#') {
                let cmd = l[idx + 2..].trim();
                if cmd.starts_with("RUN ") || cmd.starts_with("COPY ") || cmd.starts_with("FROM ") {
                    last = Some(cmd.to_string());
                }
            }
        } else if commands.iter().any(|c| c.trim() == l) {
            last = Some(l.to_string());
        }
    }
    last
}

/// One file of a mount: where it appears in the sandbox and its bytes on the host.
pub struct MountSource<'a> {
    pub remote_path: &'a str,
    pub local: &'a Path,
    pub mode: u32,
}

/// A mount holding `files`, content-addressed: each file is offered by its
/// sha256 first (`MountPutFile` without data) and uploaded only when Modal
/// does not have it (inline, or through the blob store when large), so one
/// version of the agent is uploaded once.
pub async fn mount(modal: &Modal, app_id: &str, files: &[MountSource<'_>]) -> Result<String, ModalError> {
    let mut entries = Vec::new();
    for f in files {
        let data = tokio::fs::read(f.local).await.map_err(|e| ModalError::Io {
            action: format!("read `{}`", f.local.display()),
            source: e,
        })?;
        let sha = hex(&sha2::Sha256::digest(&data));
        let probe = proto::MountPutFileRequest {
            sha256_hex: sha.clone(),
            data_oneof: None,
        };
        let exists = modal
            .call("MountPutFile", probe, |mut c, r| async move {
                c.mount_put_file(r).await
            })
            .await
            .map_err(ModalError::rpc("MountPutFile"))?
            .exists;
        if !exists {
            let payload = if data.len() < LARGE_FILE_LIMIT {
                proto::mount_put_file_request::DataOneof::Data(data.clone())
            } else {
                proto::mount_put_file_request::DataOneof::DataBlobId(
                    crate::blob::upload(modal, &data, &f.local.display().to_string()).await?,
                )
            };
            let put = proto::MountPutFileRequest {
                sha256_hex: sha.clone(),
                data_oneof: Some(payload),
            };
            let exists = modal
                .call("MountPutFile", put.clone(), |mut c, r| async move {
                    c.mount_put_file(r).await
                })
                .await
                .map_err(ModalError::rpc("MountPutFile"))?
                .exists;
            if !exists {
                wait_ingested(modal, &put, &f.local.display().to_string(), INGEST_WAIT).await?;
            }
        }
        entries.push(proto::MountFile {
            filename: f.remote_path.into(),
            sha256_hex: sha,
            size: data.len() as u64,
            mode: f.mode,
        });
    }
    let req = proto::MountGetOrCreateRequest {
        deployment_name: String::new(),
        environment_name: modal.environment().into(),
        object_creation_type: ObjectCreationType::AnonymousOwnedByApp as i32,
        files: entries,
        app_id: app_id.into(),
    };
    let resp = modal
        .call("MountGetOrCreate", req, |mut c, r| async move {
            c.mount_get_or_create(r).await
        })
        .await
        .map_err(ModalError::rpc("MountGetOrCreate"))?;
    Ok(resp.mount_id)
}

/// After an upload Modal answered `exists: false` (not there yet, or its
/// bytes to be sent again): send the same data-carrying `MountPutFile`
/// again (the bytes inline, or the same blob id) until it says `exists:
/// true`, for at most `wait`, as the official client's loop does
/// (`modal/mount.py`: the request with its data, sent again until
/// `response.exists`, within `MOUNT_PUT_FILE_CLIENT_TIMEOUT`). A question by
/// digest alone would never be answered `true` by a server that needs the
/// bytes again. Between sends a doubling pause ([`INGEST_POLL`] to
/// [`INGEST_POLL_MAX`]) spares the server (the official client sends at
/// once). A mount made before that fails with `FAILED_PRECONDITION`.
pub async fn wait_ingested(
    modal: &Modal,
    put: &proto::MountPutFileRequest,
    name: &str,
    wait: Duration,
) -> Result<(), ModalError> {
    let started = tokio::time::Instant::now();
    let mut pause = INGEST_POLL;
    loop {
        if started.elapsed() + pause > wait {
            return Err(ModalError::Upload {
                file: name.into(),
                message: format!(
                    "Modal had not ingested it (`MountPutFile` answered `exists: false`) {:.0}s after the upload",
                    wait.as_secs_f64()
                ),
            });
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(INGEST_POLL_MAX);
        let exists = modal
            .call("MountPutFile", put.clone(), |mut c, r| async move {
                c.mount_put_file(r).await
            })
            .await
            .map_err(ModalError::rpc("MountPutFile"))?
            .exists;
        if exists {
            return Ok(());
        }
    }
}

/// An app-owned secret holding `env` (names and values; values never leave
/// this call but to Modal).
pub async fn secret(modal: &Modal, app_id: &str, env: &[(String, String)]) -> Result<String, ModalError> {
    let req = proto::SecretGetOrCreateRequest {
        deployment_name: String::new(),
        environment_name: modal.environment().into(),
        object_creation_type: ObjectCreationType::AnonymousOwnedByApp as i32,
        env_dict: env.iter().cloned().collect(),
        app_id: app_id.into(),
    };
    let resp = modal
        .call("SecretGetOrCreate", req, |mut c, r| async move {
            c.secret_get_or_create(r).await
        })
        .await
        .map_err(ModalError::rpc("SecretGetOrCreate"))?;
    Ok(resp.secret_id)
}

/// A named volume: `None` when it does not exist and `create` is false.
pub async fn volume(modal: &Modal, name: &str, create: bool) -> Result<Option<String>, ModalError> {
    let req = proto::VolumeGetOrCreateRequest {
        deployment_name: name.into(),
        environment_name: modal.environment().into(),
        object_creation_type: if create {
            ObjectCreationType::CreateIfMissing as i32
        } else {
            ObjectCreationType::Unspecified as i32
        },
        app_id: String::new(),
        version: if create {
            proto::VolumeFsVersion::V2 as i32
        } else {
            proto::VolumeFsVersion::Unspecified as i32
        },
    };
    match modal
        .call("VolumeGetOrCreate", req, |mut c, r| async move {
            c.volume_get_or_create(r).await
        })
        .await
    {
        Ok(r) => Ok(Some(r.volume_id)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(ModalError::rpc("VolumeGetOrCreate")(s)),
    }
}

/// A small file of a volume (`VolumeGetFile2`, then HTTP `GET` of its
/// blocks); `None` when it does not exist.
pub async fn volume_file(modal: &Modal, volume_id: &str, path: &str) -> Result<Option<Vec<u8>>, ModalError> {
    let req = proto::VolumeGetFile2Request {
        volume_id: volume_id.into(),
        path: path.into(),
        start: 0,
        len: 0,
    };
    let resp = match modal
        .call("VolumeGetFile2", req, |mut c, r| async move {
            c.volume_get_file2(r).await
        })
        .await
    {
        Ok(r) => r,
        Err(s) if s.code() == tonic::Code::NotFound => return Ok(None),
        Err(s) => return Err(ModalError::rpc("VolumeGetFile2")(s)),
    };
    let client = reqwest::Client::new();
    let mut data = Vec::with_capacity(resp.size as usize);
    for url in &resp.get_urls {
        let bytes = async {
            let r = client.get(url).send().await?.error_for_status()?;
            r.bytes().await
        }
        .await
        // The URL is presigned: never show it.
        .map_err(|e| ModalError::Upload {
            file: path.into(),
            message: format!("reading it from the volume failed ({})", e.without_url()),
        })?;
        data.extend_from_slice(&bytes);
    }
    data.truncate(resp.size as usize);
    Ok(Some(data))
}

/// What the official client sends with every sandbox that does not block
/// the network: `network_access {network_access_type: OPEN}`.
pub fn open_network() -> proto::NetworkAccess {
    proto::NetworkAccess {
        network_access_type: proto::network_access::NetworkAccessType::Open as i32,
        allowed_cidrs: vec![],
        allowed_domains: vec![],
    }
}

/// `SandboxCreate`, with `network_access` `OPEN` when the definition says
/// nothing (as the official client sends it). A throttled answer is waited
/// out and sent again under the same idempotency key ([`Modal::call`]).
pub async fn sandbox_create(
    modal: &Modal,
    app_id: &str,
    definition: proto::Sandbox,
    tags: &[(&str, &str)],
) -> Result<String, tonic::Status> {
    let mut definition = definition;
    if definition.network_access.is_none() {
        definition.network_access = Some(open_network());
    }
    let req = proto::SandboxCreateRequest {
        app_id: app_id.into(),
        definition: Some(definition),
        environment_name: modal.environment().into(),
        tags: tags
            .iter()
            .map(|(k, v)| proto::SandboxTag {
                tag_name: (*k).into(),
                tag_value: (*v).into(),
            })
            .collect(),
    };
    Ok(modal
        .call("SandboxCreate", req, |mut c, r| async move {
            c.sandbox_create(r).await
        })
        .await?
        .sandbox_id)
}

/// How a sandbox's scheduling ended.
#[derive(Debug)]
pub enum Scheduled {
    /// It has a task (a container is starting or running).
    Running,
    /// It ended before or while starting.
    Ended(GenericResult),
    /// No task within the wait (no capacity for the GPU type asked).
    NotScheduled,
}

/// Wait until the sandbox has a task (`SandboxGetTaskId`), at most `wait`: long
/// polls (the server answers when the task is there or the request's `timeout`,
/// at most 55 s, as the official client's `wait_until_ready` asks), one call a
/// cell at a time; after an empty answer the next goes after the official
/// client's 0.5 s poll interval (`_TASK_ID_POLL_INTERVAL`), so a server that
/// does not hold the call is not asked more often than the official client asks.
pub async fn sandbox_scheduled(modal: &Modal, id: &str, wait: Duration) -> Result<Scheduled, ModalError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let req = proto::SandboxGetTaskIdRequest {
            sandbox_id: id.into(),
            timeout: left.as_secs_f32().clamp(0.0, 55.0),
            wait_until_ready: false,
        };
        let r = modal
            .call("SandboxGetTaskId", req, |mut c, r| async move {
                c.sandbox_get_task_id(r).await
            })
            .await
            .map_err(ModalError::rpc("SandboxGetTaskId"))?;
        if let Some(res) = r
            .task_result
            .filter(|r| r.status != GenericStatus::Unspecified as i32)
        {
            return Ok(Scheduled::Ended(res));
        }
        if !r.task_id.is_empty() {
            return Ok(Scheduled::Running);
        }
        if left.is_zero() {
            return Ok(Scheduled::NotScheduled);
        }
        tokio::time::sleep(Duration::from_millis(500).min(left)).await;
    }
}

/// `SandboxWait` until the sandbox has a result: long polls of 50 s (the official
/// client's are 10 s), one call a cell at a time.
pub async fn sandbox_wait(modal: &Modal, id: &str) -> Result<GenericResult, ModalError> {
    loop {
        let req = proto::SandboxWaitRequest {
            sandbox_id: id.into(),
            timeout: 50.0,
        };
        let r = modal
            .call(
                "SandboxWait",
                req,
                |mut c, r| async move { c.sandbox_wait(r).await },
            )
            .await
            .map_err(ModalError::rpc("SandboxWait"))?;
        if let Some(res) = r.result.filter(|r| r.status != GenericStatus::Unspecified as i32) {
            return Ok(res);
        }
    }
}

pub async fn sandbox_terminate(modal: &Modal, id: &str) -> Result<(), ModalError> {
    let req = proto::SandboxTerminateRequest {
        sandbox_id: id.into(),
    };
    modal
        .call("SandboxTerminate", req, |mut c, r| async move {
            c.sandbox_terminate(r).await
        })
        .await
        .map_err(ModalError::rpc("SandboxTerminate"))?;
    Ok(())
}

/// Running sandboxes of the app carrying every tag given.
pub async fn sandbox_list(
    modal: &Modal,
    app_id: &str,
    tags: &[(&str, &str)],
) -> Result<Vec<String>, ModalError> {
    let mut ids = Vec::new();
    let mut before = 0.0;
    loop {
        let req = proto::SandboxListRequest {
            app_id: app_id.into(),
            before_timestamp: before,
            environment_name: modal.environment().into(),
            include_finished: false,
            tags: tags
                .iter()
                .map(|(k, v)| proto::SandboxTag {
                    tag_name: (*k).into(),
                    tag_value: (*v).into(),
                })
                .collect(),
        };
        let r = modal
            .call(
                "SandboxList",
                req,
                |mut c, r| async move { c.sandbox_list(r).await },
            )
            .await
            .map_err(ModalError::rpc("SandboxList"))?;
        if r.sandboxes.is_empty() {
            return Ok(ids);
        }
        let oldest = r
            .sandboxes
            .iter()
            .map(|s| s.created_at)
            .fold(f64::INFINITY, f64::min);
        for s in r.sandboxes {
            if !ids.contains(&s.id) {
                ids.push(s.id);
            }
        }
        if !(oldest.is_finite() && oldest > 0.0) || (before > 0.0 && oldest >= before) {
            return Ok(ids);
        }
        before = oldest;
    }
}

/// Read one stream of a sandbox (`SandboxGetLogs`) until EOF, resuming from
/// the last entry id after a dropped or timed-out stream; `chunk` gets the
/// data as it comes.
pub async fn sandbox_logs(
    modal: &Modal,
    id: &str,
    fd: proto::FileDescriptor,
    mut chunk: impl FnMut(&str),
) -> Result<(), ModalError> {
    let mut last_entry_id = String::new();
    let mut failures = 0u32;
    loop {
        let req = proto::SandboxGetLogsRequest {
            sandbox_id: id.into(),
            file_descriptor: fd as i32,
            timeout: 55.0,
            last_entry_id: last_entry_id.clone(),
        };
        let req = modal.stream_request(req).await;
        let mut stream = match modal.stub().sandbox_get_logs(req).await {
            Ok(s) => s.into_inner(),
            // Throttled: asked again after its retry-after (no count: the server said when).
            Err(s) if crate::client::retry_after(&s).is_some() => {
                tokio::time::sleep(throttle_wait(&s)).await;
                continue;
            }
            Err(s) if crate::client::is_transient(s.code()) && failures < 20 => {
                failures += 1;
                tokio::time::sleep(Duration::from_millis(100 * u64::from(failures.min(10)))).await;
                continue;
            }
            Err(s) => return Err(ModalError::rpc("SandboxGetLogs")(s)),
        };
        loop {
            match stream.message().await {
                Ok(Some(batch)) => {
                    failures = 0;
                    if !batch.entry_id.is_empty() {
                        last_entry_id = batch.entry_id.clone();
                    }
                    for item in &batch.items {
                        chunk(&item.data);
                    }
                    if batch.eof {
                        return Ok(());
                    }
                }
                // The server ended this call (its timeout): ask again from the last entry.
                Ok(None) => break,
                Err(s) if crate::client::is_transient(s.code()) && failures < 20 => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(failures.min(10)))).await;
                    break;
                }
                Err(s) => return Err(ModalError::rpc("SandboxGetLogs")(s)),
            }
        }
    }
}

/// How long a stream's throttled opening waits before it is asked again: the
/// answer's retry-after, at least the official client's 0.1 s.
fn throttle_wait(s: &tonic::Status) -> Duration {
    crate::client::retry_after(s)
        .unwrap_or_default()
        .max(crate::client::MIN_THROTTLE_WAIT)
}

/// `H100:8` → (`H100`, 8); `H100!` (pinned) stays as written; `none` → `None`.
pub fn gpu_config(gpu: &orch_protocol::GpuRequest, pin: bool) -> Option<proto::GpuConfig> {
    let count = gpu.count();
    let mut ty = gpu.kind()?.to_string();
    if pin && !ty.ends_with('!') {
        ty.push('!');
    }
    Some(proto::GpuConfig { count, gpu_type: ty })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerfiles_become_instructions() {
        let d = "# c\nFROM python:3.11\n\nRUN apt-get update && \\\n    apt-get install -y curl\nCOPY a /a\n";
        let s = ImageSpec::dockerfile("x", d, vec![]);
        assert_eq!(
            s.commands,
            [
                "FROM python:3.11",
                "RUN apt-get update && apt-get install -y curl",
                "COPY a /a"
            ]
        );
    }

    #[test]
    fn only_a_dockerfile_that_copies_gets_a_context_mount() {
        let c = |t: &str| ImageSpec::dockerfile("x", t, vec![]).commands;
        assert!(reads_context(&c("FROM a\nCOPY x /x\n")));
        assert!(reads_context(&c("FROM a\ncopy --chmod=755 x /x\n")));
        assert!(reads_context(&c("FROM a\nADD x.tar /x\n")));
        assert!(!reads_context(&c("FROM a\nCOPY --from=builder /a /a\n")));
        assert!(!reads_context(&c("FROM a\nRUN echo COPY x\n")));
    }

    #[test]
    fn gpu_specs_become_gpu_configs() {
        let g = gpu_config(&"H100:8".into(), false).unwrap();
        assert_eq!((g.gpu_type.as_str(), g.count), ("H100", 8));
        let g = gpu_config(&"H100".into(), true).unwrap();
        assert_eq!((g.gpu_type.as_str(), g.count), ("H100!", 1));
        let g = gpu_config(&"A100-80GB:2".into(), false).unwrap();
        assert_eq!((g.gpu_type.as_str(), g.count), ("A100-80GB", 2));
        assert!(gpu_config(&"none".into(), false).is_none());
    }

    #[test]
    fn the_failing_step_is_read_from_the_build_log() {
        let log = "Step 1/3 : FROM python:3.11\nStep 2/3 : RUN pip install torch\n ok\nStep 3/3 : RUN pip install nope==9\nERROR: No matching distribution found for nope==9\n";
        assert_eq!(failing_step(log, &[]).as_deref(), Some("RUN pip install nope==9"));
        let bk = "=> [1/2] FROM docker.io/library/python:3.11\n=> ERROR [2/2] RUN false\n";
        assert_eq!(failing_step(bk, &[]).as_deref(), Some("RUN false"));
        let plain = "RUN apt-get install -y nothing\nE: Unable to locate package nothing\n";
        assert_eq!(
            failing_step(plain, &["RUN apt-get install -y nothing".into()]).as_deref(),
            Some("RUN apt-get install -y nothing")
        );
    }
}
