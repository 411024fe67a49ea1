//! Name the cause of a failed GPU server or command (vLLM, SGLang, TGI,
//! torchrun scripts...) from its logs and exit status.
//!
//! Rules live in a data file (`rules/default.yaml`, embedded); users layer
//! their own file over it (see [`Rules::load_with_user`] and the README).
//!
//! ```
//! let rules = orch_diagnose::Rules::default();
//! let d = orch_diagnose::diagnose("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", &rules);
//! assert_eq!(d.kind, orch_diagnose::FailureKind::CudaOom);
//! ```
//!
//! ## What is where
//!
//! `Rules` (embedded `rules/default.yaml`, extended by
//! `$ORCH_DIAGNOSE_RULES` or `~/.config/orch/diagnose.yaml`), `diagnose*` → `Diagnosis
//! {kind, evidence, hint}`; ranking: error lines over warnings, priority, root cause at
//! or above the first wrapper message, later line; exit status (SIGKILL, timeout) as weak
//! evidence; a rule's `context` (needed nearby) and `unless` (a line only listing
//! possible causes does not count); every pattern matched as one regex set (lazy-DFA
//! cache raised: the default thrashes on this many patterns); a corpus of real-shaped
//! vLLM/SGLang/TGI/torchrun/NCCL logs in `tests/corpus`; `eval.rs`: accuracy (and
//! leave-one-source-out) on labelled logs, run on the real-log corpus `tests/real`
//! (excerpts of public issues, by split: `tune`, then holdouts each scored once before
//! the rules saw them). It does not: read the store.

pub mod eval;
mod rules;

pub use rules::{user_config_path, RuleFile, RuleSpec, Rules, RulesError, DEFAULT_RULES, RULES_ENV};

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::LazyLock;

/// The kinds the default rules (and the exit status) can name:
/// [`FailureKind::DIAGNOSED`]. A user rule may name others ([`FailureKind::Other`]).
pub const KINDS: &[FailureKind] = FailureKind::DIAGNOSED;

/// Kinds named from what orch, a backend or a tool reports about a cell
/// (`orch: slurm ...`, `orch: kubernetes ...`, `orch: modal ...` lines, git's
/// report on a patch), not from a workload's own log: public issue threads
/// hold no logs of them, so the real-log corpus (`tests/real`) does not
/// cover them; `tests/corpus` has files for each.
pub const BACKEND_KINDS: &[FailureKind] = &[
    FailureKind::PatchDoesNotApply,
    FailureKind::SlurmUnsatisfiable,
    FailureKind::SlurmMemoryLimit,
    FailureKind::SlurmTimeLimit,
    FailureKind::SlurmPreempted,
    FailureKind::SlurmNodeFailure,
    FailureKind::SlurmPendingTooLong,
    FailureKind::ImageBuildFailed,
    FailureKind::GpuUnavailable,
    FailureKind::SandboxTerminated,
    FailureKind::Unschedulable,
    FailureKind::ImagePullFailed,
    FailureKind::ContainerConfigError,
    FailureKind::AgentInstallFailed,
    FailureKind::AgentCrashed,
    FailureKind::Evicted,
    FailureKind::NodeLost,
    FailureKind::PendingTooLong,
    FailureKind::PodRejected,
    FailureKind::MemoryEstimateExceeded,
];

/// The kind when no rule matched.
pub const UNKNOWN: FailureKind = FailureKind::Unknown;
/// The kind of a server that did not become ready in time.
pub const STARTUP_TIMEOUT: FailureKind = FailureKind::StartupTimeout;
/// The kind of a process the kernel (or a memory cgroup) killed.
pub const HOST_OOM_KILLED: FailureKind = FailureKind::HostOomKilled;

/// Priority of the `timed_out` exit flag: specific causes in the log (>= 50) beat it.
pub const TIMEOUT_PRIORITY: u32 = 45;
/// Priority of an exit by SIGKILL (137) without a timeout.
pub const KILLED_PRIORITY: u32 = 35;

/// Most evidence lines kept.
pub const MAX_EVIDENCE: usize = 5;
/// Longest evidence line kept (characters).
const MAX_LINE: usize = 400;
/// How far below the winning line to look for the exception line.
const EXCEPTION_LOOKAHEAD: usize = 40;

/// The line orch writes into a server's log when it gives up waiting for it.
pub fn not_ready_message(secs: u64) -> String {
    format!("orch: server not ready after {secs}s")
}

/// A named cause of failure: the shape records keep (`orch-record`'s), and its kind.
pub use orch_record::{Diagnosis, FailureKind};

/// How the process ended, when known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code (`137` = 128 + SIGKILL as a shell reports it; `-9` as Python reports it).
    pub code: Option<i32>,
    /// Terminating signal.
    pub signal: Option<i32>,
    /// orch gave up waiting (server never became ready, command ran past its limit).
    pub timed_out: bool,
}

impl ExitInfo {
    /// Ended by SIGKILL.
    pub fn killed(&self) -> bool {
        self.signal == Some(9) || matches!(self.code, Some(137) | Some(-9))
    }

    fn describe(&self) -> String {
        match (self.signal, self.code) {
            (Some(s), _) => format!(
                "exit: killed by signal {s}{}",
                if s == 9 { " (SIGKILL)" } else { "" }
            ),
            (None, Some(c)) => format!(
                "exit: status {c}{}",
                if self.killed() { " (SIGKILL)" } else { "" }
            ),
            (None, None) => "exit: unknown status".to_string(),
        }
    }
}

/// Diagnose one log (stdout and stderr together, or either).
pub fn diagnose(log: &str, rules: &Rules) -> Diagnosis {
    diagnose_with_exit(log, None, rules)
}

/// Diagnose a process from its stdout, its stderr and how it ended.
pub fn diagnose_output(stdout: &str, stderr: &str, exit: Option<&ExitInfo>, rules: &Rules) -> Diagnosis {
    let mut log = String::with_capacity(stdout.len() + stderr.len() + 1);
    log.push_str(stdout);
    if !stdout.is_empty() && !stdout.ends_with('\n') {
        log.push('\n');
    }
    log.push_str(stderr);
    diagnose_with_exit(&log, exit, rules)
}

/// Rank of a hit: the greatest wins. Strong (not on an INFO/WARNING line, or a rule
/// that counts those), then priority, then at or above the first wrapper line,
/// then the later line (closest to the failure).
type Key = (bool, u32, bool, usize);

#[derive(Debug)]
struct Hit {
    rule: Option<usize>,
    kind: FailureKind,
    line: usize,
    key: Key,
    /// The context line that let a rule with `context` count.
    context_line: Option<usize>,
    /// Evidence for hits that are not log lines (exit status).
    text: Option<String>,
    /// The line joined with the next, when only that matched (a wrapped paste).
    joined: Option<String>,
}

static ANSI: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern, covered by tests.
    Regex::new(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07").expect("valid ANSI pattern")
});

static EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern, covered by tests: `ValueError: ...`, `torch.OutOfMemoryError: ...`,
    // after a `(EngineCore pid=1)` or `[... TP0]` prefix.
    Regex::new(concat!(
        r"^(?:\([^)]*\)\s*)?",                                            // (EngineCore_0 pid=1)
        r"(?:(?:ERROR|CRITICAL)\s+\d\d-\d\d [\d:]+ \[?[\w.]+:\d+\]\s+)?", // vLLM log prefix
        r"(?:\[[^\]]*\]:?\s*)?",                                          // [rank0]: or [2025-01-01 TP0]
        r"(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit)\b:?",
    ))
    .expect("valid exception pattern")
});

static ERRORISH: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern, covered by tests.
    Regex::new(
        r"(?i)(?:error|exception)\b|\b(?:traceback|fatal|failed|failure|panic(?:ked)?|abort(?:ed)?|killed)\b",
    )
    .expect("valid error pattern")
});

static PASTE_PREFIX: LazyLock<Regex> = LazyLock::new(|| {
    // A constant pattern, covered by tests: what pastes and log collectors put before a
    // log line: a rich/ASCII table border (`│ `), a markdown quote (`> `), a
    // `docker compose` service column (`vllm-1  | `).
    Regex::new(r"^(?:[│┃║]\s*|>\s+|[A-Za-z][\w.-]*-\d+\s+\|\s)").expect("valid paste prefix pattern")
});

/// A line pasted from a terminal is often cut at the terminal's width and continued on
/// the next line; lines at least this long are also matched joined with the next one.
const WRAP_MIN: usize = 60;

fn strip_paste(s: &str) -> &str {
    let mut t = s.trim().trim_end_matches(['│', '┃', '║']).trim_end();
    if let Some(m) = PASTE_PREFIX.find(t) {
        t = t[m.end()..].trim_start();
    }
    t
}

fn clean_line(l: &str) -> Cow<'_, str> {
    if l.contains('\x1b') {
        let plain = ANSI.replace_all(l, "");
        Cow::Owned(strip_paste(&plain).to_string())
    } else {
        Cow::Borrowed(strip_paste(l))
    }
}

fn clean_lines(log: &str) -> Vec<Cow<'_, str>> {
    log.split(['\n', '\r']).map(clean_line).collect()
}

/// One pattern match: on line `line` alone, or (`joined`) on that line joined with the next.
struct PatternHit {
    line: usize,
    pattern: usize,
    joined: bool,
}

/// Every pattern match of `rules` in `lines`: each non-empty line alone, and each long
/// line joined with the next one for the patterns that neither matches alone.
fn pattern_matches(lines: &[Cow<'_, str>], rules: &Rules) -> Vec<PatternHit> {
    let mut out = Vec::new();
    let mut next: Option<Vec<usize>> = None;
    for i in 0..lines.len() {
        let here = match next.take() {
            Some(m) => m,
            None if lines[i].is_empty() => Vec::new(),
            None => rules.matching_patterns(&lines[i]),
        };
        for &p in &here {
            out.push(PatternHit {
                line: i,
                pattern: p,
                joined: false,
            });
        }
        let following = match lines.get(i + 1) {
            Some(l) if !l.is_empty() => rules.matching_patterns(l),
            _ => Vec::new(),
        };
        if lines[i].chars().count() >= WRAP_MIN && lines.get(i + 1).is_some_and(|l| !l.is_empty()) {
            let joined = format!("{}{}", lines[i], lines[i + 1]);
            for p in rules.matching_patterns(&joined) {
                if !here.contains(&p) && !following.contains(&p) {
                    out.push(PatternHit {
                        line: i,
                        pattern: p,
                        joined: true,
                    });
                }
            }
        }
        next = Some(following);
    }
    out
}

/// Global indices of the patterns of `rules` that match somewhere in `log` (alone or
/// across a wrapped line), ignoring `context`. The evaluation uses it to find the
/// patterns that only one source triggers.
pub fn patterns_triggered(log: &str, rules: &Rules) -> std::collections::BTreeSet<usize> {
    let lines = clean_lines(log);
    pattern_matches(&lines, rules)
        .into_iter()
        .map(|h| h.pattern)
        .collect()
}

fn evidence_line(line: &str) -> String {
    if line.chars().count() > MAX_LINE {
        let mut s: String = line.chars().take(MAX_LINE).collect();
        s.push('…');
        s
    } else {
        line.to_string()
    }
}

/// Diagnose one log and how its process ended.
pub fn diagnose_with_exit(log: &str, exit: Option<&ExitInfo>, rules: &Rules) -> Diagnosis {
    diagnose_without(log, exit, rules, &std::collections::BTreeSet::new())
}

/// [`diagnose_with_exit`] as if the patterns of the given global indices (see
/// [`patterns_triggered`]) were not in `rules`: the evaluation's leave-one-source-out.
pub fn diagnose_without(
    log: &str,
    exit: Option<&ExitInfo>,
    rules: &Rules,
    skip: &std::collections::BTreeSet<usize>,
) -> Diagnosis {
    let lines = clean_lines(log);
    let n = lines.len();
    let failure_point = lines
        .iter()
        .position(|l| !l.is_empty() && rules.is_wrapper(l))
        .unwrap_or(n);
    let is_demoted = |l: &str| rules.demote.iter().any(|d| d.is_match(l));

    let mut hits: Vec<Hit> = Vec::new();
    let mut demoted: Vec<Option<bool>> = vec![None; n];
    let mut seen: std::collections::BTreeSet<(usize, usize)> = std::collections::BTreeSet::new();
    for m in pattern_matches(&lines, rules) {
        if skip.contains(&m.pattern) {
            continue;
        }
        let (r, _) = rules.pattern_owner(m.pattern);
        // One hit per rule and line.
        if !seen.insert((r, m.line)) {
            continue;
        }
        let rule = &rules.rules[r];
        let line = &lines[m.line];
        // `unless` sees the text the pattern matched: the line, or it joined with the next.
        if !rule.unless.is_empty() {
            let text: Cow<'_, str> = if m.joined {
                let next = lines.get(m.line + 1).map(|l| l.as_ref()).unwrap_or("");
                Cow::Owned(format!("{line}{next}"))
            } else {
                Cow::Borrowed(line.as_ref())
            };
            if rule.unless.iter().any(|u| u.is_match(&text)) {
                continue;
            }
        }
        let weak = !rule.match_warnings && *demoted[m.line].get_or_insert_with(|| is_demoted(line));
        hits.push(Hit {
            rule: Some(r),
            kind: rule.kind.clone(),
            line: m.line,
            key: (!weak, rule.priority, m.line <= failure_point, m.line),
            context_line: None,
            text: None,
            joined: m.joined.then(|| {
                format!(
                    "{}{}",
                    lines[m.line],
                    lines.get(m.line + 1).map(|l| l.as_ref()).unwrap_or("")
                )
            }),
        });
    }

    // Rules with `context` count only where a context line is near enough.
    let mut context_cache: Vec<Option<Vec<usize>>> = vec![None; rules.rules.len()];
    hits.retain_mut(|h| {
        let Some(r) = h.rule else { return true };
        let rule = &rules.rules[r];
        if rule.context.is_empty() {
            return true;
        }
        let ctx = context_cache[r].get_or_insert_with(|| {
            lines
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_empty() && rule.context.iter().any(|c| c.is_match(l)))
                .map(|(i, _)| i)
                .collect()
        });
        let nearest = ctx.iter().copied().min_by_key(|&c| c.abs_diff(h.line));
        match nearest {
            Some(c) if rule.within.is_none_or(|w| c.abs_diff(h.line) <= w) => {
                h.context_line = (c != h.line).then_some(c);
                true
            }
            _ => false,
        }
    });

    if let Some(exit) = exit {
        let synthetic = if exit.timed_out {
            Some((
                STARTUP_TIMEOUT,
                TIMEOUT_PRIORITY,
                "exit: timed out waiting (orch gave up)".to_string(),
            ))
        } else if exit.killed() {
            Some((HOST_OOM_KILLED, KILLED_PRIORITY, exit.describe()))
        } else {
            None
        };
        if let Some((kind, priority, text)) = synthetic {
            hits.push(Hit {
                rule: None,
                kind,
                line: n,
                key: (true, priority, true, n),
                context_line: None,
                text: Some(text),
                joined: None,
            });
        }
    }

    let Some(best) = hits.iter().max_by_key(|h| h.key) else {
        return unknown(&lines, &is_demoted, rules);
    };
    let kind = best.kind.clone();
    let hint = match best.rule {
        Some(r) => rules.rule_hint(&rules.rules[r]),
        None => rules
            .hint_for(&kind)
            .map(str::to_string)
            .unwrap_or_else(|| format!("no hint is written for `{kind}`: read the evidence lines")),
    };

    let mut ours: Vec<&Hit> = hits.iter().filter(|h| h.kind == kind).collect();
    // Log lines first (strongest first), then what the exit status says.
    ours.sort_by(|a, b| {
        (a.text.is_none(), a.key)
            .cmp(&(b.text.is_none(), b.key))
            .reverse()
    });
    let text_of = |h: &Hit| match (&h.text, &h.joined) {
        (Some(t), _) => t.clone(),
        (None, Some(j)) => evidence_line(j),
        (None, None) => evidence_line(&lines[h.line]),
    };
    let mut evidence: Vec<String> = Vec::new();
    let add = |s: String, evidence: &mut Vec<String>| {
        if evidence.len() < MAX_EVIDENCE && !s.is_empty() && !evidence.contains(&s) {
            evidence.push(s);
        }
    };
    let first = ours[0];
    add(text_of(first), &mut evidence);
    if let Some(c) = first.context_line {
        add(evidence_line(&lines[c]), &mut evidence);
    }
    if first.text.is_none() && !EXCEPTION.is_match(&lines[first.line]) {
        let end = (first.line + 1 + EXCEPTION_LOOKAHEAD).min(n);
        let exception = lines[first.line + 1..end]
            .iter()
            .take_while(|l| !rules.is_wrapper(l))
            .find(|l| EXCEPTION.is_match(l));
        if let Some(l) = exception {
            add(evidence_line(l), &mut evidence);
        }
    }
    for h in &ours[1..] {
        add(text_of(h), &mut evidence);
    }
    if kind == STARTUP_TIMEOUT {
        if let Some(last) = lines.iter().rev().find(|l| !l.is_empty()) {
            add(format!("last log line: {}", evidence_line(last)), &mut evidence);
        }
    }
    Diagnosis { kind, evidence, hint }
}

fn unknown(lines: &[Cow<'_, str>], is_demoted: &dyn Fn(&str) -> bool, rules: &Rules) -> Diagnosis {
    // The last exception above the first wrapper (the likely root cause), the
    // wrapper, then the last error-looking lines in order.
    let wrapper = lines.iter().position(|l| !l.is_empty() && rules.is_wrapper(l));
    let above = &lines[..wrapper.unwrap_or(lines.len())];
    let mut evidence: Vec<String> = Vec::new();
    let add = |l: &str, evidence: &mut Vec<String>| {
        let l = evidence_line(l);
        if evidence.len() < MAX_EVIDENCE && !evidence.contains(&l) {
            evidence.push(l);
        }
    };
    if let Some(l) = above
        .iter()
        .rev()
        .find(|l| EXCEPTION.is_match(l) && !is_demoted(l))
    {
        add(l, &mut evidence);
    }
    if let Some(w) = wrapper {
        add(&lines[w], &mut evidence);
    }
    let mut tail: Vec<&str> = Vec::new();
    for l in lines.iter().rev() {
        if evidence.len() + tail.len() >= MAX_EVIDENCE {
            break;
        }
        let l = l.as_ref();
        let code = l.starts_with("raise ") || l.starts_with("File \"");
        if !l.is_empty()
            && !code
            && ERRORISH.is_match(l)
            && !is_demoted(l)
            && !tail.contains(&l)
            && !evidence.iter().any(|e| e == l)
        {
            tail.push(l);
        }
    }
    if evidence.is_empty() && tail.is_empty() {
        tail = lines
            .iter()
            .rev()
            .filter(|l| !l.is_empty())
            .take(3)
            .map(|l| l.as_ref())
            .collect();
    }
    for l in tail.into_iter().rev() {
        add(l, &mut evidence);
    }
    Diagnosis {
        kind: UNKNOWN,
        evidence,
        hint: rules.hint_for(&UNKNOWN).map(str::to_string).unwrap_or_else(|| {
            "no known cause found: read the evidence lines and the whole log; add a rule for it".to_string()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rules_parse_and_cover_every_kind() {
        let rules = Rules::default();
        let kinds = rules.kinds();
        for k in KINDS {
            if *k != UNKNOWN {
                assert!(kinds.contains(&k), "no default rule yields {k}");
            }
            let hint = rules.hint_for(k).unwrap_or_else(|| panic!("no hint for {k}"));
            assert!(
                hint.chars().next().is_some_and(|c| !c.is_uppercase()),
                "hint of {k} must start lowercase: {hint}"
            );
        }
        for k in &kinds {
            assert!(KINDS.contains(k), "default rules yield unlisted kind {k}");
        }
        for r in &rules.rules {
            if let Some(h) = &r.hint {
                assert!(h.chars().next().is_some_and(|c| !c.is_uppercase()), "{h}");
            }
        }
    }

    #[test]
    fn constant_patterns_compile() {
        assert!(EXCEPTION.is_match("torch.OutOfMemoryError: CUDA out of memory."));
        assert!(EXCEPTION.is_match("(EngineCore_0 pid=12) ValueError: x"));
        assert!(!EXCEPTION.is_match("INFO 12-01 loading"));
        assert!(EXCEPTION.is_match("[rank1]: AssertionError: x"));
        assert!(EXCEPTION.is_match("ERROR 12-26 19:25:14 [core.py:396] KeyError: 'x'"));
        assert!(EXCEPTION.is_match("ERROR 07-02 14:10:05 multiproc_worker_utils.py:226] RuntimeError: x"));
        assert!(ERRORISH.is_match("RuntimeError: boom"));
        assert_eq!(ANSI.replace_all("\x1b[1;31mERROR\x1b[0m x", ""), "ERROR x");
    }

    #[test]
    fn wrapper_alone_is_unknown_with_evidence() {
        let log = "INFO starting\nRuntimeError: Engine core initialization failed. See root cause above.\n";
        let d = diagnose(log, &Rules::default());
        assert_eq!(d.kind, UNKNOWN);
        assert!(d.evidence[0].contains("Engine core initialization failed"));
    }

    #[test]
    fn exit_info_alone() {
        let rules = Rules::default();
        let t = ExitInfo {
            timed_out: true,
            ..Default::default()
        };
        assert_eq!(diagnose_with_exit("", Some(&t), &rules).kind, STARTUP_TIMEOUT);
        let k = ExitInfo {
            code: Some(137),
            ..Default::default()
        };
        let d = diagnose_with_exit("", Some(&k), &rules);
        assert_eq!(d.kind, HOST_OOM_KILLED);
        assert_eq!(d.evidence, vec!["exit: status 137 (SIGKILL)".to_string()]);
        // Killed because orch timed out: a timeout, not the OOM killer.
        let both = ExitInfo {
            signal: Some(9),
            timed_out: true,
            ..Default::default()
        };
        assert_eq!(diagnose_with_exit("", Some(&both), &rules).kind, STARTUP_TIMEOUT);
        // A specific cause in the log beats the timeout.
        let log = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.";
        assert_eq!(
            diagnose_with_exit(log, Some(&t), &rules).kind,
            FailureKind::CudaOom
        );
        assert_eq!(
            diagnose_with_exit(&not_ready_message(600), None, &rules).kind,
            STARTUP_TIMEOUT
        );
    }

    #[test]
    fn stdout_and_stderr() {
        let d = diagnose_output(
            "INFO: Started server process [1]",
            "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
            None,
            &Rules::default(),
        );
        assert_eq!(d.kind, FailureKind::PortInUse);
    }

    #[test]
    fn json_shape() {
        let d = Diagnosis {
            kind: FailureKind::CudaOom,
            evidence: vec!["a".into()],
            hint: "h".into(),
        };
        assert_eq!(
            serde_json::to_string(&d).unwrap_or_default(),
            r#"{"kind":"cuda_oom","evidence":["a"],"hint":"h"}"#
        );
    }

    #[test]
    fn user_rules_extend_replace_and_disable() {
        let mut rules = Rules::default();
        let before = rules.len();
        let user: Rules = r#"
hints:
  disk_full: free space on the volume holding the weights
rules:
  - kind: disk_full
    priority: 70
    patterns: ['No space left on device']
  - id: port_in_use.errno98
    kind: port_in_use
    patterns: ['this replaces the errno 98 rule']
  - id: cuda_oom.torch
    disabled: true
"#
        .parse()
        .unwrap_or_else(|e: RulesError| panic!("{e}"));
        rules.extend(user);
        assert_eq!(rules.len(), before);
        let d = diagnose(
            "OSError: [Errno 28] No space left on device: '/root/.cache'",
            &rules,
        );
        assert_eq!(d.kind, FailureKind::DiskFull);
        assert_eq!(d.hint, "free space on the volume holding the weights");
        assert_eq!(
            diagnose("OSError: [Errno 98] Address already in use", &rules).kind,
            UNKNOWN
        );
    }

    #[test]
    fn bad_rules_are_errors() {
        let e = "rules: [{kind: x, patterns: ['(unclosed']}]"
            .parse::<Rules>()
            .err();
        assert!(matches!(e, Some(RulesError::Regex { .. })), "{e:?}");
        let e = "rules: [{kind: Bad, patterns: ['x']}]".parse::<Rules>().err();
        assert!(matches!(e, Some(RulesError::Invalid { .. })), "{e:?}");
        let e = "rules: [{kind: x, patterns: ['x'], colour: red}]"
            .parse::<Rules>()
            .err();
        assert!(matches!(e, Some(RulesError::Parse { .. })), "{e:?}");
        let e = Rules::from_path(std::path::Path::new("/nonexistent/rules.yaml")).err();
        assert!(e.is_some_and(|e| e.to_string().contains("/nonexistent/rules.yaml")));
    }

    #[test]
    fn json_rule_files_work() {
        let r: Rules = r#"{"rules": [{"kind": "x_y", "patterns": ["boom"], "hint": "stop `it`"}]}"#
            .parse()
            .unwrap_or_else(|e: RulesError| panic!("{e}"));
        assert_eq!(diagnose("Boom", &r).kind.as_str(), "x_y");
    }

    #[test]
    fn unless_drops_a_hit_on_a_line_that_only_lists_possible_causes() {
        let ray = "The actor is dead. There are some potential root causes. (1) The process is \
                   killed by SIGKILL by OOM killer due to high memory usage.";
        assert_eq!(diagnose(ray, &Rules::default()).kind, UNKNOWN);
        assert_eq!(
            diagnose(
                "kernel: Out of memory: Killed process 4242 (python)",
                &Rules::default()
            )
            .kind,
            FailureKind::HostOomKilled
        );
        let r: Rules = "rules:\n  - {kind: x_y, patterns: [boom], unless: ['maybe']}\n"
            .parse()
            .unwrap_or_else(|e: RulesError| panic!("{e}"));
        assert_eq!(diagnose("boom", &r).kind.as_str(), "x_y");
        assert_eq!(diagnose("maybe boom", &r).kind, UNKNOWN);
    }
}
