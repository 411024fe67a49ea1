//! Small helpers: timestamps, random names, `Status` errors, quantities, selectors, merge patches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

/// RFC 3339 UTC with seconds (`2026-01-02T03:04:05Z`), as Kubernetes writes `metav1.Time`.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (date, hms) = civil(d.as_secs());
    format!("{date}T{hms}Z")
}

/// RFC 3339 with nanoseconds, as the kubelet prefixes log lines (`timestamps=true`).
pub(crate) fn rfc3339_nano(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (date, hms) = civil(d.as_secs());
    format!("{date}T{hms}.{:09}Z", d.subsec_nanos())
}

pub(crate) fn now() -> String {
    rfc3339(SystemTime::now())
}

/// Seconds since the epoch → ("YYYY-MM-DD", "HH:MM:SS") (Howard Hinnant's civil-from-days).
fn civil(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` (UTC only, as clients send `sinceTime`).
pub(crate) fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let t: Vec<u64> = hms.split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let ([y, m, day], [h, mi, sec]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos: u32 = format!("{frac:0<9}").get(..9)?.parse().ok()?;
    Some(UNIX_EPOCH + std::time::Duration::new(days * 86_400 + h * 3600 + mi * 60 + sec, nanos))
}

static SEED: AtomicU64 = AtomicU64::new(0);

/// A fresh pseudo-random number (splitmix64 over time and a counter; not for cryptography).
pub(crate) fn rand_u64() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut z = SEED
        .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        .wrapping_add(t ^ u64::from(std::process::id()).rotate_left(32));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` characters of the alphabet Kubernetes uses for generated names (no vowels, no 0/1/3).
pub(crate) fn rand_suffix(n: usize) -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n)
        .map(|_| ALPHA[(rand_u64() % ALPHA.len() as u64) as usize] as char)
        .collect()
}

pub(crate) fn uuid() -> String {
    let a = rand_u64();
    let b = rand_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

pub(crate) fn hex(n: usize) -> String {
    let mut s = String::new();
    while s.len() < n {
        s.push_str(&format!("{:016x}", rand_u64()));
    }
    s.truncate(n);
    s
}

/// An API error, rendered as a Kubernetes `Status`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// `jobs.batch "x" not found`
    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        );
        e.details = Some(details(name, group, resource));
        e
    }
    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        );
        e.details = Some(details(name, group, resource));
        e
    }
    /// `Job.batch "x" is invalid: FIELD: ...` with one cause per problem.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: &[(String, &str, String)]) -> Self {
        let what = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let msgs: Vec<String> = causes.iter().map(|(f, _, m)| format!("{f}: {m}")).collect();
        let message = if msgs.len() == 1 {
            format!("{what} \"{name}\" is invalid: {}", msgs[0])
        } else {
            format!("{what} \"{name}\" is invalid: [{}]", msgs.join(", "))
        };
        let mut d = details(name, group, kind);
        d["causes"] = causes
            .iter()
            .map(|(f, r, m)| json!({"reason": r, "message": m, "field": f}))
            .collect();
        ApiError {
            code: 422,
            reason: "Invalid",
            message,
            details: Some(d),
        }
    }
    pub fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

pub(crate) fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

/// A Kubernetes quantity (`512Mi`, `2G`, `1.5Gi`, `100m`, `1e3`) in base units (bytes, cores...).
pub(crate) fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        _ => return None,
    };
    Some(n * mult)
}

/// A quantity value from JSON (string or number).
pub(crate) fn quantity_of(v: &Value) -> Option<f64> {
    match v {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A label selector (`a=b,c!=d,e,!f,g in (h,i),j notin (k)`).
pub(crate) fn parse_label_selector(s: &str) -> Result<Vec<Req>, String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    let mut out = Vec::new();
    for p in parts {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        let bad = || format!("unable to parse requirement: found '{p}', expected: valid label selector");
        if let Some((k, v)) = p.split_once("!=") {
            out.push(Req::NotEq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = p.split_once("==") {
            out.push(Req::Eq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = p.split_once('=') {
            out.push(Req::Eq(k.trim().into(), v.trim().into()));
        } else if let Some(k) = p.strip_prefix('!') {
            out.push(Req::NotExists(k.trim().into()));
        } else if let Some(open) = p.find('(') {
            let head: Vec<&str> = p[..open].split_whitespace().collect();
            let body = p[open + 1..].strip_suffix(')').ok_or_else(bad)?;
            let vals: Vec<String> = body
                .split(',')
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .collect();
            match head.as_slice() {
                [k, "in"] => out.push(Req::In(k.to_string(), vals)),
                [k, "notin"] => out.push(Req::NotIn(k.to_string(), vals)),
                _ => return Err(bad()),
            }
        } else if p.contains(char::is_whitespace) {
            return Err(bad());
        } else {
            out.push(Req::Exists(p.into()));
        }
    }
    Ok(out)
}

pub(crate) fn labels_match(reqs: &[Req], get: impl Fn(&str) -> Option<String>) -> bool {
    reqs.iter().all(|r| match r {
        Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
        Req::NotEq(k, v) => get(k).as_deref() != Some(v.as_str()),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
    })
}

/// A field selector (`metadata.name=x,status.phase!=Running`): only `=`, `==` and `!=`.
pub(crate) fn parse_field_selector(s: &str) -> Result<Vec<Req>, String> {
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((k, v)) = p.split_once("!=") {
            out.push(Req::NotEq(k.into(), v.into()));
        } else if let Some((k, v)) = p.split_once("==") {
            out.push(Req::Eq(k.into(), v.into()));
        } else if let Some((k, v)) = p.split_once('=') {
            out.push(Req::Eq(k.into(), v.into()));
        } else {
            return Err(format!("invalid selector: '{s}'; can't understand '{p}'"));
        }
    }
    Ok(out)
}

/// The value at a dotted path (`involvedObject.name`) as a string, for field selectors.
pub(crate) fn field_str(obj: &Value, path: &str) -> Option<String> {
    let mut v = obj;
    for part in path.split('.') {
        v = v.get(part)?;
    }
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Percent-decoding of a query component (`+` is a space).
pub(crate) fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    percent_encoding::percent_decode_str(&s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_and_quantities() {
        assert_eq!(
            rfc3339(UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
        let t = UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 5_000_000);
        assert_eq!(parse_rfc3339("2023-11-14T22:13:20.005Z"), Some(t));
        assert_eq!(parse_rfc3339(&rfc3339_nano(t)), Some(t));
        assert_eq!(parse_quantity("512Mi"), Some(512.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("2G"), Some(2e9));
        assert_eq!(parse_quantity("100m"), Some(0.1));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("12"), Some(12.0));
        assert_eq!(parse_quantity("3x"), None);
    }

    #[test]
    fn label_selectors() {
        let r = parse_label_selector("a=b,c!=d,e,!f,g in (h, i),j notin (k)").unwrap();
        assert_eq!(r.len(), 6);
        let labels = |k: &str| match k {
            "a" => Some("b".to_string()),
            "e" => Some("1".to_string()),
            "g" => Some("i".to_string()),
            _ => None,
        };
        assert!(labels_match(&r, labels));
        assert!(!labels_match(&parse_label_selector("a=c").unwrap(), labels));
        assert!(parse_label_selector("a b").is_err());
    }

    #[test]
    fn merge_patches() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "d": 3});
        merge_patch(&mut t, &json!({"a": {"b": null, "e": 4}, "d": [1]}));
        assert_eq!(t, json!({"a": {"c": 2, "e": 4}, "d": [1]}));
    }
}
