//! Many runs opened only to read them (`orch history` over a whole store)
//! without one listing of `state/` per run: a run is opened from its caches
//! alone (`index.json`, `records.json`, `plan.json`, read at once) when they
//! say it is finished, agree on the state they were made at, and the
//! store's change objects (`.orch/changes/`, listed once) name no state of
//! the run newer than that one. Each state is noted as a change with the
//! state's own time and writer (`<ms>~<writer>~<run>` for
//! `state/<ms>-<writer>.json`), so the newest state the changes name is
//! the run's latest state. Any other run (running, no caches, caches of an
//! older state, a newer change, records in this host's spool) is opened
//! as [`orch_store::Store::open_exact`] opens it.
//!
//! The finished runs found so are kept in a snapshot,
//! `.orch/reading/<inverted ms>-<writer>.json` (the two newest kept),
//! written when at least [`SNAPSHOT_AFTER`] of them had to be read run by
//! run: the next reader reads one object for them, with the same rule (no
//! state newer than an entry's is noted) deciding which entries are current.

use crate::index::{Index, INDEX_VERSION};
use crate::{objects, Result, S3Store};
use chrono::Utc;
use orch_manifest::Plan;
use orch_store::{Run, RunMeta, RunState, Store};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// A new snapshot is written when at least this many finished runs were
/// read run by run.
pub(crate) const SNAPSHOT_AFTER: usize = 16;

const SNAPSHOT_VERSION: u32 = 1;

/// Snapshot keys sort newest first: `<this minus the time, 13 digits>-<writer>.json`.
const SNAPSHOT_EPOCH_MS: i64 = 9_999_999_999_999;

/// Finished runs as found from their caches.
#[derive(Deserialize)]
struct Snapshot {
    v: u32,
    runs: HashMap<String, Settled>,
}

/// A [`Snapshot`] to be written.
#[derive(Serialize)]
struct SnapshotRef<'a> {
    v: u32,
    runs: BTreeMap<&'a str, &'a Settled>,
}

/// What a run's records cache says of itself (its records are not parsed here).
#[derive(Deserialize)]
struct CacheHead {
    v: u32,
    state_key: Option<String>,
    state: RunState,
    records: Vec<serde::de::IgnoredAny>,
}

/// A run found finished from its caches: what `load_run` answers, the
/// records cache for `records_of`, and the state both were made at.
#[derive(Serialize, Deserialize)]
pub(crate) struct Settled {
    meta: RunMeta,
    plan: Plan,
    /// `records.json` as read.
    records: String,
    state_key: String,
}

impl S3Store {
    /// [`orch_store::StoreBackend::open_to_read`]: see the module.
    pub(crate) fn open_runs_to_read(&self, store: &Store, ids: &[String]) -> Vec<Result<Run>> {
        let (changes, snapshot) = std::thread::scope(|sc| {
            let changes = sc.spawn(|| self.latest_noted_states());
            let snapshot = self.read_snapshot();
            (join(changes), snapshot)
        });
        self.open_read(store, ids, changes, snapshot)
    }

    /// [`orch_store::StoreBackend::open_all_to_read`]: the runs, the changes
    /// and the snapshot listed and read at once.
    #[allow(clippy::type_complexity)]
    pub(crate) fn open_all_runs_to_read(&self, store: &Store) -> Result<Vec<(String, Result<Run>)>> {
        let (ids, changes, snapshot) = std::thread::scope(|sc| {
            let changes = sc.spawn(|| self.latest_noted_states());
            let snapshot = sc.spawn(|| self.read_snapshot());
            let ids = store.run_ids();
            (ids, join(changes), join(snapshot))
        });
        let ids = ids?;
        let runs = self.open_read(store, &ids, changes, snapshot);
        Ok(ids.into_iter().zip(runs).collect())
    }

    /// Open the runs: from the snapshot or their caches where `changes` (the
    /// newest state noted for each run) say those are current. The changes
    /// are listed before the caches are read (or at once): a run is read at
    /// its state as of the listing or a newer one.
    fn open_read(
        &self,
        store: &Store,
        ids: &[String],
        changes: Result<HashMap<String, String>>,
        snapshot: Option<Snapshot>,
    ) -> Vec<Result<Run>> {
        let t0 = Utc::now().timestamp_millis();
        let Ok(changes) = changes else {
            // Without the changes nothing is trusted: each run is opened as usual.
            return orch_store::parallel_map_with(ids, objects::PARALLEL, |id| store.open_exact(id));
        };
        let settled = self.read_all_settled(ids, snapshot);
        let current: Vec<Option<(Settled, bool)>> = ids
            .iter()
            .zip(settled)
            .map(|(id, s)| {
                s.filter(|(s, _)| {
                    changes
                        .get(id.as_str())
                        .is_none_or(|newest| newest.as_str() <= s.state_key.as_str())
                })
            })
            .collect();
        let read_one_by_one = current.iter().flatten().filter(|(_, snap)| !snap).count();
        if read_one_by_one >= SNAPSHOT_AFTER {
            let runs = ids
                .iter()
                .zip(&current)
                .filter_map(|(id, s)| s.as_ref().map(|(s, _)| (id.as_str(), s)))
                .collect();
            // A snapshot that cannot be written costs the next reader time only.
            let _ = self.write_snapshot(
                t0,
                &SnapshotRef {
                    v: SNAPSHOT_VERSION,
                    runs,
                },
            );
        }
        for (id, s) in ids.iter().zip(current) {
            let Some((s, _)) = s else { continue };
            if let Ok(mut m) = self.prefetched.lock() {
                m.insert(id.clone(), s.records.into_bytes());
            }
            if let Ok(mut m) = self.settled_states.lock() {
                m.insert(id.clone(), s.state_key);
            }
            if let Ok(mut m) = self.settled_runs.lock() {
                m.insert(id.clone(), (s.meta, s.plan));
            }
        }
        orch_store::parallel_map_with(ids, objects::PARALLEL, |id| store.open_exact(id))
    }

    /// Each run's caches when they say it is finished (from the snapshot, or
    /// read; `true`: from the snapshot); `None` for a run this handle writes
    /// or that has records in this host's spool.
    fn read_all_settled(&self, ids: &[String], snapshot: Option<Snapshot>) -> Vec<Option<(Settled, bool)>> {
        let mut snapshot = snapshot.map(|s| s.runs).unwrap_or_default();
        let local = |id: &String| {
            self.runs.lock().map_or(true, |m| m.contains_key(id)) || !self.spooled(id).is_empty()
        };
        let found: Vec<(bool, Option<Settled>)> = ids
            .iter()
            .map(|id| match local(id) {
                true => (true, None),
                false => (false, snapshot.remove(id).filter(|s| s.meta.id == *id)),
            })
            .collect();
        let missing: Vec<&String> = ids
            .iter()
            .zip(&found)
            .filter(|(_, (local, s))| !local && s.is_none())
            .map(|(id, _)| id)
            .collect();
        let mut read = orch_store::parallel_map_with(&missing, objects::PARALLEL, |id| self.read_settled(id))
            .into_iter();
        found
            .into_iter()
            .map(|(local, s)| match (local, s) {
                (true, _) => None,
                (false, Some(s)) => Some((s, true)),
                (false, None) => read.next().flatten().map(|s| (s, false)),
            })
            .collect()
    }

    /// The run's caches when they say it is finished and agree on the state
    /// they were made at (`None`: open it as usual).
    fn read_settled(&self, id: &str) -> Option<Settled> {
        let base = self.run_key(id);
        let keys = ["index.json", "records.json", "plan.json"].map(|k| format!("{base}{k}"));
        let mut got = self.objects.get_many(&keys).ok()?.into_iter();
        let (index, records, plan) = (got.next()??, got.next()??, got.next()??);
        let index: Index = serde_json::from_slice(&index).ok()?;
        let head: CacheHead = serde_json::from_slice(&records).ok()?;
        let plan: Plan = serde_json::from_slice(&plan).ok()?;
        let state_key = index.state_key?;
        let agree = index.v == INDEX_VERSION
            && head.v == INDEX_VERSION
            && index.meta.id == id
            && index.meta.state != RunState::Running
            && head.state == index.meta.state
            && head.state_key.as_deref() == Some(state_key.as_str())
            && head.records.len() == plan.cells.len();
        agree.then_some(Settled {
            meta: index.meta,
            plan,
            records: String::from_utf8(records).ok()?,
            state_key,
        })
    }

    /// The newest state each run's changes name (`state/<ms>-<writer>.json`
    /// for the change `<ms>~<writer>~<run>`), from one listing of the changes.
    fn latest_noted_states(&self) -> Result<HashMap<String, String>> {
        let base = format!("{}.orch/changes/", self.prefix);
        let mut out: HashMap<String, String> = HashMap::new();
        for l in self.objects.list_dir(&base)? {
            let mut parts = l.key[base.len()..].splitn(3, '~');
            let (Some(ms), Some(writer), Some(run)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let state = format!("state/{ms}-{writer}.json");
            let e = out.entry(run.to_string()).or_default();
            if state > *e {
                *e = state;
            }
        }
        Ok(out)
    }

    /// The newest snapshot, if one can be read.
    fn read_snapshot(&self) -> Option<Snapshot> {
        let base = format!("{}.orch/reading/", self.prefix);
        let newest = self
            .objects
            .list_dir_after(&base, None, Some(1))
            .ok()?
            .into_iter()
            .next()?;
        let b = self.objects.get(&newest.key, 0).ok()??;
        serde_json::from_slice::<Snapshot>(&b)
            .ok()
            .filter(|s| s.v == SNAPSHOT_VERSION)
    }

    /// Write a new snapshot (a unique key: never a conflict) and drop all but
    /// the two newest.
    fn write_snapshot(&self, t0: i64, snapshot: &SnapshotRef) -> Result<()> {
        let base = format!("{}.orch/reading/", self.prefix);
        let key = format!(
            "{base}{:013}-{}.json",
            (SNAPSHOT_EPOCH_MS - t0).max(0),
            self.token
        );
        self.objects
            .put(&key, serde_json::to_vec(snapshot).unwrap_or_default())?;
        let old: Vec<String> = self
            .objects
            .list_dir(&base)?
            .into_iter()
            .skip(2)
            .map(|l| l.key)
            .collect();
        self.objects.delete(&old)
    }
}

/// The answer of a scoped thread (its panic goes on).
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}
