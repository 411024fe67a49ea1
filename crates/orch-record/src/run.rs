//! A run: its stored metadata (`run.json`), the whole run as `orch show
//! --json` prints it and reports read it, and its line in `orch ls`.

use crate::{BudgetRecord, CellView, RunCost};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the run was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Environment {
    pub hostname: String,
    pub os: String,
    pub arch: String,
    pub cpus: usize,
    pub orch_version: String,
    /// Commit of the git repository the manifest is in, if any.
    pub git_commit: Option<String>,
    /// The command line (secrets are never on it: they come from the environment).
    pub argv: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Cells are being run (or `orch` died while running them).
    Running,
    /// Every cell has a record.
    Complete,
    /// Stopped (Ctrl-C, the budget, a failure) before every cell finished.
    Interrupted,
    /// Stopped because the result store could not be reached or written
    /// (an outage that outlasted its budget); `--resume` runs the rest.
    StoreUnreachable,
}

impl RunState {
    /// The state as stored and shown (`running`, `store_unreachable`).
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Complete => "complete",
            RunState::Interrupted => "interrupted",
            RunState::StoreUnreachable => "store_unreachable",
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub id: String,
    pub suite: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub state: RunState,
    pub backend: String,
    pub environment: Environment,
    /// How many times the run was resumed.
    #[serde(default)]
    pub resumes: u32,
    /// The cap of `orch run --max-cost` and whether it stopped the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRecord>,
}

/// The whole run as `orch show --json` and `orch run --json` print it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub suite: String,
    pub state: RunState,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub backend: String,
    pub environment: Environment,
    /// Cells per status.
    pub counts: BTreeMap<String, usize>,
    pub cells: Vec<CellView>,
    /// What the run cost: its cells' costs summed (earlier attempts included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<RunCost>,
    /// The cap of `--max-cost`, and whether it stopped the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRecord>,
}

/// One line of `orch ls`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub id: String,
    pub suite: String,
    pub state: RunState,
    pub created_at: DateTime<Utc>,
    pub backend: String,
    pub cells: usize,
    pub counts: BTreeMap<String, usize>,
}

impl RunSummary {
    pub fn of(rec: &RunRecord) -> RunSummary {
        RunSummary {
            id: rec.id.clone(),
            suite: rec.suite.clone(),
            state: rec.state,
            created_at: rec.created_at,
            backend: rec.backend.clone(),
            cells: rec.cells.len(),
            counts: rec.counts.clone(),
        }
    }
}

/// A run's id: `<yyyymmdd-hhmmss>-<suite>-<salt>` (UTC, the salt as four hex
/// digits), which sorts by creation time; the suite name reduced to
/// characters safe in a path and a key. The one place the format is made:
/// the store names new runs with it, `--dry-run`s name objects with it.
pub fn run_id(now: DateTime<Utc>, suite: &str, salt: u16) -> String {
    let suite: String = suite
        .chars()
        .take(40)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{}-{}-{:04x}", now.format("%Y%m%d-%H%M%S"), suite, salt)
}

#[cfg(test)]
mod state_tests {
    use super::RunState;

    #[test]
    fn states_read_as_stored_and_show_as_stored() {
        for s in [
            RunState::Running,
            RunState::Complete,
            RunState::Interrupted,
            RunState::StoreUnreachable,
        ] {
            let text = serde_json::to_string(&s).unwrap();
            assert_eq!(text, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<RunState>(&text).unwrap(), s);
            assert_eq!(s.to_string(), s.as_str());
        }
        // The states of runs stored before this one still read.
        assert_eq!(
            serde_json::from_str::<RunState>("\"interrupted\"").unwrap(),
            RunState::Interrupted
        );
    }
}
