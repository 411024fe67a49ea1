//! One file's download: into `blobs/<etag>.incomplete`, large files in
//! parallel byte ranges under the connection limit, each finished range
//! recorded beside it (`.incomplete.parts`) so that an interrupted download
//! resumes; the whole file at once from a server that ignores ranges; then
//! verified and moved into place.

use super::error::{io_err, HubError};
use super::fetch::{FetchError, Fetcher, RANGE_IGNORED};
use super::listing::RemoteFile;
use super::options::{SetupEvent, SetupOptions};
use super::verify::verify_and_place;
use crate::cache::{write_atomic, RepoCache};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Semaphore};

/// Finished byte ranges of a partial blob, kept beside it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Parts {
    size: u64,
    chunk_bytes: u64,
    done: BTreeSet<u64>,
}

/// Download one file of the listing into its blob: ranges (resumed where an
/// earlier setup left them), verification, the final name.
#[allow(clippy::too_many_arguments)]
pub(super) async fn download_file(
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
    let (file, parts, chunks) = open_partial(f, chunk, &partial, &parts_path, events)?;
    let ranges = Arc::new(Ranges {
        fetcher: fetcher.clone(),
        file,
        parts,
        parts_path: parts_path.clone(),
        path: f.path.clone(),
        size: f.size,
        chunk,
        ranged,
        events: events.clone(),
        repo: repo_name.to_string(),
        endpoint: endpoint.to_string(),
    });
    if ranges.fetch_all(chunks, &permits).await? {
        ranges.fetch_whole(permits, &partial).await?;
    }

    // Verify, then move into place.
    verify_and_place(f, &partial, &parts_path, &blob, repo_name).await
}

/// Open the partial blob at its full size, resuming what an earlier setup
/// left if it used the same chunking: the file, its record of finished
/// ranges, and the ranges still to fetch (the resumed bytes are reported).
#[allow(clippy::type_complexity)]
fn open_partial(
    f: &RemoteFile,
    chunk: u64,
    partial: &Path,
    parts_path: &Path,
    events: &mpsc::UnboundedSender<SetupEvent>,
) -> Result<(Arc<std::fs::File>, Arc<Mutex<Parts>>, Vec<u64>), HubError> {
    // Resume what an earlier setup left, if it used the same chunking.
    let mut parts: Parts = std::fs::read(parts_path)
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
        .open(partial)
        .map_err(io_err(partial))?;
    file.set_len(f.size).map_err(io_err(partial))?;
    let file = Arc::new(file);
    let chunks: Vec<u64> = (0..f.size.div_ceil(chunk))
        .filter(|i| !parts.done.contains(i))
        .collect();
    let resumed: u64 = parts.done.iter().map(|i| chunk.min(f.size - i * chunk)).sum();
    if resumed > 0 {
        let _ = events.send(SetupEvent::Bytes(resumed));
    }
    Ok((file, Arc::new(Mutex::new(parts)), chunks))
}

/// What every range task of one file shares.
struct Ranges {
    fetcher: Arc<Fetcher>,
    file: Arc<std::fs::File>,
    parts: Arc<Mutex<Parts>>,
    parts_path: PathBuf,
    /// The file's path in the repository.
    path: String,
    size: u64,
    chunk: u64,
    ranged: bool,
    events: mpsc::UnboundedSender<SetupEvent>,
    repo: String,
    endpoint: String,
}

impl Ranges {
    /// Fetch the ranges not done yet, in parallel under the connection
    /// limit. `true`: the server ignored a byte range (the other ranges
    /// were aborted).
    async fn fetch_all(
        self: &Arc<Self>,
        chunks: Vec<u64>,
        permits: &Arc<Semaphore>,
    ) -> Result<bool, HubError> {
        let mut tasks = tokio::task::JoinSet::new();
        for i in chunks {
            tasks.spawn(self.clone().fetch_range(i, permits.clone()));
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
                        repo: self.repo.clone(),
                        message: format!("a download task failed: {e}"),
                    })
                }
            }
        }
        Ok(range_ignored)
    }

    /// Fetch range `i` (up to three attempts; none more once access is
    /// refused or the server ignores the range), then record it done.
    async fn fetch_range(self: Arc<Self>, i: u64, permits: Arc<Semaphore>) -> Result<(), HubError> {
        let start = i * self.chunk;
        let end = (start + self.chunk).min(self.size);
        let name = &self.repo;
        let _permit = permits.acquire_owned().await.map_err(|e| HubError::Http {
            repo: name.clone(),
            message: e.to_string(),
        })?;
        let mut last = None;
        for attempt in 0..3 {
            if attempt > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(500 * attempt)).await;
            }
            match self
                .fetcher
                .fetch(&self.path, start, end, self.ranged, &self.file, &self.events)
                .await
            {
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
                    repo: name.clone(),
                    message: RANGE_IGNORED.into(),
                })
            }
            Some(FetchError::Denied(status)) => {
                return Err(HubError::Gated {
                    repo: name.clone(),
                    url: format!("{}/{name}", self.endpoint),
                    why: format!("the server refused the download ({status})"),
                })
            }
            Some(FetchError::Other(message)) => {
                return Err(HubError::Http {
                    repo: name.clone(),
                    message,
                })
            }
        }
        self.record_done(i)
    }

    /// Record a finished range (fsync the data first, so a crash never
    /// marks unwritten bytes done).
    fn record_done(&self, i: u64) -> Result<(), HubError> {
        self.file.sync_data().map_err(io_err(&self.parts_path))?;
        // One writer at a time: the record is rewritten whole under the lock.
        let mut p = self.parts.lock().map_err(|_| HubError::Http {
            repo: self.repo.clone(),
            message: "progress record lock poisoned".into(),
        })?;
        p.done.insert(i);
        let snapshot = serde_json::to_vec(&*p).unwrap_or_default();
        write_atomic(&self.parts_path, &snapshot).map_err(io_err(&self.parts_path))?;
        drop(p);
        Ok(())
    }

    /// The server does not do byte ranges: fetch the file whole, once.
    async fn fetch_whole(&self, permits: Arc<Semaphore>, partial: &Path) -> Result<(), HubError> {
        let _permit = permits.acquire_owned().await.map_err(|e| HubError::Http {
            repo: self.repo.clone(),
            message: e.to_string(),
        })?;
        self.fetcher
            .fetch(&self.path, 0, self.size, false, &self.file, &self.events)
            .await
            .map_err(|e| HubError::Http {
                repo: self.repo.clone(),
                message: e.to_string(),
            })?;
        self.file.sync_data().map_err(io_err(partial))?;
        Ok(())
    }
}
