//! The run's one writer of cell records (a group commit). A cell that ends
//! hands its record here and waits for the answer; every record that is
//! pending when a write starts goes into that write ([`Run::finish_cells`]:
//! the folder store syncs the batch's records at once and appends the
//! ledger once, an object store uploads them side by side and rewrites the
//! run's index at most once, and at most every 5 s), on a thread of its
//! own (never a runtime worker, and never queued behind the blocking pool's
//! other work). A thousand cells ending in the same second are a few
//! writes, not a thousand in a row, and the cells' tasks go on meanwhile.
//!
//! A cell is answered only once its record is stored as the store's
//! `finish_cell` stores it (whole and durable), so a cell counts as recorded
//! only then: `orch` killed in the middle of a write loses only records
//! that no cell was told were stored, and `--resume` runs those cells again.

use orch_store::{CellRecord, Run, StoreError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Records in one write at most (a write answers its cells when it ends).
pub(crate) const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<(), StoreError>>;

/// The sending side: one per invocation, shared by its cells.
pub(crate) struct Recorder {
    tx: mpsc::UnboundedSender<(CellRecord, Reply)>,
    /// The run's folder, for the error of a writer that stopped.
    dir: PathBuf,
}

impl Recorder {
    /// Start the writer of `run`'s records; it ends once every [`Recorder`]
    /// is dropped and the records sent are written.
    pub(crate) fn start(run: Arc<Run>) -> (Recorder, oneshot::Receiver<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (done_tx, done) = oneshot::channel();
        let dir = run.dir().to_path_buf();
        // Its own thread. Where none can be made the channel is dropped:
        // each cell is answered that its record could not be written, and
        // the run ends `interrupted` for `--resume`.
        let _ = std::thread::Builder::new()
            .name("orch-recorder".into())
            .spawn(move || {
                write_loop(&run, rx);
                let _ = done_tx.send(());
            });
        (Recorder { tx, dir }, done)
    }

    /// Store `record`; returns once it is stored (or could not be).
    pub(crate) async fn record(&self, record: CellRecord) -> Result<(), StoreError> {
        let (reply, answer) = oneshot::channel();
        if self.tx.send((record, reply)).is_err() {
            return Err(gone(&self.dir));
        }
        answer.await.unwrap_or_else(|_| Err(gone(&self.dir)))
    }
}

/// The writer stopped before answering (it panicked).
fn gone(dir: &Path) -> StoreError {
    StoreError::Io {
        action: "record a cell in",
        path: dir.to_path_buf(),
        source: std::io::Error::other("the writer of records stopped before the record was stored"),
    }
}

/// The writer's loop, on its own thread: one write at a time, of every
/// record pending when it starts.
fn write_loop(run: &Run, mut rx: mpsc::UnboundedReceiver<(CellRecord, Reply)>) {
    let dir = run.dir().to_path_buf();
    while let Some(first) = rx.blocking_recv() {
        let mut records = vec![first.0];
        let mut replies = vec![first.1];
        while records.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok((r, reply)) => {
                    records.push(r);
                    replies.push(reply);
                }
                Err(_) => break,
            }
        }
        // A panic in the store: no cell of the batch is recorded (each
        // is answered so), and the writer goes on with the next batch.
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run.finish_cells(&records)));
        let mut outcomes = written.unwrap_or_default().into_iter();
        for reply in replies {
            let _ = reply.send(outcomes.next().unwrap_or_else(|| Err(gone(&dir))));
        }
    }
}
