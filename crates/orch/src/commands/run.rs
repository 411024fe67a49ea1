use crate::cli::RunArgs;
use crate::error::user;
use crate::output::{self, Reporter};
use anyhow::Context;
use orch_backend::host::{Flags, Host, Weights};
use orch_manifest::{ExpandOptions, GpuSpec};
use orch_record::CellStatus;
use orch_runner::{execute, RunnerOptions};
use tokio::sync::{mpsc, watch};

/// The files that travel with the plan's cells, per its `sync:` section.
pub(super) fn files_of(plan: &orch_manifest::Plan) -> orch_files::Files {
    let sync = plan.sync.clone().unwrap_or_default();
    orch_files::Files::new(
        orch_files::default_cache_dir(),
        orch_files::SyncSpec {
            paths: sync.paths.iter().map(std::path::PathBuf::from).collect(),
            ignore: sync.ignore,
            max_bytes: sync
                .max_size
                .map(|b| b.0)
                .unwrap_or(orch_files::DEFAULT_MAX_BYTES),
            dirty: match sync.dirty {
                Some(orch_manifest::DirtyDef::Patch) => orch_files::Dirty::Patch,
                _ => orch_files::Dirty::Refuse,
            },
        },
    )
}

/// A local repository's uncommitted changes refused, or made the patch
/// every backend applies (before the run exists: its tasks keep it).
pub(super) fn prepare_files(files: &orch_files::Files, plan: &mut orch_manifest::Plan) -> anyhow::Result<()> {
    for cell in &mut plan.cells {
        files
            .prepare(&mut cell.task)
            .map_err(|e| orch_backend::host::files_error(&e))?;
    }
    Ok(())
}

/// Everything that travels staged before any cell starts, so that a missing
/// file or a set over `sync.max_size` stops the run at once (exit 2).
pub(super) fn stage_files(
    files: &orch_files::Files,
    plan: &orch_manifest::Plan,
    backend: &dyn orch_backend::Backend,
) -> anyhow::Result<()> {
    if !backend.ships_files() {
        return Ok(());
    }
    for cell in &plan.cells {
        files
            .shipment(&cell.task)
            .map_err(|e| orch_backend::host::files_error(&e))?;
    }
    Ok(())
}

/// Refuse (exit 2) when a model the suite needs is not in the weights place.
async fn preflight(
    host: &dyn Host,
    plan: &orch_manifest::Plan,
    weights: &Weights,
    args: &RunArgs,
) -> anyhow::Result<()> {
    if args.no_preflight {
        return Ok(());
    }
    let missing: Vec<String> = host
        .check_models(plan, weights)
        .await?
        .into_iter()
        .filter(|m| !m.complete)
        .map(|m| format!("`{}@{}`", m.repo, m.revision))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(user(format!(
        "model weights not set up in {weights}: {}\nhint: run `orch setup -f {}` first (or pass `--no-preflight`)",
        missing.join(", "),
        plan.manifest.display()
    )))
}

/// Everything a run needs of the suite and the backend, checked before the
/// run's folder exists: secrets, node counts, GPU counts, weights.
pub(super) async fn check(
    host: &dyn Host,
    plan: &orch_manifest::Plan,
    args: &RunArgs,
) -> anyhow::Result<Vec<(String, String)>> {
    let secrets = collect_secrets(&plan.secrets)?;
    check_nodes(host, plan)?;
    host_gpus(host, plan)?;
    let weights = host.weights(Some(plan), false).await?;
    preflight(host, plan, &weights, args).await?;
    Ok(secrets)
}

pub async fn run(
    store: &orch_store::Store,
    prices_file: Option<&std::path::Path>,
    args: RunArgs,
) -> anyhow::Result<i32> {
    let host = crate::hosts::host(
        args.backend,
        Flags {
            weights_dir: args.weights_dir.clone(),
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            keep: args.keep,
        },
    );
    let host = host.as_ref();
    let prices = orch_cost::Prices::load(prices_file)?;
    if let Some(0) = args.jobs {
        return Err(user(
            "`--jobs` must be at least 1\nhint: `--jobs 1` runs one cell at a time",
        ));
    }
    // `_lock`: this process is the run's one writer until it returns.
    let (mut run, secrets, backend, images, cost_opts, files, _lock) = match (&args.resume, &args.file) {
        (Some(id), _) => {
            if args.gpu.is_some() {
                return Err(user(
                    "`--gpu` cannot change a run being resumed\nhint: start a new run with `-f FILE --gpu ...`",
                ));
            }
            let run = store.open_run(id)?;
            if run.meta.backend != args.backend.as_str() {
                return Err(user(format!(
                    "run `{}` was made on backend `{}`, not `{}`\nhint: resume it with `--backend {}`",
                    run.id(),
                    run.meta.backend,
                    args.backend,
                    run.meta.backend
                )));
            }
            // One writer per run: a second `orch` on it exits 2 here,
            // before it cleans up or runs anything of the first one's.
            let lock = run.lock_writer()?;
            if let Some(dead) = &lock.took_over {
                eprintln!(
                    "note: taking over run {} from its writer that is gone ({dead})",
                    run.id()
                );
            }
            // Re-read under the lock: the run may have moved on meanwhile.
            let mut run = store.open_exact(run.id())?;
            let secrets = check(host, &run.plan, &args).await?;
            let (backend, images) = host.backend(&run.plan).await?;
            let files = files_of(&run.plan);
            stage_files(&files, &run.plan, backend.as_ref())?;
            // The cap counts what the run already spent.
            let todo = run.unfinished_cells()?;
            for w in store.take_warnings() {
                eprintln!("warning: {w}");
            }
            let prior = run.cost()?.map(|c| c.usd).unwrap_or(0.0);
            let cells = crate::commands::cost::estimate_cells(store, &run.plan, host, &prices)?;
            let cost_opts = crate::commands::cost::cost_options(&cells, &todo, args.max_cost, prior)?;
            // What an earlier, killed invocation of this run left running
            // (containers, Jobs, sandboxes, queued jobs) goes first.
            backend.cleanup(run.id()).await?;
            run.note_resume()?;
            (run, secrets, backend, images, cost_opts, files, lock)
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
            let files = files_of(&plan);
            prepare_files(&files, &mut plan)?;
            if args.dry_run {
                // Refused as the run would refuse it, not printed as one node.
                check_nodes(host, &plan)?;
                print!("{}", host.dry_run(&plan, &files)?);
                return Ok(0);
            }
            for cell in &mut plan.cells {
                cell.task.strict_hardware = args.strict_hardware;
            }
            let secrets = check(host, &plan, &args).await?;
            let (backend, images) = host.backend(&plan).await?;
            stage_files(&files, &plan, backend.as_ref())?;
            let cells = crate::commands::cost::estimate_cells(store, &plan, host, &prices)?;
            let todo: Vec<String> = plan.cells.iter().map(|c| c.id.clone()).collect();
            let cost_opts = crate::commands::cost::cost_options(&cells, &todo, args.max_cost, 0.0)?;
            let text =
                std::fs::read_to_string(file).with_context(|| format!("cannot read `{}`", file.display()))?;
            let argv: Vec<String> = std::env::args().collect();
            let env = orch_store::host_environment(file, argv);
            let run = store.create_run(&plan, &text, args.backend.as_str(), env)?;
            let lock = run.lock_writer()?;
            (run, secrets, backend, images, cost_opts, files, lock)
        }
        (None, None) => {
            return Err(user(
                "`orch run` needs `-f FILE` or `--resume RUN`\nhint: `orch run -f manifests/quickstart.yaml`",
            ))
        }
    };
    let concurrency = args.jobs.unwrap_or(run.plan.concurrency);
    let gpu_devices = host_gpus(host, &run.plan)?;
    let weights_dir = host
        .weights(Some(&run.plan), false)
        .await?
        .folder()
        .map(|p| p.to_path_buf());
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
            weights_dir,
            images,
            gpu_devices,
            diagnose_rules: Some(orch_diagnose::Rules::load_with_user(None)?),
            cost: cost_opts,
            files: Some(std::sync::Arc::new(files)),
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
    let run_id = run.id().to_string();
    let outcome = outcome.map_err(|e| {
        let why = match e.to_string() {
            t if t.contains("Too many open files") || t.contains("os error 24") => {
                "\nhint: too many open files: raise the limit (`ulimit -n`) or run fewer cells at once (`--jobs`)"
            }
            t if t.contains("No space left") || t.contains("os error 28") => {
                "\nhint: the disk is full: free some space"
            }
            _ => "",
        };
        anyhow::Error::new(e).context(format!(
            "run {run_id} stopped: cells without a record are run by `orch run --resume {run_id}`{why}"
        ))
    })?;

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
    Ok(
        if record.cells.iter().all(|c| c.status == CellStatus::Succeeded) {
            0
        } else {
            1
        },
    )
}

/// Cells of more nodes than the backend gives are refused.
fn check_nodes(host: &dyn Host, plan: &orch_manifest::Plan) -> anyhow::Result<()> {
    if let Some(c) = plan.cells.iter().find(|c| c.nodes > host.max_nodes()) {
        return Err(user(format!(
            "cell `{}` asks for {} nodes, which backend `{}` cannot give\nhint: run it with `--backend slurm`, or remove `nodes`",
            c.id,
            c.nodes,
            host.kind()
        )));
    }
    Ok(())
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
pub(super) async fn watch_signals(cancel: watch::Sender<bool>) {
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

/// The GPUs of this host that the cells share (local and docker: elsewhere
/// the platform assigns them). A cell that asks for more than the host has
/// is a user error: it never runs on fewer or shared GPUs.
pub fn host_gpus(host: &dyn Host, plan: &orch_manifest::Plan) -> anyhow::Result<orch_runner::GpuDevices> {
    if !host.shares_host_gpus() {
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
