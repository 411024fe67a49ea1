//! The secrets a cell can reach, and the agent's one [`Masker`] for them.
//!
//! The task names the secret variables (`secret_env`, never values); their
//! values are in the agent's environment. Known credentials
//! ([`KNOWN_SECRET_ENV`]: the Hub token, cloud keys) count too, listed or
//! not, and so does the Hub token file a workload on this host could read.
//! Everything the agent writes or sends goes through the masker: captured
//! stdout/stderr (chunk-boundary safe), events, the result, and the other
//! files of the cell folder.

use orch_protocol::mask::{Masker, KNOWN_SECRET_ENV};
use orch_protocol::TaskSpec;
use std::path::{Path, PathBuf};

use std::sync::OnceLock;

static MASKER: OnceLock<Masker> = OnceLock::new();

/// The agent's masker (an empty one before [`install`]).
pub fn masker() -> &'static Masker {
    static EMPTY: OnceLock<Masker> = OnceLock::new();
    MASKER.get().unwrap_or_else(|| EMPTY.get_or_init(Masker::default))
}

/// Build the masker for `task` from this process's environment and install
/// it; returns the names of secrets too short to mask (never their values).
pub fn install(task: &TaskSpec) -> Vec<String> {
    let (masker, skipped) = build(task);
    let _ = MASKER.set(masker);
    skipped
}

/// The masker for `task` (see the module docs).
pub fn build(task: &TaskSpec) -> (Masker, Vec<String>) {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let names = task
        .secret_env
        .iter()
        .map(String::as_str)
        .chain(KNOWN_SECRET_ENV.iter().copied());
    for name in names {
        if let Ok(v) = std::env::var(name) {
            pairs.push((name.to_string(), v));
        }
    }
    for path in orch_protocol::mask::hub_token_paths(|k| std::env::var_os(k)) {
        if let Ok(t) = std::fs::read_to_string(&path) {
            pairs.push(("the Hub token file".to_string(), t.trim().to_string()));
        }
    }
    Masker::lenient(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// Files of the cell folder that the agent does not mask as it writes them:
/// captured logs are masked while captured, and the host owns these.
fn skipped(name: &str) -> bool {
    name.ends_with("stdout.log")
        || name.ends_with("stderr.log")
        || name == orch_protocol::AGENT_RESULT_FILE
        || matches!(name, "task.json" | "events.jsonl" | "agent.log" | "result.json")
}

/// Largest file of the cell folder that is masked after the workload ended.
const MAX_SWEPT_FILE: u64 = 64 << 20;

/// Mask, in place, every other regular file of `dir` (the workload's metrics
/// file, result files, install logs of variants...), down to a few levels.
/// Returns the files that held a secret.
pub fn sweep(dir: &Path) -> Vec<PathBuf> {
    let masker = masker();
    let mut changed = Vec::new();
    if masker.is_empty() {
        return changed;
    }
    sweep_dir(masker, dir, 0, &mut changed);
    changed
}

fn sweep_dir(masker: &Masker, dir: &Path, depth: usize, changed: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let path = e.path();
        if ft.is_dir() {
            // A compare variant's checkout (`variants/<name>/src`) is source, not output.
            if matches!(e.file_name().to_str(), Some("src" | ".git")) {
                continue;
            }
            sweep_dir(masker, &path, depth + 1, changed);
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        if !ft.is_file()
            || (depth == 0 && skipped(&name))
            || name.ends_with("stdout.log")
            || name.ends_with("stderr.log")
        {
            continue;
        }
        if e.metadata().map(|m| m.len() > MAX_SWEPT_FILE).unwrap_or(true) {
            continue;
        }
        let Ok(bytes) = std::fs::read(&path) else { continue };
        if let std::borrow::Cow::Owned(masked) = masker.mask_bytes(&bytes) {
            if crate::run::write_atomic(&path, &masked).is_ok() {
                changed.push(path);
            }
        }
    }
}
