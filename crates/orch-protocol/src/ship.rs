//! The shipping stream: how an agent on a remote machine sends everything home
//! over one byte stream (a pod log, a sandbox's stdout).
//!
//! With `orch-agent run --ship`, every line the agent prints on stdout is one
//! [`Frame`]: an [`Event`], a chunk of a file of its output folder at a byte
//! offset, or the closing list of files with their sizes and digests. Frames
//! are numbered from 1, so a host that reads the stream again after a dropped
//! connection (a replayed log) drops what it already has, and a host that
//! missed frames knows it. File chunks carry their offset, so writing one twice
//! is harmless. The `Result` event is the last frame.

use crate::Event;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest file chunk (bytes before base64) in one frame: lines stay well
/// under the 16 KiB at which container runtimes split log lines (base64 and
/// the JSON around it included).
pub const CHUNK_BYTES: usize = 8 * 1024;

/// One line of the shipping stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Sequence number, from 1, without gaps.
    pub n: u64,
    #[serde(flatten)]
    pub body: FrameBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // the result event is sent once per cell
pub enum FrameBody {
    /// An agent event, exactly as the local event stream carries it.
    Event(Event),
    /// Bytes of a file of the agent's output folder.
    File(FileChunk),
    /// Every file shipped, with its final size and digest: sent once, before
    /// the result.
    End(EndFiles),
}

/// A piece of a file at a byte offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileChunk {
    /// Path relative to the output folder, `/`-separated, no `..`.
    pub path: String,
    pub offset: u64,
    /// Standard base64 of the bytes.
    pub data: String,
    /// The file was rewritten: the host empties its copy before writing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reset: bool,
}

/// The files of the output folder as the agent left them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndFiles {
    pub files: BTreeMap<String, FileDigest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileDigest {
    pub size: u64,
    /// Lowercase hex sha256 of the whole file.
    pub sha256: String,
}

impl Frame {
    /// One JSON line (no newline).
    pub fn to_line(&self) -> String {
        // Plain data with string keys: serialising cannot fail (see `Event::to_line`).
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }

    /// A frame from one line of a stream; `None` for anything else (a
    /// runtime's own lines, a torn line).
    pub fn parse(line: &str) -> Option<Frame> {
        let line = line.trim();
        if !line.starts_with("{\"n\":") {
            return None;
        }
        serde_json::from_str(line).ok()
    }
}

/// Is `path` a safe relative path inside an output folder?
pub fn safe_relative_path(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

/// A short summary of a result, for channels with little room (a Kubernetes
/// termination message): status, exit code, failure kind and message, at
/// most `max` bytes of JSON.
pub fn result_summary(result: &crate::CellResult, max: usize) -> String {
    let mut message = result
        .failure
        .as_ref()
        .map(|f| f.message.clone())
        .unwrap_or_default();
    loop {
        let v = serde_json::json!({
            "cell_id": result.cell_id,
            "status": result.status,
            "exit_code": result.failure.as_ref().and_then(|f| f.exit_code),
            "signal": result.failure.as_ref().and_then(|f| f.signal),
            "kind": result.failure.as_ref().map(|f| f.kind.clone()),
            "message": message,
        });
        let s = v.to_string();
        if s.len() <= max || message.is_empty() {
            return s;
        }
        let mut cut = message.len().saturating_sub((s.len() - max).max(16) + 3);
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
        if cut == 0 {
            message.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CellResult, Failure, Status};

    #[test]
    fn frames_round_trip_as_one_line_each() {
        let frames = [
            Frame {
                n: 1,
                body: FrameBody::Event(Event::Message { text: "hi".into() }),
            },
            Frame {
                n: 2,
                body: FrameBody::File(FileChunk {
                    path: "stdout.log".into(),
                    offset: 7,
                    data: "aGVsbG8=".into(),
                    reset: false,
                }),
            },
            Frame {
                n: 3,
                body: FrameBody::End(EndFiles::default()),
            },
        ];
        for f in frames {
            let line = f.to_line();
            assert!(!line.contains('\n'));
            assert!(line.starts_with("{\"n\":"), "{line}");
            assert_eq!(Frame::parse(&line), Some(f));
        }
        assert_eq!(Frame::parse("{\"event\":\"message\",\"text\":\"x\"}"), None);
        assert_eq!(Frame::parse("2026-01-01T00:00:00Z some runtime line"), None);
        assert_eq!(Frame::parse("{\"n\":4,\"file\":{\"path\":"), None);
    }

    #[test]
    fn only_plain_relative_paths_are_safe() {
        for ok in ["stdout.log", "bundle/a.json", "a/b/c"] {
            assert!(safe_relative_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a\\b",
            "a/",
        ] {
            assert!(!safe_relative_path(bad), "{bad}");
        }
    }

    #[test]
    fn summaries_fit_their_room() {
        let mut r = CellResult::new("c", Status::Failed);
        r.failure = Some(Failure {
            kind: crate::FailureKind::ExitCode,
            message: "é".repeat(5000),
            exit_code: Some(3),
            signal: None,
        });
        let s = result_summary(&r, 4096);
        assert!(s.len() <= 4096, "{}", s.len());
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["exit_code"], 3);
        assert_eq!(v["status"], "failed");
    }
}
