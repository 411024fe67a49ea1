//! Files written so that a reader sees the old content or the whole new one.

use crate::{io, Result, StoreError};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Write a file so that readers see the old content or the whole new one,
/// and the new one survives a power cut once this returns.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{seq}", std::process::id()));
    // `create_new` (O_EXCL) never follows a link planted under the
    // temporary name; whatever is there is a leftover and goes first.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    let written = f
        .write_all(bytes)
        .map_err(io("write", &tmp))
        .and_then(|()| f.sync_all().map_err(io("sync", &tmp)));
    drop(f);
    // A full disk leaves no half-written temporary behind.
    let placed = written.and_then(|()| std::fs::rename(&tmp, path).map_err(io("rename into place", path)));
    if placed.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    placed?;
    if let Some(parent) = path.parent() {
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io("read", path))?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_leaves_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.json");
        write_json(&p, &serde_json::json!({"a": 1})).unwrap();
        write_json(&p, &serde_json::json!({"a": 2})).unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        let v: serde_json::Value = read_json(&p).unwrap();
        assert_eq!(v["a"], 2);
    }
}
