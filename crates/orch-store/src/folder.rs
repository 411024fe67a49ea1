//! The folder store: one folder per run under a root folder (the layout in
//! the crate's documentation). A cell's record is written last, atomically,
//! by the host only. A `result.json` that is not this cell's record (the
//! agent's own result, left by a host killed before recording; a damaged
//! file) is read as no record, with a warning naming it; the next attempt
//! moves it aside as `interrupted/<cell>.<n>/result.unrecorded.json`.
//! The run's writer lock is `lock.rs`'s.

use crate::ledger::{append_ledger_lines, folder_cost_lines, folder_history, folder_ledger, record_files};
use crate::{
    io, read_json, write_atomic, write_json, CellRecord, Result, Run, RunMeta, Store, StoreBackend,
    StoreError, WriterLock,
};
use chrono::{DateTime, Utc};
use orch_cost::{History, LedgerLine};
use orch_manifest::Plan;
use std::path::{Path, PathBuf};

/// Records of one batch written (and synced) at once: the file system
/// commits concurrent syncs together.
const SYNCS_AT_ONCE: usize = 16;

/// The name a `result.json` that was not a record gets when its attempt is moved aside.
pub const UNRECORDED: &str = "result.unrecorded.json";

/// `bytes` as the record of `cell`, or why they are not one.
pub(crate) fn parse_record(bytes: &[u8], cell: &str) -> std::result::Result<CellRecord, String> {
    match serde_json::from_slice::<CellRecord>(bytes) {
        Ok(r) if r.id == cell => Ok(r),
        Ok(r) => Err(format!(
            "is the record of another cell (`{}`)",
            r.id.escape_debug()
        )),
        Err(e) => {
            if serde_json::from_slice::<orch_protocol::CellResult>(bytes).is_ok() {
                Err(
                    "is the agent's result, not the host's record (orch ended before recording the cell)"
                        .into(),
                )
            } else {
                Err(format!(
                    "is damaged ({e}): cut short, edited or written by another version of orch"
                ))
            }
        }
    }
}

pub struct FolderStore {
    root: PathBuf,
}

impl FolderStore {
    pub fn new(root: impl Into<PathBuf>) -> FolderStore {
        FolderStore { root: root.into() }
    }
}

impl StoreBackend for FolderStore {
    fn location(&self) -> String {
        self.root.display().to_string()
    }

    fn run_location(&self, id: &str) -> String {
        self.root.join(id).display().to_string()
    }

    fn folder(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn local_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn run_ids(&self) -> Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
            Err(e) => return Err(io("read the store", &self.root)(e)),
        };
        Ok(entries
            .filter_map(|e| e.ok())
            // A run is a real folder: a symbolic link in the store is not followed.
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| e.path().join("run.json").is_file())
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .collect())
    }

    fn has_run(&self, id: &str) -> Result<bool> {
        let dir = self.root.join(id);
        // A real folder, as `run_ids` lists: a link is not followed.
        Ok(std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) && dir.join("run.json").is_file())
    }

    fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()> {
        std::fs::create_dir_all(&self.root).map_err(io("create the store", &self.root))?;
        let dir = self.root.join(&meta.id);
        std::fs::create_dir(&dir).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                StoreError::RunExists {
                    id: meta.id.clone(),
                    store: self.root.display().to_string(),
                }
            } else {
                io("create the run folder", &dir)(e)
            }
        })?;
        std::fs::create_dir(dir.join("cells")).map_err(io("create the cells folder", &dir))?;
        write_atomic(&dir.join("manifest.yaml"), manifest_text.as_bytes())?;
        write_json(&dir.join("plan.json"), plan)?;
        write_json(&dir.join("run.json"), meta)
    }

    fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)> {
        let dir = self.root.join(id);
        Ok((
            read_json(&dir.join("run.json"))?,
            read_json(&dir.join("plan.json"))?,
        ))
    }

    fn save_meta(&self, meta: &RunMeta) -> Result<()> {
        write_json(&self.root.join(&meta.id).join("run.json"), meta)
    }

    fn lock_run(&self, run: &Run) -> Result<WriterLock> {
        crate::lock::lock_folder(run.dir(), run.id()).map_err(|e| match e {
            // Say which cells the holder has to run.
            StoreError::Locked { run: id, holder, .. } => StoreError::Locked {
                run: id,
                holder,
                cells: crate::error::held_cells(&run.unfinished_cells().unwrap_or_default()),
            },
            e => e,
        })
    }

    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
        let path = run.cell_dir(cell).join("result.json");
        match std::fs::read(&path) {
            Ok(bytes) => match parse_record(&bytes, cell) {
                Ok(r) => Ok(Some(r)),
                Err(why) => {
                    run.warn(format!(
                        "`{}` {why}: cell `{cell}` counts as not run; `orch run --resume {}` runs it again",
                        path.display(),
                        run.id()
                    ));
                    Ok(None)
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>> {
        // An earlier attempt's record that cannot be read is skipped: the
        // current records are what must be whole.
        Ok(record_files(&run.dir().join("interrupted"))
            .into_iter()
            .filter_map(|(p, _)| read_json::<CellRecord>(&p).ok())
            .collect())
    }

    fn prepare_cell(&self, run: &Run, cell: &str) -> Result<(PathBuf, u32)> {
        let dir = run.cell_dir(cell);
        let mut attempt = 1;
        // `symlink_metadata`: a link planted in place of the folder is moved
        // aside like a folder, never followed.
        if std::fs::symlink_metadata(&dir).is_ok() {
            let prior = run.dir().join("interrupted");
            std::fs::create_dir_all(&prior).map_err(io("create", &prior))?;
            let mut n = 1;
            while std::fs::symlink_metadata(prior.join(format!("{cell}.{n}"))).is_ok() {
                n += 1;
            }
            attempt = n + 1;
            let to = prior.join(format!("{cell}.{n}"));
            std::fs::rename(&dir, &to).map_err(io("move aside", &dir))?;
            // What sits at the record's place without being this cell's
            // record is kept under another name: `interrupted/*/result.json`
            // are records only (the ledger and pushes read them).
            let left = to.join("result.json");
            if let Ok(bytes) = std::fs::read(&left) {
                if parse_record(&bytes, cell).is_err() {
                    let kept = to.join(UNRECORDED);
                    std::fs::rename(&left, &kept).map_err(io("move aside", &left))?;
                }
            }
        } else if let Ok(entries) = std::fs::read_dir(run.dir().join("interrupted")) {
            let prefix = format!("{cell}.");
            attempt += entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count() as u32;
        }
        std::fs::create_dir_all(&dir).map_err(io("create the cell folder", &dir))?;
        Ok((dir, attempt))
    }

    fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()> {
        self.finish_cells(run, std::slice::from_ref(record))
            .pop()
            .unwrap_or(Ok(()))
    }

    fn finish_cells(&self, run: &Run, records: &[CellRecord]) -> Vec<Result<()>> {
        // Each record written as ever (temporary file, fsync, rename, fsync
        // of its folder), the batch's at once: the file system commits
        // concurrent syncs together, so a thousand records cost a few
        // journal commits instead of two thousand in a row.
        let written = crate::parallel_map_with(records, SYNCS_AT_ONCE, |record| {
            let dir = run.cell_dir(&record.id);
            std::fs::create_dir_all(&dir).map_err(io("create the cell folder", &dir))?;
            write_json(&dir.join("result.json"), record)
        });
        // The ledger is a cache of the records: lines that cannot be
        // appended leave it stale, and the next reader rebuilds it. One
        // append for the batch.
        let stored = records.iter().zip(&written).filter(|(_, w)| w.is_ok());
        let _ = append_ledger_lines(run, stored.map(|(r, _)| r));
        written
    }

    fn ledger(&self, run: &Run) -> Result<Vec<LedgerLine>> {
        folder_ledger(run)
    }

    fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        use std::io::{Read, Seek, SeekFrom};
        let path = run.cell_dir(cell).join(name);
        let mut f = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("read", &path)(e)),
        };
        f.seek(SeekFrom::Start(offset)).map_err(io("read", &path))?;
        let mut out = Vec::new();
        f.read_to_end(&mut out).map_err(io("read", &path))?;
        Ok(Some(out))
    }

    fn cost_lines(&self, store: &Store, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        folder_cost_lines(&self.root, store, since)
    }

    fn history(&self, store: &Store, suite: &str) -> Result<History> {
        folder_history(&self.root, store, suite)
    }
}
