//! The Kubernetes API server's own rules for the values of the suite's
//! `kubernetes:` section (names, label keys and values, quantities), so
//! that a wrong value fails `orch plan` instead of every cell's creation.

/// A DNS-1123 label (a namespace): at most 63 lowercase letters, digits and
/// `-`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (a ServiceAccount, RuntimeClass or Secret name): at
/// most 253 characters, DNS-1123 labels joined by `.`.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63: a label value
/// (non-empty) and the name part of a qualified name.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Why `s` is not a qualified name (a label key): `[PREFIX/]NAME`, PREFIX a
/// DNS-1123 subdomain, NAME at most 63 letters, digits, `-`, `_`, `.`
/// beginning and ending with a letter or digit.
pub fn qualified_name_error(s: &str) -> Option<&'static str> {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            return Some("its prefix before `/` is empty");
        }
        if !is_dns_subdomain(p) {
            return Some("its prefix before `/` must be a DNS subdomain (lowercase letters, digits, `-` and `.`, at most 253)");
        }
    }
    if name.is_empty() {
        return Some("its name is empty");
    }
    if name.len() > 63 {
        return Some("its name is longer than 63 characters");
    }
    if !is_name_part(name) {
        return Some(
            "its name must be letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit",
        );
    }
    None
}

/// Why `s` is not a label value: empty, or at most 63 letters, digits, `-`,
/// `_`, `.` beginning and ending with a letter or digit.
pub fn label_value_error(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return None;
    }
    if s.len() > 63 {
        return Some("it is longer than 63 characters");
    }
    (!is_name_part(s)).then_some(
        "it must be letters, digits, `-`, `_` and `.`, beginning and ending with a letter or digit",
    )
}

/// Is `s` a quantity (`8`, `500m`, `1.5`, `2Gi`, `1e3`) in the grammar of
/// `k8s.io/apimachinery`'s `resource.Quantity`?
pub fn is_quantity(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && matches!(b[i], b'+' | b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    let mut digits = i - int_start;
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let f = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        digits += i - f;
    }
    if digits == 0 {
        return false;
    }
    let suffix = &s[i..];
    match suffix {
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        _ => {
            let Some(exp) = suffix.strip_prefix(['e', 'E']) else {
                return false;
            };
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && exp.bytes().all(|c| c.is_ascii_digit())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_rules() {
        assert!(is_dns_label("team-a") && !is_dns_label("Team") && !is_dns_label("-a") && !is_dns_label(""));
        assert!(is_dns_subdomain("gpu.nvidia.com") && !is_dns_subdomain("GPU") && !is_dns_subdomain("a..b"));
        assert_eq!(qualified_name_error("nvidia.com/gpu.product"), None);
        assert_eq!(qualified_name_error("pool"), None);
        assert!(qualified_name_error("/pool").is_some());
        assert!(qualified_name_error("Nvidia.com/x").is_some());
        assert!(qualified_name_error("a/b/c").is_some());
        assert!(qualified_name_error("pool name").is_some());
        assert!(qualified_name_error(&"x".repeat(64)).is_some());
        assert_eq!(label_value_error(""), None);
        assert_eq!(label_value_error("NVIDIA-H100-80GB-HBM3"), None);
        assert!(label_value_error("h100 80gb").is_some());
        assert!(label_value_error("-x").is_some());
        for q in ["8", "500m", "1.5", ".5", "2.", "2Gi", "1e3", "1E-2", "+1", "100k"] {
            assert!(is_quantity(q), "{q}");
        }
        for q in ["8 cores", "", "m", "1.5.1", "2gi", "1e", "eight", "1 "] {
            assert!(!is_quantity(q), "{q}");
        }
    }
}
