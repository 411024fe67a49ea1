//! Suite manifests: strict YAML parsing with `file:line:column` errors, GPU
//! specs, and expansion of the matrix into cells with stable ids.
//!
//! No IO beyond reading the manifest file; no knowledge of backends.
//!
//! ## What is where
//!
//! `suite.rs`: the YAML schema (every struct `deny_unknown_fields`);
//! `gpu.rs`: GPU spec grammar and known types; `units.rs`: durations and byte sizes;
//! `plan.rs`: matrix expansion, `{{param}}` templates, stable cell ids, measure defaults;
//! `error.rs`: `file:line:column` errors with hints. It does not: know backends or the
//! store.

pub mod error;
pub mod gpu;
pub mod k8s;
pub mod plan;
pub mod suite;
pub mod units;

pub use error::{ManifestError, Pos};
pub use gpu::{GpuSpec, GpuSpecError, KNOWN_GPUS};
pub use plan::{CellPlan, ExpandOptions, Plan};
pub use suite::{
    BuildDef, DirtyDef, ImageDef, KubernetesDef, KubernetesSection, ModelRef, SlurmDef, Suite, SyncDef,
    TolerationDef,
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

/// Read, parse and expand a manifest file.
pub fn load(path: &Path, opts: &ExpandOptions) -> Result<Plan, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let suite = parse_str(&text, path)?;
    plan::expand(suite, path, opts)
}

/// Parse and expand manifest text (tests, `--resume` of old runs).
pub fn load_str(text: &str, path: &Path, opts: &ExpandOptions) -> Result<Plan, ManifestError> {
    plan::expand(parse_str(text, path)?, path, opts)
}
