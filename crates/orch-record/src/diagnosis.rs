//! The named cause of a failure, kept in a cell's record. `orch-diagnose`
//! finds it in the cell's logs; this is only its shape.

use crate::FailureKind;
use serde::{Deserialize, Serialize};

/// A named cause of failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    /// One of `orch_diagnose::KINDS`, or a kind a user rule adds
    /// ([`FailureKind::Other`]); its string in JSON.
    pub kind: FailureKind,
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

#[cfg(test)]
mod tests {
    use crate::{CellRecord, FailureKind, RunRecord};

    /// A cell's `result.json` as the format before kinds were types writes
    /// it: a built-in failure kind and a user rule's diagnosis kind.
    const RECORD: &str = r#"{"id":"serve.h100","benchmark":"serve","status":"failed","gpu":"H100","params":{},
        "metrics":{},"timings":{"provision":0.5},"failure":{"kind":"server_exited","message":"the server exited with code 1","exit_code":1},
        "started_at":"2026-11-25T15:34:52Z","finished_at":"2026-11-25T15:35:52Z","duration_s":60.0,
        "stdout":{"bytes":10,"truncated_bytes":0},"stderr":{"bytes":20,"truncated_bytes":0},"info":{},"attempt":1,
        "diagnosis":{"kind":"weights_volume_full","evidence":["No space left on device: /weights"],"hint":"free space on the weights volume"}}"#;

    #[test]
    fn a_record_of_the_current_format_reads_and_writes_back_the_same() {
        let r: CellRecord = serde_json::from_str(RECORD).unwrap();
        let f = r.failure.as_ref().unwrap();
        assert_eq!(f.kind, FailureKind::ServerExited);
        let d = r.diagnosis.as_ref().unwrap();
        assert_eq!(d.kind, FailureKind::Other("weights_volume_full".into()));
        let back = serde_json::to_value(&r).unwrap();
        let mut want: serde_json::Value = serde_json::from_str(RECORD).unwrap();
        // Written back with the record's own timestamp form.
        want["started_at"] = back["started_at"].clone();
        want["finished_at"] = back["finished_at"].clone();
        assert_eq!(back, want);
    }

    #[test]
    fn a_stored_run_of_a_gpu_machine_reads_with_typed_kinds() {
        // `orch show --json` of a real run (an `oom` cell diagnosed `cuda_oom`).
        let text = include_str!("../../../results/seeds/seed-sizes/run-20261125-153452-seed-sizes-3e36.json");
        let raw: serde_json::Value = serde_json::from_str(text).unwrap();
        let run: RunRecord = serde_json::from_str(text).unwrap();
        let mut seen = 0;
        for (c, raw) in run.cells.iter().zip(raw["cells"].as_array().unwrap()) {
            if let Some(d) = &c.diagnosis {
                assert!(d.kind.is_builtin(), "{}", d.kind);
                assert_eq!(serde_json::to_value(d).unwrap(), raw["diagnosis"]);
                seen += 1;
            }
            if let Some(f) = &c.failure {
                assert!(f.kind.is_builtin(), "{}", f.kind);
                assert_eq!(serde_json::to_value(f).unwrap(), raw["failure"]);
            }
        }
        assert!(seen > 0);
        assert!(run
            .cells
            .iter()
            .any(|c| c.diagnosis.as_ref().map(|d| &d.kind) == Some(&FailureKind::CudaOom)));
    }
}
