//! Verification of a downloaded file (size always, sha256 for LFS files)
//! before it gets its final name.

use super::error::{io_err, HubError};
use super::listing::RemoteFile;
use sha2::{Digest, Sha256};
use std::path::Path;

/// Check the partial file, then move it into place as the blob. A file that
/// fails is removed with its record of ranges.
pub(super) async fn verify_and_place(
    f: &RemoteFile,
    partial: &Path,
    parts_path: &Path,
    blob: &Path,
    repo_name: &str,
) -> Result<(), HubError> {
    let size = std::fs::metadata(partial).map_err(io_err(partial))?.len();
    let fail = |message: String| {
        let _ = std::fs::remove_file(partial);
        let _ = std::fs::remove_file(parts_path);
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
        let p = partial.to_path_buf();
        let got = tokio::task::spawn_blocking(move || sha256_file(&p))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| fail(e.to_string()))?;
        if !got.eq_ignore_ascii_case(want) {
            return Err(fail(format!("sha256 {got}, expected {want}")));
        }
    }
    std::fs::rename(partial, blob).map_err(io_err(blob))?;
    let _ = std::fs::remove_file(parts_path);
    Ok(())
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
