//! Byte downloads over plain HTTP: [`Fetcher`] (GETs of
//! `resolve/<commit>/<path>`, with ranges, the token never forwarded on a
//! redirect) and its errors.

use super::error::HubError;
use super::options::SetupEvent;
use futures::StreamExt;
use std::os::unix::fs::FileExt;
use tokio::sync::mpsc;

pub(super) const RANGE_IGNORED: &str = "the server ignored a byte range";

#[derive(Debug)]
pub(super) enum FetchError {
    /// 401/403: no access.
    Denied(u16),
    /// The server answered a ranged request with the whole file.
    RangeIgnored,
    Other(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FetchError::Denied(s) => write!(f, "access refused (HTTP {s})"),
            FetchError::RangeIgnored => f.write_str(RANGE_IGNORED),
            FetchError::Other(m) => f.write_str(m),
        }
    }
}

/// Byte downloads: plain GETs of `resolve/<commit>/<path>`, with ranges,
/// following redirects (to a CDN, say) without forwarding the token.
pub(super) struct Fetcher {
    http: reqwest::Client,
    base: reqwest::Url,
    token: Option<crate::token::Secret>,
}

impl Fetcher {
    pub(super) fn new(
        endpoint: &str,
        repo_type: &str,
        repo: &str,
        commit: &str,
    ) -> Result<Fetcher, HubError> {
        let bad = |e: String| HubError::Http {
            repo: repo.into(),
            message: format!("invalid endpoint `{endpoint}`: {e}"),
        };
        let mut base = reqwest::Url::parse(endpoint).map_err(|e| bad(e.to_string()))?;
        {
            let mut segs = base
                .path_segments_mut()
                .map_err(|_| bad("not a base URL".into()))?;
            segs.pop_if_empty();
            match repo_type {
                "dataset" => {
                    segs.push("datasets");
                }
                "space" => {
                    segs.push("spaces");
                }
                _ => {}
            }
            for part in repo.split('/') {
                segs.push(part);
            }
            segs.push("resolve");
            segs.push(commit);
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("orch/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(30))
            .read_timeout(std::time::Duration::from_secs(120))
            .build()
            .map_err(|e| bad(e.to_string()))?;
        Ok(Fetcher {
            http,
            base,
            token: crate::token::resolve_token(),
        })
    }

    fn url(&self, path: &str) -> reqwest::Url {
        let mut url = self.base.clone();
        if let Ok(mut segs) = url.path_segments_mut() {
            for part in path.split('/') {
                segs.push(part);
            }
        }
        url
    }

    /// Fetch `[start, end)` of a file (the whole file when `ranged` is false)
    /// and write it at its offset.
    pub(super) async fn fetch(
        &self,
        path: &str,
        start: u64,
        end: u64,
        ranged: bool,
        file: &std::fs::File,
        events: &mpsc::UnboundedSender<SetupEvent>,
    ) -> Result<(), FetchError> {
        if start == end {
            return Ok(()); // an empty file
        }
        let mut req = self
            .http
            .get(self.url(path))
            .header(reqwest::header::ACCEPT_ENCODING, "identity");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        if ranged {
            req = req.header(reqwest::header::RANGE, format!("bytes={}-{}", start, end - 1));
        }
        let resp = req
            .send()
            .await
            .map_err(|e| FetchError::Other(format!("`{path}`: {}", without_url(&e))))?;
        let status = resp.status().as_u16();
        match status {
            401 | 403 => return Err(FetchError::Denied(status)),
            206 if ranged => {}
            200 if ranged && !(start == 0 && end == resp.content_length().unwrap_or(0)) => {
                return Err(FetchError::RangeIgnored)
            }
            200 => {}
            s => {
                return Err(FetchError::Other(format!(
                    "`{path}`: the server answered HTTP {s}"
                )))
            }
        }
        let mut stream = resp.bytes_stream();
        let mut offset = start;
        while let Some(bytes) = stream.next().await {
            let bytes = bytes.map_err(|e| FetchError::Other(format!("`{path}`: {}", without_url(&e))))?;
            if offset + bytes.len() as u64 > end {
                return Err(FetchError::Other(format!(
                    "`{path}`: the server sent more bytes than asked"
                )));
            }
            file.write_all_at(&bytes, offset)
                .map_err(|e| FetchError::Other(format!("cannot write `{path}`: {e}")))?;
            offset += bytes.len() as u64;
            let _ = events.send(SetupEvent::Bytes(bytes.len() as u64));
        }
        if offset != end {
            return Err(FetchError::Other(format!(
                "`{path}`: the transfer ended after {} of {} bytes",
                offset - start,
                end - start
            )));
        }
        Ok(())
    }
}

/// A reqwest error without its URL (URLs may carry signed query strings).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "<url>");
    }
    s
}
