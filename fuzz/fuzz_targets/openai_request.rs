//! The OpenAI request parsers (`/v1/chat/completions`, `/v1/completions`) never panic, and
//! what parses translates for providers without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kinf_handler::gateway::errors::Api;
use kinf_handler::gateway::parse;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let api = if mode & 1 == 0 {
        Api::Chat
    } else {
        Api::Completions
    };
    if let Ok(p) = parse::parse(api, body) {
        let _ = p.message_count();
        let _ = p.prompt_bytes();
        let _ = kinf_handler::providers::translate::parse_client(api, &p.body);
    }
});
