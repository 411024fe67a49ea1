//! Images: `ImageGetOrCreate` and `ImageJoinStreaming`, and the build itself: the
//! Dockerfile commands run against root folders (`FROM` a mapped root or `scratch`,
//! `COPY`/`ADD` of context files, `RUN` in a container, `ENV`, `WORKDIR`), each step in
//! the build log. The context is the inline `context_files` and the files of the
//! image's `context_mount_id` (a mount made by `MountGetOrCreate`, each file at `/PATH`,
//! as the official client sends `COPY` sources); what each build got is recorded
//! ([`super::FakeModal::image_contexts`]).

use super::state::{now_s, sha256_hex, Image, ImageBuild, Inner, Stream};
use super::{ContextFile, ImageContext};
use crate::container;
use orch_modal_proto::{self as proto, generic_result::GenericStatus, GenericResult};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Response, Status};

/// `ImageGetOrCreate`: an image is named by its Dockerfile commands, context files and
/// base images; the first request starts its build.
pub(super) fn get_or_create(
    inner: &Arc<Inner>,
    r: proto::ImageGetOrCreateRequest,
) -> Result<Response<proto::ImageGetOrCreateResponse>, Status> {
    let image = r.image.unwrap_or_default();
    let mut key = image.dockerfile_commands.join("\n");
    for f in &image.context_files {
        key.push_str(&format!("\n{}:{}", f.filename, sha256_hex(&f.data)));
    }
    for b in &image.base_images {
        key.push_str(&format!("\nbase:{}", b.image_id));
    }
    // A context mount (as the official client sends `COPY` sources) is named by its
    // files: its id is content-addressed.
    let mount_files = if image.context_mount_id.is_empty() {
        vec![]
    } else {
        inner
            .state
            .lock()
            .unwrap()
            .mounts
            .get(&image.context_mount_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("mount {} not found", image.context_mount_id)))?
    };
    key.push_str(&format!("\nmount:{}", image.context_mount_id));
    let id = format!("im-{}", &sha256_hex(key.as_bytes())[..16]);
    let fail = inner.scenario.lock().unwrap().build_fail.clone();
    let mut st = inner.state.lock().unwrap();
    let (img, new) = match st.images.get(&id) {
        Some(img) => (img.clone(), false),
        None => {
            let img = Arc::new(Image {
                build: Mutex::new(ImageBuild {
                    workdir: "/".into(),
                    ..Default::default()
                }),
                changed: watch::Sender::new(0),
            });
            st.images.insert(id.clone(), img.clone());
            let mut files: Vec<ContextFile> = image
                .context_files
                .iter()
                .map(|f| ContextFile {
                    name: f.filename.trim_start_matches("./").to_string(),
                    sha256: sha256_hex(&f.data),
                    size: f.data.len() as u64,
                    inline: true,
                })
                .collect();
            files.extend(mount_files.iter().map(|f| ContextFile {
                name: f.filename.trim_start_matches('/').to_string(),
                sha256: f.sha256_hex.clone(),
                size: f.size,
                inline: false,
            }));
            st.image_contexts.push(ImageContext {
                image_id: id.clone(),
                mount_id: image.context_mount_id.clone(),
                files,
            });
            (img, true)
        }
    };
    let base = image
        .base_images
        .first()
        .and_then(|b| st.images.get(&b.image_id).cloned());
    drop(st);
    if new {
        tokio::spawn(build_image(
            inner.clone(),
            id.clone(),
            img.clone(),
            image,
            mount_files,
            base,
            fail,
        ));
    }
    // The first request starts the build (no result yet: join the
    // stream); later ones find it built.
    let mut b = img.build.lock().unwrap();
    let result = if b.built_once { b.result.clone() } else { None };
    b.built_once = true;
    let workdir = b.workdir.clone();
    drop(b);
    Ok(Response::new(proto::ImageGetOrCreateResponse {
        image_id: id,
        result,
        metadata: Some(proto::ImageMetadata {
            python_version_info: "3.11.7 (fake)".into(),
            workdir,
            libc_version_info: "glibc 2.36".into(),
            image_builder_version: "2025.06".into(),
        }),
    }))
}

/// `ImageJoinStreaming`: the build log from the last entry id, and the result once built.
pub(super) async fn join_streaming(
    inner: &Arc<Inner>,
    r: proto::ImageJoinStreamingRequest,
) -> Result<Response<Stream<proto::ImageJoinStreamingResponse>>, Status> {
    let img = inner
        .state
        .lock()
        .unwrap()
        .images
        .get(&r.image_id)
        .cloned()
        .ok_or_else(|| Status::not_found("image not found"))?;
    // Wait for the build's end (up to the request's timeout), then send what is there:
    // without a result the client joins again from the last entry id.
    let timeout = Duration::from_secs_f32(if r.timeout > 0.0 {
        r.timeout.min(60.0)
    } else {
        55.0
    });
    let mut rx = img.changed.subscribe();
    let _ = tokio::time::timeout(timeout, async {
        loop {
            rx.borrow_and_update();
            if img.build.lock().unwrap().result.is_some() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
    .await;
    let b = img.build.lock().unwrap();
    let from: usize = r.last_entry_id.parse().unwrap_or(0);
    let mut out = Vec::new();
    for (i, line) in b.log.iter().enumerate().skip(from) {
        out.push(Ok(proto::ImageJoinStreamingResponse {
            result: None,
            task_logs: vec![proto::TaskLogs {
                data: line.clone(),
                task_state: 0,
                timestamp: now_s(),
                file_descriptor: proto::FileDescriptor::Stderr as i32,
            }],
            entry_id: (i + 1).to_string(),
            eof: false,
            metadata: None,
        }));
    }
    if let Some(result) = &b.result {
        out.push(Ok(proto::ImageJoinStreamingResponse {
            result: Some(result.clone()),
            task_logs: vec![],
            entry_id: b.log.len().to_string(),
            eof: true,
            metadata: Some(proto::ImageMetadata {
                python_version_info: "3.11.7 (fake)".into(),
                workdir: b.workdir.clone(),
                libc_version_info: "glibc 2.36".into(),
                image_builder_version: "2025.06".into(),
            }),
        }));
    }
    Ok(Response::new(Box::pin(futures_util::stream::iter(out))))
}

/// `Step N/M : ...` failed: what the build log says after it.
type StepError = Vec<String>;

/// Builds an image as Modal's builder would, here: `FROM` picks the root folder the builder
/// maps the reference to (`scratch`: an empty one; no root: the build fails, as a pull of an
/// image the registry does not have does), a layered image starts from its base image's root,
/// `COPY`/`ADD` copy context files, `RUN` runs in the image's root as a container (so a step
/// fails as it would there), `ENV` and `WORKDIR` are kept for the image's sandboxes; other
/// instructions are recorded only. The root is copied to `ROOT/images/ID/rootfs` before the
/// first step that changes it: mapped roots never change.
async fn build_image(
    inner: Arc<Inner>,
    id: String,
    img: Arc<Image>,
    image: proto::Image,
    mount_files: Vec<proto::MountFile>,
    base: Option<Arc<Image>>,
    fail: Option<String>,
) {
    let failed = |img: &Image, lines: StepError| {
        for l in lines {
            img.log(l);
        }
        img.finish(
            GenericResult {
                status: GenericStatus::Failure as i32,
                exception: format!("Image build for {id} failed. See build logs for more details."),
                exitcode: 1,
                ..Default::default()
            },
            None,
        );
    };
    let mut b = Build {
        root: None,
        own: None,
        rootfs: inner.root.join("images").join(&id).join("rootfs"),
        env: BTreeMap::new(),
        workdir: "/".into(),
    };
    if let Some(base) = base {
        let mut rx = base.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if base.build.lock().unwrap().result.is_some() || rx.changed().await.is_err() {
                break;
            }
        }
        let bb = base.build.lock().unwrap();
        match &bb.root {
            Some(r) => {
                b.root = Some(r.clone());
                b.env = bb.env.clone();
                b.workdir = bb.workdir.clone();
            }
            None => {
                drop(bb);
                failed(&img, vec!["ERROR: the base image did not build\n".into()]);
                return;
            }
        }
    }
    let mut context: BTreeMap<String, Vec<u8>> = image
        .context_files
        .into_iter()
        .map(|f| (f.filename.trim_start_matches("./").to_string(), f.data))
        .collect();
    // The context mount's files (`/PATH` in the context folder), from the uploaded blobs.
    for f in &mount_files {
        match std::fs::read(inner.root.join("blobs").join(&f.sha256_hex)) {
            Ok(data) => {
                context.insert(f.filename.trim_start_matches('/').to_string(), data);
            }
            Err(e) => {
                failed(
                    &img,
                    vec![format!(
                        "ERROR: context file {} is not in the mount: {e}\n",
                        f.filename
                    )],
                );
                return;
            }
        }
    }
    let n = image.dockerfile_commands.len();
    for (i, c) in image.dockerfile_commands.iter().enumerate() {
        img.log(format!("Step {}/{} : {}\n", i + 1, n, c));
        if fail.as_deref().is_some_and(|f| c.contains(f)) {
            failed(
                &img,
                vec![format!(
                    "ERROR: process \"/bin/sh -c {}\" did not complete successfully: exit code: 1\n",
                    c.trim_start_matches("RUN ")
                )],
            );
            return;
        }
        let (instr, rest) = c.trim().split_once(char::is_whitespace).unwrap_or((c.trim(), ""));
        let rest = rest.trim();
        let r = match instr.to_ascii_uppercase().as_str() {
            "FROM" => b.from(&inner, rest),
            "COPY" | "ADD" => b.copy(rest, &context).await,
            "RUN" => b.run(&img, rest).await,
            "ENV" => {
                b.set_env(rest);
                Ok(())
            }
            "WORKDIR" => {
                b.workdir = abs(&b.workdir, rest);
                Ok(())
            }
            // LABEL, ARG, EXPOSE, CMD, ENTRYPOINT, USER, ...: nothing a sandbox sees here.
            _ => Ok(()),
        };
        match r {
            Ok(()) => img.log(" ---> done\n".into()),
            Err(lines) => {
                failed(&img, lines);
                return;
            }
        }
    }
    let root = match b.own.clone().or(b.root.clone()) {
        Some(r) => r,
        None => match b.materialize().await {
            Ok(r) => r,
            Err(e) => {
                failed(&img, e);
                return;
            }
        },
    };
    {
        let mut bb = img.build.lock().unwrap();
        bb.env = b.env;
        bb.workdir = b.workdir;
    }
    img.finish(
        GenericResult {
            status: GenericStatus::Success as i32,
            ..Default::default()
        },
        Some(root),
    );
}

/// A container path from a Dockerfile (absolute, or relative to the working folder).
fn abs(workdir: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{}/{p}", workdir.trim_end_matches('/'))
    }
}

/// Shell-like words: whitespace-separated, double or single quotes grouping.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    let mut chars = s.chars();
    while let Some(ch) = chars.next() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (None, '"' | '\'') => {
                quote = Some(ch);
                any = true;
            }
            (_, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            (_, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The state of one image build.
struct Build {
    /// The root the image starts from (a mapped folder or a base image's).
    root: Option<PathBuf>,
    /// The image's own copy, once a step changed it.
    own: Option<PathBuf>,
    rootfs: PathBuf,
    env: BTreeMap<String, String>,
    workdir: String,
}

impl Build {
    fn from(&mut self, inner: &Inner, rest: &str) -> Result<(), StepError> {
        let reference = rest
            .split_whitespace()
            .find(|w| !w.starts_with("--"))
            .unwrap_or_default()
            .to_string();
        self.own = None;
        self.env.clear();
        self.workdir = "/".into();
        if reference == "scratch" {
            self.root = None;
            return Ok(());
        }
        let full = container::normalize_image(&reference);
        let found = inner.image_roots.get(&reference).or_else(|| {
            inner
                .image_roots
                .iter()
                .find(|(k, _)| container::normalize_image(k) == full)
                .map(|(_, v)| v)
        });
        match found {
            Some(r) => {
                self.root = Some(r.clone());
                Ok(())
            }
            None => Err(vec![
                format!("ERROR: failed to resolve source metadata for {full}: {full}: not found\n"),
                format!("fake-modal: no root folder is mapped to `{reference}` (FakeModalBuilder::image)\n"),
            ]),
        }
    }

    /// The image's own root, copied from where it starts the first time.
    async fn materialize(&mut self) -> Result<PathBuf, StepError> {
        if let Some(o) = &self.own {
            return Ok(o.clone());
        }
        let (from, to) = (self.root.clone(), self.rootfs.clone());
        let r = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&to);
            std::fs::create_dir_all(&to)?;
            if let Some(from) = from {
                copy_tree(&from, &to)?;
            }
            Ok(())
        })
        .await;
        match r {
            Ok(Ok(())) => {
                self.own = Some(self.rootfs.clone());
                Ok(self.rootfs.clone())
            }
            Ok(Err(e)) => Err(vec![format!("ERROR: cannot prepare the image's root: {e}\n")]),
            Err(e) => Err(vec![format!("ERROR: cannot prepare the image's root: {e}\n")]),
        }
    }

    async fn copy(&mut self, rest: &str, context: &BTreeMap<String, Vec<u8>>) -> Result<(), StepError> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut args: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str(rest).map_err(|e| vec![format!("ERROR: bad JSON in `{rest}`: {e}\n")])?
        } else {
            words(rest)
        };
        let mut chmod = None;
        let mut flags = Vec::new();
        args.retain(|a| {
            if a.starts_with("--") {
                flags.push(a.clone());
                false
            } else {
                true
            }
        });
        for f in flags {
            if let Some(m) = f.strip_prefix("--chmod=") {
                chmod = u32::from_str_radix(m, 8).ok();
            } else if f.starts_with("--from") {
                return Err(vec![format!(
                    "ERROR: fake-modal builds no multi-stage images ({f})\n"
                )]);
            }
        }
        if args.len() < 2 {
            return Err(vec!["ERROR: COPY requires at least two arguments\n".into()]);
        }
        let Some(dst) = args.pop() else {
            return Err(vec!["ERROR: COPY requires at least two arguments\n".into()]);
        };
        let root = self.materialize().await?;
        let many = args.len() > 1;
        for src in &args {
            if src.contains("://") {
                return Err(vec![format!("ERROR: fake-modal does not download `{src}`\n")]);
            }
            let s = src.trim_start_matches("./").trim_end_matches('/');
            let s = if s == "." { "" } else { s };
            let matches: Vec<(&String, &Vec<u8>)> = context
                .iter()
                .filter(|(name, _)| s.is_empty() || *name == s || name.starts_with(&format!("{s}/")))
                .collect();
            if matches.is_empty() {
                return Err(vec![format!(
                    "ERROR: failed to compute cache key: failed to calculate checksum of ref: \"/{s}\": not found\n"
                )]);
            }
            for (name, data) in matches {
                let from_dir = s.is_empty() || name.as_str() != s;
                let rel = if s.is_empty() {
                    name.as_str()
                } else if from_dir {
                    &name[s.len() + 1..]
                } else {
                    name.rsplit('/').next().unwrap_or(name)
                };
                let dst_abs = abs(&self.workdir, &dst);
                let into_dir = dst.ends_with('/')
                    || many
                    || from_dir
                    || container::host_path(&root, &dst_abs).is_ok_and(|p| p.is_dir());
                let target = if into_dir {
                    format!("{}/{rel}", dst_abs.trim_end_matches('/'))
                } else {
                    dst_abs
                };
                let host = container::host_path(&root, &target)
                    .map_err(|e| vec![format!("ERROR: {target}: {e}\n")])?;
                let mode = chmod.unwrap_or(if data.starts_with(b"\x7fELF") || data.starts_with(b"#!") {
                    0o755
                } else {
                    0o644
                });
                let write = || -> std::io::Result<()> {
                    if let Some(d) = host.parent() {
                        std::fs::create_dir_all(d)?;
                    }
                    std::fs::write(&host, data)?;
                    std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode))
                };
                write().map_err(|e| vec![format!("ERROR: copy to {target}: {e}\n")])?;
            }
        }
        Ok(())
    }

    async fn run(&mut self, img: &Image, rest: &str) -> Result<(), StepError> {
        let argv: Vec<String> = if rest.starts_with('[') {
            serde_json::from_str(rest).map_err(|e| vec![format!("ERROR: bad JSON in `{rest}`: {e}\n")])?
        } else {
            vec!["/bin/sh".into(), "-c".into(), rest.to_string()]
        };
        let shown = if rest.starts_with('[') {
            argv.join(" ")
        } else {
            format!("/bin/sh -c {rest}")
        };
        if !container::supported() {
            return Err(vec![format!(
                "ERROR: process \"{shown}\": fake-modal runs RUN steps in a container, which needs root here\n"
            )]);
        }
        let root = self.materialize().await?;
        let mut spec = container::Spec::new(root);
        spec.workdir = self.workdir.clone();
        let out = match container::command(&spec, &argv, &self.env) {
            Ok(mut cmd) => {
                cmd.stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                cmd.output().await
            }
            Err(e) => Err(e),
        };
        let out = out.map_err(|e| {
            vec![format!(
                "ERROR: process \"{shown}\" did not complete successfully: exec: \"{}\": {e}\n",
                argv.first().map(String::as_str).unwrap_or_default()
            )]
        })?;
        for stream in [&out.stdout, &out.stderr] {
            for l in String::from_utf8_lossy(stream).lines() {
                img.log(format!("{l}\n"));
            }
        }
        if !out.status.success() {
            use std::os::unix::process::ExitStatusExt as _;
            let code = out
                .status
                .code()
                .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0));
            return Err(vec![format!(
                "ERROR: process \"{shown}\" did not complete successfully: exit code: {code}\n"
            )]);
        }
        Ok(())
    }

    /// `ENV K=V K2="v 2"` or the legacy `ENV K value with spaces`.
    fn set_env(&mut self, rest: &str) {
        let first = rest.split_whitespace().next().unwrap_or_default();
        if first.contains('=') {
            for w in words(rest) {
                if let Some((k, v)) = w.split_once('=') {
                    self.env.insert(k.to_string(), v.to_string());
                }
            }
        } else if let Some((k, v)) = rest.split_once(char::is_whitespace) {
            self.env.insert(k.to_string(), v.trim().to_string());
        }
    }
}

/// A copy of a folder tree: files (with their modes), folders and symbolic links as they are.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if t.is_dir() {
            std::fs::create_dir_all(&dst)?;
            std::fs::set_permissions(&dst, std::fs::metadata(&src)?.permissions())?;
            copy_tree(&src, &dst)?;
        } else if t.is_file() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}
