//! The `local` backend: the agent as a child process per cell.
//!
//! The agent writes the workload's logs and its `result.json` straight into
//! the cell folder and prints events on its stdout, which this backend copies
//! to `events.jsonl` and relays. The agent's own stderr goes to `agent.log`.
//! The agent dies with `orch` (`PR_SET_PDEATHSIG`), so a killed `orch` leaves
//! no cell running.

use crate::{Backend, BackendError, CellEvent, CellLaunch};
use async_trait::async_trait;
use orch_protocol::{CellResult, Failure, Status};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// How to start the agent: a program and the arguments before `run ...`.
#[derive(Debug, Clone)]
pub struct AgentCommand {
    pub program: PathBuf,
    pub prefix: Vec<String>,
}

impl AgentCommand {
    /// `ORCH_AGENT=/path/to/orch-agent` if set, else this very binary with
    /// `prefix` (the `orch` binary carries the agent as `orch agent`).
    pub fn from_env_or_self(prefix: &[&str]) -> Result<AgentCommand, BackendError> {
        if let Some(p) = std::env::var_os("ORCH_AGENT").filter(|p| !p.is_empty()) {
            return Ok(AgentCommand {
                program: PathBuf::from(p),
                prefix: vec![],
            });
        }
        let exe = std::env::current_exe().map_err(|e| BackendError::Unavailable {
            backend: "local",
            message: format!("cannot find the running executable: {e}"),
            hint: "set `ORCH_AGENT` to the path of `orch-agent`".into(),
        })?;
        Ok(AgentCommand {
            program: exe,
            prefix: prefix.iter().map(|s| s.to_string()).collect(),
        })
    }
}

pub struct LocalBackend {
    agent: AgentCommand,
}

impl LocalBackend {
    pub fn new(agent: AgentCommand) -> LocalBackend {
        LocalBackend { agent }
    }
}

/// Extra time the host grants past the task's own timeout before it kills
/// the agent itself (the agent normally enforces the timeout).
const HOST_TIMEOUT_SLACK: Duration = Duration::from_secs(30);

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        let out = Command::new(&self.agent.program)
            .args(&self.agent.prefix)
            .arg("version")
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| BackendError::Unavailable {
                backend: "local",
                message: format!("cannot start the agent `{}`: {e}", self.agent.program.display()),
                hint: "check `ORCH_AGENT`, or unset it to use the agent built into `orch`".into(),
            })?;
        if !out.status.success() {
            return Err(BackendError::Unavailable {
                backend: "local",
                message: format!(
                    "the agent `{}` failed its version check: {}",
                    self.agent.program.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                hint: "check `ORCH_AGENT`, or unset it to use the agent built into `orch`".into(),
            });
        }
        Ok(())
    }

    async fn run_cell(
        &self,
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<CellResult, BackendError> {
        let cell_id = launch.task.cell_id.clone();
        let mut relay = crate::EventRelay::new(&cell_id, events);
        let dir = &launch.cell_dir;
        let task_path = dir.join("task.json");
        let mut task = launch.task.clone();
        // On this host the weights volume is the folder itself.
        task.weights_dir = launch
            .weights_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned());
        let task_json = serde_json::to_vec_pretty(&task).map_err(|e| BackendError::Io {
            action: "serialise the task".into(),
            source: std::io::Error::other(e),
        })?;
        tokio::fs::write(&task_path, task_json)
            .await
            .map_err(|source| io_err(format!("write `{}`", task_path.display()), source))?;
        let agent_log = tokio::fs::File::create(dir.join("agent.log"))
            .await
            .map_err(|source| io_err(format!("create `{}`", dir.join("agent.log").display()), source))?;
        // What the agent sends is masked already; the host masks again (an
        // older agent, its own stderr) before anything reaches the store.
        let masker = crate::host_masker(&launch.secrets);
        let mut events_file = tokio::fs::File::create(dir.join("events.jsonl"))
            .await
            .map_err(|source| io_err(format!("create `{}`", dir.join("events.jsonl").display()), source))?;

        let mut cmd = Command::new(&self.agent.program);
        cmd.args(&self.agent.prefix)
            .arg("run")
            .arg("--task")
            .arg(&task_path)
            .arg("--out")
            .arg(dir)
            .envs(launch.secrets.iter().map(|(k, v)| (k, v)))
            .envs((!launch.devices.is_empty()).then(|| ("CUDA_VISIBLE_DEVICES", launch.devices.join(","))))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        #[cfg(target_os = "linux")]
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| {
            io_err(
                format!("start the agent `{}`", self.agent.program.display()),
                source,
            )
        })?;
        let pid = child.id();
        let log_copy = child
            .stderr
            .take()
            .map(|err| tokio::spawn(crate::secrets::copy_masked(err, agent_log, masker.clone())));
        let Some(stdout) = child.stdout.take() else {
            return Err(io_err(
                "read the agent's stdout".into(),
                std::io::Error::other("no pipe"),
            ));
        };
        let mut lines = BufReader::new(stdout).lines();

        let host_deadline = tokio::time::Instant::now()
            + Duration::from_secs_f64(launch.task.measure.timeout_s + launch.task.measure.kill_grace_s)
            + HOST_TIMEOUT_SLACK;
        let mut result: Option<CellResult> = None;
        let mut stop_sent = false;
        let mut killed_by_host: Option<Status> = None;
        let mut stdout_open = true;
        let kill_after = Duration::from_secs_f64(launch.task.measure.kill_grace_s) + Duration::from_secs(10);
        let mut kill_at: Option<tokio::time::Instant> = None;

        let exit = loop {
            tokio::select! {
                line = lines.next_line(), if stdout_open => match line {
                    Ok(Some(line)) => {
                        let line = crate::secrets::mask_event_line(&masker, &line);
                        let _ = events_file.write_all(line.as_bytes()).await;
                        let _ = events_file.write_all(b"\n").await;
                        if let Some(r) = relay.line(&line) {
                            result = Some(r);
                        }
                    }
                    Ok(None) | Err(_) => stdout_open = false,
                },
                status = child.wait(), if !stdout_open => {
                    break status.map_err(|source| io_err("wait for the agent".into(), source))?;
                }
                changed = cancel.changed(), if !stop_sent => {
                    if changed.is_err() || *cancel.borrow() {
                        stop_sent = true;
                        signal(pid, libc::SIGTERM);
                        kill_at = Some(tokio::time::Instant::now() + kill_after);
                    }
                }
                _ = tokio::time::sleep_until(kill_at.unwrap_or(host_deadline)), if kill_at.is_some() || killed_by_host.is_none() => {
                    if kill_at.take().is_some() {
                        // The agent ignored SIGTERM past its grace period.
                        killed_by_host.get_or_insert(Status::Cancelled);
                        let _ = child.start_kill();
                    } else {
                        killed_by_host = Some(Status::Timeout);
                        signal(pid, libc::SIGTERM);
                        kill_at = Some(tokio::time::Instant::now() + kill_after);
                    }
                }
            }
        };
        let _ = events_file.flush().await;
        if let Some(copy) = log_copy {
            // The agent's stderr ends with it (nothing it starts keeps it).
            let _ = tokio::time::timeout(Duration::from_secs(5), copy).await;
        }

        if let Some(r) = result {
            return Ok(r);
        }
        // No result event: maybe the file made it, else the agent died.
        if let Ok(bytes) = tokio::fs::read(dir.join("result.json")).await {
            if let Ok(r) = serde_json::from_slice::<CellResult>(&bytes) {
                return Ok(relay.stamp(r));
            }
        }
        Ok(relay.stamp(agent_died(&cell_id, dir, exit, killed_by_host)))
    }

    async fn cleanup(&self, _run_id: &str) -> Result<(), BackendError> {
        // Agents die with orch (PDEATHSIG) and take their process groups
        // with them: nothing outlives a run.
        Ok(())
    }
}

fn io_err(action: String, source: std::io::Error) -> BackendError {
    BackendError::Io { action, source }
}

fn signal(pid: Option<u32>, sig: i32) {
    if let Some(pid) = pid {
        // SAFETY: plain syscall; a gone process gives ESRCH, which is fine.
        unsafe {
            libc::kill(pid as i32, sig);
        }
    }
}

/// A result for an agent that ended without reporting one.
fn agent_died(
    cell_id: &str,
    dir: &Path,
    exit: std::process::ExitStatus,
    by_host: Option<Status>,
) -> CellResult {
    use std::os::unix::process::ExitStatusExt;
    let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let tail: Vec<&str> = log
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
    let alloc_failed = log.contains("memory allocation of") && log.contains("failed");
    let (status, kind, message) = match by_host {
        Some(Status::Timeout) => (
            Status::Timeout,
            "timeout",
            "the agent did not finish in time and was killed".to_string(),
        ),
        Some(_) => (
            Status::Cancelled,
            "cancelled",
            "the agent was stopped".to_string(),
        ),
        None if alloc_failed => (Status::Oom, "oom", format!("the agent ran out of memory: {tail}")),
        None => {
            let mut r = CellResult::new(cell_id, Status::Failed);
            r.failure = Some(crate::agent_crash(dir, "the agent", exit.code(), exit.signal()));
            return r;
        }
    };
    let mut r = CellResult::new(cell_id, status);
    r.failure = Some(Failure {
        kind: kind.into(),
        message,
        exit_code: exit.code(),
        signal: exit.signal(),
    });
    r
}
