//! The cell's files on a cluster: content-addressed ConfigMaps, no shared
//! filesystem (issue 28).
//!
//! What travels with a cell ([`orch_files::Shipment`]) is a set of blobs,
//! each named by its SHA-256. They are packed into ConfigMaps' `binaryData`
//! (keys: `<sha256>`, or `<sha256>.<k>` for the chunks of a blob larger than
//! [`PACK_BYTES`]), at most [`PACK_BYTES`] of raw bytes per ConfigMap, well
//! under the API server's 1 MiB per object. Blobs are packed in the order of
//! their digests, so cells with the same files make the same ConfigMaps. A
//! ConfigMap is named by a digest of the run and its keys
//! (`orch-files-<20 hex>`): within a run (a `--resume` included) the same
//! files make the same name and are created once (a 409 is "already
//! there"); two runs never share one, so `orch down` of one run cannot take
//! another's files away. Every ConfigMap carries the run's labels and goes
//! with the run (`cleanup`, `orch down`).
//!
//! In the pod, every ConfigMap of the cell is a source of one `projected`
//! volume mounted read-only at [`orch_files::CELL_BLOBS`]; an `emptyDir` at
//! [`orch_files::CELL_ROOT`] takes the files, which the agent lays out from
//! the blobs (joining chunks, checking every digest) before the workload.
//!
//! The task itself goes the same way when its `--task-b64` argument would
//! pass [`TASK_ARG_BYTES`] (Linux refuses one argument over 128 KiB): its
//! JSON is a blob of its own ConfigMap and the agent reads `--task
//! /orch/blobs/<sha256>` ([`task_file`]).
//!
//! Limits: at most [`MAX_CELL_BYTES`] per cell (ConfigMaps live in etcd,
//! which is no place for data sets or weights: those belong in the image,
//! `orch build`, or on the weights PVC); the blobs sit in the namespace
//! until the run is cleaned up; a pod that needs a ConfigMap that is not
//! there (deleted by hand) waits, as for a missing Secret, until
//! `max_pending`.

use crate::spec::{self, KubeSettings};
use crate::{KubeError, CELL_CONTAINER};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapProjection, EmptyDirVolumeSource, ProjectedVolumeSource, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use orch_backend::BackendError;
use orch_files::{human_bytes, Shipment};
use sha2::{Digest, Sha256};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The most raw bytes in one ConfigMap (base64 of it is at most 1 MiB; the
/// API server's limit is 1 MiB of raw data per object).
pub const PACK_BYTES: u64 = 768 * 1024;
/// The most one cell's files may come to on this backend.
pub const MAX_CELL_BYTES: u64 = 64 << 20;
/// The pod's volume of the blobs (a `projected` volume of ConfigMaps).
pub const BLOBS_VOLUME: &str = "orch-blobs";
/// The pod's volume the files are laid out in (an `emptyDir`).
pub const FILES_VOLUME: &str = "orch-files";

/// One key of a ConfigMap: a blob or a chunk of one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// `<sha256>` or `<sha256>.<k>`.
    pub key: String,
    /// The staged blob on this host.
    pub blob: PathBuf,
    pub offset: u64,
    pub len: u64,
}

/// One ConfigMap's worth of pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    pub name: String,
    pub pieces: Vec<Piece>,
}

impl Pack {
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }
}

/// The ConfigMaps of a cell's blobs (sha256, staged path, size), in digest
/// order: a blob over [`PACK_BYTES`] in chunks of [`PACK_BYTES`], each
/// ConfigMap filled up to [`PACK_BYTES`]. Reads nothing.
pub fn packs(run_id: &str, blobs: &[(&str, &Path, u64)]) -> Vec<Pack> {
    let mut blobs: Vec<(&str, &Path, u64)> = blobs.to_vec();
    blobs.sort_by(|a, b| a.0.cmp(b.0));
    blobs.dedup_by(|a, b| a.0 == b.0);
    let mut pieces = Vec::new();
    for (sha, path, size) in blobs {
        if size <= PACK_BYTES {
            pieces.push(Piece {
                key: sha.to_string(),
                blob: path.to_path_buf(),
                offset: 0,
                len: size,
            });
            continue;
        }
        let mut offset = 0;
        let mut k = 0;
        while offset < size {
            let len = PACK_BYTES.min(size - offset);
            pieces.push(Piece {
                key: format!("{sha}.{k}"),
                blob: path.to_path_buf(),
                offset,
                len,
            });
            offset += len;
            k += 1;
        }
    }
    let mut groups: Vec<Vec<Piece>> = Vec::new();
    let mut bytes = 0;
    for p in pieces {
        match groups.last_mut() {
            Some(g) if bytes + p.len <= PACK_BYTES => {
                bytes += p.len;
                g.push(p);
            }
            _ => {
                bytes = p.len;
                groups.push(vec![p]);
            }
        }
    }
    groups
        .into_iter()
        .map(|pieces| Pack {
            name: pack_name(run_id, &pieces),
            pieces,
        })
        .collect()
}

/// `orch-files-<20 hex>`: a digest of the run and the keys (the keys name
/// the content).
fn pack_name(run_id: &str, pieces: &[Piece]) -> String {
    let mut h = Sha256::new();
    h.update(spec::label_value(run_id).as_bytes());
    for p in pieces {
        h.update(b"\n");
        h.update(p.key.as_bytes());
    }
    format!("orch-files-{}", &orch_files::hex(&h.finalize())[..20])
}

/// The cell's files within [`MAX_CELL_BYTES`], else the user's error.
pub fn check_size(cell: &str, shipment: &Shipment) -> Result<(), BackendError> {
    let total: u64 = shipment.blobs().iter().map(|b| b.2).sum();
    if total <= MAX_CELL_BYTES {
        return Ok(());
    }
    let mut items: Vec<&orch_files::Item> = shipment.items.iter().collect();
    items.sort_by_key(|i| std::cmp::Reverse(i.size));
    let largest: Vec<String> = items
        .iter()
        .take(3)
        .map(|i| format!("`{}` ({})", i.rel, human_bytes(i.size)))
        .collect();
    Err(BackendError::User(format!(
        "the files of cell `{cell}` come to {}, over the kubernetes backend's limit of {} (they travel in ConfigMaps); the largest: {}\nhint: leave them out with `sync.ignore` (or a `.gitignore`/`.dockerignore`), or bake them into the image with `orch build` (`image: {{build: NAME}}`) and stop naming them in the suite",
        human_bytes(total),
        human_bytes(MAX_CELL_BYTES),
        largest.join(", ")
    )))
}

fn read_piece(p: &Piece) -> Result<Vec<u8>, KubeError> {
    let io = |source| KubeError::Io {
        action: format!("read the staged file `{}`", p.blob.display()),
        source,
    };
    let mut f = std::fs::File::open(&p.blob).map_err(io)?;
    f.seek(SeekFrom::Start(p.offset)).map_err(io)?;
    let mut buf = Vec::with_capacity(p.len as usize);
    f.take(p.len).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 != p.len {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{} bytes at {}, {} read", p.len, p.offset, buf.len()),
        )));
    }
    Ok(buf)
}

/// The run's ConfigMap of a pack, with its data (read from the staged blobs).
pub fn config_map(pack: &Pack, run_id: &str, s: &KubeSettings) -> Result<ConfigMap, KubeError> {
    let mut data = std::collections::BTreeMap::new();
    for p in &pack.pieces {
        data.insert(p.key.clone(), ByteString(read_piece(p)?));
    }
    let mut labels = spec::labels(run_id, None);
    labels.insert("app.kubernetes.io/name".into(), "orch-files".into());
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(pack.name.clone()),
            namespace: Some(s.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        binary_data: Some(data),
        immutable: Some(true),
        ..Default::default()
    })
}

/// A task whose `--task-b64` argument would be longer than this goes to
/// the pod as a file instead: Linux refuses to start a program with one
/// argument over 128 KiB (`MAX_ARG_STRLEN`), which a suite with large
/// `env:` values or many parameters reaches.
pub const TASK_ARG_BYTES: usize = 64 * 1024;

/// The task as a file of its own ConfigMap (its JSON staged at `json`, on
/// this host): the agent reads `--task /orch/blobs/<sha256>` instead of
/// `--task-b64`. `None`: the task fits an argument.
pub fn task_file(job: &mut Job, run_id: &str, json: &Path) -> Result<Option<Pack>, BackendError> {
    let io = |e: std::io::Error| BackendError::Io {
        action: format!("read `{}`", json.display()),
        source: e,
    };
    let size = std::fs::metadata(json).map_err(io)?.len();
    if size > PACK_BYTES {
        return Err(BackendError::User(format!(
            "the cell's task comes to {} as JSON, over the {} one ConfigMap carries\nhint: move large values out of `env:` and parameters into files the cell reads (they travel with it)",
            human_bytes(size),
            human_bytes(PACK_BYTES)
        )));
    }
    let mut data = Vec::new();
    std::fs::File::open(json)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(io)?;
    let sha = orch_files::hex(&Sha256::digest(&data));
    let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
        return Ok(None);
    };
    let Some(args) = pod
        .containers
        .iter_mut()
        .find(|c| c.name == CELL_CONTAINER)
        .and_then(|c| c.args.as_mut())
    else {
        return Ok(None);
    };
    let Some(i) = args.iter().position(|a| a == "--task-b64") else {
        return Ok(None);
    };
    if args.get(i + 1).map_or(0, String::len) <= TASK_ARG_BYTES {
        return Ok(None);
    }
    args[i] = "--task".into();
    args[i + 1] = format!("{}/{sha}", orch_files::CELL_BLOBS);
    Ok(packs(run_id, &[(sha.as_str(), json, size)]).into_iter().next())
}

/// A cell's objects as a run applies them and `--dry-run` prints them: its
/// Job ([`spec::cell_job`]) for the task rewritten to its files, with the
/// ConfigMaps of those files and, for a task too long for one argument, of
/// the task itself (its JSON written at `task_json`). A cell of `nodes: N`
/// (N > 1) is an Indexed Job of N pods with its headless Service
/// ([`spec::indexed`]).
pub struct CellObjects {
    pub job: Job,
    /// The headless Service of a multi-node cell's pods.
    pub service: Option<k8s_openapi::api::core::v1::Service>,
    pub packs: Vec<Pack>,
    /// The task as the pod sees it (its files under `/orch/files`).
    pub task: orch_protocol::TaskSpec,
}

/// Build a cell's [`CellObjects`]: one code path for a run and `--dry-run`.
pub fn cell_objects(
    task: &orch_protocol::TaskSpec,
    image: &str,
    secret_names: &[String],
    shipment: Option<&Shipment>,
    task_json: &Path,
    nodes: u32,
    s: &KubeSettings,
) -> Result<CellObjects, BackendError> {
    let mut task = task.clone();
    let mut packs = Vec::new();
    let shipment = shipment.filter(|s| !s.is_empty());
    if let Some(shipment) = shipment {
        check_size(&task.cell_id, shipment)?;
        shipment.apply(&mut task, orch_files::CELL_ROOT, orch_files::CELL_BLOBS);
        packs = self::packs(&task.run_id, &shipment.blobs());
    }
    let mut job = spec::cell_job(&task, image, secret_names, s);
    let service = spec::indexed(&mut job, &task, nodes);
    let big = orch_backend::home::task_b64(&task).len() > TASK_ARG_BYTES;
    if big {
        let json = serde_json::to_vec_pretty(&task).map_err(|e| BackendError::Io {
            action: "serialise the task".into(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(task_json, json).map_err(|e| BackendError::Io {
            action: format!("write `{}`", task_json.display()),
            source: e,
        })?;
        packs.extend(task_file(&mut job, &task.run_id, task_json)?);
    }
    if shipment.is_some() || big {
        mount(&mut job, &packs);
    }
    Ok(CellObjects {
        job,
        service,
        packs,
        task,
    })
}

/// The cell's Job with its files: the blobs' ConfigMaps as one read-only
/// `projected` volume at `/orch/blobs`, an `emptyDir` at `/orch/files`.
pub fn mount(job: &mut Job, packs: &[Pack]) {
    let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) else {
        return;
    };
    let mut mounts = vec![VolumeMount {
        name: FILES_VOLUME.into(),
        mount_path: orch_files::CELL_ROOT.into(),
        ..Default::default()
    }];
    let mut volumes = vec![Volume {
        name: FILES_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }];
    if !packs.is_empty() {
        mounts.push(VolumeMount {
            name: BLOBS_VOLUME.into(),
            mount_path: orch_files::CELL_BLOBS.into(),
            read_only: Some(true),
            ..Default::default()
        });
        volumes.push(Volume {
            name: BLOBS_VOLUME.into(),
            projected: Some(ProjectedVolumeSource {
                default_mode: Some(0o444),
                sources: Some(
                    packs
                        .iter()
                        .map(|p| VolumeProjection {
                            config_map: Some(ConfigMapProjection {
                                name: p.name.clone(),
                                optional: Some(false),
                                items: None,
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        });
    }
    pod.volumes.get_or_insert_with(Vec::new).extend(volumes);
    if let Some(c) = pod.containers.iter_mut().find(|c| c.name == CELL_CONTAINER) {
        c.volume_mounts.get_or_insert_with(Vec::new).extend(mounts);
    }
}

/// `--dry-run`'s lines of the ConfigMaps: names, keys and sizes, no data.
pub fn describe(packs: &[Pack], s: &KubeSettings) -> String {
    let mut out = String::new();
    if packs.is_empty() {
        return out;
    }
    out.push_str(&format!(
        "# orch creates {} ConfigMap(s) of the files' blobs in namespace `{}` (binaryData by SHA-256, not shown), mounted read-only at `{}`:\n",
        packs.len(),
        s.namespace,
        orch_files::CELL_BLOBS
    ));
    for p in packs {
        out.push_str(&format!(
            "#   ConfigMap `{}`: {} key(s), {}\n",
            p.name,
            p.pieces.len(),
            human_bytes(p.bytes())
        ));
        for piece in &p.pieces {
            out.push_str(&format!("#     {}  {}\n", piece.key, human_bytes(piece.len)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_pack_in_digest_order_and_large_ones_in_chunks() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let c = "c".repeat(64);
        let p = Path::new("/x");
        let big = 2 * PACK_BYTES + 10;
        let packs1 = packs(
            "run-1",
            &[
                (&c, p, 10),
                (&b, p, big),
                (&a, p, PACK_BYTES - 5),
                (&a, p, PACK_BYTES - 5),
            ],
        );
        let keys: Vec<Vec<&str>> = packs1
            .iter()
            .map(|k| k.pieces.iter().map(|p| p.key.as_str()).collect())
            .collect();
        let b0 = format!("{b}.0");
        let b1 = format!("{b}.1");
        let b2 = format!("{b}.2");
        assert_eq!(
            keys,
            vec![
                vec![a.as_str()],
                vec![b0.as_str()],
                vec![b1.as_str()],
                vec![b2.as_str(), c.as_str()]
            ]
        );
        assert!(packs1.iter().all(|k| k.bytes() <= PACK_BYTES));
        assert_eq!(packs1[3].pieces[0].offset, 2 * PACK_BYTES);
        assert_eq!(packs1[3].pieces[0].len, 10);
        // The same files in another order: the same ConfigMaps; another run: other names.
        let again = packs("run-1", &[(&a, p, PACK_BYTES - 5), (&b, p, big), (&c, p, 10)]);
        assert_eq!(packs1, again);
        let other = packs("run-2", &[(&a, p, PACK_BYTES - 5), (&b, p, big), (&c, p, 10)]);
        assert_ne!(packs1[0].name, other[0].name);
        assert!(packs1
            .iter()
            .all(|k| k.name.starts_with("orch-files-") && k.name.len() == 31));
    }

    #[test]
    fn a_config_map_holds_the_pieces_and_the_pod_mounts_them() {
        let dir = tempfile::tempdir().unwrap();
        let blob = dir.path().join("blob");
        let bytes: Vec<u8> = (0..(PACK_BYTES + 3)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&blob, &bytes).unwrap();
        let sha = "d".repeat(64);
        let ps = packs("r", &[(&sha, &blob, bytes.len() as u64)]);
        assert_eq!(ps.len(), 2);
        let s = KubeSettings::new("ns", "agent");
        let cm = config_map(&ps[1], "r", &s).unwrap();
        let data = cm.binary_data.unwrap();
        assert_eq!(data[&format!("{sha}.1")].0, bytes[PACK_BYTES as usize..]);
        assert_eq!(
            cm.metadata.labels.unwrap()[crate::RUN_LABEL],
            spec::label_value("r")
        );
        let mut job = Job {
            spec: Some(k8s_openapi::api::batch::v1::JobSpec {
                template: k8s_openapi::api::core::v1::PodTemplateSpec {
                    spec: Some(k8s_openapi::api::core::v1::PodSpec {
                        containers: vec![k8s_openapi::api::core::v1::Container {
                            name: CELL_CONTAINER.into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }),
            ..Default::default()
        };
        mount(&mut job, &ps);
        let pod = job.spec.unwrap().template.spec.unwrap();
        let vol = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == BLOBS_VOLUME)
            .unwrap();
        let names: Vec<String> = vol
            .projected
            .unwrap()
            .sources
            .unwrap()
            .into_iter()
            .map(|s| s.config_map.unwrap().name)
            .collect();
        assert_eq!(names, [ps[0].name.clone(), ps[1].name.clone()]);
        let m = pod.containers[0].volume_mounts.as_ref().unwrap();
        assert!(m
            .iter()
            .any(|m| m.mount_path == orch_files::CELL_BLOBS && m.read_only == Some(true)));
        assert!(m.iter().any(|m| m.mount_path == orch_files::CELL_ROOT));
    }
}
