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
//!
//! The files: `options.rs` (request, options, events, report), `error.rs`
//! ([`HubError`]), `listing.rs` (listing, patterns, what is missing, the
//! access check), `file.rs` (one file's ranges and resume), `fetch.rs` (the
//! HTTP byte downloads), `verify.rs` (size and sha256 before the final name).

mod error;
mod fetch;
mod file;
mod listing;
mod options;
mod verify;

pub use error::HubError;
pub use options::{ModelRequest, SetupEvent, SetupOptions, SetupReport};

use crate::cache::{is_commit_hash, CompleteMarker, RepoCache};
use error::io_err;
use fetch::Fetcher;
use file::download_file;
use hf_hub::{HFClient, HFRepository, RepoType};
use listing::{check_access, client_endpoint, filter, list, missing, CommitOf, RemoteFile};
use std::sync::Arc;
use tokio::sync::{mpsc, Semaphore};

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
        "dataset" => setup_repo(client.dataset(owner, name), req, opts, events).await,
        "space" => setup_repo(client.space(owner, name), req, opts, events).await,
        _ => setup_repo(client.model(owner, name), req, opts, events).await,
    }
}

async fn setup_repo<T: RepoType + Send + Sync + 'static>(
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
    let (todo, present) = missing(&cache, &files);
    let _ = events.send(SetupEvent::Listed {
        repo: req.repo.clone(),
        commit: commit.clone(),
        files: files.len(),
        bytes: files.iter().map(|f| f.size).sum(),
        to_download_files: todo.len(),
        to_download_bytes: todo.iter().map(|f| f.size).sum(),
    });

    check_access(&repo, req, &commit, &endpoint, &todo).await?;

    for dir in [cache.root.join("blobs"), cache.snapshot_dir(&commit)] {
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    }
    link_present(&cache, req, &commit, &present, &events)?;
    let downloaded_bytes = download_all(&cache, req, opts, &commit, &endpoint, &todo, &events).await?;
    complete(&cache, req, &commit, &files)?;
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

/// Link the files whose blobs the cache already has into the snapshot.
fn link_present(
    cache: &RepoCache,
    req: &ModelRequest,
    commit: &str,
    present: &[RemoteFile],
    events: &mpsc::UnboundedSender<SetupEvent>,
) -> Result<(), HubError> {
    for f in present {
        cache
            .link(commit, &f.path, &f.etag)
            .map_err(io_err(&cache.snapshot_file(commit, &f.path)))?;
        let _ = events.send(SetupEvent::FileDone {
            repo: req.repo.clone(),
            path: f.path.clone(),
            bytes: f.size,
            downloaded: false,
        });
    }
    Ok(())
}

/// Download the missing files in parallel (largest first, under one
/// connection limit) and link each into the snapshot once it is verified.
/// Returns the bytes downloaded; the first error aborts the other files.
async fn download_all(
    cache: &RepoCache,
    req: &ModelRequest,
    opts: &SetupOptions,
    commit: &str,
    endpoint: &str,
    todo: &[RemoteFile],
    events: &mpsc::UnboundedSender<SetupEvent>,
) -> Result<u64, HubError> {
    let fetcher = Arc::new(Fetcher::new(endpoint, &req.repo_type, &req.repo, commit)?);
    let permits = Arc::new(Semaphore::new(opts.connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut todo = todo.to_vec();
    todo.sort_by_key(|f| std::cmp::Reverse(f.size));
    for f in todo {
        let fetcher = fetcher.clone();
        let permits = permits.clone();
        let events = events.clone();
        let cache = cache.clone();
        let commit = commit.to_string();
        let opts = opts.clone();
        let name = req.repo.clone();
        let endpoint = endpoint.to_string();
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
    match first_err {
        Some(e) => Err(e),
        None => Ok(downloaded_bytes),
    }
}

/// The revision's ref, then the completeness marker (written after every
/// file is linked: it is what makes the snapshot complete offline).
fn complete(
    cache: &RepoCache,
    req: &ModelRequest,
    commit: &str,
    files: &[RemoteFile],
) -> Result<(), HubError> {
    cache
        .write_ref(&req.revision, commit)
        .map_err(io_err(&cache.ref_file(&req.revision)))?;
    let marker = CompleteMarker {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: commit.to_string(),
        files: files.iter().map(|f| (f.path.clone(), f.size)).collect(),
        include: req.include.clone(),
        exclude: req.exclude.clone(),
    };
    cache.write_marker(&marker).map_err(io_err(&cache.root))
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
