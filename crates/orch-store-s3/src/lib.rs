//! The result store on S3 or an S3-compatible object store, behind
//! [`orch_store::StoreBackend`]: `--store s3://bucket/prefix`.
//!
//! Layout under `<prefix>/<run>/` (every key written once unless marked):
//!
//! ```text
//! run.json, manifest.yaml, plan.json   as in a folder store
//! state/<ms>-<writer>.json             each change of state, budget or resumes; the last one counts
//! claims/<cell>/<n>                    who runs attempt n of the cell (If-None-Match: one writer per attempt)
//! records/<cell>/<n>.json              attempt n's record
//! done/<cell>.json                     the record that finished the cell (If-None-Match: exactly one)
//! cells/<cell>/<n>/<file>              attempt n's files (logs, events, telemetry); while it runs,
//!                                      <file>.parts/<offset> segments uploaded every 2 s
//! index.json                           REWRITTEN: a cache (state, counts, ledger lines, the record
//!                                      keys it covers) for `orch ls` and `orch cost`
//! records.json                         REWRITTEN: a cache of every record, with the keys it covers,
//!                                      for `orch show` (one read instead of one per record)
//! ```
//! and under `<prefix>/.orch/`:
//!
//! ```text
//! probe/<writer>                       the conditional-write probe
//! runs/<run>                           one per run, written when the run is whole: the runs are
//!                                      listed from here (one flat folder, not the whole store)
//! changes/<ms>~<writer>~<run>         one per change of a run's state (after its index is rewritten)
//! catalog/<inverted ms>-<writer>.json  a snapshot of every run's summary as of <ms>, newest first;
//!                                      written by `orch ls` when it had to read many runs one by one,
//!                                      the two newest kept
//! ```
//!
//! `orch ls` reads the newest catalog, lists the changes since it (less a
//! margin for clock skew), and reads one by one only the runs that are new,
//! changed or still running. `orch show` and `orch cost` trust a run's cache
//! without listing its records while the run's latest state is the finished
//! state the cache was made at (every session writes a running state before
//! its first record), and otherwise only when the record keys it covers are
//! the ones listed now.
//!
//! Concurrency: records are created with `If-None-Match: *`; every created
//! object carries this writer's token, so a conflict on a create whose
//! first reply was lost (the retry finds the object) is told apart from a
//! real one (another writer's token). A server that ignores conditional
//! writes is found out by the probe before the first write, and refused
//! unless `ORCH_S3_UNCONDITIONAL=1`.

pub mod follow;
pub mod objects;
pub mod transfer;

use chrono::{DateTime, Utc};
use objects::{Created, Objects};
use orch_cost::LedgerLine;
use orch_manifest::Plan;
use orch_store::{CellRecord, Run, RunMeta, RunSummary, Store, StoreBackend, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, StoreError>;

/// The environment variable that accepts a server ignoring `If-None-Match`.
pub const UNCONDITIONAL_ENV: &str = "ORCH_S3_UNCONDITIONAL";

/// Minimum time between two rewrites of a run's index while cells finish.
const INDEX_EVERY: Duration = Duration::from_secs(5);

/// `s3://bucket/prefix` → (bucket, prefix without slashes at either end).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| StoreError::Remote {
        message: format!("`--store {url}`: {why}"),
        hint: "write `--store s3://BUCKET/PREFIX` (the prefix may be empty)".into(),
        user: true,
    };
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("not an `s3://` URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty()
        || !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(bad(
            "the bucket name is empty or has characters a bucket cannot have",
        ));
    }
    // S3, R2, GCS and MinIO all refuse shorter names (GCS allows up to 222
    // characters with dots: the upper bound is the server's to say).
    if bucket.len() < 3 {
        return Err(bad("a bucket name has at least 3 characters"));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        orch_store::check_relative("store prefix", prefix)?;
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// The run index: a cache rebuilt from the records when it does not cover them.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Index {
    v: u32,
    meta: RunMeta,
    summary: RunSummary,
    /// The record keys (relative to the run) this index was made from.
    keys: Vec<String>,
    ledger: Vec<LedgerLine>,
    /// The run's latest state object when the keys were listed.
    state_key: Option<String>,
}

const INDEX_VERSION: u32 = 2;

/// Every record of a run as read from `keys`: a cache for `orch show`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RecordsCache {
    v: u32,
    keys: Vec<String>,
    state_key: Option<String>,
    state: orch_store::RunState,
    /// The current records, in plan order.
    records: Vec<Option<CellRecord>>,
    earlier: Vec<CellRecord>,
}

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

/// Who wrote an object: unique per store handle (host, process, time).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    writer: String,
    host: String,
    pid: u32,
    at: DateTime<Utc>,
}

pub struct S3Store {
    objects: Arc<Objects>,
    prefix: String,
    url: String,
    token: String,
    work: PathBuf,
    probed: OnceLock<std::result::Result<(), String>>,
    followers: Mutex<HashMap<(String, String), (follow::Follower, String)>>,
    /// Records are never rewritten: once read, a key's record is kept.
    records: Mutex<HashMap<String, CellRecord>>,
    last_index: Mutex<HashMap<String, Instant>>,
    /// Runs this handle writes, to rebuild their index on a change of state.
    runs: Mutex<HashMap<String, Run>>,
    /// `records.json` of runs just loaded, until it is read (it is checked
    /// like a fresh read: it names the state and keys it covers).
    prefetched: Mutex<HashMap<String, Vec<u8>>>,
    /// `run.json` of runs just found by `has_run`, until they are loaded.
    run_json: Mutex<HashMap<String, Vec<u8>>>,
    /// Each run's latest state key as last listed, and when.
    state_keys: Mutex<HashMap<String, (Option<String>, Instant)>>,
}

/// How long a listed latest state key is taken as current by a reader.
const STATE_KEY_FRESH: Duration = Duration::from_secs(1);

impl S3Store {
    /// Open `s3://bucket/prefix` (no request: a wrong bucket or credential
    /// fails the first one with an error naming the bucket and where the
    /// credentials came from).
    pub fn open(url: &str) -> Result<S3Store> {
        let (bucket, prefix) = parse_url(url)?;
        let objects = Objects::connect(&bucket)?;
        let key_prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        // No request yet: the first one (every command makes one before
        // any work) fails with the same classified error, naming the bucket
        // and where the credentials came from.
        let host = hostname();
        let now = Utc::now();
        let token = format!(
            "w-{}-{}-{}",
            host.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(20)
                .collect::<String>(),
            std::process::id(),
            now.timestamp_nanos_opt().unwrap_or_default()
        );
        let work = std::env::var_os("ORCH_S3_WORKDIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("XDG_CACHE_HOME")
                    .map(PathBuf::from)
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                    .unwrap_or_else(std::env::temp_dir)
                    .join("orch")
                    .join("s3")
            })
            .join(&bucket)
            .join(if prefix.is_empty() { "_" } else { &prefix });
        Ok(S3Store {
            objects: Arc::new(objects),
            prefix: key_prefix,
            url: format!(
                "s3://{bucket}{}{}",
                if prefix.is_empty() { "" } else { "/" },
                prefix
            ),
            token,
            work,
            probed: OnceLock::new(),
            followers: Mutex::new(HashMap::new()),
            records: Mutex::new(HashMap::new()),
            last_index: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            state_keys: Mutex::new(HashMap::new()),
            run_json: Mutex::new(HashMap::new()),
            prefetched: Mutex::new(HashMap::new()),
        })
    }

    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// `<prefix>/<run>/`
    pub fn run_key(&self, id: &str) -> String {
        format!("{}{id}/", self.prefix)
    }

    fn claim_bytes(&self) -> Vec<u8> {
        let c = Claim {
            writer: self.token.clone(),
            host: hostname(),
            pid: std::process::id(),
            at: Utc::now(),
        };
        serde_json::to_vec(&c).unwrap_or_default()
    }

    /// Find out, once, whether the server honours `If-None-Match: *`.
    fn probe(&self) -> Result<()> {
        let r = self.probed.get_or_init(|| {
            let key = format!("{}.orch/probe/{}", self.prefix, self.token);
            let run = || -> Result<bool> {
                let first = self.objects.create(&key, self.claim_bytes(), &self.token)?;
                // A second create with another token must be refused.
                let second = self.objects.create(&key, b"{\"writer\":\"probe-2\"}".to_vec(), "probe-2")?;
                let _ = self.objects.delete(std::slice::from_ref(&key));
                Ok(first == Created::Ours && matches!(second, Created::Theirs(_)))
            };
            match run() {
                Ok(true) => Ok(()),
                Ok(false) if std::env::var(UNCONDITIONAL_ENV).is_ok_and(|v| v == "1") => {
                    eprintln!(
                        "warning: the object store at {} ignores conditional writes (`If-None-Match`); with `{UNCONDITIONAL_ENV}=1` two processes writing one run may both record a cell",
                        self.objects.endpoint
                    );
                    Ok(())
                }
                Ok(false) => Err(format!(
                    "the object store at {} ignores conditional writes (`If-None-Match: *`): a second create of `{key}` overwrote the first",
                    self.objects.endpoint
                )),
                Err(e) => Err(e.to_string()),
            }
        });
        r.clone().map_err(|message| StoreError::Remote {
            message,
            hint: format!(
                "use a server that supports conditional writes (AWS S3, MinIO, R2, recent Ceph), or set `{UNCONDITIONAL_ENV}=1` if only one process ever writes a run"
            ),
            user: true,
        })
    }

    /// Create `key` once; `Err(writer)` names the other writer on a conflict.
    fn create(&self, key: &str, bytes: Vec<u8>) -> Result<std::result::Result<(), String>> {
        self.probe()?;
        Ok(match self.objects.create(key, bytes, &self.token)? {
            Created::Ours => Ok(()),
            Created::Theirs(b) => Err(writer_of(&b)),
        })
    }

    fn get_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<Option<T>> {
        match self.objects.get(key, 0)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    path: PathBuf::from(format!("s3://{}/{key}", self.objects.bucket)),
                    source,
                }),
        }
    }

    fn must_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<T> {
        self.must_parse(key, self.objects.get(key, 0)?)
    }

    /// An object's JSON, read already (`None`: it is missing).
    fn must_parse<T: for<'de> Deserialize<'de>>(&self, key: &str, bytes: Option<Vec<u8>>) -> Result<T> {
        let bytes = bytes.ok_or_else(|| StoreError::Remote {
            message: format!("`s3://{}/{key}` is missing", self.objects.bucket),
            hint:
                "the run was not written whole (a push or a run interrupted at its start); delete its prefix"
                    .into(),
            user: false,
        })?;
        serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
            path: PathBuf::from(format!("s3://{}/{key}", self.objects.bucket)),
            source,
        })
    }

    fn with_writer<T: Serialize>(&self, value: &T) -> Vec<u8> {
        let mut v = serde_json::to_value(value).unwrap_or_default();
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("writer".into(), self.token.clone().into());
        }
        serde_json::to_vec_pretty(&v).unwrap_or_default()
    }

    /// Every record key of a run (`records/<cell>/<n>.json`, `done/<cell>.json`), relative to the run.
    fn record_keys(&self, id: &str) -> Result<Vec<String>> {
        let base = self.run_key(id);
        let mut keys: Vec<String> = Vec::new();
        for l in self.objects.list(&format!("{base}records/"))? {
            keys.push(l.key[base.len()..].to_string());
        }
        for l in self.objects.list_dir(&format!("{base}done/"))? {
            keys.push(l.key[base.len()..].to_string());
        }
        Ok(keys)
    }

    /// Records by relative key, read once each (records are immutable).
    fn load_records(&self, id: &str, keys: &[String]) -> Result<HashMap<String, CellRecord>> {
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
    fn split_records(
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

    /// The key (relative to the run) and content of the run's latest state
    /// object, when it has one.
    fn latest_state(&self, id: &str) -> Result<(Option<String>, Option<RunMeta>)> {
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
    fn list_state_key(&self, id: &str) -> Result<Option<String>> {
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
    fn sealed(&self, id: &str, state_key: Option<&str>, state: orch_store::RunState) -> Result<bool> {
        let Some(state_key) = state_key else {
            return Ok(false);
        };
        if state == orch_store::RunState::Running || self.runs.lock().map_or(true, |m| m.contains_key(id)) {
            return Ok(false);
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
    fn write_index(&self, run: &Run) -> Result<Index> {
        // The state before the records: the caches cover every record
        // written up to that state.
        let state = self.latest_state(run.id())?;
        let keys = self.record_keys(run.id())?;
        let (records, earlier) = self.split_records(run, &keys)?;
        self.write_caches(run, state, keys, records, earlier)
    }

    /// Write a run's caches (index and records) from records read at `keys`.
    fn write_caches(
        &self,
        run: &Run,
        (state_key, state_meta): (Option<String>, Option<RunMeta>),
        keys: Vec<String>,
        records: Vec<Option<CellRecord>>,
        earlier: Vec<CellRecord>,
    ) -> Result<Index> {
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

    fn read_records_cache(&self, id: &str) -> Option<RecordsCache> {
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
    fn records_of(&self, run: &Run) -> Result<(Vec<Option<CellRecord>>, Vec<CellRecord>)> {
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

    /// The runs' folders under the prefix (the listing of a store written
    /// before the run markers).
    fn folder_run_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .objects
            .list_dirs(&self.prefix)?
            .into_iter()
            .filter_map(|d| d[self.prefix.len()..].strip_suffix('/').map(String::from))
            .filter(|id| !id.starts_with('.'))
            .collect())
    }

    /// Note a change of a run's state for catalog readers (after its index).
    fn note_change(&self, id: &str) -> Result<()> {
        let key = format!(
            "{}.orch/changes/{:013}~{}~{id}",
            self.prefix,
            Utc::now().timestamp_millis().max(0),
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

    /// The run's index when it is current (sealed, or covering the record
    /// keys listed now), else rebuilt from the run `open` gives.
    fn fresh_index(&self, id: &str, open: impl FnOnce() -> Result<Run>) -> Result<Index> {
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

    fn read_index(&self, id: &str) -> Option<Index> {
        let b = self
            .objects
            .get(&format!("{}index.json", self.run_key(id)), 0)
            .ok()??;
        serde_json::from_slice::<Index>(&b)
            .ok()
            .filter(|i| i.v == INDEX_VERSION)
    }

    /// The attempt whose files are the cell's current ones: the recorded
    /// one, else the last claimed (running) one.
    fn current_attempt(&self, run: &Run, cell: &str) -> Result<Option<u32>> {
        if let Some(r) = self.cell_record(run, cell)? {
            return Ok(Some(r.attempt));
        }
        Ok(self.claims(run.id(), cell)?.into_iter().max())
    }

    fn claims(&self, id: &str, cell: &str) -> Result<Vec<u32>> {
        let base = format!("{}claims/{cell}/", self.run_key(id));
        Ok(self
            .objects
            .list_dir(&base)?
            .into_iter()
            .filter_map(|l| l.key[base.len()..].parse().ok())
            .collect())
    }
}

/// Seconds past a cell's timeout and grace after which its claim is stale.
const CLAIM_SLACK_S: f64 = 60.0;

/// Whether the process that claimed an attempt may still be running it: on
/// this host, while its pid lives; elsewhere, until the cell's timeout (and
/// grace) has passed since the claim, which no live attempt outlasts.
fn claim_alive(claim: &Claim, limit_s: f64) -> bool {
    if claim.host == hostname() {
        return claim.pid == std::process::id() || Path::new(&format!("/proc/{}", claim.pid)).exists();
    }
    let age = (Utc::now() - claim.at).num_milliseconds() as f64 / 1000.0;
    age < limit_s
}

fn writer_of(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v["writer"].as_str().map(String::from))
        .unwrap_or_else(|| "another writer".into())
}

fn poisoned() -> StoreError {
    StoreError::Remote {
        message: "the object store's cache lock was poisoned by a panic".into(),
        hint: "report this bug".into(),
        user: false,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

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
        let key = format!(
            "{}state/{:013}-{}.json",
            self.run_key(&meta.id),
            Utc::now().timestamp_millis(),
            self.token
        );
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
        self.note_change(&meta.id)
    }

    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
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
        let runkey = self.run_key(run.id());
        // Finished by another process since this one listed its cells.
        if let Some(done) = self.objects.get(&format!("{runkey}done/{cell}.json"), 0)? {
            return Err(StoreError::RecordedElsewhere {
                run: run.id().to_string(),
                cell: cell.to_string(),
                by: writer_of(&done),
            });
        }
        let last = self.claims(run.id(), cell)?.into_iter().max();
        if let Some(n) = last {
            let record = self.objects.get(&format!("{runkey}records/{cell}/{n}.json"), 0)?;
            // A finished record whose `done` marker is not up yet: the other
            // process is between its two writes (record, then done).
            if let Some(bytes) = &record {
                let finished = serde_json::from_slice::<serde_json::Value>(bytes)
                    .ok()
                    .and_then(|v| v["status"].as_str().map(|s| s != "cancelled"))
                    .unwrap_or(false);
                if finished {
                    return Err(StoreError::RecordedElsewhere {
                        run: run.id().to_string(),
                        cell: cell.to_string(),
                        by: writer_of(bytes),
                    });
                }
            }
            let recorded = record.is_some();
            if !recorded {
                if let Some(claim) = self.get_json::<Claim>(&format!("{runkey}claims/{cell}/{n}"))? {
                    let limit = run
                        .plan
                        .cells
                        .iter()
                        .find(|c| c.id == cell)
                        .map(|c| c.task.measure.timeout_s + c.task.measure.kill_grace_s)
                        .unwrap_or(0.0)
                        + CLAIM_SLACK_S;
                    if claim_alive(&claim, limit) {
                        return Err(StoreError::Claimed {
                            run: run.id().to_string(),
                            cell: cell.to_string(),
                            by: format!("{} pid {} on {}", claim.writer, claim.pid, claim.host),
                        });
                    }
                }
            }
        }
        let n = last.unwrap_or(0) + 1;
        let key = format!("{runkey}claims/{cell}/{n}");
        if let Err(by) = self.create(&key, self.claim_bytes())? {
            return Err(StoreError::Claimed {
                run: run.id().to_string(),
                cell: cell.to_string(),
                by,
            });
        }
        let dir = run.cell_dir(cell);
        // A leftover of a crash on this host: its files went up under its
        // own attempt as far as they were followed.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
            action: "create the cell folder",
            path: dir.clone(),
            source,
        })?;
        let base = format!("{}cells/{cell}/{n}/", self.run_key(run.id()));
        let f = follow::Follower::start(self.objects.clone(), dir.clone(), base.clone());
        if let Ok(mut m) = self.followers.lock() {
            m.insert((run.id().to_string(), cell.to_string()), (f, base));
        }
        Ok((dir, n))
    }

    fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()> {
        let cell = &record.id;
        let runkey = self.run_key(run.id());
        let follower = self
            .followers
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&(run.id().to_string(), cell.clone())));
        let base = match follower {
            Some((f, base)) => {
                f.stop();
                base
            }
            None => format!("{runkey}cells/{cell}/{}/", record.attempt),
        };
        let dir = run.cell_dir(cell);
        if dir.is_dir() {
            follow::finalize(&self.objects, &dir, &base)?;
        }
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
        let _ = std::fs::remove_dir_all(&dir);
        let due = self
            .last_index
            .lock()
            .ok()
            .map(|l| l.get(run.id()).is_none_or(|t| t.elapsed() >= INDEX_EVERY))
            .unwrap_or(true);
        if due {
            let _ = self.write_index(run);
        }
        outcome
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

    fn summaries(&self, store: &Store) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        let t0 = Utc::now().timestamp_millis();
        // The runs that exist are the ones listed; the catalog only saves reads.
        let ids = store.run_ids()?;
        let catalog = self.read_catalog();
        let changes = self.changes_since(catalog.as_ref().map_or(t0, |c| c.cut_ms) - SKEW_MS)?;
        let mut kept: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        let mut live: Vec<String> = Vec::new();
        for id in &ids {
            let entry = catalog.as_ref().and_then(|c| c.runs.get(id)).filter(|e| {
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
        Ok((kept.into_values().map(|e| e.summary).collect(), damaged))
    }

    fn cost_lines(&self, store: &Store, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        let ids = store.run_ids()?;
        let per_run =
            orch_store::parallel_map_with(&ids, objects::PARALLEL, |id| -> Result<Vec<LedgerLine>> {
                // A fresh index is enough: the run itself (its plan) is read only to rebuild it.
                Ok(self.fresh_index(id, || store.open_exact(id))?.ledger)
            });
        let mut out = Vec::new();
        for r in per_run {
            out.extend(
                r?.into_iter()
                    .filter(|l| since.is_none_or(|s| l.finished_at >= s)),
            );
        }
        Ok(out)
    }
}

/// Upload-side helper used by tests: the local working folder of a store.
pub fn work_dir(store: &S3Store) -> &Path {
    &store.work
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_parsed_and_bad_ones_named() {
        assert_eq!(
            parse_url("s3://team-results/perf/").unwrap(),
            ("team-results".to_string(), "perf".to_string())
        );
        assert_eq!(parse_url("s3://abc").unwrap(), ("abc".to_string(), String::new()));
        for (url, why) in [
            ("team/x", "not an `s3://` URL"),
            ("s3://", "empty"),
            ("s3://b/x", "at least 3 characters"),
            ("s3://a b/x", "characters a bucket cannot have"),
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(err.is_user_error(), "{url}: {err}");
            let text = err.to_string();
            assert!(
                text.contains(why) && text.contains(url) && text.contains("hint:"),
                "{url}: {text}"
            );
        }
        assert!(parse_url("s3://team/../x").unwrap_err().is_user_error());
    }
}
