//! Volumes, mounts and blobs: volumes are host folders (`ROOT/volumes/NAME`), mount files
//! content-addressed blobs (`ROOT/blobs/SHA256`), large blobs uploaded over plain HTTP to a
//! second port, which also serves volume files for `VolumeGetFile2`.

use super::state::{sha256_hex, Inner};
use super::Upload;
use orch_backend_modal::proto::{self, ObjectCreationType};
use std::io::{Read as _, Write as _};
use std::path::Path;
use std::sync::Arc;
use tonic::{Response, Status};

/// `VolumeGetOrCreate`: a volume is a host folder, `ROOT/volumes/NAME`.
pub(super) fn volume_get_or_create(
    inner: &Arc<Inner>,
    r: proto::VolumeGetOrCreateRequest,
) -> Result<Response<proto::VolumeGetOrCreateResponse>, Status> {
    let mut st = inner.state.lock().unwrap();
    let name = if r.deployment_name.is_empty() {
        // Ephemeral / anonymous volumes get a name of their own.
        inner.id("anon")
    } else {
        r.deployment_name.clone()
    };
    let id = match st.volumes.get(&name) {
        Some(id) => id.clone(),
        None => {
            let creates = r.object_creation_type != ObjectCreationType::Unspecified as i32;
            let dir = inner.root.join("volumes").join(&name);
            if !creates && !dir.is_dir() {
                return Err(Status::not_found(format!("Volume '{name}' not found")));
            }
            std::fs::create_dir_all(&dir).map_err(|e| Status::internal(e.to_string()))?;
            let id = inner.id("vo");
            st.volumes.insert(name, id.clone());
            st.volume_dirs.insert(id.clone(), dir);
            id
        }
    };
    Ok(Response::new(proto::VolumeGetOrCreateResponse {
        volume_id: id,
        version: proto::VolumeFsVersion::V2 as i32,
    }))
}

/// `VolumeGetFile2`: a URL of the blob server for one file of a volume.
pub(super) fn volume_get_file(
    inner: &Arc<Inner>,
    r: proto::VolumeGetFile2Request,
) -> Result<Response<proto::VolumeGetFile2Response>, Status> {
    let dir = inner
        .state
        .lock()
        .unwrap()
        .volume_dirs
        .get(&r.volume_id)
        .cloned()
        .ok_or_else(|| Status::not_found("volume not found"))?;
    let rel = r.path.trim_start_matches('/');
    if rel.split('/').any(|p| p == "..") {
        return Err(Status::invalid_argument("bad path"));
    }
    let meta =
        std::fs::metadata(dir.join(rel)).map_err(|_| Status::not_found(format!("{} not found", r.path)))?;
    let base = inner.blob_url.trim_end_matches("/blob");
    Ok(Response::new(proto::VolumeGetFile2Response {
        get_urls: vec![format!("{base}/vol/{}/{rel}", r.volume_id)],
        size: meta.len(),
        start: 0,
        len: meta.len(),
    }))
}

/// `MountGetOrCreate`: a mount of uploaded blobs, named by its files.
pub(super) fn mount_get_or_create(
    inner: &Arc<Inner>,
    r: proto::MountGetOrCreateRequest,
) -> Result<Response<proto::MountGetOrCreateResponse>, Status> {
    let blobs = inner.root.join("blobs");
    let ingesting = inner.state.lock().unwrap().ingesting.clone();
    for f in &r.files {
        if ingesting.contains_key(&f.sha256_hex) {
            return Err(Status::failed_precondition(format!(
                "file {} ({}) is not ingested yet",
                f.filename, f.sha256_hex
            )));
        }
        if !blobs.join(&f.sha256_hex).is_file() {
            return Err(Status::failed_precondition(format!(
                "file {} ({}) was not uploaded",
                f.filename, f.sha256_hex
            )));
        }
    }
    let mut key = String::new();
    for f in &r.files {
        key.push_str(&format!("{}:{}:{}\n", f.filename, f.sha256_hex, f.mode));
    }
    let digest = sha256_hex(key.as_bytes());
    let id = format!("mo-{}", &digest[..16]);
    inner.state.lock().unwrap().mounts.insert(id.clone(), r.files);
    Ok(Response::new(proto::MountGetOrCreateResponse {
        mount_id: id,
        handle_metadata: Some(proto::MountHandleMetadata {
            content_checksum_sha256_hex: digest,
        }),
    }))
}

/// `MountPutFile`: a blob, inline or from an upload, checked against its sha256.
pub(super) fn mount_put_file(
    inner: &Arc<Inner>,
    r: proto::MountPutFileRequest,
) -> Result<Response<proto::MountPutFileResponse>, Status> {
    let dir = inner.root.join("blobs");
    let path = dir.join(&r.sha256_hex);
    let via_blob = matches!(
        r.data_oneof,
        Some(proto::mount_put_file_request::DataOneof::DataBlobId(_))
    );
    // Slow ingestion: a file still being ingested is not there yet; each ask counts.
    {
        let mut st = inner.state.lock().unwrap();
        if let Some(left) = st.ingesting.get_mut(&r.sha256_hex) {
            if *left > 0 {
                *left -= 1;
                drop(st);
                inner.note("MountPutFile", "exists=false (ingesting)".into());
                return Ok(Response::new(proto::MountPutFileResponse { exists: false }));
            }
            st.ingesting.remove(&r.sha256_hex);
        }
    }
    let data = match r.data_oneof {
        None => {
            let exists = path.is_file();
            inner.note("MountPutFile", format!("exists={exists}"));
            return Ok(Response::new(proto::MountPutFileResponse { exists }));
        }
        Some(proto::mount_put_file_request::DataOneof::Data(d)) => d,
        Some(proto::mount_put_file_request::DataOneof::DataBlobId(b)) => {
            let p = inner
                .state
                .lock()
                .unwrap()
                .blobs
                .get(&b)
                .cloned()
                .ok_or_else(|| Status::not_found(format!("blob {b} was not uploaded")))?;
            std::fs::read(p).map_err(|e| Status::internal(e.to_string()))?
        }
    };
    if sha256_hex(&data) != r.sha256_hex {
        return Err(Status::invalid_argument("sha256 mismatch"));
    }
    write_exec(&path, &data).map_err(|e| Status::internal(e.to_string()))?;
    let slow = inner.scenario.lock().unwrap().slow_ingestion;
    let mut st = inner.state.lock().unwrap();
    if slow > 0 {
        st.ingesting.insert(r.sha256_hex.clone(), slow);
    }
    st.uploads.push(Upload {
        sha256: r.sha256_hex,
        size: data.len() as u64,
        via_blob,
    });
    drop(st);
    inner.note("MountPutFile", format!("exists={}", slow == 0));
    Ok(Response::new(proto::MountPutFileResponse { exists: slow == 0 }))
}

/// `BlobCreate`: a URL to upload a large blob to.
pub(super) fn blob_create(inner: &Arc<Inner>) -> Result<Response<proto::BlobCreateResponse>, Status> {
    let id = inner.id("bl");
    Ok(Response::new(proto::BlobCreateResponse {
        blob_id: id.clone(),
        upload_type_oneof: Some(proto::blob_create_response::UploadTypeOneof::UploadUrl(format!(
            "{}/{id}",
            inner.blob_url
        ))),
    }))
}

fn write_exec(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(tmp, path)
}

/// `PUT /blob/ID` with `Content-Length` (and `Content-MD5` checked when given).
pub(super) fn serve_blobs(listener: std::net::TcpListener, inner: Arc<Inner>) {
    for conn in listener.incoming() {
        let Ok(mut s) = conn else { continue };
        let inner = inner.clone();
        std::thread::spawn(move || {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => return,
                }
                if head.len() > 64 * 1024 {
                    return;
                }
            }
            let text = String::from_utf8_lossy(&head).to_string();
            let mut lines = text.split("\r\n");
            let first = lines.next().unwrap_or_default().to_string();
            let mut len = 0usize;
            let mut md5 = None;
            for l in lines {
                if let Some((k, v)) = l.split_once(':') {
                    match k.trim().to_ascii_lowercase().as_str() {
                        "content-length" => len = v.trim().parse().unwrap_or(0),
                        "content-md5" => md5 = Some(v.trim().to_string()),
                        _ => {}
                    }
                }
            }
            let mut body = vec![0u8; len];
            if s.read_exact(&mut body).is_err() {
                return;
            }
            let parts: Vec<&str> = first.split_whitespace().collect();
            if parts.first() == Some(&"GET") {
                let path = parts.get(1).copied().unwrap_or_default();
                let data = path.strip_prefix("/vol/").and_then(|rest| {
                    let (vid, rel) = rest.split_once('/')?;
                    if rel.split('/').any(|p| p == "..") {
                        return None;
                    }
                    let dir = inner.state.lock().unwrap().volume_dirs.get(vid).cloned()?;
                    std::fs::read(dir.join(rel)).ok()
                });
                match data {
                    Some(d) => {
                        let _ = write!(
                            s,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            d.len()
                        );
                        let _ = s.write_all(&d);
                    }
                    None => {
                        let _ = write!(
                            s,
                            "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                    }
                }
                return;
            }
            let ok = parts.first() == Some(&"PUT")
                && parts.get(1).is_some_and(|p| p.starts_with("/blob/"))
                && md5.as_ref().is_none_or(|m| {
                    use base64::Engine;
                    use md5::Digest;
                    *m == base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(&body))
                });
            let status = if ok {
                let id = parts[1].trim_start_matches("/blob/").to_string();
                let path = inner.root.join("uploads").join(&id);
                let _ = std::fs::create_dir_all(inner.root.join("uploads"));
                if std::fs::write(&path, &body).is_ok() {
                    inner.state.lock().unwrap().blobs.insert(id, path);
                    "200 OK"
                } else {
                    "500 Internal Server Error"
                }
            } else {
                "400 Bad Request"
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        });
    }
}
