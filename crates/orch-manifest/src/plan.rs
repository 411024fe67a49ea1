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
    pub concurrency: usize,
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
    let concurrency = suite.concurrency.unwrap_or(1);
    if concurrency == 0 {
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

/// The `kubernetes:` section's values that parsing alone does not check,
/// by the API server's own rules ([`crate::k8s`]), each at its line and column.
fn check_kubernetes(
    section: Option<Spanned<KubernetesSection>>,
    path: &Path,
) -> Result<Option<KubernetesDef>, ManifestError> {
    let Some(section) = section else { return Ok(None) };
    let section_pos = Pos::from_loc(section.referenced);
    let def = section.value;
    let at = |l: serde_saphyr::Location| Pos::from_loc(l).or(section_pos);
    let invalid = |pos: Option<Pos>, msg: String, hint: &str| ManifestError::invalid(path, pos, msg, hint);
    for (key, value) in &def.node_selector {
        if let Some(why) = k8s::qualified_name_error(key) {
            return Err(invalid(
                at(value.referenced),
                format!("`kubernetes.node_selector`: `{key}` is not a label key: {why}"),
                "label keys are `[PREFIX/]NAME`, e.g. `cloud.google.com/gke-accelerator` or `pool`",
            ));
        }
        if let Some(why) = k8s::label_value_error(&value.value) {
            return Err(invalid(
                at(value.referenced),
                format!(
                    "`kubernetes.node_selector.{key}`: `{}` is not a label value: {why}",
                    value.value
                ),
                "write the node label's value as `kubectl get nodes --show-labels` shows it",
            ));
        }
    }
    for t in &def.tolerations {
        let pos = at(t.referenced);
        let t = &t.value;
        let example = "write e.g. `{key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}`";
        if let Some(op) = t
            .operator
            .as_deref()
            .filter(|o| !matches!(*o, "Exists" | "Equal"))
        {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: operator `{op}` is neither `Exists` nor `Equal`"),
                example,
            ));
        }
        let exists = t.operator.as_deref() == Some("Exists");
        if let Some(e) = t
            .effect
            .as_deref()
            .filter(|e| !matches!(*e, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute"))
        {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: effect `{e}` is not a taint effect"),
                "the effects are `NoSchedule`, `PreferNoSchedule` and `NoExecute`",
            ));
        }
        match t.key.as_deref().unwrap_or_default() {
            "" if !exists => {
                return Err(invalid(
                    pos,
                    "`kubernetes.tolerations`: a toleration without `key` must have `operator: Exists`"
                        .into(),
                    "give the taint's `key`, or `operator: Exists` to tolerate every taint",
                ))
            }
            "" => {}
            key => {
                if let Some(why) = k8s::qualified_name_error(key) {
                    return Err(invalid(
                        pos,
                        format!("`kubernetes.tolerations`: key `{key}` is not a taint key: {why}"),
                        example,
                    ));
                }
            }
        }
        let value = t.value.as_deref().unwrap_or_default();
        if exists && !value.is_empty() {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: `operator: Exists` takes no value (`{value}`)"),
                "leave `value` out, or use `operator: Equal`",
            ));
        }
        if let Some(why) = k8s::label_value_error(value) {
            return Err(invalid(
                pos,
                format!("`kubernetes.tolerations`: value `{value}` is not a taint value: {why}"),
                example,
            ));
        }
    }
    if let Some(ns) = def.namespace.as_ref().filter(|n| !k8s::is_dns_label(&n.value)) {
        return Err(invalid(
            at(ns.referenced),
            format!("`kubernetes.namespace`: `{}` is not a namespace name", ns.value),
            "namespaces are lowercase letters, digits and `-` (at most 63)",
        ));
    }
    let names = [
        ("service_account", def.service_account.as_ref()),
        ("runtime_class", def.runtime_class.as_ref()),
        ("weights_pvc", def.weights_pvc.as_ref()),
        ("secret", def.secret.as_ref()),
    ]
    .into_iter()
    .filter_map(|(f, v)| Some((f, v?)))
    .chain(def.image_pull_secrets.iter().map(|v| ("image_pull_secrets", v)));
    for (field, name) in names {
        if !k8s::is_dns_subdomain(&name.value) {
            return Err(invalid(
                at(name.referenced),
                format!("`kubernetes.{field}`: `{}` is not an object name", name.value),
                "object names are lowercase letters, digits, `-` and `.` (at most 253), as `kubectl get` lists them",
            ));
        }
    }
    if let Some(label) = &def.gpu_label {
        if let Some(why) = k8s::qualified_name_error(&label.value) {
            return Err(invalid(
                at(label.referenced),
                format!(
                    "`kubernetes.gpu_label`: `{}` is not a label key: {why}",
                    label.value
                ),
                "write a node label key, e.g. `nvidia.com/gpu.product`",
            ));
        }
    }
    for (gpu, values) in &def.gpu_types {
        if values.value.is_empty() {
            return Err(invalid(
                at(values.referenced),
                format!("`kubernetes.gpu_types.{gpu}` lists no label value"),
                "list the node label's values, e.g. `gpu_types: {H100: [NVIDIA-H100-80GB-HBM3]}`, or leave the type out",
            ));
        }
        for v in &values.value {
            let why = if v.value.is_empty() {
                Some("it is empty")
            } else {
                k8s::label_value_error(&v.value)
            };
            if let Some(why) = why {
                return Err(invalid(
                    at(v.referenced),
                    format!(
                        "`kubernetes.gpu_types.{gpu}`: `{}` is not a label value: {why}",
                        v.value
                    ),
                    "write the node label's value as `kubectl get nodes --show-labels` shows it",
                ));
            }
        }
    }
    if let Some(cpu) = &def.cpu {
        if !k8s::is_quantity(&cpu.value) || cpu.value.starts_with('-') {
            return Err(invalid(
                at(cpu.referenced),
                format!("`kubernetes.cpu`: `{}` is not a CPU quantity", cpu.value),
                "write cores as `8`, `1.5` or `500m` (millicores)",
            ));
        }
    }
    Ok(Some(def.into_def()))
}

/// The `slurm:` section's values that parsing alone does not check.
fn check_slurm(def: Option<SlurmDef>, path: &Path) -> Result<Option<SlurmDef>, ManifestError> {
    let Some(def) = def else { return Ok(None) };
    let invalid = |msg: String, hint: &str| ManifestError::invalid(path, None, msg, hint);
    if let Some(a) = def.extra_args.iter().find(|a| !a.starts_with('-')) {
        return Err(invalid(
            format!("`slurm.extra_args`: `{a}` is not an option"),
            "write each `sbatch` option whole, e.g. `extra_args: [\"--exclusive\", \"--reservation=lab\"]`",
        ));
    }
    if let Some(g) = def
        .gpu_request
        .as_deref()
        .filter(|g| !matches!(*g, "gres" | "gpus"))
    {
        return Err(invalid(
            format!("`slurm.gpu_request`: `{g}` is neither `gres` nor `gpus`"),
            "`gres` asks `--gres=gpu:TYPE:N`, `gpus` asks `--gpus-per-node=TYPE:N`",
        ));
    }
    if def.cpus == Some(0) {
        return Err(invalid(
            "`slurm.cpus` must be at least 1".into(),
            "leave it out for the partition's default",
        ));
    }
    Ok(Some(def))
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

/// `rounds: auto` starts with this many measured rounds.
const AUTO_MIN_ROUNDS: u32 = 3;
/// `rounds: auto` stops at this many unless `max_rounds` says otherwise.
const DEFAULT_MAX_ROUNDS: u32 = 12;
/// `warmup_rounds: auto` stops at this many unless `max_warmup_rounds` says otherwise.
const DEFAULT_MAX_WARMUP_ROUNDS: u32 = 6;
/// Warm-up rounds the steadiness test looks back over (`orch_stats::STEADY_WINDOW`).
const STEADY_WINDOW: u32 = 4;

fn compare_workload(
    c: &crate::suite::CompareDef,
    workload: Workload,
    base_dir: &Path,
    has_tasks: bool,
) -> Result<Workload, Msg> {
    let Workload::Server(server) = workload else {
        return Err((
            "a comparison runs a `server` workload".into(),
            "give the benchmark `workload: {server: {...}, client: {...}}`",
        ));
    };
    if has_tasks && !c.variants.is_empty() {
        return Err((
            "`variants` and `tasks` together".into(),
            "with `tasks:`, each row names its variants (baseline, human, agent); drop `variants`",
        ));
    }
    if !has_tasks && c.variants.len() < 2 {
        return Err((
            "a comparison needs at least two `variants`".into(),
            "e.g. baseline, human and agent",
        ));
    }
    let mut names = BTreeSet::new();
    for v in &c.variants {
        check_name(&v.name).map_err(|m| (format!("variant `name`: {m}"), NAME_HINT))?;
        if !names.insert(v.name.clone()) {
            return Err((
                format!("two variants are named `{}`", v.name),
                "give each variant its own name",
            ));
        }
    }
    let abs = |p: &String| {
        let looks_remote = p.contains("://") || p.starts_with("git@");
        if Path::new(p).is_absolute() || looks_remote {
            p.clone()
        } else {
            base_dir.join(p).to_string_lossy().into_owned()
        }
    };
    let (rounds, max_rounds) = match (c.rounds, c.max_rounds) {
        (Some(crate::suite::Rounds::Auto), max) => {
            let max = max.unwrap_or(DEFAULT_MAX_ROUNDS);
            if max < AUTO_MIN_ROUNDS {
                return Err((
                    format!("`max_rounds` must be at least {AUTO_MIN_ROUNDS}"),
                    "`rounds: auto` starts with 3 rounds; the default is 12",
                ));
            }
            (AUTO_MIN_ROUNDS, Some(max))
        }
        (_, Some(_)) => return Err((
            "`max_rounds` is only for `rounds: auto`".into(),
            "write `rounds: auto` to add rounds until the interval is narrow enough, or drop `max_rounds`",
        )),
        (Some(crate::suite::Rounds::Fixed(n)), None) => (n, None),
        (None, None) => (5, None),
    };
    if rounds < 2 {
        return Err((
            "`rounds` must be at least 2".into(),
            "confidence intervals need repeated rounds; use 3 or more, or `auto`",
        ));
    }
    if c.primary_metric.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Err((
            "`primary_metric` is empty".into(),
            "name a metric the rounds report, e.g. `output_throughput`",
        ));
    }
    let (warmup_rounds, max_warmup_rounds) = match (c.warmup_rounds, c.max_warmup_rounds) {
        (Some(crate::suite::WarmupRounds::Auto), max) => {
            let max = max.unwrap_or(DEFAULT_MAX_WARMUP_ROUNDS);
            if max < STEADY_WINDOW {
                return Err((
                    format!("`max_warmup_rounds` must be at least {STEADY_WINDOW}"),
                    "`warmup_rounds: auto` looks for a trend over the last 4 warm-up rounds; the default is 6",
                ));
            }
            (STEADY_WINDOW, Some(max))
        }
        (_, Some(_)) => return Err((
            "`max_warmup_rounds` is only for `warmup_rounds: auto`".into(),
            "write `warmup_rounds: auto` to warm up until the rounds are steady, or drop `max_warmup_rounds`",
        )),
        (Some(crate::suite::WarmupRounds::Fixed(n)), None) => (n, None),
        (None, None) => (1, None),
    };
    let output_check = match &c.output_check {
        Some(crate::suite::OutputCheckDef::Off) => None,
        Some(crate::suite::OutputCheckDef::On(s)) => Some(s.clone()),
        None => Some(crate::suite::OutputCheckSettings::default()),
    };
    let output_check = match output_check {
        None => None,
        Some(s) => {
            let max_tokens = s.max_tokens.unwrap_or(32);
            let prompts = s.prompts.unwrap_or(8);
            if prompts == 0 || max_tokens == 0 {
                return Err((
                    "`output_check` needs at least one prompt and one token".into(),
                    "e.g. `output_check: {prompts: 8, max_tokens: 32}`, or `output_check: false` to turn it off",
                ));
            }
            let min_match_prefix =
                match s.min_match_prefix {
                    None | Some(crate::suite::MatchPrefix::Exact) => None,
                    Some(crate::suite::MatchPrefix::Tokens(n)) if n == 0 || n > max_tokens => return Err((
                        format!(
                            "`min_match_prefix` must be between 1 and `max_tokens` ({max_tokens}), not {n}"
                        ),
                        "a count of leading tokens every answer must share with the baseline's, or `exact`",
                    )),
                    Some(crate::suite::MatchPrefix::Tokens(n)) => Some(n),
                };
            Some(OutputCheck {
                prompts,
                max_tokens,
                min_match_prefix,
            })
        }
    };
    if c.check.as_deref().is_some_and(|m| m.trim().is_empty()) {
        return Err((
            "`check` is empty".into(),
            "a shell command run in each variant's checkout after its first round, e.g. `python3 check.py`",
        ));
    }
    Ok(Workload::Compare(CompareWorkload {
        repo: c.repo.as_ref().map(abs),
        variants: c
            .variants
            .iter()
            .map(|v| Variant {
                name: v.name.clone(),
                git_ref: v.git_ref.clone(),
                patch: v.patch.as_ref().map(abs),
                install: v.install.clone().or_else(|| c.install.clone()),
            })
            .collect(),
        rounds,
        warmup_rounds,
        noise: c.noise.unwrap_or(0.02),
        max_rounds,
        primary_metric: c.primary_metric.clone(),
        seed: c.seed,
        server,
        worktree_patch: None,
        max_warmup_rounds,
        output_check,
        check: c.check.clone(),
        defences: c.defences.unwrap_or(true),
        install_cache: None,
    }))
}

#[cfg(test)]
mod compare_tests {
    use super::*;

    fn plan(yaml: &str) -> Result<CompareWorkload, String> {
        let base = "variants: [{name: a}, {name: b}]\n";
        let c: crate::suite::CompareDef =
            serde_saphyr::from_str(&format!("{base}{yaml}")).map_err(|e| e.to_string())?;
        let server = Workload::Server(ServerWorkload {
            argv: vec!["true".into()],
            workdir: None,
            ready: Readiness::Tcp { port: 8000 },
            startup_timeout_s: 1.0,
            client: None,
        });
        match compare_workload(&c, server, Path::new("/m"), false) {
            Ok(Workload::Compare(c)) => Ok(c),
            Ok(w) => Err(format!("{w:?}")),
            Err((m, h)) => Err(format!("{m}; hint: {h}")),
        }
    }

    #[test]
    fn checks_and_defences_are_on_by_default() {
        let c = plan("").unwrap();
        let check = OutputCheck {
            prompts: 8,
            max_tokens: 32,
            min_match_prefix: None,
        };
        assert_eq!(c.output_check, Some(check));
        assert!(c.defences);
        assert_eq!((c.warmup_rounds, c.max_warmup_rounds, c.check), (1, None, None));
        let c = plan("output_check: false\ndefences: false\ncheck: python3 check.py").unwrap();
        assert_eq!((c.output_check, c.defences), (None, false));
        assert_eq!(c.check.as_deref(), Some("python3 check.py"));
        let c = plan("output_check: {prompts: 3, max_tokens: 16, min_match_prefix: 12}").unwrap();
        assert_eq!(
            c.output_check,
            Some(OutputCheck {
                prompts: 3,
                max_tokens: 16,
                min_match_prefix: Some(12)
            })
        );
        let c = plan("output_check: {min_match_prefix: exact}").unwrap();
        assert_eq!(c.output_check.unwrap().min_match_prefix, None);
    }

    #[test]
    fn warmup_auto_is_bounded() {
        let c = plan("warmup_rounds: auto").unwrap();
        assert_eq!((c.warmup_rounds, c.max_warmup_rounds), (4, Some(6)));
        let c = plan("warmup_rounds: auto\nmax_warmup_rounds: 9").unwrap();
        assert_eq!(c.max_warmup_rounds, Some(9));
        assert_eq!(plan("warmup_rounds: 2").unwrap().warmup_rounds, 2);
    }

    #[test]
    fn bad_settings_name_the_field() {
        for (yaml, want) in [
            (
                "warmup_rounds: auto\nmax_warmup_rounds: 3",
                "`max_warmup_rounds` must be at least 4",
            ),
            (
                "warmup_rounds: 2\nmax_warmup_rounds: 6",
                "only for `warmup_rounds: auto`",
            ),
            ("warmup_rounds: soon", "invalid `warmup_rounds`"),
            (
                "output_check: {min_match_prefix: 40}",
                "between 1 and `max_tokens` (32), not 40",
            ),
            ("output_check: {min_match_prefix: most}", "invalid `output_check`"),
            ("output_check: {prompts: 0}", "at least one prompt"),
            ("check: \" \"", "`check` is empty"),
        ] {
            let e = plan(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}

/// `command: [...]` or `shell: "..."` (exactly one) as an argv.
/// The comparison of one task: the template with the row's repository,
/// variants, install command, server command and load overrides.
fn task_workload(
    w: &Workload,
    t: &crate::tasks::Task,
    template_install: Option<&String>,
) -> Result<Workload, Msg> {
    let Workload::Compare(c) = w else {
        return Err((
            "a task fills a `compare` template".into(),
            "give the benchmark `compare:` and a `server` workload",
        ));
    };
    let mut c = c.clone();
    if t.repo.is_some() {
        c.repo = t.repo.clone();
    }
    if c.repo.is_none() {
        return Err((
            "no repository: the row has no `repo` and the template's `compare` none".into(),
            "give the row `repo`, or the benchmark `compare: {repo: URL_OR_PATH}`",
        ));
    }
    c.variants = t
        .variants
        .iter()
        .map(|(name, git_ref, patch)| Variant {
            name: name.clone(),
            git_ref: git_ref.clone(),
            patch: patch.clone(),
            install: t.install.clone().or_else(|| template_install.cloned()),
        })
        .collect();
    if let Some(argv) = &t.server {
        c.server.argv = argv.clone();
    }
    if !t.load.is_empty() {
        let Some(Client::Loadgen(l)) = &c.server.client else {
            return Err((
                "`load` overrides the load generator, and the template's client is a command".into(),
                "use `client: {loadgen: {...}}` in the template, or drop `load` from the row",
            ));
        };
        let Ok(Value::Object(mut fields)) = serde_json::to_value(l) else {
            return Err(("the load generator's settings are not an object".into(), ""));
        };
        let known: BTreeSet<String> = fields.keys().cloned().collect();
        let keys: BTreeSet<String> = t.load.keys().cloned().collect();
        crate::tasks::check_load_keys(&keys, &known).map_err(|m| {
            (
                m,
                "`load` sets fields of the template's `loadgen`, e.g. `{\"num_prompts\": 64}`",
            )
        })?;
        for (k, v) in &t.load {
            fields.insert(k.clone(), v.clone());
        }
        let l = serde_json::from_value(Value::Object(fields)).map_err(|e| {
            (
                format!("`load`: {e}"),
                "`load` values have the template's types (`num_prompts: 64`, `request_rate: 8.0`)",
            )
        })?;
        c.server.client = Some(Client::Loadgen(l));
    }
    Ok(Workload::Compare(c))
}

fn argv_of(command: &Option<Vec<String>>, shell: &Option<String>) -> Option<Vec<String>> {
    match (command, shell) {
        (Some(c), None) if !c.is_empty() && !c[0].is_empty() => Some(c.clone()),
        (None, Some(s)) => Some(vec!["sh".into(), "-c".into(), s.clone()]),
        _ => None,
    }
}

type LocMsg = (Option<Pos>, String, &'static str);

/// The number of cells the suite expands to, counted from the lengths of
/// its GPU lists and matrix axes (before `exclude`), without expanding
/// anything; refused over the suite's `max_cells`.
fn check_cell_count(
    suite: &Suite,
    opts: &ExpandOptions,
    tasks: &BTreeMap<String, Vec<crate::tasks::Task>>,
) -> Result<(), LocMsg> {
    let cap = suite.max_cells.unwrap_or(DEFAULT_MAX_CELLS);
    let mut total: Option<u64> = Some(0);
    let mut biggest: Option<(u64, &Benchmark)> = None;
    for bench in &suite.benchmarks {
        let gpus = opts
            .gpus
            .as_ref()
            .or(bench.gpus.as_ref())
            .or(suite.gpus.as_ref())
            .map_or(1, Vec::len) as u64;
        // A task with its own GPU is one cell per combination.
        let gpus = match tasks.get(&bench.name.value) {
            None => gpus,
            Some(ts) => ts
                .iter()
                .map(|t| {
                    if t.gpu.is_some() && opts.gpus.is_none() {
                        1
                    } else {
                        gpus
                    }
                })
                .sum(),
        };
        let axes = bench.matrix.as_ref().map(|m| &m.value);
        // `None`: more than `u64::MAX`.
        let count = axes
            .into_iter()
            .flat_map(|m| m.values())
            .try_fold(gpus, |n, values| n.checked_mul(values.len() as u64));
        total = total.zip(count).and_then(|(t, c)| t.checked_add(c));
        let c = count.unwrap_or(u64::MAX);
        if biggest.is_none_or(|(b, _)| c > b) {
            biggest = Some((c, bench));
        }
    }
    if total.is_some_and(|t| t <= cap) {
        return Ok(());
    }
    let shown = total.map_or_else(|| "more than 18446744073709551615".to_string(), |t| t.to_string());
    let (pos, detail) = match biggest {
        Some((_, b)) => {
            let mut axes: Vec<String> = b
                .matrix
                .iter()
                .flat_map(|m| m.value.iter())
                .map(|(k, v)| format!("{k}: {}", v.len()))
                .collect();
            if axes.len() > 12 {
                let more = axes.len() - 12;
                axes.truncate(12);
                axes.push(format!("{more} more axes"));
            }
            (
                b.matrix
                    .as_ref()
                    .and_then(|m| Pos::from_loc(m.referenced))
                    .or_else(|| Pos::from_loc(b.name.referenced)),
                format!(
                    " (the largest, benchmark `{}`: {})",
                    b.name.value,
                    axes.join(", ")
                ),
            )
        }
        None => (None, String::new()),
    };
    Err((
        pos,
        format!("the suite expands to {shown} cells{detail}, more than the limit of {cap}"),
        "make the matrix smaller, or raise the limit with `max_cells: N` at the top of the suite",
    ))
}

fn matrix_combos(bench: &Benchmark) -> Result<Vec<BTreeMap<String, Value>>, LocMsg> {
    let Some(matrix) = &bench.matrix else {
        return Ok(vec![BTreeMap::new()]);
    };
    let pos = Pos::from_loc(matrix.referenced);
    let mut combos = vec![BTreeMap::new()];
    for (key, values) in &matrix.value {
        if key == "gpu" || key == "gpus" {
            return Err((
                pos,
                "`matrix` may not have a `gpu` key".into(),
                "list GPUs under `gpus:` (suite or benchmark); they form the matrix's GPU axis",
            ));
        }
        if BUILTIN_VARS.contains(&key.as_str()) {
            return Err((
                pos,
                format!("`matrix` key `{key}` is reserved"),
                "rename the parameter",
            ));
        }
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err((
                pos,
                format!("`matrix` key `{key}` is not a valid name"),
                "parameter names use letters, digits and `_`",
            ));
        }
        if values.is_empty() {
            return Err((
                pos,
                format!("`matrix.{key}` has no values"),
                "give at least one value, or remove the key",
            ));
        }
        if let Some(v) = values
            .iter()
            .find(|v| v.is_array() || v.is_object() || v.is_null())
        {
            return Err((
                pos,
                format!("`matrix.{key}` has a value that is not a scalar: {v}"),
                "matrix values are strings, numbers or booleans",
            ));
        }
        let mut next = Vec::with_capacity(combos.len() * values.len());
        for c in &combos {
            for v in values {
                let mut c = c.clone();
                c.insert(key.clone(), v.clone());
                next.push(c);
            }
        }
        combos = next;
    }
    for ex in &bench.exclude {
        for k in ex.keys() {
            if k != "gpu" && !matrix.value.contains_key(k) {
                return Err((
                    pos,
                    format!("`exclude` names `{k}`, which is not a matrix parameter"),
                    "exclude entries use matrix keys (and `gpu`)",
                ));
            }
        }
    }
    Ok(combos)
}

fn excluded(exclude: &[BTreeMap<String, Value>], gpu: &GpuSpec, params: &BTreeMap<String, Value>) -> bool {
    exclude.iter().any(|ex| {
        ex.iter().all(|(k, v)| {
            if k == "gpu" {
                let text = scalar_text(v);
                GpuSpec::parse(&text).map(|g| g == *gpu).unwrap_or(false)
            } else {
                params
                    .get(k)
                    .map(|p| scalar_text(p) == scalar_text(v))
                    .unwrap_or(false)
            }
        })
    })
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `<benchmark>.<gpu>[.<param>-<value>...]`, lowercase, filesystem-safe.
pub fn cell_id(bench: &str, gpu: &GpuSpec, params: &BTreeMap<String, Value>) -> String {
    let mut id = format!("{}.{}", bench, gpu.slug());
    for (k, v) in params {
        id.push('.');
        id.push_str(k);
        id.push('-');
        id.push_str(&scalar_text(v));
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn template_vars(
    params: &BTreeMap<String, Value>,
    gpu: &GpuSpec,
    id: &str,
    bench: &str,
) -> BTreeMap<String, String> {
    let mut vars: BTreeMap<String, String> =
        params.iter().map(|(k, v)| (k.clone(), scalar_text(v))).collect();
    vars.insert("gpu".into(), gpu.to_string());
    vars.insert("gpu_count".into(), gpu.count.to_string());
    // Where the cell's files are: the agent expands it in arguments, a
    // shell in a script (`orch-files` sets it on every backend).
    vars.insert("files".into(), "${ORCH_FILES}".into());
    vars.insert("cell".into(), id.to_string());
    vars.insert("benchmark".into(), bench.to_string());
    vars
}

/// Replace `{{name}}` by the value of `name`; an unknown name is an error.
fn substitute(text: &str, vars: &BTreeMap<String, String>) -> Result<String, Msg> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = after[..end].trim();
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err((
                    format!(
                        "unknown placeholder `{{{{{name}}}}}`; known: {}",
                        vars.keys()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    "placeholders name a matrix parameter or one of `gpu`, `gpu_count`, `cell`, `benchmark`, `files` (a campaign's cells also `task`, and `model` and `base` where the row sets them)",
                ))
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

fn instantiate(
    w: &Workload,
    params: &BTreeMap<String, Value>,
    vars: &BTreeMap<String, String>,
) -> Result<Workload, Msg> {
    Ok(match w {
        Workload::Command(c) => Workload::Command(substitute_command(c, vars)?),
        Workload::Builtin(BuiltinWorkload::Transformer(cfg)) => {
            Workload::Builtin(BuiltinWorkload::Transformer(override_transformer(cfg, params)?))
        }
        Workload::Server(s) => Workload::Server(substitute_server(s, vars)?),
        Workload::Compare(c) => Workload::Compare(CompareWorkload {
            server: substitute_server(&c.server, vars)?,
            ..c.clone()
        }),
        other => other.clone(),
    })
}

fn substitute_command(c: &CommandWorkload, vars: &BTreeMap<String, String>) -> Result<CommandWorkload, Msg> {
    Ok(CommandWorkload {
        argv: c
            .argv
            .iter()
            .map(|a| substitute(a, vars))
            .collect::<Result<_, _>>()?,
        workdir: c.workdir.as_deref().map(|d| substitute(d, vars)).transpose()?,
    })
}

fn substitute_server(s: &ServerWorkload, vars: &BTreeMap<String, String>) -> Result<ServerWorkload, Msg> {
    let cmd = substitute_command(
        &CommandWorkload {
            argv: s.argv.clone(),
            workdir: s.workdir.clone(),
        },
        vars,
    )?;
    let client = match &s.client {
        Some(Client::Command(c)) => Some(Client::Command(substitute_command(c, vars)?)),
        Some(Client::Loadgen(l)) => {
            let mut l = l.clone();
            l.model = l.model.as_deref().map(|m| substitute(m, vars)).transpose()?;
            l.endpoint = substitute(&l.endpoint, vars)?;
            l.prompt_file = l
                .prompt_file
                .as_deref()
                .map(|p| substitute(p, vars))
                .transpose()?;
            l.tokenizer = l.tokenizer.as_deref().map(|p| substitute(p, vars)).transpose()?;
            Some(Client::Loadgen(l))
        }
        None => None,
    };
    Ok(ServerWorkload {
        argv: cmd.argv,
        workdir: cmd.workdir,
        ready: s.ready.clone(),
        startup_timeout_s: s.startup_timeout_s,
        client,
    })
}

/// Matrix parameters named like a transformer field set that field.
fn override_transformer(
    cfg: &TransformerConfig,
    params: &BTreeMap<String, Value>,
) -> Result<TransformerConfig, Msg> {
    let mut map = match serde_json::to_value(cfg) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let mut touched = false;
    for (k, v) in params {
        if TRANSFORMER_FIELDS.contains(&k.as_str()) {
            let v = match (k.as_str(), v) {
                // `preset: 2.7B` is a string, but `preset: 1` would be a number.
                ("preset" | "dtype" | "device", Value::Number(n)) => Value::String(n.to_string()),
                _ => v.clone(),
            };
            map.insert(k.clone(), v);
            touched = true;
        }
    }
    if !touched {
        return Ok(cfg.clone());
    }
    serde_json::from_value(Value::Object(map)).map_err(|e| {
        (
            format!("a matrix parameter does not fit the transformer: {e}"),
            "parameters named like transformer fields (`preset`, `batch`, `context`, ...) must have that field's type",
        )
    })
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
