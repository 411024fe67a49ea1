//! `orch history` end to end: a folder store of synthetic runs with a planted
//! level shift (orch-history's `synth`), read back by the real binary.

use crate::support::orch;

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

/// `orch show RUN` (text) and `orch report RUN --format json` of the store.
fn show_and_report(store_dir: &std::path::Path, id: &str) -> (String, serde_json::Value) {
    let out = orch()
        .arg("--store")
        .arg(store_dir)
        .args(["show", id])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = String::from_utf8(out.stdout).unwrap();
    let out = orch()
        .arg("--store")
        .arg(store_dir)
        .args(["report", id, "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (show, serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn a_new_regression_is_flagged_in_show_and_report_and_its_rerun_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = orch_store::Store::new(&store_dir);
    // 30 nightly runs at one level, then run 30 is 20% slower, and run 31
    // re-runs the same regression.
    let ids = orch_history::synth::write_runs(&store, "nightly", 32, &[(30, -0.20)], 5).unwrap();

    let (show, report) = show_and_report(&store_dir, &ids[30]);
    assert!(
        show.contains("history: 1 of 1 primary metric(s) outside"),
        "{show}"
    );
    assert!(show.contains("bench.cpu output_throughput: regression"), "{show}");
    assert!(show.contains("rule: a value outside mean ± max(3σ"), "{show}");
    let h = &report["history"];
    assert_eq!(h["earlier_runs"], 30, "{h}");
    let j = &h["judged"][0];
    assert_eq!(j["verdict"], "regression", "{h}");
    assert_eq!(j["metric"], "output_throughput");
    assert_eq!(j["window"], 10);
    assert_eq!(j["history"], 30);
    // The window: the 10 runs before this one (only older runs count).
    assert_eq!(j["window_first_run"], ids[20].as_str());
    assert_eq!(j["window_last_run"], ids[29].as_str());
    assert!(j["value"].as_f64().unwrap() < j["low"].as_f64().unwrap(), "{j}");
    assert!(j["testbed"].as_str().unwrap().contains("H100"), "{j}");

    // The markdown and HTML reports carry it too.
    let out = orch()
        .arg("--store")
        .arg(&store_dir)
        .args(["report", &ids[30], "--format", "md"])
        .output()
        .unwrap();
    let md = String::from_utf8(out.stdout).unwrap();
    assert!(
        md.contains("## Against history") && md.contains("**regression**"),
        "{md}"
    );
    let out = orch()
        .arg("--store")
        .arg(&store_dir)
        .args(["report", &ids[30], "--format", "html"])
        .output()
        .unwrap();
    let html = String::from_utf8(out.stdout).unwrap();
    assert!(html.contains("id=\"history\"") && html.contains("history-regression"));

    // The re-run of the same regression: the shift is accepted, no new flag.
    let (show, report) = show_and_report(&store_dir, &ids[31]);
    assert!(
        show.contains("history: 0 of 1 primary metric(s) outside"),
        "{show}"
    );
    let j = &report["history"]["judged"][0];
    assert_eq!(j["verdict"], "normal", "{j}");
    assert!(j["note"].as_str().unwrap_or("").contains("accepted"), "{j}");
    // Judged against its own time: run 30 never sees run 31.
    let (_, report) = show_and_report(&store_dir, &ids[30]);
    assert_eq!(report["history"]["judged"][0]["history"], 30);
}

#[test]
fn after_an_established_shift_and_on_a_flat_series_nothing_is_flagged() {
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = orch_store::Store::new(&store_dir);
    // A 20% drop at run 25, then 14 runs at the new level: the change point
    // is in the history, the newest run is judged against the new level.
    let ids = orch_history::synth::write_runs(&store, "shifted", 40, &[(25, -0.20)], 8).unwrap();
    let (show, report) = show_and_report(&store_dir, &ids[39]);
    assert!(!show.contains("regression"), "{show}");
    let j = &report["history"]["judged"][0];
    assert_eq!(j["verdict"], "normal", "{j}");
    // Judged at the new level: since the change point, or since a later
    // point of that level that opened one of its own.
    let note = j["note"].as_str().unwrap_or("");
    assert!(
        note.contains("change point") || note.contains("accepted"),
        "judged at the new level: {j}"
    );
    let mean = j["mean"].as_f64().unwrap();
    assert!((750.0..850.0).contains(&mean), "the new level: {j}");

    // A flat noisy series: none of its last 8 runs is flagged.
    let ids = orch_history::synth::write_runs(&store, "flat", 40, &[], 9).unwrap();
    for id in &ids[32..] {
        let (show, report) = show_and_report(&store_dir, id);
        assert!(show.contains("history: 0 of 1"), "{id}: {show}");
        assert_eq!(report["history"]["judged"][0]["verdict"], "normal", "{id}");
    }

    // Too few comparable runs: one quiet line, nothing judged.
    let ids = orch_history::synth::write_runs(&store, "young", 3, &[], 10).unwrap();
    let (show, report) = show_and_report(&store_dir, &ids[2]);
    let lines: Vec<&str> = show.lines().filter(|l| l.contains("history")).collect();
    assert_eq!(lines.len(), 1, "{show}");
    assert!(
        lines[0].contains("not judged: too few comparable earlier runs"),
        "{show}"
    );
    assert_eq!(report["history"]["judged"].as_array().unwrap().len(), 0);
    assert_eq!(report["history"]["too_little_history"], 1);
}

#[test]
fn show_prints_each_variants_gate_and_each_pairs_verdict_with_drift() {
    use orch_protocol::{CellResult, Status};
    use orch_record::{CellRecord, Environment, RunState};
    use serde_json::json;
    let tmp = tempfile::tempdir().unwrap();
    let store_dir = tmp.path().join("store");
    let store = orch_store::Store::new(&store_dir);
    let yaml = "name: cmp\nbenchmarks:\n  - name: bench\n    workload: {noop: true}\n";
    let plan = orch_manifest::load_str(yaml, std::path::Path::new("cmp.yaml"), &Default::default()).unwrap();
    let env = Environment {
        hostname: "h".into(),
        os: "linux".into(),
        arch: "x86_64".into(),
        cpus: 1,
        orch_version: "0".into(),
        git_commit: None,
        argv: vec![],
    };
    let mut run = store.create_run(&plan, yaml, "local", env).unwrap();
    let cell = run.plan.cells[0].clone();
    let mut result = CellResult::new(&cell.id, Status::Succeeded);
    for (v, x) in [("baseline", 100.0), ("human", 120.0), ("agent", 150.0)] {
        result.metrics.insert(format!("{v}.output_throughput"), x);
    }
    // The shapes the agent writes (`orch_record::compare`).
    let drift = |s: f64| json!({"slope_per_round": s, "ci_low": s - 0.01, "ci_high": s + 0.01, "p_value": 0.5, "n": 5});
    result
        .info
        .insert("primary_metric".into(), json!("output_throughput"));
    result.info.insert("rounds".into(), json!(5));
    result.info.insert("noise".into(), json!(0.02));
    result.info.insert(
        "variants".into(),
        json!({
            "baseline": {"status": "succeeded", "rounds": 5, "drift": drift(0.004),
                "output_check": {"status": "reference", "answered": 8}, "flags": [], "gate": null},
            "human": {"status": "succeeded", "rounds": 5, "drift": drift(-0.002),
                "output_check": {"status": "passed", "passed": true, "exact": 8, "compared": 8, "exact_match_rate": 1.0,
                    "first_divergence": null, "unit": "tokens", "rule": "exact", "evidence": "output-check/human.json"},
                "flags": [], "gate": null},
            "agent": {"status": "succeeded", "rounds": 5, "drift": drift(0.031),
                "output_check": {"status": "output_mismatch", "passed": false, "exact": 2, "compared": 8,
                    "exact_match_rate": 0.25, "first_divergence": 3,
                    "unit": "tokens", "rule": "exact", "evidence": "output-check/agent.json"},
                "flags": ["short_responses"],
                "gate": {"kind": "output_mismatch", "why": "6 of 8 answers to the output check differ from the baseline's"}},
        }),
    );
    let pair = |other: &str, verdict: &str, speed: Option<&str>, ratio: f64| {
        let mut p = json!({"base": "baseline", "other": other, "metric": "output_throughput", "role": "primary",
            "better": "higher", "verdict": verdict, "ratio": ratio, "ci_low": ratio - 0.05, "ci_high": ratio + 0.05,
            "speedup": ratio, "n": 5, "n_base": 5, "n_other": 5});
        if let Some(s) = speed {
            p["speed_verdict"] = json!(s);
        }
        p
    };
    result.info.insert(
        "comparison".into(),
        json!([
            pair("human", "faster", None, 1.2),
            pair("agent", "output_mismatch", Some("faster"), 1.5)
        ]),
    );
    let at = chrono::Utc::now();
    run.finish_cell(&CellRecord::from_result(&cell, result, at, at, 1))
        .unwrap();
    run.set_state(RunState::Complete).unwrap();
    let out = orch()
        .arg("--store")
        .arg(&store_dir)
        .args(["show", &run.meta.id])
        .output()
        .unwrap();
    let show = String::from_utf8(out.stdout).unwrap();
    assert!(
        show.contains(&format!("gates and drift in {}:", cell.id)),
        "{show}"
    );
    let line = |needle: &str| {
        show.lines()
            .find(|l| l.trim_start().starts_with(needle))
            .unwrap_or_else(|| panic!("no line `{needle}`: {show}"))
            .to_string()
    };
    let agent = line("variant agent:");
    for needle in [
        "output_mismatch, no verdict on speed: 6 of 8 answers",
        "output check output_mismatch: 2 of 8 answers exact, first divergence at tokens 3",
        "flags short_responses",
        "drift +3.1%/round [+2.1, +4.1]",
    ] {
        assert!(agent.contains(needle), "{needle}: {agent}");
    }
    assert!(
        line("variant human:").contains("output check passed: 8 of 8"),
        "{show}"
    );
    let p = line("pair agent vs baseline:");
    assert!(p.contains("output_mismatch (speed: faster)"), "{p}");
    assert!(
        p.contains("drift baseline +0.4%/round") && p.contains("agent +3.1%/round"),
        "{p}"
    );
    let p = line("pair human vs baseline:");
    assert!(p.contains(": faster, ratio 1.200"), "{p}");
    // One run of the suite: no history to judge against, one quiet line.
    assert!(show.contains("history: not judged"), "{show}");
}
