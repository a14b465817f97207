//! The KV block pool: reference-counted blocks, the LRU queue of free blocks and the prefix
//! cache (block hash → blocks), modelled on vLLM v1's `BlockPool`.
//!
//! - Every block is either in use (`ref_cnt > 0`) or in the **free queue**, in eviction order
//!   (head = least recently freed). Free blocks keep their cached contents until they are
//!   reused.
//! - Allocation pops from the head; a popped block that still holds a cached hash is evicted
//!   from the prefix cache first.
//! - A cache hit on a free block takes it out of the queue ("touch"); freeing appends to the
//!   tail (the engine frees a request's blocks last-block-first, as vLLM does, so a prompt's
//!   tail is evicted before its shared head).
//! - vLLM's queue is a doubly linked list, so a touch unlinks the block from its neighbours:
//!   three scattered memory accesses, which in a fleet of engines are cache misses. Here the
//!   queue is a ring of `(block, sequence number)` entries with **lazy removal**: freeing
//!   stamps the block with a new sequence number and appends an entry; a touch only takes the
//!   reference, which makes the block's entry stale; allocation pops entries from the head and
//!   skips the stale ones (a block in use, or freed again later under a newer number). The
//!   order of eviction is exactly the linked list's.
//! - Two requests computing the same block at the same time (a chunked prefill racing another)
//!   both register it, as vLLM does; the cache maps a hash to the chain of blocks holding it.
//!
//! **Events.** `BlockStored` is emitted (by the engine, which knows the tokens) when a hash
//! becomes present, `BlockRemoved` when its last copy is evicted, `AllBlocksCleared` on reset.
//! vLLM also emits `BlockStored`/`BlockRemoved` for the duplicate copies; the simulator does
//! not, so that its event stream describes exactly the set of hashes the engine holds (and a
//! consumer's index can be checked against [`BlockPool::cached_hashes`]).

use std::collections::{HashMap, VecDeque};
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
    /// Sequence number of the block's live free-queue entry (meaningful while `ref_cnt == 0`).
    free_seq: u32,
    /// Next block holding the same hash (cache chain).
    dup_next: u32,
    cached: bool,
    /// The cached hash, when `cached`.
    hash: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    num_blocks: u32,
    num_free: u32,
    /// The free queue: `(block, sequence number)`, head first; an entry is live iff its block
    /// is free and still stamped with its number, else stale (skipped when popped).
    free_queue: VecDeque<(u32, u32)>,
    /// The next sequence number. It wraps, harmlessly: the queue never holds more than
    /// `2 × num_blocks + 64` entries, so an entry leaves it (popped or compacted away) fewer
    /// than `4 × num_blocks + 128` appends after its own, far fewer than 2³².
    next_seq: u32,
    cache: BlockMap<u32>,
    emit: bool,
    events: Vec<KvEvent>,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: u32, emit: bool) -> Self {
        // Block `i` starts free with sequence number `i`: the queue holds them in order.
        let blocks = (0..num_blocks)
            .map(|i| Block {
                ref_cnt: 0,
                free_seq: i,
                dup_next: NIL,
                cached: false,
                hash: 0,
            })
            .collect();
        Self {
            blocks,
            num_blocks,
            num_free: num_blocks,
            free_queue: (0..num_blocks).map(|i| (i, i)).collect(),
            next_seq: num_blocks,
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

    /// Takes a reference on `block` (a cache hit), taking it out of the free queue if needed
    /// (its entry goes stale).
    #[inline]
    pub(crate) fn touch(&mut self, block: u32) {
        let Some(b) = self.blocks.get_mut(block as usize) else {
            return;
        };
        if b.ref_cnt == 0 {
            self.num_free -= 1;
        }
        b.ref_cnt += 1;
    }

    /// Whether a free-queue entry is live.
    #[inline]
    fn is_live(&self, (block, seq): (u32, u32)) -> bool {
        let b = self.b(block);
        b.ref_cnt == 0 && b.free_seq == seq
    }

    /// Allocates a block from the free queue's head, evicting its cached hash if any.
    /// `None` when no block is free.
    #[inline]
    pub(crate) fn alloc(&mut self) -> Option<u32> {
        if self.num_free == 0 {
            return None;
        }
        // `num_free > 0`: a live entry is in the queue, so this stops before it runs dry.
        let head = loop {
            let entry = self.free_queue.pop_front()?;
            if self.is_live(entry) {
                break entry.0;
            }
        };
        self.num_free -= 1;
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
        let Some(b) = self.blocks.get_mut(block as usize) else {
            return;
        };
        if b.ref_cnt == 0 {
            return;
        }
        b.ref_cnt -= 1;
        if b.ref_cnt == 0 {
            let seq = self.next_seq;
            b.free_seq = seq;
            self.next_seq = seq.wrapping_add(1);
            self.num_free += 1;
            self.free_queue.push_back((block, seq));
            if self.free_queue.len() > 2 * self.num_blocks as usize + 64 {
                self.compact_free_queue();
            }
        }
    }

    /// Drops the stale entries of the free queue (amortised: it runs once the queue is over
    /// twice the pool, and leaves at most the pool's size).
    fn compact_free_queue(&mut self) {
        let mut queue = std::mem::take(&mut self.free_queue);
        queue.retain(|&e| self.is_live(e));
        self.free_queue = queue;
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
        let mut seen = vec![false; self.num_blocks as usize];
        let mut live = 0u32;
        for &(block, seq) in &self.free_queue {
            let b = self
                .blocks
                .get(block as usize)
                .ok_or_else(|| format!("free queue entry for unknown block {block}"))?;
            if b.ref_cnt != 0 || b.free_seq != seq {
                continue; // stale
            }
            let slot = seen.get_mut(block as usize);
            if slot.as_deref() == Some(&true) {
                return Err(format!("block {block} live twice in the free queue"));
            }
            if let Some(x) = slot {
                *x = true;
            }
            live += 1;
        }
        if live != self.num_free {
            return Err(format!(
                "free queue has {live} live entries, num_free {}",
                self.num_free
            ));
        }
        let unqueued = self
            .blocks
            .iter()
            .zip(&seen)
            .any(|(b, &queued)| b.ref_cnt == 0 && !queued);
        if unqueued {
            return Err("a block with ref_cnt 0 is not in the free queue".into());
        }
        if self.free_queue.len() > 2 * self.num_blocks as usize + 64 {
            return Err("free queue not compacted".into());
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
        let cached = self.blocks.iter().filter(|b| b.cached);
        if cached.count() != chained {
            return Err("cached blocks differ from the cache chains".into());
        }
        Ok(())
    }
}

const SENTINEL: Block = Block {
    ref_cnt: 0,
    free_seq: 0,
    dup_next: NIL,
    cached: false,
    hash: 0,
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

    /// vLLM's free queue, as a list: free appends, a touch removes from anywhere, allocation
    /// pops the head.
    #[derive(Default)]
    struct ListModel {
        queue: std::collections::VecDeque<u32>,
        refs: Vec<u32>,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc,
        Touch(usize),
        Free(usize),
        /// A hit on a block and its release, repeated: stale entries pile up.
        HitAndRelease(usize, u32),
    }

    use proptest::prelude::*;

    proptest! {
        /// The lazily pruned ring evicts in exactly the linked list's order, through enough
        /// touches and frees to compact the ring many times.
        #[test]
        fn free_queue_evicts_as_the_linked_list_does(
            n in 1u32..12,
            ops in proptest::collection::vec(
                prop_oneof![
                    2 => Just(Op::Alloc),
                    3 => (0usize..64).prop_map(Op::Touch),
                    3 => (0usize..64).prop_map(Op::Free),
                    1 => (0usize..64, 1u32..60).prop_map(|(i, k)| Op::HitAndRelease(i, k)),
                ],
                1..400,
            ),
        ) {
            let mut p = BlockPool::new(n, false);
            let mut m = ListModel {
                queue: (0..n).collect(),
                refs: vec![0; n as usize],
            };
            for op in ops {
                match op {
                    Op::Alloc => {
                        let want = m.queue.pop_front();
                        if let Some(b) = want {
                            m.refs[b as usize] = 1;
                        }
                        prop_assert_eq!(p.alloc(), want);
                    }
                    Op::Touch(i) => {
                        let b = (i % n as usize) as u32;
                        if m.refs[b as usize] == 0 {
                            m.queue.retain(|&x| x != b);
                        }
                        m.refs[b as usize] += 1;
                        p.touch(b);
                    }
                    Op::Free(i) => {
                        let b = (i % n as usize) as u32;
                        if m.refs[b as usize] > 0 {
                            m.refs[b as usize] -= 1;
                            if m.refs[b as usize] == 0 {
                                m.queue.push_back(b);
                            }
                        }
                        p.free(b);
                    }
                    Op::HitAndRelease(i, k) => {
                        let b = (i % n as usize) as u32;
                        for _ in 0..k {
                            if m.refs[b as usize] == 0 {
                                m.queue.retain(|&x| x != b);
                            }
                            m.refs[b as usize] += 1;
                            p.touch(b);
                            m.refs[b as usize] -= 1;
                            if m.refs[b as usize] == 0 {
                                m.queue.push_back(b);
                            }
                            p.free(b);
                        }
                    }
                }
                prop_assert_eq!(p.num_free() as usize, m.queue.len());
                prop_assert_eq!(p.check(), Ok(()));
            }
        }
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
