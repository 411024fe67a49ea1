//! One writer per run (folder store): `orch run` and `orch run --resume`
//! hold an exclusive advisory lock (`flock`) on `<run>/.writer.lock` for as
//! long as they write the run, and say who they are in `<run>/writer.json`
//! (host, pid, since when). A second writer is refused with
//! [`StoreError::Locked`] naming the holder. The kernel drops the lock when
//! its holder dies (even by `kill -9`), so a dead holder's run is taken over
//! at once; its `writer.json`, left behind, names whom it was taken from.
//! The lock's descriptor is close-on-exec: agents and workloads never hold it.

use crate::{io, read_json, write_json, Result, Run, StoreError};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = ".writer.lock";
pub const WRITER_FILE: &str = "writer.json";

/// Who writes (or last wrote) a run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Writer {
    pub host: String,
    pub pid: u32,
    pub since: DateTime<Utc>,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} on host `{}`, since {}",
            self.pid,
            self.host,
            self.since.format("%Y-%m-%d %H:%M:%S UTC")
        )
    }
}

/// The writer lock of a run, held until dropped. `took_over` names the
/// earlier writer that died holding the run, if one did.
pub struct WriterLock {
    held: Option<Held>,
    /// Another store's lock (see [`WriterLock::guarded`]).
    #[allow(dead_code)] // held for its `Drop`
    guard: Option<Box<dyn Send>>,
    pub took_over: Option<Writer>,
}

struct Held {
    // Closing the file releases the lock.
    _file: std::fs::File,
    writer_file: PathBuf,
    me: Writer,
}

impl WriterLock {
    /// No lock (a store without a run-wide one).
    pub fn none() -> WriterLock {
        WriterLock {
            held: None,
            guard: None,
            took_over: None,
        }
    }

    /// A lock held by another store's `guard` (an object store's writer
    /// lease), released when the guard is dropped.
    pub fn guarded(guard: Box<dyn Send>, took_over: Option<Writer>) -> WriterLock {
        WriterLock {
            held: None,
            guard: Some(guard),
            took_over,
        }
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        if let Some(h) = &self.held {
            // Only our own name is removed; the lock goes with the file.
            if read_json::<Writer>(&h.writer_file).is_ok_and(|w| w == h.me) {
                let _ = std::fs::remove_file(&h.writer_file);
            }
        }
    }
}

/// This host's name (`/proc/sys/kernel/hostname`), as writers name it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Take the writer lock of the run folder `dir` (run `run`), or say who holds it.
pub(crate) fn lock_folder(dir: &Path, run: &str) -> Result<WriterLock> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let writer_file = dir.join(WRITER_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io("open the run's lock", &path))?;
    // SAFETY: a plain syscall on a descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            // The holder writes its name right after taking the lock: give
            // it a moment before saying we do not know it.
            let mut holder = None;
            for _ in 0..20 {
                holder = read_json::<Writer>(&writer_file).ok();
                if holder.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(25));
            }
            return Err(StoreError::Locked {
                run: run.to_string(),
                holder: holder
                    .map(|w| w.to_string())
                    .unwrap_or_else(|| format!("its name is not in `{}` yet", writer_file.display())),
                cells: String::new(),
            });
        }
        return Err(io("lock", &path)(err));
    }
    // We hold the lock: a `writer.json` still there is a writer that died.
    let took_over = read_json::<Writer>(&writer_file).ok();
    let me = Writer {
        host: hostname(),
        pid: std::process::id(),
        since: Utc::now(),
    };
    write_json(&writer_file, &me)?;
    Ok(WriterLock {
        held: Some(Held {
            _file: file,
            writer_file,
            me,
        }),
        guard: None,
        took_over,
    })
}

impl Run {
    /// Become the one writer of this run (see the module): hold the result
    /// until the run is no longer written. [`StoreError::Locked`] (a user
    /// error, exit 2) when another live `orch` writes it.
    pub fn lock_writer(&self) -> Result<WriterLock> {
        self.backend.lock_run(self)
    }
}

#[cfg(test)]
mod tests {
    use crate::test_support::{env, plan};
    use crate::{Store, StoreError};

    #[test]
    fn a_second_writer_is_refused_and_a_dead_ones_run_is_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::new(tmp.path());
        let run = store.create_run(&plan(), "", "local", env()).unwrap();
        let first = run.lock_writer().unwrap();
        assert!(first.took_over.is_none());
        // flock locks belong to the open file: a second open in this
        // process conflicts, as another process's would.
        let again = store.open_run(run.id()).unwrap();
        let e = again.lock_writer().err().expect("refused while held");
        assert!(matches!(e, StoreError::Locked { .. }), "{e}");
        assert!(e.is_user_error());
        let text = e.to_string();
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        assert!(text.contains("hint:"), "{text}");
        // It names the cells the holder has to run.
        for c in &run.plan.cells {
            assert!(text.contains(&format!("`{}`", c.id)), "{text}");
        }
        assert!(text.contains("the 2 cells without a record"), "{text}");
        drop(first);
        // Released cleanly: its name goes, no earlier writer to name.
        assert!(!run.dir().join(super::WRITER_FILE).exists());
        let second = again.lock_writer().unwrap();
        assert!(second.took_over.is_none());
        drop(second);
        // A writer killed while holding the run leaves its name (the kernel
        // drops its lock): the next one takes over and says from whom.
        let dead = super::Writer {
            host: "h".into(),
            pid: 4_000_000,
            since: chrono::Utc::now(),
        };
        crate::write_json(&run.dir().join(super::WRITER_FILE), &dead).unwrap();
        let third = again.lock_writer().unwrap();
        assert_eq!(third.took_over, Some(dead));
    }
}
