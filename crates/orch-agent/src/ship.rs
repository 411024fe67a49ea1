//! `--ship`: everything the agent produces goes home over its stdout.
//!
//! Remote backends (a Kubernetes pod, a Modal sandbox) have one byte stream
//! back to the host: the container's output. With `--ship`, the agent prints
//! numbered [`Frame`]s there: its events as they happen, and the files of its
//! output folder (the workload's logs, telemetry, result files) in chunks as
//! they grow, polled a few times a second by a thread of its own. At the end
//! it sends what is left of every file, re-sends any file that was rewritten
//! rather than appended to, closes with every file's size and digest, and
//! sends the result last. The host side is `orch_backend::home`.

use base64::Engine as _;
use orch_protocol::ship::{EndFiles, FileChunk, FileDigest, Frame, FrameBody, CHUNK_BYTES};
use orch_protocol::Event;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How often the output folder is polled for new bytes.
const POLL: Duration = Duration::from_millis(200);

/// Files the host writes itself (the result is recorded by the host's store,
/// and its presence means "finished") or that are transient.
fn skipped(rel: &str) -> bool {
    rel == orch_protocol::AGENT_RESULT_FILE
        || rel == "result.json"
        || rel == "task.json"
        || rel.ends_with(".tmp")
}

struct Shipped {
    /// Bytes sent so far.
    offset: u64,
    /// Digest of exactly those bytes.
    hasher: Sha256,
}

struct State {
    n: u64,
    out: Box<dyn Write + Send>,
    dir: PathBuf,
    files: BTreeMap<String, Shipped>,
}

impl State {
    fn send(&mut self, body: FrameBody) {
        self.n += 1;
        let frame = Frame { n: self.n, body };
        // A closed stdout (host gone) must not stop the workload's bookkeeping.
        let _ = writeln!(self.out, "{}", frame.to_line());
        let _ = self.out.flush();
    }

    /// Send whatever the folder's files gained since the last sweep.
    fn sweep(&mut self) {
        let mut found = Vec::new();
        walk(&self.dir, "", 0, &mut found);
        for rel in found {
            self.ship_new_bytes(&rel);
        }
    }

    fn ship_new_bytes(&mut self, rel: &str) {
        let path = self.dir.join(rel);
        let Ok(mut file) = std::fs::File::open(&path) else {
            return;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return;
        };
        let mut reset = false;
        let known = self.files.get(rel).map(|s| s.offset).unwrap_or(0);
        let mut offset = known;
        if len < known {
            // Shrunk: rewritten. Send it again from the start.
            reset = true;
            offset = 0;
            self.files.remove(rel);
        } else if len == known && self.files.contains_key(rel) {
            return;
        }
        if file.seek(SeekFrom::Start(offset)).is_err() {
            return;
        }
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) | Err(_) => {
                    if !self.files.contains_key(rel) {
                        // An empty file still exists at home.
                        self.files.insert(
                            rel.to_string(),
                            Shipped {
                                offset: 0,
                                hasher: Sha256::new(),
                            },
                        );
                        self.send(FrameBody::File(FileChunk {
                            path: rel.to_string(),
                            offset: 0,
                            data: String::new(),
                            reset,
                        }));
                    }
                    return;
                }
                Ok(n) => n,
            };
            let data = &buf[..n];
            let entry = self.files.entry(rel.to_string()).or_insert_with(|| Shipped {
                offset: 0,
                hasher: Sha256::new(),
            });
            entry.hasher.update(data);
            entry.offset = offset + n as u64;
            let chunk = FileChunk {
                path: rel.to_string(),
                offset,
                data: base64::engine::general_purpose::STANDARD.encode(data),
                reset,
            };
            reset = false;
            offset += n as u64;
            self.send(FrameBody::File(chunk));
        }
    }

    /// The last sweep: files rewritten in place (same or larger size, other
    /// bytes) are sent again whole, then every file's digest.
    fn finish(&mut self) {
        self.sweep();
        let mut end = EndFiles::default();
        let names: Vec<String> = self.files.keys().cloned().collect();
        for rel in names {
            let Some(digest) = digest_of(&self.dir.join(&rel)) else {
                continue;
            };
            let shipped = self
                .files
                .get(&rel)
                .map(|s| (s.offset, hex(&s.hasher.clone().finalize())));
            if shipped != Some((digest.size, digest.sha256.clone())) {
                self.files.remove(&rel);
                // Force a resend from offset 0 with `reset`.
                self.files.insert(
                    rel.clone(),
                    Shipped {
                        offset: u64::MAX,
                        hasher: Sha256::new(),
                    },
                );
                self.ship_new_bytes(&rel);
            }
            end.files.insert(rel, digest);
        }
        self.send(FrameBody::End(end));
    }
}

fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<(String, std::fs::FileType)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.file_type().ok()?)))
        .collect();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, ty) in names {
        let rel = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        // Symlinks are never followed: a workload could point one anywhere.
        if ty.is_file() && !skipped(&rel) {
            out.push(rel);
        } else if ty.is_dir() && depth < 4 {
            walk(&dir.join(&name), &rel, depth + 1, out);
        }
    }
}

fn digest_of(path: &Path) -> Option<FileDigest> {
    let mut f = std::fs::File::open(path).ok()?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Some(FileDigest {
        size,
        sha256: hex(&h.finalize()),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The shipping side of an agent run: an event sink for [`crate::ctx::Ctx`]
/// and a thread that follows the output folder.
pub struct Shipper {
    state: Arc<Mutex<State>>,
    /// Dropped to stop the thread: it wakes at once, not at its next poll
    /// (a cell's end would otherwise wait up to [`POLL`] for its result).
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Shipper {
    /// Start following `dir`, writing frames to `out` (stdout in production).
    pub fn start(dir: &Path, out: Box<dyn Write + Send>) -> Shipper {
        let state = Arc::new(Mutex::new(State {
            n: 0,
            out,
            dir: dir.to_path_buf(),
            files: BTreeMap::new(),
        }));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("orch-ship".into())
                .spawn(move || {
                    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL) {
                        if let Ok(mut s) = state.lock() {
                            s.sweep();
                        }
                    }
                })
                .ok()
        };
        Shipper {
            state,
            stop: Some(stop),
            thread,
        }
    }

    /// Send one event now.
    pub fn event(&self, event: &Event) {
        if let Ok(mut s) = self.state.lock() {
            s.send(FrameBody::Event(event.clone()));
        }
    }

    /// A sink that sends events through this shipper.
    pub fn sink(&self) -> crate::ctx::EventSink {
        let state = self.state.clone();
        Box::new(move |e: &Event| {
            if let Ok(mut s) = state.lock() {
                s.send(FrameBody::Event(e.clone()));
            }
        })
    }

    /// Stop following, send every file's remaining bytes and the closing
    /// digests, then `last` (the result).
    pub fn finish(mut self, last: &Event) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(mut s) = self.state.lock() {
            s.finish();
            s.send(FrameBody::Event(last.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::{CellResult, Status};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn frames(buf: &Buf) -> Vec<Frame> {
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        text.lines().map(|l| Frame::parse(l).expect(l)).collect()
    }

    /// Rebuild the files from the frames the way a host would.
    fn rebuild(frames: &[Frame]) -> BTreeMap<String, Vec<u8>> {
        let mut files: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        for f in frames {
            if let FrameBody::File(c) = &f.body {
                let data = base64::engine::general_purpose::STANDARD.decode(&c.data).unwrap();
                let v = files.entry(c.path.clone()).or_default();
                if c.reset {
                    v.clear();
                }
                let end = c.offset as usize + data.len();
                if v.len() < end {
                    v.resize(end, 0);
                }
                v[c.offset as usize..end].copy_from_slice(&data);
            }
        }
        files
    }

    #[test]
    fn files_growing_and_rewritten_arrive_whole_with_the_result_last() {
        let dir = tempfile::tempdir().unwrap();
        let buf = Buf::default();
        let shipper = Shipper::start(dir.path(), Box::new(buf.clone()));
        let mut sink = shipper.sink();
        sink(&Event::Message { text: "hello".into() });
        let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("stdout.log"), &big[..40_000]).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.path().join("stdout.log"))
                .unwrap();
            f.write_all(&big[40_000..]).unwrap();
        }
        std::fs::write(dir.path().join("loadgen.json"), b"{\"a\":1111}").unwrap();
        std::thread::sleep(Duration::from_millis(500));
        // Rewritten in place, same size: only the end sweep can tell.
        std::fs::write(dir.path().join("loadgen.json"), b"{\"b\":2222}").unwrap();
        std::fs::create_dir(dir.path().join("bundle")).unwrap();
        std::fs::write(dir.path().join("bundle/x.txt"), b"x").unwrap();
        std::fs::write(dir.path().join("empty.log"), b"").unwrap();
        std::fs::write(dir.path().join(orch_protocol::AGENT_RESULT_FILE), b"{}").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let result = Event::Result {
            result: CellResult::new("c", Status::Succeeded),
        };
        shipper.finish(&result);

        let frames = frames(&buf);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.n, i as u64 + 1);
        }
        assert!(matches!(
            frames.last().unwrap().body,
            FrameBody::Event(Event::Result { .. })
        ));
        let files = rebuild(&frames);
        assert_eq!(files["stdout.log"], big);
        assert_eq!(files["loadgen.json"], b"{\"b\":2222}");
        assert_eq!(files["bundle/x.txt"], b"x");
        assert_eq!(files["empty.log"], b"");
        assert!(!files.contains_key(orch_protocol::AGENT_RESULT_FILE));
        assert!(!files.contains_key("link"));
        let FrameBody::End(end) = &frames[frames.len() - 2].body else {
            panic!("no end frame before the result");
        };
        assert_eq!(end.files["stdout.log"].size, 100_000);
        assert_eq!(end.files.len(), 4);
        // The first chunk went out while the file was still growing.
        let first_chunk = frames
            .iter()
            .position(|f| matches!(&f.body, FrameBody::File(c) if c.path == "stdout.log"))
            .unwrap();
        assert!(first_chunk < frames.len() - 10);
    }
}
