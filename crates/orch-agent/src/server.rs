//! The `server` workload: start a server, watch it until it is ready, run a
//! client against it, tear it down.
//!
//! While waiting for readiness the server process is checked every 50 ms: a
//! server that exits is a failed cell at once (with its exit code or signal
//! and its logs), never a wait until the startup timeout. Teardown kills the
//! server's whole process group (and, through the cell launcher, its PID
//! namespace: [`crate::cellinit`]) and waits until its port is free, so the
//! next cell (or variant) starts on a clean machine.

use crate::capture::Capture;
use crate::command::{self, kill_group, last_line, terminate};
use crate::ctx::Ctx;
use orch_protocol::{
    CellResult, Client, Failure, FailureKind, Phase, Readiness, ServerWorkload, Status, TaskSpec,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(50);

pub fn run(srv: &ServerWorkload, task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    run_with(srv, task, out_dir, ctx, None)
}

/// [`run`], with `before_client` called with the server's base URL
/// (`http://127.0.0.1:<port>`) once it is ready and before its client
/// runs (a comparison's output check rides on its first round this way,
/// without a server start of its own). Its time is billed as `warmup`.
pub fn run_with(
    srv: &ServerWorkload,
    task: &TaskSpec,
    out_dir: &Path,
    ctx: &mut Ctx,
    before_client: Option<&mut dyn FnMut(&str)>,
) -> CellResult {
    let cell = task.cell_id.as_str();
    let Some(program) = srv.argv.first() else {
        return CellResult::failed(
            cell,
            Status::Failed,
            FailureKind::InvalidConfig,
            "the server command is empty",
        );
    };
    let log_ready = match &srv.ready {
        Readiness::Log { regex } => match regex::Regex::new(regex) {
            Ok(r) => Some(r),
            Err(e) => {
                return CellResult::failed(
                    cell,
                    Status::Failed,
                    FailureKind::InvalidConfig,
                    format!("`ready.log` is not a valid regex: {e}"),
                )
            }
        },
        _ => None,
    };
    let port = match &srv.ready {
        Readiness::Http { port, .. } | Readiness::Tcp { port } => Some(*port),
        Readiness::Log { .. } => None,
    };
    if let Some(p) = port {
        if connect(p).is_some() {
            return CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::PortInUse,
                format!("port {p} is already in use before the server starts; hint: stop what holds it, or use another port"),
            );
        }
    }

    let cmd = match command::supervised(&srv.argv, srv.workdir.as_deref(), task, &[]) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    let token = Some(cmd.token().to_string());
    let (out_cap, err_cap) = match (
        Capture::create(&out_dir.join("stdout.log"), task.logs),
        Capture::create(&out_dir.join("stderr.log"), task.logs),
    ) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            return CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::AgentIo,
                format!("cannot create log files: {e}"),
            )
        }
    };
    // From spawn until ready (or dead) is the server's start-up: billed as
    // `server_start`; the client's phases follow, then `teardown`.
    ctx.enter(Phase::ServerStart);
    let started = Instant::now();
    let mut spawned = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::Spawn,
                format!("cannot start `{program}`: {e}"),
            )
        }
    };
    let child = &mut spawned.child;
    let pgid = child.id() as i32;
    let ready_flag = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| (Box::new(s) as Box<dyn Read + Send>, out_cap)),
        child
            .stderr
            .take()
            .map(|s| (Box::new(s) as Box<dyn Read + Send>, err_cap)),
    ]
    .into_iter()
    .flatten()
    .map(|(src, cap)| {
        let re = log_ready.clone();
        let flag = ready_flag.clone();
        thread::spawn(move || {
            let on_line = re.map(|re| {
                move |l: &[u8], _cut: bool| {
                    if re.is_match(&String::from_utf8_lossy(l)) {
                        flag.store(true, Ordering::Relaxed);
                    }
                }
            });
            command::pump(src, cap, on_line)
        })
    })
    .collect();
    ctx.message(format!(
        "server started (pid {}); waiting for readiness",
        spawned.main_pid
    ));

    // Startup: ready, exited, timed out, or stopped.
    let deadline = started + command::secs(srv.startup_timeout_s);
    let outcome = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Err((
                Status::Failed,
                FailureKind::ServerExited,
                describe_exit(status, started),
                Some(status),
            ));
        }
        if ctx.stop_requested() {
            break Err((
                Status::Cancelled,
                FailureKind::Cancelled,
                "stopped on request while the server started".into(),
                None,
            ));
        }
        let ready = match &srv.ready {
            Readiness::Http { port, path } => http_ok(*port, path),
            Readiness::Tcp { port } => connect(*port).is_some(),
            Readiness::Log { .. } => ready_flag.load(Ordering::Relaxed),
        };
        if ready {
            break Ok(());
        }
        if Instant::now() >= deadline {
            break Err((
                Status::Timeout,
                FailureKind::StartupTimeout,
                format!("orch: server not ready after {:.0}s", srv.startup_timeout_s),
                None,
            ));
        }
        thread::sleep(POLL);
    };
    let startup_s = started.elapsed().as_secs_f64();

    let mut result = match outcome {
        Err((status, kind, message, exit)) => {
            let mut r = CellResult::failed(cell, status, kind, message);
            if let (Some(f), Some(e)) = (r.failure.as_mut(), exit) {
                f.exit_code = e.code();
                f.signal = e.signal();
            }
            r
        }
        Ok(()) => {
            ctx.message(format!("server ready after {startup_s:.2}s"));
            let url = match port {
                Some(p) => format!("http://127.0.0.1:{p}"),
                None => String::new(),
            };
            if let Some(hook) = before_client {
                if !url.is_empty() {
                    ctx.enter(Phase::Warmup);
                    hook(&url);
                }
            }
            let mut r = match &srv.client {
                Some(Client::Command(client)) => {
                    let extra = vec![("ORCH_SERVER_URL".to_string(), url)];
                    command::run_with_logs(client, task, out_dir, ctx, "client.", &extra)
                }
                Some(Client::Loadgen(lg)) if url.is_empty() => CellResult::failed(
                    cell,
                    Status::Failed,
                    FailureKind::InvalidConfig,
                    format!("the load generator needs the server's port: use `ready: {{http: ..., port: ...}}` or `ready: {{tcp: ...}}` ({})", lg.endpoint),
                ),
                Some(Client::Loadgen(lg)) => crate::loadgen::run(lg, task, &url, out_dir, ctx),
                None => {
                    ctx.enter(Phase::Measure);
                    CellResult::new(cell, Status::Succeeded)
                }
            };
            // A server that died under the client fails the cell.
            if let Ok(Some(status)) = child.try_wait() {
                r.status = Status::Failed;
                r.failure = Some(Failure {
                    kind: FailureKind::ServerExited,
                    message: describe_exit(status, started),
                    exit_code: status.code(),
                    signal: status.signal(),
                });
            }
            r
        }
    };
    result.metrics.insert("server_startup_s".into(), startup_s);

    // Teardown: the whole group, then wait for the port.
    ctx.enter(Phase::Teardown);
    // The group and the whole tree: in a PID namespace the server's own
    // group is not the launcher's.
    let mut group_pids = pids_in_group(pgid);
    for pid in crate::reaper::tree(pgid) {
        if !group_pids.contains(&(pid as u32)) {
            group_pids.push(pid as u32);
        }
    }
    if child.try_wait().ok().flatten().is_none() {
        terminate(child, pgid, task.measure.kill_grace_s);
    }
    kill_group(pgid, libc::SIGKILL);
    // Engine processes and workers that left the group (`setsid`) go too
    // (in a PID namespace, its init has already killed them and says how many).
    let leftovers = command::kill_marked(token.as_deref());
    let left = leftovers.len() + spawned.left_outside_group();
    if left > 0 {
        ctx.message(format!(
            "killed {left} server process(es) left running outside its process group"
        ));
    }
    group_pids.extend(leftovers.iter().map(|p| *p as u32));
    if let Some(p) = port {
        let until = Instant::now() + Duration::from_secs(30);
        while connect(p).is_some() && Instant::now() < until {
            thread::sleep(POLL);
        }
    }
    // With GPUs: wait until none of the server's processes holds GPU memory.
    if task.gpu != "none" {
        let until = Instant::now() + Duration::from_secs(60);
        while crate::reaper::gpu_pids().is_some_and(|held| held.iter().any(|p| group_pids.contains(p)))
            && Instant::now() < until
        {
            thread::sleep(POLL);
        }
    }
    for (i, r) in readers.into_iter().enumerate() {
        // Spawn order: stdout, then stderr.
        if let Ok(Ok(info)) = r.join() {
            if i == 0 {
                result.stdout = info;
            } else {
                result.stderr = info;
            }
        }
    }
    if result.status == Status::Failed {
        if let (Some(f), Some(tail)) = (result.failure.as_mut(), last_line(&out_dir.join("stderr.log"))) {
            if f.kind == FailureKind::ServerExited {
                f.message.push_str(&format!("; last stderr line: {tail}"));
            }
        }
    }
    result.info.insert("server_argv0".into(), program.clone().into());
    result
}

fn describe_exit(status: std::process::ExitStatus, started: Instant) -> String {
    let after = started.elapsed().as_secs_f64();
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("the server exited with code {c} after {after:.1}s"),
        (None, Some(s)) => format!(
            "the server was killed by signal {s} ({}) after {after:.1}s",
            command::signal_name(s)
        ),
        _ => format!("the server ended after {after:.1}s"),
    }
}

fn connect(port: u16) -> Option<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
}

/// A bare HTTP/1.1 GET for health checks (status line only). The agent has
/// no HTTP client library on purpose: it must stay small, and a health check
/// needs nothing more.
fn http_ok(port: u16, path: &str) -> bool {
    let Some(mut s) = connect(port) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(1000)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    let head = String::from_utf8_lossy(&buf[..got]);
    head.split_whitespace()
        .nth(1)
        .map(|code| code.starts_with('2'))
        .unwrap_or(false)
}

/// Processes of a process group (from `/proc`).
fn pids_in_group(pgid: i32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces): state ppid pgrp ...
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        if rest.split_whitespace().nth(2).and_then(|g| g.parse::<i32>().ok()) == Some(pgid) {
            out.push(pid);
        }
    }
    out
}
