//! The policy bundle compiler (YAML in, compiled policy or diagnostics out) never panics,
//! and rendering its diagnostics never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (sources, compilation) = kinf_lang::compile_str("fuzz.yaml", text);
    for d in &compilation.diagnostics {
        let _ = d.render_plain(&sources);
    }
});
