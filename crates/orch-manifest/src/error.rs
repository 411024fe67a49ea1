//! Manifest errors: every one names the file, and where it can the line and
//! column, and says what to do next.

use std::fmt;
use std::path::PathBuf;

/// Where in a manifest something is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: u64,
    pub column: u64,
}

impl Pos {
    pub(crate) fn from_loc(l: serde_saphyr::Location) -> Option<Pos> {
        (l.line() > 0).then(|| Pos {
            line: l.line(),
            column: l.column(),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read `{}`: {source}\nhint: check the path given to `-f`", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// The manifest is wrong: the user's to fix.
    #[error("{}", Located { path, pos, message, hint })]
    Invalid {
        path: PathBuf,
        pos: Option<Pos>,
        message: String,
        hint: String,
    },
}

struct Located<'a> {
    path: &'a PathBuf,
    pos: &'a Option<Pos>,
    message: &'a String,
    hint: &'a String,
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(p) = self.pos {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        write!(f, ": {}", self.message)?;
        if !self.hint.is_empty() {
            write!(f, "\nhint: {}", self.hint)?;
        }
        Ok(())
    }
}

impl ManifestError {
    pub fn invalid(
        path: &std::path::Path,
        pos: Option<Pos>,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        ManifestError::Invalid {
            path: path.to_path_buf(),
            pos,
            message: message.into(),
            hint: hint.into(),
        }
    }

    /// Line of the error, when known.
    pub fn line(&self) -> Option<u64> {
        match self {
            ManifestError::Invalid { pos, .. } => pos.map(|p| p.line),
            ManifestError::Read { .. } => None,
        }
    }
}

/// The message of a YAML error in our words, without its location suffix
/// (we print the location ourselves, as `file:line:column`). The parser's
/// own wording for its limits (`budget breached: Nodes { .. }`) and for a
/// repeated key (`set DuplicateKeyPolicy in Options`) speaks of its API,
/// not of the manifest, so those are said here.
pub fn yaml_message(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach as B;
    use serde_saphyr::Error as E;
    match e {
        E::WithSnippet { error, .. } => yaml_message(error),
        E::AliasError { error, .. } => yaml_message(error),
        E::Message { msg, .. } => msg.clone(),
        E::DuplicateMappingKey { key: Some(k), .. } => format!("duplicate key `{k}`"),
        E::DuplicateMappingKey { key: None, .. } => "duplicate key in a mapping".into(),
        E::Budget { breach, .. } => {
            let what = match breach {
                B::Aliases { aliases } => format!("too many aliases ({aliases})"),
                B::Anchors { anchors } => format!("too many anchors ({anchors})"),
                B::Nodes { nodes } => format!("too many aliases/nodes ({nodes} YAML nodes)"),
                B::Events { events } => format!("too many aliases/nodes ({events} YAML events)"),
                B::Depth { depth } => format!("nested too deep ({depth} levels)"),
                B::Documents { documents } => format!("too many YAML documents ({documents})"),
                B::ScalarBytes { total_scalar_bytes } => {
                    format!("too much text ({total_scalar_bytes} bytes of values)")
                }
                B::AliasAnchorRatio { aliases, anchors } => {
                    format!("too many aliases ({aliases} uses of {anchors} anchors)")
                }
                B::MergeKeys { merge_keys } => format!("too many merge keys `<<` ({merge_keys})"),
                B::InputBytes { .. } => "the file is too large".into(),
                other => format!("the manifest is too large or too complex ({other:?})"),
            };
            format!("{what}: a manifest may not be this large once its aliases are expanded")
        }
        E::AliasReplayCounterOverflow { .. }
        | E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. } => {
            "too many aliases/nodes: a manifest may not be this large once its aliases are expanded".into()
        }
        other => {
            let text = other.to_string();
            // Drop a trailing " at line X, column Y" the crate appends.
            match text.find(" at line ") {
                Some(i) => text[..i].to_string(),
                None => text,
            }
        }
    }
}

/// A hint for a serde message: suggest the closest expected field for an
/// unknown one.
pub(crate) fn yaml_hint(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let given = rest.split('`').next().unwrap_or("");
        let expected: Vec<&str> = rest
            .split_once("expected ")
            .map(|(_, list)| {
                list.trim_start_matches("one of ")
                    .split([',', ' '])
                    .map(|w| w.trim_matches('`'))
                    .filter(|w| !w.is_empty() && *w != "or")
                    .collect()
            })
            .unwrap_or_default();
        if let Some(best) = closest(given, &expected) {
            return format!("did you mean `{best}`? the fields are documented in docs/manifest.md");
        }
        return "remove the field or fix its name; the fields are documented in docs/manifest.md".into();
    }
    if message.contains("unknown GPU type") || message.contains("GPU count") {
        return "GPU specs are `TYPE[:COUNT]`, e.g. `H100`, `H100:8`, `A100-80GB:2`, or `none`".into();
    }
    if message.starts_with("duplicate key") {
        return "each key may appear once in a mapping: remove or merge the repeated one".into();
    }
    if message.starts_with("too many")
        || message.starts_with("nested too deep")
        || message.contains("too large")
    {
        return "write the values out, or split the suite; YAML aliases (`*name`) may not multiply a manifest beyond its limits".into();
    }
    if message.starts_with("missing field") {
        return "add the field; see docs/manifest.md".into();
    }
    "see docs/manifest.md for the expected form".into()
}

fn closest<'a>(given: &str, options: &[&'a str]) -> Option<&'a str> {
    options
        .iter()
        .map(|o| (edit_distance(given, o), *o))
        .filter(|(d, o)| *d <= 2.max(o.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

impl orch_protocol::ErrorClass for ManifestError {
    fn is_user_error(&self) -> bool {
        // Every manifest error names its file, line and field.
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_field() {
        let h = yaml_hint("unknown field `warmpu`, expected one of `warmup`, `repetitions`, `timeout`");
        assert!(h.contains("did you mean `warmup`?"), "{h}");
        let h = yaml_hint("unknown field `warmpu`, expected one of warmup, repetitions");
        assert!(h.contains("did you mean `warmup`?"), "{h}");
        let h = yaml_hint("unknown field `zzzzzzzz`, expected `a` or `b`");
        assert!(h.starts_with("remove the field"), "{h}");
    }
}
