//! Containers, GPUs and image roots for tests, on a machine with neither a container runtime
//! nor a GPU: what the fake Kubernetes kubelet (`orch-fake-kube`) and the fake Modal sandboxes
//! (`orch-fake-modal`) run their containers with, and what the docker and GPU-image tests run
//! the agent in.
//!
//! - [`container`]: a process started as runc starts one: a mount namespace of its own,
//!   `proc`, `/dev`, `sysfs` and `/tmp` mounted, the spec's bind mounts, `chroot` into the
//!   image's root, an overlay layer of its own; GPUs injected as the NVIDIA container toolkit
//!   injects them. Needs root.
//! - [`gpu`]: the driver's NVML as a stub `libnvidia-ml.so.1` (compiled from `nvml_stub.c`,
//!   8 H100s), and a fake `nvidia` runtime registered with the local Docker engine.
//! - [`rootfs`]: real Debian roots (debootstrap) and a glibc-less busybox root, as folders and
//!   as local Docker images.
//!
//! Not shared: a container gets no PID, network, user or cgroup namespace (it sees this host's
//! processes and loopback; memory limits are the fakes' own, by summed RSS); the crate knows
//! nothing of any platform's API and runs no server. Its own `hashing` is the one sha256 it
//! needs for cache keys (the Hub's hash helpers are `orch-fake-hub`'s).

pub mod container;
pub mod gpu;
pub mod rootfs;

/// `crate::skip` for the modules above: the one skip-or-fail rule.
use orch_test_support::skip;

/// Cache keys of built things (the stub library, roots): sha256 in lowercase hex.
mod hashing {
    use sha2::{Digest as _, Sha256};

    pub fn sha256_hex(data: &[u8]) -> String {
        use std::fmt::Write as _;
        let mut s = String::with_capacity(64);
        for b in Sha256::digest(data) {
            // Writing into a String cannot fail.
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}
