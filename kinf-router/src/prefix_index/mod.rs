//! Which endpoint holds how much of a request's prompt in its prefix cache.
//!
//! Blocks are identified by **our own chained hash** of their tokens ([`chain_hash`]): XXH3-64
//! with the fixed seed [`HASH_SEED`] over `(parent_own_hash, token ids)`, starting from
//! [`ROOT_HASH`] (or a LoRA-specific root, see [`chain_root`]). vLLM's own block hash (SHA-256 over
//! pickle or CBOR) is not cheaply reproducible, so the exact index, [`PrefixIndex`], hashes
//! `BlockStored.token_ids` itself and keeps, per endpoint, a map from engine hash to own hash to
//! apply `BlockRemoved` and to chain a `BlockStored` onto its `parent_block_hash`.
//!
//! A request is matched by computing the own hashes of its full blocks ([`block_hashes`]; a
//! partial last block is never cached by vLLM) and walking them from the start
//! ([`PrefixIndex::match_prefix`]).
//!
//! [`ApproxIndex`] is the fallback for workers without KV events: it remembers what was routed
//! where, bounded per endpoint (LRU) and by age. It is an estimate, not the engine's truth.

mod approx;
mod exact;
mod holders;
mod slots;

use smallvec::SmallVec;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use approx::{ApproxIndex, ApproxStats};
pub use exact::{IndexStats, PrefixIndex};

/// Identifies an endpoint (one vLLM engine / data-parallel rank); assigned by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointId(pub u32);

/// Seed of the XXH3-64 block hash.
pub const HASH_SEED: u64 = 0x6b69_6e66_2d70_7278; // "kinf-prx"

/// Parent hash of a prompt's first block when no LoRA adapter is involved.
pub const ROOT_HASH: u64 = 0x6b69_6e66_2d72_6f6f; // "kinf-roo"

/// Inline capacity of [`RequestHashes`] (2,048 tokens at block size 32 stay on the stack).
pub const INLINE_REQUEST_BLOCKS: usize = 64;

/// The own hashes of a request's full blocks.
pub type RequestHashes = SmallVec<[u64; INLINE_REQUEST_BLOCKS]>;

/// Tokens of one block hashed without a heap allocation up to this block size.
const STACK_BLOCK_TOKENS: usize = 128;

/// Own hash of one block: XXH3-64 (seed [`HASH_SEED`]) over `parent` (8 bytes little-endian)
/// followed by the block's token ids (4 bytes little-endian each).
pub fn chain_hash(parent: u64, block_tokens: &[u32]) -> u64 {
    let mut buf: SmallVec<[u8; 8 + 4 * STACK_BLOCK_TOKENS]> = SmallVec::new();
    chain_hash_with(&mut buf, parent, block_tokens)
}

/// [`chain_hash`] with a caller-provided scratch buffer.
#[inline]
pub(crate) fn chain_hash_with<A: smallvec::Array<Item = u8>>(
    buf: &mut SmallVec<A>,
    parent: u64,
    block_tokens: &[u32],
) -> u64 {
    buf.clear();
    buf.resize(8 + 4 * block_tokens.len(), 0);
    let (head, tail) = buf.split_at_mut(8);
    head.copy_from_slice(&parent.to_le_bytes());
    for (dst, t) in tail.chunks_exact_mut(4).zip(block_tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(buf, HASH_SEED)
}

/// The root of a prompt's chain: [`ROOT_HASH`] without LoRA; with a LoRA adapter, a hash of its
/// name (vLLM keys cached blocks by adapter, so base-model and adapter blocks never match).
/// Events name the adapter by `lora_name` (vLLM ≥ 0.11) or only by `lora_id` (older); use
/// [`chain_root_lora_id`] for the latter.
pub fn chain_root(lora_name: Option<&str>) -> u64 {
    match lora_name {
        None => ROOT_HASH,
        Some(name) => xxh3_64_with_seed(name.as_bytes(), HASH_SEED ^ ROOT_HASH),
    }
}

/// The chain root for a LoRA adapter known only by its numeric id.
pub fn chain_root_lora_id(lora_id: i64) -> u64 {
    xxh3_64_with_seed(&lora_id.to_le_bytes(), HASH_SEED ^ ROOT_HASH ^ 1)
}

/// Own hashes of the full blocks of `tokens` (no LoRA). A trailing partial block is ignored, as
/// vLLM never caches it; `block_size == 0` yields nothing.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> RequestHashes {
    block_hashes_from(ROOT_HASH, tokens, block_size)
}

/// Own hashes of the full blocks of `tokens`, chained from `root` (see [`chain_root`]).
pub fn block_hashes_from(root: u64, tokens: &[u32], block_size: usize) -> RequestHashes {
    let mut out = RequestHashes::new();
    if block_size == 0 {
        return out;
    }
    out.reserve(tokens.len() / block_size);
    let mut buf: SmallVec<[u8; 8 + 4 * STACK_BLOCK_TOKENS]> = SmallVec::new();
    let mut parent = root;
    for block in tokens.chunks_exact(block_size) {
        parent = chain_hash_with(&mut buf, parent, block);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_chain_and_ignore_partial_blocks() {
        let toks: Vec<u32> = (0..100).collect();
        let h = block_hashes(&toks, 32);
        assert_eq!(h.len(), 3);
        assert_eq!(h[0], chain_hash(ROOT_HASH, &toks[..32]));
        assert_eq!(h[1], chain_hash(h[0], &toks[32..64]));
        assert_eq!(h[2], chain_hash(h[1], &toks[64..96]));
        // A different first block changes every later hash.
        let mut other = toks.clone();
        other[0] = 999;
        let g = block_hashes(&other, 32);
        assert!(h.iter().zip(&g).all(|(a, b)| a != b));
        assert!(block_hashes(&toks, 0).is_empty());
        assert!(block_hashes(&toks[..31], 32).is_empty());
    }

    #[test]
    fn roots_differ_by_adapter() {
        assert_eq!(chain_root(None), ROOT_HASH);
        assert_ne!(chain_root(Some("a")), chain_root(Some("b")));
        assert_ne!(chain_root(Some("a")), ROOT_HASH);
        assert_ne!(chain_root_lora_id(1), chain_root_lora_id(2));
        let toks: Vec<u32> = (0..64).collect();
        assert_ne!(
            block_hashes(&toks, 32)[0],
            block_hashes_from(chain_root(Some("a")), &toks, 32)[0]
        );
    }

    #[test]
    fn large_blocks_hash_the_same_through_both_paths() {
        let toks: Vec<u32> = (0..1000).collect();
        let h = block_hashes(&toks, 256);
        assert_eq!(h[0], chain_hash(ROOT_HASH, &toks[..256]));
        assert_eq!(h.len(), 3);
    }
}
