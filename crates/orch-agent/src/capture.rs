//! Capture of one output stream into a file, keeping head and tail of huge
//! outputs.
//!
//! The first `head_bytes` go straight to the file as they arrive (so they
//! survive a crash of the agent). Past that, the last `tail_bytes` are kept in
//! a ring buffer and appended at the end after a marker line that says how
//! many bytes were dropped.

use orch_protocol::{LogLimits, StreamInfo};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

pub struct Capture {
    file: File,
    limits: LogLimits,
    total: u64,
    head_written: u64,
    tail: VecDeque<u8>,
    dropped: u64,
}

impl Capture {
    pub fn create(path: &Path, limits: LogLimits) -> io::Result<Capture> {
        Ok(Capture {
            file: File::create(path)?,
            limits,
            total: 0,
            head_written: 0,
            tail: VecDeque::new(),
            dropped: 0,
        })
    }

    pub fn write(&mut self, mut buf: &[u8]) -> io::Result<()> {
        self.total += buf.len() as u64;
        let head_room = self.limits.head_bytes.saturating_sub(self.head_written);
        if head_room > 0 {
            let n = (head_room as usize).min(buf.len());
            self.file.write_all(&buf[..n])?;
            self.head_written += n as u64;
            buf = &buf[n..];
        }
        if buf.is_empty() {
            return Ok(());
        }
        let cap = self.limits.tail_bytes as usize;
        if buf.len() >= cap {
            self.dropped += self.tail.len() as u64 + (buf.len() - cap) as u64;
            self.tail.clear();
            self.tail.extend(&buf[buf.len() - cap..]);
        } else {
            let overflow = (self.tail.len() + buf.len()).saturating_sub(cap);
            self.tail.drain(..overflow);
            self.dropped += overflow as u64;
            self.tail.extend(buf);
        }
        Ok(())
    }

    /// Write the tail (after a truncation marker when bytes were dropped) and
    /// flush to disk.
    pub fn finish(mut self) -> io::Result<StreamInfo> {
        if self.dropped > 0 {
            writeln!(
                self.file,
                "\n[orch: {} bytes truncated here; the first {} and the last {} bytes are kept]",
                self.dropped, self.limits.head_bytes, self.limits.tail_bytes
            )?;
        }
        let (a, b) = self.tail.as_slices();
        self.file.write_all(a)?;
        self.file.write_all(b)?;
        self.file.sync_all()?;
        Ok(StreamInfo {
            bytes: self.total,
            truncated_bytes: self.dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(limits: LogLimits, chunks: &[&[u8]]) -> (String, StreamInfo) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.log");
        let mut c = Capture::create(&path, limits).unwrap();
        for ch in chunks {
            c.write(ch).unwrap();
        }
        let info = c.finish().unwrap();
        (std::fs::read_to_string(&path).unwrap(), info)
    }

    #[test]
    fn small_output_is_kept_whole() {
        let (text, info) = run(LogLimits::default(), &[b"hello ", b"world\n"]);
        assert_eq!(text, "hello world\n");
        assert_eq!(info.bytes, 12);
        assert_eq!(info.truncated_bytes, 0);
    }

    #[test]
    fn huge_output_keeps_head_and_tail() {
        let limits = LogLimits {
            head_bytes: 4,
            tail_bytes: 3,
        };
        let (text, info) = run(limits, &[b"abcdef", b"gh", b"ijklm", b"no"]);
        // total "abcdefghijklmno" = 15 bytes: head "abcd", tail "mno", 8 dropped
        assert_eq!(info.bytes, 15);
        assert_eq!(info.truncated_bytes, 8);
        assert!(text.starts_with("abcd\n[orch: 8 bytes truncated"));
        assert!(text.ends_with("]\nmno"));
        let (_, info) = run(limits, &[b"abcd", b"0123456789"]);
        assert_eq!(info.truncated_bytes, 7);
    }
}
