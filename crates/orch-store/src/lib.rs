//! The result store: a directory with one folder per run.
//!
//! ```text
//! <store>/<run-id>/
//!   run.json              run metadata (suite, environment, backend, state)
//!   manifest.yaml         the manifest as given
//!   plan.json             the resolved, expanded plan (what `--resume` runs)
//!   cells/<cell-id>/      task.json, stdout.log, stderr.log, events.jsonl, agent.log
//!   cells/<cell-id>/result.json   the cell's record; its presence means "done"
//!   interrupted/<cell-id>.<n>/    earlier attempts that never finished
//! ```
//!
//! Invariant: a cell's `result.json` is written last, atomically (temporary
//! file, fsync, rename, fsync of the folder). A run killed at any moment has
//! every finished cell's record whole, and no half-written one.

use chrono::{DateTime, Utc};
use orch_cost::LedgerLine;
use orch_manifest::Plan;
use orch_protocol::{CellResult, Failure, Phase, Status, StreamInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod backend;
mod folder;
mod ledger;
pub use backend::StoreBackend;
pub use folder::FolderStore;
pub use ledger::{cell_model, parallel_map, parallel_map_with, LEDGER_FILE};

pub const DEFAULT_STORE: &str = "results";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is damaged: {source}\nhint: the file was edited, cut short or written by another version of orch; move it aside to read the rest", path.display())]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("no run `{id}` in the store `{store}`\nhint: `orch ls` lists the runs; pass `--store DIR` (or `--store s3://bucket/prefix`) if they are elsewhere")]
    NoSuchRun { id: String, store: String },
    #[error("`{id}` matches several runs: {}\nhint: give more of the id", matches.join(", "))]
    Ambiguous { id: String, matches: Vec<String> },
    /// The id drawn for a new run is taken (two runs of one suite in the
    /// same second drew the same salt); [`Store::create_run`] draws again.
    #[error("the run `{id}` already exists in `{store}`\nhint: start the run again: a new id is drawn")]
    RunExists { id: String, store: String },
    #[error("no cell `{cell}` in run `{run}`\nhint: `orch show {run}` lists its cells")]
    NoSuchCell { run: String, cell: String },
    /// A name from a manifest, an agent or a remote store that would leave
    /// the run's folder (`..`, `/`, an absolute path) or is not a plain name.
    #[error("refusing the {what} `{name}`: it is not a plain name inside the run\nhint: ids and file names are single path components without `/`, `\\`, `..` or control characters")]
    Unsafe { what: &'static str, name: String },
    /// Another process took this attempt at the cell (object stores).
    #[error("cell `{cell}` of run `{run}` is being run by another process ({by})")]
    Claimed { run: String, cell: String, by: String },
    /// Another process recorded this cell first; this attempt's record is
    /// kept as an earlier attempt.
    #[error("cell `{cell}` of run `{run}` was already recorded by another process ({by})")]
    RecordedElsewhere { run: String, cell: String, by: String },
    /// An object store's failure. `user` when the user must fix it
    /// (credentials, bucket, URL); the message never holds a secret.
    #[error("{message}\nhint: {hint}")]
    Remote {
        message: String,
        hint: String,
        user: bool,
    },
}

impl StoreError {
    /// True when the user named something that is not there.
    pub fn is_user_error(&self) -> bool {
        match self {
            StoreError::NoSuchRun { .. }
            | StoreError::Ambiguous { .. }
            | StoreError::NoSuchCell { .. }
            | StoreError::Unsafe { .. } => true,
            StoreError::Remote { user, .. } => *user,
            _ => false,
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

pub(crate) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + use<'a> {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

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
    pub budget: Option<orch_cost::BudgetRecord>,
}

/// The stored record of one finished cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRecord {
    pub id: String,
    pub benchmark: String,
    pub status: Status,
    pub gpu: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metrics: BTreeMap<String, f64>,
    pub timings: BTreeMap<Phase, f64>,
    pub failure: Option<Failure>,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Wall-clock seconds from launch to record, as the host saw it.
    pub duration_s: f64,
    pub stdout: StreamInfo,
    pub stderr: StreamInfo,
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
    /// 1 for the first try; earlier unfinished tries are under `interrupted/`.
    pub attempt: u32,
    /// The named cause of a failure, read from the cell's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<orch_diagnose::Diagnosis>,
    /// The hardware the cell ran on (GPUs, driver, CUDA), as the agent saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<orch_protocol::Hardware>,
    /// `hardware_mismatch`, `degraded_gpu`: the numbers are suspect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// What the cell cost, by phase; a failed cell's cost is waste.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<orch_cost::CellCost>,
}

impl CellRecord {
    pub fn from_result(
        plan_cell: &orch_manifest::CellPlan,
        result: CellResult,
        started_at: DateTime<Utc>,
        finished_at: DateTime<Utc>,
        attempt: u32,
    ) -> CellRecord {
        CellRecord {
            id: plan_cell.id.clone(),
            benchmark: plan_cell.benchmark.clone(),
            status: result.status,
            gpu: plan_cell.gpu.to_string(),
            params: plan_cell.params.clone(),
            metrics: result.metrics,
            timings: result.timings,
            failure: result.failure,
            started_at,
            finished_at,
            duration_s: (finished_at - started_at).num_milliseconds() as f64 / 1000.0,
            stdout: result.stdout,
            stderr: result.stderr,
            info: result.info,
            attempt,
            diagnosis: None,
            hardware: result.hardware,
            flags: result.flags,
            cost: None,
        }
    }
}

/// A cell as shown in a run record: its record, or `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellView {
    pub id: String,
    pub benchmark: String,
    /// `succeeded`, `failed`, `oom`, `timeout`, `cancelled` or `pending`.
    pub status: String,
    pub gpu: String,
    pub params: BTreeMap<String, serde_json::Value>,
    pub metrics: BTreeMap<String, f64>,
    pub timings: BTreeMap<Phase, f64>,
    pub failure: Option<Failure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    #[serde(default)]
    pub info: BTreeMap<String, serde_json::Value>,
    /// The named cause of a failure (`{kind, evidence, hint}`), when it failed.
    #[serde(default)]
    pub diagnosis: Option<orch_diagnose::Diagnosis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<orch_protocol::Hardware>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<orch_cost::CellCost>,
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
    pub cost: Option<orch_cost::RunCost>,
    /// The cap of `--max-cost`, and whether it stopped the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<orch_cost::BudgetRecord>,
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

/// A result store: a folder ([`Store::new`]) or any other [`StoreBackend`]
/// (an object store). Commands use this type and never know which it is.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn StoreBackend>,
}

impl Store {
    /// The folder store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store {
            backend: Arc::new(FolderStore::new(root)),
        }
    }

    /// A store over another implementation (an object store).
    pub fn with_backend(backend: Arc<dyn StoreBackend>) -> Store {
        Store { backend }
    }

    /// Where the store is, for messages: `results`, `s3://bucket/prefix`.
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// The folder of a folder store; `None` for an object store.
    pub fn root(&self) -> Option<&Path> {
        self.backend.folder()
    }

    pub fn backend(&self) -> &Arc<dyn StoreBackend> {
        &self.backend
    }

    /// Make a new run holding the manifest, the plan and the metadata.
    pub fn create_run(
        &self,
        plan: &Plan,
        manifest_text: &str,
        backend: &str,
        environment: Environment,
    ) -> Result<Run> {
        for c in &plan.cells {
            check_name("cell id", &c.id)?;
        }
        // An id taken by another run (same suite, same second, same 16-bit
        // salt) is drawn again: the next draw has other nanoseconds.
        let mut taken = Vec::new();
        loop {
            match self.try_create_run(plan, manifest_text, backend, environment.clone(), &taken) {
                Err(StoreError::RunExists { id, .. }) if taken.len() < 8 => taken.push(id),
                other => return other,
            }
        }
    }

    fn try_create_run(
        &self,
        plan: &Plan,
        manifest_text: &str,
        backend: &str,
        environment: Environment,
        taken: &[String],
    ) -> Result<Run> {
        let (now, id) = loop {
            let now = Utc::now();
            let id = new_run_id(now, &plan.suite);
            if !taken.contains(&id) {
                break (now, id);
            }
        };
        check_name("run id", &id)?;
        let mut plan = plan.clone();
        for c in &mut plan.cells {
            c.task.run_id = id.clone();
        }
        let meta = RunMeta {
            id: id.clone(),
            suite: plan.suite.clone(),
            created_at: now,
            updated_at: now,
            state: RunState::Running,
            backend: backend.to_string(),
            environment,
            resumes: 0,
            budget: None,
        };
        self.backend.create_run(&meta, manifest_text, &plan)?;
        Ok(Run {
            dir: self.backend.local_dir(&id),
            backend: self.backend.clone(),
            meta,
            plan,
        })
    }

    /// Open a run by id, unique id prefix, or `latest`.
    pub fn open_run(&self, id: &str) -> Result<Run> {
        // An exact id is opened without listing the store.
        if id != "latest" && check_name("run id", id).is_ok() && self.backend.has_run(id)? {
            return self.open_exact(id);
        }
        let ids = self.run_ids()?;
        let resolved = if id == "latest" {
            ids.last().cloned()
        } else if ids.iter().any(|i| i == id) {
            Some(id.to_string())
        } else {
            let matches: Vec<String> = ids
                .iter()
                .filter(|i| i.starts_with(id) || i.contains(id))
                .cloned()
                .collect();
            if matches.len() > 1 {
                return Err(StoreError::Ambiguous {
                    id: id.to_string(),
                    matches,
                });
            }
            matches.into_iter().next()
        };
        let Some(found) = resolved else {
            return Err(StoreError::NoSuchRun {
                id: id.to_string(),
                store: self.location(),
            });
        };
        self.open_exact(&found)
    }

    /// Open the run whose id is exactly `id` (ids listed by [`Store::run_ids`]).
    pub fn open_exact(&self, id: &str) -> Result<Run> {
        check_name("run id", id)?;
        let (meta, plan) = self.backend.load_run(id)?;
        for c in &plan.cells {
            check_name("cell id", &c.id)?;
        }
        Ok(Run {
            dir: self.backend.local_dir(id),
            backend: self.backend.clone(),
            meta,
            plan,
        })
    }

    /// Run ids, oldest first (ids sort by time). Names that could not be a
    /// run's folder (`..`, separators) are never listed.
    pub fn run_ids(&self) -> Result<Vec<String>> {
        let mut ids: Vec<String> = self
            .backend
            .run_ids()?
            .into_iter()
            .filter(|id| check_name("run id", id).is_ok())
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Every run that can be read; a damaged run is skipped.
    pub fn list(&self) -> Result<Vec<RunSummary>> {
        Ok(self.list_checked()?.0)
    }

    /// Every run that can be read, and the errors of those that cannot (a
    /// damaged `run.json`, `plan.json` or cell record, with its path): one
    /// damaged run never hides the others.
    pub fn list_checked(&self) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        self.backend.summaries(self)
    }

    /// A run's summary line, read through its full record.
    pub fn summary_of(&self, id: &str) -> Result<RunSummary> {
        let rec = self.open_exact(id)?.record()?;
        Ok(RunSummary::of(&rec))
    }

    /// Ledger lines of every run in the store (each run's ledger rebuilt
    /// when missing or stale). With `since`, only attempts that finished at
    /// or after it.
    pub fn cost_lines(&self, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        self.backend.cost_lines(self, since)
    }

    /// Durations of the succeeded cells of earlier runs of `suite`, for estimates.
    pub fn history(&self, suite: &str) -> Result<orch_cost::History> {
        self.backend.history(self, suite)
    }
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

/// `20261122-061502-quickstart-3fa2`: sorts by creation time. The suite
/// name is reduced to characters that are safe in a path and a key.
fn new_run_id(now: DateTime<Utc>, suite: &str) -> String {
    let nanos = now.timestamp_subsec_nanos() as u64;
    let salt = (nanos ^ (std::process::id() as u64).rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
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
    format!("{}-{}-{:04x}", now.format("%Y%m%d-%H%M%S"), suite, salt >> 48)
}

/// Check that `name` (a run id, cell id or file name from a manifest, an
/// agent or a remote store) is one plain path component: not empty, not
/// `.` or `..`, no separator, no NUL, no control character, at most 200
/// bytes. Whatever passes can be joined to a folder without leaving it.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 200
        || name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(StoreError::Unsafe {
            what,
            name: name.escape_debug().to_string(),
        });
    }
    Ok(())
}

/// Check a relative path (`variants/a/server.log`) component by component.
pub fn check_relative(what: &'static str, path: &str) -> Result<()> {
    if path.starts_with('/') {
        return Err(StoreError::Unsafe {
            what,
            name: path.escape_debug().to_string(),
        });
    }
    for part in path.split('/') {
        check_name(what, part).map_err(|_| StoreError::Unsafe {
            what,
            name: path.escape_debug().to_string(),
        })?;
    }
    Ok(())
}

/// An open run.
#[derive(Clone)]
pub struct Run {
    backend: Arc<dyn StoreBackend>,
    /// The run's folder on this host: the run itself in a folder store, a
    /// working copy (cells being run, reports) for an object store.
    dir: PathBuf,
    pub meta: RunMeta,
    pub plan: Plan,
}

impl Run {
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The run's folder on this host (see the field).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the run is stored, for messages: a folder or `s3://...`.
    pub fn location(&self) -> String {
        self.backend.run_location(&self.meta.id)
    }

    pub fn cell_dir(&self, cell: &str) -> PathBuf {
        self.dir.join("cells").join(cell)
    }

    /// The finished record of a cell, if it has one.
    pub fn cell_record(&self, cell: &str) -> Result<Option<CellRecord>> {
        check_name("cell id", cell)?;
        self.backend.cell_record(self, cell)
    }

    /// Cells that `--resume` must run: no record, or a `cancelled` one.
    pub fn unfinished_cells(&self) -> Result<Vec<String>> {
        let records = self.backend.cell_records(self)?;
        Ok(self
            .plan
            .cells
            .iter()
            .zip(records)
            .filter(|(_, r)| !r.as_ref().is_some_and(|r| r.status.is_finished()))
            .map(|(c, _)| c.id.clone())
            .collect())
    }

    /// Get a clean folder for a new attempt at `cell`; what an earlier,
    /// unfinished attempt left is kept apart (logs are never thrown away).
    /// Returns the folder and the attempt number. An object store answers
    /// [`StoreError::Claimed`] when another process took this attempt.
    pub fn prepare_cell(&self, cell: &str) -> Result<(PathBuf, u32)> {
        check_name("cell id", cell)?;
        self.backend.prepare_cell(self, cell)
    }

    /// Store a finished cell. Atomic: the record is whole or absent.
    pub fn finish_cell(&self, record: &CellRecord) -> Result<()> {
        check_name("cell id", &record.id)?;
        self.backend.finish_cell(self, record)
    }

    /// Update the run's state (and the time of the update).
    pub fn set_state(&mut self, state: RunState) -> Result<()> {
        self.meta.state = state;
        self.meta.updated_at = Utc::now();
        self.backend.save_meta(&self.meta)
    }

    /// Keep the budget of the run (`--max-cost`) in its metadata.
    pub fn set_budget(&mut self, budget: orch_cost::BudgetRecord) -> Result<()> {
        self.meta.budget = Some(budget);
        self.meta.updated_at = Utc::now();
        self.backend.save_meta(&self.meta)
    }

    pub fn note_resume(&mut self) -> Result<()> {
        self.meta.resumes += 1;
        self.set_state(RunState::Running)
    }

    /// The run as printed by `orch show --json`.
    pub fn record(&self) -> Result<RunRecord> {
        let (records, earlier) = self.backend.all_records(self)?;
        Ok(self.record_from(records, &earlier))
    }

    /// The run record from the current records (in plan order) and the
    /// earlier attempts' records.
    pub fn record_from(&self, records: Vec<Option<CellRecord>>, earlier: &[CellRecord]) -> RunRecord {
        let mut cells = Vec::with_capacity(self.plan.cells.len());
        let mut counts = BTreeMap::new();
        let mut cost = orch_cost::RunCost::default();
        for (c, record) in self.plan.cells.iter().zip(records) {
            if let Some(c) = record.as_ref().and_then(|r| r.cost.as_ref()) {
                cost.add(c, false);
            }
            let view = match record {
                Some(r) => CellView {
                    id: r.id,
                    benchmark: r.benchmark,
                    status: r.status.to_string(),
                    gpu: r.gpu,
                    params: r.params,
                    metrics: r.metrics,
                    timings: r.timings,
                    failure: r.failure,
                    duration_s: Some(r.duration_s),
                    info: r.info,
                    diagnosis: r.diagnosis,
                    hardware: r.hardware,
                    flags: r.flags,
                    cost: r.cost,
                },
                None => CellView {
                    id: c.id.clone(),
                    benchmark: c.benchmark.clone(),
                    status: "pending".into(),
                    gpu: c.gpu.to_string(),
                    params: c.params.clone(),
                    metrics: BTreeMap::new(),
                    timings: BTreeMap::new(),
                    failure: None,
                    duration_s: None,
                    info: BTreeMap::new(),
                    diagnosis: None,
                    hardware: None,
                    flags: Vec::new(),
                    cost: None,
                },
            };
            *counts.entry(view.status.clone()).or_insert(0) += 1;
            cells.push(view);
        }
        for r in earlier {
            if let Some(c) = &r.cost {
                cost.add(c, true);
            }
        }
        let all_done = cells
            .iter()
            .all(|c| c.status != "pending" && c.status != "cancelled");
        let state = match self.meta.state {
            RunState::Running if all_done => RunState::Complete,
            s => s,
        };
        RunRecord {
            id: self.meta.id.clone(),
            suite: self.meta.suite.clone(),
            state,
            created_at: self.meta.created_at,
            updated_at: self.meta.updated_at,
            backend: self.meta.backend.clone(),
            environment: self.meta.environment.clone(),
            counts,
            cells,
            cost: (cost.cells > 0).then_some(cost),
            budget: self.meta.budget.clone(),
        }
    }

    /// Fail with [`StoreError::NoSuchCell`] unless `cell` is in the plan.
    pub fn check_cell(&self, cell: &str) -> Result<()> {
        if !self.plan.cells.iter().any(|c| c.id == cell) {
            return Err(StoreError::NoSuchCell {
                run: self.meta.id.clone(),
                cell: cell.to_string(),
            });
        }
        Ok(())
    }

    /// Path of a cell's log stream (`stdout` or `stderr`) on this host.
    pub fn log_path(&self, cell: &str, stream: &str) -> Result<PathBuf> {
        self.check_cell(cell)?;
        Ok(self.cell_dir(cell).join(format!("{stream}.log")))
    }

    /// Bytes of a file of a cell's current attempt (`stdout.log`), from
    /// byte `offset` on; `None` when the cell has no such file (yet). For an
    /// object store this includes what a running cell has uploaded so far.
    pub fn read_cell_file(&self, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        self.check_cell(cell)?;
        check_relative("file name", name)?;
        self.backend.read_cell_file(self, cell, name, offset)
    }
}

/// Write a file so that readers see the old content or the whole new one,
/// and the new one survives a power cut once this returns.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{seq}", std::process::id()));
    // `create_new` (O_EXCL) never follows a link planted under the
    // temporary name; whatever is there is a leftover and goes first.
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    f.write_all(bytes).map_err(io("write", &tmp))?;
    f.sync_all().map_err(io("sync", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io("rename into place", path))?;
    if let Some(parent) = path.parent() {
        // Make the rename itself durable.
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes)
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(io("read", path))?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
}

/// The environment of this host, for the run record.
pub fn host_environment(manifest: &Path, argv: Vec<String>) -> Environment {
    Environment {
        hostname: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        os: std::env::consts::OS.into(),
        arch: std::env::consts::ARCH.into(),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        orch_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: git_commit(manifest),
        argv,
    }
}

fn git_commit(manifest: &Path) -> Option<String> {
    let dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let out = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_manifest::{load_str, ExpandOptions};

    fn plan() -> Plan {
        load_str(
            "name: t\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n    matrix: {x: [1, 2]}\n",
            Path::new("t.yaml"),
            &ExpandOptions::default(),
        )
        .unwrap()
    }

    fn env() -> Environment {
        host_environment(Path::new("t.yaml"), vec!["orch".into()])
    }

    /// The folder store, whose first run id is taken by another run.
    struct FirstIdTaken {
        inner: FolderStore,
        refused: std::sync::Mutex<Vec<String>>,
    }

    impl StoreBackend for FirstIdTaken {
        fn location(&self) -> String {
            self.inner.location()
        }
        fn run_location(&self, id: &str) -> String {
            self.inner.run_location(id)
        }
        fn local_dir(&self, id: &str) -> PathBuf {
            self.inner.local_dir(id)
        }
        fn run_ids(&self) -> Result<Vec<String>> {
            self.inner.run_ids()
        }
        fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()> {
            let mut refused = self.refused.lock().unwrap();
            if refused.is_empty() {
                refused.push(meta.id.clone());
                return Err(StoreError::RunExists {
                    id: meta.id.clone(),
                    store: self.location(),
                });
            }
            self.inner.create_run(meta, manifest_text, plan)
        }
        fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)> {
            self.inner.load_run(id)
        }
        fn save_meta(&self, meta: &RunMeta) -> Result<()> {
            self.inner.save_meta(meta)
        }
        fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
            self.inner.cell_record(run, cell)
        }
        fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>> {
            self.inner.earlier_records(run)
        }
        fn prepare_cell(&self, run: &Run, cell: &str) -> Result<(PathBuf, u32)> {
            self.inner.prepare_cell(run, cell)
        }
        fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()> {
            self.inner.finish_cell(run, record)
        }
        fn ledger(&self, run: &Run) -> Result<Vec<orch_cost::LedgerLine>> {
            self.inner.ledger(run)
        }
        fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
            self.inner.read_cell_file(run, cell, name, offset)
        }
    }

    #[test]
    fn a_taken_run_id_is_drawn_again() {
        let tmp = tempfile::tempdir().unwrap();
        let backend = Arc::new(FirstIdTaken {
            inner: FolderStore::new(tmp.path()),
            refused: Default::default(),
        });
        let store = Store::with_backend(backend.clone());
        let run = store.create_run(&plan(), "name: t\n", "local", env()).unwrap();
        let refused = backend.refused.lock().unwrap().clone();
        assert_eq!(refused.len(), 1);
        assert_ne!(run.id(), refused[0]);
        assert_eq!(store.run_ids().unwrap(), vec![run.id().to_string()]);
    }

    #[test]
    fn the_folder_store_says_when_a_run_id_is_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = store.create_run(&plan(), "name: t\n", "local", env()).unwrap();
        let err = FolderStore::new(tmp.path())
            .create_run(&run.meta, "name: t\n", &run.plan)
            .unwrap_err();
        assert!(
            matches!(err, StoreError::RunExists { ref id, .. } if id == run.id()),
            "{err}"
        );
    }

    #[test]
    fn run_lifecycle_and_resume_set() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let plan = plan();
        let run = store.create_run(&plan, "name: t\n", "local", env()).unwrap();
        assert!(run.plan.cells.iter().all(|c| c.task.run_id == run.id()));
        assert_eq!(run.unfinished_cells().unwrap().len(), 2);

        let cell = &run.plan.cells[0];
        let (dir, attempt) = run.prepare_cell(&cell.id).unwrap();
        assert_eq!(attempt, 1);
        std::fs::write(dir.join("stdout.log"), "first try").unwrap();
        // The first try dies; the second moves its logs aside.
        let (_, attempt) = run.prepare_cell(&cell.id).unwrap();
        assert_eq!(attempt, 2);
        assert!(run
            .dir()
            .join("interrupted")
            .join(format!("{}.1", cell.id))
            .join("stdout.log")
            .exists());

        let now = Utc::now();
        let rec = CellRecord::from_result(
            cell,
            CellResult::new(&cell.id, Status::Succeeded),
            now,
            now,
            attempt,
        );
        run.finish_cell(&rec).unwrap();
        assert_eq!(
            run.unfinished_cells().unwrap(),
            vec![run.plan.cells[1].id.clone()]
        );

        let again = store.open_run("latest").unwrap();
        let record = again.record().unwrap();
        assert_eq!(record.state, RunState::Running);
        assert_eq!(record.counts.get("succeeded"), Some(&1));
        assert_eq!(record.counts.get("pending"), Some(&1));
        let by_prefix = store.open_run(&run.id()[..15]).unwrap();
        assert_eq!(by_prefix.id(), run.id());
        assert!(matches!(
            store.open_run("nope"),
            Err(StoreError::NoSuchRun { .. })
        ));
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn cancelled_cells_are_run_again() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        let now = Utc::now();
        for (c, s) in run.plan.cells.iter().zip([Status::Cancelled, Status::Failed]) {
            run.finish_cell(&CellRecord::from_result(
                c,
                CellResult::new(&c.id, s),
                now,
                now,
                1,
            ))
            .unwrap();
        }
        assert_eq!(
            run.unfinished_cells().unwrap(),
            vec![run.plan.cells[0].id.clone()]
        );
    }

    #[test]
    fn atomic_write_leaves_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.json");
        write_json(&p, &serde_json::json!({"a": 1})).unwrap();
        write_json(&p, &serde_json::json!({"a": 2})).unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        let v: serde_json::Value = read_json(&p).unwrap();
        assert_eq!(v["a"], 2);
    }

    #[test]
    fn names_that_leave_the_folder_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "/etc/passwd",
            "a/b",
            "a\\b",
            "a\0b",
            "a\nb",
        ] {
            assert!(check_name("cell id", bad).is_err(), "{bad:?}");
        }
        for good in ["transformer.none.preset-small", "a..b", "x-1_2.y"] {
            check_name("cell id", good).unwrap();
        }
        assert!(check_relative("file", "variants/a/server.log").is_ok());
        for bad in ["../x", "/abs", "a//b", "a/../b", "a/./b"] {
            assert!(check_relative("file", bad).is_err(), "{bad:?}");
        }
        let e = check_name("cell id", "../../etc").unwrap_err();
        assert!(e.is_user_error());
        assert!(e.to_string().contains("../../etc") && e.to_string().contains("hint:"));
    }

    #[test]
    fn a_hostile_plan_never_writes_outside_the_run() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path().join("store"));
        let mut p = plan();
        p.cells[0].id = "../../escaped".into();
        assert!(matches!(
            store.create_run(&p, "", "local", env()),
            Err(StoreError::Unsafe { .. })
        ));
        // The same plan edited into a stored run: refused when opened.
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        let path = run.dir().join("plan.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let first = run.plan.cells[0].id.clone();
        std::fs::write(&path, text.replace(&format!("\"{first}\""), "\"../../escaped\"")).unwrap();
        assert!(matches!(store.open_run(run.id()), Err(StoreError::Unsafe { .. })));
        assert!(run.prepare_cell("../../escaped").is_err());
        assert!(run.read_cell_file(&first, "../../../etc/passwd", 0).is_err());
        assert!(!tmp.path().join("escaped").exists());
        // `orch ls` still answers, naming the damaged run.
        let (ok, damaged) = store.list_checked().unwrap();
        assert!(ok.is_empty());
        assert_eq!(damaged.len(), 1);
    }

    #[test]
    fn a_store_with_a_corrupted_record_still_lists() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let good = store.create_run(&plan(), "", "local", env()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let bad_record = store.create_run(&plan(), "", "local", env()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let bad_meta = store.create_run(&plan(), "", "local", env()).unwrap();
        let now = Utc::now();
        let cell = &bad_record.plan.cells[0];
        bad_record
            .finish_cell(&CellRecord::from_result(
                cell,
                CellResult::new(&cell.id, Status::Succeeded),
                now,
                now,
                1,
            ))
            .unwrap();
        // Cut short, as a full disk or a crash of an editor would leave it.
        let rec = bad_record.cell_dir(&cell.id).join("result.json");
        let text = std::fs::read(&rec).unwrap();
        std::fs::write(&rec, &text[..text.len() / 2]).unwrap();
        std::fs::write(bad_meta.dir().join("run.json"), "{\"id\": ").unwrap();

        let e = bad_record.record().unwrap_err();
        assert!(matches!(e, StoreError::Corrupt { .. }));
        assert!(e.to_string().contains(&rec.display().to_string()), "{e}");
        let (ok, damaged) = store.list_checked().unwrap();
        assert_eq!(
            ok.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            vec![good.id()]
        );
        assert_eq!(damaged.len(), 2);
        let text: Vec<String> = damaged.iter().map(|e| e.to_string()).collect();
        assert!(text.iter().any(|t| t.contains("result.json")), "{text:?}");
        assert!(text.iter().any(|t| t.contains("run.json")), "{text:?}");
        // `orch cost` names the damaged file; estimates skip the damaged run.
        let e = store.cost_lines(None).unwrap_err();
        assert!(e.to_string().contains(".json` is damaged"), "{e}");
        assert!(store.history("t").is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn links_in_the_store_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), "x").unwrap();
        let store = Store::new(tmp.path().join("store"));
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        // A run folder that is a link elsewhere is not a run of this store.
        let other = tmp.path().join("other-run");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::copy(run.dir().join("run.json"), other.join("run.json")).unwrap();
        std::os::unix::fs::symlink(&other, tmp.path().join("store").join("20990101-000000-link-0000"))
            .unwrap();
        assert_eq!(store.run_ids().unwrap(), vec![run.id().to_string()]);
        // A cell folder replaced by a link is moved aside, never followed.
        let cell = run.plan.cells[0].id.clone();
        std::os::unix::fs::symlink(&outside, run.cell_dir(&cell)).unwrap();
        let (dir, attempt) = run.prepare_cell(&cell).unwrap();
        assert_eq!(attempt, 2);
        assert!(!std::fs::symlink_metadata(&dir).unwrap().file_type().is_symlink());
        assert!(outside.join("keep.txt").exists());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
    }
}
