//! GPU requests, written as Modal and SkyPilot users write them:
//! `TYPE[:COUNT]`, case-insensitive (`H100`, `h100:8`, `A100-80GB:2`, `L4`);
//! `none` (or `cpu`) means CPU only.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A GPU model the tool knows, with its memory per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuType {
    /// Normalised name (`A100-80GB`).
    pub name: &'static str,
    /// Memory per GPU in GiB.
    pub memory_gib: u32,
}

/// Every known GPU type. Aliases are in [`ALIASES`].
pub const KNOWN_GPUS: &[GpuType] = &[
    GpuType {
        name: "T4",
        memory_gib: 16,
    },
    GpuType {
        name: "L4",
        memory_gib: 24,
    },
    GpuType {
        name: "A10G",
        memory_gib: 24,
    },
    GpuType {
        name: "A10",
        memory_gib: 24,
    },
    GpuType {
        name: "L40S",
        memory_gib: 48,
    },
    GpuType {
        name: "A100-40GB",
        memory_gib: 40,
    },
    GpuType {
        name: "A100-80GB",
        memory_gib: 80,
    },
    GpuType {
        name: "H100",
        memory_gib: 80,
    },
    GpuType {
        name: "H200",
        memory_gib: 141,
    },
    GpuType {
        name: "B200",
        memory_gib: 180,
    },
];

/// Other spellings accepted for a known type (lowercase alias, name).
pub const ALIASES: &[(&str, &str)] = &[
    ("a100", "A100-40GB"),
    ("h100-80gb", "H100"),
    ("a10g-24gb", "A10G"),
];

/// Most GPUs one cell may ask for (one node).
pub const MAX_GPUS_PER_CELL: u32 = 8;

/// A normalised GPU request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSpec {
    /// `None`: CPU only.
    pub gpu: Option<GpuType>,
    /// GPUs asked for (0 for CPU only).
    pub count: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuSpecError {
    #[error("unknown GPU type `{given}`: known types are {known}, or `none` for CPU only")]
    UnknownType { given: String, known: String },
    #[error("invalid GPU count `{given}` in `{spec}`: write a whole number from 1 to {max}")]
    BadCount { spec: String, given: String, max: u32 },
    #[error("empty GPU spec: write `TYPE[:COUNT]` (`H100`, `H100:8`) or `none`")]
    Empty,
    /// `H100x8`, `h100*8`: the form of cell ids, not of requests.
    #[error("unknown GPU type `{given}`: write `{suggestion}` (the count goes after a colon)")]
    CountWithoutColon { given: String, suggestion: String },
}

/// `H100x8` / `H100*8` / `H100 x 8` → `H100:8` when the part before the
/// count is a known type.
fn colon_form(ty: &str) -> Option<String> {
    let lower = ty.to_ascii_lowercase();
    let cut = lower.rfind(['x', '*'])?;
    let (t, n) = (lower[..cut].trim(), lower[cut + 1..].trim());
    if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let name = ALIASES.iter().find(|(a, _)| *a == t).map(|(_, n)| *n);
    let g = KNOWN_GPUS
        .iter()
        .find(|g| g.name.eq_ignore_ascii_case(t) || Some(g.name) == name)?;
    Some(format!("{}:{n}", g.name))
}

impl GpuSpec {
    pub const CPU: GpuSpec = GpuSpec { gpu: None, count: 0 };

    pub fn parse(text: &str) -> Result<GpuSpec, GpuSpecError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(GpuSpecError::Empty);
        }
        let (ty, count) = match text.rsplit_once(':') {
            Some((t, c)) => (t.trim(), Some(c.trim())),
            None => (text, None),
        };
        let lower = ty.to_ascii_lowercase();
        if lower == "none" || lower == "cpu" {
            if count.is_some() {
                return Err(GpuSpecError::BadCount {
                    spec: text.into(),
                    given: count.unwrap_or_default().into(),
                    max: MAX_GPUS_PER_CELL,
                });
            }
            return Ok(GpuSpec::CPU);
        }
        let name = ALIASES.iter().find(|(a, _)| *a == lower).map(|(_, n)| *n);
        let gpu = KNOWN_GPUS
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(ty) || Some(g.name) == name)
            .copied()
            .ok_or_else(|| match colon_form(ty).filter(|_| count.is_none()) {
                Some(suggestion) => GpuSpecError::CountWithoutColon {
                    given: ty.into(),
                    suggestion,
                },
                None => GpuSpecError::UnknownType {
                    given: ty.into(),
                    known: KNOWN_GPUS.iter().map(|g| g.name).collect::<Vec<_>>().join(", "),
                },
            })?;
        let count = match count {
            None => 1,
            Some(c) => match c.parse::<u32>() {
                Ok(n) if (1..=MAX_GPUS_PER_CELL).contains(&n) => n,
                _ => {
                    return Err(GpuSpecError::BadCount {
                        spec: text.into(),
                        given: c.into(),
                        max: MAX_GPUS_PER_CELL,
                    })
                }
            },
        };
        Ok(GpuSpec {
            gpu: Some(gpu),
            count,
        })
    }

    /// Parse a comma-separated list (`--gpu H100:8,A100-80GB:2`).
    pub fn parse_list(text: &str) -> Result<Vec<GpuSpec>, GpuSpecError> {
        text.split(',').map(GpuSpec::parse).collect()
    }

    pub fn is_cpu(&self) -> bool {
        self.gpu.is_none()
    }

    /// Total GPU memory asked for, in GiB.
    pub fn total_memory_gib(&self) -> u32 {
        self.gpu.map(|g| g.memory_gib * self.count).unwrap_or(0)
    }

    /// Form used in cell ids and file names: `cpu`, `h100`, `h100x8`, `a100-80gbx2`.
    pub fn slug(&self) -> String {
        match self.gpu {
            None => "cpu".into(),
            Some(g) if self.count == 1 => g.name.to_ascii_lowercase(),
            Some(g) => format!("{}x{}", g.name.to_ascii_lowercase(), self.count),
        }
    }
}

impl fmt::Display for GpuSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.gpu {
            None => f.write_str("none"),
            Some(g) if self.count == 1 => f.write_str(g.name),
            Some(g) => write!(f, "{}:{}", g.name, self.count),
        }
    }
}

impl Serialize for GpuSpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GpuSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        GpuSpec::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_normalises() {
        for (given, want) in [
            ("H100", "H100"),
            ("h100:8", "H100:8"),
            ("A100-80GB:2", "A100-80GB:2"),
            ("a100-80gb:2", "A100-80GB:2"),
            ("L4", "L4"),
            ("l4:1", "L4"),
            ("A100", "A100-40GB"),
            ("none", "none"),
            ("CPU", "none"),
            (" t4 ", "T4"),
        ] {
            assert_eq!(GpuSpec::parse(given).unwrap().to_string(), want, "{given}");
        }
        assert_eq!(GpuSpec::parse("H100:8").unwrap().slug(), "h100x8");
        assert_eq!(GpuSpec::parse("H100:8").unwrap().total_memory_gib(), 640);
    }

    #[test]
    fn rejects_bad_specs() {
        let e = GpuSpec::parse("H1000").unwrap_err().to_string();
        assert!(
            e.contains("unknown GPU type `H1000`") && e.contains("A100-80GB"),
            "{e}"
        );
        assert!(matches!(
            GpuSpec::parse("H100:0"),
            Err(GpuSpecError::BadCount { .. })
        ));
        assert!(matches!(
            GpuSpec::parse("H100:9"),
            Err(GpuSpecError::BadCount { .. })
        ));
        assert!(matches!(
            GpuSpec::parse("H100:x"),
            Err(GpuSpecError::BadCount { .. })
        ));
        assert!(matches!(
            GpuSpec::parse("none:2"),
            Err(GpuSpecError::BadCount { .. })
        ));
        assert!(matches!(GpuSpec::parse(""), Err(GpuSpecError::Empty)));
        for (given, want) in [
            ("H100x8", "H100:8"),
            ("a100-80gbx2", "A100-80GB:2"),
            ("h100*4", "H100:4"),
        ] {
            let e = GpuSpec::parse(given).unwrap_err();
            assert!(e.to_string().contains(&format!("`{want}`")), "{given}: {e}");
        }
        assert!(matches!(
            GpuSpec::parse("X100x8"),
            Err(GpuSpecError::UnknownType { .. })
        ));
        assert_eq!(GpuSpec::parse_list("H100:8,L4").unwrap().len(), 2);
    }
}
