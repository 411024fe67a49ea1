//! Write-once objects and JSON reads: the `If-None-Match` probe, creates
//! that carry this writer's token (a conflict names the other writer), and
//! objects read as JSON (missing or corrupt ones named).

use crate::objects::Created;
use crate::{Result, S3Store, UNCONDITIONAL_ENV};
use orch_store::StoreError;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

impl S3Store {
    /// Find out, once, whether the server honours `If-None-Match: *`. A
    /// probe that could not be made (the store did not answer) is made
    /// again by the next write; only its answer is kept.
    fn probe(&self) -> Result<()> {
        let mut probed = self.probed.lock().map_err(|_| poisoned())?;
        if probed.is_none() {
            let key = format!("{}.orch/probe/{}", self.prefix, self.token);
            let run = || -> Result<bool> {
                let first = self.objects.create(&key, self.claim_bytes(), &self.token)?;
                // A second create with another token must be refused.
                let second = self
                    .objects
                    .create(&key, b"{\"writer\":\"probe-2\"}".to_vec(), "probe-2")?;
                let _ = self.objects.delete(std::slice::from_ref(&key));
                Ok(first == Created::Ours && matches!(second, Created::Theirs(_)))
            };
            *probed = Some(match run()? {
                true => Ok(()),
                false if std::env::var(UNCONDITIONAL_ENV).is_ok_and(|v| v == "1") => {
                    eprintln!(
                        "warning: the object store at {} ignores conditional writes (`If-None-Match`); with `{UNCONDITIONAL_ENV}=1` two processes writing one run may both record a cell",
                        self.objects.endpoint
                    );
                    Ok(())
                }
                false => Err(format!(
                    "the object store at {} ignores conditional writes (`If-None-Match: *`): a second create of `{key}` overwrote the first",
                    self.objects.endpoint
                )),
            });
        }
        probed.clone().unwrap_or(Ok(())).map_err(|message| StoreError::Remote {
            message,
            hint: format!(
                "use a server that supports conditional writes (AWS S3, MinIO, R2, recent Ceph), or set `{UNCONDITIONAL_ENV}=1` if only one process ever writes a run"
            ),
            user: true,
        })
    }

    /// Create `key` once; `Err(writer)` names the other writer on a conflict.
    pub(crate) fn create(&self, key: &str, bytes: Vec<u8>) -> Result<std::result::Result<(), String>> {
        self.create_as(key, bytes, &self.token)
    }

    /// [`S3Store::create`] of bytes written by `writer` (a spooled record
    /// of this or an earlier process): the object already holding that
    /// writer's token is ours, so a spooled upload is made at most once.
    pub(crate) fn create_as(
        &self,
        key: &str,
        bytes: Vec<u8>,
        writer: &str,
    ) -> Result<std::result::Result<(), String>> {
        self.probe()?;
        Ok(match self.objects.create(key, bytes, writer)? {
            Created::Ours => Ok(()),
            Created::Theirs(b) => Err(writer_of(&b)),
        })
    }

    pub(crate) fn get_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<Option<T>> {
        match self.objects.get(key, 0)? {
            None => Ok(None),
            Some(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|source| StoreError::Corrupt {
                    path: PathBuf::from(format!("s3://{}/{key}", self.objects.bucket)),
                    source,
                }),
        }
    }

    pub(crate) fn must_json<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<T> {
        self.must_parse(key, self.objects.get(key, 0)?)
    }

    /// An object's JSON, read already (`None`: it is missing).
    pub(crate) fn must_parse<T: for<'de> Deserialize<'de>>(
        &self,
        key: &str,
        bytes: Option<Vec<u8>>,
    ) -> Result<T> {
        let bytes = bytes.ok_or_else(|| StoreError::Remote {
            message: format!("`s3://{}/{key}` is missing", self.objects.bucket),
            hint:
                "the run was not written whole (a push or a run interrupted at its start); delete its prefix"
                    .into(),
            user: false,
        })?;
        serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
            path: PathBuf::from(format!("s3://{}/{key}", self.objects.bucket)),
            source,
        })
    }

    pub(crate) fn with_writer<T: Serialize>(&self, value: &T) -> Vec<u8> {
        let mut v = serde_json::to_value(value).unwrap_or_default();
        if let serde_json::Value::Object(m) = &mut v {
            m.insert("writer".into(), self.token.clone().into());
        }
        serde_json::to_vec_pretty(&v).unwrap_or_default()
    }
}

pub(crate) fn writer_of(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v["writer"].as_str().map(String::from))
        .unwrap_or_else(|| "another writer".into())
}

pub(crate) fn poisoned() -> StoreError {
    StoreError::Remote {
        message: "the object store's cache lock was poisoned by a panic".into(),
        hint: "report this bug".into(),
        user: false,
    }
}
