//! The host files that travel with a cell.
//!
//! A suite names files of the machine that runs `orch`: a command's
//! `workdir`, a comparison's local `repo` and its variants' `patch` files, the
//! load generator's `prompt_file`, and the paths of its `sync:` section. A
//! cell that runs elsewhere (a container, a pod, a sandbox, a compute node)
//! gets copies of them:
//!
//! - **What travels** ([`Files::shipment`]): every file the task names; every
//!   file under a folder it names, walked with the ignore rules people
//!   already keep (`.gitignore`, `.dockerignore`, `.orchignore`, and
//!   `sync.ignore`), never `.git`; a local repository as a git bundle of
//!   HEAD and the refs the variants name (so a variant checks out inside the
//!   cell exactly as on the host); the `sync.paths`. Over `sync.max_size`
//!   the cell is refused, naming the largest files.
//! - **Where it lands**: under one root (`/orch/files` in a container),
//!   keeping the files' layout relative to each other (the common folder
//!   of their parents is the root), so a workdir's `../common/util.py` in
//!   `sync.paths` is still at `../common/util.py`. A repository `R` lands as
//!   `R.bundle`. [`Shipment::apply`] rewrites the task's paths to their
//!   landing places, sets `ORCH_FILES` to the root, and lists the files
//!   with their digests in `task.files`, which the agent lays out and checks.
//! - **Content-addressed**: every file is staged once as a blob named by
//!   its SHA-256 in the host's cache (`$ORCH_CACHE_DIR`, else
//!   `$XDG_CACHE_HOME/orch`, else `~/.cache/orch`): a transport sends a blob
//!   the other side does not have yet, and only once.
//! - **A dirty tree** ([`Files::prepare`]): a clone does not carry the
//!   uncommitted changes of a local repository, so a variant that checks
//!   out HEAD would not run what the user sees. Such a suite is refused,
//!   or, with `sync: {dirty: patch}`, the changes (`git diff HEAD`) are
//!   applied on top of those variants' checkouts, on every backend alike.
//!
//! It does not: send anything (each backend's transport does), or make a
//! shallow bundle (a bundle of a shallow history cannot be cloned; a local
//! repository travels with the full history of the refs it needs).

use orch_protocol::paths::PathRole;
use orch_protocol::{FileEntry, FileSet, TaskSpec, Workload};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

/// Where the files land in a container, pod or sandbox.
pub const CELL_ROOT: &str = "/orch/files";
/// Where a container's transport puts the blobs.
pub const CELL_BLOBS: &str = "/orch/blobs";
/// The environment variable naming the root where the files landed.
pub const ENV_FILES: &str = "ORCH_FILES";
/// `sync.max_size` when the suite sets none.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

/// What to do with the uncommitted changes of a local repository.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dirty {
    /// Refuse the suite (the default: a clone would not carry them).
    #[default]
    Refuse,
    /// Ship them as a patch applied on top of HEAD's checkouts.
    Patch,
}

/// The suite's `sync:` section, resolved (absolute paths).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SyncSpec {
    /// Paths that travel besides those the task names.
    pub paths: Vec<PathBuf>,
    /// Ignore patterns (gitignore syntax) on top of the ignore files.
    pub ignore: Vec<String>,
    /// The most one cell's files may come to.
    pub max_bytes: u64,
    pub dirty: Dirty,
}

impl Default for SyncSpec {
    fn default() -> Self {
        SyncSpec {
            paths: Vec::new(),
            ignore: Vec::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            dirty: Dirty::Refuse,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("the {what} `{path}` does not exist on this machine\nhint: paths in a suite are relative to the suite file; fix the path or create it")]
    Missing { what: String, path: String },
    #[error("the files of cell `{cell}` come to {total}, over `sync.max_size` ({cap}); the largest: {largest}\nhint: leave them out with `sync.ignore` (or a `.gitignore`/`.dockerignore`), or raise `sync.max_size`")]
    TooLarge {
        cell: String,
        total: String,
        cap: String,
        largest: String,
    },
    #[error("the repository `{repo}` has uncommitted changes ({files}), which a clone of it does not carry\nhint: commit them, or set `sync: {{dirty: patch}}` to apply them to every variant that checks out HEAD")]
    Dirty { repo: String, files: String },
    #[error("the repository `{repo}`: {message}\nhint: {hint}")]
    Git {
        repo: String,
        message: String,
        hint: &'static str,
    },
    #[error("cannot {what}: {source}")]
    Io { what: String, source: std::io::Error },
}

impl FilesError {
    /// A mistake in the suite or the user's files (exit 2), not a failure
    /// of this machine.
    pub fn is_user(&self) -> bool {
        !matches!(self, FilesError::Io { .. })
    }
}

impl orch_protocol::ErrorClass for FilesError {
    fn is_user_error(&self) -> bool {
        self.is_user()
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FilesError {
    let what = what.into();
    move |source| FilesError::Io { what, source }
}

/// One file that travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Where it lands, relative to the root.
    pub rel: String,
    pub sha256: String,
    pub size: u64,
    pub executable: bool,
    /// The staged copy in the host's cache (`<cache>/blobs/<sha256>`).
    pub blob: PathBuf,
    /// What it is to the cell (`workdir`, `repo`, `patch`, `prompt_file`,
    /// `sync`).
    pub role: &'static str,
}

/// What travels with one cell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shipment {
    pub items: Vec<Item>,
    /// The host folder the root stands for.
    pub base: PathBuf,
    /// Each path the task names (as written there) → where it lands,
    /// relative to the root.
    rewrites: BTreeMap<String, String>,
}

impl Shipment {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.rewrites.is_empty()
    }

    pub fn total_bytes(&self) -> u64 {
        self.items.iter().map(|i| i.size).sum()
    }

    /// Each blob once: (sha256, staged path, size).
    pub fn blobs(&self) -> Vec<(&str, &Path, u64)> {
        let mut seen = std::collections::BTreeSet::new();
        self.items
            .iter()
            .filter(|i| seen.insert(i.sha256.as_str()))
            .map(|i| (i.sha256.as_str(), i.blob.as_path(), i.size))
            .collect()
    }

    /// The task as the cell sees it: its paths under `root`, `ORCH_FILES`
    /// set, and the files the agent lays out from `blobs`.
    pub fn apply(&self, task: &mut TaskSpec, root: &str, blobs: &str) {
        if self.is_empty() {
            return;
        }
        let root = root.trim_end_matches('/');
        let at = |rel: &str| {
            if rel.is_empty() {
                root.to_string()
            } else {
                format!("{root}/{rel}")
            }
        };
        task.rewrite_local_paths(|_, p| {
            self.rewrites
                .get(p)
                .map(|rel| at(rel))
                .unwrap_or_else(|| p.to_string())
        });
        task.env.insert(ENV_FILES.into(), root.to_string());
        task.files = Some(FileSet {
            blobs: blobs.to_string(),
            root: root.to_string(),
            files: self
                .items
                .iter()
                .map(|i| FileEntry {
                    path: at(&i.rel),
                    sha256: i.sha256.clone(),
                    size: i.size,
                    executable: i.executable,
                })
                .collect(),
        });
    }

    /// What travels, for `--dry-run`: one line per file, then the total.
    pub fn listing(&self, root: &str) -> String {
        let mut out = String::new();
        for i in &self.items {
            out.push_str(&format!(
                "  {}/{}  {}  sha256:{}  ({})\n",
                root.trim_end_matches('/'),
                i.rel,
                human_bytes(i.size),
                &i.sha256[..16],
                i.role
            ));
        }
        out.push_str(&format!(
            "  {} file{}, {} (from `{}`)\n",
            self.items.len(),
            if self.items.len() == 1 { "" } else { "s" },
            human_bytes(self.total_bytes()),
            self.base.display()
        ));
        out
    }
}

/// `1.5 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The host's cache folder for orch.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ORCH_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("orch");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/orch"),
        None => std::env::temp_dir().join("orch-cache"),
    }
}

/// One path the task names, resolved.
struct Named {
    /// As the task writes it.
    text: String,
    role: PathRole,
    /// Canonical host path.
    path: PathBuf,
}

/// The files of a run's cells: staging into the cache and shipments,
/// computed once per set of paths.
pub struct Files {
    cache: PathBuf,
    sync: SyncSpec,
    memo: Mutex<HashMap<Vec<String>, Arc<Shipment>>>,
    /// Each folder or file walked once: canonical path → (rel inside it, item).
    walked: Mutex<HashMap<PathBuf, Walked>>,
}

/// The files under a path that travel: (where inside it, the staged file).
type Walked = Arc<Vec<(String, Item)>>;

impl Files {
    pub fn new(cache: PathBuf, sync: SyncSpec) -> Files {
        Files {
            cache,
            sync,
            memo: Mutex::new(HashMap::new()),
            walked: Mutex::new(HashMap::new()),
        }
    }

    /// The folder of staged blobs, each named by its SHA-256.
    pub fn blobs_dir(&self) -> PathBuf {
        self.cache.join("blobs")
    }

    pub fn sync(&self) -> &SyncSpec {
        &self.sync
    }

    /// Before the run is made, for every backend: a local repository's
    /// uncommitted changes refused or turned into the comparison's
    /// `worktree_patch`, and `ORCH_FILES` set to the host folder the
    /// cell's root stands for. Idempotent.
    pub fn prepare(&self, task: &mut TaskSpec) -> Result<(), FilesError> {
        self.prepare_repo(task)?;
        // `$ORCH_FILES` on this machine: the folder the cell's root stands
        // for, so a workload that uses it runs alike everywhere (a backend
        // that ships the files points it at the copies).
        let named = task.local_paths().into_iter().map(|(_, p)| PathBuf::from(p));
        let cache = std::fs::canonicalize(&self.cache).unwrap_or(self.cache.clone());
        let paths: Vec<PathBuf> = named
            .chain(self.sync.paths.iter().cloned())
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .filter(|p| !p.starts_with(&cache))
            .collect();
        if !paths.is_empty() {
            let base = common_parent(paths.iter().map(PathBuf::as_path));
            task.env
                .insert(ENV_FILES.into(), base.to_string_lossy().into_owned());
        }
        Ok(())
    }

    fn prepare_repo(&self, task: &mut TaskSpec) -> Result<(), FilesError> {
        let Workload::Compare(c) = &mut task.workload else {
            return Ok(());
        };
        let Some(repo) = c.repo.clone().filter(|r| orch_protocol::paths::is_local_repo(r)) else {
            return Ok(());
        };
        if c.worktree_patch.is_some() || c.variants.iter().all(|v| v.git_ref.is_some()) {
            return Ok(());
        }
        if !Path::new(&repo).exists() {
            return Err(FilesError::Missing {
                what: "repository".into(),
                path: repo,
            });
        }
        let status = git(&repo, &["status", "--porcelain", "--untracked-files=no"])?;
        let changed: Vec<String> = String::from_utf8_lossy(&status)
            .lines()
            .filter_map(|l| l.get(3..).map(|f| format!("`{f}`")))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        match self.sync.dirty {
            Dirty::Refuse => {
                let mut files = changed.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
                if changed.len() > 3 {
                    files.push_str(&format!(" and {} more", changed.len() - 3));
                }
                Err(FilesError::Dirty { repo, files })
            }
            Dirty::Patch => {
                let diff = git(&repo, &["diff", "HEAD", "--binary"])?;
                let dir = self.cache.join("worktree");
                std::fs::create_dir_all(&dir).map_err(io(format!("create `{}`", dir.display())))?;
                let path = dir.join(format!("{}.patch", hex(&Sha256::digest(&diff))));
                write_atomic(&path, &diff)?;
                c.worktree_patch = Some(path.to_string_lossy().into_owned());
                Ok(())
            }
        }
    }

    /// What travels with this task's cell (staged in the cache).
    pub fn shipment(&self, task: &TaskSpec) -> Result<Arc<Shipment>, FilesError> {
        let named = task.local_paths();
        let key: Vec<String> = named.iter().map(|(r, p)| format!("{}:{p}", r.as_str())).collect();
        if let Some(s) = self.memo.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(s);
        }
        let mut resolved = Vec::new();
        for (role, text) in named {
            let path = std::fs::canonicalize(&text).map_err(|_| FilesError::Missing {
                what: role.as_str().replace('_', " "),
                path: text.clone(),
            })?;
            resolved.push(Named { text, role, path });
        }
        let mut sync = Vec::new();
        for p in &self.sync.paths {
            sync.push(std::fs::canonicalize(p).map_err(|_| FilesError::Missing {
                what: "`sync.paths` entry".into(),
                path: p.display().to_string(),
            })?);
        }
        let shipment = Arc::new(self.build(task, &resolved, &sync)?);
        if let Ok(mut m) = self.memo.lock() {
            m.insert(key, shipment.clone());
        }
        Ok(shipment)
    }

    fn build(&self, task: &TaskSpec, named: &[Named], sync: &[PathBuf]) -> Result<Shipment, FilesError> {
        if named.is_empty() && sync.is_empty() {
            return Ok(Shipment::default());
        }
        // What orch made itself (the uncommitted changes' patch, in the
        // cache) lands in `.orch/` and does not move the root.
        let cache = std::fs::canonicalize(&self.cache).unwrap_or(self.cache.clone());
        let ours = |p: &Path| p.starts_with(&cache);
        let base = common_parent(
            named
                .iter()
                .map(|n| n.path.as_path())
                .filter(|p| !ours(p))
                .chain(sync.iter().map(|p| p.as_path())),
        );
        let rel_of = |p: &Path| -> String {
            if ours(p) {
                return format!(".orch/{}", p.file_name().unwrap_or_default().to_string_lossy());
            }
            p.strip_prefix(&base)
                .map(|r| r.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let mut items: BTreeMap<String, Item> = BTreeMap::new();
        let mut rewrites = BTreeMap::new();
        let refs = variant_refs(task);
        for n in named {
            let rel = rel_of(&n.path);
            if n.role == PathRole::Repo {
                let bundle_rel = format!("{rel}.bundle");
                let item = self.bundle(&n.text, &n.path, &refs, &bundle_rel)?;
                items.insert(bundle_rel.clone(), item);
                rewrites.insert(n.text.clone(), bundle_rel);
                continue;
            }
            for (inner, item) in self.walk(&n.path, role_name(n.role))?.iter() {
                let at = join_rel(&rel, inner);
                items.entry(at.clone()).or_insert_with(|| Item {
                    rel: at,
                    ..item.clone()
                });
            }
            rewrites.insert(n.text.clone(), rel);
        }
        for p in sync {
            let rel = rel_of(p);
            for (inner, item) in self.walk(p, "sync")?.iter() {
                let at = join_rel(&rel, inner);
                items.entry(at.clone()).or_insert_with(|| Item {
                    rel: at,
                    ..item.clone()
                });
            }
        }
        let shipment = Shipment {
            items: items.into_values().collect(),
            base,
            rewrites,
        };
        let total = shipment.total_bytes();
        if total > self.sync.max_bytes {
            let mut by_size: Vec<&Item> = shipment.items.iter().collect();
            by_size.sort_by_key(|i| std::cmp::Reverse(i.size));
            let largest = by_size
                .iter()
                .take(3)
                .map(|i| format!("`{}` ({})", i.rel, human_bytes(i.size)))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(FilesError::TooLarge {
                cell: task.cell_id.clone(),
                total: human_bytes(total),
                cap: human_bytes(self.sync.max_bytes),
                largest,
            });
        }
        Ok(shipment)
    }

    /// A file, or every file under a folder that the ignore rules keep, staged.
    fn walk(&self, path: &Path, role: &'static str) -> Result<Walked, FilesError> {
        if let Some(w) = self.walked.lock().ok().and_then(|m| m.get(path).cloned()) {
            return Ok(w);
        }
        let mut out = Vec::new();
        if path.is_file() {
            out.push((String::new(), self.stage(path, role)?));
        } else {
            let mut overrides = ignore::overrides::OverrideBuilder::new(path);
            for pat in &self.sync.ignore {
                overrides.add(&format!("!{pat}")).map_err(|e| FilesError::Git {
                    repo: path.display().to_string(),
                    message: format!("the `sync.ignore` pattern `{pat}` is not valid: {e}"),
                    hint: "write gitignore patterns, e.g. `*.ckpt` or `data/`",
                })?;
            }
            let overrides = overrides.build().map_err(|e| FilesError::Git {
                repo: path.display().to_string(),
                message: format!("the `sync.ignore` patterns are not valid: {e}"),
                hint: "write gitignore patterns, e.g. `*.ckpt` or `data/`",
            })?;
            let walker = ignore::WalkBuilder::new(path)
                .hidden(false)
                .parents(true)
                .git_ignore(true)
                .git_exclude(false)
                .git_global(false)
                .require_git(false)
                .ignore(false)
                .add_custom_ignore_filename(".dockerignore")
                .add_custom_ignore_filename(".orchignore")
                .overrides(overrides)
                .follow_links(false)
                .sort_by_file_name(|a, b| a.cmp(b))
                .filter_entry(|e| e.file_name() != ".git")
                .build();
            for entry in walker {
                let entry = entry.map_err(|e| FilesError::Io {
                    what: format!("walk `{}`", path.display()),
                    source: std::io::Error::other(e.to_string()),
                })?;
                let p = entry.path();
                // A symbolic link travels as the file it points to; a link
                // to a folder or nowhere does not travel.
                if !std::fs::metadata(p).map(|m| m.is_file()).unwrap_or(false) {
                    continue;
                }
                let inner = p
                    .strip_prefix(path)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_default();
                out.push((inner, self.stage(p, role)?));
            }
        }
        let out = Arc::new(out);
        if let Ok(mut m) = self.walked.lock() {
            m.insert(path.to_path_buf(), out.clone());
        }
        Ok(out)
    }

    /// Copy a file into the cache under its digest (once).
    fn stage(&self, path: &Path, role: &'static str) -> Result<Item, FilesError> {
        let dir = self.blobs_dir();
        std::fs::create_dir_all(&dir).map_err(io(format!("create `{}`", dir.display())))?;
        let meta = std::fs::metadata(path).map_err(io(format!("read `{}`", path.display())))?;
        use std::os::unix::fs::PermissionsExt;
        let executable = meta.permissions().mode() & 0o111 != 0;
        let mut input = std::fs::File::open(path).map_err(io(format!("read `{}`", path.display())))?;
        let mut tmp =
            tempfile::NamedTempFile::new_in(&dir).map_err(io(format!("write in `{}`", dir.display())))?;
        let mut hash = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = input
                .read(&mut buf)
                .map_err(io(format!("read `{}`", path.display())))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            size += n as u64;
            tmp.write_all(&buf[..n])
                .map_err(io(format!("write in `{}`", dir.display())))?;
        }
        let sha256 = hex(&hash.finalize());
        let blob = dir.join(&sha256);
        if !blob.exists() {
            tmp.persist(&blob).map_err(|e| FilesError::Io {
                what: format!("write `{}`", blob.display()),
                source: e.error,
            })?;
        }
        Ok(Item {
            rel: String::new(),
            sha256,
            size,
            executable,
            blob,
            role,
        })
    }

    /// A local repository as a git bundle of HEAD and the refs `refs` names.
    fn bundle(&self, text: &str, repo: &Path, refs: &[String], rel: &str) -> Result<Item, FilesError> {
        let repo_s = repo.to_string_lossy().into_owned();
        let not_a_repo = |e: FilesError| {
            match e {
            FilesError::Git { message, .. } => FilesError::Git {
                repo: text.to_string(),
                message,
                hint: "`compare.repo` must be a git repository (or a URL); `git init` and commit, or fix the path",
            },
            other => other,
        }
        };
        let head = rev(&repo_s, "HEAD").map_err(not_a_repo)?;
        let mut heads: Vec<(String, String)> = vec![("HEAD".into(), head.clone())];
        for r in refs {
            let sha = rev(&repo_s, &format!("{r}^{{commit}}")).map_err(|_| FilesError::Git {
                repo: text.to_string(),
                message: format!("no commit `{r}` (a variant's `ref`)"),
                hint: "name a branch, tag or commit of the repository; `git log --oneline` lists them",
            })?;
            let full = git(&repo_s, &["rev-parse", "--symbolic-full-name", r])
                .map(|o| String::from_utf8_lossy(&o).trim().to_string())
                .unwrap_or_default();
            if full.starts_with("refs/") {
                heads.push((full, sha));
            } else if !heads
                .iter()
                .any(|(_, tip)| git(&repo_s, &["merge-base", "--is-ancestor", &sha, tip]).is_ok())
            {
                return Err(FilesError::Git {
                    repo: text.to_string(),
                    message: format!(
                        "the commit `{r}` is on no branch or tag the variants name, so a bundle cannot carry it"
                    ),
                    hint: "name a branch or tag that contains it as the variant's `ref`",
                });
            }
        }
        heads.sort();
        heads.dedup();
        let key = hex(&Sha256::digest(
            heads
                .iter()
                .map(|(n, s)| format!("{n} {s}\n"))
                .collect::<String>()
                .as_bytes(),
        ));
        let dir = self.cache.join("bundles");
        std::fs::create_dir_all(&dir).map_err(io(format!("create `{}`", dir.display())))?;
        let path = dir.join(format!("{key}.bundle"));
        if !path.exists() {
            let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
            let mut args: Vec<String> = vec!["bundle".into(), "create".into(), "--quiet".into()];
            args.push(tmp.to_string_lossy().into_owned());
            args.extend(heads.iter().map(|(n, _)| n.clone()));
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            git(&repo_s, &argv)?;
            std::fs::rename(&tmp, &path).map_err(io(format!("write `{}`", path.display())))?;
        }
        let mut item = self.stage(&path, "repo")?;
        item.rel = rel.to_string();
        Ok(item)
    }
}

fn role_name(r: PathRole) -> &'static str {
    r.as_str()
}

/// The refs the comparison's variants name.
fn variant_refs(task: &TaskSpec) -> Vec<String> {
    match &task.workload {
        Workload::Compare(c) => c.variants.iter().filter_map(|v| v.git_ref.clone()).collect(),
        _ => Vec::new(),
    }
}

fn join_rel(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a}/{b}"),
    }
}

/// The deepest folder that holds the parent of every path.
fn common_parent<'a>(paths: impl Iterator<Item = &'a Path>) -> PathBuf {
    let mut common: Option<Vec<Component<'a>>> = None;
    for p in paths {
        let parent: Vec<Component> = p.parent().unwrap_or(p).components().collect();
        common = Some(match common {
            None => parent,
            Some(c) => c
                .into_iter()
                .zip(parent)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    common
        .map(|c| c.iter().collect())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// `git -C REPO ARGS` on this host, never prompting: its stdout when it
/// succeeds, its stderr (trimmed) when it fails, an error when git cannot
/// be run. The one way host-side code runs git (`orch bisect` too).
pub fn run_git(repo: &Path, args: &[&str]) -> std::io::Result<Result<Vec<u8>, String>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()?;
    Ok(if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    })
}

fn git(repo: &str, args: &[&str]) -> Result<Vec<u8>, FilesError> {
    match run_git(Path::new(repo), args) {
        Err(e) => Err(FilesError::Git {
            repo: repo.to_string(),
            message: format!("cannot run `git`: {e}"),
            hint: "install git on this machine",
        }),
        Ok(Ok(stdout)) => Ok(stdout),
        Ok(Err(stderr)) => Err(FilesError::Git {
            repo: repo.to_string(),
            message: format!("`git {}` failed: {stderr}", args.join(" ")),
            hint: "check the repository with the same git command",
        }),
    }
}

fn rev(repo: &str, r: &str) -> Result<String, FilesError> {
    git(repo, &["rev-parse", "--verify", "--quiet", r])
        .map(|o| String::from_utf8_lossy(&o).trim().to_string())
}

fn write_atomic(path: &Path, data: &[u8]) -> Result<(), FilesError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp =
        tempfile::NamedTempFile::new_in(dir).map_err(io(format!("write in `{}`", dir.display())))?;
    tmp.write_all(data)
        .map_err(io(format!("write `{}`", path.display())))?;
    tmp.persist(path).map_err(|e| FilesError::Io {
        what: format!("write `{}`", path.display()),
        source: e.error,
    })?;
    Ok(())
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
