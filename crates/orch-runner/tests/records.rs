//! The runner's writes of records (a group commit): cells that end together
//! are recorded in one write, and a run that dies in the middle of a write
//! resumes with every finished cell once. Counts, not timings.

use orch_backend::fake::FakeBackend;
use orch_manifest::Plan;
use orch_runner::{execute, Progress};
use orch_store::{
    host_environment, CellRecord, FolderStore, Result, Run, RunMeta, Store, StoreBackend, WriterLock,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

mod common;
use common::{opts, plan};

/// A run of [`CELLS`] noop cells in `store`.
fn new_run(store: &Store) -> Run {
    store
        .create_run(
            &plan(CELLS),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap()
}

/// A folder store that counts its writes of records. Its first write waits
/// until `hold` says every other cell's record is pending; the write number
/// `die_in` stores half its records and then "dies": it never returns, and
/// nothing is written after it (as after `kill -9`).
struct Counting {
    inner: FolderStore,
    /// Records in each write, in order.
    batches: Mutex<Vec<usize>>,
    hold: Box<dyn Fn() -> bool + Send + Sync>,
    die_in: Option<usize>,
    dead: AtomicBool,
    died: tokio::sync::Notify,
    released: AtomicBool,
    /// The first write's `hold` came true (not the guard's minute).
    held_until_ready: AtomicBool,
}

impl Counting {
    fn new(root: &Path, hold: impl Fn() -> bool + Send + Sync + 'static, die_in: Option<usize>) -> Counting {
        Counting {
            inner: FolderStore::new(root),
            batches: Mutex::new(Vec::new()),
            hold: Box::new(hold),
            die_in,
            dead: AtomicBool::new(false),
            died: tokio::sync::Notify::new(),
            released: AtomicBool::new(false),
            held_until_ready: AtomicBool::new(false),
        }
    }

    fn batches(&self) -> Vec<usize> {
        self.batches.lock().unwrap().clone()
    }
}

impl StoreBackend for Counting {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn run_location(&self, id: &str) -> String {
        self.inner.run_location(id)
    }
    fn folder(&self) -> Option<&Path> {
        self.inner.folder()
    }
    fn local_dir(&self, id: &str) -> PathBuf {
        self.inner.local_dir(id)
    }
    fn run_ids(&self) -> Result<Vec<String>> {
        self.inner.run_ids()
    }
    fn create_run(&self, meta: &RunMeta, manifest_text: &str, plan: &Plan) -> Result<()> {
        self.inner.create_run(meta, manifest_text, plan)
    }
    fn load_run(&self, id: &str) -> Result<(RunMeta, Plan)> {
        self.inner.load_run(id)
    }
    fn lock_run(&self, run: &Run) -> Result<WriterLock> {
        self.inner.lock_run(run)
    }
    fn save_meta(&self, meta: &RunMeta) -> Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            return Err(dead());
        }
        self.inner.save_meta(meta)
    }
    fn cell_record(&self, run: &Run, cell: &str) -> Result<Option<CellRecord>> {
        self.inner.cell_record(run, cell)
    }
    fn earlier_records(&self, run: &Run) -> Result<Vec<CellRecord>> {
        self.inner.earlier_records(run)
    }
    fn prepare_cell(&self, run: &Run, cell: &str) -> Result<(PathBuf, u32)> {
        self.inner.prepare_cell(run, cell)
    }
    fn finish_cell(&self, run: &Run, record: &CellRecord) -> Result<()> {
        self.finish_cells(run, std::slice::from_ref(record))
            .pop()
            .unwrap()
    }
    fn finish_cells(&self, run: &Run, records: &[CellRecord]) -> Vec<Result<()>> {
        let n = {
            let mut b = self.batches.lock().unwrap();
            b.push(records.len());
            b.len()
        };
        if n == 1 {
            // A guard against a hang, not a timing: the cells end in milliseconds.
            let until = Instant::now() + Duration::from_secs(60);
            while !(self.hold)() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.held_until_ready.store((self.hold)(), Ordering::SeqCst);
        }
        if self.dead.load(Ordering::SeqCst) {
            return records.iter().map(|_| Err(dead())).collect();
        }
        if self.die_in == Some(n) {
            let half = records.len() / 2;
            let _ = self.inner.finish_cells(run, &records[..half]);
            self.dead.store(true, Ordering::SeqCst);
            self.died.notify_one();
            // The process is gone: this write never answers its cells (it
            // returns, answering no one, once the test has dropped the run).
            while !self.released.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            return records.iter().map(|_| Err(dead())).collect();
        }
        self.inner.finish_cells(run, records)
    }
    fn ledger(&self, run: &Run) -> Result<Vec<orch_cost::LedgerLine>> {
        self.inner.ledger(run)
    }
    fn read_cell_file(&self, run: &Run, cell: &str, name: &str, offset: u64) -> Result<Option<Vec<u8>>> {
        self.inner.read_cell_file(run, cell, name, offset)
    }
}

fn dead() -> orch_store::StoreError {
    orch_store::StoreError::Io {
        action: "write",
        path: PathBuf::from("dead"),
        source: std::io::Error::other("the process is gone"),
    }
}

/// The ids of the cells with a record, read by a fresh store (as a new process reads them).
fn recorded(root: &Path, id: &str) -> Vec<String> {
    let run = Store::new(root).open_exact(id).unwrap();
    let mut out: Vec<String> = run
        .plan
        .cells
        .iter()
        .filter(|c| run.cell_record(&c.id).unwrap().is_some())
        .map(|c| c.id.clone())
        .collect();
    out.sort();
    out
}

const CELLS: usize = 300;

#[tokio::test]
async fn records_of_cells_ending_together_are_written_together() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeBackend::new(Duration::from_millis(50)));
    let f = fake.clone();
    // The first write waits until every cell has ended: the other records are pending then.
    let counting = Arc::new(Counting::new(
        tmp.path(),
        move || f.launched().len() == CELLS && f.running_now() == 0,
        None,
    ));
    let store = Store::with_backend(counting.clone());
    let mut run = new_run(&store);
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let outcome = execute(&mut run, fake.clone(), opts(CELLS), tx, cancel_rx)
        .await
        .unwrap();
    assert!(outcome.all_succeeded(), "{outcome:?}");
    let batches = counting.batches();
    assert_eq!(batches.iter().sum::<usize>(), CELLS, "{batches:?}");
    // One write for the first cell to end, one for all the others: not one per cell.
    assert!(
        batches.len() <= 2,
        "{} writes for {CELLS} cells: {batches:?}",
        batches.len()
    );
    assert_eq!(recorded(tmp.path(), run.id()).len(), CELLS);
    // The ledger got each cell's line once (one append per write).
    let lines = std::fs::read_to_string(run.ledger_path()).unwrap();
    assert_eq!(lines.lines().count(), CELLS);
}

#[tokio::test]
async fn a_run_killed_in_the_middle_of_a_write_resumes_with_every_finished_cell_once() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeBackend::new(Duration::from_millis(50)));
    let f = fake.clone();
    // Write 1: the first cell to end; write 2: the others, killed after half of them.
    let counting = Arc::new(Counting::new(
        tmp.path(),
        move || f.launched().len() == CELLS && f.running_now() == 0,
        Some(2),
    ));
    let store = Store::with_backend(counting.clone());
    let mut run = new_run(&store);
    let id = run.id().to_string();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    tokio::select! {
        r = execute(&mut run, fake.clone(), opts(CELLS), tx, cancel_rx) => panic!("the run ended: {r:?}"),
        _ = counting.died.notified() => {}
    }
    // The run (its cells' tasks) is dropped: the dead write may return.
    counting.released.store(true, Ordering::SeqCst);
    // What the "dead" process had said was stored.
    let mut told = Vec::new();
    while let Ok(p) = rx.try_recv() {
        if let Progress::CellFinished(r) = p {
            told.push(r.id.clone());
        }
    }
    let batches = counting.batches();
    assert_eq!(batches.len(), 2, "{batches:?}");
    let before = recorded(tmp.path(), &id);
    assert_eq!(before.len(), batches[0] + batches[1] / 2, "{batches:?}");
    assert!(before.len() < CELLS);
    for cell in &told {
        assert!(
            before.contains(cell),
            "`{cell}` was told stored but has no record"
        );
    }

    // A new process resumes: only the cells without a record run.
    let store = Store::new(tmp.path());
    let mut again = store.open_exact(&id).unwrap();
    let fake2 = Arc::new(FakeBackend::new(Duration::from_millis(1)));
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let outcome = execute(&mut again, fake2.clone(), opts(64), tx, cancel_rx)
        .await
        .unwrap();
    assert!(outcome.all_succeeded(), "{outcome:?}");
    let mut rerun = fake2.launched();
    rerun.sort();
    assert_eq!(rerun.len(), CELLS - before.len());
    assert!(
        rerun.iter().all(|c| !before.contains(c)),
        "a recorded cell ran again"
    );
    assert_eq!(recorded(tmp.path(), &id).len(), CELLS);
    // Every cell once: one record each, one ledger line each.
    let run = store.open_exact(&id).unwrap();
    let all = run.all_records().unwrap();
    assert_eq!(all.len(), CELLS, "no cell has a second record");
    let mut ledger: Vec<String> = run.ledger().unwrap().into_iter().map(|l| l.cell).collect();
    ledger.sort();
    ledger.dedup();
    assert_eq!(ledger.len(), CELLS);
    assert_eq!(run.ledger().unwrap().len(), CELLS);
}

/// A cell gives back its place among `--jobs` once the platform is done with
/// it, not once its record is stored: with one cell at a time, the second
/// cell starts while the first one's record is still being written (a slow
/// store does not hold the next cell back).
#[tokio::test]
async fn the_next_cell_starts_while_a_record_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeBackend::new(Duration::from_millis(10)));
    let f = fake.clone();
    // The first write waits until the second cell has been launched.
    let counting = Arc::new(Counting::new(tmp.path(), move || f.launched().len() == 2, None));
    let store = Store::with_backend(counting.clone());
    let mut run = store
        .create_run(
            &plan(2),
            "",
            "fake",
            host_environment(Path::new("t.yaml"), vec![]),
        )
        .unwrap();
    let (tx, _rx) = mpsc::unbounded_channel();
    let (_c, cancel_rx) = watch::channel(false);
    let outcome = execute(&mut run, fake.clone(), opts(1), tx, cancel_rx)
        .await
        .unwrap();
    assert!(outcome.all_succeeded(), "{outcome:?}");
    assert!(
        counting.held_until_ready.load(Ordering::SeqCst),
        "the second cell was not launched while the first one's record was written"
    );
    assert_eq!(fake.max_parallel_seen(), 1, "one cell at a time on the platform");
    assert_eq!(recorded(tmp.path(), run.id()).len(), 2);
}
