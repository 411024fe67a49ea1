//! `orch setup --backend modal`: the weights volume is filled from inside a
//! sandbox (the download runs next to the volume, not through this host):
//! the static `orch` is mounted at `/orch/orch` (content-addressed, uploaded
//! once per version) and runs `orch setup ... --weights-dir /weights` with
//! the volume mounted read-write, so resume and verification are those of
//! every `orch setup`. The in-sandbox `orch setup` syncs the weights folder
//! (`syncfs`) before it exits, and Modal commits the volume when the sandbox
//! ends. `weights_complete` answers `orch plan`: the repo's ref and orch's
//! completeness marker, read from the volume without a sandbox.

use crate::client::Modal;
use crate::ops::{self, ImageSpec, MountSource, Scheduled};
use crate::proto::{self, generic_result::GenericStatus};
use crate::{ModalError, ORCH_PATH, WEIGHTS_MOUNT};
use std::path::PathBuf;
use std::time::Duration;

/// The image setup sandboxes use when none is given
/// (`ORCH_MODAL_SETUP_IMAGE`): any image with CA certificates will do.
pub use orch_backend::host::DEFAULT_SETUP_IMAGE;

pub struct SetupJob {
    pub app_name: String,
    pub volume: String,
    pub image: ImageSpec,
    /// The static `orch` to run in the sandbox.
    pub orch: PathBuf,
    /// Arguments after `orch` (`setup --model ... --weights-dir /weights`).
    pub args: Vec<String>,
    /// Extra files to mount (remote path, local file): the suite manifest.
    pub files: Vec<(String, PathBuf)>,
    /// Secret environment (`HF_TOKEN`), as an app-owned secret.
    pub secrets: Vec<(String, String)>,
    pub timeout: Duration,
}

/// What the sandbox did.
pub struct SetupOutcome {
    pub sandbox_id: String,
    pub exit_code: i32,
    pub status: String,
    pub message: String,
}

/// Run the setup sandbox to its end; its stdout and stderr go to `out`
/// (`true` for stderr) as they arrive.
pub async fn run(
    modal: &Modal,
    job: &SetupJob,
    mut out: impl FnMut(bool, &str) + Send,
) -> Result<SetupOutcome, ModalError> {
    let app_id = ops::app(modal, &job.app_name).await?;
    let volume_id = ops::volume(modal, &job.volume, true)
        .await?
        .ok_or_else(|| ModalError::Unavailable {
            message: format!("the volume `{}` could not be created", job.volume),
            hint: "check the Modal environment (`MODAL_ENVIRONMENT`)".into(),
        })?;
    let builder = ops::builder_version(modal).await;
    let built = ops::image(modal, &app_id, &job.image, &builder, |t| out(true, t)).await?;
    let mut files = vec![MountSource {
        remote_path: ORCH_PATH,
        local: &job.orch,
        mode: 0o755,
    }];
    for (remote, local) in &job.files {
        files.push(MountSource {
            remote_path: remote,
            local,
            mode: 0o644,
        });
    }
    let mount_id = ops::mount(modal, &app_id, &files).await?;
    let secret_ids = if job.secrets.is_empty() {
        vec![]
    } else {
        vec![ops::secret(modal, &app_id, &job.secrets).await?]
    };
    let mut entrypoint = vec![ORCH_PATH.to_string()];
    entrypoint.extend(job.args.iter().cloned());
    let definition = proto::Sandbox {
        entrypoint_args: entrypoint,
        mount_ids: vec![mount_id],
        image_id: built.image_id,
        secret_ids,
        resources: Some(proto::Resources {
            memory_mb: 4096,
            milli_cpu: 4000,
            gpu_config: None,
            memory_mb_max: 0,
            milli_cpu_max: 0,
        }),
        timeout_secs: job.timeout.as_secs().max(60) as u32,
        workdir: String::new(),
        volume_mounts: vec![proto::VolumeMount {
            volume_id,
            mount_path: WEIGHTS_MOUNT.into(),
            allow_background_commits: true,
            read_only: false,
        }],
        network_access: Some(ops::open_network()),
        name: String::new(),
    };
    let id = ops::sandbox_create(modal, &app_id, definition, &[("orch.setup", &job.volume)])
        .await
        .map_err(ModalError::rpc("SandboxCreate"))?;
    if let Scheduled::NotScheduled = ops::sandbox_scheduled(modal, &id, Duration::from_secs(1800)).await? {
        let _ = ops::sandbox_terminate(modal, &id).await;
        return Err(ModalError::Unavailable {
            message: "the setup sandbox was not scheduled within 30 minutes".into(),
            hint: "try again later".into(),
        });
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, String)>();
    let streams = {
        let (m1, m2, i1, i2, t1, t2) = (
            modal.clone(),
            modal.clone(),
            id.clone(),
            id.clone(),
            tx.clone(),
            tx,
        );
        let a = tokio::spawn(async move {
            ops::sandbox_logs(&m1, &i1, proto::FileDescriptor::Stdout, |s| {
                let _ = t1.send((false, s.to_string()));
            })
            .await
        });
        let b = tokio::spawn(async move {
            ops::sandbox_logs(&m2, &i2, proto::FileDescriptor::Stderr, |s| {
                let _ = t2.send((true, s.to_string()));
            })
            .await
        });
        (a, b)
    };
    while let Some((err, text)) = rx.recv().await {
        out(err, &text);
    }
    let _ = streams.0.await;
    let _ = streams.1.await;
    let end = ops::sandbox_wait(modal, &id).await?;
    let status = GenericStatus::try_from(end.status).unwrap_or(GenericStatus::Unspecified);
    Ok(SetupOutcome {
        sandbox_id: id,
        exit_code: if status == GenericStatus::Success {
            0
        } else {
            end.exitcode.max(1)
        },
        status: status.as_str_name().to_string(),
        message: end.exception,
    })
}

/// The commit of `repo_folder` (`models--org--name`) at `revision` when
/// orch's completeness marker for it is in the volume: `Ok(None)` when the
/// volume, the ref or the marker is missing.
pub async fn weights_complete(
    modal: &Modal,
    volume: &str,
    repo_folder: &str,
    revision: &str,
) -> Result<Option<String>, ModalError> {
    let Some(vid) = ops::volume(modal, volume, false).await? else {
        return Ok(None);
    };
    let is_commit = revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit());
    let commit = if is_commit {
        revision.to_string()
    } else {
        match ops::volume_file(modal, &vid, &format!("{repo_folder}/refs/{revision}")).await? {
            Some(b) => String::from_utf8_lossy(&b).trim().to_string(),
            None => return Ok(None),
        }
    };
    let marker = format!("{repo_folder}/.orch/complete-{commit}.json");
    Ok(ops::volume_file(modal, &vid, &marker).await?.map(|_| commit))
}
