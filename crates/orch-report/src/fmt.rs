//! Number formatting shared by the text formats.

/// Four significant digits, trailing zeros dropped: `650.3`, `2485`,
/// `51.5`, `0.0017`; scientific below 1e-4 and from 1e9.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    if !(1e-4..1e9).contains(&a) {
        return format!("{v:.3e}");
    }
    let decimals = (3 - a.log10().floor() as i32).clamp(0, 8) as usize;
    trim(format!("{v:.decimals$}"))
}

/// Dollars: `$12.34` from one dollar, four significant digits below
/// (`$0.001723`), `$0` for nothing.
pub fn usd(v: f64) -> String {
    if v == 0.0 {
        "$0".into()
    } else if v.abs() >= 1.0 {
        format!("${v:.2}")
    } else {
        // Four significant digits, but cents at least: `$0.20`, `$0.0017`.
        let mut s = num(v);
        match s.find('.') {
            Some(dot) if s.len() - dot - 1 < 2 => s.push('0'),
            None if !s.contains('e') => s.push_str(".00"),
            _ => {}
        }
        format!("${s}")
    }
}

/// A ratio: three decimals.
pub fn ratio(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "-".into()
    }
}

fn trim(s: String) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// `k=v k=v` of a cell's parameters, strings unquoted.
pub fn params(p: &std::collections::BTreeMap<String, serde_json::Value>) -> String {
    p.iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `80 GiB`.
pub fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    format!("{} GiB", num((g * 10.0).round() / 10.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(num(650.3), "650.3");
        assert_eq!(num(2485.0), "2485");
        assert_eq!(num(123456.7), "123457");
        assert_eq!(num(51.5), "51.5");
        assert_eq!(num(0.0017), "0.0017");
        assert_eq!(num(1.23456), "1.235");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(-3.0), "-3");
        assert_eq!(num(2.5e-6), "2.500e-6");
        assert_eq!(usd(12.345), "$12.35");
        assert_eq!(usd(0.001723), "$0.001723");
        assert_eq!(usd(0.0), "$0");
        assert_eq!(usd(0.2), "$0.20");
        assert_eq!(usd(0.012), "$0.012");
        assert_eq!(ratio(1.23456), "1.235");
        assert_eq!(gib(85_899_345_920), "80 GiB");
    }
}
