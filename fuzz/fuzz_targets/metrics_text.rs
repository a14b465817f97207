//! The `/metrics` text parser (Prometheus exposition format, vLLM's gauges) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kinf_handler::live::prom_text;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for s in prom_text::samples(text).flatten() {
        let _ = s.labels().count();
        let _ = s.label("model_name");
    }
    let _ = prom_text::parse_vllm(text);
});
