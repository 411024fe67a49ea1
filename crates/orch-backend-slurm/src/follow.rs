//! Following what the agent writes on the shared filesystem: the new lines
//! of its event stream, and (when the job folder is not the cell folder) a
//! mirror of the job folder into the store while the job runs.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// New complete lines of a growing file.
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl Tail {
    pub fn new(path: PathBuf) -> Tail {
        Tail {
            path,
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// Lines completed since the last call (none while the file is missing).
    pub fn lines(&mut self) -> Vec<String> {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return vec![];
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return vec![];
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() {
            return vec![];
        }
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let mut out = Vec::new();
        while let Some(nl) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=nl).collect();
            out.push(String::from_utf8_lossy(&line).trim_end().to_string());
        }
        out
    }
}

/// A copy of a folder kept up to date: grown files get their new bytes
/// appended, shrunk or replaced ones are copied again.
pub struct Mirror {
    from: PathBuf,
    to: PathBuf,
    /// Inode and length copied, by relative path.
    copied: BTreeMap<PathBuf, (u64, u64)>,
}

impl Mirror {
    pub fn new(from: PathBuf, to: PathBuf) -> Mirror {
        Mirror {
            from,
            to,
            copied: BTreeMap::new(),
        }
    }

    /// Bring the copy up to date; `full` copies every file again (the end
    /// of the job, when files may have been rewritten in place).
    pub fn sync(&mut self, full: bool) -> std::io::Result<()> {
        let mut stack = vec![self.from.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                let Ok(meta) = e.metadata() else { continue };
                let Ok(rel) = p.strip_prefix(&self.from) else {
                    continue;
                };
                let dest = self.to.join(rel);
                if meta.is_dir() {
                    std::fs::create_dir_all(&dest)?;
                    stack.push(p);
                } else if meta.is_file() {
                    use std::os::unix::fs::MetadataExt;
                    let (ino, len) = (meta.ino(), meta.len());
                    // A file replaced by a rename (`result.json`) is a new inode.
                    match self.copied.get(rel).copied() {
                        Some((i, d)) if !full && i == ino && d == len => {}
                        Some((i, d)) if !full && i == ino && d < len => {
                            append_from(&p, &dest, d)?;
                            self.copied.insert(rel.to_path_buf(), (ino, len));
                        }
                        _ => {
                            copy_whole(&p, &dest)?;
                            self.copied.insert(rel.to_path_buf(), (ino, len));
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn append_from(src: &Path, dest: &Path, offset: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::open(src)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut out = std::fs::OpenOptions::new().create(true).append(true).open(dest)?;
    std::io::copy(&mut f, &mut out)?;
    out.flush()
}

fn copy_whole(src: &Path, dest: &Path) -> std::io::Result<()> {
    // Through a temp file and a rename: a reader of the store never sees a
    // half-copied `result.json`.
    let tmp = dest.with_extension("orch-copy");
    std::fs::copy(src, &tmp)?;
    std::fs::rename(&tmp, dest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_returns_complete_lines_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("e.jsonl");
        let mut t = Tail::new(p.clone());
        assert!(t.lines().is_empty());
        std::fs::write(&p, "a\nb").unwrap();
        assert_eq!(t.lines(), vec!["a"]);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"c\nd\n").unwrap();
        assert_eq!(t.lines(), vec!["bc", "d"]);
        assert!(t.lines().is_empty());
    }

    #[test]
    fn mirror_appends_growth_and_recopies_rewrites() {
        let d = tempfile::tempdir().unwrap();
        let (from, to) = (d.path().join("job"), d.path().join("cell"));
        std::fs::create_dir_all(from.join("nodes/1")).unwrap();
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(from.join("stdout.log"), "one\n").unwrap();
        std::fs::write(from.join("nodes/1/result.json"), "{}").unwrap();
        let mut m = Mirror::new(from.clone(), to.clone());
        m.sync(false).unwrap();
        assert_eq!(std::fs::read_to_string(to.join("stdout.log")).unwrap(), "one\n");
        assert_eq!(
            std::fs::read_to_string(to.join("nodes/1/result.json")).unwrap(),
            "{}"
        );
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(from.join("stdout.log"))
            .unwrap();
        f.write_all(b"two\n").unwrap();
        std::fs::write(from.join("nodes/1/r.tmp"), "{\"a\":1}").unwrap();
        std::fs::rename(from.join("nodes/1/r.tmp"), from.join("nodes/1/result.json")).unwrap();
        m.sync(false).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.join("stdout.log")).unwrap(),
            "one\ntwo\n"
        );
        assert_eq!(
            std::fs::read_to_string(to.join("nodes/1/result.json")).unwrap(),
            "{\"a\":1}"
        );
        // Same length, new content: only a full sync sees it.
        std::fs::write(from.join("nodes/1/result.json"), "{\"a\":2}").unwrap();
        m.sync(true).unwrap();
        assert_eq!(
            std::fs::read_to_string(to.join("nodes/1/result.json")).unwrap(),
            "{\"a\":2}"
        );
    }
}
