//! Campaigns (`tasks:`): the shipped stand-in campaign of twelve planted
//! tasks run end to end on the CPU (NumPy), each planted outcome found, the
//! headline recomputed here from the per-task scores, the report in four
//! formats (the HTML in Chromium), a killed campaign resumed task by task, a
//! row added run alone with `--reuse`, and task-file errors exit 2 naming
//! the row.

use super::report::browser;
use crate::support::{numpy_or_skip, orch_without_hub_token, repo, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `orch --store STORE`, with no token or weights of this machine's user and
/// NumPy on one thread (cells run side by side on a small machine).
fn orch(store: &Path) -> Command {
    let mut c = orch_without_hub_token();
    c.env("OPENBLAS_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .arg("--store")
        .arg(store);
    c
}

/// The shipped campaign in `dir`: its small repository built by
/// `make-repo.sh`, the task file and patches copied, the manifest pointing at
/// them; `keep` rows of the task file (all when `None`).
fn campaign(dir: &Path, keep: Option<&[&str]>) -> PathBuf {
    let ex = repo().join("examples/campaign-standin");
    let st = Command::new("bash")
        .arg(ex.join("make-repo.sh"))
        .arg(dir.join("repo"))
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success(), "make-repo.sh failed");
    let patches = dir.join("patches");
    std::fs::create_dir_all(&patches).unwrap();
    for e in std::fs::read_dir(ex.join("patches")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), patches.join(e.file_name())).unwrap();
    }
    let tasks = std::fs::read_to_string(ex.join("tasks.jsonl")).unwrap();
    let rows: Vec<&str> = tasks
        .lines()
        .filter(|l| keep.is_none_or(|k| k.iter().any(|id| l.contains(&format!("\"id\": \"{id}\"")))))
        .collect();
    std::fs::write(dir.join("tasks.jsonl"), rows.join("\n") + "\n").unwrap();
    let m = std::fs::read_to_string(repo().join("manifests/campaign-standin.yaml")).unwrap();
    let m = rewrite(
        &m,
        "tasks: ../examples/campaign-standin/tasks.jsonl",
        "tasks: tasks.jsonl",
    );
    let m = rewrite(&m, "repo: ../examples/campaign-standin/repo", "repo: repo");
    // A port of its own: other tests' servers run at the same time.
    let port = orch_testkit::suites::free_port();
    let m = rewrite(&m, r#"--port, "8000""#, &format!(r#"--port, "{port}""#));
    let m = rewrite(&m, "port: 8000}", &format!("port: {port}}}"));
    let path = dir.join("campaign.yaml");
    std::fs::write(&path, m).unwrap();
    path
}

fn rewrite(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "the shipped manifest no longer holds `{from}`"
    );
    text.replace(from, to)
}

fn report_json(store: &Path, run: &str) -> Value {
    let out = orch(store)
        .args(["report", run, "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

/// The latest run's id.
fn run_id(store: &Path) -> String {
    let out = orch(store).args(["show", "latest", "--json"]).output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    v["id"].as_str().unwrap().to_string()
}

#[test]
fn the_standin_campaign_finds_every_planted_outcome() {
    let test = "the_standin_campaign_finds_every_planted_outcome";
    if !numpy_or_skip("the stand-in server needs it: `pip install numpy`") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let manifest = campaign(tmp.path(), None);
    let store = tmp.path().join("store");

    // `orch plan`: twelve tasks, the gated model's weights missing and the
    // task it sinks named.
    let out = orch(&store)
        .args(["plan", "--gpu", "none", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(t.contains("a campaign of 12 tasks, 12 cells"), "{t}");
    assert!(t.contains("WEIGHTS") && t.contains("MISSING"), "{t}");
    assert!(t.contains("sinks task t11-gated-model until set up"), "{t}");

    let out = orch(&store)
        .args(["run", "--gpu", "none", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    let t = text(&out);
    // Some tasks fail by design: exit 1, and the gated task was never run.
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("its task t11-gated-model is recorded `weights_missing` without running"),
        "{t}"
    );
    let run = run_id(&store);
    let c = report_json(&store, &run);
    let tasks: BTreeMap<String, &Value> = c["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap().to_string(), t))
        .collect();
    assert_eq!(tasks.len(), 12);
    let outcome = |id: &str| tasks[id]["outcome"].as_str().unwrap_or("none").to_string();
    let cause = |id: &str| {
        let t = tasks[id];
        let c = if t["cause"].is_object() {
            &t["cause"]
        } else {
            &t["attempts"][0]["cause"]
        };
        format!(
            "{} in {}",
            c["kind"].as_str().unwrap_or("-"),
            c["variant"].as_str().unwrap_or("-")
        )
    };
    let all = serde_json::to_string_pretty(&c).unwrap();
    assert_eq!(outcome("t01-faster-than-human"), "won", "{all}");
    // The human's own change: the same speed. Two judges of "the same",
    // each of which errs on its own now and then for identical code: ISO-
    // Bench's ±5% band on a point estimate of 3 rounds on a shared CPU (it
    // wandered out of it in CI), and the 95% interval, which excludes 1 for
    // identical code about one time in 40 (in CI it once said `faster`).
    // The planted outcome is missed only when both err at once.
    let same = &tasks["t02-same-as-human"]["attempts"][0]["vs_human"];
    let speedup = same["speedup"].as_f64().unwrap();
    assert!(
        same["verdict"] == "same" || (0.95..=1.05).contains(&speedup),
        "{all}"
    );
    assert_ne!(outcome("t02-same-as-human"), "failed", "{all}");
    assert_eq!(outcome("t03-slower-than-human"), "lost", "{all}");
    assert_eq!(outcome("t04-slower-than-baseline"), "lost", "{all}");
    assert_eq!(
        tasks["t04-slower-than-baseline"]["attempts"][0]["gain"], 0.0,
        "{all}"
    );
    assert_eq!(outcome("t05-changes-outputs"), "failed");
    assert_eq!(cause("t05-changes-outputs"), "output_mismatch in agent");
    assert_eq!(outcome("t06-stops-early"), "failed");
    assert_eq!(outcome("t07-inflates-usage"), "failed");
    assert!(
        cause("t07-inflates-usage").starts_with("flagged"),
        "{}",
        cause("t07-inflates-usage")
    );
    assert_eq!(outcome("t08-does-not-apply"), "failed");
    assert_eq!(cause("t08-does-not-apply"), "patch_does_not_apply in agent");
    assert_eq!(outcome("t09-oom-at-start"), "failed");
    assert_eq!(cause("t09-oom-at-start"), "cuda_oom in agent");
    assert_eq!(tasks["t10-baseline-oom"]["valid"], false);
    assert_eq!(cause("t10-baseline-oom"), "cuda_oom in baseline");
    assert_eq!(tasks["t11-gated-model"]["valid"], false);
    assert_eq!(cause("t11-gated-model"), "weights_missing in cell");
    assert_eq!(outcome("t12-second-attempt"), "lost");
    assert_eq!(
        tasks["t12-second-attempt"]["opt_at"],
        serde_json::json!([false, true]),
        "{all}"
    );

    // The headline, recomputed from the per-task scores.
    let h = &c["headline"];
    let valid: Vec<&&Value> = tasks.values().filter(|t| t["valid"] == true).collect();
    assert_eq!(h["valid"]["count"], valid.len());
    assert_eq!(valid.len(), 10);
    for o in ["won", "matched", "lost", "failed"] {
        let n = valid.iter().filter(|t| t["outcome"] == o).count();
        assert_eq!(h["iso"][o]["count"], n, "{o}");
        assert_eq!(h["iso"][o]["of"], 10);
    }
    let opt1 = valid.iter().filter(|t| t["opt_at"][0] == true).count();
    let opt2 = valid
        .iter()
        .filter(|t| t["opt_at"].as_array().unwrap().iter().any(|b| b == true))
        .count();
    assert_eq!(h["opt_at"][0]["count"], opt1);
    assert_eq!(h["opt_at"][1]["count"], opt2);
    assert_eq!(opt2, opt1 + 1);
    let gains: f64 = valid
        .iter()
        .map(|t| t["attempts"][0]["gain"].as_f64().unwrap_or(0.0))
        .sum();
    let mean = h["swe_perf_agent"]["value"].as_f64().unwrap();
    assert!((mean - gains / 10.0).abs() < 1e-9, "{mean} vs {}", gains / 10.0);
    let lo = h["swe_perf_agent"]["ci_low"].as_f64().unwrap();
    let hi = h["swe_perf_agent"]["ci_high"].as_f64().unwrap();
    assert!(lo <= mean && mean <= hi);
    // The failure table: the two invalid tasks first.
    let failures = c["failures"].as_array().unwrap();
    assert!(
        failures[0]["invalidates"] == true && failures[1]["invalidates"] == true,
        "{all}"
    );

    // `orch show`: the headline under the cells.
    let out = orch(&store).args(["show", &run]).output().unwrap();
    let t = text(&out);
    assert!(t.contains("valid tasks       10/12"), "{t}");
    assert!(t.contains("Opt@2 (GSO)"), "{t}");
    // Re-scoring: a wider band, from the store, nothing run: each outcome
    // follows the rule from the stored agent-vs-human speedup.
    let wide = orch(&store)
        .args(["report", &run, "--format", "json", "--match-band", "0.9"])
        .output()
        .unwrap();
    let w: Value = serde_json::from_slice(&wide.stdout).unwrap();
    for t in w["tasks"].as_array().unwrap() {
        let a = &t["attempts"][0];
        let want = match (
            t["outcome"].is_null(),
            a["correct"].as_bool(),
            a["vs_human"]["speedup"].as_f64(),
        ) {
            (true, _, _) => "none",
            (false, Some(true), Some(x)) if x > 1.9 => "won",
            (false, Some(true), Some(x)) if x < 0.1 => "lost",
            (false, Some(true), Some(_)) => "matched",
            _ => "failed",
        };
        assert_eq!(t["outcome"].as_str().unwrap_or("none"), want, "{t}");
    }
    assert!(w["headline"]["iso"]["won"]["count"].as_u64() <= h["iso"]["won"]["count"].as_u64());
    assert!(w["headline"]["iso"]["matched"]["count"].as_u64() >= h["iso"]["matched"]["count"].as_u64());

    // Four formats, the HTML in Chromium.
    let dir = tmp.path().join("report");
    let out = orch(&store)
        .args(["report", &run, "--format", "md,csv,json,html", "-o"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let csv = std::fs::read_to_string(dir.join(format!("{run}.csv"))).unwrap();
    assert_eq!(csv.lines().count(), 13);
    let md = std::fs::read_to_string(dir.join(format!("{run}.md"))).unwrap();
    assert!(
        md.contains("patch_does_not_apply") && md.contains("| t01-faster-than-human |"),
        "{md}"
    );
    if let Some(chromium) = browser::require(test) {
        let dom = browser::dump_dom(&chromium, &dir.join(format!("{run}.html")));
        let plotted = dom.matches("<g class=\"task\"").count();
        // One forest row per correct first attempt: t01-t04 and t12's.
        assert_eq!(plotted, 5, "{dom}");
        assert_eq!(dom.matches("class=\"task-row\"").count(), 12);
        assert!(dom.contains("data-kind=\"cuda_oom\""), "{dom}");
    }
}

#[test]
fn a_killed_campaign_resumes_and_added_rows_run_alone() {
    if !numpy_or_skip("the stand-in server needs it: `pip install numpy`") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let manifest = campaign(
        tmp.path(),
        Some(&["t02-same-as-human", "t08-does-not-apply", "t09-oom-at-start"]),
    );
    let store = tmp.path().join("store");
    // Killed once its first task is stored.
    let mut child = orch(&store)
        .args(["run", "--gpu", "none", "-f"])
        .arg(&manifest)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let records = |store: &Path| -> usize {
        let Ok(runs) = std::fs::read_dir(store) else {
            return 0;
        };
        runs.flatten()
            .filter(|r| r.path().join("cells").is_dir())
            .flat_map(|r| {
                std::fs::read_dir(r.path().join("cells"))
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .filter(|c| c.path().join("result.json").is_file())
            .count()
    };
    while records(&store) == 0 {
        assert!(std::time::Instant::now() < deadline, "no task finished in 600 s");
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the campaign ended before it was killed: {st}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let run = run_id(&store);
    let before = report_json(&store, &run);
    let not_run = before["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["cause"]["kind"] == "not_run")
        .count();
    assert!(not_run >= 1, "{before}");
    let out = orch(&store).args(["run", "--resume", &run]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let after = report_json(&store, &run);
    assert!(
        after["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["cause"]["kind"] != "not_run"),
        "{after}"
    );
    assert_eq!(after["headline"]["valid"]["count"], 3);

    // A row added: `--reuse` runs it alone and takes the others' records.
    let rows = std::fs::read_to_string(tmp.path().join("tasks.jsonl")).unwrap();
    let added = std::fs::read_to_string(repo().join("examples/campaign-standin/tasks.jsonl"))
        .unwrap()
        .lines()
        .find(|l| l.contains("t05-changes-outputs"))
        .unwrap()
        .to_string();
    std::fs::write(tmp.path().join("tasks.jsonl"), format!("{rows}{added}\n")).unwrap();
    let out = orch(&store)
        .args(["run", "--gpu", "none", "--reuse", &run, "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    let t = text(&out);
    assert!(t.contains(&format!("reusing 3 of 4 cells from run {run}")), "{t}");
    let new_run = run_id(&store);
    assert_ne!(new_run, run);
    let c = report_json(&store, &new_run);
    assert_eq!(c["headline"]["tasks"], 4);
    assert_eq!(c["headline"]["valid"]["count"], 4, "{c}");
    let reused = std::fs::read_dir(store.join(&new_run).join("cells"))
        .unwrap()
        .flatten()
        .filter(|d| {
            std::fs::read_to_string(d.path().join("result.json")).is_ok_and(|r| r.contains("\"reused_from\""))
        })
        .count();
    assert_eq!(reused, 3);
}

#[test]
fn task_file_errors_exit_2_naming_the_row() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let manifest = tmp.path().join("c.yaml");
    std::fs::write(
        &manifest,
        "name: c\nbenchmarks:\n  - name: s\n    tasks: t.csv\n    compare: {repo: .}\n    workload:\n      server: {command: [x], ready: {tcp: 1}}\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("t.csv"),
        "id,human_ref,agent_patch\nt1,abc,missing.patch\n",
    )
    .unwrap();
    let out = orch(&store).args(["plan", "-f"]).arg(&manifest).output().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("t.csv:2:1: task row 1: `agent_patch`: no patch file"),
        "{t}"
    );
    assert!(t.contains("hint:"), "{t}");
}
