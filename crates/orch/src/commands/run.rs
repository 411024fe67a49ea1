use crate::cli::RunArgs;
use crate::error::user;
use crate::output::{self, Reporter};
use anyhow::Context;
use orch_backend::local::{AgentCommand, LocalBackend};
use orch_backend::Backend;
use orch_manifest::{ExpandOptions, GpuSpec};
use orch_runner::{execute, RunnerOptions};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

/// Refuse (exit 2) when a model the suite needs is not in the weights volume.
fn preflight(
    plan: &orch_manifest::Plan,
    weights_dir: &std::path::Path,
    args: &RunArgs,
) -> anyhow::Result<()> {
    if args.no_preflight {
        return Ok(());
    }
    let checks = if weights_dir == std::path::Path::new(KUBE_PVC) {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(crate::commands::kubernetes::check_models(
                plan,
                args.context.as_deref(),
                args.namespace.as_deref(),
            ))
        })?
    } else if weights_dir == std::path::Path::new(MODAL_VOLUME) {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(crate::commands::modal::check_models(plan))
        })?
    } else {
        crate::commands::plan::check_models(plan, weights_dir)
    };
    let missing: Vec<String> = checks
        .into_iter()
        .filter(|m| !m.complete)
        .map(|m| format!("`{}@{}`", m.repo, m.revision))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(user(format!(
        "model weights not set up in `{}`: {}\nhint: run `orch setup -f {}` first (or pass `--no-preflight`)",
        weights_dir.display(),
        missing.join(", "),
        plan.manifest.display()
    )))
}

/// Stands for the weights volume of the modal backend (checked on Modal).
const MODAL_VOLUME: &str = "modal:orch-weights";
/// Stands for the weights PVC of the kubernetes backend (checked by a Job).
const KUBE_PVC: &str = "kubernetes:weights-pvc";

pub async fn run(
    store: &orch_store::Store,
    prices_file: Option<&std::path::Path>,
    args: RunArgs,
) -> anyhow::Result<i32> {
    orch_backend::check_name(&args.backend)?;
    let prices = orch_cost::Prices::load(prices_file)?;
    let cost_opts: orch_runner::CostOptions;
    let mut weights_dir = match args.backend.as_str() {
        "docker" => orch_backend::docker::weights_volume_dir(false)
            .await?
            .unwrap_or_else(|| std::path::PathBuf::from("/nonexistent-orch-weights-volume")),
        "modal" => std::path::PathBuf::from(MODAL_VOLUME),
        "kubernetes" => std::path::PathBuf::from(KUBE_PVC),
        _ => args
            .weights_dir
            .clone()
            .unwrap_or_else(orch_hub::default_weights_dir),
    };
    let prepared;
    let secrets;
    let mut run = match (&args.resume, &args.file) {
        (Some(id), _) => {
            if args.gpu.is_some() {
                return Err(user(
                    "`--gpu` cannot change a run being resumed\nhint: start a new run with `-f FILE --gpu ...`",
                ));
            }
            let mut run = store.open_run(id)?;
            if args.backend == "slurm" {
                weights_dir =
                    crate::commands::slurm::weights_dir(run.plan.slurm.as_ref(), args.weights_dir.as_ref());
            }
            crate::commands::slurm::check_nodes(&run.plan, &args.backend)?;
            secrets = collect_secrets(&run.plan.secrets)?;
            preflight(&run.plan, &weights_dir, &args)?;
            prepared = make_backend(&args, &run.plan).await?;
            if run.meta.backend != args.backend {
                return Err(user(format!(
                    "run `{}` was made on backend `{}`, not `{}`\nhint: resume it with `--backend {}`",
                    run.id(),
                    run.meta.backend,
                    args.backend,
                    run.meta.backend
                )));
            }
            // The cap counts what the run already spent.
            let todo = run.unfinished_cells()?;
            let prior = run.cost()?.map(|c| c.usd).unwrap_or(0.0);
            let cells = crate::commands::cost::estimate_cells(store, &run.plan, &args.backend, &prices)?;
            cost_opts = crate::commands::cost::cost_options(&cells, &todo, args.max_cost, prior)?;
            run.note_resume()?;
            run
        }
        (None, Some(file)) => {
            let gpus = match &args.gpu {
                Some(text) => Some(GpuSpec::parse_list(text).map_err(|e| {
                    user(format!(
                        "`--gpu {text}`: {e}\nhint: write `TYPE[:COUNT]` specs separated by commas, e.g. `--gpu H100:8,L4`"
                    ))
                })?),
                None => None,
            };
            let mut plan = orch_manifest::load(file, &ExpandOptions { gpus })?;
            if args.dry_run {
                return dry_run(&args, &plan);
            }
            secrets = collect_secrets(&plan.secrets)?;
            for cell in &mut plan.cells {
                cell.task.strict_hardware = args.strict_hardware;
            }
            if args.backend == "slurm" {
                weights_dir =
                    crate::commands::slurm::weights_dir(plan.slurm.as_ref(), args.weights_dir.as_ref());
            }
            crate::commands::slurm::check_nodes(&plan, &args.backend)?;
            host_gpus(&args.backend, &plan)?;
            preflight(&plan, &weights_dir, &args)?;
            // Everything a run needs is checked before its folder exists.
            prepared = make_backend(&args, &plan).await?;
            let cells = crate::commands::cost::estimate_cells(store, &plan, &args.backend, &prices)?;
            let todo: Vec<String> = plan.cells.iter().map(|c| c.id.clone()).collect();
            cost_opts = crate::commands::cost::cost_options(&cells, &todo, args.max_cost, 0.0)?;
            let text =
                std::fs::read_to_string(file).with_context(|| format!("cannot read `{}`", file.display()))?;
            let argv: Vec<String> = std::env::args().collect();
            let env = orch_store::host_environment(file, argv);
            store.create_run(&plan, &text, &args.backend, env)?
        }
        (None, None) => {
            return Err(user(
                "`orch run` needs `-f FILE` or `--resume RUN`\nhint: `orch run -f manifests/quickstart.yaml`",
            ))
        }
    };
    if let Some(0) = args.jobs {
        return Err(user(
            "`--jobs` must be at least 1\nhint: `--jobs 1` runs one cell at a time",
        ));
    }
    let concurrency = args.jobs.unwrap_or(run.plan.concurrency);

    let (backend, images) = prepared;
    // The cluster assigns GPUs to jobs; jobs an earlier, killed invocation
    // of this run left in the queue go before the run resumes.
    let gpu_devices = host_gpus(&args.backend, &run.plan)?;
    if matches!(args.backend.as_str(), "slurm" | "kubernetes") && args.resume.is_some() {
        backend.cleanup(run.id()).await?;
    }
    let (cancel_tx, cancel_rx) = watch::channel(false);
    tokio::spawn(watch_signals(cancel_tx));

    let reporter = Reporter::new(
        run.id(),
        std::path::Path::new(&store.location()),
        run.plan.cells.len(),
        args.resume.is_some(),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let report_task = tokio::spawn(async move {
        let mut reporter = reporter;
        while let Some(p) = rx.recv().await {
            reporter.handle(p);
        }
        reporter.finish();
    });
    let outcome = execute(
        &mut run,
        backend.clone(),
        RunnerOptions {
            concurrency,
            secrets,
            weights_dir: Some(weights_dir),
            images,
            gpu_devices,
            diagnose_rules: Some(orch_diagnose::Rules::load_with_user(None)?),
            cost: cost_opts,
        },
        tx,
        cancel_rx,
    )
    .await;
    let _ = report_task.await;
    // Whatever happened, leave nothing running or lying around.
    if let Err(e) = backend.cleanup(run.id()).await {
        eprintln!("warning: cleanup of run {} failed: {e}", run.id());
    }
    let outcome = outcome?;

    let record = run.record()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&record)?);
    } else {
        print!(
            "{}",
            output::run_text(&record, std::path::Path::new(&run.location()))
        );
    }
    if let Some(why) = &outcome.budget_stopped {
        eprintln!(
            "stopped by the budget (`--max-cost`): {why}\nhint: `orch run --resume {} --max-cost USD` with a higher cap runs the rest",
            run.id()
        );
    }
    if outcome.cancelled {
        eprintln!(
            "interrupted: finished cells are stored; `orch run --resume {}` runs the rest",
            run.id()
        );
        return Ok(130);
    }
    Ok(if record.cells.iter().all(|c| c.status == "succeeded") {
        0
    } else {
        1
    })
}

/// `--dry-run`: what the backend would apply, printed; nothing runs.
fn dry_run(args: &RunArgs, plan: &orch_manifest::Plan) -> anyhow::Result<i32> {
    match args.backend.as_str() {
        "kubernetes" => {
            print!(
                "{}",
                crate::commands::kubernetes::dry_run(plan, args.namespace.as_deref(), args.context.as_deref())?
            );
            Ok(0)
        }
        other => Err(user(format!(
            "`--dry-run` prints the manifests of the kubernetes backend, not of `{other}`\nhint: `orch plan -f {}` shows the cells, weights and estimates of any backend",
            plan.manifest.display()
        ))),
    }
}

/// The values of the suite's `secrets:` from this environment. A value too
/// short to be masked in logs (`< 6` characters) is refused before anything
/// runs: masking it would mask every `a` or `1234` of every log.
fn collect_secrets(names: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    let mut secrets = Vec::new();
    for name in names {
        match std::env::var(name) {
            Ok(v) => secrets.push((name.clone(), v)),
            Err(_) => {
                eprintln!("warning: secret `{name}` is not set in the environment; cells run without it")
            }
        }
    }
    orch_protocol::mask::Masker::new(secrets.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| user(e.to_string()))?;
    Ok(secrets)
}

/// First Ctrl-C (or SIGTERM): stop cleanly, recording running cells
/// `cancelled`. Second: leave at once (agents die with us).
async fn watch_signals(cancel: watch::Sender<bool>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut count = 0;
    loop {
        let term_fut = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term_fut => {}
        }
        count += 1;
        if count == 1 {
            eprintln!("\nstopping: running cells are being stopped and recorded `cancelled` (Ctrl-C again to quit at once)");
            let _ = cancel.send(true);
        } else {
            eprintln!("quitting at once");
            std::process::exit(130);
        }
    }
}

type Images = std::collections::BTreeMap<String, String>;

/// The backend for this run and, for containers, each cell's image (a built
/// image that is missing refuses the run).
async fn make_backend(
    args: &RunArgs,
    plan: &orch_manifest::Plan,
) -> anyhow::Result<(Arc<dyn Backend>, Images)> {
    Ok(match args.backend.as_str() {
        "docker" => {
            let agent = orch_backend::docker::find_static_agent()?;
            let docker = orch_backend::docker::DockerBackend::connect(agent, args.keep)?;
            let images = crate::commands::build::resolve_images(plan, docker.client()).await?;
            (Arc::new(docker), images)
        }
        "modal" => {
            let agent = orch_backend::docker::find_static_agent()?;
            let modal = crate::commands::modal::connect()?;
            let (images, specs) = crate::commands::modal::images(plan)?;
            let opts = orch_backend_modal::backend::ModalOptions {
                weights_volume: crate::commands::modal::volume_name(),
                ..Default::default()
            };
            let backend = orch_backend_modal::ModalBackend::new(modal, agent, specs, opts);
            backend.preflight().await?;
            (Arc::new(backend), images)
        }
        "slurm" => (Arc::new(crate::commands::slurm::backend(plan)?), Images::new()),
        "kubernetes" => {
            let images = crate::commands::kubernetes::images(plan)?;
            let backend = crate::commands::kubernetes::backend(
                plan,
                args.context.as_deref(),
                args.namespace.as_deref(),
            )
            .await?;
            backend.preflight().await?;
            (Arc::new(backend), images)
        }
        _ => (
            Arc::new(LocalBackend::new(AgentCommand::from_env_or_self(&["agent"])?)),
            Images::new(),
        ),
    })
}

/// The GPUs of this host that cells of `backend` share (local and docker
/// only: elsewhere the platform assigns them). A cell that asks for more than
/// the host has is a user error: it never runs on fewer or shared GPUs.
pub fn host_gpus(backend: &str, plan: &orch_manifest::Plan) -> anyhow::Result<orch_runner::GpuDevices> {
    if !matches!(backend, "local" | "docker") {
        return Ok(orch_runner::GpuDevices::Platform);
    }
    let devices = gpu_devices();
    if let Some(devs) = &devices {
        if let Some(cell) = plan.cells.iter().find(|c| c.gpu.count as usize > devs.len()) {
            return Err(user(format!(
                "cell `{}` asks for {} GPUs (`{}`) and this host has {} (`ORCH_GPUS` or `nvidia-smi`)\nhint: ask for at most {} with `--gpu`, or run it where a node has {} GPUs (`--backend kubernetes`, `slurm` or `modal`)",
                cell.id,
                cell.gpu.count,
                cell.gpu,
                devs.len(),
                devs.len(),
                cell.gpu.count
            )));
        }
    }
    Ok(match devices {
        Some(d) => orch_runner::GpuDevices::Known(d),
        None => orch_runner::GpuDevices::Unknown,
    })
}

/// GPUs of this host: `ORCH_GPUS=0,1,...`, else what `nvidia-smi` lists,
/// else unknown (no assignment; the default concurrency of 1 keeps cells apart).
fn gpu_devices() -> Option<Vec<String>> {
    if let Ok(list) = std::env::var("ORCH_GPUS") {
        let ids: Vec<String> = list
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        return Some(ids);
    }
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=index", "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    (!ids.is_empty()).then_some(ids)
}
