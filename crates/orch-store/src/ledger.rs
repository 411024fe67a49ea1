//! The run's cost ledger, `<run>/costs.jsonl`: one line per recorded cell
//! attempt, appended right after the attempt's `result.json` is written.
//!
//! It is a cache that `orch cost` and `orch plan` read instead of every
//! record. The records are the truth: a ledger that is missing, unreadable,
//! of another version, or stale (a record it lacks, or a record written
//! after it) is rebuilt from `cells/*/result.json` and
//! `interrupted/*/result.json`.
//!
//! Staleness is checked with `stat` only (no record is opened): the number
//! of records must equal the number of lines, every current record's cell
//! must have a line, and no record may be newer than the ledger.

use crate::{io, read_json, write_atomic, CellRecord, Result, Run, RunMeta, RunState, Store, StoreError};
use chrono::{DateTime, Utc};
use orch_cost::ledger::LEDGER_VERSION;
use orch_cost::{History, LedgerLine, RunCost};
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

pub const LEDGER_FILE: &str = "costs.jsonl";

/// The cell's model: its `model` parameter, else the suite's only model.
pub fn cell_model(
    plan: &orch_manifest::Plan,
    params: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Option<String> {
    if let Some(m) = params.get("model") {
        return Some(match m {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    }
    let models: Vec<&orch_manifest::ModelRef> = plan
        .models
        .iter()
        .filter(|m| m.repo_type.as_deref().is_none_or(|t| t == "model"))
        .collect();
    match models.as_slice() {
        [one] => Some(one.repo.clone()),
        _ => None,
    }
}

impl Run {
    pub fn ledger_path(&self) -> PathBuf {
        self.dir.join(LEDGER_FILE)
    }

    /// The ledger line of a record of this run.
    pub fn ledger_line(&self, r: &CellRecord) -> LedgerLine {
        let spec = orch_manifest::GpuSpec::parse(&r.gpu).ok();
        let params = self
            .plan
            .cells
            .iter()
            .find(|c| c.id == r.id)
            .map(|c| &c.params)
            .unwrap_or(&r.params);
        LedgerLine {
            v: LEDGER_VERSION,
            run: self.meta.id.clone(),
            suite: self.meta.suite.clone(),
            backend: self.meta.backend.clone(),
            cell: r.id.clone(),
            attempt: r.attempt,
            benchmark: r.benchmark.clone(),
            gpu: r.gpu.clone(),
            gpu_type: spec
                .and_then(|s| s.gpu)
                .map(|g| g.name.to_string())
                .unwrap_or_else(|| orch_cost::catalog::CPU_ONLY.to_string()),
            gpus: spec.map(|s| s.count).unwrap_or(0),
            model: cell_model(&self.plan, params),
            status: r.status.to_string(),
            finished_at: r.finished_at,
            billed_s: r.cost.as_ref().map(|c| c.billed_s).unwrap_or(r.duration_s),
            usd: r.cost.as_ref().map(|c| c.usd).unwrap_or(0.0),
            wasted: r.status != orch_protocol::Status::Succeeded,
            priced: r.cost.as_ref().is_some_and(|c| c.priced),
        }
    }

    /// Append a record's line to the ledger (one `write` of a whole line, so
    /// lines of cells finishing at once do not interleave).
    pub(crate) fn append_ledger(&self, r: &CellRecord) -> Result<()> {
        let path = self.ledger_path();
        let mut line = serde_json::to_vec(&self.ledger_line(r)).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io("open", &path))?;
        f.write_all(&line).map_err(io("append to", &path))
    }

    /// Every recorded attempt: the current records, then the earlier
    /// attempts a resume moved to `interrupted/` (flag `true`).
    pub fn all_records(&self) -> Result<Vec<(CellRecord, bool)>> {
        let mut out = Vec::new();
        for c in &self.plan.cells {
            if let Some(r) = self.cell_record(&c.id)? {
                out.push((r, false));
            }
        }
        for p in record_files(&self.dir.join("interrupted"))
            .into_iter()
            .map(|(p, _)| p)
        {
            // An earlier attempt's record that cannot be read is skipped:
            // the current records are what must be whole.
            if let Ok(r) = read_json::<CellRecord>(&p) {
                out.push((r, true));
            }
        }
        Ok(out)
    }

    /// What the run's recorded attempts cost (earlier attempts included);
    /// `None` when no record has a cost.
    pub fn cost(&self) -> Result<Option<RunCost>> {
        let mut total = RunCost::default();
        for (r, earlier) in self.all_records()? {
            if let Some(c) = &r.cost {
                total.add(c, earlier);
            }
        }
        Ok((total.cells > 0).then_some(total))
    }

    /// `current` (the current records' cost) plus the earlier attempts'.
    pub(crate) fn add_earlier_attempts(&self, mut current: RunCost) -> Option<RunCost> {
        for (p, _) in record_files(&self.dir.join("interrupted")) {
            if let Ok(r) = read_json::<CellRecord>(&p) {
                if let Some(c) = &r.cost {
                    current.add(c, true);
                }
            }
        }
        (current.cells > 0).then_some(current)
    }

    /// Rewrite the ledger from the records.
    pub fn rebuild_ledger(&self) -> Result<Vec<LedgerLine>> {
        let lines: Vec<LedgerLine> = self
            .all_records()?
            .iter()
            .map(|(r, _)| self.ledger_line(r))
            .collect();
        write_lines(&self.ledger_path(), &lines)?;
        Ok(lines)
    }

    /// The ledger, rebuilt first when it is missing or stale.
    pub fn ledger(&self) -> Result<Vec<LedgerLine>> {
        match read_fresh_ledger(&self.dir) {
            Some(lines) => Ok(lines),
            None => self.rebuild_ledger(),
        }
    }
}

fn write_lines(path: &Path, lines: &[LedgerLine]) -> Result<()> {
    let mut bytes = Vec::with_capacity(lines.len() * 300);
    for l in lines {
        serde_json::to_writer(&mut bytes, l).map_err(|source| StoreError::Corrupt {
            path: path.to_path_buf(),
            source,
        })?;
        bytes.push(b'\n');
    }
    write_atomic(path, &bytes)
}

/// `result.json` files one level under `dir` (`dir/*/result.json`), with
/// their modification times.
fn record_files(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path().join("result.json");
            let m = std::fs::metadata(&p).ok()?;
            m.is_file().then(|| (p, m.modified().ok()))
        })
        .collect()
}

/// The run folder's ledger when it is whole and up to date, else `None`.
fn read_fresh_ledger(run_dir: &Path) -> Option<Vec<LedgerLine>> {
    let path = run_dir.join(LEDGER_FILE);
    let meta = std::fs::metadata(&path).ok()?;
    let written = meta.modified().ok()?;
    let bytes = std::fs::read(&path).ok()?;
    let mut lines = Vec::with_capacity(bytes.len() / 256 + 1);
    for raw in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let l: LedgerLine = serde_json::from_slice(raw).ok()?;
        if l.v != LEDGER_VERSION {
            return None;
        }
        lines.push(l);
    }
    let current = record_files(&run_dir.join("cells"));
    let earlier = record_files(&run_dir.join("interrupted"));
    if current.len() + earlier.len() != lines.len() {
        return None;
    }
    let newer =
        |files: &[(PathBuf, Option<SystemTime>)]| files.iter().any(|(_, m)| m.is_none_or(|m| m > written));
    if newer(&current) || newer(&earlier) {
        return None;
    }
    let cells: HashSet<&str> = lines.iter().map(|l| l.cell.as_str()).collect();
    let all_present = current.iter().all(|(p, _)| {
        p.parent()
            .and_then(|d| d.file_name())
            .and_then(|n| n.to_str())
            .is_some_and(|n| cells.contains(n))
    });
    all_present.then_some(lines)
}

impl Store {
    /// Ledger lines of every run in the store, each run's ledger rebuilt
    /// when missing or stale. With `since`, only attempts that finished at
    /// or after it (runs that ended before it are not read at all).
    pub fn cost_lines(&self, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        let ids = self.run_ids()?;
        let one = |id: &String| -> Result<Vec<LedgerLine>> {
            let dir = self.root.join(id);
            if let Some(since) = since {
                let meta: RunMeta = read_json(&dir.join("run.json"))?;
                // A run that ended before `since` recorded nothing after it.
                if meta.state != RunState::Running && meta.updated_at < since {
                    return Ok(vec![]);
                }
            }
            let lines = match read_fresh_ledger(&dir) {
                Some(lines) => lines,
                None => self.open_run(id)?.rebuild_ledger()?,
            };
            Ok(match since {
                Some(s) => lines.into_iter().filter(|l| l.finished_at >= s).collect(),
                None => lines,
            })
        };
        // Runs are independent: read them on every core, keep their order.
        let workers = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(ids.len().max(1));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut per_run: Vec<Option<Result<Vec<LedgerLine>>>> = (0..ids.len()).map(|_| None).collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(id) = ids.get(i) else { break };
                            done.push((i, one(id)));
                        }
                        done
                    })
                })
                .collect();
            for h in handles {
                // A worker only panics if reading a ledger panics: pass it on.
                for (i, r) in h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                    per_run[i] = Some(r);
                }
            }
        });
        let mut out = Vec::new();
        for r in per_run.into_iter().flatten() {
            out.extend(r?);
        }
        Ok(out)
    }

    /// Durations of the succeeded cells of earlier runs of `suite`, for estimates.
    pub fn history(&self, suite: &str) -> Result<History> {
        let mut h = History::new();
        for id in self.run_ids()? {
            let dir = self.root.join(&id);
            let meta: RunMeta = read_json(&dir.join("run.json"))?;
            if meta.suite != suite {
                continue;
            }
            let lines = match read_fresh_ledger(&dir) {
                Some(lines) => lines,
                None => self.open_run(&id)?.rebuild_ledger()?,
            };
            for l in &lines {
                h.add(l);
            }
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{host_environment, write_json};
    use orch_manifest::{load_str, ExpandOptions};
    use orch_protocol::{CellResult, Status};

    fn run_in(store: &Store) -> Run {
        let plan = load_str(
            "name: t\nmodels: [{repo: org/m}]\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n    matrix: {x: [1, 2, 3]}\n",
            Path::new("t.yaml"),
            &ExpandOptions::default(),
        )
        .unwrap();
        store
            .create_run(&plan, "", "local", host_environment(Path::new("t.yaml"), vec![]))
            .unwrap()
    }

    fn record(run: &Run, i: usize, status: Status, secs: f64, usd_per_s: f64, attempt: u32) -> CellRecord {
        let cell = &run.plan.cells[i];
        let end = Utc::now();
        let start = end - chrono::Duration::milliseconds((secs * 1000.0) as i64);
        let mut r = CellRecord::from_result(cell, CellResult::new(&cell.id, status), start, end, attempt);
        let rate = orch_cost::Rate::flat("local", usd_per_s);
        r.cost = Some(orch_cost::cell_cost(&rate, r.status, r.duration_s, &r.timings));
        r
    }

    fn total(lines: &[LedgerLine]) -> f64 {
        lines.iter().map(|l| l.usd).sum()
    }

    #[test]
    fn ledger_follows_the_records_and_is_rebuilt_when_stale() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = run_in(&store);
        run.finish_cell(&record(&run, 0, Status::Succeeded, 2.0, 1.0, 1))
            .unwrap();
        run.finish_cell(&record(&run, 1, Status::Failed, 1.0, 1.0, 1))
            .unwrap();
        let lines = read_fresh_ledger(run.dir()).expect("fresh after appends");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].model.as_deref(), Some("org/m"), "the suite's only model");
        assert!(lines[1].wasted && lines[1].priced);
        assert!((total(&store.cost_lines(None).unwrap()) - 3.0).abs() < 1e-9);

        // A record written without its line (a crash in between): stale.
        let third = record(&run, 2, Status::Succeeded, 4.0, 1.0, 1);
        run.prepare_cell(&third.id).unwrap();
        write_json(&run.cell_dir(&third.id).join("result.json"), &third).unwrap();
        assert!(read_fresh_ledger(run.dir()).is_none());
        assert!((total(&store.cost_lines(None).unwrap()) - 7.0).abs() < 1e-9);
        assert!(read_fresh_ledger(run.dir()).is_some(), "rebuilt");

        // A record rewritten after the ledger: stale too.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let dearer = record(&run, 2, Status::Succeeded, 4.0, 2.0, 1);
        write_json(&run.cell_dir(&dearer.id).join("result.json"), &dearer).unwrap();
        assert!((total(&store.cost_lines(None).unwrap()) - 11.0).abs() < 1e-9);

        // A garbled line: rebuilt.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(run.ledger_path())
            .unwrap();
        f.write_all(b"{not json\n").unwrap();
        assert_eq!(run.ledger().unwrap().len(), 3);
        assert_eq!(run.cost().unwrap().unwrap().usd, 11.0);
    }

    #[test]
    fn earlier_attempts_stay_in_the_ledger_and_the_run_cost() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = run_in(&store);
        let id = run.plan.cells[0].id.clone();
        run.prepare_cell(&id).unwrap();
        run.finish_cell(&record(&run, 0, Status::Cancelled, 1.0, 1.0, 1))
            .unwrap();
        // Resumed: the cancelled attempt moves to `interrupted/`.
        let (_, attempt) = run.prepare_cell(&id).unwrap();
        assert_eq!(attempt, 2);
        run.finish_cell(&record(&run, 0, Status::Succeeded, 2.0, 1.0, attempt))
            .unwrap();
        let lines = run.ledger().unwrap();
        assert_eq!(lines.len(), 2);
        let cost = run.record().unwrap().cost.unwrap();
        assert_eq!(
            (cost.usd, cost.wasted_usd, cost.earlier_attempts_usd),
            (3.0, 1.0, 1.0)
        );
        std::fs::remove_file(run.ledger_path()).unwrap();
        let rebuilt = run.ledger().unwrap();
        assert_eq!(rebuilt.len(), 2);
        assert!((total(&rebuilt) - 3.0).abs() < 1e-9);

        // `since` keeps what finished after it; history keeps what succeeded.
        assert!(store
            .cost_lines(Some(Utc::now() + chrono::Duration::hours(1)))
            .unwrap()
            .is_empty());
        let h = store.history("t").unwrap();
        let e = h.estimate(&id, "a", "none", 600.0, &orch_cost::Rate::flat("local", 1.0));
        assert_eq!((e.basis, e.seconds), (orch_cost::Basis::History, 2.0));
    }
}
