//! GPUs handed to cells: who assigns them ([`GpuDevices`]) and the pool that gives each
//! GPU cell of this host its own.

use std::sync::Arc;

/// Who assigns a cell's GPUs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum GpuDevices {
    /// The platform (a cluster's scheduler, Modal): nothing to hand out here.
    #[default]
    Platform,
    /// This host's, not known (no `nvidia-smi`): GPU cells take turns.
    Unknown,
    /// This host's (`0`, `1`, ...).
    Known(Vec<String>),
}

/// GPUs handed out to running cells, so that no two share one. Where the
/// host's GPUs are not known, GPU cells run one at a time: the backend gives
/// each all it sees, and two such cells would share them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PoolMode {
    Platform,
    Unknown,
    Known,
}

pub(crate) struct GpuPool {
    free: tokio::sync::Mutex<Vec<String>>,
    changed: tokio::sync::Notify,
    mode: PoolMode,
    total: usize,
    /// Held by the one GPU cell running on unknown GPUs.
    unknown: Arc<tokio::sync::Mutex<()>>,
}

/// GPUs held by one cell; returned to the pool on drop.
pub(crate) struct Lease {
    pub(crate) ids: Vec<String>,
    pool: Option<Arc<GpuPool>>,
    _all: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let ids = std::mem::take(&mut self.ids);
            // Drop cannot await: return the GPUs from a task.
            tokio::spawn(async move {
                pool.free.lock().await.extend(ids);
                pool.changed.notify_waiters();
            });
        }
    }
}

impl GpuPool {
    pub(crate) fn new(devices: GpuDevices) -> GpuPool {
        let (mode, devices) = match devices {
            GpuDevices::Platform => (PoolMode::Platform, vec![]),
            GpuDevices::Unknown => (PoolMode::Unknown, vec![]),
            GpuDevices::Known(d) => (PoolMode::Known, d),
        };
        GpuPool {
            mode,
            total: devices.len(),
            free: tokio::sync::Mutex::new(devices),
            changed: tokio::sync::Notify::new(),
            unknown: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Wait until `n` GPUs are free and take them. `Err` (the host's count)
    /// when the host has fewer than `n`: such a cell never runs on fewer GPUs
    /// or on shared ones. With unknown devices nothing is assigned and GPU
    /// cells take turns; the platform's are not ours to count.
    pub(crate) async fn acquire(self: &Arc<Self>, n: usize) -> Result<Lease, usize> {
        if n == 0 || self.mode == PoolMode::Platform {
            return Ok(Lease {
                ids: vec![],
                pool: None,
                _all: None,
            });
        }
        if self.mode == PoolMode::Unknown {
            return Ok(Lease {
                ids: vec![],
                pool: None,
                _all: Some(self.unknown.clone().lock_owned().await),
            });
        }
        if n > self.total {
            return Err(self.total);
        }
        loop {
            let notified = self.changed.notified();
            {
                let mut free = self.free.lock().await;
                if free.len() >= n {
                    let ids: Vec<String> = free.drain(..n).collect();
                    return Ok(Lease {
                        ids,
                        pool: Some(self.clone()),
                        _all: None,
                    });
                }
            }
            notified.await;
        }
    }
}
