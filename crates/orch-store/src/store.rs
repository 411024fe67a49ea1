//! [`Store`]: the store commands use, over any [`StoreBackend`]: runs
//! created (with a fresh id), opened (by id, prefix or `latest`), listed
//! (damaged runs named, the others listed), and every run's cost ledger.

use crate::ids::new_run_id;
use crate::{
    check_name, Environment, FolderStore, Result, Run, RunMeta, RunState, RunSummary, StoreBackend,
    StoreError, Warnings,
};
use chrono::{DateTime, Utc};
use orch_cost::{History, LedgerLine};
use orch_manifest::Plan;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A result store: a folder ([`Store::new`]) or any other [`StoreBackend`]
/// (an object store). Commands use this type and never know which it is.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn StoreBackend>,
    /// What reading skipped (shared with every run opened from here).
    warnings: Warnings,
}

impl Store {
    /// The folder store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store {
            backend: Arc::new(FolderStore::new(root)),
            warnings: Warnings::default(),
        }
    }

    /// A store over another implementation (an object store).
    pub fn with_backend(backend: Arc<dyn StoreBackend>) -> Store {
        Store {
            backend,
            warnings: Warnings::default(),
        }
    }

    /// Say that something was skipped while reading (a damaged record, an
    /// unreadable run); the command prints it.
    pub fn warn(&self, text: String) {
        self.warnings.push(text);
    }

    /// The warnings of this store and its runs so far (emptied).
    pub fn take_warnings(&self) -> Vec<String> {
        self.warnings.take()
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
            warnings: self.warnings.clone(),
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
            warnings: self.warnings.clone(),
            meta,
            plan,
        })
    }

    /// Open these runs (exact ids) only to read them, in the order of
    /// `ids` (see [`StoreBackend::open_to_read`]): `orch history` over
    /// every run of a store.
    pub fn open_to_read(&self, ids: &[String]) -> Vec<Result<Run>> {
        self.backend.open_to_read(self, ids)
    }

    /// Every run of the store, oldest first, opened only to read it (see
    /// [`StoreBackend::open_all_to_read`]), each with its id.
    #[allow(clippy::type_complexity)]
    pub fn open_all_to_read(&self) -> Result<Vec<(String, Result<Run>)>> {
        self.backend.open_all_to_read(self)
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
    pub fn history(&self, suite: &str) -> Result<History> {
        self.backend.history(self, suite)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{env, plan};
    use crate::{CellRecord, CellStatus};
    use orch_protocol::{CellResult, Status};

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
        fn ledger(&self, run: &Run) -> Result<Vec<LedgerLine>> {
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

        // The damaged record costs its own cell: the run reads, the cell is
        // pending (run again by `--resume`) and a warning names the file.
        let r = bad_record.record().unwrap();
        assert_eq!(r.cells[0].status, CellStatus::Pending);
        assert_eq!(bad_record.unfinished_cells().unwrap().len(), 2);
        let warned = store.take_warnings();
        assert!(
            warned
                .iter()
                .any(|w| w.contains(&rec.display().to_string()) && w.contains("damaged")),
            "{warned:?}"
        );
        let (ok, damaged) = store.list_checked().unwrap();
        let mut listed: Vec<&str> = ok.iter().map(|s| s.id.as_str()).collect();
        listed.sort();
        assert_eq!(listed, vec![good.id(), bad_record.id()]);
        assert_eq!(damaged.len(), 1);
        let text: Vec<String> = damaged.iter().map(|e| e.to_string()).collect();
        assert!(text.iter().any(|t| t.contains("run.json")), "{text:?}");
        // `orch cost` leaves the unreadable run out, naming its file.
        store.take_warnings();
        store.cost_lines(None).unwrap();
        let warned = store.take_warnings();
        assert!(
            warned
                .iter()
                .any(|w| w.contains("run.json") && w.contains(bad_meta.id())),
            "{warned:?}"
        );
        // The next attempt keeps the damaged file apart from the records.
        let (_, attempt) = bad_record.prepare_cell(&cell.id).unwrap();
        assert_eq!(attempt, 2);
        let moved = bad_record
            .dir()
            .join("interrupted")
            .join(format!("{}.1", cell.id));
        assert!(moved.join(crate::UNRECORDED).is_file());
        assert!(!moved.join("result.json").exists());
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
