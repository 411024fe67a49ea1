//! What the unit tests of several modules share.

use crate::{host_environment, Environment};
use orch_manifest::{load_str, ExpandOptions, Plan};
use std::path::Path;

/// A suite of two noop cells.
pub(crate) fn plan() -> Plan {
    load_str(
        "name: t\nbenchmarks:\n  - name: a\n    workload: {noop: true}\n    matrix: {x: [1, 2]}\n",
        Path::new("t.yaml"),
        &ExpandOptions::default(),
    )
    .unwrap()
}

pub(crate) fn env() -> Environment {
    host_environment(Path::new("t.yaml"), vec!["orch".into()])
}
