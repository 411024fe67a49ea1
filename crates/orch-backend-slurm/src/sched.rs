//! The scheduler, through its commands: `sbatch` (submit), `squeue` (state
//! of every watched job in one call), `scontrol show job` and `sacct` (a
//! finished job's exit code and reason), `scancel`; and the submission
//! limit, read once per run (`scontrol show config`'s `MaxJobCount`, and with
//! enforced accounting `sacctmgr`'s `MaxSubmitJobs`/`GrpSubmitJobs` of the
//! user's association and `MaxSubmitJobsPerUser`/`PerAccount`/`GrpSubmitJobs`
//! of its QOS), less the user's jobs already queued (one `squeue -u`): the
//! run's submission slots, a job holding one until it leaves the queue.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// No scheduler command may hang a run: a controller that does not answer
/// in this time is an error for that call.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// At most this many scheduler commands run at once in the process, all
/// runs together: each is a process with two pipes, and each an RPC that
/// slurmctld serves from a bounded thread pool. Past it they wait their turn
/// (first come, first served), so the host's file descriptors and processes
/// do not grow with the cells submitted at once (200 at once held 493 fds
/// before this cap).
pub const COMMANDS_AT_ONCE: usize = 16;

static COMMANDS: Semaphore = Semaphore::const_new(COMMANDS_AT_ONCE);

/// The message of a request no node of the cluster can ever satisfy.
pub const UNSATISFIABLE: &str = "Requested node configuration is not available";

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("cannot run `{program}`: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("`{program}` did not answer within {}s", COMMAND_TIMEOUT.as_secs())]
    Timeout { program: String },
    /// The command ran and said no (its stderr, trimmed).
    #[error("`{program}` failed: {stderr}")]
    Failed { program: String, stderr: String },
}

impl SchedError {
    /// What the command printed when it refused.
    pub fn stderr(&self) -> &str {
        match self {
            SchedError::Failed { stderr, .. } => stderr,
            _ => "",
        }
    }
}

/// Where a job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobState {
    /// `PENDING`, `RUNNING`, `COMPLETING`, `COMPLETED`, `FAILED`,
    /// `OUT_OF_MEMORY`, `TIMEOUT`, `CANCELLED`, `NODE_FAIL`, `PREEMPTED`, ...
    pub state: String,
    /// Why it waits (`Priority`, `Resources`, `QOSMaxGRESPerUser`) or ended.
    pub reason: String,
    pub nodes: String,
}

impl JobState {
    pub fn is_pending(&self) -> bool {
        matches!(
            self.state.as_str(),
            "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD"
        )
    }

    /// The job has ended: nothing of it runs any more.
    pub fn is_done(&self) -> bool {
        !self.is_pending()
            && !matches!(
                self.state.as_str(),
                "RUNNING" | "COMPLETING" | "SUSPENDED" | "STAGE_OUT" | "SIGNALING" | "RESIZING" | "STOPPED"
            )
    }
}

/// A finished job's details (`scontrol show job`, else `sacct`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobEnd {
    pub state: String,
    pub reason: String,
    /// `ExitCode=CODE:SIGNAL` of the batch script.
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub nodes: String,
    /// `StartTime` (`Start` of `sacct`): when the job started on its nodes, where
    /// billing starts; `None` for a job that never started.
    pub started: Option<std::time::SystemTime>,
}

/// Words of `sbatch` refusing a job for a submission limit of the moment
/// (the user's or the controller's count of jobs), which a job leaving the
/// queue lifts: such a refusal is retried, not a failure.
const SUBMIT_LIMIT_WORDS: &[&str] = &[
    // AssocMaxSubmitJobLimit, AssocGrpSubmitJobsLimit, QOSMaxSubmitJobPerUserLimit,
    // QOSMaxSubmitJobPerAccountLimit, QOSGrpSubmitJobsLimit.
    "SubmitJob",
    "job submit limit",
    // MaxJobCount reached.
    "temporarily unable to accept job",
];

/// Whether `sbatch`'s refusal is a submission limit of the moment.
pub fn is_submit_limit(stderr: &str) -> bool {
    SUBMIT_LIMIT_WORDS.iter().any(|w| stderr.contains(w))
}

/// The most jobs the user may have queued or running at once, and the
/// setting that says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubmitLimit {
    pub jobs: usize,
    /// `MaxSubmitJobsPerUser of QOS `normal``, `MaxJobCount of the controller`.
    pub source: String,
}

/// Where the run's jobs go, for the limits that apply to them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    pub account: Option<String>,
    pub qos: Option<String>,
    pub partition: Option<String>,
}

/// The run's submission slots: `None` when no limit is known.
struct Gate {
    limit: Option<SubmitLimit>,
    /// Why the limits could not be read (the run then submits without a gate).
    unread: Option<String>,
    slots: Option<Arc<Semaphore>>,
    /// The user's jobs already in the queue when the run began.
    queued: usize,
}

/// A submission slot, held from `sbatch` until the job has left the queue.
pub struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
}

/// The scheduler's commands, with a shared view of the watched jobs'
/// states: one `squeue` call refreshes them all, however many cells wait;
/// and the run's submission slots.
pub struct Scheduler {
    watched: tokio::sync::Mutex<Watched>,
    gate: tokio::sync::OnceCell<Gate>,
}

#[derive(Default)]
struct Watched {
    ids: BTreeSet<String>,
    states: BTreeMap<String, JobState>,
    at: Option<Instant>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new()
    }
}

async fn run(
    program: &str,
    args: &[String],
    env: &[(String, String)],
    cwd: Option<&Path>,
) -> Result<String, SchedError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    // The semaphore is never closed: acquiring it cannot fail.
    let _turn = COMMANDS.acquire().await.ok();
    let out = match tokio::time::timeout(COMMAND_TIMEOUT, cmd.output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(source)) => {
            return Err(SchedError::Spawn {
                program: program.to_string(),
                source,
            })
        }
        Err(_) => {
            return Err(SchedError::Timeout {
                program: program.to_string(),
            })
        }
    };
    if !out.status.success() {
        return Err(SchedError::Failed {
            program: program.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Scheduler {
    pub fn new() -> Scheduler {
        Scheduler {
            watched: tokio::sync::Mutex::new(Watched::default()),
            gate: tokio::sync::OnceCell::new(),
        }
    }

    /// The submission limit of the user's jobs going to `target`: the
    /// smallest of the controller's `MaxJobCount` and, where accounting
    /// enforces limits, the association's and its QOS's. `Err`: the
    /// controller's configuration could not be read; a failing `sacctmgr`
    /// leaves the controller's limit.
    pub async fn submit_limit(&self, target: &Target) -> Result<Option<SubmitLimit>, SchedError> {
        let config = parse_config(&run("scontrol", &["show".into(), "config".into()], &[], None).await?);
        let mut limits: Vec<SubmitLimit> = Vec::new();
        if let Some(n) = config.max_job_count {
            limits.push(SubmitLimit {
                jobs: n,
                source: "`MaxJobCount` of the controller".into(),
            });
        }
        if config.enforces_limits {
            if let Some(user) = user_name().await {
                limits.extend(accounting_limits(&user, &config.cluster, target).await);
            }
        }
        Ok(limits.into_iter().min_by_key(|l| l.jobs))
    }

    async fn gate(&self, target: &Target) -> &Gate {
        self.gate
            .get_or_init(|| async {
                // A controller that does not answer here fails at `sbatch`, with its words.
                let (limit, unread) = match self.submit_limit(target).await {
                    Ok(l) => (l, None),
                    Err(e) => (None, Some(e.to_string())),
                };
                let queued = match limit {
                    Some(_) => self.queued_of_user().await.unwrap_or(0),
                    None => 0,
                };
                let slots = limit
                    .as_ref()
                    .map(|l| Arc::new(Semaphore::new(l.jobs.saturating_sub(queued).max(1))));
                Gate {
                    limit,
                    unread,
                    slots,
                    queued,
                }
            })
            .await
    }

    /// The run's submission limit and the user's jobs queued before it
    /// (read once, at the first call).
    pub async fn limit(&self, target: &Target) -> (Option<SubmitLimit>, usize) {
        let g = self.gate(target).await;
        (g.limit.clone(), g.queued)
    }

    /// The run's submission limit as [`Scheduler::submit_limit`] read it
    /// (once per scheduler: `orch plan`'s and `orch run`'s default of cells
    /// at once and the run's gate share the one reading); `Err`: why it
    /// could not be read.
    pub async fn read_limit(&self, target: &Target) -> Result<Option<SubmitLimit>, String> {
        let g = self.gate(target).await;
        match &g.unread {
            Some(e) => Err(e.clone()),
            None => Ok(g.limit.clone()),
        }
    }

    /// A scheduler whose limits were read already (tests).
    #[cfg(test)]
    pub(crate) fn read_already(limit: Option<SubmitLimit>, queued: usize) -> Scheduler {
        let s = Scheduler::new();
        let slots = limit
            .as_ref()
            .map(|l| Arc::new(Semaphore::new(l.jobs.saturating_sub(queued).max(1))));
        let gate = Gate {
            limit,
            unread: None,
            slots,
            queued,
        };
        if s.gate.set(gate).is_err() {
            unreachable!("a new scheduler's gate is unset");
        }
        s
    }

    /// A submission slot: at once while the run's jobs in the queue are
    /// under the limit (less the user's jobs queued before the run), else
    /// once one of them has left. `waiting` is called once when it must wait.
    pub async fn slot(&self, target: &Target, waiting: impl FnOnce(&SubmitLimit, usize)) -> Slot {
        let g = self.gate(target).await;
        let Some(slots) = &g.slots else {
            return Slot { _permit: None };
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                if let Some(l) = &g.limit {
                    waiting(l, g.queued);
                }
                // The semaphore is never closed.
                slots.clone().acquire_owned().await.ok()
            }
        };
        Slot { _permit: permit }
    }

    /// How many jobs of the current user the queue lists.
    async fn queued_of_user(&self) -> Result<usize, SchedError> {
        let mut args: Vec<String> = vec!["-h".into(), "-o".into(), "%i".into()];
        match std::env::var("USER").ok().filter(|u| !u.is_empty()) {
            Some(u) => args.extend(["-u".into(), u]),
            None => args.push("--me".into()),
        }
        let text = run("squeue", &args, &[], None).await?;
        Ok(text.lines().filter(|l| !l.trim().is_empty()).count())
    }

    /// `scontrol ping`: the commands are installed and the controller answers.
    pub async fn ping(&self) -> Result<String, SchedError> {
        let out = run("scontrol", &["ping".into()], &[], None).await?;
        if out.contains("DOWN") && !out.contains("UP") {
            return Err(SchedError::Failed {
                program: "scontrol".into(),
                stderr: out.trim().to_string(),
            });
        }
        Ok(out.trim().to_string())
    }

    /// Submit a batch script; the job id. `env` (secrets) goes to sbatch's
    /// environment, which the job inherits: never into the script.
    pub async fn submit(
        &self,
        script: &Path,
        env: &[(String, String)],
        cwd: Option<&Path>,
    ) -> Result<String, SchedError> {
        let out = run(
            "sbatch",
            &["--parsable".into(), script.to_string_lossy().into_owned()],
            env,
            cwd,
        )
        .await?;
        // `ID` or `ID;CLUSTER`.
        let id = out
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
            return Err(SchedError::Failed {
                program: "sbatch".into(),
                stderr: format!("unexpected answer `{}`", out.trim()),
            });
        }
        let mut w = self.watched.lock().await;
        w.ids.insert(id.clone());
        w.at = None;
        Ok(id)
    }

    /// Stop watching a job (it ended, its cell is recorded).
    pub async fn forget(&self, id: &str) {
        let mut w = self.watched.lock().await;
        w.ids.remove(id);
        w.states.remove(id);
    }

    /// A watched job's state, from a `squeue` call no older than `max_age`
    /// (made now, for every watched job, if the last one is older). `None`:
    /// the controller no longer lists the job.
    pub async fn state(&self, id: &str, max_age: Duration) -> Result<Option<JobState>, SchedError> {
        let mut w = self.watched.lock().await;
        if w.at.is_none_or(|t| t.elapsed() >= max_age) {
            let ids: Vec<String> = w.ids.iter().cloned().collect();
            let text = if ids.is_empty() {
                String::new()
            } else {
                match run(
                    "squeue",
                    &[
                        "-h".into(),
                        "-t".into(),
                        "all".into(),
                        "-j".into(),
                        ids.join(","),
                        "-o".into(),
                        "%i|%T|%r|%N".into(),
                    ],
                    &[],
                    None,
                )
                .await
                {
                    Ok(t) => t,
                    // Every id is unknown to the controller (purged).
                    Err(SchedError::Failed { stderr, .. }) if stderr.contains("Invalid job id") => {
                        String::new()
                    }
                    Err(e) => return Err(e),
                }
            };
            w.states = parse_squeue(&text);
            w.at = Some(Instant::now());
        }
        Ok(w.states.get(id).cloned())
    }

    /// A job's details once it ended: `scontrol show job`, else `sacct`
    /// (when the controller has already forgotten it).
    pub async fn end(&self, id: &str) -> Option<JobEnd> {
        if let Ok(text) = run(
            "scontrol",
            &["show".into(), "job".into(), "-o".into(), id.into()],
            &[],
            None,
        )
        .await
        {
            if let Some(e) = parse_scontrol(&text) {
                return Some(e);
            }
        }
        let text = run(
            "sacct",
            &[
                "-n".into(),
                "-P".into(),
                "-X".into(),
                "-j".into(),
                id.into(),
                "-o".into(),
                "State,ExitCode,Reason,NodeList,Start".into(),
            ],
            &[],
            None,
        )
        .await
        .ok()?;
        parse_sacct(&text)
    }

    /// `scancel` jobs (SIGTERM to every step, SIGKILL after the cluster's `KillWait`).
    pub async fn cancel(&self, ids: &[String]) -> Result<(), SchedError> {
        if ids.is_empty() {
            return Ok(());
        }
        run("scancel", ids, &[], None).await.map(|_| ())
    }

    /// Jobs of the current user whose name or comment marks them as a run's
    /// (`orch-<run>-...`, `orch:<run>:...`), still queued or running.
    pub async fn jobs_of_run(&self, run_id: &str) -> Result<Vec<String>, SchedError> {
        let user = std::env::var("USER").ok().filter(|u| !u.is_empty());
        let mut args: Vec<String> = vec!["-h".into(), "-o".into(), "%i|%j|%k|%T".into()];
        match user {
            Some(u) => args.extend(["-u".into(), u]),
            None => args.push("--me".into()),
        }
        let text = run("squeue", &args, &[], None).await?;
        Ok(parse_run_jobs(&text, run_id))
    }
}

/// The current user's name: `USER`, else `id -un`.
async fn user_name() -> Option<String> {
    if let Some(u) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return Some(u);
    }
    let out = run("id", &["-un".into()], &[], None).await.ok()?;
    Some(out.trim().to_string()).filter(|u| !u.is_empty())
}

/// What `scontrol show config` says about submission limits.
#[derive(Debug, Default, PartialEq, Eq)]
struct Config {
    max_job_count: Option<usize>,
    cluster: String,
    /// Accounting through slurmdbd, enforcing limits or QOS.
    enforces_limits: bool,
}

fn parse_config(text: &str) -> Config {
    let mut c = Config::default();
    let (mut storage, mut enforce) = (String::new(), String::new());
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "MaxJobCount" => c.max_job_count = v.parse().ok().filter(|n| *n > 0),
            "ClusterName" => c.cluster = v.to_string(),
            "AccountingStorageType" => storage = v.to_string(),
            "AccountingStorageEnforce" => enforce = v.to_string(),
            _ => {}
        }
    }
    c.enforces_limits = storage.contains("slurmdbd")
        && enforce
            .split(',')
            .any(|e| matches!(e.trim(), "limits" | "qos" | "safe"));
    c
}

/// A `sacctmgr -P` number: empty (no limit) or the count.
fn limit_field(s: Option<&&str>) -> Option<usize> {
    s.and_then(|v| v.trim().parse().ok())
}

/// The user's association rows (`Account|Partition|MaxSubmit|GrpSubmit|QOS|DefaultQOS`)
/// that apply to `target`: its account (else `default_account`), its
/// partition's row, else the one for every partition.
fn pick_assoc<'t>(text: &'t str, account: &str, partition: Option<&str>) -> Option<Vec<&'t str>> {
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.trim().split('|').collect::<Vec<_>>())
        .filter(|f| f.len() >= 6 && f[0] == account)
        .collect();
    let part = partition.and_then(|p| rows.iter().find(|f| f[1] == p));
    part.or_else(|| rows.iter().find(|f| f[1].is_empty())).cloned()
}

/// The association's limits and the QOS it runs under.
fn assoc_limits(row: &[&str], account: &str) -> (Vec<SubmitLimit>, String) {
    let mut out = Vec::new();
    if let Some(n) = limit_field(row.get(2)) {
        out.push(SubmitLimit {
            jobs: n,
            source: format!("`MaxSubmitJobs` of the association (account `{account}`)"),
        });
    }
    if let Some(n) = limit_field(row.get(3)) {
        out.push(SubmitLimit {
            jobs: n,
            source: format!("`GrpSubmitJobs` of the association (account `{account}`)"),
        });
    }
    // Its default QOS, else `normal` where it may use it, else its only one.
    let qos: Vec<&str> = row
        .get(4)
        .map(|q| q.split(',').map(str::trim).filter(|q| !q.is_empty()).collect())
        .unwrap_or_default();
    let default = row.get(5).map(|d| d.trim()).unwrap_or_default();
    let qos = if !default.is_empty() {
        default.to_string()
    } else if qos.len() == 1 {
        qos[0].to_string()
    } else {
        "normal".to_string()
    };
    (out, qos)
}

/// A QOS's limits from `Name|MaxSubmitPU|MaxSubmitPA|GrpSubmit`.
fn qos_limits(text: &str, qos: &str) -> Vec<SubmitLimit> {
    let Some(f) = text
        .lines()
        .map(|l| l.trim().split('|').collect::<Vec<_>>())
        .find(|f| f.len() >= 4 && f[0] == qos)
    else {
        return Vec::new();
    };
    [
        (1, "MaxSubmitJobsPerUser"),
        (2, "MaxSubmitJobsPerAccount"),
        (3, "GrpSubmitJobs"),
    ]
    .into_iter()
    .filter_map(|(i, name)| {
        limit_field(f.get(i)).map(|n| SubmitLimit {
            jobs: n,
            source: format!("`{name}` of QOS `{qos}`"),
        })
    })
    .collect()
}

/// The limits accounting puts on `user`'s jobs to `target` (none when
/// `sacctmgr` does not answer).
async fn accounting_limits(user: &str, cluster: &str, target: &Target) -> Vec<SubmitLimit> {
    let sacctmgr = |args: Vec<String>| async move {
        let mut all = vec!["-n".to_string(), "-P".into()];
        all.extend(args);
        run("sacctmgr", &all, &[], None).await.ok()
    };
    let account = match &target.account {
        Some(a) => a.clone(),
        None => {
            let Some(text) = sacctmgr(vec![
                "show".into(),
                "user".into(),
                user.into(),
                "format=DefaultAccount".into(),
            ])
            .await
            else {
                return Vec::new();
            };
            match text.lines().map(str::trim).find(|l| !l.is_empty()) {
                Some(a) => a.to_string(),
                None => return Vec::new(),
            }
        }
    };
    let mut filter = vec![format!("user={user}")];
    if !cluster.is_empty() {
        filter.push(format!("cluster={cluster}"));
    }
    let mut args: Vec<String> = vec!["show".into(), "assoc".into(), "where".into()];
    args.extend(filter);
    args.push("format=Account,Partition,MaxSubmitJobs,GrpSubmitJobs,QOS,DefaultQOS".into());
    let Some(text) = sacctmgr(args).await else {
        return Vec::new();
    };
    let Some(row) = pick_assoc(&text, &account, target.partition.as_deref()) else {
        return Vec::new();
    };
    let (mut limits, qos) = assoc_limits(&row, &account);
    let qos = target.qos.clone().unwrap_or(qos);
    if let Some(text) = sacctmgr(vec![
        "show".into(),
        "qos".into(),
        "where".into(),
        format!("name={qos}"),
        "format=Name,MaxSubmitJobsPerUser,MaxSubmitJobsPerAccount,GrpSubmitJobs".into(),
    ])
    .await
    {
        limits.extend(qos_limits(&text, &qos));
    }
    limits
}

fn parse_squeue(text: &str) -> BTreeMap<String, JobState> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().splitn(4, '|').collect();
            (f.len() == 4 && !f[0].is_empty()).then(|| {
                (
                    f[0].to_string(),
                    JobState {
                        state: f[1].to_string(),
                        reason: f[2].to_string(),
                        nodes: f[3].to_string(),
                    },
                )
            })
        })
        .collect()
}

fn exit_pair(s: &str) -> (Option<i32>, Option<i32>) {
    let mut it = s.split(':');
    let code = it.next().and_then(|c| c.trim().parse().ok());
    let sig = it.next().and_then(|c| c.trim().parse().ok()).filter(|s| *s != 0);
    (code, sig)
}

fn parse_scontrol(text: &str) -> Option<JobEnd> {
    let line = text.lines().find(|l| l.contains("JobState="))?;
    let mut end = JobEnd::default();
    for field in line.split_whitespace() {
        let Some((k, v)) = field.split_once('=') else {
            continue;
        };
        match k {
            "JobState" => end.state = v.to_string(),
            "Reason" => end.reason = v.to_string(),
            "NodeList" => end.nodes = v.to_string(),
            "ExitCode" => (end.exit_code, end.signal) = exit_pair(v),
            "StartTime" => end.started = slurm_time(v),
            _ => {}
        }
    }
    Some(end)
}

fn parse_sacct(text: &str) -> Option<JobEnd> {
    let line = text.lines().find(|l| !l.trim().is_empty())?;
    let f: Vec<&str> = line.trim().split('|').collect();
    let (exit_code, signal) = exit_pair(f.get(1).copied().unwrap_or_default());
    Some(JobEnd {
        // `CANCELLED by 1000` → `CANCELLED`.
        state: f.first()?.split_whitespace().next()?.to_string(),
        reason: f.get(2).copied().unwrap_or_default().to_string(),
        exit_code,
        signal,
        nodes: f.get(3).copied().unwrap_or_default().to_string(),
        started: f.get(4).and_then(|t| slurm_time(t)),
    })
}

/// A time as Slurm prints it (`2026-11-28T19:20:01`, the controller's local time,
/// taken as this host's); `Unknown`, `None` or nothing: none.
fn slurm_time(v: &str) -> Option<std::time::SystemTime> {
    use chrono::TimeZone as _;
    let t = chrono::NaiveDateTime::parse_from_str(v.trim(), "%Y-%m-%dT%H:%M:%S").ok()?;
    let t = chrono::Local.from_local_datetime(&t).earliest()?;
    Some(t.with_timezone(&chrono::Utc).into())
}

fn parse_run_jobs(text: &str, run_id: &str) -> Vec<String> {
    let name = format!("orch-{run_id}-");
    let comment = format!("orch:{run_id}:");
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().splitn(4, '|').collect();
            let ours = f.len() >= 3 && (f[1].starts_with(&name) || f[2].starts_with(&comment));
            ours.then(|| f[0].to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_parse_and_states_classify() {
        let m = parse_squeue(
            "12|PENDING|QOSMaxGRESPerUser|\n13|RUNNING|None|node[1-2]\n14|OUT_OF_MEMORY|OutOfMemory|n1\n",
        );
        assert_eq!(m["12"].reason, "QOSMaxGRESPerUser");
        assert!(m["12"].is_pending() && !m["12"].is_done());
        assert!(!m["13"].is_pending() && !m["13"].is_done());
        assert_eq!(m["13"].nodes, "node[1-2]");
        assert!(m["14"].is_done());
    }

    #[test]
    fn scontrol_and_sacct_give_the_end() {
        let line = "JobId=4 JobName=wrap UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=137:0 RunTime=00:00:01 NodeList=vm BatchHost=vm";
        let e = parse_scontrol(line).unwrap();
        assert_eq!(e.state, "FAILED");
        assert_eq!(e.reason, "NonZeroExitCode");
        assert_eq!((e.exit_code, e.signal), (Some(137), None));
        assert_eq!(e.nodes, "vm");
        let e = parse_scontrol("JobId=5 JobState=OUT_OF_MEMORY Reason=OutOfMemory ExitCode=0:125").unwrap();
        assert_eq!(
            (e.state.as_str(), e.exit_code, e.signal),
            ("OUT_OF_MEMORY", Some(0), Some(125))
        );
        let e = parse_sacct("CANCELLED by 1000|0:15|None|gpu01\n").unwrap();
        assert_eq!((e.state.as_str(), e.signal), ("CANCELLED", Some(15)));
        // Billing starts at the job's start; a job cancelled while pending has none.
        let e = parse_scontrol("JobId=6 JobState=COMPLETED StartTime=2026-11-28T19:20:01 EndTime=2026-11-28T19:21:00 ExitCode=0:0").unwrap();
        let local = chrono::DateTime::<chrono::Local>::from(e.started.unwrap());
        assert_eq!(
            local.format("%Y-%m-%dT%H:%M:%S").to_string(),
            "2026-11-28T19:20:01"
        );
        let e = parse_scontrol("JobId=7 JobState=CANCELLED StartTime=Unknown ExitCode=0:0").unwrap();
        assert_eq!(e.started, None);
        let e = parse_sacct("COMPLETED|0:0|None|gpu01|2026-11-28T19:20:01\n").unwrap();
        assert!(e.started.is_some());
        assert_eq!(
            parse_sacct("CANCELLED|0:0|None|None assigned|Unknown\n")
                .unwrap()
                .started,
            None
        );
        assert!(parse_sacct("").is_none());
    }

    #[test]
    fn the_submission_limit_is_read_from_config_association_and_qos() {
        let c = parse_config(
            "Configuration data as of 2026-11-28T19:19:05\nAccountingStorageEnforce = associations,limits,qos\nAccountingStorageType   = accounting_storage/slurmdbd\nClusterName             = orchtestx\nMaxJobCount             = 10000\n",
        );
        assert_eq!(
            c,
            Config {
                max_job_count: Some(10000),
                cluster: "orchtestx".into(),
                enforces_limits: true
            }
        );
        let c = parse_config(
            "AccountingStorageType = accounting_storage/none\nAccountingStorageEnforce = none\n",
        );
        assert!(!c.enforces_limits && c.max_job_count.is_none());
        let c = parse_config(
            "AccountingStorageType = accounting_storage/slurmdbd\nAccountingStorageEnforce = associations\n",
        );
        assert!(!c.enforces_limits);

        let assoc = "orch||3||normal|\nroot||50|200|normal,long|long\nroot|gpu|8||normal|\n";
        let row = pick_assoc(assoc, "root", None).unwrap();
        let (limits, qos) = assoc_limits(&row, "root");
        assert_eq!(qos, "long");
        assert_eq!(limits.iter().map(|l| l.jobs).collect::<Vec<_>>(), vec![50, 200]);
        assert!(
            limits[0].source.contains("`MaxSubmitJobs`"),
            "{}",
            limits[0].source
        );
        // The partition's own association first.
        let row = pick_assoc(assoc, "root", Some("gpu")).unwrap();
        assert_eq!(assoc_limits(&row, "root").0[0].jobs, 8);
        let row = pick_assoc(assoc, "orch", Some("gpu")).unwrap();
        assert_eq!(
            assoc_limits(&row, "orch"),
            (
                vec![SubmitLimit {
                    jobs: 3,
                    source: "`MaxSubmitJobs` of the association (account `orch`)".into()
                }],
                "normal".into()
            )
        );
        assert!(pick_assoc(assoc, "other", None).is_none());

        let q = qos_limits("normal|2|5|\nlong|||\n", "normal");
        assert_eq!(q.iter().map(|l| l.jobs).collect::<Vec<_>>(), vec![2, 5]);
        assert_eq!(q[0].source, "`MaxSubmitJobsPerUser` of QOS `normal`");
        assert!(qos_limits("normal|2|5|\nlong|||\n", "long").is_empty());
    }

    #[test]
    fn refusals_for_a_submission_limit_are_known() {
        for said in [
            "sbatch: error: AssocMaxSubmitJobLimit\nsbatch: error: Batch job submission failed: Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)",
            "sbatch: error: QOSMaxSubmitJobPerUserLimit",
            "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying",
        ] {
            assert!(is_submit_limit(said), "{said}");
        }
        assert!(!is_submit_limit(
            "sbatch: error: Batch job submission failed: Requested node configuration is not available"
        ));
        assert!(!is_submit_limit("sbatch: error: invalid partition specified: x"));
    }

    #[tokio::test]
    async fn slots_wait_for_a_job_to_leave() {
        let s = Scheduler::new();
        let gate = Gate {
            limit: Some(SubmitLimit {
                jobs: 3,
                source: "test".into(),
            }),
            unread: None,
            slots: Some(Arc::new(Semaphore::new(2))),
            queued: 1,
        };
        assert!(s.gate.set(gate).is_ok());
        let t = Target::default();
        let a = s.slot(&t, |_, _| panic!("no wait for the first")).await;
        let _b = s.slot(&t, |_, _| panic!("no wait for the second")).await;
        let waited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let w = waited.clone();
        let third = s.slot(&t, move |l, queued| {
            assert_eq!((l.jobs, queued), (3, 1));
            w.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        tokio::pin!(third);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut third)
            .await
            .is_err());
        assert!(waited.load(std::sync::atomic::Ordering::SeqCst));
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), third).await.unwrap();
    }

    #[test]
    fn jobs_of_a_run_by_name_or_comment() {
        let text = "7|orch-r1-a.cpu|orch:r1:a.cpu|RUNNING\n8|x|orch:r1:b|PENDING\n9|orch-r10-a|orch:r10:a|RUNNING\n10|other|(null)|RUNNING\n";
        assert_eq!(parse_run_jobs(text, "r1"), vec!["7", "8"]);
    }

    /// 200 cells submitted at once ran 200 `sbatch` processes at once (two
    /// pipes each: 493 fds at the peak). Each command here says how many
    /// are running beside it (one file each in a folder while it sleeps).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_more_than_the_cap_of_commands_run_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "touch {d}/$$; sleep 0.3; ls {d} | wc -l; rm {d}/$$",
            d = dir.path().display()
        );
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..3 * COMMANDS_AT_ONCE {
            let args = vec!["-c".to_string(), script.clone()];
            calls.spawn(async move { run("sh", &args, &[], None).await });
        }
        let mut seen: Vec<usize> = Vec::new();
        while let Some(r) = calls.join_next().await {
            seen.push(r.unwrap().unwrap().trim().parse().unwrap());
        }
        let most = seen.iter().copied().max().unwrap();
        assert!(most <= COMMANDS_AT_ONCE, "{most} at once: {seen:?}");
        assert!(most > 1, "they ran one by one: {seen:?}");
    }
}
