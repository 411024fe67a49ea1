//! A run's records: read once each (records are never rewritten), current
//! and earlier attempts told apart, and `records.json`, the cache of every
//! record that `orch show` reads instead of one object per record.

use crate::conditional::poisoned;
use crate::index::INDEX_VERSION;
use crate::{Result, S3Store};
use orch_store::{CellRecord, Run, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Every record of a run as read from `keys`: a cache for `orch show`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RecordsCache {
    pub(crate) v: u32,
    pub(crate) keys: Vec<String>,
    pub(crate) state_key: Option<String>,
    pub(crate) state: orch_store::RunState,
    /// The current records, in plan order.
    pub(crate) records: Vec<Option<CellRecord>>,
    pub(crate) earlier: Vec<CellRecord>,
}

impl S3Store {
    /// Records by relative key, read once each (records are immutable).
    pub(crate) fn load_records(&self, id: &str, keys: &[String]) -> Result<HashMap<String, CellRecord>> {
        let base = self.run_key(id);
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        {
            let cache = self.records.lock().map_err(|_| poisoned())?;
            for k in keys {
                match cache.get(&format!("{base}{k}")) {
                    Some(r) => {
                        out.insert(k.clone(), r.clone());
                    }
                    None => missing.push(k.clone()),
                }
            }
        }
        let full: Vec<String> = missing.iter().map(|k| format!("{base}{k}")).collect();
        let got = self.objects.get_many(&full)?;
        let mut cache = self.records.lock().map_err(|_| poisoned())?;
        for ((k, fk), bytes) in missing.into_iter().zip(full).zip(got) {
            let Some(bytes) = bytes else { continue };
            let r: CellRecord = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
                path: PathBuf::from(format!("s3://{}/{fk}", self.objects.bucket)),
                source,
            })?;
            cache.insert(fk, r.clone());
            out.insert(k, r);
        }
        Ok(out)
    }

    /// Current records (plan order) and earlier ones, from a listing.
    pub(crate) fn split_records(
        &self,
        run: &Run,
        keys: &[String],
    ) -> Result<(Vec<Option<CellRecord>>, Vec<CellRecord>)> {
        let all = self.load_records(run.id(), keys)?;
        let mut current: BTreeMap<String, (u32, CellRecord, bool)> = BTreeMap::new();
        let mut attempts: Vec<(String, u32, CellRecord)> = Vec::new();
        for (k, r) in &all {
            if let Some(cell) = k.strip_prefix("done/").and_then(|c| c.strip_suffix(".json")) {
                current.insert(cell.to_string(), (r.attempt, r.clone(), true));
            } else if let Some(rest) = k.strip_prefix("records/") {
                let Some((cell, n)) = rest.rsplit_once('/') else {
                    continue;
                };
                let Some(n) = n.strip_suffix(".json").and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                attempts.push((cell.to_string(), n, r.clone()));
            }
        }
        // Without a finished record, the last attempt's record is current.
        for (cell, n, r) in &attempts {
            let e = current.entry(cell.clone()).or_insert((*n, r.clone(), false));
            if !e.2 && *n > e.0 {
                *e = (*n, r.clone(), false);
            }
        }
        let earlier: Vec<CellRecord> = attempts
            .into_iter()
            .filter(|(cell, n, _)| current.get(cell).is_none_or(|(m, _, _)| m != n))
            .map(|(_, _, r)| r)
            .collect();
        let records = run
            .plan
            .cells
            .iter()
            .map(|c| current.get(&c.id).map(|(_, r, _)| r.clone()))
            .collect();
        Ok((records, earlier))
    }

    pub(crate) fn read_records_cache(&self, id: &str) -> Option<RecordsCache> {
        let prefetched = self.prefetched.lock().ok().and_then(|mut m| m.remove(id));
        let b = match prefetched {
            Some(b) => b,
            None => self
                .objects
                .get(&format!("{}records.json", self.run_key(id)), 0)
                .ok()??,
        };
        serde_json::from_slice::<RecordsCache>(&b)
            .ok()
            .filter(|c| c.v == INDEX_VERSION)
    }

    /// Current and earlier records: from the records cache when it covers
    /// exactly the record keys listed now, else read (and the caches rewritten).
    #[allow(clippy::type_complexity)]
    pub(crate) fn records_of(&self, run: &Run) -> Result<(Vec<Option<CellRecord>>, Vec<CellRecord>)> {
        // Records kept on this host go up first: they are part of the run.
        self.flush_spool(run.id(), true)?;
        let cache = self
            .read_records_cache(run.id())
            .filter(|c| c.records.len() == run.plan.cells.len());
        if let Some(c) = &cache {
            if self.sealed(run.id(), c.state_key.as_deref(), c.state)? {
                return Ok((c.records.clone(), c.earlier.clone()));
            }
        }
        let state = self.latest_state(run.id())?;
        let keys = self.record_keys(run.id())?;
        if let Some(c) = cache {
            if c.keys == keys {
                return Ok((c.records, c.earlier));
            }
        }
        let (records, earlier) = self.split_records(run, &keys)?;
        // For the next reader; a cache that cannot be written costs only time.
        let _ = self.write_caches(run, state, keys, records.clone(), earlier.clone());
        Ok((records, earlier))
    }
}
