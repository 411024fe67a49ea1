//! Test support for `orch`: generated, realistic model repositories ([`fixtures`]) and a real local
//! Hugging Face Hub-compatible HTTP server that serves them ([`hub`]).
//!
//! ```no_run
//! use orch_testkit::{fixtures, hub::HubServer};
//! let root = tempfile_like_dir();
//! # fn tempfile_like_dir() -> std::path::PathBuf { std::env::temp_dir().join("hub-root") }
//! let model = fixtures::write_test_model(&root, "acme/tiny-llama", &fixtures::ModelOptions::tiny()).unwrap();
//! let server = HubServer::builder(&root).gated("acme/tiny-llama", "hf_valid").start().unwrap();
//! std::env::set_var("HF_ENDPOINT", server.endpoint());
//! # let _ = model;
//! ```

pub mod container;
pub mod faultproxy;
pub mod fixtures;
pub mod gpu;
pub mod hashing;
pub mod hub;
pub mod kube;
pub mod modal;
pub mod rootfs;
pub mod s3;
/// The skip-or-fail rule (`orch-test-support`), under its old path.
pub use orch_test_support::skip;
pub mod slurm;
pub mod suites;

/// Name of the per-repo marker file (inside `root/org/name/`) that the server reads and never serves.
///
/// JSON object; recognised keys: `"gated_token"` (string: the repo is gated and only this bearer
/// token may read it) and `"generator"` (free-form, written by [`fixtures`] to describe how the
/// repo was generated).
pub const MARKER_FILE: &str = ".fakehub.json";
