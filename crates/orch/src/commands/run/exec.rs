//! The one run loop of `orch run` and `orch bisect` (each of its steps is a run): a
//! backend made ready once ([`Ready`]), a new run created under its writer lock
//! ([`create`]), and a run's cells executed ([`execute`]): through the runner
//! (`orch_runner::execute`: each cell driven through the backend's lifecycle, recorded
//! in the store as it ends, its cost, the budget, the run's final state), with the
//! progress shown or drained, and the backend cleaned up whatever happened.
//! What comes before (the plan, the checks, a resume, the cost cap) and after (the
//! record printed, the exit code) is the command's.

use crate::output::Reporter;
use orch_backend::host::{Host, Images};
use orch_backend::Backend;
use orch_runner::{CostOptions, Outcome, RunnerError, RunnerOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// The backend that runs a command's cells, made once (`Host::backend`, its
/// preflight), with what `run::check` resolved for it.
#[derive(Clone)]
pub(in crate::commands) struct Ready {
    pub backend: Arc<dyn Backend>,
    /// Each cell's image (container backends).
    pub images: Images,
    /// The suite's secrets, from this environment.
    pub secrets: Vec<(String, String)>,
    /// The weights place's folder on this host, if it has one.
    pub weights_dir: Option<PathBuf>,
}

/// How a run's cells are executed.
pub(in crate::commands) struct Exec<'a> {
    pub store: &'a orch_store::Store,
    pub host: &'a dyn Host,
    pub ready: Ready,
    /// The files that travel with the cells (staged already).
    pub files: orch_files::Files,
    /// Cells at once from `--jobs`; `None`: the suite's `concurrency`, else
    /// the host's default (`orch plan` says which).
    pub jobs: Option<usize>,
    /// Prices and the cap (`--max-cost`).
    pub cost: CostOptions,
    /// The command's Ctrl-C (`run::watch_signals`).
    pub cancel: watch::Receiver<bool>,
    /// The progress shown live (`orch run`: `Some(resumed)`), or drained (`orch bisect`'s steps).
    pub show: Option<bool>,
}

/// How the runner ended: its outcome, or the store or backend failure that
/// stopped it (the run left `interrupted`; `--resume` runs the rest).
pub(in crate::commands) type Ended = Result<Outcome, RunnerError>;

/// A new run of `plan` in the store, this process its one writer while the
/// lock lives; its environment names this host and the suite's commit.
pub(in crate::commands) fn create(
    store: &orch_store::Store,
    plan: &orch_manifest::Plan,
    text: &str,
    host: &dyn Host,
    manifest: &Path,
) -> anyhow::Result<(orch_store::Run, orch_store::WriterLock)> {
    let argv: Vec<String> = std::env::args().collect();
    let env = orch_store::host_environment(manifest, argv);
    let run = store.create_run(plan, text, host.kind().as_str(), env)?;
    let lock = run.lock_writer()?;
    Ok((run, lock))
}

/// The unfinished cells of `run` executed; the backend cleaned up afterwards
/// whatever happened. An error: nothing ran (the host's GPUs, the diagnosis
/// rules); `Ended`'s error: the runner stopped.
pub(in crate::commands) async fn execute(run: &mut orch_store::Run, exec: Exec<'_>) -> anyhow::Result<Ended> {
    let Ready {
        backend,
        images,
        secrets,
        weights_dir,
    } = exec.ready;
    let gpu_devices = super::host_gpus(exec.host, &run.plan)?;
    let concurrency = crate::commands::plan::jobs(exec.host, &run.plan, exec.jobs, &gpu_devices)
        .await
        .jobs;
    let reporter = exec.show.map(|resumed| {
        Reporter::new(
            run.id(),
            Path::new(&exec.store.location()),
            run.plan.cells.len(),
            resumed,
        )
    });
    let (tx, mut rx) = mpsc::unbounded_channel();
    let progress = tokio::spawn(async move {
        let mut reporter = reporter;
        while let Some(p) = rx.recv().await {
            if let Some(r) = reporter.as_mut() {
                r.handle(p);
            }
        }
        if let Some(r) = reporter {
            r.finish();
        }
    });
    let outcome = orch_runner::execute(
        run,
        backend.clone(),
        RunnerOptions {
            concurrency,
            secrets,
            weights_dir,
            images,
            gpu_devices,
            diagnose_rules: Some(orch_diagnose::Rules::load_with_user(None)?),
            cost: exec.cost,
            files: Some(Arc::new(exec.files)),
        },
        tx,
        exec.cancel,
    )
    .await;
    let _ = progress.await;
    // Whatever happened, leave nothing running or lying around.
    if let Err(e) = backend.cleanup(run.id()).await {
        eprintln!("warning: cleanup of run {} failed: {e}", run.id());
    }
    Ok(outcome)
}
