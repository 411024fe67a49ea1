//! A suite's run records read from a store (folder or S3): every run of the
//! suite whose record can be read, oldest first; a run that cannot be read is
//! skipped with a warning, never an error.

use crate::HistoryError;
use chrono::{DateTime, Utc};
use orch_record::RunRecord;
use orch_store::{parallel_map_with, Store};

/// Runs read at once from an object store (S3).
pub const OBJECT_STORE_READERS: usize = 32;

/// What [`load`] read.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The suite's runs, oldest first (by `created_at`, then id).
    pub records: Vec<RunRecord>,
    /// One line per run that was skipped (unreadable `run.json`, `plan.json`
    /// or records), naming it. Damaged cell records inside a readable run are
    /// the store's own warnings (`Store::take_warnings`).
    pub warnings: Vec<String>,
}

/// The records of `suite`'s runs in `store`; with `since`, only runs
/// created at or after it. Each run's metadata is read first and only the
/// suite's runs (in time) have their cell records read, several at a time.
/// Fails only when the store cannot be listed.
pub fn load(store: &Store, suite: &str, since: Option<DateTime<Utc>>) -> Result<Loaded, HistoryError> {
    // A folder store is bound by the CPUs; an object store by the round
    // trips of its requests (3 to 4 per run, each a few ms): many runs in
    // flight at once keep `orch history` over 10,000 runs on S3 within 2x
    // of the folder store (scripts/bench-history.sh).
    let workers = match store.root() {
        Some(_) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        None => OBJECT_STORE_READERS,
    };
    // Opened at once: an object store reads what tells it which runs are
    // finished once, not one listing per run.
    let opened = store.open_all_to_read()?;
    let read = parallel_map_with(
        &opened,
        workers,
        |(id, run)| -> Result<Option<RunRecord>, String> {
            let run = run.as_ref().map_err(|e| format!("skipped run `{id}`: {e}"))?;
            if run.meta.suite != suite || since.is_some_and(|s| run.meta.created_at < s) {
                return Ok(None);
            }
            run.record()
                .map(Some)
                .map_err(|e| format!("skipped run `{id}`: {e}"))
        },
    );
    let mut out = Loaded::default();
    for r in read {
        match r {
            Ok(Some(rec)) => out.records.push(rec),
            Ok(None) => {}
            Err(w) => out.warnings.push(w),
        }
    }
    out.records
        .sort_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::write_runs;

    #[test]
    fn a_suites_runs_are_read_and_a_damaged_one_is_skipped() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let ids = write_runs(&store, "nightly", 12, &[(6, -0.1)], 1).unwrap();
        write_runs(&store, "other", 2, &[], 2).unwrap();
        std::fs::write(tmp.path().join(&ids[3]).join("run.json"), "{\"id\": ").unwrap();
        let got = load(&store, "nightly", None).unwrap();
        assert_eq!(got.records.len(), 11);
        assert_eq!(got.warnings.len(), 1, "{:?}", got.warnings);
        assert!(got.warnings[0].contains(&ids[3]), "{:?}", got.warnings);
        assert!(got.records.windows(2).all(|w| w[0].created_at <= w[1].created_at));
        let since = got.records[8].created_at;
        assert_eq!(load(&store, "nightly", Some(since)).unwrap().records.len(), 3);
        assert!(load(&store, "nope", None).unwrap().records.is_empty());
    }
}
