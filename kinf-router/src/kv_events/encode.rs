//! Encoding in vLLM 0.32's wire format (used by the simulator to publish identical bytes).

use super::msgpack::Writer;
use super::{BlockRemoved, BlockStored, EventBatch, KvEvent};

/// Encodes a payload exactly as vLLM 0.32 does (msgspec, `omit_defaults`): the positional
/// array `[ts, events, dp_rank]` (two elements when `dp_rank` is `None`), events as maps tagged by
/// `"type"` with fields in declaration order. Fields that vLLM declares without a default
/// (`parent_block_hash`, `lora_id`, `medium`, `lora_name`, …) are always written, `nil` when
/// `None`; the defaulted ones (`extra_keys`, `group_idx`, `kv_cache_spec_kind`,
/// `kv_cache_spec_sliding_window`) are omitted when `None`. Integers use their smallest encoding
/// and `ts` is always a float64, as msgspec writes them.
pub fn encode_payload(ts: f64, events: &[KvEvent], dp_rank: Option<i64>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + events.len() * 256);
    encode_payload_into(&mut out, ts, events, dp_rank);
    out
}

/// Like [`encode_payload`], appending to `out` (to reuse its allocation).
pub fn encode_payload_into(out: &mut Vec<u8>, ts: f64, events: &[KvEvent], dp_rank: Option<i64>) {
    let mut w = Writer { out };
    w.array_len(if dp_rank.is_some() { 3 } else { 2 });
    w.f64(ts);
    w.array_len(events.len());
    for e in events {
        event(&mut w, e);
    }
    if let Some(dp) = dp_rank {
        w.int(dp);
    }
}

/// Encodes a whole live message `[topic, seq (8-byte big-endian), payload]`.
pub fn encode_message(batch: &EventBatch) -> [Vec<u8>; 3] {
    [
        batch.topic.as_bytes().to_vec(),
        batch.seq.to_be_bytes().to_vec(),
        encode_payload(batch.ts, &batch.events, batch.dp_rank),
    ]
}

/// The frames a `DEALER` sends to vLLM's replay socket to ask for every buffered batch with
/// sequence ≥ `start_seq`: `["", start_seq (8-byte big-endian)]`.
pub fn replay_request_frames(start_seq: i64) -> [Vec<u8>; 2] {
    [Vec::new(), start_seq.to_be_bytes().to_vec()]
}

/// The frames vLLM 0.32's replay socket sends (after the `ROUTER` identity) for one buffered
/// batch: `["", topic, seq, payload]`.
pub fn replay_reply_frames(batch: &EventBatch) -> [Vec<u8>; 4] {
    let [topic, seq, payload] = encode_message(batch);
    [Vec::new(), topic, seq, payload]
}

/// The end-of-replay marker `["", "", -1 (8-byte big-endian), ""]`.
pub fn replay_end_frames() -> [Vec<u8>; 4] {
    [
        Vec::new(),
        Vec::new(),
        (-1i64).to_be_bytes().to_vec(),
        Vec::new(),
    ]
}

fn event(w: &mut Writer<'_>, e: &KvEvent) {
    match e {
        KvEvent::BlockStored(s) => stored(w, s),
        KvEvent::BlockRemoved(r) => removed(w, r),
        KvEvent::AllBlocksCleared => {
            w.map_len(1);
            w.str("type");
            w.str("AllBlocksCleared");
        }
        KvEvent::Unknown(tag) => {
            w.map_len(1);
            w.str("type");
            w.str(tag);
        }
    }
}

fn stored(w: &mut Writer<'_>, s: &BlockStored) {
    let optional = usize::from(s.extra_keys.is_some())
        + usize::from(s.group_idx.is_some())
        + usize::from(s.kv_cache_spec_kind.is_some())
        + usize::from(s.kv_cache_spec_sliding_window.is_some());
    w.map_len(8 + optional);
    w.str("type");
    w.str("BlockStored");
    w.str("block_hashes");
    w.array_len(s.block_hashes.len());
    for &h in &s.block_hashes {
        w.uint(h);
    }
    w.str("parent_block_hash");
    match s.parent {
        Some(p) => w.uint(p),
        None => w.nil(),
    }
    w.str("token_ids");
    w.array_len(s.token_ids.len());
    for &t in &s.token_ids {
        w.uint(u64::from(t));
    }
    w.str("block_size");
    w.uint(u64::from(s.block_size));
    w.str("lora_id");
    match s.lora_id {
        Some(l) => w.int(l),
        None => w.nil(),
    }
    w.str("medium");
    match &s.medium {
        Some(m) => w.str(m.as_str()),
        None => w.nil(),
    }
    w.str("lora_name");
    match &s.lora_name {
        Some(n) => w.str(n),
        None => w.nil(),
    }
    if let Some(keys) = &s.extra_keys {
        w.str("extra_keys");
        w.array_len(keys.len());
        for k in keys {
            match k {
                Some(v) => w.value(v),
                None => w.nil(),
            }
        }
    }
    if let Some(g) = s.group_idx {
        w.str("group_idx");
        w.uint(u64::from(g));
    }
    if let Some(k) = &s.kv_cache_spec_kind {
        w.str("kv_cache_spec_kind");
        w.str(k);
    }
    if let Some(sw) = s.kv_cache_spec_sliding_window {
        w.str("kv_cache_spec_sliding_window");
        w.uint(u64::from(sw));
    }
}

fn removed(w: &mut Writer<'_>, r: &BlockRemoved) {
    w.map_len(3 + usize::from(r.group_idx.is_some()));
    w.str("type");
    w.str("BlockRemoved");
    w.str("block_hashes");
    w.array_len(r.block_hashes.len());
    for &h in &r.block_hashes {
        w.uint(h);
    }
    w.str("medium");
    match &r.medium {
        Some(m) => w.str(m.as_str()),
        None => w.nil(),
    }
    if let Some(g) = r.group_idx {
        w.str("group_idx");
        w.uint(u64::from(g));
    }
}
