//! The records of the GPU seed runs (`results/seeds/*/run-*.json`, written by
//! `orch show --json`) read back into the schema and written out again
//! unchanged: a field renamed, removed or retyped here fails this test.

use orch_record::{CompareInfo, RunRecord, RunSummary};
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

/// Every comparison cell of the seed runs reads into [`CompareInfo`]; one
/// of the current format (its variants have `lengths`, the latest key the
/// agent added) is written out again equal to what was read.
#[test]
fn seed_comparisons_read_into_the_types_and_round_trip() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/seeds");
    let (mut read, mut current) = (0, 0);
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
            let record: RunRecord = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            for c in &record.cells {
                let Some(cmp) = CompareInfo::from_info(&c.info) else {
                    continue;
                };
                let cmp = cmp.unwrap_or_else(|e| panic!("{} {}: {e}", path.display(), c.id));
                read += 1;
                let variants = c.info["variants"].as_object().unwrap();
                if !variants.values().all(|v| v.get("lengths").is_some()) {
                    continue;
                }
                let mut again = c.info.clone();
                cmp.write_into(&mut again);
                assert_eq!(again, c.info, "{} {}", path.display(), c.id);
                current += 1;
            }
        }
    }
    assert!(
        read >= 7 && current >= 2,
        "{read} comparisons read, {current} of the current format"
    );
}
