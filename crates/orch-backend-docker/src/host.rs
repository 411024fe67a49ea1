//! The docker backend's host side: the weights are Docker's named volume
//! (`orch-weights`, its folder on this host filled by `orch setup --backend
//! docker`), built images must be in the engine, and cells share this
//! host's GPUs.

use crate::{weights_volume_dir, DockerBackend, WEIGHTS_VOLUME};
use async_trait::async_trait;
use orch_backend::host::{Flags, Host, Images, Kind, Weights};
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
