//! What a setup is asked for and what it tells: the model request, the
//! options, progress events and the final report.

use super::error::HubError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One model to set up.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    pub repo: String,
    pub revision: String,
    pub include: Vec<String>,
    pub exclude: Vec<String>,
    /// `model`, `dataset` or `space`.
    pub repo_type: String,
}

impl ModelRequest {
    /// `org/name` or `org/name@revision`.
    pub fn parse(spec: &str) -> Result<ModelRequest, HubError> {
        let (repo, revision) = match spec.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (spec, "main"),
        };
        let valid =
            |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        match repo.split_once('/') {
            Some((org, name)) if valid(org) && valid(name) && !revision.is_empty() => Ok(ModelRequest {
                repo: repo.to_string(),
                revision: revision.to_string(),
                include: vec![],
                exclude: vec![],
                repo_type: "model".into(),
            }),
            _ => Err(HubError::BadSpec(spec.to_string())),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SetupOptions {
    pub weights_dir: PathBuf,
    /// HTTP requests in flight at once, over all files.
    pub connections: usize,
    /// Files at least this large are fetched in parallel byte ranges.
    pub range_min_bytes: u64,
    /// Size of one byte range.
    pub chunk_bytes: u64,
}

impl SetupOptions {
    pub fn new(weights_dir: PathBuf) -> SetupOptions {
        SetupOptions {
            weights_dir,
            connections: 16,
            range_min_bytes: 48 << 20,
            chunk_bytes: 32 << 20,
        }
    }
}

/// Progress of a setup.
#[derive(Debug, Clone, PartialEq)]
pub enum SetupEvent {
    /// The repository was listed.
    Listed {
        repo: String,
        commit: String,
        files: usize,
        bytes: u64,
        to_download_files: usize,
        to_download_bytes: u64,
    },
    /// Bytes received (for a rate and an ETA).
    Bytes(u64),
    /// A file is verified and in the snapshot.
    FileDone {
        repo: String,
        path: String,
        bytes: u64,
        downloaded: bool,
    },
    /// The network failed but the cache holds a complete snapshot.
    UsedCache {
        repo: String,
        commit: String,
        reason: String,
    },
}

/// What a setup did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SetupReport {
    pub repo: String,
    pub revision: String,
    pub commit: String,
    pub snapshot: PathBuf,
    pub files: usize,
    pub bytes: u64,
    pub downloaded_files: usize,
    pub downloaded_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_specs() {
        let r = ModelRequest::parse("org/name@v1.0").unwrap();
        assert_eq!((r.repo.as_str(), r.revision.as_str()), ("org/name", "v1.0"));
        assert_eq!(ModelRequest::parse("org/name").unwrap().revision, "main");
        assert!(ModelRequest::parse("name").is_err());
        assert!(ModelRequest::parse("a/b/c").is_err());
    }
}
