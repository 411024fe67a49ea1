//! The store's errors.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{}` is damaged: {source}\nhint: the file was edited, cut short or written by another version of orch; move it aside to read the rest", path.display())]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("no run `{id}` in the store `{store}`\nhint: `orch ls` lists the runs; pass `--store DIR` (or `--store s3://bucket/prefix`) if they are elsewhere")]
    NoSuchRun { id: String, store: String },
    #[error("`{id}` matches several runs: {}\nhint: give more of the id", matches.join(", "))]
    Ambiguous { id: String, matches: Vec<String> },
    /// The id drawn for a new run is taken (two runs of one suite in the
    /// same second drew the same salt); [`crate::Store::create_run`] draws again.
    #[error("the run `{id}` already exists in `{store}`\nhint: start the run again: a new id is drawn")]
    RunExists { id: String, store: String },
    #[error("no cell `{cell}` in run `{run}`\nhint: `orch show {run}` lists its cells")]
    NoSuchCell { run: String, cell: String },
    /// A name from a manifest, an agent or a remote store that would leave
    /// the run's folder (`..`, `/`, an absolute path) or is not a plain name.
    #[error("refusing the {what} `{name}`: it is not a plain name inside the run\nhint: ids and file names are single path components without `/`, `\\`, `..` or control characters")]
    Unsafe { what: &'static str, name: String },
    /// Another process took this attempt at the cell (object stores).
    #[error("cell `{cell}` of run `{run}` is being run by another process ({by})")]
    Claimed { run: String, cell: String, by: String },
    /// Another process recorded this cell first; this attempt's record is
    /// kept as an earlier attempt.
    #[error("cell `{cell}` of run `{run}` was already recorded by another process ({by})")]
    RecordedElsewhere { run: String, cell: String, by: String },
    /// Another live `orch` writes this run (the folder store's writer
    /// lock, an object store's writer lease); `cells`: the cells it holds
    /// (those without a record), as [`held_cells`] words them.
    #[error("run `{run}` is being written by another orch ({holder}){cells}\nhint: wait for it to end or stop it, then `orch run --resume {run}`; `orch show {run}` reads the run meanwhile")]
    Locked {
        run: String,
        holder: String,
        cells: String,
    },
    /// An object store's failure. `user` when the user must fix it
    /// (credentials, bucket, URL); the message never holds a secret.
    /// The object store is away (unreachable, silent or failing) past the
    /// outage budget: named by what it answered. Neither the user's error
    /// nor an internal one: `orch` exits 3 (see [`StoreError::is_outage`]).
    #[error("{message}\nhint: {hint}")]
    Unreachable { message: String, hint: String },
    #[error("{message}\nhint: {hint}")]
    Remote {
        message: String,
        hint: String,
        user: bool,
    },
}

impl StoreError {
    /// The OS error under an IO failure (`EMFILE`, `ENOSPC`...), if any.
    pub fn os_error(&self) -> Option<i32> {
        match self {
            StoreError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True when the user named something that is not there.
    pub fn is_user_error(&self) -> bool {
        match self {
            StoreError::NoSuchRun { .. }
            | StoreError::Ambiguous { .. }
            | StoreError::NoSuchCell { .. }
            | StoreError::Unsafe { .. }
            | StoreError::Locked { .. } => true,
            StoreError::Remote { user, .. } => *user,
            _ => false,
        }
    }
}

impl StoreError {
    /// True when the store could not be reached or written (an outage
    /// that outlasted its budget): exit code 3.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Unreachable { .. })
    }
}

/// The cells another writer holds, for [`StoreError::Locked`]: `; it holds
/// the 3 cells without a record: `a`, `b`, `c``.
pub fn held_cells(cells: &[String]) -> String {
    const SHOWN: usize = 20;
    if cells.is_empty() {
        return String::new();
    }
    let mut names: Vec<String> = cells.iter().take(SHOWN).map(|c| format!("`{c}`")).collect();
    if cells.len() > SHOWN {
        names.push(format!("and {} more", cells.len() - SHOWN));
    }
    format!(
        "; it holds the {} cell{} without a record: {}",
        cells.len(),
        if cells.len() == 1 { "" } else { "s" },
        names.join(", ")
    )
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// `map_err(io("read", path))`: an IO error with what was being done to which path.
pub(crate) fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + use<'a> {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

impl orch_protocol::ErrorClass for StoreError {
    fn is_user_error(&self) -> bool {
        Self::is_user_error(self)
    }

    fn is_outage(&self) -> bool {
        Self::is_outage(self)
    }
}
