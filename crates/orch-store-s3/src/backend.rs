//! [`StoreBackend`] for [`S3Store`]: runs created and loaded, states saved,
//! cells claimed, followed and recorded once, records, ledgers and summaries
//! read through the caches. A record that cannot go up is spooled
//! (`spool.rs`) and goes up before the run's records are read, its state
//! changed, with the run's next write that succeeds, or when it is opened.

use crate::index::INDEX_EVERY;
use crate::{follow, objects, Result, S3Store};
use chrono::{DateTime, Utc};
use orch_cost::LedgerLine;
use orch_manifest::Plan;
use orch_store::{CellRecord, Run, RunMeta, RunSummary, Store, StoreBackend, StoreError};
use std::path::{Path, PathBuf};

impl StoreBackend for S3Store {
    fn location(&self) -> String {
        self.url.clone()
    }

    fn run_location(&self, id: &str) -> String {
        format!("{}/{id}", self.url)
    }

    fn local_dir(&self, id: &str) -> PathBuf {
        self.work.join(id)
    }

    fn run_ids(&self) -> Result<Vec<String>> {
        let base = format!("{}.orch/runs/", self.prefix);
        let ids: Vec<String> = self
            .objects
            .list_dir(&base)?
            .into_iter()
            .map(|l| l.key[base.len()..].to_string())
            .collect();
        if !ids.is_empty() {
            return Ok(ids);
        }
        // A store written before the run markers: its runs' folders.
        self.folder_run_ids()
    }

    fn has_run(&self, id: &str) -> Result<bool> {
        let Some(bytes) = self.objects.get(&format!("{}run.json", self.run_key(id)), 0)? else {
            return Ok(false);
        };
        // Kept for the `load_run` that follows.
        if let Ok(mut m) = self.run_json.lock() {
            m.insert(id.to_string(), bytes);
        }
        Ok(true)
    }

    fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()> {
        let base = self.run_key(&meta.id);
        // run.json first: it claims the id.
        self.create(&format!("{base}run.json"), self.with_writer(meta))?
            .map_err(|_by| StoreError::RunExists {
                id: meta.id.clone(),
                store: self.url.to_string(),
            })?;
        self.objects
            .put(&format!("{base}manifest.yaml"), manifest_text.as_bytes().to_vec())?;
        self.objects.put(
            &format!("{base}plan.json"),
            serde_json::to_vec_pretty(plan).unwrap_or_default(),
        )?;
        std::fs::create_dir_all(self.local_dir(&meta.id)).map_err(|source| StoreError::Io {
            action: "create the working folder",
            path: self.local_dir(&meta.id),
            source,
        })?;
        self.register_run(&meta.id)?;
        self.note_change(&meta.id)
    }

    fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)> {
        if self.adopt_spool(id)? {
            // Records went up after the run's latest state: a new state
            // (the same one) tells the caches made at the old one apart.
            if let (_, Some(meta)) = self.latest_state(id)? {
                if meta.state != orch_store::RunState::Running {
                    self.save_meta(&meta)?;
                }
            }
            if let Ok(mut m) = self.state_keys.lock() {
                m.remove(id);
            }
            if let Ok(mut m) = self.settled_states.lock() {
                m.remove(id);
            }
            if let Ok(mut m) = self.settled_runs.lock() {
                m.remove(id);
            }
        }
        // Opened to be read, and found finished from its caches (`reading.rs`).
        if let Some(found) = self.settled_runs.lock().ok().and_then(|mut m| m.remove(id)) {
            return Ok(found);
        }
        let base = self.run_key(id);
        let (run_key, plan_key) = (format!("{base}run.json"), format!("{base}plan.json"));
        let seen = self.run_json.lock().ok().and_then(|mut m| m.remove(id));
        // The run, its plan, its latest state and its records cache (which
        // nearly every command reads next) at once.
        let (state, got) = std::thread::scope(|sc| {
            let state = sc.spawn(|| self.latest_state(id));
            let mut keys = vec![plan_key.clone(), format!("{base}records.json")];
            if seen.is_none() {
                keys.push(run_key.clone());
            }
            let got = self.objects.get_many(&keys);
            (state.join().unwrap_or_else(|p| std::panic::resume_unwind(p)), got)
        });
        let mut got = got?.into_iter();
        let plan: Plan = self.must_parse(&plan_key, got.next().flatten())?;
        if let (Some(records), Ok(mut m)) = (got.next().flatten(), self.prefetched.lock()) {
            m.insert(id.to_string(), records);
        }
        let created: RunMeta = self.must_parse(&run_key, seen.or_else(|| got.next().flatten()))?;
        Ok((state?.1.unwrap_or(created), plan))
    }

    fn save_meta(&self, meta: &RunMeta) -> Result<()> {
        // Records kept on this host go up before the state that covers them.
        if let Err(e) = self.flush_spool(&meta.id, true) {
            if meta.state == orch_store::RunState::Complete {
                return Err(e);
            }
        }
        match self.write_state(meta) {
            // A run that stops while the store is away: its state is kept
            // on this host and written when the run is next opened.
            Err(e) if objects::is_outage(&e) && meta.state != orch_store::RunState::Running => {
                match self.keep_state(meta) {
                    Ok(path) => eprintln!(
                        "warning: the state `{}` of run {} could not be written to the store: it is kept at `{}` and written when the run is next opened (`orch show {}`, `orch run --resume {}`)",
                        meta.state,
                        meta.id,
                        path.display(),
                        meta.id,
                        meta.id
                    ),
                    Err(keep) => eprintln!(
                        "warning: the state `{}` of run {} could not be kept on this host either: {keep}",
                        meta.state, meta.id
                    ),
                }
                Err(e)
            }
            r => r,
        }
    }

    fn lock_run(&self, run: &Run) -> Result<orch_store::WriterLock> {
        self.lease_run(run)
    }

    fn kept_locally(&self, id: &str) -> Option<PathBuf> {
        let dir = self.spool_dir(id);
        std::fs::read_dir(&dir)
            .is_ok_and(|mut d| d.next().is_some())
            .then_some(dir)
    }

    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
        self.flush_spool(run.id(), true)?;
        let base = self.run_key(run.id());
        if let Some(r) = self.get_json::<CellRecord>(&format!("{base}done/{cell}.json"))? {
            return Ok(Some(r));
        }
        let keys: Vec<String> = self
            .objects
            .list_dir(&format!("{base}records/{cell}/"))?
            .into_iter()
            .map(|l| l.key[base.len()..].to_string())
            .collect();
        let recs = self.load_records(run.id(), &keys)?;
        Ok(recs.into_values().max_by_key(|r| r.attempt))
    }

    fn cell_records(&self, run: &Run) -> Result<Vec<Option<CellRecord>>> {
        Ok(self.records_of(run)?.0)
    }

    fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>> {
        Ok(self.records_of(run)?.1)
    }

    fn all_records(&self, run: &Run) -> Result<(Vec<Option<CellRecord>>, Vec<CellRecord>)> {
        self.records_of(run)
    }

    fn prepare_cell(&self, run: &Run, cell: &str) -> Result<(PathBuf, u32)> {
        if let Ok(mut m) = self.runs.lock() {
            m.entry(run.id().to_string()).or_insert_with(|| run.clone());
        }
        let n = self.claim_attempt(run, cell)?;
        // The store answers again: what was kept meanwhile goes up.
        let _ = self.flush_spool(run.id(), false);
        let dir = run.cell_dir(cell);
        // A leftover of a crash on this host: its files went up under its
        // own attempt as far as they were followed.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            action: "create the cell folder",
            path: dir.clone(),
            source,
        })?;
        self.start_following(run, cell, n, &dir);
        Ok((dir, n))
    }

    fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()> {
        self.finish_cells(run, std::slice::from_ref(record))
            .pop()
            .unwrap_or(Ok(()))
    }

    fn finish_cells(&self, run: &Run, records: &[CellRecord]) -> Vec<Result<()>> {
        // The batch's records go up side by side (each one's files, its
        // attempt record and `done` marker, created once); then, once for
        // the batch, what the spool kept and the run's index (when due).
        let outcomes =
            orch_store::parallel_map_with(records, objects::PARALLEL, |record| self.finish_one(run, record));
        if outcomes.iter().any(|(up, _)| *up) {
            let _ = self.flush_spool(run.id(), false);
            self.write_index_if_due(run);
        }
        outcomes.into_iter().map(|(_, outcome)| outcome).collect()
    }

    fn ledger(&self, run: &Run) -> Result<Vec<LedgerLine>> {
        Ok(self.fresh_index(run.id(), || Ok(run.clone()))?.ledger)
    }

    fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        let Some(n) = self.current_attempt(run, cell)? else {
            return Ok(None);
        };
        let base = format!("{}cells/{cell}/{n}/", self.run_key(run.id()));
        follow::read(&self.objects, &base, name, offset)
    }

    fn open_to_read(&self, store: &Store, ids: &[String]) -> Vec<Result<Run>> {
        self.open_runs_to_read(store, ids)
    }

    fn open_all_to_read(&self, store: &Store) -> Result<Vec<(String, Result<Run>)>> {
        self.open_all_runs_to_read(store)
    }

    fn summaries(&self, store: &Store) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        self.catalog_summaries(store)
    }

    fn cost_lines(&self, store: &Store, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        self.catalog_cost_lines(store, since)
    }
}

impl S3Store {
    /// Store one finished attempt: its files, then its records. Whether
    /// the store took it (else it is kept in the spool, or refused), and
    /// the cell's outcome.
    fn finish_one(&self, run: &Run, record: &CellRecord) -> (bool, Result<()>) {
        let dir = run.cell_dir(&record.id);
        let base = self.stop_following(run, record);
        let up = match dir.is_dir() {
            true => follow::finalize(&self.objects, &dir, &base),
            false => Ok(()),
        };
        let outcome = match up.and_then(|()| self.create_records(run, record)) {
            Ok(outcome) => outcome,
            Err(e @ (StoreError::Remote { .. } | StoreError::Unreachable { .. })) => {
                return (false, self.keep(run, record, &base, &dir, e))
            }
            Err(e) => return (false, Err(e)),
        };
        let _ = std::fs::remove_dir_all(&dir);
        (true, outcome)
    }

    /// Follow the cell folder's files up as segments under the attempt's
    /// files while the cell runs.
    fn start_following(&self, run: &Run, cell: &str, n: u32, dir: &Path) {
        let base = format!("{}cells/{cell}/{n}/", self.run_key(run.id()));
        self.followers
            .follow((run.id().to_string(), cell.to_string()), dir.to_path_buf(), base);
    }

    /// Stop following the cell folder; the key prefix of the attempt's files.
    fn stop_following(&self, run: &Run, record: &CellRecord) -> String {
        let cell = &record.id;
        match self.followers.stop(&(run.id().to_string(), cell.clone())) {
            Some(base) => base,
            None => format!("{}cells/{cell}/{}/", self.run_key(run.id()), record.attempt),
        }
    }

    /// A record that could not go up: kept in the spool. The run goes on
    /// (with a warning) through an outage; a refusal (credentials, bucket)
    /// is the error, with where the record is kept.
    fn keep(&self, run: &Run, record: &CellRecord, base: &str, dir: &Path, e: StoreError) -> Result<()> {
        let path = match self.spool(run, record, base, dir, &e) {
            Ok(p) => p,
            Err(spool_err) => {
                eprintln!(
                    "warning: the record of cell `{}` could not be kept on this host either: {spool_err}",
                    record.id
                );
                return Err(e);
            }
        };
        let kept = format!(
            "the record of cell `{}` is kept at `{}` and goes up with `orch run --resume {}`",
            record.id,
            path.display(),
            run.id()
        );
        if objects::is_outage(&e) {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or_default();
            eprintln!("warning: {first}\n  {kept}, or with the run's next write that succeeds");
            return Ok(());
        }
        Err(match e {
            StoreError::Remote { message, hint, user } => StoreError::Remote {
                message,
                hint: format!("{hint}; {kept}"),
                user,
            },
            other => other,
        })
    }

    /// Create the attempt's record, then (for a finished cell) the `done`
    /// marker, each once. The inner `Err`: another process recorded the cell
    /// first (this attempt's record is kept as an earlier attempt).
    fn create_records(&self, run: &Run, record: &CellRecord) -> Result<Result<()>> {
        let cell = &record.id;
        let runkey = self.run_key(run.id());
        let bytes = self.with_writer(record);
        let attempt_key = format!("{runkey}records/{cell}/{}.json", record.attempt);
        let mut outcome = Ok(());
        if let Err(by) = self.create(&attempt_key, bytes.clone())? {
            outcome = Err(StoreError::RecordedElsewhere {
                run: run.id().to_string(),
                cell: cell.clone(),
                by,
            });
        }
        if outcome.is_ok() && record.status.is_finished() {
            if let Err(by) = self.create(&format!("{runkey}done/{cell}.json"), bytes)? {
                outcome = Err(StoreError::RecordedElsewhere {
                    run: run.id().to_string(),
                    cell: cell.clone(),
                    by,
                });
            }
        }
        if let Ok(mut c) = self.records.lock() {
            c.insert(attempt_key, record.clone());
        }
        Ok(outcome)
    }

    /// Rewrite the run's index, at most every [`INDEX_EVERY`] while cells
    /// finish (a cache: a failure costs only time).
    fn write_index_if_due(&self, run: &Run) {
        // Taken under the lock: of writers that find it due at once, one writes.
        let due = self
            .last_index
            .lock()
            .ok()
            .map(|mut l| {
                let due = l.get(run.id()).is_none_or(|t| t.elapsed() >= INDEX_EVERY);
                if due {
                    l.insert(run.id().to_string(), std::time::Instant::now());
                }
                due
            })
            .unwrap_or(true);
        if due {
            let _ = self.write_index(run);
        }
    }
}

impl S3Store {
    /// Write a new state object of the run (no spool first), its index
    /// and its change.
    pub(crate) fn write_state(&self, meta: &RunMeta) -> Result<()> {
        // The change noted below has the state's time and writer: readers
        // tell the run's latest state from the changes (`reading.rs`).
        let ms = Utc::now().timestamp_millis().max(0);
        let key = format!("{}state/{ms:013}-{}.json", self.run_key(&meta.id), self.token);
        // Unique key: a conflict can only be our own lost reply.
        let _ = self.create(&key, self.with_writer(meta))?;
        // The index is a cache of the state too: rewrite it from a run this
        // store has seen, else drop it so that the next reader rebuilds it.
        let seen = self.runs.lock().ok().and_then(|m| m.get(&meta.id).cloned());
        let index = format!("{}index.json", self.run_key(&meta.id));
        match seen {
            Some(mut run) => {
                run.meta = meta.clone();
                if self.write_index(&run).is_err() {
                    let _ = self.objects.delete(&[index]);
                }
            }
            None => {
                let _ = self.objects.delete(&[index]);
            }
        }
        self.note_change_at(&meta.id, ms)
    }
}
