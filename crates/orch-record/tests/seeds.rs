//! The records of the GPU seed runs (`results/seeds/*/run-*.json`, written by
//! `orch show --json`) read back into the schema and written out again
//! unchanged: a field renamed, removed or retyped here fails this test.

use orch_record::{RunRecord, RunSummary};
use std::path::Path;

#[test]
fn seed_run_records_round_trip() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/seeds");
    let mut checked = 0;
    for suite in std::fs::read_dir(&seeds).unwrap() {
        let suite = suite.unwrap().path();
        if !suite.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&suite).unwrap() {
            let path = file.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if !(name.starts_with("run-") && name.ends_with(".json")) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let original: serde_json::Value = serde_json::from_str(&text).unwrap();
            let record: RunRecord =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let again = serde_json::to_value(&record).unwrap();
            assert_eq!(again, original, "{}", path.display());
            let summary = RunSummary::of(&record);
            assert_eq!(summary.cells, record.cells.len());
            assert_eq!(summary.counts.values().sum::<usize>(), record.cells.len());
            checked += 1;
        }
    }
    assert!(checked > 0, "no seed run record under {}", seeds.display());
}
