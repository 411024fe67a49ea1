//! Real Linux root filesystems and local Docker images for tests, built on this machine.
//!
//! The agent ships into images that users choose: old ones (Debian bullseye, glibc 2.31), new
//! ones (trixie, glibc 2.41) and images with no C library at all. Tests that care about what
//! runs where (symbol versions, library folders, a static binary) need those systems for real,
//! without a registry to pull from:
//!
//! * [`debian_root`]: a Debian root filesystem made with `debootstrap --variant=minbase` from
//!   `http://deb.debian.org/debian` (or `$ORCH_TESTKIT_DEBIAN_MIRROR`), for `chroot` or as the
//!   content of [`debian_image`];
//! * [`debian_image`]: that root imported into the local Docker engine as
//!   `orch-testkit/debian:<release>`;
//! * [`static_root`] / [`static_image`]: a glibc-less system holding only a static busybox
//!   (`orch-testkit/static:busybox`);
//! * [`glibc_version`]: the glibc a root filesystem carries, for assertions and messages.
//!
//! Roots are cached under [`crate::gpu::cache_dir`]`/rootfs/`, built in a temporary folder and
//! renamed when complete, under a `flock` so that parallel test processes build each one once;
//! images are reused while their tag exists. Building needs root (debootstrap, device nodes)
//! and the network; a missing `debootstrap` or busybox-static is installed with apt-get.
//!
//! Slow tests gate themselves with [`require_tooling`]: they skip when debootstrap or Docker
//! are unavailable, except under CI, where they fail ([`crate::skip`]).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read as _};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::gpu::{cache_dir, run_checked, tail, temp_name, FileLock};

/// The `PATH` the images get (Docker's default for Linux containers).
pub const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The tag of [`static_image`].
pub const STATIC_IMAGE: &str = "orch-testkit/static:busybox";

const DEFAULT_MIRROR: &str = "http://deb.debian.org/debian";

/// Releases whose systems (and Docker's official images) do not have a merged `/usr`.
const UNMERGED_USR: &[&str] = &["jessie", "stretch", "buster", "bullseye"];

/// Skip (outside CI: print why, return `false`) or fail (under CI: panic) when a test's
/// tooling is missing; `true` when it is there. [`crate::skip::require`] for the running test.
#[track_caller]
pub fn require_tooling(check: Result<(), String>) -> bool {
    crate::skip::require(&crate::skip::current_test(), check).is_some()
}

/// Whether [`debian_root`] can work here: root, and `debootstrap` or `apt-get` to install it.
pub fn debootstrap_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("debootstrap needs root".into());
    }
    if find_program("debootstrap").is_some() || find_program("apt-get").is_some() {
        Ok(())
    } else {
        Err("neither debootstrap nor apt-get is installed".into())
    }
}

/// Whether a Docker engine answers (`docker info`).
pub fn docker_available() -> Result<(), String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "docker info: {}",
            tail(&String::from_utf8_lossy(&o.stderr), 300)
        )),
        Err(e) => Err(format!("docker: {e}")),
    }
}

/// The folders of programs, sbin ones included (not on a non-root `PATH`).
const SYSTEM_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// `name` on `PATH` or in the sbin folders (not on a non-root `PATH`).
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SYSTEM_DIRS.map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// `PATH` for the tools we run: the caller's plus the sbin folders.
fn tool_path() -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect();
    for d in SYSTEM_DIRS {
        if !dirs.iter().any(|x| x == Path::new(d)) {
            dirs.push(d.into());
        }
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| IMAGE_PATH.into())
}

/// `apt-get install -y PACKAGE` (after an `apt-get update` when the first try fails).
fn apt_install(package: &str) -> io::Result<()> {
    let install = || {
        run_checked(
            Command::new("apt-get")
                .args([
                    "-o",
                    "DPkg::Lock::Timeout=300",
                    "install",
                    "-y",
                    "--no-install-recommends",
                    package,
                ])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .env("PATH", tool_path()),
        )
    };
    if install().is_ok() {
        return Ok(());
    }
    run_checked(
        Command::new("apt-get")
            .args(["-o", "DPkg::Lock::Timeout=300", "update"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("PATH", tool_path()),
    )?;
    install()
        .map(|_| ())
        .map_err(|e| io::Error::new(e.kind(), format!("installing {package}: {e}")))
}

fn debootstrap_program() -> io::Result<PathBuf> {
    if let Some(p) = find_program("debootstrap") {
        return Ok(p);
    }
    apt_install("debootstrap")?;
    find_program("debootstrap").ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "debootstrap not found after apt-get install",
        )
    })
}

/// A release name is one plain word (it names a cache folder and an image tag).
fn check_release(release: &str) -> io::Result<()> {
    if release.is_empty()
        || release.len() > 64
        || !release
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("release {release:?} is not a Debian codename such as bullseye"),
        ));
    }
    Ok(())
}

/// A Debian root filesystem for `release` (`bullseye`, `bookworm`, `trixie`, ...), made by
/// `debootstrap --variant=minbase <release> DIR http://deb.debian.org/debian` (mirror:
/// `$ORCH_TESTKIT_DEBIAN_MIRROR`; releases older than bullseye live on
/// `http://archive.debian.org/debian`), cached as `cache_dir()/rootfs/<release>`. Releases up to
/// bullseye get `--no-merged-usr`, as their real systems and Docker's images have separate
/// `/lib` and `/usr/lib`.
///
/// Built into a temporary folder and renamed when complete, under a `flock`, so parallel test
/// processes build it once and never see half a root. Downloaded `.deb` files and apt lists
/// are removed afterwards (as in Docker's official images). Needs root and the network;
/// installs debootstrap with `apt-get` when missing. debootstrap's log is kept next to the root
/// (`rootfs/<release>.log`) and its tail is in the error when it fails.
pub fn debian_root(release: &str) -> io::Result<PathBuf> {
    debian_root_with(release, &[])
}

/// The name of a root of `release` with `packages` added (`bookworm+git+python3`).
fn flavour(release: &str, packages: &[&str]) -> String {
    std::iter::once(release)
        .chain(packages.iter().copied())
        .collect::<Vec<_>>()
        .join("+")
}

/// [`debian_root`] with `packages` installed too (debootstrap's `--include`), for cells that
/// need programs a GPU image has (`git`, `python3`, `python3-numpy`): cached as
/// `rootfs/<release>+<package>+...`.
pub fn debian_root_with(release: &str, packages: &[&str]) -> io::Result<PathBuf> {
    check_release(release)?;
    for p in packages {
        check_release(p)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("package {p:?}")))?;
    }
    let name = flavour(release, packages);
    let parent = cache_dir()?.join("rootfs");
    let root = parent.join(&name);
    if root.is_dir() {
        return Ok(root);
    }
    fs::create_dir_all(&parent)?;
    let _lock = FileLock::acquire(&parent.join(format!(".{name}.lock")))?;
    if root.is_dir() {
        return Ok(root);
    }
    // Holding the lock: any temporary folder of this release is left from a build that died.
    let stale = format!(".{name}.tmp-");
    for entry in fs::read_dir(&parent)?.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&stale) {
            remove_root(&entry.path())?;
        }
    }
    let debootstrap = debootstrap_program()?;
    let tmp = parent.join(temp_name(&name));
    let log_path = parent.join(format!("{name}.log"));
    let log = File::create(&log_path)?;
    let mirror = std::env::var("ORCH_TESTKIT_DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty());
    let mut cmd = Command::new(&debootstrap);
    cmd.arg("--variant=minbase");
    // Images of releases before bookworm keep /bin, /lib ... apart from /usr; debootstrap 1.0.128+
    // would merge them.
    if UNMERGED_USR.contains(&release) {
        cmd.arg("--no-merged-usr");
    }
    if !packages.is_empty() {
        cmd.arg(format!("--include={}", packages.join(",")));
    }
    cmd.arg(release)
        .arg(&tmp)
        .arg(mirror.as_deref().unwrap_or(DEFAULT_MIRROR));
    // An older debootstrap does not know newer codenames: they build like sid.
    if !Path::new("/usr/share/debootstrap/scripts").join(release).exists() {
        cmd.arg("/usr/share/debootstrap/scripts/sid");
    }
    let status = cmd
        .env("PATH", tool_path())
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", debootstrap.display())))?;
    if !status.success() {
        let _ = remove_root(&tmp);
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        return Err(io::Error::other(format!(
            "debootstrap {release} failed ({status}); log {}: {}",
            log_path.display(),
            tail(&log, 1500)
        )));
    }
    for dir in ["var/cache/apt/archives", "var/lib/apt/lists"] {
        if let Ok(entries) = fs::read_dir(tmp.join(dir)) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    fs::rename(&tmp, &root)?;
    Ok(root)
}

/// Remove a (possibly half-built) root: unmount what a dead debootstrap left mounted in it
/// (`proc`, `sys`), then delete it.
fn remove_root(dir: &Path) -> io::Result<()> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount)
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        if let Ok(c) = CString::new(m.as_bytes()) {
            // SAFETY: umount2 with a valid NUL-terminated path; failure is handled by the removal below.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io::Error::new(e.kind(), format!("remove {}: {e}", dir.display())))
        }
        _ => Ok(()),
    }
}

/// `/proc/self/mountinfo` escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn image_exists(tag: &str) -> io::Result<bool> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", tag])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("docker: {e}")))?;
    Ok(out.status.success())
}

/// `tar -C root -c . | docker import --change ... - tag`.
fn import_root(root: &Path, tag: &str, changes: &[String]) -> io::Result<()> {
    let tar_err = cache_dir()?.join(temp_name("tar-stderr"));
    let mut tar = Command::new("tar")
        .args([
            "--numeric-owner",
            "--exclude=./dev/*",
            "--exclude=./proc/*",
            "--exclude=./sys/*",
            "-C",
        ])
        .arg(root)
        .args(["-c", "."])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(&tar_err)?)
        .spawn()
        .map_err(|e| io::Error::new(e.kind(), format!("tar: {e}")))?;
    let Some(stream) = tar.stdout.take() else {
        return Err(io::Error::other("tar: no stdout"));
    };
    let mut import = Command::new("docker");
    import.arg("import");
    for c in changes {
        import.arg("--change").arg(c);
    }
    let imported = import.arg("-").arg(tag).stdin(Stdio::from(stream)).output();
    let tar_status = tar.wait();
    let tar_stderr = fs::read_to_string(&tar_err).unwrap_or_default();
    let _ = fs::remove_file(&tar_err);
    let imported = imported.map_err(|e| io::Error::new(e.kind(), format!("docker import: {e}")))?;
    if !imported.status.success() {
        return Err(io::Error::other(format!(
            "docker import {tag}: {}: {}",
            imported.status,
            tail(&String::from_utf8_lossy(&imported.stderr), 1000)
        )));
    }
    match tar_status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(io::Error::other(format!(
            "tar -C {}: {s}: {}",
            root.display(),
            tail(&tar_stderr, 1000)
        ))),
        Err(e) => Err(io::Error::new(e.kind(), format!("tar: {e}"))),
    }
}

/// Import `root` as `tag` unless the tag exists; one process at a time.
fn ensure_image(
    tag: &str,
    root: impl FnOnce() -> io::Result<PathBuf>,
    changes: &[String],
) -> io::Result<String> {
    if image_exists(tag)? {
        return Ok(tag.to_string());
    }
    let lock_name: String = tag
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let _lock = FileLock::acquire(&cache_dir()?.join("images").join(format!("{lock_name}.lock")))?;
    if image_exists(tag)? {
        return Ok(tag.to_string());
    }
    let root = root()?;
    import_root(&root, tag, changes)?;
    Ok(tag.to_string())
}

/// A local Docker image `orch-testkit/debian:<release>` holding [`debian_root`]`(release)`
/// (`tar -C ROOT -c . | docker import - TAG`, with `PATH` set as in Docker's images, `CMD
/// ["bash"]` and a label `org.orch-testkit.glibc`), reused while the tag exists.
pub fn debian_image(release: &str) -> io::Result<String> {
    debian_image_with(release, &[])
}

/// [`debian_image`] of [`debian_root_with`]: `orch-testkit/debian:<release>-<package>-...`.
pub fn debian_image_with(release: &str, packages: &[&str]) -> io::Result<String> {
    check_release(release)?;
    let tag = format!(
        "orch-testkit/debian:{}",
        flavour(release, packages).replace('+', "-")
    );
    if image_exists(&tag)? {
        return Ok(tag);
    }
    let root = debian_root_with(release, packages)?;
    let changes = [
        format!("ENV PATH={IMAGE_PATH}"),
        r#"CMD ["bash"]"#.to_string(),
        format!(
            "LABEL org.orch-testkit.glibc={}",
            glibc_version(&root).unwrap_or_default()
        ),
    ];
    ensure_image(&tag, || Ok(root), &changes)
}

/// A static busybox: `/bin/busybox` of this machine when it is static (Debian's
/// busybox-static, installed with apt-get when there is no busybox); when this machine's
/// busybox is dynamic, busybox-static's `.deb` is downloaded and unpacked into the cache instead
/// of replacing the installed package.
fn static_busybox() -> io::Result<PathBuf> {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        if is_static_elf(Path::new(p)) {
            return Ok(p.into());
        }
    }
    if !Path::new("/bin/busybox").exists() && !Path::new("/usr/bin/busybox").exists() {
        apt_install("busybox-static")?;
        if is_static_elf(Path::new("/bin/busybox")) {
            return Ok("/bin/busybox".into());
        }
    }
    let dir = cache_dir()?.join("busybox-static");
    let bin = dir.join("bin/busybox");
    if is_static_elf(&bin) {
        return Ok(bin);
    }
    let work = cache_dir()?.join(temp_name("busybox-static"));
    fs::create_dir_all(&work)?;
    let result = (|| {
        run_checked(
            Command::new("apt-get")
                .args(["download", "busybox-static"])
                .current_dir(&work)
                .env("PATH", tool_path()),
        )?;
        let deb = fs::read_dir(&work)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| io::Error::other("apt-get download busybox-static: no .deb"))?;
        let unpacked = work.join("root");
        run_checked(
            Command::new("dpkg-deb")
                .arg("-x")
                .arg(&deb)
                .arg(&unpacked)
                .env("PATH", tool_path()),
        )?;
        let _ = fs::remove_dir_all(&dir);
        fs::rename(&unpacked, &dir)
    })();
    let _ = fs::remove_dir_all(&work);
    result?;
    if is_static_elf(&bin) {
        Ok(bin)
    } else {
        Err(io::Error::other(format!(
            "{} is not a static executable",
            bin.display()
        )))
    }
}

/// An x86-64/aarch64 ELF executable without a program interpreter (`PT_INTERP`): static.
fn is_static_elf(path: &Path) -> bool {
    let Ok(mut f) = File::open(path) else { return false };
    let mut head = vec![0u8; 4096];
    let Ok(n) = f.read(&mut head) else { return false };
    head.truncate(n);
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return false; // only 64-bit little-endian ELF
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(head[32..40].try_into().unwrap_or([0; 8])) as usize;
    let (phentsize, phnum) = (u16_at(54), u16_at(56));
    if phentsize < 4 || phoff + phentsize * phnum > head.len() {
        return false;
    }
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes([head[o], head[o + 1], head[o + 2], head[o + 3]]) != 3
        // PT_INTERP
    })
}

/// A root filesystem without any C library: a static busybox at `/bin/busybox`, a symlink in
/// `/bin` for each of its applets (`/bin/sh`, `/bin/ls`, ...), and empty `/tmp` (1777), `/proc`,
/// `/dev`, `/etc`. For `chroot` use, and the content of [`static_image`]. Cached as
/// `cache_dir()/rootfs/static-busybox-<hash of the busybox binary>`.
pub fn static_root() -> io::Result<PathBuf> {
    let busybox = static_busybox()?;
    let bytes = fs::read(&busybox)?;
    let hash = crate::hashing::sha256_hex(&bytes);
    let parent = cache_dir()?.join("rootfs");
    let root = parent.join(format!("static-busybox-{}", &hash[..16]));
    if root.is_dir() {
        return Ok(root);
    }
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(temp_name("static-busybox"));
    let result = (|| {
        for d in ["bin", "tmp", "proc", "dev", "etc"] {
            fs::create_dir_all(tmp.join(d))?;
        }
        fs::set_permissions(tmp.join("tmp"), fs::Permissions::from_mode(0o1777))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::write(tmp.join("bin/busybox"), &bytes)?;
        fs::set_permissions(tmp.join("bin/busybox"), fs::Permissions::from_mode(0o755))?;
        let list = run_checked(Command::new(&busybox).arg("--list"))?;
        for applet in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
            if applet.is_empty() || applet == "busybox" || applet.contains('/') || applet.starts_with('.') {
                continue;
            }
            symlink("busybox", tmp.join("bin").join(applet))?;
        }
        if fs::symlink_metadata(tmp.join("bin/sh")).is_err() {
            return Err(io::Error::other(format!(
                "{} has no sh applet",
                busybox.display()
            )));
        }
        Ok(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    match fs::rename(&tmp, &root) {
        Ok(()) => Ok(root),
        // Another process was first: same binary, same root.
        Err(_) if root.is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(root)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// A local Docker image with no C library, [`STATIC_IMAGE`] (`orch-testkit/static:busybox`):
/// [`static_root`] imported as a single layer (the equivalent of `FROM scratch` + `COPY`), with
/// `PATH` set and `CMD ["/bin/sh"]`; reused while the tag exists.
pub fn static_image() -> io::Result<String> {
    let changes = [format!("ENV PATH={IMAGE_PATH}"), r#"CMD ["/bin/sh"]"#.to_string()];
    ensure_image(STATIC_IMAGE, static_root, &changes)
}

/// The glibc version (upstream, e.g. `"2.31"`) a root filesystem carries: the `libc6` entry of
/// `var/lib/dpkg/status` (Debian, Ubuntu), else the `release version` banner inside its
/// `libc.so.6`; `None` when it has no glibc (a static or musl root). Nothing in the root runs.
pub fn glibc_version(root: &Path) -> Option<String> {
    if let Ok(status) = fs::read_to_string(root.join("var/lib/dpkg/status")) {
        for para in status.split("\n\n") {
            let field = |name: &str| {
                para.lines()
                    .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
                    .map(str::trim)
            };
            if field("Package") != Some("libc6")
                || field("Status").is_some_and(|s| !s.ends_with(" installed"))
            {
                continue;
            }
            if let Some(v) = field("Version") {
                return Some(upstream_version(v).to_string());
            }
        }
    }
    for lib in [
        "usr/lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libc.so.6",
        "usr/lib/aarch64-linux-gnu/libc.so.6",
        "usr/lib64/libc.so.6",
        "lib64/libc.so.6",
        "usr/lib/libc.so.6",
        "lib/libc.so.6",
    ] {
        // A symlink with an absolute target would leave the root: resolve it inside.
        let Some(path) = resolve_in_root(root, lib) else {
            continue;
        };
        let Ok(bytes) = fs::read(path) else { continue };
        let needle = b"release version ";
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            let v: String = bytes[at + needle.len()..]
                .iter()
                .take_while(|b| b.is_ascii_digit() || **b == b'.')
                .map(|b| *b as char)
                .collect();
            let v = v.trim_end_matches('.');
            if !v.is_empty() {
                return Some(v.to_string());
            }
        }
    }
    None
}

/// `1:2.31-13+deb11u11` → `2.31`.
fn upstream_version(v: &str) -> &str {
    let v = v.split_once(':').map_or(v, |(_, rest)| rest);
    v.split('-').next().unwrap_or(v)
}

/// Follow symlinks of `rel` inside `root` (absolute targets are taken relative to `root`).
fn resolve_in_root(root: &Path, rel: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    let mut pending: Vec<std::ffi::OsString> = Path::new(rel).iter().rev().map(|c| c.to_owned()).collect();
    let mut hops = 0;
    while let Some(c) = pending.pop() {
        if c == "/" || c == "." {
            continue;
        }
        if c == ".." {
            path.pop();
            continue;
        }
        let next = path.join(&c);
        match fs::symlink_metadata(root.join(&next)) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return None;
                }
                let target = fs::read_link(root.join(&next)).ok()?;
                if target.as_os_str().as_bytes().first() == Some(&b'/') {
                    path = PathBuf::new();
                }
                pending.extend(target.iter().rev().map(|c| c.to_owned()));
            }
            Ok(_) => path = next,
            Err(_) => return None,
        }
    }
    Some(root.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn docker_sh(image: &str, script: &str) -> std::process::Output {
        Command::new("docker")
            .args(["run", "--rm", image, "/bin/sh", "-c", script])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn du(path: &Path) -> String {
        Command::new("du")
            .args(["-sh", "--apparent-size"])
            .arg(path)
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .next()
                    .unwrap_or("?")
                    .to_string()
            })
            .unwrap_or_default()
    }

    #[test]
    fn glibc_version_reads_dpkg_status_and_libc_banner() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(glibc_version(root), None);
        fs::create_dir_all(root.join("var/lib/dpkg")).unwrap();
        fs::write(
            root.join("var/lib/dpkg/status"),
            "Package: libc-bin\nStatus: install ok installed\nVersion: 2.31-13+deb11u11\n\n\
             Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.31-13+deb11u11\n",
        )
        .unwrap();
        assert_eq!(glibc_version(root).as_deref(), Some("2.31"));

        let other = tempfile::tempdir().unwrap();
        let root = other.path();
        fs::create_dir_all(root.join("usr/lib64")).unwrap();
        fs::write(
            root.join("usr/lib64/libc-2.17.so"),
            b"\0GNU C Library (GNU libc) stable release version 2.17, by Roland\0",
        )
        .unwrap();
        // An absolute link, as old distributions have: resolved inside the root, not on this host.
        symlink("/usr/lib64/libc-2.17.so", root.join("usr/lib64/libc.so.6")).unwrap();
        symlink("usr/lib64", root.join("lib64")).unwrap();
        assert_eq!(glibc_version(root).as_deref(), Some("2.17"));
        assert_eq!(upstream_version("1:2.41-12"), "2.41");
    }

    #[test]
    fn static_busybox_is_recognised() {
        assert!(!is_static_elf(Path::new("/bin/ls")) || !Path::new("/bin/ls").exists());
        assert!(!is_static_elf(Path::new("/nonexistent")));
    }

    #[test]
    fn debian_roots_have_their_loader_and_glibc() {
        if !require_tooling(debootstrap_available()) {
            return;
        }
        for (release, glibc) in [("bullseye", "2.31"), ("trixie", "2.41")] {
            let t = Instant::now();
            let root = debian_root(release).unwrap();
            eprintln!(
                "{release}: {} in {:.0?}, {}",
                root.display(),
                t.elapsed(),
                du(&root)
            );
            let loader = ["lib64/ld-linux-x86-64.so.2", "usr/lib64/ld-linux-x86-64.so.2"]
                .iter()
                .any(|l| fs::symlink_metadata(root.join(l)).is_ok());
            assert!(loader, "{release}: no ld-linux-x86-64.so.2 in {}", root.display());
            assert_eq!(glibc_version(&root).as_deref(), Some(glibc), "{release}");
            // Cached.
            assert_eq!(debian_root(release).unwrap(), root);
        }
    }

    #[test]
    fn images_run_a_shell() {
        if !require_tooling(debootstrap_available().and(docker_available())) {
            return;
        }
        for release in ["bullseye", "trixie"] {
            let t = Instant::now();
            let image = debian_image(release).unwrap();
            eprintln!("{image}: ready in {:.0?}", t.elapsed());
            assert_eq!(image, format!("orch-testkit/debian:{release}"));
            let out = docker_sh(&image, "echo ok; ls /lib/x86_64-linux-gnu/libc.so.6");
            assert!(out.status.success(), "{image}: {out:?}");
            assert!(
                String::from_utf8_lossy(&out.stdout).starts_with("ok\n"),
                "{image}: {out:?}"
            );
        }
        let t = Instant::now();
        let image = static_image().unwrap();
        eprintln!("{image}: ready in {:.0?}", t.elapsed());
        let out = docker_sh(&image, "echo ok; ls /lib /usr/lib /lib64 2>&1");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("ok\n"),
            "{image}: {out:?}"
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("No such file"),
            "no C library: {out:?}"
        );
        let root = static_root().unwrap();
        assert_eq!(glibc_version(&root), None);
        assert!(is_static_elf(&root.join("bin/busybox")));
        assert_eq!(fs::read_link(root.join("bin/sh")).unwrap(), Path::new("busybox"));
    }
}
