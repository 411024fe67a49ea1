//! The local spool: a finished cell whose record (or files) could not be
//! uploaded within the request budget is kept on this host under
//! `<work>/.spool/<run>/` until the store answers again.
//!
//! One entry per attempt: `<cell>.<n>.json` (the record exactly as it is
//! uploaded, with the writer token of the process that ran the cell, and
//! where its files go) and `<cell>.<n>.files/` (the attempt's files, moved
//! there from the cell folder). An entry is written whole (a temporary file
//! renamed) and removed only once its files, its attempt record and (for a
//! finished cell) its `done` marker are up. The uploads are create-once
//! with the writer token of the entry, so an entry uploaded twice (two
//! processes, or a reply lost before the entry was removed) is recorded once.
//!
//! A run that stops while the store is away keeps its last state there too
//! (`state.pending`, the `RunMeta` as it was to be written): it is written,
//! after the records, when the store answers again (the run's next write,
//! or any command that opens the run), unless the store has a newer state
//! of the run by then.

use crate::conditional::poisoned;
use crate::{follow, Result, S3Store};
use orch_store::{CellRecord, Run, RunMeta, StoreError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    v: u32,
    run: String,
    cell: String,
    attempt: u32,
    finished: bool,
    /// The writer token inside `record`.
    writer: String,
    /// The record as uploaded (with `writer`).
    record: serde_json::Value,
    /// Where the attempt's files go (a key prefix ending in `/`).
    files_key: String,
    /// Why it was spooled.
    error: String,
}

const VERSION: u32 = 1;

/// The state a run stopped in, not yet written to the store.
pub const PENDING_STATE: &str = "state.pending";

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

impl S3Store {
    /// The run's spool folder on this host.
    pub fn spool_dir(&self, id: &str) -> PathBuf {
        self.work.join(".spool").join(id)
    }

    /// The spooled entries of a run (their files), oldest attempt first.
    pub fn spooled(&self, id: &str) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = std::fs::read_dir(self.spool_dir(id))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        out.sort();
        out
    }

    /// Keep the state `meta` on this host until the store answers (see the
    /// module); the path it is kept at.
    pub(crate) fn keep_state(&self, meta: &RunMeta) -> Result<PathBuf> {
        let spool = self.spool_dir(&meta.id);
        std::fs::create_dir_all(&spool).map_err(io("create the spool folder", &spool))?;
        let path = spool.join(PENDING_STATE);
        let tmp = spool.join(format!(".{PENDING_STATE}.tmp"));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(meta).unwrap_or_default())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(io("write the run's state", &path))?;
        if let Ok(mut p) = self.spool_pending.lock() {
            p.insert(meta.id.clone());
        }
        Ok(path)
    }

    /// Write the state kept on this host, unless the store has a newer
    /// one. True when one was kept (written or dropped as stale).
    fn upload_state(&self, id: &str) -> Result<bool> {
        let path = self.spool_dir(id).join(PENDING_STATE);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io("read the run's kept state", &path)(e)),
        };
        let meta: RunMeta = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            source,
        })?;
        let newer = self
            .latest_state(id)?
            .1
            .is_some_and(|latest| latest.updated_at > meta.updated_at);
        if !newer {
            self.write_state(&meta)?;
            eprintln!(
                "note: run {id}'s state `{}`, kept on this host while the store was away, is written",
                meta.state
            );
        }
        let _ = std::fs::remove_file(&path);
        Ok(true)
    }

    /// Keep a record (and the attempt's files in `dir`) in the spool. The
    /// path of the entry.
    pub(crate) fn spool(
        &self,
        run: &Run,
        record: &CellRecord,
        files_key: &str,
        dir: &Path,
        error: &StoreError,
    ) -> Result<PathBuf> {
        let spool = self.spool_dir(run.id());
        std::fs::create_dir_all(&spool).map_err(io("create the spool folder", &spool))?;
        let name = format!("{}.{}", record.id, record.attempt);
        let files = spool.join(format!("{name}.files"));
        if dir.is_dir() && !files.exists() {
            // Same file system (both under the working folder): a rename.
            std::fs::rename(dir, &files).map_err(io("move the cell's files to the spool", dir))?;
        }
        let entry = Entry {
            v: VERSION,
            run: run.id().to_string(),
            cell: record.id.clone(),
            attempt: record.attempt,
            finished: record.status.is_finished(),
            writer: self.token.clone(),
            record: serde_json::from_slice(&self.with_writer(record)).unwrap_or_default(),
            files_key: files_key.to_string(),
            error: error.to_string(),
        };
        let path = spool.join(format!("{name}.json"));
        let tmp = spool.join(format!(".{name}.json.tmp"));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec_pretty(&entry).unwrap_or_default())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&spool)?.sync_all()
        };
        write().map_err(io("write the spooled record", &path))?;
        if let Ok(mut p) = self.spool_pending.lock() {
            p.insert(run.id().to_string());
        }
        Ok(path)
    }

    /// Upload the run's spooled entries, if this process may have any.
    /// `wait`: wait for another thread's upload (before a read of the
    /// records or a change of state); else leave it to that thread. The
    /// number of entries uploaded.
    pub(crate) fn flush_spool(&self, id: &str, wait: bool) -> Result<usize> {
        let pending = self.spool_pending.lock().map_err(|_| poisoned())?.contains(id);
        if !pending {
            return Ok(0);
        }
        let _one = match self.spool_lock.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::WouldBlock) if !wait => return Ok(0),
            Err(std::sync::TryLockError::WouldBlock) => self.spool_lock.lock().map_err(|_| poisoned())?,
            Err(std::sync::TryLockError::Poisoned(_)) => return Err(poisoned()),
        };
        let mut sent = 0;
        for path in self.spooled(id) {
            if self.upload_entry(id, &path)? {
                sent += 1;
            }
        }
        // The state after the records it covers.
        if self.spooled(id).is_empty() && self.upload_state(id)? {
            sent += 1;
        }
        if self.spooled(id).is_empty() && !self.spool_dir(id).join(PENDING_STATE).exists() {
            let _ = std::fs::remove_dir_all(self.spool_dir(id));
            if let Ok(mut p) = self.spool_pending.lock() {
                p.remove(id);
            }
        }
        Ok(sent)
    }

    /// Note the spool of a run this process opens (another process's
    /// leftovers), and upload it. True when something went up.
    pub(crate) fn adopt_spool(&self, id: &str) -> Result<bool> {
        if self.spooled(id).is_empty() && !self.spool_dir(id).join(PENDING_STATE).exists() {
            return Ok(false);
        }
        if let Ok(mut p) = self.spool_pending.lock() {
            p.insert(id.to_string());
        }
        Ok(self.flush_spool(id, true)? > 0)
    }

    /// Upload one entry: files, attempt record, `done` marker; then remove
    /// it. False when another process removed it first.
    fn upload_entry(&self, id: &str, path: &Path) -> Result<bool> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io("read the spooled record", path)(e)),
        };
        let entry: Entry = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
        let files = path.with_extension("files");
        let gone = || !path.exists();
        if files.is_dir() {
            if let Err(e) = follow::finalize(&self.objects, &files, &entry.files_key) {
                // Another process uploaded and removed it meanwhile.
                return if gone() { Ok(false) } else { Err(e) };
            }
        }
        let runkey = self.run_key(id);
        let body = serde_json::to_vec_pretty(&entry.record).unwrap_or_default();
        let attempt_key = format!("{runkey}records/{}/{}.json", entry.cell, entry.attempt);
        let mut recorded_elsewhere = None;
        if let Err(by) = self.create_as(&attempt_key, body.clone(), &entry.writer)? {
            recorded_elsewhere = Some(by);
        }
        if recorded_elsewhere.is_none() && entry.finished {
            if let Err(by) =
                self.create_as(&format!("{runkey}done/{}.json", entry.cell), body, &entry.writer)?
            {
                recorded_elsewhere = Some(by);
            }
        }
        if let Some(by) = recorded_elsewhere {
            eprintln!(
                "warning: cell `{}` of run `{id}` was recorded by another process ({by}) while its record from attempt {} was kept on this host; that one stays an earlier attempt",
                entry.cell, entry.attempt
            );
        }
        if let (Ok(record), Ok(mut cache)) = (
            serde_json::from_value::<CellRecord>(entry.record),
            self.records.lock(),
        ) {
            cache.insert(attempt_key, record);
        }
        let _ = std::fs::remove_dir_all(&files);
        let _ = std::fs::remove_file(path);
        Ok(true)
    }
}
