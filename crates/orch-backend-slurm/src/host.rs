//! The slurm backend's host side: the suite's `slurm:` section into the
//! backend's configuration, the weights folder on the shared filesystem,
//! `orch setup --as-job`, `orch down`, per-partition prices, multi-node
//! cells, and the default of cells at once (the submission limit).

use crate::sched::Scheduler;
use crate::{GpuRequest, SlurmBackend, SlurmConfig};
use async_trait::async_trait;
use orch_backend::host::{
    Check, DefaultJobs, Flags, Host, Images, Kind, OnLine, SetupPlace, SetupRequest, Weights,
};
use orch_backend::{Backend, BackendError};
use orch_manifest::{Plan, SlurmDef};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The most cells at once by default, however high the submission limit
/// (`MaxJobCount` is 10,000 on a cluster that sets nothing): each waiting
/// cell costs the host a task and a file poll.
pub const MAX_DEFAULT_JOBS: usize = 1000;
/// Cells at once by default when the controller's limits cannot be read.
pub const FALLBACK_JOBS: usize = 64;

/// Cells at once by default: the user's submission limit for the suite's
/// account, QOS and partition (at most [`MAX_DEFAULT_JOBS`]), as `sched`
/// reads it once for the run (its gate uses the same reading).
pub async fn default_jobs(def: Option<&SlurmDef>, sched: &Scheduler) -> DefaultJobs {
    let target = crate::target(&config(def));
    match sched.read_limit(&target).await {
        Ok(Some(l)) if l.jobs > MAX_DEFAULT_JOBS => DefaultJobs::new(
            MAX_DEFAULT_JOBS,
            format!(
                "the submission limit is {} ({}); at most {MAX_DEFAULT_JOBS} by default",
                l.jobs, l.source
            ),
        ),
        Ok(Some(l)) => DefaultJobs::new(l.jobs, format!("the submission limit, {}", l.source)),
        Ok(None) => DefaultJobs::new(FALLBACK_JOBS, "the cluster sets no submission limit"),
        Err(e) => DefaultJobs::new(
            FALLBACK_JOBS,
            format!(
                "the submission limits could not be read: {}",
                orch_backend::host::first_line(&e)
            ),
        ),
    }
}

pub fn config(def: Option<&SlurmDef>) -> SlurmConfig {
    let Some(d) = def else {
        return SlurmConfig::default();
    };
    SlurmConfig {
        partition: d.partition.clone(),
        account: d.account.clone(),
        qos: d.qos.clone(),
        constraint: d.constraint.clone(),
        extra_args: d.extra_args.clone(),
        shared_dir: d.shared_dir.as_ref().map(PathBuf::from),
        max_pending: d.max_pending.map(|s| Duration::from_secs_f64(s.0)),
        cpus: d.cpus,
        gpu_types: d.gpu_types.clone(),
        gpu_flag: match d.gpu_request.as_deref() {
            Some("gpus") => GpuRequest::Gpus,
            _ => GpuRequest::Gres,
        },
        poll: d.poll.map(|s| Duration::from_secs_f64(s.0.max(0.1))),
    }
}

/// The weights volume of slurm cells: `--weights-dir`, else the suite's
/// `slurm.weights_dir`, else `<shared_dir>/weights`, else the local default
/// (a home folder, which clusters share).
pub fn weights_dir(def: Option<&SlurmDef>, flag: Option<&PathBuf>) -> PathBuf {
    if let Some(f) = flag {
        return f.clone();
    }
    match def {
        Some(SlurmDef {
            weights_dir: Some(w), ..
        }) => PathBuf::from(w),
        Some(SlurmDef {
            shared_dir: Some(s), ..
        }) => PathBuf::from(s).join("weights"),
        _ => orch_hub::default_weights_dir(),
    }
}

pub fn backend(plan: &Plan, sched: Arc<Scheduler>) -> Result<SlurmBackend, BackendError> {
    let nodes: BTreeMap<String, u32> = plan
        .cells
        .iter()
        .filter(|c| c.nodes > 1)
        .map(|c| (c.id.clone(), c.nodes))
        .collect();
    Ok(SlurmBackend::new(config(plan.slurm.as_ref()), nodes)?.with_scheduler(sched))
}

/// `orch setup --backend slurm --as-job`: the same setup, run by this
/// binary (on the shared filesystem) in a batch job, for clusters whose
/// login nodes may not download. Its output is shown as it comes.
pub async fn setup_as_job(
    req: &SetupRequest,
    def: Option<&SlurmDef>,
    weights_dir: &std::path::Path,
    on_line: OnLine<'_>,
) -> Result<i32, BackendError> {
    let cfg = config(def);
    let orch = crate::shared_orch(cfg.shared_dir.as_deref())?;
    let mut argv = vec![
        orch.to_string_lossy().into_owned(),
        "setup".into(),
        "--backend".into(),
        "slurm".into(),
        "--weights-dir".into(),
        weights_dir.to_string_lossy().into_owned(),
        "--connections".into(),
        req.connections.to_string(),
    ];
    match &req.file {
        // The suite keeps each model's include/exclude patterns.
        Some(f) => {
            let f = std::fs::canonicalize(f).unwrap_or(f.clone());
            argv.extend(["-f".into(), f.to_string_lossy().into_owned()]);
            for m in &req.models {
                argv.extend(["--model".into(), m.clone()]);
            }
        }
        None => {
            for r in &req.requests {
                argv.extend(["--model".into(), format!("{}@{}", r.repo, r.revision)]);
            }
        }
    }
    // The token reaches the job through sbatch's environment only.
    let env: Vec<(String, String)> = ["HF_TOKEN", "HF_ENDPOINT"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
        .collect();
    let dir = weights_dir.join(".orch");
    let name = format!("setup-{}", std::process::id());
    on_line(
        false,
        &format!(
            "weights volume: {} (downloaded by a slurm job)\n",
            weights_dir.display()
        ),
    );
    let end = crate::run_job(&cfg, &dir, &name, &argv, &env, |l| {
        on_line(false, &format!("  {l}\n"))
    })
    .await?;
    if end.state == "COMPLETED" {
        return Ok(0);
    }
    // The job's own exit code (2: a user error such as a gated repository).
    on_line(
        false,
        &format!(
            "the setup job ended {} (exit code {}): its output is in `{}`\n",
            if end.state.is_empty() {
                "UNKNOWN"
            } else {
                &end.state
            },
            end.exit_code.unwrap_or(0),
            dir.join(format!("{name}.log")).display()
        ),
    );
    Ok(end.exit_code.filter(|c| *c != 0).unwrap_or(1))
}

/// The slurm backend's host side.
pub struct SlurmHost {
    pub flags: Flags,
    /// The run's scheduler: its submission limits are read once, for the
    /// default of cells at once and the backend's gate alike.
    sched: Arc<Scheduler>,
}

impl SlurmHost {
    pub fn new(flags: Flags) -> SlurmHost {
        SlurmHost {
            flags,
            sched: Arc::new(Scheduler::new()),
        }
    }
}

#[async_trait]
impl Host for SlurmHost {
    fn kind(&self) -> Kind {
        Kind::Slurm
    }

    async fn weights(&self, plan: Option<&Plan>, _create: bool) -> Result<Weights, BackendError> {
        let def = plan.and_then(|p| p.slurm.as_ref());
        Ok(Weights::Folder(weights_dir(def, self.flags.weights_dir.as_ref())))
    }

    async fn backend(&self, plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError> {
        let backend = backend(plan, self.sched.clone())?;
        backend.preflight().await?;
        Ok((Arc::new(backend), Images::new()))
    }

    async fn setup(
        &self,
        req: &SetupRequest,
        plan: Option<&Plan>,
        on_line: OnLine<'_>,
    ) -> Result<SetupPlace, BackendError> {
        let def = plan.and_then(|p| p.slurm.as_ref());
        let dir = weights_dir(def, self.flags.weights_dir.as_ref());
        if req.as_job {
            return setup_as_job(req, def, &dir, on_line).await.map(SetupPlace::Ran);
        }
        // A folder on the cluster's shared filesystem, filled from the login node.
        Ok(SetupPlace::Here(dir))
    }

    async fn down(&self, run_id: &str, _plan: &Plan) -> Result<String, BackendError> {
        SlurmBackend::for_cleanup().cleanup(run_id).await?;
        Ok(format!("cancelled every slurm job of run {run_id}"))
    }

    fn max_nodes(&self) -> u32 {
        u32::MAX
    }

    async fn default_jobs(&self, plan: &Plan, _host_gpus: Option<usize>) -> DefaultJobs {
        default_jobs(plan.slurm.as_ref(), &self.sched).await
    }

    fn price_partition<'p>(&self, plan: &'p Plan) -> Option<&'p str> {
        plan.slurm.as_ref().and_then(|s| s.partition.as_deref())
    }

    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        doctor(plan, self.flags.weights_dir.as_ref()).await
    }
}

/// A program on `PATH`.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// One partition as `sinfo` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct Partition {
    pub name: String,
    pub default: bool,
    pub up: bool,
    /// The GRES of its nodes (`gpu:h100:8`, or empty).
    pub gres: Vec<String>,
}

/// `sinfo -h -o '%P|%a|%G'` lines into partitions (one line per node
/// group: GRES of the groups of one partition are merged).
pub fn parse_sinfo(text: &str) -> Vec<Partition> {
    let mut out: Vec<Partition> = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut f = line.trim().split('|');
        let (Some(name), Some(avail), Some(gres)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let default = name.ends_with('*');
        let name = name.trim_end_matches('*').to_string();
        let gres: Vec<String> = gres
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty() && *g != "(null)")
            .map(String::from)
            .collect();
        match out.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                for g in gres {
                    if !p.gres.contains(&g) {
                        p.gres.push(g);
                    }
                }
            }
            None => out.push(Partition {
                name,
                default,
                up: avail == "up",
                gres,
            }),
        }
    }
    out
}

/// `orch doctor --backend slurm`: the commands, the partitions and their
/// GPUs (GRES), the suite's partition, the weights folder.
async fn doctor(plan: Option<&Plan>, weights_flag: Option<&PathBuf>) -> Vec<Check> {
    if on_path("sbatch").is_none() {
        return vec![Check::skipped(
            "commands",
            "no `sbatch` on `PATH`: no Slurm cluster here",
            "run orch on a login node of the cluster, with Slurm's client commands on `PATH`",
        )];
    }
    let mut out = Vec::new();
    let missing: Vec<&str> = ["sbatch", "squeue", "scontrol", "scancel", "sinfo"]
        .into_iter()
        .filter(|c| on_path(c).is_none())
        .collect();
    if missing.is_empty() {
        out.push(Check::ok(
            "commands",
            "sbatch, squeue, scontrol, scancel and sinfo on `PATH`",
        ));
    } else {
        out.push(Check::fail(
            "commands",
            format!("not on `PATH`: {}", missing.join(", ")),
            "install Slurm's client commands (Debian: `slurm-client`) or add them to `PATH`",
        ));
        if missing.contains(&"sinfo") {
            return out;
        }
    }
    let sinfo = tokio::time::timeout(
        Duration::from_secs(15),
        tokio::process::Command::new("sinfo")
            .args(["-h", "-o", "%P|%a|%G"])
            .kill_on_drop(true)
            .output(),
    )
    .await;
    let text = match sinfo {
        Ok(Ok(o)) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(Ok(o)) => {
            let stderr = String::from_utf8_lossy(&o.stderr);
            // The last line is the one that says why (`fatal: ...`).
            let why = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            let conf = std::env::var_os("SLURM_CONF").is_some()
                || ["/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"]
                    .iter()
                    .any(|p| std::path::Path::new(p).is_file());
            out.push(if conf {
                Check::fail(
                    "partitions",
                    format!("`sinfo` failed: {why}"),
                    "check that slurmctld answers (`scontrol ping`)",
                )
            } else {
                Check::skipped(
                    "partitions",
                    format!("Slurm's commands are here but no cluster is configured (no `slurm.conf`, `SLURM_CONF` unset): {why}"),
                    "run orch on a login node of the cluster, or set `SLURM_CONF`",
                )
            });
            return out;
        }
        Ok(Err(e)) => {
            out.push(Check::fail(
                "partitions",
                format!("cannot run `sinfo`: {e}"),
                "check Slurm's client commands",
            ));
            return out;
        }
        Err(_) => {
            out.push(Check::fail(
                "partitions",
                "`sinfo` did not answer within 15 s",
                "check that slurmctld answers (`scontrol ping`)",
            ));
            return out;
        }
    };
    let parts = parse_sinfo(&text);
    let describe = |p: &Partition| {
        format!(
            "{}{}{}",
            p.name,
            if p.default { " (default)" } else { "" },
            if p.gres.is_empty() {
                String::new()
            } else {
                format!(" [{}]", p.gres.join(","))
            }
        )
    };
    if parts.is_empty() {
        out.push(Check::fail(
            "partitions",
            "`sinfo` lists no partition",
            "ask the cluster's admins",
        ));
        return out;
    }
    out.push(Check::ok(
        "partitions",
        parts.iter().map(describe).collect::<Vec<_>>().join(", "),
    ));
    let def = plan.and_then(|p| p.slurm.as_ref());
    let wanted = def.and_then(|d| d.partition.clone());
    let chosen = match &wanted {
        Some(w) => parts.iter().find(|p| &p.name == w),
        None => parts.iter().find(|p| p.default),
    };
    let gpu_cells = plan.is_some_and(|p| p.cells.iter().any(|c| !c.gpu.is_cpu()));
    match (chosen, &wanted) {
        (None, Some(w)) => out.push(Check::fail(
            "partition",
            format!("the suite's partition `{w}` is not one of the cluster's"),
            "set `slurm.partition` to one `sinfo` lists",
        )),
        (None, None) => out.push(Check::warn(
            "partition",
            "the cluster has no default partition and the suite names none",
            "set `slurm.partition` in the suite",
        )),
        (Some(p), _) => {
            let gpus = p.gres.iter().any(|g| g.starts_with("gpu"));
            let what = format!("`{}`{}", p.name, if p.up { "" } else { " (down)" });
            if !p.up {
                out.push(Check::fail(
                    "partition",
                    format!("{what} is not up"),
                    "ask the cluster's admins, or set `slurm.partition` to one that is up",
                ));
            } else if gpu_cells && !gpus {
                out.push(Check::fail(
                    "gres",
                    format!("{what} has no GPU GRES, and the suite asks for GPUs"),
                    "set `slurm.partition` to a partition whose nodes list `gpu` GRES (`sinfo -o '%P %G'`)",
                ));
            } else if !gpus {
                out.push(Check::warn(
                    "gres",
                    format!("{what} has no GPU GRES: CPU cells only"),
                    "set `slurm.partition` to a GPU partition for GPU cells",
                ));
            } else {
                out.push(Check::ok("gres", format!("{what}: {}", p.gres.join(","))));
            }
        }
    }
    out.push(orch_backend::host::weights_folder_check(&weights_dir(
        def,
        weights_flag,
    )));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinfo_lines_become_partitions_with_their_gres_merged() {
        let p = parse_sinfo("debug*|up|(null)\ngpu|up|gpu:h100:8(S:0-1)\ngpu|up|gpu:a100:4\nold|down|\n");
        assert_eq!(p.len(), 3);
        assert!(p[0].default && p[0].up && p[0].gres.is_empty());
        assert_eq!(p[1].name, "gpu");
        assert_eq!(p[1].gres, vec!["gpu:h100:8(S:0-1)", "gpu:a100:4"]);
        assert!(!p[2].up && !p[2].default);
    }

    /// `orch plan`'s and `orch run`'s default of cells at once and the
    /// run's submission gate share one reading of the limits (the host's
    /// scheduler): read already, no `scontrol` is asked again (on a machine
    /// without a controller it would fail and give the fallback).
    #[tokio::test]
    async fn the_default_and_the_gate_share_one_reading_of_the_limits() {
        let limit = crate::sched::SubmitLimit {
            jobs: 7,
            source: "`MaxSubmitJobs` of the association (account `orch`)".into(),
        };
        let sched = Arc::new(Scheduler::read_already(Some(limit.clone()), 2));
        let d = default_jobs(None, &sched).await;
        assert_eq!(d.jobs, 7, "{}", d.why);
        assert!(d.why.contains("the submission limit"), "{}", d.why);
        assert_eq!(sched.limit(&crate::target(&config(None))).await, (Some(limit), 2));
    }
}
