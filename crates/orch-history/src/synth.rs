//! Synthetic history (feature `synth`; always in this crate's tests): runs
//! of a one-cell suite written into a store, each a day apart, with one
//! metric (`output_throughput`, around 1000 with 3% noise) whose level moves
//! at planted points, for tests and `scripts/bench-history.sh`.

use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::{CellResult, GpuInfo, Hardware, Status};
use orch_record::{CellRecord, Environment, RunState};
use orch_store::{Store, StoreError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;

/// The metric the synthetic runs report.
pub const METRIC: &str = "output_throughput";

/// Errors of [`write_runs`].
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the synthetic suite `{suite}` does not load: {message}")]
    Manifest { suite: String, message: String },
}

/// Write `n` complete runs of `suite` (one noop cell `bench`, an H100,
/// driver `580.1`) into `store`: run `i` is created `i` days after
/// 2026-01-01, its commit is `{i:012x}{seed:028x}` (40 hex digits), and its value is
/// `1000 · Π(1 + shift) · (1 + 0.03·z)` over the `shifts` whose index is at
/// most `i` (`z` standard normal from `seed`). Returns the run ids in order.
pub fn write_runs(
    store: &Store,
    suite: &str,
    n: usize,
    shifts: &[(usize, f64)],
    seed: u64,
) -> Result<Vec<String>, SynthError> {
    let yaml = format!("name: {suite}\nbenchmarks:\n  - name: bench\n    workload: {{noop: true}}\n");
    let plan = load_str(&yaml, Path::new("synth.yaml"), &ExpandOptions::default()).map_err(|e| {
        SynthError::Manifest {
            suite: suite.to_string(),
            message: e.to_string(),
        }
    })?;
    let mut rng = StdRng::seed_from_u64(seed);
    let start = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
        .map(|t| t.with_timezone(&chrono::Utc))
        .unwrap_or_else(|_| chrono::Utc::now());
    let hardware = Hardware {
        gpus: vec![GpuInfo {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            uuid: "GPU-synth".into(),
            memory_bytes: 80 << 30,
            ..GpuInfo::default()
        }],
        driver_version: Some("580.1".into()),
        cpus: 16,
        ..Hardware::default()
    };
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let env = Environment {
            hostname: "synth".into(),
            os: "linux".into(),
            arch: "x86_64".into(),
            cpus: 16,
            orch_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: Some(format!("{i:012x}{seed:028x}")),
            argv: vec!["orch".into(), "run".into()],
        };
        let mut run = store.create_run(&plan, &yaml, "local", env)?;
        let at = start + chrono::Duration::days(i as i64);
        run.meta.created_at = at;
        let level = shifts
            .iter()
            .filter(|(k, _)| *k <= i)
            .fold(1000.0, |l, (_, s)| l * (1.0 + s));
        let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
        let u2: f64 = rng.random();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        for cell in &run.plan.cells {
            let mut result = CellResult::new(&cell.id, Status::Succeeded);
            result.metrics.insert(METRIC.into(), level * (1.0 + 0.03 * z));
            result.hardware = Some(hardware.clone());
            run.finish_cell(&CellRecord::from_result(cell, result, at, at, 1))?;
        }
        run.set_state(RunState::Complete)?;
        ids.push(run.meta.id.clone());
    }
    Ok(ids)
}
