//! The KV-event decoder (vLLM's ZMQ frames and msgpack payloads) never panics.
//!
//! Input: one mode byte, then the frames separated by `|FR|` (mode 0: one msgpack payload;
//! 1: a live message `[topic, seq, payload]`; 2: a replay reply).
#![no_main]

use libfuzzer_sys::fuzz_target;

const SEP: &[u8] = b"|FR|";

fn split_frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while let Some(i) = data.windows(SEP.len()).position(|w| w == SEP) {
        out.push(&data[..i]);
        data = &data[i + SEP.len()..];
    }
    out.push(data);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 3 {
        0 => {
            let _ = kinf_router::kv_events::decode_payload(rest);
        }
        1 => {
            let frames = split_frames(rest);
            let _ = kinf_router::kv_events::decode_message(&frames);
        }
        _ => {
            let frames = split_frames(rest);
            let _ = kinf_router::kv_events::decode_replay_reply(&frames);
        }
    }
});
