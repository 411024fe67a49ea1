//! Durations (`90s`, `10m`, or a number of seconds) and byte sizes (`64MiB`,
//! `4GB`, or a number of bytes) as manifest values.
//!
//! Both are range-checked when the manifest is parsed, so the error names
//! its `file:line:column` and nothing downstream meets a value that
//! overflows a `Duration` or an `Instant`: a duration is at most
//! [`MAX_DURATION_S`] (30 days), a size at most [`MAX_BYTES`] (1 PiB).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest duration a manifest may give (30 days): longer than any
/// cell, short enough that `Instant + Duration` never overflows.
pub const MAX_DURATION_S: f64 = 30.0 * 24.0 * 3600.0;
/// The largest size a manifest may give (1 PiB).
pub const MAX_BYTES: u64 = 1 << 50;

/// A duration in seconds, `0..=MAX_DURATION_S`.
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
            Raw::Num(n) if n > MAX_DURATION_S => Err(serde::de::Error::custom(too_long(&number(n)))),
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

/// A number as a message shows it: `1e300`, not three hundred digits.
fn number(n: f64) -> String {
    if n.abs() >= 1e16 {
        format!("{n:e}")
    } else {
        n.to_string()
    }
}

fn too_long(t: &str) -> String {
    format!("duration `{t}` is too long: the most is 30 days (`30d`, {MAX_DURATION_S} seconds)")
}

/// `90s`, `10m`, `1h30m` or a number of seconds, at most 30 days.
pub fn parse_duration(t: &str) -> Result<f64, String> {
    let t = t.trim();
    let secs = match t.parse::<f64>() {
        Ok(n) if n >= 0.0 && n.is_finite() => n,
        _ => humantime::parse_duration(t)
            .map(|d| d.as_secs_f64())
            .map_err(|e| {
                format!(
                    "invalid duration `{t}` ({e}): write seconds or a duration like `90s`, `10m`, `1h30m`"
                )
            })?,
    };
    if secs > MAX_DURATION_S {
        return Err(too_long(t));
    }
    Ok(secs)
}

/// A size in bytes, `0..=MAX_BYTES`.
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
            Raw::Num(n) if n > MAX_BYTES => Err(serde::de::Error::custom(too_large(&n.to_string()))),
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

fn too_large(t: &str) -> String {
    format!("size `{t}` is too large: the most is 1 PiB (`1024TiB`, {MAX_BYTES} bytes)")
}

/// `512MiB`, `4GiB`, `2GB` or a number of bytes, at most 1 PiB.
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
    let bytes = (n * mult).round();
    // A NaN is refused too (`.` alone does not parse, but be sure).
    if bytes.is_nan() || bytes > MAX_BYTES as f64 {
        return Err(too_large(t));
    }
    // In range and not negative (only digits and `.`), so the cast is exact.
    Ok(bytes as u64)
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
        assert_eq!(parse_duration("30d").unwrap(), MAX_DURATION_S);
        assert!(parse_duration("31d").unwrap_err().contains("too long"));
        assert!(parse_duration("18446744073709551615")
            .unwrap_err()
            .contains("too long"));
        assert!(parse_duration("18446744073709551615s").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_bytes("1.5 GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("100").unwrap(), 100);
        assert!(parse_bytes("lots").is_err());
        assert_eq!(parse_bytes("1024TiB").unwrap(), MAX_BYTES);
        assert!(parse_bytes("1025TiB").unwrap_err().contains("too large"));
        assert!(parse_bytes("99999999999999999999999TB")
            .unwrap_err()
            .contains("too large"));
    }
}
