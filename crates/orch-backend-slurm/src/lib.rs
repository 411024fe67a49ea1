//! The `slurm` backend: one batch job per cell on a Slurm cluster, run from
//! a login node.
//!
//! - a cell is `sbatch job.sh` (partition, account, QOS, constraint, time
//!   from the cell's timeout, `--gres=gpu:TYPE:N` per node, CPUs, memory,
//!   extra options); the job runs the agent with `srun` on each of its nodes;
//! - Slurm shares a filesystem between the login node and the compute
//!   nodes: the agent (the `orch` binary itself, or `ORCH_AGENT`) and the
//!   job folder live on it. The job folder is the cell's folder in the store
//!   when the store is on the shared filesystem; with `shared_dir` it is
//!   `<shared_dir>/jobs/<run>/<cell>/`, mirrored into the store while the job
//!   runs. Either way logs reach the store while the job runs and stay;
//! - state comes from the scheduler (`squeue` for every watched job in one
//!   call; `scontrol`/`sacct` for a finished job): pending reasons are shown
//!   live, a pending limit fails a cell that waits too long, a request no
//!   node can satisfy fails at submission with Slurm's words, and
//!   `OUT_OF_MEMORY`, `TIMEOUT`, `NODE_FAIL`, `PREEMPTED` become `oom`,
//!   `timeout`, `node_failure` and `preempted` (a preempted cell is recorded
//!   `cancelled`, so `orch run --resume` runs it again);
//! - `nodes: N` cells get `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`,
//!   `NNODES`, `NODE_RANK`; every node's agent writes its own result, and
//!   each node's hardware and telemetry go into the record (`info.nodes`);
//! - cancel, `--max-cost` and a lost controller `scancel` the cell's job;
//!   jobs are named `orch-<run>-<cell>` and commented `orch:<run>:<cell>`,
//!   which `cleanup` (`orch down RUN`) cancels by.
//!
//! No scheduler library: the commands every Slurm login node has.

pub mod follow;
pub mod sched;
pub mod script;

use async_trait::async_trait;
use follow::{Mirror, Tail};
use orch_backend::{Backend, BackendError, CellEvent, CellLaunch, EventRelay};
use orch_protocol::{CellResult, Event, Failure, Status};
use sched::{JobEnd, Scheduler, UNSATISFIABLE};
use script::{GpuFlag, JobSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

pub use script::GpuFlag as GpuRequest;

/// How a suite runs on the cluster (the manifest's `slurm:` section).
#[derive(Debug, Clone, Default)]
pub struct SlurmConfig {
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub constraint: Option<String>,
    /// Further `sbatch` options (`--exclusive`, `--reservation=NAME`).
    pub extra_args: Vec<String>,
    /// A folder on the filesystem the login and compute nodes share, for
    /// the agent and the job folders when the store is not on it.
    pub shared_dir: Option<PathBuf>,
    /// A cell pending longer than this fails (`pending_too_long`).
    pub max_pending: Option<Duration>,
    /// CPUs per node of a cell (`--cpus-per-task`).
    pub cpus: Option<u32>,
    /// GRES type per GPU type (`H100` → `h100`, the default: the name in
    /// lowercase; an empty string asks for any type).
    pub gpu_types: BTreeMap<String, String>,
    pub gpu_flag: GpuFlag,
    /// Time between two scheduler queries while a job waits or runs.
    pub poll: Option<Duration>,
}

/// Default time between two `squeue` calls.
pub const DEFAULT_POLL: Duration = Duration::from_secs(2);
/// How often the agent's files are read while a job runs.
const FILE_POLL: Duration = Duration::from_millis(200);
/// After the agent's result, how long the job may take to leave the queue.
const END_WAIT: Duration = Duration::from_secs(60);
/// Pending reasons under which a job can never start as the cluster is
/// configured: its cell fails at once (`unsatisfiable`).
const NEVER_REASONS: &[&str] = &["PartitionNodeLimit", "PartitionConfig", "BadConstraints"];
/// A controller that has not answered for this long fails the cell.
const LOST_CONTROLLER: Duration = Duration::from_secs(300);

pub struct SlurmBackend {
    cfg: SlurmConfig,
    /// The agent command on the shared filesystem (program, `agent`).
    agent: Vec<String>,
    /// Nodes per cell id (1 when absent).
    nodes: BTreeMap<String, u32>,
    sched: Scheduler,
}

fn unavailable(message: String, hint: &str) -> BackendError {
    BackendError::Unavailable {
        backend: "slurm",
        message,
        hint: hint.into(),
    }
}

fn io_err(action: String) -> impl FnOnce(std::io::Error) -> BackendError {
    move |source| BackendError::Io { action, source }
}

/// The agent for the compute nodes: `ORCH_AGENT`, else this `orch` binary
/// (`orch agent ...`); copied into `<shared_dir>/bin/` when `shared_dir` is
/// set and the binary is not already under it.
pub fn agent_command(shared_dir: Option<&Path>) -> Result<Vec<String>, BackendError> {
    let Some(agent) = std::env::var_os("ORCH_AGENT").filter(|p| !p.is_empty()) else {
        return Ok(vec![
            shared_orch(shared_dir)?.to_string_lossy().into_owned(),
            "agent".into(),
        ]);
    };
    let agent = PathBuf::from(agent);
    let agent = std::fs::canonicalize(&agent).unwrap_or(agent);
    let agent = match shared_dir {
        Some(shared) if !agent.starts_with(std::fs::canonicalize(shared).unwrap_or(shared.to_path_buf())) => {
            copy_to_shared(&agent, shared)?
        }
        _ => agent,
    };
    Ok(vec![agent.to_string_lossy().into_owned()])
}

/// `<shared>/bin/<name>-<size>-<mtime>`: one copy per build, made once.
fn copy_to_shared(program: &Path, shared: &Path) -> Result<PathBuf, BackendError> {
    let meta = std::fs::metadata(program).map_err(io_err(format!("read `{}`", program.display())))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let name = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "orch".into());
    let bin = shared.join("bin");
    let dest = bin.join(format!("{name}-{}-{mtime}", meta.len()));
    if dest.is_file() {
        return Ok(dest);
    }
    std::fs::create_dir_all(&bin).map_err(io_err(format!("create `{}`", bin.display())))?;
    let tmp = bin.join(format!(".{name}.{}.tmp", std::process::id()));
    std::fs::copy(program, &tmp).map_err(io_err(format!("copy the agent to `{}`", tmp.display())))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err(format!("make `{}` executable", tmp.display())))?;
    }
    std::fs::rename(&tmp, &dest).map_err(io_err(format!("move the agent to `{}`", dest.display())))?;
    Ok(dest)
}

/// This `orch` binary as the compute nodes see it: itself, or its copy in
/// `<shared_dir>/bin/` when `shared_dir` is set and it is not under it.
pub fn shared_orch(shared_dir: Option<&Path>) -> Result<PathBuf, BackendError> {
    let exe = std::env::current_exe().map_err(|e| {
        unavailable(
            format!("cannot find the running executable: {e}"),
            "run orch from a path the compute nodes share",
        )
    })?;
    let exe = std::fs::canonicalize(&exe).unwrap_or(exe);
    match shared_dir {
        Some(shared) if !exe.starts_with(std::fs::canonicalize(shared).unwrap_or(shared.to_path_buf())) => {
            copy_to_shared(&exe, shared)
        }
        _ => Ok(exe),
    }
}

/// Run a program as a batch job of its own and wait for its end, handing
/// each line of its output to `on_line` as it comes (`orch setup --as-job`).
/// The job's script and output are `<dir>/<name>.sh` and `<dir>/<name>.log`;
/// `env` (a token) goes to sbatch's environment, never into the script.
pub async fn run_job(
    cfg: &SlurmConfig,
    dir: &Path,
    name: &str,
    argv: &[String],
    env: &[(String, String)],
    mut on_line: impl FnMut(&str),
) -> Result<JobEnd, BackendError> {
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(io_err(format!("create `{}`", dir.display())))?;
    let log = dir.join(format!("{name}.log"));
    let _ = tokio::fs::remove_file(&log).await;
    let mut text = String::from("#!/bin/sh\n");
    text.push_str(&format!(
        "#SBATCH --job-name=orch-{name}\n#SBATCH --output={}\n",
        log.display()
    ));
    for (flag, v) in [
        ("partition", &cfg.partition),
        ("account", &cfg.account),
        ("qos", &cfg.qos),
        ("constraint", &cfg.constraint),
    ] {
        if let Some(v) = v {
            text.push_str(&format!("#SBATCH --{flag}={v}\n"));
        }
    }
    if let Some(c) = cfg.cpus {
        text.push_str(&format!("#SBATCH --cpus-per-task={c}\n"));
    }
    for a in &cfg.extra_args {
        text.push_str(&format!("#SBATCH {a}\n"));
    }
    let argv: Vec<String> = argv.iter().map(|a| script::sh_quote(a)).collect();
    text.push_str(&format!("exec {}\n", argv.join(" ")));
    let script_path = dir.join(format!("{name}.sh"));
    tokio::fs::write(&script_path, text)
        .await
        .map_err(io_err(format!("write `{}`", script_path.display())))?;
    let sched = Scheduler::new();
    let err = |e: sched::SchedError| {
        unavailable(
            format!("the job failed: {e}"),
            "check that `sbatch` and `squeue` work here",
        )
    };
    let cwd = std::env::current_dir().ok();
    let job = sched
        .submit(&script_path, env, cwd.as_deref())
        .await
        .map_err(err)?;
    on_line(&format!("slurm job {job} submitted"));
    let mut tail = Tail::new(log);
    let mut last_reason = String::new();
    let poll = cfg.poll.unwrap_or(DEFAULT_POLL);
    loop {
        tokio::time::sleep(FILE_POLL.max(poll / 4)).await;
        for l in tail.lines() {
            on_line(&l);
        }
        match sched.state(&job, poll).await.map_err(err)? {
            Some(s) if s.is_done() => break,
            Some(s) if s.is_pending() && s.reason != last_reason && s.reason != "None" => {
                on_line(&format!("slurm job {job} pending: {}", s.reason));
                last_reason = s.reason;
            }
            Some(_) => {}
            None => break,
        }
    }
    for l in tail.lines() {
        on_line(&l);
    }
    Ok(sched.end(&job).await.unwrap_or_default())
}

impl SlurmBackend {
    /// `nodes`: cells that run on more than one node, by id.
    pub fn new(cfg: SlurmConfig, nodes: BTreeMap<String, u32>) -> Result<SlurmBackend, BackendError> {
        let agent = agent_command(cfg.shared_dir.as_deref())?;
        Ok(SlurmBackend {
            cfg,
            agent,
            nodes,
            sched: Scheduler::new(),
        })
    }

    /// A backend that only cancels jobs (`orch down`): no agent needed.
    pub fn for_cleanup() -> SlurmBackend {
        SlurmBackend {
            cfg: SlurmConfig::default(),
            agent: vec![],
            nodes: BTreeMap::new(),
            sched: Scheduler::new(),
        }
    }

    fn poll(&self) -> Duration {
        self.cfg.poll.unwrap_or(DEFAULT_POLL)
    }

    /// The folder the job writes into, and whether it is mirrored into the
    /// cell folder (it is not when the cell folder is on the shared filesystem).
    fn job_dir(&self, launch: &CellLaunch) -> (PathBuf, bool) {
        let cell = std::fs::canonicalize(&launch.cell_dir).unwrap_or(launch.cell_dir.clone());
        match &self.cfg.shared_dir {
            Some(shared) => {
                let shared = std::fs::canonicalize(shared).unwrap_or(shared.clone());
                if cell.starts_with(&shared) {
                    (cell, false)
                } else {
                    let dir = shared
                        .join("jobs")
                        .join(&launch.task.run_id)
                        .join(&launch.task.cell_id);
                    (dir, true)
                }
            }
            None => (cell, false),
        }
    }

    fn job_spec(&self, launch: &CellLaunch, job_dir: &Path) -> JobSpec {
        let task = &launch.task;
        let gpu = match task.gpu.as_str() {
            "none" | "" => None,
            g => {
                let (ty, n) = match g.rsplit_once(':') {
                    Some((t, n)) => (t, n.parse().unwrap_or(1)),
                    None => (g, 1),
                };
                let gres = self
                    .cfg
                    .gpu_types
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(ty))
                    .map(|(_, v)| v.clone())
                    .unwrap_or_else(|| ty.to_ascii_lowercase());
                Some((gres, n))
            }
        };
        JobSpec {
            run_id: task.run_id.clone(),
            cell_id: task.cell_id.clone(),
            job_dir: job_dir.to_path_buf(),
            time_minutes: script::time_minutes(task.measure.timeout_s, task.measure.kill_grace_s),
            nodes: self.nodes.get(&task.cell_id).copied().unwrap_or(1).max(1),
            gpu,
            gpu_flag: self.cfg.gpu_flag,
            cpus: self.cfg.cpus,
            mem_mib: task.memory_limit_bytes.map(|b| b.div_ceil(1 << 20)),
            partition: self.cfg.partition.clone(),
            account: self.cfg.account.clone(),
            qos: self.cfg.qos.clone(),
            constraint: self.cfg.constraint.clone(),
            extra_args: self.cfg.extra_args.clone(),
            agent: self.agent.clone(),
        }
    }
}

/// Why the host ended a job.
#[derive(Debug, Clone, PartialEq)]
enum ByHost {
    Cancelled,
    /// Pending for a reason that no wait can lift (`PartitionNodeLimit`...).
    Unsatisfiable(String),
    PendingTooLong(String),
    LostController(String),
}

#[async_trait]
impl Backend for SlurmBackend {
    fn name(&self) -> &'static str {
        "slurm"
    }

    async fn preflight(&self) -> Result<(), BackendError> {
        self.sched.ping().await.map_err(|e| {
            unavailable(
                format!("the Slurm controller does not answer: {e}"),
                "run orch on a login node of the cluster (`sinfo` must work), or set `SLURM_CONF`",
            )
        })?;
        if let Some(a) = self.agent.first() {
            if !Path::new(a).is_file() {
                return Err(unavailable(
                    format!("the agent `{a}` does not exist"),
                    "set `ORCH_AGENT` to an agent on the shared filesystem, or unset it",
                ));
            }
        }
        Ok(())
    }

    async fn run_cell(
        &self,
        launch: CellLaunch,
        events: mpsc::UnboundedSender<CellEvent>,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<CellResult, BackendError> {
        let cell_id = launch.task.cell_id.clone();
        let notes = events.clone();
        let note = |text: String| {
            let _ = notes.send(CellEvent {
                cell_id: cell_id.clone(),
                event: Event::Message { text },
            });
        };
        let mut relay = EventRelay::new(&cell_id, events);
        let (job_dir, mirrored) = self.job_dir(&launch);
        if mirrored {
            // A folder left by an earlier attempt of this cell goes first.
            let _ = tokio::fs::remove_dir_all(&job_dir).await;
        }
        tokio::fs::create_dir_all(&job_dir)
            .await
            .map_err(io_err(format!("create `{}`", job_dir.display())))?;
        let mut task = launch.task.clone();
        task.weights_dir = launch
            .weights_dir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned());
        let task_json = serde_json::to_vec_pretty(&task).map_err(|e| BackendError::Io {
            action: "serialise the task".into(),
            source: std::io::Error::other(e),
        })?;
        let spec = self.job_spec(&launch, &job_dir);
        for (name, body) in [
            ("task.json", task_json),
            ("node.sh", script::node_script(&spec).into_bytes()),
            ("job.sh", script::job_script(&spec).into_bytes()),
        ] {
            let p = job_dir.join(name);
            tokio::fs::write(&p, body)
                .await
                .map_err(io_err(format!("write `{}`", p.display())))?;
        }
        let mut mirror = mirrored.then(|| Mirror::new(job_dir.clone(), launch.cell_dir.clone()));
        let sync = |m: Option<Mirror>, full: bool| async move {
            match m {
                Some(mut m) => tokio::task::spawn_blocking(move || {
                    let _ = m.sync(full);
                    m
                })
                .await
                .ok(),
                None => None,
            }
        };

        let cwd = std::env::current_dir().ok();
        let job = match self
            .sched
            .submit(&job_dir.join("job.sh"), &launch.secrets, cwd.as_deref())
            .await
        {
            Ok(id) => id,
            Err(e) => {
                let said = e.stderr().to_string();
                let _ = tokio::fs::write(job_dir.join("agent.log"), format!("orch: sbatch: {e}\n")).await;
                sync(mirror.take(), true).await;
                let (kind, message) = if said.contains(UNSATISFIABLE) {
                    (
                        "unsatisfiable",
                        format!(
                            "slurm refused the job: no node can ever run it ({}); asked: {}",
                            UNSATISFIABLE,
                            request_text(&spec)
                        ),
                    )
                } else {
                    ("submit", format!("slurm refused the job: {e}"))
                };
                let mut r = CellResult::failed(&cell_id, Status::Failed, kind, message);
                r.info.insert("slurm_request".into(), request_text(&spec).into());
                return Ok(r);
            }
        };
        note(format!("slurm job {job} submitted"));

        let mut tail = Tail::new(job_dir.join("events.jsonl"));
        let submitted = Instant::now();
        let mut result: Option<CellResult> = None;
        let mut by_host: Option<ByHost> = None;
        let mut last_reason = String::new();
        let mut last_query = None::<Instant>;
        let mut result_at = None::<Instant>;
        let mut failing_since = None::<Instant>;
        let mut state_seen = None::<sched::JobState>;
        let mut started = false;
        loop {
            // A stop asked before this loop began is not a change to wait for.
            if by_host.is_none() && *cancel.borrow() {
                by_host = Some(ByHost::Cancelled);
                let _ = self.sched.cancel(std::slice::from_ref(&job)).await;
            }
            tokio::select! {
                _ = tokio::time::sleep(FILE_POLL) => {}
                changed = cancel.changed(), if by_host.is_none() => {
                    if changed.is_err() || *cancel.borrow() {
                        by_host = Some(ByHost::Cancelled);
                        let _ = self.sched.cancel(std::slice::from_ref(&job)).await;
                    }
                }
            }
            for line in tail.lines() {
                if let Some(r) = relay.line(&line) {
                    result = Some(r);
                    result_at.get_or_insert_with(Instant::now);
                }
            }
            mirror = sync(mirror.take(), false).await;
            // Once the result is in (or the job was told to stop), ask often
            // until the job has left; otherwise at the configured pace.
            let pace = if result.is_some() || by_host.is_some() {
                FILE_POLL
            } else {
                self.poll()
            };
            if last_query.is_some_and(|t| t.elapsed() < pace) {
                continue;
            }
            last_query = Some(Instant::now());
            match self.sched.state(&job, pace).await {
                Ok(Some(s)) => {
                    failing_since = None;
                    if s.is_pending() {
                        if s.reason != last_reason && s.reason != "None" {
                            note(format!("slurm job {job} pending: {}", s.reason));
                            last_reason = s.reason.clone();
                        }
                        if by_host.is_none() && NEVER_REASONS.contains(&s.reason.as_str()) {
                            by_host = Some(ByHost::Unsatisfiable(s.reason.clone()));
                            let _ = self.sched.cancel(std::slice::from_ref(&job)).await;
                        }
                        if let (Some(max), None) = (self.cfg.max_pending, &by_host) {
                            if submitted.elapsed() > max {
                                by_host = Some(ByHost::PendingTooLong(s.reason.clone()));
                                let _ = self.sched.cancel(std::slice::from_ref(&job)).await;
                            }
                        }
                    } else if !started && !s.is_done() {
                        started = true;
                        note(format!("slurm job {job} running on {}", s.nodes));
                    }
                    let done = s.is_done();
                    state_seen = Some(s);
                    if done {
                        break;
                    }
                }
                // The controller no longer lists it: it ended a while ago.
                Ok(None) => break,
                Err(e) => {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > LOST_CONTROLLER {
                        let _ = self.sched.cancel(std::slice::from_ref(&job)).await;
                        by_host = Some(ByHost::LostController(e.to_string()));
                        break;
                    }
                }
            }
            if result_at.is_some_and(|t| t.elapsed() > END_WAIT) {
                break;
            }
        }
        for line in tail.lines() {
            if let Some(r) = relay.line(&line) {
                result = Some(r);
            }
        }
        let end = self.sched.end(&job).await.unwrap_or_else(|| JobEnd {
            state: state_seen.as_ref().map(|s| s.state.clone()).unwrap_or_default(),
            reason: state_seen.as_ref().map(|s| s.reason.clone()).unwrap_or_default(),
            ..Default::default()
        });
        self.sched.forget(&job).await;
        if result.is_none() {
            if let Ok(bytes) = tokio::fs::read(job_dir.join("result.json")).await {
                result = serde_json::from_slice(&bytes).ok().map(|r| relay.stamp(r));
            }
        }
        let slurm_log = tokio::fs::read_to_string(job_dir.join("slurm.log"))
            .await
            .unwrap_or_default();
        let mut result = judge(&cell_id, result, &end, &slurm_log, by_host.as_ref(), &spec);
        if result.status != Status::Succeeded {
            // The scheduler's side of the story, where `orch logs` and the
            // diagnosis read it.
            let mut text = format!(
                "orch: slurm job {job} ended {} (reason {}, exit code {}:{})\n",
                if end.state.is_empty() {
                    "UNKNOWN"
                } else {
                    &end.state
                },
                if end.reason.is_empty() {
                    "None"
                } else {
                    &end.reason
                },
                end.exit_code.unwrap_or(0),
                end.signal.unwrap_or(0)
            );
            if let Some(ByHost::Unsatisfiable(reason)) = &by_host {
                text.push_str(&format!(
                    "orch: slurm job {job} cannot run as asked (pending reason {reason})\n"
                ));
            }
            if let Some(ByHost::PendingTooLong(reason)) = &by_host {
                text.push_str(&format!(
                    "orch: slurm job {job} pending longer than `max_pending` (last reason: {reason})\n"
                ));
            }
            if let Some(f) = result.failure.as_ref().filter(|f| f.kind == "agent_crashed") {
                text.push_str(&format!("orch: {}\n", f.message));
            }
            text.push_str(&slurm_log);
            let log = job_dir.join("agent.log");
            let mut old = tokio::fs::read_to_string(&log).await.unwrap_or_default();
            if !old.is_empty() && !old.ends_with('\n') {
                old.push('\n');
            }
            let _ = tokio::fs::write(&log, old + &text).await;
        }
        node_results(&job_dir, &mut result).await;
        result.info.insert("slurm_job_id".into(), job.clone().into());
        if !end.nodes.is_empty() {
            result.info.insert("slurm_nodes".into(), end.nodes.clone().into());
        }
        result.info.insert("slurm_state".into(), end.state.clone().into());
        result
            .info
            .insert("slurm_request".into(), request_text(&spec).into());
        sync(mirror.take(), true).await;
        Ok(relay.stamp(result))
    }

    async fn cleanup(&self, run_id: &str) -> Result<(), BackendError> {
        let err = |e: sched::SchedError| {
            unavailable(
                format!("cannot list or cancel the run's jobs: {e}"),
                "check that `squeue` and `scancel` work here",
            )
        };
        let mut ids = self.sched.jobs_of_run(run_id).await.map_err(err)?;
        // `scancel` asks; wait (bounded) until the queue no longer lists them.
        for _ in 0..150 {
            if ids.is_empty() {
                break;
            }
            self.sched.cancel(&ids).await.map_err(err)?;
            tokio::time::sleep(Duration::from_millis(200)).await;
            ids = self.sched.jobs_of_run(run_id).await.map_err(err)?;
        }
        Ok(())
    }
}

/// What the cell asked for, in Slurm's words (for messages and the record).
fn request_text(spec: &JobSpec) -> String {
    script::sbatch_options(spec)
        .into_iter()
        .filter(|o| {
            !(o.starts_with("--job-name")
                || o.starts_with("--comment")
                || o.starts_with("--output")
                || o.starts_with("--open-mode")
                || o.starts_with("--no-requeue")
                || o.starts_with("--ntasks-per-node"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Memory kills as Slurm reports them without cgroups (`jobacct_gather`'s
/// `OverMemoryKill`) and with them.
fn killed_for_memory(end: &JobEnd, log: &str) -> bool {
    end.state == "OUT_OF_MEMORY"
        || log.contains("Exceeded job memory limit")
        || log.contains("Exceeded step memory limit")
        || log.contains("exceeded memory limit")
        || log.contains("oom_kill event")
        || log.contains("oom-kill event")
}

/// The cell's result from the agent's (if any) and the job's end.
fn judge(
    cell_id: &str,
    result: Option<CellResult>,
    end: &JobEnd,
    log: &str,
    by_host: Option<&ByHost>,
    spec: &JobSpec,
) -> CellResult {
    let state = end.state.as_str();
    let mem = || {
        format!(
            "slurm killed the job for using more memory than it asked for ({})",
            spec.mem_mib
                .map(|m| format!("--mem={m}M"))
                .unwrap_or_else(|| "the partition's default memory".into())
        )
    };
    let failed = |status: Status, kind: &str, message: String| {
        let mut r = CellResult::failed(cell_id, status, kind, message);
        if let Some(f) = r.failure.as_mut() {
            f.exit_code = end.exit_code;
            f.signal = end.signal;
        }
        r
    };
    let preempted = || {
        failed(
            Status::Cancelled,
            "preempted",
            "slurm preempted the job (a higher-priority job took its nodes); `orch run --resume RUN` runs the cell again"
                .into(),
        )
    };
    let node_failure = || {
        failed(
            Status::Failed,
            "node_failure",
            format!(
                "a node of the job failed ({state} on {}); the cell did not finish",
                if end.nodes.is_empty() { "?" } else { &end.nodes }
            ),
        )
    };
    let time_limit = || {
        failed(
            Status::Timeout,
            "timeout",
            format!("slurm's time limit ({} min) ended the job", spec.time_minutes),
        )
    };
    match (result, by_host) {
        (_, Some(ByHost::PendingTooLong(reason))) => failed(
            Status::Failed,
            "pending_too_long",
            format!(
                "the job waited in the queue longer than `max_pending` (last reason: {reason}) and was cancelled"
            ),
        ),
        (_, Some(ByHost::Unsatisfiable(reason))) => failed(
            Status::Failed,
            "unsatisfiable",
            format!(
                "slurm cannot run the job as asked (pending reason {reason}: the partition has fewer nodes, or limits lower than asked); asked: {}",
                request_text(spec)
            ),
        ),
        (_, Some(ByHost::LostController(e))) => failed(
            Status::Failed,
            "scheduler_unreachable",
            format!("the Slurm controller did not answer for {}s: {e}", LOST_CONTROLLER.as_secs()),
        ),
        (Some(r), _) if r.status == Status::Succeeded => r,
        // `scancel` signals every process of the job, the workload too:
        // whatever the agent saw, the cell was stopped.
        (Some(r), Some(ByHost::Cancelled)) => CellResult {
            status: Status::Cancelled,
            failure: Some(Failure {
                kind: "cancelled".into(),
                message: "the job was cancelled (`scancel`)".into(),
                exit_code: r.failure.as_ref().and_then(|f| f.exit_code),
                signal: r.failure.as_ref().and_then(|f| f.signal),
            }),
            ..r
        },
        (Some(r), _) if killed_for_memory(end, log) && r.status != Status::Cancelled => {
            let mut o = failed(Status::Oom, "oom", mem());
            o.metrics = r.metrics;
            o.timings = r.timings;
            o.hardware = r.hardware;
            o.info = r.info;
            o
        }
        (Some(r), _) if state == "PREEMPTED" => CellResult { failure: preempted().failure, ..r },
        (Some(r), _) if state == "TIMEOUT" && r.status == Status::Cancelled => CellResult {
            status: Status::Timeout,
            failure: time_limit().failure,
            ..r
        },
        (Some(r), _) if matches!(state, "NODE_FAIL" | "BOOT_FAIL") => CellResult {
            status: Status::Failed,
            failure: node_failure().failure,
            ..r
        },
        (Some(r), _) => r,
        (None, Some(ByHost::Cancelled)) => failed(Status::Cancelled, "cancelled", "the job was cancelled".into()),
        (None, None) if killed_for_memory(end, log) => failed(Status::Oom, "oom", mem()),
        (None, None) => match state {
            "TIMEOUT" | "DEADLINE" => time_limit(),
            "PREEMPTED" => preempted(),
            "NODE_FAIL" | "BOOT_FAIL" => node_failure(),
            "CANCELLED" => failed(
                Status::Failed,
                "cancelled_outside",
                "the job was cancelled outside orch (`scancel`, an administrator or a reservation's end)".into(),
            ),
            _ => {
                let tail: Vec<&str> = log.lines().rev().filter(|l| !l.trim().is_empty()).take(3).collect();
                let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
                // Slurm's `exit code N:S`: S is the signal that ended the
                // step, or N is a shell's 128 + signal.
                let signal = end
                    .signal
                    .filter(|s| *s > 0)
                    .or_else(|| end.exit_code.and_then(orch_protocol::signal_of_exit_code));
                let mut r = failed(
                    Status::Failed,
                    "agent_crashed",
                    format!(
                        "the agent crashed: the job ended without a result ({}, exit code {}:{}{}){}",
                        if state.is_empty() { "state unknown" } else { state },
                        end.exit_code.unwrap_or(0),
                        end.signal.unwrap_or(0),
                        signal
                            .map(|s| format!(", killed by {}", orch_protocol::describe_signal(s)))
                            .unwrap_or_default(),
                        if tail.is_empty() { String::new() } else { format!(": {tail}") }
                    ),
                );
                if let Some(f) = r.failure.as_mut() {
                    f.signal = signal;
                }
                r
            }
        },
    }
}

/// Every node's hardware, status and telemetry into `info.nodes`; a node
/// other than the first that failed fails the cell.
async fn node_results(job_dir: &Path, result: &mut CellResult) {
    let host = |dir: PathBuf| async move {
        tokio::fs::read_to_string(dir.join("node"))
            .await
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let mut nodes = vec![serde_json::json!({
        "rank": 0,
        "host": host(job_dir.to_path_buf()).await,
        "status": result.status,
        "hardware": result.hardware,
        "metrics": telemetry_metrics(&result.metrics),
    })];
    let mut rank = 1;
    let mut worst: Option<(u32, CellResult)> = None;
    loop {
        let dir = job_dir.join("nodes").join(rank.to_string());
        if !dir.is_dir() {
            break;
        }
        let r: Option<CellResult> = tokio::fs::read(dir.join("result.json"))
            .await
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        nodes.push(serde_json::json!({
            "rank": rank,
            "host": host(dir.clone()).await,
            "status": r.as_ref().map(|r| r.status.as_str()).unwrap_or("no_result"),
            "hardware": r.as_ref().and_then(|r| r.hardware.clone()),
            "metrics": r.as_ref().map(|r| telemetry_metrics(&r.metrics)).unwrap_or_default(),
        }));
        match r {
            Some(r) if r.status == Status::Succeeded => {}
            Some(r) => {
                worst.get_or_insert((rank, r));
            }
            None => {
                worst.get_or_insert((rank, CellResult::new(&result.cell_id, Status::Failed)));
            }
        }
        rank += 1;
    }
    if nodes.len() > 1 {
        result
            .info
            .insert("nodes".into(), serde_json::Value::Array(nodes));
        if result.status == Status::Succeeded {
            if let Some((rank, r)) = worst {
                result.status = if r.status == Status::Succeeded {
                    Status::Failed
                } else {
                    r.status
                };
                result.failure = Some(Failure {
                    kind: "node_rank_failed".into(),
                    message: format!(
                        "node rank {rank} did not succeed: {}",
                        r.failure
                            .map(|f| f.message)
                            .unwrap_or_else(|| "it wrote no result".into())
                    ),
                    exit_code: None,
                    signal: None,
                });
            }
        }
    }
}

/// The GPU telemetry figures of a result (`gpu_*`, energy, power).
fn telemetry_metrics(m: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    m.iter()
        .filter(|(k, _)| k.starts_with("gpu_") || k.contains("energy") || k.contains("power"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            run_id: "r".into(),
            cell_id: "c".into(),
            job_dir: PathBuf::from("/j"),
            time_minutes: 2,
            nodes: 1,
            gpu: Some(("h100".into(), 9)),
            gpu_flag: GpuFlag::Gres,
            cpus: None,
            mem_mib: Some(100),
            partition: Some("gpu".into()),
            account: None,
            qos: None,
            constraint: None,
            extra_args: vec![],
            agent: vec!["/o".into()],
        }
    }

    fn end(state: &str) -> JobEnd {
        JobEnd {
            state: state.into(),
            ..Default::default()
        }
    }

    #[test]
    fn job_ends_map_to_statuses() {
        let s = spec();
        let j = |r: Option<CellResult>, e: &str, log: &str, h: Option<&ByHost>| {
            judge("c", r, &end(e), log, h, &s)
        };
        let r = j(None, "OUT_OF_MEMORY", "", None);
        assert_eq!((r.status, r.failure.unwrap().kind.as_str()), (Status::Oom, "oom"));
        let r = j(
            None,
            "FAILED",
            "slurmstepd: error: Exceeded job memory limit\n",
            None,
        );
        assert_eq!(r.status, Status::Oom);
        assert!(r.failure.unwrap().message.contains("--mem=100M"));
        let r = j(None, "TIMEOUT", "", None);
        assert_eq!(
            (r.status, r.failure.unwrap().kind.as_str()),
            (Status::Timeout, "timeout")
        );
        let r = j(None, "NODE_FAIL", "", None);
        assert_eq!(
            (r.status, r.failure.unwrap().kind.as_str()),
            (Status::Failed, "node_failure")
        );
        let r = j(None, "PREEMPTED", "", None);
        assert_eq!(
            (r.status, r.failure.unwrap().kind.as_str()),
            (Status::Cancelled, "preempted")
        );
        let r = j(None, "CANCELLED", "", None);
        assert_eq!(r.failure.unwrap().kind, "cancelled_outside");
        let r = j(None, "CANCELLED", "", Some(&ByHost::Cancelled));
        assert_eq!(r.status, Status::Cancelled);
        let terminated = CellResult::failed("c", Status::Failed, "exit_code", "command exited with code 143");
        let r = j(Some(terminated), "CANCELLED", "", Some(&ByHost::Cancelled));
        assert_eq!(
            (r.status, r.failure.unwrap().exit_code),
            (Status::Cancelled, None)
        );
        let r = j(
            None,
            "CANCELLED",
            "",
            Some(&ByHost::PendingTooLong("Resources".into())),
        );
        let f = r.failure.unwrap();
        assert_eq!((r.status, f.kind.as_str()), (Status::Failed, "pending_too_long"));
        assert!(f.message.contains("Resources"));
        // The agent's own result stands, unless the scheduler knows better.
        let ok = CellResult::new("c", Status::Succeeded);
        assert_eq!(j(Some(ok), "COMPLETED", "", None).status, Status::Succeeded);
        let stopped = CellResult::failed("c", Status::Cancelled, "cancelled", "stopped");
        let r = j(Some(stopped.clone()), "TIMEOUT", "", None);
        assert_eq!(r.status, Status::Timeout);
        let r = j(Some(stopped), "PREEMPTED", "", None);
        assert_eq!(r.failure.unwrap().kind, "preempted");
        let crashed = CellResult::failed("c", Status::Failed, "signal", "killed");
        assert_eq!(
            j(Some(crashed), "FAILED", "Exceeded job memory limit", None).status,
            Status::Oom
        );
        let r = j(None, "FAILED", "x\nsrun: error: boom\n", None);
        let f = r.failure.unwrap();
        assert_eq!(f.kind, "agent_crashed");
        assert!(f.message.contains("srun: error: boom"), "{}", f.message);
    }

    #[test]
    fn request_text_is_what_was_asked() {
        assert_eq!(
            request_text(&spec()),
            "--time=2 --nodes=1 --gres=gpu:h100:9 --mem=100M --partition=gpu"
        );
    }
}
