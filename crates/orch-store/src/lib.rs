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
use orch_manifest::Plan;
use orch_protocol::{CellResult, Failure, Phase, Status, StreamInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

mod ledger;
pub use ledger::{cell_model, LEDGER_FILE};

pub const DEFAULT_STORE: &str = "results";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is damaged: {source}\nhint: the file was edited or written by another version of orch", path.display())]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("no run `{id}` in the store `{}`\nhint: `orch ls` lists the runs; pass `--store DIR` if they are elsewhere", store.display())]
    NoSuchRun { id: String, store: PathBuf },
    #[error("`{id}` matches several runs: {}\nhint: give more of the id", matches.join(", "))]
    Ambiguous { id: String, matches: Vec<String> },
    #[error("no cell `{cell}` in run `{run}`\nhint: `orch show {run}` lists its cells")]
    NoSuchCell { run: String, cell: String },
}

impl StoreError {
    /// True when the user named something that is not there.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            StoreError::NoSuchRun { .. } | StoreError::Ambiguous { .. } | StoreError::NoSuchCell { .. }
        )
    }
}

type Result<T> = std::result::Result<T, StoreError>;

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + use<'a> {
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

pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Make a new run folder holding the manifest, the plan and the metadata.
    pub fn create_run(
        &self,
        plan: &Plan,
        manifest_text: &str,
        backend: &str,
        environment: Environment,
    ) -> Result<Run> {
        std::fs::create_dir_all(&self.root).map_err(io("create the store", &self.root))?;
        let now = Utc::now();
        let id = new_run_id(now, &plan.suite);
        let dir = self.root.join(&id);
        std::fs::create_dir(&dir).map_err(io("create the run folder", &dir))?;
        std::fs::create_dir(dir.join("cells")).map_err(io("create the cells folder", &dir))?;
        write_atomic(&dir.join("manifest.yaml"), manifest_text.as_bytes())?;
        let mut plan = plan.clone();
        for c in &mut plan.cells {
            c.task.run_id = id.clone();
        }
        write_json(&dir.join("plan.json"), &plan)?;
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
        write_json(&dir.join("run.json"), &meta)?;
        Ok(Run { dir, meta, plan })
    }

    /// Open a run by id, unique id prefix, or `latest`.
    pub fn open_run(&self, id: &str) -> Result<Run> {
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
                store: self.root.clone(),
            });
        };
        let dir = self.root.join(&found);
        Ok(Run {
            meta: read_json(&dir.join("run.json"))?,
            plan: read_json(&dir.join("plan.json"))?,
            dir,
        })
    }

    /// Run ids, oldest first (ids sort by time).
    pub fn run_ids(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io("read the store", &self.root)(e)),
        };
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("run.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect();
        ids.sort();
        Ok(ids)
    }

    pub fn list(&self) -> Result<Vec<RunSummary>> {
        let mut out = Vec::new();
        for id in self.run_ids()? {
            let run = self.open_run(&id)?;
            let rec = run.record()?;
            out.push(RunSummary {
                id: rec.id,
                suite: rec.suite,
                state: rec.state,
                created_at: rec.created_at,
                backend: rec.backend,
                cells: rec.cells.len(),
                counts: rec.counts,
            });
        }
        Ok(out)
    }
}

/// `20261122-061502-quickstart-3fa2`: sorts by creation time.
fn new_run_id(now: DateTime<Utc>, suite: &str) -> String {
    let nanos = now.timestamp_subsec_nanos() as u64;
    let salt = (nanos ^ (std::process::id() as u64).rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let suite: String = suite.chars().take(40).collect();
    format!("{}-{}-{:04x}", now.format("%Y%m%d-%H%M%S"), suite, salt >> 48)
}

/// An open run folder.
#[derive(Clone)]
pub struct Run {
    dir: PathBuf,
    pub meta: RunMeta,
    pub plan: Plan,
}

impl Run {
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn cell_dir(&self, cell: &str) -> PathBuf {
        self.dir.join("cells").join(cell)
    }

    /// The finished record of a cell, if it has one.
    pub fn cell_record(&self, cell: &str) -> Result<Option<CellRecord>> {
        let path = self.cell_dir(cell).join("result.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StoreError::Corrupt { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    /// Cells that `--resume` must run: no record, or a `cancelled` one.
    pub fn unfinished_cells(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for c in &self.plan.cells {
            match self.cell_record(&c.id)? {
                Some(r) if r.status.is_finished() => {}
                _ => out.push(c.id.clone()),
            }
        }
        Ok(out)
    }

    /// Get a clean folder for a new attempt at `cell`; what an earlier,
    /// unfinished attempt left is moved to `interrupted/` (logs are never
    /// thrown away). Returns the folder and the attempt number.
    pub fn prepare_cell(&self, cell: &str) -> Result<(PathBuf, u32)> {
        let dir = self.cell_dir(cell);
        let mut attempt = 1;
        if dir.exists() {
            let prior = self.dir.join("interrupted");
            std::fs::create_dir_all(&prior).map_err(io("create", &prior))?;
            let mut n = 1;
            while prior.join(format!("{cell}.{n}")).exists() {
                n += 1;
            }
            attempt = n + 1;
            let to = prior.join(format!("{cell}.{n}"));
            std::fs::rename(&dir, &to).map_err(io("move aside", &dir))?;
        } else if let Ok(entries) = std::fs::read_dir(self.dir.join("interrupted")) {
            let prefix = format!("{cell}.");
            attempt += entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count() as u32;
        }
        std::fs::create_dir_all(&dir).map_err(io("create the cell folder", &dir))?;
        Ok((dir, attempt))
    }

    /// Store a finished cell. Atomic: the record is whole or absent. Its
    /// line is then appended to the cost ledger (a cache of the records).
    pub fn finish_cell(&self, record: &CellRecord) -> Result<()> {
        let dir = self.cell_dir(&record.id);
        std::fs::create_dir_all(&dir).map_err(io("create the cell folder", &dir))?;
        write_json(&dir.join("result.json"), record)?;
        // The ledger is a cache of the records: a line that cannot be
        // appended leaves it stale, and the next reader rebuilds it.
        let _ = self.append_ledger(record);
        Ok(())
    }

    /// Update the run's state (and the time of the update).
    pub fn set_state(&mut self, state: RunState) -> Result<()> {
        self.meta.state = state;
        self.meta.updated_at = Utc::now();
        write_json(&self.dir.join("run.json"), &self.meta)
    }

    /// Keep the budget of the run (`--max-cost`) in its metadata.
    pub fn set_budget(&mut self, budget: orch_cost::BudgetRecord) -> Result<()> {
        self.meta.budget = Some(budget);
        self.meta.updated_at = Utc::now();
        write_json(&self.dir.join("run.json"), &self.meta)
    }

    pub fn note_resume(&mut self) -> Result<()> {
        self.meta.resumes += 1;
        self.set_state(RunState::Running)
    }

    /// The run as printed by `orch show --json`.
    pub fn record(&self) -> Result<RunRecord> {
        let mut cells = Vec::with_capacity(self.plan.cells.len());
        let mut counts = BTreeMap::new();
        let mut cost = orch_cost::RunCost::default();
        for c in &self.plan.cells {
            let record = self.cell_record(&c.id)?;
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
        let all_done = cells
            .iter()
            .all(|c| c.status != "pending" && c.status != "cancelled");
        let state = match self.meta.state {
            RunState::Running if all_done => RunState::Complete,
            s => s,
        };
        Ok(RunRecord {
            id: self.meta.id.clone(),
            suite: self.meta.suite.clone(),
            state,
            created_at: self.meta.created_at,
            updated_at: self.meta.updated_at,
            backend: self.meta.backend.clone(),
            environment: self.meta.environment.clone(),
            counts,
            cells,
            cost: self.add_earlier_attempts(cost),
            budget: self.meta.budget.clone(),
        })
    }

    /// Path of a cell's log stream (`stdout` or `stderr`).
    pub fn log_path(&self, cell: &str, stream: &str) -> Result<PathBuf> {
        if !self.plan.cells.iter().any(|c| c.id == cell) {
            return Err(StoreError::NoSuchCell {
                run: self.meta.id.clone(),
                cell: cell.to_string(),
            });
        }
        Ok(self.cell_dir(cell).join(format!("{stream}.log")))
    }
}

/// Write a file so that readers see the old content or the whole new one,
/// and the new one survives a power cut once this returns.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
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
}
