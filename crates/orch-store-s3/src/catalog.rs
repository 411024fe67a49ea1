//! The store's list of runs: the run markers (`.orch/runs/<run>`), the change
//! objects (`.orch/changes/`), and the catalog (`.orch/catalog/`), a snapshot
//! of every run's summary and cost ledger that lets `orch ls` and `orch cost`
//! read one object instead of one or two per run (at 100,000 runs, `orch cost`
//! read run by run did not finish in 10 minutes against a local S3 server).

use crate::index::Index;
use crate::{objects, Result, S3Store};
use chrono::{DateTime, Utc};
use orch_cost::LedgerLine;
use orch_store::{RunState, RunSummary, Store, StoreError};
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
    /// The run's cost ledger lines (absent from catalogs written before it
    /// was kept here: such an entry is read again by `orch cost`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ledger: Option<Vec<LedgerLine>>,
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
        let (entries, damaged) = self.catalog_entries(store, Want::Summaries)?;
        Ok((
            entries.into_values().map(|e| e.summary).collect(),
            damaged.into_iter().map(|(_, e)| e).collect(),
        ))
    }

    /// Every run's cost ledger lines (with `since`, the attempts that
    /// finished at or after it), from the catalog as `catalog_summaries`
    /// reads it; a run not in it is read from its index, made current
    /// while the run is running. A run that cannot be read is left out
    /// with a warning; a store that does not answer is the error.
    pub(crate) fn catalog_cost_lines(
        &self,
        store: &Store,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<LedgerLine>> {
        let (entries, damaged) = self.catalog_entries(store, Want::Ledgers)?;
        for (id, e) in damaged {
            if objects::is_outage(&e) || e.is_user_error() {
                return Err(e);
            }
            store.warn(format!("run `{id}` is left out: {e}"));
        }
        Ok(entries
            .into_values()
            .flat_map(|e| e.ledger.unwrap_or_default())
            .filter(|l| since.is_none_or(|s| l.finished_at >= s))
            .collect())
    }

    /// Every listed run's catalog entry: the newest catalog's where it is
    /// current (and holds what `want` needs), else made from the run's
    /// index; the runs that could not be read, with their errors. A new
    /// catalog is written when many finished runs had to be read one by one.
    fn catalog_entries(&self, store: &Store, want: Want) -> Result<(BTreeMap<String, CatalogEntry>, Unread)> {
        let t0 = Utc::now().timestamp_millis();
        // The runs that exist are the ones listed; the catalog only saves reads.
        let ids = store.run_ids()?;
        let catalog = self.read_catalog();
        let changes = self.changes_since(catalog.as_ref().map_or(t0, |c| c.cut_ms) - SKEW_MS)?;
        let (mut kept, live) = trusted_entries(&ids, catalog.as_ref(), &changes, want);
        let found =
            orch_store::parallel_map_with(&live, objects::PARALLEL, |id| self.live_index(store, id, want));
        let mut damaged = Vec::new();
        let mut read_finished = 0;
        for (id, r) in live.iter().zip(found) {
            match r {
                Ok(index) => {
                    if index.summary.state != RunState::Running {
                        read_finished += 1;
                    }
                    let changes = changes.get(id).cloned().unwrap_or_default();
                    let entry = CatalogEntry {
                        summary: index.summary,
                        ledger: Some(index.ledger),
                        changes,
                    };
                    kept.insert(id.clone(), entry);
                }
                Err(e) => damaged.push((id.clone(), e)),
            }
        }
        if read_finished >= CATALOG_AFTER {
            self.save_catalog(t0, &kept);
        }
        Ok((kept, damaged))
    }

    /// The index of a run the catalog does not cover: as written (rebuilt
    /// when there is none); for `orch cost`, one that says the run is
    /// running is first made current (its records listed), as a cost
    /// must not miss a cell that finished since the index was written.
    fn live_index(&self, store: &Store, id: &str, want: Want) -> Result<Index> {
        match self.read_index(id) {
            Some(i) if want == Want::Summaries || i.meta.state != RunState::Running => Ok(i),
            Some(_) => self.fresh_index(id, || store.open_exact(id)),
            None => self.write_index(&store.open_exact(id)?),
        }
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

/// The runs that could not be read, with why.
type Unread = Vec<(String, StoreError)>;

/// What a reader of the catalog needs of each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Its summary (`orch ls`).
    Summaries,
    /// Its cost ledger (`orch cost`).
    Ledgers,
}

/// The catalog's entries that are current for the runs `ids` (a finished
/// run with no change the entry does not already name, holding what `want`
/// needs), and the runs to read.
fn trusted_entries(
    ids: &[String],
    catalog: Option<&Catalog>,
    changes: &HashMap<String, Vec<String>>,
    want: Want,
) -> (BTreeMap<String, CatalogEntry>, Vec<String>) {
    let mut kept: BTreeMap<String, CatalogEntry> = BTreeMap::new();
    let mut live: Vec<String> = Vec::new();
    for id in ids {
        let entry = catalog.and_then(|c| c.runs.get(id)).filter(|e| {
            e.summary.state != RunState::Running
                && (want == Want::Summaries || e.ledger.is_some())
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
