//! Durations (`90s`, `10m`, or a number of seconds) and byte sizes (`64MiB`,
//! `4GB`, or a number of bytes) as manifest values.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Seconds(pub f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) if n >= 0.0 && n.is_finite() => Ok(Seconds(n)),
            Raw::Num(n) => Err(serde::de::Error::custom(format!(
                "invalid duration `{n}`: write a positive number of seconds or a duration like `90s`, `10m`, `1h`"
            ))),
            Raw::Text(t) => parse_duration(&t).map(Seconds).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

pub fn parse_duration(t: &str) -> Result<f64, String> {
    let t = t.trim();
    if let Ok(n) = t.parse::<f64>() {
        if n >= 0.0 && n.is_finite() {
            return Ok(n);
        }
    }
    humantime::parse_duration(t)
        .map(|d| d.as_secs_f64())
        .map_err(|e| {
            format!("invalid duration `{t}` ({e}): write seconds or a duration like `90s`, `10m`, `1h30m`")
        })
}

/// A size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Num(n) => Ok(Bytes(n)),
            Raw::Text(t) => parse_bytes(&t).map(Bytes).map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

pub fn parse_bytes(t: &str) -> Result<u64, String> {
    let t = t.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("invalid size `{t}`: write bytes or a size like `512MiB`, `4GiB`, `2GB`");
    let n: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "t" | "tb" => 1e12,
        "ki" | "kib" => 1024.0,
        "mi" | "mib" => 1024.0 * 1024.0,
        "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "ti" | "tib" => 1024f64.powi(4),
        _ => return Err(bad()),
    };
    Ok((n * mult).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), 90.0);
        assert_eq!(parse_duration("10m").unwrap(), 600.0);
        assert_eq!(parse_duration("1.5").unwrap(), 1.5);
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("lots").is_err());
    }
}
