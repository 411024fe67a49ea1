//! Nothing leaks, nothing escapes, end to end through the `orch` binary:
//! a canary `HF_TOKEN` printed by a workload in every form leaves no trace in
//! the store or in anything orch prints (local and docker backends); a
//! secret too short to mask is refused; a `setsid` child of a workload dies
//! with `orch` killed by SIGKILL.

use crate::support::{container_agent, repo, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "hf_CanaryT0ken/With+Eq=Z9x8";

/// [`crate::support::orch`] with the Hub and weights folders under `home`.
fn orch(home: &Path) -> Command {
    let mut c = crate::support::orch();
    c.env_remove("HF_TOKEN_PATH")
        // No Hub token file of this machine's user takes part.
        .env("HF_HOME", home.join("hf-home"))
        .env("ORCH_WEIGHTS_DIR", home.join("weights"));
    c
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

/// Fragments that betray the token: its distinctive middle (in the plain,
/// split, URL-encoded and JSON-escaped forms) and the middle of its base64
/// at each alignment.
fn betrayals() -> Vec<String> {
    let mut out = vec![
        "CanaryT0ken".to_string(),
        "With+Eq".to_string(),
        "Z9x8".to_string(),
    ];
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

fn assert_tree_clean(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            n += assert_tree_clean(&p);
        } else {
            assert_clean(&p.display().to_string(), &std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    n
}

fn all(out: &Output) -> Vec<u8> {
    let mut v = out.stdout.clone();
    v.extend_from_slice(&out.stderr);
    v
}

/// Prints the token plain, base64 (three alignments), URL-encoded, in its
/// metrics file, split across two writes on both streams, inside a
/// Python-like traceback whose last line (the failure message, the
/// diagnosis evidence) holds it, and exits non-zero.
const CANARY: &str = r#"t="$HF_TOKEN"
echo "plain: $t"
printf '%s' "$t" | base64
printf 'a%s' "$t" | base64
printf 'user:%s' "$t" | base64
printf 'https://huggingface.co/api?token=%s\n' "$(printf %s "$t" | sed 's|/|%2F|g; s|+|%2B|g; s|=|%3D|g')"
echo "ORCH_METRIC x=1"
printf '{"x": 1, "note": "%s"}' "$t" > "$ORCH_METRICS_FILE"
half=$(printf %s "$t" | cut -c1-9); rest=$(printf %s "$t" | cut -c10-)
printf 'split: %s' "$half"; sleep 0.3; printf '%s\n' "$rest"
printf 'split-err: %s' "$half" >&2; sleep 0.3; printf '%s\n' "$rest" >&2
echo 'Traceback (most recent call last):' >&2
echo '  File "bench.py", line 12, in <module>' >&2
echo "    hf_hub_download(repo_id, token=\"$t\")" >&2
echo "huggingface_hub.errors.GatedRepoError: 403 Client Error. Cannot access gated repo for url https://huggingface.co/x?token=$t" >&2
exit 3
"#;

fn canary_manifest(dir: &Path, image: Option<&str>) -> PathBuf {
    let script: String = CANARY.lines().map(|l| format!("        {l}\n")).collect();
    let image = image.map(|t| format!("image: {t}\n")).unwrap_or_default();
    let p = dir.join("suite.yaml");
    std::fs::write(
        &p,
        format!(
            "name: canary\n{image}secrets: [HF_TOKEN]\nmeasure: {{timeout: 1m}}\nbenchmarks:\n  - name: leak\n    workload:\n      shell: |\n{script}"
        ),
    )
    .unwrap();
    p
}

/// Run the canary suite, then every command that shows it; check the whole
/// store, the report folder and every output.
fn canary(backend: &str, image: Option<&str>) {
    let tmp = tempfile::tempdir().unwrap();
    let m = canary_manifest(tmp.path(), image);
    let store = tmp.path().join("store");
    let s = store.to_str().unwrap();
    let run = |args: &[&str]| {
        orch(tmp.path())
            .args(args)
            .env("HF_TOKEN", TOKEN)
            .output()
            .unwrap()
    };
    let out = run(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--backend",
        backend,
        "--store",
        s,
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&all(&out))
    );
    let mut outputs = vec![("run".to_string(), out)];
    let report = tmp.path().join("report");
    let r = report.to_str().unwrap();
    for args in [
        vec!["run", "--resume", "latest", "--store", s, "--json"],
        vec!["ls", "--store", s],
        vec!["show", "latest", "--store", s],
        vec!["show", "latest", "--store", s, "--json"],
        vec!["logs", "latest", "--store", s],
        vec!["logs", "latest", "--store", s, "--stream", "stderr"],
        vec!["logs", "latest", "--store", s, "--stream", "agent"],
        vec![
            "report",
            "latest",
            "--store",
            s,
            "--format",
            "md,csv,json,html",
            "-o",
            r,
        ],
        vec!["report", "latest", "--store", s, "--format", "md"],
        vec!["cost", "--store", s],
        vec!["cost", "--store", s, "--json"],
        vec!["cost", "--store", s, "--by", "run", "--csv"],
    ] {
        let out = run(&args);
        outputs.push((args.join(" "), out));
    }
    for (what, out) in &outputs {
        assert_clean(&format!("the output of `orch {what}`"), &all(out));
    }
    // The failure and its diagnosis are there, masked.
    let shown = String::from_utf8_lossy(&outputs[4].1.stdout).into_owned();
    assert!(shown.contains("***"), "{shown}");
    let logs = String::from_utf8_lossy(&outputs[6].1.stdout).into_owned();
    assert!(
        logs.contains("token=\\\"***\\\"") || logs.contains("token=\"***\""),
        "{logs}"
    );
    let files = assert_tree_clean(&store) + assert_tree_clean(&report);
    assert!(files >= 10, "only {files} files checked");
    let record = std::fs::read_dir(
        store
            .join(
                std::fs::read_dir(&store)
                    .unwrap()
                    .next()
                    .unwrap()
                    .unwrap()
                    .file_name(),
            )
            .join("cells"),
    )
    .unwrap()
    .next()
    .unwrap()
    .unwrap()
    .path()
    .join("result.json");
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(record).unwrap()).unwrap();
    assert_eq!(rec["status"], "failed");
    let msg = rec["failure"]["message"].as_str().unwrap();
    assert!(msg.contains("token=***"), "{msg}");
    assert_eq!(rec["diagnosis"]["kind"], "gated_repo", "{rec}");
    assert!(rec["diagnosis"]["evidence"].to_string().contains("***"), "{rec}");
}

#[test]
fn a_canary_token_leaves_no_trace_on_the_local_backend() {
    canary("local", None);
}

#[test]
fn a_canary_token_leaves_no_trace_on_the_docker_backend() {
    let Some(tag) = docker_image() else { return };
    canary("docker", Some(&tag));
}

#[test]
fn a_secret_too_short_to_mask_is_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let m = canary_manifest(tmp.path(), None);
    let store = tmp.path().join("store");
    let out = orch(tmp.path())
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .env("HF_TOKEN", "abc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`HF_TOKEN`") && err.contains("hint:"), "{err}");
    assert!(!err.contains("abc"), "the value is shown: {err}");
    assert!(!store.exists() || std::fs::read_dir(&store).unwrap().next().is_none());
}

fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start()).unwrap_or("");
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

/// The live process whose command line is `sleep <arg>`.
fn sleeper(arg: &str) -> Option<i32> {
    let want = format!("sleep\0{arg}\0");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<i32>().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (cmd == want.as_bytes() && alive(pid)).then_some(pid)
    })
}

#[test]
fn a_setsid_child_dies_with_orch_killed_by_sigkill() {
    let tmp = tempfile::tempdir().unwrap();
    let arg = format!("300.{}", std::process::id());
    let pidfile = tmp.path().join("pid");
    let m = tmp.path().join("suite.yaml");
    std::fs::write(
        &m,
        format!(
            "name: orphan\nbenchmarks:\n  - name: o\n    workload:\n      shell: 'setsid sleep {arg} </dev/null >/dev/null 2>&1 & echo $! > {}; sleep 300'\n",
            pidfile.display()
        ),
    )
    .unwrap();
    let mut child = orch(tmp.path())
        .args(["run", "-f", m.to_str().unwrap(), "--store"])
        .arg(tmp.path().join("store"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The child is found by its command line: in the agent's PID namespace
    // the `$!` the workload writes is not the pid seen here.
    let pid: i32 = wait_for(
        "the workload never started",
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            let found = std::fs::read_to_string(&pidfile).is_ok_and(|s| !s.trim().is_empty());
            found.then(|| sleeper(&arg)).flatten()
        },
    );
    assert!(alive(pid));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() > until {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("the setsid child {pid} outlived `orch` killed by SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The quickstart image, built if needed; `None` (skip, outside CI) without
/// Docker or the static agent.
fn docker_image() -> Option<String> {
    let docker = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let agent = container_agent();
    let busybox = repo().join("containers/quickstart/busybox");
    let test = orch_testkit::skip::current_test();
    if !matches!(docker, Ok(s) if s.success()) {
        orch_testkit::skip::skip_or_fail(&test, "no Docker engine reachable for the docker canary test");
        return None;
    }
    if !(agent.is_file() && busybox.is_file()) {
        orch_testkit::skip::skip_or_fail(
            &test,
            "Docker is here but not the static agent or busybox: run `bash scripts/prepare-docker.sh` first",
        );
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = orch(tmp.path())
        .args(["build", "-f"])
        .arg(repo().join("manifests/quickstart.yaml"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&all(&out))
    );
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .trim()
            .to_string(),
    )
}
