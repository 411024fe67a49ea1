//! Where a run was made: this host, for the run's metadata.

use crate::Environment;
use std::path::Path;

/// The environment of this host, for the run record.
pub fn host_environment(manifest: &Path, argv: Vec<String>) -> Environment {
    Environment {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        orch_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: git_commit(manifest),
        argv,
    }
}

fn git_commit(manifest: &Path) -> Option<String> {
    let dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}
