//! `orch history` end to end: a folder store of synthetic runs with a planted
//! level shift (orch-history's `synth`), read back by the real binary.

use std::process::Command;

fn orch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_orch"));
    c.env_remove("ORCH_STORE");
    c
}

#[test]
fn history_finds_a_planted_shift_and_charts_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = orch_store::Store::new(&store_dir);
    // 40 nightly runs; from run 25 on, 10% slower.
    let ids = orch_history::synth::write_runs(&store, "nightly", 40, &[(25, -0.10)], 7).unwrap();
    let html = tmp.path().join("h.html");
    let out = orch()
        .arg("--store")
        .arg(&store_dir)
        .args([
            "history",
            "nightly",
            "--metric",
            "output_throughput",
            "--json",
            "--html",
        ])
        .arg(&html)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"], 40, "{v}");
    let series = v["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "{v}");
    let cps = series[0]["change_points"].as_array().unwrap();
    assert_eq!(cps.len(), 1, "one shift, one change point: {cps:?}");
    let at = cps[0]["point"].as_u64().unwrap() as i64;
    assert!((at - 25).abs() <= 1, "found at {at}");
    assert_eq!(cps[0]["run_after"], ids[at as usize].as_str());
    // Every point carries its run and commit.
    let points = series[0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 40);
    assert!(
        points
            .iter()
            .all(|p| p["run_id"].is_string() && p["commit"].is_string()),
        "{}",
        points[0]
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("changepoint"), "{page}");
    assert!(page.contains(&ids[0]), "a point's tooltip names its run");

    // The table and CSV views.
    let out = orch()
        .arg("--store")
        .arg(&store_dir)
        .args(["history", "nightly", "--csv"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let csv = String::from_utf8(out.stdout).unwrap();
    assert!(csv.starts_with("benchmark,params,metric,testbed,run_id"), "{csv}");
    assert_eq!(csv.lines().filter(|l| l.ends_with(",1")).count(), 1, "{csv}");
}

#[test]
fn history_errors_name_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = orch_store::Store::new(&store_dir);
    orch_history::synth::write_runs(&store, "nightly", 3, &[], 1).unwrap();
    for (args, needle) in [
        (vec!["history", "other"], "no runs of suite `other`"),
        (
            vec!["history", "nightly", "--since", "soon"],
            "`soon` is not a duration",
        ),
        (
            vec!["history", "nightly", "--metric", "nope"],
            "no series of suite `nightly`",
        ),
    ] {
        let out = orch()
            .arg("--store")
            .arg(&store_dir)
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle) && err.contains("hint:"), "{args:?}: {err}");
    }
}
