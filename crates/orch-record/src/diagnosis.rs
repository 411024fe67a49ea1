//! The named cause of a failure, kept in a cell's record. `orch-diagnose`
//! finds it in the cell's logs; this is only its shape.

use serde::{Deserialize, Serialize};

/// A named cause of failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// One of `orch_diagnose::KINDS` (or a kind a user rule adds).
    pub kind: String,
    /// Log lines that show it, strongest first (at most
    /// `orch_diagnose::MAX_EVIDENCE`).
    pub evidence: Vec<String>,
    /// What to do about it.
    pub hint: String,
}

impl Diagnosis {
    /// `kind: ...`, `evidence:` with indented lines, `hint: ...`.
    pub fn to_text(&self) -> String {
        let mut s = format!("kind: {}\n", self.kind);
        if self.evidence.is_empty() {
            s.push_str("evidence: (none)\n");
        } else {
            s.push_str("evidence:\n");
            for e in &self.evidence {
                s.push_str("  ");
                s.push_str(e);
                s.push('\n');
            }
        }
        s.push_str("hint: ");
        s.push_str(&self.hint);
        s.push('\n');
        s
    }
}
