//! The result store on S3 or an S3-compatible object store, behind
//! [`orch_store::StoreBackend`]: `--store s3://bucket/prefix`.
//!
//! Layout under `<prefix>/<run>/` (every key written once unless marked):
//!
//! ```text
//! run.json, manifest.yaml, plan.json   as in a folder store
//! state/<ms>-<writer>.json             each change of state, budget or resumes; the last one counts
//! claims/<cell>/<n>                    who runs attempt n of the cell (If-None-Match: one writer per attempt)
//! writers/<ms>-<writer>.json           REWRITTEN: the lease of an `orch` writing the run (`lease.rs`;
//!                                      the earliest live one holds the run, removed when it ends)
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
//! changes/<ms>~<writer>~<run>         one per change of a run's state (after its index is rewritten;
//!                                      for state/<ms>-<writer>.json, its own time and writer)
//! catalog/<inverted ms>-<writer>.json  a snapshot of every run's summary and cost ledger as of <ms>,
//!                                      newest first; written by `orch ls` or `orch cost` when it had
//!                                      to read many runs one by one, the two newest kept
//! ```
//!
//! `orch ls` and `orch cost` read the newest catalog, list the changes since
//! it (less a margin for clock skew), and read one by one only the runs that
//! are new, changed or still running (`orch cost` makes a running run's index
//! current first). `orch show` (a run's records and its ledger) trusts a
//! run's cache without listing its records while the run's latest state is the finished
//! state the cache was made at (every session writes a running state before
//! its first record), and otherwise only when the record keys it covers are
//! the ones listed now. `orch history` opens every run of the store at
//! once: a run whose caches say it is finished, made at the newest state
//! the store's changes name, is read from its caches without a listing
//! (`reading.rs`); any other run as `orch show` reads it.
//!
//! Concurrency: records are created with `If-None-Match: *`; every created
//! object carries this writer's token, so a conflict on a create whose
//! first reply was lost (the retry finds the object) is told apart from a
//! real one (another writer's token). A server that ignores conditional
//! writes is found out by the probe before the first write, and refused
//! unless `ORCH_S3_UNCONDITIONAL=1`.
//!
//! Outages: every request has a connect, read, attempt and operation
//! timeout and is retried with backoff (the SDK's `TimeoutConfig` and
//! `RetryConfig`) within a budget of 60 s from the outage's first failed
//! request, shared by every request of the process; the environment sets them:
//!
//! ```text
//! ORCH_S3_TIMEOUT_S=60           an outage (every request from its first failure on), and one operation
//! ORCH_S3_ATTEMPT_TIMEOUT_S=30   one attempt (connect, send, the reply's headers; a read's body)
//! ORCH_S3_CONNECT_TIMEOUT_S=5    opening a connection
//! ORCH_S3_MAX_ATTEMPTS=40        attempts per operation at most
//! ORCH_S3_RETRY_MODE=standard    or `adaptive` (the SDK's client-side rate limiter)
//! ```
//!
//! A finished cell whose record (or files) cannot be uploaded within the
//! budget is kept in the local spool, `<work>/.spool/<run>/` (`<work>`
//! is `$ORCH_S3_WORKDIR` or `~/.cache/orch/s3/<bucket>/<prefix>`, so the
//! spool is keyed by the store URL and the run): the run goes on with a
//! warning, and the record goes up, at most once, with the next write of
//! the run that succeeds, before the run's records are read or its final
//! state written, and when any command (`orch run --resume`, `orch show`,
//! ...) opens the run. A refused credential or a missing bucket stops the
//! run (a user error); the record is spooled all the same.
//!
//! An outage is given up as a whole: every request of the process draws on
//! one budget, counted from the outage's first failed request and reset when
//! the store answers (`outage.rs`), and the error names what the store
//! answered (`` `503 SlowDown` ×289``); a run that stops so keeps its state
//! in the spool too, written when the store answers again.
//!
//! The files: `layout.rs` (URLs and keys), `lease.rs` (one writer per
//! run), `outage.rs` (the outage budget and what the store answered), `conditional.rs` (write-once
//! creates and the probe, JSON reads), `claims.rs` (who runs which attempt),
//! `records.rs` (records and their cache), `index.rs` (the run index and the
//! state it was made at), `catalog.rs` (run markers, changes, the catalog),
//! `backend.rs` (the store backend), `spool.rs` (records kept locally
//! through an outage), `reading.rs` (many finished runs opened for
//! `orch history` from their caches, without a listing each); `objects.rs`,
//! `follow.rs` and `transfer.rs` as above.
//!
//! ## What is where
//!
//! `S3Store` (`--store s3://bucket/prefix`): `objects.rs` (aws-sdk-s3 on
//! its own runtime behind a blocking face: get/range, conditional create with the writer
//! token, list, parallel gets, multipart file upload; errors classified, credentials
//! named by source and redacted), the write-once layout (`run.json`, `state/`, `claims/`,
//! `records/`, `done/`, `cells/<cell>/<n>/`, the `index.json` and `records.json` caches,
//! the store's `.orch/changes/` and `.orch/catalog/`), the catalog that lets `orch ls`
//! and `orch cost` read one object instead of one or two per run, the `If-None-Match` probe; `follow.rs`
//! (running cells' files up as segments every 2 s by one thread for every cell, whole
//! at the end, links never followed); a batch of finished cells (`finish_cells`, the
//! runner's group commit) goes up side by side and rewrites the run's index at most once (at most every 5 s); `transfer.rs` (`push`/`pull`, verified, hostile keys refused). It does not:
//! compile into the core or the agent.

mod backend;
mod catalog;
mod claims;
mod conditional;
pub mod follow;
mod index;
mod layout;
pub mod lease;
pub mod objects;
pub mod outage;
mod reading;
mod records;
mod spool;
pub mod transfer;

pub use layout::parse_url;

use chrono::Utc;
use objects::Objects;
use orch_store::{CellRecord, Run, StoreError};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

type Result<T> = std::result::Result<T, StoreError>;

/// The environment variable that accepts a server ignoring `If-None-Match`.
pub const UNCONDITIONAL_ENV: &str = "ORCH_S3_UNCONDITIONAL";

pub struct S3Store {
    objects: Arc<Objects>,
    prefix: String,
    url: String,
    token: String,
    work: PathBuf,
    /// The probe's answer, once there is one.
    probed: Mutex<Option<std::result::Result<(), String>>>,
    /// Runs that may have records in the local spool (see `spool.rs`).
    spool_pending: Mutex<HashSet<String>>,
    /// One upload of the spool at a time.
    spool_lock: Mutex<()>,
    /// The running cells' folders, followed by one thread.
    followers: follow::Followers,
    /// Records are never rewritten: once read, a key's record is kept.
    records: Mutex<HashMap<String, CellRecord>>,
    last_index: Mutex<HashMap<String, Instant>>,
    /// Rewrites of run indexes by this handle (see [`S3Store::index_writes`]).
    index_writes: std::sync::atomic::AtomicU64,
    /// Runs this handle writes, to rebuild their index on a change of state.
    runs: Mutex<HashMap<String, Run>>,
    /// `records.json` of runs just loaded, until it is read (it is checked
    /// like a fresh read: it names the state and keys it covers).
    prefetched: Mutex<HashMap<String, Vec<u8>>>,
    /// `run.json` of runs just found by `has_run`, until they are loaded.
    run_json: Mutex<HashMap<String, Vec<u8>>>,
    /// Each run's latest state key as last listed, and when.
    state_keys: Mutex<HashMap<String, (Option<String>, Instant)>>,
    /// Runs opened to be read (`reading.rs`) whose caches say they are
    /// finished and current: their latest state key, until their records are read.
    settled_states: Mutex<HashMap<String, String>>,
    /// The same runs' metadata and plan, until they are loaded.
    settled_runs: Mutex<HashMap<String, (orch_store::RunMeta, orch_manifest::Plan)>>,
}

impl S3Store {
    /// Open `s3://bucket/prefix` (no request: a wrong bucket or credential
    /// fails the first one with an error naming the bucket and where the
    /// credentials came from).
    pub fn open(url: &str) -> Result<S3Store> {
        S3Store::open_with(url, objects::Settings::from_env()?)
    }

    /// [`S3Store::open`] with these timeouts and retries (and, for tests,
    /// another endpoint).
    pub fn open_with(url: &str, settings: objects::Settings) -> Result<S3Store> {
        let (bucket, prefix) = parse_url(url)?;
        let objects = Objects::connect_with(&bucket, settings)?;
        let key_prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        // No request yet: the first one (every command makes one before
        // any work) fails with the same classified error, naming the bucket
        // and where the credentials came from.
        let host = claims::hostname();
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
        let objects = Arc::new(objects);
        Ok(S3Store {
            followers: follow::Followers::new(objects.clone()),
            objects,
            prefix: key_prefix,
            url: format!(
                "s3://{bucket}{}{}",
                if prefix.is_empty() { "" } else { "/" },
                prefix
            ),
            token,
            work,
            probed: Mutex::new(None),
            spool_pending: Mutex::new(HashSet::new()),
            spool_lock: Mutex::new(()),
            records: Mutex::new(HashMap::new()),
            last_index: Mutex::new(HashMap::new()),
            index_writes: std::sync::atomic::AtomicU64::new(0),
            runs: Mutex::new(HashMap::new()),
            state_keys: Mutex::new(HashMap::new()),
            run_json: Mutex::new(HashMap::new()),
            prefetched: Mutex::new(HashMap::new()),
            settled_states: Mutex::new(HashMap::new()),
            settled_runs: Mutex::new(HashMap::new()),
        })
    }

    pub fn objects(&self) -> &Objects {
        &self.objects
    }

    /// How many times this handle rewrote a run's index (and records
    /// cache): once per batch of records at most, and at most every few
    /// seconds while cells end, however many end at once.
    pub fn index_writes(&self) -> u64 {
        self.index_writes.load(std::sync::atomic::Ordering::Relaxed)
    }
}
