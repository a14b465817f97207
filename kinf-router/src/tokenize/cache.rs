//! A bounded, sharded cache of token ids per text segment.
//!
//! Key: XXH3-64 of the segment's bytes, its length and an encoder variant. Two different
//! segments of the same length colliding on 64 bits would return wrong ids; at 2⁻⁶⁴ per pair
//! this is accepted, as in every hash-keyed prefix cache.
//!
//! Eviction: CLOCK (second chance) per shard, against a byte budget (ids × 4 + a fixed
//! per-entry overhead). Concurrency: 16 shards, each a `parking_lot::Mutex`, chosen by the top
//! bits of the hash. A lock is held only for a map lookup or insert and an `Arc` clone — never
//! while tokenizing or copying ids — so threads rarely wait. Two threads missing the same segment
//! at once both tokenize it; the second insert is a no-op.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

const SHARDS: usize = 16;
/// Bytes charged per entry on top of its ids (map slot, ring slot, `Arc` header).
const ENTRY_OVERHEAD: usize = 64;

/// Identifies a segment: content hash, byte length, encoder variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub hash: u64,
    pub len: u64,
    pub variant: u8,
}

#[derive(Debug)]
struct Entry {
    ids: Arc<[u32]>,
    referenced: bool,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<Key, Entry, ahash::RandomState>,
    /// CLOCK order: front is the next eviction candidate.
    ring: VecDeque<Key>,
    bytes: usize,
}

/// Cache counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Segment lookups answered from the cache.
    pub hits: u64,
    /// Segment lookups that had to tokenize.
    pub misses: u64,
    /// Segments evicted to stay within the budget.
    pub evictions: u64,
    /// Segments held now.
    pub entries: u64,
    /// Bytes charged now (ids × 4 + per-entry overhead).
    pub bytes: u64,
    /// The byte budget.
    pub budget: u64,
}

#[derive(Debug)]
pub(crate) struct SegmentCache {
    shards: Box<[Mutex<Shard>]>,
    shard_budget: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

fn cost(ids: usize) -> usize {
    ids.saturating_mul(4).saturating_add(ENTRY_OVERHEAD)
}

impl SegmentCache {
    /// A cache holding at most about `budget_bytes`; 0 disables it.
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            shard_budget: budget_bytes / SHARDS,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.shard_budget > ENTRY_OVERHEAD
    }

    fn shard(&self, key: &Key) -> &Mutex<Shard> {
        // Top bits of the hash; the map inside uses its own hasher.
        let i = (key.hash >> 60) as usize % SHARDS;
        &self.shards[i]
    }

    /// The ids of `key`, marking it recently used.
    pub(crate) fn get(&self, key: &Key) -> Option<Arc<[u32]>> {
        let found = {
            let mut shard = self.shard(key).lock();
            shard.map.get_mut(key).map(|e| {
                e.referenced = true;
                Arc::clone(&e.ids)
            })
        };
        let counter = if found.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        found
    }

    /// Stores `ids` under `key`, evicting as needed; too large segments are not stored.
    pub(crate) fn insert(&self, key: Key, ids: Arc<[u32]>) {
        let c = cost(ids.len());
        if c > self.shard_budget {
            return;
        }
        let mut evicted = 0u64;
        {
            let mut guard = self.shard(&key).lock();
            let shard = &mut *guard;
            if shard.map.contains_key(&key) {
                return;
            }
            while shard.bytes + c > self.shard_budget {
                let Some(victim) = shard.ring.pop_front() else {
                    break;
                };
                match shard.map.get_mut(&victim) {
                    Some(e) if e.referenced => {
                        e.referenced = false;
                        shard.ring.push_back(victim);
                    }
                    Some(_) => {
                        if let Some(e) = shard.map.remove(&victim) {
                            shard.bytes -= cost(e.ids.len());
                            evicted += 1;
                        }
                    }
                    None => {}
                }
            }
            shard.map.insert(
                key,
                Entry {
                    ids,
                    referenced: false,
                },
            );
            shard.ring.push_back(key);
            shard.bytes += c;
        }
        if evicted > 0 {
            self.evictions.fetch_add(evicted, Ordering::Relaxed);
        }
    }

    /// Drops every entry (counters are kept).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            s.map.clear();
            s.ring.clear();
            s.bytes = 0;
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let (mut entries, mut bytes) = (0u64, 0u64);
        for shard in self.shards.iter() {
            let s = shard.lock();
            entries += s.map.len() as u64;
            bytes += s.bytes as u64;
        }
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries,
            bytes,
            budget: (self.shard_budget * SHARDS) as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn key(hash: u64) -> Key {
        Key {
            hash,
            len: 1,
            variant: 0,
        }
    }

    #[test]
    fn evicts_within_budget_and_spares_referenced() {
        // One shard's budget fits 3 entries of 10 ids (10*4+64 = 104 bytes each).
        let cache = SegmentCache::new(SHARDS * 320);
        let ids: Arc<[u32]> = Arc::from(vec![7u32; 10]);
        // All keys land in shard 0 (top 4 bits zero).
        for h in 1..=3 {
            cache.insert(key(h), Arc::clone(&ids));
        }
        assert!(cache.get(&key(1)).is_some()); // referenced: gets a second chance
        cache.insert(key(4), Arc::clone(&ids));
        assert!(cache.get(&key(1)).is_some());
        assert!(cache.get(&key(2)).is_none()); // the oldest unreferenced one went
        let s = cache.stats();
        assert_eq!(s.entries, 3);
        assert_eq!(s.evictions, 1);
        assert!(s.bytes <= 320);
        // Too large for a shard: not stored.
        cache.insert(key(9), Arc::from(vec![0u32; 100]));
        assert!(cache.get(&key(9)).is_none());
        cache.clear();
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn zero_budget_disables() {
        let cache = SegmentCache::new(0);
        assert!(!cache.enabled());
        cache.insert(key(1), Arc::from(vec![1u32]));
        assert!(cache.get(&key(1)).is_none());
    }
}
