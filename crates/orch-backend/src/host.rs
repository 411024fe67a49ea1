//! Each backend's host side: what the commands need of a backend besides
//! running cells. `orch run`, `setup`, `plan`, `down` and `cost` are one
//! script each over [`Host`]; a backend implements it in its own crate, and
//! the CLI registers it in one line (its `hosts.rs`).
//!
//! - [`Kind`]: the backends by name (`--backend`);
//! - [`Weights`]: where cells find the model weights, as a typed place (a
//!   folder, Docker's volume, a PVC, a Modal volume), never a made-up path;
//! - [`ModelCheck`]: a suite's models against that place (`orch plan`, the
//!   preflight of `orch run`);
//! - [`Host::setup`]: where `orch setup` downloads (here, into a folder; or
//!   in a Job, a sandbox or a batch job, which it runs);
//! - [`Host::down`], [`Host::dry_run`], prices ([`Host::price_partition`]),
//!   who assigns GPUs ([`Host::shares_host_gpus`]), multi-node cells
//!   ([`Host::max_nodes`]), how many cells run at once by default
//!   ([`Host::default_jobs`], [`DefaultJobs`]), a comparison's checkouts kept
//!   installed across cells and runs ([`Host::install_cache`]);
//! - [`Host::doctor`]: what `orch doctor` checks of a backend ([`Check`]:
//!   ok, warn, fail or skipped, with the next step), cheaply and spending nothing.

use crate::{Backend, BackendError, LocalBackend};
use async_trait::async_trait;
use orch_hub::safetensors::{fit, Fit};
use orch_hub::{ModelRequest, RepoCache};
use orch_manifest::{GpuSpec, Plan};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The backends, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Local,
    Docker,
    Kubernetes,
    Modal,
    Slurm,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Local,
        Kind::Docker,
        Kind::Kubernetes,
        Kind::Modal,
        Kind::Slurm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::Docker => "docker",
            Kind::Kubernetes => "kubernetes",
            Kind::Modal => "modal",
            Kind::Slurm => "slurm",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Kind {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Kind, BackendError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| BackendError::Unknown(s.to_string()))
    }
}

/// Where the cells of a backend find the model weights (a hub cache).
#[derive(Debug, Clone, PartialEq)]
pub enum Weights {
    /// A folder of this host, or of the filesystem a cluster shares.
    Folder(PathBuf),
    /// Docker's named volume, and its folder on this host once it exists.
    DockerVolume { name: String, dir: Option<PathBuf> },
    /// A PersistentVolumeClaim of the cluster (`None`: the suite names
    /// none), in the namespace the flag or the suite names (`None`: the
    /// kubeconfig context's).
    Pvc {
        name: Option<String>,
        namespace: Option<String>,
    },
    /// A Modal volume.
    ModalVolume(String),
}

impl Weights {
    /// The folder on this host, where there is one.
    pub fn folder(&self) -> Option<&Path> {
        match self {
            Weights::Folder(p) => Some(p),
            Weights::DockerVolume { dir, .. } => dir.as_deref(),
            Weights::Pvc { .. } | Weights::ModalVolume(_) => None,
        }
    }
}

impl std::fmt::Display for Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Weights::Folder(p) => write!(f, "{}", p.display()),
            Weights::DockerVolume { name, dir: Some(d) } => {
                write!(f, "docker volume `{name}` ({})", d.display())
            }
            Weights::DockerVolume { name, dir: None } => write!(f, "docker volume `{name}` (not made yet)"),
            Weights::Pvc { name, namespace } => {
                match name {
                    Some(n) => write!(f, "PVC `{n}`")?,
                    None => f.write_str("no weights PVC")?,
                }
                match namespace {
                    Some(ns) => write!(f, " in namespace `{ns}`"),
                    None => f.write_str(" in the kubeconfig context's namespace"),
                }
            }
            Weights::ModalVolume(v) => write!(f, "modal volume `{v}`"),
        }
    }
}

/// One model of a suite against the weights place.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelCheck {
    pub repo: String,
    pub revision: String,
    /// Every file of the pinned revision is there.
    pub complete: bool,
    pub commit: Option<String>,
    pub bytes: Option<u64>,
    /// Parameters and bytes from the safetensors headers (a folder only).
    pub params: Option<u64>,
    pub weights_bytes: Option<u64>,
    pub fit: Vec<FitCheck>,
}

impl ModelCheck {
    /// A check that only knows the commit (a remote place).
    pub fn remote(request: ModelRequest, commit: Option<String>) -> ModelCheck {
        ModelCheck {
            repo: request.repo,
            revision: request.revision,
            complete: commit.is_some(),
            commit,
            bytes: None,
            params: None,
            weights_bytes: None,
            fit: vec![],
        }
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct FitCheck {
    pub gpu: String,
    pub fits: bool,
    /// The smallest count of this GPU type that fits, when `gpu` does not.
    pub needs: Option<String>,
}

/// The flags of a command that pick where and how (`--weights-dir`,
/// `--context`, `--namespace`, `--keep`).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub weights_dir: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: Option<String>,
    pub keep: bool,
}

/// `orch setup`: what to download.
#[derive(Debug, Clone)]
pub struct SetupRequest {
    /// The suite, when one was given (remote setups ship it: it keeps each
    /// model's include/exclude patterns).
    pub file: Option<PathBuf>,
    /// The `--model` specs, as given.
    pub models: Vec<String>,
    /// Every model: the suite's and the `--model` ones.
    pub requests: Vec<ModelRequest>,
    pub connections: usize,
    pub json: bool,
    /// `--as-job`: download from a batch job (slurm).
    pub as_job: bool,
}

/// Where `orch setup` ran.
#[derive(Debug, Clone, PartialEq)]
pub enum SetupPlace {
    /// Download here, into this folder (the caller shows the progress).
    Here(PathBuf),
    /// It ran elsewhere (a Job, a sandbox, a batch job): its exit code.
    Ran(i32),
}

/// Output of a remote setup, as it comes (lines end with their `\n`): for
/// stdout (`true`) or stderr.
pub type OnLine<'a> = &'a (dyn Fn(bool, &str) + Send + Sync);

/// Each cell's image (container backends), by cell id.
pub type Images = BTreeMap<String, String>;

/// How one check of `orch doctor` came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
    /// Not configured here: nothing to check.
    Skipped,
}

impl CheckStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Ok => "ok",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
            CheckStatus::Skipped => "skipped",
        }
    }
}

/// One check of `orch doctor`: what was looked at, what was found, and
/// the one thing to do next (none when all is well).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Check {
    /// What was checked (`engine`, `rbac`, `gpu nodes`).
    pub name: String,
    pub status: CheckStatus,
    /// What was found, in one line.
    pub detail: String,
    /// The one action that fixes or completes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

impl Check {
    pub fn new(name: &str, status: CheckStatus, detail: impl Into<String>) -> Check {
        Check {
            name: name.to_string(),
            status,
            detail: detail.into(),
            next: None,
        }
    }
    pub fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, CheckStatus::Ok, detail)
    }
    pub fn warn(name: &str, detail: impl Into<String>, next: impl Into<String>) -> Check {
        Check::new(name, CheckStatus::Warn, detail).with_next(next)
    }
    pub fn fail(name: &str, detail: impl Into<String>, next: impl Into<String>) -> Check {
        Check::new(name, CheckStatus::Fail, detail).with_next(next)
    }
    pub fn skipped(name: &str, detail: impl Into<String>, next: impl Into<String>) -> Check {
        Check::new(name, CheckStatus::Skipped, detail).with_next(next)
    }
    pub fn with_next(mut self, next: impl Into<String>) -> Check {
        self.next = Some(next.into());
        self
    }
}

/// The static agent for containers, as `orch doctor` sees it (the backends
/// that ship it: docker, kubernetes, modal).
pub fn static_agent_check() -> Check {
    match crate::find_static_agent() {
        Ok(p) => Check::ok("static agent", format!("`{}`", p.display())),
        Err(e) => Check::fail(
            "static agent",
            first_line(&e.to_string()),
            "install orch from its wheel or release archive (they carry `orch-agent-static`), run `bash scripts/prepare-docker.sh` in a checkout, or set `ORCH_AGENT_STATIC`",
        ),
    }
}

/// The first line of an error's text (its `hint:` goes to `next`).
pub fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}

/// How many cells a backend runs at once when neither `--jobs` nor the
/// suite's `concurrency` says, and why, in words (`orch plan` shows both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultJobs {
    pub jobs: usize,
    pub why: String,
}

impl DefaultJobs {
    pub fn new(jobs: usize, why: impl Into<String>) -> DefaultJobs {
        DefaultJobs {
            jobs: jobs.max(1),
            why: why.into(),
        }
    }
}

/// The default of backends whose cells share this host's GPUs (local,
/// docker): one cell per set of GPUs the largest cell asks for, when every
/// cell asks for GPUs and the host's are known; else one at a time, so
/// that CPU cells' timings stay apart.
pub fn gpu_sets_default(plan: &Plan, host_gpus: Option<usize>) -> DefaultJobs {
    let gpu_cells = !plan.cells.is_empty() && plan.cells.iter().all(|c| !c.gpu.is_cpu());
    match host_gpus {
        Some(n) if gpu_cells && n > 0 => {
            let widest = plan
                .cells
                .iter()
                .map(|c| c.gpu.count as usize)
                .max()
                .unwrap_or(1)
                .max(1);
            DefaultJobs::new(n / widest, format!("one per {widest} of this host's {n} GPU(s)"))
        }
        _ if gpu_cells => DefaultJobs::new(1, "this host's GPUs are unknown"),
        _ => DefaultJobs::new(1, "CPU cells run one at a time, so their timings stay apart"),
    }
}

/// A backend's host side.
#[async_trait]
pub trait Host: Send + Sync {
    fn kind(&self) -> Kind;

    /// Where cells find the weights; `create`: make the place when it can be
    /// made here (Docker's volume, for `orch setup`).
    async fn weights(&self, plan: Option<&Plan>, create: bool) -> Result<Weights, BackendError>;

    /// The suite's models against the weights place.
    async fn check_models(&self, plan: &Plan, weights: &Weights) -> Result<Vec<ModelCheck>, BackendError> {
        Ok(match weights.folder() {
            Some(dir) => check_folder(plan, dir),
            None => model_requests(plan)
                .into_iter()
                .map(|r| ModelCheck::remote(r, None))
                .collect(),
        })
    }

    /// The backend that runs the cells of `plan`, checked (`preflight`), and
    /// each cell's image.
    async fn backend(&self, plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError>;

    /// `orch setup`: download here (the place's folder) or run it elsewhere.
    async fn setup(
        &self,
        req: &SetupRequest,
        plan: Option<&Plan>,
        on_line: OnLine<'_>,
    ) -> Result<SetupPlace, BackendError> {
        let _ = on_line;
        if req.as_job {
            return Err(BackendError::User(
                "`--as-job` needs `--backend slurm`\nhint: other backends download from this machine".into(),
            ));
        }
        match self.weights(plan, true).await? {
            Weights::Folder(dir) => Ok(SetupPlace::Here(dir)),
            Weights::DockerVolume { dir: Some(dir), .. } => Ok(SetupPlace::Here(dir)),
            other => Err(BackendError::User(format!(
                "`orch setup --backend {}` cannot write {other}\nhint: set up the weights where the cells run",
                self.kind()
            ))),
        }
    }

    /// `orch down RUN`: remove whatever the run left; what was done, in words.
    async fn down(&self, run_id: &str, plan: &Plan) -> Result<String, BackendError>;

    /// `orch run --dry-run`: what would be applied and what would travel
    /// with the cells, as text; nothing is sent.
    fn dry_run(&self, plan: &Plan, files: &orch_files::Files) -> Result<String, BackendError> {
        let mut out = format!(
            "# orch run --backend {} --dry-run: {} cell(s) of suite `{}`; nothing is sent\n",
            self.kind(),
            plan.cells.len(),
            plan.suite
        );
        if self.kind() == Kind::Local {
            out.push_str("# cells run on this machine, where their files are: no files travel\n");
        } else {
            out.push_str(&files_listing(plan, files, orch_files::CELL_ROOT)?);
        }
        Ok(out)
    }

    /// Do the cells share this host's GPUs (the runner then assigns them)?
    /// Elsewhere the platform assigns GPUs to each cell.
    fn shares_host_gpus(&self) -> bool {
        false
    }

    /// The most nodes one cell may have.
    fn max_nodes(&self) -> u32 {
        1
    }

    /// Cells at once when neither `--jobs` nor the suite's `concurrency`
    /// says; `host_gpus`: this host's GPUs, where the cells share them.
    async fn default_jobs(&self, plan: &Plan, host_gpus: Option<usize>) -> DefaultJobs {
        gpu_sets_default(plan, host_gpus)
    }

    /// Where a comparison's checkouts, once installed, are kept for later
    /// cells and runs (`orch bisect`'s steps, a campaign's tasks): a folder
    /// the cells reach, when they run on this host. `None`: each cell
    /// installs its own.
    fn install_cache(&self) -> Option<PathBuf> {
        None
    }

    /// The price list's partition for the suite's cells, where prices are
    /// per partition (slurm).
    fn price_partition<'p>(&self, _plan: &'p Plan) -> Option<&'p str> {
        None
    }

    /// `orch doctor`: what is configured for this backend, what works and
    /// what to do next, checked for real but cheaply (reads, no cell, no
    /// spend); the suite, when one was given, narrows what is asked. A
    /// backend with nothing configured here answers `skipped` checks.
    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        let _ = plan;
        Vec::new()
    }
}

/// The image a remote `orch setup` runs in by default (the static `orch`
/// needs nothing of it; a shell is handy).
pub const DEFAULT_SETUP_IMAGE: &str = "python:3.11-slim";

/// The argv of `orch setup` run elsewhere (a Job, a sandbox): the suite at
/// `suite` (where the remote side finds it), the `--model` specs, into
/// `weights_dir`.
pub fn setup_argv(req: &SetupRequest, suite: Option<&str>, weights_dir: &str) -> Vec<String> {
    let mut argv: Vec<String> = vec!["setup".into()];
    if let Some(s) = suite {
        argv.extend(["-f".into(), s.to_string()]);
    }
    for m in &req.models {
        argv.extend(["--model".into(), m.clone()]);
    }
    argv.extend([
        "--weights-dir".into(),
        weights_dir.to_string(),
        "--connections".into(),
        req.connections.to_string(),
    ]);
    if req.json {
        argv.push("--json".into());
    }
    argv
}

/// The models a suite names, as setup requests.
pub fn model_requests(plan: &Plan) -> Vec<ModelRequest> {
    plan.models
        .iter()
        .map(|m| ModelRequest {
            repo: m.repo.clone(),
            revision: m.revision.clone().unwrap_or_else(|| "main".into()),
            include: m.include.clone(),
            exclude: m.exclude.clone(),
            repo_type: m.repo_type.clone().unwrap_or_else(|| "model".into()),
        })
        .collect()
}

/// Every model of the plan against a weights folder (offline): complete?,
/// size, parameters, and whether it fits each GPU the plan asks for.
pub fn check_folder(plan: &Plan, weights_dir: &Path) -> Vec<ModelCheck> {
    let gpus: BTreeSet<String> = plan
        .cells
        .iter()
        .filter(|c| !c.gpu.is_cpu())
        .map(|c| c.gpu.to_string())
        .collect();
    model_requests(plan)
        .into_iter()
        .map(|req| {
            let cache = RepoCache::new(weights_dir, &req.repo, &req.repo_type);
            let marker = cache.complete(&req.revision);
            let (params, weights) = match &marker {
                Some(m) => match orch_hub::safetensors::weights_in_dir(&cache.snapshot_dir(&m.commit)) {
                    Ok((p, b, n)) if n > 0 => (Some(p), Some(b)),
                    _ => (None, None),
                },
                None => (None, None),
            };
            let fit = match weights {
                Some(bytes) => gpus
                    .iter()
                    .filter_map(|g| GpuSpec::parse(g).ok())
                    .filter_map(|g| g.gpu.map(|t| (g, t)))
                    .map(|(g, t)| fit_check(bytes, &g, &t))
                    .collect(),
                None => vec![],
            };
            ModelCheck {
                repo: req.repo,
                revision: req.revision,
                complete: marker.is_some(),
                commit: marker.as_ref().map(|m| m.commit.clone()),
                bytes: marker.as_ref().map(|m| m.files.iter().map(|f| f.1).sum()),
                params,
                weights_bytes: weights,
                fit,
            }
        })
        .collect()
}

fn fit_check(bytes: u64, g: &GpuSpec, t: &orch_manifest::gpu::GpuType) -> FitCheck {
    let max = orch_manifest::gpu::MAX_GPUS_PER_CELL;
    let f = fit(bytes, t.memory_gib, g.count, max);
    FitCheck {
        gpu: g.to_string(),
        fits: f == Fit::Fits,
        needs: match f {
            Fit::Fits => None,
            Fit::NeedsCount(n) => Some(format!("{}:{n}", t.name)),
            Fit::TooLarge => Some(format!("more than {max} x {}", t.name)),
        },
    }
}

/// The local backend's host side: cells are child processes of `orch`; the
/// weights are a folder (`--weights-dir`, else the default hub cache).
pub struct LocalHost {
    pub flags: Flags,
}

#[async_trait]
impl Host for LocalHost {
    fn kind(&self) -> Kind {
        Kind::Local
    }

    async fn weights(&self, _plan: Option<&Plan>, _create: bool) -> Result<Weights, BackendError> {
        Ok(Weights::Folder(
            self.flags
                .weights_dir
                .clone()
                .unwrap_or_else(orch_hub::default_weights_dir),
        ))
    }

    async fn backend(&self, _plan: &Plan) -> Result<(Arc<dyn Backend>, Images), BackendError> {
        let agent = crate::local::AgentCommand::from_env_or_self(&["agent"])?;
        let local = LocalBackend::new(agent);
        local.preflight().await?;
        Ok((Arc::new(local), Images::new()))
    }

    async fn down(&self, run_id: &str, _plan: &Plan) -> Result<String, BackendError> {
        Ok(format!(
            "run {run_id} used backend `local`: nothing outlives its cells there"
        ))
    }

    fn shares_host_gpus(&self) -> bool {
        true
    }

    fn install_cache(&self) -> Option<PathBuf> {
        Some(orch_files::default_cache_dir().join("checkouts"))
    }

    async fn doctor(&self, plan: Option<&Plan>) -> Vec<Check> {
        let mut out = Vec::new();
        out.push(match crate::local::AgentCommand::from_env_or_self(&["agent"]) {
            Ok(_) => Check::ok("agent", "the agent built into `orch` (cells are child processes)"),
            Err(e) => Check::fail(
                "agent",
                first_line(&e.to_string()),
                "reinstall orch, or set `ORCH_AGENT` to an `orch-agent` binary",
            ),
        });
        let dir = self
            .flags
            .weights_dir
            .clone()
            .unwrap_or_else(orch_hub::default_weights_dir);
        out.push(weights_folder_check(&dir));
        if let Some(plan) = plan {
            let checks = check_folder(plan, &dir);
            let missing: Vec<String> = checks
                .iter()
                .filter(|c| !c.complete)
                .map(|c| format!("{}@{}", c.repo, c.revision))
                .collect();
            if !checks.is_empty() && missing.is_empty() {
                out.push(Check::ok(
                    "models",
                    format!("{} model(s) of the suite set up", checks.len()),
                ));
            } else if !missing.is_empty() {
                out.push(Check::warn(
                    "models",
                    format!("not set up: {}", missing.join(", ")),
                    format!("`orch setup -f {}`", plan.manifest.display()),
                ));
            }
        }
        out
    }
}

/// A weights folder: there and writable, or makeable.
pub fn weights_folder_check(dir: &Path) -> Check {
    if dir.is_dir() {
        let probe = dir.join(format!(".orch-doctor-{}", std::process::id()));
        match std::fs::write(&probe, b"") {
            Ok(()) => {
                let _ = std::fs::remove_file(&probe);
                Check::ok("weights", format!("`{}` (writable)", dir.display()))
            }
            Err(e) => Check::warn(
                "weights",
                format!("`{}` is not writable: {e}", dir.display()),
                "pass `--weights-dir DIR` (or `ORCH_WEIGHTS_DIR`) to a folder you can write",
            ),
        }
    } else {
        Check::ok(
            "weights",
            format!("`{}` (made by the first `orch setup`)", dir.display()),
        )
    }
}

/// What travels with the cells of `plan` (`--dry-run`): each distinct set
/// of files once, with the cells it goes with, its files, sizes and digests.
pub fn files_listing(plan: &Plan, files: &orch_files::Files, root: &str) -> Result<String, BackendError> {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for c in &plan.cells {
        let listing = files
            .shipment(&c.task)
            .map_err(|e| files_error(&e))?
            .listing(root);
        match groups.iter_mut().find(|(l, _)| *l == listing) {
            Some((_, cells)) => cells.push(c.id.clone()),
            None => groups.push((listing, vec![c.id.clone()])),
        }
    }
    let mut out = String::new();
    for (listing, cells) in groups {
        if listing.starts_with("  0 files") {
            out.push_str(&format!("# no files travel with {}\n", cells.join(", ")));
            continue;
        }
        out.push_str(&format!(
            "# files that travel with {} (under `{root}`):\n",
            cells.join(", ")
        ));
        for line in listing.lines() {
            out.push_str(&format!("#{line}\n"));
        }
    }
    Ok(out)
}

/// A [`orch_files::FilesError`] as a backend error: the user's (exit 2) or
/// this machine's.
pub fn files_error(e: &orch_files::FilesError) -> BackendError {
    if e.is_user() {
        BackendError::User(e.to_string())
    } else {
        BackendError::Io {
            action: "stage the cell's files".into(),
            source: std::io::Error::other(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_name_and_others_are_refused_with_the_list() {
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>().unwrap(), k);
        }
        let e = "lambda".parse::<Kind>().unwrap_err();
        assert!(e.is_user_error());
        assert!(
            e.to_string()
                .contains("local, docker, kubernetes, modal and slurm"),
            "{e}"
        );
    }

    #[test]
    fn checks_serialize_with_their_status_and_next_step() {
        let c = serde_json::to_value(Check::fail(
            "rbac",
            "not granted: `get` on `pods`",
            "apply the Role",
        ))
        .unwrap();
        assert_eq!(
            c,
            serde_json::json!({"name": "rbac", "status": "fail", "detail": "not granted: `get` on `pods`", "next": "apply the Role"})
        );
        let c = serde_json::to_value(Check::ok("engine", "Docker 27")).unwrap();
        assert_eq!(c["status"], "ok");
        assert!(c.get("next").is_none(), "{c}");
        assert_eq!(CheckStatus::Skipped.as_str(), "skipped");
    }

    #[test]
    fn gpu_cells_default_to_one_per_gpu_set_and_cpu_cells_to_one() {
        let plan = |gpus: &str| {
            let dir = tempfile::tempdir().unwrap();
            let m = dir.path().join("s.yaml");
            std::fs::write(
                &m,
                format!(
                    "name: s\ngpus: [{gpus}]\nbenchmarks:\n  - name: a\n    workload: {{shell: 'true'}}\n"
                ),
            )
            .unwrap();
            orch_manifest::load(&m, &Default::default()).unwrap()
        };
        assert_eq!(gpu_sets_default(&plan("\"H100:2\", \"H100:1\""), Some(8)).jobs, 4);
        assert_eq!(gpu_sets_default(&plan("\"H100:2\""), None).jobs, 1);
        assert_eq!(gpu_sets_default(&plan("\"H100:8\""), Some(4)).jobs, 1);
        let d = gpu_sets_default(&plan("\"none\""), Some(8));
        assert_eq!(d.jobs, 1);
        assert!(d.why.contains("CPU"), "{}", d.why);
    }

    #[test]
    fn a_weights_folder_is_checked_writable() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(weights_folder_check(tmp.path()).status, CheckStatus::Ok);
        let later = weights_folder_check(&tmp.path().join("not-yet"));
        assert_eq!(later.status, CheckStatus::Ok);
        assert!(
            later.detail.contains("made by the first `orch setup`"),
            "{}",
            later.detail
        );
    }

    #[test]
    fn weights_places_say_where_they_are() {
        let w = Weights::Pvc {
            name: Some("weights".into()),
            namespace: Some("ml".into()),
        };
        assert_eq!(w.to_string(), "PVC `weights` in namespace `ml`");
        assert_eq!(w.folder(), None);
        assert_eq!(Weights::Folder("/w".into()).folder(), Some(Path::new("/w")));
    }
}
