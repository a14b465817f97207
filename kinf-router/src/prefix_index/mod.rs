//! Which endpoint holds how much of a request's prompt in its prefix cache.
//!
//! Blocks are identified by **our own chained hash** of their tokens ([`chain_hash`]): XXH3-64
//! with the fixed seed [`HASH_SEED`] over `(parent_own_hash, XXH3-64(token ids))`, starting from
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
use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

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

/// Tokens converted to bytes on the stack per step when hashing a block.
const STACK_TOKENS: usize = 64;

/// Own hash of one block chained after `parent`:
/// `XXH3-64(parent ‖ XXH3-64(tokens))`, both with seed [`HASH_SEED`], where `parent` and the
/// inner hash are 8 bytes little-endian and each token id 4 bytes little-endian.
///
/// (Hashing the tokens on their own keeps the long input at the size XXH3 is fastest on for
/// vLLM's block sizes, 64 bytes at 16 tokens and 128 at 32; the second hash chains it.)
#[inline]
pub fn chain_hash(parent: u64, block_tokens: &[u32]) -> u64 {
    chain_hash_in(&mut [0u8; 4 * STACK_TOKENS], parent, block_tokens)
}

/// Scratch space for converting tokens to bytes; reused across the blocks of a prompt.
pub(crate) type Scratch = [u8; 4 * STACK_TOKENS];

/// [`chain_hash`] with caller-provided scratch space (no per-block zeroing).
#[inline]
pub(crate) fn chain_hash_in(buf: &mut Scratch, parent: u64, block_tokens: &[u32]) -> u64 {
    let mut pair = [0u8; 16];
    pair[..8].copy_from_slice(&parent.to_le_bytes());
    pair[8..].copy_from_slice(&tokens_hash(buf, block_tokens).to_le_bytes());
    xxh3_64_with_seed(&pair, HASH_SEED)
}

/// XXH3-64 (seed [`HASH_SEED`]) of the tokens' little-endian bytes, converted in `buf`.
#[inline]
fn tokens_hash(buf: &mut Scratch, tokens: &[u32]) -> u64 {
    if tokens.len() <= STACK_TOKENS {
        let bytes = &mut buf[..4 * tokens.len()];
        for (dst, t) in bytes.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(bytes, HASH_SEED)
    } else {
        // Streaming gives the same digest as one-shot hashing of all the bytes.
        let mut h = Xxh3::with_seed(HASH_SEED);
        for chunk in tokens.chunks(STACK_TOKENS) {
            let bytes = &mut buf[..4 * chunk.len()];
            for (dst, t) in bytes.chunks_exact_mut(4).zip(chunk) {
                dst.copy_from_slice(&t.to_le_bytes());
            }
            h.update(bytes);
        }
        h.digest()
    }
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
    chain_blocks(root, tokens, block_size, |h| out.push(h));
    out
}

/// Calls `f` with the own hash of every full block of `tokens`, in order, chained from `parent`.
///
/// The common block sizes get code specialised for their length (about twice as fast as the
/// generic loop, whose XXH3 must dispatch on the input length at run time).
#[inline]
pub(crate) fn chain_blocks(parent: u64, tokens: &[u32], block_size: usize, f: impl FnMut(u64)) {
    match block_size {
        0 => {}
        16 => chain_fixed::<16>(parent, tokens, f),
        32 => chain_fixed::<32>(parent, tokens, f),
        64 => chain_fixed::<64>(parent, tokens, f),
        128 => chain_fixed::<128>(parent, tokens, f),
        _ => {
            let mut f = f;
            let mut buf: Scratch = [0; 4 * STACK_TOKENS];
            let mut parent = parent;
            for block in tokens.chunks_exact(block_size) {
                parent = chain_hash_in(&mut buf, parent, block);
                f(parent);
            }
        }
    }
}

#[inline(always)]
fn chain_fixed<const B: usize>(mut parent: u64, tokens: &[u32], mut f: impl FnMut(u64)) {
    let mut buf: Scratch = [0; 4 * STACK_TOKENS];
    for block in tokens.chunks_exact(B) {
        let Ok(block) = <&[u32; B]>::try_from(block) else {
            continue; // unreachable: chunks_exact yields B tokens
        };
        parent = chain_hash_in(&mut buf, parent, block);
        f(parent);
    }
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
    fn specialised_block_sizes_match_the_generic_chain() {
        let toks: Vec<u32> = (0..1000).map(|i| i * 7919 % 32000).collect();
        for bs in [1, 3, 16, 32, 64, 100, 128, 200] {
            let mut parent = ROOT_HASH;
            let want: Vec<u64> = toks
                .chunks_exact(bs)
                .map(|b| {
                    parent = chain_hash(parent, b);
                    parent
                })
                .collect();
            assert_eq!(block_hashes(&toks, bs).to_vec(), want, "block size {bs}");
        }
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
    fn streaming_and_one_shot_token_hashes_agree() {
        let toks: Vec<u32> = (0..300).collect();
        let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            tokens_hash(&mut [0; 256], &toks),
            xxh3_64_with_seed(&bytes, HASH_SEED)
        );
        assert_eq!(
            tokens_hash(&mut [0; 256], &toks[..64]),
            xxh3_64_with_seed(&bytes[..256], HASH_SEED)
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
