//! Accuracy of the rules on a folder of labelled logs.
//!
//! A log is `<kind>__<name>.log` (in any sub-folder; the sub-folder is its *split*,
//! e.g. `tune` and `holdout`), optionally with a sibling `<kind>__<name>.exit.json`
//! ([`ExitInfo`]). A first line `# source: owner/repo#N` (or a URL) names where the
//! log comes from; logs without one are their own source.
//!
//! Besides plain accuracy, the report has a *leave-one-source-out* figure: each log
//! is diagnosed again without the patterns that only logs of its own source trigger,
//! so a pattern written for one thread's wording does not count for that thread.

use crate::{
    diagnose_with_exit, diagnose_without, patterns_triggered, ExitInfo, FailureKind, Rules, UNKNOWN,
};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Why a folder could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the file name must be `<kind>__<name>.log`")]
    BadName { path: PathBuf },
    #[error("{path}: bad exit status file: {message}")]
    BadExit { path: PathBuf, message: String },
    #[error("{path}: no `*.log` file under it")]
    Empty { path: PathBuf },
}

/// One labelled log.
#[derive(Debug, Clone)]
pub struct LabelledLog {
    pub path: PathBuf,
    /// The kind its name starts with.
    pub expected: FailureKind,
    /// `# source:` line, else the file name.
    pub source: String,
    /// Sub-folder of the evaluated folder (`""` at its top).
    pub split: String,
    pub log: String,
    pub exit: Option<ExitInfo>,
}

/// Accuracy of one group of logs.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Score {
    pub logs: usize,
    pub correct: usize,
    pub accuracy: f64,
    /// Correct when each log's own-source-only patterns are removed.
    pub correct_loso: usize,
    pub accuracy_loso: f64,
}

impl Score {
    fn add(&mut self, ok: bool, ok_loso: bool) {
        self.logs += 1;
        self.correct += usize::from(ok);
        self.correct_loso += usize::from(ok_loso);
        self.accuracy = ratio(self.correct, self.logs);
        self.accuracy_loso = ratio(self.correct_loso, self.logs);
    }
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        (a as f64 / b as f64 * 10_000.0).round() / 10_000.0
    }
}

/// The diagnosis of one log.
#[derive(Debug, Clone, Serialize)]
pub struct LogResult {
    pub file: String,
    pub source: String,
    pub split: String,
    pub expected: FailureKind,
    pub got: FailureKind,
    /// The kind without the patterns only this log's source triggers.
    pub got_loso: FailureKind,
    /// The first evidence line.
    pub evidence: Option<String>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub total: Score,
    pub by_kind: BTreeMap<FailureKind, Score>,
    pub by_split: BTreeMap<String, Score>,
    pub sources: usize,
    /// Logs whose expected kind is `unknown` that were given a kind (false alarms).
    pub false_kind_on_unknown: usize,
    /// Patterns that only one source triggers: `rule id` -> patterns with that source.
    pub single_source_patterns: BTreeMap<String, Vec<(String, String)>>,
    pub misses: Vec<LogResult>,
    pub logs: Vec<LogResult>,
}

/// Read every labelled log under `dir` (recursively), sorted by path.
pub fn load_dir(dir: &Path) -> Result<Vec<LabelledLog>, EvalError> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    files.sort();
    if files.is_empty() {
        return Err(EvalError::Empty {
            path: dir.to_path_buf(),
        });
    }
    files.iter().map(|p| load_one(dir, p)).collect()
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), EvalError> {
    let read = |e| EvalError::Read {
        path: dir.to_path_buf(),
        source: e,
    };
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let path = entry.map_err(read)?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "log") {
            out.push(path);
        }
    }
    Ok(())
}

fn load_one(root: &Path, path: &Path) -> Result<LabelledLog, EvalError> {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some((expected, _)) = stem.split_once("__").filter(|(k, _)| !k.is_empty()) else {
        return Err(EvalError::BadName {
            path: path.to_path_buf(),
        });
    };
    let bytes = std::fs::read(path).map_err(|source| EvalError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let mut source = None;
    let mut body = Vec::new();
    for (i, line) in text.split_inclusive('\n').enumerate() {
        match line.trim().strip_prefix("# source:") {
            Some(s) if i == 0 => source = Some(s.trim().to_string()),
            _ => body.push(line),
        }
    }
    let exit_path = path.with_extension("exit.json");
    let exit = match std::fs::read_to_string(&exit_path) {
        Ok(t) => Some(serde_json::from_str(&t).map_err(|e| EvalError::BadExit {
            path: exit_path.clone(),
            message: e.to_string(),
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(EvalError::Read {
                path: exit_path,
                source,
            })
        }
    };
    let split = path
        .parent()
        .and_then(|p| p.strip_prefix(root).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(LabelledLog {
        path: path.to_path_buf(),
        expected: FailureKind::new(expected),
        source: source.unwrap_or_else(|| stem.clone()),
        split,
        log: body.concat(),
        exit,
    })
}

/// Diagnose every log with `rules`, and again without each source's own patterns.
pub fn evaluate(logs: &[LabelledLog], rules: &Rules) -> EvalReport {
    // Which sources trigger each pattern.
    let triggered: Vec<BTreeSet<usize>> = logs.iter().map(|l| patterns_triggered(&l.log, rules)).collect();
    let mut sources_of: BTreeMap<usize, BTreeSet<&str>> = BTreeMap::new();
    for (l, pats) in logs.iter().zip(&triggered) {
        for &p in pats {
            sources_of.entry(p).or_default().insert(&l.source);
        }
    }
    let mut own: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    let mut single_source_patterns: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (&p, srcs) in &sources_of {
        if let [only] = srcs.iter().copied().collect::<Vec<_>>()[..] {
            own.entry(only).or_default().insert(p);
            let (rule, pattern) = rules.pattern_label(p);
            single_source_patterns
                .entry(rule)
                .or_default()
                .push((pattern, only.to_string()));
        }
    }
    let mut total = Score::default();
    let mut by_kind: BTreeMap<FailureKind, Score> = BTreeMap::new();
    let mut by_split: BTreeMap<String, Score> = BTreeMap::new();
    let mut results = Vec::with_capacity(logs.len());
    let mut false_kind_on_unknown = 0;
    for l in logs {
        let d = diagnose_with_exit(&l.log, l.exit.as_ref(), rules);
        let got_loso = match own.get(l.source.as_str()) {
            None => d.kind.clone(),
            Some(skip) => diagnose_without(&l.log, l.exit.as_ref(), rules, skip).kind,
        };
        let ok = d.kind == l.expected;
        let ok_loso = got_loso == l.expected;
        if l.expected == UNKNOWN && !ok {
            false_kind_on_unknown += 1;
        }
        total.add(ok, ok_loso);
        by_kind.entry(l.expected.clone()).or_default().add(ok, ok_loso);
        by_split.entry(l.split.clone()).or_default().add(ok, ok_loso);
        results.push(LogResult {
            file: l
                .path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            source: l.source.clone(),
            split: l.split.clone(),
            expected: l.expected.clone(),
            got: d.kind,
            got_loso,
            evidence: d.evidence.into_iter().next(),
        });
    }
    let misses = results
        .iter()
        .filter(|r| r.got != r.expected || r.got_loso != r.expected)
        .cloned()
        .collect();
    let sources = logs
        .iter()
        .map(|l| l.source.as_str())
        .collect::<BTreeSet<_>>()
        .len();
    EvalReport {
        total,
        by_kind,
        by_split,
        sources,
        false_kind_on_unknown,
        single_source_patterns,
        misses,
        logs: results,
    }
}

impl EvalReport {
    /// A short table for a terminal.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let line = |name: &str, sc: &Score| {
            format!(
                "{name:<28} {:>4} {:>7.1}% {:>9.1}%\n",
                sc.logs,
                100.0 * sc.accuracy,
                100.0 * sc.accuracy_loso
            )
        };
        s.push_str(&format!(
            "{:<28} {:>4} {:>8} {:>10}\n",
            "kind", "logs", "right", "right-loso"
        ));
        for (k, sc) in &self.by_kind {
            s.push_str(&line(k.as_str(), sc));
        }
        for (k, sc) in &self.by_split {
            s.push_str(&line(
                &format!("[split {}]", if k.is_empty() { "." } else { k }),
                sc,
            ));
        }
        s.push_str(&line("[all]", &self.total));
        s.push_str(&format!("sources: {}\n", self.sources));
        for m in &self.misses {
            s.push_str(&format!(
                "miss {}: want {}, got {} (loso {}){}\n",
                m.file,
                m.expected,
                m.got,
                m.got_loso,
                m.evidence
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(expected: &str, source: &str, text: &str) -> LabelledLog {
        LabelledLog {
            path: PathBuf::from(format!("{expected}__{source}.log")),
            expected: FailureKind::new(expected),
            source: source.into(),
            split: String::new(),
            log: text.into(),
            exit: None,
        }
    }

    #[test]
    fn a_pattern_only_one_source_triggers_does_not_count_for_it() {
        let rules: Rules = r#"
rules:
  - id: a.one
    kind: a
    patterns: ['only thread one says this', 'shared wording']
"#
        .parse()
        .unwrap_or_else(|e: crate::RulesError| panic!("{e}"));
        let logs = vec![
            log("a", "s1", "error: only thread one says this"),
            log("a", "s2", "error: shared wording"),
            log("a", "s3", "error: shared wording again"),
        ];
        let r = evaluate(&logs, &rules);
        assert_eq!(r.total.correct, 3);
        assert_eq!(r.total.correct_loso, 2, "{r:#?}");
        assert_eq!(r.logs[0].got_loso, UNKNOWN);
        assert_eq!(r.single_source_patterns["a.one"].len(), 1);
        assert_eq!(r.misses.len(), 1);
    }

    #[test]
    fn unknown_given_a_kind_is_counted() {
        let rules: Rules = "rules: [{kind: a, patterns: ['boom']}]"
            .parse()
            .unwrap_or_else(|e: crate::RulesError| panic!("{e}"));
        let r = evaluate(
            &[
                log(UNKNOWN.as_str(), "s1", "boom"),
                log(UNKNOWN.as_str(), "s2", "fine"),
            ],
            &rules,
        );
        assert_eq!(r.false_kind_on_unknown, 1);
        assert_eq!(r.by_kind[&UNKNOWN].correct, 1);
    }

    #[test]
    fn load_dir_reads_names_sources_splits_and_exit_files() {
        let dir = std::env::temp_dir().join(format!("orch-diagnose-eval-{}", std::process::id()));
        let sub = dir.join("holdout");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(
            sub.join("cuda_oom__x-1.log"),
            "# source: o/r#1\nCUDA out of memory\n",
        )
        .unwrap();
        std::fs::write(sub.join("startup_timeout__y-2.log"), "INFO waiting\n").unwrap();
        std::fs::write(
            sub.join("startup_timeout__y-2.exit.json"),
            r#"{"code": null, "signal": 9, "timed_out": true}"#,
        )
        .unwrap();
        let logs = load_dir(&dir).unwrap();
        let bad = std::fs::write(dir.join("nolabel.log"), "x").map(|_| load_dir(&dir));
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(logs.len(), 2);
        assert_eq!(logs[0].source, "o/r#1");
        assert_eq!(logs[0].split, "holdout");
        assert!(!logs[0].log.contains("# source"));
        assert_eq!(logs[1].source, "startup_timeout__y-2");
        assert!(logs[1].exit.is_some_and(|e| e.timed_out));
        let r = evaluate(&logs, &Rules::default());
        assert_eq!(r.total.correct, 2, "{}", r.to_text());
        assert!(matches!(bad, Ok(Err(EvalError::BadName { .. }))));
    }
}
