//! The repository's listing: the commit a revision points to, every file
//! with its size and hash (the tree, else HEAD requests on the file names),
//! include/exclude patterns, what is missing from the cache, and the access
//! check before any byte is downloaded.

use super::error::{map_err, HubError};
use super::options::ModelRequest;
use crate::cache::RepoCache;
use futures::StreamExt;
use hf_hub::repository::{RepoTreeEntry, RepoTypeDataset, RepoTypeModel, RepoTypeSpace};
use hf_hub::{HFError, HFRepository, RepoType};
use std::future::Future;
use std::pin::Pin;

/// A file of the listing.
#[derive(Debug, Clone)]
pub(super) struct RemoteFile {
    pub(super) path: String,
    pub(super) size: u64,
    /// Blob name in the cache: sha256 for LFS files, git oid otherwise.
    pub(super) etag: String,
    pub(super) sha256: Option<String>,
}

/// The commit a revision points to and the file names (`siblings`) of the
/// repository (`info` is per repository kind in hf-hub).
pub(super) trait CommitOf {
    #[allow(clippy::type_complexity)]
    fn commit_of(
        &self,
        revision: String,
    ) -> Pin<Box<dyn Future<Output = Result<(Option<String>, Vec<String>), HFError>> + Send + '_>>;
}

macro_rules! commit_of {
    ($t:ty) => {
        impl CommitOf for HFRepository<$t> {
            fn commit_of(
                &self,
                revision: String,
            ) -> Pin<Box<dyn Future<Output = Result<(Option<String>, Vec<String>), HFError>> + Send + '_>>
            {
                Box::pin(async move {
                    let info = self.info().revision(revision).send().await?;
                    let names = info
                        .siblings
                        .unwrap_or_default()
                        .into_iter()
                        .map(|s| s.rfilename)
                        .collect();
                    Ok((info.sha, names))
                })
            }
        }
    };
}
commit_of!(RepoTypeModel);
commit_of!(RepoTypeDataset);
commit_of!(RepoTypeSpace);

pub(super) fn client_endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

/// Resolve the revision to a commit and list every file.
pub(super) async fn list<T: RepoType>(
    repo: &HFRepository<T>,
    req: &ModelRequest,
    endpoint: &str,
) -> Result<(String, Vec<RemoteFile>), HubError>
where
    HFRepository<T>: CommitOf,
{
    let (sha, siblings) = repo
        .commit_of(req.revision.clone())
        .await
        .map_err(|e| map_err(e, &req.repo, &req.revision, endpoint))?;
    let commit = sha.ok_or_else(|| HubError::Http {
        repo: req.repo.clone(),
        message: "the server did not say which commit the revision is".into(),
    })?;
    let tree: Result<Vec<RemoteFile>, HFError> = async {
        let stream = repo.list_tree().revision(commit.clone()).recursive(true).send()?;
        let entries: Vec<_> = stream.collect().await;
        let mut files = Vec::new();
        for e in entries {
            if let RepoTreeEntry::File {
                oid, size, path, lfs, ..
            } = e?
            {
                let sha256 = lfs.and_then(|l| l.sha256);
                files.push(RemoteFile {
                    etag: sha256.clone().unwrap_or(oid),
                    path,
                    size,
                    sha256,
                });
            }
        }
        Ok(files)
    }
    .await;
    let files = match tree {
        Ok(files) => files,
        // Access problems are the answer; anything else (a server without
        // the tree API) falls back to HEAD requests on the sibling list.
        Err(
            e @ (HFError::AuthRequired { .. } | HFError::Forbidden { .. } | HFError::RepoNotFound { .. }),
        ) => return Err(map_err(e, &req.repo, &req.revision, endpoint)),
        Err(_) if !siblings.is_empty() => {
            let mut files = Vec::with_capacity(siblings.len());
            for name in siblings {
                let meta = repo
                    .get_file_metadata()
                    .filepath(name.clone())
                    .revision(&commit)
                    .send()
                    .await
                    .map_err(|e| map_err(e, &req.repo, &req.revision, endpoint))?;
                let sha256 = (meta.etag.len() == 64 && meta.etag.chars().all(|c| c.is_ascii_hexdigit()))
                    .then(|| meta.etag.to_ascii_lowercase());
                files.push(RemoteFile {
                    path: name,
                    size: meta.file_size,
                    etag: meta.etag,
                    sha256,
                });
            }
            files
        }
        Err(e) => return Err(map_err(e, &req.repo, &req.revision, endpoint)),
    };
    Ok((commit, files))
}

pub(super) fn filter(
    files: Vec<RemoteFile>,
    include: &[String],
    exclude: &[String],
) -> Result<Vec<RemoteFile>, HubError> {
    let build = |pats: &[String]| -> Result<Option<globset::GlobSet>, HubError> {
        if pats.is_empty() {
            return Ok(None);
        }
        let mut b = globset::GlobSetBuilder::new();
        for p in pats {
            b.add(globset::Glob::new(p).map_err(|e| HubError::BadPattern {
                pattern: p.clone(),
                message: e.to_string(),
            })?);
        }
        b.build().map(Some).map_err(|e| HubError::BadPattern {
            pattern: pats.join(", "),
            message: e.to_string(),
        })
    };
    let inc = build(include)?;
    let exc = build(exclude)?;
    Ok(files
        .into_iter()
        .filter(|f| inc.as_ref().map(|g| g.is_match(&f.path)).unwrap_or(true))
        .filter(|f| !exc.as_ref().map(|g| g.is_match(&f.path)).unwrap_or(false))
        .collect())
}

/// The files whose blob is not in the cache with its size (to download),
/// and those whose blob is (to link).
pub(super) fn missing(cache: &RepoCache, files: &[RemoteFile]) -> (Vec<RemoteFile>, Vec<RemoteFile>) {
    let mut todo = Vec::new();
    let mut present = Vec::new();
    for f in files {
        let blob_ok = std::fs::metadata(cache.blob(&f.etag))
            .map(|m| m.len() == f.size)
            .unwrap_or(false);
        if blob_ok {
            present.push(f.clone());
        } else {
            todo.push(f.clone());
        }
    }
    (todo, present)
}

/// Access before any byte: HEAD the smallest missing file.
pub(super) async fn check_access<T: RepoType>(
    repo: &HFRepository<T>,
    req: &ModelRequest,
    commit: &str,
    endpoint: &str,
    todo: &[RemoteFile],
) -> Result<(), HubError> {
    if let Some(probe) = todo.iter().min_by_key(|f| f.size) {
        if let Err(e) = repo
            .get_file_metadata()
            .filepath(probe.path.clone())
            .revision(commit)
            .send()
            .await
        {
            return Err(map_err(e, &req.repo, &req.revision, endpoint));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_filter_files() {
        let f = |p: &str| RemoteFile {
            path: p.into(),
            size: 1,
            etag: "e".into(),
            sha256: None,
        };
        let files = vec![f("a.safetensors"), f("onnx/m.onnx"), f("config.json")];
        let kept = filter(files.clone(), &["*.safetensors".into(), "*.json".into()], &[]).unwrap();
        assert_eq!(kept.len(), 2);
        let kept = filter(files, &[], &["onnx/**".into()]).unwrap();
        assert_eq!(
            kept.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            vec!["a.safetensors", "config.json"]
        );
        assert!(filter(vec![], &["[".into()], &[]).is_err());
    }
}
