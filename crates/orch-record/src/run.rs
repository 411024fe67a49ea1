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
    /// Stopped (Ctrl-C) before every cell finished.
    Interrupted,
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
