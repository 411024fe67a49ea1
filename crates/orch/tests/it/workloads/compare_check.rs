//! Comparisons that cannot be fooled (issue 32), end to end through the
//! `orch` binary: a toy server (`scripts/bench-compare/toy_server.py`) with
//! planted variants — a true speedup, a wrong answer that is faster, an
//! answer cache (also one that strips the nonce), an early stop, an A/A copy — compared in one cell. Only the
//! true speedup may come out `faster`; the gamed ones are `output_mismatch`
//! or `flagged` (or, for the cache that the per-round nonce defeats, no
//! faster at all); the A/A pair is `same` with no alarm. Also the `check:`
//! command of command clients and `warmup_rounds: auto`.

use crate::support::{git, json, orch, repo, write_suite};
use orch_testkit::suites::free_port;
use serde_json::Value;
use std::path::Path;

/// A repository whose `main` is the honest toy server, with a branch per
/// planted variant (`sed`-like edits of its constants).
fn toy_repo(dir: &Path) -> std::path::PathBuf {
    let repo_dir = dir.join("toy");
    std::fs::create_dir_all(&repo_dir).unwrap();
    let src = std::fs::read_to_string(repo().join("scripts/bench-compare/toy_server.py")).unwrap();
    // Fewer host-side loops than the benchmark's: the test's load is small.
    let base = src.replacen("WORK = 200 ", "WORK = 50 ", 1);
    assert_ne!(base, src);
    std::fs::write(repo_dir.join("server.py"), &base).unwrap();
    git(&repo_dir, &["init", "-q", "-b", "main"]);
    git(&repo_dir, &["add", "."]);
    git(&repo_dir, &["commit", "-q", "-m", "toy"]);
    let branch = |name: &str, from: &str, to: &str| {
        git(&repo_dir, &["checkout", "-q", "-b", name, "main"]);
        let s = base.replacen(from, to, 1);
        assert_ne!(s, base, "{name}");
        std::fs::write(repo_dir.join("server.py"), s).unwrap();
        git(&repo_dir, &["commit", "-q", "-am", name]);
    };
    branch("fast", "STEP_MS = 4.0 ", "STEP_MS = 2.0 ");
    branch("wrong", "MODE = \"honest\"", "MODE = \"wrong\"");
    branch("cache", "MODE = \"honest\"", "MODE = \"cache\"");
    branch("early", "MODE = \"honest\"", "MODE = \"early\"");
    branch("strip", "MODE = \"honest\"", "MODE = \"cache_strip\"");
    branch("early_long", "MODE = \"honest\"", "MODE = \"early_long\"");
    branch("early_stream", "MODE = \"honest\"", "MODE = \"early_stream\"");
    branch("usage_lie", "MODE = \"honest\"", "MODE = \"usage_lie\"");
    git(&repo_dir, &["checkout", "-q", "main"]);
    repo_dir
}

fn run(dir: &Path, manifest: &str) -> Value {
    let m = write_suite(dir, manifest);
    let out = orch()
        .args(["run", "-f", m.to_str().unwrap(), "--store"])
        .arg(dir.join("store"))
        .arg("--json")
        .output()
        .unwrap();
    json(&out)
}

fn pair<'a>(info: &'a Value, other: &str) -> &'a Value {
    info["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["base"] == "baseline" && p["other"] == other)
        .unwrap_or_else(|| panic!("no pair baseline vs {other}: {}", info["pairs"]))
}

#[test]
fn only_the_true_speedup_is_faster_and_gamed_variants_are_caught() {
    let tmp = tempfile::tempdir().unwrap();
    let toy = toy_repo(tmp.path());
    let port = free_port();
    let rec = run(
        tmp.path(),
        &format!(
            r#"
name: gaming
benchmarks:
  - name: cmp
    compare:
      repo: {toy}
      rounds: 4
      warmup_rounds: 1
      # The true speedup is ~1.9x; a noise threshold of 15% keeps the A/A pair
      # `same` on a loaded CI host (at 5% it came out `faster` x1.10 once, with
      # builds beside it: 4 rounds are few).
      noise: 0.15
      seed: 3
      output_check: {{prompts: 4, max_tokens: 8}}
      variants:
        - {{name: baseline, ref: main}}
        - {{name: aa, ref: main}}
        - {{name: fast, ref: fast}}
        - {{name: wrong, ref: wrong}}
        - {{name: cache, ref: cache}}
        - {{name: early, ref: early}}
        - {{name: strip, ref: strip}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
        startup_timeout: 30s
      client:
        loadgen: {{num_prompts: 8, max_concurrency: 4, input_len: 8, output_len: 12, seed: 5}}
"#,
            toy = toy.display()
        ),
    );
    let c = &rec["cells"][0];
    let info = &c["info"];
    assert_eq!(c["status"], "succeeded", "{c}");
    let v = &info["variants"];
    // The output check ran for every variant, at the load's answer length
    // (12 tokens, not the check's own 8); the evidence is in the cell folder.
    assert_eq!(info["output_check"]["status"], "ran", "{}", info["output_check"]);
    assert_eq!(info["output_check"]["max_tokens"], 12, "{}", info["output_check"]);
    assert_eq!(v["baseline"]["output_check"]["status"], "reference");
    for ok in ["aa", "fast", "cache", "strip"] {
        assert_eq!(v[ok]["output_check"]["status"], "passed", "{ok}: {}", v[ok]);
        assert_eq!(v[ok]["output_check"]["exact_match_rate"], 1.0);
    }
    for bad in ["wrong", "early"] {
        let chk = &v[bad]["output_check"];
        assert_eq!(chk["status"], "output_mismatch", "{bad}: {chk}");
        assert!(chk["first_difference"]["baseline"].is_string(), "{chk}");
        assert_eq!(v[bad]["gate"]["kind"], "output_mismatch", "{bad}: {}", v[bad]);
        // Its speed is still measured and shown.
        let p = pair(info, bad);
        assert_eq!(p["verdict"], "output_mismatch", "{p}");
        assert!(
            p["speed_verdict"].is_string() && p["speedup"].as_f64().unwrap() > 1.2,
            "{p}"
        );
    }
    let cell_dir = tmp
        .path()
        .join("store")
        .join(rec["id"].as_str().unwrap())
        .join("cells")
        .join(c["id"].as_str().unwrap());
    let evidence: Value =
        serde_json::from_str(&std::fs::read_to_string(cell_dir.join("output-check/wrong.json")).unwrap())
            .unwrap();
    assert_eq!(evidence["answers"].as_array().unwrap().len(), 4);
    assert_eq!(evidence["outcome"]["passed"], false);
    // Only the true speedup is faster; A/A is same with no alarm.
    assert_eq!(pair(info, "fast")["verdict"], "faster", "{}", pair(info, "fast"));
    assert_eq!(pair(info, "aa")["verdict"], "same", "{}", pair(info, "aa"));
    for quiet in ["baseline", "aa", "fast"] {
        assert!(v[quiet]["gate"].is_null(), "{quiet}: {}", v[quiet]);
    }
    for p in info["pairs"].as_array().unwrap() {
        if p["verdict"] == "faster" {
            assert_eq!(p["other"], "fast", "{p}");
        }
        if p["verdict"] == "slower" {
            assert_eq!(p["base"], "fast", "{p}");
        }
    }
    // The cache never hits: every round's prompts carry a fresh nonce.
    let nonces = info["nonces"].as_array().unwrap();
    assert_eq!(nonces.len(), 5, "{nonces:?}");
    assert_ne!(nonces[1], nonces[2]);
    assert_ne!(pair(info, "cache")["verdict"], "faster");
    // A cache that strips the nonce never hits either: random prompts are
    // drawn from a seed of each round's own.
    assert_ne!(
        pair(info, "strip")["verdict"],
        "faster",
        "{}",
        pair(info, "strip")
    );
    // The drift of the measured rounds is recorded per variant.
    assert_eq!(v["fast"]["drift"]["n"], 4, "{}", v["fast"]);
    // The report shows the gate.
    let out = orch()
        .args(["report", rec["id"].as_str().unwrap(), "--format", "md", "--store"])
        .arg(tmp.path().join("store"))
        .args(["--output"])
        .arg(tmp.path().join("report"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_dir(tmp.path().join("report"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "md"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    assert!(md.contains("variant `wrong` **output_mismatch**"), "{md}");
    assert!(md.contains("drift"), "{md}");
}

#[test]
fn a_check_command_gates_command_clients_and_warm_up_can_wait_for_steady_rounds() {
    let tmp = tempfile::tempdir().unwrap();
    let toy = toy_repo(tmp.path());
    let port = free_port();
    // The client writes what the server answers beside its metrics file;
    // the check compares it with the baseline's.
    let client = tmp.path().join("client.py");
    std::fs::write(
        &client,
        r#"import json, os, urllib.request
req = urllib.request.Request(os.environ["ORCH_SERVER_URL"] + "/v1/completions",
                             data=json.dumps({"prompt": "the same question", "max_tokens": 6}).encode())
text = json.load(urllib.request.urlopen(req))["choices"][0]["text"]
with open(os.path.join(os.path.dirname(os.environ["ORCH_METRICS_FILE"]), "answer.txt"), "w") as f:
    f.write(text)
print("ORCH_METRIC answer_tokens_per_s=%f" % (100.0 + len(text)))
"#,
    )
    .unwrap();
    let rec = run(
        tmp.path(),
        &format!(
            r#"
name: checked
benchmarks:
  - name: cmp
    compare:
      repo: {toy}
      rounds: 2
      warmup_rounds: auto
      max_warmup_rounds: 5
      check: 'cmp "$ORCH_ROUND_DIR/answer.txt" "$ORCH_BASELINE_ROUND_DIR/answer.txt"'
      variants:
        - {{name: baseline, ref: main}}
        - {{name: wrong, ref: wrong}}
        - {{name: fast, ref: fast}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
        startup_timeout: 30s
      client:
        command: [python3, "{client}"]
"#,
            toy = toy.display(),
            client = client.display()
        ),
    );
    let c = &rec["cells"][0];
    let info = &c["info"];
    let v = &info["variants"];
    assert_eq!(
        info["output_check"]["status"], "skipped",
        "{}",
        info["output_check"]
    );
    assert_eq!(
        v["wrong"]["output_check"]["status"], "output_mismatch",
        "{}",
        v["wrong"]
    );
    assert_eq!(v["wrong"]["gate"]["kind"], "output_mismatch");
    assert_eq!(v["fast"]["output_check"]["status"], "passed", "{}", v["fast"]);
    assert!(v["fast"]["gate"].is_null());
    // Auto warm-up: at least the steadiness window, at most the bound.
    let warmed = info["warmup_rounds"].as_u64().unwrap();
    assert!((4..=5).contains(&warmed), "{info}");
    assert!(
        ["steady", "max_warmup_rounds"].contains(&info["warmup_stopped_by"].as_str().unwrap()),
        "{info}"
    );
    assert_eq!(
        v["baseline"]["warmup_values"].as_array().unwrap().len() as u64,
        warmed
    );
}

/// Issue 44: servers that lie about their own work, judged with no tokenizer
/// (the server's `usage` is all a count could rest on). The output check is
/// off so that the load-time defences stand alone: a patch that stops long
/// answers at half while its `usage` claims them whole (`early_long`, the
/// attack that came out `faster` x1.76 on two H200s), one that does so on
/// streamed answers only (`early_stream`, which an output check asked
/// without streaming never sees), and one whose answers are right but whose
/// `usage` claims 1.5 times the tokens (`usage_lie`). None may be `faster`;
/// each is flagged with the evidence in `lengths/<name>.json`; the true
/// speedup stays `faster` and the A/A pair `same`, unflagged.
#[test]
fn servers_that_lie_in_usage_are_never_faster() {
    let tmp = tempfile::tempdir().unwrap();
    let toy = toy_repo(tmp.path());
    let port = free_port();
    let rec = run(
        tmp.path(),
        &format!(
            r#"
name: lying
benchmarks:
  - name: cmp
    compare:
      repo: {toy}
      rounds: 3
      # The true speedup is ~1.9x; a noise threshold of 15% keeps the A/A pair
      # `same` on a loaded CI host (at 5% it came out `faster` x1.10 once, with
      # builds beside it: 4 rounds are few).
      noise: 0.15
      seed: 11
      output_check: false
      variants:
        - {{name: baseline, ref: main}}
        - {{name: aa, ref: main}}
        - {{name: fast, ref: fast}}
        - {{name: early_long, ref: early_long}}
        - {{name: early_stream, ref: early_stream}}
        - {{name: usage_lie, ref: usage_lie}}
    workload:
      server:
        command: [python3, server.py, "{port}"]
        ready: {{http: /health, port: {port}}}
        startup_timeout: 30s
      client:
        loadgen: {{num_prompts: 8, max_concurrency: 4, input_len: 8, output_len: 40, seed: 5}}
"#,
            toy = toy.display()
        ),
    );
    let c = &rec["cells"][0];
    let info = &c["info"];
    assert_eq!(c["status"], "succeeded", "{c}");
    let v = &info["variants"];
    let flags = |name: &str| -> Vec<String> {
        v[name]["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect()
    };
    for liar in ["early_long", "early_stream"] {
        let p = pair(info, liar);
        assert_eq!(p["verdict"], "flagged", "{liar}: {p}");
        // Its speed alone would have been a win.
        assert_eq!(p["speed_verdict"], "faster", "{liar}: {p}");
        assert!(
            flags(liar).contains(&"shorter_outputs".to_string()),
            "{liar}: {}",
            v[liar]
        );
        let l = &v[liar]["lengths"];
        assert!(l["bytes"]["ratio"].as_f64().unwrap() < 0.6, "{liar}: {l}");
        // 8 answers a round, 4 rounds (the warm-up round included).
        assert_eq!(l["pairs"], 32, "{liar}: {l}");
    }
    let p = pair(info, "usage_lie");
    assert_eq!(p["verdict"], "flagged", "{p}");
    assert_eq!(p["speed_verdict"], "faster", "{p}");
    assert_eq!(
        flags("usage_lie"),
        ["inflated_token_counts"],
        "{}",
        v["usage_lie"]
    );
    assert!(
        v["usage_lie"]["gate"]["why"]
            .as_str()
            .unwrap()
            .contains("inflated_token_counts"),
        "{}",
        v["usage_lie"]
    );
    // The evidence: the judgement and every paired answer.
    let cell_dir = tmp
        .path()
        .join("store")
        .join(rec["id"].as_str().unwrap())
        .join("cells")
        .join(c["id"].as_str().unwrap());
    let ev: Value =
        serde_json::from_str(&std::fs::read_to_string(cell_dir.join("lengths/usage_lie.json")).unwrap())
            .unwrap();
    assert_eq!(ev["pairs"].as_array().unwrap().len(), 32);
    assert!(
        ev["judgement"]["claimed_per_byte"]["ratio"].as_f64().unwrap() > 1.4,
        "{ev}"
    );
    // What each request received is in `requests.jsonl`, beside the claim.
    let req = std::fs::read_to_string(cell_dir.join("variants/usage_lie/round-0/requests.jsonl")).unwrap();
    let first: Value = serde_json::from_str(req.lines().next().unwrap()).unwrap();
    assert_eq!(first["usage_output_tokens"], 60, "{first}");
    assert_eq!(first["output_events"], 40, "{first}");
    assert!(first["output_bytes"].as_u64().unwrap() >= 40 * 5, "{first}");
    // The honest ones are untouched.
    assert_eq!(pair(info, "fast")["verdict"], "faster", "{}", pair(info, "fast"));
    assert_eq!(pair(info, "aa")["verdict"], "same", "{}", pair(info, "aa"));
    for quiet in ["aa", "fast"] {
        assert!(flags(quiet).is_empty(), "{quiet}: {}", v[quiet]);
        assert_eq!(
            v[quiet]["lengths"]["bytes"]["ratio"], 1.0,
            "{quiet}: {}",
            v[quiet]
        );
    }
}
