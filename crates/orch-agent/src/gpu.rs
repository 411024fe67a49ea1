//! The GPUs the agent got: identity through NVML, and telemetry sampled while
//! the workload runs.
//!
//! NVML is loaded at run time (`$ORCH_NVML_LIB`, `libnvidia-ml.so.1` through
//! the loader's search, then the folders where the NVIDIA container toolkit,
//! GKE and the GPU operator put it). The static agent never loads it (see
//! [`crate::launch`]). Where NVML cannot be loaded the cell still runs: the
//! GPUs are named by `nvidia-smi` when it is on the PATH, else by the driver's
//! procfs (`/proc/driver/nvidia/gpus/*/information`), else counted from the
//! device nodes (`/dev/nvidiaN`), so a record never claims no GPU where the
//! container has one; `info.gpu_probe` keeps NVML's error and
//! `info.gpu_source` says where the identity came from. Telemetry needs NVML.
//! Only the GPUs this cell may use are read: `CUDA_VISIBLE_DEVICES` (indices
//! or UUIDs) narrows the list, as CUDA itself would.

use crate::ctx::PhaseChange;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;
use orch_protocol::{GpuInfo, Hardware, Phase};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable: telemetry samples per second (`0` turns sampling off).
pub const TELEMETRY_HZ_ENV: &str = "ORCH_TELEMETRY_HZ";
/// Environment variable: path of the NVML library to load.
pub const NVML_LIB_ENV: &str = "ORCH_NVML_LIB";
const DEFAULT_HZ: f64 = 10.0;

/// NVML and the indices of the GPUs this cell may use.
pub struct Gpus {
    nvml: Nvml,
    indices: Vec<u32>,
}

impl Gpus {
    /// Load NVML and find the visible GPUs. `Err` is a note for the record
    /// (`NVML not found`), not a failure.
    pub fn open() -> Result<Gpus, String> {
        let nvml = load_nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML found no GPUs: {e}"))?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let indices = visible_positions(
            count as usize,
            |i| nvml.device_by_index(i as u32).and_then(|d| d.uuid()).ok(),
            visible.as_deref(),
        )
        .into_iter()
        .map(|i| i as u32)
        .collect();
        Ok(Gpus { nvml, indices })
    }

    pub fn count(&self) -> usize {
        self.indices.len()
    }

    /// Driver version, CUDA version and one [`GpuInfo`] per visible GPU.
    pub fn hardware(&self) -> Hardware {
        let nvml = &self.nvml;
        let mut hw = host_hardware();
        hw.driver_version = nvml.sys_driver_version().ok();
        hw.cuda_version = nvml
            .sys_cuda_driver_version()
            .ok()
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
        for &i in &self.indices {
            let Ok(d) = nvml.device_by_index(i) else {
                continue;
            };
            hw.gpus.push(GpuInfo {
                index: i,
                name: d.name().unwrap_or_default(),
                uuid: d.uuid().unwrap_or_default(),
                memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
                pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                compute_capability: d
                    .cuda_compute_capability()
                    .ok()
                    .map(|c| format!("{}.{}", c.major, c.minor)),
                power_limit_w: d.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0),
            });
        }
        hw
    }
}

/// Folders where GPU containers get the driver's libraries when the loader's
/// own search does not find them (no `ldconfig` run after the injection).
const NVML_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
];

fn load_nvml() -> Result<Nvml, String> {
    if let Some(why) = crate::launch::nvml_unavailable() {
        return Err(why);
    }
    if let Some(why) = crate::launch::probe_nvml_crashed() {
        return Err(why);
    }
    let mut tried = Vec::new();
    let mut candidates: Vec<std::ffi::OsString> = Vec::new();
    if let Some(p) = std::env::var_os(NVML_LIB_ENV).filter(|p| !p.is_empty()) {
        candidates.push(p);
    }
    // The driver installs the versioned name; the bare name exists only with
    // development packages.
    candidates.push("libnvidia-ml.so.1".into());
    candidates.push("libnvidia-ml.so".into());
    for d in NVML_DIRS {
        let p = Path::new(d).join("libnvidia-ml.so.1");
        if p.exists() {
            candidates.push(p.into());
        }
    }
    for c in &candidates {
        match Nvml::builder().lib_path(c).init() {
            Ok(n) => return Ok(n),
            Err(e) => tried.push(format!("{}: {e}", c.to_string_lossy())),
        }
    }
    Err(format!("no GPU: NVML not available ({})", tried.join("; ")))
}

/// For `orch-agent probe`: load NVML and count the GPUs.
pub fn probe_nvml() -> Result<u32, String> {
    let nvml = load_nvml()?;
    nvml.device_count()
        .map_err(|e| format!("NVML found no GPUs: {e}"))
}

/// Positions (0..count) that `CUDA_VISIBLE_DEVICES` leaves visible, in its
/// order (all when unset); `uuid_of` gives a position's UUID.
fn visible_positions(
    count: usize,
    uuid_of: impl Fn(usize) -> Option<String>,
    visible: Option<&str>,
) -> Vec<usize> {
    let Some(spec) = visible.map(str::trim) else {
        return (0..count).collect();
    };
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if let Ok(i) = item.parse::<i64>() {
            // CUDA stops at the first invalid index.
            if i < 0 || i >= count as i64 {
                break;
            }
            out.push(i as usize);
        } else if let Some(i) = (0..count).find(|&i| {
            uuid_of(i)
                .filter(|u| !u.is_empty())
                .map(|u| u == item || u.starts_with(item))
                .unwrap_or(false)
        }) {
            out.push(i);
        } else if item.starts_with("MIG-") || (0..count).all(|i| uuid_of(i).is_none_or(|u| u.is_empty())) {
            // A MIG instance (its parent's UUID is not its own), or GPUs known
            // without UUIDs (device nodes): one GPU, not none.
            match (0..count).find(|i| !out.contains(i)) {
                Some(i) => out.push(i),
                None => break,
            }
        } else {
            break;
        }
    }
    out
}

/// GPUs named without NVML: where the names came from and the driver version.
struct Identified {
    gpus: Vec<GpuInfo>,
    driver_version: Option<String>,
    source: &'static str,
}

/// Name the GPUs without NVML: `nvidia-smi`, the driver's procfs, the device
/// nodes, in that order; `None` when none shows a GPU.
fn identify_without_nvml() -> Option<Identified> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let narrow = |mut all: Identified| {
        let keep = visible_positions(
            all.gpus.len(),
            |i| Some(all.gpus[i].uuid.clone()),
            visible.as_deref(),
        );
        let gpus = std::mem::take(&mut all.gpus);
        all.gpus = keep.into_iter().filter_map(|i| gpus.get(i).cloned()).collect();
        all
    };
    if let Some(found) = from_nvidia_smi() {
        return Some(narrow(found));
    }
    if let Some(found) = from_procfs(Path::new("/proc/driver/nvidia"), Path::new("/dev")) {
        return Some(narrow(found));
    }
    from_device_nodes(Path::new("/dev")).map(narrow)
}

/// Run a program for at most `limit`; its stdout when it exits 0.
fn run_for(program: &str, args: &[&str], limit: Duration) -> Option<String> {
    use std::io::Read as _;
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut pipe = child.stdout.take()?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = pipe.read_to_string(&mut out);
        out
    });
    let status = crate::launch::wait_until(&mut child, Instant::now() + limit)?;
    let out = reader.join().ok()?;
    status.success().then_some(out)
}

fn from_nvidia_smi() -> Option<Identified> {
    // `name` last: the only field that could hold a comma.
    const FIELDS: &str = "index,uuid,memory.total,pci.bus_id,power.limit,driver_version";
    let limit = Duration::from_secs(15);
    // `compute_cap` is known to nvidia-smi of drivers 510 and later.
    let with_cc = format!("--query-gpu={FIELDS},compute_cap,name");
    let (out, with_cc) = match run_for("nvidia-smi", &[&with_cc, "--format=csv,noheader,nounits"], limit) {
        Some(o) => (o, true),
        None => (
            run_for(
                "nvidia-smi",
                &[
                    &format!("--query-gpu={FIELDS},name"),
                    "--format=csv,noheader,nounits",
                ],
                limit,
            )?,
            false,
        ),
    };
    let parsed = parse_nvidia_smi(&out, with_cc);
    (!parsed.gpus.is_empty()).then_some(parsed)
}

/// `index, uuid, memory.total, pci.bus_id, power.limit, driver_version[,
/// compute_cap], name` lines.
fn parse_nvidia_smi(out: &str, with_cc: bool) -> Identified {
    let mut gpus = Vec::new();
    let mut driver = None;
    let known = |v: &str| !(v.is_empty() || v.starts_with('[') || v.eq_ignore_ascii_case("N/A"));
    let n = if with_cc { 8 } else { 7 };
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.splitn(n, ',').map(str::trim).collect();
        if f.len() < n {
            continue;
        }
        let mib = f[2].parse::<f64>().unwrap_or(0.0);
        driver = driver.or_else(|| known(f[5]).then(|| f[5].to_string()));
        gpus.push(GpuInfo {
            index: f[0].parse().unwrap_or(gpus.len() as u32),
            name: f[n - 1].to_string(),
            uuid: f[1].to_string(),
            memory_bytes: (mib * 1024.0 * 1024.0) as u64,
            pci_bus_id: known(f[3]).then(|| f[3].to_string()),
            compute_capability: with_cc.then(|| f[6]).filter(|v| known(v)).map(String::from),
            power_limit_w: f[4].parse::<f64>().ok(),
        });
    }
    Identified {
        gpus,
        driver_version: driver,
        source: "nvidia-smi",
    }
}

/// The driver's procfs: one folder per GPU with `Model`, `GPU UUID`, `Bus
/// Location` and `Device Minor`; a GPU counts only when this container has its
/// device node (the toolkit passes the nodes of the GPUs it gives).
fn from_procfs(proc_nvidia: &Path, dev: &Path) -> Option<Identified> {
    let mut gpus = Vec::new();
    for e in std::fs::read_dir(proc_nvidia.join("gpus")).ok()?.flatten() {
        let Ok(text) = std::fs::read_to_string(e.path().join("information")) else {
            continue;
        };
        let field = |name: &str| {
            text.lines().find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.trim() == name)
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        if let Some(minor) = field("Device Minor") {
            if !dev.join(format!("nvidia{minor}")).exists() {
                continue;
            }
        }
        gpus.push(GpuInfo {
            index: 0,
            name: field("Model").unwrap_or_default(),
            uuid: field("GPU UUID").unwrap_or_default(),
            memory_bytes: 0,
            pci_bus_id: field("Bus Location").or_else(|| e.file_name().to_str().map(String::from)),
            compute_capability: None,
            power_limit_w: None,
        });
    }
    if gpus.is_empty() {
        return None;
    }
    // NVML's (and nvidia-smi's) order: by PCI bus id.
    gpus.sort_by(|a, b| a.pci_bus_id.cmp(&b.pci_bus_id));
    for (i, g) in gpus.iter_mut().enumerate() {
        g.index = i as u32;
    }
    let driver_version = std::fs::read_to_string(proc_nvidia.join("version"))
        .ok()
        .and_then(|v| {
            // `NVRM version: NVIDIA UNIX [Open ]Kernel Module [for x86_64]  580.95.05  ...`
            let first = v.lines().next()?;
            let after = &first[first.find("Module")?..];
            after
                .split_whitespace()
                .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
                .map(String::from)
        });
    Some(Identified {
        gpus,
        driver_version,
        source: "procfs",
    })
}

/// `/dev/nvidia0`, `/dev/nvidia1`...: GPUs present, not named.
fn from_device_nodes(dev: &Path) -> Option<Identified> {
    let mut minors: Vec<u32> = std::fs::read_dir(dev)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("nvidia")?.parse().ok())
        .collect();
    minors.sort_unstable();
    let gpus: Vec<GpuInfo> = (0..minors.len() as u32)
        .map(|index| GpuInfo {
            index,
            ..GpuInfo::default()
        })
        .collect();
    (!gpus.is_empty()).then_some(Identified {
        gpus,
        driver_version: None,
        source: "device-nodes",
    })
}

/// CPU model, cores and memory of this host (no GPU fields).
pub fn host_hardware() -> Hardware {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string());
    Hardware {
        cpu_model,
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        memory_bytes: crate::sysmem::total_memory_bytes().unwrap_or(0),
        ..Hardware::default()
    }
}

/// How the GPUs were read: `nvml`, `nvidia-smi`, `procfs`, `device-nodes`,
/// or `none`, and NVML's error when it could not be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub source: &'static str,
    pub nvml_error: Option<String>,
}

impl Probe {
    /// Into a result's `info`: `gpu_source`, `gpu_probe` (NVML's error) and
    /// `agent` (which build ran, on what libc).
    pub fn record(&self, info: &mut BTreeMap<String, Value>) {
        info.insert("gpu_source".into(), json!(self.source));
        if let Some(e) = &self.nvml_error {
            info.insert("gpu_probe".into(), json!(e));
        }
        info.insert("agent".into(), crate::launch::info());
    }
}

/// What the agent found: NVML's GPUs; without NVML the GPUs named another
/// way (no telemetry), or the host alone with a note.
pub fn detect() -> (Option<Arc<Gpus>>, Hardware, Probe) {
    match Gpus::open() {
        Ok(g) => {
            let hw = g.hardware();
            let probe = Probe {
                source: "nvml",
                nvml_error: None,
            };
            (Some(Arc::new(g)), hw, probe)
        }
        Err(note) => {
            let mut hw = host_hardware();
            let source = match identify_without_nvml() {
                Some(found) => {
                    hw.gpus = found.gpus;
                    hw.driver_version = found.driver_version;
                    found.source
                }
                None => "none",
            };
            hw.gpu_note = Some(if source == "none" {
                note.clone()
            } else {
                format!("{note}; GPUs named by {source}, no telemetry")
            });
            let probe = Probe {
                source,
                nvml_error: Some(note),
            };
            (None, hw, probe)
        }
    }
}

/// Why what is present differs from what was asked (`H100:8`), if it does.
pub fn mismatch(requested: &str, hw: &Hardware) -> Option<String> {
    let (kind, count) = match requested.trim().split_once(':') {
        Some((k, n)) => (k.trim(), n.trim().parse::<usize>().unwrap_or(1)),
        None => (requested.trim(), 1),
    };
    if kind.is_empty() || kind.eq_ignore_ascii_case("none") {
        return None;
    }
    let present = describe(&hw.gpus);
    if hw.gpus.len() < count {
        return Some(format!("asked for `{requested}`, found {present}"));
    }
    if kind.eq_ignore_ascii_case("any") {
        return None;
    }
    let wrong: Vec<&GpuInfo> = hw
        .gpus
        .iter()
        .take(count)
        // A GPU known only by its device node cannot be judged by model.
        .filter(|g| !g.name.is_empty() && !gpu_matches(kind, &g.name, g.memory_bytes))
        .collect();
    if wrong.is_empty() {
        None
    } else {
        Some(format!("asked for `{requested}`, found {present}"))
    }
}

fn describe(gpus: &[GpuInfo]) -> String {
    if gpus.is_empty() {
        return "no GPU".into();
    }
    let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
    for g in gpus {
        let name = if g.name.is_empty() {
            "unidentified NVIDIA GPU"
        } else {
            g.name.as_str()
        };
        *by_name.entry(name).or_insert(0) += 1;
    }
    by_name
        .iter()
        .map(|(n, c)| format!("{c} x `{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Does an NVML name (`NVIDIA H100 80GB HBM3`) with this much memory satisfy
/// a requested type (`H100`, `A100-80GB`, `L4`)? Words are matched whole, so
/// `L4` is not `L40S`; a memory suffix (`-80GB`) must match within 10%.
pub fn gpu_matches(requested: &str, name: &str, memory_bytes: u64) -> bool {
    let req = requested.to_ascii_uppercase();
    let (model, mem_gb) = match req.rsplit_once('-') {
        Some((m, suffix)) if suffix.ends_with("GB") => {
            (m.to_string(), suffix.trim_end_matches("GB").parse::<f64>().ok())
        }
        _ => (req.clone(), None),
    };
    let words = name_words(name);
    let model_ok = words.contains(&model)
        // `H100` also names `H100-SXM5-80GB`-style single tokens.
        || words.iter().any(|w| w.starts_with(&model) && w[model.len()..].starts_with(|c: char| !c.is_ascii_digit() && c != 'S'));
    if !model_ok {
        return false;
    }
    match mem_gb {
        None => true,
        Some(gb) => {
            let have = memory_bytes as f64 / 1e9;
            // NVML reports GiB-ish totals a little under the marketed figure.
            (have / gb - 1.0).abs() < 0.15 || words.iter().any(|w| *w == format!("{gb}GB"))
        }
    }
}

/// The upper-case alphanumeric words of a GPU name (`NVIDIA A100-SXM4-80GB`
/// → `NVIDIA`, `A100`, `SXM4`, `80GB`).
pub fn name_words(name: &str) -> Vec<String> {
    name.to_ascii_uppercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(String::from)
        .collect()
}

/// Telemetry rate from the task's environment (`ORCH_TELEMETRY_HZ`), else 10 Hz.
pub fn telemetry_hz(env: &BTreeMap<String, String>) -> f64 {
    env.get(TELEMETRY_HZ_ENV)
        .cloned()
        .or_else(|| std::env::var(TELEMETRY_HZ_ENV).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|h| h.is_finite() && *h >= 0.0)
        .unwrap_or(DEFAULT_HZ)
}

/// One reading of one GPU.
#[derive(Debug, Clone, Serialize)]
struct Reading {
    gpu: u32,
    util_pct: Option<u32>,
    mem_util_pct: Option<u32>,
    mem_used_bytes: Option<u64>,
    power_w: Option<f64>,
    sm_clock_mhz: Option<u32>,
    temp_c: Option<u32>,
    /// Energy counter since the driver loaded, in joules.
    energy_j: Option<f64>,
}

/// One line of `telemetry.jsonl`.
#[derive(Debug, Clone, Serialize)]
struct Sample {
    t: f64,
    phase: Option<Phase>,
    gpus: Vec<Reading>,
}

enum Msg {
    Phase(PhaseChange),
    Stop,
}

/// Samples the GPUs on a thread until stopped; phase changes are sampled at
/// once, so energy per phase comes from counter readings at its edges.
pub struct Sampler {
    tx: mpsc::Sender<Msg>,
    handle: std::thread::JoinHandle<Summary>,
}

impl Sampler {
    /// Start sampling at `hz` into `out_dir/telemetry.jsonl`.
    pub fn start(gpus: Arc<Gpus>, hz: f64, out_dir: &Path) -> Sampler {
        let (tx, rx) = mpsc::channel();
        let path = out_dir.join("telemetry.jsonl");
        let period = Duration::from_secs_f64(1.0 / hz.max(0.1));
        let handle = std::thread::spawn(move || sample_loop(&gpus, period, &rx, &path));
        Sampler { tx, handle }
    }

    /// A hook for [`crate::Ctx`]: tell the sampler the phase changed.
    pub fn phase_hook(&self) -> crate::ctx::PhaseHook {
        let tx = self.tx.clone();
        Box::new(move |p| {
            let _ = tx.send(Msg::Phase(p));
        })
    }

    pub fn finish(self) -> Summary {
        let _ = self.tx.send(Msg::Stop);
        self.handle.join().unwrap_or_default()
    }
}

fn read(devices: &[(u32, nvml_wrapper::Device<'_>)]) -> Vec<Reading> {
    let mut out = Vec::with_capacity(devices.len());
    for (i, d) in devices {
        let util = d.utilization_rates().ok();
        out.push(Reading {
            gpu: *i,
            util_pct: util.as_ref().map(|u| u.gpu),
            mem_util_pct: util.as_ref().map(|u| u.memory),
            mem_used_bytes: d.memory_info().ok().map(|m| m.used),
            power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            temp_c: d.temperature(TemperatureSensor::Gpu).ok(),
            energy_j: d.total_energy_consumption().ok().map(|mj| mj as f64 / 1000.0),
        });
    }
    out
}

/// One JSON line of `telemetry.jsonl`; a file that cannot be written loses
/// lines, never the cell.
fn write_line<T: Serialize>(file: &mut Option<std::io::BufWriter<std::fs::File>>, value: &T) {
    if let (Some(f), Ok(line)) = (file.as_mut(), serde_json::to_string(value)) {
        let _ = writeln!(f, "{line}");
    }
}

fn sample_loop(gpus: &Gpus, period: Duration, rx: &mpsc::Receiver<Msg>, path: &Path) -> Summary {
    let started = Instant::now();
    // Handles looked up once: each sample is only the readings.
    let gpus: Vec<(u32, nvml_wrapper::Device<'_>)> = gpus
        .indices
        .iter()
        .filter_map(|&i| gpus.nvml.device_by_index(i).ok().map(|d| (i, d)))
        .collect();
    let gpus = gpus.as_slice();
    let mut file = std::fs::File::create(path).ok().map(std::io::BufWriter::new);
    let mut acc = Accumulator::default();
    let mut phase: Option<Phase> = None;
    let mut next = Instant::now();
    loop {
        let t0 = Instant::now();
        let readings = read(gpus);
        acc.cost_s += t0.elapsed().as_secs_f64();
        let s = Sample {
            t: started.elapsed().as_secs_f64(),
            phase,
            gpus: readings,
        };
        acc.add(&s);
        write_line(&mut file, &s);
        next += period;
        let wait = next.saturating_duration_since(Instant::now());
        match rx.recv_timeout(wait) {
            Ok(Msg::Phase(PhaseChange::Relabel(p))) => {
                // The open span was this phase all along (a command's start-up
                // before its first `ORCH_PHASE` line).
                phase = Some(p);
                acc.relabel(p);
                write_line(
                    &mut file,
                    &json!({"t": started.elapsed().as_secs_f64(), "relabel": p}),
                );
            }
            Ok(Msg::Phase(PhaseChange::Enter(p))) => {
                // Close the old span with a reading at its edge, open the new one with the same reading.
                let readings = read(gpus);
                let t = started.elapsed().as_secs_f64();
                acc.add(&Sample {
                    t,
                    phase,
                    gpus: readings.clone(),
                });
                phase = Some(p);
                acc.open(p);
                let s = Sample {
                    t,
                    phase,
                    gpus: readings,
                };
                acc.add(&s);
                write_line(&mut file, &s);
                next = Instant::now() + period;
            }
            Ok(Msg::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let readings = read(gpus);
                acc.add(&Sample {
                    t: started.elapsed().as_secs_f64(),
                    phase,
                    gpus: readings,
                });
                break;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if next + period < Instant::now() {
                    next = Instant::now();
                }
            }
        }
    }
    if let Some(mut f) = file {
        let _ = f.flush();
    }
    acc.summary(period.as_secs_f64())
}

/// Running sums over one span of a phase (from its start to the next phase).
#[derive(Default)]
struct SpanAcc {
    samples: u64,
    util_sum: f64,
    util_n: u64,
    power_sum: f64,
    power_n: u64,
    clock_sum: f64,
    clock_n: u64,
    /// Energy counter: first and last reading per GPU.
    energy_first: BTreeMap<u32, f64>,
    energy_last: BTreeMap<u32, f64>,
    /// Integrated power (trapezoids) per GPU, and the last (t, W).
    integrated: BTreeMap<u32, f64>,
    last_power: BTreeMap<u32, (f64, f64)>,
    t_first: Option<f64>,
    t_last: f64,
}

impl SpanAcc {
    fn add(&mut self, s: &Sample) {
        self.samples += 1;
        self.t_first.get_or_insert(s.t);
        self.t_last = s.t;
        for r in &s.gpus {
            if let Some(u) = r.util_pct {
                self.util_sum += f64::from(u);
                self.util_n += 1;
            }
            if let Some(c) = r.sm_clock_mhz {
                self.clock_sum += f64::from(c);
                self.clock_n += 1;
            }
            if let Some(w) = r.power_w {
                self.power_sum += w;
                self.power_n += 1;
                if let Some((t0, w0)) = self.last_power.insert(r.gpu, (s.t, w)) {
                    *self.integrated.entry(r.gpu).or_insert(0.0) += (s.t - t0) * (w + w0) / 2.0;
                }
            }
            if let Some(e) = r.energy_j {
                self.energy_first.entry(r.gpu).or_insert(e);
                self.energy_last.insert(r.gpu, e);
            }
        }
    }

    /// Energy of the span, all GPUs: the counter where every GPU has one,
    /// else integrated power.
    fn energy(&self) -> (Option<f64>, &'static str) {
        if !self.energy_last.is_empty() {
            let e = self
                .energy_last
                .iter()
                .map(|(g, e)| e - self.energy_first.get(g).copied().unwrap_or(*e))
                .sum();
            (Some(e), "energy_counter")
        } else if !self.integrated.is_empty() {
            (Some(self.integrated.values().sum()), "integrated_power")
        } else {
            (None, "none")
        }
    }
}

/// Per phase totals over its spans.
#[derive(Default)]
struct PhaseTotals {
    seconds: f64,
    samples: u64,
    util_sum: f64,
    util_n: u64,
    power_sum: f64,
    power_n: u64,
    clock_sum: f64,
    clock_n: u64,
    gpus: usize,
    energy: Option<f64>,
    source: &'static str,
}

#[derive(Default)]
struct Accumulator {
    /// Closed spans, and the open one (its phase may still be relabelled).
    closed: Vec<(Phase, SpanAcc)>,
    open: Option<(Phase, SpanAcc)>,
    peak_mem: BTreeMap<u32, u64>,
    temp_max: Option<u32>,
    samples: u64,
    cost_s: f64,
}

impl Accumulator {
    fn open(&mut self, phase: Phase) {
        if let Some(span) = self.open.take() {
            self.closed.push(span);
        }
        self.open = Some((phase, SpanAcc::default()));
    }

    fn relabel(&mut self, phase: Phase) {
        match self.open.as_mut() {
            Some((p, _)) => *p = phase,
            None => self.open(phase),
        }
    }

    fn add(&mut self, s: &Sample) {
        self.samples += 1;
        for r in &s.gpus {
            if let Some(m) = r.mem_used_bytes {
                let e = self.peak_mem.entry(r.gpu).or_insert(0);
                *e = (*e).max(m);
            }
            if let Some(t) = r.temp_c {
                self.temp_max = Some(self.temp_max.map_or(t, |m| m.max(t)));
            }
        }
        if s.phase.is_none() {
            return;
        }
        if self.open.is_none() {
            if let Some(p) = s.phase {
                self.open(p);
            }
        }
        if let Some((_, span)) = self.open.as_mut() {
            span.add(s);
        }
    }

    fn summary(&self, period_s: f64) -> Summary {
        let mut totals: BTreeMap<Phase, PhaseTotals> = BTreeMap::new();
        for (phase, span) in self.closed.iter().chain(self.open.iter()) {
            let t = totals.entry(*phase).or_default();
            t.seconds += span.t_first.map(|f| span.t_last - f).unwrap_or(0.0);
            t.samples += span.samples;
            t.util_sum += span.util_sum;
            t.util_n += span.util_n;
            t.power_sum += span.power_sum;
            t.power_n += span.power_n;
            t.clock_sum += span.clock_sum;
            t.clock_n += span.clock_n;
            t.gpus = t.gpus.max(span.last_power.len()).max(span.energy_last.len());
            let (e, source) = span.energy();
            if let Some(e) = e {
                t.energy = Some(t.energy.unwrap_or(0.0) + e);
                t.source = source;
            } else if t.source.is_empty() {
                t.source = source;
            }
        }
        let phases = totals
            .into_iter()
            .map(|(phase, t)| {
                let gpus = t.gpus.max(1) as f64;
                (
                    phase,
                    PhaseSummary {
                        seconds: t.seconds,
                        samples: t.samples,
                        util_mean_pct: (t.util_n > 0).then(|| t.util_sum / t.util_n as f64),
                        // Mean power of the GPUs together.
                        power_mean_w: (t.power_n > 0).then(|| t.power_sum / t.power_n as f64 * gpus),
                        sm_clock_mean_mhz: (t.clock_n > 0).then(|| t.clock_sum / t.clock_n as f64),
                        energy_j: t.energy,
                        energy_source: if t.source.is_empty() { "none" } else { t.source },
                    },
                )
            })
            .collect();
        Summary {
            period_s,
            samples: self.samples,
            sample_cost_us: if self.samples > 0 {
                self.cost_s / self.samples as f64 * 1e6
            } else {
                0.0
            },
            peak_memory_bytes: self.peak_mem.clone(),
            temp_max_c: self.temp_max,
            phases,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseSummary {
    pub seconds: f64,
    pub samples: u64,
    pub util_mean_pct: Option<f64>,
    pub power_mean_w: Option<f64>,
    pub sm_clock_mean_mhz: Option<f64>,
    pub energy_j: Option<f64>,
    pub energy_source: &'static str,
}

/// What the sampler saw over the whole cell.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    pub period_s: f64,
    pub samples: u64,
    /// Mean wall time of one sample of every GPU, in microseconds.
    pub sample_cost_us: f64,
    /// Peak memory used per GPU index.
    pub peak_memory_bytes: BTreeMap<u32, u64>,
    pub temp_max_c: Option<u32>,
    pub phases: BTreeMap<Phase, PhaseSummary>,
}

impl Summary {
    /// Headline metrics (`gpu_*`) for the cell, from the measured phase.
    /// `steps` and `tokens` are what the measured phase did, when known.
    pub fn metrics(&self, steps: Option<f64>, tokens: Option<f64>) -> BTreeMap<String, f64> {
        let mut m = BTreeMap::new();
        if let Some(peak) = self.peak_memory_bytes.values().max() {
            m.insert("gpu_peak_memory_bytes".into(), *peak as f64);
        }
        if let Some(t) = self.temp_max_c {
            m.insert("gpu_temp_max_c".into(), f64::from(t));
        }
        let Some(p) = self.phases.get(&Phase::Measure) else {
            return m;
        };
        if let Some(u) = p.util_mean_pct {
            m.insert("gpu_util_mean_pct".into(), u);
        }
        if let Some(w) = p.power_mean_w {
            m.insert("gpu_power_mean_w".into(), w);
        }
        if let Some(c) = p.sm_clock_mean_mhz {
            m.insert("gpu_sm_clock_mean_mhz".into(), c);
        }
        if let Some(e) = p.energy_j {
            m.insert("gpu_energy_j".into(), e);
            if let Some(s) = steps.filter(|s| *s > 0.0) {
                m.insert("gpu_energy_per_step_j".into(), e / s);
            }
            if let Some(t) = tokens.filter(|t| *t > 0.0) {
                m.insert("gpu_energy_per_token_j".into(), e / t);
            }
        }
        if p.seconds > 0.0 && self.period_s > 0.0 {
            // Share of one CPU core that sampling takes (the sampler's own
            // thread; its effect on a step is measured by scripts/bench-gpu.sh).
            let share = (self.sample_cost_us / 1e6) / self.period_s * 100.0;
            m.insert("telemetry_cpu_pct".into(), share);
        }
        m
    }

    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn names_match_whole_words_and_memory() {
        assert!(gpu_matches("H100", "NVIDIA H100 80GB HBM3", 85 * GB));
        assert!(gpu_matches("H100", "NVIDIA H100 PCIe", 85 * GB));
        assert!(!gpu_matches("H200", "NVIDIA H100 80GB HBM3", 85 * GB));
        assert!(gpu_matches("L4", "NVIDIA L4", 24 * GB));
        assert!(!gpu_matches("L4", "NVIDIA L40S", 48 * GB));
        assert!(gpu_matches("A100-80GB", "NVIDIA A100-SXM4-80GB", 85 * GB));
        assert!(!gpu_matches("A100-80GB", "NVIDIA A100-SXM4-40GB", 42 * GB));
        assert!(gpu_matches("A100-40GB", "NVIDIA A100-PCIE-40GB", 42 * GB));
        assert!(gpu_matches("A100", "NVIDIA A100-SXM4-40GB", 42 * GB));
        assert!(gpu_matches("T4", "Tesla T4", 16 * GB));
        assert!(!gpu_matches("A10G", "NVIDIA A100-SXM4-40GB", 42 * GB));
        assert!(gpu_matches("A10G", "NVIDIA A10G", 24 * GB));
    }

    fn hw(names: &[&str]) -> Hardware {
        Hardware {
            gpus: names
                .iter()
                .enumerate()
                .map(|(i, n)| GpuInfo {
                    index: i as u32,
                    name: n.to_string(),
                    memory_bytes: 85 * GB,
                    ..GpuInfo::default()
                })
                .collect(),
            ..Hardware::default()
        }
    }

    #[test]
    fn mismatch_names_count_and_model() {
        let one = hw(&["NVIDIA H100 80GB HBM3"]);
        assert_eq!(mismatch("H100", &one), None);
        assert_eq!(mismatch("none", &one), None);
        let m = mismatch("H100:8", &one).unwrap();
        assert!(
            m.contains("asked for `H100:8`") && m.contains("1 x `NVIDIA H100 80GB HBM3`"),
            "{m}"
        );
        assert!(mismatch("A100-80GB", &one).is_some());
        let m = mismatch("H100", &hw(&[])).unwrap();
        assert!(m.contains("no GPU"), "{m}");
        assert_eq!(mismatch("none", &hw(&[])), None);
    }

    #[test]
    fn energy_per_phase_from_counter_edges() {
        let mut acc = Accumulator::default();
        let reading = |e: f64, util: u32| Reading {
            gpu: 0,
            util_pct: Some(util),
            mem_util_pct: None,
            mem_used_bytes: Some(1000),
            power_w: Some(700.0),
            sm_clock_mhz: Some(1980),
            temp_c: Some(50),
            energy_j: Some(e),
        };
        let sample = |t: f64, e: f64, util: u32, phase: Phase| Sample {
            t,
            phase: Some(phase),
            gpus: vec![reading(e, util)],
        };
        acc.open(Phase::Warmup);
        acc.add(&sample(0.0, 100.0, 10, Phase::Warmup));
        // The edge reading closes warm-up and opens the measured phase.
        acc.add(&sample(1.0, 400.0, 10, Phase::Warmup));
        acc.open(Phase::Measure);
        for (t, e) in [(1.0, 400.0), (2.0, 1100.0), (3.0, 1800.0)] {
            acc.add(&sample(t, e, 90, Phase::Measure));
        }
        let s = acc.summary(0.1);
        let m = s.metrics(Some(10.0), None);
        assert_eq!(m["gpu_energy_j"], 1400.0);
        assert_eq!(m["gpu_energy_per_step_j"], 140.0);
        assert_eq!(m["gpu_util_mean_pct"], 90.0);
        assert_eq!(m["gpu_power_mean_w"], 700.0);
        assert_eq!(m["gpu_peak_memory_bytes"], 1000.0);
        assert_eq!(s.phases[&Phase::Measure].energy_source, "energy_counter");
        assert_eq!(s.phases[&Phase::Measure].seconds, 2.0);
        assert_eq!(s.phases[&Phase::Warmup].energy_j, Some(300.0));
    }

    #[test]
    fn a_relabelled_span_leaves_the_measured_phase() {
        // A command starts in `measure`; its first `ORCH_PHASE warmup` line
        // renames what ran so far (imports, model build) to `start`.
        let mut acc = Accumulator::default();
        let sample = |t: f64, e: f64, phase: Phase| Sample {
            t,
            phase: Some(phase),
            gpus: vec![Reading {
                gpu: 0,
                util_pct: Some(if phase == Phase::Measure { 95 } else { 5 }),
                mem_util_pct: None,
                mem_used_bytes: None,
                power_w: None,
                sm_clock_mhz: None,
                temp_c: None,
                energy_j: Some(e),
            }],
        };
        acc.open(Phase::Measure);
        acc.add(&sample(0.0, 0.0, Phase::Measure));
        acc.add(&sample(10.0, 1000.0, Phase::Measure));
        acc.relabel(Phase::Start);
        acc.add(&sample(12.0, 1200.0, Phase::Start));
        acc.open(Phase::Measure);
        acc.add(&sample(12.0, 1200.0, Phase::Measure));
        acc.add(&sample(14.0, 2600.0, Phase::Measure));
        let s = acc.summary(0.1);
        assert_eq!(s.phases[&Phase::Start].energy_j, Some(1200.0));
        assert_eq!(s.phases[&Phase::Start].seconds, 12.0);
        let m = s.metrics(Some(2.0), Some(1400.0));
        assert_eq!(m["gpu_energy_j"], 1400.0);
        assert_eq!(m["gpu_energy_per_step_j"], 700.0);
        assert_eq!(m["gpu_energy_per_token_j"], 1.0);
        assert_eq!(m["gpu_util_mean_pct"], 95.0);
    }

    #[test]
    fn integrated_power_without_counter() {
        let mut acc = Accumulator::default();
        acc.open(Phase::Measure);
        for t in [0.0, 1.0, 2.0] {
            acc.add(&Sample {
                t,
                phase: Some(Phase::Measure),
                gpus: vec![Reading {
                    gpu: 0,
                    util_pct: None,
                    mem_util_pct: None,
                    mem_used_bytes: None,
                    power_w: Some(300.0),
                    sm_clock_mhz: None,
                    temp_c: None,
                    energy_j: None,
                }],
            });
        }
        let s = acc.summary(0.1);
        assert_eq!(s.phases[&Phase::Measure].energy_j, Some(600.0));
        assert_eq!(s.phases[&Phase::Measure].energy_source, "integrated_power");
    }

    #[test]
    fn cpu_only_host_is_a_note_not_an_error() {
        // On a machine without NVIDIA's driver NVML cannot load: the host is
        // recorded with its CPUs and a note. (With a driver, GPUs are listed.)
        let (gpus, hw, probe) = detect();
        match gpus {
            None => {
                assert!(hw.gpu_note.as_deref().unwrap_or("").contains("NVML"));
                assert!(probe.nvml_error.is_some());
                if probe.source == "none" {
                    assert!(hw.gpus.is_empty());
                }
            }
            Some(g) => {
                assert_eq!(hw.gpus.len(), g.count());
                assert_eq!(probe.source, "nvml");
            }
        }
        assert!(hw.cpus >= 1);
        assert!(hw.memory_bytes > 0);
        let mut info = BTreeMap::new();
        probe.record(&mut info);
        assert_eq!(info["gpu_source"], json!(probe.source));
        assert_eq!(info["agent"]["linkage"], json!(crate::launch::LINKAGE));
    }

    #[test]
    fn nvidia_smi_output_names_the_gpus() {
        let out = "0, GPU-aaaa-0, 81559, 00000000:18:00.0, 700.00, 580.95.05, 9.0, NVIDIA H100 80GB HBM3\n\
                   1, GPU-bbbb-1, 81559, 00000000:2A:00.0, [N/A], 580.95.05, 9.0, NVIDIA H100, 80GB, HBM3\n";
        let found = parse_nvidia_smi(out, true);
        assert_eq!(found.gpus.len(), 2);
        assert_eq!(found.driver_version.as_deref(), Some("580.95.05"));
        let g = &found.gpus[1];
        // A comma in a name stays in the name.
        assert_eq!(
            (g.index, g.name.as_str(), g.uuid.as_str()),
            (1, "NVIDIA H100, 80GB, HBM3", "GPU-bbbb-1")
        );
        assert_eq!(g.memory_bytes, 81559 * 1024 * 1024);
        assert_eq!(g.power_limit_w, None);
        assert_eq!(found.gpus[0].power_limit_w, Some(700.0));
        assert_eq!(found.gpus[0].compute_capability.as_deref(), Some("9.0"));
        // Without `compute_cap` (drivers before 510).
        let old = parse_nvidia_smi(
            "0, GPU-cccc, 15360, 00000000:00:04.0, 70.00, 470.82.01, Tesla T4\n",
            false,
        );
        assert_eq!(old.gpus[0].compute_capability, None);
        assert!(gpu_matches("T4", &old.gpus[0].name, old.gpus[0].memory_bytes));
    }

    #[test]
    fn procfs_names_the_gpus_whose_device_node_is_here() {
        let dir = tempfile::tempdir().unwrap();
        let proc_nv = dir.path().join("proc");
        let dev = dir.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        for (bus, minor, uuid) in [
            ("0000:2a:00.0", 1, "GPU-2222"),
            ("0000:18:00.0", 0, "GPU-1111"),
            ("0000:3b:00.0", 2, "GPU-3333"),
        ] {
            let d = proc_nv.join("gpus").join(bus);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\nGPU UUID: \t\t {uuid}\nVideo BIOS: \t\t ??.??.??.??.??\nBus Type: \t\t PCIe\nDMA Size: \t\t 52 bits\nDevice Minor: \t {minor}\nBus Location: \t {bus}\n"),
            )
            .unwrap();
        }
        std::fs::write(
            proc_nv.join("version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        // This container got GPUs 0 and 1 only.
        std::fs::write(dev.join("nvidia0"), "").unwrap();
        std::fs::write(dev.join("nvidia1"), "").unwrap();
        std::fs::write(dev.join("nvidiactl"), "").unwrap();
        let found = from_procfs(&proc_nv, &dev).unwrap();
        assert_eq!(found.source, "procfs");
        assert_eq!(found.driver_version.as_deref(), Some("580.95.05"));
        let uuids: Vec<&str> = found.gpus.iter().map(|g| g.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-1111", "GPU-2222"]);
        assert_eq!(found.gpus[1].index, 1);
        assert_eq!(found.gpus[0].name, "NVIDIA H100 80GB HBM3");
        // Device nodes alone: counted, not named; no model mismatch claimed.
        let nodes = from_device_nodes(&dev).unwrap();
        assert_eq!(nodes.gpus.len(), 2);
        let hw = Hardware {
            gpus: nodes.gpus,
            ..Hardware::default()
        };
        assert_eq!(mismatch("H100:2", &hw), None);
        let m = mismatch("H100:4", &hw).unwrap();
        assert!(m.contains("2 x `unidentified NVIDIA GPU`"), "{m}");
        assert!(from_device_nodes(&dir.path().join("nothing")).is_none());
    }

    #[test]
    fn visible_devices_narrow_by_index_or_uuid() {
        let uuids = ["GPU-aa11", "GPU-bb22", "GPU-cc33"];
        let uuid_of = |i: usize| Some(uuids[i].to_string());
        assert_eq!(visible_positions(3, uuid_of, None), [0, 1, 2]);
        assert_eq!(visible_positions(3, uuid_of, Some("2,0")), [2, 0]);
        assert_eq!(visible_positions(3, uuid_of, Some("GPU-bb,GPU-cc33")), [1, 2]);
        // CUDA stops at the first invalid entry.
        assert_eq!(visible_positions(3, uuid_of, Some("1,7,0")), [1]);
        assert!(visible_positions(3, uuid_of, Some("")).is_empty());
        // A UUID that no GPU has: CUDA sees none from there on.
        assert_eq!(visible_positions(3, uuid_of, Some("0,GPU-ffff")), [0]);
        // A MIG instance, or GPUs without known UUIDs: counted, not lost.
        assert_eq!(visible_positions(3, uuid_of, Some("MIG-1234")), [0]);
        let unknown = |_: usize| Some(String::new());
        assert_eq!(
            visible_positions(2, unknown, Some("GPU-aa11,GPU-bb22,GPU-cc33")),
            [0, 1]
        );
    }
}
