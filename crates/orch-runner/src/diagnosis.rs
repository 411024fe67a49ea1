//! The cause of a failed cell named from its logs (`orch-diagnose`), a failed comparison
//! variant's from its own logs, and a command that ran out of GPU memory recorded `oom`.

use orch_protocol::Status;
use orch_record::{CompareInfo, FailureKind};
use orch_store::CellRecord;

/// For a comparison, name the cause of each failed variant from its own logs
/// (the rounds' server and client logs, its install log) into
/// `info.variants.<name>.diagnosis`; the first one is the cell's diagnosis.
/// A comparison whose `info` does not read as `orch_record::CompareInfo`
/// (an agent of another schema) is left as it is: the reports name it.
pub fn diagnose_variants(record: &mut CellRecord, dir: &std::path::Path, rules: &orch_diagnose::Rules) {
    let Some(Ok(mut cmp)) = CompareInfo::from_info(&record.info) else {
        return;
    };
    let mut first = None;
    for (name, v) in cmp.variants.iter_mut() {
        // Variant names come from the agent: one that is not a plain name
        // (`../..`) never names a folder to read.
        if !v.failed() || orch_store::check_name("variant name", name).is_err() {
            continue;
        }
        let vdir = dir.join("variants").join(name);
        let mut logs = Vec::new();
        let mut stack = vec![vdir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() && p.file_name().map(|n| n != "src").unwrap_or(true) {
                    stack.push(p);
                } else if p.extension().map(|x| x == "log").unwrap_or(false) {
                    logs.push(p);
                }
            }
        }
        logs.sort();
        let mut text: String = logs
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .collect::<Vec<_>>()
            .join("\n");
        if let Some(f) = &v.failure {
            text.push('\n');
            text.push_str(f);
        }
        let d = orch_diagnose::diagnose(&text, rules);
        v.diagnosis = Some(d.clone());
        first.get_or_insert(d);
    }
    if first.is_some() {
        cmp.write_variants_into(&mut record.info);
        record.diagnosis = first;
    }
}

/// Diagnosis kinds that mean "the work does not fit the device's memory".
const OOM_KINDS: &[FailureKind] = &[FailureKind::CudaOom];

/// A command cell that failed because it ran out of GPU memory (a PyTorch
/// `OutOfMemoryError`, a CUDA allocation failure: the diagnosis named it) is
/// `oom`, like a builtin workload that does not fit: a size that does not fit
/// is a result of a sweep, not a broken cell. The failure is kept; its kind
/// becomes `oom`.
pub fn oom_from_diagnosis(record: &mut CellRecord) {
    let is_oom = record
        .diagnosis
        .as_ref()
        .is_some_and(|d| OOM_KINDS.contains(&d.kind));
    // Only a program that ended on its own (a command's exit code or signal):
    // a server that dies at start keeps `server_exited`, its cause named.
    let ended = record
        .failure
        .as_ref()
        .is_some_and(|f| matches!(f.kind, FailureKind::ExitCode | FailureKind::Signal));
    if record.status == Status::Failed && is_oom && ended {
        record.status = Status::Oom;
        if let Some(f) = record.failure.as_mut() {
            f.kind = FailureKind::Oom;
        }
    }
}

/// Name the cause of a cell that did not succeed, from its logs (server or
/// command output, the client's, and the agent's own).
pub fn diagnose_cell(
    record: &CellRecord,
    dir: &std::path::Path,
    rules: &orch_diagnose::Rules,
) -> Option<orch_diagnose::Diagnosis> {
    if matches!(record.status, Status::Succeeded | Status::Cancelled) {
        return None;
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let stdout = [read("stdout.log"), read("client.stdout.log")].join("\n");
    let failure = record.failure.as_ref();
    // A builtin workload's `oom` (its memory preflight, an allocation that
    // failed) is in no log: its message is the evidence.
    let message = failure
        .filter(|f| f.kind == FailureKind::Oom)
        .map(|f| f.message.clone())
        .unwrap_or_default();
    let stderr = [
        read("stderr.log"),
        read("client.stderr.log"),
        read("agent.log"),
        message,
    ]
    .join("\n");
    let exit = orch_diagnose::ExitInfo {
        code: failure.and_then(|f| f.exit_code),
        signal: failure.and_then(|f| f.signal),
        timed_out: record.status == Status::Timeout,
    };
    Some(orch_diagnose::diagnose_output(
        &stdout,
        &stderr,
        Some(&exit),
        rules,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::StreamInfo;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn record(info: BTreeMap<String, serde_json::Value>) -> CellRecord {
        let at = chrono::Utc::now();
        CellRecord {
            id: "cmp".into(),
            benchmark: "cmp".into(),
            status: Status::Failed,
            gpu: "none".into(),
            params: BTreeMap::new(),
            metrics: BTreeMap::new(),
            timings: BTreeMap::new(),
            failure: None,
            started_at: at,
            finished_at: at,
            duration_s: 0.0,
            stdout: StreamInfo::default(),
            stderr: StreamInfo::default(),
            info,
            attempt: 1,
            diagnosis: None,
            hardware: None,
            flags: vec![],
            cost: None,
        }
    }

    fn variant(status: &str, failure: Option<&str>) -> serde_json::Value {
        json!({"status": status, "failure": failure, "rounds": 0, "values": {}, "warmup_values": [],
            "drift": null, "output_check": null, "flags": [], "lengths": null, "gate": null, "logs": "variants/x"})
    }

    #[test]
    fn a_failed_variant_is_named_from_its_own_logs_and_the_rest_of_info_kept() {
        let dir = tempfile::tempdir().unwrap();
        let round = dir.path().join("variants/crash/round-0");
        std::fs::create_dir_all(&round).unwrap();
        std::fs::write(
            round.join("server.log"),
            "RuntimeError: CUDA error: out of memory\n",
        )
        .unwrap();
        let info = BTreeMap::from([
            (
                "variants".to_string(),
                json!({"baseline": variant("succeeded", None), "crash": variant("failed", Some("round 1: server exited"))}),
            ),
            ("comparison".to_string(), json!([])),
            ("rounds".to_string(), json!(0)),
            ("noise".to_string(), json!(0.02)),
            ("hostname".to_string(), json!("h")),
        ]);
        let mut r = record(info.clone());
        diagnose_variants(&mut r, dir.path(), &orch_diagnose::Rules::default());
        assert_eq!(r.diagnosis.as_ref().map(|d| d.kind.as_str()), Some("cuda_oom"));
        assert_eq!(r.info["variants"]["crash"]["diagnosis"]["kind"], "cuda_oom");
        // Nothing else changed.
        r.info
            .get_mut("variants")
            .and_then(|v| v["crash"].as_object_mut())
            .unwrap()
            .remove("diagnosis");
        assert_eq!(r.info, info);
    }

    #[test]
    fn a_comparison_that_does_not_read_is_left_alone() {
        let mut v = variant("failed", Some("x"));
        v["renamed"] = json!(1);
        let info = BTreeMap::from([
            ("variants".to_string(), json!({ "a": v })),
            ("comparison".to_string(), json!([])),
            ("rounds".to_string(), json!(0)),
            ("noise".to_string(), json!(0.02)),
        ]);
        let mut r = record(info.clone());
        diagnose_variants(
            &mut r,
            std::path::Path::new("/nonexistent"),
            &orch_diagnose::Rules::default(),
        );
        assert_eq!(r.info, info);
        assert!(r.diagnosis.is_none());
    }
}
