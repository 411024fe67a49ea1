//! What the `modal` backend needs from the commands: the connection, each
//! cell's image as Modal builds it, the weights check against the volume,
//! and `orch setup --backend modal` (the download in a sandbox).

use crate::error::user;
use orch_backend_modal::ops::ImageSpec;
use orch_backend_modal::{Credentials, Modal};
use orch_manifest::{ImageDef, Plan};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// The weights volume: `ORCH_MODAL_VOLUME`, else `orch-weights`.
pub fn volume_name() -> String {
    std::env::var("ORCH_MODAL_VOLUME")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| orch_backend_modal::WEIGHTS_VOLUME.into())
}

pub fn connect() -> anyhow::Result<Modal> {
    let creds = Credentials::from_env().map_err(orch_backend::BackendError::from)?;
    Ok(Modal::connect(creds).map_err(orch_backend::BackendError::from)?)
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
pub fn images(plan: &Plan) -> anyhow::Result<(BTreeMap<String, String>, HashMap<String, ImageSpec>)> {
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
                    let context = orch_images::find_context(&plan.manifest, &b.build)?;
                    let dockerfile = b.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into());
                    let text = std::fs::read_to_string(context.join(&dockerfile)).map_err(|e| {
                        user(format!(
                            "cannot read `{}`: {e}\nhint: `image: {{build: {}}}` needs `containers/{}/{dockerfile}`",
                            context.join(&dockerfile).display(),
                            b.build,
                            b.build
                        ))
                    })?;
                    let files = orch_images::context_files(&context)?
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

/// The static `orch` run inside setup sandboxes: `ORCH_STATIC`, else
/// `orch-static` beside `orch`, else the static build in the target folder
/// (`scripts/prepare-modal.sh` makes it).
pub fn find_static_orch() -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("ORCH_STATIC").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("orch-static"));
            for up in [dir.parent(), dir.parent().and_then(|d| d.parent())]
                .into_iter()
                .flatten()
            {
                candidates.push(up.join(format!(
                    "{}-unknown-linux-gnu/release/orch",
                    std::env::consts::ARCH
                )));
            }
        }
    }
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        user(format!(
            "no static `orch` for the setup sandbox (looked at {})\nhint: build it with `bash scripts/prepare-modal.sh`, or set `ORCH_STATIC`",
            candidates.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The suite's models against the weights volume (no sandbox: the ref and
/// orch's completeness marker are read from the volume).
pub async fn check_models(plan: &Plan) -> anyhow::Result<Vec<crate::commands::plan::ModelCheck>> {
    let requests = crate::commands::setup::requests_of(plan);
    if requests.is_empty() {
        return Ok(vec![]);
    }
    let modal = connect()?;
    let volume = volume_name();
    let mut out = Vec::new();
    for r in requests {
        let folder = orch_hub::cache::repo_folder_name(&r.repo, &r.repo_type);
        let commit = orch_backend_modal::setup::weights_complete(&modal, &volume, &folder, &r.revision)
            .await
            .map_err(orch_backend::BackendError::from)?;
        out.push(crate::commands::plan::ModelCheck {
            repo: r.repo,
            revision: r.revision,
            complete: commit.is_some(),
            commit,
            bytes: None,
            params: None,
            weights_bytes: None,
            fit: vec![],
        });
    }
    Ok(out)
}

/// `orch setup --backend modal`: the download runs in a sandbox with the
/// volume mounted read-write at `/weights`.
pub async fn setup(args: &crate::cli::SetupArgs) -> anyhow::Result<i32> {
    let modal = connect()?;
    let orch = find_static_orch()?;
    let mut cmd: Vec<String> = vec!["setup".into()];
    let mut files = Vec::new();
    if let Some(f) = &args.file {
        files.push(("/orch/suite.yaml".to_string(), f.clone()));
        cmd.extend(["-f".into(), "/orch/suite.yaml".into()]);
    }
    for m in &args.models {
        cmd.extend(["--model".into(), m.clone()]);
    }
    cmd.extend([
        "--weights-dir".into(),
        orch_backend_modal::WEIGHTS_MOUNT.into(),
        "--connections".into(),
        args.connections.to_string(),
    ]);
    if args.json {
        cmd.push("--json".into());
    }
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
        .unwrap_or_else(|| orch_backend_modal::setup::DEFAULT_SETUP_IMAGE.into());
    let job = orch_backend_modal::setup::SetupJob {
        app_name: orch_backend_modal::APP_NAME.into(),
        volume: volume_name(),
        image: ImageSpec::registry(&image),
        orch,
        args: cmd,
        files,
        secrets,
        timeout: std::time::Duration::from_secs(24 * 3600),
    };
    eprintln!(
        "weights volume: modal volume `{}` (setup runs in a sandbox)",
        job.volume
    );
    let outcome = orch_backend_modal::setup::run(&modal, &job, |err, text| {
        use std::io::Write;
        if err {
            let _ = std::io::stderr().write_all(text.as_bytes());
        } else {
            let _ = std::io::stdout().write_all(text.as_bytes());
        }
    })
    .await
    .map_err(orch_backend::BackendError::from)?;
    if outcome.exit_code != 0 {
        eprintln!(
            "the setup sandbox {} ended {} (exit code {}){}",
            outcome.sandbox_id,
            outcome.status,
            outcome.exit_code,
            if outcome.message.is_empty() {
                String::new()
            } else {
                format!(": {}", outcome.message)
            }
        );
        // `orch setup` exits 2 for user errors (gated repo...): keep its code.
        return Ok(if outcome.exit_code == 2 { 2 } else { 1 });
    }
    Ok(0)
}
