//! Cost, spend and budgets end to end: the real `orch` binary, the local
//! backend, real `sleep` workloads, prices from a user prices file.

use crate::support::{json, orch, write_suite};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// USD per second of a CPU-only cell on the local backend in these tests.
const PRICE: f64 = 0.01;

struct Env {
    tmp: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let env = Env {
            tmp: tempfile::tempdir().unwrap(),
        };
        std::fs::write(
            env.prices(),
            format!("backends:\n  local:\n    gpu:\n      none: {PRICE}\n"),
        )
        .unwrap();
        env
    }

    fn path(&self) -> &Path {
        self.tmp.path()
    }

    fn prices(&self) -> PathBuf {
        self.path().join("prices.yaml")
    }

    fn store(&self) -> PathBuf {
        self.path().join("store")
    }

    /// `orch ARGS --store STORE --prices FILE`, with no user config around.
    fn orch(&self, args: &[&str]) -> Command {
        let mut c = orch();
        c.args(args)
            .arg("--store")
            .arg(self.store())
            .arg("--prices")
            .arg(self.prices())
            .env_remove("ORCH_PRICES")
            .env("HOME", self.path())
            .env("XDG_CONFIG_HOME", self.path().join("config"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.orch(args).output().unwrap()
    }

    fn manifest(&self, text: &str) -> String {
        write_suite(self.path(), text).to_str().unwrap().to_string()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Cells `sleep $SLEEP_S` (default 1 s), timeout 60 s.
const SLEEPS: &str = r#"
name: sleeps
measure: {timeout: 60s}
benchmarks:
  - name: nap
    workload:
      shell: 'sleep ${SLEEP_S:-1}'
    matrix:
      i: [1, 2, 3]
"#;

#[test]
fn local_run_costs_its_duration_at_the_users_price() {
    let env = Env::new();
    let m = env.manifest(&SLEEPS.replace("[1, 2, 3]", "[1, 2]"));
    let out = env.run(&["run", "-f", &m, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rec = json(&out);
    let mut sum = 0.0;
    for c in rec["cells"].as_array().unwrap() {
        let cost = &c["cost"];
        let d = f(&c["duration_s"]);
        assert!(d >= 1.0, "{c}");
        let usd = f(&cost["usd"]);
        let expect = d * PRICE;
        assert!((usd - expect).abs() <= 0.01 * expect, "{usd} vs {expect}: {c}");
        assert_eq!(cost["wasted"], false);
        assert_eq!(f(&cost["usd_per_s"]), PRICE);
        assert!(
            cost["price_source"].as_str().unwrap().starts_with("user: "),
            "{cost}"
        );
        // The phases and `other` split the whole cost; provision is measured by the host.
        let by_phase: f64 = cost["by_phase"].as_object().unwrap().values().map(f).sum();
        assert!((by_phase - usd).abs() < 1e-9, "{cost}");
        assert!(f(&c["timings"]["provision"]) > 0.0, "{c}");
        assert!(f(&cost["by_phase"]["measure"]) > 0.9 * PRICE, "{cost}");
        sum += usd;
    }
    assert!((f(&rec["cost"]["usd"]) - sum).abs() < 1e-9, "{}", rec["cost"]);
    assert_eq!(f(&rec["cost"]["wasted_usd"]), 0.0);

    let show = env.run(&["show", "latest"]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("COST") && text.contains("cost: $0.0"), "{text}");
}

#[test]
fn cost_by_gpu_totals_equal_the_cells_costs_and_survive_a_lost_ledger() {
    let env = Env::new();
    let m = env.manifest(
        r#"
name: mixed
benchmarks:
  - name: ok
    workload: {shell: 'sleep 0.3'}
  - name: bad
    workload: {shell: 'sleep 0.3; exit 3'}
"#,
    );
    for _ in 0..2 {
        let out = env.run(&["run", "-f", &m]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    }
    // The truth: every record's cost.
    let mut total = 0.0;
    let mut wasted = 0.0;
    let mut cells = 0;
    for run in std::fs::read_dir(env.store()).unwrap() {
        for c in std::fs::read_dir(run.unwrap().path().join("cells")).unwrap() {
            let r: Value =
                serde_json::from_slice(&std::fs::read(c.unwrap().path().join("result.json")).unwrap())
                    .unwrap();
            let usd = f(&r["cost"]["usd"]);
            assert!(usd > 0.0);
            total += usd;
            if r["status"] != "succeeded" {
                assert_eq!(r["cost"]["wasted"], true);
                wasted += usd;
            }
            cells += 1;
        }
    }
    assert_eq!(cells, 4);
    let check = |out: &Output| {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        let spend = json(out);
        assert_eq!(spend["by"], "gpu");
        assert_eq!(spend["runs"], 2);
        assert!((f(&spend["total"]["usd"]) - total).abs() < 1e-9, "{spend}");
        assert!(
            (f(&spend["total"]["wasted_usd"]) - wasted).abs() < 1e-9,
            "{spend}"
        );
        assert_eq!(spend["total"]["cells"], 4);
        assert_eq!(spend["total"]["wasted_cells"], 2);
        let groups = spend["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0]["key"], "none");
        let by_groups: f64 = groups.iter().map(|g| f(&g["usd"])).sum();
        assert!((by_groups - total).abs() < 1e-9);
    };
    check(&env.run(&["cost", "--by", "gpu", "--json"]));

    // The ledgers are a cache: removed (or stale), they are rebuilt from the records.
    for run in std::fs::read_dir(env.store()).unwrap() {
        std::fs::remove_file(run.unwrap().path().join("costs.jsonl")).unwrap();
    }
    check(&env.run(&["cost", "--by", "gpu", "--json"]));

    let by_status = json(&env.run(&["cost", "--by", "status", "--json"]));
    let failed = by_status["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == "failed")
        .unwrap();
    assert!((f(&failed["usd"]) - wasted).abs() < 1e-9);
    let csv = env.run(&["cost", "--by", "suite", "--csv"]);
    let text = String::from_utf8_lossy(&csv.stdout);
    assert!(text.starts_with("suite,cells,wasted_cells,"), "{text}");
    assert!(text.contains("\nmixed,4,2,"), "{text}");
    // Nothing finished in the future.
    let none = json(&env.run(&["cost", "--since", "1s", "--json"]));
    assert!(f(&none["total"]["usd"]) <= total);
}

#[test]
fn max_cost_below_the_estimate_refuses_to_start() {
    let env = Env::new();
    let m = env.manifest(SLEEPS);
    // No earlier run: each cell is estimated at its 60 s timeout ($0.60).
    let plan = json(&env.run(&["plan", "-f", &m, "--json"]));
    assert!(
        (f(&plan["estimate"]["usd"]) - 3.0 * 60.0 * PRICE).abs() < 1e-9,
        "{plan}"
    );
    assert_eq!(plan["estimate"]["upper_bound_cells"], 3);
    assert_eq!(plan["cells"][0]["estimate"]["basis"], "timeout_upper_bound");

    let out = env.run(&["run", "-f", &m, "--max-cost", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("over `--max-cost 1`") && err.contains("\nhint: "),
        "{err}"
    );
    assert!(err.contains("upper bound"), "{err}");
    assert!(!env.store().exists(), "nothing ran, nothing was stored");
}

#[test]
fn max_cost_stops_a_run_midway_within_the_cap() {
    let env = Env::new();
    let m = env.manifest(SLEEPS);
    // A first run gives each cell a history of ~0.1 s...
    let first = env
        .orch(&["run", "-f", &m])
        .env("SLEEP_S", "0.1")
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let plan = json(&env.run(&["plan", "-f", &m, "--json"]));
    assert_eq!(plan["estimate"]["history_cells"], 3);
    let estimate = f(&plan["estimate"]["usd"]);
    assert!(estimate < 0.02, "{plan}");

    // ... so a run with a cap of $0.05 starts, then the cells sleep 30 s:
    // the first passes its estimate and is stopped before the cap; the
    // others never start.
    let cap = 0.05;
    let started = Instant::now();
    let out = env
        .orch(&["run", "-f", &m, "--max-cost", &cap.to_string(), "--json"])
        .env("SLEEP_S", "30")
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the budget stopped nothing"
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("stopped by the budget"), "{}", stderr(&out));
    let rec = json(&out);
    let budget = &rec["budget"];
    assert_eq!(budget["stopped"], true, "{budget}");
    assert_eq!(f(&budget["max_usd"]), cap);
    assert!(budget["reason"].as_str().unwrap().contains("cap"), "{budget}");
    for c in rec["cells"].as_array().unwrap() {
        assert_eq!(c["status"], "cancelled", "{c}");
        assert_eq!(c["failure"]["kind"], "budget", "{c}");
    }
    // The bound: the cap plus what the stopped cell costs while it stops
    // (one tick of 0.25 s, and at most 1 s to stop and be recorded).
    let spent = f(&rec["cost"]["usd"]);
    let tick = f(&budget["tick_s"]);
    assert!(
        spent <= cap + PRICE * (tick + 1.0),
        "spent {spent} over the cap {cap}"
    );
    // It did run until the cap was near (not stopped at once for nothing).
    assert!(spent >= cap - PRICE * (2.0 * tick + 0.5), "spent {spent}");
    assert!((f(&budget["accrued_usd"]) - spent).abs() < 1e-9, "{budget}");

    let show = env.run(&["show", rec["id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("budget: $0.0500 cap") && text.contains("STOPPED"),
        "{text}"
    );
}

#[test]
fn prices_show_their_sources_and_a_bad_file_is_a_user_error() {
    let env = Env::new();
    let out = env.run(&["prices", "--backend", "local", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let p = json(&out);
    let none = p["prices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["item"] == "gpu none")
        .unwrap();
    assert_eq!(f(&none["value"]), PRICE);
    assert!(none["source"].as_str().unwrap().contains("prices.yaml"));
    let all = env.run(&["prices"]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(
        text.contains("gpu H100") && text.contains("catalog: modal, 2025-08"),
        "{text}"
    );

    std::fs::write(env.prices(), "backends:\n  local:\n    gpu:\n      nonee: 1\n").unwrap();
    let out = env.run(&["prices"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("prices.yaml:4:") && err.contains("`nonee`") && err.contains("hint:"),
        "{err}"
    );
}

#[test]
fn server_start_and_load_are_billed_as_their_own_phases() {
    let env = Env::new();
    let port = 20000 + (std::process::id() % 1000) as u16;
    let m = env.manifest(&format!(
        r#"
name: phases
benchmarks:
  - name: srv
    workload:
      server:
        shell: 'sleep 1; exit 1'
        ready: {{tcp: {port}}}
        startup_timeout: 1m
  - name: cmd
    workload:
      shell: 'echo ORCH_PHASE load; sleep 0.5; echo ORCH_PHASE measure; sleep 0.2'
"#
    ));
    let out = env.run(&["run", "-f", &m, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rec = json(&out);
    let cells = rec["cells"].as_array().unwrap();
    // (A phase's cost is its seconds at the cell's price, within 1%: the
    // host's and the agent's clocks can overrun the billed time by a few
    // milliseconds, and then the phases are scaled into it.)
    let srv = cells.iter().find(|c| c["id"] == "srv.cpu").unwrap();
    let t = f(&srv["timings"]["server_start"]);
    assert!((1.0..2.5).contains(&t), "server_start {t}: {srv}");
    assert!(
        (f(&srv["cost"]["by_phase"]["server_start"]) - t * PRICE).abs() <= 0.01 * t * PRICE,
        "{srv}"
    );
    assert_eq!(srv["cost"]["wasted"], true, "a failed server's cost is waste");
    let cmd = cells.iter().find(|c| c["id"] == "cmd.cpu").unwrap();
    let load = f(&cmd["timings"]["load"]);
    // `sleep 0.5` between the markers, as the agent reads them.
    assert!((0.4..1.5).contains(&load), "load {load}: {cmd}");
    assert!(
        (f(&cmd["cost"]["by_phase"]["load"]) - load * PRICE).abs() <= 0.01 * load * PRICE,
        "{cmd}"
    );
    assert!((f(&rec["cost"]["wasted_usd"]) - f(&srv["cost"]["usd"])).abs() < 1e-12);
}
