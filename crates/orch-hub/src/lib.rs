//! Model weights for orch: set up once into a Hugging Face hub cache layout
//! (so code in a container loads them with `HF_HUB_OFFLINE=1`), checked
//! offline afterwards.
//!
//! The HTTP side goes through `hf-hub` (endpoint from `HF_ENDPOINT`, token
//! from `HF_TOKEN` or the hub's token file, typed errors); the parallel byte
//! ranges, resume, verification and cache layout are ours.
//!
//! ## What is where
//!
//! `download/`: `setup` of one repo through `hf-hub` (endpoint, token,
//! typed errors): listing, access check before any byte, parallel files and byte ranges
//! under one connection limit, resume from `.incomplete.parts`, size/sha256 verification,
//! links; `cache.rs`: the hub cache layout, refs, the `.orch/complete-<commit>.json`
//! marker that makes "complete" an offline check; `safetensors.rs`: parameter/byte counts
//! from headers, GPU fit. It does not: know manifests or backends.

pub mod cache;
pub mod download;
pub mod safetensors;
pub mod token;

pub use cache::{repo_folder_name, CompleteMarker, RepoCache};
pub use download::{setup, HubError, ModelRequest, SetupEvent, SetupOptions, SetupReport};

/// Build the hub client: endpoint from `HF_ENDPOINT`, token from `HF_TOKEN`
/// or the token file. The token is never printed.
pub fn client() -> Result<hf_hub::HFClient, HubError> {
    let mut b = hf_hub::HFClient::builder()
        .cache_enabled(false)
        .retry_max_attempts(3);
    if let Some(t) = token::resolve_token() {
        b = b.token(t.expose());
    }
    b.build().map_err(|e| HubError::Http {
        repo: String::new(),
        message: format!("cannot set up the hub client: {e}"),
    })
}

/// Default weights folder for the local backend: `ORCH_WEIGHTS_DIR`, else
/// `<user cache dir>/orch/weights`.
pub fn default_weights_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("ORCH_WEIGHTS_DIR").filter(|d| !d.is_empty()) {
        return d.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::path::PathBuf::from(".cache"));
    base.join("orch").join("weights")
}
