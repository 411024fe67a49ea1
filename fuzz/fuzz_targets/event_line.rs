//! The agent's event stream as the host decodes it (a remote backend's
//! stdout is untrusted text), and the masking of each line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use orch_protocol::mask::Masker;
use orch_protocol::Event;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let masker = Masker::new([("SECRET", "hf_fuzzSecret/+=")]).expect("a long secret");
    for line in text.split('\n') {
        if let Ok(event) = Event::from_line(line) {
            let back = Event::from_line(&event.to_line());
            assert!(back.is_ok(), "an event does not round-trip: {line}");
            let _ = masker.mask_value(&event);
        }
        let _ = masker.mask_str(line);
    }
    let mut stream = masker.stream();
    let mut out = Vec::new();
    for chunk in data.chunks(7) {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    assert_eq!(out, masker.mask_bytes(data).into_owned());
});
