//! Modal's blob store, as the official client (`modal/_utils/blob_utils.py`,
//! 1.x) writes to it: files of [`LARGE_FILE_LIMIT`] bytes or more travel
//! there instead of inline in a gRPC request.
//!
//! - `BlobCreate` with the content's MD5 and SHA-256 (base64) and length;
//! - the answer names where the bytes go: one or more providers tried in
//!   order (`upload_types_oneof`, one `blob_ids` entry each, what the 1.x
//!   client reads), else the older single form (`upload_type_oneof` with
//!   `blob_id`); see [`targets`];
//! - a single upload is one `PUT` (`Content-Type: application/octet-stream`,
//!   `Content-MD5` for S3/R2 hosts only: the official `use_md5` leaves it out
//!   for localhost and private addresses);
//! - a multipart upload ([`split`]) is one `PUT` per part URL, part `i`
//!   holding bytes `[i * part_length, min((i + 1) * part_length, size))`,
//!   each with no `Content-Type`, at most [`PARALLEL_PARTS`] at a time;
//!   then a `POST` of S3's `CompleteMultipartUpload` XML (each part's
//!   number and quoted ETag) to the completion URL, whose answer must name
//!   the whole's ETag (MD5 of the parts' MD5s, `-N`);
//! - every `PUT` is tried [`PUT_ATTEMPTS`] times (0.3 s, doubling; one more
//!   second after S3's `503 SlowDown`), and the ETag it answers must be the
//!   MD5 of what was sent (the client-side check of the official client);
//!   a provider that fails is given up for the next one.
//!
//! Upload URLs are presigned: they never appear in an error.

use crate::client::Modal;
use crate::proto;
use crate::ModalError;
use sha2::Digest;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// Files of this size or more go through the blob store (the official
/// client's `LARGE_FILE_LIMIT`, 4 MiB); smaller ones inline.
pub const LARGE_FILE_LIMIT: usize = 4 * 1024 * 1024;
/// Attempts of one `PUT` (the official client's `n_attempts=3`).
pub const PUT_ATTEMPTS: u32 = 3;
/// The first pause between them (`base_delay=0.3`), doubling.
pub const PUT_RETRY_BASE: Duration = Duration::from_millis(300);
/// Parts of one multipart upload in flight at once.
pub const PARALLEL_PARTS: usize = 8;

/// Where `BlobCreate` says a blob's bytes go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One `PUT` of the whole.
    Single(String),
    /// A `PUT` per part, then the completion `POST`.
    Multipart {
        part_length: u64,
        urls: Vec<String>,
        completion_url: String,
    },
}

/// The (blob id, target) pairs of a `BlobCreate` answer, to try in order:
/// the providers of `upload_types_oneof` with their `blob_ids` when the
/// answer has them (as the official 1.x client reads it), else the single
/// target of `upload_type_oneof` with `blob_id`.
pub fn targets(resp: &proto::BlobCreateResponse) -> Vec<(String, Target)> {
    use proto::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
    let multi = |m: &proto::MultiPartUpload| Target::Multipart {
        part_length: u64::try_from(m.part_length).unwrap_or(0),
        urls: m.upload_urls.clone(),
        completion_url: m.completion_url.clone(),
    };
    let list: Vec<Target> = match &resp.upload_types_oneof {
        Some(UploadTypesOneof::UploadUrls(l)) => l.items.iter().cloned().map(Target::Single).collect(),
        Some(UploadTypesOneof::Multiparts(l)) => l.items.iter().map(multi).collect(),
        None => vec![],
    };
    if !list.is_empty() {
        return resp.blob_ids.iter().cloned().zip(list).collect();
    }
    match &resp.upload_type_oneof {
        Some(UploadTypeOneof::UploadUrl(u)) => vec![(resp.blob_id.clone(), Target::Single(u.clone()))],
        Some(UploadTypeOneof::Multipart(m)) => vec![(resp.blob_id.clone(), multi(m))],
        None => vec![],
    }
}

/// The byte ranges of a multipart upload of `len` bytes: one per URL, each
/// `part_length` long but the last (the official `perform_multipart_upload`);
/// an error when the parts cannot hold the file.
pub fn split(len: u64, part_length: u64, urls: usize) -> Result<Vec<Range<usize>>, String> {
    if part_length == 0 {
        return Err("Modal asked for parts of 0 bytes".into());
    }
    if part_length.saturating_mul(urls as u64) < len {
        return Err(format!(
            "Modal gave {urls} part URL(s) of {part_length} bytes for {len} bytes"
        ));
    }
    let mut out = Vec::with_capacity(urls);
    let mut at = 0u64;
    for _ in 0..urls {
        let n = part_length.min(len - at);
        out.push(at as usize..(at + n) as usize);
        at += n;
    }
    Ok(out)
}

/// S3's `CompleteMultipartUpload` body, as the official client writes it.
pub fn completion_body(etags: &[String]) -> String {
    let mut lines = vec!["<CompleteMultipartUpload>".to_string()];
    for (i, e) in etags.iter().enumerate() {
        lines.push(format!(
            "<Part>\n<PartNumber>{}</PartNumber>\n<ETag>\"{e}\"</ETag>\n</Part>",
            i + 1
        ));
    }
    lines.push("</CompleteMultipartUpload>".into());
    lines.join("\n")
}

/// The ETag of the assembled object: the MD5 of the parts' MD5s (as
/// bytes), then `-N`.
pub fn multipart_etag(etags: &[String]) -> Option<String> {
    let mut all = Vec::with_capacity(etags.len() * 16);
    for e in etags {
        all.extend(from_hex(e)?);
    }
    Some(format!(
        "{}-{}",
        crate::ops::hex(&md5::Md5::digest(&all)),
        etags.len()
    ))
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Whether a `PUT` to `url` carries `Content-MD5`: S3 and R2 hosts yes,
/// localhost and private or loopback addresses no (the official
/// `use_md5`, a workaround for test stores); other hosts yes.
pub fn use_md5(url: &str) -> bool {
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        authority.rsplit_once(':').map(|(h, _)| h).unwrap_or(authority)
    };
    if host.ends_with(".amazonaws.com") || host.ends_with(".r2.cloudflarestorage.com") {
        return true;
    }
    if host == "localhost" {
        return false;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => !(a.is_private() || a.is_loopback()),
        Ok(std::net::IpAddr::V6(a)) => !(a.is_loopback() || (a.segments()[0] & 0xfe00) == 0xfc00),
        Err(_) => true,
    }
}

fn unquote(etag: &str) -> String {
    let e = etag.trim();
    let e = e.strip_prefix("W/").or_else(|| e.strip_prefix("w/")).unwrap_or(e);
    e.trim_matches('"').to_string()
}

/// `BlobCreate`, then the bytes to the first target that takes them; the
/// blob id.
pub async fn upload(modal: &Modal, data: &[u8], name: &str) -> Result<String, ModalError> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let md5 = b64.encode(md5::Md5::digest(data));
    let req = proto::BlobCreateRequest {
        content_md5: md5.clone(),
        content_sha256_base64: b64.encode(sha2::Sha256::digest(data)),
        content_length: data.len() as i64,
    };
    let resp = modal
        .call(
            "BlobCreate",
            req,
            |mut c, r| async move { c.blob_create(r).await },
        )
        .await
        .map_err(ModalError::rpc("BlobCreate"))?;
    let targets = targets(&resp);
    if targets.is_empty() {
        return Err(ModalError::Upload {
            file: name.into(),
            message: "Modal's `BlobCreate` answer named no upload URL".into(),
        });
    }
    let client = reqwest::Client::new();
    let data: Arc<[u8]> = Arc::from(data);
    let mut last = String::new();
    for (blob_id, target) in targets {
        let r = match target {
            Target::Single(url) => put(&client, &url, &data, 0..data.len(), Some(md5.as_str()))
                .await
                .map(|_| ()),
            Target::Multipart {
                part_length,
                urls,
                completion_url,
            } => multipart(&client, &data, part_length, urls, &completion_url).await,
        };
        match r {
            Ok(()) => return Ok(blob_id),
            Err(m) => last = m,
        }
    }
    Err(ModalError::Upload {
        file: name.into(),
        message: last,
    })
}

/// One `PUT` of `data[range]`, retried; the ETag it answered (checked
/// against the MD5 of what was sent when there is one). `md5` (base64) is
/// sent as `Content-MD5` with a `Content-Type` for a single upload; parts
/// go without either, as the official client sends them.
async fn put(
    client: &reqwest::Client,
    url: &str,
    data: &Arc<[u8]>,
    range: Range<usize>,
    md5: Option<&str>,
) -> Result<String, String> {
    let body = &data[range];
    let want = crate::ops::hex(&md5::Md5::digest(body));
    let mut pause = PUT_RETRY_BASE;
    let mut last = String::new();
    for attempt in 0..PUT_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        let mut req = client.put(url).body(body.to_vec());
        if let Some(m) = md5 {
            req = req.header("Content-Type", "application/octet-stream");
            if use_md5(url) {
                req = req.header("Content-MD5", m);
            }
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                let etag = r.headers().get("etag").and_then(|v| v.to_str().ok()).map(unquote);
                match etag {
                    Some(e) if e == want => return Ok(e),
                    // A store that names no ETag cannot be checked: take it.
                    None => return Ok(want),
                    Some(e) => last = format!("the blob store's checksum {e} differs from the data's {want}"),
                }
            }
            // The URL is presigned: never show it (it grants access).
            Ok(r) => {
                if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
                    // S3's `SlowDown`: the official client waits a second more.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                last = format!("the blob store answered {}", r.status());
            }
            Err(e) => last = format!("the blob store is not reachable ({})", e.without_url()),
        }
    }
    Err(last)
}

/// The parts (each retried on its own), then the completion.
async fn multipart(
    client: &reqwest::Client,
    data: &Arc<[u8]>,
    part_length: u64,
    urls: Vec<String>,
    completion_url: &str,
) -> Result<(), String> {
    let ranges = split(data.len() as u64, part_length, urls.len())?;
    let gate = Arc::new(tokio::sync::Semaphore::new(PARALLEL_PARTS));
    let mut set = tokio::task::JoinSet::new();
    for (i, (url, range)) in urls.into_iter().zip(ranges).enumerate() {
        let (client, data, gate) = (client.clone(), data.clone(), gate.clone());
        set.spawn(async move {
            let _permit = gate.acquire_owned().await;
            (i, put(&client, &url, &data, range, None).await)
        });
    }
    let mut etags = vec![String::new(); set.len()];
    while let Some(done) = set.join_next().await {
        let (i, r) = done.map_err(|e| format!("a part upload stopped ({e})"))?;
        etags[i] = r.map_err(|m| format!("part {}: {m}", i + 1))?;
    }
    let expected = multipart_etag(&etags).ok_or("the blob store answered a part ETag that is not MD5 hex")?;
    let r = client
        .post(completion_url)
        .body(completion_body(&etags))
        .send()
        .await
        .map_err(|e| format!("completing the multipart upload failed ({})", e.without_url()))?;
    if !r.status().is_success() {
        return Err(format!(
            "completing the multipart upload: the blob store answered {}",
            r.status()
        ));
    }
    let text = r
        .text()
        .await
        .map_err(|e| format!("completing the multipart upload failed ({})", e.without_url()))?;
    if !text.contains(&expected) {
        return Err(format!(
            "the assembled upload's checksum is not {expected}: the parts did not arrive whole"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_split_into_parts_of_the_length_asked() {
        assert_eq!(split(10, 4, 3).unwrap(), vec![0..4, 4..8, 8..10]);
        assert_eq!(split(8, 4, 2).unwrap(), vec![0..4, 4..8]);
        // Five MiB in 2 MiB parts.
        let mib = 1024 * 1024;
        let p = split(5 * mib, 2 * mib, 3).unwrap();
        assert_eq!(p.iter().map(|r| r.len() as u64).sum::<u64>(), 5 * mib);
        assert_eq!(p[2].len() as u64, mib);
        // More URLs than bytes need: the extra parts are empty (as the official client sends them).
        assert_eq!(split(4, 4, 2).unwrap(), vec![0..4, 4..4]);
        assert!(split(10, 4, 2).is_err());
        assert!(split(10, 0, 9).is_err());
    }

    #[test]
    fn the_completion_names_every_part_and_the_whole_etag_is_the_md5_of_md5s() {
        let a = crate::ops::hex(&md5::Md5::digest(b"abc"));
        let b = crate::ops::hex(&md5::Md5::digest(b"de"));
        let body = completion_body(&[a.clone(), b.clone()]);
        assert!(body.starts_with("<CompleteMultipartUpload>\n<Part>\n<PartNumber>1</PartNumber>"));
        assert!(body.contains(&format!("<PartNumber>2</PartNumber>\n<ETag>\"{b}\"</ETag>")));
        assert!(body.ends_with("</CompleteMultipartUpload>"));
        let mut cat = md5::Md5::digest(b"abc").to_vec();
        cat.extend(md5::Md5::digest(b"de"));
        assert_eq!(
            multipart_etag(&[a, b]).unwrap(),
            format!("{}-2", crate::ops::hex(&md5::Md5::digest(&cat)))
        );
        assert!(multipart_etag(&["zz".into()]).is_none());
    }

    #[test]
    fn both_answer_forms_are_read() {
        use proto::blob_create_response::{UploadTypeOneof, UploadTypesOneof};
        let old = proto::BlobCreateResponse {
            blob_id: "bl-1".into(),
            upload_type_oneof: Some(UploadTypeOneof::UploadUrl("http://x/1".into())),
            ..Default::default()
        };
        assert_eq!(
            targets(&old),
            vec![("bl-1".into(), Target::Single("http://x/1".into()))]
        );
        let new = proto::BlobCreateResponse {
            blob_id: "bl-old".into(),
            upload_type_oneof: Some(UploadTypeOneof::UploadUrl("http://x/old".into())),
            blob_ids: vec!["bl-a".into(), "bl-b".into()],
            upload_types_oneof: Some(UploadTypesOneof::Multiparts(proto::MultiPartUploadList {
                items: vec![
                    proto::MultiPartUpload {
                        part_length: 5,
                        upload_urls: vec!["p1".into(), "p2".into()],
                        completion_url: "c".into(),
                    },
                    proto::MultiPartUpload {
                        part_length: 10,
                        upload_urls: vec!["q1".into()],
                        completion_url: "d".into(),
                    },
                ],
            })),
        };
        let t = targets(&new);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[0],
            (
                "bl-a".into(),
                Target::Multipart {
                    part_length: 5,
                    urls: vec!["p1".into(), "p2".into()],
                    completion_url: "c".into()
                }
            )
        );
        assert_eq!(t[1].0, "bl-b");
        assert!(targets(&proto::BlobCreateResponse::default()).is_empty());
    }

    #[test]
    fn content_md5_goes_to_s3_and_not_to_local_stores() {
        assert!(use_md5("https://modal-blobs.s3.us-east-1.amazonaws.com/b?sig=1"));
        assert!(use_md5("https://acct.r2.cloudflarestorage.com/b"));
        assert!(!use_md5("http://localhost:9000/b"));
        assert!(!use_md5("http://127.0.0.1:41234/blob/bl-1"));
        assert!(!use_md5("http://10.1.2.3/blob"));
        assert!(!use_md5("http://[::1]:80/blob"));
    }
}
