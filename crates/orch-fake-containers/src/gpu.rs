//! Fake GPUs for a machine without one: a stub NVML library and a fake NVIDIA container runtime.
//!
//! `orch-agent` reads GPUs through NVML (`libnvidia-ml.so.1`, loaded with `dlopen` by the
//! nvml-wrapper crate). On a GPU host that library comes from the driver, and the NVIDIA
//! container toolkit bind-mounts it into a container together with the GPUs the container was
//! given (`NVIDIA_VISIBLE_DEVICES`). This module reproduces both halves without a GPU:
//!
//! * [`nvml_stub`] compiles `nvml_stub.c` (embedded in this crate) into a real
//!   `libnvidia-ml.so.1`: a host with a pool of 8 `NVIDIA H100 80GB HBM3`
//!   (85520809984 bytes, UUIDs `GPU-5a6b7c8d-0000-4000-8000-00000000000N`, PCI bus ids
//!   `00000000:1N:00.0`, compute capability 9.0, 700 W limit, ~300 W drawn, an energy counter
//!   that grows with wall time, driver 580.95.05, CUDA 13.0). Which GPUs a process sees is read
//!   from `NVIDIA_VISIBLE_DEVICES` at `nvmlInit`, as the container toolkit would decide it:
//!   unset or `all` → the first `ORCH_NVML_STUB_GPUS` (default 2); `none`, `void` or empty → none
//!   (init still succeeds); otherwise a comma list of pool indices and/or UUIDs (or a UUID
//!   prefix naming one GPU), in that order. `ORCH_NVML_STUB_FAIL=init` makes `nvmlInit*` fail
//!   with `NVML_ERROR_DRIVER_NOT_LOADED` (9). The file is linked against libc only and needs no
//!   glibc symbol version above 2.17, so it loads in Debian bullseye (glibc 2.31) and older
//!   images as well as new ones; the full contract is at the top of `nvml_stub.c`.
//! * [`ensure_fake_nvidia_runtime`] registers a runtime named `nvidia` with the local Docker
//!   engine, as `nvidia-ctk runtime configure --runtime=docker` does on a GPU host. Like the
//!   real `nvidia-container-runtime`, it is a thin wrapper around runc that edits the OCI
//!   bundle's `config.json` on `create`: when the container's environment asks for GPUs it
//!   bind-mounts the stub read-only at the image's library folder, so
//!   `docker run --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=0,1 IMAGE` sees two H100s through
//!   NVML, and the device nodes `/dev/nvidiaN` (major 195) and `/dev/nvidiactl`, which exist
//!   but lead nowhere: NVML is the only part of the driver that answers.
//!
//! Built files are cached in [`cache_dir`]: `$ORCH_TESTKIT_CACHE`, else the workspace's
//! `target/orch-testkit-cache/`, else `~/.cache/orch-testkit`.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The C source of the stub NVML library.
pub const NVML_STUB_SOURCE: &str = include_str!("nvml_stub.c");

/// The file name (and soname) of the library NVML users load.
pub const NVML_LIB_NAME: &str = "libnvidia-ml.so.1";

/// The newest glibc symbol version the stub may need (Debian bullseye has 2.31; 2.17 is CentOS 7's).
pub const MAX_GLIBC: (u32, u32) = (2, 17);

/// Where [`ensure_fake_nvidia_runtime`] keeps its wrapper and the copy of the stub it mounts.
pub const RUNTIME_DIR: &str = "/var/lib/orch-testkit";

/// The fake runtime's wrapper script (registered as runtime `nvidia`).
pub const RUNTIME_PATH: &str = "/var/lib/orch-testkit/nvidia-container-runtime";

/// The copy of the stub that the fake runtime bind-mounts into containers.
pub const RUNTIME_STUB_PATH: &str = "/var/lib/orch-testkit/libnvidia-ml.so.1";

const DAEMON_JSON: &str = "/etc/docker/daemon.json";

const CC_FLAGS: &[&str] = &[
    "-shared",
    "-fPIC",
    "-O2",
    "-fvisibility=hidden",
    "-U_FORTIFY_SOURCE",
    "-Wall",
    "-Wl,-soname,libnvidia-ml.so.1",
];

/// The folder orch-testkit caches built things in (created if missing): `$ORCH_TESTKIT_CACHE`,
/// else `target/orch-testkit-cache/` of the workspace this crate was built in (or
/// `$CARGO_TARGET_DIR/orch-testkit-cache/`), else `~/.cache/orch-testkit`.
pub fn cache_dir() -> io::Result<PathBuf> {
    let dir = if let Some(d) = std::env::var_os("ORCH_TESTKIT_CACHE").filter(|d| !d.is_empty()) {
        PathBuf::from(d)
    } else if let Some(t) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        PathBuf::from(t).join("orch-testkit-cache")
    } else if let Some(ws) = workspace_root() {
        ws.join("target").join("orch-testkit-cache")
    } else if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        PathBuf::from(home).join(".cache").join("orch-testkit")
    } else {
        std::env::temp_dir().join("orch-testkit-cache")
    };
    fs::create_dir_all(&dir)
        .map_err(|e| io::Error::new(e.kind(), format!("cache folder {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The workspace this crate was compiled in, if it still exists: the nearest ancestor of
/// `CARGO_MANIFEST_DIR` whose `Cargo.toml` has a `[workspace]` table.
fn workspace_root() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| {
            fs::read_to_string(d.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
}

/// An exclusive `flock` on a file, held until dropped: serializes builds between test processes.
pub(crate) struct FileLock {
    _file: File,
}

impl FileLock {
    pub(crate) fn acquire(path: &Path) -> io::Result<FileLock> {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: flock on a file descriptor this File owns for the call's duration.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock { _file: file });
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(io::Error::new(
                    err.kind(),
                    format!("lock {}: {err}", path.display()),
                ));
            }
        }
    }
}

/// A name for a temporary sibling that no other process or thread uses.
pub(crate) fn temp_name(base: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        ".{base}.tmp-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Run a command to completion; a failure to start or a non-zero exit is an error naming it,
/// with the tail of its stderr.
pub(crate) fn run_checked(cmd: &mut Command) -> io::Result<Output> {
    let what = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("{what}: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what}: {}: {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 2000)
        )));
    }
    Ok(out)
}

pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    if s.len() > 200 {
        s.truncate(200);
        s.push('…');
    }
    s
}

pub(crate) fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &s[start..])
}

/// Build (once; cached by the source's hash) the stub NVML library and return the path of a
/// file named exactly `libnvidia-ml.so.1`.
///
/// It is compiled with `cc -shared -fPIC -O2` (soname `libnvidia-ml.so.1`, libc only) into
/// `cache_dir()/nvml-stub/<hash>/`, built in a temporary folder and renamed into place, so
/// parallel test processes never see a half-written file. After building, `objdump -T` must show
/// no `GLIBC_` symbol version above [`MAX_GLIBC`] (an error names the symbol otherwise), so the
/// library loads in bullseye and older images. See the module docs for what it models and the
/// environment variables it reads (`NVIDIA_VISIBLE_DEVICES`, `ORCH_NVML_STUB_GPUS`,
/// `ORCH_NVML_STUB_FAIL`).
pub fn nvml_stub() -> io::Result<PathBuf> {
    let mut key = NVML_STUB_SOURCE.as_bytes().to_vec();
    key.extend(CC_FLAGS.join(" ").as_bytes());
    let hash = crate::hashing::sha256_hex(&key);
    let parent = cache_dir()?.join("nvml-stub");
    let dir = parent.join(&hash[..16]);
    let lib = dir.join(NVML_LIB_NAME);
    if lib.is_file() {
        return Ok(lib);
    }
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(temp_name(&hash[..16]));
    let built = build_stub_into(&tmp);
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &dir) {
        Ok(()) => {}
        // Another process renamed its build into place first: same source, same result.
        Err(_) if lib.is_file() => {
            let _ = fs::remove_dir_all(&tmp);
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            return Err(io::Error::new(
                e.kind(),
                format!("rename into {}: {e}", dir.display()),
            ));
        }
    }
    Ok(lib)
}

fn build_stub_into(tmp: &Path) -> io::Result<()> {
    fs::create_dir_all(tmp)?;
    let src = tmp.join("nvml_stub.c");
    fs::write(&src, NVML_STUB_SOURCE)?;
    let out = tmp.join(NVML_LIB_NAME);
    let mut cc = Command::new("cc");
    cc.args(CC_FLAGS).arg("-o").arg(&out).arg(&src);
    run_checked(&mut cc).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            io::Error::new(
                e.kind(),
                format!("building the NVML stub needs a C compiler (gcc): {e}"),
            )
        } else {
            io::Error::new(e.kind(), format!("building the NVML stub: {e}"))
        }
    })?;
    check_glibc_versions(&out, MAX_GLIBC)?;
    check_needed(&out)?;
    Ok(())
}

/// `objdump -T`: every `GLIBC_x.y[.z]` a dynamic symbol needs must be at most `max`.
pub fn check_glibc_versions(lib: &Path, max: (u32, u32)) -> io::Result<()> {
    let out = run_checked(Command::new("objdump").arg("-T").arg(lib))?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let Some(at) = line.find("GLIBC_") else { continue };
        let ver: String = line[at + 6..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = ver.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let v = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        if v > max {
            let symbol = line.split_whitespace().last().unwrap_or("?");
            return Err(io::Error::other(format!(
                "{} needs {symbol} from GLIBC_{ver}, newer than GLIBC_{}.{}: it would not load in older images",
                lib.display(),
                max.0,
                max.1
            )));
        }
    }
    Ok(())
}

/// `objdump -p`: the stub may need libc only.
fn check_needed(lib: &Path) -> io::Result<()> {
    let out = run_checked(Command::new("objdump").arg("-p").arg(lib))?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("NEEDED") {
            let needed = words.next().unwrap_or("");
            if needed != "libc.so.6" {
                return Err(io::Error::other(format!(
                    "{} needs {needed}, not only libc.so.6",
                    lib.display()
                )));
            }
        }
    }
    Ok(())
}

/// The wrapper registered as runtime `nvidia`: a `sh` script around `runc` that, on `create`,
/// lets python3 add the stub's bind mount to the bundle's `config.json`.
fn runtime_script(python: &str, runc: &str) -> String {
    format!(
        r#"#!/bin/sh
# orch-testkit fake nvidia-container-runtime (written by orch_testkit::gpu::ensure_fake_nvidia_runtime).
# Like NVIDIA's, a thin wrapper around runc: on `create`, when the container's environment has
# NVIDIA_VISIBLE_DEVICES (not "", "none" or "void"), the bundle's config.json gets a read-only bind
# mount of the stub NVML library at the image's library folder and the GPUs' device nodes; then
# the real runc runs.
PY='
import json, os, sys
STUB = "{stub}"
args = sys.argv[1:]
with_value = {{"--root", "--log", "--log-format", "--criu", "--rootless"}}
i, sub = 0, None
while i < len(args):
    a = args[i]
    if a in with_value:
        i += 2
        continue
    if a.startswith("-"):
        i += 1
        continue
    sub = a
    break
if sub != "create":
    sys.exit(0)
rest = args[i + 1:]
bundle = None
for j, a in enumerate(rest):
    if a in ("--bundle", "-b") and j + 1 < len(rest):
        bundle = rest[j + 1]
    elif a.startswith("--bundle=") or a.startswith("-b="):
        bundle = a.split("=", 1)[1]
bundle = bundle or os.getcwd()
path = os.path.join(bundle, "config.json")
with open(path) as f:
    cfg = json.load(f)
visible = None
for e in (cfg.get("process") or {{}}).get("env") or []:
    if e.startswith("NVIDIA_VISIBLE_DEVICES="):
        visible = e.split("=", 1)[1]
if visible is None or visible.strip() in ("", "none", "void"):
    sys.exit(0)
root = (cfg.get("root") or {{}}).get("path") or "rootfs"
if not os.path.isabs(root):
    root = os.path.join(bundle, root)
if os.path.isdir(os.path.join(root, "usr/lib/x86_64-linux-gnu")):
    target = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
else:
    target = "/usr/lib64/libnvidia-ml.so.1"
mounts = [m for m in cfg.get("mounts") or [] if m.get("destination") != target]
mounts.append({{"destination": target, "type": "bind", "source": STUB, "options": ["rbind", "ro", "nosuid", "nodev"]}})
cfg["mounts"] = mounts
# The device nodes of the GPUs, as the toolkit passes them (major 195; minor = the number of the GPU;
# nvidiactl is 255). They exist in the container; nothing behind them answers.
if visible.strip() == "all":
    minors = list(range(int(os.environ.get("ORCH_NVML_STUB_GPUS", "2"))))
else:
    minors = [int(v) for v in visible.split(",") if v.strip().isdigit()] or [0]
linux = cfg.setdefault("linux", {{}})
devs = [d for d in linux.get("devices") or [] if not d.get("path", "").startswith("/dev/nvidia")]
for node, minor in [("/dev/nvidia%d" % m, m) for m in minors] + [("/dev/nvidiactl", 255)]:
    devs.append({{"path": node, "type": "c", "major": 195, "minor": minor, "fileMode": 438, "uid": 0, "gid": 0}})
linux["devices"] = devs
res = linux.setdefault("resources", {{}})
res["devices"] = (res.get("devices") or []) + [{{"allow": True, "type": "c", "major": 195, "access": "rwm"}}]
# dockerd adds this prestart hook for --gpus when it finds the real toolkit; its work is done here.
hooks = cfg.get("hooks") or {{}}
if hooks.get("prestart"):
    hooks["prestart"] = [h for h in hooks["prestart"] if os.path.basename(h.get("path", "")) != "nvidia-container-runtime-hook"]
tmp = path + ".orch-testkit.tmp"
with open(tmp, "w") as f:
    json.dump(cfg, f)
os.rename(tmp, path)
'
{python} -c "$PY" "$@" </dev/null || exit $?
exec {runc} "$@"
"#,
        stub = RUNTIME_STUB_PATH,
        python = python,
        runc = runc,
    )
}

fn first_existing(candidates: &[&'static str], what: &str) -> io::Result<&'static str> {
    candidates
        .iter()
        .copied()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{what} not found at {}", candidates.join(" or ")),
            )
        })
}

/// Write `content` to `path` through a temporary sibling and a rename, with mode `mode`.
pub(crate) fn write_atomic(path: &Path, content: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .unwrap_or(OsStr::new("file"))
        .to_string_lossy()
        .into_owned();
    let tmp = dir.join(temp_name(&name));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(content)?;
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map_err(|e| io::Error::new(e.kind(), format!("write {}: {e}", path.display())))
}

/// Register the fake NVIDIA container runtime with the local Docker engine as runtime `nvidia`
/// (what `nvidia-ctk runtime configure --runtime=docker` does on a GPU host), so that
/// `docker run --runtime nvidia -e NVIDIA_VISIBLE_DEVICES=0 IMAGE` gets the stub NVML library
/// (see [`nvml_stub`]) bind-mounted read-only at `/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1`
/// (Debian/Ubuntu-style images: the folder exists in the image) or else at
/// `/usr/lib64/libnvidia-ml.so.1`. Without `NVIDIA_VISIBLE_DEVICES` (or with `""`, `none`,
/// `void`) nothing is added, as with the real toolkit.
///
/// Writes [`RUNTIME_PATH`] (a `sh` script that uses `/usr/bin/python3` for the JSON edit and
/// `exec`s the real runc) and [`RUNTIME_STUB_PATH`], adds
/// `"runtimes": {"nvidia": {"path": RUNTIME_PATH}}` to `/etc/docker/daemon.json` keeping every
/// other key, sends the daemon `SIGHUP` (runtimes are reloaded live) and waits until
/// `docker info` lists `nvidia`. Idempotent and serialized between processes with a `flock`.
/// When an `nvidia` runtime that is not this one is already configured (a real GPU host), it
/// is left alone and this returns `Ok`. Needs root and a running Docker engine.
///
/// Not modelled: CUDA libraries, the driver procfs, `--gpus` (Docker registers its
/// `--gpus` driver only when `nvidia-container-runtime-hook` is on the daemon's `PATH` when the
/// daemon starts).
pub fn ensure_fake_nvidia_runtime() -> io::Result<()> {
    let stub = nvml_stub()?;
    fs::create_dir_all(RUNTIME_DIR)?;
    let _lock = FileLock::acquire(&Path::new(RUNTIME_DIR).join(".runtime.lock"))?;

    let python = first_existing(&["/usr/bin/python3", "/usr/local/bin/python3"], "python3")?;
    let runc = first_existing(
        &[
            "/usr/sbin/runc",
            "/usr/bin/runc",
            "/usr/local/sbin/runc",
            "/usr/local/bin/runc",
        ],
        "runc",
    )?;

    let want_stub = fs::read(&stub)?;
    if fs::read(RUNTIME_STUB_PATH).ok().as_deref() != Some(&want_stub[..]) {
        // A rename: containers that have the old file mounted keep it.
        write_atomic(Path::new(RUNTIME_STUB_PATH), &want_stub, 0o755)?;
    }
    let script = runtime_script(python, runc);
    if fs::read_to_string(RUNTIME_PATH).ok().as_deref() != Some(script.as_str()) {
        write_atomic(Path::new(RUNTIME_PATH), script.as_bytes(), 0o755)?;
    }

    let text = match fs::read_to_string(DAEMON_JSON) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io::Error::new(e.kind(), format!("read {DAEMON_JSON}: {e}"))),
    };
    let mut config: serde_json::Value = if text.trim().is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_str(&text).map_err(|e| io::Error::other(format!("{DAEMON_JSON}: {e}")))?
    };
    let Some(obj) = config.as_object_mut() else {
        return Err(io::Error::other(format!("{DAEMON_JSON}: not a JSON object")));
    };
    let runtimes = obj.entry("runtimes").or_insert_with(|| serde_json::json!({}));
    let Some(runtimes) = runtimes.as_object_mut() else {
        return Err(io::Error::other(format!(
            "{DAEMON_JSON}: \"runtimes\" is not an object"
        )));
    };
    match runtimes
        .get("nvidia")
        .and_then(|r| r.get("path"))
        .and_then(|p| p.as_str())
    {
        Some(p) if p == RUNTIME_PATH => {}
        // A real (or someone else's) nvidia runtime: not ours to replace.
        Some(_) => return Ok(()),
        None => {
            runtimes.insert("nvidia".into(), serde_json::json!({ "path": RUNTIME_PATH }));
            let mut out = serde_json::to_string_pretty(&config).map_err(io::Error::other)?;
            out.push('\n');
            fs::create_dir_all("/etc/docker")?;
            let mode = fs::metadata(DAEMON_JSON)
                .map(|m| m.permissions().mode() & 0o7777)
                .unwrap_or(0o644);
            write_atomic(Path::new(DAEMON_JSON), out.as_bytes(), mode)?;
        }
    }
    if docker_runtimes()?.contains("\"nvidia\"") {
        return Ok(());
    }
    reload_dockerd()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runtimes = docker_runtimes()?;
        if runtimes.contains("\"nvidia\"") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "dockerd did not load runtime nvidia from {DAEMON_JSON} after SIGHUP (runtimes: {}); \
                 is it started with another --config-file?",
                runtimes.trim()
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn docker_runtimes() -> io::Result<String> {
    let out = run_checked(Command::new("docker").args(["info", "--format", "{{json .Runtimes}}"]))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `SIGHUP` to dockerd (its pid file, else the process named `dockerd`): reloads `runtimes`.
fn reload_dockerd() -> io::Result<()> {
    let mut pids: Vec<i32> = ["/run/docker.pid", "/var/run/docker.pid"]
        .iter()
        .filter_map(|p| fs::read_to_string(p).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if pids.is_empty() {
        for entry in fs::read_dir("/proc")?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if fs::read_to_string(entry.path().join("comm")).is_ok_and(|c| c.trim() == "dockerd") {
                pids.push(pid);
            }
        }
    }
    let Some(&pid) = pids.first() else {
        return Err(io::Error::other(
            "dockerd not found: no /run/docker.pid and no process named dockerd",
        ));
    };
    // SAFETY: kill(2) with a pid read from dockerd's pid file and a constant signal.
    if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("SIGHUP to dockerd (pid {pid}): {e}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rootfs;

    const HARNESS: &str = r#"
#include <dlfcn.h>
#include <unistd.h>
#include <stdio.h>
#include <string.h>
typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } pci_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned gpu, memory; } util_t;
#define SYM(T, n) __typeof__(T) n = (__typeof__(T))dlsym(h, #n); if (!n) { printf("missing %s\n", #n); return 3; }
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
    SYM(int (*)(void), nvmlInit_v2)
    SYM(int (*)(void), nvmlShutdown)
    SYM(const char *(*)(int), nvmlErrorString)
    SYM(int (*)(unsigned *), nvmlDeviceGetCount_v2)
    SYM(int (*)(unsigned, void **), nvmlDeviceGetHandleByIndex_v2)
    SYM(int (*)(void *, char *, unsigned), nvmlDeviceGetName)
    SYM(int (*)(void *, char *, unsigned), nvmlDeviceGetUUID)
    SYM(int (*)(void *, mem2_t *), nvmlDeviceGetMemoryInfo_v2)
    SYM(int (*)(void *, pci_t *), nvmlDeviceGetPciInfo_v3)
    SYM(int (*)(void *, int *, int *), nvmlDeviceGetCudaComputeCapability)
    SYM(int (*)(void *, unsigned *), nvmlDeviceGetPowerUsage)
    SYM(int (*)(void *, unsigned long long *), nvmlDeviceGetTotalEnergyConsumption)
    SYM(int (*)(void *, util_t *), nvmlDeviceGetUtilizationRates)
    SYM(int (*)(void *, unsigned, unsigned *), nvmlDeviceGetClockInfo)
    SYM(int (*)(char *, unsigned), nvmlSystemGetDriverVersion)
    unsigned n = 0;
    printf("precount=%d\n", nvmlDeviceGetCount_v2(&n));
    int rc = nvmlInit_v2();
    printf("init=%d %s\n", rc, nvmlErrorString(rc));
    if (rc) return 0;
    rc = nvmlDeviceGetCount_v2(&n);
    printf("count=%u\n", n);
    void *d = 0;
    printf("badindex=%d\n", nvmlDeviceGetHandleByIndex_v2(n, &d));
    char small[4];
    char drv[80];
    nvmlSystemGetDriverVersion(drv, sizeof drv);
    printf("driver=%s\n", drv);
    for (unsigned i = 0; i < n; i++) {
        char name[96], uuid[96];
        mem2_t m; memset(&m, 0, sizeof m); m.version = (unsigned)(sizeof(mem2_t) | (2u << 24));
        pci_t p; int ma, mi; unsigned mw, sm; unsigned long long e1, e2; util_t u;
        nvmlDeviceGetHandleByIndex_v2(i, &d);
        nvmlDeviceGetName(d, name, sizeof name);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        printf("small=%d\n", nvmlDeviceGetUUID(d, small, sizeof small));
        nvmlDeviceGetMemoryInfo_v2(d, &m);
        nvmlDeviceGetPciInfo_v3(d, &p);
        nvmlDeviceGetCudaComputeCapability(d, &ma, &mi);
        nvmlDeviceGetPowerUsage(d, &mw);
        nvmlDeviceGetClockInfo(d, 1, &sm);
        nvmlDeviceGetUtilizationRates(d, &u);
        nvmlDeviceGetTotalEnergyConsumption(d, &e1);
        usleep(20000);
        nvmlDeviceGetTotalEnergyConsumption(d, &e2);
        printf("gpu%u name=%s uuid=%s total=%llu bus=%s bus#=%u cc=%d.%d mw=%u sm=%u util=%u/%u energy_up=%d\n",
               i, name, uuid, m.total, p.busId, p.bus, ma, mi, mw, sm, u.gpu, u.memory, e2 > e1);
    }
    printf("shutdown=%d\n", nvmlShutdown());
    return 0;
}
"#;

    /// The dlopen harness (a C program that calls the stub like nvml-wrapper does), built once.
    fn harness() -> PathBuf {
        let dir = cache_dir().unwrap().join("nvml-harness");
        let hash = crate::hashing::sha256_hex(HARNESS.as_bytes());
        let bin = dir.join(format!("harness-{}", &hash[..16]));
        if bin.is_file() {
            return bin;
        }
        let work = dir.join(temp_name("harness"));
        fs::create_dir_all(&work).unwrap();
        fs::write(work.join("harness.c"), HARNESS).unwrap();
        run_checked(
            Command::new("cc")
                .args(["-O1", "-o", "harness", "harness.c", "-ldl"])
                .current_dir(&work),
        )
        .unwrap();
        fs::rename(work.join("harness"), &bin).unwrap();
        fs::remove_dir_all(&work).unwrap();
        bin
    }

    fn probe(envs: &[(&str, &str)]) -> String {
        let lib = nvml_stub().unwrap();
        let mut cmd = Command::new(harness());
        cmd.arg(&lib)
            .env_remove("NVIDIA_VISIBLE_DEVICES")
            .env_remove("ORCH_NVML_STUB_GPUS")
            .env_remove("ORCH_NVML_STUB_FAIL");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "harness: {out:?}");
        assert!(out.stderr.is_empty(), "the stub printed to stderr: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn nvml_stub_builds_for_old_glibc() {
        let lib = nvml_stub().unwrap();
        assert_eq!(lib.file_name().unwrap(), NVML_LIB_NAME);
        check_glibc_versions(&lib, MAX_GLIBC).unwrap();
        let dynsym = run_checked(Command::new("objdump").arg("-T").arg(&lib)).unwrap();
        let dynsym = String::from_utf8_lossy(&dynsym.stdout);
        for sym in [
            "nvmlInit_v2",
            "nvmlDeviceGetPciInfo_v3",
            "nvmlSystemGetCudaDriverVersion_v2",
        ] {
            assert!(dynsym.contains(sym), "{sym} not exported");
        }
        assert!(!dynsym.contains("fill_pool"), "internal symbols must stay hidden");
        let dynamic = run_checked(Command::new("objdump").arg("-p").arg(&lib)).unwrap();
        assert!(String::from_utf8_lossy(&dynamic.stdout).contains("SONAME               libnvidia-ml.so.1"));
        // Cached: the same path again.
        assert_eq!(nvml_stub().unwrap(), lib);
        // The checker does catch newer versions (glibc 2.34 moved dlopen & co. into libc).
        assert!(check_glibc_versions(&lib, (2, 2))
            .unwrap_err()
            .to_string()
            .contains("GLIBC_2."));
    }

    #[test]
    fn nvml_stub_defaults_to_two_gpus() {
        let out = probe(&[]);
        assert!(out.contains("precount=1\n"), "{out}");
        assert!(out.contains("init=0 Success\n"), "{out}");
        assert!(out.contains("count=2\n"), "{out}");
        assert!(out.contains("badindex=2\n"), "{out}");
        assert!(out.contains("small=7\n"), "{out}");
        assert!(out.contains("driver=580.95.05\n"), "{out}");
        assert!(
            out.contains(
                "gpu0 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000000 \
                 total=85520809984 bus=00000000:10:00.0 bus#=16 cc=9.0"
            ),
            "{out}"
        );
        assert!(
            out.contains("gpu1 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000001"),
            "{out}"
        );
        assert!(out.contains("sm=1980 util=87/41 energy_up=1"), "{out}");
        assert!(out.contains("shutdown=0\n"), "{out}");
    }

    #[test]
    fn nvml_stub_follows_nvidia_visible_devices() {
        let out = probe(&[(
            "NVIDIA_VISIBLE_DEVICES",
            "GPU-5a6b7c8d-0000-4000-8000-000000000003",
        )]);
        assert!(out.contains("count=1\n"), "{out}");
        assert!(
            out.contains("gpu0 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000003"),
            "{out}"
        );
        assert!(out.contains("bus=00000000:13:00.0"), "{out}");

        let out = probe(&[(
            "NVIDIA_VISIBLE_DEVICES",
            "5, GPU-5a6b7c8d-0000-4000-8000-0000000000, 1,GPU-5a6b7c8d-0000-4000-8000-000000000002,5",
        )]);
        assert!(
            out.contains("count=3\n"),
            "ambiguous prefix and repeats skipped: {out}"
        );
        assert!(
            out.contains("gpu0 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000005"),
            "{out}"
        );
        assert!(
            out.contains("gpu1 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000001"),
            "{out}"
        );
        assert!(
            out.contains("gpu2 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000002"),
            "{out}"
        );

        for none in ["none", "void", ""] {
            let out = probe(&[("NVIDIA_VISIBLE_DEVICES", none)]);
            assert!(
                out.contains("init=0 Success\n") && out.contains("count=0\n"),
                "{none:?}: {out}"
            );
        }
        let out = probe(&[("NVIDIA_VISIBLE_DEVICES", "all"), ("ORCH_NVML_STUB_GPUS", "8")]);
        assert!(
            out.contains("count=8\n") && out.contains("uuid=GPU-5a6b7c8d-0000-4000-8000-000000000007"),
            "{out}"
        );
        let out = probe(&[("ORCH_NVML_STUB_FAIL", "init")]);
        assert!(out.contains("init=9 Driver Not Loaded\n"), "{out}");
    }

    fn docker(args: &[&str]) -> Output {
        Command::new("docker")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    #[test]
    fn fake_runtime_mounts_the_stub_where_the_image_keeps_libraries() {
        if !rootfs::require_tooling(rootfs::docker_available().and(rootfs::debootstrap_available())) {
            return;
        }
        ensure_fake_nvidia_runtime().unwrap();
        // Idempotent.
        ensure_fake_nvidia_runtime().unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(DAEMON_JSON).unwrap()).unwrap();
        let ours = config["runtimes"]["nvidia"]["path"] == RUNTIME_PATH;

        let debian = rootfs::debian_image("trixie").unwrap();
        let lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
        let out = docker(&[
            "run",
            "--rm",
            "--runtime",
            "nvidia",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=0",
            &debian,
            "ls",
            "-l",
            lib,
        ]);
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains(lib), "{out:?}");
        if ours {
            // Read-only, and the stub really loads there (glibc 2.41).
            let out = docker(&[
                "run",
                "--rm",
                "--runtime",
                "nvidia",
                "-e",
                "NVIDIA_VISIBLE_DEVICES=0",
                &debian,
                "sh",
                "-c",
                &format!("echo x > {lib}"),
            ]);
            assert!(
                !out.status.success(),
                "the stub must be mounted read-only: {out:?}"
            );
        }
        let out = docker(&["run", "--rm", "--runtime", "nvidia", &debian, "ls", "-l", lib]);
        assert!(
            !out.status.success(),
            "no NVIDIA_VISIBLE_DEVICES, no library: {out:?}"
        );
        let out = docker(&[
            "run",
            "--rm",
            "--runtime",
            "nvidia",
            "-e",
            "NVIDIA_VISIBLE_DEVICES=none",
            &debian,
            "ls",
            "-l",
            lib,
        ]);
        assert!(
            !out.status.success(),
            "NVIDIA_VISIBLE_DEVICES=none, no library: {out:?}"
        );

        if ours {
            let stat = rootfs::static_image().unwrap();
            let out = docker(&[
                "run",
                "--rm",
                "--runtime",
                "nvidia",
                "-e",
                "NVIDIA_VISIBLE_DEVICES=all",
                &stat,
                "ls",
                "-l",
                "/usr/lib64/libnvidia-ml.so.1",
            ]);
            assert!(out.status.success(), "{out:?}");
            assert!(
                String::from_utf8_lossy(&out.stdout).contains("/usr/lib64/libnvidia-ml.so.1"),
                "{out:?}"
            );
        }
    }

    #[test]
    fn fake_runtime_stub_loads_in_old_and_new_glibc_images() {
        if !rootfs::require_tooling(rootfs::docker_available().and(rootfs::debootstrap_available())) {
            return;
        }
        ensure_fake_nvidia_runtime().unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(DAEMON_JSON).unwrap()).unwrap();
        if config["runtimes"]["nvidia"]["path"] != RUNTIME_PATH {
            eprintln!("skipped: runtime nvidia is not the fake one on this host");
            return;
        }
        let gpus = "NVIDIA_VISIBLE_DEVICES=1,GPU-5a6b7c8d-0000-4000-8000-000000000004";
        // bullseye (glibc 2.31): the dynamic loader of the image resolves every symbol version
        // the stub needs (a missing one is "version `GLIBC_2.x' not found", exit 127).
        let bullseye = rootfs::debian_image("bullseye").unwrap();
        let lib = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1";
        let preload = format!("LD_PRELOAD={lib}");
        let out = docker(&[
            "run",
            "--rm",
            "--runtime",
            "nvidia",
            "-e",
            gpus,
            "-e",
            &preload,
            &bullseye,
            "/bin/true",
        ]);
        assert!(out.status.success() && out.stderr.is_empty(), "bullseye: {out:?}");
        // trixie (glibc 2.41) runs the harness built here (glibc 2.36), which dlopens the library by
        // name as nvml-wrapper does and sees the GPUs the container was given.
        let trixie = rootfs::debian_image("trixie").unwrap();
        let volume = format!("{}:/harness:ro", harness().display());
        let out = docker(&[
            "run",
            "--rm",
            "--runtime",
            "nvidia",
            "-e",
            gpus,
            "-v",
            &volume,
            &trixie,
            "/harness",
            NVML_LIB_NAME,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "trixie: {out:?}");
        assert!(stdout.contains("count=2\n"), "{stdout}");
        assert!(
            stdout.contains("gpu0 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000001"),
            "{stdout}"
        );
        assert!(
            stdout.contains("gpu1 name=NVIDIA H100 80GB HBM3 uuid=GPU-5a6b7c8d-0000-4000-8000-000000000004"),
            "{stdout}"
        );
    }
}
