//! Scanning a hub root into repos and hashing their files.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use sha1::{Digest as _, Sha1};

use crate::hashing::{git_blob_oid, lfs_pointer, sha256_file, to_hex};
use crate::MARKER_FILE;

/// Files above this size are treated as LFS files regardless of their extension.
pub const LFS_THRESHOLD: u64 = 10 * 1024 * 1024;

const LFS_EXTENSIONS: &[&str] = &[
    "safetensors",
    "bin",
    "onnx",
    "onnx_data",
    "pt",
    "pth",
    "gguf",
    "h5",
    "msgpack",
    "ckpt",
    "model",
];

/// Kind of repository (URL prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RepoType {
    Model,
    Dataset,
    Space,
}

impl RepoType {
    /// `models`, `datasets`, `spaces` (the `/api/{plural}` segment).
    pub fn plural(self) -> &'static str {
        match self {
            RepoType::Model => "models",
            RepoType::Dataset => "datasets",
            RepoType::Space => "spaces",
        }
    }

    pub fn from_plural(s: &str) -> Option<RepoType> {
        match s {
            "models" => Some(RepoType::Model),
            "datasets" => Some(RepoType::Dataset),
            "spaces" => Some(RepoType::Space),
            _ => None,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            RepoType::Model => "model",
            RepoType::Dataset => "dataset",
            RepoType::Space => "space",
        }
    }
}

#[derive(Debug, Clone)]
pub struct LfsInfo {
    pub sha256: String,
    pub pointer_size: u64,
}

#[derive(Debug, Clone)]
pub struct RepoFile {
    pub path: String,
    pub abs: PathBuf,
    pub size: u64,
    /// Git blob oid (of the LFS pointer for LFS files, like the Hub).
    pub blob_oid: String,
    pub lfs: Option<LfsInfo>,
}

impl RepoFile {
    /// The ETag the Hub sends: sha256 for LFS files, blob oid otherwise.
    pub fn etag(&self) -> &str {
        match &self.lfs {
            Some(l) => &l.sha256,
            None => &self.blob_oid,
        }
    }
}

#[derive(Debug)]
pub struct Repo {
    pub id: String,
    pub kind: RepoType,
    pub commit: String,
    pub gated_token: Option<String>,
    pub files: BTreeMap<String, RepoFile>,
    pub dirs: BTreeSet<String>,
}

impl Repo {
    pub fn dir_oid(&self, dir: &str) -> String {
        let mut h = Sha1::new();
        h.update(self.commit.as_bytes());
        h.update(b"tree ");
        h.update(dir.as_bytes());
        to_hex(&h.finalize())
    }

    pub fn used_storage(&self) -> u64 {
        self.files.values().map(|f| f.size).sum()
    }
}

/// Read the marker file of a repo dir: the gated token, if any.
fn read_marker(dir: &Path) -> io::Result<Option<String>> {
    let path = dir.join(MARKER_FILE);
    if !path.exists() {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&path)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))?;
    Ok(v.get("gated_token").and_then(|t| t.as_str()).map(str::to_string))
}

fn is_hidden_dir(name: &str) -> bool {
    name.starts_with('.')
}

fn list_dirs(dir: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if is_hidden_dir(&name) {
            continue;
        }
        out.push((name, e.path()));
    }
    out.sort();
    Ok(out)
}

/// Find every `org/name` repo under `root` (models), `root/datasets/org/name` and `root/spaces/org/name`.
pub fn discover(root: &Path) -> io::Result<Vec<(RepoType, String, PathBuf)>> {
    let mut out = Vec::new();
    for (org, org_dir) in list_dirs(root)? {
        let (kind, base) = match org.as_str() {
            "datasets" => (RepoType::Dataset, Some(org_dir.clone())),
            "spaces" => (RepoType::Space, Some(org_dir.clone())),
            _ => (RepoType::Model, None),
        };
        if let Some(base) = base {
            for (org2, org2_dir) in list_dirs(&base)? {
                for (name, dir) in list_dirs(&org2_dir)? {
                    out.push((kind, format!("{org2}/{name}"), dir));
                }
            }
        } else {
            for (name, dir) in list_dirs(&org_dir)? {
                out.push((kind, format!("{org}/{name}"), dir));
            }
        }
    }
    Ok(out)
}

fn walk(
    dir: &Path,
    prefix: &str,
    files: &mut Vec<(String, PathBuf, u64)>,
    dirs: &mut BTreeSet<String>,
) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        let meta = fs::metadata(e.path())?;
        if meta.is_dir() {
            if name == ".git" || name == ".cache" {
                continue;
            }
            dirs.insert(rel.clone());
            walk(&e.path(), &rel, files, dirs)?;
        } else if meta.is_file() {
            if prefix.is_empty() && name == MARKER_FILE {
                continue;
            }
            files.push((rel, e.path(), meta.len()));
        }
    }
    Ok(())
}

fn is_lfs(path: &str, size: u64) -> bool {
    if size > LFS_THRESHOLD {
        return true;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    match name.rsplit_once('.') {
        Some((_, ext)) => LFS_EXTENSIONS.contains(&ext),
        None => false,
    }
}

fn hash_file(rel: &str, abs: &Path, size: u64) -> io::Result<RepoFile> {
    if is_lfs(rel, size) {
        let (sha256, real) = sha256_file(abs)?;
        let pointer = lfs_pointer(&sha256, real);
        Ok(RepoFile {
            path: rel.to_string(),
            abs: abs.to_path_buf(),
            size: real,
            blob_oid: git_blob_oid(pointer.as_bytes()),
            lfs: Some(LfsInfo {
                sha256,
                pointer_size: pointer.len() as u64,
            }),
        })
    } else {
        let data = fs::read(abs)?;
        Ok(RepoFile {
            path: rel.to_string(),
            abs: abs.to_path_buf(),
            size: data.len() as u64,
            blob_oid: git_blob_oid(&data),
            lfs: None,
        })
    }
}

/// Scan and hash every repo under `root`. `gated` overrides/extends marker-file gating.
pub fn load(root: &Path, gated: &HashMap<String, String>) -> io::Result<Vec<Repo>> {
    struct Pending {
        kind: RepoType,
        id: String,
        gated_token: Option<String>,
        files: Vec<(String, PathBuf, u64)>,
        dirs: BTreeSet<String>,
    }
    let mut pending = Vec::new();
    for (kind, id, dir) in discover(root)? {
        let mut files = Vec::new();
        let mut dirs = BTreeSet::new();
        walk(&dir, "", &mut files, &mut dirs)?;
        let gated_token = match gated.get(&id) {
            Some(t) => Some(t.clone()),
            None => read_marker(&dir)?,
        };
        pending.push(Pending {
            kind,
            id,
            gated_token,
            files,
            dirs,
        });
    }

    // Hash all files of all repos in parallel, biggest first.
    let mut jobs: Vec<(usize, usize)> = Vec::new();
    for (r, p) in pending.iter().enumerate() {
        for f in 0..p.files.len() {
            jobs.push((r, f));
        }
    }
    jobs.sort_by_key(|&(r, f)| std::cmp::Reverse(pending[r].files[f].2));
    let results: Mutex<HashMap<(usize, usize), io::Result<RepoFile>>> = Mutex::new(HashMap::new());
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 8);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(r, f)) = jobs.get(i) else { break };
                let (rel, abs, size) = &pending[r].files[f];
                let res = hash_file(rel, abs, *size);
                results
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert((r, f), res);
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());

    let mut repos = Vec::with_capacity(pending.len());
    for (r, p) in pending.into_iter().enumerate() {
        let mut files = BTreeMap::new();
        for f in 0..p.files.len() {
            let file = results
                .remove(&(r, f))
                .ok_or_else(|| io::Error::other("hash result missing"))??;
            files.insert(file.path.clone(), file);
        }
        let mut h = Sha1::new();
        h.update(p.kind.plural().as_bytes());
        h.update(p.id.as_bytes());
        for f in files.values() {
            h.update(format!("\n{} {} {}", f.path, f.size, f.blob_oid).as_bytes());
        }
        let commit = to_hex(&h.finalize());
        repos.push(Repo {
            id: p.id,
            kind: p.kind,
            commit,
            gated_token: p.gated_token,
            files,
            dirs: p.dirs,
        });
    }
    Ok(repos)
}
