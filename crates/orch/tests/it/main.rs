//! orch's integration tests, one binary: each file was its own test binary, and each
//! linked the whole CLI and orch-testkit's servers again (minutes of CI's build).

use std::path::{Path, PathBuf};

/// The repository root (manifests, scripts, containers).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

mod cli;
mod cost;
mod docker;
mod gpu_images;
mod hardware;
mod kubernetes;
mod modal;
mod registry;
mod report;
mod s3;
mod safety;
mod seeds;
mod setup;
mod ship;
mod slurm;
