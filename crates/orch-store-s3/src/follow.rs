//! Following running cells' folders ([`Followers`], one thread per store
//! for all of them): every [`FLUSH_EVERY`], the bytes each
//! file gained go up as one new segment object, `<file>.parts/<offset>`
//! (written once, never rewritten), so a crash of the host loses at most
//! the last interval and another machine can follow the logs. When the cell
//! ends, each file goes up whole (multipart when large) and its segments
//! are deleted. A segment is tried for a few seconds only (the next flush
//! sends what it missed), so stopping a follower never waits out an outage.
//!
//! Only regular files are read: a symbolic link in a cell folder (a
//! workload pointing `x.log` at `~/.aws/credentials`) is never followed.

use crate::objects::Objects;
use orch_store::StoreError;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Time between two uploads of what the cell's files gained.
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// Files of a cell folder that are not uploaded: the agent's own copy of
/// the result (the record is written by the store) and temporary files.
fn skipped(rel: &str) -> bool {
    rel == "result.json" || rel == orch_protocol::AGENT_RESULT_FILE || rel.contains(".tmp.")
}

/// Regular files under `dir` (relative names with `/`), links not followed.
pub fn regular_files(dir: &Path) -> Vec<(String, PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(t) = e.file_type() else { continue };
            let Some(name) = e.file_name().to_str().map(String::from) else {
                continue;
            };
            if orch_store::check_name("file name", &name).is_err() {
                continue;
            }
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if t.is_dir() {
                stack.push((e.path(), r));
            } else if t.is_file() {
                let size = e.metadata().map(|m| m.len()).unwrap_or(0);
                out.push((r, e.path(), size));
            }
        }
    }
    out.sort();
    out
}

/// The key of the segment of `file` starting at `offset`.
pub fn segment_key(base: &str, rel: &str, offset: u64) -> String {
    format!("{base}{rel}.parts/{offset:016}")
}

/// A followed cell folder and what of its files went up.
struct Followed {
    dir: PathBuf,
    base: String,
    sent: BTreeMap<String, u64>,
    stopped: bool,
}

/// The key of a followed cell: (run, cell).
pub type CellKey = (String, String);

/// Cell folders at once in one round of uploads.
const FLUSHES_AT_ONCE: usize = 8;

struct Shared {
    objects: Arc<Objects>,
    cells: Mutex<HashMap<CellKey, Arc<Mutex<Followed>>>>,
    /// The store is gone: the thread ends.
    closed: Mutex<bool>,
    wake: Condvar,
}

/// Every running cell's folder of a store, followed by one thread (not one
/// per cell): every [`FLUSH_EVERY`] it uploads what each folder's files
/// gained, [`FLUSHES_AT_ONCE`] folders at a time.
pub struct Followers {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Followers {
    pub fn new(objects: Arc<Objects>) -> Followers {
        Followers {
            shared: Arc::new(Shared {
                objects,
                cells: Mutex::new(HashMap::new()),
                closed: Mutex::new(false),
                wake: Condvar::new(),
            }),
            thread: Mutex::new(None),
        }
    }

    /// Start following `dir`, uploading under the key prefix `base` (ending in `/`).
    pub fn follow(&self, key: CellKey, dir: PathBuf, base: String) {
        let followed = Followed {
            dir,
            base,
            sent: BTreeMap::new(),
            stopped: false,
        };
        if let Ok(mut cells) = self.shared.cells.lock() {
            cells.insert(key, Arc::new(Mutex::new(followed)));
        }
        let Ok(mut thread) = self.thread.lock() else {
            return;
        };
        if thread.is_none() {
            let shared = self.shared.clone();
            // Without a thread the files go up whole at the end only.
            *thread = std::thread::Builder::new()
                .name("orch-s3-follow".into())
                .spawn(move || follow_loop(&shared))
                .ok();
        }
    }

    /// Stop following a cell (after an upload under way ends); the key
    /// prefix of its files, when it was followed.
    pub fn stop(&self, key: &CellKey) -> Option<String> {
        let followed = self.shared.cells.lock().ok()?.remove(key)?;
        let mut f = followed.lock().unwrap_or_else(|p| p.into_inner());
        f.stopped = true;
        Some(f.base.clone())
    }

    /// The cells followed now.
    pub fn len(&self) -> usize {
        self.shared.cells.lock().map(|c| c.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Followers {
    fn drop(&mut self) {
        if let Ok(mut closed) = self.shared.closed.lock() {
            *closed = true;
        }
        self.shared.wake.notify_all();
    }
}

fn follow_loop(shared: &Shared) {
    loop {
        {
            let Ok(closed) = shared.closed.lock() else { return };
            let Ok((closed, _)) = shared.wake.wait_timeout_while(closed, FLUSH_EVERY, |c| !*c) else {
                return;
            };
            if *closed {
                return;
            }
        }
        let cells: Vec<Arc<Mutex<Followed>>> = match shared.cells.lock() {
            Ok(c) => c.values().cloned().collect(),
            Err(_) => return,
        };
        orch_store::parallel_map_with(&cells, FLUSHES_AT_ONCE, |cell| {
            let mut guard = cell.lock().unwrap_or_else(|p| p.into_inner());
            let f = &mut *guard;
            if !f.stopped {
                // A failed upload is retried at the next flush.
                let _ = flush(&shared.objects, &f.dir, &f.base, &mut f.sent);
            }
        });
    }
}

/// Upload what each file gained since `sent` as new segments.
pub fn flush(
    objects: &Objects,
    dir: &Path,
    base: &str,
    sent: &mut BTreeMap<String, u64>,
) -> Result<(), StoreError> {
    use std::io::{Read, Seek, SeekFrom};
    for (rel, path, size) in regular_files(dir) {
        if skipped(&rel) {
            continue;
        }
        let from = sent.get(&rel).copied().unwrap_or(0);
        if size <= from {
            continue;
        }
        let read = || -> std::io::Result<Vec<u8>> {
            let mut f = std::fs::File::open(&path)?;
            f.seek(SeekFrom::Start(from))?;
            let mut buf = Vec::with_capacity((size - from) as usize);
            f.take(size - from).read_to_end(&mut buf)?;
            Ok(buf)
        };
        let Ok(bytes) = read() else { continue };
        let n = bytes.len() as u64;
        objects.put_segment(&segment_key(base, &rel, from), bytes)?;
        sent.insert(rel, from + n);
    }
    Ok(())
}

/// Upload every file of the finished attempt whole and delete its segments.
pub fn finalize(objects: &Objects, dir: &Path, base: &str) -> Result<(), StoreError> {
    for (rel, path, _) in regular_files(dir) {
        if skipped(&rel) {
            continue;
        }
        objects.put_file(&format!("{base}{rel}"), &path)?;
    }
    let parts: Vec<String> = objects
        .list(base)?
        .into_iter()
        .map(|l| l.key)
        .filter(|k| k.contains(".parts/"))
        .collect();
    objects.delete(&parts)
}

/// A file of an attempt from `offset` on: the whole object when the
/// attempt has ended, else its segments so far.
pub fn read(objects: &Objects, base: &str, rel: &str, offset: u64) -> Result<Option<Vec<u8>>, StoreError> {
    let whole = format!("{base}{rel}");
    if let Some(b) = objects.get(&whole, offset)? {
        return Ok(Some(b));
    }
    let prefix = format!("{whole}.parts/");
    let parts = objects.list(&prefix)?;
    if parts.is_empty() {
        // Finalized between the two reads?
        return objects.get(&whole, offset);
    }
    let mut keys = Vec::new();
    let mut starts = Vec::new();
    for p in &parts {
        let Some(start) = p.key[prefix.len()..].parse::<u64>().ok() else {
            continue;
        };
        if start + p.size > offset {
            keys.push(p.key.clone());
            starts.push(start);
        }
    }
    let mut out = Vec::new();
    let mut at = offset;
    for (start, bytes) in starts.into_iter().zip(objects.get_many(&keys)?) {
        let Some(bytes) = bytes else { break };
        if start > at {
            // A segment is missing (deleted by a finalize in between).
            return objects.get(&whole, offset);
        }
        let skip = (at - start) as usize;
        if skip < bytes.len() {
            out.extend_from_slice(&bytes[skip..]);
            at = start + bytes.len() as u64;
        }
    }
    Ok(Some(out))
}
