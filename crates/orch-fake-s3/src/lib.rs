//! Real S3-compatible servers for tests, started as child processes:
//! `s3s-fs` (crates.io; real SigV4 checks; `If-None-Match` honoured but
//! checked then written, not atomic) and `moto_server` (PyPI `moto[server]`;
//! atomic conditional writes, for races), plus [`IgnoringProxy`], which
//! drops `If-None-Match` on the way, as some S3-compatible servers do.
//!
//! A missing server is `Err(reason)`: tests skip with the reason, except
//! under CI where they must fail ([`require`], [`crate::skip`]).
//!
//! [`faultproxy`] stands between a client and such a server to play an outage (refused, `503`,
//! dropped, silent, denied).
//!
//! Not shared: the crate has no dependency but the skip rule (no async runtime, no S3 client);
//! it does not fake S3 itself, it starts real servers, and knows nothing of `orch`'s store.

pub mod faultproxy;

use orch_test_support::skip;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ACCESS_KEY: &str = "orchtestkey";
pub const SECRET_KEY: &str = "orch-test-secret-do-not-print-0123456789";

/// A running server; killed on drop.
pub struct S3Server {
    child: Child,
    pub endpoint: String,
    pub kind: &'static str,
    root: Option<PathBuf>,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        // moto's shell stops its server when its stdin closes; give it a moment.
        if self.child.stdin.take().is_some() {
            for _ in 0..50 {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Skip (outside CI) or fail (under CI) when a server is missing: [`crate::skip::require`]
/// for the running test.
#[track_caller]
pub fn require<T>(server: Result<T, String>) -> Option<T> {
    crate::skip::require(&crate::skip::current_test(), server)
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn wait_port(port: u16, child: &mut Child, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            return Err(format!("{name} exited at start: {st}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{name} did not listen on port {port} within 30 s"))
}

fn find(bin: &str, env: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(Path::new(&h).join(".cargo/bin"));
        dirs.push(Path::new(&h).join(".local/bin"));
    }
    dirs.into_iter().map(|d| d.join(bin)).find(|p| p.is_file())
}

impl S3Server {
    /// `s3s-fs` over a folder (`$ORCH_TEST_S3S_FS` or `s3s-fs` on the PATH
    /// or in ~/.cargo/bin), with SigV4 credentials [`ACCESS_KEY`]/[`SECRET_KEY`].
    pub fn s3s_fs(root: &Path) -> Result<S3Server, String> {
        let bin = find("s3s-fs", "ORCH_TEST_S3S_FS")
            .ok_or("`s3s-fs` not found (`cargo install s3s-fs@0.14.1 --locked --features binary`)")?;
        std::fs::create_dir_all(root).map_err(|e| e.to_string())?;
        let port = free_port()?;
        let mut child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start s3s-fs: {e}"))?;
        wait_port(port, &mut child, "s3s-fs")?;
        Ok(S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            kind: "s3s-fs",
            root: Some(root.to_path_buf()),
        })
    }

    /// `moto_server` (`$ORCH_TEST_MOTO` or on the PATH): atomic conditional writes.
    pub fn moto() -> Result<S3Server, String> {
        let bin = find("moto_server", "ORCH_TEST_MOTO")
            .ok_or("`moto_server` not found (`pip install 'moto[server]'`)")?;
        let port = free_port()?;
        // Test binaries keep this server in a static that is never dropped: a shell
        // holds it and kills it when its stdin (a pipe from this process) closes,
        // which the kernel does when the test process exits.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec 3<&0; "$0" "$@" </dev/null & p=$!; read -r _ <&3; kill $p; wait $p"#)
            .arg(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start moto_server: {e}"))?;
        wait_port(port, &mut child, "moto_server")?;
        Ok(S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            kind: "moto",
            root: None,
        })
    }

    /// Create a bucket (a folder for s3s-fs; an anonymous `PUT /bucket` for moto).
    pub fn create_bucket(&self, name: &str) -> Result<(), String> {
        if let Some(root) = &self.root {
            return std::fs::create_dir_all(root.join(name)).map_err(|e| e.to_string());
        }
        let addr = self.endpoint.trim_start_matches("http://");
        // A server that accepts before it answers (moto under load) gets a
        // few more tries while its replies are empty.
        let mut reply = String::new();
        for attempt in 0..20 {
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
            let mut s = TcpStream::connect(addr).map_err(|e| e.to_string())?;
            write!(
                s,
                "PUT /{name} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .map_err(|e| e.to_string())?;
            reply.clear();
            let _ = s.read_to_string(&mut reply);
            if !reply.is_empty() {
                break;
            }
        }
        if reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(format!(
                "create bucket `{name}`: {}",
                reply.lines().next().unwrap_or("(no reply)")
            ))
        }
    }

    /// The environment that points the AWS chain at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_string()),
            ("AWS_REGION", "us-east-1".to_string()),
            // No ~/.aws of the machine running the tests is read.
            ("AWS_CONFIG_FILE", "/nonexistent/orch-test-aws-config".to_string()),
            (
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/orch-test-aws-credentials".to_string(),
            ),
            ("AWS_EC2_METADATA_DISABLED", "true".to_string()),
        ]
    }
}

/// A TCP proxy in front of a server that removes `If-None-Match` from every
/// request: a server that ignores conditional writes. Each connection
/// carries one request (`Connection: close`).
pub struct IgnoringProxy {
    pub endpoint: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for IgnoringProxy {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

impl IgnoringProxy {
    pub fn start(upstream: &str) -> Result<IgnoringProxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let upstream = upstream.trim_start_matches("http://").to_string();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let up = upstream.clone();
                std::thread::spawn(move || {
                    let _ = relay(client, &up);
                });
            }
        });
        Ok(IgnoringProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            stop,
        })
    }
}

fn relay(mut client: TcpStream, upstream: &str) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    let end = loop {
        let n = client.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let mut out = String::new();
    for line in text.split("\r\n").filter(|l| !l.is_empty()) {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("if-none-match:") || lower.starts_with("connection:") {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut server = TcpStream::connect(upstream)?;
    server.write_all(out.as_bytes())?;
    server.write_all(&head[end..])?;
    let mut c2 = client.try_clone()?;
    let mut s2 = server.try_clone()?;
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c2, &mut s2);
        let _ = s2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
    Ok(())
}
