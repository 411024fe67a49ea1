//! `orch build --agent --push REGISTRY` publishes the agent image (the
//! kubernetes backend's init container installs the agent from it) to a real
//! registry: Debian's `docker-registry` (the CNCF distribution registry),
//! started here on a loopback port, pushed to by this machine's Docker engine.
//! Needs Docker, the static agent (`bash scripts/prepare-docker.sh`) and
//! `docker-registry`; under CI a missing one fails, elsewhere the test is
//! skipped with the reason printed (`orch_testkit::skip`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{container_agent, orch};
use orch_testkit::skip;

/// Docker, the static agent and `docker-registry` are here; else skip or fail
/// ([`orch_testkit::skip`]).
fn ready() -> bool {
    let test = skip::current_test();
    let docker = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(docker, Ok(s) if s.success()) {
        return skip::skip_or_fail(&test, "no Docker engine reachable");
    }
    let agent = container_agent();
    if !agent.is_file() {
        return skip::skip_or_fail(
            &test,
            "the static agent is missing: run `bash scripts/prepare-docker.sh`",
        );
    }
    if registry_binary().is_none() {
        return skip::skip_or_fail(
            &test,
            "`docker-registry` is not installed (Debian: `apt-get install docker-registry`)",
        );
    }
    true
}

fn registry_binary() -> Option<PathBuf> {
    ["/usr/bin/docker-registry", "/usr/sbin/docker-registry"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry() -> Registry {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new(registry_binary().unwrap())
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&addr, "/v2/").is_none() {
        assert!(Instant::now() < deadline, "the registry did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    Registry {
        child,
        addr,
        _dir: dir,
    }
}

/// A plain HTTP GET; the body of a 200.
fn get(addr: &str, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

#[test]
fn the_agent_image_is_built_from_scratch_and_pushed_to_a_real_registry() {
    if !ready() {
        return;
    }
    let reg = start_registry();
    let out = orch()
        .args(["build", "--agent", "--push", &reg.addr])
        .env_remove("ORCH_AGENT_STATIC")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let pushed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        pushed.starts_with(&format!("{}/orch/orch-agent:", reg.addr)),
        "{pushed}\n{stderr}"
    );
    let tag = pushed.rsplit(':').next().unwrap();
    let tags = get(&reg.addr, "/v2/orch/orch-agent/tags/list").expect("the repository exists");
    assert!(tags.contains(tag), "{tags}");
    // The image is the static agent alone: one layer, `/orch-agent` runs.
    let run = Command::new("docker")
        .args(["run", "--rm", &pushed, "version"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("orch-agent"),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = Command::new("docker").args(["rmi", &pushed]).output();
}
