//! Where things are: `s3://bucket/prefix` parsed, a run's key, the keys of
//! its records, the runs' folders under the prefix.

use crate::{Result, S3Store};
use orch_store::StoreError;

/// `s3://bucket/prefix` → (bucket, prefix without slashes at either end).
pub fn parse_url(url: &str) -> Result<(String, String)> {
    let bad = |why: &str| StoreError::Remote {
        message: format!("`--store {url}`: {why}"),
        hint: "write `--store s3://BUCKET/PREFIX` (the prefix may be empty)".into(),
        user: true,
    };
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad("not an `s3://` URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty()
        || !bucket
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(bad(
            "the bucket name is empty or has characters a bucket cannot have",
        ));
    }
    // S3, R2, GCS and MinIO all refuse shorter names (GCS allows up to 222
    // characters with dots: the upper bound is the server's to say).
    if bucket.len() < 3 {
        return Err(bad("a bucket name has at least 3 characters"));
    }
    let prefix = prefix.trim_matches('/');
    if !prefix.is_empty() {
        orch_store::check_relative("store prefix", prefix)?;
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

impl S3Store {
    /// `<prefix>/<run>/`
    pub fn run_key(&self, id: &str) -> String {
        format!("{}{id}/", self.prefix)
    }

    /// Every record key of a run (`records/<cell>/<n>.json`, `done/<cell>.json`), relative to the run.
    pub(crate) fn record_keys(&self, id: &str) -> Result<Vec<String>> {
        let base = self.run_key(id);
        let mut keys: Vec<String> = Vec::new();
        for l in self.objects.list(&format!("{base}records/"))? {
            keys.push(l.key[base.len()..].to_string());
        }
        for l in self.objects.list_dir(&format!("{base}done/"))? {
            keys.push(l.key[base.len()..].to_string());
        }
        Ok(keys)
    }

    /// The runs' folders under the prefix (the listing of a store written
    /// before the run markers).
    pub(crate) fn folder_run_ids(&self) -> Result<Vec<String>> {
        Ok(self
            .objects
            .list_dirs(&self.prefix)?
            .into_iter()
            .filter_map(|d| d[self.prefix.len()..].strip_suffix('/').map(String::from))
            .filter(|id| !id.starts_with('.'))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_parsed_and_bad_ones_named() {
        assert_eq!(
            parse_url("s3://team-results/perf/").unwrap(),
            ("team-results".to_string(), "perf".to_string())
        );
        assert_eq!(parse_url("s3://abc").unwrap(), ("abc".to_string(), String::new()));
        for (url, why) in [
            ("team/x", "not an `s3://` URL"),
            ("s3://", "empty"),
            ("s3://b/x", "at least 3 characters"),
            ("s3://a b/x", "characters a bucket cannot have"),
        ] {
            let err = parse_url(url).unwrap_err();
            assert!(err.is_user_error(), "{url}: {err}");
            let text = err.to_string();
            assert!(
                text.contains(why) && text.contains(url) && text.contains("hint:"),
                "{url}: {text}"
            );
        }
        assert!(parse_url("s3://team/../x").unwrap_err().is_user_error());
    }
}
