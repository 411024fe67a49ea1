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
//! - the files a cell names (workdir, patches, prompt file, a local repo as
//!   a git bundle, `sync:` paths) travel through the shared filesystem:
//!   their content-addressed blobs are copied once into
//!   `<shared_dir>/blobs/` (without `shared_dir`, the host cache's folder is
//!   used in place, and must be shared like the agent); the agent lays them
//!   out under the job folder's `files/` and checks each digest;
//! - `nodes: N` cells get `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`,
//!   `NNODES`, `NODE_RANK`; every node's agent writes its own result, and
//!   each node's hardware and telemetry go into the record (`info.nodes`);
//! - submissions keep to the user's submission limit, read once per run
//!   (`MaxJobCount`, and with enforced accounting `MaxSubmitJobs` and the
//!   like of the association and QOS), less the user's jobs already queued:
//!   a cell past it waits for one of the run's jobs to leave the queue; a
//!   refusal for such a limit (changed under the run, or one not read) is
//!   submitted again after a delay, never a failed cell;
//! - cancel, `--max-cost` and a lost controller `scancel` the cell's job;
//!   jobs are named `orch-<run>-<cell>` and commented `orch:<run>:<cell>`,
//!   which `cleanup` (`orch down RUN`) cancels by.
//!
//! No scheduler library: the commands every Slurm login node has.
//!
//! ## What is where
//!
//! the `slurm` backend: `script.rs` (the cell's `job.sh` with its
//! `#SBATCH` options and rendezvous variables, the per-node `node.sh` that starts the
//! agent into the job folder or `nodes/<rank>/`), `sched.rs` (`sbatch`, one `squeue` for
//! every watched job, `scontrol`/`sacct` for a finished job, `scancel`, jobs of a run by
//! name/comment, the submission limit and the run's submission slots, which refusals are
//! a limit's), `follow.rs` (the event stream's new lines, a mirror of a job folder on
//! `shared_dir` into the store), `lib.rs` (`SlurmBackend`: submission, live pending
//! reasons, `max_pending`, never-startable reasons, cancel, job end → status
//! (`OUT_OF_MEMORY`/`TIMEOUT`/`NODE_FAIL`/`PREEMPTED`), every node's record into
//! `info.nodes`, a slot before `sbatch` and refusals for a limit retried; `run_job` for
//! `orch setup --as-job`), `host.rs` (the host side, the `--jobs` default: the submission
//! limit). It does not: link a Slurm library
//! or talk to `slurmrestd`: the commands every login node has.

pub mod follow;
pub mod host;
pub mod sched;
pub mod script;

use async_trait::async_trait;
use follow::{Mirror, Tail};
use orch_backend::lifecycle::{self, Cell, Early, Platform, PlatformEnd, Stop};
use orch_backend::{Backend, BackendError, Cancel, CellLaunch, Events, Ran};
use orch_protocol::{CellResult, Event, Failure, FailureKind, Status};
use sched::{JobEnd, Scheduler, UNSATISFIABLE};
use script::{GpuFlag, JobSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use host::SlurmHost;
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
/// A job refused for a submission limit of the moment is submitted again
/// after this, doubling up to [`SUBMIT_RETRY_MAX`].
const SUBMIT_RETRY_FIRST: Duration = Duration::from_secs(2);
const SUBMIT_RETRY_MAX: Duration = Duration::from_secs(30);

pub struct SlurmBackend {
    cfg: SlurmConfig,
    /// The agent command on the shared filesystem (program, `agent`).
    agent: Vec<String>,
    /// Nodes per cell id (1 when absent).
    nodes: BTreeMap<String, u32>,
    sched: Arc<Scheduler>,
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
            sched: Arc::new(Scheduler::new()),
        })
    }

    /// Share `sched` (the host's, whose limits `orch plan`/`orch run` read
    /// for the default of cells at once) instead of a scheduler of its own.
    pub fn with_scheduler(mut self, sched: Arc<Scheduler>) -> SlurmBackend {
        self.sched = sched;
        self
    }

    /// A backend that only cancels jobs (`orch down`): no agent needed.
    pub fn for_cleanup() -> SlurmBackend {
        SlurmBackend {
            cfg: SlurmConfig::default(),
            agent: vec![],
            nodes: BTreeMap::new(),
            sched: Arc::new(Scheduler::new()),
        }
    }

    fn poll(&self) -> Duration {
        self.cfg.poll.unwrap_or(DEFAULT_POLL)
    }

    /// Where the cells' jobs go, for the submission limits.
    fn target(&self) -> sched::Target {
        target(&self.cfg)
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

    /// The folder of the cell's blobs as the compute nodes see it:
    /// `<shared_dir>/blobs`, each blob copied there once (content-addressed:
    /// one already there is not copied again); without `shared_dir`, the
    /// host cache's own folder, which must then be on the shared filesystem
    /// like the agent (a home folder usually is).
    async fn deliver_blobs(&self, files: &orch_files::Shipment) -> Result<PathBuf, BackendError> {
        let Some(shared) = &self.cfg.shared_dir else {
            let dir = files
                .blobs()
                .first()
                .and_then(|(_, p, _)| p.parent().map(Path::to_path_buf))
                .unwrap_or_default();
            return Ok(dir);
        };
        let dir = shared.join("blobs");
        tokio::fs::create_dir_all(&dir)
            .await
            .map_err(io_err(format!("create `{}`", dir.display())))?;
        for (sha, blob, size) in files.blobs() {
            let dest = dir.join(sha);
            if tokio::fs::metadata(&dest).await.is_ok_and(|m| m.len() == size) {
                continue;
            }
            let tmp = dir.join(format!(".{sha}.{}.part", std::process::id()));
            tokio::fs::copy(blob, &tmp).await.map_err(io_err(format!(
                "copy `{}` to `{}`",
                blob.display(),
                tmp.display()
            )))?;
            tokio::fs::rename(&tmp, &dest)
                .await
                .map_err(io_err(format!("write `{}`", dest.display())))?;
        }
        Ok(dir)
    }

    fn job_spec(&self, launch: &CellLaunch, job_dir: &Path) -> JobSpec {
        let task = &launch.task;
        let gpu = task.gpu.type_name().map(|ty| {
            let gres = self
                .cfg
                .gpu_types
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(ty))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| ty.to_ascii_lowercase());
            (gres, task.gpu.count())
        });
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

    async fn run_cell(&self, launch: CellLaunch, events: Events, cancel: Cancel) -> Ran {
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
        if let Some(files) = launch.files.as_ref().filter(|f| !f.is_empty()) {
            let blobs = self.deliver_blobs(files).await?;
            let root = job_dir.join("files");
            files.apply(&mut task, &root.to_string_lossy(), &blobs.to_string_lossy());
        }
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
        let mirror = mirrored.then(|| Mirror::new(job_dir.clone(), launch.cell_dir.clone()));
        // The agent writes `events.jsonl` into the job folder itself.
        let cell = Cell::with_agent_events(launch, events)?;
        let mut job = SlurmJob {
            backend: self,
            tail: Tail::new(job_dir.join("events.jsonl")),
            spec,
            job_dir,
            mirror,
            job: None,
            lines: Default::default(),
            submitted: Instant::now(),
            last_reason: String::new(),
            last_query: None,
            failing_since: None,
            state_seen: None,
            running: false,
            done: false,
            result_at: None,
            stopped: false,
            gave_up: None,
            end: None,
            slot: None,
        };
        Ok(lifecycle::drive(&mut job, cell, cancel).await)
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

/// Where a suite's jobs go, for the submission limits.
pub fn target(cfg: &SlurmConfig) -> sched::Target {
    sched::Target {
        account: cfg.account.clone(),
        qos: cfg.qos.clone(),
        partition: cfg.partition.clone(),
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

/// Why the host gave a job up before it ran.
#[derive(Debug, Clone, PartialEq)]
enum GaveUp {
    /// Pending for a reason that no wait can lift (`PartitionNodeLimit`...).
    Unsatisfiable(String),
    PendingTooLong(String),
    LostController(String),
}

impl GaveUp {
    fn early(&self, spec: &JobSpec) -> Early {
        match self {
            GaveUp::PendingTooLong(reason) => Early::failed(
                FailureKind::PendingTooLong,
                format!(
                    "the job waited in the queue longer than `max_pending` (last reason: {reason}) and was cancelled"
                ),
            ),
            GaveUp::Unsatisfiable(reason) => Early::failed(
                FailureKind::Unsatisfiable,
                format!(
                    "slurm cannot run the job as asked (pending reason {reason}: the partition has fewer nodes, or limits lower than asked); asked: {}",
                    request_text(spec)
                ),
            ),
            GaveUp::LostController(e) => Early::failed(
                FailureKind::SchedulerUnreachable,
                format!("the Slurm controller did not answer for {}s: {e}", LOST_CONTROLLER.as_secs()),
            ),
        }
    }
}

/// One cell's batch job: the slurm backend's platform.
struct SlurmJob<'a> {
    backend: &'a SlurmBackend,
    spec: JobSpec,
    job_dir: PathBuf,
    mirror: Option<Mirror>,
    job: Option<String>,
    tail: Tail,
    /// Lines read and not handed out yet.
    lines: std::collections::VecDeque<String>,
    submitted: Instant,
    last_reason: String,
    last_query: Option<Instant>,
    failing_since: Option<Instant>,
    state_seen: Option<sched::JobState>,
    running: bool,
    done: bool,
    result_at: Option<Instant>,
    stopped: bool,
    gave_up: Option<GaveUp>,
    end: Option<JobEnd>,
    /// The submission slot, from `sbatch` until the job has left the queue.
    slot: Option<sched::Slot>,
}

impl SlurmJob<'_> {
    async fn sync(&mut self, full: bool) {
        if let Some(mut m) = self.mirror.take() {
            self.mirror = tokio::task::spawn_blocking(move || {
                let _ = m.sync(full);
                m
            })
            .await
            .ok();
        }
    }

    async fn cancel_job(&self) {
        if let Some(job) = &self.job {
            let _ = self.backend.sched.cancel(std::slice::from_ref(job)).await;
        }
    }

    /// New lines of the event file, the mirror, and (at the pace) the
    /// scheduler's state. Returns once something may have changed.
    async fn poll(&mut self, cell: &Cell) {
        tokio::time::sleep(FILE_POLL).await;
        for line in self.tail.lines() {
            if matches!(Event::from_line(&line), Ok(Event::Result { .. })) {
                self.result_at.get_or_insert_with(Instant::now);
            }
            self.lines.push_back(line);
        }
        self.sync(false).await;
        let Some(job) = self.job.clone() else {
            self.done = true;
            return;
        };
        // Once the result is in (or the job was told to stop), ask often
        // until the job has left; otherwise at the configured pace.
        let pace = if self.result_at.is_some() || self.stopped {
            FILE_POLL
        } else {
            self.backend.poll()
        };
        if self.last_query.is_some_and(|t| t.elapsed() < pace) {
            return;
        }
        self.last_query = Some(Instant::now());
        match self.backend.sched.state(&job, pace).await {
            Ok(Some(s)) => {
                self.failing_since = None;
                if s.is_pending() {
                    if s.reason != self.last_reason && s.reason != "None" {
                        cell.message(&format!("slurm job {job} pending: {}", s.reason));
                        self.last_reason = s.reason.clone();
                    }
                    if !self.stopped && self.gave_up.is_none() {
                        if NEVER_REASONS.contains(&s.reason.as_str()) {
                            self.gave_up = Some(GaveUp::Unsatisfiable(s.reason.clone()));
                        } else if self
                            .backend
                            .cfg
                            .max_pending
                            .is_some_and(|max| self.submitted.elapsed() > max)
                        {
                            self.gave_up = Some(GaveUp::PendingTooLong(s.reason.clone()));
                        }
                        if self.gave_up.is_some() {
                            self.cancel_job().await;
                        }
                    }
                } else if !self.running && !s.is_done() {
                    self.running = true;
                    cell.message(&format!("slurm job {job} running on {}", s.nodes));
                }
                self.done = s.is_done();
                self.state_seen = Some(s);
            }
            // The controller no longer lists it: it ended a while ago.
            Ok(None) => self.done = true,
            Err(e) => {
                let since = *self.failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > LOST_CONTROLLER {
                    self.cancel_job().await;
                    self.gave_up = Some(GaveUp::LostController(e.to_string()));
                    self.done = true;
                }
            }
        }
        if self.result_at.is_some_and(|t| t.elapsed() > END_WAIT) {
            self.done = true;
        }
    }

    /// The job's end as the scheduler tells it (asked once).
    async fn job_end(&mut self) -> JobEnd {
        if let Some(e) = &self.end {
            return e.clone();
        }
        let Some(job) = self.job.clone() else {
            return JobEnd::default();
        };
        let seen = self.state_seen.as_ref();
        let end = self.backend.sched.end(&job).await.unwrap_or_else(|| JobEnd {
            state: seen.map(|s| s.state.clone()).unwrap_or_default(),
            reason: seen.map(|s| s.reason.clone()).unwrap_or_default(),
            ..Default::default()
        });
        self.backend.sched.forget(&job).await;
        // It has left the queue (or was given up): its slot is the next job's.
        self.slot = None;
        self.end = Some(end.clone());
        end
    }
}

#[async_trait]
impl Platform for SlurmJob<'_> {
    fn what(&self) -> &'static str {
        "the job"
    }

    fn limit(&self, _m: &orch_protocol::Measure) -> Duration {
        // Slurm's `--time`, in whole minutes.
        Duration::from_secs(self.spec.time_minutes * 60)
    }

    async fn started(&mut self, cell: &mut Cell) -> Result<(), Early> {
        let target = self.backend.target();
        let (limit, _) = self.backend.sched.limit(&target).await;
        if let Some(l) = limit.as_ref().filter(|l| l.jobs == 0) {
            return Err(Early::failed(
                FailureKind::Submit,
                format!(
                    "slurm allows this user no job ({} is 0); hint: ask the cluster's admins, or set `slurm.account`/`slurm.qos` to one that allows jobs",
                    l.source
                ),
            ));
        }
        let job_dir = self.job_dir.clone();
        self.slot = Some(
            self.backend
                .sched
                .slot(&target, |l, queued| {
                    cell.message(&format!(
                        "waiting to submit: the run's jobs and {queued} other job(s) of the user fill the submission limit ({}: {})",
                        l.source, l.jobs
                    ))
                })
                .await,
        );
        let cwd = std::env::current_dir().ok();
        let mut delay = SUBMIT_RETRY_FIRST;
        let job = loop {
            let submitted = self
                .backend
                .sched
                .submit(&job_dir.join("job.sh"), &cell.launch.secrets, cwd.as_deref())
                .await;
            match submitted {
                Ok(id) => break id,
                // A limit of the moment (changed under the run, or other
                // jobs of the user): submitted again once jobs may have left.
                Err(e) if sched::is_submit_limit(e.stderr()) => {
                    let said = e
                        .stderr()
                        .lines()
                        .find(|l| sched::is_submit_limit(l))
                        .unwrap_or_default()
                        .trim_start_matches("sbatch: error: ")
                        .to_string();
                    cell.message(&format!(
                        "slurm refused the job for now ({said}); submitting again in {}s",
                        delay.as_secs()
                    ));
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(SUBMIT_RETRY_MAX);
                }
                Err(e) => {
                    let said = e.stderr().to_string();
                    let _ = tokio::fs::write(self.job_dir.join("agent.log"), format!("orch: sbatch: {e}\n"))
                        .await;
                    return Err(if said.contains(UNSATISFIABLE) {
                        Early::failed(
                            FailureKind::Unsatisfiable,
                            format!(
                                "slurm refused the job: no node can ever run it ({UNSATISFIABLE}); asked: {}",
                                request_text(&self.spec)
                            ),
                        )
                    } else {
                        Early::failed(FailureKind::Submit, format!("slurm refused the job: {e}"))
                    });
                }
            }
        };
        cell.message(&format!("slurm job {job} submitted"));
        self.job = Some(job);
        self.submitted = Instant::now();
        while !self.running && !self.done {
            self.poll(cell).await;
            if let Some(g) = &self.gave_up {
                return Err(g.early(&self.spec));
            }
        }
        Ok(())
    }

    async fn next_line(&mut self, cell: &mut Cell) -> Option<String> {
        loop {
            if let Some(line) = self.lines.pop_front() {
                return Some(line);
            }
            if self.done {
                // The last lines written before the job left.
                self.lines.extend(self.tail.lines());
                return self.lines.pop_front();
            }
            self.poll(cell).await;
        }
    }

    async fn stop(&mut self, cell: &mut Cell, _why: Stop, kill: bool) {
        // `scancel` signals every process of the job, the workload too.
        self.stopped = true;
        self.cancel_job().await;
        if kill {
            // The host stops following the job (a stop before it was seen
            // running, or past the grace): wait, bounded, until it has left
            // the queue, so that nothing it writes into the job folder (its
            // `agent-result.json` in the store's cell folder) comes after the
            // record.
            let until = Instant::now() + END_WAIT;
            while !self.done && Instant::now() < until {
                self.poll(cell).await;
            }
        }
    }

    async fn end(&mut self, cell: &mut Cell, _stopped: Option<Stop>) -> PlatformEnd {
        let end = self.job_end().await;
        // Billing starts when the job started on its nodes.
        if let Some(at) = end.started {
            cell.container_started(at);
        }
        let log = tokio::fs::read_to_string(self.job_dir.join("slurm.log"))
            .await
            .unwrap_or_default();
        let (verdict, words) = job_end(&end, &log, &self.spec);
        // Slurm's `exit code N:S`: S is the signal that ended the step, or
        // N is a shell's 128 + signal.
        let signal = end
            .signal
            .filter(|s| *s > 0)
            .or_else(|| end.exit_code.and_then(orch_protocol::signal_of_exit_code));
        let _ = cell;
        PlatformEnd {
            result: Cell::result_file(&self.job_dir),
            exit_code: end.exit_code,
            signal,
            verdict,
            words,
        }
    }

    fn note_line(&self, _f: &Failure) -> Option<String> {
        None
    }

    async fn finish(&mut self, _cell: &mut Cell, result: &mut CellResult) {
        let end = self.job_end().await;
        if let Some(job) = self.job.clone() {
            if result.status != Status::Succeeded {
                // The scheduler's side of the story, where `orch logs` and
                // the diagnosis read it.
                let or = |s: &str, d: &'static str| {
                    if s.is_empty() {
                        d.to_string()
                    } else {
                        s.to_string()
                    }
                };
                let mut text = format!(
                    "orch: slurm job {job} ended {} (reason {}, exit code {}:{})\n",
                    or(&end.state, "UNKNOWN"),
                    or(&end.reason, "None"),
                    end.exit_code.unwrap_or(0),
                    end.signal.unwrap_or(0)
                );
                match &self.gave_up {
                    Some(GaveUp::Unsatisfiable(reason)) => text.push_str(&format!(
                        "orch: slurm job {job} cannot run as asked (pending reason {reason})\n"
                    )),
                    Some(GaveUp::PendingTooLong(reason)) => text.push_str(&format!(
                        "orch: slurm job {job} pending longer than `max_pending` (last reason: {reason})\n"
                    )),
                    _ => {}
                }
                text.push_str(
                    &tokio::fs::read_to_string(self.job_dir.join("slurm.log"))
                        .await
                        .unwrap_or_default(),
                );
                let log = self.job_dir.join("agent.log");
                let mut old = tokio::fs::read_to_string(&log).await.unwrap_or_default();
                if !old.is_empty() && !old.ends_with('\n') {
                    old.push('\n');
                }
                let _ = tokio::fs::write(&log, old + &text).await;
            }
            node_results(&self.job_dir, result).await;
            result.info.insert("slurm_job_id".into(), job.into());
            if !end.nodes.is_empty() {
                result.info.insert("slurm_nodes".into(), end.nodes.clone().into());
            }
            result.info.insert("slurm_state".into(), end.state.clone().into());
        }
        result
            .info
            .insert("slurm_request".into(), request_text(&self.spec).into());
        self.sync(true).await;
    }
}

/// A status and its failure.
type Ended = Option<(Status, Failure)>;

/// What a job's end says, when the scheduler ended it: (verdict, words)
/// for [`PlatformEnd`].
fn job_end(end: &JobEnd, log: &str, spec: &JobSpec) -> (Ended, Ended) {
    let state = end.state.as_str();
    let failure =
        |kind: FailureKind, message: String| Failure::new(kind, message).exited(end.exit_code, end.signal);
    if killed_for_memory(end, log) {
        let mem = spec
            .mem_mib
            .map(|m| format!("--mem={m}M"))
            .unwrap_or_else(|| "the partition's default memory".into());
        let f = failure(
            FailureKind::Oom,
            format!("slurm killed the job for using more memory than it asked for ({mem})"),
        );
        return (Some((Status::Oom, f)), None);
    }
    let verdict = match state {
        "TIMEOUT" | "DEADLINE" => Some((
            Status::Timeout,
            failure(FailureKind::Timeout, format!("slurm's time limit ({} min) ended the job", spec.time_minutes)),
        )),
        "PREEMPTED" => Some((
            Status::Cancelled,
            failure(
                FailureKind::Preempted,
                "slurm preempted the job (a higher-priority job took its nodes); `orch run --resume RUN` runs the cell again".into(),
            ),
        )),
        "NODE_FAIL" | "BOOT_FAIL" => Some((
            Status::Failed,
            failure(
                FailureKind::NodeFailure,
                format!(
                    "a node of the job failed ({state} on {}); the cell did not finish",
                    if end.nodes.is_empty() { "?" } else { &end.nodes }
                ),
            ),
        )),
        _ => None,
    };
    if verdict.is_some() {
        return (verdict, None);
    }
    let words = if state == "CANCELLED" {
        failure(
            FailureKind::CancelledOutside,
            "the job was cancelled outside orch (`scancel`, an administrator or a reservation's end)".into(),
        )
    } else {
        let tail: Vec<&str> = log
            .lines()
            .rev()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect();
        let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
        failure(
            FailureKind::AgentCrashed,
            format!(
                "the agent crashed: the job ended without a result ({}, exit code {}:{}){}",
                if state.is_empty() { "state unknown" } else { state },
                end.exit_code.unwrap_or(0),
                end.signal.unwrap_or(0),
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(": {tail}")
                }
            ),
        )
    };
    (None, Some((Status::Failed, words)))
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
        let r: Option<CellResult> = tokio::fs::read(dir.join(orch_protocol::AGENT_RESULT_FILE))
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
                result.failure = Some(Failure::new(
                    FailureKind::NodeRankFailed,
                    format!(
                        "node rank {rank} did not succeed: {}",
                        r.failure
                            .map(|f| f.message)
                            .unwrap_or_else(|| "it wrote no result".into())
                    ),
                ));
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
        let dir = tempfile::tempdir().unwrap();
        let j = |r: Option<CellResult>, e: &str, log: &str, stopped: Option<Stop>| {
            let (verdict, words) = job_end(&end(e), log, &s);
            let end = PlatformEnd {
                verdict,
                words,
                ..Default::default()
            };
            lifecycle::judge_in(dir.path(), "c", "the job", &|_| None, r, stopped, end)
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
        assert_eq!(r.failure.unwrap().kind, FailureKind::CancelledOutside);
        let r = j(None, "CANCELLED", "", Some(Stop::Cancelled));
        assert_eq!(r.status, Status::Cancelled);
        let terminated = CellResult::failed(
            "c",
            Status::Failed,
            FailureKind::ExitCode,
            "command exited with code 143",
        );
        let r = j(Some(terminated), "CANCELLED", "", Some(Stop::Cancelled));
        assert_eq!(
            (r.status, r.failure.unwrap().exit_code),
            (Status::Cancelled, None)
        );
        // The agent's own result stands, unless the scheduler knows better.
        let ok = CellResult::new("c", Status::Succeeded);
        assert_eq!(j(Some(ok), "COMPLETED", "", None).status, Status::Succeeded);
        let stopped = CellResult::failed("c", Status::Cancelled, FailureKind::Cancelled, "stopped");
        let r = j(Some(stopped.clone()), "TIMEOUT", "", None);
        assert_eq!(r.status, Status::Timeout);
        let r = j(Some(stopped), "PREEMPTED", "", None);
        assert_eq!(r.failure.unwrap().kind, FailureKind::Preempted);
        let crashed = CellResult::failed("c", Status::Failed, FailureKind::Signal, "killed");
        assert_eq!(
            j(Some(crashed), "FAILED", "Exceeded job memory limit", None).status,
            Status::Oom
        );
        let r = j(None, "FAILED", "x\nsrun: error: boom\n", None);
        let f = r.failure.unwrap();
        assert_eq!(f.kind, FailureKind::AgentCrashed);
        assert!(f.message.contains("srun: error: boom"), "{}", f.message);
        // Given up before it ran.
        let e = GaveUp::PendingTooLong("Resources".into()).early(&s);
        assert_eq!(e.failure.kind, FailureKind::PendingTooLong);
        assert!(e.failure.message.contains("Resources"));
    }

    #[test]
    fn request_text_is_what_was_asked() {
        assert_eq!(
            request_text(&spec()),
            "--time=2 --nodes=1 --gres=gpu:h100:9 --mem=100M --partition=gpu"
        );
    }
}
