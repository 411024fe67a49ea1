//! The host's masker: what every backend and the runner mask in what they
//! write (events, agent logs, records), on top of the agent's own masking.

use orch_protocol::mask::{hub_token_paths, Masker, KNOWN_SECRET_ENV};

/// A masker of the cell's secrets (`(name, value)`), the known credentials
/// of this host's environment ([`KNOWN_SECRET_ENV`]) and the Hub token file.
/// Values too short to mask are skipped here: `orch run` refuses them in
/// `secrets:` before any cell starts.
pub fn host_masker(secrets: &[(String, String)]) -> Masker {
    let mut pairs: Vec<(String, String)> = secrets.to_vec();
    for name in KNOWN_SECRET_ENV {
        if let Ok(v) = std::env::var(name) {
            pairs.push((name.to_string(), v));
        }
    }
    for path in hub_token_paths(|k| std::env::var_os(k)) {
        if let Ok(t) = std::fs::read_to_string(&path) {
            pairs.push(("the Hub token file".into(), t.trim().to_string()));
        }
    }
    Masker::lenient(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))).0
}

/// One line of an agent's event stream, masked (as JSON when it is JSON, so
/// it stays valid; as text otherwise).
pub fn mask_event_line<'a>(masker: &Masker, line: &'a str) -> std::borrow::Cow<'a, str> {
    if masker.is_empty() {
        return std::borrow::Cow::Borrowed(line);
    }
    if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(line) {
        let before = v.clone();
        masker.mask_json(&mut v);
        if v != before {
            return std::borrow::Cow::Owned(v.to_string());
        }
        return std::borrow::Cow::Borrowed(line);
    }
    masker.mask_str(line)
}

/// Copy a stream (an agent's stderr) into a file, masked; ends with the
/// stream.
pub async fn copy_masked(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    masker: Masker,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = masker.stream();
    // Small: one per running cell, and an agent's stderr is a trickle.
    let mut buf = vec![0u8; 8 * 1024];
    let mut out = Vec::new();
    loop {
        let n = from.read(&mut buf).await?;
        out.clear();
        if n == 0 {
            stream.finish(&mut out);
            to.write_all(&out).await?;
            return to.flush().await;
        }
        stream.push(&buf[..n], &mut out);
        to.write_all(&out).await?;
    }
}

/// Files up to this size are masked in memory and rewritten only when a
/// secret was found; larger ones are streamed through the masker.
const IN_MEMORY: u64 = 256 << 20;

/// Mask every file below `dir` in place (links are not followed): what a
/// cell left, whatever the agent masked itself. Files without a secret are
/// left untouched; a file is replaced atomically (a temporary file renamed).
pub fn mask_dir(dir: &std::path::Path, masker: &Masker) -> std::io::Result<()> {
    if masker.is_empty() {
        return Ok(());
    }
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                todo.push(entry.path());
            } else if kind.is_file() {
                mask_file(&entry.path(), masker)?;
            }
        }
    }
    Ok(())
}

fn mask_file(path: &std::path::Path, masker: &Masker) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let len = std::fs::metadata(path)?.len();
    let tmp = path.with_file_name(format!(
        ".{}.masking",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
    ));
    if len <= IN_MEMORY {
        let bytes = std::fs::read(path)?;
        if let std::borrow::Cow::Owned(masked) = masker.mask_bytes(&bytes) {
            std::fs::write(&tmp, masked)?;
            std::fs::rename(&tmp, path)?;
        }
        return Ok(());
    }
    let mut from = std::fs::File::open(path)?;
    let mut to = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
    let mut stream = masker.stream();
    let mut buf = vec![0u8; 1 << 20];
    let mut out = Vec::new();
    loop {
        let n = from.read(&mut buf)?;
        out.clear();
        if n == 0 {
            stream.finish(&mut out);
            to.write_all(&out)?;
            break;
        }
        stream.push(&buf[..n], &mut out);
        to.write_all(&out)?;
    }
    to.flush()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_stay_json() {
        let m = host_masker(&[("MY_SECRET".into(), "s3cr3t-\"quoted\"".into())]);
        let line = serde_json::json!({"event": "message", "text": "got s3cr3t-\"quoted\" here"}).to_string();
        let masked = mask_event_line(&m, &line);
        let v: serde_json::Value = serde_json::from_str(&masked).unwrap();
        assert_eq!(v["text"], "got *** here");
        assert_eq!(mask_event_line(&m, "plain s3cr3t-\"quoted\""), "plain ***");
    }

    #[tokio::test]
    async fn a_copied_stream_is_masked_across_reads() {
        let m = host_masker(&[("MY_SECRET".into(), "abcdef123".into())]);
        let (mut w, r) = tokio::io::duplex(4);
        let mut out: Vec<u8> = Vec::new();
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for part in ["panic: abc", "def1", "23 end\n"] {
                w.write_all(part.as_bytes()).await.unwrap();
            }
        });
        copy_masked(r, &mut out, m).await.unwrap();
        writer.await.unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "panic: *** end\n");
    }
}
