//! Every `tests/corpus/<kind>__<source>_<n>.log` must be diagnosed as `<kind>`.
//! A sibling `<name>.exit.json` (`{"code": 137, "signal": null, "timed_out": false}`)
//! gives how the process ended.

use orch_diagnose::FailureKind;
use orch_diagnose::{diagnose_with_exit, ExitInfo, Rules, KINDS, UNKNOWN};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    files
}

fn real_logs() -> Vec<orch_diagnose::eval::LabelledLog> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real");
    orch_diagnose::eval::load_dir(&dir).unwrap_or_else(|e| panic!("{e}"))
}

/// The corpus of real logs pasted into public issue threads (`tests/real/{tune,holdout}`):
/// its shape (size, sources, kinds, unknowns) and the accuracy the README reports.
#[test]
fn real_corpus_is_diagnosed() {
    let logs = real_logs();
    assert!(logs.len() >= 80, "{} real logs, want at least 80", logs.len());
    let mut per_kind: BTreeMap<&FailureKind, usize> = BTreeMap::new();
    for l in &logs {
        assert!(
            l.source.contains('#') || l.source.starts_with("http"),
            "{}: no `# source:` line",
            l.path.display()
        );
        assert!(KINDS.contains(&l.expected), "{}: unknown kind", l.path.display());
        *per_kind.entry(&l.expected).or_default() += 1;
    }
    for k in KINDS.iter().filter(|k| !orch_diagnose::BACKEND_KINDS.contains(k)) {
        assert!(
            per_kind.get(k).copied().unwrap_or(0) >= 3,
            "kind {k} has fewer than 3 real logs: {per_kind:?}"
        );
    }
    let report = orch_diagnose::eval::evaluate(&logs, &Rules::default());
    println!("{}", report.to_text());
    assert!(
        report.sources * 10 >= logs.len() * 8,
        "most logs come from their own thread"
    );
    assert!(report.total.accuracy >= 0.9, "accuracy {}", report.total.accuracy);
    assert!(
        report.total.accuracy_loso >= 0.85,
        "leave-one-source-out accuracy {}",
        report.total.accuracy_loso
    );
}

fn expected_kind(path: &Path) -> FailureKind {
    let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
    let (kind, _source) = stem
        .split_once("__")
        .unwrap_or_else(|| panic!("{stem}: name must be <kind>__<source>_<n>.log"));
    FailureKind::new(kind)
}

fn exit_info(path: &Path) -> Option<ExitInfo> {
    let side = path.with_extension("exit.json");
    let text = std::fs::read_to_string(&side).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", side.display())))
}

#[test]
fn corpus_is_diagnosed_by_name() {
    let rules = Rules::default();
    let files = corpus();
    assert!(
        files.len() >= 40,
        "corpus has {} logs, want at least 40",
        files.len()
    );
    let mut per_kind: BTreeMap<FailureKind, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for path in &files {
        let want = expected_kind(path);
        assert!(KINDS.contains(&want), "{}: unknown kind {want}", path.display());
        *per_kind.entry(want.clone()).or_default() += 1;
        let log = std::fs::read_to_string(path).unwrap();
        let exit = exit_info(path);
        let d = diagnose_with_exit(&log, exit.as_ref(), &rules);
        let name = path.file_name().unwrap().to_string_lossy();
        if d.kind != want {
            failures.push(format!(
                "{name}: want {want}, got {}\n    evidence: {:?}",
                d.kind, d.evidence
            ));
        } else if want != UNKNOWN && d.evidence.is_empty() {
            failures.push(format!("{name}: {want} without evidence"));
        } else {
            assert!(d.evidence.len() <= orch_diagnose::MAX_EVIDENCE);
            assert!(!d.hint.is_empty());
            println!(
                "ok   {name}: {}",
                d.evidence.first().map(String::as_str).unwrap_or("(no evidence)")
            );
        }
    }
    let ok = files.len() - failures.len();
    println!(
        "corpus accuracy: {ok}/{} = {:.1}%",
        files.len(),
        100.0 * ok as f64 / files.len() as f64
    );
    // The real corpus counts too: kinds added with it have no written-from-memory logs.
    for l in real_logs() {
        *per_kind.entry(l.expected).or_default() += 1;
    }
    for k in KINDS {
        assert!(
            per_kind.get(k).copied().unwrap_or(0) >= 2,
            "kind {k} has fewer than 2 corpus logs"
        );
    }
    assert!(failures.is_empty(), "misdiagnosed:\n  {}", failures.join("\n  "));
}

#[test]
fn evidence_names_the_root_cause_not_the_wrapper() {
    let rules = Rules::default();
    let wrappers = [
        "Engine core initialization failed",
        "Engine process failed to start",
        "scheduler is dead",
        "ChildFailedError",
        "failed to start",
        "WebserverFailed",
        "ShardCannotStart",
    ];
    for path in corpus() {
        let d = orch_diagnose::diagnose_with_exit(
            &std::fs::read_to_string(&path).unwrap(),
            exit_info(&path).as_ref(),
            &rules,
        );
        if d.kind == UNKNOWN {
            continue;
        }
        for line in &d.evidence {
            for w in wrappers {
                assert!(
                    !line.contains(w),
                    "{}: wrapper in evidence: {line}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn large_log_is_fast_enough() {
    let rules = Rules::default();
    let noise =
        "INFO 12-26 19:24:01 [metrics.py:455] Avg prompt throughput: 1234.5 tokens/s, Running: 12 reqs\n";
    let mut log = noise.repeat(100_000);
    log.push_str("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n");
    let start = std::time::Instant::now();
    let d = orch_diagnose::diagnose(&log, &rules);
    assert_eq!(d.kind, FailureKind::CudaOom);
    println!("100k lines in {:?}", start.elapsed());
}

#[test]
fn load_with_user_layers_an_explicit_file() {
    let path = std::env::temp_dir().join(format!("orch-diagnose-test-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "rules:\n  - kind: weights_volume_full\n    priority: 99\n    patterns: ['No space left on device: .?/weights']\n    hint: free space on the weights volume\n",
    )
    .unwrap();
    let rules = Rules::load_with_user(Some(&path));
    std::fs::remove_file(&path).ok();
    let rules = rules.unwrap();
    let d = orch_diagnose::diagnose(
        "OSError: [Errno 28] No space left on device: '/weights/x'",
        &rules,
    );
    assert_eq!(d.kind.as_str(), "weights_volume_full");
    assert!(!d.kind.is_builtin());
    assert_eq!(d.hint, "free space on the weights volume");
    // The defaults are there under it.
    let d = orch_diagnose::diagnose("OSError: [Errno 28] No space left on device: '/tmp/x'", &rules);
    assert_eq!(d.kind, FailureKind::DiskFull);
    // The defaults are still there.
    assert_eq!(
        orch_diagnose::diagnose("OSError: [Errno 98] Address already in use", &rules).kind,
        FailureKind::PortInUse
    );
    let missing = Rules::load_with_user(Some(Path::new("/nonexistent/diagnose.yaml")));
    assert!(missing.is_err_and(|e| e.to_string().contains("/nonexistent/diagnose.yaml")));
}
