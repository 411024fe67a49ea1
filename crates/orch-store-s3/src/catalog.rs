//! The store's list of runs: the run markers (`.orch/runs/<run>`), the change
//! objects (`.orch/changes/`), and the catalog (`.orch/catalog/`), a snapshot
//! of every run's summary that lets `orch ls` read one object instead of one
//! per run.

use crate::{objects, Result, S3Store};
use chrono::Utc;
use orch_store::{RunSummary, Store, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// The store's catalog: every run's summary as of `cut_ms`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Catalog {
    v: u32,
    cut_ms: i64,
    runs: BTreeMap<String, CatalogEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CatalogEntry {
    summary: RunSummary,
    /// The run's change keys that the summary already reflects (those
    /// within the skew margin of the cut: older ones are never listed again).
    changes: Vec<String>,
}

const CATALOG_VERSION: u32 = 1;

/// How far behind another machine's clock may be: changes are listed from
/// this long before a catalog's cut.
const SKEW_MS: i64 = 10 * 60 * 1000;

/// `orch ls` writes a new catalog when it read at least this many finished
/// runs one by one.
const CATALOG_AFTER: usize = 16;

/// Catalog keys sort newest first: `<this minus the cut, 13 digits>-<writer>.json`.
const CATALOG_EPOCH_MS: i64 = 9_999_999_999_999;

impl S3Store {
    /// List the run among the store's runs (once it is whole). The first
    /// marker of a store written before the markers existed first marks
    /// the runs already there: runs are listed from the markers once one
    /// exists, and those runs would vanish from `orch ls`.
    pub(crate) fn register_run(&self, id: &str) -> Result<()> {
        let base = format!("{}.orch/runs/", self.prefix);
        if self.objects.list_dir_after(&base, None, Some(1))?.is_empty() {
            let earlier = self.folder_run_ids()?;
            for r in orch_store::parallel_map_with(&earlier, objects::PARALLEL, |old| {
                self.objects.put(&format!("{base}{old}"), self.claim_bytes())
            }) {
                r?;
            }
        }
        self.objects.put(&format!("{base}{id}"), self.claim_bytes())
    }

    /// Note a change of a run's state for catalog readers (after its index).
    pub(crate) fn note_change(&self, id: &str) -> Result<()> {
        self.note_change_at(id, Utc::now().timestamp_millis().max(0))
    }

    /// Note a change of a run's state as of `ms` (a state's own time: see `reading.rs`).
    pub(crate) fn note_change_at(&self, id: &str, ms: i64) -> Result<()> {
        let key = format!(
            "{}.orch/changes/{:013}~{}~{id}",
            self.prefix,
            ms.max(0),
            self.token
        );
        self.objects.put(&key, self.claim_bytes())
    }

    /// The changes listed from `from_ms` on, by run.
    fn changes_since(&self, from_ms: i64) -> Result<HashMap<String, Vec<String>>> {
        let base = format!("{}.orch/changes/", self.prefix);
        let after = format!("{base}{:013}", from_ms.max(0));
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for l in self.objects.list_dir_after(&base, Some(&after), None)? {
            let rel = &l.key[base.len()..];
            // `<ms>~<writer>~<run>`: the writer token has no `~`, the run id may.
            if let Some(run) = rel.splitn(3, '~').nth(2) {
                out.entry(run.to_string()).or_default().push(rel.to_string());
            }
        }
        Ok(out)
    }

    /// The newest catalog, if one can be read.
    fn read_catalog(&self) -> Option<Catalog> {
        let base = format!("{}.orch/catalog/", self.prefix);
        let newest = self
            .objects
            .list_dir_after(&base, None, Some(1))
            .ok()?
            .into_iter()
            .next()?;
        let b = self.objects.get(&newest.key, 0).ok()??;
        serde_json::from_slice::<Catalog>(&b)
            .ok()
            .filter(|c| c.v == CATALOG_VERSION)
    }

    /// Write a new catalog (a unique key: never a conflict) and drop all
    /// but the two newest.
    fn write_catalog(&self, catalog: &Catalog) -> Result<()> {
        let base = format!("{}.orch/catalog/", self.prefix);
        let key = format!(
            "{base}{:013}-{}.json",
            (CATALOG_EPOCH_MS - catalog.cut_ms).max(0),
            self.token
        );
        self.objects
            .put(&key, serde_json::to_vec(catalog).unwrap_or_default())?;
        let old: Vec<String> = self
            .objects
            .list_dir(&base)?
            .into_iter()
            .skip(2)
            .map(|l| l.key)
            .collect();
        let _ = self.objects.delete(&old);
        Ok(())
    }

    /// Every run's summary: from the newest catalog where its entry is
    /// current (a finished run with no change the entry does not name), else
    /// from the run's index (rebuilt if needed); a new catalog is written when
    /// many finished runs had to be read one by one.
    pub(crate) fn catalog_summaries(&self, store: &Store) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        let t0 = Utc::now().timestamp_millis();
        // The runs that exist are the ones listed; the catalog only saves reads.
        let ids = store.run_ids()?;
        let catalog = self.read_catalog();
        let changes = self.changes_since(catalog.as_ref().map_or(t0, |c| c.cut_ms) - SKEW_MS)?;
        let (mut kept, live) = trusted_entries(&ids, catalog.as_ref(), &changes);
        let found = orch_store::parallel_map_with(&live, objects::PARALLEL, |id| match self.read_index(id) {
            Some(i) => Ok(i.summary),
            None => {
                let run = store.open_exact(id)?;
                self.write_index(&run).map(|i| i.summary)
            }
        });
        let mut damaged = Vec::new();
        let mut read_finished = 0;
        for (id, r) in live.iter().zip(found) {
            match r {
                Ok(summary) => {
                    if summary.state != orch_store::RunState::Running {
                        read_finished += 1;
                    }
                    let changes = changes.get(id).cloned().unwrap_or_default();
                    kept.insert(id.clone(), CatalogEntry { summary, changes });
                }
                Err(e) => damaged.push(e),
            }
        }
        if read_finished >= CATALOG_AFTER {
            self.save_catalog(t0, &kept);
        }
        Ok((kept.into_values().map(|e| e.summary).collect(), damaged))
    }

    /// A new catalog of `kept` as of `t0`, each entry naming only the changes
    /// within the skew margin of the cut.
    fn save_catalog(&self, t0: i64, kept: &BTreeMap<String, CatalogEntry>) {
        let cut = format!("{:013}", (t0 - SKEW_MS).max(0));
        let mut runs = kept.clone();
        for e in runs.values_mut() {
            e.changes.retain(|k| k.as_str() >= cut.as_str());
        }
        // A catalog that cannot be written costs the next `orch ls` time only.
        let _ = self.write_catalog(&Catalog {
            v: CATALOG_VERSION,
            cut_ms: t0,
            runs,
        });
    }
}

/// The catalog's entries that are current for the runs `ids` (a finished
/// run with no change the entry does not already name), and the runs to read.
fn trusted_entries(
    ids: &[String],
    catalog: Option<&Catalog>,
    changes: &HashMap<String, Vec<String>>,
) -> (BTreeMap<String, CatalogEntry>, Vec<String>) {
    let mut kept: BTreeMap<String, CatalogEntry> = BTreeMap::new();
    let mut live: Vec<String> = Vec::new();
    for id in ids {
        let entry = catalog.and_then(|c| c.runs.get(id)).filter(|e| {
            e.summary.state != orch_store::RunState::Running
                && changes
                    .get(id)
                    .is_none_or(|ks| ks.iter().all(|k| e.changes.contains(k)))
        });
        match entry {
            Some(e) => {
                kept.insert(id.clone(), e.clone());
            }
            None => live.push(id.clone()),
        }
    }
    (kept, live)
}
