//! The modal backend's host side: the connection, each cell's image as
//! Modal builds it, the weights check against the volume, `orch setup
//! --backend modal` (the download in a sandbox) and `orch down`.

use crate::ops::ImageSpec;
use crate::{Credentials, Modal, ModalBackend};
use async_trait::async_trait;
use orch_backend::host::{
    first_line, model_requests, static_agent_check, Check, DefaultJobs, Flags, Host, Images, Kind,
    ModelCheck, OnLine, SetupPlace, SetupRequest, Weights,
};
use orch_backend::{Backend, BackendError};
use orch_manifest::{ImageDef, Plan};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// Modal's concurrency limits on its Starter plan (modal.com/pricing): GPUs
/// and containers running at once in a workspace; more wait in Modal's queue.
pub const GPU_CONCURRENCY: usize = 10;
pub const CONTAINER_CONCURRENCY: usize = 100;

/// Cells at once by default: as many as Modal runs at once for the plan.
pub fn default_jobs(plan: &Plan) -> DefaultJobs {
    let widest = plan.cells.iter().map(|c| c.gpu.count as usize).max().unwrap_or(0);
    if widest == 0 {
        return DefaultJobs::new(
            CONTAINER_CONCURRENCY,
            format!("Modal's {CONTAINER_CONCURRENCY} containers at once"),
        );
    }
    DefaultJobs::new(
        GPU_CONCURRENCY / widest,
        format!("Modal's {GPU_CONCURRENCY} GPUs at once, cells of up to {widest} GPU(s)"),
    )
}

fn user(message: String) -> BackendError {
    BackendError::User(message)
}

fn image_err(e: orch_images::ImageError) -> BackendError {
    user(e.to_string())
}

/// The weights volume: `ORCH_MODAL_VOLUME`, else `orch-weights`.
pub fn volume_name() -> String {
    std::env::var("ORCH_MODAL_VOLUME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| crate::WEIGHTS_VOLUME.into())
}

pub fn connect() -> Result<Modal, BackendError> {
    let creds = Credentials::from_env().map_err(BackendError::from)?;
    Ok(Modal::connect(creds)?)
}

/// The image of a cell without `image:` (`ORCH_MODAL_IMAGE`, else a small
/// Debian: the static agent needs nothing from the image).
fn default_image() -> String {
    std::env::var("ORCH_MODAL_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "debian:bookworm-slim".into())
}

/// Each cell's image key, and the image behind each key: `image: REF` is
/// Modal's `from_registry`; `image: {build: NAME}` sends
/// `containers/NAME/Dockerfile`'s instructions with its context files.
pub fn images(plan: &Plan) -> Result<(Images, HashMap<String, ImageSpec>), BackendError> {
    let mut per_cell = BTreeMap::new();
    let mut specs = HashMap::new();
    for c in &plan.cells {
        let key = match &c.image {
            None => {
                let r = default_image();
                specs.entry(r.clone()).or_insert_with(|| ImageSpec::registry(&r));
                r
            }
            Some(ImageDef::Ref(r)) => {
                specs.entry(r.clone()).or_insert_with(|| ImageSpec::registry(r));
                r.clone()
            }
            Some(ImageDef::Build(b)) => {
                let key = format!("{{build: {}}}", b.build);
                if !specs.contains_key(&key) {
                    let context = orch_images::find_context(&plan.manifest, &b.build).map_err(image_err)?;
                    let dockerfile = b.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into());
                    let text = std::fs::read_to_string(context.join(&dockerfile)).map_err(|e| {
                        user(format!(
                            "cannot read `{}`: {e}\nhint: `image: {{build: {}}}` needs `containers/{}/{dockerfile}`",
                            context.join(&dockerfile).display(),
                            b.build,
                            b.build
                        ))
                    })?;
                    // As the official client does: only what the Dockerfile's
                    // `COPY`/`ADD` can read travels (less `.dockerignore`).
                    let sources = orch_images::copy_sources(&text);
                    let all = orch_images::context_files(&context).map_err(image_err)?;
                    let files = orch_images::filter_files(all, &sources, &[])
                        .into_iter()
                        .map(|p| {
                            let abs = if p.is_absolute() {
                                p.clone()
                            } else {
                                context.join(&p)
                            };
                            let rel = abs
                                .strip_prefix(&context)
                                .unwrap_or(&p)
                                .to_string_lossy()
                                .to_string();
                            (rel, abs)
                        })
                        .filter(|(rel, _)| *rel != dockerfile)
                        .collect();
                    specs.insert(key.clone(), ImageSpec::dockerfile(&key, &text, files));
                }
                key
            }
        };
        per_cell.insert(c.id.clone(), key);
    }
    Ok((per_cell, specs))
}

/// The suite's models against the weights volume (no sandbox: the ref and
/// orch's completeness marker are read from the volume).
pub async fn check_models(plan: &Plan) -> Result<Vec<ModelCheck>, BackendError> {
    let requests = model_requests(plan);
    if requests.is_empty() {
        return Ok(vec![]);
    }
    let modal = connect()?;
    let volume = volume_name();
    let mut out = Vec::new();
    for r in requests {
        let folder = orch_hub::cache::repo_folder_name(&r.repo, &r.repo_type);
        let commit = crate::setup::weights_complete(&modal, &volume, &folder, &r.revision).await?;
        out.push(ModelCheck::remote(r, commit));
    }
    Ok(out)
}

/// `orch setup --backend modal`: the download runs in a sandbox with the
/// volume mounted read-write at `/weights`.
pub async fn setup(req: &SetupRequest, on_line: OnLine<'_>) -> Result<i32, BackendError> {
    let modal = connect()?;
    let orch = orch_backend::find_static_orch()?;
    let mut files = Vec::new();
    if let Some(f) = &req.file {
        files.push(("/orch/suite.yaml".to_string(), f.clone()));
    }
    let cmd = orch_backend::host::setup_argv(
        req,
        req.file.as_ref().map(|_| "/orch/suite.yaml"),
        crate::WEIGHTS_MOUNT,
    );
    let mut secrets = Vec::new();
    if let Some(t) = orch_hub::token::resolve_token() {
        secrets.push(("HF_TOKEN".to_string(), t.expose().to_string()));
    }
    if let Ok(e) = std::env::var("HF_ENDPOINT") {
        secrets.push(("HF_ENDPOINT".to_string(), e));
    }
    let image = std::env::var("ORCH_MODAL_SETUP_IMAGE")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| crate::setup::DEFAULT_SETUP_IMAGE.into());
    let job = crate::setup::SetupJob {
        app_name: crate::APP_NAME.into(),
        volume: volume_name(),
        image: ImageSpec::registry(&image),
        orch,
        args: cmd,
        files,
        secrets,
        timeout: std::time::Duration::from_secs(24 * 3600),
    };
    on_line(
        false,
        &format!(
            "weights volume: modal volume `{}` (setup runs in a sandbox)\n",
            job.volume
        ),
    );
    let outcome = crate::setup::run(&modal, &job, |err, text| on_line(!err, text)).await?;
    if outcome.exit_code != 0 {
        on_line(
            false,
            &format!(
                "the setup sandbox {} ended {} (exit code {}){}\n",
                outcome.sandbox_id,
                outcome.status,
                outcome.exit_code,
                if outcome.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", outcome.message)
                }
            ),
        );
        // `orch setup` exits 2 for user errors (gated repo...): keep its code.
        return Ok(if outcome.exit_code == 2 { 2 } else { 1 });
    }
    Ok(0)
}

/// The modal backend's host side.
pub struct ModalHost {
    pub flags: Flags,
}

#[async_trait]
impl Host for ModalHost {
    fn kind(&self) -> Kind {
        Kind::Modal
    }

    async fn weights(&self, _plan: Option<&Plan>, _create: bool) -> Result<Weights, BackendError> {
        Ok(Weights::ModalVolume(volume_name()))
    }

    async fn default_jobs(&self, plan: &Plan, _host_gpus: Option<usize>) -> DefaultJobs {
        default_jobs(plan)
    }

    async fn check_models(&self, plan: &Plan, _weights: &Weights) -> Result<Vec<ModelCheck>, BackendError> {
        check_models(plan).await
    }

    async fn backend(&self, plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError> {
        let agent = orch_backend::find_static_agent()?;
        let modal = connect()?;
        let (images, specs) = images(plan)?;
        let opts = crate::backend::ModalOptions {
            weights_volume: volume_name(),
            ..Default::default()
        };
        let backend = ModalBackend::new(modal, agent, specs, opts);
        backend.preflight().await?;
        Ok((Arc::new(backend), images))
    }

    async fn setup(
        &self,
        req: &SetupRequest,
        _plan: Option<&Plan>,
        on_line: OnLine<'_>,
    ) -> Result<SetupPlace, BackendError> {
        setup(req, on_line).await.map(SetupPlace::Ran)
    }

    async fn down(&self, run_id: &str, _plan: &Plan) -> Result<String, BackendError> {
        let backend = ModalBackend::new(connect()?, PathBuf::new(), Default::default(), Default::default());
        backend.cleanup(run_id).await?;
        Ok(format!("terminated every sandbox of run {run_id} on modal"))
    }

    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        doctor(plan).await
    }
}

/// `orch doctor --backend modal`: the token, the workspace answering (a
/// lookup of the weights volume, which creates nothing), the static agent
/// and `orch` a setup sandbox runs, the suite's models on the volume.
async fn doctor(plan: Option<&Plan>) -> Vec<Check> {
    let token_next =
        "run `modal token new` (or `modal token set`), or set `MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET`";
    let creds = match Credentials::from_env() {
        Ok(c) => c,
        Err(e) => {
            let configured = std::env::var_os("MODAL_TOKEN_ID").is_some()
                || crate::config::config_path().is_some_and(|p| p.is_file());
            let detail = first_line(&e.to_string());
            return vec![if configured {
                Check::fail("token", detail, token_next)
            } else {
                Check::skipped("token", detail, token_next)
            }];
        }
    };
    let mut out = vec![Check::ok("token", format!("from {}", creds.source))];
    let server = creds.server_url.clone();
    let modal = match Modal::connect(creds) {
        Ok(m) => m,
        Err(e) => {
            out.push(Check::fail(
                "workspace",
                first_line(&e.to_string()),
                "check `MODAL_SERVER_URL`",
            ));
            return out;
        }
    };
    let volume = volume_name();
    let looked = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        crate::ops::volume(&modal, &volume, false),
    )
    .await;
    match looked {
        Ok(Ok(found)) => {
            out.push(Check::ok(
                "workspace",
                format!(
                    "{server} answers{}",
                    if modal.environment().is_empty() {
                        String::new()
                    } else {
                        format!(" (environment `{}`)", modal.environment())
                    }
                ),
            ));
            out.push(match found {
                Some(_) => Check::ok("weights", format!("modal volume `{volume}`")),
                None => Check::ok(
                    "weights",
                    format!("modal volume `{volume}` (made by the first `orch setup --backend modal`)"),
                ),
            });
            if let Some(plan) = plan.filter(|p| !p.models.is_empty()) {
                out.push(match check_models(plan).await {
                    Ok(models) => {
                        let missing: Vec<String> = models
                            .iter()
                            .filter(|m| !m.complete)
                            .map(|m| format!("{}@{}", m.repo, m.revision))
                            .collect();
                        if missing.is_empty() {
                            Check::ok(
                                "models",
                                format!("{} model(s) of the suite on the volume", models.len()),
                            )
                        } else {
                            Check::warn(
                                "models",
                                format!("not on the volume: {}", missing.join(", ")),
                                format!("`orch setup --backend modal -f {}`", plan.manifest.display()),
                            )
                        }
                    }
                    Err(e) => Check::warn(
                        "models",
                        first_line(&e.to_string()),
                        "check the volume in Modal's dashboard",
                    ),
                });
            }
        }
        Ok(Err(e)) => out.push(Check::fail(
            "workspace",
            first_line(&e.to_string()),
            "check the token's workspace (`modal profile current`, `modal token new`)",
        )),
        Err(_) => out.push(Check::fail(
            "workspace",
            format!("{server} did not answer within 20 s"),
            "check the network, or `MODAL_SERVER_URL`",
        )),
    }
    out.push(static_agent_check());
    out.push(match orch_backend::find_static_orch() {
        Ok(p) => Check::ok(
            "static orch",
            format!("`{}` (runs `orch setup` in a sandbox)", p.display()),
        ),
        Err(e) => Check::warn(
            "static orch",
            first_line(&e.to_string()),
            "install orch from its wheel or release archive (a static `orch`), or set `ORCH_STATIC`",
        ),
    });
    out
}
