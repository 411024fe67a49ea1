//! The scheduler, through its commands: `sbatch` (submit), `squeue` (state
//! of every watched job in one call), `scontrol show job` and `sacct` (a
//! finished job's exit code and reason), `scancel`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// No scheduler command may hang a run: a controller that does not answer
/// in this time is an error for that call.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

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

/// The scheduler's commands, with a shared view of the watched jobs'
/// states: one `squeue` call refreshes them all, however many cells wait.
pub struct Scheduler {
    watched: tokio::sync::Mutex<Watched>,
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
        }
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
    fn jobs_of_a_run_by_name_or_comment() {
        let text = "7|orch-r1-a.cpu|orch:r1:a.cpu|RUNNING\n8|x|orch:r1:b|PENDING\n9|orch-r10-a|orch:r10:a|RUNNING\n10|other|(null)|RUNNING\n";
        assert_eq!(parse_run_jobs(text, "r1"), vec!["7", "8"]);
    }
}
