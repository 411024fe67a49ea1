//! An S3 fault proxy: a TCP proxy in front of a test S3 server (`s3s-fs`,
//! `moto_server`, see [`crate`]) whose [`Mode`] a test switches while
//! the client runs, to play an outage of the object store:
//!
//! - [`Mode::Pass`]: every request goes to the server and back.
//! - [`Mode::Refuse`]: the listening socket is closed, so a connection is
//!   refused (`ECONNREFUSED`) as by a server that is down; it is bound
//!   again on the same port when the mode changes.
//! - [`Mode::SlowDown`]: every request is answered `503 Slow Down` with the
//!   S3 XML error body `<Code>SlowDown</Code>` (what S3 answers when it
//!   throttles: <https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html>).
//! - [`Mode::Drop`]: the request reaches the server (so a write is done),
//!   but the connection is closed halfway through the reply.
//! - [`Mode::Silent`]: the connection is accepted and the request read, and
//!   nothing is ever answered (until the client gives up or the proxy is
//!   dropped): an endpoint that hangs.
//! - [`Mode::Deny`]: every request is answered `403 InvalidAccessKeyId`
//!   (S3's answer to an access key it does not know): credentials refused.
//!
//! Each connection carries one request (`Connection: close` on the way
//! there and back), so every request meets the mode of its own moment,
//! never a connection kept alive from before the outage.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the proxy does with the next request (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass = 0,
    Refuse = 1,
    SlowDown = 2,
    Drop = 3,
    Silent = 4,
    Deny = 5,
}

const MODES: [Mode; 6] = [
    Mode::Pass,
    Mode::Refuse,
    Mode::SlowDown,
    Mode::Drop,
    Mode::Silent,
    Mode::Deny,
];

struct Shared {
    mode: AtomicU8,
    stop: AtomicBool,
    /// Requests met in each mode (for `Refuse`: connections accepted just
    /// before the listener closed, then closed unanswered).
    counts: [AtomicU64; 6],
    upstream: String,
}

impl Shared {
    fn mode(&self) -> Mode {
        MODES[self.mode.load(Ordering::SeqCst) as usize % MODES.len()]
    }
}

/// The proxy; stopped on drop (held connections are closed).
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`: the endpoint to give the client.
    pub endpoint: String,
    shared: Arc<Shared>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

impl FaultProxy {
    /// A proxy to `upstream` (`http://host:port`), in [`Mode::Pass`].
    pub fn start(upstream: &str) -> Result<FaultProxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass as u8),
            stop: AtomicBool::new(false),
            counts: Default::default(),
            upstream: upstream
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || accept_loop(listener, port, s))
            .map_err(|e| e.to_string())?;
        Ok(FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            shared,
        })
    }

    pub fn set(&self, mode: Mode) {
        self.shared.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// How many requests met `mode` so far.
    pub fn count(&self, mode: Mode) -> u64 {
        self.shared.counts[mode as usize].load(Ordering::SeqCst)
    }

    /// Switch modes on a timetable, in a thread: wait each step's time,
    /// then set its mode. The thread ends after the last step (or when the
    /// proxy is dropped).
    pub fn schedule(&self, steps: Vec<(Duration, Mode)>) -> std::thread::JoinHandle<()> {
        let s = self.shared.clone();
        std::thread::spawn(move || {
            for (wait, mode) in steps {
                let mut slept = Duration::ZERO;
                while slept < wait {
                    if s.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let step = (wait - slept).min(Duration::from_millis(50));
                    std::thread::sleep(step);
                    slept += step;
                }
                s.mode.store(mode as u8, Ordering::SeqCst);
            }
        })
    }
}

fn accept_loop(listener: TcpListener, port: u16, s: Arc<Shared>) {
    let mut listener = Some(listener);
    while !s.stop.load(Ordering::SeqCst) {
        if s.mode() == Mode::Refuse {
            // Closing the listening socket: new connections are refused,
            // those in its backlog reset.
            listener = None;
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        let Some(l) = &listener else {
            // std binds with SO_REUSEADDR on Unix: the same port again.
            match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) if l.set_nonblocking(true).is_ok() => listener = Some(l),
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
            continue;
        };
        match l.accept() {
            Ok((conn, _)) => {
                let s = s.clone();
                std::thread::spawn(move || {
                    let _ = conn.set_nonblocking(false);
                    let _ = handle(conn, &s);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// The head with `Connection: close` instead of any connection header.
fn closing(head: &str) -> String {
    let mut out = String::new();
    for line in head.split("\r\n").filter(|l| !l.is_empty()) {
        if line.to_ascii_lowercase().starts_with("connection:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    out
}

fn handle(mut client: TcpStream, s: &Shared) -> std::io::Result<()> {
    let Some((head, rest)) = read_head(&mut client)? else {
        return Ok(());
    };
    let mode = s.mode();
    s.counts[mode as usize].fetch_add(1, Ordering::SeqCst);
    match mode {
        Mode::Pass => pass(client, &head, &rest, s, false),
        Mode::Drop => pass(client, &head, &rest, s, true),
        Mode::Refuse => client.shutdown(Shutdown::Both),
        Mode::SlowDown => answer(
            client,
            &head,
            rest.len(),
            "503 Slow Down",
            "SlowDown",
            "Please reduce your request rate.",
        ),
        Mode::Deny => answer(
            client,
            &head,
            rest.len(),
            "403 Forbidden",
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
        ),
        Mode::Silent => {
            // Hold the connection, answering nothing, until the client
            // closes it or the proxy stops.
            client.set_read_timeout(Some(Duration::from_millis(100)))?;
            let mut buf = [0u8; 8192];
            while !s.stop.load(Ordering::SeqCst) {
                match client.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
            Ok(())
        }
    }
}

/// Answer an S3 XML error (after reading the request's body, so that the
/// client reads the answer rather than a reset).
fn answer(
    mut client: TcpStream,
    head: &str,
    have: usize,
    status: &str,
    code: &str,
    message: &str,
) -> std::io::Result<()> {
    let expects = header(head, "expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    let len: usize = header(head, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if !expects && len > have {
        client.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut left = (len - have) as u64;
        let mut buf = [0u8; 65536];
        while left > 0 {
            match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n as u64),
            }
        }
    }
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message><RequestId>faultproxy</RequestId><HostId>faultproxy</HostId></Error>"
    );
    write!(
        client,
        "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\nx-amz-request-id: faultproxy\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    client.flush()?;
    client.shutdown(Shutdown::Write)?;
    // Let the client read the answer before the socket goes.
    client.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut sink = [0u8; 4096];
    while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

/// Relay one request to the server and its reply back; `cut`: send only
/// the first half of the reply, then close.
fn pass(mut client: TcpStream, head: &str, rest: &[u8], s: &Shared, cut: bool) -> std::io::Result<()> {
    let mut server = match TcpStream::connect(&s.upstream) {
        Ok(c) => c,
        Err(_) => return client.shutdown(Shutdown::Both),
    };
    server.write_all(closing(head).as_bytes())?;
    server.write_all(rest)?;
    // The rest of the request body, as the client sends it.
    let mut c2 = client.try_clone()?;
    let mut s2 = server.try_clone()?;
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut s2);
    });
    if cut {
        let mut reply = Vec::new();
        let _ = server.read_to_end(&mut reply);
        let half = (reply.len() / 2).max(1).min(reply.len());
        let _ = client.write_all(&reply[..half]);
    } else {
        // Interim replies (100 Continue) as they are, then the final head
        // with `Connection: close`, then the body as it comes.
        let mut reply = Prefixed {
            first: Vec::new(),
            rest: &mut server,
        };
        while let Some((h, body)) = read_head(&mut reply)? {
            if h.starts_with("HTTP/1.1 1") || h.starts_with("HTTP/1.0 1") {
                client.write_all(h.as_bytes())?;
                reply.first = body;
                continue;
            }
            client.write_all(closing(&h).as_bytes())?;
            client.write_all(&body)?;
            let _ = std::io::copy(&mut reply, &mut client);
            break;
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
    let _ = up.join();
    Ok(())
}

/// Bytes already read, then a stream.
struct Prefixed<'a> {
    first: Vec<u8>,
    rest: &'a mut TcpStream,
}

impl Read for Prefixed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if !self.first.is_empty() {
            let n = buf.len().min(self.first.len());
            buf[..n].copy_from_slice(&self.first[..n]);
            self.first.drain(..n);
            return Ok(n);
        }
        self.rest.read(buf)
    }
}

/// Read an HTTP head (to the blank line); the head and the bytes after it.
fn read_head(r: &mut impl Read) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(i + 4);
            return Ok(Some((String::from_utf8_lossy(&buf).into_owned(), rest)));
        }
        if buf.len() > 1 << 20 {
            return Ok(None);
        }
    }
}
