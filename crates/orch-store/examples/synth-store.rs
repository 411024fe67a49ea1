//! A synthetic result store, written through the real store code (run
//! folders, plans, atomic cell records, cost ledgers), for benchmarks of
//! `orch cost` on large stores.
//!
//! cargo run --release -p orch-store --example synth-store -- DIR [CELLS] [RUNS]

use chrono::{Duration, Utc};
use orch_manifest::{load_str, ExpandOptions};
use orch_protocol::{CellResult, FailureKind, Phase, Status};
use orch_store::{host_environment, CellRecord, RunState, Store};
use std::path::Path;

const GPUS: &[&str] = &["H100:8", "H100", "A100-80GB:2", "L4", "T4", "none"];
const MODELS: &[&str] = &["org/small", "org/large"];
const SUITES: &[&str] = &["lm-sweep", "serve", "vision", "calibrate"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: synth-store DIR [CELLS] [RUNS]");
        std::process::exit(2);
    };
    let cells: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let runs: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20);
    let per_run = cells.div_ceil(runs);
    let per_combo = per_run.div_ceil(GPUS.len() * MODELS.len());
    let prices = orch_cost::Prices::builtin().expect("the built-in catalog parses");
    let store = Store::new(dir);
    let mut written = 0usize;
    let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        // xorshift64*: deterministic, no dependency.
        seed ^= seed >> 12;
        seed ^= seed << 25;
        seed ^= seed >> 27;
        seed.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    for r in 0..runs {
        let values: Vec<String> = (1..=per_combo).map(|i| i.to_string()).collect();
        let suite = SUITES[r % SUITES.len()];
        let manifest = format!(
            "name: {suite}\ngpus: [{}]\nbenchmarks:\n  - name: sweep\n    workload: {{command: [\"true\"]}}\n    matrix:\n      model: [{}]\n      i: [{}]\n",
            GPUS.iter().map(|g| format!("\"{g}\"")).collect::<Vec<_>>().join(", "),
            MODELS.join(", "),
            values.join(", ")
        );
        let plan = load_str(&manifest, Path::new("synth.yaml"), &ExpandOptions::default()).expect("manifest");
        // (An id drawn twice within one second is drawn again by `create_run`.)
        let mut run = store
            .create_run(
                &plan,
                &manifest,
                "modal",
                host_environment(Path::new("synth.yaml"), vec![]),
            )
            .expect("create run");
        let base = Utc::now() - Duration::days(30 - (r as i64 % 30));
        for cell in run.plan.cells.clone() {
            if written >= cells {
                break;
            }
            let roll = next() % 100;
            let status = match roll {
                0..=84 => Status::Succeeded,
                85..=91 => Status::Failed,
                92..=96 => Status::Oom,
                97..=98 => Status::Timeout,
                _ => Status::Cancelled,
            };
            let secs = 30.0 + (next() % 3000) as f64 / 10.0;
            let mut result = if status == Status::Succeeded {
                CellResult::new(&cell.id, status)
            } else {
                CellResult::failed(&cell.id, status, FailureKind::of_status(status), "synthetic")
            };
            result.timings = [
                (Phase::Provision, secs * 0.1),
                (Phase::Start, secs * 0.1),
                (Phase::Warmup, secs * 0.2),
                (Phase::Measure, secs * 0.5),
                (Phase::Teardown, secs * 0.05),
            ]
            .into();
            result
                .metrics
                .insert("tokens_per_s".into(), (next() % 10_000) as f64);
            let started = base + Duration::seconds(written as i64 % 86_400);
            let finished = started + Duration::milliseconds((secs * 1000.0) as i64);
            let mut record = CellRecord::from_result(&cell, result, started, finished, 1);
            let rate = prices.rate("modal", &cell.gpu, None);
            record.cost = Some(orch_cost::cell_cost(
                &rate,
                record.status,
                record.duration_s,
                &record.timings,
            ));
            run.finish_cell(&record).expect("record");
            written += 1;
        }
        run.set_state(RunState::Complete).expect("state");
    }
    println!("{written}");
}
