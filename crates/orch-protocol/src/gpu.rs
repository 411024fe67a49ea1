//! A cell's GPU request as the task carries it.

use serde::{Deserialize, Serialize};

/// A cell's GPU request: `none` (a CPU cell) or `TYPE[:COUNT]` (`H100:8`,
/// `L4`; a trailing `!` on the type pins it exactly where a platform could
/// substitute). On the wire (`task.json`) it is that text, as the manifest
/// normalised it; backends and the agent read the parts from here instead
/// of parsing the text again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub struct GpuRequest {
    text: String,
    /// `None`: no GPU.
    kind: Option<String>,
    count: u32,
}

impl GpuRequest {
    /// Read a request; lenient, as the manifest checked it already: an
    /// empty text, `none` or `cpu` is no GPU, a count that does not parse
    /// is 1.
    pub fn parse(text: &str) -> GpuRequest {
        let t = text.trim();
        if t.is_empty() || t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("cpu") {
            return GpuRequest {
                text: "none".into(),
                kind: None,
                count: 0,
            };
        }
        let (kind, count) = match t.rsplit_once(':') {
            Some((k, n)) => (k, n.trim().parse().unwrap_or(1)),
            None => (t, 1),
        };
        GpuRequest {
            text: t.to_string(),
            kind: Some(kind.trim().to_string()),
            count,
        }
    }

    /// No GPU.
    pub fn none() -> GpuRequest {
        GpuRequest::parse("none")
    }

    pub fn is_cpu(&self) -> bool {
        self.kind.is_none()
    }

    /// The GPU type as written (`H100`, `A100-80GB`, `H100!`); `None`: no GPU.
    pub fn kind(&self) -> Option<&str> {
        self.kind.as_deref()
    }

    /// The GPU type without the pin mark `!`.
    pub fn type_name(&self) -> Option<&str> {
        self.kind().map(|k| k.trim_end_matches('!'))
    }

    /// GPUs asked for (0 for a CPU cell).
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The request as text (`none`, `H100:8`).
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl Default for GpuRequest {
    fn default() -> Self {
        GpuRequest::none()
    }
}

impl From<String> for GpuRequest {
    fn from(s: String) -> Self {
        GpuRequest::parse(&s)
    }
}

impl From<&str> for GpuRequest {
    fn from(s: &str) -> Self {
        GpuRequest::parse(s)
    }
}

impl From<GpuRequest> for String {
    fn from(g: GpuRequest) -> Self {
        g.text
    }
}

impl std::fmt::Display for GpuRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq<str> for GpuRequest {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for GpuRequest {
    fn eq(&self, other: &&str) -> bool {
        self.text == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_their_parts_and_keep_their_text() {
        let g = GpuRequest::parse("H100:8");
        assert_eq!((g.kind(), g.count(), g.is_cpu()), (Some("H100"), 8, false));
        assert_eq!(g.to_string(), "H100:8");
        let g = GpuRequest::parse("A100-80GB");
        assert_eq!((g.kind(), g.count()), (Some("A100-80GB"), 1));
        assert_eq!(GpuRequest::parse("H100!:2").type_name(), Some("H100"));
        for cpu in ["none", "", " NONE ", "cpu"] {
            let g = GpuRequest::parse(cpu);
            assert!(g.is_cpu() && g.count() == 0 && g == "none", "{cpu}");
        }
        let json = serde_json::to_string(&GpuRequest::parse("L4:2")).unwrap();
        assert_eq!(json, "\"L4:2\"");
        let back: GpuRequest = serde_json::from_str(&json).unwrap();
        assert_eq!(back.count(), 2);
    }
}
