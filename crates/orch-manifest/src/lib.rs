//! Suite manifests: strict YAML parsing with `file:line:column` errors, GPU
//! specs, and expansion of the matrix into cells with stable ids.
//!
//! No IO beyond reading the manifest file; no knowledge of backends.
//!
//! ## What is where
//!
//! `suite.rs`: the YAML schema (every struct `deny_unknown_fields`);
//! `gpu.rs`: GPU spec grammar and known types; `units.rs`: durations and byte sizes;
//! `tasks.rs`: a campaign's task file (JSONL, CSV, YAML) checked row by row;
//! `plan.rs`: the suite expanded into cells (workloads, measure defaults, the plan's types),
//! with `plan/matrix.rs` (cell counts, combinations, `exclude`, stable cell ids),
//! `plan/template.rs` (`{{param}}` templates), `plan/compare.rs` (a comparison's settings, a
//! task row filling them), `plan/backends.rs` (the `kubernetes:` and `slurm:` sections);
//! `error.rs`: `file:line:column` errors with hints. It does not: know backends or the
//! store.
//!
//! ## Hostile manifests
//!
//! A manifest is refused before it costs anything: a file over
//! [`MAX_MANIFEST_BYTES`] is not read; the parser's budget (nodes, aliases,
//! depth) stops an alias bomb, said in our words (`too many aliases/nodes`);
//! a repeated key is an error (`duplicate key `x``); durations and sizes are
//! range-checked as they are parsed (`units.rs`); the number of cells is
//! counted from the axes' lengths before the matrix is expanded and refused
//! over `max_cells` (default [`plan::DEFAULT_MAX_CELLS`]); names and cell ids
//! follow the store's rule (at most [`plan::MAX_NAME_BYTES`] bytes, no `.`/`..`).

pub mod error;
pub mod gpu;
pub mod k8s;
pub mod plan;
pub mod suite;
pub mod tasks;
pub mod units;

pub use error::{ManifestError, Pos};
pub use gpu::{GpuSpec, GpuSpecError, KNOWN_GPUS};
pub use plan::{CellPlan, ExpandOptions, Plan};
pub use suite::{
    AgentDelivery, BuildDef, DirtyDef, GpuAffinity, ImageDef, KubernetesDef, KubernetesSection, ModelRef,
    SlurmDef, Suite, SyncDef, TolerationDef,
};

use std::path::Path;

/// Parse manifest text. `path` is only used in messages and to resolve
/// relative `workdir`s.
pub fn parse_str(text: &str, path: &Path) -> Result<Suite, ManifestError> {
    serde_saphyr::from_str::<Suite>(text).map_err(|e| {
        let message = error::yaml_message(&e);
        let hint = error::yaml_hint(&message);
        ManifestError::invalid(path, e.location().and_then(Pos::from_loc), message, hint)
    })
}

/// The largest manifest file read (16 MiB; real suites are a few KiB).
pub const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Read, parse and expand a manifest file.
pub fn load(path: &Path, opts: &ExpandOptions) -> Result<Plan, ManifestError> {
    use std::io::Read;
    let read_err = |source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(read_err)?
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(ManifestError::invalid(
            path,
            None,
            format!("the manifest is larger than {} MiB", MAX_MANIFEST_BYTES >> 20),
            "a suite is a few KiB of YAML: check that `-f` names the manifest",
        ));
    }
    let suite = parse_str(&text, path)?;
    plan::expand(suite, path, opts)
}

/// The task files a manifest reads from Hugging Face datasets (`tasks:
/// {dataset: ...}`), without expanding it: `orch setup` fetches them before
/// the plan (which reads them) is made.
pub fn task_datasets(path: &Path) -> Result<Vec<tasks::TasksDef>, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let suite = parse_str(&text, path)?;
    Ok(suite
        .benchmarks
        .into_iter()
        .filter_map(|b| b.tasks.map(|t| t.value))
        .filter(|t| t.dataset.is_some())
        .collect())
}

/// Parse and expand manifest text (tests, `--resume` of old runs).
pub fn load_str(text: &str, path: &Path, opts: &ExpandOptions) -> Result<Plan, ManifestError> {
    plan::expand(parse_str(text, path)?, path, opts)
}
