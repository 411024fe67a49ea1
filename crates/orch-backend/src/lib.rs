//! Backends: where a cell's agent runs.
//!
//! One trait, [`Backend`], for all of them. A backend's job is narrow: given a
//! cell's task, get `orch-agent` running it somewhere, relay the agent's events
//! while it runs, bring back its result, and leave nothing behind. It knows
//! nothing of manifests, matrices or the store's layout beyond the cell folder
//! it is handed.
//!
//! | backend      | a cell is                        | weights            | agent delivered by            | crate |
//! |--------------|----------------------------------|--------------------|-------------------------------|-------|
//! | `local`      | a child process                  | a host folder      | the `orch` binary itself      | this |
//! | `docker`     | a container (Engine API)         | a named volume     | bind-mounted static binary    | this |
//! | `kubernetes` | a Job                            | a PVC              | an init container             | `orch-backend-kubernetes` |
//! | `modal`      | a sandbox (Modal's gRPC API)     | a Modal volume     | a content-addressed mount     | `orch-backend-modal` |
//! | `slurm`      | a batch job                      | a shared folder    | `orch` on the shared filesystem | `orch-backend-slurm` |
//!
//! ## What is where
//!
//! `lifecycle.rs` (the one cell lifecycle: `Platform`, `drive`, `judge`,
//! the host deadline, stop and kill); `host.rs` (`Host`, `Kind`, `Weights`, the folder
//! weights check, `LocalHost`); `local.rs` (agent child process, events → `events.jsonl`,
//! `CUDA_VISIBLE_DEVICES` from assigned GPUs); `fake.rs` (recording fake with scripted
//! outcomes, for runner tests; feature `fake`); `secrets.rs` (`host_masker`: the launch's
//! secrets, known credentials of the host, the Hub token file; masked event lines, agent
//! stderr and, at a cell's end, every file of its folder); `home.rs` (the way home of
//! remote backends: shipping frames → cell folder, dedup, gaps, digests); `EventRelay` in
//! `lib.rs` (relays events, returns the result, measures the `provision` phase). It does
//! not: parse manifests, write records.

#[cfg(feature = "fake")]
pub mod fake;
pub mod home;
pub mod host;
pub mod lifecycle;
pub mod local;
pub mod secrets;

pub use host::{Check, CheckStatus, Host, Kind};
pub use local::LocalBackend;
pub use secrets::host_masker;

use async_trait::async_trait;
use orch_protocol::{CellResult, Event, FailureKind, Phase, TaskSpec};
use std::path::PathBuf;
use tokio::sync::{mpsc, watch};

/// Everything a backend needs to run one cell.
#[derive(Debug, Clone)]
pub struct CellLaunch {
    pub task: TaskSpec,
    /// Host folder for this cell: the backend puts `task.json`, the logs
    /// (`stdout.log`, `stderr.log`, `agent.log`) and `events.jsonl` here.
    pub cell_dir: PathBuf,
    /// Secret environment (name, value): handed to the agent's environment,
    /// never written to disk.
    pub secrets: Vec<(String, String)>,
    /// Host folder of the weights volume (a hub cache), if any.
    pub weights_dir: Option<PathBuf>,
    /// Container image (container backends).
    pub image: Option<String>,
    /// GPU devices assigned to this cell (indices), when known.
    pub devices: Vec<String>,
    /// The host files that travel with the cell (staged as blobs in the
    /// host's cache), for a backend whose cells do not run on this host's
    /// filesystem: it delivers the blobs and applies the shipment to the
    /// task (`Shipment::apply`) before the agent gets it. `None` for the
    /// local backend (see [`Backend::ships_files`]).
    pub files: Option<std::sync::Arc<orch_files::Shipment>>,
}

/// An agent event, tagged with its cell.
#[derive(Debug, Clone)]
pub struct CellEvent {
    pub cell_id: String,
    pub event: Event,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot be used here (missing binary, engine, credentials).
    #[error("backend `{backend}` is not usable: {message}\nhint: {hint}")]
    Unavailable {
        backend: &'static str,
        message: String,
        hint: String,
    },
    #[error("unknown backend `{0}`\nhint: the backends are local, docker, kubernetes, modal and slurm")]
    Unknown(String),
    #[error("{action}: {source}")]
    Io { action: String, source: std::io::Error },
    /// What the user must fix (a flag, the suite's backend section, an
    /// image not built); the text carries its `hint:`.
    #[error("{0}")]
    User(String),
}

impl BackendError {
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            BackendError::Unavailable { .. } | BackendError::Unknown(_) | BackendError::User(_)
        )
    }
}

/// Where a backend sends a cell's events (the runner's progress).
pub type Events = mpsc::UnboundedSender<CellEvent>;
/// A cell's stop signal: `true` stops it; its sender going away is no stop.
pub type Cancel = watch::Receiver<bool>;
/// How [`Backend::run_cell`] ends: the cell's result (a failed cell is a
/// result), or the backend itself failing.
pub type Ran = Result<CellResult, BackendError>;

#[async_trait]
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;

    /// Check, before any cell starts, that cells can run here.
    async fn preflight(&self) -> Result<(), BackendError>;

    /// Run one cell to its end and return the agent's result. Agent events are
    /// sent on `events` as they arrive. When `cancel` turns true the backend
    /// asks the agent to stop; the result is then `cancelled` (or whatever the
    /// cell reached first). A cell whose agent dies is a failed result, not an
    /// error: errors are for the backend itself failing.
    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran;

    /// Remove whatever a run left behind (containers, jobs, sandboxes).
    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError>;

    /// Do cells run away from this host's filesystem, so that the files a
    /// task names must travel with them (`CellLaunch::files`)?
    fn ships_files(&self) -> bool {
        true
    }
}

/// The event stream of one cell, shared by every backend: relays the
/// agent's events, returns its result, and measures the `provision` phase,
/// from the cell's launch (this relay's creation) until the agent's
/// `Started` event (container create, image pull, scheduling, agent start).
pub struct EventRelay {
    cell_id: String,
    events: mpsc::UnboundedSender<CellEvent>,
    launched: std::time::Instant,
    provision_s: Option<f64>,
}

impl EventRelay {
    /// Create it when the cell's launch begins.
    pub fn new(cell_id: &str, events: mpsc::UnboundedSender<CellEvent>) -> EventRelay {
        EventRelay {
            cell_id: cell_id.to_string(),
            events,
            launched: std::time::Instant::now(),
            provision_s: None,
        }
    }

    /// One line of the agent's event stream: the final result is returned
    /// (with the provision time), other events are relayed.
    pub fn line(&mut self, line: &str) -> Option<CellResult> {
        match Event::from_line(line) {
            Ok(Event::Result { result }) => Some(self.stamp(result)),
            Ok(event) => {
                if matches!(event, Event::Started { .. }) && self.provision_s.is_none() {
                    self.provision_s = Some(self.launched.elapsed().as_secs_f64());
                }
                let _ = self.events.send(CellEvent {
                    cell_id: self.cell_id.clone(),
                    event,
                });
                None
            }
            Err(_) => None,
        }
    }

    /// Seconds from launch until the agent started, once it has.
    pub fn provision_s(&self) -> Option<f64> {
        self.provision_s
    }

    /// Put the provision time into a result (one the agent sent, read from
    /// its file, or made up for an agent that died).
    pub fn stamp(&self, mut result: CellResult) -> CellResult {
        if let Some(p) = self.provision_s {
            result.timings.entry(Phase::Provision).or_insert(p);
        }
        result
    }
}

/// Resolves when `cancel` turns true (never, once its sender is gone).
pub async fn wait_cancel(cancel: &mut watch::Receiver<bool>) {
    loop {
        if *cancel.borrow() {
            return;
        }
        if cancel.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Append `bytes` to a file (created if missing) in one `write`, the file
/// open only for it: a running cell keeps no descriptor of its own for the
/// files it writes to now and then (`events.jsonl`, `agent.log`, a
/// platform's own log).
pub fn append(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?
        .write_all(bytes)
}

/// A file appended to piece by piece through [`append`], as an async writer
/// (the agent's stderr copied into `agent.log`): each write is one short
/// append to the page cache, done in place.
pub struct AppendFile(pub std::path::PathBuf);

impl tokio::io::AsyncWrite for AppendFile {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(append(&self.0, buf).map(|()| buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Append an `orch: LINE` line to a cell's `agent.log` (after the agent's own
/// lines, if any came home): what a backend saw of a cell's end, where the
/// diagnosis reads it.
pub fn note_agent_log(cell_dir: &std::path::Path, line: &str) {
    use std::io::Write as _;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(cell_dir.join("agent.log"))
    {
        let _ = writeln!(f, "orch: {line}");
    }
}

/// The signal a container's exit code says its entrypoint died of, when it
/// is one the process could have died of by itself (SIGKILL is a kill from
/// outside: the OOM killer, a grace period's end, a preemption).
pub fn crash_signal(exit_code: Option<i32>) -> Option<i32> {
    exit_code
        .and_then(orch_protocol::signal_of_exit_code)
        .filter(|s| *s != 9)
}

/// The last few lines the agent itself wrote (its stderr, `agent.log`), not
/// orch's own notes: evidence for a crash.
pub fn agent_log_tail(cell_dir: &std::path::Path, lines: usize) -> Vec<String> {
    let log = std::fs::read(cell_dir.join("agent.log")).unwrap_or_default();
    let log = String::from_utf8_lossy(&log);
    let mut tail: Vec<String> = log
        .lines()
        .rev()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty() && !l.starts_with("orch: "))
        .take(lines)
        .map(String::from)
        .collect();
    tail.reverse();
    tail
}

/// The agent (or the container it is the entrypoint of) ended and no result
/// came: the failure, kind `agent_crashed`, naming the signal (from the
/// process status, or a runtime's exit code 128 + N) and the agent's last
/// stderr lines. The same line goes into `agent.log`, where the diagnosis
/// reads it. `what` names the process (`the agent`, `the container`).
pub fn agent_crash(
    cell_dir: &std::path::Path,
    what: &str,
    exit_code: Option<i32>,
    signal: Option<i32>,
) -> orch_protocol::Failure {
    let signal = signal.or_else(|| exit_code.and_then(orch_protocol::signal_of_exit_code));
    let how = match (signal, exit_code) {
        (Some(s), Some(c)) if c != 0 => format!(
            "the agent crashed: {what} was killed by {} (exit code {c})",
            orch_protocol::describe_signal(s)
        ),
        (Some(s), _) => format!(
            "the agent crashed: {what} was killed by {}",
            orch_protocol::describe_signal(s)
        ),
        (None, Some(c)) => format!("the agent crashed: {what} exited with code {c} without a result"),
        (None, None) => format!("the agent crashed: {what} ended without a result (no exit status)"),
    };
    note_agent_log(cell_dir, &how);
    let tail = agent_log_tail(cell_dir, 3);
    let message = if tail.is_empty() {
        format!("{how}; the agent wrote nothing to its stderr")
    } else {
        format!("{how}; its last stderr lines: {}", tail.join(" | "))
    };
    orch_protocol::Failure {
        kind: FailureKind::AgentCrashed,
        message,
        exit_code,
        signal,
    }
}

/// The static agent for containers: `ORCH_AGENT_STATIC`, else
/// `orch-agent-static` beside `orch`, else the static build in the cargo
/// target folder beside `orch` (`scripts/build-agent.sh` makes it).
/// "Beside `orch`" is beside the executable itself: `current_exe` is
/// `/proc/self/exe`, with every symlink resolved, so `~/.local/bin/orch`
/// linked by `uv tool install` to its venv finds the venv's
/// `bin/orch-agent-static`, as `pip install` into a venv puts it.
pub fn find_static_agent() -> Result<std::path::PathBuf, BackendError> {
    let mut candidates: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("ORCH_AGENT_STATIC").filter(|p| !p.is_empty()) {
        candidates.push(std::path::PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("orch-agent-static"));
            // target/{debug,release}/orch -> target/x86_64-unknown-linux-gnu/release/orch-agent
            if let Some(target) = dir.parent() {
                candidates.push(target.join(format!(
                    "{}-unknown-linux-gnu/release/orch-agent",
                    std::env::consts::ARCH
                )));
            }
            if let Some(target) = dir.parent().and_then(|d| d.parent()) {
                candidates.push(target.join(format!(
                    "{}-unknown-linux-gnu/release/orch-agent",
                    std::env::consts::ARCH
                )));
            }
        }
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| BackendError::Unavailable {
            backend: "container",
            message: format!(
                "no static agent found (looked at {})",
                candidates
                    .iter()
                    .map(|p| format!("`{}`", p.display()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            hint: "install orch from its wheel or release archive (both carry `orch-agent-static` beside `orch`), run `bash scripts/prepare-docker.sh` in a checkout, or set `ORCH_AGENT_STATIC`".into(),
        })
}

/// Is this build of orch static (`+crt-static`, as the wheel and the
/// release archive ship it, and `scripts/prepare-modal.sh` builds it)?
pub const IS_STATIC: bool = cfg!(target_feature = "crt-static");

/// The static `orch` that remote setups run (a Modal sandbox, the agent
/// image's Job): `ORCH_STATIC`, else the running `orch` when it is static
/// (an installed wheel or release archive), else `orch-static` beside
/// `orch`, else the static build in the target folder
/// (`scripts/prepare-modal.sh` makes it).
pub fn find_static_orch() -> Result<PathBuf, BackendError> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("ORCH_STATIC").filter(|p| !p.is_empty()) {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if IS_STATIC {
            candidates.push(exe.clone());
        }
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("orch-static"));
            for up in [dir.parent(), dir.parent().and_then(|d| d.parent())]
                .into_iter()
                .flatten()
            {
                candidates.push(up.join(format!(
                    "{}-unknown-linux-gnu/release/orch",
                    std::env::consts::ARCH
                )));
            }
        }
    }
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        BackendError::User(format!(
            "no static `orch` for remote setups (looked at {})\nhint: build it with `bash scripts/prepare-modal.sh`, or set `ORCH_STATIC`",
            candidates.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// The SHA-256 of a file, in hex (`orch --version` names the agent it ships).
pub fn sha256_file(path: &std::path::Path) -> std::io::Result<String> {
    use sha2::Digest as _;
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

impl orch_protocol::ErrorClass for BackendError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::Status;

    #[test]
    fn a_crash_names_the_signal_and_keeps_the_agent_stderr() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("agent.log"),
            "starting\nfirst\nsecond\nlast words\n",
        )
        .unwrap();
        // A container runtime reports SIGFPE as exit code 136.
        let f = agent_crash(dir.path(), "the container", Some(136), None);
        assert_eq!(f.kind, FailureKind::AgentCrashed);
        assert_eq!(f.signal, Some(8));
        assert!(f.message.contains("SIGFPE (signal 8)"), "{}", f.message);
        assert!(f.message.contains("first | second | last words"), "{}", f.message);
        assert!(!f.message.contains("starting"), "{}", f.message);
        let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
        assert!(
            log.ends_with(
                "orch: the agent crashed: the container was killed by SIGFPE (signal 8) (exit code 136)\n"
            ),
            "{log}"
        );
        // The note is orch's, not the agent's: a second look leaves it out.
        assert_eq!(agent_log_tail(dir.path(), 1), vec!["last words".to_string()]);
        let f = agent_crash(dir.path(), "the agent", None, Some(11));
        assert!(f.message.contains("SIGSEGV"), "{}", f.message);
        let f = agent_crash(dir.path(), "the agent", Some(3), None);
        assert_eq!(f.signal, None);
        assert!(f.message.contains("exited with code 3"), "{}", f.message);
    }

    #[test]
    fn relay_measures_provision_until_the_agent_started() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut relay = EventRelay::new("c", tx);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let started = Event::Started {
            cell_id: "c".into(),
            agent_version: "x".into(),
            pid: 1,
        };
        assert!(relay.line(&started.to_line()).is_none());
        assert!(matches!(
            rx.try_recv().map(|e| e.event),
            Ok(Event::Started { .. })
        ));
        let p = relay.provision_s().unwrap();
        assert!((0.03..1.0).contains(&p), "{p}");
        std::thread::sleep(std::time::Duration::from_millis(30));
        // A later `Started` (none is sent, but a replayed stream) changes nothing.
        relay.line(&started.to_line());
        assert_eq!(relay.provision_s(), Some(p));
        let result = Event::Result {
            result: CellResult::new("c", Status::Succeeded),
        };
        let r = relay.line(&result.to_line()).unwrap();
        assert_eq!(r.timings.get(&Phase::Provision), Some(&p));
        // A result made up for a dead agent gets it too; one without a
        // `Started` (the agent never ran) gets none.
        let made_up = relay.stamp(CellResult::new("c", Status::Failed));
        assert_eq!(made_up.timings.get(&Phase::Provision), Some(&p));
        let (tx, _rx) = mpsc::unbounded_channel();
        let never = EventRelay::new("c", tx);
        assert!(never
            .stamp(CellResult::new("c", Status::Failed))
            .timings
            .is_empty());
    }
}
