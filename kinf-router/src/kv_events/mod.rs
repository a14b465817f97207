//! Decoder (and encoder) for vLLM's ZMQ KV-cache events.
//!
//! vLLM publishes, on a ZMQ `PUB` socket, one multipart message per scheduler step that changed
//! the prefix cache: `[topic (utf-8), seq (8-byte big-endian signed), payload (msgpack)]`. The
//! payload is the positional array `[ts: f64, events: [...], data_parallel_rank: int | nil]`
//! (the trailing rank may be omitted; a map `{ts, events, data_parallel_rank}` is accepted too).
//!
//! Events are msgpack maps tagged by `"type"` since vLLM 0.24 (`BlockStored`, `BlockRemoved`,
//! `AllBlocksCleared`) and arrays led by the tag up to 0.23; both are decoded. Unknown keys are
//! ignored, fields absent from the wire take their default, and an event whose tag is not known
//! decodes to [`KvEvent::Unknown`] rather than failing the batch.
//!
//! **Engine block hashes** are represented as `u64`. vLLM normally sends them as msgpack integers
//! (of any width; a negative value, as sent by vLLM versions hashing with Python's `hash()`, is
//! taken as its two's-complement `u64`). With `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0` it sends the
//! 32-byte digest as `bin`; we then keep its low 64 bits, i.e. the **last 8 bytes read
//! big-endian**, which is exactly the integer vLLM would have sent in int mode. Such hashes are
//! only identifiers for [`crate::prefix_index`]; they are never recomputed.
//!
//! Decoding is total: malformed input of any kind yields a [`DecodeError`], never a panic, and
//! no allocation is sized from an untrusted length without checking it against the input size.
//!
//! The replay protocol (vLLM 0.26+; `replay_endpoint` set) is covered by
//! [`replay_request_frames`] and [`decode_replay_reply`]; [`SeqTracker`] detects the sequence
//! gaps that make a replay (or an index reset) necessary. [`encode_payload`] produces the exact
//! bytes vLLM 0.32 publishes, for the simulator.

mod decode;
mod encode;
mod msgpack;
mod seq;

use std::borrow::Cow;

use smallvec::SmallVec;

pub use decode::{decode_message, decode_payload, decode_replay_reply};
pub use encode::{
    encode_message, encode_payload, encode_payload_into, replay_end_frames, replay_reply_frames,
    replay_request_frames,
};
pub use seq::{SeqStatus, SeqTracker};

/// Inline capacity of [`BlockStored::block_hashes`]; most events carry a few blocks.
pub const INLINE_HASHES: usize = 4;

/// The engine block hashes of one event (inline up to [`INLINE_HASHES`]).
pub type BlockHashes = SmallVec<[u64; INLINE_HASHES]>;

/// One decoded ZMQ message: `[topic, seq, payload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// The ZMQ topic (vLLM's `kv_events_config.topic`, often empty).
    pub topic: String,
    /// Publisher sequence number (starts at 0 for each publisher process).
    pub seq: i64,
    /// Publisher timestamp, seconds since the Unix epoch.
    pub ts: f64,
    /// Events in the order the engine produced them.
    pub events: Vec<KvEvent>,
    /// Data-parallel rank of the publishing engine, if sent.
    pub dp_rank: Option<i64>,
}

/// One KV-cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    /// Blocks became cached (prefix-cacheable and hashed).
    BlockStored(BlockStored),
    /// Blocks were evicted.
    BlockRemoved(BlockRemoved),
    /// The whole prefix cache was reset (e.g. `POST /reset_prefix_cache`).
    AllBlocksCleared,
    /// An event type this decoder does not know, kept by tag so that a batch still decodes.
    Unknown(String),
}

/// Storage medium named by an event (`"GPU"` even on vLLM's CPU backend).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"`: the engine's primary KV cache.
    Gpu,
    /// `"CPU"`: an offloaded tier.
    Cpu,
    /// Any other medium name, verbatim.
    Other(String),
}

impl Medium {
    /// Parses a medium name.
    pub fn from_name(s: &str) -> Self {
        match s {
            "GPU" => Self::Gpu,
            "CPU" => Self::Cpu,
            other => Self::Other(other.to_owned()),
        }
    }

    /// The wire name.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Gpu => "GPU",
            Self::Cpu => "CPU",
            Self::Other(s) => s,
        }
    }
}

/// A `BlockStored` event: `block_hashes.len()` consecutive full blocks whose tokens are
/// `token_ids` (`block_size` tokens each), chained after `parent`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in chain order.
    pub block_hashes: BlockHashes,
    /// Engine hash of the block preceding the first stored block; `None` at a prompt's start.
    pub parent: Option<u64>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block.
    pub block_size: u32,
    /// LoRA adapter id (deprecated upstream in favour of `lora_name`).
    pub lora_id: Option<i64>,
    /// Storage medium.
    pub medium: Option<Medium>,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// Per-block extra hash keys (multimodal ids, LoRA name, cache salt…), verbatim; absent on
    /// vLLM versions that do not send them.
    pub extra_keys: Option<Vec<Option<rmpv::Value>>>,
    /// KV-cache group of the blocks (hybrid models have several).
    pub group_idx: Option<u32>,
    /// Kind of the group's cache spec (`"full_attention"`, `"sliding_window"`, …).
    pub kv_cache_spec_kind: Option<Cow<'static, str>>,
    /// Sliding-window size of the group's cache spec, if any.
    pub kv_cache_spec_sliding_window: Option<u32>,
}

/// A `BlockRemoved` event: blocks evicted from the cache.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine hashes of the evicted blocks.
    pub block_hashes: BlockHashes,
    /// Storage medium.
    pub medium: Option<Medium>,
    /// KV-cache group of the blocks.
    pub group_idx: Option<u32>,
}

/// One item received on the replay socket.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayItem {
    /// A buffered batch (its `topic` is empty for pre-0.26 replies, which do not carry it).
    Batch(EventBatch),
    /// The end-of-replay marker (sequence `-1`).
    End,
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Wrong number of ZMQ frames.
    #[error("expected {expected} frames, got {got}")]
    FrameCount {
        /// What was expected, in words.
        expected: &'static str,
        /// How many frames arrived.
        got: usize,
    },
    /// The topic frame is not UTF-8.
    #[error("topic frame is not valid utf-8")]
    TopicNotUtf8,
    /// The sequence frame is not 8 bytes long.
    #[error("sequence frame must be 8 bytes, got {0}")]
    SeqLength(usize),
    /// The payload ended in the middle of a value.
    #[error("unexpected end of payload at byte {0}")]
    Eof(usize),
    /// A value of the wrong type.
    #[error("expected {expected} at byte {offset}")]
    Type {
        /// The expected type, in words.
        expected: &'static str,
        /// Byte offset of the offending value in the payload.
        offset: usize,
    },
    /// An integer outside the range of its field.
    #[error("{what} out of range at byte {offset}")]
    Range {
        /// The field.
        what: &'static str,
        /// Byte offset of the offending value in the payload.
        offset: usize,
    },
    /// A string that is not UTF-8.
    #[error("string is not valid utf-8 at byte {0}")]
    Utf8(usize),
    /// A required field is absent.
    #[error("{event} is missing field `{field}`")]
    MissingField {
        /// The event type.
        event: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// An event without a type tag.
    #[error("event at byte {0} has no type tag")]
    MissingTag(usize),
    /// Values nested deeper than the decoder accepts.
    #[error("values nested deeper than {0} levels")]
    TooDeep(usize),
    /// Bytes left over after the payload.
    #[error("{0} trailing bytes after the payload")]
    Trailing(usize),
}
