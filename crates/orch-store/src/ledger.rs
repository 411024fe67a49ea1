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
//!
//! A cell attempt is counted once: a ledger with two lines of one cell and
//! attempt (two writers appended) is stale and rebuilt, and a rebuild keeps
//! one line per cell and attempt. A run that cannot be read (a damaged
//! `run.json` or `plan.json`) is left out of the store's lines with a
//! warning, never failing `orch cost` for the other runs.

use crate::{io, read_json, write_atomic, CellRecord, Result, Run, RunMeta, RunState, Store, StoreError};
use chrono::{DateTime, Utc};
use orch_cost::ledger::LEDGER_VERSION;
use orch_cost::{History, LedgerLine};
use orch_record::RunCost;
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
    /// The ledger file of a folder store's run (`<run>/costs.jsonl`).
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

    /// Every recorded attempt: the current records, then the earlier
    /// attempts (flag `true`).
    pub fn all_records(&self) -> Result<Vec<(CellRecord, bool)>> {
        let (current, earlier) = self.backend.all_records(self)?;
        let mut out: Vec<(CellRecord, bool)> = current.into_iter().flatten().map(|r| (r, false)).collect();
        out.extend(earlier.into_iter().map(|r| (r, true)));
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

    /// The ledger (a cache of the records, rebuilt when missing or stale).
    pub fn ledger(&self) -> Result<Vec<LedgerLine>> {
        self.backend.ledger(self)
    }
}

/// Append a record's line to a folder run's ledger (one `write` of a whole
/// line, so lines of cells finishing at once do not interleave).
#[cfg(test)]
pub(crate) fn append_ledger(run: &Run, r: &CellRecord) -> Result<()> {
    append_ledger_lines(run, std::slice::from_ref(r))
}

/// Append the lines of records to a folder run's ledger in one `write`
/// (whole lines, so writers appending at once do not interleave).
pub(crate) fn append_ledger_lines<'a>(
    run: &Run,
    records: impl IntoIterator<Item = &'a CellRecord>,
) -> Result<()> {
    let path = run.ledger_path();
    let mut lines = Vec::new();
    for r in records {
        serde_json::to_writer(&mut lines, &run.ledger_line(r)).map_err(|source| StoreError::Corrupt {
            path: path.clone(),
            source,
        })?;
        lines.push(b'\n');
    }
    if lines.is_empty() {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(io("open", &path))?;
    f.write_all(&lines).map_err(io("append to", &path))
}

/// Rewrite a folder run's ledger from the records.
pub(crate) fn rebuild_ledger(run: &Run) -> Result<Vec<LedgerLine>> {
    let mut seen = HashSet::new();
    let lines: Vec<LedgerLine> = run
        .all_records()?
        .iter()
        .filter(|(r, _)| seen.insert((r.id.clone(), r.attempt)))
        .map(|(r, _)| run.ledger_line(r))
        .collect();
    write_lines(&run.ledger_path(), &lines)?;
    Ok(lines)
}

/// A folder run's ledger, rebuilt first when it is missing or stale.
pub(crate) fn folder_ledger(run: &Run) -> Result<Vec<LedgerLine>> {
    match read_fresh_ledger(run.dir()) {
        Some(lines) => Ok(lines),
        None => rebuild_ledger(run),
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
pub(crate) fn record_files(dir: &Path) -> Vec<(PathBuf, Option<SystemTime>)> {
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
    // Two lines of one attempt: two writers appended; rebuilt once.
    let mut attempts = HashSet::with_capacity(lines.len());
    if !lines
        .iter()
        .all(|l| attempts.insert((l.cell.as_str(), l.attempt)))
    {
        return None;
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

/// Ledger lines of every run of a folder store, each run's ledger rebuilt
/// when missing or stale. With `since`, only attempts that finished at or
/// after it (runs that ended before it are not read at all).
pub(crate) fn folder_cost_lines(
    root: &Path,
    store: &Store,
    since: Option<DateTime<Utc>>,
) -> Result<Vec<LedgerLine>> {
    let ids = store.run_ids()?;
    let one = |id: &String| -> Result<Vec<LedgerLine>> {
        let dir = root.join(id);
        if let Some(since) = since {
            let meta: RunMeta = read_json(&dir.join("run.json"))?;
            // A run that ended before `since` recorded nothing after it.
            if meta.state != RunState::Running && meta.updated_at < since {
                return Ok(vec![]);
            }
        }
        let lines = match read_fresh_ledger(&dir) {
            Some(lines) => lines,
            None => rebuild_ledger(&store.open_exact(id)?)?,
        };
        Ok(match since {
            Some(s) => lines.into_iter().filter(|l| l.finished_at >= s).collect(),
            None => lines,
        })
    };
    let per_run = parallel_map(&ids, one);
    let mut out = Vec::new();
    for (id, r) in ids.iter().zip(per_run) {
        match r {
            Ok(lines) => out.extend(lines),
            // A run that cannot be read costs its own lines only.
            Err(e) if unreadable(&e) => store.warn(format!("run `{id}` is left out: {e}")),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// A run whose files are damaged or missing (not a failing disk or store).
fn unreadable(e: &StoreError) -> bool {
    match e {
        StoreError::Corrupt { .. } | StoreError::Unsafe { .. } => true,
        StoreError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
        _ => false,
    }
}

/// `f` over `items` on every core, results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(items.len().max(1));
    parallel_map_with(items, workers, f)
}

/// `f` over `items` on `workers` threads, results in the items' order.
pub fn parallel_map_with<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    if workers <= 1 || items.len() <= 1 {
        // No thread for one item (a batch of one record).
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut slots: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.max(1).min(items.len().max(1)))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        done.push((i, f(item)));
                    }
                    done
                })
            })
            .collect();
        for h in handles {
            // A worker only panics if `f` panics: pass it on.
            for (i, r) in h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                slots[i] = Some(r);
            }
        }
    });
    // Every index below `items.len()` was taken by exactly one worker.
    slots.into_iter().flatten().collect()
}

/// Durations of the succeeded cells of earlier runs of `suite` in a folder store.
pub(crate) fn folder_history(root: &Path, store: &Store, suite: &str) -> Result<History> {
    let mut h = History::new();
    for id in store.run_ids()? {
        let dir = root.join(&id);
        let meta: RunMeta = match read_json(&dir.join("run.json")) {
            Ok(m) => m,
            // A damaged run tells nothing about durations; it is reported by `orch ls`.
            Err(_) => continue,
        };
        if meta.suite != suite {
            continue;
        }
        let lines = match read_fresh_ledger(&dir) {
            Some(lines) => lines,
            None => match store.open_exact(&id).and_then(|r| rebuild_ledger(&r)) {
                Ok(lines) => lines,
                // A damaged record: `orch ls` and `orch show` name it.
                Err(_) => continue,
            },
        };
        for l in &lines {
            h.add(l);
        }
    }
    Ok(h)
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

    #[test]
    fn a_line_appended_twice_is_counted_once() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = run_in(&store);
        let r = record(&run, 0, Status::Succeeded, 2.0, 1.0, 1);
        run.finish_cell(&r).unwrap();
        // A second writer appended the same attempt (no lock, an old orch).
        append_ledger(&run, &r).unwrap();
        let lines = run.ledger().unwrap();
        assert_eq!(lines.len(), 1);
        assert!((total(&store.cost_lines(None).unwrap()) - 2.0).abs() < 1e-9);
        let text = std::fs::read_to_string(run.ledger_path()).unwrap();
        assert_eq!(text.lines().count(), 1, "rebuilt: {text}");
    }
}
