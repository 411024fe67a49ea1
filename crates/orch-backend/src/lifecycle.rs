//! One cell's lifecycle, the same on every backend.
//!
//! A backend implements [`Platform`]: what is its own (get the agent running,
//! read its stream, stop it, say how it ended, clean up). [`drive`] does the
//! rest, once for all of them:
//!
//! 1. until the agent runs ([`Platform::started`]), only a cancel stops the
//!    cell (the platform bounds its own provisioning: scheduling, queues,
//!    image pulls);
//! 2. then the host deadline is armed ([`host_limit`], counted from the
//!    start), and the agent's stream is read into the cell folder
//!    ([`Stream`]: plain event lines, or shipping frames that carry the files
//!    home), relaying events as they come;
//! 3. a cancel or the deadline asks the platform to stop the cell
//!    ([`Stop`]); past the grace period it is killed, and past that the host
//!    stops waiting;
//! 4. the end: the agent's result, else one the platform recovers (a
//!    `agent-result.json`, a termination message), else one made up from what
//!    the platform says ([`PlatformEnd`]), by one set of rules ([`judge`]):
//!    a stop by the host is `cancelled`/`timeout`, a platform's OOM kill,
//!    eviction, lost node, time limit or preemption names the end whatever
//!    the agent managed to say, a `cancelled` the host did not ask for is
//!    the platform's stop from outside ([`Platform::stopped_outside`]), an
//!    agent killed by a signal of its own is `agent_crashed`. A platform
//!    says what it did or saw ([`PlatformEnd`]); how that ranks against the
//!    agent's own result is decided here only;
//! 5. everything the cell left in its folder is masked on the host
//!    ([`crate::secrets::mask_dir`]), whatever the agent masked itself;
//! 6. billing starts when the platform started the cell's container, as the
//!    platform says it ([`Cell::container_started`], in `started` or `end`):
//!    `info.container_started_at` ([`CONTAINER_STARTED_AT`]); `null` for a cell
//!    that ended before its agent ran with no container said started (a sandbox
//!    never created or scheduled, an image never pulled), which costs nothing.
//!
//! A cancel is the `cancel` receiver turning `true`; its sender going away
//! is no cancel (the runner holds it for the run's life).

use crate::home::Home;
use crate::{BackendError, CellEvent, CellLaunch, EventRelay};
use async_trait::async_trait;
use orch_protocol::mask::Masker;
use orch_protocol::{CellResult, Event, Failure, FailureKind, Measure, Phase, Status, TaskSpec};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Past a platform's own limit, how long the host waits before it stops a
/// cell itself, and, once stopped, how long past the grace period it waits
/// for the end.
pub const HOST_SLACK: Duration = Duration::from_secs(30);

/// `info` key of where billing starts (`orch_record::CONTAINER_STARTED_AT`): the
/// platform's start of the cell's container (RFC 3339), `null` when the cell ended
/// before its agent ran and the platform said of no container started.
pub const CONTAINER_STARTED_AT: &str = "container_started_at";

/// After a kill, how long the host waits for the stream to end.
const AFTER_KILL: Duration = Duration::from_secs(10);

/// The limit a platform is told for a cell (Slurm's `--time`, a Job's
/// `activeDeadlineSeconds`, a sandbox's timeout): the task's timeout, its
/// kill grace (at least a second) and a minute to start and report.
pub fn platform_limit(m: &Measure) -> Duration {
    Duration::from_secs_f64(m.timeout_s.max(0.0) + grace(m).as_secs_f64() + 60.0)
}

/// The host's own deadline for a cell, counted from the agent's start: the
/// platform's limit and [`HOST_SLACK`], for a platform (or an agent) that did
/// not end the cell in time.
pub fn host_limit(m: &Measure) -> Duration {
    platform_limit(m) + HOST_SLACK
}

/// The grace period between asking a cell to stop and killing it.
pub fn grace(m: &Measure) -> Duration {
    Duration::from_secs_f64(m.kill_grace_s.max(1.0))
}

/// Why the host stopped a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Ctrl-C, `--max-cost`, a run being stopped.
    Cancelled,
    /// The host deadline passed.
    Timeout,
}

impl Stop {
    pub fn status(self) -> Status {
        match self {
            Stop::Cancelled => Status::Cancelled,
            Stop::Timeout => Status::Timeout,
        }
    }
}

/// Cancel and the host deadline, as one future that fires once.
pub struct Stopper {
    cancel: watch::Receiver<bool>,
    deadline: Option<tokio::time::Instant>,
    fired: Option<Stop>,
}

impl Stopper {
    pub fn new(cancel: watch::Receiver<bool>) -> Stopper {
        Stopper {
            cancel,
            deadline: None,
            fired: None,
        }
    }

    /// Start the host deadline now.
    pub fn arm(&mut self, limit: Duration) {
        self.deadline = Some(tokio::time::Instant::now() + limit);
    }

    /// Why the cell was stopped, once it was.
    pub fn stopped(&self) -> Option<Stop> {
        self.fired
    }

    /// Resolves once, when the cell must stop (a cancel asked before the
    /// call counts); never again after that.
    pub async fn next(&mut self) -> Stop {
        if self.fired.is_some() {
            return std::future::pending().await;
        }
        let deadline = self.deadline;
        let why = tokio::select! {
            _ = crate::wait_cancel(&mut self.cancel) => Stop::Cancelled,
            _ = async {
                match deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            } => Stop::Timeout,
        };
        self.fired = Some(why);
        why
    }
}

/// Where a cell's stream lands.
pub enum Stream {
    /// The agent's event lines; it writes its files into the cell folder
    /// itself (local, docker, slurm's shared filesystem).
    Events(EventLines),
    /// Shipping frames, which carry the agent's files home (kubernetes, modal).
    Frames(Box<Home>),
}

impl Stream {
    /// One line; the cell's result when it is the result.
    pub fn line(&mut self, line: &str) -> Option<CellResult> {
        match self {
            Stream::Events(e) => e.line(line),
            Stream::Frames(h) => h.line(line).ok().flatten(),
        }
    }

    /// A result with the provision time, when the agent started.
    pub fn stamp(&self, r: CellResult) -> CellResult {
        match self {
            Stream::Events(e) => e.relay.stamp(r),
            Stream::Frames(h) => h.stamp(r),
        }
    }

    /// The way home, for platforms that replay missed frames.
    pub fn home(&mut self) -> Option<&mut Home> {
        match self {
            Stream::Frames(h) => Some(h),
            Stream::Events(_) => None,
        }
    }

    fn close(&mut self) {
        match self {
            // Each line was appended whole: nothing is left to write.
            Stream::Events(e) => e.file = None,
            Stream::Frames(h) => h.close(),
        }
    }
}

/// Event lines into `events.jsonl` (masked on the host), relayed.
pub struct EventLines {
    relay: EventRelay,
    masker: Masker,
    /// `events.jsonl`, appended to line by line (open only for the write:
    /// a running cell holds no descriptor of its own for it).
    file: Option<PathBuf>,
}

impl EventLines {
    pub fn line(&mut self, line: &str) -> Option<CellResult> {
        let line = crate::secrets::mask_event_line(&self.masker, line.trim_end_matches(['\n', '\r']));
        if let Some(path) = &self.file {
            // Followers of the cell folder (`orch logs -f`, the S3 store)
            // see each event when it comes.
            let _ = crate::append(path, format!("{line}\n").as_bytes());
        }
        self.relay.line(&line)
    }
}

/// One cell being run: its task, folder, secrets and stream.
pub struct Cell {
    pub id: String,
    pub dir: PathBuf,
    pub task: TaskSpec,
    pub launch: CellLaunch,
    pub masker: Masker,
    pub stream: Stream,
    events: mpsc::UnboundedSender<CellEvent>,
    launched: Instant,
    container_started: Option<std::time::SystemTime>,
}

impl Cell {
    /// A cell whose agent sends event lines and writes its own files here.
    pub fn with_events(
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
    ) -> Result<Cell, BackendError> {
        let dir = launch.cell_dir.clone();
        std::fs::create_dir_all(&dir).map_err(io(format!("create `{}`", dir.display())))?;
        let path = dir.join("events.jsonl");
        std::fs::File::create(&path).map_err(io(format!("create `{}`", path.display())))?;
        let masker = crate::host_masker(&launch.secrets);
        let stream = Stream::Events(EventLines {
            relay: EventRelay::new(&launch.task.cell_id, events.clone()),
            masker: masker.clone(),
            file: Some(path),
        });
        Ok(Cell::new(launch, events, masker, stream))
    }

    /// A cell whose agent writes its files, `events.jsonl` too, into a folder
    /// the host reads (a shared filesystem): the host only relays.
    pub fn with_agent_events(
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
    ) -> Result<Cell, BackendError> {
        let masker = crate::host_masker(&launch.secrets);
        let stream = Stream::Events(EventLines {
            relay: EventRelay::new(&launch.task.cell_id, events.clone()),
            masker: masker.clone(),
            file: None,
        });
        Ok(Cell::new(launch, events, masker, stream))
    }

    /// A cell whose agent ships its files home in frames (`--ship`).
    pub fn with_frames(
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
    ) -> Result<Cell, BackendError> {
        let masker = crate::host_masker(&launch.secrets);
        let home = Home::new(&launch.task.cell_id, &launch.cell_dir, events.clone())
            .map_err(|e| BackendError::Io {
                action: "open the cell folder".into(),
                source: std::io::Error::other(e.to_string()),
            })?
            .masked(masker.clone());
        Ok(Cell::new(launch, events, masker, Stream::Frames(Box::new(home))))
    }

    fn new(
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        masker: Masker,
        stream: Stream,
    ) -> Cell {
        Cell {
            id: launch.task.cell_id.clone(),
            dir: launch.cell_dir.clone(),
            task: launch.task.clone(),
            launch,
            masker,
            stream,
            events,
            launched: Instant::now(),
            container_started: None,
        }
    }

    /// The platform started the cell's container at `at` (by its own clock where it
    /// says one); billing starts there (`info.container_started_at`). The first
    /// report holds.
    pub fn container_started(&mut self, at: std::time::SystemTime) {
        self.container_started.get_or_insert(at);
    }

    /// [`Cell::container_started`] from an RFC 3339 time (Docker's `StartedAt`); a
    /// time that does not parse, or the zero time of a container never started
    /// (`0001-01-01T00:00:00Z`), says nothing.
    pub fn container_started_rfc3339(&mut self, at: &str) {
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(at) {
            if t.timestamp() > 0 {
                self.container_started(t.with_timezone(&chrono::Utc).into());
            }
        }
    }

    /// When the platform started the cell's container, if it said.
    pub fn container_started_at(&self) -> Option<std::time::SystemTime> {
        self.container_started
    }

    /// A message of the host's about this cell, shown like the agent's.
    pub fn message(&self, text: &str) {
        let _ = self.events.send(CellEvent {
            cell_id: self.id.clone(),
            event: Event::Message {
                text: self.masker.mask_str(text).into_owned(),
            },
        });
    }

    /// An `orch: LINE` line in the cell's `agent.log`, where `orch logs` and
    /// the diagnosis read what the host saw.
    pub fn note(&self, line: &str) {
        crate::note_agent_log(&self.dir, &self.masker.mask_str(line));
    }

    /// Seconds since the launch began.
    pub fn since_launch(&self) -> Duration {
        self.launched.elapsed()
    }

    /// A failed result of this cell (the cell's id, no exit status).
    pub fn failed(&self, status: Status, kind: FailureKind, message: impl Into<String>) -> CellResult {
        CellResult::failed(&self.id, status, kind, message)
    }

    /// The agent's result in `dir` ([`orch_protocol::AGENT_RESULT_FILE`]),
    /// when it wrote one.
    pub fn result_file(dir: &Path) -> Option<CellResult> {
        std::fs::read(dir.join(orch_protocol::AGENT_RESULT_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }
}

/// A cell's end before its agent ran (a refusal, a pod that can never be
/// scheduled, no GPU to be had).
#[derive(Debug, Clone)]
pub struct Early {
    pub status: Status,
    pub failure: Failure,
}

impl Early {
    pub fn failed(kind: FailureKind, message: impl Into<String>) -> Early {
        Early {
            status: Status::Failed,
            failure: Failure::new(kind, message),
        }
    }
}

/// What a platform says of a cell's end, once its stream ended.
#[derive(Debug, Clone, Default)]
pub struct PlatformEnd {
    /// A result the platform recovered (the agent's `agent-result.json` in a
    /// shared folder, its summary in a termination message).
    pub result: Option<CellResult>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// What the platform did to the cell (an OOM kill, an eviction, a lost
    /// node, its own time limit, a preemption): it names the end, whatever
    /// the agent managed to say while it was being stopped.
    pub verdict: Option<(Status, Failure)>,
    /// The platform's words for an end without a result, where they say
    /// more than an exit status; `None`: the agent crashed.
    pub words: Option<(Status, Failure)>,
}

impl PlatformEnd {
    /// An end the platform named (`ended`): a verdict when its kind is one
    /// of `verdicts` (what the platform did to the cell), else its words.
    pub fn named(
        result: Option<CellResult>,
        exit_code: Option<i32>,
        ended: (Status, Failure),
        verdicts: &[FailureKind],
    ) -> PlatformEnd {
        let verdict = verdicts.contains(&ended.1.kind);
        PlatformEnd {
            result,
            exit_code,
            signal: None,
            verdict: verdict.then(|| ended.clone()),
            words: (!verdict).then_some(ended),
        }
    }
}

/// What a backend does for one cell: its platform's side of the lifecycle.
/// Each future may be dropped at an `.await` (a cancel): keep in `self`
/// what must be stopped or deleted.
#[async_trait]
pub trait Platform: Send {
    /// What runs the agent, in messages (`the agent`, `the container`,
    /// `the cell's Job`, `the sandbox`, `the job`).
    fn what(&self) -> &'static str;

    /// The limit the platform itself puts on the cell once it runs; the
    /// host deadline is this and [`HOST_SLACK`] past the start.
    fn limit(&self, m: &Measure) -> Duration {
        platform_limit(m)
    }

    /// Until the agent runs. `Err`: the cell ended before.
    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early>;

    /// The agent's next line; `None` once its stream ended.
    async fn next_line(&mut self, cell: &mut Cell) -> Option<String>;

    /// Ask the cell to stop (`kill`: the grace period passed).
    async fn stop(&mut self, cell: &mut Cell, why: Stop, kill: bool);

    /// How the cell ended, after its stream did (or the host stopped
    /// waiting). The platform may feed lines it missed into `cell.stream`.
    async fn end(&mut self, cell: &mut Cell, stopped: Option<Stop>) -> PlatformEnd;

    /// The `orch: ...` line a made-up end leaves in `agent.log` (the
    /// diagnosis rules match it); `None`: none.
    fn note_line(&self, _failure: &Failure) -> Option<String> {
        None
    }

    /// The end of a cell stopped from outside orch: its agent's result is
    /// `cancelled` (it was told to stop), orch stopped nothing, and the
    /// platform names nothing it did ([`PlatformEnd::verdict`]). `None`:
    /// the agent's result stands.
    fn stopped_outside(&self) -> Option<(Status, Failure)> {
        None
    }

    /// The platform's additions to the record (`info`), and its clean-up
    /// (delete the Job, remove the container), once the result is known.
    async fn finish(&mut self, cell: &mut Cell, result: &mut CellResult);
}

/// Run one cell on a platform, from start to record.
pub async fn drive<P: Platform + ?Sized>(
    platform: &mut P,
    mut cell: Cell,
    cancel: watch::Receiver<bool>,
) -> CellResult {
    let mut stopper = Stopper::new(cancel);
    let mut result: Option<CellResult> = None;
    let started = tokio::select! {
        s = platform.started(&mut cell) => s.map(|()| None),
        // Stopped before the agent was seen running: stopped, and its end
        // (it may have started meanwhile) judged like any other.
        why = stopper.next() => Ok(Some(why)),
    };
    // The agent never ran: an early end, or a stop while the platform was starting it.
    let never_ran = !matches!(started, Ok(None));
    let mut result = match started {
        Ok(Some(why)) => {
            platform.stop(&mut cell, why, true).await;
            let end = platform.end(&mut cell, Some(why)).await;
            cell.stream.close();
            judge(platform, &mut cell, None, Some(why), end)
        }
        Err(early) => {
            if let Some(line) = platform.note_line(&early.failure) {
                cell.note(&line);
            }
            let mut r = CellResult::new(&cell.id, early.status);
            r.failure = Some(early.failure);
            cell.stream.close();
            cell.stream.stamp(r)
        }
        Ok(None) => {
            stopper.arm(platform.limit(&cell.task.measure) + HOST_SLACK);
            let grace = grace(&cell.task.measure);
            // (when to act next, whether the cell was killed already)
            let mut give_up: Option<(tokio::time::Instant, bool)> = None;
            loop {
                let wake = give_up.map(|g| g.0);
                tokio::select! {
                    line = platform.next_line(&mut cell) => match line {
                        Some(line) => {
                            if let Some(r) = cell.stream.line(&line) {
                                result = Some(r);
                            }
                        }
                        None => break,
                    },
                    why = stopper.next() => {
                        platform.stop(&mut cell, why, false).await;
                        give_up = Some((tokio::time::Instant::now() + grace + HOST_SLACK, false));
                    }
                    _ = async {
                        match wake {
                            Some(t) => tokio::time::sleep_until(t).await,
                            None => std::future::pending().await,
                        }
                    } => {
                        let why = stopper.stopped().unwrap_or(Stop::Cancelled);
                        match give_up {
                            Some((_, false)) => {
                                platform.stop(&mut cell, why, true).await;
                                give_up = Some((tokio::time::Instant::now() + AFTER_KILL, true));
                            }
                            _ => {
                                cell.note(&format!(
                                    "{} did not end in time after being stopped",
                                    platform.what()
                                ));
                                break;
                            }
                        }
                    }
                }
            }
            let stopped = stopper.stopped();
            let end = platform.end(&mut cell, stopped).await;
            cell.stream.close();
            judge(platform, &mut cell, result, stopped, end)
        }
    };
    result
        .timings
        .entry(Phase::Provision)
        .or_insert(cell.since_launch().as_secs_f64());
    platform.finish(&mut cell, &mut result).await;
    // Where billing starts: the container's start as the platform said it; a cell
    // that ended before its agent ran, with no start said, had no container.
    let container = match cell.container_started {
        Some(at) => Some(serde_json::Value::String(
            chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        )),
        None if never_ran => Some(serde_json::Value::Null),
        None => None,
    };
    if let Some(v) = container {
        result.info.insert(CONTAINER_STARTED_AT.into(), v);
    }
    // Everything written is masked on the host too (an older agent, a
    // platform's own log, a file the agent did not sweep).
    // (Nothing to do, and no thread taken, without a secret.)
    if !cell.masker.is_empty() {
        let (dir, masker) = (cell.dir.clone(), cell.masker.clone());
        let _ = tokio::task::spawn_blocking(move || crate::secrets::mask_dir(&dir, &masker)).await;
    }
    cell.masker.mask_in_place(&mut result);
    result
}

/// The cell's result from the agent's (if any), the host's stop and the
/// platform's end. The same rules for every backend.
pub fn judge<P: Platform + ?Sized>(
    platform: &P,
    cell: &mut Cell,
    result: Option<CellResult>,
    stopped: Option<Stop>,
    end: PlatformEnd,
) -> CellResult {
    let recovered = end.result.clone().map(|r| cell.stream.stamp(r));
    let note_line = |f: &Failure| {
        platform
            .note_line(f)
            .map(|l| cell.masker.mask_str(&l).into_owned())
    };
    let rules = Rules {
        dir: &cell.dir,
        cell_id: &cell.id,
        what: platform.what(),
        note_line: &note_line,
        stopped_outside: platform.stopped_outside(),
    };
    let r = ranked(rules, result.or(recovered), stopped, end);
    cell.stream.stamp(r)
}

/// [`judge`] for a cell folder `dir`, where the notes (`note_line`) and an
/// agent crash's line go into `agent.log` (a platform that names no stop
/// from outside).
pub fn judge_in(
    dir: &Path,
    cell_id: &str,
    what: &str,
    note_line: &dyn Fn(&Failure) -> Option<String>,
    result: Option<CellResult>,
    stopped: Option<Stop>,
    end: PlatformEnd,
) -> CellResult {
    let rules = Rules {
        dir,
        cell_id,
        what,
        note_line,
        stopped_outside: None,
    };
    ranked(rules, result, stopped, end)
}

/// The cell [`ranked`] judges: its folder and id, what ran it, the
/// platform's notes and its stop from outside.
struct Rules<'a> {
    dir: &'a Path,
    cell_id: &'a str,
    what: &'a str,
    note_line: &'a dyn Fn(&Failure) -> Option<String>,
    /// [`Platform::stopped_outside`].
    stopped_outside: Option<(Status, Failure)>,
}

/// The one place where the agent's result, the host's stop and what the
/// platform did or saw are ranked.
fn ranked(
    rules: Rules<'_>,
    result: Option<CellResult>,
    stopped: Option<Stop>,
    end: PlatformEnd,
) -> CellResult {
    let Rules {
        dir,
        cell_id,
        what,
        note_line,
        stopped_outside,
    } = rules;
    let note = |f: &Failure| {
        if let Some(line) = note_line(f) {
            crate::note_agent_log(dir, &line);
        }
    };
    let mut r = match result {
        Some(r) => r,
        None => {
            let (status, failure) = match stopped {
                Some(Stop::Cancelled) => (
                    Status::Cancelled,
                    Failure::new(
                        FailureKind::Cancelled,
                        format!("{what} was stopped by orch (cancel)"),
                    ),
                ),
                Some(Stop::Timeout) => (
                    Status::Timeout,
                    Failure::new(
                        FailureKind::Timeout,
                        format!("{what} did not finish in time and was killed"),
                    ),
                ),
                None => match (&end.verdict, &end.words) {
                    (Some(v), _) => {
                        note(&v.1);
                        v.clone()
                    }
                    (None, words) => {
                        let signal = end
                            .signal
                            .filter(|s| *s != 9)
                            .or_else(|| crate::crash_signal(end.exit_code));
                        match words {
                            // The agent died of a signal of its own (not
                            // SIGKILL: a kill from outside): its crash,
                            // with the platform's words kept.
                            Some((_, w)) if signal.is_some() => {
                                let mut f = crate::agent_crash(dir, what, end.exit_code, signal);
                                f.message.push_str(&format!(" ({})", w.message));
                                (Status::Failed, f)
                            }
                            Some((s, w)) => {
                                note(w);
                                (*s, w.clone())
                            }
                            None => (
                                Status::Failed,
                                crate::agent_crash(dir, what, end.exit_code, end.signal),
                            ),
                        }
                    }
                },
            };
            let mut r = CellResult::new(cell_id, status);
            r.failure = Some(failure);
            return finish_stop(r, stopped);
        }
    };
    // What the platform did to the cell names its end; where it names
    // nothing, a cancel orch did not ask for is its stop from outside.
    let verdict = end
        .verdict
        .clone()
        .or_else(|| stopped_outside.filter(|_| stopped.is_none() && r.status == Status::Cancelled));
    if let Some((status, failure)) = &verdict {
        let applies = if failure.kind == FailureKind::Oom {
            !matches!(r.status, Status::Succeeded | Status::Cancelled)
        } else {
            stopped.is_none() && r.status != Status::Succeeded
        };
        if applies && r.failure.as_ref().map(|f| &f.kind) != Some(&failure.kind) {
            note(failure);
            let mut failure = failure.clone();
            if let Some(old) = &r.failure {
                failure.exit_code = failure.exit_code.or(old.exit_code);
                failure.signal = failure.signal.or(old.signal);
            }
            r.status = *status;
            r.failure = Some(failure);
        }
    }
    finish_stop(r, stopped)
}

/// A cell the host cancelled did not fail on its own: whatever the agent
/// saw as its processes were stopped (a workload killed by the stop), it
/// is `cancelled`.
fn finish_stop(mut r: CellResult, stopped: Option<Stop>) -> CellResult {
    if stopped == Some(Stop::Cancelled) && r.status == Status::Failed {
        let old = r.failure.take();
        r.status = Status::Cancelled;
        r.failure = Some(
            Failure::new(
                FailureKind::Cancelled,
                format!(
                    "the cell was stopped by orch (cancel){}",
                    old.as_ref()
                        .map(|f| format!("; before that: {}", f.message))
                        .unwrap_or_default()
                ),
            )
            .exited(
                old.as_ref().and_then(|f| f.exit_code),
                old.as_ref().and_then(|f| f.signal),
            ),
        );
    }
    r
}

fn io(action: String) -> impl FnOnce(std::io::Error) -> BackendError {
    move |source| BackendError::Io { action, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A platform that plays a script: lines, then an end.
    struct Script {
        lines: std::collections::VecDeque<String>,
        hang: bool,
        never_starts: bool,
        ended: bool,
        end: PlatformEnd,
        stops: Vec<(Stop, bool)>,
        finished: bool,
        outside: Option<(Status, Failure)>,
        /// The container's start the platform says (in `started`).
        container_at: Option<std::time::SystemTime>,
    }

    #[async_trait]
    impl Platform for Script {
        fn what(&self) -> &'static str {
            "the script"
        }
        async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
            if self.never_starts {
                std::future::pending::<()>().await;
            }
            if let Some(at) = self.container_at {
                cell.container_started(at);
            }
            Ok(())
        }
        async fn next_line(&mut self, _cell: &mut Cell) -> Option<String> {
            match self.lines.pop_front() {
                Some(l) => Some(l),
                None if self.hang && self.stops.is_empty() => std::future::pending().await,
                None => None,
            }
        }
        async fn stop(&mut self, _cell: &mut Cell, why: Stop, kill: bool) {
            self.stops.push((why, kill));
        }
        async fn end(&mut self, _cell: &mut Cell, _stopped: Option<Stop>) -> PlatformEnd {
            self.ended = true;
            self.end.clone()
        }
        async fn finish(&mut self, _cell: &mut Cell, _result: &mut CellResult) {
            self.finished = true;
        }
        fn stopped_outside(&self) -> Option<(Status, Failure)> {
            self.outside.clone()
        }
    }

    fn cell(dir: &Path, secret: &str) -> (Cell, mpsc::UnboundedReceiver<CellEvent>) {
        let task = TaskSpec {
            version: orch_protocol::PROTOCOL_VERSION,
            run_id: "r".into(),
            cell_id: "c".into(),
            gpu: "none".into(),
            params: Default::default(),
            env: Default::default(),
            secret_env: vec![],
            workload: orch_protocol::Workload::Builtin(orch_protocol::BuiltinWorkload::Transformer(
                Default::default(),
            )),
            measure: Measure::default(),
            logs: Default::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
            files: None,
        };
        let launch = CellLaunch {
            task,
            cell_dir: dir.to_path_buf(),
            secrets: vec![("MY_SECRET".into(), secret.into())],
            weights_dir: None,
            image: None,
            devices: vec![],
            files: None,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        (Cell::with_events(launch, tx).unwrap(), rx)
    }

    fn script(lines: &[String], end: PlatformEnd) -> Script {
        Script {
            lines: lines.iter().cloned().collect(),
            hang: false,
            never_starts: false,
            ended: false,
            end,
            stops: vec![],
            finished: false,
            outside: None,
            container_at: None,
        }
    }

    #[tokio::test]
    async fn billing_starts_with_the_container_the_platform_said_and_none_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let done = Event::Result {
            result: CellResult::new("c", Status::Succeeded),
        };
        // Said started: the time, to the millisecond.
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let mut p = script(&[done.to_line()], PlatformEnd::default());
        p.container_at = Some(std::time::UNIX_EPOCH + Duration::from_millis(1_767_225_600_123));
        let (_tx, cancel) = watch::channel(false);
        let r = drive(&mut p, c, cancel).await;
        assert_eq!(r.info[CONTAINER_STARTED_AT], "2026-01-01T00:00:00.123Z");
        // The agent ran but nothing was said: no key (billed from orch's launch).
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let mut p = script(&[done.to_line()], PlatformEnd::default());
        let (_tx, cancel) = watch::channel(false);
        let r = drive(&mut p, c, cancel).await;
        assert!(!r.info.contains_key(CONTAINER_STARTED_AT));
        // Cancelled while the platform was still starting it, nothing said: `null`.
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let mut p = script(&[], PlatformEnd::default());
        p.never_starts = true;
        let (tx, cancel) = watch::channel(false);
        let _ = tx.send(true);
        let r = drive(&mut p, c, cancel).await;
        assert_eq!(r.status, Status::Cancelled);
        assert_eq!(r.info[CONTAINER_STARTED_AT], serde_json::Value::Null);
    }

    #[tokio::test]
    async fn the_agents_result_is_the_cells_and_a_platform_oom_kill_names_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let failed = Event::Result {
            result: CellResult::failed("c", Status::Failed, FailureKind::ExitCode, "exited 1"),
        };
        let mut p = script(
            &[failed.to_line()],
            PlatformEnd {
                verdict: Some((Status::Oom, Failure::new(FailureKind::Oom, "killed for memory"))),
                ..Default::default()
            },
        );
        let (_tx, cancel) = watch::channel(false);
        let r = drive(&mut p, c, cancel).await;
        assert_eq!(r.status, Status::Oom);
        assert!(p.finished);
        assert!(r.timings.contains_key(&Phase::Provision));
    }

    #[tokio::test]
    async fn no_result_and_a_crash_signal_is_the_agents_crash_and_everything_is_masked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("stdout.log"), "token hunter2-secret here\n").unwrap();
        std::fs::write(
            dir.path().join("agent.log"),
            "thread panicked with hunter2-secret\n",
        )
        .unwrap();
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let mut p = script(
            &[r#"{"event":"message","text":"hunter2-secret"}"#.to_string()],
            PlatformEnd {
                exit_code: Some(139),
                words: Some((
                    Status::Failed,
                    Failure::new(FailureKind::SandboxFailed, "ended with 139"),
                )),
                ..Default::default()
            },
        );
        let (_tx, cancel) = watch::channel(false);
        let r = drive(&mut p, c, cancel).await;
        let f = r.failure.unwrap();
        assert_eq!(f.kind, FailureKind::AgentCrashed);
        assert!(
            f.message.contains("SIGSEGV") && f.message.contains("ended with 139"),
            "{}",
            f.message
        );
        assert!(!f.message.contains("hunter2"), "{}", f.message);
        for file in ["stdout.log", "agent.log", "events.jsonl"] {
            let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
            assert!(!text.contains("hunter2-secret"), "{file}: {text}");
            assert!(text.contains("***"), "{file}: {text}");
        }
    }

    #[tokio::test]
    async fn a_cancel_stops_then_kills_and_the_cell_is_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        let mut p = script(&[], PlatformEnd::default());
        p.hang = true;
        let (tx, cancel) = watch::channel(false);
        let _ = tx.send(true);
        let r = drive(&mut p, c, cancel).await;
        assert_eq!(r.status, Status::Cancelled);
        // Stopped before or after the start (both were ready at once).
        assert!(matches!(p.stops[..], [(Stop::Cancelled, _)]), "{:?}", p.stops);
        // A dropped sender is no cancel: the deadline (0 s + 1 s grace + 60 s
        // + slack) is what would stop this one; not waited for here.
        let (tx, cancel) = watch::channel(false);
        drop(tx);
        let mut s = Stopper::new(cancel);
        s.arm(Duration::from_millis(20));
        assert_eq!(s.next().await, Stop::Timeout);
    }

    #[tokio::test]
    async fn a_cancel_before_the_start_stops_kills_and_still_asks_how_it_ended() {
        let dir = tempfile::tempdir().unwrap();
        let (c, _rx) = cell(dir.path(), "hunter2-secret");
        // The platform recovers the agent's own result (it started meanwhile):
        // a workload killed by the stop is still `cancelled`.
        let killed = CellResult::failed("c", Status::Failed, FailureKind::Signal, "killed by SIGTERM");
        let mut p = script(
            &[],
            PlatformEnd {
                result: Some(killed),
                ..Default::default()
            },
        );
        p.never_starts = true;
        let (tx, cancel) = watch::channel(false);
        let stop = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tx.send(true);
            tx
        });
        let r = drive(&mut p, c, cancel).await;
        let _tx = stop.await.unwrap();
        assert_eq!(r.status, Status::Cancelled);
        assert_eq!(p.stops, vec![(Stop::Cancelled, true)]);
        assert!(p.ended && p.finished);
        assert!(r.failure.unwrap().message.contains("killed by SIGTERM"));
    }

    /// An agent's result of `status`, failed with `kind` unless it succeeded.
    fn agent(status: Status, kind: &str) -> CellResult {
        let mut r = CellResult::failed("c", status, FailureKind::new(kind), format!("the agent: {kind}"));
        if status == Status::Succeeded {
            r.failure = None;
        } else if let Some(f) = r.failure.as_mut() {
            f.exit_code = Some(3);
        }
        r
    }

    fn verdict(status: Status, kind: &str) -> PlatformEnd {
        PlatformEnd {
            verdict: Some((
                status,
                Failure::new(FailureKind::new(kind), format!("the platform: {kind}")),
            )),
            ..Default::default()
        }
    }

    fn words(status: Status, kind: &str, exit_code: Option<i32>) -> PlatformEnd {
        PlatformEnd {
            exit_code,
            words: Some((
                status,
                Failure::new(FailureKind::new(kind), format!("the platform: {kind}")),
            )),
            ..Default::default()
        }
    }

    fn ended(r: &CellResult) -> (Status, String) {
        (
            r.status,
            r.failure.as_ref().map(|f| f.kind.to_string()).unwrap_or_default(),
        )
    }

    /// (what, the agent's result, orch's stop, the platform's end) → the
    /// cell's status and failure kind.
    type Case = (
        &'static str,
        Option<CellResult>,
        Option<Stop>,
        PlatformEnd,
        (Status, &'static str),
    );

    /// Every rule of the ranking, once.
    #[test]
    fn the_agents_result_the_hosts_stop_and_the_platforms_end_rank_once() {
        use Status::*;
        let cases: Vec<Case> = vec![
            (
                "an OOM kill names a failure's end",
                Some(agent(Failed, "exit_code")),
                None,
                verdict(Oom, "oom"),
                (Oom, "oom"),
            ),
            (
                "an OOM kill past orch's timeout",
                Some(agent(Failed, "exit_code")),
                Some(Stop::Timeout),
                verdict(Oom, "oom"),
                (Oom, "oom"),
            ),
            (
                "a success stands over an OOM kill",
                Some(agent(Succeeded, "")),
                None,
                verdict(Oom, "oom"),
                (Succeeded, ""),
            ),
            (
                "a cancel stands over an OOM kill",
                Some(agent(Cancelled, "cancelled")),
                None,
                verdict(Oom, "oom"),
                (Cancelled, "cancelled"),
            ),
            (
                "an eviction names a failure's end",
                Some(agent(Failed, "exit_code")),
                None,
                verdict(Failed, "evicted"),
                (Failed, "evicted"),
            ),
            (
                "a success stands over an eviction",
                Some(agent(Succeeded, "")),
                None,
                verdict(Failed, "evicted"),
                (Succeeded, ""),
            ),
            (
                "orch's timeout stands over the platform's",
                Some(agent(Timeout, "timeout")),
                Some(Stop::Timeout),
                verdict(Timeout, "timeout"),
                (Timeout, "timeout"),
            ),
            (
                "orch's cancel over a failure",
                Some(agent(Failed, "exit_code")),
                Some(Stop::Cancelled),
                verdict(Failed, "evicted"),
                (Cancelled, "cancelled"),
            ),
            (
                "words do not name an end that has a result",
                Some(agent(Failed, "exit_code")),
                None,
                words(Failed, "pod_failed", Some(1)),
                (Failed, "exit_code"),
            ),
            (
                "no result: orch's cancel",
                None,
                Some(Stop::Cancelled),
                verdict(Oom, "oom"),
                (Cancelled, "cancelled"),
            ),
            (
                "no result: orch's timeout",
                None,
                Some(Stop::Timeout),
                words(Failed, "pod_failed", None),
                (Timeout, "timeout"),
            ),
            (
                "no result: the verdict",
                None,
                None,
                verdict(Failed, "evicted"),
                (Failed, "evicted"),
            ),
            (
                "no result: the words",
                None,
                None,
                words(Failed, "pod_failed", Some(1)),
                (Failed, "pod_failed"),
            ),
            (
                "no result: a signal of the agent's own is its crash",
                None,
                None,
                words(Failed, "agent_died", Some(139)),
                (Failed, "agent_crashed"),
            ),
            (
                "no result: SIGKILL is from outside",
                None,
                None,
                words(Failed, "agent_died", Some(137)),
                (Failed, "agent_died"),
            ),
            (
                "no result, no words: the agent crashed",
                None,
                None,
                PlatformEnd::default(),
                (Failed, "agent_crashed"),
            ),
        ];
        for (name, result, stopped, end, want) in cases {
            let dir = tempfile::tempdir().unwrap();
            let r = judge_in(dir.path(), "c", "the script", &|_| None, result, stopped, end);
            assert_eq!(ended(&r), (want.0, want.1.to_string()), "{name}: {r:?}");
        }
        // A verdict keeps the agent's exit status; a cancel keeps what it saw.
        let dir = tempfile::tempdir().unwrap();
        let r = judge_in(
            dir.path(),
            "c",
            "the script",
            &|f| Some(format!("platform {}", f.kind)),
            Some(agent(Status::Failed, "exit_code")),
            None,
            verdict(Status::Failed, "evicted"),
        );
        assert_eq!(r.failure.unwrap().exit_code, Some(3));
        let log = std::fs::read_to_string(dir.path().join("agent.log")).unwrap();
        assert!(log.contains("platform evicted"), "{log}");
        let r = judge_in(
            dir.path(),
            "c",
            "the script",
            &|_| None,
            Some(agent(Status::Failed, "exit_code")),
            Some(Stop::Cancelled),
            PlatformEnd::default(),
        );
        assert!(r
            .failure
            .unwrap()
            .message
            .contains("before that: the agent: exit_code"));
    }

    #[test]
    fn a_cancel_orch_did_not_ask_for_is_the_platforms_stop_from_outside() {
        let outside = (
            Status::Cancelled,
            Failure::new(FailureKind::Disrupted, "stopped from outside"),
        );
        let judged = |outside: Option<(Status, Failure)>, stopped: Option<Stop>, end: PlatformEnd| {
            let dir = tempfile::tempdir().unwrap();
            let (mut c, _rx) = cell(dir.path(), "hunter2-secret");
            let mut p = script(&[], end.clone());
            p.outside = outside;
            ended(&judge(
                &p,
                &mut c,
                Some(agent(Status::Cancelled, "cancelled")),
                stopped,
                end,
            ))
        };
        let no_word = words(Status::Failed, "agent_died", Some(143));
        assert_eq!(
            judged(Some(outside.clone()), None, no_word.clone()),
            (Status::Cancelled, "disrupted".into())
        );
        // Orch stopped it: its cancel.
        assert_eq!(
            judged(Some(outside.clone()), Some(Stop::Cancelled), no_word.clone()),
            (Status::Cancelled, "cancelled".into())
        );
        // The platform named what it did.
        assert_eq!(
            judged(Some(outside), None, verdict(Status::Failed, "evicted")),
            (Status::Failed, "evicted".into())
        );
        // A platform that names no stop from outside: the agent's words.
        assert_eq!(
            judged(None, None, no_word),
            (Status::Cancelled, "cancelled".into())
        );
    }

    #[test]
    fn limits_are_one_formula() {
        let m = Measure {
            timeout_s: 100.0,
            kill_grace_s: 0.0,
            ..Default::default()
        };
        assert_eq!(platform_limit(&m), Duration::from_secs(161));
        assert_eq!(host_limit(&m), Duration::from_secs(191));
    }
}
