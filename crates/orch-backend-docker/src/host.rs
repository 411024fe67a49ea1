//! The docker backend's host side: the weights are Docker's named volume
//! (`orch-weights`, its folder on this host filled by `orch setup --backend
//! docker`), built images must be in the engine, and cells share this
//! host's GPUs.

use crate::{weights_volume_dir, DockerBackend, WEIGHTS_VOLUME};
use async_trait::async_trait;
use orch_backend::host::{static_agent_check, Check, Flags, Host, Images, Kind, Weights};
use orch_backend::{Backend, BackendError};
use orch_manifest::{ImageDef, Plan};
use std::sync::Arc;

pub struct DockerHost {
    pub flags: Flags,
}

#[async_trait]
impl Host for DockerHost {
    fn kind(&self) -> Kind {
        Kind::Docker
    }

    async fn weights(&self, _plan: Option<&Plan>, create: bool) -> Result<Weights, BackendError> {
        Ok(Weights::DockerVolume {
            name: WEIGHTS_VOLUME.into(),
            dir: weights_volume_dir(create).await?,
        })
    }

    async fn backend(&self, plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError> {
        let agent = orch_backend::find_static_agent()?;
        let docker = DockerBackend::connect(agent, self.flags.keep)?;
        docker.preflight().await?;
        let images = resolve_images(plan, docker.client()).await?;
        Ok((Arc::new(docker), images))
    }

    async fn down(&self, run_id: &str, _plan: &Plan) -> Result<String, BackendError> {
        // Removing containers needs no agent.
        let backend = DockerBackend::connect(std::path::PathBuf::new(), false)?;
        backend.cleanup(run_id).await?;
        Ok(format!("removed what run {run_id} left on docker"))
    }

    fn shares_host_gpus(&self) -> bool {
        true
    }

    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        doctor(plan).await
    }
}

/// `orch doctor --backend docker`: the engine answering, the NVIDIA
/// runtime, the static agent, the weights volume and the suite's images.
async fn doctor(plan: Option<&Plan>) -> Vec<Check> {
    let start_docker = "start Docker (`docker info` answers), or set `DOCKER_HOST`";
    let socket = std::path::Path::new("/var/run/docker.sock");
    if std::env::var_os("DOCKER_HOST").is_none_or(|h| h.is_empty()) && !socket.exists() {
        return vec![Check::skipped(
            "engine",
            "no Docker engine here (no `DOCKER_HOST`, no `/var/run/docker.sock`)",
            "install Docker and its NVIDIA container toolkit, or set `DOCKER_HOST`",
        )];
    }
    let docker = match bollard::Docker::connect_with_local_defaults() {
        Ok(d) => d,
        Err(e) => {
            return vec![Check::fail(
                "engine",
                format!("cannot connect: {e}"),
                start_docker,
            )]
        }
    };
    let limit = std::time::Duration::from_secs(10);
    let version = match tokio::time::timeout(limit, docker.version()).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            return vec![Check::fail(
                "engine",
                format!("the engine did not answer: {e}"),
                start_docker,
            )]
        }
        Err(_) => {
            return vec![Check::fail(
                "engine",
                "the engine did not answer within 10 s",
                start_docker,
            )]
        }
    };
    let mut out = vec![Check::ok(
        "engine",
        format!(
            "Docker {} (API {})",
            version.version.unwrap_or_default(),
            version.api_version.unwrap_or_default()
        ),
    )];
    match tokio::time::timeout(limit, docker.info()).await {
        Ok(Ok(info)) => {
            let runtimes: Vec<String> = info.runtimes.map(|r| r.into_keys().collect()).unwrap_or_default();
            if runtimes.iter().any(|r| r == "nvidia") {
                out.push(Check::ok(
                    "nvidia runtime",
                    "the engine lists the `nvidia` runtime",
                ));
            } else {
                out.push(Check::warn(
                    "nvidia runtime",
                    format!(
                        "the engine lists no `nvidia` runtime (runtimes: {}): GPU cells ask for GPUs by device request and fail where the engine has no GPU driver",
                        if runtimes.is_empty() { "none".to_string() } else { runtimes.join(", ") }
                    ),
                    "install the NVIDIA container toolkit and run `nvidia-ctk runtime configure --runtime=docker` (CPU cells run without it)",
                ));
            }
        }
        Ok(Err(e)) => out.push(Check::warn(
            "nvidia runtime",
            format!("`docker info` failed: {e}"),
            start_docker,
        )),
        Err(_) => out.push(Check::warn(
            "nvidia runtime",
            "`docker info` did not answer within 10 s",
            start_docker,
        )),
    }
    out.push(static_agent_check());
    out.push(match docker.inspect_volume(WEIGHTS_VOLUME).await {
        Ok(_) => Check::ok("weights", format!("docker volume `{WEIGHTS_VOLUME}`")),
        Err(_) => Check::ok(
            "weights",
            format!("docker volume `{WEIGHTS_VOLUME}` (made by the first `orch setup --backend docker`)"),
        ),
    });
    if let Some(plan) = plan {
        let built = plan
            .cells
            .iter()
            .any(|c| matches!(c.image, Some(ImageDef::Build(_))));
        if built {
            out.push(match resolve_images(plan, &docker).await {
                Ok(_) => Check::ok("images", "every image the suite builds is in the engine"),
                Err(e) => Check::warn(
                    "images",
                    orch_backend::host::first_line(&e.to_string()),
                    format!("`orch build -f {}`", plan.manifest.display()),
                ),
            });
        }
    }
    out
}

/// An images error: the user's to fix, or the engine's.
pub fn image_err(e: orch_images::ImageError) -> BackendError {
    if e.is_user_error() {
        BackendError::User(e.to_string())
    } else {
        BackendError::Unavailable {
            backend: "docker",
            message: e.to_string(),
            hint: "check that Docker runs (`docker info`), or set `DOCKER_HOST`".into(),
        }
    }
}

/// The image of each cell; a built image that is missing (or changed
/// since it was built) refuses the run.
pub async fn resolve_images(plan: &Plan, docker: &bollard::Docker) -> Result<Images, BackendError> {
    // A cell with no image cannot start in a container: refused before the
    // run, not a failed cell each.
    let bare: Vec<&str> = plan
        .cells
        .iter()
        .filter(|c| c.image.is_none())
        .map(|c| c.id.as_str())
        .collect();
    if let Some(first) = bare.first() {
        return Err(BackendError::User(format!(
            "`{}`: cell `{first}`{} names no `image`, and the docker backend runs every cell in one\nhint: add `image: REF` (an image in the engine: `docker images`) or `image: {{build: NAME}}` (built from `containers/NAME/`) to the suite, or run it with `--backend local`",
            plan.manifest.display(),
            match bare.len() {
                1 => String::new(),
                n => format!(" (and {} more)", n - 1),
            }
        )));
    }
    let specs = orch_images::plan_specs(plan).map_err(image_err)?;
    let mut tags = Images::new();
    for (name, spec) in &specs {
        let tag = orch_images::resolve_tag(spec).map_err(image_err)?;
        if !orch_images::exists(docker, &tag).await.map_err(image_err)? {
            return Err(BackendError::User(format!(
                "image `{name}` is not built (or changed since): `{tag}` is not in the engine\nhint: run `orch build -f {}`",
                plan.manifest.display()
            )));
        }
        tags.insert(name.clone(), tag);
    }
    let mut out = Images::new();
    for c in &plan.cells {
        match &c.image {
            Some(ImageDef::Ref(r)) => {
                out.insert(c.id.clone(), r.clone());
            }
            Some(ImageDef::Build(b)) => {
                if let Some(t) = tags.get(&b.build) {
                    out.insert(c.id.clone(), t.clone());
                }
            }
            None => {}
        }
    }
    Ok(out)
}
