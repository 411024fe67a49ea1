//! The slurm backend's host side: the suite's `slurm:` section into the
//! backend's configuration, the weights folder on the shared filesystem,
//! `orch setup --as-job`, `orch down`, per-partition prices and multi-node
//! cells.

use crate::{GpuRequest, SlurmBackend, SlurmConfig};
use async_trait::async_trait;
use orch_backend::host::{Flags, Host, Images, Kind, OnLine, SetupPlace, SetupRequest, Weights};
use orch_backend::{Backend, BackendError};
use orch_manifest::{Plan, SlurmDef};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

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

pub fn backend(plan: &Plan) -> Result<SlurmBackend, BackendError> {
    let nodes: BTreeMap<String, u32> = plan
        .cells
        .iter()
        .filter(|c| c.nodes > 1)
        .map(|c| (c.id.clone(), c.nodes))
        .collect();
    SlurmBackend::new(config(plan.slurm.as_ref()), nodes)
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
        Ok((Arc::new(backend(plan)?), Images::new()))
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

    fn price_partition<'p>(&self, plan: &'p Plan) -> Option<&'p str> {
        plan.slurm.as_ref().and_then(|s| s.partition.as_deref())
    }
}
