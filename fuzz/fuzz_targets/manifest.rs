//! The manifest parser and the matrix expansion: any text is a suite or an
//! error with a position, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = std::path::Path::new("fuzz.yaml");
    if let Err(e) = orch_manifest::load_str(text, path, &orch_manifest::ExpandOptions::default()) {
        let _ = e.to_string();
    }
});
