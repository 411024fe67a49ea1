//! End-to-end tests of the `orch` binary on the local backend: real agent
//! child processes, real workloads, a real store on disk.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn orch() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_orch"));
    c.env_remove("ORCH_STORE")
        .env_remove("ORCH_AGENT")
        .stdin(Stdio::null());
    c
}

use crate::repo;

fn run_ok(args: &[&str]) -> Output {
    let out = orch().args(args).output().unwrap();
    out
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn write_manifest(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("suite.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

fn cell<'a>(record: &'a Value, id: &str) -> &'a Value {
    record["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no cell {id} in {record}"))
}

#[test]
fn quickstart_succeeds_with_metrics() {
    let tmp = tempfile::tempdir().unwrap();
    let manifest = repo().join("manifests/quickstart.yaml");
    let store = tmp.path().join("store");
    let out = run_ok(&[
        "run",
        "-f",
        manifest.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    let cells = rec["cells"].as_array().unwrap();
    assert!(cells.len() >= 3);
    for c in cells {
        assert_eq!(c["status"], "succeeded", "{c}");
        assert!(!c["metrics"].as_object().unwrap().is_empty(), "{c}");
        assert!(c["failure"].is_null());
        for phase in ["start", "measure", "teardown"] {
            assert!(c["timings"][phase].as_f64().is_some(), "no {phase} timing in {c}");
        }
    }
    let t = cell(&rec, "transformer.cpu.preset-nano");
    assert!(t["metrics"]["tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(t["metrics"]["params"].as_f64().unwrap() > 0.0);
    assert!(t["timings"]["warmup"].as_f64().is_some());

    // `ls --json` and `show --json` agree with the run.
    let ls = json(&run_ok(&["ls", "--json", "--store", store.to_str().unwrap()]));
    assert_eq!(ls[0]["id"], rec["id"]);
    let show = json(&run_ok(&[
        "show",
        rec["id"].as_str().unwrap(),
        "--json",
        "--store",
        store.to_str().unwrap(),
    ]));
    assert_eq!(show["cells"], rec["cells"]);
    // The run folder holds the resolved manifest and the environment.
    let dir = store.join(rec["id"].as_str().unwrap());
    assert!(dir.join("manifest.yaml").is_file() && dir.join("plan.json").is_file());
    assert!(rec["environment"]["orch_version"].is_string());
}

#[test]
fn unknown_field_exits_2_naming_field_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(
        tmp.path(),
        "name: t\nbenchmarks:\n  - name: a\n    workload:\n      noop: true\n    measure:\n      warmpu: 1\n",
    );
    let out = run_ok(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        tmp.path().join("s").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("suite.yaml:7:"), "{err}");
    assert!(err.contains("`warmpu`") && err.contains("hint:"), "{err}");
    assert!(
        !tmp.path().join("s").exists(),
        "nothing is stored for an invalid manifest"
    );

    let out = run_ok(&["run", "-f", m.to_str().unwrap(), "--gpu", "H9000"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown GPU type `H9000`"));
}

#[test]
fn failing_command_is_failed_with_stderr_in_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(
        tmp.path(),
        "name: t\nbenchmarks:\n  - name: bad\n    workload:\n      shell: 'echo to-stdout; echo the-cause >&2; exit 3'\n  - name: good\n    workload:\n      noop: true\n",
    );
    let store = tmp.path().join("s");
    let out = run_ok(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let rec = json(&out);
    let bad = cell(&rec, "bad.cpu");
    assert_eq!(bad["status"], "failed");
    assert_eq!(bad["failure"]["exit_code"], 3);
    assert!(bad["failure"]["message"].as_str().unwrap().contains("the-cause"));
    assert_eq!(cell(&rec, "good.cpu")["status"], "succeeded", "the sweep goes on");

    let id = rec["id"].as_str().unwrap();
    let logs = run_ok(&[
        "logs",
        id,
        "bad.cpu",
        "--stream",
        "stderr",
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(String::from_utf8_lossy(&logs.stdout), "the-cause\n");
    let all = run_ok(&["logs", id, "--store", store.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.contains("to-stdout") && text.contains("the-cause"), "{text}");
}

#[test]
fn oom_timeout_and_truncation_are_recorded() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(
        tmp.path(),
        r#"
name: t
logs: {head: 1KiB, tail: 1KiB}
benchmarks:
  - name: big
    memory_limit: 1MiB
    workload:
      transformer: {preset: small, context: 128, batch: 2}
  - name: slow
    measure: {timeout: 1s, kill_grace: 1s}
    workload:
      shell: "trap '' TERM; sleep 30"
  - name: loud
    workload:
      shell: "yes 0123456789 | head -c 3000000; echo; echo last-line"
"#,
    );
    let store = tmp.path().join("s");
    let started = Instant::now();
    let out = run_ok(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "timeout was not enforced"
    );
    assert_eq!(out.status.code(), Some(1));
    let rec = json(&out);
    assert_eq!(cell(&rec, "big.cpu")["status"], "oom");
    assert_eq!(cell(&rec, "slow.cpu")["status"], "timeout");
    let loud = cell(&rec, "loud.cpu");
    assert_eq!(loud["status"], "succeeded");
    let log = std::fs::read_to_string(
        store
            .join(rec["id"].as_str().unwrap())
            .join("cells/loud.cpu/stdout.log"),
    )
    .unwrap();
    assert!(log.len() < 4096, "log kept {} bytes", log.len());
    assert!(
        log.contains("bytes truncated") && log.ends_with("last-line\n"),
        "{log}"
    );
}

fn slow_manifest(dir: &Path) -> PathBuf {
    write_manifest(
        dir,
        "name: slow\nbenchmarks:\n  - name: s\n    workload:\n      shell: 'sleep 0.7; echo ORCH_METRIC i={{i}}'\n    matrix:\n      i: [1, 2, 3, 4, 5, 6]\n",
    )
}

fn records(store: &Path) -> Vec<Value> {
    let run = std::fs::read_dir(store).unwrap().next().unwrap().unwrap().path();
    let mut out = vec![];
    for e in std::fs::read_dir(run.join("cells")).unwrap() {
        if let Ok(bytes) = std::fs::read(e.unwrap().path().join("result.json")) {
            out.push(serde_json::from_slice(&bytes).unwrap());
        }
    }
    out
}

#[test]
fn kill_9_then_resume_loses_and_repeats_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let m = slow_manifest(tmp.path());
    let store = tmp.path().join("s");
    let mut child = orch()
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until two cells are finished, then kill orch mid-cell.
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.exists() && records(&store).len() < 2 || !store.exists() {
        assert!(Instant::now() < deadline, "cells never finished");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let before = records(&store);
    assert!(before.len() >= 2 && before.len() < 6, "{} finished", before.len());

    let out = run_ok(&[
        "run",
        "--resume",
        "latest",
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
    assert_eq!(rec["state"], "complete");
    assert!(rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "succeeded"));
    // Every cell finished before the kill is untouched: same record, not run again.
    let after = records(&store);
    assert_eq!(after.len(), 6);
    for b in &before {
        let a = after.iter().find(|a| a["id"] == b["id"]).unwrap();
        assert_eq!(a, b, "a finished cell was run again");
    }
}

#[test]
fn interrupt_records_cancelled_and_resume_finishes() {
    let tmp = tempfile::tempdir().unwrap();
    let m = slow_manifest(tmp.path());
    let store = tmp.path().join("s");
    let child = orch()
        .args([
            "run",
            "-f",
            m.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.exists() || records(&store).is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    unsafe_sigint(child.id());
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rec = json(&out);
    assert_eq!(rec["state"], "interrupted");
    let statuses: Vec<&str> = rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"cancelled"), "{statuses:?}");
    assert!(statuses.contains(&"pending"), "{statuses:?}");

    let out = run_ok(&[
        "run",
        "--resume",
        rec["id"].as_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let rec = json(&out);
    assert!(rec["cells"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "succeeded"));
}

fn unsafe_sigint(pid: u32) {
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn server_is_watched_fails_fast_and_is_torn_down() {
    let tmp = tempfile::tempdir().unwrap();
    let port = 18000 + (std::process::id() % 1000) as u16;
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let md = run_ok(&["report", id, "--store", store.to_str().unwrap()]);
    let md = String::from_utf8_lossy(&md.stdout).to_string();
    assert!(
        md.contains("## Load curves") && md.contains("### `sweep.cpu` (by rate)"),
        "{md}"
    );
    assert!(md.contains("highest rate meeting the SLO"), "{md}");
    let out = tmp.path().join("rep");
    let r = run_ok(&[
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

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "user.email=t@t", "-c", "user.name=t"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let show = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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

#[test]
fn live_phases_follow_the_workloads_markers_and_gpu_counts_take_a_colon() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(
        tmp.path(),
        r#"
name: phases
benchmarks:
  - name: p
    workload:
      shell: "sleep 0.3; echo ORCH_PHASE warmup; sleep 0.1; echo ORCH_PHASE measure; sleep 0.1; echo ORCH_METRIC samples_per_s=5 gpu_energy_j=3"
"#,
    );
    let store = tmp.path().join("s");
    let out = run_ok(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let phases: Vec<&str> = err
        .lines()
        .filter_map(|l| l.trim().strip_prefix("p.cpu "))
        .filter(|l| ["warmup", "measure", "teardown"].contains(l))
        .collect();
    assert_eq!(phases, ["warmup", "measure", "teardown"], "{err}");
    // The workload's own metrics come before telemetry in the table.
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("samples_per_s=5 gpu_energy_j=3"), "{text}");

    let out = run_ok(&[
        "run",
        "-f",
        m.to_str().unwrap(),
        "--store",
        store.to_str().unwrap(),
        "--gpu",
        "H100x8",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("`H100:8`") && err.contains("hint:"), "{err}");
}

#[test]
fn a_cell_asking_for_more_gpus_than_the_host_has_is_refused_before_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let m = write_manifest(
        tmp.path(),
        "name: big\ngpus: [\"H100:8\", \"H100:2\"]\nbenchmarks:\n  - name: hello\n    workload: {shell: 'echo hi'}\n",
    );
    let store = tmp.path().join("store");
    let out = orch()
        .env("ORCH_GPUS", "0,1,2,3")
        .args(["run", "-f"])
        .arg(&m)
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cell `hello.h100x8` asks for 8 GPUs"), "{err}");
    assert!(err.contains("this host has 4"), "{err}");
    assert!(err.contains("hint:"), "{err}");
    // Nothing ran and no run was made.
    assert!(std::fs::read_dir(&store).map(|d| d.count() == 0).unwrap_or(true));
    // `plan` says the same.
    let out = orch()
        .env("ORCH_GPUS", "0,1,2,3")
        .args(["plan", "-f"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("asks for 8 GPUs"));
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
    let m = write_manifest(
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
    let out = run_ok(&[
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
