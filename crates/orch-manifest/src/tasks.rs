//! A campaign's task list (`tasks:` of a benchmark): a JSONL, CSV or YAML
//! file whose rows fill the benchmark's comparison template, one compare
//! cell per task (baseline, human, the agent's attempts, an optional A/A).
//!
//! Every row is checked here, before anything runs: an error names the
//! task file, the row (its line) and the field, with a hint (exit 2).
//! `docs/campaigns.md` documents the row fields; keep the two in step.

use crate::error::{ManifestError, Pos};
use crate::gpu::GpuSpec;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The largest task file read (64 MiB: ISO-Bench's 96 rows are a few KiB,
/// inline diffs included).
pub const MAX_TASKS_BYTES: u64 = 64 << 20;

/// The most rows one task file may hold.
pub const MAX_TASKS: usize = 100_000;

/// Variant names a campaign's cells use: the scoring reads them back.
pub const BASELINE: &str = "baseline";
pub const BASELINE_AGAIN: &str = "baseline-again";
pub const HUMAN: &str = "human";
pub const AGENT: &str = "agent";

/// `tasks: FILE`, or `tasks: {file: FILE, aa: true}`, or
/// `tasks: {dataset: org/name, file: PATH, revision: REV}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TasksDef {
    /// The task file (relative: to the manifest's folder), or the file's
    /// path inside `dataset`.
    pub file: String,
    /// A Hugging Face dataset repository holding `file` (set up by `orch setup`).
    pub dataset: Option<String>,
    pub revision: Option<String>,
    /// Add `baseline-again` to every task: an A/A pair that must come out `same`.
    pub aa: bool,
}

impl<'de> Deserialize<'de> for TasksDef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            file: String,
            #[serde(default)]
            dataset: Option<String>,
            #[serde(default)]
            revision: Option<String>,
            #[serde(default)]
            aa: Option<bool>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Path(String),
            Full(Full),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Path(file)) => Ok(TasksDef {
                file,
                dataset: None,
                revision: None,
                aa: false,
            }),
            Ok(Raw::Full(f)) => Ok(TasksDef {
                file: f.file,
                dataset: f.dataset,
                revision: f.revision,
                aa: f.aa.unwrap_or(false),
            }),
            Err(_) => Err(serde::de::Error::custom(
                "invalid `tasks`: write a file (`tasks: tasks.jsonl`) or `{file: tasks.jsonl, aa: true}` or `{dataset: org/name, file: data/tasks.jsonl, revision: main}`",
            )),
        }
    }
}

/// One row as written (JSONL object, CSV record, YAML mapping).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRow {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default)]
    repo: Option<String>,
    #[serde(default, alias = "base_ref", alias = "base_commit")]
    base: Option<String>,
    #[serde(default)]
    human_ref: Option<String>,
    #[serde(default)]
    human_patch: Option<String>,
    #[serde(default)]
    agent_patch: Option<String>,
    #[serde(default)]
    agent_patches: Option<Vec<String>>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default, alias = "gpu")]
    gpus: Option<Value>,
    #[serde(default)]
    install: Option<String>,
    #[serde(default)]
    server: Option<Value>,
    #[serde(default)]
    load: Option<BTreeMap<String, Value>>,
    #[serde(default)]
    labels: Option<BTreeMap<String, Value>>,
}

/// A task as the plan keeps it (`plan.json`): what the scoring reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskInfo {
    /// The row's `id`.
    pub id: String,
    /// The row's number in its file (1 = the first row).
    pub row: usize,
    /// The task file.
    pub file: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The baseline's ref (`None`: the repository's HEAD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The human change's variant, if the row has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub human: Option<String>,
    /// The agent's attempts, in order (`agent`, or `agent-1`..`agent-K`).
    #[serde(default)]
    pub agents: Vec<String>,
    /// The A/A variant, if asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aa: Option<String>,
}

/// A checked row: its variants and overrides, ready to fill the template.
#[derive(Debug, Clone)]
pub struct Task {
    pub info: TaskInfo,
    pub repo: Option<String>,
    pub gpu: Option<GpuSpec>,
    pub install: Option<String>,
    /// Replaces the server's command (`sh -c` for a string).
    pub server: Option<Vec<String>>,
    pub load: BTreeMap<String, Value>,
    /// (name, ref, patch file) of each variant, baseline first.
    pub variants: Vec<(String, Option<String>, Option<String>)>,
    /// Line of the row in its file, when known.
    pub line: Option<u64>,
}

fn row_err(
    file: &Path,
    line: Option<u64>,
    row: usize,
    msg: impl std::fmt::Display,
    hint: &str,
) -> ManifestError {
    ManifestError::invalid(
        file,
        line.map(|line| Pos { line, column: 1 }),
        format!("task row {row}: {msg}"),
        hint,
    )
}

const FIELDS_HINT: &str = "row fields: `id`, `repo`, `base`, `human_ref` or `human_patch`, `agent_patch` or `agent_patches`, `model`, `gpus`, `install`, `server`, `load`, `labels` (docs/campaigns.md)";

/// Where a `tasks:` file is: beside the manifest, or in the host's Hugging
/// Face cache for a dataset (put there by `orch setup`).
pub fn tasks_path(def: &TasksDef, base_dir: &Path, hf_cache: &Path) -> PathBuf {
    match &def.dataset {
        None => {
            let p = Path::new(&def.file);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base_dir.join(p)
            }
        }
        Some(repo) => {
            let folder = hf_cache.join(format!("datasets--{}", repo.replace('/', "--")));
            let rev = def.revision.clone().unwrap_or_else(|| "main".into());
            // A branch or tag names a commit in `refs/`; a commit is its own.
            let commit = std::fs::read_to_string(folder.join("refs").join(&rev))
                .map(|s| s.trim().to_string())
                .unwrap_or(rev);
            folder.join("snapshots").join(commit).join(&def.file)
        }
    }
}

/// The host's Hugging Face hub cache (`HF_HUB_CACHE`, `HF_HOME/hub`,
/// `~/.cache/huggingface/hub`), where `orch setup` puts a task dataset.
pub fn default_hf_cache() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("HF_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("hub");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/huggingface/hub"),
        None => std::env::temp_dir().join("huggingface/hub"),
    }
}

/// Where inline diffs are kept: `task-patches/` in orch's cache
/// (`ORCH_CACHE_DIR`, `$XDG_CACHE_HOME/orch`, `~/.cache/orch`: the rule of
/// `orch_files::default_cache_dir`), so a resumed run finds them.
pub fn default_patch_dir() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|d| !d.is_empty()).map(PathBuf::from);
    let cache = env("ORCH_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("orch")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/orch")))
        .unwrap_or_else(|| std::env::temp_dir().join("orch-cache"));
    cache.join("task-patches")
}

/// Read and check every row of a task file. `patch_dir` is where inline
/// diffs are written (content-addressed), so that they travel as files.
pub fn load_tasks(file: &Path, def: &TasksDef, patch_dir: &Path) -> Result<Vec<Task>, ManifestError> {
    use std::io::Read;
    let read_err = |source: std::io::Error| {
        let hint = if def.dataset.is_some() {
            "run `orch setup -f MANIFEST` first: it fetches the task dataset into the Hugging Face cache"
        } else {
            "check `tasks:`: a path relative to the manifest's folder"
        };
        ManifestError::invalid(file, None, format!("cannot read the task file: {source}"), hint)
    };
    let mut text = String::new();
    std::fs::File::open(file)
        .map_err(read_err)?
        .take(MAX_TASKS_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(read_err)?;
    if text.len() as u64 > MAX_TASKS_BYTES {
        return Err(ManifestError::invalid(
            file,
            None,
            format!("the task file is larger than {} MiB", MAX_TASKS_BYTES >> 20),
            "split the campaign into several task files",
        ));
    }
    let name = file.to_string_lossy().to_ascii_lowercase();
    let rows: Vec<(Option<u64>, Value)> = if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        jsonl_rows(&text, file)?
    } else if name.ends_with(".csv") {
        csv_rows(&text, file)?
    } else if name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json") {
        yaml_rows(&text, file)?
    } else {
        return Err(ManifestError::invalid(
            file,
            None,
            "the task file is not `.jsonl`, `.csv`, `.yaml` or `.json`",
            "name it after its format: `tasks.jsonl` (one JSON object a line), `tasks.csv` (a header row) or `tasks.yaml` (a list of rows)",
        ));
    };
    if rows.is_empty() {
        return Err(ManifestError::invalid(
            file,
            None,
            "the task file has no rows",
            "a campaign needs at least one task",
        ));
    }
    if rows.len() > MAX_TASKS {
        return Err(ManifestError::invalid(
            file,
            None,
            format!("the task file has {} rows, more than {MAX_TASKS}", rows.len()),
            "split the campaign into several task files",
        ));
    }
    let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut seen = BTreeMap::<String, usize>::new();
    let mut tasks = Vec::with_capacity(rows.len());
    for (i, (line, value)) in rows.into_iter().enumerate() {
        let row = i + 1;
        let raw: RawRow =
            serde_json::from_value(value).map_err(|e| row_err(file, line, row, e, FIELDS_HINT))?;
        let task = check_row(raw, row, line, file, &dir, def, patch_dir)?;
        if let Some(first) = seen.insert(task.info.id.clone(), row) {
            return Err(row_err(
                file,
                line,
                row,
                format!("`id` `{}` is also row {first}'s", task.info.id),
                "give every task its own `id`",
            ));
        }
        tasks.push(task);
    }
    Ok(tasks)
}

fn jsonl_rows(text: &str, file: &Path) -> Result<Vec<(Option<u64>, Value)>, ManifestError> {
    let mut rows = Vec::new();
    for (n, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with("//") {
            continue;
        }
        let line = n as u64 + 1;
        let v: Value = serde_json::from_str(t).map_err(|e| {
            ManifestError::invalid(
                file,
                Some(Pos {
                    line,
                    column: e.column() as u64,
                }),
                format!("task row {}: not a JSON object: {e}", rows.len() + 1),
                "a `.jsonl` task file holds one JSON object per line",
            )
        })?;
        rows.push((Some(line), v));
    }
    Ok(rows)
}

fn yaml_rows(text: &str, file: &Path) -> Result<Vec<(Option<u64>, Value)>, ManifestError> {
    let items: Vec<serde_saphyr::Spanned<Value>> = serde_saphyr::from_str(text).map_err(|e| {
        let message = crate::error::yaml_message(&e);
        ManifestError::invalid(
            file,
            e.location().and_then(Pos::from_loc),
            format!("the task file: {message}"),
            "a YAML task file is a list of rows, each a mapping (`- {id: t1, base: abc123, agent_patch: t1.patch}`)",
        )
    })?;
    Ok(items
        .into_iter()
        .map(|s| (Pos::from_loc(s.referenced).map(|p| p.line), s.value))
        .collect())
}

/// A CSV record as the JSON object a row would be: `agent_patches` split on
/// `;`, `load.FIELD` and `labels.KEY` (or `label.KEY`) columns gathered,
/// numbers in `load` read as numbers, empty cells left out.
fn csv_rows(text: &str, file: &Path) -> Result<Vec<(Option<u64>, Value)>, ManifestError> {
    let mut reader = csv::ReaderBuilder::new()
        .flexible(false)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| {
            ManifestError::invalid(
                file,
                Some(Pos { line: 1, column: 1 }),
                format!("the header row: {e}"),
                "a `.csv` task file starts with a header row naming the fields",
            )
        })?
        .clone();
    let mut rows = Vec::new();
    for rec in reader.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map(|p| p.line());
            ManifestError::invalid(
                file,
                line.map(|line| Pos { line, column: 1 }),
                format!("task row {}: {e}", rows.len() + 1),
                "every row has as many columns as the header; quote a value holding a comma",
            )
        })?;
        let line = rec.position().map(|p| p.line());
        let mut obj = serde_json::Map::new();
        let mut load = serde_json::Map::new();
        let mut labels = serde_json::Map::new();
        for (k, v) in header.iter().zip(rec.iter()) {
            if v.is_empty() {
                continue;
            }
            if let Some(f) = k.strip_prefix("load.") {
                let val = serde_json::from_str::<Value>(v)
                    .ok()
                    .filter(|x| x.is_number() || x.is_boolean())
                    .unwrap_or_else(|| Value::String(v.to_string()));
                load.insert(f.to_string(), val);
            } else if let Some(l) = k.strip_prefix("labels.").or_else(|| k.strip_prefix("label.")) {
                labels.insert(l.to_string(), Value::String(v.to_string()));
            } else if k == "agent_patches" {
                obj.insert(
                    k.into(),
                    Value::Array(
                        v.split(';')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(|s| Value::String(s.into()))
                            .collect(),
                    ),
                );
            } else {
                obj.insert(k.to_string(), Value::String(v.to_string()));
            }
        }
        if !load.is_empty() {
            obj.insert("load".into(), Value::Object(load));
        }
        if !labels.is_empty() {
            obj.insert("labels".into(), Value::Object(labels));
        }
        rows.push((line, Value::Object(obj)));
    }
    Ok(rows)
}

/// An inline diff rather than a path: several lines, diff markers.
fn is_inline_diff(s: &str) -> bool {
    s.contains('\n')
        && (s.contains("diff --git") || s.contains("\n+++ ") || s.starts_with("--- ") || s.contains("\n@@"))
}

fn check_row(
    raw: RawRow,
    row: usize,
    line: Option<u64>,
    file: &Path,
    dir: &Path,
    def: &TasksDef,
    patch_dir: &Path,
) -> Result<Task, ManifestError> {
    let err = |msg: String, hint: &str| row_err(file, line, row, msg, hint);
    let id = match raw.id {
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => {
            return Err(err(
                "`id` must be a text or a number".into(),
                "e.g. `\"id\": \"8aa1485f\"`",
            ))
        }
        None => {
            return Err(err(
                "no `id`".into(),
                "every row names its task: `\"id\": \"8aa1485f\"`",
            ))
        }
    };
    if id.len() > 64
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || id.starts_with('.')
    {
        return Err(err(
            format!("`id` `{id}` is not a task name"),
            "use at most 64 letters, digits, `-`, `_` and `.` (it names the task's cell in the store)",
        ));
    }
    let nonempty = |field: &str, v: Option<String>| -> Result<Option<String>, ManifestError> {
        match v {
            Some(s) if s.trim().is_empty() => Err(err(
                format!("`{field}` is empty"),
                "leave the field out, or give it a value",
            )),
            other => Ok(other.map(|s| s.trim_end_matches('\n').to_string())),
        }
    };
    let repo = nonempty("repo", raw.repo)?.map(|r| {
        let remote = r.contains("://") || r.starts_with("git@");
        if remote || Path::new(&r).is_absolute() {
            r
        } else {
            dir.join(r).to_string_lossy().into_owned()
        }
    });
    let base = nonempty("base", raw.base)?;
    let human_ref = nonempty("human_ref", raw.human_ref)?;
    let human_patch = nonempty("human_patch", raw.human_patch)?;
    if human_ref.is_some() && human_patch.is_some() {
        return Err(err(
            "both `human_ref` and `human_patch`".into(),
            "the human change is a ref (the commit) or a patch against `base`, not both",
        ));
    }
    let agent_patches = match (nonempty("agent_patch", raw.agent_patch)?, raw.agent_patches) {
        (Some(_), Some(_)) => {
            return Err(err(
                "both `agent_patch` and `agent_patches`".into(),
                "one attempt is `agent_patch`; several (Opt@K) are `agent_patches: [...]`",
            ))
        }
        (Some(p), None) => vec![p],
        (None, Some(ps)) => {
            if ps.is_empty() {
                return Err(err(
                    "`agent_patches` is empty".into(),
                    "list the agent's attempts, or leave the field out",
                ));
            }
            if ps.len() > 64 {
                return Err(err(
                    format!("`agent_patches` has {} attempts; the most is 64", ps.len()),
                    "Opt@K is reported for K up to the attempts given",
                ));
            }
            ps
        }
        (None, None) => Vec::new(),
    };
    if human_ref.is_none() && human_patch.is_none() && agent_patches.is_empty() {
        return Err(err(
            "nothing to compare with the baseline".into(),
            "give the row `human_ref` or `human_patch`, and `agent_patch` or `agent_patches`",
        ));
    }
    let patch_file = |field: &str, p: String| -> Result<String, ManifestError> {
        if is_inline_diff(&p) {
            return write_inline(&p, patch_dir).map_err(|e| {
                err(
                    format!(
                        "`{field}`: cannot keep the inline diff in `{}`: {e}",
                        patch_dir.display()
                    ),
                    "check that the cache folder is writable (`ORCH_CACHE_DIR`)",
                )
            });
        }
        let path = if Path::new(&p).is_absolute() {
            PathBuf::from(&p)
        } else {
            dir.join(&p)
        };
        if !path.is_file() {
            return Err(err(
                format!("`{field}`: no patch file `{}`", path.display()),
                "a patch path is relative to the task file's folder; an inline diff starts with `diff --git` or `--- `",
            ));
        }
        Ok(path.to_string_lossy().into_owned())
    };
    let human_patch = human_patch.map(|p| patch_file("human_patch", p)).transpose()?;
    let mut agents = Vec::new();
    for (i, p) in agent_patches.into_iter().enumerate() {
        let field = if i == 0 {
            "agent_patch".to_string()
        } else {
            format!("agent_patches[{i}]")
        };
        agents.push(patch_file(&field, p)?);
    }
    let model = nonempty("model", raw.model)?;
    if let Some(m) = &model {
        let parts: Vec<&str> = m.split('/').collect();
        if parts.len() != 2
            || parts
                .iter()
                .any(|p| p.is_empty() || p.contains(char::is_whitespace))
        {
            return Err(err(
                format!("`model` `{m}` is not a Hugging Face repository"),
                "write `org/name`, e.g. `meta-llama/Llama-3.1-8B-Instruct`",
            ));
        }
    }
    let gpu = match raw.gpus {
        None => None,
        Some(Value::String(s)) => Some(GpuSpec::parse(&s).map_err(|e| {
            err(
                format!("`gpus` `{s}`: {e}"),
                "write one GPU spec, `TYPE[:COUNT]` (`H100:2`), or `none`",
            )
        })?),
        Some(other) => {
            return Err(err(
                format!("`gpus` must be a GPU spec such as `H100:2`, not `{other}`"),
                "write one GPU spec, `TYPE[:COUNT]` (`H100:2`)",
            ))
        }
    };
    let install = nonempty("install", raw.install)?;
    let server = match raw.server {
        None => None,
        Some(Value::String(s)) if !s.trim().is_empty() => Some(vec!["sh".into(), "-c".into(), s]),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => Some(
            a.into_iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect(),
        ),
        Some(_) => {
            return Err(err(
                "`server` must be a command line (text, run with `sh -c`) or a list of arguments".into(),
                "e.g. `\"server\": [\"vllm\", \"serve\", \"org/model\", \"--port\", \"8000\"]`",
            ))
        }
    };
    let mut labels = BTreeMap::new();
    for (k, v) in raw.labels.unwrap_or_default() {
        let text = match v {
            Value::String(s) => s,
            Value::Null => continue,
            Value::Array(_) | Value::Object(_) => {
                return Err(err(
                    format!("`labels.{k}` must be a text, number or boolean"),
                    "labels are free-form `key: value` pairs the report groups by",
                ))
            }
            other => other.to_string(),
        };
        labels.insert(k, text);
    }
    let mut variants = vec![(BASELINE.to_string(), base.clone(), None)];
    let human = if human_ref.is_some() || human_patch.is_some() {
        variants.push((
            HUMAN.to_string(),
            human_ref.clone().or_else(|| base.clone()),
            human_patch,
        ));
        Some(HUMAN.to_string())
    } else {
        None
    };
    let mut agent_names = Vec::new();
    let many = agents.len() > 1;
    for (i, p) in agents.into_iter().enumerate() {
        let name = if many {
            format!("{AGENT}-{}", i + 1)
        } else {
            AGENT.to_string()
        };
        variants.push((name.clone(), base.clone(), Some(p)));
        agent_names.push(name);
    }
    let aa = def.aa.then(|| {
        variants.push((BASELINE_AGAIN.to_string(), base.clone(), None));
        BASELINE_AGAIN.to_string()
    });
    Ok(Task {
        info: TaskInfo {
            id,
            row,
            file: file.to_string_lossy().into_owned(),
            labels,
            model,
            base,
            human,
            agents: agent_names,
            aa,
        },
        repo,
        gpu,
        install,
        server,
        load: raw.load.unwrap_or_default(),
        variants,
        line,
    })
}

/// An inline diff kept as `<dir>/<sha256>.patch` (the same diff, the same
/// file; written once, atomically).
fn write_inline(diff: &str, dir: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    let mut text = diff.to_string();
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let hash = sha2::Sha256::digest(text.as_bytes());
    let name: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let path = dir.join(format!("{name}.patch"));
    if !path.is_file() {
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(path.to_string_lossy().into_owned())
}

/// The distinct models of a task list, in first-seen order, with the ids of
/// the tasks each one serves.
pub fn models_of(tasks: &[Task]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut index = BTreeMap::new();
    for t in tasks {
        if let Some(m) = &t.info.model {
            let i = *index.entry(m.clone()).or_insert_with(|| {
                out.push((m.clone(), Vec::new()));
                out.len() - 1
            });
            out[i].1.push(t.info.id.clone());
        }
    }
    out
}

/// Names of the load generator's fields a row's `load` may set.
pub fn check_load_keys(keys: &BTreeSet<String>, known: &BTreeSet<String>) -> Result<(), String> {
    match keys.iter().find(|k| !known.contains(*k)) {
        None => Ok(()),
        Some(k) => Err(format!(
            "`load.{k}` is not a load generator field; known: {}",
            known
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def() -> TasksDef {
        TasksDef {
            file: "t".into(),
            dataset: None,
            revision: None,
            aa: false,
        }
    }

    fn load(name: &str, text: &str) -> Result<Vec<Task>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.patch"), "--- a/x\n+++ b/x\n").unwrap();
        let f = dir.path().join(name);
        std::fs::write(&f, text).unwrap();
        load_tasks(&f, &def(), &dir.path().join("inline")).map_err(|e| e.to_string())
    }

    #[test]
    fn jsonl_rows_become_variants() {
        let t = load(
            "t.jsonl",
            r#"{"id": "t1", "base": "abc", "human_ref": "def", "agent_patch": "a.patch", "gpus": "H100:2", "labels": {"k": 1}}
# a comment
{"id": 7, "base": "abc", "agent_patches": ["a.patch", "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"]}
"#,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].info.human.as_deref(), Some("human"));
        assert_eq!(t[0].variants[1].1.as_deref(), Some("def"));
        assert_eq!(t[0].gpu.unwrap().count, 2);
        assert_eq!(t[0].info.labels["k"], "1");
        assert_eq!(t[1].info.id, "7");
        assert_eq!(t[1].info.agents, vec!["agent-1", "agent-2"]);
        assert!(t[1].variants[2].2.as_deref().unwrap().ends_with(".patch"));
        assert_eq!(t[1].line, Some(3));
    }

    #[test]
    fn errors_name_the_row_line_and_field() {
        let e = load(
            "t.jsonl",
            "{\"id\": \"a\", \"agent_patch\": \"a.patch\"}\n{\"id\": \"b\", \"agnet_patch\": \"x\"}\n",
        )
        .unwrap_err();
        assert!(
            e.contains("t.jsonl:2:1: task row 2: unknown field `agnet_patch`"),
            "{e}"
        );
        let e = load("t.jsonl", "{\"id\": \"a\", \"agent_patch\": \"missing.patch\"}\n").unwrap_err();
        assert!(e.contains("task row 1: `agent_patch`: no patch file"), "{e}");
        let e = load(
            "t.jsonl",
            "{\"id\": \"a\", \"agent_patch\": \"a.patch\", \"gpus\": \"H100:x\"}\n",
        )
        .unwrap_err();
        assert!(e.contains("task row 1: `gpus` `H100:x`"), "{e}");
        let e = load("t.jsonl", "{\"id\": \"a\"}\n").unwrap_err();
        assert!(e.contains("nothing to compare"), "{e}");
        let e = load(
            "t.jsonl",
            "{\"id\": \"a\", \"agent_patch\": \"a.patch\"}\n{\"id\": \"a\", \"agent_patch\": \"a.patch\"}\n",
        )
        .unwrap_err();
        assert!(e.contains("task row 2: `id` `a` is also row 1's"), "{e}");
        let e = load("t.jsonl", "{\"id\": \"a b\", \"agent_patch\": \"a.patch\"}\n").unwrap_err();
        assert!(e.contains("not a task name"), "{e}");
        let e = load(
            "t.jsonl",
            "{\"id\": \"a\", \"agent_patch\": \"a.patch\", \"model\": \"llama\"}\n",
        )
        .unwrap_err();
        assert!(e.contains("`model` `llama`"), "{e}");
    }

    #[test]
    fn a_dataset_file_is_read_from_the_hub_cache_layout() {
        let cache = tempfile::tempdir().unwrap();
        let folder = cache.path().join("datasets--org--bench");
        std::fs::create_dir_all(folder.join("refs")).unwrap();
        std::fs::write(folder.join("refs/main"), "abc123\n").unwrap();
        let def = TasksDef {
            file: "data/tasks.jsonl".into(),
            dataset: Some("org/bench".into()),
            revision: None,
            aa: false,
        };
        let p = tasks_path(&def, Path::new("/m"), cache.path());
        assert_eq!(p, folder.join("snapshots/abc123/data/tasks.jsonl"));
        // A commit as the revision names its own snapshot.
        let def = TasksDef {
            revision: Some("def456".into()),
            ..def
        };
        assert_eq!(
            tasks_path(&def, Path::new("/m"), cache.path()),
            folder.join("snapshots/def456/data/tasks.jsonl")
        );
    }

    #[test]
    fn csv_and_yaml_read_the_same_rows() {
        let t = load(
            "t.csv",
            "id,base,human_patch,agent_patches,load.num_prompts,label.kind\nt1,abc,a.patch,a.patch;a.patch,16,fast\n",
        )
        .unwrap();
        assert_eq!(t[0].info.agents.len(), 2);
        assert_eq!(t[0].load["num_prompts"], 16);
        assert_eq!(t[0].info.labels["kind"], "fast");
        assert_eq!(t[0].line, Some(2));
        let t = load(
            "t.yaml",
            "- id: t1\n  agent_patch: a.patch\n- id: t2\n  human_ref: abc\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].line, Some(3));
        let e = load("t.csv", "id,bogus\nt1,x\n").unwrap_err();
        assert!(e.contains("t.csv:2:1: task row 1: unknown field `bogus`"), "{e}");
    }
}
