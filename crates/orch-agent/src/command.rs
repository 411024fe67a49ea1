//! The `command` workload: any program, supervised.
//!
//! - stdout and stderr go to `stdout.log` / `stderr.log` in the output folder
//!   (head and tail kept for huge outputs, see [`crate::capture`]);
//! - metrics come from the JSON file at `$ORCH_METRICS_FILE` and from stdout
//!   lines `ORCH_METRIC name=value [name=value ...]`; a value that is not a
//!   finite number (`NaN`, `inf`, `1e400`, `x`) is left out, the same way
//!   from either place: a `warning:` line in the cell's log (a message
//!   event, `agent.log` on the host) and a note in the record
//!   (`info.metric_notes`); it never fails the cell. A metrics file that is
//!   not a JSON object fails it (`bad_metrics`). Lines up to
//!   [`MAX_SCANNED_LINE`] (1 MiB) are read whole; an `ORCH_METRIC` line
//!   longer than that is refused with a warning, never dropped silently;
//! - phases come from stdout lines `ORCH_PHASE warmup|measure|teardown`; a
//!   command that prints none has its whole run counted as `measure`;
//! - the program runs in its own process group, killed as a whole at the end,
//!   on timeout and on stop (SIGTERM, then SIGKILL after the grace period);
//! - it dies with the agent (`PR_SET_PDEATHSIG`), so nothing is orphaned;
//!   it starts inside the cell (a PID namespace of its own through the cell
//!   launcher, [`crate::cellinit`], and the cell's cgroup, where the agent
//!   has them: [`crate::reaper`]); its exit code or signal is the program's
//!   either way.

use crate::capture::Capture;
use crate::ctx::Ctx;
use orch_protocol::{
    CellResult, CommandWorkload, Failure, FailureKind, Phase, Status, StreamInfo, TaskSpec, METRICS_FILE_ENV,
    METRIC_LINE_PREFIX, PHASE_LINE_PREFIX,
};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Longest stdout line scanned for `ORCH_*` markers (1 MiB); longer lines
/// are logged, and an `ORCH_METRIC` one is refused with a warning.
pub const MAX_SCANNED_LINE: usize = 1024 * 1024;

/// The record's `info` key listing metrics left out (not finite numbers).
pub const METRIC_NOTES_KEY: &str = "metric_notes";

enum Note {
    Metric(String, f64),
    Phase(Phase),
    /// A metric left out, and why.
    Refused(String),
}

pub fn run(cmd: &CommandWorkload, task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    run_with_logs(cmd, task, out_dir, ctx, "", &[])
}

/// Run a command whose logs are `<prefix>stdout.log`/`<prefix>stderr.log`
/// (and metrics file `<prefix>metrics.json`), with extra environment.
pub fn run_with_logs(
    cmd: &CommandWorkload,
    task: &TaskSpec,
    out_dir: &Path,
    ctx: &mut Ctx,
    prefix: &str,
    extra_env: &[(String, String)],
) -> CellResult {
    let cell = task.cell_id.as_str();
    let Some(program) = cmd.argv.first() else {
        return CellResult::failed(
            cell,
            Status::Failed,
            FailureKind::InvalidConfig,
            "`argv` is empty",
        );
    };
    let metrics_path = out_dir.join(format!("{prefix}metrics.json"));
    let _ = std::fs::remove_file(&metrics_path);

    let mut command = match supervised(&cmd.argv, cmd.workdir.as_deref(), task, extra_env) {
        Ok(c) => c,
        Err(r) => return *r,
    };
    command.env(METRICS_FILE_ENV, &metrics_path);
    let token = Some(command.token().to_string());

    let (out_cap, err_cap) = match (
        Capture::create(&out_dir.join(format!("{prefix}stdout.log")), task.logs),
        Capture::create(&out_dir.join(format!("{prefix}stderr.log")), task.logs),
    ) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            return CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::AgentIo,
                format!("cannot create log files in `{}`: {e}", out_dir.display()),
            )
        }
    };

    let mut spawned = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            let mut r = CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::Spawn,
                format!("cannot start `{program}`: {e}"),
            );
            r.stdout = finish_quietly(out_cap);
            r.stderr = finish_quietly(err_cap);
            return r;
        }
    };
    let child = &mut spawned.child;
    let pgid = child.id() as i32;
    // Until its first `ORCH_PHASE` line the command is starting up (the live
    // view says `start`, not `measure`); a command that reports no phases
    // has all of its run counted as `measure` when it ends.
    ctx.enter(Phase::Start);

    let (tx, rx) = mpsc::channel::<Note>();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let (done_tx, done_rx) = mpsc::channel::<(bool, std::io::Result<StreamInfo>)>();
    let out_thread = stdout.map(|s| {
        let done = done_tx.clone();
        thread::spawn(move || {
            let r = pump(s, out_cap, Some(|l: &[u8], cut: bool| scan_line(l, cut, &tx)));
            let _ = done.send((true, r));
        })
    });
    let err_thread = stderr.map(|s| {
        let done = done_tx.clone();
        thread::spawn(move || {
            let r = pump(s, err_cap, None::<fn(&[u8], bool)>);
            let _ = done.send((false, r));
        })
    });
    drop(done_tx);

    let deadline = Instant::now() + secs(task.measure.timeout_s - ctx.elapsed());
    let mut metrics = Metrics::default();
    let mut saw_phase = false;
    let mut ended_by: Option<Status> = None;
    let exit: ExitStatus = loop {
        for note in rx.try_iter() {
            handle_note(note, ctx, &mut metrics, &mut saw_phase);
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                kill_group(pgid, libc::SIGKILL);
                let _ = child.wait();
                kill_marked(token.as_deref());
                return CellResult::failed(
                    cell,
                    Status::Failed,
                    FailureKind::AgentIo,
                    format!("cannot wait for the command: {e}"),
                );
            }
        }
        if ended_by.is_none() {
            if ctx.stop_requested() {
                ended_by = Some(Status::Cancelled);
            } else if Instant::now() >= deadline {
                ended_by = Some(Status::Timeout);
            }
            if ended_by.is_some() {
                ctx.message(match ended_by {
                    Some(Status::Timeout) => format!(
                        "timeout after {:.0}s: stopping the command",
                        task.measure.timeout_s
                    ),
                    _ => "stop requested: stopping the command".to_string(),
                });
                break terminate(child, pgid, task.measure.kill_grace_s);
            }
        }
        thread::sleep(Duration::from_millis(10));
    };
    for note in rx.try_iter() {
        handle_note(note, ctx, &mut metrics, &mut saw_phase);
    }
    if !saw_phase {
        ctx.relabel(Phase::Measure);
    }
    ctx.enter(Phase::Teardown);
    // Whatever the command left in its process group goes too, and so does
    // whatever left the group (`setsid`, daemons): found by its mark.
    // In a PID namespace, its init has already killed them and says how many.
    kill_group(pgid, libc::SIGKILL);
    let mut leftovers = kill_marked(token.as_deref());
    let left = leftovers.len() + spawned.left_outside_group();
    if left > 0 {
        ctx.message(format!(
            "killed {left} process(es) the command left running outside its process group"
        ));
    }
    // On a GPU cell the cell ends when the GPU memory they held is free.
    if !task.gpu.is_cpu() {
        leftovers.push(pgid);
        leftovers.push(spawned.main_pid);
        crate::reaper::wait_gpu_released(&leftovers, Duration::from_secs(60));
    }

    // Readers end when the pipes close; a grandchild that left the group can
    // hold them open, so wait a bounded time.
    let mut out_info = StreamInfo::default();
    let mut err_info = StreamInfo::default();
    let wait_until = Instant::now() + Duration::from_secs(3);
    for _ in 0..2 {
        let left = wait_until.saturating_duration_since(Instant::now());
        match done_rx.recv_timeout(left) {
            Ok((is_out, Ok(info))) => {
                if is_out {
                    out_info = info
                } else {
                    err_info = info
                }
            }
            Ok((_, Err(e))) => ctx.message(format!("log capture failed: {e}")),
            Err(_) => {
                ctx.message("an output pipe stayed open after the command ended: log tail not kept");
                break;
            }
        }
    }
    for t in [out_thread, err_thread].into_iter().flatten() {
        if t.is_finished() {
            let _ = t.join();
        }
    }
    for note in rx.try_iter() {
        handle_note(note, ctx, &mut metrics, &mut saw_phase);
    }

    let mut result = CellResult::new(cell, Status::Succeeded);
    result.stdout = out_info;
    result.stderr = err_info;
    result
        .info
        .insert("argv0".into(), serde_json::Value::String(program.clone()));

    match read_metrics_file(&metrics_path) {
        Ok(Some((m, refused))) => {
            metrics.values.extend(m);
            for why in refused {
                metrics.refuse(ctx, why);
            }
        }
        Ok(None) => {}
        Err(msg) => {
            result.failure = Some(Failure::new(FailureKind::BadMetrics, msg));
            result.status = Status::Failed;
        }
    }
    if !metrics.notes.is_empty() {
        result.info.insert(
            METRIC_NOTES_KEY.into(),
            serde_json::Value::Array(metrics.notes.into_iter().map(serde_json::Value::String).collect()),
        );
    }
    result.metrics = metrics.values;

    let exit_code = exit.code();
    let signal = exit.signal();
    if let Some(status) = ended_by {
        let message = match status {
            Status::Timeout => format!("command did not finish within {:.0}s", task.measure.timeout_s),
            _ => "command stopped on request".to_string(),
        };
        result.status = status;
        result.failure = Some(Failure {
            kind: FailureKind::of_status(status),
            message,
            exit_code,
            signal,
        });
    } else if exit.success() {
        // bad_metrics (if any) stands
    } else {
        let tail = last_line(&out_dir.join(format!("{prefix}stderr.log")));
        let (kind, mut message) = match (exit_code, signal) {
            (Some(code), _) => (FailureKind::ExitCode, format!("command exited with code {code}")),
            (None, Some(sig)) => (
                FailureKind::Signal,
                format!("command killed by signal {sig} ({})", signal_name(sig)),
            ),
            _ => (FailureKind::ExitCode, "command ended abnormally".to_string()),
        };
        if let Some(t) = tail {
            message.push_str(&format!("; last stderr line: {t}"));
        }
        result.status = Status::Failed;
        result.failure = Some(Failure {
            kind,
            message,
            exit_code,
            signal,
        });
    }
    result
}

/// The metrics a command reported, and the notes on those left out.
#[derive(Default)]
struct Metrics {
    values: BTreeMap<String, f64>,
    notes: Vec<String>,
}

/// Notes (and warning lines) at most: a workload printing `NaN` in a loop
/// must not grow the record or the log without bound. The last one says
/// that more were left out.
const MAX_METRIC_NOTES: usize = 50;

impl Metrics {
    fn refuse(&mut self, ctx: &mut Ctx, why: String) {
        let why = match self.notes.len() {
            n if n < MAX_METRIC_NOTES - 1 => why,
            n if n == MAX_METRIC_NOTES - 1 => {
                "more metrics were left out than are listed (not finite numbers)".to_string()
            }
            _ => return,
        };
        ctx.message(format!("warning: {why}"));
        self.notes.push(why);
    }
}

fn handle_note(note: Note, ctx: &mut Ctx, metrics: &mut Metrics, saw_phase: &mut bool) {
    match note {
        Note::Metric(k, v) => {
            metrics.values.insert(k, v);
        }
        Note::Refused(why) => metrics.refuse(ctx, why),
        Note::Phase(p) => {
            // Time before the first phase line was process start-up (the
            // phase opened at spawn).
            *saw_phase = true;
            if ctx.phase() != Some(p) {
                ctx.enter(p);
            }
        }
    }
}

/// The variable naming where the cell's files landed (`orch-files`).
const FILES_ENV: &str = "ORCH_FILES";

/// A workload process ready to start ([`supervised`]): its argv, folder,
/// environment (in the order given: a later value wins) and mark.
pub(crate) struct Supervised {
    argv: Vec<String>,
    workdir: Option<String>,
    env: Vec<(OsString, OsString)>,
    token: String,
    /// Through the cell launcher (a PID namespace, [`crate::cellinit`]),
    /// unless the task's `env` turned it off.
    via_launcher: bool,
}

impl Supervised {
    /// One more variable (it wins over those given before).
    pub(crate) fn env(&mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> &mut Self {
        self.env.push((k.as_ref().to_owned(), v.as_ref().to_owned()));
        self
    }

    /// The mark of this process and its descendants ([`crate::reaper`]).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// Start it: piped stdout and stderr, null stdin, a process group of its
    /// own (the launcher's, where there is one: the agent's group signals
    /// reach the program through it), the cell's cgroup, `PR_SET_PDEATHSIG`
    /// bound to the agent.
    pub(crate) fn spawn(&self) -> std::io::Result<crate::cellinit::Spawned> {
        let agent = std::process::id() as i32;
        let configure = |cmd: &mut Command| {
            cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(dir) = &self.workdir {
                cmd.current_dir(dir);
            }
            // SAFETY: only async-signal-safe calls (open/write/close,
            // setpgid, prctl, getppid) between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    crate::reaper::join_cell_in_child();
                    if libc::setpgid(0, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    #[cfg(target_os = "linux")]
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    // The agent died before the line above: nothing would
                    // ever end this process.
                    if libc::getppid() != agent {
                        return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                });
            }
        };
        crate::cellinit::spawn(&self.argv, self.via_launcher, &configure)
    }
}

/// A workload process as every workload runs one: piped output, its own
/// process group, killed if the agent dies, in the cell (its PID namespace
/// and cgroup, where the agent has them: [`crate::reaper`]), the cell's
/// environment (weights offline from the weights volume, `ORCH_*`, params,
/// the suite's env, which may override the rest). `Err` is the cell's failure.
pub(crate) fn supervised(
    argv: &[String],
    workdir: Option<&str>,
    task: &TaskSpec,
    extra_env: &[(String, String)],
) -> Result<Supervised, Box<CellResult>> {
    let cell = task.cell_id.as_str();
    if argv.is_empty() {
        return Err(Box::new(CellResult::failed(
            cell,
            Status::Failed,
            FailureKind::InvalidConfig,
            "the command is empty",
        )));
    }
    // `{{files}}` in a suite is `${ORCH_FILES}`: where the cell's files
    // landed, in a command's arguments as in a shell's.
    let files = task.env.get(FILES_ENV);
    let expand = |a: &String| match files {
        Some(f) => a.replace("${ORCH_FILES}", f),
        None => a.clone(),
    };
    let token = crate::reaper::spawn_token();
    let mut sup = Supervised {
        argv: argv.iter().map(expand).collect(),
        workdir: None,
        env: Vec::new(),
        token: token.clone(),
        via_launcher: !crate::cellinit::opted_out_by(
            task.env.get(crate::cellinit::PIDNS_ENV).map(String::as_str),
        ),
    };
    sup.env("HF_HUB_OFFLINE", "1");
    if let Some(d) = &task.weights_dir {
        sup.env("HF_HUB_CACHE", d);
    }
    sup.env("ORCH_CELL_ID", &task.cell_id)
        .env("ORCH_RUN_ID", &task.run_id)
        .env("ORCH_GPU", task.gpu.as_str())
        .env(crate::reaper::TOKEN_ENV, &token);
    for (k, v) in &task.params {
        let value = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        sup.env(format!("ORCH_PARAM_{}", env_name(k)), value);
    }
    for (k, v) in extra_env {
        sup.env(k, v);
    }
    for (k, v) in &task.env {
        sup.env(k, expand(v));
    }
    if let Some(dir) = workdir {
        if !Path::new(dir).is_dir() {
            return Err(Box::new(CellResult::failed(
                cell,
                Status::Failed,
                FailureKind::Spawn,
                format!(
                    "the working directory `{dir}` does not exist here; hint: fix `workdir`, or leave it out"
                ),
            )));
        }
        sup.workdir = Some(dir.to_string());
    }
    Ok(sup)
}

/// The longest duration the agent waits for anything (about 31 years): a
/// task's seconds become a `Duration` that `Instant + ` never overflows.
const MAX_WAIT_S: f64 = 1e9;

/// Seconds as a `Duration`, saturating: negative or NaN is zero, anything
/// over [`MAX_WAIT_S`] (infinity included) is `MAX_WAIT_S`. Never panics,
/// whatever a task (or a hand-edited `plan.json`) says.
pub(crate) fn secs(s: f64) -> Duration {
    let s = if s.is_nan() { 0.0 } else { s.clamp(0.0, MAX_WAIT_S) };
    Duration::from_secs_f64(s)
}

/// SIGTERM the group, wait up to `grace_s`, then SIGKILL.
pub(crate) fn terminate(child: &mut Child, pgid: i32, grace_s: f64) -> ExitStatus {
    kill_group(pgid, libc::SIGTERM);
    let until = Instant::now() + secs(grace_s);
    while Instant::now() < until {
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        thread::sleep(Duration::from_millis(10));
    }
    kill_group(pgid, libc::SIGKILL);
    match child.wait() {
        Ok(s) => s,
        // The child was spawned by us and not yet reaped: wait cannot fail
        // except on EINTR storms; report it as killed.
        Err(_) => ExitStatus::from_raw(libc::SIGKILL),
    }
}

/// Kill every process carrying a workload process's mark (see [`crate::reaper`]).
pub(crate) fn kill_marked(token: Option<&str>) -> Vec<i32> {
    token.map(crate::reaper::kill_marked).unwrap_or_default()
}

pub(crate) fn kill_group(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; ESRCH (group gone) is fine.
    unsafe {
        libc::kill(-pgid, sig);
    }
}

/// Copy a pipe into its capture with the cell's secrets masked (also when a
/// secret is split across reads), handing each line (cut at `\n` or `\r`)
/// to `on_line` when given, with `false`; a line over [`MAX_SCANNED_LINE`]
/// bytes is handed on as its first `MAX_SCANNED_LINE` bytes with `true`.
pub(crate) fn pump(
    src: impl Read,
    cap: Capture,
    on_line: Option<impl FnMut(&[u8], bool)>,
) -> std::io::Result<StreamInfo> {
    pump_masked(src, cap, on_line, crate::secrets::masker())
}

/// [`pump`] with a given masker.
pub fn pump_masked(
    mut src: impl Read,
    mut cap: Capture,
    mut on_line: Option<impl FnMut(&[u8], bool)>,
    masker: &orch_protocol::mask::Masker,
) -> std::io::Result<StreamInfo> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut line_too_long = false;
    let mut mask = (!masker.is_empty()).then(|| masker.stream());
    let mut masked: Vec<u8> = Vec::new();
    let mut raw_bytes = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        raw_bytes += n as u64;
        match mask.as_mut() {
            Some(m) => {
                masked.clear();
                m.push(&buf[..n], &mut masked);
                cap.write(&masked)?;
            }
            None => cap.write(&buf[..n])?,
        }
        if let Some(f) = on_line.as_mut() {
            for &b in &buf[..n] {
                if b == b'\n' || b == b'\r' {
                    if !line.is_empty() {
                        f(&line, line_too_long);
                    }
                    line.clear();
                    line_too_long = false;
                } else if line.len() < MAX_SCANNED_LINE {
                    line.push(b);
                } else {
                    line_too_long = true;
                }
            }
        }
    }
    if let Some(f) = on_line.as_mut() {
        if !line.is_empty() {
            f(&line, line_too_long);
        }
    }
    if let Some(m) = mask.as_mut() {
        masked.clear();
        m.finish(&mut masked);
        cap.write(&masked)?;
    }
    let mut info = cap.finish()?;
    // What the workload wrote, not what was kept after masking.
    info.bytes = raw_bytes;
    Ok(info)
}

fn scan_line(line: &[u8], cut: bool, tx: &mpsc::Sender<Note>) {
    if cut {
        let head = String::from_utf8_lossy(&line[..line.len().min(64)]);
        if head.trim_start().starts_with(METRIC_LINE_PREFIX) {
            let _ = tx.send(Note::Refused(format!(
                "an `{METRIC_LINE_PREFIX}` line longer than {} MiB was not read: print one line per few metrics, or write them to `${METRICS_FILE_ENV}`",
                MAX_SCANNED_LINE >> 20
            )));
        }
        return;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return;
    };
    for note in parse_marker_line(text) {
        let _ = tx.send(note);
    }
}

/// Parse `ORCH_METRIC a=1 b=2.5` and `ORCH_PHASE measure` lines.
fn parse_marker_line(text: &str) -> Vec<Note> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix(METRIC_LINE_PREFIX) {
        if !rest.starts_with(char::is_whitespace) {
            return vec![];
        }
        return rest
            .split_whitespace()
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                if k.is_empty() {
                    return None;
                }
                Some(match v.parse::<f64>() {
                    Ok(x) if x.is_finite() => Note::Metric(k.to_string(), x),
                    _ => Note::Refused(refused(k, v, METRIC_LINE_PREFIX)),
                })
            })
            .collect();
    }
    if let Some(rest) = text.strip_prefix(PHASE_LINE_PREFIX) {
        if let Some(p) = Phase::parse(rest) {
            if rest.starts_with(char::is_whitespace) {
                return vec![Note::Phase(p)];
            }
        }
    }
    vec![]
}

/// The note on a metric left out.
fn refused(name: &str, value: &str, from: &str) -> String {
    let value: String = value.chars().take(40).collect();
    format!("metric `{name}` left out: `{value}` (from {from}) is not a finite number")
}

/// Prefix of the JSON string a non-finite number token of a metrics file
/// becomes before parsing (a NUL never starts a metric a workload wrote).
const NON_FINITE_MARK: &str = "\u{0}non-finite:";

/// The metrics file, if the command wrote one (see
/// [`orch_protocol::parse_metrics_json`]), and the notes on the values left
/// out. JSON has no `NaN` or `Infinity` and `serde_json` refuses `1e400`,
/// but Python's `json.dump` writes the first two: each such number token is
/// turned into a marked string first, so one bad value costs its metric,
/// not the cell's.
/// A metrics file's values and the notes on the values left out.
type MetricsRead = (BTreeMap<String, f64>, Vec<String>);

fn read_metrics_file(path: &Path) -> Result<Option<MetricsRead>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read the metrics file `{}`: {e}", path.display())),
    };
    let text = mark_non_finite(&text);
    let mut metrics = orch_protocol::parse_metrics_json(&text)?;
    // The marked values were strings, so `parse_metrics_json` left them out;
    // find their names the same way it names metrics.
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut notes = Vec::new();
    marked_names("", &value, &mut notes);
    for (name, _) in &notes {
        metrics.remove(name);
    }
    let from = format!("`${METRICS_FILE_ENV}`");
    Ok(Some((
        metrics,
        notes.into_iter().map(|(k, v)| refused(&k, &v, &from)).collect(),
    )))
}

/// The names (flattened like [`orch_protocol::parse_metrics_json`]: `a.b`,
/// `{value: ..}` objects as their key) of the values [`mark_non_finite`] marked.
fn marked_names(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    match v {
        Value::String(s) => {
            if let Some(token) = s.strip_prefix(NON_FINITE_MARK) {
                out.push((prefix.to_string(), token.to_string()));
            }
        }
        Value::Object(map) => {
            if let (Some(inner), false) = (map.get("value"), prefix.is_empty()) {
                if !inner.is_object() {
                    return marked_names(prefix, inner, out);
                }
            }
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                marked_names(&key, v, out);
            }
        }
        _ => {}
    }
}

/// `NaN`, `Infinity`, `-Infinity`, `inf` and numbers too large for an
/// `f64` (`1e400`), outside strings, as marked JSON strings; the rest of
/// the text unchanged.
fn mark_non_finite(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.char_indices().peekable();
    let mut in_string = false;
    let mut escaped = false;
    while let Some((i, c)) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        if c == '"' {
            in_string = true;
            out.push(c);
            continue;
        }
        if !(c == '-' || c == '+' || c.is_ascii_alphanumeric()) {
            out.push(c);
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if d.is_ascii_alphanumeric() || matches!(d, '.' | '-' | '+' | '_') {
                end = j + d.len_utf8();
                chars.next();
            } else {
                break;
            }
        }
        let token = &text[i..end];
        let non_finite = match token {
            "true" | "false" | "null" => false,
            _ => {
                let lower = token.trim_start_matches(['-', '+']).to_ascii_lowercase();
                matches!(lower.as_str(), "nan" | "inf" | "infinity")
                    || token.parse::<f64>().is_ok_and(|x| !x.is_finite())
            }
        };
        if non_finite {
            out.push_str(&serde_json::Value::String(format!("{NON_FINITE_MARK}{token}")).to_string());
        } else {
            out.push_str(token);
        }
    }
    out
}

pub(crate) fn env_name(k: &str) -> String {
    k.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn finish_quietly(cap: Capture) -> StreamInfo {
    cap.finish().unwrap_or_default()
}

/// Last non-empty line of a log (at most 300 characters), for failure messages.
pub(crate) fn last_line(path: &Path) -> Option<String> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    let start = len.saturating_sub(4096);
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let line = text.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    Some(line.chars().take(300).collect())
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_saturate() {
        assert_eq!(secs(-1.0), Duration::ZERO);
        assert_eq!(secs(f64::NAN), Duration::ZERO);
        assert_eq!(secs(1.5), Duration::from_millis(1500));
        assert_eq!(secs(1.8446744073709552e19), secs(f64::INFINITY));
        let _ = Instant::now() + secs(f64::INFINITY);
    }

    #[test]
    fn marker_lines() {
        let notes = parse_marker_line("ORCH_METRIC tokens_per_s=123.5 loss=0.25 junk bad=x");
        let got: Vec<(String, f64)> = notes
            .into_iter()
            .filter_map(|n| match n {
                Note::Metric(k, v) => Some((k, v)),
                _ => None,
            })
            .collect();
        assert_eq!(got, vec![("tokens_per_s".into(), 123.5), ("loss".into(), 0.25)]);
        let refused: Vec<String> = parse_marker_line("ORCH_METRIC a=NaN b=inf c=1e400 d=2 e=-inf")
            .into_iter()
            .filter_map(|n| match n {
                Note::Refused(why) => Some(why),
                _ => None,
            })
            .collect();
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert!(refused[0].contains("metric `a` left out: `NaN`"), "{refused:?}");
        assert!(refused[2].contains("`1e400`"), "{refused:?}");
        assert!(matches!(
            parse_marker_line("ORCH_PHASE warmup")[..],
            [Note::Phase(Phase::Warmup)]
        ));
        assert!(parse_marker_line("ORCH_PHASEwarmup").is_empty());
        assert!(parse_marker_line("ORCH_METRICS a=1").is_empty());
        assert!(parse_marker_line("say ORCH_METRIC a=1").is_empty());
    }

    #[test]
    fn metrics_file_flattening() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.json");
        std::fs::write(
            &p,
            r#"{"a": 1, "b": {"c": 2.5, "d": "x"}, "e": {"value": 7, "unit": "ms"}}"#,
        )
        .unwrap();
        let (m, notes) = read_metrics_file(&p).unwrap().unwrap();
        assert!(notes.is_empty());
        assert_eq!(m.get("a"), Some(&1.0));
        assert_eq!(m.get("b.c"), Some(&2.5));
        assert_eq!(m.get("e"), Some(&7.0));
        assert_eq!(m.len(), 3);
        std::fs::write(
            &p,
            r#"{"ok": 2, "nan": NaN, "b": {"inf": -Infinity, "big": 1e400, "s": "NaN \" 1e400"}, "e": {"value": Infinity}}"#,
        )
        .unwrap();
        let (m, notes) = read_metrics_file(&p).unwrap().unwrap();
        assert_eq!(m, BTreeMap::from([("ok".to_string(), 2.0)]));
        let joined = notes.join("\n");
        for name in ["`nan`", "`b.inf`", "`b.big`", "`e`"] {
            assert!(joined.contains(name), "{name} in {joined}");
        }
        assert_eq!(notes.len(), 4, "{joined}");
        std::fs::write(&p, "[1]").unwrap();
        assert!(read_metrics_file(&p).is_err());
        assert!(read_metrics_file(&dir.path().join("none")).unwrap().is_none());
    }
}
