//! The agent in images like real GPU images, on every container backend.
//!
//! Images: Debian root filesystems of two glibc versions made by debootstrap
//! (bullseye 2.31, trixie 2.41; trixie is where a static glibc loading NVML
//! died of SIGFPE) and a glibc-less one (a static busybox, `FROM scratch`).
//! GPUs: a stub `libnvidia-ml.so.1` (two `NVIDIA H100 80GB HBM3`) that the
//! platform injects the way the NVIDIA toolkit does: Docker's `nvidia` runtime
//! (a runc wrapper editing the OCI spec), the fake kubelet and the fake Modal
//! worker bind-mount it into the image's library folder for GPU containers.
//! The agent is `scripts/build-agent.sh`'s, as shipped.
//!
//! What must hold in every image: a CPU cell succeeds; a GPU cell runs, and
//! where the image has a glibc loader it records the stub's GPUs by model,
//! count and UUID, with telemetry and energy, from the dynamic agent on the
//! image's own glibc; in the glibc-less image it says why NVML was not read.

use crate::support::{container_agent, orch_without_weights, text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use orch_testkit::{gpu, rootfs};

pub(crate) const STUB_UUIDS: [&str; 2] = [
    "GPU-5a6b7c8d-0000-4000-8000-000000000000",
    "GPU-5a6b7c8d-0000-4000-8000-000000000001",
];

/// The agent as shipped (`scripts/build-agent.sh`), or `None` (skip) outside CI.
pub(crate) fn shipped_agent() -> Option<PathBuf> {
    let agent = container_agent();
    let ok = agent.is_file()
        && Command::new(&agent)
            .arg("version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("carries the glibc 2.17 dynamic agent"))
            .unwrap_or(false);
    if ok {
        return Some(agent);
    }
    orch_testkit::skip::skip_or_fail(
        &orch_testkit::skip::current_test(),
        "the shipped agent is missing: run `bash scripts/build-agent.sh` \
         (or `bash scripts/prepare-docker.sh`) first",
    );
    None
}

/// A suite with a GPU cell (two H100s) and a CPU cell in `image`.
pub(crate) fn suite(dir: &Path, image: &str) -> PathBuf {
    let p = dir.join("gpu-images.yaml");
    std::fs::write(
        &p,
        format!(
            r#"name: gpu-images
image: {image}
measure: {{timeout: 2m}}
benchmarks:
  - name: gpu
    gpus: ["H100:2"]
    env: {{ORCH_TELEMETRY_HZ: "20"}}
    workload:
      shell: 'echo ORCH_PHASE measure; i=0; while [ $i -lt 20 ]; do i=$((i+1)); sleep 0.05; done; echo ORCH_METRIC steps=20'
  - name: cpu
    gpus: [none]
    workload:
      shell: 'echo ORCH_METRIC x=1'
"#
        ),
    )
    .unwrap();
    p
}

/// The checks every backend shares: `rec` is `orch run --json`'s record,
/// `glibc` the image's (`None`: no libc).
/// `device_nodes`: the platform passes `/dev/nvidiaN` (Docker's runtime does;
/// the fakes' chroots do not).
pub(crate) fn check_record(rec: &Value, glibc: Option<&str>, device_nodes: bool, what: &str) {
    let cells = rec["cells"].as_array().unwrap();
    let cell = |id: &str| {
        cells
            .iter()
            .find(|c| c["id"].as_str().is_some_and(|i| i.starts_with(id)))
            .unwrap_or_else(|| panic!("{what}: no cell {id} in {rec}"))
    };
    let cpu = cell("cpu.");
    assert_eq!(cpu["status"], "succeeded", "{what}: {cpu}");
    let g = cell("gpu.");
    assert_eq!(g["status"], "succeeded", "{what}: {g}");
    let info = &g["info"];
    let hw = &g["hardware"];
    match glibc {
        Some(v) => {
            // The dynamic agent ran on the image's own glibc and read NVML.
            assert_eq!(info["agent"]["linkage"], "dynamic", "{what}: {info}");
            assert_eq!(info["agent"]["libc"], v, "{what}: {info}");
            assert_eq!(info["gpu_source"], "nvml", "{what}: {info}");
            let gpus = hw["gpus"].as_array().unwrap();
            assert_eq!(gpus.len(), 2, "{what}: {hw}");
            for (gpu, uuid) in gpus.iter().zip(STUB_UUIDS) {
                assert_eq!(gpu["name"], "NVIDIA H100 80GB HBM3", "{what}: {hw}");
                assert_eq!(gpu["uuid"], uuid, "{what}: {hw}");
                assert_eq!(gpu["memory_bytes"], 85_520_809_984u64, "{what}: {hw}");
            }
            assert_eq!(hw["driver_version"], "580.95.05", "{what}: {hw}");
            assert!(hw.get("mismatch").is_none(), "{what}: {hw}");
            let m = &g["metrics"];
            for k in [
                "gpu_energy_j",
                "gpu_power_mean_w",
                "gpu_util_mean_pct",
                "gpu_sm_clock_mean_mhz",
            ] {
                assert!(m[k].as_f64().is_some_and(|v| v > 0.0), "{what}: {k} in {m}");
            }
            assert!(
                info["telemetry"]["samples"].as_u64().unwrap_or(0) >= 3,
                "{what}: {info}"
            );
        }
        None => {
            // No loader: the static agent ran and says why NVML was not read.
            assert_eq!(info["agent"]["linkage"], "static", "{what}: {info}");
            let why = info["agent"]["why_static"].as_str().unwrap_or("");
            assert!(why.contains("no glibc dynamic loader"), "{what}: {info}");
            assert!(
                info["gpu_probe"]
                    .as_str()
                    .unwrap_or("")
                    .contains("NVML not loaded"),
                "{what}: {info}"
            );
            // Never "no GPU" where the container has GPUs: counted from
            // their device nodes, and then no model is claimed either way.
            if device_nodes {
                assert_eq!(info["gpu_source"], "device-nodes", "{what}: {info}");
                assert_eq!(hw["gpus"].as_array().unwrap().len(), 2, "{what}: {hw}");
                assert!(hw.get("mismatch").is_none(), "{what}: {hw}");
            } else {
                assert_eq!(info["gpu_source"], "none", "{what}: {info}");
                assert!(
                    g["flags"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|f| f == "hardware_mismatch"),
                    "{what}: {g}"
                );
            }
        }
    }
}

/// `orch run --backend docker --json` of [`suite`] in `image`, with `agent` as
/// the container agent; the store in `dir`.
fn run_docker(agent: &Path, env: &[(&str, &str)], dir: &Path, image: &str) -> Output {
    let mut c = orch_without_weights();
    c.env("ORCH_AGENT_STATIC", agent);
    for (k, v) in env {
        c.env(k, v);
    }
    c.args(["run", "--backend", "docker", "--json", "-f"])
        .arg(suite(dir, image))
        .arg("--store")
        .arg(dir.join("s"))
        .output()
        .unwrap()
}

/// The images as root folders, for the fakes: (`REGISTRY/debian:bullseye`,
/// root, glibc), trixie, and `REGISTRY/static:busybox` (no glibc).
pub(crate) fn image_roots(registry: &str) -> Vec<(String, PathBuf, Option<String>)> {
    let mut images = Vec::new();
    for release in ["bullseye", "trixie"] {
        let root = rootfs::debian_root(release).expect("debootstrap");
        let glibc = rootfs::glibc_version(&root);
        assert!(glibc.is_some(), "{release}: no glibc version");
        images.push((format!("{registry}/debian:{release}"), root, glibc));
    }
    images.push((
        format!("{registry}/static:busybox"),
        rootfs::static_root().expect("static root"),
        None,
    ));
    images
}

fn docker_ready() -> Option<PathBuf> {
    if !rootfs::require_tooling(rootfs::docker_available())
        || !rootfs::require_tooling(rootfs::debootstrap_available())
    {
        return None;
    }
    shipped_agent()
}

#[test]
fn docker_gpu_and_cpu_cells_in_real_images() {
    let Some(agent) = docker_ready() else { return };
    gpu::ensure_fake_nvidia_runtime().expect("the fake nvidia runtime");
    let mut images: Vec<(String, Option<String>)> = Vec::new();
    for release in ["bullseye", "trixie"] {
        let root = rootfs::debian_root(release).expect("debootstrap");
        let glibc = rootfs::glibc_version(&root);
        assert!(glibc.is_some(), "{release}: no glibc version");
        images.push((rootfs::debian_image(release).expect("docker import"), glibc));
    }
    images.push((rootfs::static_image().expect("static image"), None));
    for (image, glibc) in images {
        let tmp = tempfile::tempdir().unwrap();
        let out = run_docker(&agent, &[], tmp.path(), &image);
        assert_eq!(out.status.code(), Some(0), "{image}: {}", text(&out));
        let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
        check_record(&rec, glibc.as_deref(), true, &image);
    }
}

/// The issue's reproduction: a static glibc agent that loads the image's
/// `libnvidia-ml.so.1` dies (SIGFPE on Ubuntu 24.04 and Debian trixie): the
/// host names the signal and keeps the agent's stderr, the diagnosis names
/// the kind. The crash is made here by an "agent" that divides by zero.
#[test]
fn docker_agent_crash_is_named() {
    let Some(_agent) = docker_ready() else { return };
    gpu::ensure_fake_nvidia_runtime().expect("the fake nvidia runtime");
    let tmp = tempfile::tempdir().unwrap();
    // An "agent" that writes to stderr and dies of a real SIGFPE (an integer
    // division by zero: a fault, delivered even to PID 1; not `1 / z`, which
    // gcc computes without a division), static so that the glibc-less image
    // runs it.
    let src = tmp.path().join("crasher.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\nint main(void) { volatile int z = 0; fprintf(stderr, \"orch-agent: loading libnvidia-ml.so.1\\n\"); fflush(stderr); return 7 / z; }\n",
    )
    .unwrap();
    let crasher = tmp.path().join("crasher");
    let cc = Command::new("cc")
        .args(["-static", "-O0", "-o"])
        .arg(&crasher)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(cc.status.success(), "{}", text(&cc));
    let image = rootfs::static_image().expect("static image");
    let out = run_docker(&crasher, &[], tmp.path(), &image);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap();
    for c in rec["cells"].as_array().unwrap() {
        assert_eq!(c["status"], "failed", "{c}");
        let f = &c["failure"];
        assert_eq!(f["kind"], "agent_crashed", "{c}");
        assert_eq!(f["signal"], 8, "{c}");
        let msg = f["message"].as_str().unwrap();
        assert!(msg.contains("SIGFPE"), "{msg}");
        assert!(msg.contains("loading libnvidia-ml.so.1"), "{msg}");
        assert_eq!(c["diagnosis"]["kind"], "agent_crashed", "{c}");
        assert!(c["diagnosis"]["hint"].as_str().unwrap().contains("report"), "{c}");
    }
}

/// The issue's reproduction, on an engine without the NVIDIA toolkit (`--gpus`
/// has no driver): the stub baked into the image's library folder, as a
/// user's image might carry a driver library. The GPU cell runs without GPU
/// devices, says so, and the dynamic agent still reads what NVML reports.
#[test]
fn docker_without_gpu_runtime_runs_the_cell_and_says_so() {
    let Some(agent) = docker_ready() else { return };
    let stub = gpu::nvml_stub().expect("stub");
    let tmp = tempfile::tempdir().unwrap();
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy(&stub, ctx.join("libnvidia-ml.so.1")).unwrap();
    let base = rootfs::debian_image("trixie").expect("docker import");
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM {base}\nCOPY libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1\n"),
    )
    .unwrap();
    let tag = "orch-testkit/debian-stub:trixie";
    let built = Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(&ctx)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built));
    let out = run_docker(&agent, &[("ORCH_DOCKER_GPUS", "request")], tmp.path(), tag);
    let rec: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    let g = rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"].as_str().is_some_and(|i| i.starts_with("gpu.")))
        .unwrap();
    let notes = g["info"]["container_notes"].as_str().unwrap_or("");
    if notes.is_empty() {
        // An engine with the real toolkit's `--gpus` driver attached GPUs.
        eprintln!("note: this engine attaches GPUs with --gpus; nothing to check");
        return;
    }
    assert!(notes.contains("cannot attach GPUs"), "{g}");
    assert!(text(&out).contains("cannot attach GPUs"), "{}", text(&out));
    let glibc = rootfs::glibc_version(&rootfs::debian_root("trixie").unwrap());
    check_record(&rec, glibc.as_deref(), false, tag);
}
