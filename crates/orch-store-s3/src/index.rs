//! The run index (`index.json`: state, summary, ledger lines, the record keys
//! it covers), rewritten as a cache; the run's latest state object, and
//! whether a cache made at a state is still current without a listing.

use crate::records::RecordsCache;
use crate::{Result, S3Store};
use orch_cost::LedgerLine;
use orch_store::{CellRecord, Run, RunMeta, RunSummary};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// Minimum time between two rewrites of a run's index while cells finish.
pub(crate) const INDEX_EVERY: Duration = Duration::from_secs(5);

/// The run index: a cache rebuilt from the records when it does not cover them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Index {
    pub(crate) v: u32,
    pub(crate) meta: RunMeta,
    pub(crate) summary: RunSummary,
    /// The record keys (relative to the run) this index was made from.
    pub(crate) keys: Vec<String>,
    pub(crate) ledger: Vec<LedgerLine>,
    /// The run's latest state object when the keys were listed.
    pub(crate) state_key: Option<String>,
}

pub(crate) const INDEX_VERSION: u32 = 2;

/// How long a listed latest state key is taken as current by a reader.
const STATE_KEY_FRESH: Duration = Duration::from_secs(1);

impl S3Store {
    /// The key (relative to the run) and content of the run's latest state
    /// object, when it has one.
    pub(crate) fn latest_state(&self, id: &str) -> Result<(Option<String>, Option<RunMeta>)> {
        let key = self.list_state_key(id)?;
        match &key {
            Some(k) => {
                let meta = self.must_json(&format!("{}{k}", self.run_key(id)))?;
                Ok((key, Some(meta)))
            }
            None => Ok((None, None)),
        }
    }

    /// List the run's latest state key (and remember it for a moment).
    pub(crate) fn list_state_key(&self, id: &str) -> Result<Option<String>> {
        let run = self.run_key(id);
        let key = self
            .objects
            .list_dir(&format!("{run}state/"))?
            .last()
            .map(|l| l.key[run.len()..].to_string());
        if let Ok(mut m) = self.state_keys.lock() {
            m.insert(id.to_string(), (key.clone(), Instant::now()));
        }
        Ok(key)
    }

    /// Whether a cache made at `state_key` while the run was in `state`
    /// is current without listing the records. Records are written only
    /// while a run is running, and every session starts by writing a
    /// running state: so a cache made after a finished state, when that
    /// state is still the latest, covers every record. A run this process
    /// writes is always listed (another session may have finished it).
    pub(crate) fn sealed(
        &self,
        id: &str,
        state_key: Option<&str>,
        state: orch_store::RunState,
    ) -> Result<bool> {
        let Some(state_key) = state_key else {
            return Ok(false);
        };
        if state == orch_store::RunState::Running || self.runs.lock().map_or(true, |m| m.contains_key(id)) {
            return Ok(false);
        }
        // Found current once for a run opened to be read (`reading.rs`).
        if let Some(k) = self.settled_states.lock().ok().and_then(|mut m| m.remove(id)) {
            return Ok(k == state_key);
        }
        let remembered = self.state_keys.lock().ok().and_then(|m| {
            m.get(id)
                .filter(|(_, at)| at.elapsed() < STATE_KEY_FRESH)
                .map(|(k, _)| k.clone())
        });
        let latest = match remembered {
            Some(k) => k,
            None => self.list_state_key(id)?,
        };
        Ok(latest.as_deref() == Some(state_key))
    }

    /// Rebuild and write a run's index from its records (a cache).
    pub(crate) fn write_index(&self, run: &Run) -> Result<Index> {
        // The state before the records: the caches cover every record
        // written up to that state.
        let state = self.latest_state(run.id())?;
        let keys = self.record_keys(run.id())?;
        let (records, earlier) = self.split_records(run, &keys)?;
        self.write_caches(run, state, keys, records, earlier)
    }

    /// Write a run's caches (index and records) from records read at `keys`.
    pub(crate) fn write_caches(
        &self,
        run: &Run,
        (state_key, state_meta): (Option<String>, Option<RunMeta>),
        keys: Vec<String>,
        records: Vec<Option<CellRecord>>,
        earlier: Vec<CellRecord>,
    ) -> Result<Index> {
        self.index_writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let meta = state_meta.unwrap_or_else(|| run.meta.clone());
        let cache = RecordsCache {
            v: INDEX_VERSION,
            keys: keys.clone(),
            state_key: state_key.clone(),
            state: meta.state,
            records: records.clone(),
            earlier: earlier.clone(),
        };
        self.objects.put(
            &format!("{}records.json", self.run_key(run.id())),
            serde_json::to_vec(&cache).unwrap_or_default(),
        )?;
        let rec = run.record_from(records.clone(), &earlier);
        let mut ledger: Vec<LedgerLine> = records.iter().flatten().map(|r| run.ledger_line(r)).collect();
        ledger.extend(earlier.iter().map(|r| run.ledger_line(r)));
        let index = Index {
            v: INDEX_VERSION,
            meta,
            summary: RunSummary::of(&rec),
            keys,
            ledger,
            state_key,
        };
        let bytes = serde_json::to_vec(&index).unwrap_or_default();
        self.objects
            .put(&format!("{}index.json", self.run_key(run.id())), bytes)?;
        if let Ok(mut l) = self.last_index.lock() {
            l.insert(run.id().to_string(), Instant::now());
        }
        Ok(index)
    }

    /// The run's index when it is current (sealed, or covering the record
    /// keys listed now), else rebuilt from the run `open` gives.
    pub(crate) fn fresh_index(&self, id: &str, open: impl FnOnce() -> Result<Run>) -> Result<Index> {
        if let Some(i) = self.read_index(id) {
            if self.sealed(id, i.state_key.as_deref(), i.meta.state)? {
                return Ok(i);
            }
            if i.keys == self.record_keys(id)? {
                return Ok(i);
            }
        }
        self.write_index(&open()?)
    }

    pub(crate) fn read_index(&self, id: &str) -> Option<Index> {
        let b = self
            .objects
            .get(&format!("{}index.json", self.run_key(id)), 0)
            .ok()??;
        serde_json::from_slice::<Index>(&b)
            .ok()
            .filter(|i| i.v == INDEX_VERSION)
    }
}
