//! `orch report` and `orch compare` end to end: the real binary, the
//! quickstart run into a real store, the four report files, the HTML opened
//! in headless Chromium.

#[path = "../../../../orch-report/tests/support/browser.rs"]
pub(super) mod browser;

use crate::support::repo;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// [`crate::support::orch`] on `store`.
fn orch(store: &Path) -> Command {
    let mut c = crate::support::orch();
    c.arg("--store").arg(store);
    c
}

fn run(store: &Path, args: &[&str]) -> Output {
    orch(store).args(args).output().unwrap()
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

fn ok(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn quickstart(store: &Path) -> String {
    let manifest = repo().join("manifests/quickstart.yaml");
    let out = run(store, &["run", "-f", manifest.to_str().unwrap(), "--json"]);
    let rec: Value = serde_json::from_str(&ok(&out)).unwrap();
    rec["id"].as_str().unwrap().to_string()
}

#[test]
fn report_of_the_quickstart_in_four_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let id = quickstart(&store);
    let dir = tmp.path().join("out");
    let out = run(
        &store,
        &[
            "report",
            "latest",
            "--format",
            "md,csv,json,html",
            "-o",
            dir.to_str().unwrap(),
        ],
    );
    let printed = ok(&out);
    let files: Vec<PathBuf> = ["md", "csv", "json", "html"]
        .iter()
        .map(|ext| dir.join(format!("{id}.{ext}")))
        .collect();
    for f in &files {
        assert!(f.is_file(), "no {}", f.display());
        assert!(printed.contains(&f.display().to_string()), "{printed}");
    }
    let cells = [
        "transformer.cpu.preset-nano",
        "transformer.cpu.preset-tiny",
        "transformer.cpu.preset-mini",
        "command.cpu",
    ];

    let md = std::fs::read_to_string(&files[0]).unwrap();
    assert!(md.starts_with(&format!("# Report of `{id}`\n")), "{md}");
    for section in [
        "## Ranking by throughput",
        "### `tokens_per_s` (higher is better)",
        "### `md5_mib_per_s` (higher is better)",
        "## Ranking by cost-efficiency ($ per 1k output tokens)",
        "## Cells",
        "## Hardware",
    ] {
        assert!(md.contains(section), "no `{section}` in\n{md}");
    }
    for c in cells {
        assert!(md.contains(&format!("`{c}`")), "no {c} in\n{md}");
    }
    assert!(md.contains("`step_time (ms)`"), "{md}");

    let csv = std::fs::read_to_string(&files[1]).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + cells.len(), "{csv}");
    assert!(
        lines[0].starts_with("run,cell,benchmark,status,gpu,"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("metric.tokens_per_s") && lines[0].contains("param.preset"));
    for c in cells {
        assert!(
            lines.iter().any(|l| l.starts_with(&format!("{id},{c},"))),
            "{csv}"
        );
    }

    let json: Value = serde_json::from_str(&std::fs::read_to_string(&files[2]).unwrap()).unwrap();
    assert_eq!(json["run"]["id"], id.as_str());
    assert_eq!(json["cells"].as_array().unwrap().len(), cells.len());
    let rankings = json["rankings"].as_array().unwrap();
    assert_eq!(rankings[0]["metric"], "tokens_per_s");
    assert_eq!(rankings[0]["entries"].as_array().unwrap().len(), 3);
    // Ranked best first.
    let v: Vec<f64> = rankings[0]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["value"].as_f64().unwrap())
        .collect();
    assert!(v.windows(2).all(|w| w[0] >= w[1]), "{v:?}");

    let html = std::fs::read_to_string(&files[3]).unwrap();
    assert!(html.starts_with("<!doctype html>") && html.contains(&id));
    if let Some(chromium) = browser::require("report_of_the_quickstart_in_four_formats") {
        let dom = browser::dump_dom(&chromium, &files[3]);
        let r = browser::check(&dom).unwrap_or_else(|e| panic!("{e}\n--- DOM ---\n{dom}"));
        // One bar per cell: 3 transformer cells + the command cell.
        assert_eq!(r.throughput_bars, 4, "{r:?}");
        assert_eq!(r.cost_bars, json["cost_ranking"].as_array().unwrap().len());
        assert_eq!(r.latency_rows, 3, "{r:?}");
        for c in cells {
            assert!(
                dom.contains(&format!("class=\"bar throughput\" data-cell=\"{c}\"")),
                "no bar for {c}"
            );
        }
        if let Some(sample) = std::env::var_os("ORCH_REPORT_SAMPLE_DIR") {
            let sample = Path::new(&sample);
            std::fs::create_dir_all(sample).unwrap();
            for f in &files {
                std::fs::copy(
                    f,
                    sample.join(format!("quickstart.{}", f.extension().unwrap().to_string_lossy())),
                )
                .unwrap();
            }
            browser::screenshot(&chromium, &files[3], &sample.join("quickstart.png"), 2200);
        }
    }

    // One format without `-o` prints on stdout; several go into the run folder.
    let md_out = ok(&run(&store, &["report", &id]));
    assert!(md_out.starts_with(&format!("# Report of `{id}`")));
    let json_out: Value =
        serde_json::from_str(&ok(&run(&store, &["report", "latest", "--format", "json"]))).unwrap();
    assert_eq!(json_out["run"]["id"], id.as_str());
    ok(&run(&store, &["report", "latest", "--format", "csv,html"]));
    assert!(store
        .join(&id)
        .join("report")
        .join(format!("{id}.html"))
        .is_file());

    // `--metric` and `--latency` choose; a lower-is-better metric ranks ascending.
    let json_out: Value = serde_json::from_str(&ok(&run(
        &store,
        &[
            "report",
            "latest",
            "--format",
            "json",
            "--metric",
            "step_time_mean_ms",
        ],
    )))
    .unwrap();
    assert_eq!(json_out["rankings"][0]["better"], "lower");
    assert_eq!(
        json_out["rankings"][0]["entries"][0]["cell"],
        "transformer.cpu.preset-nano"
    );
}

#[test]
fn report_and_compare_user_errors_exit_2_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let suite = tmp.path().join("noop.yaml");
    std::fs::write(
        &suite,
        "name: noop\nbenchmarks:\n  - name: n\n    workload: {noop: true}\n    matrix: {x: [1, 2]}\n",
    )
    .unwrap();
    ok(&run(&store, &["run", "-f", suite.to_str().unwrap()]));
    let cases: [(&[&str], &str); 5] = [
        (&["report", "latest", "--format", "md,pdf"], "`--format`"),
        (&["report", "latest", "--metric", "nope_per_s"], "`--metric`"),
        (&["report", "latest", "--latency", "ttft"], "`--latency`"),
        (&["report", "no-such-run"], "`no-such-run`"),
        (&["compare", "latest", "no-such-run"], "`no-such-run`"),
    ];
    for (args, needle) in cases {
        let out = run(&store, args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle) && err.contains("hint:"), "{args:?}: {err}");
    }
}

#[test]
fn compare_two_runs_of_the_same_suite() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("store");
    let suite = tmp.path().join("s.yaml");
    std::fs::write(
        &suite,
        "name: rates\nbenchmarks:\n  - name: c\n    workload:\n      shell: 'echo \"ORCH_METRIC tokens_per_s={{n}}00 latency_mean_ms=5 latency_p99_ms=9\"'\n    matrix: {n: [1, 2]}\n",
    )
    .unwrap();
    ok(&run(&store, &["run", "-f", suite.to_str().unwrap()]));
    ok(&run(&store, &["run", "-f", suite.to_str().unwrap()]));
    let ids: Vec<Value> = serde_json::from_str(&ok(&run(&store, &["ls", "--json"]))).unwrap();
    let (a, b) = (ids[0]["id"].as_str().unwrap(), ids[1]["id"].as_str().unwrap());

    let cmp: Value = serde_json::from_str(&ok(&run(&store, &["compare", a, b, "--json"]))).unwrap();
    assert_eq!(cmp["a"]["id"], a);
    let pairs = cmp["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2, "{cmp}");
    for p in pairs {
        assert_eq!(p["cell_a"], p["cell_b"]);
        assert_eq!(p["metric"], "tokens_per_s");
        // The same deterministic work twice: ratio 1.
        assert_eq!(p["ratio"], 1.0, "{p}");
    }
    assert!(cmp["only_a"].as_array().unwrap().is_empty());

    let out = ok(&run(&store, &["compare", a, b]));
    assert!(out.starts_with(&format!("A  {a}")), "{out}");
    assert!(
        out.contains("CELL") && out.contains("B/A") && out.contains("CHEAPER"),
        "{out}"
    );
    assert!(out.contains("c n=1") && out.contains("tokens_per_s"), "{out}");

    // A run of another suite shares nothing: a user error.
    let other = tmp.path().join("o.yaml");
    std::fs::write(
        &other,
        "name: other\nbenchmarks:\n  - name: z\n    workload: {noop: true}\n",
    )
    .unwrap();
    let rec: Value = serde_json::from_str(&ok(&run(
        &store,
        &["run", "-f", other.to_str().unwrap(), "--json"],
    )))
    .unwrap();
    let out = run(&store, &["compare", a, rec["id"].as_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("no cell in common") && err.contains("hint:"),
        "{err}"
    );
}

#[test]
fn report_of_a_served_model_uses_vllm_names() {
    let tmp = tempfile::tempdir().unwrap();
    let port = 21000 + (std::process::id() % 1000) as u16;
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let suite = tmp.path().join("serve.yaml");
    std::fs::write(
        &suite,
        format!(
            r#"
name: serve
env: {{FAKE_TTFT_MS: "20", FAKE_ITL_MS: "3"}}
benchmarks:
  - name: serve
    workload:
      server:
        command: [python3, "{}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen: {{num_prompts: 8, request_rate: 50, max_concurrency: 4, input_len: 16, output_len: 8}}
"#,
            fake.display()
        ),
    )
    .unwrap();
    let store = tmp.path().join("store");
    ok(&run(&store, &["run", "-f", suite.to_str().unwrap()]));
    let json: Value =
        serde_json::from_str(&ok(&run(&store, &["report", "latest", "--format", "json"]))).unwrap();
    let cell = &json["cells"][0];
    assert_eq!(cell["throughput"]["name"], "output_throughput", "{cell}");
    assert_eq!(cell["token_rate"]["name"], "output_throughput");
    assert_eq!(cell["latency"]["family"], "ttft", "{cell}");
    assert!(cell["latency"]["p99"].as_f64().unwrap() >= cell["latency"]["median"].as_f64().unwrap());
    assert_eq!(json["rankings"][0]["metric"], "output_throughput");
    // `--latency e2el` and `--metric request_throughput` choose others.
    let json: Value = serde_json::from_str(&ok(&run(
        &store,
        &[
            "report",
            "latest",
            "--format",
            "json",
            "--latency",
            "e2el",
            "--metric",
            "request_throughput",
        ],
    )))
    .unwrap();
    assert_eq!(json["cells"][0]["latency"]["family"], "e2el");
    assert_eq!(json["rankings"][0]["metric"], "request_throughput");
    assert_eq!(json["rankings"][0]["unit"], "requests");
}
