//! Server workloads end to end on the local backend: a server watched and torn down,
//! the load generator against an OpenAI-compatible fake (vLLM's field names, goodput
//! and SLOs, token counts, rate sweeps and saturation, multi-turn replay, 1,000
//! requests a second), and comparisons of a server's variants (three-way with broken
//! patches, `rounds: auto`).

use crate::support::{cell, git, json, orch_output, write_suite};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn server_is_watched_fails_fast_and_is_torn_down() {
    let tmp = tempfile::tempdir().unwrap();
    let port = 18000 + (std::process::id() % 1000) as u16;
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: srv
benchmarks:
  - name: ok
    workload:
      server:
        command: [python3, -m, http.server, "{port}", --bind, 127.0.0.1]
        ready: {{http: /, port: {port}}}
        startup_timeout: 30s
      client:
        shell: 'test -n "$ORCH_SERVER_URL" && echo ORCH_METRIC requests=1'
  - name: crash
    workload:
      server:
        shell: 'echo loading; sleep 1; echo "RuntimeError: CUDA error: out of memory" >&2; exit 1'
        ready: {{tcp: {}}}
        startup_timeout: 10m
"#,
            port + 1
        ),
    );
    let started = Instant::now();
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        tmp.path().join("s").to_str().unwrap(),
        "--json",
    ]);
    // The crashing server is noticed at once, not after its 10 minute startup timeout.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let ok = cell(&rec, "ok.cpu");
    assert_eq!(ok["status"], "succeeded", "{ok}");
    assert_eq!(ok["metrics"]["requests"], 1.0);
    let crash = cell(&rec, "crash.cpu");
    assert_eq!(crash["status"], "failed");
    assert_eq!(crash["failure"]["kind"], "server_exited");
    assert_eq!(crash["failure"]["exit_code"], 1);
    // The cause is named from the server's log.
    assert_eq!(crash["diagnosis"]["kind"], "cuda_oom", "{crash}");
    assert!(!crash["diagnosis"]["hint"].as_str().unwrap().is_empty());
    // Failed within 1 s of the server's exit (it exits after 1 s).
    let startup = crash["metrics"]["server_startup_s"].as_f64().unwrap();
    assert!((1.0..2.0).contains(&startup), "noticed after {startup}s");
    // Teardown freed the port.
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still held"
    );
}

#[test]
fn loadgen_measures_an_openai_server_with_vllm_field_names() {
    let tmp = tempfile::tempdir().unwrap();
    let port = 19000 + (std::process::id() % 1000) as u16;
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: lg
env: {{FAKE_TTFT_MS: "30", FAKE_ITL_MS: "4"}}
benchmarks:
  - name: serve
    workload:
      server:
        command: [python3, "{}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen:
          endpoint: "{{{{endpoint}}}}"
          num_prompts: 12
          request_rate: 50
          max_concurrency: 4
          input_len: 16
          output_len: 10
          warmup_requests: 2
    matrix:
      endpoint: [/v1/completions, /v1/chat/completions]
"#,
            fixture.display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    for c in rec["cells"].as_array().unwrap() {
        let m = &c["metrics"];
        assert_eq!(m["completed"], 12.0, "{c}");
        assert_eq!(m["failed"], 0.0);
        assert_eq!(m["total_output_tokens"], 120.0);
        let ttft = m["mean_ttft_ms"].as_f64().unwrap();
        assert!((25.0..1000.0).contains(&ttft), "ttft {ttft}");
        let itl = m["median_itl_ms"].as_f64().unwrap();
        assert!((3.0..200.0).contains(&itl), "itl {itl}");
        for k in [
            "p99_ttft_ms",
            "p90_tpot_ms",
            "std_e2el_ms",
            "request_throughput",
            "output_throughput",
        ] {
            assert!(m[k].as_f64().unwrap() > 0.0, "{k} in {c}");
        }
        assert!(c["timings"]["warmup"].as_f64().is_some());
    }
    let saved: Value = serde_json::from_slice(
        &std::fs::read(
            store
                .join(rec["id"].as_str().unwrap())
                .join("cells/serve.cpu.endpoint-_v1_completions/loadgen.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(saved["request_rate"], "50");
    assert!(saved["mean_ttft_ms"].as_f64().is_some());
}

/// Goodput under an SLO, latency from the intended send time, the schedule lag and
/// the `client_behind` flag, `requests.jsonl`, and input tokens as the server counts them.
#[test]
fn loadgen_reports_goodput_schedule_lag_and_per_request_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let port = orch_testkit::suites::free_port();
    let port2 = orch_testkit::suites::free_port();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: lg2
env: {{FAKE_TTFT_MS: "40", FAKE_ITL_MS: "2"}}
benchmarks:
  - name: strict
    workload:
      server:
        command: [python3, "{f}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen:
          num_prompts: 10
          request_rate: 1000
          max_concurrency: 1
          input_len: 16
          output_len: 5
          slo: {{ttft_ms: 10}}
  - name: loose
    workload:
      server:
        command: [python3, "{f}", "{port2}"]
        ready: {{http: /health, port: {port2}}}
      client:
        loadgen:
          num_prompts: 10
          request_rate: 1000
          max_concurrency: 1
          input_len: 16
          output_len: 5
          slo: {{ttft_ms: 5000, tpot_ms: 1000, e2el_ms: 5000}}
"#,
            f = fixture.display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    for c in rec["cells"].as_array().unwrap() {
        let m = &c["metrics"];
        assert_eq!(m["completed"], 10.0, "{c}");
        // The server's own count (2 a word + 1), not 16 words.
        assert_eq!(m["total_input_tokens"], 10.0 * 33.0, "{c}");
        // One slot, 40 ms a request, 1000 requests a second asked: each waits for the
        // one before it, so the latency from the intended send time grows.
        let ttft = m["mean_ttft_ms"].as_f64().unwrap();
        let sched = m["mean_sched_ttft_ms"].as_f64().unwrap();
        assert!(sched > ttft + 100.0, "sched {sched} ttft {ttft}");
        assert!(m["p99_schedule_lag_ms"].as_f64().unwrap() > 200.0, "{c}");
        assert!(
            c["flags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f == "client_behind"),
            "{c}"
        );
        let bound = if c["id"].as_str().unwrap().starts_with("strict") {
            10.0
        } else {
            5000.0
        };
        let goodput = m["request_goodput"].as_f64().unwrap();
        let attained = m["slo_attainment"].as_f64().unwrap();
        if bound < 40.0 {
            assert_eq!(goodput, 0.0, "{c}");
            assert_eq!(attained, 0.0, "{c}");
        } else {
            assert_eq!(attained, 1.0, "{c}");
            let rps = m["request_throughput"].as_f64().unwrap();
            assert!((goodput - rps).abs() < 1e-9, "{goodput} vs {rps}");
            assert!(m["output_goodput"].as_f64().unwrap() > 0.0);
        }
        let dir = store
            .join(rec["id"].as_str().unwrap())
            .join("cells")
            .join(c["id"].as_str().unwrap());
        let lines = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap();
        let lines: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 10);
        for (i, l) in lines.iter().enumerate() {
            assert_eq!(l["i"], i);
            assert_eq!(l["input_tokens_from"], "usage");
            assert!(l["sent_s"].as_f64().unwrap() >= l["scheduled_s"].as_f64().unwrap());
            assert_eq!(l["slo_met"], bound > 40.0, "{l}");
        }
        let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("loadgen.json")).unwrap()).unwrap();
        assert_eq!(saved["token_counts"]["input"]["usage"], 10, "{saved}");
        assert!(saved["client_behind"]
            .as_str()
            .unwrap()
            .contains("max_concurrency"));
    }
}

/// Prompts of an exact number of tokens and counts by the model's tokenizer (a
/// `tokenizer.json` beside the suite): input as `vllm bench serve` counts it (BOS
/// included), output from the text that arrived (the server's `usage` kept beside it).
#[test]
fn loadgen_counts_tokens_with_the_models_tokenizer() {
    let tmp = tempfile::tempdir().unwrap();
    let port = orch_testkit::suites::free_port();
    let port2 = orch_testkit::suites::free_port();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    std::fs::create_dir_all(tmp.path().join("tok")).unwrap();
    std::fs::copy(
        fixtures.join("tiny-tokenizer.json"),
        tmp.path().join("tok/tokenizer.json"),
    )
    .unwrap();
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: toks
env: {{FAKE_TTFT_MS: "5", FAKE_ITL_MS: "1"}}
benchmarks:
  - name: usage
    workload:
      server:
        command: [python3, "{f}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen: {{num_prompts: 6, input_len: 40, output_len: 5, tokenizer: tok/tokenizer.json, max_concurrency: 2}}
  - name: nousage
    env: {{FAKE_NO_USAGE: "1"}}
    workload:
      server:
        command: [python3, "{f}", "{port2}"]
        ready: {{http: /health, port: {port2}}}
      client:
        loadgen: {{num_prompts: 6, input_len: 40, output_len: 5, tokenizer: tok/tokenizer.json, max_concurrency: 2, endpoint: /v1/chat/completions}}
"#,
            f = fixtures.join("fake_openai.py").display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    for c in rec["cells"].as_array().unwrap() {
        let m = &c["metrics"];
        assert_eq!(m["completed"], 6.0, "{c}");
        // 40 tokens as the server counts them (39 of text and the BOS), not
        // 40 words.
        assert_eq!(m["total_input_tokens"], 6.0 * 40.0, "{c}");
        let dir = store
            .join(rec["id"].as_str().unwrap())
            .join("cells")
            .join(c["id"].as_str().unwrap());
        let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("loadgen.json")).unwrap()).unwrap();
        assert_eq!(saved["token_counts"]["input"]["tokenizer"], 6, "{saved}");
        assert!(saved["tokenizer"].as_str().unwrap().ends_with("tokenizer.json"));
        // " tok" five times: four byte-level tokens each (`Ġ`, `t`, `o`, `k`),
        // counted from the text that arrived whatever the server's `usage`
        // says (5: it counts " tok" as one), which is kept beside the count.
        assert_eq!(m["total_output_tokens"], 6.0 * 20.0, "{c}");
        assert_eq!(saved["token_counts"]["output"]["tokenizer"], 6, "{saved}");
        if c["id"].as_str().unwrap().starts_with("nousage") {
            assert!(m.get("usage_output_tokens").is_none(), "{c}");
        } else {
            assert_eq!(m["usage_output_tokens"], 6.0 * 5.0, "{c}");
            assert_eq!(m["token_count_disagreements"], 6.0, "{c}");
        }
    }
}

/// A sweep of rates in one cell gives a throughput curve; a saturation search against
/// a server that serves one request at a time (about 50 a second) stops where its p99
/// TTFT breaks the SLO.
#[test]
fn loadgen_sweeps_rates_and_searches_the_highest_rate_meeting_the_slo() {
    let tmp = tempfile::tempdir().unwrap();
    let port = orch_testkit::suites::free_port();
    let port2 = orch_testkit::suites::free_port();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: sweeps
env: {{FAKE_TTFT_MS: "20", FAKE_ITL_MS: "0", FAKE_CAPACITY: "1"}}
benchmarks:
  - name: sweep
    workload:
      server:
        command: [python3, "{f}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen:
          num_prompts: 12
          input_len: 4
          output_len: 1
          burstiness: 100
          sweep: {{request_rate: [5, 20, 80]}}
  - name: search
    workload:
      server:
        command: [python3, "{f}", "{port2}"]
        ready: {{http: /health, port: {port2}}}
      client:
        loadgen:
          num_prompts: 24
          input_len: 4
          output_len: 1
          burstiness: 100
          slo: {{ttft_ms: 150}}
          saturation: {{start_rate: 8, max_rate: 1024, steps: 2}}
"#,
            f = fixture.display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let sweep = cell(&rec, "sweep.cpu");
    let m = &sweep["metrics"];
    let tput: Vec<f64> = ["rate_5", "rate_20", "rate_80"]
        .iter()
        .map(|s| m[format!("{s}.request_throughput")].as_f64().unwrap())
        .collect();
    assert!(tput[0] < tput[1] && tput[1] < tput[2], "not monotone: {tput:?}");
    // Past the server's capacity the queue shows in TTFT.
    let ttft: Vec<f64> = ["rate_5", "rate_80"]
        .iter()
        .map(|s| m[format!("{s}.p99_ttft_ms")].as_f64().unwrap())
        .collect();
    assert!(ttft[1] > 2.0 * ttft[0], "{ttft:?}");
    assert_eq!(m["max_request_throughput"].as_f64().unwrap(), tput[2]);
    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/sweep.cpu");
    let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("loadgen.json")).unwrap()).unwrap();
    assert_eq!(saved["stages"].as_array().unwrap().len(), 3, "{saved}");
    let lines = std::fs::read_to_string(dir.join("requests.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 36);
    assert!(lines.lines().all(|l| l.contains("\"stage\":\"rate_")));

    let search = cell(&rec, "search.cpu");
    let m = &search["metrics"];
    let rate = m["saturation_rate"]
        .as_f64()
        .unwrap_or_else(|| panic!("{search}"));
    // About 50 requests a second fit; 24 at 128/s wait up to ~0.3 s.
    assert!((16.0..128.0).contains(&rate), "saturation at {rate}: {search}");
    let stop = search["info"]["saturation_stop"].as_str().unwrap();
    assert!(stop.contains("broke"), "{stop}");
    let name = format!(
        "rate_{}",
        if rate.fract() == 0.0 {
            format!("{}", rate as i64)
        } else {
            format!("{rate}").replace('.', "p")
        }
    );
    assert!(
        m[format!("{name}.p99_ttft_ms")].as_f64().unwrap() <= 150.0,
        "{search}"
    );
    // The curve in the reports: a table in markdown, a chart in HTML, columns in CSV.
    let id = rec["id"].as_str().unwrap();
    let md = orch_output(&["report", id, "--store", store.to_str().unwrap()]);
    let md = String::from_utf8_lossy(&md.stdout).to_string();
    assert!(
        md.contains("## Load curves") && md.contains("### `sweep.cpu` (by rate)"),
        "{md}"
    );
    assert!(md.contains("highest rate meeting the SLO"), "{md}");
    let out = tmp.path().join("rep");
    let r = orch_output(&[
        "report",
        id,
        "--store",
        store.to_str().unwrap(),
        "--format",
        "html,csv",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(0), "{}", String::from_utf8_lossy(&r.stderr));
    let html = std::fs::read_to_string(out.join(format!("{id}.html"))).unwrap();
    assert_eq!(
        html.matches("<svg class=\"curve\"").count(),
        2,
        "one chart a cell with stages"
    );
    let csv = std::fs::read_to_string(out.join(format!("{id}.csv"))).unwrap();
    assert!(csv.lines().next().unwrap().contains("rate_80.p99_ttft_ms"));
}

/// A patch of `server.py` replacing `from` with `to`, made with git.
fn patch(repo: &Path, from: &str, to: &str, out: &Path) {
    let src = std::fs::read_to_string(repo.join("server.py")).unwrap();
    std::fs::write(repo.join("server.py"), src.replacen(from, to, 1)).unwrap();
    std::fs::write(out, git(repo, &["diff"])).unwrap();
    git(repo, &["checkout", "--", "server.py"]);
}

#[test]
fn three_way_comparison_gives_verdicts_and_survives_broken_variants() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("server-repo");
    std::fs::create_dir_all(&repo).unwrap();
    let fixture =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py"))
            .unwrap();
    // Defaults baked into the source, so that patches change speed.
    let src = fixture.replace(
        r#"os.environ.get("FAKE_ITL_MS", "5")"#,
        r#"os.environ.get("FAKE_ITL_MS", "20")"#,
    );
    assert_ne!(src, fixture);
    std::fs::write(repo.join("server.py"), &src).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "baseline"]);
    let patches = tmp.path().join("patches");
    std::fs::create_dir_all(&patches).unwrap();
    patch(
        &repo,
        r#""FAKE_ITL_MS", "20""#,
        r#""FAKE_ITL_MS", "6""#,
        &patches.join("human.patch"),
    );
    patch(
        &repo,
        "class Handler",
        "# tidy-up only\nclass Handler",
        &patches.join("agent.patch"),
    );
    patch(
        &repo,
        "    port = int(sys.argv[1])",
        "    raise RuntimeError(\"CUDA error: out of memory\")\n    port = int(sys.argv[1])",
        &patches.join("crash.patch"),
    );
    std::fs::write(
        patches.join("broken.patch"),
        "--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-x\n+y\n",
    )
    .unwrap();

    let port = 17000 + (std::process::id() % 1000) as u16;
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: threeway
benchmarks:
  - name: cmp
    compare:
      repo: server-repo
      rounds: 4
      warmup_rounds: 1
      seed: 11
      variants:
        - {{name: baseline, ref: main}}
        - {{name: human, ref: main, patch: patches/human.patch}}
        - {{name: agent, ref: main, patch: patches/agent.patch}}
        - {{name: crash, ref: main, patch: patches/crash.patch}}
        - {{name: broken, ref: main, patch: patches/broken.patch}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
        startup_timeout: 60s
      client:
        loadgen: {{num_prompts: 8, max_concurrency: 4, input_len: 8, output_len: 8}}
"#
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let c = &rec["cells"][0];
    let variants = &c["info"]["variants"];
    for ok in ["baseline", "human", "agent"] {
        assert_eq!(variants[ok]["status"], "succeeded", "{ok}: {}", variants[ok]);
        assert_eq!(variants[ok]["rounds"], 4);
        assert_eq!(
            variants[ok]["values"]["output_throughput"]
                .as_array()
                .unwrap()
                .len(),
            4
        );
    }
    // A stale patch is named as such, with git's report kept.
    assert_eq!(
        variants["broken"]["diagnosis"]["kind"], "patch_does_not_apply",
        "{}",
        variants["broken"]
    );
    let cell_dir = store
        .join(rec["id"].as_str().unwrap())
        .join("cells")
        .join(c["id"].as_str().unwrap());
    let report = std::fs::read_to_string(cell_dir.join("variants/broken/patch.log")).unwrap();
    assert!(report.contains("nope.py"), "{report}");
    // Shuffled rounds: seeded, recorded, every live variant once per round.
    let info = &c["info"];
    assert_eq!(info["seed"], 11);
    let orders = info["order"].as_array().unwrap();
    assert_eq!(orders.len(), 5, "1 warm-up + 4 rounds: {orders:?}");
    for (i, o) in orders.iter().enumerate() {
        let mut names: Vec<&str> = o
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap())
            .collect();
        names.sort();
        // `crash` fails in the first round (where the output check rides),
        // and is in no round after it.
        let want: &[&str] = if i == 0 {
            &["agent", "baseline", "crash", "human"]
        } else {
            &["agent", "baseline", "human"]
        };
        assert_eq!(names, want, "{o}");
    }
    assert!(
        orders.iter().any(|o| o[0] != "baseline"),
        "the order is shuffled: {orders:?}"
    );
    assert_eq!(info["stopped_by"], "rounds");
    assert_eq!(info["primary_metric"], "output_throughput");
    assert_eq!(info["method"], "student_t");
    // One verdict per pair, from the primary metric, with n, interval and MDE.
    let pairs = info["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 3, "{pairs:?}");
    let human = pairs
        .iter()
        .find(|p| p["base"] == "baseline" && p["other"] == "human")
        .unwrap();
    assert_eq!(human["verdict"], "faster", "{human}");
    assert_eq!(human["n"], 4);
    assert!(human["mde"].as_f64().unwrap() > 0.0);
    let primary = info["comparison"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["other"] == "human" && x["role"] == "primary")
        .unwrap();
    assert_eq!(primary["metric"], "output_throughput");
    assert_eq!(primary["base_values"].as_array().unwrap().len(), 4);
    assert_eq!(variants["crash"]["status"], "failed");
    assert_eq!(variants["broken"]["status"], "failed");
    assert!(
        variants["broken"]["failure"]
            .as_str()
            .unwrap()
            .contains("does not apply"),
        "{}",
        variants["broken"]
    );
    assert_eq!(
        variants["crash"]["diagnosis"]["kind"], "cuda_oom",
        "{}",
        variants["crash"]
    );
    let verdict = |base: &str, other: &str, metric: &str| -> String {
        let v = c["info"]["comparison"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["base"] == base && x["other"] == other && x["metric"] == metric)
            .unwrap_or_else(|| panic!("no {other} vs {base} on {metric}"));
        v["verdict"].as_str().unwrap().to_string()
    };
    // The primary metric decides each pair.
    assert_eq!(verdict("baseline", "human", "output_throughput"), "faster");
    assert_eq!(verdict("human", "agent", "output_throughput"), "slower");
    assert_eq!(
        verdict("baseline", "agent", "median_itl_ms"),
        "same",
        "a no-op patch is A/A"
    );
    // Secondary metrics: the same direction, with a Holm-adjusted p-value
    // (their verdict needs it under 0.05, which 4 rounds on a loaded machine
    // may not give).
    let itl = c["info"]["comparison"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["base"] == "baseline" && x["other"] == "human" && x["metric"] == "median_itl_ms")
        .unwrap();
    assert_eq!(itl["role"], "secondary");
    assert!(itl["speedup"].as_f64().unwrap() > 2.0, "{itl}");
    assert!(itl["p_adjusted"].as_f64().unwrap() >= itl["p_value"].as_f64().unwrap());
    assert_ne!(itl["verdict"], "slower");

    // `orch show` prints the comparison table.
    let show = orch_output(&[
        "show",
        rec["id"].as_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(
        text.contains("human vs baseline") && text.contains("faster"),
        "{text}"
    );
    assert!(text.contains("output_throughput (primary)"), "{text}");
    assert!(text.contains("output_throughput per round, human:"), "{text}");
    assert!(text.contains("patch_does_not_apply"), "{text}");
}

#[test]
fn auto_rounds_stop_and_say_why_and_a_missing_primary_metric_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("server-repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py"),
        repo.join("server.py"),
    )
    .unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "server"]);
    let port = 17000 + ((std::process::id() + 500) % 1000) as u16;
    let bench = |name: &str, extra: &str| {
        format!(
            r#"
  - name: {name}
    compare:
      repo: server-repo
      warmup_rounds: 0
{extra}
      variants:
        - {{name: a, ref: main}}
        - {{name: b, ref: main}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen: {{num_prompts: 4, max_concurrency: 4, input_len: 4, output_len: 4}}
"#
        )
    };
    let m = write_suite(
        tmp.path(),
        &format!(
            "name: auto
benchmarks:{}{}",
            bench(
                "auto",
                "      rounds: auto
      max_rounds: 4
      primary_metric: mean_e2el_ms"
            ),
            bench(
                "missing",
                "      rounds: 2
      primary_metric: tokens_per_gpu"
            )
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    let rec = json(&out);
    let cell = |id: &str| {
        rec["cells"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == id)
            .unwrap()
            .clone()
    };
    let auto = cell("auto.cpu");
    let info = &auto["info"];
    assert_eq!(auto["status"], "succeeded", "{auto}");
    assert_eq!(info["rounds_requested"], "auto");
    assert_eq!(info["max_rounds"], 4);
    assert_eq!(info["primary_metric"], "mean_e2el_ms");
    let n = info["rounds"].as_u64().unwrap();
    match info["stopped_by"].as_str().unwrap() {
        "max_rounds" => assert_eq!(n, 4),
        "precision" => assert!((3..=4).contains(&n), "{n}"),
        other => panic!("stopped by {other}"),
    }
    assert_eq!(info["pairs"][0]["n"], n);
    assert_eq!(info["pairs"][0]["metric"], "mean_e2el_ms");
    let missing = cell("missing.cpu");
    assert_eq!(missing["status"], "failed");
    assert_eq!(missing["failure"]["kind"], "invalid_config");
    let msg = missing["failure"]["message"].as_str().unwrap();
    assert!(
        msg.contains("`tokens_per_gpu`") && msg.contains("output_throughput"),
        "{msg}"
    );
}

/// Conversations replayed turn by turn: each turn carries the history with the
/// server's own answers, is sent after the answer before it, and is a line of
/// `requests.jsonl`; the nonce tags every prompt; `outputs.jsonl` and the
/// anti-gaming metrics come with the cell.
#[test]
fn loadgen_replays_multi_turn_conversations_with_the_servers_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let port = orch_testkit::suites::free_port();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let log = tmp.path().join("seen.jsonl");
    std::fs::write(
        tmp.path().join("convs.json"),
        r#"[{"conversations": [
              {"from": "human", "value": "first question"}, {"from": "gpt", "value": "a b"},
              {"from": "human", "value": "second question"}, {"from": "gpt", "value": "a b c"},
              {"from": "human", "value": "third question"}, {"from": "gpt", "value": "a b c d"}]},
            {"conversations": [{"from": "human", "value": "alone"}, {"from": "gpt", "value": "x y"}]}]"#,
    )
    .unwrap();
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: turns
env: {{FAKE_TTFT_MS: "5", FAKE_ITL_MS: "1", FAKE_LOG: "{log}"}}
benchmarks:
  - name: chat
    workload:
      server:
        command: [python3, "{f}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen:
          endpoint: /v1/chat/completions
          num_prompts: 2
          prompt_file: convs.json
          multi_turn: true
          turn_delay_ms: 20
          nonce: r1
"#,
            f = fixture.display(),
            log = log.display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let c = cell(&rec, "chat.cpu");
    let mx = &c["metrics"];
    assert_eq!(mx["completed"], 4.0, "{c}");
    assert_eq!(mx["failed"], 0.0, "{c}");
    assert_eq!(mx["short_responses"], 0.0, "{c}");
    assert_eq!(mx["token_count_disagreements"], 0.0, "{c}");
    // Answers of 2, 3, 4 and 2 tokens: three distinct texts of four.
    assert_eq!(mx["distinct_output_ratio"], 0.75, "{c}");

    // What the server saw: 1, 3 and 5 messages for the long conversation.
    let seen: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut counts: Vec<usize> = seen
        .iter()
        .map(|s| s["messages"].as_array().unwrap().len())
        .collect();
    counts.sort();
    assert_eq!(counts, [1, 1, 3, 5]);
    let last = seen
        .iter()
        .find(|s| s["messages"].as_array().unwrap().len() == 5)
        .unwrap();
    let msgs = last["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "user", "assistant", "user"]);
    // The assistant turns are the server's answers (" tok" a token), not the dataset's.
    assert_eq!(msgs[1]["content"], " tok tok");
    assert_eq!(msgs[3]["content"], " tok tok tok");
    let user = |k: usize| msgs[k]["content"].as_str().unwrap().to_string();
    assert!(user(0).starts_with("first question [nonce r1-"), "{}", user(0));
    assert!(user(4).starts_with("third question [nonce r1-"), "{}", user(4));
    // Every prompt carries a different nonce.
    let tags: std::collections::BTreeSet<String> = seen
        .iter()
        .map(|s| {
            let m = s["messages"].as_array().unwrap();
            m.last().unwrap()["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(tags.len(), 4);

    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/chat.cpu");
    let lines: Vec<Value> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    let turn = |conv: u64, t: u64| {
        lines
            .iter()
            .find(|l| l["conversation"] == conv && l["turn"] == t)
            .unwrap_or_else(|| panic!("no turn {t} of {conv}: {lines:?}"))
    };
    for t in 1..3 {
        let (prev, next) = (turn(0, t - 1), turn(0, t));
        let answered = prev["sent_s"].as_f64().unwrap() + prev["e2el_ms"].as_f64().unwrap() / 1000.0;
        let sent = next["sent_s"].as_f64().unwrap();
        assert!(
            sent >= answered + 0.019,
            "turn {t} sent at {sent}, answer before it at {answered}"
        );
    }
    assert_eq!(turn(1, 0)["ok"], true);
    let outs: Vec<Value> = std::fs::read_to_string(dir.join("outputs.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(outs.len(), 4);
    assert!(outs
        .iter()
        .all(|o| o["prompt_sha256"].as_str().unwrap().len() == 64 && o["text"].is_string()));
}

/// 2,000 requests at 1,000 a second from the one-thread client all complete, and a
/// linear ramp sends its first requests further apart than its last.
#[test]
fn loadgen_sends_two_thousand_requests_at_a_thousand_a_second_and_ramps_up() {
    let tmp = tempfile::tempdir().unwrap();
    let port = orch_testkit::suites::free_port();
    let port2 = orch_testkit::suites::free_port();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_openai.py");
    let m = write_suite(
        tmp.path(),
        &format!(
            r#"
name: fast
env: {{FAKE_TTFT_MS: "0", FAKE_ITL_MS: "0"}}
benchmarks:
  - name: rate
    workload:
      server:
        command: [python3, "{f}", "{port}"]
        ready: {{http: /health, port: {port}}}
      client:
        loadgen: {{num_prompts: 2000, request_rate: 1000, input_len: 4, output_len: 2}}
  - name: ramp
    workload:
      server:
        command: [python3, "{f}", "{port2}"]
        ready: {{http: /health, port: {port2}}}
      client:
        loadgen:
          num_prompts: 200
          input_len: 4
          output_len: 2
          burstiness: 50
          ramp_up: {{strategy: linear, start_rps: 50, end_rps: 500}}
"#,
            f = fixture.display()
        ),
    );
    let store = tmp.path().join("s");
    let out = orch_output(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let rate = cell(&rec, "rate.cpu");
    assert_eq!(rate["metrics"]["completed"], 2000.0, "{rate}");
    assert_eq!(rate["metrics"]["failed"], 0.0, "{rate}");
    let ramp = cell(&rec, "ramp.cpu");
    assert_eq!(ramp["metrics"]["completed"], 200.0, "{ramp}");
    let dir = store.join(rec["id"].as_str().unwrap()).join("cells/ramp.cpu");
    let at: Vec<f64> = std::fs::read_to_string(dir.join("requests.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["scheduled_s"]
                .as_f64()
                .unwrap()
        })
        .collect();
    // The first 20 intervals at about 50-95 requests/s, the last 20 at about 455-500.
    let first = at[20] - at[0];
    let last = at[199] - at[179];
    assert!(first > 4.0 * last, "first {first} last {last}");
    assert!((0.2..0.45).contains(&first), "first {first}");
    let saved: Value = serde_json::from_slice(&std::fs::read(dir.join("loadgen.json")).unwrap()).unwrap();
    assert_eq!(saved["ramp_up_strategy"], "linear", "{saved}");
}
