pub(super) mod exec;

use crate::cli::RunArgs;
use crate::error::user;
use crate::output;
use anyhow::Context;
use exec::{Exec, Ready};
use orch_backend::host::{Flags, Host, Weights};
use orch_manifest::{ExpandOptions, GpuSpec};
use orch_record::{CellStatus, FailureKind};
use tokio::sync::watch;

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

/// The comparisons of `cells` share the host's install cache where it has
/// one (`Host::install_cache`): a commit whose patches and install command
/// are the same is installed once, and reused by later cells and runs.
pub(super) fn share_installs<'c>(
    host: &dyn Host,
    cells: impl IntoIterator<Item = &'c mut orch_manifest::CellPlan>,
) {
    let Some(checkouts) = host.install_cache() else {
        return;
    };
    for cell in cells {
        if let orch_protocol::Workload::Compare(w) = &mut cell.task.workload {
            w.install_cache = Some(checkouts.to_string_lossy().into_owned());
        }
    }
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
/// In a campaign, a model only tasks need sinks those tasks alone: they are
/// named, and returned (cell, model) to be recorded `weights_missing`
/// without running; the other tasks run.
async fn preflight(
    host: &dyn Host,
    plan: &orch_manifest::Plan,
    weights: &Weights,
    no_preflight: bool,
) -> anyhow::Result<Vec<(String, String)>> {
    if no_preflight {
        return Ok(Vec::new());
    }
    let missing: Vec<(String, String)> = host
        .check_models(plan, weights)
        .await?
        .into_iter()
        .filter(|m| !m.complete)
        .map(|m| (m.repo.clone(), format!("`{}@{}`", m.repo, m.revision)))
        .collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    // Which tasks each missing model would sink; a model no task names
    // (the suite's own `models:`) still refuses the run.
    let tasks_of = |repo: &str| -> Vec<&orch_manifest::CellPlan> {
        plan.cells
            .iter()
            .filter(|c| {
                c.campaign
                    .as_ref()
                    .is_some_and(|t| t.model.as_deref() == Some(repo))
            })
            .collect()
    };
    let refused: Vec<&String> = missing
        .iter()
        .filter(|(repo, _)| tasks_of(repo).is_empty())
        .map(|(_, shown)| shown)
        .collect();
    if !refused.is_empty() {
        return Err(user(format!(
            "model weights not set up in {weights}: {}\nhint: run `orch setup -f {}` first (or pass `--no-preflight`)",
            refused.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            plan.manifest.display()
        )));
    }
    let mut sunk = Vec::new();
    for (repo, shown) in &missing {
        let cells = tasks_of(repo);
        let ids: Vec<&str> = cells
            .iter()
            .filter_map(|c| c.campaign.as_ref().map(|t| t.id.as_str()))
            .collect();
        eprintln!(
            "warning: model weights not set up in {weights}: {shown}; its task{} {} {} recorded `weights_missing` without running\nhint: `orch setup -f {}` sets it up (a gated model needs access first)",
            if ids.len() == 1 { "" } else { "s" },
            ids.join(", "),
            if ids.len() == 1 { "is" } else { "are" },
            plan.manifest.display()
        );
        sunk.extend(cells.iter().map(|c| (c.id.clone(), repo.clone())));
    }
    Ok(sunk)
}

/// The cells of campaign tasks whose model is missing, recorded failed
/// `weights_missing` (nothing rented, nothing run) unless already recorded.
fn record_sunk(
    run: &orch_store::Run,
    sunk: &[(String, String)],
    manifest: &std::path::Path,
) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    for (cell, model) in sunk {
        let Some(plan_cell) = run.plan.cells.iter().find(|c| &c.id == cell) else {
            continue;
        };
        if run.cell_record(cell)?.is_some() {
            continue;
        }
        let (_, attempt) = run.prepare_cell(cell)?;
        let record = orch_record::CellRecord {
            id: plan_cell.id.clone(),
            benchmark: plan_cell.benchmark.clone(),
            status: orch_protocol::Status::Failed,
            gpu: plan_cell.gpu.to_string(),
            params: plan_cell.params.clone(),
            metrics: Default::default(),
            timings: Default::default(),
            failure: Some(orch_protocol::Failure::new(
                FailureKind::WeightsMissing,
                format!(
                    "model `{model}` is not set up: run `orch setup -f {}` (a gated model needs access first)",
                    manifest.display()
                ),
            )),
            started_at: now,
            finished_at: now,
            duration_s: 0.0,
            stdout: Default::default(),
            stderr: Default::default(),
            info: Default::default(),
            attempt,
            diagnosis: None,
            hardware: None,
            flags: Vec::new(),
            cost: None,
        };
        run.finish_cell(&record)?;
    }
    Ok(())
}

/// The cells of `plan` that finished in run `old` with the same task
/// (workload, files by content, GPUs, image): (old run id, record).
fn reusable(
    store: &orch_store::Store,
    old: &str,
    plan: &orch_manifest::Plan,
) -> anyhow::Result<Vec<(String, orch_record::CellRecord)>> {
    let old = store.open_run(old)?;
    let same = |a: &orch_manifest::CellPlan, b: &orch_manifest::CellPlan| {
        let mut ta = a.task.clone();
        let mut tb = b.task.clone();
        ta.run_id.clear();
        tb.run_id.clear();
        ta.strict_hardware = false;
        tb.strict_hardware = false;
        // A task is the same wherever its row now sits in the file.
        let task = |c: &orch_manifest::CellPlan| {
            c.campaign.clone().map(|mut t| {
                t.row = 0;
                t.file.clear();
                t
            })
        };
        ta == tb && a.gpu == b.gpu && a.image == b.image && a.nodes == b.nodes && task(a) == task(b)
    };
    let earlier: std::collections::HashMap<&str, &orch_manifest::CellPlan> =
        old.plan.cells.iter().map(|c| (c.id.as_str(), c)).collect();
    let mut out = Vec::new();
    for cell in &plan.cells {
        let Some(prev) = earlier.get(cell.id.as_str()).copied() else {
            continue;
        };
        if !same(prev, cell) {
            continue;
        }
        if let Some(rec) = old.cell_record(&cell.id)? {
            // A task its missing model sank never ran: it runs again here.
            let sunk = rec
                .failure
                .as_ref()
                .is_some_and(|f| f.kind == FailureKind::WeightsMissing);
            if rec.status.is_finished() && !sunk {
                out.push((old.id().to_string(), rec));
            }
        }
    }
    eprintln!(
        "reusing {} of {} cells from run {} (unchanged and finished there); running the others",
        out.len(),
        plan.cells.len(),
        old.id()
    );
    Ok(out)
}

/// The reused records stored in the new run (their logs copied where both
/// runs are folders here), marked `info.reused_from`; their cost stays
/// with the run that paid it.
fn reuse_cells(
    store: &orch_store::Store,
    run: &orch_store::Run,
    reused: &[(String, orch_record::CellRecord)],
) -> anyhow::Result<()> {
    for (old_id, rec) in reused {
        let (dir, attempt) = run.prepare_cell(&rec.id)?;
        if let Ok(old) = store.open_exact(old_id) {
            let from = old.cell_dir(&rec.id);
            if from.is_dir() {
                copy_tree(&from, &dir);
            }
        }
        let mut rec = rec.clone();
        rec.attempt = attempt;
        rec.cost = None;
        rec.info
            .insert("reused_from".into(), serde_json::Value::String(old_id.clone()));
        run.finish_cell(&rec)?;
    }
    Ok(())
}

/// Best effort: files under `from` copied into `to` (a missing log is not
/// worth failing a run for; the record names the run it came from).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for e in entries.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if src.is_dir() {
            let _ = std::fs::create_dir_all(&dst);
            copy_tree(&src, &dst);
        } else if !dst.exists() {
            let _ = std::fs::copy(&src, &dst);
        }
    }
}

/// What [`check`] found: what the run is given, decided once.
pub(super) struct Checked {
    pub secrets: Vec<(String, String)>,
    /// Campaign cells whose model is missing, with the model.
    pub sunk: Vec<(String, String)>,
    /// The weights place's folder on this host, if it has one.
    pub weights_dir: Option<std::path::PathBuf>,
}

impl Checked {
    /// The backend for `plan` made (`Host::backend`: its preflight, each
    /// cell's image), with what was checked.
    pub async fn ready(self, host: &dyn Host, plan: &orch_manifest::Plan) -> anyhow::Result<Ready> {
        let (backend, images) = host.backend(plan).await?;
        Ok(Ready {
            backend,
            images,
            secrets: self.secrets,
            weights_dir: self.weights_dir,
        })
    }
}

/// Everything a run needs of the suite and the backend, checked before the
/// run's folder exists: secrets, node counts, GPU counts, weights (resolved
/// once here, and handed to the runner from here); `no_preflight`: the
/// models are not checked.
pub(super) async fn check(
    host: &dyn Host,
    plan: &orch_manifest::Plan,
    no_preflight: bool,
) -> anyhow::Result<Checked> {
    let secrets = collect_secrets(&plan.secrets)?;
    check_nodes(host, plan)?;
    host_gpus(host, plan)?;
    let weights = host.weights(Some(plan), false).await?;
    let sunk = preflight(host, plan, &weights, no_preflight).await?;
    Ok(Checked {
        secrets,
        sunk,
        weights_dir: weights.folder().map(|p| p.to_path_buf()),
    })
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
    let (mut run, ready, cost_opts, files, _lock) = match (&args.resume, &args.file) {
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
            let checked = check(host, &run.plan, args.no_preflight).await?;
            record_sunk(&run, &checked.sunk, &run.plan.manifest)?;
            let ready = checked.ready(host, &run.plan).await?;
            let files = files_of(&run.plan);
            stage_files(&files, &run.plan, ready.backend.as_ref())?;
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
            ready.backend.cleanup(run.id()).await?;
            run.note_resume()?;
            (run, ready, cost_opts, files, lock)
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
            let mut plan = orch_manifest::load(
                file,
                &ExpandOptions {
                    gpus,
                    ..Default::default()
                },
            )?;
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
            // A campaign: tasks whose variants share a commit, patches and
            // install command install it once (as `orch bisect`).
            share_installs(host, plan.cells.iter_mut().filter(|c| c.campaign.is_some()));
            let mut checked = check(host, &plan, args.no_preflight).await?;
            let sunk = std::mem::take(&mut checked.sunk);
            let ready = checked.ready(host, &plan).await?;
            stage_files(&files, &plan, ready.backend.as_ref())?;
            let cells = crate::commands::cost::estimate_cells(store, &plan, host, &prices)?;
            // Cells recorded `weights_missing` rent nothing.
            let todo: Vec<String> = plan
                .cells
                .iter()
                .map(|c| c.id.clone())
                .filter(|id| !sunk.iter().any(|(c, _)| c == id))
                .collect();
            let cost_opts = crate::commands::cost::cost_options(&cells, &todo, args.max_cost, 0.0)?;
            let text =
                std::fs::read_to_string(file).with_context(|| format!("cannot read `{}`", file.display()))?;
            // The earlier run's finished cells that have not changed, read
            // before the new run exists (a wrong id costs nothing).
            let reused = match &args.reuse {
                Some(old) => reusable(store, old, &plan)?,
                None => Vec::new(),
            };
            let (run, lock) = exec::create(store, &plan, &text, host, file)?;
            record_sunk(&run, &sunk, &run.plan.manifest)?;
            reuse_cells(store, &run, &reused)?;
            (run, ready, cost_opts, files, lock)
        }
        (None, None) => {
            return Err(user(
                "`orch run` needs `-f FILE` or `--resume RUN`\nhint: `orch run -f manifests/quickstart.yaml`",
            ))
        }
    };
    let (cancel_tx, cancel_rx) = watch::channel(false);
    tokio::spawn(watch_signals(cancel_tx));
    let exec = Exec {
        store,
        host,
        ready,
        files,
        jobs: args.jobs,
        cost: cost_opts,
        cancel: cancel_rx,
        show: Some(args.resume.is_some()),
    };
    let outcome = exec::execute(&mut run, exec).await?;
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
        let kept = kept_hint(store, &run_id, &e);
        anyhow::Error::new(e).context(format!(
            "run {run_id} stopped: cells without a record are run by `orch run --resume {run_id}`{why}{kept}"
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

/// For a run stopped by a store outage: where what was not written is
/// kept, and how it goes up.
fn kept_hint(store: &orch_store::Store, run_id: &str, e: &orch_runner::RunnerError) -> String {
    if !orch_protocol::ErrorClass::is_outage(e) {
        return String::new();
    }
    match store.backend().kept_locally(run_id) {
        Some(dir) => format!(
            "\nhint: the store could not be reached; what was not written to it (records, the run's state) is kept at `{}` and goes up with `orch run --resume {run_id}` (or `orch show {run_id}`) once it answers",
            dir.display()
        ),
        None => format!(
            "\nhint: the store could not be reached; `orch run --resume {run_id}` once it answers"
        ),
    }
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
