//! Claims: who runs attempt n of a cell (`claims/<cell>/<n>`, created once),
//! whether a claim's process may still be running it, and the next attempt
//! claimed for this process.

use crate::conditional::writer_of;
use crate::{Result, S3Store};
use chrono::{DateTime, Utc};
use orch_protocol::Status;
use orch_store::{Run, StoreBackend, StoreError};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Who wrote an object: unique per store handle (host, process, time).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Claim {
    writer: String,
    host: String,
    pid: u32,
    at: DateTime<Utc>,
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

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl S3Store {
    pub(crate) fn claim_bytes(&self) -> Vec<u8> {
        let c = Claim {
            writer: self.token.clone(),
            host: hostname(),
            pid: std::process::id(),
            at: Utc::now(),
        };
        serde_json::to_vec(&c).unwrap_or_default()
    }

    /// The attempt whose files are the cell's current ones: the recorded
    /// one, else the last claimed (running) one.
    pub(crate) fn current_attempt(&self, run: &Run, cell: &str) -> Result<Option<u32>> {
        if let Some(r) = self.cell_record(run, cell)? {
            return Ok(Some(r.attempt));
        }
        Ok(self.claims(run.id(), cell)?.into_iter().max())
    }

    pub(crate) fn claims(&self, id: &str, cell: &str) -> Result<Vec<u32>> {
        let base = format!("{}claims/{cell}/", self.run_key(id));
        Ok(self
            .objects
            .list_dir(&base)?
            .into_iter()
            .filter_map(|l| l.key[base.len()..].parse().ok())
            .collect())
    }

    /// Claim the cell's next attempt for this process. Refused when another
    /// process recorded the cell (its `done` marker, or a finished record
    /// whose marker is not up yet) or may still be running its last claim.
    pub(crate) fn claim_attempt(&self, run: &Run, cell: &str) -> Result<u32> {
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
                    .and_then(|v| v["status"].as_str().map(|s| s != Status::Cancelled.as_str()))
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
        Ok(n)
    }
}
