//! The agent's safety guarantees, on the real binary: secrets never reach
//! what it writes or sends, and no process of a workload outlives its cell
//! (normal exit, timeout, stop, the agent itself SIGKILLed, the agent and
//! its guard SIGKILLed at once, every orch process SIGKILLed at once as
//! `pkill -9 orch` does); through the cell launcher the workload keeps its
//! exit code, signal and the signals the agent sends it, and sees its own
//! PID namespace and `/proc`.
//!
//! Workload processes are found by a command line of their own (`sleep
//! 300.<unique>`), not by a pid the workload prints: in the cell's PID
//! namespace a workload's `$!` is not the pid this test sees.

use orch_protocol::{CommandWorkload, Measure, Status, TaskSpec, Workload};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "hf_CanaryT0ken/With+Eq=Z9x8";

fn task(script: &str, timeout_s: f64) -> TaskSpec {
    TaskSpec {
        version: orch_protocol::PROTOCOL_VERSION,
        run_id: "r1".into(),
        cell_id: "c1".into(),
        gpu: "none".into(),
        params: Default::default(),
        env: Default::default(),
        secret_env: vec!["MY_TOKEN".into()],
        workload: Workload::Command(CommandWorkload {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            workdir: None,
        }),
        measure: Measure {
            warmup: 0,
            repetitions: 1,
            timeout_s,
            kill_grace_s: 1.0,
        },
        logs: Default::default(),
        memory_limit_bytes: None,
        weights_dir: None,
        strict_hardware: false,
        gpu_fallback: vec![],
        files: None,
    }
}

fn spawn_agent(t: &TaskSpec, dir: &Path) -> Child {
    let task_path = dir.join("task.json");
    std::fs::write(&task_path, serde_json::to_vec(t).unwrap()).unwrap();
    Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .args(["run", "--task"])
        .arg(&task_path)
        .arg("--out")
        .arg(dir.join("out"))
        .env("MY_TOKEN", TOKEN)
        // No token file of this machine's user counts here.
        .env("HF_HOME", dir.join("hf-home"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Base64 (standard alphabet), written here so the check does not use the
/// code it checks.
fn b64(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16 | (*c.get(1).unwrap_or(&0) as u32) << 8 | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..=c.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// Fragments that betray the token: its distinctive middle (plain, split,
/// URL-encoded, JSON-escaped all contain it) and the middle of its base64
/// at each alignment.
fn betrayals() -> Vec<String> {
    let mut out = vec!["CanaryT0ken".to_string(), "Z9x8".to_string()];
    for prefix in ["", "a", "ab"] {
        let enc = b64(format!("{prefix}{TOKEN}").as_bytes());
        out.push(enc[4..enc.len() - 4].to_string());
    }
    out
}

fn assert_clean(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for b in betrayals() {
        assert!(!text.contains(&b), "`{b}` found in {what}:\n{text}");
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

const CANARY: &str = r#"
t="$MY_TOKEN"
echo "plain: $t"
printf '%s' "$t" | base64
printf 'a%s' "$t" | base64
printf 'user:%s' "$t" | base64
printf 'https://huggingface.co/api?token=%s\n' "$(printf %s "$t" | sed 's|/|%2F|g; s|+|%2B|g; s|=|%3D|g')"
printf '{"x": 1, "note": "%s"}' "$t" > "$ORCH_METRICS_FILE"
half=$(printf %s "$t" | cut -c1-9); rest=$(printf %s "$t" | cut -c10-)
printf 'split: %s' "$half"; sleep 0.3; printf '%s\n' "$rest"
printf 'split-err: %s' "$half" >&2; sleep 0.3; printf '%s\n' "$rest" >&2
echo 'Traceback (most recent call last):' >&2
echo '  File "bench.py", line 12, in <module>' >&2
echo "    login(token=\"$t\")" >&2
echo "ValueError: invalid token $t" >&2
exit 3
"#;

#[test]
fn a_canary_secret_never_leaves_the_agent() {
    let tmp = tempfile::tempdir().unwrap();
    let out = spawn_agent(&task(CANARY, 30.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_clean("the event stream", &out.stdout);
    assert_clean("the agent's stderr", &out.stderr);
    let out_dir = tmp.path().join("out");
    for f in files(&out_dir) {
        assert_clean(&f.display().to_string(), &std::fs::read(&f).unwrap());
    }
    let result: orch_protocol::CellResult =
        serde_json::from_slice(&std::fs::read(out_dir.join(orch_protocol::AGENT_RESULT_FILE)).unwrap())
            .unwrap();
    assert_eq!(result.status, Status::Failed);
    let msg = result.failure.unwrap().message;
    assert!(msg.contains("ValueError: invalid token ***"), "{msg}");
    // Masked, not dropped: every line is there with `***` in its place.
    let stdout = std::fs::read_to_string(out_dir.join("stdout.log")).unwrap();
    assert!(stdout.contains("plain: ***\n"), "{stdout}");
    assert!(stdout.contains("split: ***\n"), "{stdout}");
    assert!(stdout.contains("token=***\n"), "{stdout}");
    let stderr = std::fs::read_to_string(out_dir.join("stderr.log")).unwrap();
    assert!(stderr.contains("login(token=\"***\")"), "{stderr}");
    assert!(std::fs::read_to_string(out_dir.join("metrics.json"))
        .unwrap()
        .contains("\"***\""));
    // The metric itself is kept.
    assert_eq!(result.metrics.get("x"), Some(&1.0));
}

/// A `sleep` argument no other process has: `300.<test pid><n>`.
fn unique_sleep() -> String {
    unique_sleep_of(300)
}

/// A `sleep` argument no other process has: `<secs>.<test pid><n>`.
fn unique_sleep_of(secs: u32) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{secs}.{}{n:03}", std::process::id())
}

/// Live processes whose command line is `sleep <arg>`, as this test's
/// `/proc` numbers them.
fn sleepers(arg: &str) -> Vec<i32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.ends_with(want.as_bytes()) && alive(*pid))
        })
        .collect()
}

/// A workload that leaves a sleeping child (`sleep <arg>`) in its own
/// session (out of the process group) and then writes `pidfile`.
fn orphan_script(pidfile: &Path, arg: &str, then: &str) -> String {
    format!(
        // Waits until the child has left the session (under load `setsid` may not have
        // run yet when the script ends, and the group kill would take it instead).
        "setsid sleep {arg} </dev/null >/dev/null 2>&1 & p=$!; \
         while [ \"$(cut -d' ' -f6 /proc/$p/stat)\" = \"$(cut -d' ' -f6 /proc/$$/stat)\" ]; do sleep 0.01; done; \
         echo $p > {}; {then}",
        pidfile.display()
    )
}

/// Wait for the workload to write `pidfile`, then return the pid (as this
/// test sees it) of its `sleep <arg>` child.
fn wait_pid(pidfile: &Path, arg: &str) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(pidfile).map_or(true, |s| s.trim().is_empty()) {
        assert!(Instant::now() < until, "the workload never started its child");
        std::thread::sleep(Duration::from_millis(20));
    }
    match sleepers(arg)[..] {
        [pid] => pid,
        ref other => panic!("expected one `sleep {arg}`, found {other:?}"),
    }
}

/// Alive = exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start()).unwrap_or("");
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

fn assert_gone_soon(pid: i32, when: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() > until {
            // SAFETY: cleaning up after a failed test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the setsid child {pid} outlived its cell ({when})");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_orphan_outside_the_group_dies_on_normal_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let arg = unique_sleep();
    let started = Instant::now();
    let out = spawn_agent(
        &task(&orphan_script(&pidfile, &arg, "echo done"), 30.0),
        tmp.path(),
    )
    .wait_with_output()
    .unwrap();
    assert!(out.status.success());
    assert!(pidfile.exists(), "the workload ran");
    assert_eq!(
        sleepers(&arg),
        Vec::<i32>::new(),
        "the setsid child outlived its cell"
    );
    // Its output pipes closed with it: no wait for a pipe held open.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let events = String::from_utf8_lossy(&out.stdout);
    assert!(events.contains("outside its process group"), "{events}");
}

#[test]
fn an_orphan_outside_the_group_dies_on_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let arg = unique_sleep();
    let child = spawn_agent(
        &task(&orphan_script(&pidfile, &arg, "sleep 300"), 5.0),
        tmp.path(),
    );
    let pid = wait_pid(&pidfile, &arg);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let r: orch_protocol::CellResult = serde_json::from_slice(
        &std::fs::read(tmp.path().join("out").join(orch_protocol::AGENT_RESULT_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(r.status, Status::Timeout);
    assert_gone_soon(pid, "timeout");
}

#[test]
fn an_orphan_outside_the_group_dies_on_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let arg = unique_sleep();
    let child = spawn_agent(
        &task(&orphan_script(&pidfile, &arg, "sleep 300"), 60.0),
        tmp.path(),
    );
    let pid = wait_pid(&pidfile, &arg);
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let r: orch_protocol::CellResult = serde_json::from_slice(
        &std::fs::read(tmp.path().join("out").join(orch_protocol::AGENT_RESULT_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(r.status, Status::Cancelled);
    assert_gone_soon(pid, "stop");
}

#[test]
fn an_orphan_outside_the_group_dies_when_the_agent_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let arg = unique_sleep();
    let mut child = spawn_agent(
        &task(&orphan_script(&pidfile, &arg, "sleep 300"), 60.0),
        tmp.path(),
    );
    let pid = wait_pid(&pidfile, &arg);
    assert!(alive(pid));
    child.kill().unwrap(); // SIGKILL: no teardown of its own
    child.wait().unwrap();
    assert_gone_soon(pid, "agent SIGKILLed");
}

/// `orch_testkit::skip::skip_or_fail`'s rule, written here so the agent's
/// tests do not build the test servers: outside CI a test that cannot run
/// here is skipped with a note; under CI (`CI=true` or `1`) it fails.
fn skip_or_fail(test: &str, why: &str) {
    if matches!(std::env::var("CI").as_deref(), Ok("true" | "1")) {
        panic!("{test}: {why} (CI=true: this test must run here; .ci/run installs what it needs)");
    }
    eprintln!("skipped: {test}: {why}");
}

/// The agent's children named `name` (`comm`).
fn children_named(parent: i32, name: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let comm = stat
                .split_once(" (")
                .and_then(|(_, r)| r.rsplit_once(") "))
                .map(|(c, _)| c);
            let ppid = stat
                .rsplit_once(") ")
                .and_then(|(_, r)| r.split_whitespace().nth(1));
            comm == Some(name) && ppid == Some(parent.to_string().as_str())
        })
        .collect()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The PID namespace of a process, as a link text (`pid:[4026531836]`).
fn pid_ns(pid: i32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// `pid` and its descendants, from `/proc`.
fn tree(pid: i32) -> Vec<i32> {
    let procs: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(") ")?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let parent = out[i];
        out.extend(procs.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    out
}

/// Wait (at most 5 s) until no `sleep <arg>` is left; kill what is left
/// and fail otherwise.
fn assert_all_gone_soon(arg: &str, when: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let left = sleepers(arg);
        if left.is_empty() {
            return;
        }
        if Instant::now() > until {
            for pid in &left {
                // SAFETY: cleaning up after a failed test.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!("{} workload processes outlived {when}: {left:?}", left.len());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Skip (or fail under CI) when the workload is not in a PID namespace of
/// its own; cleans up first. `true` when the test may go on.
fn in_own_namespace(test: &str, agent: &mut Child, arg: &str) -> bool {
    let agent_pid = agent.id() as i32;
    let workload = sleepers(arg);
    if workload.iter().all(|p| pid_ns(*p) != pid_ns(agent_pid)) {
        return true;
    }
    for pid in workload {
        // SAFETY: cleaning up this test's own workload before skipping.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = agent.kill();
    let _ = agent.wait();
    skip_or_fail(
        test,
        "the agent could not give the workload a PID namespace of its own (needs root, CAP_SYS_ADMIN or user namespaces)",
    );
    false
}

/// `pkill -9 orch`: every process named `orch...` (the agent `orch-agent`,
/// its guard `orch-guard`, the launcher and the namespace's init
/// `orch-cell`) SIGKILLed at once. Only this agent's tree is scanned (other
/// orch processes of this machine are not this test's), and they are all
/// stopped before any is killed, so none acts before all are dead. A
/// `setsid` double-forked daemon and a plain child of the workload die too.
#[test]
fn no_workload_process_survives_pkill_9_orch() {
    let test = "no_workload_process_survives_pkill_9_orch";
    let tmp = tempfile::tempdir().unwrap();
    let started = tmp.path().join("started");
    let arg = unique_sleep_of(1000);
    let script = format!(
        "setsid sh -c 'sleep {arg} </dev/null >/dev/null 2>&1 & exit 0' </dev/null >/dev/null 2>&1 & \
         sleep {arg} & \
         echo yes > {}; sleep 300",
        started.display(),
    );
    let mut agent = spawn_agent(&task(&script, 120.0), tmp.path());
    let agent_pid = agent.id() as i32;
    let until = Instant::now() + Duration::from_secs(20);
    while !(started.exists() && sleepers(&arg).len() == 2) {
        assert!(
            Instant::now() < until,
            "the workload did not start its daemon and its child: {:?}",
            sleepers(&arg)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if !in_own_namespace(test, &mut agent, &arg) {
        return;
    }
    // What `pkill orch` matches: `comm` containing `orch`.
    let orch: Vec<(i32, String)> = tree(agent_pid)
        .into_iter()
        .map(|p| (p, comm(p)))
        .filter(|(_, c)| c.contains("orch"))
        .collect();
    let names: Vec<&str> = orch.iter().map(|(_, c)| c.as_str()).collect();
    for want in ["orch-agent", "orch-guard", "orch-cell"] {
        assert!(names.contains(&want), "no `{want}` among {names:?}");
    }
    // The launcher and the namespace's init: `orch-cell` both.
    assert_eq!(
        names.iter().filter(|n| **n == "orch-cell").count(),
        2,
        "{names:?}"
    );
    // The workload itself is not named `orch...`: pkill leaves it to the kernel.
    for pid in sleepers(&arg) {
        assert!(!comm(pid).contains("orch"));
    }
    // SAFETY: signalling the processes of the agent this test started.
    unsafe {
        for (pid, _) in &orch {
            libc::kill(*pid, libc::SIGSTOP);
        }
        for (pid, _) in &orch {
            libc::kill(*pid, libc::SIGKILL);
        }
    }
    agent.wait().unwrap();
    assert_all_gone_soon(&arg, "`pkill -9 orch`");
}

/// The agent and its guard SIGKILLed at once (the launcher lives on until
/// its `PR_SET_PDEATHSIG`): the workload, however many processes it forked
/// and however they hid (their own sessions, the agent's mark dropped from
/// their environment), dies too.
#[test]
fn no_workload_process_survives_the_agent_and_its_guard_sigkilled_at_once() {
    let test = "no_workload_process_survives_the_agent_and_its_guard_sigkilled_at_once";
    let tmp = tempfile::tempdir().unwrap();
    let started = tmp.path().join("started");
    let arg = unique_sleep();
    let script = format!(
        "for i in $(seq 30); do sleep {arg} & done; \
         for i in $(seq 10); do setsid sleep {arg} </dev/null >/dev/null 2>&1 & done; \
         for i in $(seq 10); do env -u {mark} sh -c 'setsid sleep {arg} </dev/null >/dev/null 2>&1 &'; done; \
         echo yes > {}; sleep 300",
        started.display(),
        mark = "ORCH_AGENT_TOKEN",
    );
    let mut agent = spawn_agent(&task(&script, 120.0), tmp.path());
    let agent_pid = agent.id() as i32;
    let until = Instant::now() + Duration::from_secs(20);
    while !(started.exists() && sleepers(&arg).len() == 50) {
        assert!(
            Instant::now() < until,
            "the workload did not start its 50 children: {}",
            sleepers(&arg).len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(comm(agent_pid), "orch-agent", "the agent is named `orch-agent`");
    let guards = children_named(agent_pid, "orch-guard");
    assert_eq!(guards.len(), 1, "one guard, named `orch-guard`");
    if !in_own_namespace(test, &mut agent, &arg) {
        return;
    }
    // SAFETY: SIGKILL of the agent and the guard this test started, back to back.
    unsafe {
        libc::kill(guards[0], libc::SIGSTOP);
        libc::kill(agent_pid, libc::SIGKILL);
        libc::kill(guards[0], libc::SIGKILL);
    }
    agent.wait().unwrap();
    assert_all_gone_soon(&arg, "the agent and its guard");
}

fn result_of(dir: &Path) -> orch_protocol::CellResult {
    serde_json::from_slice(&std::fs::read(dir.join("out").join(orch_protocol::AGENT_RESULT_FILE)).unwrap())
        .unwrap()
}

/// Through the launcher the program is PID 2 of its own namespace (after
/// the init), `/proc` is that namespace's (its pid and `/proc/<pid>`
/// agree), and its exit code and signal are what the agent records.
#[test]
fn the_workload_has_its_own_pid_namespace_and_keeps_its_exit_status() {
    let tmp = tempfile::tempdir().unwrap();
    let seen = tmp.path().join("seen");
    let script = format!(
        "echo $$ $(cut -d' ' -f1 /proc/$$/stat) $(readlink /proc/self/ns/pid) > {}; exit 7",
        seen.display()
    );
    let out = spawn_agent(&task(&script, 30.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = result_of(tmp.path());
    let f = r.failure.as_ref().unwrap();
    assert_eq!(
        (f.kind.as_str(), f.exit_code, f.signal),
        ("exit_code", Some(7), None)
    );
    let containment = r.info["containment"].as_str().unwrap_or_default().to_string();
    let seen = std::fs::read_to_string(&seen).unwrap();
    let fields: Vec<&str> = seen.split_whitespace().collect();
    let ours = pid_ns(std::process::id() as i32).unwrap();
    if !containment.starts_with("pid namespace") {
        skip_or_fail(
            "the_workload_has_its_own_pid_namespace_and_keeps_its_exit_status",
            &format!("no PID namespace for the workload here ({containment})"),
        );
        return;
    }
    assert_eq!(fields[0], "2", "the program is PID 2 of its namespace: {seen}");
    assert_eq!(fields[0], fields[1], "`$$` and `/proc/$$` agree: {seen}");
    assert_ne!(Path::new(fields[2]), ours, "{seen}");

    // A signal is the program's, not the launcher's; no core file is left.
    let tmp = tempfile::tempdir().unwrap();
    let out = spawn_agent(&task("kill -SEGV $$", 30.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success());
    let r = result_of(tmp.path());
    let f = r.failure.unwrap();
    assert_eq!(
        (f.kind.as_str(), f.signal),
        ("signal", Some(libc::SIGSEGV)),
        "{}",
        f.message
    );
    assert!(!tmp.path().join("core").exists());
}

/// Without root the launcher makes its namespaces inside a user namespace
/// (our uid and gid mapped to themselves): the program is still PID 2 of
/// its own PID namespace, with its own `/proc`, and runs as the same user.
/// Runs where this test is root (to start the agent as `nobody`); skipped
/// with a note where user namespaces are refused (that host keeps the
/// marks and the guard).
#[test]
fn without_root_the_workload_gets_a_user_namespace() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: without_root_the_workload_gets_a_user_namespace: needs root to start the agent as `nobody`");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let seen = tmp.path().join("seen");
    let script = format!(
        "echo $$ $(cut -d' ' -f1 /proc/$$/stat) $(id -u) > {}",
        seen.display()
    );
    let task_path = tmp.path().join("task.json");
    std::fs::write(&task_path, serde_json::to_vec(&task(&script, 30.0)).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_orch-agent"))
        .args(["run", "--task"])
        .arg(&task_path)
        .arg("--out")
        .arg(tmp.path().join("out"))
        .env("MY_TOKEN", TOKEN)
        .env("HF_HOME", tmp.path().join("hf-home"))
        .current_dir(tmp.path())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = result_of(tmp.path());
    assert_eq!(r.status, Status::Succeeded, "{:?}", r.failure);
    let containment = r.info["containment"].as_str().unwrap_or_default().to_string();
    if !containment.starts_with("pid namespace (in a user namespace)") {
        eprintln!("skipped: without_root_the_workload_gets_a_user_namespace: {containment}");
        return;
    }
    let seen = std::fs::read_to_string(&seen).unwrap();
    let fields: Vec<&str> = seen.split_whitespace().collect();
    assert_eq!(fields, ["2", "2", "65534"], "pid, `/proc/$$`, uid: {seen}");
}

/// The agent's SIGTERM on timeout reaches the program through the launcher
/// and the init: a program that traps it ends with its own exit code, not
/// by the SIGKILL after the grace period.
#[test]
fn a_timed_out_workload_gets_the_sigterm_through_the_launcher() {
    let tmp = tempfile::tempdir().unwrap();
    let arg = unique_sleep();
    let script = format!("trap 'exit 42' TERM; sleep {arg} & wait");
    let mut t = task(&script, 2.0);
    t.measure.kill_grace_s = 20.0;
    let started = Instant::now();
    let out = spawn_agent(&t, tmp.path()).wait_with_output().unwrap();
    assert!(out.status.success());
    let r = result_of(tmp.path());
    assert_eq!(r.status, Status::Timeout);
    let f = r.failure.unwrap();
    assert_eq!((f.exit_code, f.signal), (Some(42), None), "{}", f.message);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert_all_gone_soon(&arg, "its cell");
}

/// Where cgroups are writable, the workload runs in a cgroup of the cell's
/// own, and the cell's end kills it whole (also what dropped its mark and
/// left the process tree's view) and removes it.
#[test]
fn the_workload_runs_in_a_cgroup_of_its_own_that_the_cell_end_removes() {
    let tmp = tempfile::tempdir().unwrap();
    let arg = unique_sleep();
    let script = format!(
        "env -u ORCH_AGENT_TOKEN sh -c 'setsid sleep {arg} </dev/null >/dev/null 2>&1 &'; \
         sleep 0.2; cat /proc/self/cgroup > {}",
        tmp.path().join("cgroup").display()
    );
    let out = spawn_agent(&task(&script, 30.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        sleepers(&arg),
        Vec::<i32>::new(),
        "the hidden child outlived its cell"
    );
    let r: orch_protocol::CellResult = serde_json::from_slice(
        &std::fs::read(tmp.path().join("out").join(orch_protocol::AGENT_RESULT_FILE)).unwrap(),
    )
    .unwrap();
    let containment = r
        .info
        .get("containment")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string();
    let Some(dir) = containment.split_once("cgroup ").map(|(_, d)| d.to_string()) else {
        skip_or_fail(
            "the_workload_runs_in_a_cgroup_of_its_own_that_the_cell_end_removes",
            &format!(
                "no writable cgroup v2 for the agent here ({containment}); run as root with cgroup2 mounted"
            ),
        );
        return;
    };
    let seen = std::fs::read_to_string(tmp.path().join("cgroup")).unwrap();
    let name = Path::new(&dir).file_name().unwrap().to_string_lossy().to_string();
    assert!(seen.contains(&name), "the workload was in `{name}`: {seen}");
    assert!(
        !Path::new(&dir).exists(),
        "the cell's cgroup `{dir}` is removed at its end"
    );
}
