//! Following a running cell's folder: every [`FLUSH_EVERY`], the bytes each
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
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<BTreeMap<String, u64>>>,
}

impl Follower {
    /// Start following `dir`, uploading under the key prefix `base` (ending in `/`).
    pub fn start(objects: Arc<Objects>, dir: PathBuf, base: String) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("orch-s3-follow".into())
            .spawn(move || {
                let mut sent: BTreeMap<String, u64> = BTreeMap::new();
                while !s.load(Ordering::Relaxed) {
                    // Sleep in small steps so that a stop is seen at once.
                    let mut slept = Duration::ZERO;
                    while slept < FLUSH_EVERY && !s.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                        slept += Duration::from_millis(100);
                    }
                    // A failed upload is retried at the next flush.
                    let _ = flush(&objects, &dir, &base, &mut sent);
                }
                sent
            })
            .ok();
        Follower { stop, thread }
    }

    /// Stop following; the offsets sent so far per file.
    pub fn stop(mut self) -> BTreeMap<String, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
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
