//! The providers' stream translators (OpenAI and Anthropic SSE, Bedrock's AWS event stream)
//! decode any bytes, however chunked, without panicking, and the client encoder re-encodes
//! whatever was decoded without panicking. Whole provider bodies are read the same way.
#![no_main]

use libfuzzer_sys::fuzz_target;

use kinf_handler::gateway::errors::Api;
use kinf_handler::providers::stream::{ClientEncoder, ProviderDecoder};
use kinf_policy::ProviderType;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (mode, cut, rest) = (data[0], usize::from(data[1]) + 1, &data[2..]);
    let protocol = match mode % 3 {
        0 => ProviderType::OpenAI,
        1 => ProviderType::Anthropic,
        _ => ProviderType::Bedrock,
    };
    let api = match (mode / 3) % 3 {
        0 => Api::Chat,
        1 => Api::Completions,
        _ => Api::Messages,
    };
    let mut dec = ProviderDecoder::new(protocol);
    let mut enc = ClientEncoder::new(api, "fuzz-model", mode & 0x40 != 0);
    let mut out = bytes::BytesMut::new();
    for chunk in rest.chunks(cut) {
        for ev in dec.feed(chunk) {
            enc.encode(&ev, &mut out);
        }
    }
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(rest)
        && let Some(r) = kinf_handler::providers::translate::parse_provider_response(protocol, &v)
    {
        let _ = kinf_handler::providers::translate::client_response(api, &r, "fuzz-model");
    }
});
