//! The gateway's SSE tap (splits upstream streams into events, strips the injected usage
//! chunk, reads usage) never panics, whatever the bytes and however they are chunked; and it
//! passes on every byte when it strips nothing.
#![no_main]

use std::time::Instant;

use libfuzzer_sys::fuzz_target;

use kinf_handler::gateway::errors::Api;
use kinf_handler::gateway::sse_tap::{SseTap, body_usage};

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (mode, cut, rest) = (data[0], usize::from(data[1]) + 1, &data[2..]);
    let api = match mode % 3 {
        0 => Api::Chat,
        1 => Api::Completions,
        _ => Api::Messages,
    };
    let strip = mode & 4 != 0;
    let mut tap = SseTap::new(api, strip);
    let now = Instant::now();
    let mut passed = Vec::new();
    for chunk in rest.chunks(cut) {
        passed.extend_from_slice(&tap.feed(chunk, now));
    }
    passed.extend_from_slice(&tap.finish());
    if !strip {
        assert_eq!(passed, rest, "the tap must pass every byte through");
    }
    let _ = body_usage(api, rest);
});
