//! orch's integration tests, one binary: each file was its own test binary, and each
//! linked the whole CLI and orch-testkit's servers again (minutes of CI's build).

use std::path::{Path, PathBuf};

/// The repository root (manifests, scripts, containers).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The agent containers get, as `scripts/build-agent.sh` (run by
/// `scripts/prepare-docker.sh`) ships it.
fn container_agent() -> PathBuf {
    repo().join(format!(
        "target/{}-unknown-linux-gnu/release/orch-agent",
        std::env::consts::ARCH
    ))
}

/// Whether tests of the fakes' containers can run here: root (chroot and
/// mounts), the shipped agent and the quickstart image's busybox. Outside CI
/// a missing one skips the test with a note; under CI it fails
/// (`orch_testkit::skip`).
fn containers_ready(what: &str) -> bool {
    if !orch_testkit::container::available_or_skip(what) {
        return false;
    }
    let agent = container_agent();
    let busybox = repo().join("containers/quickstart/busybox");
    if orch_testkit::container::is_static_elf(&agent) && busybox.is_file() {
        return true;
    }
    orch_testkit::skip::skip_or_fail(
        what,
        &format!(
            "the static agent `{}` or `{}` is missing: run `bash scripts/prepare-docker.sh` first",
            agent.display(),
            busybox.display()
        ),
    )
}

mod bisect;
mod cli;
mod compare_check;
mod cost;
mod docker;
mod faults;
mod files;
mod gpu_images;
mod hardware;
mod history;
mod install;
mod kubernetes;
mod modal;
mod registry;
mod report;
mod s3;
mod s3faults;
mod safety;
mod seeds;
mod setup;
mod ship;
mod slurm;
