//! Volumes, mounts and blobs: volumes are host folders (`ROOT/volumes/NAME`), mount files
//! content-addressed blobs (`ROOT/blobs/SHA256`), large blobs uploaded over plain HTTP to a
//! second port as S3 takes them (a single `PUT`, or a multipart upload: a `PUT` per part,
//! then the completion `POST`; ETags as S3 answers them, `503 Slow Down` on demand), which
//! also serves volume files for `VolumeGetFile2`.

use super::state::{sha256_hex, Inner};
use super::{BlobRecord, Upload};
use orch_modal_proto::{self as proto, ObjectCreationType};
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
    {
        let mut sc = inner.scenario.lock().unwrap();
        if sc.drop_uploads > 0 {
            sc.drop_uploads -= 1;
            drop(sc);
            inner.note("MountPutFile", "exists=false (dropped: send it again)".into());
            return Ok(Response::new(proto::MountPutFileResponse { exists: false }));
        }
    }
    // The bytes of a file already stored (sent again, as the official client
    // sends them until `exists: true`) are there: no new ingestion.
    if path.is_file() {
        inner.note("MountPutFile", "exists=true".into());
        return Ok(Response::new(proto::MountPutFileResponse { exists: true }));
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

/// `BlobCreate`: where to upload a large blob, in both forms Modal answers (the single
/// `blob_id` with `upload_type_oneof`, and `blob_ids` with `upload_types_oneof`, which the
/// official 1.x client reads: `modal/_utils/blob_utils.py`): one upload URL, or, under
/// [`super::Scenario::multipart_part_bytes`], a multipart upload (`part_length`, one URL
/// per part, a completion URL).
pub(super) fn blob_create(
    inner: &Arc<Inner>,
    r: proto::BlobCreateRequest,
) -> Result<Response<proto::BlobCreateResponse>, Status> {
    use proto::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
    let size =
        u64::try_from(r.content_length).map_err(|_| Status::invalid_argument("negative content_length"))?;
    let id = inner.id("bl");
    let part = inner
        .scenario
        .lock()
        .unwrap()
        .multipart_part_bytes
        .filter(|p| *p > 0);
    let parts = part.map(|p| size.div_ceil(p).max(1) as usize).unwrap_or(0);
    {
        let mut st = inner.state.lock().unwrap();
        st.blob_claims.insert(id.clone(), (size, r.content_md5.clone()));
        st.blob_records.push(BlobRecord {
            id: id.clone(),
            size,
            parts,
            puts: 0,
            completed: false,
        });
    }
    let base = &inner.blob_url;
    let (old, new) = match part {
        None => {
            let url = format!("{base}/{id}");
            (
                UploadTypeOneof::UploadUrl(url.clone()),
                UploadTypesOneof::UploadUrls(proto::UploadUrlList { items: vec![url] }),
            )
        }
        Some(p) => {
            let m = proto::MultiPartUpload {
                part_length: p as i64,
                upload_urls: (1..=parts).map(|n| format!("{base}/{id}/part/{n}")).collect(),
                completion_url: format!("{base}/{id}/complete"),
            };
            (
                UploadTypeOneof::Multipart(m.clone()),
                UploadTypesOneof::Multiparts(proto::MultiPartUploadList { items: vec![m] }),
            )
        }
    };
    Ok(Response::new(proto::BlobCreateResponse {
        blob_id: id.clone(),
        upload_type_oneof: Some(old),
        blob_ids: vec![id],
        upload_types_oneof: Some(new),
    }))
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest;
    md5::Md5::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn md5_b64(data: &[u8]) -> String {
    use base64::Engine;
    use md5::Digest;
    base64::engine::general_purpose::STANDARD.encode(md5::Md5::digest(data))
}

/// A blob's bytes arrived whole: checked against what `BlobCreate` declared (length,
/// MD5), then kept for `MountPutFile`.
fn blob_done(inner: &Inner, id: &str, body: &[u8]) -> Result<(), String> {
    let claim = inner.state.lock().unwrap().blob_claims.get(id).cloned();
    let Some((size, md5)) = claim else {
        return Err(format!("no blob {id}"));
    };
    if body.len() as u64 != size {
        return Err(format!("blob {id}: {} bytes, {size} declared", body.len()));
    }
    if !md5.is_empty() && md5 != md5_b64(body) {
        return Err(format!("blob {id}: the MD5 differs from the declared one"));
    }
    let dir = inner.root.join("uploads");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join(id);
    std::fs::write(&path, body).map_err(|e| e.to_string())?;
    let mut st = inner.state.lock().unwrap();
    st.blobs.insert(id.to_string(), path);
    if let Some(r) = st.blob_records.iter_mut().find(|r| r.id == id) {
        r.completed = true;
    }
    Ok(())
}

/// S3's `CompleteMultipartUpload`: the parts named (number, quoted ETag), in order.
fn completion_parts(body: &str) -> Vec<(usize, String)> {
    body.split("<Part>")
        .skip(1)
        .filter_map(|p| {
            let num = p.split("<PartNumber>").nth(1)?.split("</PartNumber>").next()?;
            let etag = p.split("<ETag>").nth(1)?.split("</ETag>").next()?;
            Some((
                num.trim().parse().ok()?,
                etag.trim().trim_matches('"').to_string(),
            ))
        })
        .collect()
}

/// The blob store's side of an upload (as S3 answers it): `PUT /blob/ID` (the whole,
/// `Content-MD5` checked when sent), `PUT /blob/ID/part/N`, `POST /blob/ID/complete`.
/// Each `PUT` answers the MD5 of what it got as its `ETag`; the completion answers the
/// whole's (`MD5(part MD5s)-N`). Returns (status line, extra headers, body).
fn blob_request(
    inner: &Inner,
    method: &str,
    path: &str,
    md5: Option<&str>,
    body: &[u8],
) -> (String, String, String) {
    let bad = |why: String| ("400 Bad Request".to_string(), String::new(), why);
    let Some(rest) = path.strip_prefix("/blob/") else {
        return ("404 Not Found".into(), String::new(), String::new());
    };
    let mut segs = rest.split('/');
    let id = segs.next().unwrap_or_default().to_string();
    let tail: Vec<&str> = segs.collect();
    let known = inner.state.lock().unwrap().blob_claims.contains_key(&id);
    if !known {
        return ("404 Not Found".into(), String::new(), format!("no blob {id}"));
    }
    if method == "PUT" {
        {
            let mut st = inner.state.lock().unwrap();
            if let Some(r) = st.blob_records.iter_mut().find(|r| r.id == id) {
                r.puts += 1;
            }
        }
        let mut sc = inner.scenario.lock().unwrap();
        if sc.fail_blob_puts > 0 {
            sc.fail_blob_puts -= 1;
            return (
                "503 Slow Down".into(),
                String::new(),
                "<Error><Code>SlowDown</Code></Error>".into(),
            );
        }
    }
    let etag = format!("ETag: \"{}\"\r\n", md5_hex(body));
    match (method, tail.as_slice()) {
        ("PUT", []) => {
            if md5.is_some_and(|m| m != md5_b64(body)) {
                return bad("The Content-MD5 you specified did not match what we received.".into());
            }
            match blob_done(inner, &id, body) {
                Ok(()) => ("200 OK".into(), etag, String::new()),
                Err(e) => bad(e),
            }
        }
        ("PUT", ["part", n]) => {
            let Ok(n) = n.parse::<usize>() else {
                return bad("bad part number".into());
            };
            let dir = inner.root.join("uploads");
            let _ = std::fs::create_dir_all(&dir);
            match std::fs::write(dir.join(format!("{id}.part{n}")), body) {
                Ok(()) => ("200 OK".into(), etag, String::new()),
                Err(e) => ("500 Internal Server Error".into(), String::new(), e.to_string()),
            }
        }
        ("POST", ["complete"]) => {
            let parts = completion_parts(&String::from_utf8_lossy(body));
            if parts.is_empty() || parts.iter().enumerate().any(|(i, (n, _))| *n != i + 1) {
                return bad("<Error><Code>InvalidPartOrder</Code></Error>".into());
            }
            let dir = inner.root.join("uploads");
            let mut whole = Vec::new();
            let mut md5s = Vec::new();
            for (n, tag) in &parts {
                let Ok(data) = std::fs::read(dir.join(format!("{id}.part{n}"))) else {
                    return bad("<Error><Code>InvalidPart</Code></Error>".into());
                };
                if md5_hex(&data) != *tag {
                    return bad("<Error><Code>InvalidPart</Code></Error>".into());
                }
                use md5::Digest;
                md5s.extend(md5::Md5::digest(&data));
                whole.extend(data);
            }
            if let Err(e) = blob_done(inner, &id, &whole) {
                return bad(e);
            }
            let tag = format!("{}-{}", md5_hex(&md5s), parts.len());
            (
                "200 OK".into(),
                String::new(),
                format!("<CompleteMultipartUploadResult><ETag>&quot;{tag}&quot;</ETag></CompleteMultipartUploadResult>"),
            )
        }
        _ => ("405 Method Not Allowed".into(), String::new(), String::new()),
    }
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
            let method = parts.first().copied().unwrap_or_default();
            let path = parts.get(1).copied().unwrap_or_default();
            let (status, headers, text) = blob_request(&inner, method, path, md5.as_deref(), &body);
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        });
    }
}
