//! The cell's own cgroup (cgroup v2), where cgroups are writable.
//!
//! At start the agent creates `orch-cell.<agent mark>` under its own cgroup
//! (the delegated cgroup of an unprivileged agent, or any cgroup when it runs
//! as root; the cgroup2 mount is found in `/proc/self/mountinfo`, wherever it
//! is: `/sys/fs/cgroup` or a hybrid host's `/sys/fs/cgroup/unified`). Every
//! workload process joins it between `fork` and `exec` ([`CellCgroup::join_in_child`]),
//! so whatever a workload starts is in it, however it detaches (`setsid`,
//! double forks, a cleared environment). At the end of the cell, and in the
//! guard when the agent dies, [`CellCgroup::kill_all`] kills the whole cgroup at
//! once with `cgroup.kill` (Linux 5.14+; before that: freeze, SIGKILL each
//! pid, thaw) and waits until it is empty; the agent then removes it.
//!
//! Only core cgroup files are used (`cgroup.procs`, `cgroup.kill`,
//! `cgroup.freeze`, `cgroup.events`), no controller, so the "no internal
//! processes" rule never applies. Where the cgroup cannot be made (cgroup v1
//! only, read-only, not delegated) there is none, and the marks and the guard
//! of [`crate::reaper`] do the work alone. The cgroup alone does not survive
//! a SIGKILL of the agent and its guard: the PID namespace of the cell
//! launcher ([`crate::cellinit`]) does that. Through the launcher, the
//! launcher joins the cgroup and the namespace's init and the program
//! inherit it.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One cell's cgroup.
#[derive(Debug)]
pub struct CellCgroup {
    dir: PathBuf,
    /// `<dir>/cgroup.procs`, ready for [`CellCgroup::join_in_child`] (no
    /// allocation after `fork`).
    procs: CString,
}

static CELL: OnceLock<Option<CellCgroup>> = OnceLock::new();

/// Create the cell's cgroup (once; later calls return the first answer).
/// `Err` says why there is none.
pub(crate) fn setup(name: &str) -> Result<&'static CellCgroup, String> {
    let mut why = String::new();
    let cell = CELL.get_or_init(|| match create(name) {
        Ok(c) => Some(c),
        Err(e) => {
            why = e;
            None
        }
    });
    cell.as_ref().ok_or(if why.is_empty() {
        "no cgroup for this cell".to_string()
    } else {
        why
    })
}

/// The cell's cgroup, if [`setup`] made one.
pub fn cell() -> Option<&'static CellCgroup> {
    CELL.get().and_then(Option::as_ref)
}

fn create(name: &str) -> Result<CellCgroup, String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("mountinfo: {e}"))?;
    let (mount, root) = cgroup2_mount(&mountinfo).ok_or("no cgroup2 filesystem mounted")?;
    let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
    let path = own_cgroup(&own).ok_or("not in a cgroup v2 hierarchy")?;
    let dir = own_dir(&mount, &root, &path).join(name);
    std::fs::create_dir(&dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let procs = dir.join("cgroup.procs");
    let usable = std::fs::OpenOptions::new().write(true).open(&procs).is_ok()
        && (dir.join("cgroup.kill").exists() || dir.join("cgroup.freeze").exists());
    let procs_c = CString::new(procs.as_os_str().as_encoded_bytes()).ok();
    match (usable, procs_c) {
        (true, Some(procs)) => Ok(CellCgroup { dir, procs }),
        _ => {
            let _ = std::fs::remove_dir(&dir);
            Err(format!("`{}` is not writable", procs.display()))
        }
    }
}

/// The first cgroup2 mount: (mount point, root of the mount), from
/// `/proc/self/mountinfo` (`ID PARENT MAJ:MIN ROOT POINT OPTS ... - TYPE SRC OPTS`).
fn cgroup2_mount(mountinfo: &str) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let f: Vec<&str> = pre.split_whitespace().collect();
        Some((PathBuf::from(unescape(f.get(4)?)), unescape(f.get(3)?)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = |c: u8| u32::from(c - b'0');
            // At most `\377` in mountinfo; a larger value is not ours to keep.
            out.push((v(b[i + 1]) * 64 + v(b[i + 2]) * 8 + v(b[i + 3])) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup v2 path of this process (`0::/a/b` in `/proc/self/cgroup`).
fn own_cgroup(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Our cgroup's folder: the mount point plus our path below the mount's root.
fn own_dir(mount: &Path, root: &str, path: &str) -> PathBuf {
    let rel = if root == "/" {
        path
    } else {
        path.strip_prefix(root).unwrap_or(path)
    };
    mount.join(rel.trim_start_matches('/'))
}

impl CellCgroup {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Move the calling process into the cgroup. Async-signal-safe (only
    /// `open`, `write`, `close`): for a `pre_exec` hook. `false` when it failed.
    pub fn join_in_child(&self) -> bool {
        // SAFETY: raw syscalls on a NUL-terminated path and a static buffer.
        unsafe {
            let fd = libc::open(self.procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return false;
            }
            let ok = libc::write(fd, b"0\n".as_ptr().cast(), 2) == 2;
            libc::close(fd);
            ok
        }
    }

    /// The pids in the cgroup now (as this process's `/proc` numbers them).
    pub fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether any process is still in the cgroup (`cgroup.events`).
    fn populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(t) => t.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => !self.pids().is_empty(),
        }
    }

    /// SIGKILL every process in the cgroup and wait (at most 5 s) until it
    /// is empty. Returns the pids that were in it.
    pub fn kill_all(&self) -> Vec<i32> {
        let pids = self.pids();
        if pids.is_empty() && !self.populated() {
            return pids;
        }
        if std::fs::write(self.dir.join("cgroup.kill"), "1").is_err() {
            // Before Linux 5.14: freeze so nothing forks while we kill.
            let _ = std::fs::write(self.dir.join("cgroup.freeze"), "1");
            for pid in self.pids() {
                // SAFETY: plain syscall; ESRCH is fine.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = std::fs::write(self.dir.join("cgroup.freeze"), "0");
        }
        let until = Instant::now() + Duration::from_secs(5);
        while self.populated() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        pids
    }

    /// Remove the (empty) cgroup.
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount_and_our_folder() {
        let mi = "25 30 0:23 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                  31 30 0:29 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n";
        let (mount, root) = cgroup2_mount(mi).unwrap();
        assert_eq!(mount, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(root, "/");
        let own = own_cgroup("4:memory:/x\n0::/user.slice/a b.scope\n").unwrap();
        assert_eq!(
            own_dir(&mount, &root, &own),
            Path::new("/sys/fs/cgroup/unified/user.slice/a b.scope")
        );
        assert_eq!(own_dir(Path::new("/c"), "/k", "/k/pod"), Path::new("/c/pod"));
        assert_eq!(own_dir(Path::new("/c"), "/", "/"), Path::new("/c"));
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert!(cgroup2_mount("25 30 0:23 / /x rw - cgroup cgroup rw\n").is_none());
    }
}
