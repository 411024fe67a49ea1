//! Memory facts of this process and machine (Linux `/proc` and cgroup files).

/// Peak resident set size of this process, in bytes (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident set size of this process, in bytes (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

/// The machine's memory (`MemTotal`), in bytes.
pub fn total_memory_bytes() -> Option<u64> {
    meminfo_kib("MemTotal:").map(|k| k * 1024)
}

fn meminfo_kib(key: &str) -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l[key.len()..].trim().trim_end_matches("kB").trim().parse().ok())
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l[key.len()..].trim().trim_end_matches("kB").trim().parse().ok())
}

/// Memory this process may still allocate: the smaller of the machine's
/// `MemAvailable` and the room left under the cgroup's `memory.max`.
pub fn available_bytes() -> Option<u64> {
    let avail = meminfo_kib("MemAvailable:").map(|k| k * 1024);
    let cgroup = cgroup_room();
    match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

fn cgroup_room() -> Option<u64> {
    let max = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
    let max: u64 = max.trim().parse().ok()?; // "max" means no limit: parse fails -> None
    let current: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.current")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(max.saturating_sub(current))
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_memory() {
        let peak = super::peak_rss_bytes().unwrap();
        let now = super::rss_bytes().unwrap();
        // Read at different instants (other test threads allocate): both positive.
        assert!(peak > 0 && now > 0);
        assert!(super::available_bytes().unwrap() > 0);
    }
}
