//! The hub token: found where the hub's own tools look, never shown.

use std::fmt;

/// A secret string whose `Debug` and `Display` never reveal it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// `HF_TOKEN`, else the file at `HF_TOKEN_PATH`, else `$HF_HOME/token` (the
/// order `huggingface_hub` and `hf-hub` use). `HF_HUB_DISABLE_IMPLICIT_TOKEN`
/// turns the lookup off.
pub fn resolve_token() -> Option<Secret> {
    let nonempty = |s: String| {
        let t = s.trim().to_string();
        (!t.is_empty()).then_some(Secret(t))
    };
    if std::env::var("HF_HUB_DISABLE_IMPLICIT_TOKEN")
        .map(|v| !v.is_empty())
        .unwrap_or(false)
    {
        return None;
    }
    if let Some(t) = std::env::var("HF_TOKEN").ok().and_then(nonempty) {
        return Some(t);
    }
    if let Some(t) = std::env::var("HF_TOKEN_PATH")
        .ok()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(nonempty)
    {
        return Some(t);
    }
    std::fs::read_to_string(hf_hub::hf_home().join("token"))
        .ok()
        .and_then(nonempty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shown() {
        let s = Secret("hf_abc".into());
        assert_eq!(format!("{s} {s:?}"), "*** Secret(***)");
        assert_eq!(s.expose(), "hf_abc");
    }
}
