//! The simulated engine's block hash, generated token ids, and a small deterministic RNG.
//!
//! **Block hashes.** vLLM hashes a block as `H((parent_hash, tuple(token_ids), extra_keys))` with
//! SHA-256 over pickle or CBOR and publishes the low 64 bits. The simulator does **not**
//! reproduce that digest: it uses its own deterministic 64-bit chained hash,
//! [`block_hash`] = XXH3-64 over the block's token ids (4 bytes little-endian each), seeded with
//! `ENGINE_HASH_SEED ^ parent`, starting from `parent` = [`NONE_HASH`]. This is
//! enough for everything a consumer may rely on: equal token chains give equal hashes, different
//! chains (almost surely) different ones, and hashes are opaque identifiers. Kinference's prefix
//! index hashes `BlockStored.token_ids` with its own function anyway, and keeps an engine-hash →
//! own-hash map only to resolve `BlockRemoved` and `parent_block_hash`.
//!
//! **Generated tokens.** The simulator does not run a model; the `i`-th generated token of a
//! request is [`output_token`]`(output_seed, i, vocab)`, so a workload generator can reproduce a
//! conversation's earlier answers exactly (multi-turn prefix reuse depends on it).

use std::sync::Arc;

use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// Seed of the engine block hash (`"kinf-sim"`), distinct from the router's own hash seed.
pub const ENGINE_HASH_SEED: u64 = 0x6b69_6e66_2d73_696d;

/// Parent hash of a prompt's first block (the simulator's analogue of vLLM's `NONE_HASH`; it is
/// never published: a first block's `BlockStored.parent_block_hash` is `nil`).
pub const NONE_HASH: u64 = 0x9bd9_6a48_5ad8_4efd;

/// Tokens hashed through a stack buffer; larger blocks stream.
const STACK_TOKENS: usize = 64;

/// The engine hash of one block of `tokens` chained after `parent` (see the module docs):
/// XXH3-64 of the tokens' little-endian bytes, seeded with `ENGINE_HASH_SEED ^ parent`.
#[inline]
pub fn block_hash(parent: u64, tokens: &[u32]) -> u64 {
    match tokens.len() {
        16 => hash_fixed::<16>(parent, tokens),
        32 => hash_fixed::<32>(parent, tokens),
        _ => hash_any(parent, tokens),
    }
}

#[inline(always)]
fn hash_fixed<const B: usize>(parent: u64, tokens: &[u32]) -> u64 {
    let Ok(block) = <&[u32; B]>::try_from(tokens) else {
        return hash_any(parent, tokens);
    };
    let mut buf = [0u8; 4 * STACK_TOKENS];
    for (dst, t) in buf.chunks_exact_mut(4).zip(block.iter()) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(buf.get(..4 * B).unwrap_or(&[]), ENGINE_HASH_SEED ^ parent)
}

fn hash_any(parent: u64, tokens: &[u32]) -> u64 {
    let seed = ENGINE_HASH_SEED ^ parent;
    let mut buf = [0u8; 4 * STACK_TOKENS];
    if tokens.len() <= STACK_TOKENS {
        for (dst, t) in buf.chunks_exact_mut(4).zip(tokens) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(buf.get(..4 * tokens.len()).unwrap_or(&[]), seed)
    } else {
        // Streaming gives the same digest as hashing all the bytes at once.
        let mut h = Xxh3::with_seed(seed);
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

/// Engine hashes of the full blocks of `tokens` (a trailing partial block is never cached).
/// `block_size == 0` yields nothing.
pub fn block_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut parent = NONE_HASH;
    for block in tokens.chunks_exact(block_size) {
        parent = block_hash(parent, block);
        out.push(parent);
    }
    out
}

/// The engine hashes of a prompt prefix that many requests share, computed once.
///
/// A simulation that sends the same system prompt thousands of times attaches it to each
/// request ([`Request::with_prefix_hashes`](crate::Request::with_prefix_hashes)), so that
/// engines do not hash the prefix again for every request. It is a hint: it saves work and
/// never changes an outcome. It holds the prefix's tokens, and an engine uses it only if the
/// request's prompt begins with them and its block size is the engine's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixHashes {
    tokens: Arc<[u32]>,
    block_size: u32,
    hashes: Arc<[u64]>,
}

impl PrefixHashes {
    /// The hashes of the full blocks of `tokens` for blocks of `block_size` tokens.
    pub fn new(tokens: Arc<[u32]>, block_size: u32) -> Self {
        let hashes = block_hashes(&tokens, block_size as usize).into();
        Self {
            tokens,
            block_size,
            hashes,
        }
    }

    /// The prefix's tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The block size the hashes are for.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The hashes of the prefix's full blocks, in order.
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }
}

/// SplitMix64 finaliser: a bijective 64-bit mix.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `index`-th token a request with `output_seed` generates, in `0..vocab` (`vocab` 0 is
/// taken as 2³²).
#[inline]
pub fn output_token(output_seed: u64, index: u32, vocab: u32) -> u32 {
    let x = mix64(output_seed ^ mix64(u64::from(index).wrapping_add(0x9e37_79b9_7f4a_7c15)));
    if vocab == 0 {
        x as u32
    } else {
        // Lemire's multiply-shift range reduction.
        (((x >> 32) * u64::from(vocab)) >> 32) as u32
    }
}

/// A small, fast, deterministic RNG (SplitMix64) for workloads and tests.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            state: mix64(seed ^ 0x6b69_6e66_7369_6d00),
        }
    }

    /// An independent generator derived from this one's seed and `stream`.
    pub fn fork(&self, stream: u64) -> Self {
        Self::new(self.state ^ mix64(stream.wrapping_add(1)))
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.state)
    }

    /// Uniform in `[0, 1)` with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Exponentially distributed with the given rate (mean `1 / rate`); `rate <= 0` gives
    /// infinity.
    #[inline]
    pub fn exp(&mut self, rate: f64) -> f64 {
        if rate <= 0.0 {
            return f64::INFINITY;
        }
        -(1.0 - self.next_f64()).ln() / rate
    }

    /// `n` random token ids in `0..vocab`.
    pub fn tokens(&mut self, n: usize, vocab: u32) -> Vec<u32> {
        (0..n)
            .map(|_| self.below(u64::from(vocab.max(1))) as u32)
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn chained_hashes_depend_on_every_earlier_block() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[0] = 1000;
        let ha = block_hashes(&a, 16);
        let hb = block_hashes(&b, 16);
        assert_eq!(ha.len(), 4);
        assert!(ha.iter().zip(&hb).all(|(x, y)| x != y));
        assert_eq!(ha[1], block_hash(ha[0], &a[16..32]));
        assert!(block_hashes(&a[..15], 16).is_empty());
        assert!(block_hashes(&a, 0).is_empty());
    }

    #[test]
    fn all_paths_agree_with_the_definition() {
        let toks: Vec<u32> = (0..200).map(|i| i * 31 + 7).collect();
        let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
        for n in [1usize, 15, 16, 17, 32, 64, 65, 200] {
            assert_eq!(
                block_hash(42, &toks[..n]),
                xxh3_64_with_seed(&bytes[..4 * n], ENGINE_HASH_SEED ^ 42),
                "{n} tokens"
            );
        }
    }

    #[test]
    fn output_tokens_are_deterministic_and_in_range() {
        for i in 0..1000 {
            let t = output_token(42, i, 1000);
            assert!(t < 1000);
            assert_eq!(t, output_token(42, i, 1000));
        }
        assert_ne!(
            (0..16)
                .map(|i| output_token(1, i, 50_000))
                .collect::<Vec<_>>(),
            (0..16)
                .map(|i| output_token(2, i, 50_000))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn rng_is_deterministic_and_roughly_uniform() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut r = Rng::new(1);
        let n = 100_000;
        let mean: f64 = (0..n).map(|_| r.exp(2.0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        let mut counts = [0u32; 10];
        for _ in 0..n {
            counts[r.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)));
    }
}
