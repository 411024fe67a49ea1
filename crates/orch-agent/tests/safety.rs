//! The agent's safety guarantees, on the real binary: secrets never reach
//! what it writes or sends, and no process of a workload outlives its cell
//! (normal exit, timeout, stop, and the agent itself SIGKILLed).

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
        serde_json::from_slice(&std::fs::read(out_dir.join("result.json")).unwrap()).unwrap();
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

/// A workload that leaves a sleeping child in its own session (out of the
/// process group) and writes the child's pid.
fn orphan_script(pidfile: &Path, then: &str) -> String {
    format!(
        // Waits until the child has left the session (under load `setsid` may not have
        // run yet when the script ends, and the group kill would take it instead).
        "setsid sleep 300 </dev/null >/dev/null 2>&1 & p=$!; \
         while [ \"$(cut -d' ' -f6 /proc/$p/stat)\" = \"$(cut -d' ' -f6 /proc/$$/stat)\" ]; do sleep 0.01; done; \
         echo $p > {}; {then}",
        pidfile.display()
    )
}

fn wait_pid(pidfile: &Path) -> i32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(Instant::now() < until, "the workload never started its child");
        std::thread::sleep(Duration::from_millis(20));
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
    let started = Instant::now();
    let out = spawn_agent(&task(&orphan_script(&pidfile, "echo done"), 30.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success());
    let pid = wait_pid(&pidfile);
    assert_gone_soon(pid, "normal exit");
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
    let out = spawn_agent(&task(&orphan_script(&pidfile, "sleep 300"), 1.0), tmp.path())
        .wait_with_output()
        .unwrap();
    assert!(out.status.success());
    let r: orch_protocol::CellResult =
        serde_json::from_slice(&std::fs::read(tmp.path().join("out/result.json")).unwrap()).unwrap();
    assert_eq!(r.status, Status::Timeout);
    assert_gone_soon(wait_pid(&pidfile), "timeout");
}

#[test]
fn an_orphan_outside_the_group_dies_on_stop() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let child = spawn_agent(&task(&orphan_script(&pidfile, "sleep 300"), 60.0), tmp.path());
    let pid = wait_pid(&pidfile);
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let r: orch_protocol::CellResult =
        serde_json::from_slice(&std::fs::read(tmp.path().join("out/result.json")).unwrap()).unwrap();
    assert_eq!(r.status, Status::Cancelled);
    assert_gone_soon(pid, "stop");
}

#[test]
fn an_orphan_outside_the_group_dies_when_the_agent_is_killed() {
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let mut child = spawn_agent(&task(&orphan_script(&pidfile, "sleep 300"), 60.0), tmp.path());
    let pid = wait_pid(&pidfile);
    assert!(alive(pid));
    child.kill().unwrap(); // SIGKILL: no teardown of its own
    child.wait().unwrap();
    assert_gone_soon(pid, "agent SIGKILLed");
}
