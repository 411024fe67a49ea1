//! A process inside an image's root folder, started the way a container runtime starts one, for
//! the fakes' "kubelet" (`orch-fake-kube`) and sandboxes (`orch-fake-modal`).
//!
//! [`command`] returns a [`tokio::process::Command`] whose child, before it runs anything,
//! enters a mount namespace of its own (`unshare(CLONE_NEWNS)`, `/` made private recursively so
//! nothing leaks back to the host), mounts what runc would: `proc` at `/proc`, a tmpfs `/dev`
//! holding the host's `null`, `zero`, `full`, `random`, `urandom` and `tty` nodes (plus the
//! `/dev/fd` and `/dev/std*` links and a tmpfs `/dev/shm`), a read-only `sysfs` at `/sys` (where
//! the kernel lets it), a tmpfs at `/tmp`, then the [`Spec`]'s bind mounts (files or folders,
//! read-only when asked, parents before children), then `chroot`s into the root and changes to
//! the working folder. The program is looked up there, in the container's `PATH`, and executed
//! there: a process sees the image's files and glibc, the mounts, and nothing else of this
//! host. The host's `PATH` and `HOME` never reach it (`PATH` defaults to [`DEFAULT_PATH`] and
//! `HOME` to `/root`, as Docker and containerd do when the image sets neither).
//!
//! With [`Spec::layer`] the root is the read-only lower layer of an overlay whose upper layer
//! is the container's own (what a snapshotter gives each container): what the container writes,
//! and the mount targets missing in the image (folders for folders, empty files for files, as
//! runc makes them), land there and the root folder never changes. Without it the root is
//! written in place.
//!
//! Not a sandbox: no PID, network, user or cgroup namespace (the fakes find a container's
//! processes by process group and `/proc` walks, and their servers listen on 127.0.0.1).
//!
//! GPUs ([`Gpu`]) come the way the NVIDIA container toolkit brings them: the driver's NVML
//! library bound read-only at `/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1` (Debian/Ubuntu
//! roots) or `/usr/lib64/libnvidia-ml.so.1` (others), the host's `/dev/nvidia*` nodes of the
//! chosen devices when the host has them, and `NVIDIA_VISIBLE_DEVICES` in the environment.
//!
//! Needs root (`CAP_SYS_ADMIN` for the namespace and mounts, `CAP_SYS_CHROOT`): [`supported`]
//! says whether this process can. [`busybox_root`], [`glibc_root`] and [`glibc_ca_root`] make
//! image roots for tests from Debian's static busybox (`busybox-static`), this host's glibc
//! runtime and CA bundle.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `PATH` of a container whose environment has none (runc's and containerd's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A bind mount: a host file or folder seen at `target` inside the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    /// Absolute container path.
    pub target: String,
    pub read_only: bool,
}

/// GPU injection, as the NVIDIA container toolkit does it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The NVML library to bind at `libnvidia-ml.so.1` (a stub in tests).
    pub nvml_lib: PathBuf,
    /// `NVIDIA_VISIBLE_DEVICES`: the chosen GPUs' indices, comma-separated (`0,1`).
    pub visible_devices: String,
}

/// Where and how a container runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The image's root folder on this host.
    pub root: PathBuf,
    pub mounts: Vec<Mount>,
    pub gpu: Option<Gpu>,
    /// Working folder inside the container (made if missing, as runc does); `/` when empty.
    pub workdir: String,
    /// A folder for the container's writable layer: the root is the lower layer of an overlay
    /// whose upper layer is kept here, as a container runtime's snapshotter does, so the root
    /// folder itself never changes (an image shared by tests stays as it was). `None`: the root
    /// is written in place (mount targets included).
    pub layer: Option<PathBuf>,
}

impl Spec {
    /// A container of `root` with no mounts or GPUs, working in `/`.
    pub fn new(root: impl Into<PathBuf>) -> Spec {
        Spec {
            root: root.into(),
            mounts: Vec::new(),
            gpu: None,
            workdir: "/".into(),
            layer: None,
        }
    }
}

/// Whether this process can start containers: it runs as root and the kernel lets it make a
/// mount namespace, mount and `chroot` (checked once, in a forked child).
pub fn supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        let tmp = c"/tmp";
        let tmpfs = c"tmpfs";
        let root = c"/";
        // SAFETY: the child only makes async-signal-safe syscalls on static strings, then
        // `_exit`s; the parent waits for it.
        unsafe {
            let pid = libc::fork();
            if pid < 0 {
                return false;
            }
            if pid == 0 {
                let ok = libc::unshare(libc::CLONE_NEWNS) == 0
                    && libc::mount(
                        std::ptr::null(),
                        root.as_ptr(),
                        std::ptr::null(),
                        libc::MS_REC | libc::MS_PRIVATE,
                        std::ptr::null(),
                    ) == 0
                    && libc::mount(tmpfs.as_ptr(), tmp.as_ptr(), tmpfs.as_ptr(), 0, std::ptr::null()) == 0
                    && libc::chroot(root.as_ptr()) == 0;
                libc::_exit(if ok { 0 } else { 1 });
            }
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0 {
                if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    return false;
                }
            }
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
        }
    })
}

/// For tests: `true` when containers can start here; otherwise, under CI, a panic (CI
/// runs as root: a missing capability is a broken machine), elsewhere `false` with a note on
/// stderr saying that `what` is skipped ([`crate::skip::skip_or_fail`]).
#[track_caller]
pub fn available_or_skip(what: &str) -> bool {
    supported()
        || crate::skip::skip_or_fail(
            what,
            "containers need root (a mount namespace, mounts and chroot); CI runs as root",
        )
}

/// One step of the child's setup, run between fork and exec.
enum Step {
    /// `mount(src, target, fstype, flags, data)`; `optional` steps may fail silently.
    Mount {
        src: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
        optional: bool,
    },
    /// `mkdir` of each path in turn (`EEXIST` is fine).
    Mkdirs(Vec<CString>),
    /// An empty file if nothing is there.
    Touch(CString),
    /// `symlink(to, at)` (`EEXIST` is fine).
    Symlink {
        to: CString,
        at: CString,
    },
    Chroot(CString),
    Chdir(CString),
    /// Try each candidate path with `execve`, as `execvp` would with the container's `PATH`.
    Exec {
        candidates: Vec<CString>,
    },
}

/// The child's whole setup, prepared before the fork: the pre-exec closure allocates nothing.
struct Plan {
    steps: Vec<Step>,
    /// The program's arguments and environment, and null-terminated pointer arrays into them.
    _argv: Vec<CString>,
    _envp: Vec<CString>,
    argv_ptrs: Vec<*const libc::c_char>,
    envp_ptrs: Vec<*const libc::c_char>,
}

// SAFETY: the raw pointers point into CStrings owned by the same Plan (heap buffers that do not
// move with it); the Plan is only read, in the forked child.
unsafe impl Send for Plan {}
// SAFETY: as above: never written after construction.
unsafe impl Sync for Plan {}

fn cstr(p: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(p.as_ref().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a NUL byte in {:?}", p.as_ref()),
        )
    })
}

/// The clean components of a container path (`.` and empty ones dropped, `..` applied).
fn components(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c.to_string()),
        }
    }
    out
}

/// Folders the runtime mounts itself: their image contents are hidden, paths under them are
/// taken as written.
const RUNTIME_DIRS: [&str; 4] = ["proc", "dev", "sys", "tmp"];

/// A container path with the root's symbolic links followed inside the root (an absolute link
/// is relative to the root, never to this host), as runc's `securejoin` does; missing parts are
/// kept as written.
fn resolve_in_root(root: &Path, target: &str) -> io::Result<Vec<String>> {
    let mut todo: std::collections::VecDeque<String> = components(target).into();
    if todo.front().is_some_and(|c| RUNTIME_DIRS.contains(&c.as_str())) {
        return Ok(todo.into());
    }
    let mut cur: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(part) = todo.pop_front() {
        if part == ".." {
            cur.pop();
            continue;
        }
        let host = root.join(cur.iter().chain([&part]).collect::<PathBuf>());
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("too many levels of symbolic links in {target}"),
                    ));
                }
                let link = std::fs::read_link(&host)?;
                let link = link.to_string_lossy();
                if link.starts_with('/') {
                    cur.clear();
                }
                for c in link.split('/').rev() {
                    if !c.is_empty() && c != "." {
                        todo.push_front(c.to_string());
                    }
                }
            }
            _ => cur.push(part),
        }
    }
    Ok(cur)
}

/// The host path of a container path in an image root, its symbolic links followed inside the
/// root (never out of it); parts that do not exist are kept as written. Relative paths are
/// taken from `/`.
pub fn host_path(root: &Path, path: &str) -> io::Result<PathBuf> {
    let mut parts = components(path);
    if parts.first().is_some_and(|c| RUNTIME_DIRS.contains(&c.as_str())) {
        // Image contents under these are hidden by the runtime's mounts, but a build writes there.
        return Ok(root.join(parts.iter().collect::<PathBuf>()));
    }
    parts = resolve_in_root(root, path)?;
    Ok(root.join(parts.iter().collect::<PathBuf>()))
}

/// `root/a`, `root/a/b`, ... for a resolved container path.
fn prefixes(root: &Path, parts: &[String]) -> io::Result<Vec<CString>> {
    let mut out = Vec::new();
    let mut p = root.to_path_buf();
    for c in parts {
        p.push(c);
        out.push(cstr(&p)?);
    }
    Ok(out)
}

fn bind(src: &Path, target: CString, optional: bool) -> io::Result<Step> {
    Ok(Step::Mount {
        src: Some(cstr(src)?),
        target,
        fstype: None,
        flags: libc::MS_BIND | libc::MS_REC,
        data: None,
        optional,
    })
}

fn fs_mount(
    fstype: &str,
    target: &Path,
    flags: libc::c_ulong,
    data: Option<&str>,
    optional: bool,
) -> io::Result<Step> {
    Ok(Step::Mount {
        src: Some(cstr(fstype)?),
        target: cstr(target)?,
        fstype: Some(cstr(fstype)?),
        flags,
        data: data.map(cstr).transpose()?,
        optional,
    })
}

/// Spawns `cmd`, trying again while `execve` answers `ETXTBSY` (at most 10
/// times, 10 to 100 ms apart, about half a second in all).
///
/// A fake writes files into a container's root (an uploaded mount, a copied
/// agent) from one thread while another thread forks a container's child:
/// that child holds a copy of the write descriptor until it `exec`s, after
/// its mounts and `chroot`, and until then executing the written file fails
/// with "Text file busy" (as Go's toolchain found, golang/go#22315). A real
/// runtime writes in one process and starts the container from another; the
/// fakes retry, as `go` does. The sleep blocks the calling thread: it happens
/// only in that race.
pub fn spawn_retrying_busy(cmd: &mut tokio::process::Command) -> io::Result<tokio::process::Child> {
    let mut tries = 0u32;
    loop {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 10 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(u64::from(tries.min(10)) * 10));
            }
            other => return other,
        }
    }
}

/// Where the toolkit puts `libnvidia-ml.so.1` in this root.
fn nvml_target(root: &Path) -> io::Result<String> {
    let deb = resolve_in_root(root, "/usr/lib/x86_64-linux-gnu")?;
    if root.join(deb.iter().collect::<PathBuf>()).is_dir() {
        Ok("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into())
    } else {
        Ok("/usr/lib64/libnvidia-ml.so.1".into())
    }
}

/// A command that runs `argv` inside `spec.root` with exactly `env` (plus `PATH`/`HOME`
/// defaults and, with a GPU, `NVIDIA_VISIBLE_DEVICES`). The caller sets stdio, process group
/// and the like, and spawns it. `argv[0]` is looked up in the container's `PATH` inside the
/// root; when nothing is found the spawn fails with [`io::ErrorKind::NotFound`]. A failing
/// setup step writes what failed to the child's stderr before the spawn fails.
pub fn command(
    spec: &Spec,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> io::Result<tokio::process::Command> {
    let Some(prog) = argv.first().filter(|p| !p.is_empty()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "no command specified",
        ));
    };
    let root = std::fs::canonicalize(&spec.root)
        .map_err(|e| io::Error::new(e.kind(), format!("the image root {}: {e}", spec.root.display())))?;
    if !root.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the image root {} is not a folder", root.display()),
        ));
    }
    let mut env = env.clone();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    env.entry("HOME".into()).or_insert_with(|| "/root".into());
    let mut mounts = spec.mounts.clone();
    if let Some(gpu) = &spec.gpu {
        env.insert("NVIDIA_VISIBLE_DEVICES".into(), gpu.visible_devices.clone());
        mounts.push(Mount {
            host: gpu.nvml_lib.clone(),
            target: nvml_target(&root)?,
            read_only: true,
        });
    }

    let mut steps = vec![Step::Mount {
        src: None,
        target: cstr("/")?,
        fstype: None,
        flags: libc::MS_REC | libc::MS_PRIVATE,
        data: None,
        optional: false,
    }];
    // `base`: where the container's `/` is on this host while the child sets it up.
    let base = match &spec.layer {
        None => {
            for d in RUNTIME_DIRS {
                // The runtime's own mount points: made in the image when missing, as runc does.
                let p = root.join(d);
                if std::fs::symlink_metadata(&p).is_err() {
                    std::fs::create_dir_all(&p)?;
                }
            }
            root.clone()
        }
        Some(layer) => {
            for d in ["upper", "work", "merged"] {
                std::fs::create_dir_all(layer.join(d))?;
            }
            let layer = std::fs::canonicalize(layer)?;
            let (upper, work, merged) = (layer.join("upper"), layer.join("work"), layer.join("merged"));
            let opts = format!(
                "lowerdir={},upperdir={},workdir={}",
                root.display(),
                upper.display(),
                work.display()
            );
            if [&root, &layer]
                .iter()
                .any(|p| p.to_string_lossy().contains([',', ':']))
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("overlay paths may not hold `,` or `:`: {opts}"),
                ));
            }
            steps.push(fs_mount("overlay", &merged, 0, Some(&opts), false)?);
            merged
        }
    };
    steps.push(Step::Mkdirs(
        RUNTIME_DIRS
            .iter()
            .map(|d| cstr(base.join(d)))
            .collect::<io::Result<_>>()?,
    ));
    steps.push(fs_mount(
        "proc",
        &base.join("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
        false,
    )?);
    // /dev: a tmpfs with the usual nodes bound from the host (never the host's /dev itself:
    // files made under /dev, like the termination log, must not land there).
    let dev = base.join("dev");
    steps.push(fs_mount(
        "tmpfs",
        &dev,
        libc::MS_NOSUID | libc::MS_STRICTATIME,
        Some("mode=755,size=65536k"),
        false,
    )?);
    let mut nodes: Vec<String> = ["null", "zero", "full", "random", "urandom", "tty"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(gpu) = &spec.gpu {
        nodes.extend(["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"].map(String::from));
        for d in gpu.visible_devices.split(',').map(str::trim) {
            if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) {
                nodes.push(format!("nvidia{d}"));
            }
        }
    }
    for n in nodes {
        let host = Path::new("/dev").join(&n);
        if !host.exists() {
            continue;
        }
        let at = cstr(dev.join(&n))?;
        steps.push(Step::Touch(at.clone()));
        steps.push(bind(&host, at, n == "tty")?);
    }
    for (at, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("core", "/proc/kcore"),
    ] {
        steps.push(Step::Symlink {
            to: cstr(to)?,
            at: cstr(dev.join(at))?,
        });
    }
    steps.push(Step::Mkdirs(vec![cstr(dev.join("pts"))?, cstr(dev.join("shm"))?]));
    steps.push(fs_mount(
        "devpts",
        &dev.join("pts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
        true,
    )?);
    steps.push(Step::Symlink {
        to: cstr("pts/ptmx")?,
        at: cstr(dev.join("ptmx"))?,
    });
    steps.push(fs_mount(
        "tmpfs",
        &dev.join("shm"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some("mode=1777,size=65536k"),
        false,
    )?);
    steps.push(fs_mount(
        "sysfs",
        &base.join("sys"),
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
        true,
    )?);
    steps.push(fs_mount(
        "tmpfs",
        &base.join("tmp"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
        false,
    )?);

    // The spec's mounts, parents before children.
    let mut planned = Vec::new();
    for m in &mounts {
        if !m.target.starts_with('/') || m.target.split('/').any(|c| c == "..") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mount target `{}` is not an absolute path", m.target),
            ));
        }
        let meta = std::fs::metadata(&m.host).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mount source {} (for {}): {e}", m.host.display(), m.target),
            )
        })?;
        let parts = resolve_in_root(&root, &m.target)?;
        if parts.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cannot mount {} over the root", m.host.display()),
            ));
        }
        planned.push((parts, m, meta.is_dir()));
    }
    planned.sort_by_key(|(parts, _, _)| parts.len());
    for (parts, m, is_dir) in planned {
        let host_target = base.join(parts.iter().collect::<PathBuf>());
        let under_runtime = RUNTIME_DIRS.contains(&parts[0].as_str());
        if !under_runtime && spec.layer.is_none() {
            // Made in the image now, as runc does.
            if is_dir {
                std::fs::create_dir_all(&host_target)?;
            } else {
                if let Some(d) = host_target.parent() {
                    std::fs::create_dir_all(d)?;
                }
                if std::fs::symlink_metadata(&host_target).is_err() {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&host_target)
                        .or_else(|e| {
                            if e.kind() == io::ErrorKind::AlreadyExists {
                                Ok(std::fs::File::open(&host_target)?)
                            } else {
                                Err(e)
                            }
                        })?;
                }
            }
        }
        let at = cstr(&host_target)?;
        if is_dir {
            steps.push(Step::Mkdirs(prefixes(&base, &parts)?));
        } else {
            steps.push(Step::Mkdirs(prefixes(&base, &parts[..parts.len() - 1])?));
            steps.push(Step::Touch(at.clone()));
        }
        let host = std::fs::canonicalize(&m.host)?;
        steps.push(bind(&host, at.clone(), false)?);
        if m.read_only {
            steps.push(Step::Mount {
                src: None,
                target: at,
                fstype: None,
                flags: libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                data: None,
                optional: false,
            });
        }
    }

    steps.push(Step::Chroot(cstr(&base)?));
    steps.push(Step::Chdir(cstr("/")?));
    let wd = components(&spec.workdir);
    let mut wd_prefixes = Vec::new();
    let mut p = String::new();
    for c in &wd {
        p.push('/');
        p.push_str(c);
        wd_prefixes.push(cstr(&p)?);
    }
    steps.push(Step::Mkdirs(wd_prefixes));
    steps.push(Step::Chdir(cstr(if p.is_empty() { "/" } else { &p })?));

    // The program, as execvp would find it with the container's PATH.
    let candidates = if prog.contains('/') {
        vec![cstr(prog)?]
    } else {
        let path = env.get("PATH").map(String::as_str).unwrap_or(DEFAULT_PATH);
        path.split(':')
            .filter(|d| !d.is_empty())
            .map(|d| cstr(format!("{}/{prog}", d.trim_end_matches('/'))))
            .collect::<io::Result<Vec<_>>>()?
    };
    let argv_c = argv.iter().map(cstr).collect::<io::Result<Vec<_>>>()?;
    let envp_c = env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}")))
        .collect::<io::Result<Vec<_>>>()?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp_c.iter().map(|c| c.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    steps.push(Step::Exec { candidates });
    let plan = Plan {
        steps,
        _argv: argv_c,
        _envp: envp_c,
        argv_ptrs,
        envp_ptrs,
    };

    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(&argv[1..]).env_clear().envs(&env);
    // SAFETY: the closure runs in the forked child and only makes async-signal-safe syscalls
    // (unshare, mount, mkdir, open, close, symlink, chroot, chdir, write, execve) on memory
    // prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || run_plan(&plan));
    }
    Ok(cmd)
}

/// A setup step failed: say which on stderr (the container's log), return the errno.
fn fail(what: &[u8], path: &CString) -> io::Error {
    let err = io::Error::last_os_error();
    let parts: [&[u8]; 4] = [b"container setup: ", what, b" ", path.as_bytes()];
    for p in parts {
        // SAFETY: write(2) on the child's stderr with a valid buffer.
        unsafe {
            libc::write(2, p.as_ptr().cast(), p.len());
        }
    }
    // SAFETY: as above.
    unsafe {
        libc::write(2, b"\n".as_ptr().cast(), 1);
    }
    err
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn run_plan(plan: &Plan) -> io::Result<()> {
    let opt = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is a NUL-terminated string owned by `plan`, or null where the
    // syscall allows it.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(fail(b"unshare(CLONE_NEWNS)", &CString::default()));
        }
        for step in &plan.steps {
            match step {
                Step::Mount {
                    src,
                    target,
                    fstype,
                    flags,
                    data,
                    optional,
                } => {
                    let r = libc::mount(opt(src), target.as_ptr(), opt(fstype), *flags, opt(data).cast());
                    if r != 0 && !optional {
                        return Err(fail(b"mount at", target));
                    }
                }
                Step::Mkdirs(paths) => {
                    for p in paths {
                        if libc::mkdir(p.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                            return Err(fail(b"mkdir", p));
                        }
                    }
                }
                Step::Touch(p) => {
                    let fd = libc::open(
                        p.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        if errno() != libc::EISDIR {
                            return Err(fail(b"create", p));
                        }
                    } else {
                        libc::close(fd);
                    }
                }
                Step::Symlink { to, at } => {
                    if libc::symlink(to.as_ptr(), at.as_ptr()) != 0 && errno() != libc::EEXIST {
                        return Err(fail(b"symlink", at));
                    }
                }
                Step::Chroot(p) => {
                    if libc::chroot(p.as_ptr()) != 0 {
                        return Err(fail(b"chroot", p));
                    }
                }
                Step::Chdir(p) => {
                    if libc::chdir(p.as_ptr()) != 0 {
                        return Err(fail(b"chdir", p));
                    }
                }
                Step::Exec { candidates, .. } => {
                    // execvp's rules: the first that execs wins; ENOENT/ENOTDIR/EACCES go on to
                    // the next; EACCES is reported if nothing ran.
                    let mut saw_eacces = false;
                    for c in candidates {
                        libc::execve(c.as_ptr(), plan.argv_ptrs.as_ptr(), plan.envp_ptrs.as_ptr());
                        match errno() {
                            libc::ENOENT | libc::ENOTDIR => {}
                            libc::EACCES => saw_eacces = true,
                            e => return Err(io::Error::from_raw_os_error(e)),
                        }
                    }
                    let e = if saw_eacces { libc::EACCES } else { libc::ENOENT };
                    return Err(io::Error::from_raw_os_error(e));
                }
            }
        }
    }
    // Not reached: the plan always ends with Exec.
    Err(io::Error::from_raw_os_error(libc::ENOEXEC))
}

/// `x` → `docker.io/library/x:latest`: an image reference as containerd names it.
pub fn normalize_image(image: &str) -> String {
    let (name, digest) = match image.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (image, None),
    };
    let slash = name.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name[slash..].rfind(':') {
        Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
        None => (name, None),
    };
    let first = name.split('/').next().unwrap_or_default();
    let full = if !name.contains('/') {
        format!("docker.io/library/{name}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        name.to_string()
    } else {
        format!("docker.io/{name}")
    };
    match (tag, digest) {
        (_, Some(d)) => format!("{full}@{d}"),
        (Some(t), None) => format!("{full}:{t}"),
        (None, None) => format!("{full}:latest"),
    }
}

// ---------------------------------------------------------------------------------------------
// Image roots for tests.

/// Whether an ELF file has no program interpreter (statically linked); `false` for anything
/// that is not a 64-bit little-endian ELF file.
pub fn is_static_elf(path: &Path) -> bool {
    let Ok(b) = std::fs::read(path) else {
        return false;
    };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let u16_at = |o: usize| b.get(o..o + 2).map(|s| u16::from_le_bytes([s[0], s[1]]) as usize);
    let u64_at = |o: usize| {
        b.get(o..o + 8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map(|a| u64::from_le_bytes(a) as usize)
    };
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        match b.get(o..o + 4) {
            Some(t) if u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3 => return false, // PT_INTERP
            Some(_) => {}
            None => return false,
        }
    }
    true
}

/// A statically linked busybox on this host: `$ORCH_BUSYBOX`, else `/bin/busybox` or
/// `/usr/bin/busybox` (Debian's `busybox-static`).
pub fn host_busybox() -> io::Result<PathBuf> {
    let mut tried = Vec::new();
    let env = std::env::var_os("ORCH_BUSYBOX")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    for p in env
        .into_iter()
        .chain(["/bin/busybox", "/usr/bin/busybox"].map(PathBuf::from))
    {
        if is_static_elf(&p) {
            return Ok(p);
        }
        tried.push(p.display().to_string());
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no statically linked busybox (looked at {}): `apt-get install busybox-static`",
            tried.join(", ")
        ),
    ))
}

/// Where tests keep what they make once: `$CARGO_TARGET_DIR` or the workspace's `target/`,
/// then `orch-testkit-cache/`.
pub fn cache_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("orch-testkit-cache")
}

fn link_or_copy(from: &Path, to: &Path) -> io::Result<()> {
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to)?;
    }
    Ok(())
}

/// Makes a busybox image root in `dir` (an empty or missing folder): `/bin/busybox` (a copy of
/// the host's static one) with every applet linked where `busybox --install -s` puts it
/// (`/bin/sh`, `/usr/bin/env`, ...), `/etc/passwd` and `/etc/group` with root, and empty
/// `/root`, `/proc`, `/dev`, `/sys`, `/tmp`. No glibc: only static programs run in it.
pub fn make_busybox_root(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let bb = host_busybox()?;
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "proc", "dev", "sys", "tmp", "var/tmp",
    ] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::copy(&bb, dir.join("bin/busybox"))?;
    let out = std::process::Command::new(&bb).arg("--list-full").output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!("{} --list-full failed", bb.display())));
    }
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let l = l.trim().trim_start_matches('/');
        if l.is_empty() || l == "bin/busybox" || l.split('/').any(|c| c == "..") {
            continue;
        }
        let at = dir.join(l);
        if let Some(d) = at.parent() {
            std::fs::create_dir_all(d)?;
        }
        if std::fs::symlink_metadata(&at).is_err() {
            std::os::unix::fs::symlink("/bin/busybox", &at)?;
        }
    }
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n")?;
    std::fs::write(dir.join("etc/group"), "root:x:0:\n")?;
    std::fs::write(dir.join("etc/hostname"), "container\n")?;
    std::fs::write(dir.join("etc/hosts"), "127.0.0.1\tlocalhost\n::1\tlocalhost\n")?;
    Ok(())
}

/// The glibc runtime of Debian's `libc6` and `libgcc-s1` packages (what `debian:bookworm-slim`
/// and the `python:*-slim` images have), by file name.
const GLIBC_LIBS: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libmvec.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "libutil.so.1",
    "libresolv.so.2",
    "libanl.so.1",
    "libnss_files.so.2",
    "libnss_dns.so.2",
    "libgcc_s.so.1",
];

/// Makes a glibc image root in `dir`: [`make_busybox_root`] plus this host's glibc
/// runtime laid out as Debian 12 lays it out (`/usr/lib/<triplet>/`, `/lib -> usr/lib`,
/// `/lib64 -> usr/lib64`, the dynamic loader at `/lib64/ld-linux-x86-64.so.2`): dynamically
/// linked programs that need nothing beyond `libc6` and `libgcc-s1` run in it, as in
/// `debian:bookworm-slim`. On a Debian 12 host (this project's machines) that is glibc 2.36,
/// the image's own.
pub fn make_glibc_root(dir: &Path) -> io::Result<()> {
    make_busybox_root(dir)?;
    let (triplet, loader, loader_dir) = match std::env::consts::ARCH {
        "aarch64" => ("aarch64-linux-gnu", "ld-linux-aarch64.so.1", "lib"),
        _ => ("x86_64-linux-gnu", "ld-linux-x86-64.so.2", "lib64"),
    };
    let host_dirs = [format!("/lib/{triplet}"), format!("/usr/lib/{triplet}")];
    let find = |name: &str| {
        host_dirs
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
    };
    let libdir = dir.join("usr/lib").join(triplet);
    std::fs::create_dir_all(&libdir)?;
    std::fs::create_dir_all(dir.join("usr/lib64"))?;
    let real_loader = find(loader).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no {loader} on this host (a glibc system is needed)"),
        )
    })?;
    link_or_copy(&std::fs::canonicalize(real_loader)?, &libdir.join(loader))?;
    for name in GLIBC_LIBS {
        if let Some(p) = find(name) {
            link_or_copy(&std::fs::canonicalize(p)?, &libdir.join(name))?;
        }
    }
    let link = |to: &str, at: &Path| -> io::Result<()> {
        if std::fs::symlink_metadata(at).is_err() {
            std::os::unix::fs::symlink(to, at)?;
        }
        Ok(())
    };
    link("usr/lib", &dir.join("lib"))?;
    link("usr/lib64", &dir.join("lib64"))?;
    if loader_dir == "lib64" {
        link(
            &format!("../lib/{triplet}/{loader}"),
            &dir.join("usr/lib64").join(loader),
        )?;
    } else {
        link(&format!("{triplet}/{loader}"), &dir.join("usr/lib").join(loader))?;
    }
    std::fs::create_dir_all(dir.join("etc"))?;
    std::fs::write(dir.join("etc/debian_version"), "12.0\n")?;
    std::fs::write(
        dir.join("etc/nsswitch.conf"),
        "passwd: files\ngroup: files\nhosts: files dns\n",
    )?;
    Ok(())
}

/// Makes [`make_glibc_root`] in `dir` with this host's CA bundle at
/// `/etc/ssl/certs/ca-certificates.crt` (Debian's `ca-certificates`), as images that install
/// it have it (`python:*-slim`, unlike `debian:*-slim`): TLS clients find their roots there.
pub fn make_glibc_ca_root(dir: &Path) -> io::Result<()> {
    make_glibc_root(dir)?;
    let bundle = [
        "/etc/ssl/certs/ca-certificates.crt",
        "/etc/pki/tls/certs/ca-bundle.crt",
    ]
    .iter()
    .map(Path::new)
    .find(|p| p.is_file())
    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no CA bundle on this host"))?;
    std::fs::create_dir_all(dir.join("etc/ssl/certs"))?;
    std::fs::copy(bundle, dir.join("etc/ssl/certs/ca-certificates.crt"))?;
    Ok(())
}

/// A root made once per build folder under [`cache_dir`]: built in a temporary folder, then
/// renamed in place (concurrent tests and processes agree on one).
fn cached_root(name: &str, make: fn(&Path) -> io::Result<()>) -> io::Result<PathBuf> {
    let dir = cache_dir().join(name);
    if dir.join(".complete").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(cache_dir())?;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = cache_dir().join(format!(
        ".{name}.{}.{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    make(&tmp)?;
    std::fs::write(tmp.join(".complete"), "")?;
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another test got there first (or a stale incomplete one is in the way).
        if !dir.join(".complete").is_file() {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)?;
        } else {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }
    Ok(dir)
}

/// A busybox image root ([`make_busybox_root`]) shared by the tests of this build folder
/// (`target/orch-testkit-cache/busybox-root`). Containers write into the root they run in:
/// a test that adds files to its image makes its own with [`make_busybox_root`].
pub fn busybox_root() -> io::Result<PathBuf> {
    cached_root("busybox-root-v1", make_busybox_root)
}

/// A glibc image root ([`make_glibc_root`]), shared like [`busybox_root`]: a stand-in for
/// `debian:bookworm-slim`.
pub fn glibc_root() -> io::Result<PathBuf> {
    cached_root("glibc-root-v1", make_glibc_root)
}

/// A glibc image root with a CA bundle ([`make_glibc_ca_root`]), shared like
/// [`busybox_root`]: a stand-in for `python:3.11-slim` (less Python).
pub fn glibc_ca_root() -> io::Result<PathBuf> {
    cached_root("glibc-ca-root-v1", make_glibc_ca_root)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    fn skip() -> bool {
        !available_or_skip("container tests")
    }

    /// The race of `spawn_retrying_busy`'s doc, made on purpose: the file to
    /// run is held open for writing (as a forked child holds a fake's write
    /// descriptor until it execs). A plain spawn fails "Text file busy"; the
    /// retrying one starts it once the writer lets go.
    #[tokio::test]
    async fn a_file_still_open_for_writing_is_started_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("prog");
        std::fs::write(&exe, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let writer = std::fs::OpenOptions::new().write(true).open(&exe).unwrap();
        let mut cmd = tokio::process::Command::new(&exe);
        let e = cmd.spawn().unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ETXTBSY), "{e}");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(60));
            drop(writer);
        });
        let status = spawn_retrying_busy(&mut cmd).unwrap().wait().await.unwrap();
        assert!(status.success());
        release.join().unwrap();
    }

    async fn run(spec: &Spec, script: &str) -> (i32, String, String) {
        let argv: Vec<String> = ["sh", "-c", script].map(String::from).to_vec();
        let env = BTreeMap::from([("GREETING".to_string(), "hi".to_string())]);
        let out = command(spec, &argv, &env)
            .unwrap()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .await
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    #[test]
    fn components_and_resolution_stay_in_the_root() {
        assert_eq!(components("/a/./b//../c/"), ["a", "c"]);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.path().join("lib")).unwrap();
        std::os::unix::fs::symlink("../../etc", root.path().join("usr/lib/up")).unwrap();
        assert_eq!(
            resolve_in_root(root.path(), "/lib/x").unwrap(),
            ["usr", "lib", "x"]
        );
        // `..` never climbs above the root.
        assert_eq!(resolve_in_root(root.path(), "/lib/up/../../../y").unwrap(), ["y"]);
        assert_eq!(resolve_in_root(root.path(), "/dev/shm").unwrap(), ["dev", "shm"]);
    }

    #[test]
    fn images_normalize() {
        assert_eq!(normalize_image("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalize_image("acme/x:v1"), "docker.io/acme/x:v1");
        assert_eq!(normalize_image("reg.io:5000/a/b"), "reg.io:5000/a/b:latest");
        assert_eq!(normalize_image("localhost/a@sha256:ab"), "localhost/a@sha256:ab");
    }

    #[test]
    fn static_elf_detection() {
        assert!(!is_static_elf(Path::new("/nonexistent")));
        assert!(!is_static_elf(Path::new("/etc/passwd")));
        // This test binary is linked dynamically against the host's glibc.
        assert!(!is_static_elf(&std::env::current_exe().unwrap()));
        if let Ok(bb) = host_busybox() {
            assert!(is_static_elf(&bb));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_container_sees_its_root_and_mounts_not_the_host() {
        if skip() {
            return;
        }
        let root = busybox_root().unwrap();
        let layer = tempfile::tempdir().unwrap();
        let data = tempfile::tempdir().unwrap();
        std::fs::write(data.path().join("in.txt"), "from-host-folder").unwrap();
        let file = data.path().join("single");
        std::fs::write(&file, "one-file").unwrap();
        let spec = Spec {
            root: root.clone(),
            mounts: vec![
                Mount {
                    host: data.path().to_path_buf(),
                    target: "/data".into(),
                    read_only: false,
                },
                Mount {
                    host: file.clone(),
                    target: "/etc/deep/single.txt".into(),
                    read_only: true,
                },
            ],
            gpu: None,
            workdir: "/data".into(),
            layer: Some(layer.path().to_path_buf()),
        };
        let (code, out, err) = run(
            &spec,
            "echo \"pwd=$(pwd) greet=$GREETING path=$PATH home=$HOME\"; ls /; cat /data/in.txt; echo; cat /etc/deep/single.txt; echo; \
             echo w > /data/written; cat /proc/self/mountinfo; test -e /work && echo HOST-WORK; test -e /root/.cargo && echo HOST-CARGO; \
             test -e /usr/lib/x86_64-linux-gnu/libc.so.6 && echo HOST-GLIBC; echo tmp > /tmp/x && cat /tmp/x; ls /dev; \
             echo layer > /written-in-root",
        )
        .await;
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(
            out.contains(&format!("pwd=/data greet=hi path={DEFAULT_PATH} home=/root")),
            "{out}"
        );
        assert!(
            out.contains("from-host-folder") && out.contains("one-file"),
            "{out}"
        );
        for leak in ["HOST-WORK", "HOST-CARGO", "HOST-GLIBC"] {
            assert!(!out.contains(leak), "{leak}: {out}");
        }
        assert!(
            out.contains(" /data ") && out.contains(" /etc/deep/single.txt "),
            "{out}"
        );
        assert!(out.contains(" /proc ") && out.contains(" /tmp "), "{out}");
        assert!(out.lines().any(|l| l == "tmp"), "{out}");
        assert!(out.contains("null") && out.contains("urandom"), "{out}");
        // Writes to a read-write mount reach the host folder; /tmp is the container's own.
        assert_eq!(
            std::fs::read_to_string(data.path().join("written")).unwrap(),
            "w\n"
        );
        // The image root stays as it was: targets and writes went to the container's layer.
        assert!(!root.join("data").exists() && !root.join("etc/deep").exists());
        assert!(!root.join("written-in-root").exists());
        assert!(layer.path().join("upper/written-in-root").is_file());
        // The host's mount table is untouched.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&root.display().to_string()), "{mounts}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_only_mounts_refuse_writes_and_programs_come_from_the_root() {
        if skip() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        make_busybox_root(root.path()).unwrap();
        let data = tempfile::tempdir().unwrap();
        let spec = Spec {
            root: root.path().to_path_buf(),
            mounts: vec![Mount {
                host: data.path().to_path_buf(),
                target: "/ro".into(),
                read_only: true,
            }],
            gpu: None,
            workdir: String::new(),
            layer: None,
        };
        let (code, out, err) = run(&spec, "pwd; echo x > /ro/f || echo refused").await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "/\nrefused\n");
        assert!(err.contains("Read-only file system"), "{err}");
        assert!(!data.path().join("f").exists());
        // Without a layer, the missing target was made in the root itself, as runc does.
        assert!(root.path().join("ro").is_dir());
        // A program only the host has is not found; the error is NotFound.
        let e = command(&spec, &["cargo".to_string()], &BTreeMap::new())
            .unwrap()
            .stderr(Stdio::null())
            .spawn()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // A dynamically linked host program cannot run in a root without glibc.
        let here = std::env::current_exe().unwrap();
        let spec2 = Spec {
            mounts: vec![Mount {
                host: here,
                target: "/dyn".into(),
                read_only: true,
            }],
            ..spec.clone()
        };
        let r = command(&spec2, &["/dyn".to_string()], &BTreeMap::new())
            .unwrap()
            .stderr(Stdio::null())
            .spawn();
        assert!(r.is_err(), "no dynamic loader in a busybox root");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn gpu_injection_binds_the_library_and_sets_visible_devices() {
        if skip() {
            return;
        }
        let root = busybox_root().unwrap();
        let layer = tempfile::tempdir().unwrap();
        let lib = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(lib.path(), "not-really-nvml").unwrap();
        let mut spec = Spec::new(&root);
        spec.layer = Some(layer.path().join("a"));
        spec.gpu = Some(Gpu {
            nvml_lib: lib.path().to_path_buf(),
            visible_devices: "2,3".into(),
        });
        let (code, out, err) = run(
            &spec,
            "echo \"v=$NVIDIA_VISIBLE_DEVICES\"; cat /usr/lib64/libnvidia-ml.so.1",
        )
        .await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, "v=2,3\nnot-really-nvml");
        // A Debian root gets it in the multiarch folder.
        let deb = tempfile::tempdir().unwrap();
        make_glibc_root(deb.path()).unwrap();
        spec.root = deb.path().to_path_buf();
        spec.layer = Some(layer.path().join("b"));
        let (code, out, err) = run(&spec, "cat /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").await;
        if std::env::consts::ARCH == "x86_64" {
            assert_eq!(code, 0, "{err}");
            assert_eq!(out, "not-really-nvml");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_glibc_root_runs_dynamically_linked_programs() {
        if skip() {
            return;
        }
        let root = glibc_root().unwrap();
        let layer = tempfile::tempdir().unwrap();
        // The dynamically linked busybox-free program of the host: `ls` of coreutils needs
        // more than libc6 (libselinux), `true` does not.
        let t = Path::new("/usr/bin/true");
        if !t.is_file() {
            return;
        }
        let spec = Spec {
            root,
            mounts: vec![Mount {
                host: t.to_path_buf(),
                target: "/opt/true".into(),
                read_only: true,
            }],
            gpu: None,
            workdir: "/".into(),
            layer: Some(layer.path().to_path_buf()),
        };
        let (code, out, err) = run(&spec, "/opt/true && echo ran").await;
        assert_eq!((code, out.as_str()), (0, "ran\n"), "{err}");
    }
}
