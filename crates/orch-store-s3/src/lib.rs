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
//! ```
//! and `<prefix>/.orch/probe/<writer>`, the conditional-write probe.
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
}

const INDEX_VERSION: u32 = 1;

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
}

impl S3Store {
    /// Open `s3://bucket/prefix`: checks that the bucket can be listed with
    /// the credentials found (a clear error naming the bucket and where the
    /// credentials came from otherwise).
    pub fn open(url: &str) -> Result<S3Store> {
        let (bucket, prefix) = parse_url(url)?;
        let objects = Objects::connect(&bucket)?;
        let key_prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        objects.check(&key_prefix)?;
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
        self.get_json(key)?.ok_or_else(|| StoreError::Remote {
            message: format!("`s3://{}/{key}` is missing", self.objects.bucket),
            hint:
                "the run was not written whole (a push or a run interrupted at its start); delete its prefix"
                    .into(),
            user: false,
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
        for sub in ["records/", "done/"] {
            for l in self.objects.list(&format!("{base}{sub}"))? {
                keys.push(l.key[base.len()..].to_string());
            }
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

    fn latest_meta(&self, id: &str, created: RunMeta) -> Result<RunMeta> {
        let base = format!("{}state/", self.run_key(id));
        let states = self.objects.list(&base)?;
        match states.last() {
            Some(l) => self.must_json(&l.key),
            None => Ok(created),
        }
    }

    /// Rebuild and write a run's index from its records (a cache).
    fn write_index(&self, run: &Run) -> Result<Index> {
        let keys = self.record_keys(run.id())?;
        let (records, earlier) = self.split_records(run, &keys)?;
        let mut meta = run.meta.clone();
        if let Ok(m) = self.latest_meta(run.id(), run.meta.clone()) {
            meta = m;
        }
        let rec = run.record_from(records.clone(), &earlier);
        let mut ledger: Vec<LedgerLine> = records.iter().flatten().map(|r| run.ledger_line(r)).collect();
        ledger.extend(earlier.iter().map(|r| run.ledger_line(r)));
        let index = Index {
            v: INDEX_VERSION,
            meta,
            summary: RunSummary::of(&rec),
            keys,
            ledger,
        };
        let bytes = serde_json::to_vec(&index).unwrap_or_default();
        self.objects
            .put(&format!("{}index.json", self.run_key(run.id())), bytes)?;
        if let Ok(mut l) = self.last_index.lock() {
            l.insert(run.id().to_string(), Instant::now());
        }
        Ok(index)
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
            .list(&base)?
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
        Ok(self
            .objects
            .list_dirs(&self.prefix)?
            .into_iter()
            .filter_map(|d| d[self.prefix.len()..].strip_suffix('/').map(String::from))
            .filter(|id| !id.starts_with('.'))
            .collect())
    }

    fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()> {
        let base = self.run_key(&meta.id);
        let conflict = |by: String| StoreError::Remote {
            message: format!(
                "the run `{}` already exists in {} (written by {by})",
                meta.id, self.url
            ),
            hint: "start the run again: a new id is drawn".into(),
            user: false,
        };
        // run.json first: it claims the id.
        self.create(&format!("{base}run.json"), self.with_writer(meta))?
            .map_err(conflict)?;
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
        Ok(())
    }

    fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)> {
        let base = self.run_key(id);
        let created: RunMeta = self.must_json(&format!("{base}run.json"))?;
        let plan: Plan = self.must_json(&format!("{base}plan.json"))?;
        let meta = self.latest_meta(id, created)?;
        Ok((meta, plan))
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
        Ok(())
    }

    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
        let base = self.run_key(run.id());
        if let Some(r) = self.get_json::<CellRecord>(&format!("{base}done/{cell}.json"))? {
            return Ok(Some(r));
        }
        let keys: Vec<String> = self
            .objects
            .list(&format!("{base}records/{cell}/"))?
            .into_iter()
            .map(|l| l.key[base.len()..].to_string())
            .collect();
        let recs = self.load_records(run.id(), &keys)?;
        Ok(recs.into_values().max_by_key(|r| r.attempt))
    }

    fn cell_records(&self, run: &Run) -> Result<Vec<Option<CellRecord>>> {
        let keys = self.record_keys(run.id())?;
        Ok(self.split_records(run, &keys)?.0)
    }

    fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>> {
        let keys = self.record_keys(run.id())?;
        Ok(self.split_records(run, &keys)?.1)
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
        let keys = self.record_keys(run.id())?;
        if let Some(i) = self.read_index(run.id()) {
            if i.keys == keys {
                return Ok(i.ledger);
            }
        }
        Ok(self.write_index(run)?.ledger)
    }

    fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        let Some(n) = self.current_attempt(run, cell)? else {
            return Ok(None);
        };
        let base = format!("{}cells/{cell}/{n}/", self.run_key(run.id()));
        follow::read(&self.objects, &base, name, offset)
    }

    fn summaries(&self, store: &Store) -> Result<(Vec<RunSummary>, Vec<StoreError>)> {
        let ids = store.run_ids()?;
        let found = orch_store::parallel_map_with(&ids, objects::PARALLEL, |id| match self.read_index(id) {
            Some(i) => Ok(i.summary),
            None => {
                let run = store.open_exact(id)?;
                self.write_index(&run).map(|i| i.summary)
            }
        });
        let mut out = Vec::new();
        let mut damaged = Vec::new();
        for r in found {
            match r {
                Ok(s) => out.push(s),
                Err(e) => damaged.push(e),
            }
        }
        Ok((out, damaged))
    }

    fn cost_lines(&self, store: &Store, since: Option<DateTime<Utc>>) -> Result<Vec<LedgerLine>> {
        let ids = store.run_ids()?;
        let per_run =
            orch_store::parallel_map_with(&ids, objects::PARALLEL, |id| -> Result<Vec<LedgerLine>> {
                // A fresh index is enough: the run itself (its plan) is read only to rebuild it.
                let keys = self.record_keys(id)?;
                if let Some(i) = self.read_index(id) {
                    if i.keys == keys {
                        return Ok(i.ledger);
                    }
                }
                Ok(self.write_index(&store.open_exact(id)?)?.ledger)
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
