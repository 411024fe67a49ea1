//! Orphan-proof teardown: no process of a workload outlives its cell.
//!
//! A workload's process group is not enough: `setsid`, daemons, vLLM's
//! engine processes and torchrun workers leave it. These mechanisms cover
//! them:
//!
//! - every workload process runs in a PID namespace of its own, started
//!   through the cell launcher ([`crate::cellinit`], where the agent may make
//!   one: root, `CAP_SYS_ADMIN` or a user namespace): the namespace's init
//!   (`orch-cell`) dies with its launcher (`orch-cell`), which dies with the
//!   agent (`PR_SET_PDEATHSIG`), and when the init dies the kernel SIGKILLs
//!   every process of the namespace. So the workload is gone even when every
//!   orch process is SIGKILLed at once (`pkill -9 orch`, which matches
//!   `orch`, `orch-agent`, `orch-guard` and `orch-cell`), and when the
//!   program ends, the init ends whatever it left;
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
//!   and the kernel does this itself.
//!
//! Why a PID namespace and not only a cgroup: nothing in the kernel kills a
//! cgroup when the process that made it dies, so a cgroup needs a survivor
//! to write `cgroup.kill`, and `pkill -9 orch` leaves none (the guard is
//! `orch-guard`). A `PR_SET_PDEATHSIG` reaches only the process that set it,
//! not what it forks. A namespace's init is the one process whose death the
//! kernel turns into the death of all the others. The cgroup still makes the
//! end of a cell one atomic `cgroup.kill`. Where no namespace can be made
//! (a container without `CAP_SYS_ADMIN`: there the agent is PID 1; a Slurm
//! job without user namespaces), the marks, the guard and the cgroup remain,
//! as before; `info.containment` of the record says which held ([`containment`]).
//!
//! Process names (`comm`, what `ps`, `top` and `pkill` match): the host is
//! `orch`, the agent `orch-agent` (set at start: the memfd `exec` of
//! `launch.rs` and `orch agent` would name it otherwise), the guard
//! `orch-guard`, the launcher and the namespace's init `orch-cell`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Environment variable marking every process of a workload.
pub const TOKEN_ENV: &str = "ORCH_AGENT_TOKEN";

static AGENT_TOKEN: OnceLock<String> = OnceLock::new();
static SPAWNS: AtomicU64 = AtomicU64::new(0);
static GUARD_PID: OnceLock<i32> = OnceLock::new();

/// Set this process's name (`comm`, at most 15 bytes).
pub fn set_process_name(name: &std::ffi::CStr) {
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscall with a NUL-terminated string that outlives it.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
}

/// What a workload process (or its launcher) does between `fork` and
/// `exec` to be inside the cell: join the cell's cgroup, where there is one
/// (not fatal when it fails: the marks and the namespace still hold).
/// Only async-signal-safe calls.
pub fn join_cell_in_child() {
    if let Some(cg) = crate::cgroup::cell() {
        cg.join_in_child();
    }
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
pub(crate) struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// Its process group.
    pub pgrp: i32,
    pub zombie: bool,
}

/// Every process `/proc` shows (the namespace's, where `/proc` is its own).
pub(crate) fn processes() -> Vec<Proc> {
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
        let pgrp = f.next().and_then(|g| g.parse().ok()).unwrap_or(0);
        out.push(Proc {
            pid,
            ppid,
            pgrp,
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
/// (the guard excepted) and every process carrying this agent's mark, and
/// reap them. Returns the pids killed. Call only when the workload's own
/// children have been waited for.
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

/// `pid` and its live descendants (as this process's `/proc` numbers them).
pub fn tree(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    out.extend(descendants(pid, &processes()));
    out
}

/// The program a cell launcher started, as this process's `/proc` numbers
/// it: the process of the launcher's namespace whose pid there is 2 (the
/// init is 1, the program its first child).
pub fn namespace_main(launcher: i32) -> Option<i32> {
    descendants(launcher, &processes()).into_iter().find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .and_then(|l| l.split_whitespace().last().map(|p| p == "2"))
            })
            .unwrap_or(false)
    })
}

/// How the workloads are kept inside the cell, for the record's `info`:
/// the way they were started ([`crate::cellinit::containment`]) and the
/// cgroup, if any.
pub fn containment() -> String {
    let how = crate::cellinit::containment();
    match crate::cgroup::cell() {
        Some(c) => format!("{how}, cgroup {}", c.dir().display()),
        None => how,
    }
}

/// Decide how workload processes start ([`crate::cellinit::mode`], a probe
/// in a child), make the cell's cgroup and fork the guard (see the module
/// docs). Call before any thread starts. The guard ignores terminal signals
/// and only acts when the agent is gone.
pub fn start_guard() {
    let _ = crate::cellinit::mode();
    let token = agent_token().to_string();
    let _ = crate::cgroup::setup(&format!("orch-cell.{token}"));
    let mut fds = [0i32; 2];
    // SAFETY: plain syscall into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    // SAFETY: the agent is single-threaded here (called before any thread
    // starts), so the child may run ordinary code.
    let pid = unsafe { libc::fork() };
    match pid {
        0 => guard_main(read_end, write_end, &token),
        p if p > 0 => {
            // SAFETY: closing our copy of the guard's end.
            unsafe {
                libc::close(read_end);
            }
            let _ = GUARD_PID.set(p);
            // The write end stays open (close-on-exec, so no workload holds
            // it) until the agent exits or dies.
        }
        _ => {
            // SAFETY: fork failed; close both ends.
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
            }
        }
    }
}

fn guard_main(read_end: i32, write_end: i32, token: &str) -> ! {
    // SAFETY: in the freshly forked single-threaded child: signal
    // dispositions, fd housekeeping and a polled read.
    unsafe {
        set_process_name(c"orch-guard");
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        libc::close(write_end);
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
            if fd > 2 && fd != read_end {
                libc::close(fd);
            }
        }
        libc::setsid();
        let mut buf = [0u8; 16];
        loop {
            let mut pfd = libc::pollfd {
                fd: read_end,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, -1) <= 0 {
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
    let me = std::process::id() as i32;
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
    // its (inherited) buffers.
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
        let p = |pid, ppid, zombie| Proc {
            pid,
            ppid,
            pgrp: pid,
            zombie,
        };
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
