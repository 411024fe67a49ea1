//! Rule files: parsing, validation, regex compilation and layering.

use crate::FailureKind;
use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The default rules, embedded in the binary.
pub const DEFAULT_RULES: &str = include_str!("../rules/default.yaml");

/// Environment variable naming a user rule file layered over the defaults.
pub const RULES_ENV: &str = "ORCH_DIAGNOSE_RULES";

/// Priority of a rule that does not say.
pub const DEFAULT_PRIORITY: u32 = 50;

/// Size limit of one compiled pattern (bytes), well above what the defaults need.
const REGEX_SIZE_LIMIT: usize = 4 << 20;
/// Upper bound of a regex set's lazy DFA cache (see `Rules::reindex`).
const DFA_CACHE_LIMIT: usize = 256 << 20;

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read rules file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{origin}: rule `{rule}`: bad regex `{pattern}`: {message}")]
    Regex {
        origin: String,
        rule: String,
        pattern: String,
        message: String,
    },
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
}

/// A rule file as written (YAML; JSON is valid YAML too).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    /// Hint per kind, used by rules that carry no `hint` of their own.
    #[serde(default)]
    pub hints: BTreeMap<String, String>,
    /// Lines that only report that something failed elsewhere (never a cause).
    #[serde(default)]
    pub wrappers: Vec<String>,
    /// Log-level prefixes of lines that are not errors (INFO, WARNING...):
    /// a rule matching only such lines loses to any rule matching an error line.
    #[serde(default)]
    pub demote: Vec<String>,
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
}

/// One rule as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Name of the rule; a later file's rule with the same id replaces it.
    #[serde(default)]
    pub id: Option<String>,
    /// The diagnosis this rule yields (`[a-z][a-z0-9_]*`).
    #[serde(default)]
    pub kind: String,
    /// Higher wins; see the README for the bands the defaults use.
    #[serde(default = "default_priority")]
    pub priority: u32,
    /// Regexes; a line matching any of them is a hit.
    #[serde(default)]
    pub patterns: Vec<String>,
    /// Regexes of which one must match some line (within `within` lines of the hit, when set).
    #[serde(default)]
    pub context: Vec<String>,
    #[serde(default)]
    pub within: Option<usize>,
    /// Regexes: a hit whose line matches one of them does not count (a line that only
    /// lists possible causes, such as Ray's "There are some potential root causes").
    #[serde(default)]
    pub unless: Vec<String>,
    /// Patterns are case-insensitive unless this is set.
    #[serde(default)]
    pub case_sensitive: bool,
    /// Hits on INFO/WARNING lines count in full (the message is never harmless).
    #[serde(default)]
    pub match_warnings: bool,
    /// With an `id`: remove the earlier rule of that id.
    #[serde(default)]
    pub disabled: bool,
    /// What to do; defaults to the file's `hints` entry for the kind.
    #[serde(default)]
    pub hint: Option<String>,
}

fn default_priority() -> u32 {
    DEFAULT_PRIORITY
}

#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub id: Option<String>,
    pub kind: FailureKind,
    pub priority: u32,
    pub set: RegexSet,
    pub patterns: Vec<String>,
    pub case_sensitive: bool,
    pub context: Vec<Regex>,
    pub within: Option<usize>,
    pub unless: Vec<Regex>,
    pub match_warnings: bool,
    pub hint: Option<String>,
}

/// Compiled diagnosis rules. Build once, use for many logs.
#[derive(Debug, Clone)]
pub struct Rules {
    pub(crate) rules: Vec<Rule>,
    pub(crate) hints: BTreeMap<String, String>,
    pub(crate) wrappers: Vec<Regex>,
    pub(crate) demote: Vec<Regex>,
    /// Ids of `disabled` rules, removed from the rules this file extends.
    pub(crate) removed: Vec<String>,
    /// Every rule's patterns in one set, so that a line is scanned once; `None` when
    /// too big to build (rules are then tried one by one).
    pub(crate) all: Option<RegexSet>,
    /// Global pattern index -> (rule index, pattern index within the rule).
    pub(crate) owner: Vec<(usize, usize)>,
    /// Rule index -> its first global pattern index.
    pub(crate) first_pattern: Vec<usize>,
    /// The wrappers in one set, when it builds.
    pub(crate) wrapper_set: Option<RegexSet>,
}

impl Default for Rules {
    /// The embedded default rules.
    fn default() -> Self {
        // The embedded file is fixed at build time and a test proves it compiles.
        Rules::parse(DEFAULT_RULES, "default rules").expect("embedded default rules are valid")
    }
}

impl FromStr for Rules {
    type Err = RulesError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Rules::parse(text, "rules")
    }
}

impl Rules {
    /// Rules with nothing in them (every log is `unknown`).
    pub fn empty() -> Self {
        Rules {
            rules: Vec::new(),
            hints: BTreeMap::new(),
            wrappers: Vec::new(),
            demote: Vec::new(),
            removed: Vec::new(),
            all: None,
            owner: Vec::new(),
            first_pattern: Vec::new(),
            wrapper_set: None,
        }
    }

    /// Parse and compile a rule file; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, RulesError> {
        let file: RuleFile = serde_saphyr::from_str(text).map_err(|e| RulesError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        Rules::compile(&file, origin)
    }

    /// Read and compile a rule file.
    pub fn from_path(path: &Path) -> Result<Self, RulesError> {
        let text = std::fs::read_to_string(path).map_err(|source| RulesError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Rules::parse(&text, &path.display().to_string())
    }

    /// Compile a rule file already parsed.
    pub fn compile(file: &RuleFile, origin: &str) -> Result<Self, RulesError> {
        let invalid = |message: String| RulesError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let mut rules = Vec::with_capacity(file.rules.len());
        for (n, spec) in file.rules.iter().enumerate() {
            let name = spec
                .id
                .clone()
                .unwrap_or_else(|| format!("#{} ({})", n + 1, spec.kind));
            if spec.disabled {
                if spec.id.is_none() {
                    return Err(invalid(format!("rule {name}: `disabled` needs an `id`")));
                }
                // Kept as a tombstone: `extend` removes the earlier rule of that id.
                rules.push((spec.clone(), None));
                continue;
            }
            if !valid_kind(&spec.kind) {
                return Err(invalid(format!(
                    "rule {name}: kind `{}` must be lowercase letters, digits and `_`",
                    spec.kind
                )));
            }
            if spec.patterns.is_empty() {
                return Err(invalid(format!("rule {name}: `patterns` is empty")));
            }
            let regex_err = |pattern: &str, e: regex::Error| RulesError::Regex {
                origin: origin.to_string(),
                rule: name.clone(),
                pattern: pattern.to_string(),
                message: e.to_string(),
            };
            for p in spec.patterns.iter().chain(&spec.context).chain(&spec.unless) {
                build_regex(p, !spec.case_sensitive).map_err(|e| regex_err(p, e))?;
            }
            let set = RegexSetBuilder::new(&spec.patterns)
                .case_insensitive(!spec.case_sensitive)
                .size_limit(REGEX_SIZE_LIMIT * spec.patterns.len())
                .build()
                .map_err(|e| regex_err(&spec.patterns.join(" | "), e))?;
            let context = spec
                .context
                .iter()
                .map(|p| build_regex(p, !spec.case_sensitive).map_err(|e| regex_err(p, e)))
                .collect::<Result<Vec<_>, _>>()?;
            let unless = spec
                .unless
                .iter()
                .map(|p| build_regex(p, !spec.case_sensitive).map_err(|e| regex_err(p, e)))
                .collect::<Result<Vec<_>, _>>()?;
            rules.push((
                spec.clone(),
                Some(Rule {
                    id: spec.id.clone(),
                    kind: FailureKind::new(&spec.kind),
                    priority: spec.priority,
                    set,
                    patterns: spec.patterns.clone(),
                    case_sensitive: spec.case_sensitive,
                    context,
                    within: spec.within,
                    unless,
                    match_warnings: spec.match_warnings,
                    hint: spec.hint.clone(),
                }),
            ));
        }
        let list = |what: &str, patterns: &[String]| {
            patterns
                .iter()
                .map(|p| {
                    build_regex(p, true).map_err(|e| RulesError::Regex {
                        origin: origin.to_string(),
                        rule: what.to_string(),
                        pattern: p.clone(),
                        message: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        for kind in file.hints.keys() {
            if !valid_kind(kind) {
                return Err(invalid(format!(
                    "hints: kind `{kind}` must be lowercase letters, digits and `_`"
                )));
            }
        }
        let mut out = Rules {
            rules: Vec::new(),
            hints: file.hints.clone(),
            wrappers: list("wrappers", &file.wrappers)?,
            demote: list("demote", &file.demote)?,
            removed: Vec::new(),
            all: None,
            owner: Vec::new(),
            first_pattern: Vec::new(),
            wrapper_set: None,
        };
        for (spec, rule) in rules {
            match (rule, spec.id) {
                (Some(rule), _) => out.push(rule),
                (None, Some(id)) => {
                    out.remove_id(&id);
                    out.removed.push(id);
                }
                (None, None) => {}
            }
        }
        out.reindex();
        Ok(out)
    }

    fn remove_id(&mut self, id: &str) {
        self.rules.retain(|r| r.id.as_deref() != Some(id));
    }

    fn push(&mut self, rule: Rule) {
        if let Some(id) = rule.id.as_deref() {
            if let Some(old) = self.rules.iter_mut().find(|r| r.id.as_deref() == Some(id)) {
                *old = rule;
                return;
            }
        }
        self.rules.push(rule);
    }

    /// Layer `other` over these rules: its `disabled` ids are removed, its rules
    /// are added (a rule with the id of an existing one replaces it), its hints override, its wrappers and demote
    /// patterns are added.
    pub fn extend(&mut self, other: Rules) {
        for id in &other.removed {
            self.remove_id(id);
        }
        self.removed.extend(other.removed);
        for rule in other.rules {
            self.push(rule);
        }
        self.hints.extend(other.hints);
        self.wrappers.extend(other.wrappers);
        self.demote.extend(other.demote);
        self.reindex();
    }

    fn reindex(&mut self) {
        let mut patterns = Vec::new();
        self.owner.clear();
        self.first_pattern.clear();
        for (r, rule) in self.rules.iter().enumerate() {
            self.first_pattern.push(patterns.len());
            for (i, p) in rule.patterns.iter().enumerate() {
                patterns.push(if rule.case_sensitive {
                    format!("(?:{p})")
                } else {
                    format!("(?i:{p})")
                });
                self.owner.push((r, i));
            }
        }
        self.all = RegexSetBuilder::new(&patterns)
            .size_limit(REGEX_SIZE_LIMIT * patterns.len().max(1))
            // The lazy DFA of hundreds of case-insensitive patterns outgrows the default
            // cache (2 MiB) and then falls back to the NFA: 1.3 ms a line instead of 20 µs
            // (20,000 log lines: 26 s against 0.4 s). A limit, not an allocation: a log of
            // ordinary lines grows it to tens of MiB.
            .dfa_size_limit(DFA_CACHE_LIMIT)
            .build()
            .ok();
        self.wrapper_set = RegexSetBuilder::new(self.wrappers.iter().map(|w| w.as_str()))
            .case_insensitive(true)
            .size_limit(REGEX_SIZE_LIMIT * self.wrappers.len().max(1))
            .dfa_size_limit(DFA_CACHE_LIMIT)
            .build()
            .ok();
    }

    /// Global indices of the patterns (of every rule) that match `line`, ascending.
    pub(crate) fn matching_patterns(&self, line: &str) -> Vec<usize> {
        match &self.all {
            Some(set) => set.matches(line).into_iter().collect(),
            None => self
                .rules
                .iter()
                .enumerate()
                .flat_map(|(r, rule)| {
                    let first = self.first_pattern[r];
                    rule.set.matches(line).into_iter().map(move |i| first + i)
                })
                .collect(),
        }
    }

    /// The pattern of global index `g`: (rule index, pattern index within the rule).
    pub(crate) fn pattern_owner(&self, g: usize) -> (usize, usize) {
        self.owner[g]
    }

    /// `(rule id or kind, pattern)` of global pattern `g`, for reports.
    pub fn pattern_label(&self, g: usize) -> (String, String) {
        let (r, i) = self.owner[g];
        let rule = &self.rules[r];
        (
            rule.id.clone().unwrap_or_else(|| rule.kind.to_string()),
            rule.patterns[i].clone(),
        )
    }

    pub(crate) fn is_wrapper(&self, line: &str) -> bool {
        match &self.wrapper_set {
            Some(set) => set.is_match(line),
            None => self.wrappers.iter().any(|w| w.is_match(line)),
        }
    }

    /// Remove every rule of id `id` (as a file's `disabled: true` rule does).
    pub fn disable(&mut self, id: &str) {
        self.remove_id(id);
        self.reindex();
    }

    /// The defaults, then the user's file (`$ORCH_DIAGNOSE_RULES`, else
    /// `$XDG_CONFIG_HOME/orch/diagnose.yaml`, else `~/.config/orch/diagnose.yaml`,
    /// when present), then `path` when given. A file named by the variable or by
    /// `path` must exist.
    pub fn load_with_user(path: Option<&Path>) -> Result<Self, RulesError> {
        let mut rules = Rules::default();
        match std::env::var_os(RULES_ENV).filter(|v| !v.is_empty()) {
            Some(p) => rules.extend(Rules::from_path(Path::new(&p))?),
            None => {
                if let Some(p) = user_config_path().filter(|p| p.is_file()) {
                    rules.extend(Rules::from_path(&p)?);
                }
            }
        }
        if let Some(p) = path {
            rules.extend(Rules::from_path(p)?);
        }
        Ok(rules)
    }

    /// Kinds that some rule yields, sorted.
    pub fn kinds(&self) -> Vec<&FailureKind> {
        let mut kinds: Vec<&FailureKind> = self.rules.iter().map(|r| &r.kind).collect();
        kinds.sort_unstable();
        kinds.dedup();
        kinds
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The hint of `kind` from the `hints` table.
    pub fn hint_for(&self, kind: &FailureKind) -> Option<&str> {
        self.hints.get(kind.as_str()).map(String::as_str)
    }

    pub(crate) fn rule_hint(&self, rule: &Rule) -> String {
        rule.hint
            .clone()
            .or_else(|| self.hints.get(rule.kind.as_str()).cloned())
            .unwrap_or_else(|| format!("no hint is written for `{}`: read the evidence lines", rule.kind))
    }
}

/// `~/.config/orch/diagnose.yaml` (or under `$XDG_CONFIG_HOME`).
pub fn user_config_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".config"),
    };
    Some(base.join("orch").join("diagnose.yaml"))
}

fn build_regex(pattern: &str, case_insensitive: bool) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
}

fn valid_kind(kind: &str) -> bool {
    let mut chars = kind.chars();
    matches!(chars.next(), Some('a'..='z'))
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl orch_protocol::ErrorClass for RulesError {
    fn is_user_error(&self) -> bool {
        // A rules file the user wrote: its path and line are in the message.
        true
    }
}
