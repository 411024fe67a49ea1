//! `setup`: put a model repository's files into the hub cache layout.
//!
//! - one listing (`tree`, recursive) gives every file's size and hash;
//! - files already in the cache (blob present with its size) are linked, not
//!   downloaded: a second setup of a complete snapshot downloads nothing;
//! - before any download, access is checked (a gated repo without access is
//!   an error naming the repo and what to do);
//! - files download in parallel, large files in parallel byte ranges, into
//!   `blobs/<etag>.incomplete`; finished ranges are recorded beside it
//!   (`.incomplete.parts`) so an interrupted download resumes;
//! - every file is checked (size always, sha256 for LFS files) before it is
//!   renamed into place and linked into the snapshot.

use crate::cache::{is_commit_hash, write_atomic, CompleteMarker, RepoCache};
use futures::StreamExt;
use hf_hub::repository::{RepoTreeEntry, RepoTypeDataset, RepoTypeModel, RepoTypeSpace};
use hf_hub::{HFClient, HFError, HFRepository, RepoType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Semaphore};

/// One model to set up.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    pub repo: String,
    pub revision: String,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// `model`, `dataset` or `space`.
    pub repo_type: String,
}

impl ModelRequest {
    /// `org/name` or `org/name@revision`.
    pub fn parse(spec: &str) -> Result<ModelRequest, HubError> {
        let (repo, revision) = match spec.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (spec, "main"),
        };
        let valid =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        match repo.split_once('/') {
            Some((org, name)) if valid(org) && valid(name) && !revision.is_empty() => Ok(ModelRequest {
                repo: repo.to_string(),
                revision: revision.to_string(),
                include: vec![],
                exclude: vec![],
                repo_type: "model".into(),
            }),
            _ => Err(HubError::BadSpec(spec.to_string())),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SetupOptions {
    pub weights_dir: PathBuf,
    /// HTTP requests in flight at once, over all files.
    pub connections: usize,
    /// Files at least this large are fetched in parallel byte ranges.
    pub range_min_bytes: u64,
    /// Size of one byte range.
    pub chunk_bytes: u64,
}

impl SetupOptions {
    pub fn new(weights_dir: PathBuf) -> SetupOptions {
        SetupOptions {
            weights_dir,
            connections: 16,
            range_min_bytes: 48 << 20,
            chunk_bytes: 32 << 20,
        }
    }
}

/// Progress of a setup.
#[derive(Debug, Clone, PartialEq)]
pub enum SetupEvent {
    /// The repository was listed.
    Listed {
        repo: String,
        commit: String,
        files: usize,
        bytes: u64,
        to_download_files: usize,
        to_download_bytes: u64,
    },
    /// Bytes received (for a rate and an ETA).
    Bytes(u64),
    /// A file is verified and in the snapshot.
    FileDone {
        repo: String,
        path: String,
        bytes: u64,
        downloaded: bool,
    },
    /// The network failed but the cache holds a complete snapshot.
    UsedCache {
        repo: String,
        commit: String,
        reason: String,
    },
}

/// What a setup did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetupReport {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub snapshot: PathBuf,
    pub files: usize,
    pub bytes: u64,
    pub downloaded_files: usize,
    pub downloaded_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("invalid model `{0}`\nhint: write `org/name` or `org/name@revision`")]
    BadSpec(String),
    #[error(
        "invalid pattern `{pattern}`: {message}\nhint: patterns are globs like `*.safetensors` or `onnx/**`"
    )]
    BadPattern { pattern: String, message: String },
    #[error("`{repo}` is a gated repository and {why}; nothing was downloaded\nhint: accept its terms at {url} with your account, then set `HF_TOKEN` to a token of that account (or run `hf auth login`)")]
    Gated { repo: String, url: String, why: String },
    #[error("repository `{repo}` was not found at {endpoint} (or it is private and the token has no access)\nhint: check the name; for a private repo set `HF_TOKEN`")]
    NotFound { repo: String, endpoint: String },
    #[error(
        "revision `{revision}` not found in `{repo}`\nhint: use a branch, tag or commit of the repository"
    )]
    RevisionNotFound { repo: String, revision: String },
    #[error("`{repo}` has no files matching the include/exclude patterns\nhint: check `include`/`exclude`")]
    NoFiles { repo: String },
    #[error("`{repo}`: {message}")]
    Http { repo: String, message: String },
    #[error("`{repo}`: `{path}` failed verification: {message}; the partial file was removed, run `orch setup` again")]
    Verify {
        repo: String,
        path: String,
        message: String,
    },
    #[error("cannot write `{}`: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl HubError {
    /// True when the user must act (name, access, patterns).
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            HubError::BadSpec(_)
                | HubError::BadPattern { .. }
                | HubError::Gated { .. }
                | HubError::NotFound { .. }
                | HubError::RevisionNotFound { .. }
                | HubError::NoFiles { .. }
        )
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A file of the listing.
#[derive(Debug, Clone)]
struct RemoteFile {
    path: String,
    size: u64,
    /// Blob name in the cache: sha256 for LFS files, git oid otherwise.
    etag: String,
    sha256: Option<String>,
}

/// Set up one model. Returns what was done; sends progress on `events`.
pub async fn setup(
    client: &HFClient,
    req: &ModelRequest,
    opts: &SetupOptions,
    events: mpsc::UnboundedSender<SetupEvent>,
) -> Result<SetupReport, HubError> {
    let (owner, name) = req
        .repo
        .split_once('/')
        .ok_or_else(|| HubError::BadSpec(req.repo.clone()))?;
    match req.repo_type.as_str() {
        "dataset" => setup_repo(client, client.dataset(owner, name), req, opts, events).await,
        "space" => setup_repo(client, client.space(owner, name), req, opts, events).await,
        _ => setup_repo(client, client.model(owner, name), req, opts, events).await,
    }
}

/// The commit a revision points to and the file names (`siblings`) of the
/// repository (`info` is per repository kind in hf-hub).
trait CommitOf {
    #[allow(clippy::type_complexity)]
    fn commit_of(
        &self,
        revision: String,
    ) -> Pin<Box<dyn Future<Output = Result<(Option<String>, Vec<String>), HFError>> + Send + '_>>;
}

macro_rules! commit_of {
    ($t:ty) => {
        impl CommitOf for HFRepository<$t> {
            fn commit_of(
                &self,
                revision: String,
            ) -> Pin<Box<dyn Future<Output = Result<(Option<String>, Vec<String>), HFError>> + Send + '_>>
            {
                Box::pin(async move {
                    let info = self.info().revision(revision).send().await?;
                    let names = info
                        .siblings
                        .unwrap_or_default()
                        .into_iter()
                        .map(|s| s.rfilename)
                        .collect();
                    Ok((info.sha, names))
                })
            }
        }
    };
}
commit_of!(RepoTypeModel);
commit_of!(RepoTypeDataset);
commit_of!(RepoTypeSpace);

async fn setup_repo<T: RepoType + Send + Sync + 'static>(
    _client: &HFClient,
    repo: HFRepository<T>,
    req: &ModelRequest,
    opts: &SetupOptions,
    events: mpsc::UnboundedSender<SetupEvent>,
) -> Result<SetupReport, HubError>
where
    HFRepository<T>: CommitOf,
{
    let cache = RepoCache::new(&opts.weights_dir, &req.repo, &req.repo_type);
    let endpoint = client_endpoint();
    // A pinned commit that is complete locally needs no network at all.
    if is_commit_hash(&req.revision) {
        if let Some(m) = cache.complete(&req.revision) {
            return Ok(report_from_marker(&cache, &m, &events));
        }
    }
    let listing = match list(&repo, req, &endpoint).await {
        Ok(l) => l,
        Err(e @ HubError::Http { .. }) => {
            // Network trouble: a complete local snapshot still serves.
            if let Some(m) = cache.complete(&req.revision) {
                let _ = events.send(SetupEvent::UsedCache {
                    repo: req.repo.clone(),
                    commit: m.commit.clone(),
                    reason: e.to_string(),
                });
                return Ok(report_from_marker(&cache, &m, &events));
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let (commit, files) = listing;
    let files = filter(files, &req.include, &req.exclude)?;
    if files.is_empty() {
        return Err(HubError::NoFiles {
            repo: req.repo.clone(),
        });
    }

    // What is missing?
    let mut todo = Vec::new();
    let mut present = Vec::new();
    for f in &files {
        let blob_ok = std::fs::metadata(cache.blob(&f.etag))
            .map(|m| m.len() == f.size)
            .unwrap_or(false);
        if blob_ok {
            present.push(f.clone());
        } else {
            todo.push(f.clone());
        }
    }
    let _ = events.send(SetupEvent::Listed {
        repo: req.repo.clone(),
        commit: commit.clone(),
        files: files.len(),
        bytes: files.iter().map(|f| f.size).sum(),
        to_download_files: todo.len(),
        to_download_bytes: todo.iter().map(|f| f.size).sum(),
    });

    // Access before any byte: HEAD the smallest missing file.
    if let Some(probe) = todo.iter().min_by_key(|f| f.size) {
        if let Err(e) = repo
            .get_file_metadata()
            .filepath(probe.path.clone())
            .revision(&commit)
            .send()
            .await
        {
            return Err(map_err(e, &req.repo, &req.revision, &endpoint));
        }
    }

    for dir in [cache.root.join("blobs"), cache.snapshot_dir(&commit)] {
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    }
    for f in &present {
        cache
            .link(&commit, &f.path, &f.etag)
            .map_err(io_err(&cache.snapshot_file(&commit, &f.path)))?;
        let _ = events.send(SetupEvent::FileDone {
            repo: req.repo.clone(),
            path: f.path.clone(),
            bytes: f.size,
            downloaded: false,
        });
    }

    let fetcher = Arc::new(Fetcher::new(&endpoint, &req.repo_type, &req.repo, &commit)?);
    let permits = Arc::new(Semaphore::new(opts.connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    todo.sort_by_key(|f| std::cmp::Reverse(f.size));
    for f in todo.clone() {
        let fetcher = fetcher.clone();
        let permits = permits.clone();
        let events = events.clone();
        let cache = cache.clone();
        let commit = commit.clone();
        let opts = opts.clone();
        let name = req.repo.clone();
        let endpoint = endpoint.clone();
        tasks.spawn(async move {
            download_file(&fetcher, &cache, &f, &opts, permits, &events, &name, &endpoint).await?;
            cache
                .link(&commit, &f.path, &f.etag)
                .map_err(io_err(&cache.snapshot_file(&commit, &f.path)))?;
            let _ = events.send(SetupEvent::FileDone {
                repo: name,
                path: f.path.clone(),
                bytes: f.size,
                downloaded: true,
            });
            Ok::<u64, HubError>(f.size)
        });
    }
    let mut downloaded_bytes = 0;
    let mut first_err = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(n)) => downloaded_bytes += n,
            Ok(Err(e)) => {
                if first_err.is_none() {
                    tasks.abort_all();
                }
                first_err.get_or_insert(e);
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                first_err.get_or_insert(HubError::Http {
                    repo: req.repo.clone(),
                    message: format!("a download task failed: {e}"),
                });
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    cache
        .write_ref(&req.revision, &commit)
        .map_err(io_err(&cache.ref_file(&req.revision)))?;
    let marker = CompleteMarker {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: commit.clone(),
        files: files.iter().map(|f| (f.path.clone(), f.size)).collect(),
        include: req.include.clone(),
        exclude: req.exclude.clone(),
    };
    cache.write_marker(&marker).map_err(io_err(&cache.root))?;
    Ok(SetupReport {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: commit.clone(),
        snapshot: cache.snapshot_dir(&commit),
        files: files.len(),
        bytes: files.iter().map(|f| f.size).sum(),
        downloaded_files: todo.len(),
        downloaded_bytes,
    })
}

fn client_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

fn report_from_marker(
    cache: &RepoCache,
    m: &CompleteMarker,
    events: &mpsc::UnboundedSender<SetupEvent>,
) -> SetupReport {
    let bytes = m.files.iter().map(|f| f.1).sum();
    let _ = events.send(SetupEvent::Listed {
        repo: m.repo.clone(),
        commit: m.commit.clone(),
        files: m.files.len(),
        bytes,
        to_download_files: 0,
        to_download_bytes: 0,
    });
    SetupReport {
        repo: m.repo.clone(),
        revision: m.revision.clone(),
        commit: m.commit.clone(),
        snapshot: cache.snapshot_dir(&m.commit),
        files: m.files.len(),
        bytes,
        downloaded_files: 0,
        downloaded_bytes: 0,
    }
}

/// Resolve the revision to a commit and list every file.
async fn list<T: RepoType>(
    repo: &HFRepository<T>,
    req: &ModelRequest,
    endpoint: &str,
) -> Result<(String, Vec<RemoteFile>), HubError>
where
    HFRepository<T>: CommitOf,
{
    let (sha, siblings) = repo
        .commit_of(req.revision.clone())
        .await
        .map_err(|e| map_err(e, &req.repo, &req.revision, endpoint))?;
    let commit = sha.ok_or_else(|| HubError::Http {
        repo: req.repo.clone(),
        message: "the server did not say which commit the revision is".into(),
    })?;
    let tree: Result<Vec<RemoteFile>, HFError> = async {
        let stream = repo.list_tree().revision(commit.clone()).recursive(true).send()?;
        let entries: Vec<_> = stream.collect().await;
        let mut files = Vec::new();
        for e in entries {
            if let RepoTreeEntry::File {
                oid, size, path, lfs, ..
            } = e?
            {
                let sha256 = lfs.and_then(|l| l.sha256);
                files.push(RemoteFile {
                    etag: sha256.clone().unwrap_or(oid),
                    path,
                    size,
                    sha256,
                });
            }
        }
        Ok(files)
    }
    .await;
    let files = match tree {
        Ok(files) => files,
        // Access problems are the answer; anything else (a server without
        // the tree API) falls back to HEAD requests on the sibling list.
        Err(
            e @ (HFError::AuthRequired { .. } | HFError::Forbidden { .. } | HFError::RepoNotFound { .. }),
        ) => return Err(map_err(e, &req.repo, &req.revision, endpoint)),
        Err(_) if !siblings.is_empty() => {
            let mut files = Vec::with_capacity(siblings.len());
            for name in siblings {
                let meta = repo
                    .get_file_metadata()
                    .filepath(name.clone())
                    .revision(&commit)
                    .send()
                    .await
                    .map_err(|e| map_err(e, &req.repo, &req.revision, endpoint))?;
                let sha256 = (meta.etag.len() == 64 && meta.etag.chars().all(|c| c.is_ascii_hexdigit()))
                    .then(|| meta.etag.to_ascii_lowercase());
                files.push(RemoteFile {
                    path: name,
                    size: meta.file_size,
                    etag: meta.etag,
                    sha256,
                });
            }
            files
        }
        Err(e) => return Err(map_err(e, &req.repo, &req.revision, endpoint)),
    };
    Ok((commit, files))
}

fn filter(
    files: Vec<RemoteFile>,
    include: &[String],
    exclude: &[String],
) -> Result<Vec<RemoteFile>, HubError> {
    let build = |pats: &[String]| -> Result<Option<globset::GlobSet>, HubError> {
        if pats.is_empty() {
            return Ok(None);
        }
        let mut b = globset::GlobSetBuilder::new();
        for p in pats {
            b.add(globset::Glob::new(p).map_err(|e| HubError::BadPattern {
                pattern: p.clone(),
                message: e.to_string(),
            })?);
        }
        b.build().map(Some).map_err(|e| HubError::BadPattern {
            pattern: pats.join(", "),
            message: e.to_string(),
        })
    };
    let inc = build(include)?;
    let exc = build(exclude)?;
    Ok(files
        .into_iter()
        .filter(|f| inc.as_ref().map(|g| g.is_match(&f.path)).unwrap_or(true))
        .filter(|f| !exc.as_ref().map(|g| g.is_match(&f.path)).unwrap_or(false))
        .collect())
}

fn map_err(e: HFError, repo: &str, revision: &str, endpoint: &str) -> HubError {
    let url = format!("{endpoint}/{repo}");
    match e {
        HFError::AuthRequired { .. } => HubError::Gated {
            repo: repo.into(),
            url,
            why: if std::env::var_os("HF_TOKEN").is_some() {
                "the token was not accepted".into()
            } else {
                "no token was given".into()
            },
        },
        HFError::Forbidden { .. } => HubError::Gated {
            repo: repo.into(),
            url,
            why: "the token's account has no access to it".into(),
        },
        HFError::RepoNotFound { .. } => HubError::NotFound {
            repo: repo.into(),
            endpoint: endpoint.into(),
        },
        HFError::RevisionNotFound { .. } => HubError::RevisionNotFound {
            repo: repo.into(),
            revision: revision.into(),
        },
        other => {
            let text = other.to_string();
            // Gated responses that came through as plain HTTP errors.
            if text.contains("GatedRepo") || text.contains("restricted") {
                return HubError::Gated {
                    repo: repo.into(),
                    url,
                    why: "access was refused".into(),
                };
            }
            HubError::Http {
                repo: repo.into(),
                message: text,
            }
        }
    }
}

/// Finished byte ranges of a partial blob, kept beside it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Parts {
    size: u64,
    chunk_bytes: u64,
    done: BTreeSet<u64>,
}

#[allow(clippy::too_many_arguments)]
async fn download_file(
    fetcher: &Arc<Fetcher>,
    cache: &RepoCache,
    f: &RemoteFile,
    opts: &SetupOptions,
    permits: Arc<Semaphore>,
    events: &mpsc::UnboundedSender<SetupEvent>,
    repo_name: &str,
    endpoint: &str,
) -> Result<(), HubError> {
    let blob = cache.blob(&f.etag);
    let partial = blob.with_file_name(format!("{}.incomplete", f.etag));
    let parts_path = blob.with_file_name(format!("{}.incomplete.parts", f.etag));
    let ranged = f.size >= opts.range_min_bytes;
    let chunk = if ranged {
        opts.chunk_bytes.max(1 << 20)
    } else {
        f.size.max(1)
    };

    // Resume what an earlier setup left, if it used the same chunking.
    let mut parts: Parts = std::fs::read(&parts_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|p: &Parts| p.size == f.size && p.chunk_bytes == chunk && partial.exists())
        .unwrap_or_default();
    parts.size = f.size;
    parts.chunk_bytes = chunk;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .read(true)
        .open(&partial)
        .map_err(io_err(&partial))?;
    file.set_len(f.size).map_err(io_err(&partial))?;
    let file = Arc::new(file);
    let chunks: Vec<u64> = (0..f.size.div_ceil(chunk))
        .filter(|i| !parts.done.contains(i))
        .collect();
    let resumed: u64 = parts.done.iter().map(|i| chunk.min(f.size - i * chunk)).sum();
    if resumed > 0 {
        let _ = events.send(SetupEvent::Bytes(resumed));
    }
    let parts = Arc::new(Mutex::new(parts));

    let mut tasks = tokio::task::JoinSet::new();
    for i in chunks {
        let start = i * chunk;
        let end = (start + chunk).min(f.size);
        let fetcher = fetcher.clone();
        let permits = permits.clone();
        let file = file.clone();
        let events = events.clone();
        let parts = parts.clone();
        let parts_path = parts_path.clone();
        let path = f.path.clone();
        let name = repo_name.to_string();
        let endpoint = endpoint.to_string();
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.map_err(|e| HubError::Http {
                repo: name.clone(),
                message: e.to_string(),
            })?;
            let mut last = None;
            for attempt in 0..3 {
                if attempt > 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(500 * attempt)).await;
                }
                match fetcher.fetch(&path, start, end, ranged, &file, &events).await {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e @ (FetchError::Denied(_) | FetchError::RangeIgnored)) => {
                        last = Some(e);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match last {
                None => {}
                Some(FetchError::RangeIgnored) => {
                    return Err(HubError::Http {
                        repo: name,
                        message: RANGE_IGNORED.into(),
                    })
                }
                Some(FetchError::Denied(status)) => {
                    return Err(HubError::Gated {
                        repo: name.clone(),
                        url: format!("{endpoint}/{name}"),
                        why: format!("the server refused the download ({status})"),
                    })
                }
                Some(FetchError::Other(message)) => return Err(HubError::Http { repo: name, message }),
            }
            // Record the finished range (fsync the data first, so a crash
            // never marks unwritten bytes done).
            file.sync_data().map_err(io_err(&parts_path))?;
            // One writer at a time: the record is rewritten whole under the lock.
            let mut p = parts.lock().map_err(|_| HubError::Http {
                repo: name.clone(),
                message: "progress record lock poisoned".into(),
            })?;
            p.done.insert(i);
            let snapshot = serde_json::to_vec(&*p).unwrap_or_default();
            write_atomic(&parts_path, &snapshot).map_err(io_err(&parts_path))?;
            drop(p);
            Ok::<(), HubError>(())
        });
    }
    let mut range_ignored = false;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(HubError::Http { message, .. })) if message == RANGE_IGNORED => {
                range_ignored = true;
                tasks.abort_all();
            }
            Ok(Err(e)) => return Err(e),
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                return Err(HubError::Http {
                    repo: repo_name.into(),
                    message: format!("a download task failed: {e}"),
                })
            }
        }
    }
    if range_ignored {
        // The server does not do byte ranges: fetch the file whole, once.
        let _permit = permits.acquire_owned().await.map_err(|e| HubError::Http {
            repo: repo_name.into(),
            message: e.to_string(),
        })?;
        fetcher
            .fetch(&f.path, 0, f.size, false, &file, events)
            .await
            .map_err(|e| HubError::Http {
                repo: repo_name.into(),
                message: e.to_string(),
            })?;
        file.sync_data().map_err(io_err(&partial))?;
    }

    // Verify, then move into place.
    let size = std::fs::metadata(&partial).map_err(io_err(&partial))?.len();
    let fail = |message: String| {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&parts_path);
        HubError::Verify {
            repo: repo_name.into(),
            path: f.path.clone(),
            message,
        }
    };
    if size != f.size {
        return Err(fail(format!("size {size}, expected {}", f.size)));
    }
    if let Some(want) = &f.sha256 {
        let p = partial.clone();
        let got = tokio::task::spawn_blocking(move || sha256_file(&p))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
        if !got.eq_ignore_ascii_case(want) {
            return Err(fail(format!("sha256 {got}, expected {want}")));
        }
    }
    std::fs::rename(&partial, &blob).map_err(io_err(&blob))?;
    let _ = std::fs::remove_file(&parts_path);
    Ok(())
}

const RANGE_IGNORED: &str = "the server ignored a byte range";

#[derive(Debug)]
enum FetchError {
    /// 401/403: no access.
    Denied(u16),
    /// The server answered a ranged request with the whole file.
    RangeIgnored,
    Other(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Denied(s) => write!(f, "access refused (HTTP {s})"),
            FetchError::RangeIgnored => f.write_str(RANGE_IGNORED),
            FetchError::Other(m) => f.write_str(m),
        }
    }
}

/// Byte downloads: plain GETs of `resolve/<commit>/<path>`, with ranges,
/// following redirects (to a CDN, say) without forwarding the token.
struct Fetcher {
    http: reqwest::Client,
    base: reqwest::Url,
    token: Option<crate::token::Secret>,
}

impl Fetcher {
    fn new(endpoint: &str, repo_type: &str, repo: &str, commit: &str) -> Result<Fetcher, HubError> {
        let bad = |e: String| HubError::Http {
            repo: repo.into(),
            message: format!("invalid endpoint `{endpoint}`: {e}"),
        };
        let mut base = reqwest::Url::parse(endpoint).map_err(|e| bad(e.to_string()))?;
        {
            let mut segs = base
                .path_segments_mut()
                .map_err(|_| bad("not a base URL".into()))?;
            segs.pop_if_empty();
            match repo_type {
                "dataset" => {
                    segs.push("datasets");
                }
                "space" => {
                    segs.push("spaces");
                }
                _ => {}
            }
            for part in repo.split('/') {
                segs.push(part);
            }
            segs.push("resolve");
            segs.push(commit);
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("orch/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Fetcher {
            http,
            base,
            token: crate::token::resolve_token(),
        })
    }

    fn url(&self, path: &str) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            for part in path.split('/') {
                segs.push(part);
            }
        }
        url
    }

    /// Fetch `[start, end)` of a file (the whole file when `ranged` is false)
    /// and write it at its offset.
    async fn fetch(
        &self,
        path: &str,
        start: u64,
        end: u64,
        ranged: bool,
        file: &std::fs::File,
        events: &mpsc::UnboundedSender<SetupEvent>,
    ) -> Result<(), FetchError> {
        if start == end {
            return Ok(()); // an empty file
        }
        let mut req = self
            .http
            .get(self.url(path))
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        if ranged {
            req = req.header(reqwest::header::RANGE, format!("bytes={}-{}", start, end - 1));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| FetchError::Other(format!("`{path}`: {}", without_url(&e))))?;
        let status = resp.status().as_u16();
        match status {
            401 | 403 => return Err(FetchError::Denied(status)),
            206 if ranged => {}
            200 if ranged && !(start == 0 && end == resp.content_length().unwrap_or(0)) => {
                return Err(FetchError::RangeIgnored)
            }
            200 => {}
            s => {
                return Err(FetchError::Other(format!(
                    "`{path}`: the server answered HTTP {s}"
                )))
            }
        }
        let mut stream = resp.bytes_stream();
        let mut offset = start;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes.map_err(|e| FetchError::Other(format!("`{path}`: {}", without_url(&e))))?;
            if offset + bytes.len() as u64 > end {
                return Err(FetchError::Other(format!(
                    "`{path}`: the server sent more bytes than asked"
                )));
            }
            file.write_all_at(&bytes, offset)
                .map_err(|e| FetchError::Other(format!("cannot write `{path}`: {e}")))?;
            offset += bytes.len() as u64;
            let _ = events.send(SetupEvent::Bytes(bytes.len() as u64));
        }
        if offset != end {
            return Err(FetchError::Other(format!(
                "`{path}`: the transfer ended after {} of {} bytes",
                offset - start,
                end - start
            )));
        }
        Ok(())
    }
}

/// A reqwest error without its URL (URLs may carry signed query strings).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<url>");
    }
    s
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_specs() {
        let r = ModelRequest::parse("org/name@v1.0").unwrap();
        assert_eq!((r.repo.as_str(), r.revision.as_str()), ("org/name", "v1.0"));
        assert_eq!(ModelRequest::parse("org/name").unwrap().revision, "main");
        assert!(ModelRequest::parse("name").is_err());
        assert!(ModelRequest::parse("a/b/c").is_err());
    }

    #[test]
    fn patterns_filter_files() {
        let f = |p: &str| RemoteFile {
            path: p.into(),
            size: 1,
            etag: "e".into(),
            sha256: None,
        };
        let files = vec![f("a.safetensors"), f("onnx/m.onnx"), f("config.json")];
        let kept = filter(files.clone(), &["*.safetensors".into(), "*.json".into()], &[]).unwrap();
        assert_eq!(kept.len(), 2);
        let kept = filter(files, &[], &["onnx/**".into()]).unwrap();
        assert_eq!(
            kept.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            vec!["a.safetensors", "config.json"]
        );
        assert!(filter(vec![], &["[".into()], &[]).is_err());
    }
}
