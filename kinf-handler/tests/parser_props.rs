//! Properties of the gateway's parsers on hostile input (the proptest side of the cargo-fuzz
//! targets in fuzz/): the `/metrics` parser, the request parsers and the SSE tap never panic on
//! arbitrary or mutated real input; the tap passes every byte through however it is chunked;
//! the JSON depth check agrees with the real nesting.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Instant;

use kinf_handler::gateway::errors::Api;
use kinf_handler::gateway::parse::{check_json_depth, parse_limited};
use kinf_handler::gateway::sse_tap::SseTap;
use kinf_handler::live::prom_text;
use proptest::prelude::*;

const METRICS: &str = include_str!("../../testdata/vllm-0.32.0-cpu/metrics_raw.txt");
const CHAT_STREAM: &str = include_str!("../../testdata/vllm-0.32.0-cpu/chat_stream.txt");
const MESSAGES_STREAM: &str = include_str!("../../testdata/vllm-0.32.0-cpu/messages_stream.txt");
const REQUEST: &str = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5}"#;

fn mutate(
    base: &str,
    edits: &[(prop::sample::Index, u8)],
    cut: Option<&prop::sample::Index>,
) -> Vec<u8> {
    let mut b = base.as_bytes().to_vec();
    for (i, v) in edits {
        let at = i.index(b.len());
        b[at] = *v;
    }
    if let Some(cut) = cut {
        b.truncate(cut.index(b.len() + 1));
    }
    b
}

fn nesting(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(nesting).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(nesting).max().unwrap_or(0),
        _ => 0,
    }
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i32>().prop_map(serde_json::Value::from),
        "[\\[\\]{}\"\\\\a-z]{0,6}".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(12, 64, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z\\[{\"]{1,4}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn metrics_parser_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<prop::sample::Index>(),
        junk in ".{0,200}",
    ) {
        let text = String::from_utf8_lossy(&mutate(METRICS, &edits, Some(&cut))).into_owned();
        for t in [text.as_str(), junk.as_str()] {
            for s in prom_text::samples(t).flatten() {
                let _ = s.labels().count();
            }
            let _ = prom_text::parse_vllm(t);
        }
    }

    #[test]
    fn request_parsers_never_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
        depth in 1usize..130,
    ) {
        let body = mutate(REQUEST, &edits, Some(&cut));
        for api in [Api::Chat, Api::Completions, Api::Messages] {
            let _ = parse_limited(api, &body, depth);
        }
    }

    #[test]
    fn depth_check_agrees_with_the_nesting(v in json_value(), max in 1usize..14) {
        let text = v.to_string();
        let ok = check_json_depth(text.as_bytes(), max).is_ok();
        prop_assert_eq!(ok, nesting(&v) <= max, "{} (max {})", text, max);
    }

    #[test]
    fn sse_tap_passes_every_byte_however_chunked(
        cuts in prop::collection::vec(1usize..64, 1..40),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        anthropic in any::<bool>(),
    ) {
        let (api, base) = if anthropic {
            (Api::Messages, MESSAGES_STREAM)
        } else {
            (Api::Chat, CHAT_STREAM)
        };
        let input = mutate(base, &edits, None);
        let mut tap = SseTap::new(api, false);
        let now = Instant::now();
        let mut out = Vec::new();
        let mut rest = &input[..];
        for c in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let n = (*c).min(rest.len());
            out.extend_from_slice(&tap.feed(&rest[..n], now));
            rest = &rest[n..];
        }
        out.extend_from_slice(&tap.finish());
        prop_assert_eq!(out, input);
    }
}
