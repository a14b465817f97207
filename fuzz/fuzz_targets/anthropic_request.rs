//! The Anthropic request parser (`/v1/messages`) never panics, and what parses translates
//! for providers without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kinf_handler::gateway::errors::Api;
use kinf_handler::gateway::parse;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = parse::parse(Api::Messages, data) {
        let _ = p.message_count();
        let _ = p.prompt_bytes();
        let _ = kinf_handler::providers::translate::parse_client(Api::Messages, &p.body);
    }
});
