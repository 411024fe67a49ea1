//! The way home for remote backends: one stream in, a cell folder out.
//!
//! A remote agent (`orch-agent run --ship`) prints numbered frames on its
//! stdout (`orch_protocol::ship`): events, chunks of its output files, the
//! closing digests, the result. Whatever carries that stream to this host (a
//! Kubernetes pod log, a Modal sandbox's stdout), [`Home`] turns it into the
//! same cell folder the local backend leaves: `events.jsonl`, `stdout.log`,
//! `stderr.log`, `agent.log`, `telemetry.jsonl` and any other file, with
//! events relayed live through [`EventRelay`].
//!
//! Reconnecting is safe: frames already seen are dropped by number, chunks are
//! written at their offset, so a replayed stream changes nothing; frames that
//! never arrived show up in [`Home::gaps`], and replaying the whole stream
//! fills them.

use crate::{CellEvent, EventRelay};
use base64::Engine as _;
use orch_protocol::ship::{safe_relative_path, EndFiles, Frame, FrameBody};
use orch_protocol::{CellResult, Event, TaskSpec};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error("cannot write `{path}` of the cell folder: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("the agent sent a file with an unsafe path `{0}`")]
    UnsafePath(String),
    #[error("the agent sent a chunk of `{0}` that is not valid base64")]
    BadChunk(String),
}

/// The task as the agent's `--task-b64` argument.
pub fn task_b64(task: &TaskSpec) -> String {
    let json = serde_json::to_vec(task).unwrap_or_default();
    base64::engine::general_purpose::STANDARD.encode(json)
}

/// One cell's way home.
pub struct Home {
    dir: PathBuf,
    relay: EventRelay,
    /// `events.jsonl`, appended to event by event (open only for the write).
    events_file: Option<PathBuf>,
    /// Highest frame number seen.
    last: u64,
    /// Numbers below `last` that never arrived.
    missing: BTreeSet<u64>,
    end: Option<EndFiles>,
    result: Option<CellResult>,
    /// Files written, so a `reset` chunk of one seen the first time is not
    /// needed to create it.
    written: BTreeMap<String, u64>,
    /// The host's masker, for events (files are masked once whole).
    masker: Option<orch_protocol::mask::Masker>,
}

impl Home {
    /// Start receiving into `cell_dir` (created if needed). Create it when the
    /// cell's launch begins: the provision phase is measured from here.
    pub fn new(
        cell_id: &str,
        cell_dir: &Path,
        events: mpsc::UnboundedSender<CellEvent>,
    ) -> Result<Home, HomeError> {
        std::fs::create_dir_all(cell_dir).map_err(|source| HomeError::Write {
            path: cell_dir.to_path_buf(),
            source,
        })?;
        let events_path = cell_dir.join("events.jsonl");
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&events_path)
            .map_err(|source| HomeError::Write {
                path: events_path.clone(),
                source,
            })?;
        Ok(Home {
            dir: cell_dir.to_path_buf(),
            relay: EventRelay::new(cell_id, events),
            events_file: Some(events_path),
            last: 0,
            missing: BTreeSet::new(),
            end: None,
            result: None,
            written: BTreeMap::new(),
            masker: None,
        })
    }

    /// Mask every event on the host too (the agent masks them already).
    pub fn masked(mut self, masker: orch_protocol::mask::Masker) -> Home {
        self.masker = Some(masker);
        self
    }

    /// A result with the provision time, when the agent started.
    pub fn stamp(&self, result: CellResult) -> CellResult {
        self.relay.stamp(result)
    }

    /// No more events: `events.jsonl` is closed.
    pub fn close(&mut self) {
        self.events_file.take();
    }

    /// One line of the stream. Returns the cell's result when the result
    /// frame arrives (once; a replayed result returns nothing). Lines that
    /// are not frames are ignored.
    pub fn line(&mut self, line: &str) -> Result<Option<CellResult>, HomeError> {
        let Some(frame) = Frame::parse(line) else {
            return Ok(None);
        };
        if frame.n == 0 {
            return Ok(None);
        }
        if frame.n <= self.last {
            if !self.missing.remove(&frame.n) {
                return Ok(None);
            }
        } else {
            self.missing.extend(self.last + 1..frame.n);
            self.last = frame.n;
        }
        match frame.body {
            FrameBody::Event(mut event) => {
                if let Some(m) = &self.masker {
                    m.mask_in_place(&mut event);
                }
                if let Some(path) = &self.events_file {
                    let _ = crate::append(path, format!("{}\n", event.to_line()).as_bytes());
                }
                if let Event::Result { result } = event {
                    let result = self.relay.stamp(result);
                    self.result = Some(result.clone());
                    return Ok(Some(result));
                }
                self.relay.line(&event.to_line());
            }
            FrameBody::File(chunk) => {
                if !safe_relative_path(&chunk.path) || chunk.path == "events.jsonl" {
                    return Err(HomeError::UnsafePath(chunk.path));
                }
                let data = base64::engine::general_purpose::STANDARD
                    .decode(chunk.data.as_bytes())
                    .map_err(|_| HomeError::BadChunk(chunk.path.clone()))?;
                self.write_at(&chunk.path, chunk.offset, &data, chunk.reset)?;
            }
            FrameBody::End(end) => self.end = Some(end),
        }
        Ok(None)
    }

    fn write_at(&mut self, rel: &str, offset: u64, data: &[u8], reset: bool) -> Result<(), HomeError> {
        let path = self.dir.join(rel);
        let err = |source| HomeError::Write {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err)?;
        }
        // Never follow a link placed in the cell folder.
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(HomeError::UnsafePath(rel.to_string()));
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .map_err(err)?;
        if reset {
            f.set_len(0).map_err(err)?;
        }
        f.seek(SeekFrom::Start(offset)).map_err(err)?;
        f.write_all(data).map_err(err)?;
        let end = offset + data.len() as u64;
        let e = self.written.entry(rel.to_string()).or_insert(0);
        *e = if reset { end } else { (*e).max(end) };
        Ok(())
    }

    /// Feed every line of `reader` until its end or the result, whichever
    /// comes first. `Ok(None)`: the stream ended without a result (look at
    /// [`Home::gaps`] and replay; the lifecycle then judges the end).
    pub async fn pump<R>(&mut self, reader: R) -> Result<Option<CellResult>, HomeError>
    where
        R: tokio::io::AsyncBufRead + Unpin,
    {
        use tokio::io::AsyncBufReadExt;
        let mut lines = reader.lines();
        loop {
            match lines.next_line().await {
                Ok(Some(line)) => {
                    if let Some(r) = self.line(&line)? {
                        return Ok(Some(r));
                    }
                }
                Ok(None) | Err(_) => return Ok(None),
            }
        }
    }

    /// The highest frame number received.
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// Whether frames are missing (a dropped connection lost some): replay
    /// the whole stream to fill them.
    pub fn gaps(&self) -> bool {
        !self.missing.is_empty()
    }

    /// The result, once it arrived.
    pub fn result(&self) -> Option<&CellResult> {
        self.result.as_ref()
    }

    /// Seconds from launch until the agent started, once it has.
    pub fn provision_s(&self) -> Option<f64> {
        self.relay.provision_s()
    }

    /// Check the files against the agent's closing digests. `Ok(false)` when
    /// no closing frame arrived (the agent died); `Err` names the first file
    /// that differs.
    pub fn verify(&self) -> Result<bool, String> {
        let Some(end) = &self.end else {
            return Ok(false);
        };
        for (rel, want) in &end.files {
            let path = self.dir.join(rel);
            let bytes = std::fs::read(&path).map_err(|e| format!("`{rel}` did not arrive: {e}"))?;
            let got = Sha256::digest(&bytes);
            let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
            if bytes.len() as u64 != want.size || hex != want.sha256 {
                return Err(format!(
                    "`{rel}` arrived with {} bytes, the agent had {}",
                    bytes.len(),
                    want.size
                ));
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::ship::FileChunk;
    use orch_protocol::Status;

    fn chunk(n: u64, path: &str, offset: u64, data: &[u8]) -> String {
        Frame {
            n,
            body: FrameBody::File(FileChunk {
                path: path.into(),
                offset,
                data: base64::engine::general_purpose::STANDARD.encode(data),
                reset: false,
            }),
        }
        .to_line()
    }

    fn event(n: u64, e: Event) -> String {
        Frame {
            n,
            body: FrameBody::Event(e),
        }
        .to_line()
    }

    #[test]
    fn a_replayed_stream_with_gaps_and_duplicates_gives_the_same_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut home = Home::new("c", dir.path(), tx).unwrap();
        let started = Event::Started {
            cell_id: "c".into(),
            agent_version: "x".into(),
            pid: 1,
        };
        let stream = [
            event(1, started),
            chunk(2, "stdout.log", 0, b"hello "),
            chunk(3, "stdout.log", 6, b"world\n"),
            chunk(4, "sub/t.jsonl", 0, b"{}\n"),
            Frame {
                n: 5,
                body: FrameBody::End(EndFiles {
                    files: [(
                        "stdout.log".to_string(),
                        orch_protocol::ship::FileDigest {
                            size: 12,
                            sha256: Sha256::digest(b"hello world\n")
                                .iter()
                                .map(|b| format!("{b:02x}"))
                                .collect(),
                        },
                    )]
                    .into(),
                }),
            }
            .to_line(),
            event(
                6,
                Event::Result {
                    result: CellResult::new("c", Status::Succeeded),
                },
            ),
        ];
        // First connection: frames 1, 2 and then 4 (3 lost), a foreign line.
        assert!(home.line(&stream[0]).unwrap().is_none());
        home.line(&stream[1]).unwrap();
        home.line("2026-11-22T00:00:00Z a runtime's own line").unwrap();
        home.line(&stream[3]).unwrap();
        assert!(home.gaps());
        assert_eq!(home.last_seq(), 4);
        // Replay from the start: duplicates dropped, the gap filled.
        let mut results = 0;
        for l in &stream {
            if home.line(l).unwrap().is_some() {
                results += 1;
            }
        }
        // A second replay returns no second result.
        for l in &stream {
            assert!(home.line(l).unwrap().is_none());
        }
        assert_eq!(results, 1);
        assert!(!home.gaps());
        assert_eq!(
            std::fs::read(dir.path().join("stdout.log")).unwrap(),
            b"hello world\n"
        );
        assert_eq!(std::fs::read(dir.path().join("sub/t.jsonl")).unwrap(), b"{}\n");
        assert_eq!(home.verify(), Ok(true));
        let events = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
        assert_eq!(events.lines().count(), 2, "{events}");
        assert!(matches!(rx.try_recv().unwrap().event, Event::Started { .. }));
        assert!(home.provision_s().is_some());
    }

    #[test]
    fn unsafe_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut home = Home::new("c", &dir.path().join("cell"), tx).unwrap();
        for (n, p) in ["../escape", "/etc/x", "events.jsonl", "a/../../b"]
            .iter()
            .enumerate()
        {
            assert!(matches!(
                home.line(&chunk(n as u64 + 1, p, 0, b"x")),
                Err(HomeError::UnsafePath(_))
            ));
        }
        std::os::unix::fs::symlink("/tmp", dir.path().join("cell/ln")).unwrap();
        assert!(home.line(&chunk(9, "ln", 0, b"x")).is_err());
        assert!(!dir.path().join("escape").exists());
    }

    #[test]
    fn a_stream_cut_short_keeps_what_came_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut home = Home::new("c", dir.path(), tx).unwrap();
        home.line(&chunk(1, "stderr.log", 0, b"Killed\n")).unwrap();
        assert_eq!(home.verify(), Ok(false));
        home.close();
        assert!(home.result().is_none());
        assert_eq!(std::fs::read(dir.path().join("stderr.log")).unwrap(), b"Killed\n");
    }
}
