//! The cell launcher: every workload process runs in a PID namespace of its
//! own, so that no process of it survives the SIGKILL of every orch process
//! at once (`pkill -9 orch`).
//!
//! The agent is multi-threaded, and a process that has unshared a PID
//! namespace can no longer create threads (`clone(CLONE_THREAD)` is `EINVAL`
//! once `pid_for_children` is not its own namespace), so the agent does not
//! make the namespace itself: it starts each workload process through its own
//! binary (`/proc/self/exe`, which is also right for the memfd `exec` of
//! `launch.rs` and for `orch agent`), as the hidden sub-command
//! `cell-init [--user] -- PROGRAM ARGS...` ([`dispatch`], called first thing
//! by `orch-agent`'s and `orch`'s `main`). Environment, working folder,
//! stdio, process group, cgroup and mark are given to the launcher exactly as
//! they were given to the program, and the launcher passes them on.
//!
//! - the **launcher** (`orch-cell`, a fresh single-threaded process, the
//!   agent's child, `PR_SET_PDEATHSIG(SIGKILL)` bound to the agent):
//!   `unshare(CLONE_NEWPID | CLONE_NEWNS)` (as root or with `CAP_SYS_ADMIN`;
//!   otherwise with `CLONE_NEWUSER`, the uid and gid mapped to themselves),
//!   then forks the namespace's init, forwards to it the signals the agent
//!   sends (`SIGTERM`, `SIGINT`, `SIGHUP`, `SIGQUIT`, `SIGUSR1`, `SIGUSR2`),
//!   waits for it and ends the way the program ended (its exit code, or the
//!   same signal, without a core file), so the agent classifies exit codes,
//!   signals and OOM kills as before;
//! - the **init** (`orch-cell`, PID 1 of the namespace, `PR_SET_PDEATHSIG`
//!   bound to the launcher, checked against the race of a launcher already
//!   gone): its mounts become slaves of the host's (the host's later mounts
//!   still show, none of ours leaks out), a fresh `proc` on `/proc` so that
//!   `getpid()` and `/proc/<pid>` agree, then it forks and `exec`s the
//!   program in a process group of its own, forwards the signals to that
//!   group, reaps every process of the namespace, and when the program ends it
//!   counts what it left outside its group, kills the rest of the namespace
//!   and hands the program's wait status to the launcher.
//!
//! When PID 1 of a PID namespace dies, the kernel SIGKILLs every process in
//! it. So `pkill -9 orch` (which matches `orch`, `orch-agent`, `orch-guard`
//! and `orch-cell`), a SIGKILL of the agent alone (the launcher's
//! `PR_SET_PDEATHSIG`), or a SIGKILL of the launcher (the init's) ends every
//! process of the workload, however it detached (`setsid`, double forks, a
//! dropped mark). The agent's SIGKILL of the launcher's process group ends
//! the namespace the same way.
//!
//! The launcher tells the agent how it went on a pipe (`ORCH_CELL_REPORT_FD`,
//! taken out of the environment before the program runs): the program
//! started, or could not be `exec`ed (the agent's spawn then fails with the
//! same error, as a direct spawn would), or ran directly (and why); at the
//! end, how many processes it left outside its process group.
//!
//! Where no namespace can be made ([`mode`]: a container without
//! `CAP_SYS_ADMIN`, whose seccomp profile refuses user namespaces), the
//! launcher is not used at all and the program is spawned directly, as
//! before; where the agent is PID 1 (a container) it is not needed. The
//! decision is made once per agent by a probe in a child (`unshare`, fork,
//! mount `/proc`), and `ORCH_CELL_PIDNS=0` (the agent's environment or the
//! task's `env`) turns the launcher off. [`containment`] says which mode was
//! in force.
//!
//! NVML reports host pids: the agent keeps seeing the launcher's tree in its
//! own `/proc` (the host's), and [`Spawned::main_pid`] is the program's pid
//! there. The init's end waits until every process of the namespace is gone
//! (their files, GPU ones included, closed) before the launcher ends.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The hidden sub-command that runs the launcher.
pub const SUBCOMMAND: &str = "cell-init";
/// `0` (or `false`, `no`, `off`) in the agent's environment or the task's
/// `env` turns the launcher off: workload processes are spawned directly.
pub const PIDNS_ENV: &str = "ORCH_CELL_PIDNS";
/// The launcher's report pipe (a descriptor number), for the launcher only.
const REPORT_FD_ENV: &str = "ORCH_CELL_REPORT_FD";
/// The launcher is used where it can be. Off: every workload process is
/// spawned directly, as before the launcher existed.
const ENABLED: bool = true;
/// `comm` of the launcher and the init (what `pkill orch` matches).
const LAUNCHER_NAME: &CStr = c"orch-cell";
/// Signals the launcher and the init pass on to the program's process group.
const FORWARDED: [libc::c_int; 6] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// How this agent starts workload processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// Through the launcher, in a PID namespace; `user`: inside a user
    /// namespace that maps our uid and gid to themselves (no root here).
    Namespace { user: bool },
    /// Directly: the agent is PID 1 (a container), so the kernel already
    /// ends every process when the agent dies.
    AgentIsInit,
    /// Directly, and why no namespace.
    Direct(String),
}

static MODE: OnceLock<Mode> = OnceLock::new();

/// How workload processes are started, decided on the first call (a probe
/// in a child: call it before threads start where possible).
pub fn mode() -> &'static Mode {
    MODE.get_or_init(decide)
}

fn opted_out(v: Option<&OsStr>) -> bool {
    v.map(|v| v.to_string_lossy().trim().to_ascii_lowercase())
        .is_some_and(|v| matches!(v.as_str(), "0" | "false" | "no" | "off"))
}

/// Does the task's `env` turn the launcher off?
pub fn opted_out_by(task_env: Option<&str>) -> bool {
    opted_out(task_env.map(OsStr::new))
}

fn decide() -> Mode {
    if !ENABLED {
        return Mode::Direct("the cell launcher is off in this build".into());
    }
    if opted_out(std::env::var_os(PIDNS_ENV).as_deref()) {
        return Mode::Direct(format!("`{PIDNS_ENV}=0`"));
    }
    if std::process::id() == 1 {
        return Mode::AgentIsInit;
    }
    if std::fs::metadata("/proc/self/exe").is_err() {
        return Mode::Direct("no `/proc/self/exe` to start the launcher from".into());
    }
    match probe(false) {
        Ok(()) => Mode::Namespace { user: false },
        Err(own) => match probe(true) {
            Ok(()) => Mode::Namespace { user: true },
            Err(user) => Mode::Direct(format!("{own}; in a user namespace: {user}")),
        },
    }
}

static NS_SPAWNS: AtomicU64 = AtomicU64::new(0);
static DIRECT_SPAWNS: AtomicU64 = AtomicU64::new(0);
/// Why the last direct spawn was direct.
static DIRECT_WHY: Mutex<String> = Mutex::new(String::new());

fn note_direct(why: &str) {
    DIRECT_SPAWNS.fetch_add(1, Ordering::Relaxed);
    if let Ok(mut w) = DIRECT_WHY.lock() {
        *w = why.to_string();
    }
}

/// How the workload processes of this cell were contained, for the
/// record's `info.containment` (the cgroup is added by [`crate::reaper`]).
pub fn containment() -> String {
    let ns = NS_SPAWNS.load(Ordering::Relaxed);
    let direct = DIRECT_SPAWNS.load(Ordering::Relaxed);
    let why = DIRECT_WHY.lock().map(|w| w.clone()).unwrap_or_default();
    let ns_name = match MODE.get() {
        Some(Mode::Namespace { user: true }) => "pid namespace (in a user namespace)",
        _ => "pid namespace",
    };
    match (ns, direct) {
        (0, 0) => match MODE.get() {
            Some(Mode::AgentIsInit) => "the agent is PID 1".into(),
            _ => "no workload process".into(),
        },
        (_, 0) => ns_name.into(),
        (0, _) => format!("process marks (no pid namespace: {why})"),
        (n, d) => format!(
            "{ns_name} for {n} of {} workload processes, process marks for the others ({why})",
            n + d
        ),
    }
}

/// A workload process the agent started.
pub struct Spawned {
    /// The process the agent waits for and signals: the launcher (the
    /// leader of the process group the agent kills), or the program.
    pub child: Child,
    /// The program's pid as the agent's `/proc` (and NVML) numbers it;
    /// the launcher's when the program was not found in time.
    pub main_pid: i32,
    report: Option<BufReader<std::fs::File>>,
}

impl Spawned {
    /// Once [`Spawned::child`] has ended: how many processes the program
    /// left outside its process group, which the namespace's init killed
    /// (0 when there was no init, or it did not get to say).
    pub fn left_outside_group(&mut self) -> usize {
        let Some(r) = self.report.as_mut() else {
            return 0;
        };
        // Every writer is gone once the launcher ended; non-blocking in case
        // a stray copy of the write end lives on elsewhere.
        // SAFETY: plain fcntl on a descriptor we own.
        unsafe {
            let fd = r.get_ref().as_raw_fd();
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let mut left = 0;
        let mut line = String::new();
        while matches!(r.read_line(&mut line), Ok(n) if n > 0) {
            if let Some(n) = line.trim().strip_prefix("left ") {
                left = n.parse().unwrap_or(0);
            }
            line.clear();
        }
        left
    }
}

/// Start `argv` as a workload process: through the launcher where
/// [`mode`] allows and `via_launcher` (the task did not opt out), else
/// directly. `configure` gives the command its environment, folder, stdio
/// and `pre_exec` hooks, the same either way.
pub fn spawn(
    argv: &[String],
    via_launcher: bool,
    configure: &dyn Fn(&mut Command),
) -> std::io::Result<Spawned> {
    let Some((program, args)) = argv.split_first() else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the command is empty",
        ));
    };
    let user = match (via_launcher, mode()) {
        (true, Mode::Namespace { user }) => *user,
        (false, _) => {
            note_direct(&format!("`{PIDNS_ENV}=0` in the task's env"));
            return spawn_direct(program, args, configure);
        }
        (true, Mode::AgentIsInit) => return spawn_direct(program, args, configure),
        (true, Mode::Direct(why)) => {
            note_direct(why);
            return spawn_direct(program, args, configure);
        }
    };
    let mut fds = [-1i32; 2];
    // SAFETY: plain syscall into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here only.
    let (read_end, write_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let w = write_end.as_raw_fd();
    let mut cmd = Command::new("/proc/self/exe");
    cmd.arg0(LAUNCHER_NAME.to_string_lossy().as_ref()).arg(SUBCOMMAND);
    if user {
        cmd.arg("--user");
    }
    cmd.arg("--").arg(program).args(args);
    configure(&mut cmd);
    cmd.env(REPORT_FD_ENV, w.to_string());
    // SAFETY: fcntl is async-signal-safe: the launcher inherits the write end.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(w, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let spawned = cmd.spawn();
    drop(write_end);
    let mut child = spawned?;
    let mut report = BufReader::new(std::fs::File::from(read_end));
    let mut line = String::new();
    let mut direct: Option<String> = None;
    let started = loop {
        line.clear();
        match report.read_line(&mut line) {
            Ok(0) | Err(_) => break false,
            Ok(_) => {}
        }
        let l = line.trim_end();
        if l == "started" {
            break true;
        }
        if let Some(why) = l.strip_prefix("direct ") {
            direct = Some(why.to_string());
        } else if let Some(e) = l.strip_prefix("exec-error ") {
            let _ = child.wait();
            return Err(std::io::Error::from_raw_os_error(
                e.parse().unwrap_or(libc::ENOEXEC),
            ));
        } else if let Some(msg) = l.strip_prefix("fail ") {
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "{msg} (`{PIDNS_ENV}=0` starts workloads without a PID namespace)"
            )));
        }
    };
    if !started {
        // The launcher `exec`ed the program itself (or ended first).
        note_direct(direct.as_deref().unwrap_or("the launcher ran the program itself"));
        return Ok(Spawned {
            main_pid: child.id() as i32,
            child,
            report: None,
        });
    }
    NS_SPAWNS.fetch_add(1, Ordering::Relaxed);
    let launcher = child.id() as i32;
    let main_pid = crate::reaper::namespace_main(launcher).unwrap_or(launcher);
    Ok(Spawned {
        child,
        main_pid,
        report: Some(report),
    })
}

fn spawn_direct(
    program: &str,
    args: &[String],
    configure: &dyn Fn(&mut Command),
) -> std::io::Result<Spawned> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    configure(&mut cmd);
    let child = cmd.spawn()?;
    Ok(Spawned {
        main_pid: child.id() as i32,
        child,
        report: None,
    })
}

// ---------------------------------------------------------------------------
// Namespaces: raw syscalls only (the probe runs them in a child of the agent)

/// A step of making the namespace that failed, and its errno.
#[derive(Clone, Copy)]
struct Fail {
    step: u32,
    errno: i32,
}

const STEPS: [&str; 8] = [
    "",
    "`unshare` of a PID and a mount namespace",
    "`setgroups` deny",
    "`uid_map`",
    "`gid_map`",
    "`fork` of the namespace's init",
    "making the mounts slaves of the host's",
    "mounting `/proc`",
];

impl Fail {
    const OK: Fail = Fail { step: 0, errno: 0 };

    fn bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.step.to_le_bytes());
        b[4..].copy_from_slice(&self.errno.to_le_bytes());
        b
    }

    fn from_bytes(b: [u8; 8]) -> Fail {
        let mut s = [0u8; 4];
        let mut e = [0u8; 4];
        s.copy_from_slice(&b[..4]);
        e.copy_from_slice(&b[4..]);
        Fail {
            step: u32::from_le_bytes(s),
            errno: i32::from_le_bytes(e),
        }
    }

    fn describe(self) -> String {
        let step = STEPS.get(self.step as usize).copied().unwrap_or("a step");
        format!("{step} failed: {}", std::io::Error::from_raw_os_error(self.errno))
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `U U 1` lines for `uid_map` and `gid_map`, made before any fork.
struct Maps {
    uid: CString,
    gid: CString,
}

fn maps() -> Maps {
    // SAFETY: plain syscalls without arguments.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    // Digits and spaces only: no NUL, so these cannot fail.
    Maps {
        uid: CString::new(format!("{uid} {uid} 1")).unwrap_or_default(),
        gid: CString::new(format!("{gid} {gid} 1")).unwrap_or_default(),
    }
}

/// Write `data` to `path`. Async-signal-safe.
fn write_file(path: &CStr, data: &[u8]) -> bool {
    // SAFETY: raw syscalls on a NUL-terminated path and a live buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let ok = libc::write(fd, data.as_ptr().cast(), data.len()) == data.len() as isize;
        libc::close(fd);
        ok
    }
}

/// Unshare a PID and a mount namespace (and a user namespace with `maps`).
/// Async-signal-safe; the caller must be single-threaded.
fn enter_namespaces(maps: Option<&Maps>) -> Result<(), Fail> {
    let mut flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS;
    if maps.is_some() {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: plain syscall.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(Fail {
            step: 1,
            errno: errno(),
        });
    }
    if let Some(m) = maps {
        // Kernels before 3.19 have no `setgroups` file, and need none.
        if !write_file(c"/proc/self/setgroups", b"deny") && errno() != libc::ENOENT {
            return Err(Fail {
                step: 2,
                errno: errno(),
            });
        }
        if !write_file(c"/proc/self/uid_map", m.uid.as_bytes()) {
            return Err(Fail {
                step: 3,
                errno: errno(),
            });
        }
        if !write_file(c"/proc/self/gid_map", m.gid.as_bytes()) {
            return Err(Fail {
                step: 4,
                errno: errno(),
            });
        }
    }
    Ok(())
}

/// In PID 1 of the new namespace: mounts that follow the host's without
/// leaking back, and a `/proc` of this PID namespace. Async-signal-safe.
fn make_proc() -> Result<(), Fail> {
    // SAFETY: plain syscalls with NUL-terminated constant strings.
    unsafe {
        if libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        ) != 0
        {
            return Err(Fail {
                step: 6,
                errno: errno(),
            });
        }
        if libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        ) != 0
        {
            return Err(Fail {
                step: 7,
                errno: errno(),
            });
        }
    }
    Ok(())
}

/// Read exactly `buf.len()` bytes (`false` on EOF or error first).
fn read_exact_fd(fd: i32, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the live remainder of `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

fn write_all_fd(fd: i32, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: writing from the live remainder of `data`.
        let n = unsafe { libc::write(fd, data[done..].as_ptr().cast(), data.len() - done) };
        if n > 0 {
            done += n as usize;
        } else if !(n < 0 && errno() == libc::EINTR) {
            return;
        }
    }
}

/// Can a PID namespace with its own `/proc` be made here (in a user
/// namespace with `user`)? Tried in a child (and its child, the init), so
/// nothing of this process changes. The children make raw syscalls only.
fn probe(user: bool) -> Result<(), String> {
    let maps = user.then(maps);
    let mut p = [-1i32; 2];
    // SAFETY: plain syscall into a local array.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("`pipe` failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the child makes raw syscalls only (no allocation, no lock), so
    // this is sound even in a multi-threaded process.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: in the forked child: raw syscalls, then `_exit`.
        unsafe {
            let fail = match enter_namespaces(maps.as_ref()) {
                Err(f) => f,
                Ok(()) => {
                    // The bare `clone` syscall, not glibc's `fork` (whose
                    // atfork handlers take locks another thread of the agent
                    // may have held when it forked us).
                    let init =
                        libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) as i32;
                    if init == 0 {
                        let f = match make_proc() {
                            Ok(()) => Fail::OK,
                            Err(f) => f,
                        };
                        write_all_fd(p[1], &f.bytes());
                        libc::_exit(0);
                    }
                    if init > 0 {
                        let mut st = 0;
                        libc::waitpid(init, &mut st, 0);
                        libc::_exit(0);
                    }
                    Fail {
                        step: 5,
                        errno: errno(),
                    }
                }
            };
            write_all_fd(p[1], &fail.bytes());
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end.
    unsafe { libc::close(p[1]) };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing the read end we own.
        unsafe { libc::close(p[0]) };
        return Err(format!("`fork` failed: {e}"));
    }
    let mut buf = [0u8; 8];
    let got = read_exact_fd(p[0], &mut buf);
    // SAFETY: closing the read end and reaping our child.
    unsafe {
        libc::close(p[0]);
        let mut st = 0;
        while libc::waitpid(pid, &mut st, 0) < 0 && errno() == libc::EINTR {}
    }
    if !got {
        return Err("the probe ended without an answer".into());
    }
    match Fail::from_bytes(buf) {
        f if f.step == 0 => Ok(()),
        f => Err(f.describe()),
    }
}

// ---------------------------------------------------------------------------
// The launcher and the init

/// Where a forwarded signal goes: a pid (the launcher's init), a negative
/// process group (the init's program), 0 for nowhere yet.
static TARGET: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let target = TARGET.load(Ordering::Relaxed);
    if target != 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(target, sig);
        }
    }
}

/// Block the forwarded signals; returns the mask before.
fn block_forwarded() -> libc::sigset_t {
    // SAFETY: sigset operations on local values.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

fn set_handlers(handler: libc::sighandler_t) {
    // SAFETY: installing a handler that only calls `kill`, or the default.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        for s in FORWARDED {
            libc::sigaction(s, &sa, std::ptr::null_mut());
        }
    }
}

fn set_mask(mask: &libc::sigset_t) {
    // SAFETY: plain syscall with a valid mask.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut());
    }
}

/// A line on the report pipe to the agent (nothing when there is none).
fn report(fd: Option<i32>, line: &str) {
    if let Some(fd) = fd {
        // One write under PIPE_BUF: atomic, never interleaved.
        let mut l: Vec<u8> = line.bytes().filter(|b| *b != b'\n').take(1000).collect();
        l.push(b'\n');
        write_all_fd(fd, &l);
    }
}

/// `orch-agent cell-init ...` / `orch cell-init ...`: when this process was
/// started as the cell launcher, run it (never returns); otherwise return at
/// once. Call first thing in `main`, before any thread starts.
pub fn dispatch() {
    let mut args = std::env::args_os();
    let _ = args.next();
    if args.next().as_deref() != Some(OsStr::new(SUBCOMMAND)) {
        return;
    }
    launcher(args.collect())
}

fn launcher(args: Vec<OsString>) -> ! {
    crate::reaper::set_process_name(LAUNCHER_NAME);
    let report_fd: Option<i32> = std::env::var(REPORT_FD_ENV).ok().and_then(|v| v.parse().ok());
    if report_fd.is_some() {
        // SAFETY (edition 2021: safe fn): single-threaded; the program must
        // not see it.
        std::env::remove_var(REPORT_FD_ENV);
    }
    if let Some(fd) = report_fd {
        // SAFETY: plain fcntl; nothing the program runs may hold the pipe.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    let mut user = false;
    let mut rest = args.into_iter();
    let argv: Vec<CString> = loop {
        match rest.next() {
            Some(a) if a == "--user" => user = true,
            Some(a) if a == "--" => {
                // Arguments of a process hold no NUL.
                break rest.filter_map(|a| CString::new(a.as_bytes()).ok()).collect();
            }
            _ => break Vec::new(),
        }
    };
    if argv.is_empty() {
        eprintln!("usage: orch-agent {SUBCOMMAND} [--user] -- PROGRAM [ARGS...]");
        report(report_fd, &format!("exec-error {}", libc::EINVAL));
        // SAFETY: leaving at once.
        unsafe { libc::_exit(127) }
    }
    let old_mask = block_forwarded();
    let maps = user.then(maps);
    // Our own PID namespace, to come back to if the init cannot be made.
    // SAFETY: plain syscall on a constant path.
    let own_pid_ns = unsafe { libc::open(c"/proc/self/ns/pid".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    match enter_namespaces(maps.as_ref()) {
        Ok(()) => {}
        // Nothing changed: run the program here, as without the launcher.
        Err(f) if f.step == 1 => {
            report(report_fd, &format!("direct {}", f.describe()));
            exec_program(&argv, report_fd, &old_mask, false)
        }
        Err(f) => back_out(own_pid_ns, report_fd, &argv, &old_mask, f),
    }
    let mut sv = [-1i32; 2];
    // SAFETY: plain syscall into a local array.
    let paired = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } == 0;
    // SAFETY: this process is single-threaded (a fresh `exec`), so the child
    // may run ordinary code.
    let init = if paired { unsafe { libc::fork() } } else { -1 };
    if init == 0 {
        // SAFETY: closing the launcher's end in the child.
        unsafe { libc::close(sv[0]) };
        init_main(sv[1], report_fd, &argv, &old_mask)
    }
    if init < 0 {
        let why = Fail {
            step: 5,
            errno: errno(),
        };
        back_out(own_pid_ns, report_fd, &argv, &old_mask, why)
    }
    // SAFETY: closing the init's end here.
    unsafe { libc::close(sv[1]) };
    TARGET.store(init, Ordering::Relaxed);
    set_handlers(forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
    set_mask(&old_mask);
    let mut answer = [0u8; 1];
    let ready = read_exact_fd(sv[0], &mut answer) && answer[0] == b'R';
    if !ready {
        let mut buf = [0u8; 8];
        let why = if answer[0] == b'F' && read_exact_fd(sv[0], &mut buf) {
            Fail::from_bytes(buf)
        } else {
            Fail {
                step: 5,
                errno: libc::ECHILD,
            }
        };
        let _ = block_forwarded();
        TARGET.store(0, Ordering::Relaxed);
        set_handlers(libc::SIG_DFL);
        wait_for(init);
        back_out(own_pid_ns, report_fd, &argv, &old_mask, why)
    }
    // From here the init holds the report pipe.
    if let Some(fd) = report_fd {
        // SAFETY: closing our copy.
        unsafe { libc::close(fd) };
    }
    let init_status = wait_for(init);
    let mut msg = [0u8; 5];
    let status = if read_exact_fd(sv[0], &mut msg) && msg[0] == b'X' {
        let mut s = [0u8; 4];
        s.copy_from_slice(&msg[1..]);
        i32::from_le_bytes(s)
    } else {
        init_status
    };
    end_as(status)
}

/// The init could not be made after the namespaces were: back to our own
/// PID namespace and run the program here, or, where that is not allowed
/// (a user namespace), fail the spawn with the reason.
fn back_out(
    own_pid_ns: i32,
    report_fd: Option<i32>,
    argv: &[CString],
    mask: &libc::sigset_t,
    why: Fail,
) -> ! {
    // SAFETY: plain syscall on a descriptor opened above.
    if own_pid_ns >= 0 && unsafe { libc::setns(own_pid_ns, libc::CLONE_NEWPID) } == 0 {
        report(report_fd, &format!("direct {}", why.describe()));
        exec_program(argv, report_fd, mask, false)
    }
    report(
        report_fd,
        &format!(
            "fail the cell's PID namespace could not be made: {}",
            why.describe()
        ),
    );
    // SAFETY: leaving at once.
    unsafe { libc::_exit(127) }
}

/// Wait for `pid` (through `EINTR`); its wait status.
fn wait_for(pid: i32) -> i32 {
    let mut st = 0;
    loop {
        // SAFETY: plain syscall into a local.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid || (r < 0 && errno() != libc::EINTR) {
            return st;
        }
    }
}

/// End this process the way the wait status `st` says: its exit code, or
/// its signal (raised on ourselves, without a core file).
fn end_as(st: i32) -> ! {
    if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        // SAFETY: plain syscalls; the signal is sent to ourselves with its
        // default action, unblocked, so this process ends by it.
        unsafe {
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig)
        }
    }
    let code = if libc::WIFEXITED(st) {
        libc::WEXITSTATUS(st)
    } else {
        127
    };
    // SAFETY: leaving without running anything else.
    unsafe { libc::_exit(code) }
}

/// `exec` the program in this process with the forwarded signals back to
/// their defaults and the mask as the agent gave it; on failure tell the
/// agent why and exit 127. With `own_group`, first a process group of its own.
fn exec_program(argv: &[CString], report_fd: Option<i32>, mask: &libc::sigset_t, own_group: bool) -> ! {
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    exec_prepared(&ptrs, report_fd, mask, own_group)
}

/// [`exec_program`] with `argv` ready: only async-signal-safe calls.
fn exec_prepared(
    ptrs: &[*const libc::c_char],
    report_fd: Option<i32>,
    mask: &libc::sigset_t,
    own_group: bool,
) -> ! {
    // SAFETY: raw syscalls; `ptrs` is a NULL-terminated array of pointers to
    // NUL-terminated strings that outlive the call.
    unsafe {
        if own_group {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        }
        for s in FORWARDED {
            libc::signal(s, libc::SIG_DFL);
        }
        // As `std::process::Command` does for a program it starts.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        set_mask(mask);
        libc::execvp(ptrs[0], ptrs.as_ptr());
        let e = errno();
        if let Some(fd) = report_fd {
            // No allocation here: the digits by hand.
            const HEAD: &[u8] = b"exec-error ";
            let mut digits = [0u8; 12];
            let mut k = digits.len();
            let mut n = e.unsigned_abs();
            loop {
                k -= 1;
                digits[k] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            let d = &digits[k..];
            let mut line = [0u8; 32];
            line[..HEAD.len()].copy_from_slice(HEAD);
            line[HEAD.len()..HEAD.len() + d.len()].copy_from_slice(d);
            line[HEAD.len() + d.len()] = b'\n';
            write_all_fd(fd, &line[..HEAD.len() + d.len() + 1]);
        }
        libc::_exit(127)
    }
}

/// PID 1 of the cell's namespace (see the module docs). `sock`: to the
/// launcher; `report_fd`: to the agent.
fn init_main(sock: i32, report_fd: Option<i32>, argv: &[CString], mask: &libc::sigset_t) -> ! {
    // SAFETY: in the forked child of the single-threaded launcher: plain
    // syscalls on descriptors it owns.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        // The launcher may have died before the line above: then its end of
        // the socket is closed.
        let mut pfd = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
        if libc::poll(&mut pfd, 1, 0) > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            libc::_exit(1);
        }
        // Not in the launcher's group: the agent's group signals reach the
        // launcher alone, which passes them on once.
        libc::setpgid(0, 0);
    }
    if let Err(f) = make_proc() {
        let mut msg = [0u8; 9];
        msg[0] = b'F';
        msg[1..].copy_from_slice(&f.bytes());
        write_all_fd(sock, &msg);
        // SAFETY: leaving at once.
        unsafe { libc::_exit(1) }
    }
    write_all_fd(sock, b"R");
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let mut ex = [-1i32; 2];
    // SAFETY: plain syscall into a local array.
    if unsafe { libc::pipe2(ex.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        report(report_fd, &format!("exec-error {}", errno()));
        // SAFETY: leaving at once.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: single-threaded; the child only makes async-signal-safe calls
    // before `exec`.
    let main = unsafe { libc::fork() };
    if main == 0 {
        // SAFETY: closing the child's copies of descriptors it must not hold.
        unsafe {
            libc::close(ex[0]);
            libc::close(sock);
        }
        exec_prepared(&ptrs, Some(ex[1]), mask, true)
    }
    // SAFETY: closing our copy of the exec pipe's write end.
    unsafe { libc::close(ex[1]) };
    if main < 0 {
        report(report_fd, &format!("exec-error {}", errno()));
        // SAFETY: leaving at once.
        unsafe { libc::_exit(127) }
    }
    // SAFETY: as the shell does, both sides set the group (no race with a
    // signal forwarded to it); EACCES after its `exec` is fine.
    unsafe { libc::setpgid(main, main) };
    TARGET.store(-main, Ordering::Relaxed);
    set_handlers(forward as extern "C" fn(libc::c_int) as libc::sighandler_t);
    // Did the `exec` happen? EOF: yes; otherwise the child's errno.
    let mut buf = [0u8; 64];
    let mut got = 0usize;
    loop {
        // SAFETY: reading into the live remainder of `buf`.
        let n = unsafe { libc::read(ex[0], buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
            if got == buf.len() {
                break;
            }
        } else if !(n < 0 && errno() == libc::EINTR) {
            break;
        }
    }
    // SAFETY: closing the read end.
    unsafe { libc::close(ex[0]) };
    if got == 0 {
        report(report_fd, "started");
    } else {
        // The child wrote `exec-error N` itself.
        if let Some(fd) = report_fd {
            write_all_fd(fd, &buf[..got]);
        }
    }
    set_mask(mask);
    // Reap everything until the program ends.
    let status = loop {
        let mut st = 0;
        // SAFETY: plain syscall into a local.
        let r = unsafe { libc::waitpid(-1, &mut st, 0) };
        if r == main {
            break st;
        }
        if r < 0 && errno() == libc::ECHILD {
            break st;
        }
    };
    TARGET.store(0, Ordering::Relaxed);
    let left = outside_group(main);
    // SAFETY: from PID 1, `kill(-1)` reaches every other process of the
    // namespace; then reap them all.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
        let mut st = 0;
        loop {
            let r = libc::waitpid(-1, &mut st, 0);
            if r < 0 && errno() != libc::EINTR {
                break;
            }
        }
    }
    report(report_fd, &format!("left {left}"));
    let mut msg = [0u8; 5];
    msg[0] = b'X';
    msg[1..].copy_from_slice(&status.to_le_bytes());
    write_all_fd(sock, &msg);
    // SAFETY: leaving; the kernel ends whatever is left of the namespace.
    unsafe { libc::_exit(0) }
}

/// Live processes of this namespace (but the init) outside process group
/// `group`, from the namespace's own `/proc`.
fn outside_group(group: i32) -> usize {
    crate::reaper::processes()
        .iter()
        .filter(|p| p.pid != 1 && !p.zombie && p.pgrp != group)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opting_out() {
        assert!(opted_out_by(Some("0")));
        assert!(opted_out_by(Some(" off ")));
        assert!(!opted_out_by(Some("1")));
        assert!(!opted_out_by(None));
    }

    #[test]
    fn failures_round_trip_and_name_their_step() {
        let f = Fail::from_bytes(
            Fail {
                step: 1,
                errno: libc::EPERM,
            }
            .bytes(),
        );
        assert_eq!((f.step, f.errno), (1, libc::EPERM));
        let text = f.describe();
        assert!(
            text.starts_with("`unshare` of a PID and a mount namespace failed"),
            "{text}"
        );
    }
}
