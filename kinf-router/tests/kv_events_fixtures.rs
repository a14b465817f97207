//! The KV-event decoder against real vLLM 0.32.0 captures (`testdata/vllm-0.32.0-cpu/`), plus
//! hand-built edge cases and property tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;

use kinf_router::kv_events::{
    BlockRemoved, BlockStored, DecodeError, EventBatch, KvEvent, Medium, ReplayItem, SeqStatus,
    SeqTracker, decode_message, decode_payload, decode_replay_reply, encode_message,
    encode_payload, replay_end_frames, replay_reply_frames, replay_request_frames,
};
use proptest::prelude::*;
use serde_json::Value as Json;

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/vllm-0.32.0-cpu")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn unhex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Parses a `*_frames.txt` capture: a header line (`# t=… nframes=N sizes=[…]` or
/// `nframes=N sizes=[…]`) then one `frame[i] HEX` line per frame.
fn frames_file(rel: &str) -> Vec<Vec<Vec<u8>>> {
    let mut msgs: Vec<(Vec<usize>, Vec<Vec<u8>>)> = Vec::new();
    for line in read(rel).lines() {
        if line.starts_with('#') || line.starts_with("nframes") {
            let sizes = line
                .split("sizes=[")
                .nth(1)
                .unwrap()
                .trim_end_matches(']')
                .split(',')
                .map(|s| s.trim().parse().unwrap())
                .collect();
            msgs.push((sizes, Vec::new()));
        } else if let Some(rest) = line.strip_prefix("frame[") {
            let hex = rest.split_once("] ").map_or("", |(_, h)| h).trim();
            msgs.last_mut().unwrap().1.push(unhex(hex));
        } else {
            assert!(line.trim().is_empty(), "unexpected line {line:?}");
        }
    }
    msgs.into_iter()
        .map(|(sizes, frames)| {
            let got: Vec<usize> = frames.iter().map(Vec::len).collect();
            assert_eq!(got, sizes, "frame sizes differ from the header");
            frames
        })
        .collect()
}

fn refs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
    frames.iter().map(Vec::as_slice).collect()
}

fn json_u64(v: &Json) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

fn opt_u64(v: Option<&Json>) -> Option<u64> {
    v.filter(|v| !v.is_null()).map(json_u64)
}

fn same_f64(a: f64, b: f64) -> bool {
    // The JSON side went through Python's repr and serde_json's parser: allow one ulp.
    a.to_bits().abs_diff(b.to_bits()) <= 1
}

fn rmpv_to_json(v: &rmpv::Value) -> Json {
    match v {
        rmpv::Value::Nil => Json::Null,
        rmpv::Value::Boolean(b) => Json::Bool(*b),
        rmpv::Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Json::from(u),
            (None, Some(s)) => Json::from(s),
            _ => Json::Null,
        },
        rmpv::Value::F32(f) => Json::from(f64::from(*f)),
        rmpv::Value::F64(f) => Json::from(*f),
        rmpv::Value::String(s) => Json::from(s.as_str().unwrap_or_default()),
        rmpv::Value::Array(a) => Json::Array(a.iter().map(rmpv_to_json).collect()),
        other => Json::String(format!("{other}")),
    }
}

const STORED_KEYS: [&str; 12] = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
];

/// Compares one decoded event with vLLM's own decoding, field by field.
fn check_event(ours: &KvEvent, theirs: &Json, ctx: &str) {
    let m = theirs.as_object().unwrap();
    let ty = m["type"].as_str().unwrap();
    match (ty, ours) {
        ("BlockStored", KvEvent::BlockStored(s)) => {
            for k in m.keys() {
                assert!(STORED_KEYS.contains(&k.as_str()), "{ctx}: unknown key {k}");
            }
            let hashes: Vec<u64> = m["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(json_u64)
                .collect();
            assert_eq!(s.block_hashes.as_slice(), hashes.as_slice(), "{ctx}");
            assert_eq!(s.parent, opt_u64(m.get("parent_block_hash")), "{ctx}");
            let toks: Vec<u32> = m["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| u32::try_from(json_u64(t)).unwrap())
                .collect();
            assert_eq!(s.token_ids, toks, "{ctx}");
            assert_eq!(u64::from(s.block_size), json_u64(&m["block_size"]), "{ctx}");
            assert_eq!(
                s.lora_id,
                m.get("lora_id").and_then(Json::as_i64),
                "{ctx} lora_id"
            );
            assert_eq!(
                s.medium.as_ref().map(Medium::as_str),
                m.get("medium").and_then(Json::as_str),
                "{ctx} medium"
            );
            assert_eq!(
                s.lora_name.as_deref(),
                m.get("lora_name").and_then(Json::as_str),
                "{ctx} lora_name"
            );
            let keys = s
                .extra_keys
                .as_ref()
                .map(|ks| {
                    Json::Array(
                        ks.iter()
                            .map(|k| k.as_ref().map_or(Json::Null, rmpv_to_json))
                            .collect(),
                    )
                })
                .unwrap_or(Json::Null);
            assert_eq!(
                keys,
                m.get("extra_keys").cloned().unwrap_or(Json::Null),
                "{ctx}"
            );
            assert_eq!(
                s.group_idx.map(u64::from),
                opt_u64(m.get("group_idx")),
                "{ctx}"
            );
            assert_eq!(
                s.kv_cache_spec_kind.as_deref(),
                m.get("kv_cache_spec_kind").and_then(Json::as_str),
                "{ctx}"
            );
            assert_eq!(
                s.kv_cache_spec_sliding_window.map(u64::from),
                opt_u64(m.get("kv_cache_spec_sliding_window")),
                "{ctx}"
            );
            assert_eq!(
                s.token_ids.len(),
                s.block_hashes.len() * s.block_size as usize,
                "{ctx}: len(token_ids) == len(block_hashes) * block_size"
            );
        }
        ("BlockRemoved", KvEvent::BlockRemoved(r)) => {
            for k in m.keys() {
                assert!(
                    ["type", "block_hashes", "medium", "group_idx"].contains(&k.as_str()),
                    "{ctx}: unknown key {k}"
                );
            }
            let hashes: Vec<u64> = m["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(json_u64)
                .collect();
            assert_eq!(r.block_hashes.as_slice(), hashes.as_slice(), "{ctx}");
            assert_eq!(
                r.medium.as_ref().map(Medium::as_str),
                m.get("medium").and_then(Json::as_str),
                "{ctx}"
            );
            assert_eq!(
                r.group_idx.map(u64::from),
                opt_u64(m.get("group_idx")),
                "{ctx}"
            );
        }
        ("AllBlocksCleared", KvEvent::AllBlocksCleared) => assert_eq!(m.len(), 1, "{ctx}"),
        _ => panic!("{ctx}: {ty} decoded as {ours:?}"),
    }
}

/// Compares a decoded payload with vLLM's `[ts, events, dp_rank]`.
fn check_payload(ts: f64, events: &[KvEvent], dp: Option<i64>, theirs: &Json, ctx: &str) {
    let p = theirs.as_array().unwrap();
    assert!(
        same_f64(ts, p[0].as_f64().unwrap()),
        "{ctx}: ts {ts} vs {}",
        p[0]
    );
    let evs = p[1].as_array().unwrap();
    assert_eq!(events.len(), evs.len(), "{ctx}: event count");
    for (i, (a, b)) in events.iter().zip(evs).enumerate() {
        check_event(a, b, &format!("{ctx} event {i}"));
    }
    assert_eq!(dp, p.get(2).and_then(Json::as_i64), "{ctx}: dp rank");
}

/// Decodes every message of a `*_raw_frames.txt` capture, compares it with the matching
/// `*_decoded.json`, and checks that re-encoding gives the captured bytes back.
fn check_raw_capture(frames_rel: &str, decoded_rel: &str) -> Vec<EventBatch> {
    let msgs = frames_file(frames_rel);
    let decoded: Vec<Json> = serde_json::from_str(&read(decoded_rel)).unwrap();
    assert_eq!(msgs.len(), decoded.len(), "{frames_rel}: message count");
    assert!(!msgs.is_empty());
    let mut out = Vec::new();
    for (i, (frames, theirs)) in msgs.iter().zip(&decoded).enumerate() {
        let ctx = format!("{frames_rel} message {i}");
        let b = decode_message(&refs(frames)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(b.topic, theirs["topic"].as_str().unwrap(), "{ctx}");
        assert_eq!(b.seq, theirs["seq"].as_i64().unwrap(), "{ctx}");
        check_payload(b.ts, &b.events, b.dp_rank, &theirs["payload"], &ctx);
        // Byte equality with what vLLM published.
        let again = encode_message(&b);
        assert_eq!(
            again.as_slice(),
            frames.as_slice(),
            "{ctx}: re-encoding differs"
        );
        out.push(b);
    }
    out
}

#[test]
fn main_capture_decodes_and_reencodes_byte_for_byte() {
    let batches = check_raw_capture("kv_events_raw_frames.txt", "kv_events_decoded.json");
    assert_eq!(batches.len(), 14);
    let mut tracker = SeqTracker::new();
    for b in &batches {
        assert_eq!(tracker.observe(b.seq), SeqStatus::InOrder);
        assert_eq!(b.topic, "kv-events");
    }
    assert!(batches.iter().all(|b| b.dp_rank == Some(0)));
}

#[test]
fn run2_small_cache_has_evictions_and_clear() {
    let batches = check_raw_capture(
        "run2-small-cache/kv_events_raw_frames.txt",
        "run2-small-cache/kv_events_decoded.json",
    );
    let all: Vec<&KvEvent> = batches.iter().flat_map(|b| &b.events).collect();
    let removed = all
        .iter()
        .filter(|e| matches!(e, KvEvent::BlockRemoved(_)))
        .count();
    let cleared = all
        .iter()
        .filter(|e| matches!(e, KvEvent::AllBlocksCleared))
        .count();
    assert!(removed > 100, "expected many evictions, saw {removed}");
    assert_eq!(cleared, 1);
    let mut tracker = SeqTracker::new();
    for b in &batches {
        assert_eq!(tracker.observe(b.seq), SeqStatus::InOrder);
    }
}

#[test]
fn run2_replay_socket_frames() {
    let live = frames_file("run2-small-cache/kv_events_raw_frames.txt");
    let replies = frames_file("run2-small-cache/replay_frames.txt");
    let summary: Vec<Json> =
        serde_json::from_str(&read("run2-small-cache/replay_decoded.json")).unwrap();
    assert_eq!(replies.len(), summary.len());
    // The request that produced them: DEALER asked from seq 8.
    let req = replay_request_frames(8);
    assert_eq!(req[0], b"");
    assert_eq!(req[1], 8i64.to_be_bytes());

    let mut tracker = SeqTracker::starting_at(8);
    let mut ended = false;
    for (frames, s) in replies.iter().zip(&summary) {
        match decode_replay_reply(&refs(frames)).unwrap() {
            ReplayItem::Batch(b) => {
                assert!(!ended);
                assert_eq!(b.seq, s["seq"].as_i64().unwrap());
                assert_eq!(b.topic, s["topic"].as_str().unwrap());
                assert_eq!(b.events.len() as u64, json_u64(&s["n_events"]));
                let mut types: Vec<&str> = b
                    .events
                    .iter()
                    .map(|e| match e {
                        KvEvent::BlockStored(_) => "BlockStored",
                        KvEvent::BlockRemoved(_) => "BlockRemoved",
                        KvEvent::AllBlocksCleared => "AllBlocksCleared",
                        KvEvent::Unknown(t) => t.as_str(),
                    })
                    .collect();
                types.sort_unstable();
                types.dedup();
                let want: Vec<&str> = s["event_types"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_str().unwrap())
                    .collect();
                assert_eq!(types, want);
                assert_eq!(tracker.observe_replayed(b.seq), SeqStatus::InOrder);
                // Replayed payloads are the live ones, byte for byte, and re-encode the same.
                let live_msg = &live[b.seq as usize];
                assert_eq!(frames[3], live_msg[2]);
                assert_eq!(b, decode_message(&refs(live_msg)).unwrap());
                assert_eq!(replay_reply_frames(&b).as_slice(), frames.as_slice());
            }
            ReplayItem::End => {
                assert_eq!(s["seq"].as_i64(), Some(-1));
                assert_eq!(replay_end_frames().as_slice(), frames.as_slice());
                ended = true;
            }
        }
    }
    assert!(ended, "no end marker");
}

/// Decodes a `kv_frames_*.jsonl` capture; returns the batches.
fn check_jsonl(rel: &str) -> Vec<EventBatch> {
    let mut out = Vec::new();
    for (i, line) in read(rel).lines().enumerate() {
        let ctx = format!("{rel} line {i}");
        let j: Json = serde_json::from_str(line).unwrap();
        assert_eq!(j["nparts"].as_u64(), Some(3), "{ctx}");
        let topic = j["topic"].as_str().unwrap().as_bytes().to_vec();
        let seq = unhex(j["seq_hex"].as_str().unwrap());
        let payload = unhex(j["payload_hex"].as_str().unwrap());
        assert_eq!(payload.len() as u64, json_u64(&j["payload_len"]), "{ctx}");
        let frames = [topic, seq, payload];
        let b = decode_message(&refs(&frames)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        assert_eq!(b.seq, j["seq"].as_i64().unwrap(), "{ctx}");
        check_payload(b.ts, &b.events, b.dp_rank, &j["decoded"], &ctx);
        assert_eq!(encode_message(&b).as_slice(), frames.as_slice(), "{ctx}");
        out.push(b);
    }
    assert!(!out.is_empty(), "{rel} is empty");
    out
}

#[test]
fn run1_jsonl() {
    let b = check_jsonl("kv_frames_run1.jsonl");
    assert!(b.iter().all(|b| b.topic == "kv@pod-a@tiny"));
    // The sha256_cbor vector of NOTES.md §1 (low 64 bits of the engine hashes).
    let KvEvent::BlockStored(s) = &b[0].events[0] else {
        panic!("first event is not BlockStored")
    };
    assert_eq!(
        s.block_hashes.as_slice(),
        &[4_591_314_448_499_521_480, 138_874_408_344_858_465]
    );
}

#[test]
fn run2_evictions_jsonl() {
    let b = check_jsonl("kv_frames_run2_evictions.jsonl");
    let evs: Vec<&KvEvent> = b.iter().flat_map(|b| &b.events).collect();
    assert!(evs.iter().any(|e| matches!(e, KvEvent::BlockRemoved(_))));
    assert!(evs.iter().any(|e| matches!(e, KvEvent::AllBlocksCleared)));
}

#[test]
fn run3_guidellm_jsonl() {
    let b = check_jsonl("kv_frames_run3_guidellm_prefix.jsonl");
    assert_eq!(b.len(), 16);
    let with_parent = b
        .iter()
        .flat_map(|b| &b.events)
        .filter(|e| matches!(e, KvEvent::BlockStored(s) if s.parent.is_some()))
        .count();
    assert!(
        with_parent > 10,
        "shared-prefix run should chain onto parents"
    );
}

/// Every captured payload, for the robustness tests.
fn all_payloads() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for rel in [
        "kv_events_raw_frames.txt",
        "run2-small-cache/kv_events_raw_frames.txt",
    ] {
        out.extend(frames_file(rel).into_iter().map(|mut f| f.remove(2)));
    }
    for rel in [
        "kv_frames_run1.jsonl",
        "kv_frames_run2_evictions.jsonl",
        "kv_frames_run3_guidellm_prefix.jsonl",
    ] {
        for line in read(rel).lines() {
            let j: Json = serde_json::from_str(line).unwrap();
            out.push(unhex(j["payload_hex"].as_str().unwrap()));
        }
    }
    out
}

#[test]
fn every_truncation_of_every_capture_is_an_error() {
    for p in all_payloads() {
        assert!(decode_payload(&p).is_ok());
        for n in 0..p.len() {
            assert!(
                decode_payload(&p[..n]).is_err(),
                "prefix of {n} bytes decoded"
            );
        }
        let mut longer = p.clone();
        longer.push(0xc0);
        assert_eq!(decode_payload(&longer), Err(DecodeError::Trailing(1)));
    }
}

#[test]
fn frame_errors() {
    let payload = encode_payload(1.0, &[KvEvent::AllBlocksCleared], Some(0));
    let seq = 5i64.to_be_bytes();
    assert!(matches!(
        decode_message(&[b"t", &seq]),
        Err(DecodeError::FrameCount { got: 2, .. })
    ));
    assert_eq!(
        decode_message(&[b"t", &seq[..7], &payload]),
        Err(DecodeError::SeqLength(7))
    );
    assert_eq!(
        decode_message(&[&[0xff, 0xfe], &seq, &payload]),
        Err(DecodeError::TopicNotUtf8)
    );
    let ok = decode_message(&[b"t", &seq, &payload]).unwrap();
    assert_eq!(ok.seq, 5);
    assert_eq!(ok.events, vec![KvEvent::AllBlocksCleared]);
    // Replay replies in the older shapes.
    let end = (-1i64).to_be_bytes();
    assert_eq!(decode_replay_reply(&[&end, b""]).unwrap(), ReplayItem::End);
    assert!(matches!(
        decode_replay_reply(&[b"", &seq, &payload]).unwrap(),
        ReplayItem::Batch(b) if b.seq == 5 && b.topic.is_empty()
    ));
    assert!(matches!(
        decode_replay_reply(&[&seq, &payload]).unwrap(),
        ReplayItem::Batch(b) if b.seq == 5
    ));
    assert!(decode_replay_reply(&[b"x", b"t", &seq, &payload]).is_err());
    assert!(decode_replay_reply(&[b"x"]).is_err());
    // Errors render as lowercase sentences.
    let msg = DecodeError::SeqLength(7).to_string();
    assert!(msg.starts_with(char::is_lowercase), "{msg}");
}

fn mp(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn s(x: &str) -> rmpv::Value {
    rmpv::Value::from(x)
}

#[test]
fn legacy_array_events_and_map_payload() {
    use rmpv::Value as V;
    // vLLM ≤ 0.23: events are arrays led by the tag; trailing defaults may be omitted.
    let stored = V::Array(vec![
        s("BlockStored"),
        V::Array(vec![V::from(1u64), V::from(2u64)]),
        V::Nil,
        V::Array((0..8u32).map(V::from).collect()),
        V::from(4u32),
        V::Nil,
        s("GPU"),
    ]);
    let removed = V::Array(vec![s("BlockRemoved"), V::Array(vec![V::from(2u64)])]);
    let cleared = V::Array(vec![s("AllBlocksCleared")]);
    let future = V::Array(vec![s("BlockMoved"), V::from(1u64)]);
    let payload = V::Array(vec![
        V::F64(12.5),
        V::Array(vec![stored, removed, cleared, future]),
    ]);
    let (ts, evs, dp) = decode_payload(&mp(&payload)).unwrap();
    assert_eq!(ts, 12.5);
    assert_eq!(dp, None);
    assert_eq!(
        evs,
        vec![
            KvEvent::BlockStored(BlockStored {
                block_hashes: [1, 2].into_iter().collect(),
                parent: None,
                token_ids: (0..8).collect(),
                block_size: 4,
                medium: Some(Medium::Gpu),
                ..Default::default()
            }),
            KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: [2].into_iter().collect(),
                ..Default::default()
            }),
            KvEvent::AllBlocksCleared,
            KvEvent::Unknown("BlockMoved".into()),
        ]
    );

    // Map-shaped batch, unknown keys everywhere, keys out of order.
    let ev = V::Map(vec![
        (s("block_hashes"), V::Array(vec![V::from(7u64)])),
        (
            s("future_field"),
            V::Map(vec![(V::from(1), V::Array(vec![]))]),
        ),
        (V::from(5), V::Nil),
        (s("type"), s("BlockRemoved")),
        (s("medium"), s("CPU")),
    ]);
    let payload = V::Map(vec![
        (s("events"), V::Array(vec![ev])),
        (s("ts"), V::from(3)),
        (s("data_parallel_rank"), V::from(2)),
        (s("extra"), V::Boolean(true)),
    ]);
    let (ts, evs, dp) = decode_payload(&mp(&payload)).unwrap();
    assert_eq!((ts, dp), (3.0, Some(2)));
    assert_eq!(
        evs,
        vec![KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: [7].into_iter().collect(),
            medium: Some(Medium::Cpu),
            group_idx: None,
        })]
    );
}

#[test]
fn hash_encodings_of_every_width_and_bytes() {
    use rmpv::Value as V;
    let mut digest = [0u8; 32];
    for (i, b) in digest.iter_mut().enumerate() {
        *b = i as u8;
    }
    let hashes = V::Array(vec![
        V::from(5u8),
        V::from(300u16),
        V::from(70_000u32),
        V::from(u64::MAX),
        V::from(-1i64),
        V::Binary(digest.to_vec()),
    ]);
    let ev = V::Map(vec![
        (s("type"), s("BlockRemoved")),
        (s("block_hashes"), hashes),
        (s("medium"), V::Nil),
    ]);
    let (_, evs, _) =
        decode_payload(&mp(&V::Array(vec![V::F64(0.0), V::Array(vec![ev])]))).unwrap();
    let KvEvent::BlockRemoved(r) = &evs[0] else {
        panic!()
    };
    assert_eq!(
        r.block_hashes.as_slice(),
        &[
            5,
            300,
            70_000,
            u64::MAX,
            u64::MAX,
            u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31])
        ]
    );
    // Hand-written signed encodings of small positive values (msgspec never writes these, but
    // other encoders do).
    let payload = [
        0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82, 0xa4, b't', b'y', b'p', b'e', 0xac, b'B',
        b'l', b'o', b'c', b'k', b'R', b'e', b'm', b'o', b'v', b'e', b'd', 0xac, b'b', b'l', b'o',
        b'c', b'k', b'_', b'h', b'a', b's', b'h', b'e', b's', 0x92, 0xd0, 0x05, 0xd3, 0, 0, 0, 0,
        0, 0, 1, 0,
    ];
    let (_, evs, _) = decode_payload(&payload).unwrap();
    let KvEvent::BlockRemoved(r) = &evs[0] else {
        panic!()
    };
    assert_eq!(r.block_hashes.as_slice(), &[5, 256]);
}

#[test]
fn type_errors_are_reported_not_panicked() {
    use rmpv::Value as V;
    let bad_token = V::Map(vec![
        (s("type"), s("BlockStored")),
        (s("block_hashes"), V::Array(vec![V::from(1)])),
        (s("token_ids"), V::Array(vec![V::from(-3)])),
        (s("block_size"), V::from(1)),
    ]);
    let e = decode_payload(&mp(&V::Array(vec![V::F64(0.0), V::Array(vec![bad_token])])));
    assert!(
        matches!(
            e,
            Err(DecodeError::Range {
                what: "token id",
                ..
            })
        ),
        "{e:?}"
    );
    let missing = V::Map(vec![(s("type"), s("BlockStored"))]);
    let e = decode_payload(&mp(&V::Array(vec![V::F64(0.0), V::Array(vec![missing])])));
    assert!(matches!(e, Err(DecodeError::MissingField { .. })), "{e:?}");
    let untagged = V::Map(vec![(s("block_hashes"), V::Array(vec![]))]);
    let e = decode_payload(&mp(&V::Array(vec![V::F64(0.0), V::Array(vec![untagged])])));
    assert!(matches!(e, Err(DecodeError::MissingTag(_))), "{e:?}");
    // A header that claims 4 billion tokens must not allocate them.
    let huge = [
        0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(decode_payload(&huge).is_err());
    // Deep nesting in an ignored field is bounded.
    let mut deep = vec![0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x82];
    deep.extend_from_slice(&[0xa4, b't', b'y', b'p', b'e', 0xa1, b'X', 0xa1, b'z']);
    deep.extend(std::iter::repeat_n(0x91, 100_000));
    deep.push(0xc0);
    assert!(matches!(
        decode_payload(&deep),
        Err(DecodeError::TooDeep(_))
    ));
    assert!(decode_payload(&[]).is_err());
    assert!(decode_payload(&[0xc1]).is_err());
    assert!(decode_payload(&[0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
}

#[test]
fn encode_from_fields_matches_vllm_bytes() {
    // Rebuild run1's first event from vLLM's JSON decoding (not from our decoder) and encode it.
    let line = read("kv_frames_run1.jsonl");
    let j: Json = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    let captured = unhex(j["payload_hex"].as_str().unwrap());
    let e = &j["decoded"][1][0];
    let ev = KvEvent::BlockStored(BlockStored {
        block_hashes: e["block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(json_u64)
            .collect(),
        parent: None,
        token_ids: e["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| json_u64(t) as u32)
            .collect(),
        block_size: 32,
        lora_id: None,
        medium: Some(Medium::Gpu),
        lora_name: None,
        extra_keys: Some(vec![None, None]),
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
        kv_cache_spec_sliding_window: None,
    });
    // ts exactly as sent (bytes 2..10: the payload starts with 0x93 0xcb).
    let ts = f64::from_be_bytes(captured[2..10].try_into().unwrap());
    assert_eq!(encode_payload(ts, &[ev], Some(0)), captured);
}

// --- property tests --------------------------------------------------------------------------

fn medium() -> impl Strategy<Value = Option<Medium>> {
    prop_oneof![
        Just(None),
        Just(Some(Medium::Gpu)),
        Just(Some(Medium::Cpu)),
        "[a-z]{0,40}".prop_map(|s| Some(Medium::Other(s))),
    ]
}

fn extra_value() -> impl Strategy<Value = rmpv::Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(rmpv::Value::from),
        any::<u64>().prop_map(rmpv::Value::from),
        ".{0,40}".prop_map(|s: String| rmpv::Value::from(s.as_str())),
        any::<bool>().prop_map(rmpv::Value::Boolean),
        Just(rmpv::Value::Nil),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop::collection::vec(inner, 0..4).prop_map(rmpv::Value::Array)
    })
}

fn stored() -> impl Strategy<Value = KvEvent> {
    (
        (
            prop::collection::vec(any::<u64>(), 0..6),
            any::<Option<u64>>(),
            prop::collection::vec(any::<u32>(), 0..80),
            any::<u32>(),
            any::<Option<i64>>(),
            medium(),
        ),
        (
            prop::option::of("[a-z0-9-]{0,20}"),
            // A top-level `Some(Nil)` would encode as the `None` entry; never generate it.
            prop::option::of(prop::collection::vec(
                prop::option::of(extra_value().prop_filter("nil", |v| !v.is_nil())),
                0..4,
            )),
            any::<Option<u32>>(),
            prop::option::of(prop_oneof![
                Just("full_attention".to_owned()),
                Just("sliding_window".to_owned()),
                "[a-z_]{0,30}",
            ]),
            any::<Option<u32>>(),
        ),
    )
        .prop_map(
            |((hashes, parent, toks, bs, lora_id, medium), (name, extra, group, kind, sw))| {
                KvEvent::BlockStored(BlockStored {
                    block_hashes: hashes.into_iter().collect(),
                    parent,
                    token_ids: toks,
                    block_size: bs,
                    lora_id,
                    medium,
                    lora_name: name,
                    extra_keys: extra,
                    group_idx: group,
                    kv_cache_spec_kind: kind.map(Into::into),
                    kv_cache_spec_sliding_window: sw,
                })
            },
        )
}

fn event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        4 => stored(),
        3 => (prop::collection::vec(any::<u64>(), 0..40), medium(), any::<Option<u32>>()).prop_map(
            |(h, medium, group_idx)| KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: h.into_iter().collect(),
                medium,
                group_idx,
            })
        ),
        1 => Just(KvEvent::AllBlocksCleared),
        1 => "[A-Za-z]{0,20}"
            .prop_filter("known tag", |t| {
                !["BlockStored", "BlockRemoved", "AllBlocksCleared"].contains(&t.as_str())
            })
            .prop_map(KvEvent::Unknown),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decoder_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_payload(&bytes);
        let _ = decode_message(&[b"t", &0i64.to_be_bytes(), &bytes]);
        let _ = decode_replay_reply(&[b"", &bytes]);
    }

    #[test]
    fn decoder_never_panics_on_mutated_captures(
        which in 0usize..64,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let payloads = all_payloads();
        let mut p = payloads[which % payloads.len()].clone();
        for (i, b) in edits {
            let at = i.index(p.len());
            p[at] = b;
        }
        let n = cut.index(p.len() + 1);
        let _ = decode_payload(&p[..n]);
        let _ = decode_payload(&p);
    }

    #[test]
    fn encode_decode_round_trip(
        ts in -1e12f64..1e12,
        events in prop::collection::vec(event(), 0..6),
        dp in any::<Option<i64>>(),
        seq in any::<i64>(),
        topic in ".{0,20}",
    ) {
        let payload = encode_payload(ts, &events, dp);
        let (ts2, events2, dp2) = decode_payload(&payload).unwrap();
        prop_assert_eq!(ts2.to_bits(), ts.to_bits());
        prop_assert_eq!(&events2, &events);
        prop_assert_eq!(dp2, dp);
        let batch = EventBatch { topic, seq, ts, events, dp_rank: dp };
        let frames = encode_message(&batch);
        let back = decode_message(&refs(&frames)).unwrap();
        prop_assert_eq!(&back, &batch);
        // Re-encoding what was decoded is stable.
        prop_assert_eq!(encode_payload(ts2, &events2, dp2), payload);
    }
}
