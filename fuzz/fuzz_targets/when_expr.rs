//! The `when:` expression parser, then the type checker on what parses, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(expr) = kinf_grammar::parse_expr(text) {
        let _ = expr.to_string();
        let _ = kinf_grammar::expr::typecheck(&expr, kinf_lang::env::request_env());
        let _ = kinf_grammar::expr::typecheck(&expr, kinf_lang::env::endpoint_env());
    }
});
