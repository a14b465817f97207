//! The KV block pool: reference-counted blocks, the LRU queue of free blocks and the prefix
//! cache (block hash → blocks), modelled on vLLM v1's `BlockPool`.
//!
//! - Every block is either in use (`ref_cnt > 0`) or in the **free queue**, a doubly linked list
//!   in eviction order (head = least recently freed). Free blocks keep their cached contents
//!   until they are reused.
//! - Allocation pops from the head; a popped block that still holds a cached hash is evicted
//!   from the prefix cache first.
//! - A cache hit on a free block takes it out of the queue ("touch"); freeing appends to the
//!   tail (the engine frees a request's blocks last-block-first, as vLLM does, so a prompt's
//!   tail is evicted before its shared head).
//! - Two requests computing the same block at the same time (a chunked prefill racing another)
//!   both register it, as vLLM does; the cache maps a hash to the chain of blocks holding it.
//!
//! **Events.** `BlockStored` is emitted (by the engine, which knows the tokens) when a hash
//! becomes present, `BlockRemoved` when its last copy is evicted, `AllBlocksCleared` on reset.
//! vLLM also emits `BlockStored`/`BlockRemoved` for the duplicate copies; the simulator does
//! not, so that its event stream describes exactly the set of hashes the engine holds (and a
//! consumer's index can be checked against [`BlockPool::cached_hashes`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use kinf_router::block_map::{BATCH, BlockMap};
use kinf_router::kv_events::{BlockRemoved, KvEvent, Medium};

/// No block.
pub(crate) const NIL: u32 = u32::MAX;

/// A hasher for keys that are already uniformly distributed 64-bit hashes.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        // Block hashes are uniform already; request ids are not (hashbrown takes its tag from
        // the top bits), so mix every key once.
        self.0 = crate::hash::mix64(n);
    }
}

pub(crate) type IdMap<V> = HashMap<u64, V, BuildHasherDefault<IdHasher>>;

#[derive(Debug, Clone, Copy)]
struct Block {
    ref_cnt: u32,
    /// Free-queue links (valid while `ref_cnt == 0`).
    prev: u32,
    next: u32,
    /// Next block holding the same hash (cache chain).
    dup_next: u32,
    /// The cached hash, when `cached`.
    hash: u64,
    cached: bool,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    /// `n` blocks followed by the free queue's sentinel at index `n`.
    blocks: Vec<Block>,
    num_blocks: u32,
    num_free: u32,
    cache: BlockMap<u32>,
    emit: bool,
    events: Vec<KvEvent>,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: u32, emit: bool) -> Self {
        let n = num_blocks as usize;
        let mut blocks = Vec::with_capacity(n + 1);
        for i in 0..=num_blocks {
            blocks.push(Block {
                ref_cnt: 0,
                prev: if i == 0 { num_blocks } else { i - 1 },
                next: if i == num_blocks { 0 } else { i + 1 },
                dup_next: NIL,
                hash: 0,
                cached: false,
            });
        }
        if num_blocks == 0
            && let Some(s) = blocks.first_mut()
        {
            s.prev = 0;
            s.next = 0;
        }
        Self {
            blocks,
            num_blocks,
            num_free: num_blocks,
            cache: BlockMap::new(),
            emit,
            events: Vec::new(),
        }
    }

    #[inline]
    fn b(&self, i: u32) -> &Block {
        // Indices come from this pool; the fallback is never taken.
        self.blocks.get(i as usize).unwrap_or(&SENTINEL)
    }

    #[inline]
    fn bm(&mut self, i: u32) -> Option<&mut Block> {
        self.blocks.get_mut(i as usize)
    }

    pub(crate) fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub(crate) fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Distinct hashes held.
    pub(crate) fn num_cached(&self) -> usize {
        self.cache.len()
    }

    pub(crate) fn usage(&self) -> f64 {
        if self.num_blocks == 0 {
            0.0
        } else {
            1.0 - f64::from(self.num_free) / f64::from(self.num_blocks)
        }
    }

    pub(crate) fn emits(&self) -> bool {
        self.emit
    }

    /// A block holding `hash`, if any.
    #[cfg(test)]
    pub(crate) fn lookup(&self, hash: u64) -> Option<u32> {
        self.cache.get(hash)
    }

    /// Calls `f` with a block for each leading hash of `hashes` that is cached, stopping at the
    /// first that is not. Looks the hashes up [`BATCH`] at a time, so that their memory
    /// accesses overlap.
    pub(crate) fn for_each_cached_prefix(&self, hashes: &[u64], mut f: impl FnMut(u32)) {
        self.cache.for_each_leading(hashes, BATCH, |b| {
            f(b);
            true
        });
    }

    #[inline]
    pub(crate) fn ref_cnt(&self, block: u32) -> u32 {
        self.b(block).ref_cnt
    }

    #[inline]
    fn unlink_free(&mut self, i: u32) {
        let Block { prev, next, .. } = *self.b(i);
        if let Some(p) = self.bm(prev) {
            p.next = next;
        }
        if let Some(n) = self.bm(next) {
            n.prev = prev;
        }
        self.num_free -= 1;
    }

    #[inline]
    fn push_free_tail(&mut self, i: u32) {
        let s = self.num_blocks;
        let tail = self.b(s).prev;
        if let Some(b) = self.bm(i) {
            b.prev = tail;
            b.next = s;
        }
        if let Some(t) = self.bm(tail) {
            t.next = i;
        }
        if let Some(sent) = self.bm(s) {
            sent.prev = i;
        }
        self.num_free += 1;
    }

    /// Takes a reference on `block` (a cache hit), removing it from the free queue if needed.
    #[inline]
    pub(crate) fn touch(&mut self, block: u32) {
        if self.b(block).ref_cnt == 0 {
            self.unlink_free(block);
        }
        if let Some(b) = self.bm(block) {
            b.ref_cnt += 1;
        }
    }

    /// Allocates a block from the free queue's head, evicting its cached hash if any.
    /// `None` when no block is free.
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        if self.num_free == 0 {
            return None;
        }
        let head = self.b(self.num_blocks).next;
        self.unlink_free(head);
        if self.b(head).cached {
            self.uncache(head);
        }
        if let Some(b) = self.bm(head) {
            b.ref_cnt = 1;
        }
        Some(head)
    }

    /// Drops a reference; a block reaching zero goes to the free queue's tail.
    #[inline]
    pub(crate) fn free(&mut self, block: u32) {
        let Some(b) = self.bm(block) else { return };
        if b.ref_cnt == 0 {
            return;
        }
        b.ref_cnt -= 1;
        if b.ref_cnt == 0 {
            self.push_free_tail(block);
        }
    }

    /// Registers `block` as holding `hash`. Returns whether the hash was new to the cache (the
    /// caller then emits `BlockStored`).
    #[inline]
    pub(crate) fn cache(&mut self, block: u32, hash: u64) -> bool {
        if self.b(block).cached {
            return false;
        }
        let (fresh, next) = match self.cache.get_mut(hash) {
            Some(head) => {
                let old = *head;
                *head = block;
                (false, old)
            }
            None => {
                self.cache.insert(hash, block);
                (true, NIL)
            }
        };
        if let Some(b) = self.bm(block) {
            b.cached = true;
            b.hash = hash;
            b.dup_next = next;
        }
        fresh
    }

    /// Removes `block` from the prefix cache; emits `BlockRemoved` if it was the hash's last
    /// copy.
    fn uncache(&mut self, block: u32) {
        let Block { hash, dup_next, .. } = *self.b(block);
        if let Some(b) = self.bm(block) {
            b.cached = false;
            b.dup_next = NIL;
        }
        let Some(head) = self.cache.get(hash) else {
            return;
        };
        if head == block {
            if dup_next == NIL {
                self.cache.remove(hash);
                if self.emit {
                    let mut r = BlockRemoved {
                        medium: Some(Medium::Gpu),
                        group_idx: Some(0),
                        ..BlockRemoved::default()
                    };
                    r.block_hashes.push(hash);
                    self.events.push(KvEvent::BlockRemoved(r));
                }
            } else if let Some(h) = self.cache.get_mut(hash) {
                *h = dup_next;
            }
            return;
        }
        // Unlink from the middle of the chain.
        let mut cur = head;
        while cur != NIL {
            let nxt = self.b(cur).dup_next;
            if nxt == block {
                if let Some(c) = self.bm(cur) {
                    c.dup_next = dup_next;
                }
                return;
            }
            cur = nxt;
        }
    }

    /// Drops the whole prefix cache if no block is in use (vLLM's `reset_prefix_cache`).
    /// Returns whether it did.
    pub(crate) fn reset(&mut self) -> bool {
        if self.num_free != self.num_blocks {
            return false;
        }
        self.cache.clear();
        for b in &mut self.blocks {
            b.cached = false;
            b.dup_next = NIL;
        }
        if self.emit {
            self.events.push(KvEvent::AllBlocksCleared);
        }
        true
    }

    pub(crate) fn push_event(&mut self, e: KvEvent) {
        if self.emit {
            self.events.push(e);
        }
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub(crate) fn take_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.events)
    }

    /// Every distinct hash held, sorted.
    pub(crate) fn cached_hashes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.cache.iter().map(|(h, _)| h).collect();
        v.sort_unstable();
        v
    }

    /// Checks the pool's invariants (tests and debugging): the free queue is a consistent list
    /// of exactly the blocks with `ref_cnt == 0`, and every cache chain holds exactly the
    /// cached blocks of its hash.
    pub(crate) fn check(&self) -> Result<(), String> {
        let s = self.num_blocks;
        let mut seen = 0u32;
        let mut cur = self.b(s).next;
        let mut prev = s;
        while cur != s {
            let b = self.b(cur);
            if b.ref_cnt != 0 {
                return Err(format!(
                    "block {cur} in the free queue with ref_cnt {}",
                    b.ref_cnt
                ));
            }
            if b.prev != prev {
                return Err(format!("block {cur}: broken prev link"));
            }
            seen += 1;
            if seen > self.num_blocks {
                return Err("free queue has a cycle".into());
            }
            prev = cur;
            cur = b.next;
        }
        if seen != self.num_free {
            return Err(format!(
                "free queue has {seen} blocks, num_free {}",
                self.num_free
            ));
        }
        let zero = self
            .blocks
            .iter()
            .take(s as usize)
            .filter(|b| b.ref_cnt == 0);
        if zero.count() != seen as usize {
            return Err("free queue differs from the blocks with ref_cnt 0".into());
        }
        let mut chained = 0usize;
        for (h, head) in self.cache.iter() {
            let mut cur = head;
            while cur != NIL {
                let b = self.b(cur);
                if !b.cached || b.hash != h {
                    return Err(format!("block {cur} chained under a hash it does not hold"));
                }
                chained += 1;
                if chained > self.num_blocks as usize {
                    return Err("cache chain has a cycle".into());
                }
                cur = b.dup_next;
            }
        }
        let cached = self.blocks.iter().take(s as usize).filter(|b| b.cached);
        if cached.count() != chained {
            return Err("cached blocks differ from the cache chains".into());
        }
        Ok(())
    }
}

const SENTINEL: Block = Block {
    ref_cnt: 0,
    prev: NIL,
    next: NIL,
    dup_next: NIL,
    hash: 0,
    cached: false,
};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn removed(events: &[KvEvent]) -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| match e {
                KvEvent::BlockRemoved(r) => Some(r.block_hashes.to_vec()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn lru_evicts_free_blocks_in_free_order_and_skips_referenced_ones() {
        let mut p = BlockPool::new(4, true);
        let blocks: Vec<u32> = (0..4).map(|_| p.alloc().unwrap()).collect();
        assert_eq!(p.num_free(), 0);
        assert!(p.alloc().is_none());
        for (i, &b) in blocks.iter().enumerate() {
            assert!(p.cache(b, 100 + i as u64));
        }
        // A second reference on block 0 (a cache hit by another request).
        p.touch(blocks[0]);
        // Free in the order 3, 2, 1, 0 (a request frees its last block first).
        for &b in blocks.iter().rev() {
            p.free(b);
        }
        // Block 0 still has a reference: not free.
        assert_eq!(p.num_free(), 3);
        p.check().unwrap();
        // Allocation evicts the least recently freed first: 103, then 102.
        let a = p.alloc().unwrap();
        assert_eq!(a, blocks[3]);
        assert_eq!(removed(&p.take_events()), vec![103]);
        // A hit on 101 (free) takes it out of the queue; the next eviction is 102, then the
        // queue is empty although block 0 is cached (it is referenced).
        p.touch(blocks[1]);
        assert_eq!(p.alloc().unwrap(), blocks[2]);
        assert_eq!(removed(&p.take_events()), vec![102]);
        assert!(p.alloc().is_none());
        assert_eq!(p.lookup(100), Some(blocks[0]));
        assert_eq!(p.lookup(101), Some(blocks[1]));
        assert_eq!(p.cached_hashes(), vec![100, 101]);
        p.check().unwrap();
        // Releasing block 0's remaining reference frees it; an extra release is ignored.
        p.free(blocks[0]);
        assert_eq!(p.num_free(), 1);
        p.free(blocks[0]);
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.alloc().unwrap(), blocks[0]);
        assert_eq!(removed(&p.take_events()), vec![100]);
        p.check().unwrap();
    }

    #[test]
    fn duplicates_keep_the_hash_until_the_last_copy_goes() {
        let mut p = BlockPool::new(2, true);
        let a = p.alloc().unwrap();
        let b = p.alloc().unwrap();
        assert!(p.cache(a, 7));
        assert!(!p.cache(b, 7));
        p.check().unwrap();
        p.free(a);
        p.free(b);
        assert_eq!(p.alloc().unwrap(), a);
        assert!(p.take_events().is_empty(), "a copy remains");
        assert_eq!(p.lookup(7), Some(b));
        assert_eq!(p.alloc().unwrap(), b);
        assert_eq!(removed(&p.take_events()), vec![7]);
        assert_eq!(p.lookup(7), None);
        p.check().unwrap();
    }

    #[test]
    fn reset_needs_every_block_free() {
        let mut p = BlockPool::new(2, true);
        let a = p.alloc().unwrap();
        p.cache(a, 1);
        assert!(!p.reset());
        p.free(a);
        assert!(p.reset());
        assert_eq!(p.take_events(), vec![KvEvent::AllBlocksCleared]);
        assert_eq!(p.num_cached(), 0);
        p.check().unwrap();
    }
}
