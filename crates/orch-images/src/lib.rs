//! Images built from `containers/<name>/` (a `Dockerfile` plus its context).
//!
//! The tag is `orch/<name>:<hash>`, where the hash covers every file of the
//! context that `.dockerignore` keeps (path, mode, content), the Dockerfile
//! name and the build args. An image whose tag exists is not rebuilt, so a
//! second `orch build` makes no build call.
//!
//! ## What is where
//!
//! image specs from `containers/<name>/`, `.dockerignore`, the content
//! hash that names `orch/<name>:<hash>`, builds (streamed output, failing step reported)
//! and pushes with Docker-config credentials; `copy.rs`: the context files a
//! Dockerfile's `COPY`/`ADD` can read (for builders sent the context file by
//! file). It does not: run containers.

pub mod copy;
pub use copy::{copy_sources, filter_files, CopySources};

use bollard::query_parameters::{BuildImageOptionsBuilder, PushImageOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("no image folder `containers/{name}` (looked in {})\nhint: create `containers/{name}/Dockerfile`, or name an existing image with `image: REF`", looked.join(", "))]
    NoContext { name: String, looked: Vec<String> },
    #[error("`{}` has no `{dockerfile}`\nhint: put a Dockerfile in the image folder", context.display())]
    NoDockerfile { context: PathBuf, dockerfile: String },
    #[error("cannot read the build context `{}`: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid `.dockerignore` in `{}`: {message}", context.display())]
    Ignore { context: PathBuf, message: String },
    #[error("cannot reach the Docker engine: {0}\nhint: start Docker, or set `DOCKER_HOST`")]
    Engine(String),
    #[error("building `{tag}` failed at: {step}\n{output}")]
    BuildFailed {
        tag: String,
        step: String,
        output: String,
    },
    #[error("pushing `{tag}` failed: {message}\nhint: log in with `docker login {registry}` (orch uses the usual Docker credentials)")]
    PushFailed {
        tag: String,
        registry: String,
        message: String,
    },
}

impl ImageError {
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            ImageError::NoContext { .. } | ImageError::NoDockerfile { .. } | ImageError::Ignore { .. }
        )
    }
}

/// An image to build.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    pub name: String,
    pub context: PathBuf,
    pub dockerfile: String,
    pub args: BTreeMap<String, String>,
}

/// The images a suite builds (`image: {build: NAME}`), by name.
pub fn plan_specs(plan: &orch_manifest::Plan) -> Result<BTreeMap<String, ImageSpec>, ImageError> {
    let mut specs = BTreeMap::new();
    for c in &plan.cells {
        if let Some(orch_manifest::ImageDef::Build(b)) = &c.image {
            if specs.contains_key(&b.build) {
                continue;
            }
            let context = find_context(&plan.manifest, &b.build)?;
            specs.insert(
                b.build.clone(),
                ImageSpec {
                    name: b.build.clone(),
                    context,
                    dockerfile: b.dockerfile.clone().unwrap_or_else(|| "Dockerfile".into()),
                    args: b.args.clone(),
                },
            );
        }
    }
    Ok(specs)
}

/// Find `containers/<name>` beside the manifest or in a folder above it.
pub fn find_context(manifest: &Path, name: &str) -> Result<PathBuf, ImageError> {
    let mut looked = Vec::new();
    let start = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    let start = std::fs::canonicalize(if start.as_os_str().is_empty() {
        Path::new(".")
    } else {
        &start
    })
    .unwrap_or(start);
    let mut dir = Some(start.as_path());
    while let Some(d) = dir {
        let candidate = d.join("containers").join(name);
        if candidate.is_dir() {
            return Ok(candidate);
        }
        looked.push(candidate.display().to_string());
        dir = d.parent();
        if looked.len() >= 4 {
            break;
        }
    }
    Err(ImageError::NoContext {
        name: name.to_string(),
        looked,
    })
}

/// Files of the context that `.dockerignore` keeps, relative, sorted.
pub fn context_files(context: &Path) -> Result<Vec<PathBuf>, ImageError> {
    let mut ignore = ignore::gitignore::GitignoreBuilder::new(context);
    if let Ok(text) = std::fs::read_to_string(context.join(".dockerignore")) {
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            // .dockerignore patterns are relative to the context root.
            let pattern = if line.starts_with('/') || line.starts_with('!') {
                line.to_string()
            } else {
                format!("/{line}")
            };
            ignore.add_line(None, &pattern).map_err(|e| ImageError::Ignore {
                context: context.to_path_buf(),
                message: e.to_string(),
            })?;
        }
    }
    let ignore = ignore.build().map_err(|e| ImageError::Ignore {
        context: context.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    let mut stack = vec![context.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|source| ImageError::Io {
            path: dir.clone(),
            source,
        })?;
        for e in entries {
            let e = e.map_err(|source| ImageError::Io {
                path: dir.clone(),
                source,
            })?;
            let path = e.path();
            let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
            let rel = path.strip_prefix(context).unwrap_or(&path).to_path_buf();
            let keep_always = rel == Path::new("Dockerfile") || rel == Path::new(".dockerignore");
            if !keep_always && ignore.matched_path_or_any_parents(&rel, is_dir).is_ignore() {
                continue;
            }
            if is_dir {
                stack.push(path);
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The content hash that names the image.
pub fn context_hash(spec: &ImageSpec, files: &[PathBuf]) -> Result<String, ImageError> {
    use std::os::unix::fs::PermissionsExt;
    let mut h = Sha256::new();
    h.update(b"orch-image-v1\0");
    h.update(spec.dockerfile.as_bytes());
    for (k, v) in &spec.args {
        h.update(format!("\0arg {k}={v}").as_bytes());
    }
    for rel in files {
        let path = spec.context.join(rel);
        let bytes = std::fs::read(&path).map_err(|source| ImageError::Io {
            path: path.clone(),
            source,
        })?;
        let mode = std::fs::metadata(&path)
            .map(|m| m.permissions().mode() & 0o111)
            .unwrap_or(0);
        h.update(format!("\0file {} {mode:o} {}\0", rel.display(), bytes.len()).as_bytes());
        h.update(&bytes);
    }
    Ok(h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect())
}

pub fn tag_for(spec: &ImageSpec, hash: &str) -> String {
    format!("orch/{}:{hash}", spec.name.to_ascii_lowercase())
}

fn tar_context(spec: &ImageSpec, files: &[PathBuf]) -> Result<Vec<u8>, ImageError> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(true);
    for rel in files {
        let path = spec.context.join(rel);
        b.append_path_with_name(&path, rel)
            .map_err(|source| ImageError::Io { path, source })?;
    }
    b.into_inner().map_err(|source| ImageError::Io {
        path: spec.context.clone(),
        source,
    })
}

/// The tag the spec builds to, without building.
pub fn resolve_tag(spec: &ImageSpec) -> Result<String, ImageError> {
    if !spec.context.join(&spec.dockerfile).is_file() {
        return Err(ImageError::NoDockerfile {
            context: spec.context.clone(),
            dockerfile: spec.dockerfile.clone(),
        });
    }
    let files = context_files(&spec.context)?;
    Ok(tag_for(spec, &context_hash(spec, &files)?))
}

/// Does the engine have this image?
pub async fn exists(docker: &Docker, tag: &str) -> Result<bool, ImageError> {
    match docker.inspect_image(tag).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
        Err(e) => Err(ImageError::Engine(e.to_string())),
    }
}

/// What `ensure_built` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub tag: String,
    /// False when the image already existed (no build call was made).
    pub built: bool,
}

/// Build the image unless its tag exists. `output` receives build output lines.
pub async fn ensure_built(
    docker: &Docker,
    spec: &ImageSpec,
    mut output: impl FnMut(&str),
) -> Result<Built, ImageError> {
    let tag = resolve_tag(spec)?;
    if exists(docker, &tag).await? {
        return Ok(Built { tag, built: false });
    }
    let files = context_files(&spec.context)?;
    let tar = tar_context(spec, &files)?;
    let mut opts = BuildImageOptionsBuilder::default()
        .dockerfile(&spec.dockerfile)
        .t(&tag)
        .rm(true)
        .forcerm(true);
    if !spec.args.is_empty() {
        let args: std::collections::HashMap<String, String> =
            spec.args.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        opts = opts.buildargs(&args);
    }
    let mut stream = docker.build_image(opts.build(), None, Some(bollard::body_full(tar.into())));
    let mut log = String::new();
    let mut step = String::from("(before the first step)");
    while let Some(item) = stream.next().await {
        let info = match item {
            Ok(i) => i,
            Err(bollard::errors::Error::DockerStreamError { error }) => {
                return Err(ImageError::BuildFailed {
                    tag,
                    step,
                    output: tail(&log, error),
                })
            }
            Err(e) => {
                return Err(ImageError::BuildFailed {
                    tag,
                    step,
                    output: tail(&log, e.to_string()),
                })
            }
        };
        if let Some(s) = info.stream {
            for line in s.lines() {
                if line.starts_with("Step ") {
                    step = line.trim().to_string();
                }
                output(line);
                log.push_str(line);
                log.push('\n');
            }
        }
        if let Some(detail) = info.error_detail {
            let message = detail.message.unwrap_or_default();
            return Err(ImageError::BuildFailed {
                tag,
                step,
                output: tail(&log, message),
            });
        }
    }
    if !exists(docker, &tag).await? {
        return Err(ImageError::BuildFailed {
            tag,
            step,
            output: tail(
                &log,
                "the engine reported no error but the image is missing".into(),
            ),
        });
    }
    Ok(Built { tag, built: true })
}

fn tail(log: &str, error: String) -> String {
    let lines: Vec<&str> = log.lines().collect();
    let start = lines.len().saturating_sub(20);
    format!("{}\nerror: {error}", lines[start..].join("\n"))
}

/// Tag `tag` into `registry` and push it; credentials come from the usual
/// Docker config (`~/.docker/config.json` auths), when present.
pub async fn push(docker: &Docker, tag: &str, registry: &str) -> Result<String, ImageError> {
    let (repo, version) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
    let target_repo = format!("{}/{}", registry.trim_end_matches('/'), repo);
    let fail = |message: String| ImageError::PushFailed {
        tag: tag.to_string(),
        registry: registry.to_string(),
        message,
    };
    docker
        .tag_image(
            tag,
            Some(
                bollard::query_parameters::TagImageOptionsBuilder::default()
                    .repo(&target_repo)
                    .tag(version)
                    .build(),
            ),
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
    let creds = docker_credentials(registry);
    let mut stream = docker.push_image(
        &target_repo,
        Some(PushImageOptionsBuilder::default().tag(version).build()),
        creds,
    );
    while let Some(item) = stream.next().await {
        let info = item.map_err(|e| fail(e.to_string()))?;
        if let Some(d) = info.error_detail {
            return Err(fail(d.message.unwrap_or_default()));
        }
    }
    Ok(format!("{target_repo}:{version}"))
}

fn docker_credentials(registry: &str) -> Option<bollard::auth::DockerCredentials> {
    let home = std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))?;
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(home.join("config.json")).ok()?).ok()?;
    let host = registry.split('/').next().unwrap_or(registry);
    let auth = config["auths"][host]["auth"].as_str()?;
    Some(bollard::auth::DockerCredentials {
        auth: Some(auth.to_string()),
        serveraddress: Some(host.to_string()),
        ..Default::default()
    })
}

impl orch_protocol::ErrorClass for ImageError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dockerignore_and_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let ctx = tmp.path().join("containers/x");
        std::fs::create_dir_all(ctx.join("sub")).unwrap();
        std::fs::write(ctx.join("Dockerfile"), "FROM scratch\n").unwrap();
        std::fs::write(ctx.join(".dockerignore"), "*.log\nsub/skip\n").unwrap();
        std::fs::write(ctx.join("a.txt"), "a").unwrap();
        std::fs::write(ctx.join("noise.log"), "n").unwrap();
        std::fs::write(ctx.join("sub/keep"), "k").unwrap();
        std::fs::write(ctx.join("sub/skip"), "s").unwrap();
        let files = context_files(&ctx).unwrap();
        let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(names, vec![".dockerignore", "Dockerfile", "a.txt", "sub/keep"]);
        let spec = ImageSpec {
            name: "x".into(),
            context: ctx.clone(),
            dockerfile: "Dockerfile".into(),
            args: BTreeMap::new(),
        };
        let t1 = resolve_tag(&spec).unwrap();
        std::fs::write(ctx.join("noise.log"), "changed").unwrap();
        assert_eq!(
            resolve_tag(&spec).unwrap(),
            t1,
            "ignored files do not change the tag"
        );
        std::fs::write(ctx.join("a.txt"), "b").unwrap();
        assert_ne!(resolve_tag(&spec).unwrap(), t1);
        assert!(t1.starts_with("orch/x:"));
        let manifest = tmp.path().join("manifests/suite.yaml");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        assert_eq!(
            find_context(&manifest, "x").unwrap(),
            std::fs::canonicalize(&ctx).unwrap()
        );
        assert!(find_context(&manifest, "nope").is_err());
    }
}
