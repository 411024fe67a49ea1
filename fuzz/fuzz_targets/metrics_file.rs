//! The metrics file a workload writes: any bytes are metrics or a message,
//! never a panic, and every metric kept is a finite number.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(metrics) = orch_protocol::parse_metrics_json(text) {
        assert!(metrics.values().all(|v| v.is_finite()));
    }
});
