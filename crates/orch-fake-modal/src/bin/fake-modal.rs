//! `fake-modal`: a local server speaking Modal's gRPC protocol (see `orch_fake_modal`).
//!
//! ```text
//! fake-modal [--root DIR] [--port N] [--token ID:SECRET]
//!            [--image REF=DIR]... [--busybox-image REF]... [--nvml-stub LIB]
//!            [--fail-build TEXT] [--unavailable-gpu TYPE]... [--oom CELL]... [--terminate CELL]...
//!            [--kill-after SECS] [--transient N] [--drop-log-streams]
//!            [--throttle N[:SECS]] [--slow-ingest N] [--multipart BYTES]
//!            [--fail-blob-puts N] [--max-request-bytes N] [--rate-limit PER_S[:BURST[:METHOD,...]]]
//!            [--stats FILE]
//! ```
//!
//! Prints `url http://127.0.0.1:PORT` as the first stdout line (for
//! `MODAL_SERVER_URL`), then serves until killed (SIGTERM/SIGINT/SIGHUP: its
//! sandboxes are killed too, and with `--stats FILE` the calls it answered are
//! written to FILE as JSON first). Sandboxes run in their
//! image's root folder (a mount namespace and `chroot`): run it as root.

use orch_fake_modal::{FakeModal, Scenario};
use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: fake-modal [--root DIR] [--port N] [--token ID:SECRET]
                  [--image REF=DIR]... [--busybox-image REF]... [--nvml-stub LIB]
                  [--fail-build TEXT] [--unavailable-gpu TYPE]... [--oom CELL]... [--terminate CELL]...
                  [--kill-after SECS] [--transient N] [--drop-log-streams]
                  [--throttle N[:SECS]] [--slow-ingest N] [--multipart BYTES]
                  [--fail-blob-puts N] [--max-request-bytes N] [--rate-limit PER_S[:BURST[:METHOD,...]]]
                  [--stats FILE]

  --root DIR            volumes, blobs and sandbox folders (default: a temporary folder)
  --port N              port on 127.0.0.1 (default: a free port)
  --token ID:SECRET     accept only this token (default: any)
  --image REF=DIR       `FROM REF` is the root folder DIR (sandboxes chroot into it:
                        needs root); an image from an unmapped REF fails to build
  --busybox-image REF   `FROM REF` is a static busybox and nothing else
  --nvml-stub LIB       the NVML library GPU sandboxes get (NVIDIA container toolkit style)
  --fail-build TEXT     an image build fails at the Dockerfile step containing TEXT
  --unavailable-gpu T   sandboxes asking for GPU type T are never scheduled
  --oom CELL            sandboxes of cells containing CELL are OOM-killed after --kill-after
  --terminate CELL      ... or terminated after --kill-after
  --kill-after SECS     default 1
  --transient N         the first N calls answer UNAVAILABLE
  --drop-log-streams    log streams end after every batch (clients must resume)
  --throttle N[:SECS]   the first N SandboxCreate calls answer RESOURCE_EXHAUSTED with a
                        retry-after of SECS (default 1)
  --slow-ingest N       an uploaded file answers `exists: false` for N more asks
  --multipart BYTES     BlobCreate asks for multipart uploads in parts of BYTES
  --fail-blob-puts N    the first N blob PUTs answer 503 Slow Down
  --max-request-bytes N requests over N bytes are refused RESOURCE_EXHAUSTED
  --rate-limit PER_S[:BURST[:METHOD,...]]
                        unary calls (of each METHOD, default every one) over PER_S a second
                        (bursts of BURST, default 1) answer RESOURCE_EXHAUSTED with a
                        retry-after, as Modal throttles
  --stats FILE          on exit (SIGTERM, SIGINT, SIGHUP), write the calls answered to FILE
                        (JSON: counts by method, calls per second, calls told to wait)

The first stdout line is `url http://127.0.0.1:PORT`.";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fake-modal: {e}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("`{flag}` takes a number"))
}

fn run() -> Result<(), String> {
    let mut b = FakeModal::builder();
    let mut sc = Scenario {
        kill_after: Duration::from_secs(1),
        ..Default::default()
    };
    let mut stats = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--root" => b = b.root(val()?),
            "--port" => {
                b = b.port(
                    val()?
                        .parse()
                        .map_err(|_| "`--port` takes a number".to_string())?,
                )
            }
            "--token" => {
                let v = val()?;
                let (id, secret) = v.split_once(':').ok_or("`--token` is ID:SECRET")?;
                b = b.token(id, secret);
            }
            "--image" => {
                let v = val()?;
                let (r, d) = v.split_once('=').ok_or("`--image` takes REF=DIR")?;
                b = b.image(r, d);
            }
            "--busybox-image" => {
                let root = orch_fake_containers::container::busybox_root()
                    .map_err(|e| format!("cannot make a busybox root: {e}"))?;
                b = b.image(&val()?, root);
            }
            "--nvml-stub" => b = b.nvml_stub(val()?),
            "--fail-build" => sc.build_fail = Some(val()?),
            "--unavailable-gpu" => sc.unavailable_gpus.push(val()?),
            "--oom" => sc.oom.push(val()?),
            "--terminate" => sc.terminate.push(val()?),
            "--kill-after" => {
                sc.kill_after = Duration::from_secs_f64(
                    val()?
                        .parse()
                        .map_err(|_| "`--kill-after` takes seconds".to_string())?,
                )
            }
            "--transient" => {
                sc.transient_failures = val()?
                    .parse()
                    .map_err(|_| "`--transient` takes a number".to_string())?
            }
            "--drop-log-streams" => sc.drop_log_streams = true,
            "--throttle" => {
                let v = val()?;
                let (n, secs) = v.split_once(':').unwrap_or((v.as_str(), "1"));
                sc.throttle_sandbox_creates = n
                    .parse()
                    .map_err(|_| "`--throttle` takes N or N:SECS".to_string())?;
                sc.throttle_after = Duration::from_secs_f64(
                    secs.parse()
                        .map_err(|_| "`--throttle` takes N or N:SECS".to_string())?,
                );
            }
            "--slow-ingest" => sc.slow_ingestion = number(&a, &val()?)?,
            "--multipart" => sc.multipart_part_bytes = Some(number(&a, &val()?)?),
            "--fail-blob-puts" => sc.fail_blob_puts = number(&a, &val()?)?,
            "--max-request-bytes" => sc.max_request_bytes = Some(number(&a, &val()?)?),
            "--rate-limit" => {
                let v = val()?;
                let mut parts = v.splitn(3, ':');
                let per_s = number(&a, parts.next().unwrap_or_default())?;
                let burst = parts.next().map(|b| number(&a, b)).transpose()?.unwrap_or(1);
                let methods = parts
                    .next()
                    .map(|m| m.split(',').map(String::from).collect())
                    .unwrap_or_default();
                sc.rate_limit = Some(orch_fake_modal::RateLimit {
                    per_s,
                    burst,
                    methods,
                });
            }
            "--stats" => stats = Some(std::path::PathBuf::from(val()?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    // SIGTERM, SIGINT and SIGHUP are taken by `sigwait` below, so the server's drop kills
    // every sandbox it started. The mask is set before any thread starts (threads inherit it;
    // sandboxes get an empty mask from std's Command).
    // SAFETY: plain libc calls on a zeroed, then initialised, signal set.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let started = Instant::now();
    let server = b.scenario(sc).start().map_err(|e| format!("cannot start: {e}"))?;
    println!("url {}", server.url());
    let _ = std::io::stdout().flush();
    let mut sig = 0;
    // SAFETY: `set` was initialised above; `sig` is a valid out pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    let written = match &stats {
        Some(path) => std::fs::write(path, stats_json(&server, started).to_string())
            .map_err(|e| format!("cannot write `{}`: {e}", path.display())),
        None => Ok(()),
    };
    drop(server);
    written
}

/// What `--stats` writes: calls by method, calls in each second since the start, and
/// the calls the rate limit told to wait (`told`), sent again too early (`early`) or
/// after waiting as told (`waited`).
fn stats_json(server: &FakeModal, started: Instant) -> serde_json::Value {
    let calls = server.calls();
    let mut per_second: Vec<u64> = Vec::new();
    for c in &calls {
        let s = c.at.saturating_duration_since(started).as_secs() as usize;
        if per_second.len() <= s {
            per_second.resize(s + 1, 0);
        }
        per_second[s] += 1;
    }
    let t = server.throttling();
    serde_json::json!({
        "requests": calls.len(),
        "by_method": server.counts(),
        "per_second": per_second,
        "throttled": t.told.values().sum::<usize>(),
        "throttled_by_method": t.told,
        "throttled_early": t.early,
        "throttled_waited": t.waited,
    })
}
