//! `orch push RUN --to s3://...` and `orch pull RUN --from s3://...`: a run
//! between the folder store and a bucket, verified after the copy.

use crate::cli::{PullArgs, PushArgs};
use crate::error::user;
use std::sync::Arc;

fn bucket(url: &str, flag: &str) -> anyhow::Result<Arc<orch_store_s3::S3Store>> {
    if !url.starts_with("s3://") {
        return Err(user(format!(
            "`{flag} {url}` is not a bucket\nhint: write `{flag} s3://BUCKET/PREFIX`"
        )));
    }
    Ok(Arc::new(orch_store_s3::S3Store::open(url)?))
}

fn folder(store: &orch_store::Store, command: &str) -> anyhow::Result<std::path::PathBuf> {
    store.root().map(|p| p.to_path_buf()).ok_or_else(|| {
        user(format!(
            "`orch {command}` moves runs between a folder store and a bucket, and `--store` names a bucket\nhint: pass `--store DIR` (default `results`)"
        ))
    })
}

pub fn push(store: &orch_store::Store, args: PushArgs) -> anyhow::Result<i32> {
    folder(store, "push")?;
    let dest = bucket(&args.to, "--to")?;
    for run in &args.runs {
        let moved = orch_store_s3::transfer::push(store, run, &dest)?;
        eprintln!(
            "pushed {} to {}: {} files ({} bytes), {} records, {} files already there; verified",
            moved.run,
            dest_location(&dest, &moved.run),
            moved.files,
            moved.bytes,
            moved.records,
            moved.already_there
        );
    }
    Ok(0)
}

pub fn pull(store: &orch_store::Store, args: PullArgs) -> anyhow::Result<i32> {
    let root = folder(store, "pull")?;
    let src = bucket(&args.from, "--from")?;
    let moved = orch_store_s3::transfer::pull(&src, &args.run, &root)?;
    eprintln!(
        "pulled {} into {}: {} files ({} bytes), {} records; verified",
        moved.run,
        root.join(&moved.run).display(),
        moved.files,
        moved.bytes,
        moved.records
    );
    Ok(0)
}

fn dest_location(s: &orch_store_s3::S3Store, run: &str) -> String {
    orch_store::StoreBackend::run_location(s, run)
}
