//! What the runner's integration tests share: a plan of `n` noop cells and
//! the runner's options.

use orch_manifest::{load_str, ExpandOptions, Plan};
use orch_runner::{GpuDevices, RunnerOptions};
use std::path::Path;

/// One benchmark of `n` noop cells (`i: [1..=n]`).
pub fn plan(n: usize) -> Plan {
    let values: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    let text = format!(
        "name: t\nbenchmarks:\n  - name: a\n    workload: {{noop: true}}\n    matrix: {{i: [{}]}}\n",
        values.join(", ")
    );
    load_str(&text, Path::new("t.yaml"), &ExpandOptions::default()).unwrap()
}

/// `concurrency` cells at once, nothing else set.
pub fn opts(concurrency: usize) -> RunnerOptions {
    RunnerOptions {
        concurrency,
        secrets: vec![],
        weights_dir: None,
        images: Default::default(),
        gpu_devices: GpuDevices::Platform,
        diagnose_rules: None,
        cost: Default::default(),
        files: None,
    }
}
