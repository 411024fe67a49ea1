//! The agent's driver: read the task, run the workload, report.

use crate::ctx::Ctx;
use crate::{calibrate, command, gpu, server, transformer, AGENT_VERSION};
use orch_protocol::{
    BuiltinWorkload, CellResult, Event, FailureKind, Phase, Status, TaskSpec, Workload,
    FLAG_HARDWARE_MISMATCH, PROTOCOL_VERSION,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("usage: orch-agent run (--task FILE | --task-b64 BASE64) --out DIR [--ship] [--summary-file FILE]\n       orch-agent install DEST [SRC]\n       orch-agent version")]
    Usage,
    #[error("cannot install the agent at `{path}`: {source}")]
    Install { path: PathBuf, source: std::io::Error },
    #[error("cannot read the task file `{path}`: {source}")]
    ReadTask { path: PathBuf, source: std::io::Error },
    #[error("the task file `{path}` is not a valid task: {source}\nhint: the task file is written by `orch`; is this agent the same version as `orch`?")]
    ParseTask {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("task protocol version {got} is not supported by this agent (speaks {want})\nhint: use an `orch-agent` of the same release as `orch`")]
    Version { got: u32, want: u32 },
    #[error("cannot use the output folder `{path}`: {source}")]
    OutDir { path: PathBuf, source: std::io::Error },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
}

impl AgentError {
    /// 2 for a bad invocation or task, 1 for an internal failure.
    pub fn exit_code(&self) -> i32 {
        match self {
            AgentError::Usage | AgentError::ParseTask { .. } | AgentError::Version { .. } => 2,
            _ => 1,
        }
    }
}

/// Run one task to its result. Never panics out: a panicking workload is a
/// failed cell.
pub fn run_task(task: &TaskSpec, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    ctx.emit(Event::Started {
        cell_id: task.cell_id.clone(),
        agent_version: AGENT_VERSION.to_string(),
        pid: std::process::id(),
    });
    ctx.enter(Phase::Start);
    let (gpus, mut hardware, probe) = gpu::detect();
    hardware.mismatch = gpu::mismatch(task.gpu.as_str(), &hardware);
    if let Some(m) = &hardware.mismatch {
        ctx.message(format!("hardware mismatch: {m}"));
    }
    if let (Some(m), true) = (&hardware.mismatch, task.strict_hardware) {
        let mut r = CellResult::failed(
            &task.cell_id,
            Status::Failed,
            FailureKind::HardwareMismatch,
            format!("{m} (strict hardware: the workload did not run)"),
        );
        r.flags.push(FLAG_HARDWARE_MISMATCH.into());
        r.hardware = Some(hardware);
        probe.record(&mut r.info);
        return finish(r, out_dir, ctx);
    }
    if let Some(set) = &task.files {
        match crate::files::lay_out(set) {
            Ok(summary) => ctx.message(summary),
            Err(e) => {
                let mut r = CellResult::failed(
                    &task.cell_id,
                    Status::Failed,
                    FailureKind::FilesError,
                    format!("the cell's files could not be laid out: {e}"),
                );
                r.hardware = Some(hardware);
                probe.record(&mut r.info);
                return finish(r, out_dir, ctx);
            }
        }
    }
    if let Some(msg) = builtin_without_cuda(task, &hardware) {
        let mut r = CellResult::failed(&task.cell_id, Status::Failed, FailureKind::WorkloadError, msg);
        r.hardware = Some(hardware);
        probe.record(&mut r.info);
        return finish(r, out_dir, ctx);
    }
    let hz = gpu::telemetry_hz(&task.env);
    let sampler = gpus
        .filter(|g| g.count() > 0 && hz > 0.0)
        .map(|g| gpu::Sampler::start(g, hz, out_dir));
    if let Some(s) = &sampler {
        ctx.set_phase_hook(s.phase_hook());
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &task.workload {
        Workload::Command(c) => command::run(c, task, out_dir, ctx),
        Workload::Server(s) => server::run(s, task, out_dir, ctx),
        Workload::Compare(c) => crate::compare::run(c, task, out_dir, ctx),
        Workload::Builtin(BuiltinWorkload::Transformer(cfg)) => transformer::run(cfg, task, ctx),
        Workload::Builtin(BuiltinWorkload::Calibrate(cfg)) => calibrate::run(cfg, task, ctx),
        Workload::Builtin(BuiltinWorkload::Noop) => {
            ctx.enter(Phase::Measure);
            CellResult::new(&task.cell_id, Status::Succeeded)
        }
    }));
    ctx.clear_phase_hook();
    let mut result = match outcome {
        Ok(r) => r,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            CellResult::failed(
                &task.cell_id,
                Status::Failed,
                FailureKind::AgentPanic,
                format!("the workload panicked: {msg}"),
            )
        }
    };
    if hardware.mismatch.is_some() {
        result.flags.push(FLAG_HARDWARE_MISMATCH.into());
    }
    if let Workload::Builtin(BuiltinWorkload::Calibrate(cfg)) = &task.workload {
        calibrate::judge(&mut result, &hardware, cfg);
    }
    let measure_s = ctx.phase_seconds(Phase::Measure);
    if let Some(s) = sampler {
        let summary = s.finish();
        let (steps, tokens) = measured_work(task, &result.metrics, measure_s);
        result.metrics.extend(summary.metrics(steps, tokens));
        result.info.insert("telemetry".into(), summary.to_json());
    }
    result.hardware = Some(hardware);
    probe.record(&mut result.info);
    finish(result, out_dir, ctx)
}

/// A builtin workload of a GPU cell, on a machine with GPUs, in an agent
/// built without CUDA would measure the CPU and call it the GPU's figure:
/// refuse, and say which agent to use. (On a host without GPUs the cell runs
/// on the CPU, flagged `hardware_mismatch`.)
fn builtin_without_cuda(task: &TaskSpec, hw: &orch_protocol::Hardware) -> Option<String> {
    if orch_kernels::CUDA || hw.gpus.is_empty() {
        return None;
    }
    if task.gpu.is_cpu() {
        return None;
    }
    let gpu = &task.gpu;
    let (name, device) = match &task.workload {
        Workload::Builtin(BuiltinWorkload::Transformer(c)) => ("transformer", c.device.as_deref()),
        Workload::Builtin(BuiltinWorkload::Calibrate(c)) => ("calibrate", c.device.as_deref()),
        _ => return None,
    };
    if device.is_some() {
        return None;
    }
    Some(format!(
        "the cell asks for `{gpu}` but this agent was built without CUDA, so builtin `{name}` would measure the CPU\nhint: set `ORCH_AGENT` to an `orch-agent` built with `--features cuda`, or set `device: cpu` to measure the CPU on purpose"
    ))
}

/// Steps and tokens of the measured phase, for energy per step and per token:
/// the builtin transformer does `repetitions` steps (calibrate has none); a command may report `steps` and
/// `tokens` (or `total_output_tokens`) itself; else tokens from a tokens/s
/// rate over the measured time.
fn measured_work(
    task: &TaskSpec,
    metrics: &std::collections::BTreeMap<String, f64>,
    measure_s: f64,
) -> (Option<f64>, Option<f64>) {
    let steps = match &task.workload {
        Workload::Builtin(BuiltinWorkload::Transformer(_)) => Some(f64::from(task.measure.repetitions)),
        Workload::Builtin(_) => None,
        _ => ["steps", "measured_steps"]
            .iter()
            .find_map(|k| metrics.get(*k).copied()),
    };
    let tokens = ["tokens", "measured_tokens", "total_output_tokens"]
        .iter()
        .find_map(|k| metrics.get(*k).copied())
        .or_else(|| {
            ["tokens_per_s", "output_throughput"]
                .iter()
                .find_map(|k| metrics.get(*k))
                .map(|rate| rate * measure_s)
                .filter(|t| *t > 0.0)
        });
    (steps, tokens)
}

fn finish(mut result: CellResult, out_dir: &Path, ctx: &mut Ctx) -> CellResult {
    result.timings = ctx.take_timings();
    // Every cell has both logs, even a builtin workload that wrote none.
    for name in ["stdout.log", "stderr.log"] {
        let path = out_dir.join(name);
        if !path.exists() {
            let _ = std::fs::File::create(path);
        }
    }
    result.info.insert("agent_version".into(), AGENT_VERSION.into());
    if let Some(host) = hostname() {
        result.info.insert("hostname".into(), host.into());
    }
    if let Some(peak) = crate::sysmem::peak_rss_bytes() {
        result.info.insert("agent_peak_rss_bytes".into(), peak.into());
    }
    result
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Write `bytes` to `path` so that a reader sees the old file or the whole new one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Entry point shared by the `orch-agent` binary and `orch agent`.
/// `args` excludes the program name.
pub fn main_with_args(args: &[String]) -> i32 {
    match try_main(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("orch-agent: error: {e}");
            e.exit_code()
        }
    }
}

/// Copy this executable (or `src`, another file of the agent image such as
/// the static `orch`) to `dest` (mode 755), through a temporary name so that
/// a half-copied program never runs. An image `FROM scratch` has no `cp`.
fn install(dest: &Path, src: Option<PathBuf>) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let err = |source| AgentError::Install {
        path: dest.to_path_buf(),
        source,
    };
    let me = match src {
        Some(s) => s,
        None => std::env::current_exe().map_err(err)?,
    };
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent).map_err(err)?;
    }
    let tmp = dest.with_extension("part");
    std::fs::copy(&me, &tmp).map_err(err)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(err)?;
    std::fs::rename(&tmp, dest).map_err(err)?;
    println!("installed {} at {}", me.display(), dest.display());
    Ok(())
}

fn try_main(args: &[String]) -> Result<i32, AgentError> {
    let mut task_path = None;
    let mut task_b64 = None;
    let mut out_dir = None;
    let mut ship = false;
    let mut summary_file = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("run") => {}
        Some("probe") => return Ok(crate::launch::probe()),
        Some("install") => {
            // `orch-agent install DEST`: copy this executable to DEST (an init
            // container of the agent image puts the agent into a volume the
            // cell's container, of any image, runs it from).
            let Some(dest) = it.next().map(PathBuf::from) else {
                return Err(AgentError::Usage);
            };
            return install(&dest, it.next().map(PathBuf::from)).map(|()| 0);
        }
        Some("check-kernels") => {
            // `orch-agent check-kernels [cpu|cuda]`: the fused ops' gradient
            // checks on this machine's device, one JSON object per line; exit 1
            // when one is out of tolerance.
            return Ok(orch_kernels::check_kernels(it.next().map(String::as_str)));
        }
        Some("version") | Some("--version") | Some("-V") => {
            println!(
                "orch-agent {AGENT_VERSION} (protocol {PROTOCOL_VERSION}, {}{})",
                crate::launch::LINKAGE,
                if crate::launch::has_embedded() {
                    ", carries the glibc 2.17 dynamic agent"
                } else {
                    ""
                }
            );
            return Ok(0);
        }
        _ => return Err(AgentError::Usage),
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--task" => task_path = it.next().map(PathBuf::from),
            "--task-b64" => task_b64 = it.next().cloned(),
            "--out" => out_dir = it.next().map(PathBuf::from),
            "--ship" => ship = true,
            "--summary-file" => summary_file = it.next().map(PathBuf::from),
            _ => return Err(AgentError::Usage),
        }
    }
    let Some(out_dir) = out_dir else {
        return Err(AgentError::Usage);
    };
    let (task_path, text) = match (task_path, task_b64) {
        (Some(path), None) => {
            let text = std::fs::read_to_string(&path).map_err(|source| AgentError::ReadTask {
                path: path.clone(),
                source,
            })?;
            (path, text)
        }
        (None, Some(b64)) => {
            use base64::Engine as _;
            let path = PathBuf::from("--task-b64");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| AgentError::ReadTask {
                    path: path.clone(),
                    source: std::io::Error::other(e),
                })?;
            let text = String::from_utf8(bytes).map_err(|e| AgentError::ReadTask {
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
            (path, text)
        }
        _ => return Err(AgentError::Usage),
    };
    let task: TaskSpec = serde_json::from_str(&text).map_err(|source| AgentError::ParseTask {
        path: task_path.clone(),
        source,
    })?;
    if task.version != PROTOCOL_VERSION {
        return Err(AgentError::Version {
            got: task.version,
            want: PROTOCOL_VERSION,
        });
    }
    // The static agent becomes the dynamic one where the image has a loader
    // (this call does not return then): before any thread starts.
    crate::launch::choose(args, task.env.get(crate::launch::FLAVOR_ENV).map(String::as_str));
    std::fs::create_dir_all(&out_dir).map_err(|source| AgentError::OutDir {
        path: out_dir.clone(),
        source,
    })?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(AgentError::Signals)?;
    }
    // Die with the host: a host killed with SIGKILL must not leave an agent
    // (and its workload) running on a GPU.
    #[cfg(target_os = "linux")]
    // SAFETY: plain syscall with constant arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
    }
    // Orphans of the workload become ours; if we are killed, the guard
    // kills what is left. Forked here, before any thread starts.
    crate::reaper::set_process_name(c"orch-agent");
    crate::reaper::become_subreaper();
    crate::reaper::start_guard();
    let too_short = crate::secrets::install(&task);

    // Shipping: the output folder and the events go home over stdout, and
    // the agent's own messages (stderr) become `agent.log`, shipped with them.
    let shipper = if ship {
        redirect_stderr(&out_dir.join("agent.log"));
        Some(crate::ship::Shipper::start(&out_dir, Box::new(std::io::stdout())))
    } else {
        None
    };
    // Every event goes out with the cell's secrets masked.
    let sink: crate::ctx::EventSink = match &shipper {
        Some(s) => {
            let mut inner = s.sink();
            Box::new(move |e: &Event| match crate::secrets::masker().mask_value(e) {
                Some(masked) => inner(&masked),
                None => inner(e),
            })
        }
        None => Box::new(|e: &Event| {
            let line = match crate::secrets::masker().mask_value(e) {
                Some(masked) => masked.to_line(),
                None => e.to_line(),
            };
            let mut out = std::io::stdout().lock();
            // A closed stdout (host gone) must not stop the workload's bookkeeping.
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }),
    };
    let mut ctx = Ctx::new(sink, stop);
    for name in too_short {
        ctx.message(format!(
            "secret `{name}` is shorter than {} characters and is not masked",
            orch_protocol::mask::MIN_SECRET_LEN
        ));
    }
    let mut result = run_task(&task, &out_dir, &mut ctx);
    teardown(&task, &mut result, &mut ctx);
    for path in crate::secrets::sweep(&out_dir) {
        ctx.message(format!("masked a secret in `{}`", path.display()));
    }
    crate::secrets::masker().mask_in_place(&mut result);
    let json = serde_json::to_vec_pretty(&result).unwrap_or_default();
    let written = write_atomic(&out_dir.join(orch_protocol::AGENT_RESULT_FILE), &json);
    if let Some(path) = &summary_file {
        let _ = std::fs::write(path, orch_protocol::ship::result_summary(&result, 4000));
    }
    match shipper {
        Some(s) => s.finish(&Event::Result { result }),
        None => {
            if let Err(source) = written {
                return Err(AgentError::OutDir {
                    path: out_dir,
                    source,
                });
            }
            ctx.emit(Event::Result { result });
        }
    }
    Ok(0)
}

/// The end of a cell: no process of the workload survives it (see
/// [`crate::reaper`]); on a GPU cell, the killed processes' GPU memory is
/// released before the cell ends.
fn teardown(task: &TaskSpec, result: &mut CellResult, ctx: &mut Ctx) {
    let killed = crate::reaper::kill_descendants();
    if let Some(cg) = crate::cgroup::cell() {
        cg.remove();
    }
    result
        .info
        .insert("containment".into(), crate::reaper::containment().into());
    if killed.is_empty() {
        return;
    }
    ctx.message(format!(
        "killed {} leftover process(es) of the workload at the end of the cell",
        killed.len()
    ));
    result
        .info
        .insert("leftover_processes_killed".into(), killed.len().into());
    if !task.gpu.is_cpu() {
        crate::reaper::wait_gpu_released(&killed, std::time::Duration::from_secs(60));
    }
}

/// Send this process's stderr to `path` (appending).
fn redirect_stderr(path: &Path) {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        // SAFETY: dup2 onto fd 2 with a valid open descriptor; `f` may close
        // afterwards, fd 2 keeps its own reference to the file.
        unsafe {
            libc::dup2(f.as_raw_fd(), 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orch_protocol::{CalibrateConfig, GpuInfo, Hardware, Measure, TransformerConfig};

    fn task(gpu: &str, workload: Workload) -> TaskSpec {
        TaskSpec {
            version: PROTOCOL_VERSION,
            run_id: "r".into(),
            cell_id: "c".into(),
            gpu: gpu.into(),
            params: Default::default(),
            env: Default::default(),
            secret_env: vec![],
            workload,
            measure: Measure::default(),
            logs: Default::default(),
            memory_limit_bytes: None,
            weights_dir: None,
            strict_hardware: false,
            gpu_fallback: vec![],
            files: None,
        }
    }

    #[test]
    fn a_cpu_only_agent_refuses_to_measure_a_present_gpu() {
        let with_gpu = Hardware {
            gpus: vec![GpuInfo {
                name: "NVIDIA H100 80GB HBM3".into(),
                ..GpuInfo::default()
            }],
            ..Hardware::default()
        };
        let tr = Workload::Builtin(BuiltinWorkload::Transformer(TransformerConfig::default()));
        let cal = Workload::Builtin(BuiltinWorkload::Calibrate(CalibrateConfig::default()));
        if orch_kernels::CUDA {
            assert_eq!(builtin_without_cuda(&task("H100", tr), &with_gpu), None);
            return;
        }
        let msg = builtin_without_cuda(&task("H100", tr.clone()), &with_gpu).unwrap();
        assert!(
            msg.contains("`--features cuda`") && msg.contains("hint:"),
            "{msg}"
        );
        assert!(builtin_without_cuda(&task("H100", cal), &with_gpu).is_some());
        // CPU cells, hosts without GPUs, explicit devices and commands run.
        assert_eq!(builtin_without_cuda(&task("none", tr.clone()), &with_gpu), None);
        assert_eq!(
            builtin_without_cuda(&task("H100", tr), &Hardware::default()),
            None
        );
        let explicit = Workload::Builtin(BuiltinWorkload::Transformer(TransformerConfig {
            device: Some("cpu".into()),
            ..Default::default()
        }));
        assert_eq!(builtin_without_cuda(&task("H100", explicit), &with_gpu), None);
    }
}
