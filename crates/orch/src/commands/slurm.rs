//! The `slurm` backend's glue: the manifest's `slurm:` section into the
//! backend's configuration, and where its weights volume is.

use crate::error::user;
use orch_backend_slurm::{GpuRequest, SlurmBackend, SlurmConfig};
use orch_manifest::{Plan, SlurmDef};
use std::collections::BTreeMap;
use std::path::PathBuf;
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

pub fn backend(plan: &Plan) -> anyhow::Result<SlurmBackend> {
    let nodes: BTreeMap<String, u32> = plan
        .cells
        .iter()
        .filter(|c| c.nodes > 1)
        .map(|c| (c.id.clone(), c.nodes))
        .collect();
    Ok(SlurmBackend::new(config(plan.slurm.as_ref()), nodes)?)
}

/// Multi-node cells run on slurm only.
pub fn check_nodes(plan: &Plan, backend: &str) -> anyhow::Result<()> {
    if backend == "slurm" {
        return Ok(());
    }
    if let Some(c) = plan.cells.iter().find(|c| c.nodes > 1) {
        return Err(user(format!(
            "cell `{}` asks for {} nodes, which backend `{backend}` cannot give\nhint: run it with `--backend slurm`, or remove `nodes`",
            c.id, c.nodes
        )));
    }
    Ok(())
}

/// `orch setup --backend slurm --as-job`: the same setup, run by this
/// binary (on the shared filesystem) in a batch job, for clusters whose
/// login nodes may not download. Its output is shown as it comes.
pub async fn setup_as_job(
    args: &crate::cli::SetupArgs,
    def: Option<&SlurmDef>,
    weights_dir: &std::path::Path,
    requests: &[orch_hub::ModelRequest],
) -> anyhow::Result<i32> {
    let cfg = config(def);
    let orch = orch_backend_slurm::shared_orch(cfg.shared_dir.as_deref())?;
    let mut argv = vec![
        orch.to_string_lossy().into_owned(),
        "setup".into(),
        "--backend".into(),
        "slurm".into(),
        "--weights-dir".into(),
        weights_dir.to_string_lossy().into_owned(),
        "--connections".into(),
        args.connections.to_string(),
    ];
    match &args.file {
        // The suite keeps each model's include/exclude patterns.
        Some(f) => {
            let f = std::fs::canonicalize(f).unwrap_or(f.clone());
            argv.extend(["-f".into(), f.to_string_lossy().into_owned()]);
            for m in &args.models {
                argv.extend(["--model".into(), m.clone()]);
            }
        }
        None => {
            for r in requests {
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
    eprintln!(
        "weights volume: {} (downloaded by a slurm job)",
        weights_dir.display()
    );
    let end = orch_backend_slurm::run_job(&cfg, &dir, &name, &argv, &env, |l| eprintln!("  {l}")).await?;
    if end.state == "COMPLETED" {
        return Ok(0);
    }
    // The job's own exit code (2: a user error such as a gated repository).
    eprintln!(
        "the setup job ended {} (exit code {}): its output is in `{}`",
        if end.state.is_empty() {
            "UNKNOWN"
        } else {
            &end.state
        },
        end.exit_code.unwrap_or(0),
        dir.join(format!("{name}.log")).display()
    );
    Ok(end.exit_code.filter(|c| *c != 0).unwrap_or(1))
}
