//! Credentials and endpoint, found the way Modal's own clients find them:
//! `MODAL_TOKEN_ID` + `MODAL_TOKEN_SECRET`, else the profile of
//! `~/.modal.toml` named by `MODAL_PROFILE`, else the one marked
//! `active = true`, else the only one; `MODAL_SERVER_URL` (else the
//! profile's `server_url`, else `https://api.modal.com`) and
//! `MODAL_ENVIRONMENT` (else the profile's `environment`) are honoured.
//! The secret is never printed: `Debug` shows its length only.

use crate::ModalError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const DEFAULT_SERVER_URL: &str = "https://api.modal.com";

#[derive(Clone)]
pub struct Credentials {
    pub token_id: String,
    pub token_secret: String,
    pub server_url: String,
    /// The Modal environment (`""`: the workspace's default).
    pub environment: String,
    /// Where the token came from (for messages; never the token itself).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token_id", &self.token_id)
            .field(
                "token_secret",
                &format_args!("<{} bytes>", self.token_secret.len()),
            )
            .field("server_url", &self.server_url)
            .field("environment", &self.environment)
            .field("source", &self.source)
            .finish()
    }
}

#[derive(Debug, Default, Deserialize)]
struct Profile {
    token_id: Option<String>,
    token_secret: Option<String>,
    server_url: Option<String>,
    environment: Option<String>,
    #[serde(default)]
    active: bool,
}

/// `~/.modal.toml` (or `MODAL_CONFIG_PATH`).
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MODAL_CONFIG_PATH").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".modal.toml"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Credentials {
    /// Find the credentials; a missing token is an `Unavailable` error with a hint.
    pub fn from_env() -> Result<Credentials, ModalError> {
        let path = config_path();
        let profile = match &path {
            Some(p) if p.is_file() => read_profile(p, env("MODAL_PROFILE").as_deref())?,
            _ => None,
        };
        let (pname, profile) = profile.unwrap_or_default();
        let server_url = env("MODAL_SERVER_URL")
            .or(profile.server_url.clone())
            .unwrap_or_else(|| DEFAULT_SERVER_URL.into());
        let environment = env("MODAL_ENVIRONMENT")
            .or(profile.environment.clone())
            .unwrap_or_default();
        let (token_id, token_secret, source) = match (env("MODAL_TOKEN_ID"), env("MODAL_TOKEN_SECRET")) {
            (Some(id), Some(secret)) => (id, secret, "`MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET`".to_string()),
            _ => match (profile.token_id, profile.token_secret) {
                (Some(id), Some(secret)) => (
                    id,
                    secret,
                    format!(
                        "profile `{pname}` of `{}`",
                        path.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_default()
                    ),
                ),
                _ => {
                    return Err(ModalError::Unavailable {
                        message: "no Modal token: `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET` are not set and `~/.modal.toml` has no active profile with a token".into(),
                        hint: "run `modal token new` (or `modal token set`), or set `MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET`".into(),
                    })
                }
            },
        };
        Ok(Credentials {
            token_id,
            token_secret,
            server_url,
            environment,
            source,
        })
    }
}

/// The profile to use: `wanted` by name, else the active one, else the only one.
fn read_profile(path: &Path, wanted: Option<&str>) -> Result<Option<(String, Profile)>, ModalError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModalError::Unavailable {
        message: format!("cannot read `{}`: {e}", path.display()),
        hint: "fix its permissions, or set `MODAL_TOKEN_ID` and `MODAL_TOKEN_SECRET`".into(),
    })?;
    let mut profiles: BTreeMap<String, Profile> = toml::from_str(&text).map_err(|e| ModalError::Unavailable {
        // toml's message names the line and column; it quotes no value of ours
        // beyond the offending span, which for a token file could be a
        // token: keep only the position.
        message: format!(
            "`{}` is not valid TOML{}",
            path.display(),
            e.span()
                .map(|s| format!(" (at byte {})", s.start))
                .unwrap_or_default()
        ),
        hint: "each profile is a `[name]` table with `token_id`, `token_secret` and `active = true` for the one in use".into(),
    })?;
    if let Some(name) = wanted {
        return match profiles.remove(name) {
            Some(p) => Ok(Some((name.to_string(), p))),
            None => Err(ModalError::Unavailable {
                message: format!(
                    "`MODAL_PROFILE` names `{name}`, which `{}` does not have",
                    path.display()
                ),
                hint: format!(
                    "the profiles there are: {}",
                    profiles
                        .keys()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        };
    }
    if let Some(name) = profiles.iter().find(|(_, p)| p.active).map(|(k, _)| k.clone()) {
        return Ok(profiles.remove(&name).map(|p| (name, p)));
    }
    if profiles.len() == 1 {
        return Ok(profiles.pop_first());
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_profile_is_chosen_and_the_secret_never_shows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("modal.toml");
        std::fs::write(
            &p,
            "[a]\ntoken_id = \"ak-1\"\ntoken_secret = \"as-1\"\n\n[b]\ntoken_id = \"ak-2\"\ntoken_secret = \"as-SECRET\"\nactive = true\nenvironment = \"dev\"\n",
        )
        .unwrap();
        let (name, prof) = read_profile(&p, None).unwrap().unwrap();
        assert_eq!(name, "b");
        assert_eq!(prof.token_id.as_deref(), Some("ak-2"));
        let (name, _) = read_profile(&p, Some("a")).unwrap().unwrap();
        assert_eq!(name, "a");
        assert!(read_profile(&p, Some("zz")).is_err());
        let c = Credentials {
            token_id: "ak-2".into(),
            token_secret: "as-SECRET".into(),
            server_url: DEFAULT_SERVER_URL.into(),
            environment: String::new(),
            source: "test".into(),
        };
        assert!(!format!("{c:?}").contains("SECRET"));
    }

    #[test]
    fn bad_toml_does_not_echo_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("modal.toml");
        std::fs::write(&p, "[a]\ntoken_secret = as-UNQUOTED-SECRET\n").unwrap();
        let e = read_profile(&p, None).unwrap_err().to_string();
        assert!(!e.contains("UNQUOTED-SECRET"), "{e}");
    }
}
