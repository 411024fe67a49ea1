//! Orphan-proof teardown: no process of a workload outlives its cell.
//!
//! A workload's process group is not enough: `setsid`, daemons, vLLM's
//! engine processes and torchrun workers leave it. Three mechanisms cover
//! them:
//!
//! - the agent is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a descendant
//!   whose parent dies is re-parented to the agent, not to init, so at the end
//!   of a cell every descendant is still in the agent's process tree, found
//!   by walking `/proc` ([`kill_descendants`]);
//! - every workload process is spawned with `ORCH_AGENT_TOKEN=<agent>.<n>` in
//!   its environment, which its descendants inherit: when one workload
//!   process ends, whatever it left anywhere is found by that mark
//!   ([`kill_marked`]) and its output pipes close at once;
//! - a guard process forked when the agent starts waits on a pipe that only
//!   the agent holds: when the agent dies (SIGKILL, or `PR_SET_PDEATHSIG`
//!   after a `kill -9` of `orch`), the pipe ends and the guard kills the
//!   cell's cgroup ([`crate::cgroup`]) and every process carrying the agent's
//!   mark, then exits ([`start_guard`]). In a container the agent is PID 1
//!   and the kernel does this itself;
//! - NOT ACTIVE YET ([`USE_PID_NAMESPACE`] is off: an agent that unshares
//!   a PID namespace cannot start threads): where the agent may (root, or
//!   `CAP_SYS_ADMIN`), the guard is PID 1 of a new PID namespace, and every process
//!   the agent starts afterwards (every workload) is created in it, with a
//!   `/proc` of its own (a mount namespace the workload joins, `/proc`
//!   mounted there, so `getpid()` and `/proc/<pid>` agree). When the guard
//!   dies, by any signal, the kernel SIGKILLs every process of the namespace:
//!   the workload is gone even when every orch process is SIGKILLed at once
//!   (`pkill -9 orch`, which matches `orch`, `orch-agent` and `orch-guard`).
//!
//! Why a PID namespace and not only a cgroup: nothing in the kernel kills a
//! cgroup when the process that made it dies, so a cgroup needs a survivor
//! to write `cgroup.kill`, and `pkill -9 orch` leaves none unless one hides
//! under a name that is not `orch`'s (a user could not tell it is ours). A
//! `PR_SET_PDEATHSIG` reaches only the process that set it, not what it
//! forks. A namespace's init is the one process whose death the kernel turns
//! into the death of all the others, so the guard is that init. The cgroup
//! still makes the end of a cell one atomic `cgroup.kill` and catches what
//! leaves the process tree and drops its mark. Where neither can be made
//! (unprivileged, no delegated cgroup: a Slurm job, a plain user), the marks
//! and the guard remain, as before.
//!
//! Process names (`comm`, what `ps`, `top` and `pkill` match): the host is
//! `orch`, the agent `orch-agent` (set at start: the memfd `exec` of
//! `launch.rs` and `orch agent` would name it otherwise), the guard
//! `orch-guard`.

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Environment variable marking every process of a workload.
pub const TOKEN_ENV: &str = "ORCH_AGENT_TOKEN";

static AGENT_TOKEN: OnceLock<String> = OnceLock::new();
static SPAWNS: AtomicU64 = AtomicU64::new(0);
static GUARD_PID: OnceLock<i32> = OnceLock::new();
/// The workloads' mount namespace (the guard's, with its own `/proc`), when
/// the guard is the init of a PID namespace.
static CELL_MNT_NS: OnceLock<i32> = OnceLock::new();

/// Set this process's name (`comm`, at most 15 bytes).
pub fn set_process_name(name: &std::ffi::CStr) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscall with a NUL-terminated string that outlives it.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
}

/// Whether the workloads run in the guard's PID namespace.
pub fn in_cell_namespace() -> bool {
    CELL_MNT_NS.get().is_some()
}

/// What a workload process does between `fork` and `exec` to be inside the
/// cell: join the cell's mount namespace (its `/proc`) and go back to `cwd`
/// (joining a mount namespace moves to its root), then join the cell's
/// cgroup. Only async-signal-safe calls. `Err` when the namespace cannot be
/// joined (the spawn fails rather than run a workload half outside).
pub fn enter_cell_in_child(cwd: Option<&std::ffi::CStr>) -> std::io::Result<()> {
    if let Some(fd) = CELL_MNT_NS.get() {
        // SAFETY: plain syscalls on a descriptor kept open for the agent's
        // life and a NUL-terminated path.
        unsafe {
            if libc::setns(*fd, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(dir) = cwd {
                if libc::chdir(dir.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
    }
    if let Some(cg) = crate::cgroup::cell() {
        // Not fatal: the marks still find the process.
        cg.join_in_child();
    }
    Ok(())
}

/// This agent's mark: its pid and start time (unique on the host).
pub fn agent_token() -> &'static str {
    AGENT_TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{nanos:x}", std::process::id())
    })
}

/// A new mark for one spawned workload process (and its descendants).
pub fn spawn_token() -> String {
    format!("{}.{}", agent_token(), SPAWNS.fetch_add(1, Ordering::Relaxed))
}

/// The mark a command was given (see [`spawn_token`]).
pub fn token_of(cmd: &std::process::Command) -> Option<String> {
    cmd.get_envs()
        .find(|(k, _)| *k == TOKEN_ENV)
        .and_then(|(_, v)| v)
        .map(|v| v.to_string_lossy().into_owned())
}

/// Make this process a child subreaper (Linux; elsewhere a no-op).
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscall with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// One process as `/proc/<pid>/stat` describes it.
struct Proc {
    pid: i32,
    ppid: i32,
    zombie: bool,
}

fn processes() -> Vec<Proc> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name (which may hold spaces and parentheses): state ppid ...
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("");
        let Some(ppid) = f.next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        out.push(Proc {
            pid,
            ppid,
            zombie: state == "Z" || state == "X",
        });
    }
    out
}

/// Live descendants of `root` (not counting `root`), from `/proc`.
fn descendants(root: i32, procs: &[Proc]) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<&Proc>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    let mut seen = HashSet::new();
    while let Some(pid) = todo.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            if seen.insert(c.pid) {
                if !c.zombie {
                    out.push(c.pid);
                }
                todo.push(c.pid);
            }
        }
    }
    out
}

/// Does the process carry `mark` (exactly, or as `mark.` prefix when
/// `prefix` is true) in its environment?
fn has_mark(pid: i32, mark: &str, prefix: bool) -> bool {
    let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let want = format!("{TOKEN_ENV}={mark}");
    env.split(|b| *b == 0).any(|entry| {
        if prefix {
            entry.starts_with(want.as_bytes()) && entry.get(want.len()) == Some(&b'.')
        } else {
            entry == want.as_bytes()
        }
    })
}

fn kill(pid: i32) {
    // SAFETY: plain syscall; a gone process gives ESRCH, which is fine.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Reap any exited child without blocking (orphans re-parented to us).
/// Only called when no `std::process::Child` of ours is waiting to be reaped.
fn reap_children() {
    loop {
        let mut status = 0;
        // SAFETY: plain syscall.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            break;
        }
    }
}

/// SIGKILL every process found by `find` until none is left (or 5 s pass);
/// returns the pids killed.
fn kill_until_gone(mut find: impl FnMut() -> Vec<i32>, reap: bool) -> Vec<i32> {
    let mut killed: Vec<i32> = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let left = find();
        if left.is_empty() || Instant::now() >= until {
            break;
        }
        for pid in &left {
            kill(*pid);
            if !killed.contains(pid) {
                killed.push(*pid);
            }
        }
        std::thread::sleep(Duration::from_millis(10));
        if reap {
            reap_children();
        }
    }
    if reap {
        reap_children();
    }
    killed
}

/// Kill every live process carrying exactly `mark` (one spawned workload
/// process and whatever it started, wherever it went). Returns the pids.
pub fn kill_marked(mark: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    kill_until_gone(
        || {
            processes()
                .into_iter()
                .filter(|p| !p.zombie && p.pid != me && has_mark(p.pid, mark, false))
                .map(|p| p.pid)
                .collect()
        },
        false,
    )
}

/// End of a cell: kill the cell's cgroup, every descendant of the agent
/// and of the guard (orphans of a PID namespace go to its init, the guard),
/// the guard excepted, and every process carrying this agent's mark, and reap
/// them. Returns the pids killed. Call only when the workload's own children
/// have been waited for.
pub fn kill_descendants() -> Vec<i32> {
    let me = std::process::id() as i32;
    let guard = GUARD_PID.get().copied();
    let token = agent_token().to_string();
    let mut in_cgroup = crate::cgroup::cell().map(|c| c.kill_all()).unwrap_or_default();
    let mut killed = kill_until_gone(
        || {
            let procs = processes();
            let mut pids: Vec<i32> = descendants(me, &procs)
                .into_iter()
                .chain(guard.map(|g| descendants(g, &procs)).unwrap_or_default())
                .filter(|p| Some(*p) != guard)
                .collect();
            for p in &procs {
                if !p.zombie
                    && p.pid != me
                    && Some(p.pid) != guard
                    && !pids.contains(&p.pid)
                    && has_mark(p.pid, &token, true)
                {
                    pids.push(p.pid);
                }
            }
            pids
        },
        true,
    );
    in_cgroup.retain(|p| !killed.contains(p));
    killed.append(&mut in_cgroup);
    killed
}

/// How the workloads are kept inside the cell, for the record's `info`.
pub fn containment() -> String {
    let ns = if in_cell_namespace() {
        "pid namespace"
    } else {
        "process marks"
    };
    match crate::cgroup::cell() {
        Some(c) => format!("{ns}, cgroup {}", c.dir().display()),
        None => ns.to_string(),
    }
}

/// Fork the guard (see the module docs), first making the cell's cgroup
/// and, where allowed, the PID namespace the guard is init of. Call before
/// any thread starts. The guard ignores terminal signals and only acts when
/// the agent is gone.
pub fn start_guard() {
    let token = agent_token().to_string();
    let _ = crate::cgroup::setup(&format!("orch-cell.{token}"));
    let mut fds = [0i32; 2];
    let mut ready = [0i32; 2];
    // SAFETY: plain syscalls into local arrays.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    // SAFETY: as above.
    if unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        ready = [-1, -1];
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    // A PID namespace for everything forked from now on; not when we are
    // already PID 1 (a container: the kernel does it for us).
    // SAFETY: opening our own namespace, to come back to it if the guard
    // cannot make its `/proc`; `unshare` of a PID namespace only changes
    // where our later children go.
    let own_pid_ns = unsafe { libc::open(c"/proc/self/ns/pid".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    let new_ns = USE_PID_NAMESPACE
        && ready[0] >= 0
        && own_pid_ns >= 0
        && std::process::id() != 1
        && std::env::var_os(NO_NAMESPACE_ENV).is_none()
        // SAFETY: plain syscall.
        && unsafe { libc::unshare(libc::CLONE_NEWPID) } == 0;
    // SAFETY: the agent is single-threaded here (called before any thread
    // starts), so the child may run ordinary code.
    let pid = unsafe { libc::fork() };
    match pid {
        0 => {
            guard_main(read_end, write_end, ready, &token, new_ns);
        }
        p if p > 0 => {
            // SAFETY: closing our copies of the guard's ends.
            unsafe {
                libc::close(read_end);
                if ready[1] >= 0 {
                    libc::close(ready[1]);
                }
            }
            let _ = GUARD_PID.set(p);
            if new_ns {
                let mut ok = [0u8; 1];
                // SAFETY: a blocking read of one byte into a local buffer.
                let n = unsafe { libc::read(ready[0], ok.as_mut_ptr().cast(), 1) };
                let mnt = (n == 1 && ok[0] == b'1')
                    .then(|| {
                        let path = CString::new(format!("/proc/{p}/ns/mnt")).ok()?;
                        // SAFETY: plain syscall on a NUL-terminated path.
                        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
                        (fd >= 0).then_some(fd)
                    })
                    .flatten();
                match mnt {
                    Some(fd) => {
                        let _ = CELL_MNT_NS.set(fd);
                    }
                    // The guard has no `/proc` of the namespace: workloads
                    // stay in ours rather than see pids that are not theirs.
                    // SAFETY: back to our own PID namespace for later children.
                    None => unsafe {
                        libc::setns(own_pid_ns, libc::CLONE_NEWPID);
                    },
                }
            }
            // The write end stays open (close-on-exec, so no workload holds
            // it) until the agent exits or dies.
        }
        _ => {
            // SAFETY: fork failed; close both ends and leave the namespace
            // that has no init.
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
                if new_ns {
                    libc::setns(own_pid_ns, libc::CLONE_NEWPID);
                }
            }
        }
    }
    // SAFETY: closing descriptors this function opened.
    unsafe {
        if own_pid_ns >= 0 {
            libc::close(own_pid_ns);
        }
        if ready[0] >= 0 {
            libc::close(ready[0]);
        }
    }
}

/// Off: after `unshare(CLONE_NEWPID)` the agent itself can no longer
/// create threads (`clone(CLONE_THREAD)` is `EINVAL` once `pid_for_children`
/// differs from the caller's namespace), and the agent needs threads. The
/// namespace must be made by a launcher process that runs the workload
/// instead (see issue 30 item 4); until then the cgroup and the guard hold.
const USE_PID_NAMESPACE: bool = false;

/// Set (to anything) to keep workloads out of a PID namespace of their own
/// (the cgroup and the marks still apply).
pub const NO_NAMESPACE_ENV: &str = "ORCH_AGENT_NO_PIDNS";

/// In the guard, init of a new PID namespace: a mount namespace of its own
/// (following the host's mounts) with a `/proc` of the PID namespace.
/// Call in the single-threaded guard only (`unshare(CLONE_NEWNS)` refuses a
/// process whose filesystem state is shared with threads).
fn make_cell_proc() -> bool {
    // SAFETY: plain syscalls with NUL-terminated constant strings.
    unsafe {
        libc::unshare(libc::CLONE_NEWNS) == 0
            && libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            ) == 0
            && libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) == 0
    }
}

fn guard_main(read_end: i32, write_end: i32, ready: [i32; 2], token: &str, ns_init: bool) -> ! {
    // SAFETY: in the freshly forked single-threaded child: signal
    // dispositions, fd housekeeping, namespaces and a polled read.
    unsafe {
        set_process_name(c"orch-guard");
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::close(write_end);
        if ready[0] >= 0 {
            libc::close(ready[0]);
        }
        // Hold nothing of the agent's: its stdout is the host's event pipe.
        let devnull = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if devnull >= 0 {
            for fd in 0..3 {
                libc::dup2(devnull, fd);
            }
        }
        let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
            .collect();
        for fd in fds {
            if fd > 2 && fd != read_end && fd != ready[1] {
                libc::close(fd);
            }
        }
        libc::setsid();
        if ready[1] >= 0 {
            let ok = if ns_init && make_cell_proc() { b"1" } else { b"0" };
            libc::write(ready[1], ok.as_ptr().cast(), 1);
            libc::close(ready[1]);
        }
        let mut buf = [0u8; 16];
        loop {
            // As init of the namespace, the workloads' orphans are ours to reap.
            if ns_init {
                let mut status = 0;
                while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            }
            let mut pfd = libc::pollfd {
                fd: read_end,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 200) <= 0 {
                continue;
            }
            let n = libc::read(read_end, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 {
                break;
            }
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
    }
    if let Some(cg) = crate::cgroup::cell() {
        cg.kill_all();
        cg.remove();
    }
    // Our own pid as our `/proc` numbers it (in a namespace whose `/proc`
    // could not be mounted, `getpid()` is 1 but `/proc` is the host's).
    let me = std::fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_string_lossy().parse().ok())
        .unwrap_or(std::process::id() as i32);
    kill_until_gone(
        || {
            processes()
                .into_iter()
                .filter(|p| !p.zombie && p.pid != me && has_mark(p.pid, token, true))
                .map(|p| p.pid)
                .collect()
        },
        false,
    );
    // SAFETY: leave without running the agent's atexit handlers or flushing
    // its (inherited) buffers. As a namespace's init, this exit makes the
    // kernel SIGKILL whatever is left in it.
    unsafe { libc::_exit(0) }
}

/// PIDs holding GPU memory, per `nvidia-smi` (`None` when it is absent).
pub fn gpu_pids() -> Option<Vec<u32>> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    })
}

/// Wait (at most `limit`) until none of `pids` holds GPU memory.
pub fn wait_gpu_released(pids: &[i32], limit: Duration) {
    if pids.is_empty() {
        return;
    }
    let until = Instant::now() + limit;
    while gpu_pids().is_some_and(|held| held.iter().any(|p| pids.contains(&(*p as i32))))
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_follow_the_tree_and_skip_zombies() {
        let p = |pid, ppid, zombie| Proc { pid, ppid, zombie };
        let procs = vec![
            p(10, 1, false),
            p(11, 10, false),
            p(12, 11, true),
            p(13, 12, false),
            p(20, 1, false),
        ];
        let mut d = descendants(10, &procs);
        d.sort();
        assert_eq!(d, vec![11, 13]);
        assert!(descendants(20, &procs).is_empty());
    }

    #[test]
    fn spawn_tokens_share_the_agent_prefix() {
        let a = spawn_token();
        let b = spawn_token();
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("{}.", agent_token())));
        let mut cmd = std::process::Command::new("true");
        cmd.env(TOKEN_ENV, &a);
        assert_eq!(token_of(&cmd).as_deref(), Some(a.as_str()));
    }

    #[test]
    fn a_marked_process_that_left_its_group_is_killed() {
        let mark = spawn_token();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"])
            .env(TOKEN_ENV, &mark)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = String::new();
        use std::io::Read;
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        child.wait().unwrap();
        let sleeper: i32 = out.trim().parse().unwrap();
        assert!(std::path::Path::new(&format!("/proc/{sleeper}")).exists());
        let killed = kill_marked(&mark);
        assert!(killed.contains(&sleeper), "{killed:?} {sleeper}");
    }
}
