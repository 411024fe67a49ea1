//! `fake-hub`: serve a directory of `org/name` model folders as a Hugging Face Hub-compatible server.
//!
//! ```text
//! fake-hub --root DIR [--port N] [--gated org/name=TOKEN]... [--verbose]
//!          [--generate org/name [--size-mb N] [--files N] [--gate-generated TOKEN]]...
//! ```
//!
//! Prints `endpoint http://127.0.0.1:PORT` as the first stdout line, then serves until killed.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use orch_fake_hub::fixtures::{self, ModelOptions};
use orch_fake_hub::HubServer;
use orch_fake_hub::MARKER_FILE;

const USAGE: &str = "usage: fake-hub --root DIR [--port N] [--gated org/name=TOKEN]... [--verbose]
                [--generate org/name [--size-mb N] [--files N] [--seed N]]...

  --root DIR            serve every DIR/org/name folder as a model repo
                        (DIR/datasets/org/name and DIR/spaces/org/name as datasets/spaces)
  --port N              port on 127.0.0.1 (default: a free port)
  --gated REPO=TOKEN    gate REPO: only `Authorization: Bearer TOKEN` may download
  --generate REPO       generate a llama-like test model at DIR/REPO first (skipped when an
                        identical one was generated before); --size-mb/--files/--seed after it apply to it
  --size-mb N           weights size in MiB (default 1)
  --files N             number of safetensors shards (default 2)
  --seed N              data seed (default 42)
  --verbose             log every request to stderr

The first stdout line is `endpoint http://127.0.0.1:PORT`.";

struct Generate {
    repo: String,
    size_mb: u64,
    files: usize,
    seed: u64,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-hub: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut root: Option<PathBuf> = None;
    let mut port = 0u16;
    let mut gated: Vec<(String, String)> = Vec::new();
    let mut generate: Vec<Generate> = Vec::new();
    let mut verbose = false;

    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") && f != "--gated" => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => args.next().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        let num = |name: &str, v: String| -> Result<u64, String> {
            v.parse::<u64>().map_err(|_| format!("{name}: not a number: {v}"))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            "--root" => root = Some(PathBuf::from(value("--root")?)),
            "--port" => {
                let v = value("--port")?;
                port = v.parse().map_err(|_| format!("--port: bad port {v}"))?;
            }
            "--gated" => {
                let v = value("--gated")?;
                let (repo, token) = v.split_once('=').ok_or("--gated expects org/name=TOKEN")?;
                gated.push((repo.to_string(), token.to_string()));
            }
            "--generate" => generate.push(Generate {
                repo: value("--generate")?,
                size_mb: 1,
                files: 2,
                seed: 42,
            }),
            "--size-mb" | "--files" | "--seed" => {
                let v = num(&flag, value(&flag)?)?;
                let g = generate
                    .last_mut()
                    .ok_or_else(|| format!("{flag} must follow --generate"))?;
                match flag.as_str() {
                    "--size-mb" => g.size_mb = v,
                    "--files" => g.files = (v as usize).max(1),
                    _ => g.seed = v,
                }
            }
            "-v" | "--verbose" => verbose = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let root = root.ok_or("--root is required")?;
    std::fs::create_dir_all(&root).map_err(|e| format!("create {}: {e}", root.display()))?;

    for g in &generate {
        let stamp = format!("size_mb={} files={} seed={}", g.size_mb, g.files, g.seed);
        let dir = fixtures::repo_dir(&root, &g.repo);
        let marker = dir.join(MARKER_FILE);
        let previous = std::fs::read(&marker)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v.get("generator").and_then(|s| s.as_str()).map(str::to_string));
        if previous.as_deref() == Some(stamp.as_str()) {
            eprintln!("fake-hub: reusing generated {} ({stamp})", g.repo);
            continue;
        }
        if dir.exists() {
            // Different parameters: start from scratch so no stale shards remain.
            std::fs::remove_dir_all(&dir).map_err(|e| format!("remove {}: {e}", dir.display()))?;
        }
        let opts = ModelOptions::with_size_mb(g.size_mb, g.files).seed(g.seed);
        let model = fixtures::write_test_model(&root, &g.repo, &opts)
            .map_err(|e| format!("generate {}: {e}", g.repo))?;
        std::fs::write(&marker, serde_json::json!({ "generator": stamp }).to_string())
            .map_err(|e| format!("write {}: {e}", marker.display()))?;
        eprintln!(
            "fake-hub: generated {} ({} files, {} bytes)",
            g.repo,
            model.files.len(),
            model.total_size()
        );
    }

    let mut builder = HubServer::builder(&root).port(port).log_requests(verbose);
    for (repo, token) in gated {
        builder = builder.gated(repo, token);
    }
    let server = builder.start().map_err(|e| format!("start: {e}"))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "endpoint {}", server.endpoint()).map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    for m in server.models() {
        eprintln!(
            "fake-hub: serving {m} commit {}",
            server.commit(&m).unwrap_or_default()
        );
    }
    loop {
        std::thread::park();
    }
}
