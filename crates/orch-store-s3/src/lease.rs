//! One writer per run on S3: `orch run` and `--resume` hold a lease,
//! `writers/<ms>-<writer>.json` (host, pid, the pid's start time, since,
//! renewed), and a second live one is refused with
//! [`StoreError::Locked`] naming the holder and the cells it holds (a user
//! error, exit 2), before it runs anything.
//!
//! With write-once keys and no compare-and-swap, each writer first writes
//! its own lease, then lists the others: the earliest live lease holds the
//! run, a later one withdraws (two resumes a second apart, or at once, end
//! with exactly one running). A lease is stale when its process is gone
//! (same host: no such pid, or another process with that pid) or, from
//! another host, when it was not renewed for [`EXPIRES_S`] (the holder
//! rewrites it every [`RENEW`]: the one object of a run rewritten besides
//! the caches). A stale lease is taken over (named, and removed). The lease
//! goes when its writer ends; per-cell claims (`claims.rs`) stay the
//! guard of each attempt.

use crate::objects::Objects;
use crate::{Result, S3Store};
use chrono::{DateTime, Utc};
use orch_store::{held_cells, Run, StoreError, Writer, WriterLock};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// How often a holder rewrites its lease.
pub const RENEW: Duration = Duration::from_secs(30);
/// Seconds without a renewal after which another host's lease is stale.
pub const EXPIRES_S: i64 = 150;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Lease {
    writer: String,
    host: String,
    pid: u32,
    /// The pid's start time (clock ticks since boot, `/proc/<pid>/stat`),
    /// so that a pid reused by another process is no holder.
    start: Option<u64>,
    since: DateTime<Utc>,
    renewed: DateTime<Utc>,
}

impl Lease {
    fn writer(&self) -> Writer {
        Writer {
            host: self.host.clone(),
            pid: self.pid,
            since: self.since,
        }
    }
}

/// The start time of a process of this host, if it lives.
fn pid_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) in parentheses:
    // the start time is the 22nd field, the 20th after `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn alive(l: &Lease) -> bool {
    if l.host == orch_store::hostname() {
        return pid_start(l.pid).is_some_and(|s| l.start.is_none_or(|ls| ls == s));
    }
    (Utc::now() - l.renewed).num_seconds() < EXPIRES_S
}

/// The held lease: renewed by a thread, removed when dropped.
struct Held {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn renew(objects: Arc<Objects>, key: String, mut lease: Lease, stop: std::sync::mpsc::Receiver<()>) {
    use std::sync::mpsc::RecvTimeoutError;
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(RENEW) {
        lease.renewed = Utc::now();
        // A renewal lost to an outage is tried again at the next turn.
        let _ = objects.put(&key, serde_json::to_vec(&lease).unwrap_or_default());
    }
    let _ = objects.delete(&[key]);
}

impl S3Store {
    /// Take the run's writer lease, or say who holds it (see the module).
    pub(crate) fn lease_run(&self, run: &Run) -> Result<WriterLock> {
        let base = format!("{}writers/", self.run_key(run.id()));
        let now = Utc::now();
        let key = format!("{base}{:013}-{}.json", now.timestamp_millis().max(0), self.token);
        let me = Lease {
            writer: self.token.clone(),
            host: orch_store::hostname(),
            pid: std::process::id(),
            start: pid_start(std::process::id()),
            since: now,
            renewed: now,
        };
        // A key of its own: a plain write.
        self.objects
            .put(&key, serde_json::to_vec(&me).unwrap_or_default())?;
        let mut others = self.objects.list_dir(&base)?;
        others.sort_by(|a, b| a.key.cmp(&b.key));
        let mut took_over = None;
        for l in others.iter().filter(|l| l.key != key) {
            let Some(other) = self.get_json::<Lease>(&l.key)? else {
                continue;
            };
            if !alive(&other) {
                took_over = Some(other.writer());
                let _ = self.objects.delete(std::slice::from_ref(&l.key));
                continue;
            }
            if l.key < key {
                // An earlier live writer holds the run: withdraw.
                let _ = self.objects.delete(&[key]);
                return Err(StoreError::Locked {
                    run: run.id().to_string(),
                    holder: other.writer().to_string(),
                    cells: held_cells(&run.unfinished_cells().unwrap_or_default()),
                });
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let objects = self.objects.clone();
        let thread = std::thread::Builder::new()
            .name("orch-s3-lease".into())
            .spawn(move || renew(objects, key, me, rx))
            .map_err(|e| StoreError::Remote {
                message: format!("cannot start the thread that renews the run's lease: {e}"),
                hint: "the system is out of threads or memory".into(),
                user: false,
            })?;
        Ok(WriterLock::guarded(
            Box::new(Held {
                stop: Some(tx),
                thread: Some(thread),
            }),
            took_over,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_process_is_told_from_a_gone_one_and_a_reused_pid() {
        let me = std::process::id();
        let start = pid_start(me);
        assert!(start.is_some());
        let now = Utc::now();
        let mut l = Lease {
            writer: "w".into(),
            host: orch_store::hostname(),
            pid: me,
            start,
            since: now,
            renewed: now,
        };
        assert!(alive(&l));
        l.start = start.map(|s| s + 1);
        assert!(!alive(&l), "another process with the same pid");
        l.pid = 4_000_000;
        l.start = None;
        assert!(!alive(&l));
        l.host = "elsewhere".into();
        assert!(alive(&l), "renewed just now on another host");
        l.renewed = now - chrono::Duration::seconds(EXPIRES_S + 1);
        assert!(!alive(&l));
    }
}
