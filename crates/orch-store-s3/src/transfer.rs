//! `orch push` and `orch pull`: a run between a folder store and a bucket,
//! every file checked by size after the copy (and every record parsed).
//!
//! Nothing from the bucket is trusted as a path: each key is checked with
//! [`orch_store::check_relative`] before it names a file, files are created
//! new (never through an existing file or link), inside a run folder this
//! pull created.

use crate::follow::regular_files;
use crate::S3Store;
use orch_store::{
    check_name, check_relative, read_json, CellRecord, RunMeta, Store, StoreBackend, StoreError,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

type Result<T> = std::result::Result<T, StoreError>;

/// What a transfer moved.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Moved {
    pub run: String,
    pub files: usize,
    pub bytes: u64,
    pub records: usize,
    /// Objects already in the bucket with the same size (an earlier push).
    pub already_there: usize,
}

fn other(message: String, hint: &str, user: bool) -> StoreError {
    StoreError::Remote {
        message,
        hint: hint.into(),
        user,
    }
}

/// Copy the run `id` of the folder store `local` into `dest`.
pub fn push(local: &Store, id: &str, dest: &std::sync::Arc<S3Store>) -> Result<Moved> {
    let run = local.open_run(id)?;
    let dir = run.dir().to_path_buf();
    let base = dest.run_key(run.id());
    let present: BTreeMap<String, u64> = dest
        .objects()
        .list(&base)?
        .into_iter()
        .map(|l| (l.key, l.size))
        .collect();
    let mut moved = Moved {
        run: run.id().to_string(),
        ..Moved::default()
    };
    // (key, local file) pairs to upload, then the records.
    let mut files: Vec<(String, PathBuf)> = vec![
        (format!("{base}manifest.yaml"), dir.join("manifest.yaml")),
        (format!("{base}plan.json"), dir.join("plan.json")),
    ];
    let mut records: Vec<(String, CellRecord, bool)> = Vec::new();
    let mut claims: Vec<String> = Vec::new();
    for c in &run.plan.cells {
        let mut attempts: Vec<(u32, PathBuf)> = Vec::new();
        let prefix = format!("{}.", c.id);
        if let Ok(entries) = std::fs::read_dir(dir.join("interrupted")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(n) = name.strip_prefix(&prefix).and_then(|n| n.parse::<u32>().ok()) {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        attempts.push((n, e.path()));
                    }
                }
            }
        }
        let current = run.cell_dir(&c.id);
        let current_record = run.cell_record(&c.id)?;
        if std::fs::symlink_metadata(&current).is_ok_and(|m| m.is_dir()) {
            let n = current_record
                .as_ref()
                .map(|r| r.attempt)
                .unwrap_or(attempts.iter().map(|a| a.0).max().unwrap_or(0) + 1);
            attempts.push((n, current.clone()));
        }
        for (n, adir) in attempts {
            claims.push(format!("{base}claims/{}/{n}", c.id));
            for (rel, path, _) in regular_files(&adir) {
                if rel == "result.json" {
                    continue;
                }
                files.push((format!("{base}cells/{}/{n}/{rel}", c.id), path));
            }
            let rec = if adir == current {
                current_record.clone()
            } else {
                read_json::<CellRecord>(&adir.join("result.json")).ok()
            };
            if let Some(r) = rec {
                let finished = adir == current && r.status.is_finished();
                records.push((format!("{base}records/{}/{n}.json", c.id), r, finished));
            }
        }
    }
    let objects = dest.objects();
    // run.json first claims the id in the bucket (or finds an earlier push).
    let run_json = format!("{base}run.json");
    if !present.contains_key(&run_json) {
        let created: RunMeta = read_json(&dir.join("run.json"))?;
        if let Err(by) = dest.create(&run_json, dest.with_writer(&created))? {
            return Err(other(
                format!("the run `{}` was pushed at the same time by {by}", run.id()),
                "push it again once the other push is done",
                false,
            ));
        }
    }
    // Files, claims and records go up on many connections at once.
    let uploaded = orch_store::parallel_map_with(
        &files,
        crate::objects::PARALLEL,
        |(key, path)| -> Result<Option<u64>> {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            if present.get(key) == Some(&size) {
                return Ok(None);
            }
            objects.put_file(key, path).map(Some)
        },
    );
    for u in uploaded {
        match u? {
            Some(n) => {
                moved.files += 1;
                moved.bytes += n;
            }
            None => moved.already_there += 1,
        }
    }
    for r in orch_store::parallel_map_with(&claims, crate::objects::PARALLEL, |key| -> Result<()> {
        if !present.contains_key(key) {
            let _ = dest.create(key, dest.claim_bytes())?;
        }
        Ok(())
    }) {
        r?;
    }
    let created = orch_store::parallel_map_with(
        &records,
        crate::objects::PARALLEL,
        |(key, rec, finished)| -> Result<bool> {
            let bytes = dest.with_writer(rec);
            let mut new = false;
            if !present.contains_key(key) {
                let _ = dest.create(key, bytes.clone())?;
                new = true;
            }
            let done = format!("{base}done/{}.json", rec.id);
            if *finished && !present.contains_key(&done) {
                if let Err(by) = dest.create(&done, bytes)? {
                    return Err(StoreError::RecordedElsewhere {
                        run: run.id().to_string(),
                        cell: rec.id.clone(),
                        by,
                    });
                }
            }
            Ok(new)
        },
    );
    for c in created {
        if c? {
            moved.records += 1;
        }
    }
    // The latest state, as a state object of its own, and the run's index.
    let meta = run.meta.clone();
    dest.register_run(run.id())?;
    dest.save_meta(&meta)?;
    let remote = Store::with_backend(dest.clone()).open_exact(run.id())?;
    dest.write_index(&remote)?;
    // Verify: every file is in the bucket with its size.
    let after: BTreeMap<String, u64> = objects
        .list(&base)?
        .into_iter()
        .map(|l| (l.key, l.size))
        .collect();
    for (key, path) in &files {
        let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if after.get(key) != Some(&size) {
            return Err(other(
                format!(
                    "`{key}` is not in the bucket with the size of `{}` after the push",
                    path.display()
                ),
                "push again",
                false,
            ));
        }
    }
    for (key, _, _) in &records {
        if !after.contains_key(key) {
            return Err(other(
                format!("`{key}` is missing after the push"),
                "push again",
                false,
            ));
        }
    }
    Ok(moved)
}

/// Copy the run `id` of `src` into the folder store at `root`.
pub fn pull(src: &std::sync::Arc<S3Store>, id: &str, root: &Path) -> Result<Moved> {
    let remote = Store::with_backend(src.clone());
    let run = remote.open_run(id)?;
    let id = run.id().to_string();
    let dir = root.join(&id);
    if std::fs::symlink_metadata(&dir).is_ok() {
        return Err(other(
            format!("`{}` already exists", dir.display()),
            "remove it, or pull into another store (`--store DIR`)",
            true,
        ));
    }
    let base = src.run_key(&id);
    let listed = src.objects().list(&base)?;
    let records = remote.backend().cell_records(&run)?;
    let current: BTreeMap<&str, u32> = run
        .plan
        .cells
        .iter()
        .zip(&records)
        .filter_map(|(c, r)| r.as_ref().map(|r| (c.id.as_str(), r.attempt)))
        .collect();
    // Every key must be a plain relative path before it names a file.
    let mut plan_files: Vec<(PathBuf, String, u64)> = Vec::new();
    let mut attempt_records: Vec<(PathBuf, String)> = Vec::new();
    let mut latest: BTreeMap<String, u32> = BTreeMap::new();
    for l in &listed {
        let rel = &l.key[base.len()..];
        if let Some(rest) = rel.strip_prefix("cells/") {
            let mut parts = rest.splitn(3, '/');
            let (Some(cell), Some(n), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if file.contains(".parts/") {
                continue;
            }
            check_name("cell id", cell)?;
            check_relative("file name", file)?;
            let n: u32 = n.parse().map_err(|_| StoreError::Unsafe {
                what: "attempt number",
                name: n.escape_debug().to_string(),
            })?;
            let e = latest.entry(cell.to_string()).or_insert(n);
            *e = (*e).max(n);
            plan_files.push((
                PathBuf::from(cell).join(n.to_string()).join(file),
                l.key.clone(),
                l.size,
            ));
        } else if let Some(rest) = rel.strip_prefix("records/") {
            let Some((cell, n)) = rest.split_once('/') else {
                continue;
            };
            check_name("cell id", cell)?;
            let n = n
                .strip_suffix(".json")
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(|| StoreError::Unsafe {
                    what: "record name",
                    name: rest.escape_debug().to_string(),
                })?;
            attempt_records.push((PathBuf::from(cell).join(n.to_string()), l.key.clone()));
        }
    }
    // Where attempt n of a cell goes: the current one to cells/<cell>/,
    // others to interrupted/<cell>.<n>/.
    let place = |cell: &str, n: u32| -> PathBuf {
        let cur = current.get(cell).copied().or(latest.get(cell).copied());
        if cur == Some(n) {
            dir.join("cells").join(cell)
        } else {
            dir.join("interrupted").join(format!("{cell}.{n}"))
        }
    };
    std::fs::create_dir_all(root).map_err(orch_io("create", root))?;
    std::fs::create_dir(&dir).map_err(orch_io("create", &dir))?;
    std::fs::create_dir(dir.join("cells")).map_err(orch_io("create", &dir))?;
    let objects = src.objects();
    let mut moved = Moved {
        run: id.clone(),
        ..Moved::default()
    };
    let whole = |name: &str| -> Result<Vec<u8>> {
        objects.get(&format!("{base}{name}"), 0)?.ok_or_else(|| {
            other(
                format!("`s3://{}/{base}{name}` is missing", objects.bucket),
                "the run was not written whole; push it again",
                false,
            )
        })
    };
    write_new(&dir.join("manifest.yaml"), &whole("manifest.yaml")?)?;
    write_new(&dir.join("plan.json"), &whole("plan.json")?)?;
    let mut meta_bytes = serde_json::to_vec_pretty(&run.meta).unwrap_or_default();
    meta_bytes.push(b'\n');
    write_new(&dir.join("run.json"), &meta_bytes)?;
    for (rel, key, size) in &plan_files {
        let mut it = rel.components();
        let cell = it
            .next()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .unwrap_or_default();
        let n: u32 = it
            .next()
            .and_then(|c| c.as_os_str().to_str().and_then(|s| s.parse().ok()))
            .unwrap_or(0);
        let file: PathBuf = it.collect();
        let to = place(&cell, n).join(file);
        let bytes = objects.get(key, 0)?.unwrap_or_default();
        if bytes.len() as u64 != *size {
            return Err(other(
                format!(
                    "`{key}` changed size while it was read ({} of {size} bytes)",
                    bytes.len()
                ),
                "pull again",
                false,
            ));
        }
        write_new(&to, &bytes)?;
        moved.files += 1;
        moved.bytes += *size;
    }
    for (rel, key) in &attempt_records {
        let cell = rel
            .iter()
            .next()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let n: u32 = rel
            .iter()
            .nth(1)
            .and_then(|c| c.to_str()?.parse().ok())
            .unwrap_or(0);
        let bytes = objects.get(key, 0)?.unwrap_or_default();
        let r: CellRecord = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
            path: PathBuf::from(format!("s3://{}/{key}", objects.bucket)),
            source,
        })?;
        let mut out = serde_json::to_vec_pretty(&r).unwrap_or_default();
        out.push(b'\n');
        write_new(&place(&cell, n).join("result.json"), &out)?;
        moved.records += 1;
    }
    // Verify through the folder store: the same cells, the same records.
    let local = Store::new(root);
    let copy = local.open_exact(&id)?;
    let got = copy.record()?;
    let want = run.record()?;
    let statuses = |r: &orch_store::RunRecord| {
        r.cells
            .iter()
            .map(|c| (c.id.clone(), c.status))
            .collect::<Vec<_>>()
    };
    if statuses(&got) != statuses(&want) {
        return Err(other(
            format!("the pulled copy of `{id}` does not have the bucket's cell records"),
            "pull again (into an empty store)",
            false,
        ));
    }
    let _ = copy.ledger();
    Ok(moved)
}

fn orch_io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + use<'a> {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Create a new file (never through an existing file or link), its folders first.
fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(orch_io("create", parent))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(orch_io("create", path))?;
    f.write_all(bytes).map_err(orch_io("write", path))
}
