//! The `local` backend: the agent as a child process per cell.
//!
//! The agent writes the workload's logs and its `agent-result.json` straight
//! into the cell folder and prints events on its stdout, which this backend
//! copies to `events.jsonl` and relays. The agent's own stderr goes to
//! `agent.log`. The host's record is `result.json` beside it, a name the
//! agent never writes: when `orch` dies in between, the cell has no record
//! and `--resume` runs it again (the attempt kept in `interrupted/`).
//! The agent dies with `orch` (`PR_SET_PDEATHSIG`), so a killed `orch` leaves
//! no cell running.

use crate::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use crate::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use async_trait::async_trait;
use orch_protocol::{CellResult, Failure, FailureKind, Status};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

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

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    /// Cells run here, where the task's paths are.
    fn ships_files(&self) -> bool {
        false
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

    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran {
        let mut cell = Cell::with_events(launch, events)?;
        let mut child = self.spawn(&mut cell).await?;
        Ok(lifecycle::drive(&mut child, cell, cancel).await)
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

impl LocalBackend {
    /// Write the task and start the agent on it.
    async fn spawn(&self, cell: &mut Cell) -> Result<Agent, BackendError> {
        let dir = cell.dir.clone();
        let task_path = dir.join("task.json");
        let mut task = cell.task.clone();
        // On this host the weights volume is the folder itself.
        task.weights_dir = cell
            .launch
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
        // Created empty now, appended to as the agent writes (no descriptor
        // held while the cell runs).
        let agent_log = dir.join("agent.log");
        std::fs::File::create(&agent_log)
            .map_err(|source| io_err(format!("create `{}`", agent_log.display()), source))?;
        let agent_log = crate::AppendFile(agent_log);
        let devices = &cell.launch.devices;
        let mut cmd = Command::new(&self.agent.program);
        cmd.args(&self.agent.prefix)
            .arg("run")
            .arg("--task")
            .arg(&task_path)
            .arg("--out")
            .arg(&dir)
            .envs(cell.launch.secrets.iter().map(|(k, v)| (k, v)))
            .envs((!devices.is_empty()).then(|| ("CUDA_VISIBLE_DEVICES", devices.join(","))))
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
        // What the agent writes on stderr is masked on its way to agent.log.
        let log_copy = child
            .stderr
            .take()
            .map(|err| tokio::spawn(crate::secrets::copy_masked(err, agent_log, cell.masker.clone())));
        let Some(stdout) = child.stdout.take() else {
            return Err(io_err(
                "read the agent's stdout".into(),
                std::io::Error::other("no pipe"),
            ));
        };
        Ok(Agent {
            pid: child.id(),
            child,
            lines: BufReader::new(stdout).lines(),
            log_copy,
            exit: None,
        })
    }
}

/// The agent's child process: the local backend's platform.
struct Agent {
    child: tokio::process::Child,
    pid: Option<u32>,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    log_copy: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    exit: Option<std::process::ExitStatus>,
}

#[async_trait]
impl Platform for Agent {
    fn what(&self) -> &'static str {
        "the agent"
    }

    async fn started(&mut self, _cell: &mut Cell) -> Result<(), Early> {
        Ok(())
    }

    async fn next_line(&mut self, _cell: &mut Cell) -> Option<String> {
        if self.exit.is_some() {
            return None;
        }
        match self.lines.next_line().await {
            Ok(Some(line)) => Some(line),
            Ok(None) | Err(_) => {
                // Its stdout closed: the stream ends when the agent does.
                self.exit = self.child.wait().await.ok();
                if self.exit.is_none() {
                    // Cannot wait for it: an exit status nobody will read.
                    self.exit = Some(std::os::unix::process::ExitStatusExt::from_raw(0));
                }
                None
            }
        }
    }

    async fn stop(&mut self, _cell: &mut Cell, _why: Stop, kill: bool) {
        if kill {
            let _ = self.child.start_kill();
        } else if let Some(pid) = self.pid {
            // SAFETY: plain syscall; a gone process gives ESRCH, which is fine.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
    }

    async fn end(&mut self, cell: &mut Cell, _stopped: Option<Stop>) -> PlatformEnd {
        use std::os::unix::process::ExitStatusExt;
        let exit = match self.exit {
            Some(e) => Some(e),
            None => {
                // The host stopped waiting: the agent goes now.
                let _ = self.child.start_kill();
                self.child.wait().await.ok()
            }
        };
        if let Some(copy) = self.log_copy.take() {
            // The agent's stderr ends with it (nothing it starts keeps it).
            let _ = tokio::time::timeout(Duration::from_secs(5), copy).await;
        }
        let log = std::fs::read_to_string(cell.dir.join("agent.log")).unwrap_or_default();
        let (exit_code, signal) = (exit.and_then(|e| e.code()), exit.and_then(|e| e.signal()));
        // The agent's own allocator gave up: out of memory.
        let verdict = (log.contains("memory allocation of") && log.contains("failed")).then(|| {
            let tail: Vec<&str> = log
                .lines()
                .rev()
                .filter(|l| !l.trim().is_empty())
                .take(3)
                .collect();
            let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
            (
                Status::Oom,
                Failure::new(FailureKind::Oom, format!("the agent ran out of memory: {tail}"))
                    .exited(exit_code, signal),
            )
        });
        PlatformEnd {
            result: Cell::result_file(&cell.dir),
            exit_code,
            signal,
            verdict,
            words: None,
        }
    }

    async fn finish(&mut self, _cell: &mut Cell, _result: &mut CellResult) {}
}
