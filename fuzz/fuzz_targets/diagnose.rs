//! The diagnosis engine: any log (and any user rules file) gives a
//! diagnosis or a rules error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static RULES: OnceLock<orch_diagnose::Rules> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let rules = RULES.get_or_init(orch_diagnose::Rules::default);
    // First byte picks the input: a log, a log with an exit, or a rules file.
    match data.first().map(|b| b % 3) {
        Some(0) => {
            let mid = (0..=text.len() / 2)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let (out, err) = text.split_at(mid);
            let exit = orch_diagnose::ExitInfo {
                code: Some(137),
                signal: Some(9),
                timed_out: data.len() % 2 == 0,
            };
            let _ = orch_diagnose::diagnose_output(out, err, Some(&exit), rules);
        }
        Some(1) => {
            if let Ok(user) = orch_diagnose::Rules::parse(&text, "fuzz.yaml") {
                let mut all = rules.clone();
                all.extend(user);
                let _ = orch_diagnose::diagnose("RuntimeError: CUDA out of memory\nError: x\n", &all);
            }
        }
        _ => {
            let _ = orch_diagnose::diagnose(&text, rules);
        }
    }
});
