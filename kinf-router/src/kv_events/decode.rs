//! Decoding of ZMQ frames and msgpack payloads.

use std::borrow::Cow;

use super::msgpack::Reader;
use super::{
    BlockHashes, BlockRemoved, BlockStored, DecodeError, EventBatch, KvEvent, Medium, ReplayItem,
};

/// Decodes one live message `[topic, seq, payload]` received on the `SUB` socket.
pub fn decode_message(frames: &[&[u8]]) -> Result<EventBatch, DecodeError> {
    let &[topic, seq, payload] = frames else {
        return Err(DecodeError::FrameCount {
            expected: "3",
            got: frames.len(),
        });
    };
    batch(topic, seq, payload)
}

/// Decodes one reply received by a `DEALER` on vLLM's replay socket.
///
/// Accepts `["", topic, seq, payload]` (vLLM 0.26+), `["", seq, payload]` and `[seq, payload]`
/// (earlier versions; the batch's topic is then empty). A sequence of `-1` is the end marker.
pub fn decode_replay_reply(frames: &[&[u8]]) -> Result<ReplayItem, DecodeError> {
    let (topic, seq, payload): (&[u8], &[u8], &[u8]) = match *frames {
        [delim, topic, seq, payload] => {
            if !delim.is_empty() {
                return Err(DecodeError::FrameCount {
                    expected: "an empty delimiter frame and 3",
                    got: frames.len(),
                });
            }
            (topic, seq, payload)
        }
        [topic, seq, payload] => (topic, seq, payload),
        [seq, payload] => (&[], seq, payload),
        _ => {
            return Err(DecodeError::FrameCount {
                expected: "2 to 4",
                got: frames.len(),
            });
        }
    };
    if seq_of(seq)? == -1 {
        return Ok(ReplayItem::End);
    }
    batch(topic, seq, payload).map(ReplayItem::Batch)
}

fn seq_of(frame: &[u8]) -> Result<i64, DecodeError> {
    let b: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqLength(frame.len()))?;
    Ok(i64::from_be_bytes(b))
}

fn batch(topic: &[u8], seq: &[u8], payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let topic = std::str::from_utf8(topic)
        .map_err(|_| DecodeError::TopicNotUtf8)?
        .to_owned();
    let seq = seq_of(seq)?;
    let (ts, events, dp_rank) = decode_payload(payload)?;
    Ok(EventBatch {
        topic,
        seq,
        ts,
        events,
        dp_rank,
    })
}

/// Decodes a msgpack payload into `(ts, events, data_parallel_rank)`.
///
/// Accepts the positional array `[ts, events]` / `[ts, events, dp_rank, …]` (what vLLM sends)
/// and the map form `{"ts", "events", "data_parallel_rank"}`. Trailing bytes are an error.
#[allow(clippy::type_complexity)]
pub fn decode_payload(payload: &[u8]) -> Result<(f64, Vec<KvEvent>, Option<i64>), DecodeError> {
    let mut r = Reader::new(payload);
    let out = if let Some(n) = r.try_array_len()? {
        if n < 2 {
            return Err(r.type_err(0, "a payload array of at least 2 elements"));
        }
        let ts = r.f64()?;
        let events = events(&mut r)?;
        let dp = if n >= 3 {
            opt(&mut r, |r| r.i64_value("data_parallel_rank"))?
        } else {
            None
        };
        for _ in 3..n {
            r.skip()?;
        }
        (ts, events, dp)
    } else if let Some(n) = r.try_map_len()? {
        let (mut ts, mut evs, mut dp) = (None, None, None);
        for _ in 0..n {
            match key(&mut r)? {
                Some(b"ts") => ts = Some(r.f64()?),
                Some(b"events") => evs = Some(events(&mut r)?),
                Some(b"data_parallel_rank") => {
                    dp = opt(&mut r, |r| r.i64_value("data_parallel_rank"))?;
                }
                _ => r.skip()?,
            }
        }
        let missing = |field| DecodeError::MissingField {
            event: "EventBatch",
            field,
        };
        (
            ts.ok_or_else(|| missing("ts"))?,
            evs.ok_or_else(|| missing("events"))?,
            dp,
        )
    } else {
        return Err(r.type_err(0, "a payload array or map"));
    };
    if r.remaining() > 0 {
        return Err(DecodeError::Trailing(r.remaining()));
    }
    Ok(out)
}

/// Reads a map key: `Some(bytes)` for a string key; a key of another type is skipped (`None`).
#[inline]
fn key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, DecodeError> {
    if matches!(r.peek()?, 0xa0..=0xbf | 0xd9..=0xdb) {
        r.str_bytes().map(Some)
    } else {
        r.skip()?;
        Ok(None)
    }
}

#[inline]
fn opt<'a, T>(
    r: &mut Reader<'a>,
    f: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    if r.nil()? { Ok(None) } else { f(r).map(Some) }
}

/// Caps a length read from the wire by what the remaining input can hold (≥ 1 byte per item).
#[inline]
fn checked_len(r: &Reader<'_>, n: usize) -> Result<usize, DecodeError> {
    if n > r.remaining() {
        Err(DecodeError::Eof(r.pos()))
    } else {
        Ok(n)
    }
}

fn events(r: &mut Reader<'_>) -> Result<Vec<KvEvent>, DecodeError> {
    let n = r.array_len()?;
    let n = checked_len(r, n)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(event(r)?);
    }
    Ok(out)
}

/// Fields of any event type, as read from the wire.
#[derive(Default)]
struct Fields<'a> {
    tag: Option<&'a [u8]>,
    block_hashes: Option<BlockHashes>,
    parent: Option<u64>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<String>,
    extra_keys: Option<Vec<Option<rmpv::Value>>>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<Cow<'static, str>>,
    kv_cache_spec_sliding_window: Option<u32>,
}

/// Positional field order of the pre-0.24 array encoding (the tag comes first).
const STORED_ORDER: [&[u8]; 11] = [
    b"block_hashes",
    b"parent_block_hash",
    b"token_ids",
    b"block_size",
    b"lora_id",
    b"medium",
    b"lora_name",
    b"extra_keys",
    b"group_idx",
    b"kv_cache_spec_kind",
    b"kv_cache_spec_sliding_window",
];
const REMOVED_ORDER: [&[u8]; 3] = [b"block_hashes", b"medium", b"group_idx"];

fn event(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let start = r.pos();
    let mut f = Fields::default();
    if let Some(n) = r.try_map_len()? {
        for _ in 0..n {
            match key(r)? {
                Some(k) => field(r, &mut f, k)?,
                None => r.skip()?,
            }
        }
    } else if let Some(n) = r.try_array_len()? {
        if n == 0 {
            return Err(DecodeError::MissingTag(start));
        }
        let tag = r.str_bytes()?;
        f.tag = Some(tag);
        let order: &[&[u8]] = match tag {
            b"BlockStored" => &STORED_ORDER,
            b"BlockRemoved" => &REMOVED_ORDER,
            _ => &[],
        };
        for i in 1..n {
            match order.get(i - 1) {
                Some(k) => field(r, &mut f, k)?,
                None => r.skip()?,
            }
        }
    } else {
        return Err(r.type_err(start, "an event map or array"));
    }
    build(f, start)
}

fn field<'a>(r: &mut Reader<'a>, f: &mut Fields<'a>, k: &[u8]) -> Result<(), DecodeError> {
    match k {
        b"type" => f.tag = Some(r.str_bytes()?),
        b"block_hashes" => f.block_hashes = Some(hashes(r)?),
        b"parent_block_hash" => f.parent = opt(r, Reader::block_hash)?,
        b"token_ids" => f.token_ids = Some(tokens(r)?),
        b"block_size" => f.block_size = Some(r.u32_value("block_size")?),
        b"lora_id" => f.lora_id = opt(r, |r| r.i64_value("lora_id"))?,
        b"medium" => f.medium = opt(r, |r| r.str().map(Medium::from_name))?,
        b"lora_name" => f.lora_name = opt(r, |r| r.str().map(str::to_owned))?,
        b"extra_keys" => f.extra_keys = opt(r, extra_keys)?,
        b"group_idx" => f.group_idx = opt(r, |r| r.u32_value("group_idx"))?,
        b"kv_cache_spec_kind" => f.kv_cache_spec_kind = opt(r, |r| r.str().map(intern_kind))?,
        b"kv_cache_spec_sliding_window" => {
            f.kv_cache_spec_sliding_window =
                opt(r, |r| r.u32_value("kv_cache_spec_sliding_window"))?;
        }
        _ => r.skip()?,
    }
    Ok(())
}

fn build(f: Fields<'_>, start: usize) -> Result<KvEvent, DecodeError> {
    let tag = f.tag.ok_or(DecodeError::MissingTag(start))?;
    Ok(match tag {
        b"BlockStored" => {
            let missing = |field| DecodeError::MissingField {
                event: "BlockStored",
                field,
            };
            KvEvent::BlockStored(BlockStored {
                block_hashes: f.block_hashes.ok_or_else(|| missing("block_hashes"))?,
                parent: f.parent,
                token_ids: f.token_ids.ok_or_else(|| missing("token_ids"))?,
                block_size: f.block_size.ok_or_else(|| missing("block_size"))?,
                lora_id: f.lora_id,
                medium: f.medium,
                lora_name: f.lora_name,
                extra_keys: f.extra_keys,
                group_idx: f.group_idx,
                kv_cache_spec_kind: f.kv_cache_spec_kind,
                kv_cache_spec_sliding_window: f.kv_cache_spec_sliding_window,
            })
        }
        b"BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: f.block_hashes.ok_or(DecodeError::MissingField {
                event: "BlockRemoved",
                field: "block_hashes",
            })?,
            medium: f.medium,
            group_idx: f.group_idx,
        }),
        b"AllBlocksCleared" => KvEvent::AllBlocksCleared,
        other => KvEvent::Unknown(String::from_utf8_lossy(other).into_owned()),
    })
}

fn hashes(r: &mut Reader<'_>) -> Result<BlockHashes, DecodeError> {
    let n = r.array_len()?;
    let n = checked_len(r, n)?;
    let mut out = BlockHashes::with_capacity(n);
    for _ in 0..n {
        out.push(r.block_hash()?);
    }
    Ok(out)
}

fn tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len()?;
    let n = checked_len(r, n)?;
    let mut out = Vec::with_capacity(n);
    r.u32_values(n, &mut out, "token id")?;
    Ok(out)
}

fn extra_keys(r: &mut Reader<'_>) -> Result<Vec<Option<rmpv::Value>>, DecodeError> {
    let n = r.array_len()?;
    let n = checked_len(r, n)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        if r.nil()? {
            out.push(None);
            continue;
        }
        // Validate (bounded depth, real lengths) before handing the bytes to rmpv.
        let start = r.pos();
        r.skip()?;
        let mut bytes = r.slice_from(start);
        let v = rmpv::decode::read_value(&mut bytes).map_err(|_| DecodeError::Type {
            expected: "an extra key",
            offset: start,
        })?;
        out.push(Some(v));
    }
    Ok(out)
}

/// Known `kv_cache_spec_kind` values are borrowed, so decoding them does not allocate.
fn intern_kind(s: &str) -> Cow<'static, str> {
    const KNOWN: [&str; 8] = [
        "full_attention",
        "sliding_window",
        "mla_attention",
        "sink_full_attention",
        "chunked_local_attention",
        "cross_attention",
        "encoder_only_attention",
        "mamba",
    ];
    match KNOWN.iter().find(|k| **k == s) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(s.to_owned()),
    }
}
