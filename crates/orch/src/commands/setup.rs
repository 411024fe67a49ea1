use crate::cli::SetupArgs;
use crate::error::user;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use orch_backend::host::{model_requests, Flags, SetupPlace, SetupRequest};
use orch_hub::{ModelRequest, SetupEvent, SetupOptions};
use orch_manifest::ExpandOptions;
use std::io::IsTerminal;
use std::time::Instant;
use tokio::sync::mpsc;

pub async fn setup(args: SetupArgs) -> anyhow::Result<i32> {
    let host = crate::hosts::host(
        args.backend,
        Flags {
            weights_dir: args.weights_dir.clone(),
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            keep: false,
        },
    );
    // A campaign's task file from a Hub dataset comes first: the plan reads it.
    if let Some(file) = &args.file {
        fetch_task_datasets(file).await?;
    }
    let plan = match &args.file {
        Some(file) => Some(orch_manifest::load(file, &ExpandOptions::default())?),
        None => None,
    };
    let mut requests = plan.as_ref().map(model_requests).unwrap_or_default();
    // A campaign: every model's access checked before any byte moves; a
    // refusal names the tasks it sinks, and the other models are set up.
    let mut refused: Vec<String> = Vec::new();
    if let Some(p) = plan
        .as_ref()
        .filter(|p| p.cells.iter().any(|c| c.campaign.is_some()))
    {
        for check in crate::commands::doctor::hub_checks(Some(p)).await {
            if check.status != orch_backend::host::CheckStatus::Fail {
                continue;
            }
            let Some(req) = requests
                .iter()
                .find(|r| format!("{}@{}", r.repo, r.revision) == check.name)
            else {
                continue;
            };
            let tasks: Vec<&str> = p
                .cells
                .iter()
                .filter_map(|c| c.campaign.as_ref())
                .filter(|t| t.model.as_deref() == Some(req.repo.as_str()))
                .map(|t| t.id.as_str())
                .collect();
            let sinks = if tasks.is_empty() {
                "every task".to_string()
            } else {
                format!(
                    "task{} {}",
                    if tasks.len() == 1 { "" } else { "s" },
                    tasks.join(", ")
                )
            };
            eprintln!(
                "refused: {}: {} (sinks {sinks})\nhint: {}",
                check.name,
                check.detail,
                check.next.clone().unwrap_or_default()
            );
            refused.push(req.repo.clone());
        }
        requests.retain(|r| !refused.contains(&r.repo));
    }
    for spec in &args.models {
        requests.push(ModelRequest::parse(spec)?);
    }
    if requests.is_empty() && !refused.is_empty() {
        return Err(user(format!(
            "no model of the campaign may be set up: {} refused\nhint: see each refusal above",
            refused.join(", ")
        )));
    }
    if requests.is_empty() {
        return Err(user(
            "no model to set up\nhint: `orch setup --model org/name[@revision]`, or `-f SUITE` with a `models:` list",
        ));
    }
    let req = SetupRequest {
        file: args.file.clone(),
        models: args.models.clone(),
        requests: requests.clone(),
        connections: args.connections,
        json: args.json,
        as_job: args.as_job,
    };
    let on_line = |stdout: bool, text: &str| {
        use std::io::Write;
        if stdout {
            let _ = std::io::stdout().write_all(text.as_bytes());
        } else {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    };
    let weights_dir = match host.setup(&req, plan.as_ref(), &on_line).await? {
        // `orch setup` elsewhere exits 2 for user errors (a gated repo...):
        // its code is kept.
        SetupPlace::Ran(code) => {
            return Ok(match code {
                0 => 0,
                2 => 2,
                _ => 1,
            })
        }
        SetupPlace::Here(dir) => dir,
    };
    let mut opts = SetupOptions::new(weights_dir.clone());
    opts.connections = args.connections.max(1);
    let client = orch_hub::client()?;
    eprintln!("weights volume: {}", weights_dir.display());

    let mut reports = Vec::new();
    for req in &requests {
        let started = Instant::now();
        let (tx, rx) = mpsc::unbounded_channel();
        let ui = tokio::spawn(show_progress(rx));
        let result = orch_hub::setup(&client, req, &opts, tx).await;
        let _ = ui.await;
        let report = result?;
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{}@{} -> {}: {} files, {} ({} files, {} downloaded in {:.1}s)",
            report.repo,
            report.revision,
            &report.commit[..report.commit.len().min(12)],
            report.files,
            human_bytes(report.bytes),
            report.downloaded_files,
            human_bytes(report.downloaded_bytes),
            secs
        );
        reports.push(report);
    }
    // Flush the weights to their file system before exiting: inside a
    // Modal sandbox this is what commits a volume's writes (`sync`).
    sync_dir(&weights_dir);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    if !refused.is_empty() {
        eprintln!(
            "error: {} of the campaign's models refused ({}): their tasks are recorded `weights_missing` by `orch run`, the others run\nhint: get access and run `orch setup` again",
            refused.len(),
            refused.join(", ")
        );
        return Ok(2);
    }
    Ok(0)
}

/// Each `tasks: {dataset: ...}` file into this host's Hugging Face cache
/// (where the plan reads it), whatever the backend: the host reads the rows.
async fn fetch_task_datasets(file: &std::path::Path) -> anyhow::Result<()> {
    let defs = orch_manifest::task_datasets(file)?;
    if defs.is_empty() {
        return Ok(());
    }
    let cache = orch_manifest::tasks::default_hf_cache();
    let client = orch_hub::client()?;
    for d in defs {
        let Some(repo) = d.dataset.clone() else { continue };
        let req = ModelRequest {
            repo: repo.clone(),
            revision: d.revision.clone().unwrap_or_else(|| "main".into()),
            include: vec![d.file.clone()],
            exclude: Vec::new(),
            repo_type: "dataset".into(),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let ui = tokio::spawn(show_progress(rx));
        let result = orch_hub::setup(&client, &req, &SetupOptions::new(cache.clone()), tx).await;
        let _ = ui.await;
        let report = result?;
        eprintln!(
            "task file {} of dataset {repo}@{} -> {}",
            d.file,
            report.revision,
            cache.display()
        );
    }
    Ok(())
}

async fn show_progress(mut rx: mpsc::UnboundedReceiver<SetupEvent>) {
    let tty = std::io::stderr().is_terminal();
    let mut bar: Option<ProgressBar> = None;
    let mut done = 0u64;
    let mut last_line = Instant::now();
    while let Some(e) = rx.recv().await {
        match e {
            SetupEvent::Listed {
                repo,
                files,
                bytes,
                to_download_files,
                to_download_bytes,
                ..
            } => {
                eprintln!(
                    "{repo}: {files} files, {}; to download: {to_download_files} files, {}",
                    human_bytes(bytes),
                    human_bytes(to_download_bytes)
                );
                if tty && to_download_bytes > 0 {
                    let b =
                        ProgressBar::with_draw_target(Some(to_download_bytes), ProgressDrawTarget::stderr());
                    // A constant template: known to be valid.
                    let style = ProgressStyle::with_template(
                        "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {wide_msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar());
                    b.set_style(style);
                    bar = Some(b);
                }
                done = 0;
            }
            SetupEvent::Bytes(n) => {
                done += n;
                match &bar {
                    Some(b) => b.inc(n),
                    None if last_line.elapsed().as_secs() >= 5 => {
                        eprintln!("  {} received", human_bytes(done));
                        last_line = Instant::now();
                    }
                    None => {}
                }
            }
            SetupEvent::FileDone {
                path,
                bytes,
                downloaded,
                ..
            } => {
                let line = format!(
                    "  {} {path} ({})",
                    if downloaded { "downloaded" } else { "cached" },
                    human_bytes(bytes)
                );
                match &bar {
                    Some(b) => b.println(line),
                    None => eprintln!("{line}"),
                }
            }
            SetupEvent::UsedCache { repo, commit, reason } => {
                eprintln!("warning: {repo}: using the complete local snapshot {commit}: {reason}");
            }
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}

pub fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// `syncfs(2)` on the file system holding `dir` (what `sync DIR` does);
/// errors are ignored: the data is written either way.
fn sync_dir(dir: &std::path::Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open descriptor, for the duration of the call.
        unsafe {
            libc::syncfs(f.as_raw_fd());
        }
    }
}
