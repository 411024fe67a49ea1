//! Expansion of a suite into a plan: one [`CellPlan`] per (benchmark, GPU,
//! parameter combination), each with a stable id and a ready [`TaskSpec`].

use crate::error::{ManifestError, Pos};
use crate::gpu::GpuSpec;
use crate::k8s;
use crate::suite::{
    Benchmark, ImageDef, KubernetesDef, KubernetesSection, MeasureDef, ModelRef, SlurmDef, Suite, SyncDef,
    WorkloadDef,
};
use orch_protocol::{
    BuiltinWorkload, Client, CommandWorkload, CompareWorkload, LoadGen, LogLimits, Measure, OutputCheck,
    Readiness, ServerWorkload, TaskSpec, TransformerConfig, Variant, Workload, PROTOCOL_VERSION,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_saphyr::Spanned;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod backends;
mod compare;
mod matrix;
mod template;
use backends::*;
use compare::*;
pub use matrix::cell_id;
use matrix::*;
use template::*;

/// Defaults when neither the suite nor the benchmark sets a value.
pub const DEFAULT_WARMUP: u32 = 3;
pub const DEFAULT_REPETITIONS: u32 = 10;
pub const DEFAULT_TIMEOUT_S: f64 = 30.0 * 60.0;
pub const DEFAULT_KILL_GRACE_S: f64 = 10.0;
pub const DEFAULT_STARTUP_TIMEOUT_S: f64 = 10.0 * 60.0;
/// The most cells a suite expands to unless its `max_cells` says otherwise.
pub const DEFAULT_MAX_CELLS: u64 = 100_000;
/// The longest name (suite, benchmark, variant, build) and cell id, in bytes:
/// the store's rule for a name that becomes a folder or a file
/// (`orch_store::check_name`: one path component of at most 200 bytes).
pub const MAX_NAME_BYTES: usize = 200;

/// The resolved, expanded suite: what a run executes. Stored with each run
/// (`plan.json`), so `orch run --resume` needs no manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub suite: String,
    #[serde(default)]
    pub description: Option<String>,
    /// The manifest this plan came from.
    pub manifest: PathBuf,
    /// Cells at once, as the suite says (`concurrency:`); `None`: the
    /// backend's default (`orch plan` says which).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// Host environment variables passed to cells as secrets (names only).
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub models: Vec<ModelRef>,
    pub cells: Vec<CellPlan>,
    /// The suite's `slurm:` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmDef>,
    /// The suite's `kubernetes:` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesDef>,
    /// The suite's `sync:` section, its paths absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncDef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellPlan {
    /// Stable id: `<benchmark>.<gpu>[.<param>-<value>...]`.
    pub id: String,
    pub benchmark: String,
    pub gpu: GpuSpec,
    pub params: BTreeMap<String, Value>,
    /// Container image (container backends only).
    #[serde(default)]
    pub image: Option<ImageDef>,
    /// Nodes the cell runs on (more than 1: `slurm` only).
    #[serde(default = "one_node", skip_serializing_if = "is_one_node")]
    pub nodes: u32,
    /// The agent's task (its `run_id` is filled in when the run starts).
    pub task: TaskSpec,
    /// The campaign task this cell compares (`tasks:`), read back by the
    /// scoring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub campaign: Option<crate::tasks::TaskInfo>,
}

/// Command-line overrides applied while expanding.
#[derive(Debug, Clone, Default)]
pub struct ExpandOptions {
    /// `--gpu`: replaces every GPU list of the manifest.
    pub gpus: Option<Vec<GpuSpec>>,
    /// Where a task file's inline diffs are kept (default:
    /// [`crate::tasks::default_patch_dir`]).
    pub patch_dir: Option<PathBuf>,
    /// The Hugging Face cache a task dataset is read from (default:
    /// [`crate::tasks::default_hf_cache`]).
    pub hf_cache: Option<PathBuf>,
}

/// Placeholders every template may use besides the matrix parameters.
const BUILTIN_VARS: &[&str] = &["gpu", "gpu_count", "cell", "benchmark", "files", "task"];

/// Placeholders a campaign's rows fill (`tasks:`): reserved there only.
const TASK_VARS: &[&str] = &["model", "base"];

/// Transformer fields a matrix parameter of the same name overrides.
const TRANSFORMER_FIELDS: &[&str] = &[
    "preset", "d_model", "layers", "heads", "d_ff", "context", "batch", "vocab", "pass", "dtype", "device",
    "seed",
];

pub(crate) fn expand(suite: Suite, path: &Path, opts: &ExpandOptions) -> Result<Plan, ManifestError> {
    let invalid = |pos: Option<Pos>, msg: String, hint: &str| ManifestError::invalid(path, pos, msg, hint);
    let name_pos = Pos::from_loc(suite.name.referenced);
    check_name(&suite.name.value).map_err(|m| invalid(name_pos, format!("suite `name`: {m}"), NAME_HINT))?;
    if suite.benchmarks.is_empty() {
        return Err(invalid(
            None,
            "the suite has no `benchmarks`".into(),
            "add at least one benchmark; see manifests/quickstart.yaml",
        ));
    }
    for s in &suite.secrets {
        if !is_env_name(s) {
            return Err(invalid(
                None,
                format!("`secrets`: `{s}` is not an environment variable name"),
                "list names such as `HF_TOKEN`, not values",
            ));
        }
    }
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base_dir
    };
    let base_dir = std::fs::canonicalize(&base_dir).unwrap_or(base_dir);
    let concurrency = suite.concurrency;
    if concurrency == Some(0) {
        return Err(invalid(
            None,
            "`concurrency` must be at least 1".into(),
            "use 1 to run one cell at a time",
        ));
    }
    let logs = LogLimits {
        head_bytes: suite
            .logs
            .head
            .map(|b| b.0)
            .unwrap_or(LogLimits::default().head_bytes),
        tail_bytes: suite
            .logs
            .tail
            .map(|b| b.0)
            .unwrap_or(LogLimits::default().tail_bytes),
    };

    // `gpu_fallback` keys, normalised like every GPU spec (`h100:2` is `H100:2`).
    let mut fallback = BTreeMap::<String, Vec<GpuSpec>>::new();
    for (k, alts) in &suite.gpu_fallback {
        let key = GpuSpec::parse(k).map_err(|e| {
            invalid(
                None,
                format!("`gpu_fallback` key `{k}`: {e}"),
                "keys are GPU specs as written in `gpus` (`H100:2`), values lists of alternatives",
            )
        })?;
        fallback.insert(key.to_string(), alts.clone());
    }
    // Task files first: their rows count as cells.
    let mut task_lists = BTreeMap::<String, Vec<crate::tasks::Task>>::new();
    for bench in &suite.benchmarks {
        if let Some(t) = &bench.tasks {
            let bpos = Pos::from_loc(t.referenced).or(Pos::from_loc(bench.name.referenced));
            if bench.compare.is_none() {
                return Err(invalid(
                    bpos,
                    format!("benchmark `{}`: `tasks` fill a `compare` template", bench.name.value),
                    "add `compare: {repo: ..., rounds: 3}` and a `server` workload; each row names its variants",
                ));
            }
            let hf = opts
                .hf_cache
                .clone()
                .unwrap_or_else(crate::tasks::default_hf_cache);
            let file = crate::tasks::tasks_path(&t.value, &base_dir, &hf);
            let patch_dir = opts
                .patch_dir
                .clone()
                .unwrap_or_else(crate::tasks::default_patch_dir);
            let tasks = crate::tasks::load_tasks(&file, &t.value, &patch_dir)?;
            task_lists.insert(bench.name.value.clone(), tasks);
        }
    }
    check_cell_count(&suite, opts, &task_lists).map_err(|(pos, m, h)| invalid(pos, m, h))?;
    let mut cells = Vec::new();
    let mut seen_bench = BTreeSet::new();
    let mut seen_ids = BTreeMap::<String, String>::new();
    for bench in &suite.benchmarks {
        let bpos = Pos::from_loc(bench.name.referenced);
        let bname = bench.name.value.clone();
        check_name(&bname).map_err(|m| invalid(bpos, format!("benchmark `name`: {m}"), NAME_HINT))?;
        if !seen_bench.insert(bname.clone()) {
            return Err(invalid(
                bpos,
                format!("two benchmarks are named `{bname}`"),
                "give each benchmark its own name",
            ));
        }
        let wpos = Pos::from_loc(bench.workload.referenced);
        let mut workload = base_workload(&bench.workload.value, &base_dir)
            .map_err(|(m, h)| invalid(wpos, format!("benchmark `{bname}`: `workload`: {m}"), h))?;
        let tasks = task_lists.get(&bname);
        if let Some(c) = &bench.compare {
            workload = compare_workload(c, workload, &base_dir, tasks.is_some())
                .map_err(|(m, h)| invalid(bpos, format!("benchmark `{bname}`: `compare`: {m}"), h))?;
        }
        let measure = merge_measure(&suite.measure, &bench.measure);
        let gpus = opts
            .gpus
            .clone()
            .or_else(|| bench.gpus.clone())
            .or_else(|| suite.gpus.clone())
            .unwrap_or_else(|| vec![GpuSpec::CPU]);
        if gpus.is_empty() {
            return Err(invalid(
                bpos,
                format!("benchmark `{bname}`: the GPU list is empty"),
                "write `gpus: [none]` for CPU only",
            ));
        }
        let combos = matrix_combos(bench)
            .map_err(|(pos, m, h)| invalid(pos.or(bpos), format!("benchmark `{bname}`: {m}"), h))?;
        if let (Some(_), Some(m)) = (&bench.tasks, &bench.matrix) {
            if let Some(k) = m.value.keys().find(|k| TASK_VARS.contains(&k.as_str())) {
                return Err(invalid(
                    Pos::from_loc(m.referenced).or(bpos),
                    format!("benchmark `{bname}`: `matrix` key `{k}` is what each task row sets"),
                    "rename the parameter, or set it per task in the task file",
                ));
            }
        }
        let memory_limit = bench.memory_limit.or(suite.memory_limit).map(|b| b.0);
        let image = bench.image.clone().or_else(|| suite.image.clone());
        if let Some(ImageDef::Build(b)) = &image {
            check_name(&b.build).map_err(|m| invalid(bpos, format!("`image.build`: {m}"), NAME_HINT))?;
        }
        let mut env = suite.env.clone();
        env.extend(bench.env.clone());
        let nodes = match &bench.nodes {
            Some(n) if n.value == 0 => {
                return Err(invalid(
                    Pos::from_loc(n.referenced).or(bpos),
                    format!("benchmark `{bname}`: `nodes` must be at least 1"),
                    "leave `nodes` out for one node per cell",
                ))
            }
            Some(n) => n.value,
            None => 1,
        };

        // A campaign: every task its own template and GPUs; else one.
        type Unit<'a> = (Vec<GpuSpec>, Option<&'a crate::tasks::Task>);
        let units: Vec<Unit> = match tasks {
            None => vec![(gpus.clone(), None)],
            Some(ts) => ts
                .iter()
                .map(|t| {
                    let g = match (&opts.gpus, t.gpu) {
                        (None, Some(g)) => vec![g],
                        _ => gpus.clone(),
                    };
                    (g, Some(t))
                })
                .collect(),
        };
        for (unit_gpus, task) in &units {
            let workload = match task {
                None => workload.clone(),
                Some(t) => task_workload(
                    &workload,
                    t,
                    bench.compare.as_ref().and_then(|c| c.install.as_ref()),
                )
                .map_err(|(m, h)| {
                    ManifestError::invalid(
                        Path::new(&t.info.file),
                        t.line.map(|line| Pos { line, column: 1 }),
                        format!("task row {}: {m}", t.info.row),
                        h,
                    )
                })?,
            };
            for gpu in unit_gpus {
                for params in &combos {
                    if excluded(&bench.exclude, gpu, params) {
                        continue;
                    }
                    let mut params = params.clone();
                    if let Some(t) = task {
                        params.insert("task".into(), Value::String(t.info.id.clone()));
                    }
                    let params = &params;
                    let id = cell_id(&bname, gpu, params);
                    if id.len() > MAX_NAME_BYTES {
                        return Err(invalid(
                        bpos,
                        format!(
                            "the cell id `{id}` is {} bytes long; the most is {MAX_NAME_BYTES} (it names the cell's folder in the store)",
                            id.len()
                        ),
                        "shorten the benchmark name or the matrix values (the id is `<benchmark>.<gpu>.<param>-<value>...`)",
                    ));
                    }
                    if let Some(other) = seen_ids.insert(id.clone(), bname.clone()) {
                        return Err(invalid(
                            bpos,
                            format!("two cells get the id `{id}` (benchmarks `{other}` and `{bname}`)"),
                            "make parameter values differ by more than case or punctuation",
                        ));
                    }
                    let mut vars = template_vars(params, gpu, &id, &bname);
                    if let Some(t) = task {
                        if let Some(m) = &t.info.model {
                            vars.insert("model".into(), m.clone());
                        }
                        if let Some(b) = &t.info.base {
                            vars.insert("base".into(), b.clone());
                        }
                    }
                    let workload = instantiate(&workload, params, &vars)
                        .map_err(|(m, h)| invalid(wpos, format!("cell `{id}`: {m}"), h))?;
                    let env = env
                        .iter()
                        .map(|(k, v)| Ok((k.clone(), substitute(v, &vars)?)))
                        .collect::<Result<BTreeMap<_, _>, (String, &str)>>()
                        .map_err(|(m, h)| invalid(bpos, format!("cell `{id}`: `env`: {m}"), h))?;
                    cells.push(CellPlan {
                        id: id.clone(),
                        benchmark: bname.clone(),
                        gpu: *gpu,
                        params: params.clone(),
                        image: image.clone(),
                        nodes,
                        task: TaskSpec {
                            version: PROTOCOL_VERSION,
                            run_id: String::new(),
                            cell_id: id,
                            gpu: gpu.to_string().into(),
                            params: params.clone(),
                            env,
                            secret_env: suite.secrets.clone(),
                            workload,
                            measure: measure.clone(),
                            logs,
                            memory_limit_bytes: memory_limit,
                            weights_dir: None,
                            strict_hardware: false,
                            gpu_fallback: fallback
                                .get(&gpu.to_string())
                                .map(|alts| alts.iter().map(|g| g.to_string().into()).collect())
                                .unwrap_or_default(),
                            files: None,
                        },
                        campaign: task.map(|t| t.info.clone()),
                    });
                }
            }
        }
    }
    if cells.is_empty() {
        return Err(invalid(
            None,
            "the matrix expands to no cells (everything is excluded)".into(),
            "check the `exclude` lists",
        ));
    }
    // Every task's model is set up and checked like the suite's own.
    let mut models = suite.models;
    for tasks in task_lists.values() {
        for (repo, _) in crate::tasks::models_of(tasks) {
            if !models.iter().any(|m| m.repo == repo) {
                models.push(ModelRef {
                    repo,
                    revision: None,
                    include: Vec::new(),
                    exclude: Vec::new(),
                    repo_type: None,
                });
            }
        }
    }
    Ok(Plan {
        suite: suite.name.value,
        description: suite.description,
        manifest: std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()),
        concurrency,
        secrets: suite.secrets,
        models,
        cells,
        slurm: check_slurm(suite.slurm, path)?,
        kubernetes: check_kubernetes(suite.kubernetes, path)?,
        sync: suite.sync.map(|mut s| {
            for p in &mut s.paths {
                if !Path::new(p.as_str()).is_absolute() {
                    *p = base_dir.join(p.as_str()).to_string_lossy().into_owned();
                }
            }
            s
        }),
    })
}

fn one_node() -> u32 {
    1
}

fn is_one_node(n: &u32) -> bool {
    *n == 1
}

const NAME_HINT: &str = "names use letters, digits, `-`, `_` and `.`";

/// A name that becomes part of a folder or file name in the store: the
/// store's rule ([`MAX_NAME_BYTES`], one plain path component), checked
/// here so `plan` says so, not `run`.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("`{name}` is not a name (it means a folder)"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!(
            "is {} bytes long; the most is {MAX_NAME_BYTES} (names become folder names in the store)",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!("`{name}` contains `{c}`"));
    }
    Ok(())
}

fn is_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn merge_measure(suite: &MeasureDef, bench: &MeasureDef) -> Measure {
    Measure {
        warmup: bench.warmup.or(suite.warmup).unwrap_or(DEFAULT_WARMUP),
        repetitions: bench
            .repetitions
            .or(suite.repetitions)
            .unwrap_or(DEFAULT_REPETITIONS),
        timeout_s: bench
            .timeout
            .or(suite.timeout)
            .map(|s| s.0)
            .unwrap_or(DEFAULT_TIMEOUT_S),
        kill_grace_s: bench
            .kill_grace
            .or(suite.kill_grace)
            .map(|s| s.0)
            .unwrap_or(DEFAULT_KILL_GRACE_S),
    }
}

type Msg = (String, &'static str);

fn base_workload(w: &WorkloadDef, base_dir: &Path) -> Result<Workload, Msg> {
    let given: Vec<&str> = [
        ("command", w.command.is_some()),
        ("shell", w.shell.is_some()),
        ("transformer", w.transformer.is_some()),
        ("calibrate", w.calibrate.is_some()),
        ("noop", w.noop.unwrap_or(false)),
        ("server", w.server.is_some()),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(n, _)| *n)
    .collect();
    const HINT: &str = "a workload is exactly one of `command: [prog, args...]`, `shell: \"script\"`, `transformer: {...}`, `calibrate: {...}`, `server: {...}` or `noop: true`";
    if given.len() != 1 {
        let msg = if given.is_empty() {
            "no workload given".to_string()
        } else {
            format!(
                "several workloads given ({})",
                given
                    .iter()
                    .map(|g| format!("`{g}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err((msg, HINT));
    }
    // No `workdir`: the agent's own (where orch runs, or the image's WORKDIR).
    let workdir = || {
        w.workdir.as_ref().map(|d| {
            let dir = if Path::new(d).is_absolute() {
                PathBuf::from(d)
            } else {
                base_dir.join(d)
            };
            dir.to_string_lossy().into_owned()
        })
    };
    if w.client.is_some() && w.server.is_none() {
        return Err(("`client` only goes with `server`".into(), HINT));
    }
    if w.workdir.is_some() && w.command.is_none() && w.shell.is_none() {
        return Err(("`workdir` only applies to `command` and `shell`".into(), HINT));
    }
    Ok(match given[0] {
        "command" => {
            let argv = w.command.clone().unwrap_or_default();
            if argv.is_empty() || argv[0].is_empty() {
                return Err((
                    "`command` is empty".into(),
                    "write the program and its arguments: `command: [python, bench.py]`",
                ));
            }
            Workload::Command(CommandWorkload {
                argv,
                workdir: workdir(),
            })
        }
        "shell" => Workload::Command(CommandWorkload {
            argv: vec!["sh".into(), "-c".into(), w.shell.clone().unwrap_or_default()],
            workdir: workdir(),
        }),
        "transformer" => Workload::Builtin(BuiltinWorkload::Transformer(
            w.transformer.clone().unwrap_or_default(),
        )),
        "calibrate" => Workload::Builtin(BuiltinWorkload::Calibrate(
            w.calibrate.clone().unwrap_or_default(),
        )),
        "server" => server_workload(w, base_dir)?,
        _ => Workload::Builtin(BuiltinWorkload::Noop),
    })
}

fn server_workload(w: &WorkloadDef, base_dir: &Path) -> Result<Workload, Msg> {
    let srv = w.server.clone().unwrap_or_default();
    let dir = |d: &Option<String>| {
        d.as_ref().map(|d| {
            let p = if Path::new(d).is_absolute() {
                PathBuf::from(d)
            } else {
                base_dir.join(d)
            };
            p.to_string_lossy().into_owned()
        })
    };
    let argv = argv_of(&srv.command, &srv.shell).ok_or((
        "`server` needs exactly one of `command` or `shell`".to_string(),
        "e.g. `server: {command: [python, -m, vllm.entrypoints.openai.api_server], ready: {http: /health, port: 8000}}`",
    ))?;
    let r = &srv.ready;
    let ready = match (&r.http, r.port, r.tcp, &r.log) {
        (Some(path), Some(port), None, None) => Readiness::Http {
            port,
            path: if path.starts_with('/') { path.clone() } else { format!("/{path}") },
        },
        (None, None, Some(port), None) => Readiness::Tcp { port },
        (None, None, None, Some(regex)) => Readiness::Log { regex: regex.clone() },
        _ => {
            return Err((
                "`server.ready` needs exactly one of `http` (with `port`), `tcp` or `log`".into(),
                "e.g. `ready: {http: /health, port: 8000}`, `ready: {tcp: 8000}` or `ready: {log: \"Uvicorn running\"}`",
            ))
        }
    };
    let client = match &w.client {
        Some(c) if c.loadgen.is_some() => {
            if c.command.is_some() || c.shell.is_some() {
                return Err((
                    "`client` takes one of `command`, `shell` or `loadgen`".into(),
                    "use the load generator, or your own client, not both",
                ));
            }
            let l = c.loadgen.clone().unwrap_or_else(|| unreachable!("checked above"));
            let rate = match &l.request_rate {
                None => None,
                Some(Value::String(s)) if s.eq_ignore_ascii_case("inf") => None,
                Some(Value::Number(n)) if n.as_f64().map(|r| r > 0.0).unwrap_or(false) => n.as_f64(),
                Some(other) => {
                    return Err((
                        format!("`loadgen.request_rate` must be a positive number or `inf`, not {other}"),
                        "e.g. `request_rate: 8` (requests per second) or `request_rate: inf`",
                    ))
                }
            };
            let prompt_file = l.prompt_file.as_ref().map(|p| {
                let p = if Path::new(p).is_absolute() {
                    PathBuf::from(p)
                } else {
                    base_dir.join(p)
                };
                p.to_string_lossy().into_owned()
            });
            let slo = match &l.slo {
                None => None,
                Some(d) => {
                    for (name, v) in [
                        ("ttft_ms", d.ttft_ms),
                        ("tpot_ms", d.tpot_ms),
                        ("e2el_ms", d.e2el_ms),
                    ] {
                        if let Some(v) = v {
                            if !(v.is_finite() && v > 0.0) {
                                return Err((
                                    format!("`loadgen.slo.{name}` must be a positive number of milliseconds, not {v}"),
                                    "e.g. `slo: {ttft_ms: 500, tpot_ms: 50}`",
                                ));
                            }
                        }
                    }
                    if d.ttft_ms.is_none() && d.tpot_ms.is_none() && d.e2el_ms.is_none() {
                        return Err((
                            "`loadgen.slo` names no bound".to_string(),
                            "give at least one of `ttft_ms`, `tpot_ms`, `e2el_ms`",
                        ));
                    }
                    Some(orch_protocol::Slo {
                        ttft_ms: d.ttft_ms,
                        tpot_ms: d.tpot_ms,
                        e2el_ms: d.e2el_ms,
                    })
                }
            };
            let tokenizer = l.tokenizer.as_ref().map(|t| {
                if t.ends_with(".json") && !Path::new(t).is_absolute() {
                    base_dir.join(t).to_string_lossy().into_owned()
                } else {
                    t.clone()
                }
            });
            let range_ratio = l.range_ratio.unwrap_or(0.0);
            if !(0.0..1.0).contains(&range_ratio) {
                return Err((
                    format!("`loadgen.range_ratio` must be in [0, 1), not {range_ratio}"),
                    "prompt lengths are drawn in `input_len * [1 - r, 1 + r]`, e.g. `range_ratio: 0.25`",
                ));
            }
            const MAX_STAGES: usize = 64;
            let sweep = match &l.sweep {
                None => None,
                Some(d) => {
                    const SWEEP_HINT: &str =
                        "one list: `sweep: {request_rate: [1, 2, 4, inf]}` or `sweep: {max_concurrency: [1, 8, 64]}`";
                    let rates = d.request_rate.clone().unwrap_or_default();
                    let concs = d.max_concurrency.clone().unwrap_or_default();
                    if rates.is_empty() == concs.is_empty() {
                        return Err((
                            "`loadgen.sweep` needs exactly one non-empty list".to_string(),
                            SWEEP_HINT,
                        ));
                    }
                    if rates.len().max(concs.len()) > MAX_STAGES {
                        return Err((
                            format!("`loadgen.sweep` has more than {MAX_STAGES} stages"),
                            SWEEP_HINT,
                        ));
                    }
                    let mut request_rate = Vec::new();
                    for r in &rates {
                        request_rate.push(match r {
                            Value::String(s) if s.eq_ignore_ascii_case("inf") => None,
                            Value::Number(n) if n.as_f64().is_some_and(|r| r > 0.0 && r.is_finite()) => n.as_f64(),
                            other => {
                                return Err((
                                    format!("`loadgen.sweep.request_rate` values must be positive numbers or `inf`, not {other}"),
                                    SWEEP_HINT,
                                ))
                            }
                        });
                    }
                    if concs.contains(&0) {
                        return Err((
                            "`loadgen.sweep.max_concurrency` values must be at least 1".to_string(),
                            SWEEP_HINT,
                        ));
                    }
                    Some(orch_protocol::Sweep {
                        request_rate,
                        max_concurrency: concs,
                    })
                }
            };
            let saturation = match &l.saturation {
                None => None,
                Some(d) => {
                    const SAT_HINT: &str = "e.g. `saturation: {start_rate: 1, max_rate: 256, steps: 4}` with `slo: {ttft_ms: 500}`";
                    if slo.is_none() {
                        return Err((
                            "`loadgen.saturation` needs `loadgen.slo` (the bounds to search against)"
                                .to_string(),
                            SAT_HINT,
                        ));
                    }
                    if sweep.is_some() {
                        return Err((
                            "`loadgen.saturation` and `loadgen.sweep` do not go together".to_string(),
                            SAT_HINT,
                        ));
                    }
                    let start_rate = d.start_rate.unwrap_or(1.0);
                    let max_rate = d.max_rate.unwrap_or(1024.0);
                    let steps = d.steps.unwrap_or(4);
                    if !(start_rate.is_finite()
                        && start_rate > 0.0
                        && max_rate.is_finite()
                        && max_rate >= start_rate)
                    {
                        return Err((
                            format!("`loadgen.saturation` needs 0 < `start_rate` <= `max_rate`, not {start_rate} and {max_rate}"),
                            SAT_HINT,
                        ));
                    }
                    if steps > 16 {
                        return Err((
                            format!("`loadgen.saturation.steps` is at most 16, not {steps}"),
                            SAT_HINT,
                        ));
                    }
                    Some(orch_protocol::Saturation {
                        start_rate,
                        max_rate,
                        steps,
                    })
                }
            };
            let ramp_up = match &l.ramp_up {
                None => None,
                Some(d) => {
                    const RAMP_HINT: &str =
                        "e.g. `ramp_up: {strategy: linear, start_rps: 1, end_rps: 32}` (without `request_rate`)";
                    if rate.is_some() || l.request_rate.is_some() {
                        return Err((
                            "`loadgen.ramp_up` and `loadgen.request_rate` do not go together".to_string(),
                            "the ramp sets the rate: remove `request_rate`, or remove `ramp_up`",
                        ));
                    }
                    if sweep.as_ref().is_some_and(|s| !s.request_rate.is_empty()) || saturation.is_some() {
                        return Err((
                            "`loadgen.ramp_up` does not go with a `sweep` of rates or `saturation`"
                                .to_string(),
                            RAMP_HINT,
                        ));
                    }
                    let strategy =
                        match d.strategy.as_deref() {
                            Some("linear") => orch_protocol::RampStrategy::Linear,
                            Some("exponential") => orch_protocol::RampStrategy::Exponential,
                            other => {
                                return Err((
                                    format!(
                                    "`loadgen.ramp_up.strategy` must be `linear` or `exponential`, not {}",
                                    other.map(|o| format!("`{o}`")).unwrap_or_else(|| "missing".into())
                                ),
                                    RAMP_HINT,
                                ))
                            }
                        };
                    let (Some(start_rps), Some(end_rps)) = (d.start_rps, d.end_rps) else {
                        return Err((
                            "`loadgen.ramp_up` needs `start_rps` and `end_rps`".to_string(),
                            RAMP_HINT,
                        ));
                    };
                    let min = if strategy == orch_protocol::RampStrategy::Exponential {
                        f64::MIN_POSITIVE
                    } else {
                        0.0
                    };
                    if !(start_rps.is_finite()
                        && end_rps.is_finite()
                        && start_rps >= min
                        && end_rps > 0.0
                        && start_rps <= end_rps)
                    {
                        return Err((
                            format!("`loadgen.ramp_up` needs 0 <= `start_rps` <= `end_rps` (0 < `start_rps` when exponential) and `end_rps` > 0, not {start_rps} and {end_rps}"),
                            RAMP_HINT,
                        ));
                    }
                    Some(orch_protocol::RampUp {
                        strategy,
                        start_rps,
                        end_rps,
                    })
                }
            };
            let endpoint = l.endpoint.unwrap_or_else(|| "/v1/completions".into());
            let multi_turn = l.multi_turn.unwrap_or(false);
            if multi_turn && !endpoint.contains("chat") {
                return Err((
                    format!(
                        "`loadgen.multi_turn` replays conversations on a chat endpoint, not `{endpoint}`"
                    ),
                    "use `endpoint: /v1/chat/completions` with `multi_turn: true`",
                ));
            }
            let turn_delay_ms = l.turn_delay_ms.unwrap_or(0.0);
            if !(turn_delay_ms.is_finite() && turn_delay_ms >= 0.0) {
                return Err((
                    format!(
                        "`loadgen.turn_delay_ms` must be a number of milliseconds >= 0, not {turn_delay_ms}"
                    ),
                    "e.g. `turn_delay_ms: 500` (the user's think time between an answer and the next turn)",
                ));
            }
            if l.turn_delay_ms.is_some() && !multi_turn {
                return Err((
                    "`loadgen.turn_delay_ms` needs `multi_turn: true`".to_string(),
                    "add `multi_turn: true`, or remove `turn_delay_ms`",
                ));
            }
            if l.nonce.as_deref().is_some_and(str::is_empty) {
                return Err((
                    "`loadgen.nonce` is empty".to_string(),
                    "e.g. `nonce: run-2`, or remove it",
                ));
            }
            Some(Client::Loadgen(LoadGen {
                endpoint,
                model: l.model,
                num_prompts: l.num_prompts,
                request_rate: rate,
                burstiness: l.burstiness.unwrap_or(1.0),
                max_concurrency: l.max_concurrency,
                input_len: l.input_len.unwrap_or(128),
                output_len: l.output_len.unwrap_or(128),
                prompt_file,
                warmup_requests: l.warmup_requests.unwrap_or(0),
                stream: l.stream.unwrap_or(true),
                seed: l.seed.unwrap_or(0),
                slo,
                tokenizer,
                range_ratio,
                prefix_len: l.prefix_len.unwrap_or(0),
                prefix_groups: l.prefix_groups.unwrap_or(1),
                sweep,
                saturation,
                ramp_up,
                multi_turn,
                turn_delay_ms,
                nonce: l.nonce,
                ignore_eos: l.ignore_eos.unwrap_or(true),
            }))
        }
        Some(c) => Some(Client::Command(CommandWorkload {
            argv: argv_of(&c.command, &c.shell).ok_or((
                "`client` needs exactly one of `command`, `shell` or `loadgen`".to_string(),
                "e.g. `client: {shell: \"python bench.py --url $ORCH_SERVER_URL\"}`",
            ))?,
            workdir: dir(&c.workdir),
        })),
        None => None,
    };
    Ok(Workload::Server(ServerWorkload {
        argv,
        workdir: dir(&srv.workdir),
        ready,
        startup_timeout_s: srv
            .startup_timeout
            .map(|s| s.0)
            .unwrap_or(DEFAULT_STARTUP_TIMEOUT_S),
        client,
    }))
}

fn argv_of(command: &Option<Vec<String>>, shell: &Option<String>) -> Option<Vec<String>> {
    match (command, shell) {
        (Some(c), None) if !c.is_empty() && !c[0].is_empty() => Some(c.clone()),
        (None, Some(s)) => Some(vec!["sh".into(), "-c".into(), s.clone()]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn substitution() {
        let vars: BTreeMap<String, String> = [("bs".to_string(), "8".to_string())].into_iter().collect();
        assert_eq!(
            substitute("--batch {{bs}} {{ bs }}", &vars).unwrap(),
            "--batch 8 8"
        );
        assert_eq!(
            substitute("awk '{print $1}' {x}", &vars).unwrap(),
            "awk '{print $1}' {x}"
        );
        assert!(substitute("{{bz}}", &vars)
            .unwrap_err()
            .0
            .contains("unknown placeholder `{{bz}}`"));
    }

    #[test]
    fn ids_are_stable_and_safe() {
        let params: BTreeMap<String, Value> = [
            ("preset".to_string(), Value::String("2.7B".into())),
            ("bs".to_string(), Value::from(8)),
        ]
        .into_iter()
        .collect();
        let gpu = GpuSpec::parse("H100:8").unwrap();
        assert_eq!(cell_id("lm", &gpu, &params), "lm.h100x8.bs-8.preset-2.7b");
        assert_eq!(
            cell_id("my bench", &GpuSpec::CPU, &BTreeMap::new()),
            "my_bench.cpu"
        );
    }
}
