//! The files that travel with a cell, laid out before the workload runs.
//!
//! The host names each file by the SHA-256 of its content and puts the
//! blobs where the cell can read them (a read-only bind mount, a Kubernetes
//! ConfigMap volume, a Modal mount, a folder on Slurm's shared filesystem).
//! Here each blob is read (whole, or as the chunks `<sha256>.0`, `.1`, ...
//! a transport with a size limit per object splits it into), its digest is
//! checked, and it is copied to where the rewritten task expects it. A
//! missing blob or a wrong digest fails the cell before its workload runs.

use orch_protocol::{FileEntry, FileSet};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;

/// Lay out every file of `set`; `Ok` is a one-line summary for the log.
pub fn lay_out(set: &FileSet) -> Result<String, String> {
    let mut bytes = 0u64;
    for f in &set.files {
        lay_out_one(Path::new(&set.blobs), f)?;
        bytes += f.size;
    }
    Ok(format!(
        "laid out {} file{} ({}) under `{}`, every SHA-256 checked",
        set.files.len(),
        if set.files.len() == 1 { "" } else { "s" },
        human(bytes),
        set.root
    ))
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        format!("{b} B")
    }
}

/// The pieces of a blob: the whole file, else its numbered chunks.
fn pieces(blobs: &Path, sha: &str) -> Result<Vec<std::path::PathBuf>, String> {
    let whole = blobs.join(sha);
    if whole.is_file() {
        return Ok(vec![whole]);
    }
    let mut out = Vec::new();
    loop {
        let p = blobs.join(format!("{sha}.{}", out.len()));
        if !p.is_file() {
            break;
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err(format!(
            "the blob `{sha}` is not in `{}`: the host did not deliver it",
            blobs.display()
        ));
    }
    Ok(out)
}

fn lay_out_one(blobs: &Path, f: &FileEntry) -> Result<(), String> {
    if !is_sha256(&f.sha256) {
        return Err(format!("`{}` is not a SHA-256 (file `{}`)", f.sha256, f.path));
    }
    let dest = Path::new(&f.path);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("cannot create `{}`: {e}", parent.display()))?;
    }
    // Written beside, renamed when checked: a wrong digest leaves nothing.
    let tmp = dest.with_file_name(format!(
        ".{}.orch-part",
        dest.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let mut out =
        std::fs::File::create(&tmp).map_err(|e| format!("cannot create `{}`: {e}", tmp.display()))?;
    let mut hash = Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    for piece in pieces(blobs, &f.sha256)? {
        let mut input =
            std::fs::File::open(&piece).map_err(|e| format!("cannot read `{}`: {e}", piece.display()))?;
        loop {
            let n = input
                .read(&mut buf)
                .map_err(|e| format!("cannot read `{}`: {e}", piece.display()))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            size += n as u64;
            out.write_all(&buf[..n])
                .map_err(|e| format!("cannot write `{}`: {e}", tmp.display()))?;
        }
    }
    drop(out);
    let got = hex(&hash.finalize());
    if got != f.sha256 || size != f.size {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "`{}` arrived damaged: SHA-256 {got} ({size} bytes), expected {} ({} bytes)",
            f.path, f.sha256, f.size
        ));
    }
    let mode = if f.executable { 0o755 } else { 0o644 };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the mode of `{}`: {e}", tmp.display()))?;
    std::fs::rename(&tmp, dest).map_err(|e| format!("cannot write `{}`: {e}", dest.display()))?;
    Ok(())
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    #[test]
    fn files_are_laid_out_from_whole_and_chunked_blobs_and_checked() {
        let d = tempfile::tempdir().unwrap();
        let blobs = d.path().join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let a = b"print('hello')\n".to_vec();
        let b: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(blobs.join(sha(&a)), &a).unwrap();
        std::fs::write(blobs.join(format!("{}.0", sha(&b))), &b[..60_000]).unwrap();
        std::fs::write(blobs.join(format!("{}.1", sha(&b))), &b[60_000..]).unwrap();
        let root = d.path().join("files");
        let set = FileSet {
            blobs: blobs.to_string_lossy().into(),
            root: root.to_string_lossy().into(),
            files: vec![
                FileEntry {
                    path: root.join("w/run.py").to_string_lossy().into(),
                    sha256: sha(&a),
                    size: a.len() as u64,
                    executable: true,
                },
                FileEntry {
                    path: root.join("data/b.bin").to_string_lossy().into(),
                    sha256: sha(&b),
                    size: b.len() as u64,
                    executable: false,
                },
            ],
        };
        let summary = lay_out(&set).unwrap();
        assert!(summary.starts_with("laid out 2 files"), "{summary}");
        assert_eq!(std::fs::read(root.join("w/run.py")).unwrap(), a);
        assert_eq!(std::fs::read(root.join("data/b.bin")).unwrap(), b);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(root.join("w/run.py"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);

        // A damaged blob fails and leaves nothing at the destination.
        std::fs::write(blobs.join(sha(&a)), b"print('evil')\n").unwrap();
        std::fs::remove_file(root.join("w/run.py")).unwrap();
        let e = lay_out(&set).unwrap_err();
        assert!(e.contains("arrived damaged"), "{e}");
        assert!(!root.join("w/run.py").exists());

        // A missing blob names itself and the folder.
        std::fs::remove_file(blobs.join(sha(&a))).unwrap();
        let e = lay_out(&set).unwrap_err();
        assert!(
            e.contains("the host did not deliver it") && e.contains(&sha(&a)),
            "{e}"
        );
    }
}
