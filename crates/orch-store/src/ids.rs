//! Run ids: `<yyyymmdd-hhmmss>-<suite>-<16-bit salt>`, sorting by creation time.

use chrono::{DateTime, Utc};

/// `20261122-061502-quickstart-3fa2`: sorts by creation time. The suite
/// name is reduced to characters that are safe in a path and a key.
pub(crate) fn new_run_id(now: DateTime<Utc>, suite: &str) -> String {
    let nanos = now.timestamp_subsec_nanos() as u64;
    let salt = (nanos ^ (std::process::id() as u64).rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    orch_record::run_id(now, suite, (salt >> 48) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_run_id_is_a_safe_name_that_sorts_by_time() {
        let t = Utc.with_ymd_and_hms(2026, 11, 22, 6, 15, 2).unwrap();
        let id = new_run_id(t, "quick start/../x");
        assert!(id.starts_with("20261122-061502-quick_start_.._x-"), "{id}");
        assert_eq!(id.len(), "20261122-061502-quick_start_.._x-".len() + 4);
        crate::check_name("run id", &id).unwrap();
        let later = new_run_id(t + chrono::Duration::seconds(1), "quick start/../x");
        assert!(later > id);
    }
}
