//! What every test module shares: the one `orch` command (and its named variants), what it
//! printed, the repository's paths, the container tests' readiness check, and small
//! fixtures (a suite file, git, waiting for something to happen).

use orch_testkit::skip;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository root (manifests, scripts, containers).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The agent containers get, as `scripts/build-agent.sh` (run by
/// `scripts/prepare-docker.sh`) ships it.
pub fn container_agent() -> PathBuf {
    repo().join(format!(
        "target/{}-unknown-linux-gnu/release/orch-agent",
        std::env::consts::ARCH
    ))
}

/// Whether tests of the fakes' containers can run here: root (chroot and
/// mounts), the shipped agent and the quickstart image's busybox. Outside CI
/// a missing one skips the test with a note; under CI it fails
/// (`orch_testkit::skip`).
pub fn containers_ready(what: &str) -> bool {
    if !orch_testkit::container::available_or_skip(what) {
        return false;
    }
    let agent = container_agent();
    let busybox = repo().join("containers/quickstart/busybox");
    if orch_testkit::container::is_static_elf(&agent) && busybox.is_file() {
        return true;
    }
    skip::skip_or_fail(
        what,
        &format!(
            "the static agent `{}` or `{}` is missing: run `bash scripts/prepare-docker.sh` first",
            agent.display(),
            busybox.display()
        ),
    )
}

/// The real `orch` binary with none of this machine's orch settings: no `ORCH_STORE`
/// (each test names its store), no `ORCH_AGENT` (the agent is the one built beside
/// `orch`), stdin closed. Every test's `orch` starts here and adds its own environment.
pub fn orch() -> Command {
    orch_at(Path::new(env!("CARGO_BIN_EXE_orch")))
}

/// [`orch`]'s settings for another `orch` executable (one installed from the wheel).
pub fn orch_at(exe: &Path) -> Command {
    let mut c = Command::new(exe);
    c.env_remove("ORCH_STORE")
        .env_remove("ORCH_AGENT")
        .stdin(Stdio::null());
    c
}

/// [`orch`] that finds no model weights of this machine: `ORCH_WEIGHTS_DIR` names a
/// folder that does not exist.
pub fn orch_without_weights() -> Command {
    let mut c = orch();
    c.env("ORCH_WEIGHTS_DIR", "/nonexistent-orch-weights");
    c
}

/// [`orch`] with no Hugging Face token and no weights folder of this machine's user:
/// `HF_TOKEN` and `ORCH_WEIGHTS_DIR` unset, `HF_HOME` a folder that does not exist (so
/// no token file either).
pub fn orch_without_hub_token() -> Command {
    let mut c = orch();
    c.env_remove("HF_TOKEN")
        .env("HF_HOME", "/nonexistent-orch-test-hf-home")
        .env_remove("ORCH_WEIGHTS_DIR");
    c
}

/// [`orch`] for an S3 store, with none of this machine's S3 settings (`AWS_PROFILE`,
/// `AWS_SESSION_TOKEN`, `ORCH_S3_UNCONDITIONAL`) and its local S3 files (spool, caches)
/// in `work`. The test adds the server's endpoint and credentials.
pub fn orch_s3(work: &Path) -> Command {
    let mut c = orch();
    c.env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove(orch_store_s3::UNCONDITIONAL_ENV)
        .env("ORCH_S3_WORKDIR", work);
    c
}

/// `orch ARGS` ([`orch`]) run to its end: its exit status, stdout and stderr.
pub fn orch_output(args: &[&str]) -> Output {
    orch().args(args).output().unwrap()
}

/// stdout then stderr, as one text: all a user saw.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The exit status, stdout and stderr, labelled: an assertion's message.
pub fn dump(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// stdout as JSON (`--json`); a panic showing stdout and stderr where it is not.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The cell `id` of a run record; a panic showing the record where it has none.
pub fn cell<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no cell {id} in {record}"))
}

/// `text` written to `DIR/suite.yaml`; that path.
pub fn write_suite(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("suite.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// `git ARGS` in `dir` (as user `t`), which must succeed; its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.email=t@t", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `found()` asked every `every` until it gives a value; a panic saying `what` did not
/// happen once `limit` has passed.
pub fn wait_for<T>(what: &str, limit: Duration, every: Duration, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = found() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(every);
    }
}

/// Whether `python3` imports NumPy; where it does not, the running test is skipped
/// (failed under CI), the note saying what needs it (`why`).
pub fn numpy_or_skip(why: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip::skip_or_fail(
            &skip::current_test(),
            &format!("python3 with numpy is not installed ({why})"),
        );
    }
    ok
}
