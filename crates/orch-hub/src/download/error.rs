//! Setup errors: [`HubError`] (user errors with a hint, HTTP, verification,
//! IO) and the mapping of hf-hub's errors onto it.

use hf_hub::HFError;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("invalid model `{0}`\nhint: write `org/name` or `org/name@revision`")]
    BadSpec(String),
    #[error(
        "invalid pattern `{pattern}`: {message}\nhint: patterns are globs like `*.safetensors` or `onnx/**`"
    )]
    BadPattern { pattern: String, message: String },
    #[error("`{repo}` is a gated repository and {why}; nothing was downloaded\nhint: accept its terms at {url} with your account, then set `HF_TOKEN` to a token of that account (or run `hf auth login`)")]
    Gated { repo: String, url: String, why: String },
    #[error("repository `{repo}` was not found at {endpoint} (or it is private and the token has no access)\nhint: check the name; for a private repo set `HF_TOKEN`")]
    NotFound { repo: String, endpoint: String },
    #[error(
        "revision `{revision}` not found in `{repo}`\nhint: use a branch, tag or commit of the repository"
    )]
    RevisionNotFound { repo: String, revision: String },
    #[error("`{repo}` has no files matching the include/exclude patterns\nhint: check `include`/`exclude`")]
    NoFiles { repo: String },
    #[error("`{repo}`: {message}")]
    Http { repo: String, message: String },
    #[error("`{repo}`: `{path}` failed verification: {message}; the partial file was removed, run `orch setup` again")]
    Verify {
        repo: String,
        path: String,
        message: String,
    },
    #[error("cannot write `{}`: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

impl HubError {
    /// True when the user must act (name, access, patterns).
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            HubError::BadSpec(_)
                | HubError::BadPattern { .. }
                | HubError::Gated { .. }
                | HubError::NotFound { .. }
                | HubError::RevisionNotFound { .. }
                | HubError::NoFiles { .. }
        )
    }
}

pub(super) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(super) fn map_err(e: HFError, repo: &str, revision: &str, endpoint: &str) -> HubError {
    let url = format!("{endpoint}/{repo}");
    match e {
        HFError::AuthRequired { .. } => HubError::Gated {
            repo: repo.into(),
            url,
            why: if std::env::var_os("HF_TOKEN").is_some() {
                "the token was not accepted".into()
            } else {
                "no token was given".into()
            },
        },
        HFError::Forbidden { .. } => HubError::Gated {
            repo: repo.into(),
            url,
            why: "the token's account has no access to it".into(),
        },
        HFError::RepoNotFound { .. } => HubError::NotFound {
            repo: repo.into(),
            endpoint: endpoint.into(),
        },
        HFError::RevisionNotFound { .. } => HubError::RevisionNotFound {
            repo: repo.into(),
            revision: revision.into(),
        },
        other => {
            let text = other.to_string();
            // Gated responses that came through as plain HTTP errors.
            if text.contains("GatedRepo") || text.contains("restricted") {
                return HubError::Gated {
                    repo: repo.into(),
                    url,
                    why: "access was refused".into(),
                };
            }
            HubError::Http {
                repo: repo.into(),
                message: text,
            }
        }
    }
}

impl orch_protocol::ErrorClass for HubError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}
