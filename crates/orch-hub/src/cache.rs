//! The Hugging Face hub cache layout, as the Python `huggingface_hub` writes it:
//!
//! ```text
//! <cache>/models--org--name/
//!   blobs/<etag>                       file content (etag: sha256 for LFS files, git blob oid otherwise)
//!   snapshots/<commit>/<path>          relative symlink to ../../blobs/<etag>
//!   refs/<revision>                    the commit a branch or tag pointed to
//! ```
//!
//! orch adds one folder the hub ignores: `.orch/complete-<commit>.json`, the
//! list of files (and sizes) a finished `orch setup` put into that snapshot,
//! so that `orch plan` can tell "complete" without the network.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// `models--org--name` (or `datasets--...`, `spaces--...`).
pub fn repo_folder_name(repo: &str, repo_type: &str) -> String {
    let kind = match repo_type {
        "dataset" => "datasets",
        "space" => "spaces",
        _ => "models",
    };
    format!("{kind}--{}", repo.replace('/', "--"))
}

#[derive(Debug, Clone)]
pub struct RepoCache {
    pub root: PathBuf,
}

/// What a finished setup recorded for one snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompleteMarker {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    /// (path, size) of every file of the snapshot.
    pub files: Vec<(String, u64)>,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
}

impl RepoCache {
    pub fn new(weights_dir: &Path, repo: &str, repo_type: &str) -> RepoCache {
        RepoCache {
            root: weights_dir.join(repo_folder_name(repo, repo_type)),
        }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    pub fn snapshot_file(&self, commit: &str, path: &str) -> PathBuf {
        self.snapshot_dir(commit).join(path)
    }

    pub fn ref_file(&self, revision: &str) -> PathBuf {
        self.root.join("refs").join(revision)
    }

    fn marker_path(&self, commit: &str) -> PathBuf {
        self.root.join(".orch").join(format!("complete-{commit}.json"))
    }

    /// The commit a revision resolves to locally: itself if it is a commit
    /// with a snapshot, else what `refs/<revision>` says.
    pub fn local_commit(&self, revision: &str) -> Option<String> {
        if is_commit_hash(revision) && self.snapshot_dir(revision).is_dir() {
            return Some(revision.to_string());
        }
        std::fs::read_to_string(self.ref_file(revision))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    }

    pub fn write_ref(&self, revision: &str, commit: &str) -> std::io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.ref_file(revision);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        write_atomic(&path, commit.as_bytes())
    }

    pub fn read_marker(&self, commit: &str) -> Option<CompleteMarker> {
        let bytes = std::fs::read(self.marker_path(commit)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn write_marker(&self, marker: &CompleteMarker) -> std::io::Result<()> {
        let path = self.marker_path(&marker.commit);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let bytes = serde_json::to_vec_pretty(marker).map_err(std::io::Error::other)?;
        write_atomic(&path, &bytes)
    }

    /// Is the snapshot for `revision` complete (every recorded file present
    /// with its size)? Offline.
    pub fn complete(&self, revision: &str) -> Option<CompleteMarker> {
        let commit = self.local_commit(revision)?;
        let marker = self.read_marker(&commit)?;
        let all_there = marker.files.iter().all(|(path, size)| {
            std::fs::metadata(self.snapshot_file(&commit, path))
                .map(|m| m.len() == *size)
                .unwrap_or(false)
        });
        all_there.then_some(marker)
    }

    /// Link `snapshots/<commit>/<path>` to `blobs/<etag>` with a relative link.
    pub fn link(&self, commit: &str, path: &str, etag: &str) -> std::io::Result<()> {
        let link = self.snapshot_file(commit, path);
        if let Some(parent) = link.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let depth = path.split('/').count() - 1;
        let mut target = PathBuf::new();
        for _ in 0..depth + 2 {
            target.push("..");
        }
        target.push("blobs");
        target.push(etag);
        match std::fs::symlink_metadata(&link) {
            Ok(_) => std::fs::remove_file(&link)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::os::unix::fs::symlink(&target, &link)
    }
}

/// 40 hex characters.
pub fn is_commit_hash(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_hub() {
        assert_eq!(repo_folder_name("org/name", "model"), "models--org--name");
        assert_eq!(repo_folder_name("org/data", "dataset"), "datasets--org--data");
        let tmp = tempfile::tempdir().unwrap();
        let c = RepoCache::new(tmp.path(), "org/name", "model");
        std::fs::create_dir_all(c.root.join("blobs")).unwrap();
        std::fs::write(c.blob("abc"), b"hi").unwrap();
        c.link("c0ffee", "sub/dir/f.txt", "abc").unwrap();
        let link = c.snapshot_file("c0ffee", "sub/dir/f.txt");
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            PathBuf::from("../../../../blobs/abc")
        );
        assert_eq!(std::fs::read(&link).unwrap(), b"hi");
    }
}
