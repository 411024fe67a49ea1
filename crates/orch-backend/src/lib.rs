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

pub mod docker;
pub mod fake;
pub mod home;
pub mod local;
pub mod secrets;

pub use secrets::host_masker;

use async_trait::async_trait;
use orch_protocol::{CellResult, Event, Phase, TaskSpec};
use std::path::PathBuf;
use tokio::sync::{mpsc, watch};

/// The backends orch has or will have, by name.
pub const BACKENDS: &[&str] = &["local", "docker", "kubernetes", "modal", "slurm"];

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
    /// The backend named is designed but not built yet.
    #[error(
        "backend `{0}` is not available in this version of orch\nhint: use `--backend local` (the default) or `--backend docker`"
    )]
    NotBuilt(String),
    #[error("unknown backend `{0}`\nhint: the backends are local, docker, kubernetes, modal and slurm")]
    Unknown(String),
    #[error("{action}: {source}")]
    Io { action: String, source: std::io::Error },
}

impl BackendError {
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            BackendError::Unavailable { .. } | BackendError::NotBuilt(_) | BackendError::Unknown(_)
        )
    }
}

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
    async fn run_cell(
        &self,
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        cancel: watch::Receiver<bool>,
    ) -> Result<CellResult, BackendError>;

    /// Remove whatever a run left behind (containers, jobs, sandboxes).
    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError>;
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

/// Check a backend name: `Ok` for those built, a clear error for the others.
pub fn check_name(name: &str) -> Result<(), BackendError> {
    match name {
        "local" | "docker" | "slurm" => Ok(()),
        "modal" | "kubernetes" => Ok(()),
        n if BACKENDS.contains(&n) => Err(BackendError::NotBuilt(n.to_string())),
        n => Err(BackendError::Unknown(n.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::Status;

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
