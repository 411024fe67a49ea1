//! Hash helpers matching what the Hub reports: git blob oids (sha1) and LFS oids (sha256).

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha1::{Digest as _, Sha1};
use sha2::Sha256;

/// Lowercase hex of a byte slice.
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing into a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// sha256 of `data`, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    to_hex(&Sha256::digest(data))
}

/// Git blob object id: sha1 of `"blob {len}\0" + content`, lowercase hex.
pub fn git_blob_oid(data: &[u8]) -> String {
    let mut h = Sha1::new();
    h.update(format!("blob {}\0", data.len()).as_bytes());
    h.update(data);
    to_hex(&h.finalize())
}

/// sha256 of a file's content (streamed), lowercase hex, plus the file size.
pub fn sha256_file(path: &Path) -> io::Result<(String, u64)> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        h.update(&buf[..n]);
    }
    Ok((to_hex(&h.finalize()), total))
}

/// The git-lfs pointer file text stored in git for an LFS file.
pub fn lfs_pointer(sha256: &str, size: u64) -> String {
    format!("version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n")
}
