//! Hardware identity, mismatch flags and the calibrate workload, end to end
//! through the `orch` binary on the local backend.
//!
//! These run on any host: a host without NVML records no GPUs and a note (no
//! error), and `B200:8` is a request that no test host satisfies.

use crate::support::{json, orch, write_suite};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

const SUITE: &str = r#"
name: hw
measure: {warmup: 1, repetitions: 2, timeout: 2m}
benchmarks:
  - name: calibrate
    workload:
      calibrate: {matmul_size: 128, copy_bytes: 1048576}
  - name: echo
    workload:
      shell: "echo ORCH_METRIC x=1"
"#;

fn run(dir: &Path, extra: &[&str]) -> (Output, Value) {
    let manifest = write_suite(dir, SUITE);
    let store = dir.join("store");
    let out = orch()
        .args([
            "run",
            "-f",
            manifest.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    let rec = json(&out);
    (out, rec)
}

fn cells(rec: &Value) -> &Vec<Value> {
    rec["cells"].as_array().unwrap()
}

#[test]
fn cpu_cells_record_the_host_and_no_error() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, rec) = run(tmp.path(), &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in cells(&rec) {
        assert_eq!(c["status"], "succeeded", "{c}");
        let hw = &c["hardware"];
        assert!(hw["cpus"].as_u64().unwrap() >= 1, "{hw}");
        assert!(hw["memory_bytes"].as_u64().unwrap() > 0, "{hw}");
        assert!(hw["gpus"].is_array(), "{hw}");
        if hw["gpus"].as_array().unwrap().is_empty() {
            assert!(hw["gpu_note"].as_str().unwrap().contains("NVML"), "{hw}");
        }
        // CPU cells never mismatch, and nothing is flagged.
        assert!(hw.get("mismatch").is_none(), "{hw}");
        assert!(
            c.get("flags").is_none() || c["flags"].as_array().unwrap().is_empty(),
            "{c}"
        );
        assert!(c["failure"].is_null(), "{c}");
    }
    let cal = cells(&rec)
        .iter()
        .find(|c| c["benchmark"] == "calibrate")
        .unwrap();
    assert!(
        cal["metrics"]["matmul_f32_tflops"].as_f64().unwrap() > 0.0,
        "{cal}"
    );
    assert!(cal["metrics"]["bandwidth_gbs"].as_f64().unwrap() > 0.0, "{cal}");
    assert_eq!(cal["info"]["device"], "cpu");
}

#[test]
fn gpus_other_than_asked_are_flagged_or_fail_when_strict() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, rec) = run(tmp.path(), &["--gpu", "B200:8"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in cells(&rec) {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert_eq!(c["flags"], serde_json::json!(["hardware_mismatch"]), "{c}");
        let m = c["hardware"]["mismatch"].as_str().unwrap();
        assert!(m.starts_with("asked for `B200:8`, found "), "{m}");
    }

    let tmp = tempfile::tempdir().unwrap();
    let (out, rec) = run(tmp.path(), &["--gpu", "B200:8", "--strict-hardware"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for c in cells(&rec) {
        assert_eq!(c["status"], "failed", "{c}");
        assert_eq!(c["failure"]["kind"], "hardware_mismatch", "{c}");
        assert!(
            c["failure"]["message"].as_str().unwrap().contains("did not run"),
            "{c}"
        );
        // The workload never ran: no metrics.
        assert!(c["metrics"].as_object().unwrap().is_empty(), "{c}");
    }
    let shown = orch()
        .args([
            "show",
            "latest",
            "--store",
            tmp.path().join("store").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("hardware_mismatch"), "{text}");
}
