//! The exact prefix index, fed by vLLM KV events.

use smallvec::SmallVec;

use crate::block_map::BlockMap;

use super::holders::{HolderStore, Holders, Removed, View, bit};
use super::slots::{Key, Slots};
use super::{EndpointId, chain_blocks, chain_root, chain_root_lora_id};
use crate::kv_events::{BlockRemoved, BlockStored, KvEvent, Medium};

/// Counters of a [`PrefixIndex`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Endpoints known to the index.
    pub endpoints: usize,
    /// Distinct blocks held by at least one endpoint.
    pub blocks: usize,
    /// `(endpoint, block)` pairs.
    pub pairs: usize,
    /// Stored blocks skipped because their parent's engine hash was unknown (e.g. after a
    /// sequence gap, or when the parent itself was orphaned or rejected).
    pub orphaned: u64,
    /// Stored blocks skipped because the event's `block_size` differs from the index's or
    /// `token_ids` is not `block_hashes × block_size` long.
    pub rejected: u64,
    /// Events skipped by the medium/group filter, or of an unknown type.
    pub ignored_events: u64,
    /// Removed engine hashes that the endpoint's map did not know.
    pub unknown_removals: u64,
}

/// Per-endpoint state: engine hash → own hash of every block the endpoint stored.
#[derive(Debug, Clone, Default)]
struct Endpoint {
    engine: BlockMap<u64>,
    pairs: usize,
}

/// Exact index of which endpoint caches which blocks, built from KV events.
///
/// Blocks are keyed by our own chained hash of their tokens (see the module docs); each block
/// records the set of endpoints holding it. Per endpoint an engine-hash → own-hash map resolves
/// `BlockRemoved` and the `parent_block_hash` of a `BlockStored`.
///
/// Semantics of [`apply`](Self::apply):
/// - `BlockStored`: the first block chains from the prompt root ([`chain_root`] of the event's
///   LoRA adapter) when `parent` is `None`, otherwise from the own hash the endpoint's map gives
///   for `parent`. If the parent is **unknown** (typically after a sequence gap, or because the
///   parent's store was itself skipped) the blocks cannot be placed in the chain: they are
///   counted as [`IndexStats::orphaned`] and skipped. A replay, or the next request that stores
///   the prefix again, repairs it.
/// - `BlockRemoved`: each engine hash is looked up in the endpoint's map and the endpoint is
///   dropped from that block.
/// - `AllBlocksCleared` wipes the endpoint.
/// - Only the primary cache is indexed: events whose `medium` is neither absent nor `"GPU"`, or
///   whose `group_idx` is neither absent nor the configured group (default 0, see
///   [`with_kv_group`](Self::with_kv_group)), are ignored.
///
/// Blocks with equal tokens but different engine hashes (multimodal inputs or cache salts hash
/// the same tokens differently in vLLM) share one own hash; removing either removes the block,
/// so the index can under-estimate in that case, never invent a block an endpoint never stored.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    block_size: usize,
    group: Option<u32>,
    blocks: BlockMap<Holders>,
    store: HolderStore,
    endpoints: Slots<Endpoint>,
    pairs: usize,
    orphaned: u64,
    rejected: u64,
    ignored_events: u64,
    unknown_removals: u64,
}

/// Slots kept on the stack while matching; more spill to the heap.
const INLINE_ACTIVE: usize = 16;
/// Request blocks looked up together while matching ([`PrefixIndex::match_prefix`]).
const LOOKAHEAD: usize = 8;

impl PrefixIndex {
    /// An empty index for engines with `block_size` tokens per block (0 is taken as 1).
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            group: Some(0),
            blocks: BlockMap::new(),
            store: HolderStore::default(),
            endpoints: Slots::default(),
            pairs: 0,
            orphaned: 0,
            rejected: 0,
            ignored_events: 0,
            unknown_removals: 0,
        }
    }

    /// Indexes only KV-cache group `group` (events without `group_idx` always count);
    /// `None` indexes every group. The default is group 0.
    pub fn with_kv_group(mut self, group: Option<u32>) -> Self {
        self.group = group;
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    fn accepts(&self, medium: Option<&Medium>, group: Option<u32>) -> bool {
        let medium_ok = matches!(medium, None | Some(Medium::Gpu));
        let group_ok = match (self.group, group) {
            (None, _) | (_, None) => true,
            (Some(want), Some(g)) => want == g,
        };
        medium_ok && group_ok
    }

    /// Whether a `BlockStored` is of the cache this index tracks (its medium and KV-cache
    /// group; its block size is not looked at).
    pub fn accepts_stored(&self, s: &BlockStored) -> bool {
        self.accepts(s.medium.as_ref(), s.group_idx)
    }

    /// Applies one event published by endpoint `ep` (registering `ep` on first sight).
    pub fn apply(&mut self, ep: EndpointId, event: &KvEvent) {
        self.apply_with(ep, event, &mut |_| {});
    }

    /// Like [`apply`](Self::apply), calling `on_stored` with the own hash of every block a
    /// `BlockStored` places for `ep`.
    pub fn apply_with(&mut self, ep: EndpointId, event: &KvEvent, on_stored: &mut impl FnMut(u64)) {
        self.apply_key((ep, 0), event, on_stored);
    }

    fn apply_key(&mut self, key: Key, event: &KvEvent, on_stored: &mut impl FnMut(u64)) {
        match event {
            KvEvent::BlockStored(s) => {
                if self.accepts(s.medium.as_ref(), s.group_idx) {
                    self.stored(key, s, on_stored);
                } else {
                    self.ignored_events += 1;
                }
            }
            KvEvent::BlockRemoved(r) => {
                if self.accepts(r.medium.as_ref(), r.group_idx) {
                    self.removed(key, r);
                } else {
                    self.ignored_events += 1;
                }
            }
            KvEvent::AllBlocksCleared => self.clear_key(key),
            KvEvent::Unknown(_) => self.ignored_events += 1,
        }
    }

    /// Applies every event of a batch, in order.
    pub fn apply_all(&mut self, ep: EndpointId, events: &[KvEvent]) {
        self.apply_all_with(ep, events, |_| {});
    }

    /// Like [`apply_all`](Self::apply_all), with [`apply_with`](Self::apply_with)'s
    /// `on_stored`.
    pub fn apply_all_with(
        &mut self,
        ep: EndpointId,
        events: &[KvEvent],
        on_stored: impl FnMut(u64),
    ) {
        self.apply_rank_all_with(ep, 0, events, on_stored);
    }

    /// Like [`apply_all_with`](Self::apply_all_with), for the events of data-parallel rank
    /// `rank` of endpoint `ep`. Each rank of an endpoint has a cache and an event stream of
    /// its own: its blocks are tracked apart from the other ranks' (a rank's `BlockRemoved` or
    /// `AllBlocksCleared` leaves the blocks the others hold), and a match reports the endpoint
    /// once per rank holding the prompt's first block (take the deepest). Rank 0 is what
    /// [`apply`](Self::apply) and the other rank-less methods apply to.
    pub fn apply_rank_all_with(
        &mut self,
        ep: EndpointId,
        rank: u32,
        events: &[KvEvent],
        mut on_stored: impl FnMut(u64),
    ) {
        for e in events {
            self.apply_key((ep, rank), e, &mut on_stored);
        }
    }

    fn stored(&mut self, key: Key, s: &BlockStored, on_stored: &mut impl FnMut(u64)) {
        let bs = self.block_size;
        let n = s.block_hashes.len();
        if s.block_size as usize != bs || Some(s.token_ids.len()) != n.checked_mul(bs) {
            self.rejected += n as u64;
            return;
        }
        let Some(slot) = self.endpoints.slot_or_insert(key, Endpoint::default) else {
            self.ignored_events += 1;
            return;
        };
        let Self {
            blocks,
            store,
            endpoints,
            pairs,
            orphaned,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        let parent = match s.parent {
            None => match (&s.lora_name, s.lora_id) {
                (Some(name), _) => chain_root(Some(name)),
                (None, Some(id)) => chain_root_lora_id(id),
                (None, None) => chain_root(None),
            },
            Some(p) => match state.engine.get(p) {
                Some(own) => own,
                None => {
                    *orphaned += n as u64;
                    return;
                }
            },
        };
        let mut engines = s.block_hashes.iter();
        chain_blocks(parent, &s.token_ids, bs, |own| {
            let Some(&engine) = engines.next() else {
                return;
            };
            if let Some(old) = state.engine.insert(engine, own)
                && old != own
                && remove_pair(blocks, store, slot, old)
            {
                *pairs -= 1;
                state.pairs -= 1;
            }
            let (holders, inserted) = blocks.get_or_insert_with(own, || Holders::one(slot));
            let added = inserted || store.insert(holders, slot);
            if added {
                *pairs += 1;
                state.pairs += 1;
            }
            on_stored(own);
        });
    }

    fn removed(&mut self, key: Key, r: &BlockRemoved) {
        let Some(slot) = self.endpoints.slot(key) else {
            self.unknown_removals += r.block_hashes.len() as u64;
            return;
        };
        let Self {
            blocks,
            store,
            endpoints,
            pairs,
            unknown_removals,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        for engine in &r.block_hashes {
            match state.engine.remove(*engine) {
                Some(own) => {
                    if remove_pair(blocks, store, slot, own) {
                        *pairs -= 1;
                        state.pairs -= 1;
                    }
                }
                None => *unknown_removals += 1,
            }
        }
        // Hash tables never shrink by themselves: give memory back once three quarters of a
        // table are free (rehashing then is amortised over the removals that emptied it).
        shrink_if_sparse(&mut state.engine);
        shrink_if_sparse(blocks);
    }

    /// Forgets every block of `ep`, of all its ranks, but keeps it registered (as
    /// `AllBlocksCleared` does for one rank).
    pub fn clear_endpoint(&mut self, ep: EndpointId) {
        for slot in self.endpoints.slots_of(ep) {
            self.clear_slot(slot);
        }
    }

    /// Forgets every block of data-parallel rank `rank` of `ep` (see
    /// [`apply_rank_all_with`](Self::apply_rank_all_with)); the other ranks keep theirs.
    pub fn clear_rank(&mut self, ep: EndpointId, rank: u32) {
        self.clear_key((ep, rank));
    }

    fn clear_key(&mut self, key: Key) {
        if let Some(slot) = self.endpoints.slot(key) {
            self.clear_slot(slot);
        }
    }

    fn clear_slot(&mut self, slot: u32) {
        let Self {
            blocks,
            store,
            endpoints,
            pairs,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        // Replace the map (rather than clear it) so that its capacity is released.
        let engine = std::mem::take(&mut state.engine);
        for (_, own) in engine.iter() {
            if remove_pair(blocks, store, slot, own) {
                *pairs -= 1;
            }
        }
        state.pairs = 0;
    }

    /// Forgets `ep` entirely (all its ranks); its slots are reused by later endpoints.
    pub fn remove_endpoint(&mut self, ep: EndpointId) {
        for slot in self.endpoints.slots_of(ep) {
            self.clear_slot(slot);
            let key = self.endpoints.key(slot);
            self.endpoints.remove(key);
        }
    }

    /// Renames the endpoints the index knows: `remap(id)` is the endpoint's new id, or `None`
    /// to forget it ([`remove_endpoint`](Self::remove_endpoint)). What the others hold is kept
    /// under their new ids, engine-hash maps included, so that later `BlockStored` events
    /// still chain onto the blocks stored before (for a worker set whose endpoint list changed:
    /// ids are positions in it). Two endpoints given the same new id: the later one is
    /// forgotten. Cost: the forgotten endpoints' blocks plus one step per endpoint.
    pub fn remap_endpoints(&mut self, remap: impl FnMut(EndpointId) -> Option<EndpointId>) {
        let (drop, rename) = super::slots::plan_remap(self.endpoints(), remap);
        for id in drop {
            self.remove_endpoint(id);
        }
        self.endpoints
            .rename(|id| rename.get(&id).copied().unwrap_or(id));
    }

    /// Forgets everything (keeps the configuration and the cumulative counters).
    pub fn clear(&mut self) {
        self.blocks = BlockMap::new();
        self.store.clear();
        self.endpoints = Slots::default();
        self.pairs = 0;
    }

    /// The slots of `ep`, one per rank.
    fn slots_of(&self, ep: EndpointId) -> Vec<u32> {
        self.endpoints.slots_of(ep)
    }

    /// Whether `ep` (any of its ranks) holds the block with own hash `own`.
    pub fn contains(&self, ep: EndpointId, own: u64) -> bool {
        let Some(h) = self.blocks.get(own) else {
            return false;
        };
        let held = self.store.view(h);
        self.slots_of(ep)
            .into_iter()
            .any(|slot| held.contains(slot))
    }

    /// The engine hashes of the blocks `ep` holds (all ranks), sorted and distinct: what the
    /// engine itself would list (for checking the index against an engine's ground truth;
    /// costs a pass over the maps).
    pub fn engine_hashes(&self, ep: EndpointId) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .slots_of(ep)
            .into_iter()
            .filter_map(|s| self.endpoints.get(s))
            .flat_map(|e| e.engine.iter().map(|(k, _)| k))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Number of blocks `ep` holds (0 if unknown), summed over its ranks.
    pub fn endpoint_blocks(&self, ep: EndpointId) -> usize {
        self.slots_of(ep)
            .into_iter()
            .filter_map(|s| self.endpoints.get(s))
            .map(|e| e.pairs)
            .sum()
    }

    /// The endpoints the index knows, sorted.
    pub fn endpoints(&self) -> impl Iterator<Item = EndpointId> + '_ {
        self.endpoints.endpoint_ids().into_iter()
    }

    /// For every endpoint holding at least the request's first block, the number of leading
    /// request blocks it holds (the longest held prefix, in blocks), written to `out` (cleared
    /// first; order unspecified).
    ///
    /// Walks `request_hashes` (from [`block_hashes`](super::block_hashes)) from the start,
    /// intersecting the set of endpoints still matching with each block's holders, and stops
    /// when none is left. Cost: one hash lookup per matched block plus, per block, the size of
    /// the smaller of the two sets (or a word-wise AND of two bitsets).
    pub fn match_prefix(&self, request_hashes: &[u64], out: &mut Vec<(EndpointId, u32)>) {
        out.clear();
        let Some(first) = request_hashes.first().and_then(|&h| self.blocks.get(h)) else {
            return;
        };
        let ids = self.endpoints.ids();
        let mut active = Active::new(self.store.view(first));
        // The table lookups of a few blocks are made before any of them is used
        // (`BlockMap::for_each_leading`): they do not depend on each other, so their cache
        // misses overlap instead of following one another (in a fleet-sized index nearly every
        // lookup is a miss). Lookups past the end of the match are wasted, at most
        // LOOKAHEAD - 1.
        let mut depth = 1;
        let rest = request_hashes.get(1..).unwrap_or(&[]);
        self.blocks.for_each_leading(rest, LOOKAHEAD, |holders| {
            active.intersect(self.store.view(holders), depth, ids, out);
            depth += 1;
            !active.is_empty()
        });
        // The walk ended at a block nobody left holds, or at the request's end (`depth` is
        // then its length); whoever is still active matched `depth` blocks.
        active.drain(depth, ids, out);
    }

    /// Counters and sizes.
    pub fn stats(&self) -> IndexStats {
        IndexStats {
            endpoints: self.endpoints.len(),
            blocks: self.blocks.len(),
            pairs: self.pairs,
            orphaned: self.orphaned,
            rejected: self.rejected,
            ignored_events: self.ignored_events,
            unknown_removals: self.unknown_removals,
        }
    }

    /// Estimated heap bytes held by the index (hash tables at their real bucket counts, holder
    /// sets, per-endpoint maps). Walks the holder arena: O(blocks held by ≥ 3 endpoints).
    pub fn memory_bytes(&self) -> usize {
        let per_endpoint: usize = self
            .endpoints
            .iter()
            .map(|(_, e)| e.engine.heap_bytes())
            .sum();
        std::mem::size_of::<Self>()
            + self.blocks.heap_bytes()
            + self.store.heap_bytes()
            + self.endpoints.heap_bytes()
            + per_endpoint
    }
}

/// Removes `slot` from block `own`; returns whether it held it.
fn remove_pair(
    blocks: &mut BlockMap<Holders>,
    store: &mut HolderStore,
    slot: u32,
    own: u64,
) -> bool {
    let Some(holders) = blocks.get_mut(own) else {
        return false;
    };
    match store.remove(holders, slot) {
        Removed::NotHeld => false,
        Removed::Held => true,
        Removed::Empty => {
            blocks.remove(own);
            true
        }
    }
}

/// Shrinks a table to twice its length when it is at most a quarter full (and not tiny).
fn shrink_if_sparse<V: Copy + Default>(m: &mut BlockMap<V>) {
    if m.capacity() >= 1024 && m.len() * 4 < m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}

/// Heap bytes of a hashbrown table with `capacity` usable entries of `entry` bytes: buckets
/// (a power of two, 8/7 of the capacity from 8 on) plus one control byte each and a group.
pub(crate) fn table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        capacity + 1
    } else {
        (capacity / 7 * 8).next_power_of_two()
    };
    buckets * (entry + 1) + 16
}

/// The endpoints still matching during a walk: a sorted slot list while small, else a bitset.
enum Active {
    List(SmallVec<[u32; INLINE_ACTIVE]>),
    Bits(SmallVec<[u64; INLINE_ACTIVE]>),
}

impl Active {
    fn new(v: View<'_>) -> Self {
        match v {
            View::Bits(w) => Active::Bits(SmallVec::from_slice(w)),
            View::List(l) if l.len() > INLINE_ACTIVE => {
                let max = l.last().copied().unwrap_or(0);
                let mut w: SmallVec<[u64; INLINE_ACTIVE]> = SmallVec::new();
                w.resize(max as usize / 64 + 1, 0);
                for &s in l {
                    if let Some(x) = w.get_mut((s / 64) as usize) {
                        *x |= 1 << (s % 64);
                    }
                }
                Active::Bits(w)
            }
            v => {
                let mut l = SmallVec::new();
                v.for_each(|s| l.push(s));
                Active::List(l)
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Active::List(l) => l.is_empty(),
            Active::Bits(w) => w.iter().all(|&x| x == 0),
        }
    }

    /// Keeps the slots also in `h`; the others matched `depth` blocks.
    #[inline]
    fn intersect(
        &mut self,
        h: View<'_>,
        depth: u32,
        ids: &[EndpointId],
        out: &mut Vec<(EndpointId, u32)>,
    ) {
        match self {
            Active::List(l) => l.retain(|s| {
                let keep = h.contains(*s);
                if !keep {
                    out.push((id_of(ids, *s), depth));
                }
                keep
            }),
            Active::Bits(words) => match h {
                View::Bits(hw) => {
                    for (wi, w) in words.iter_mut().enumerate() {
                        let keep = *w & hw.get(wi).copied().unwrap_or(0);
                        push_bits(*w & !keep, wi, depth, ids, out);
                        *w = keep;
                    }
                }
                small => {
                    // Few holders: the survivors are those of `h` present in the bitset.
                    let mut kept: SmallVec<[u32; INLINE_ACTIVE]> = SmallVec::new();
                    small.for_each(|s| {
                        if bit(words, s) {
                            kept.push(s);
                        }
                    });
                    for (wi, w) in words.iter().enumerate() {
                        let mut dropped = *w;
                        for &s in &kept {
                            if (s / 64) as usize == wi {
                                dropped &= !(1 << (s % 64));
                            }
                        }
                        push_bits(dropped, wi, depth, ids, out);
                    }
                    *self = Active::List(kept);
                }
            },
        }
    }

    /// Every remaining slot matched `depth` blocks.
    fn drain(&mut self, depth: u32, ids: &[EndpointId], out: &mut Vec<(EndpointId, u32)>) {
        match self {
            Active::List(l) => out.extend(l.drain(..).map(|s| (id_of(ids, s), depth))),
            Active::Bits(words) => {
                for (wi, w) in words.iter_mut().enumerate() {
                    push_bits(*w, wi, depth, ids, out);
                    *w = 0;
                }
            }
        }
    }
}

#[inline]
fn id_of(ids: &[EndpointId], s: u32) -> EndpointId {
    ids.get(s as usize).copied().unwrap_or(EndpointId(u32::MAX))
}

#[inline]
fn push_bits(
    mut w: u64,
    wi: usize,
    depth: u32,
    ids: &[EndpointId],
    out: &mut Vec<(EndpointId, u32)>,
) {
    while w != 0 {
        out.push((id_of(ids, wi as u32 * 64 + w.trailing_zeros()), depth));
        w &= w - 1;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::kv_events::BlockStored;
    use crate::prefix_index::block_hashes;

    fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) -> KvEvent {
        KvEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().copied().collect(),
            parent,
            token_ids: tokens.to_vec(),
            block_size: bs,
            medium: Some(Medium::Gpu),
            ..Default::default()
        })
    }

    fn removed(hashes: &[u64]) -> KvEvent {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().copied().collect(),
            medium: Some(Medium::Gpu),
            group_idx: Some(0),
        })
    }

    fn sorted(mut v: Vec<(EndpointId, u32)>) -> Vec<(EndpointId, u32)> {
        v.sort();
        v
    }

    #[test]
    fn store_chain_match_remove_clear() {
        let toks: Vec<u32> = (0..16).collect();
        let mut ix = PrefixIndex::new(4);
        let a = EndpointId(7);
        let b = EndpointId(9);
        // a stores 4 blocks in two events chained by engine hash.
        ix.apply(a, &store(&[100, 101], None, &toks[..8], 4));
        ix.apply(a, &store(&[102, 103], Some(101), &toks[8..], 4));
        // b stores 2 blocks with different engine hashes (other seed).
        ix.apply(b, &store(&[200, 201], None, &toks[..8], 4));
        let req = block_hashes(&toks, 4);
        let mut out = Vec::new();
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 4), (b, 2)]);
        assert_eq!(ix.stats().blocks, 4);
        assert_eq!(ix.stats().pairs, 6);

        // Evicting a's second block cuts its match at 1.
        ix.apply(a, &removed(&[101]));
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1), (b, 2)]);

        // Unknown parent: orphaned.
        ix.apply(b, &store(&[202], Some(999), &toks[8..12], 4));
        assert_eq!(ix.stats().orphaned, 1);

        ix.apply(a, &KvEvent::AllBlocksCleared);
        ix.match_prefix(&req, &mut out);
        assert_eq!(out, vec![(b, 2)]);
        ix.remove_endpoint(b);
        ix.match_prefix(&req, &mut out);
        assert!(out.is_empty());
        assert_eq!(ix.stats().pairs, 0);
        assert_eq!(ix.stats().blocks, 0);
    }

    #[test]
    fn data_parallel_ranks_are_tracked_apart() {
        let toks: Vec<u32> = (0..16).collect();
        let req = block_hashes(&toks, 4);
        let mut ix = PrefixIndex::new(4);
        let (a, b) = (EndpointId(0), EndpointId(1));
        let mut out = Vec::new();
        // Both ranks of a store the prompt's first two blocks (same engine hashes: same seed);
        // rank 1 also the next two.
        ix.apply_rank_all_with(a, 0, &[store(&[1, 2], None, &toks[..8], 4)], |_| {});
        ix.apply_rank_all_with(a, 1, &[store(&[1, 2], None, &toks[..8], 4)], |_| {});
        ix.apply_rank_all_with(a, 1, &[store(&[3, 4], Some(2), &toks[8..], 4)], |_| {});
        ix.apply(b, &store(&[9], None, &toks[..4], 4));
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 2), (a, 4), (b, 1)]);
        assert_eq!(ix.endpoint_blocks(a), 6);
        assert_eq!(ix.engine_hashes(a), vec![1, 2, 3, 4]);
        assert_eq!(ix.endpoints().collect::<Vec<_>>(), vec![a, b]);
        // Rank 1 evicts block 0, then rank 0 clears its cache: each leaves the other's.
        ix.apply_rank_all_with(a, 1, &[removed(&[1])], |_| {});
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 2), (b, 1)]);
        assert!(ix.contains(a, req[1]));
        ix.apply_rank_all_with(a, 0, &[KvEvent::AllBlocksCleared], |_| {});
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(b, 1)]);
        assert!(ix.contains(a, req[1]), "rank 1 still holds block 1");
        ix.clear_rank(a, 1);
        assert_eq!(ix.endpoint_blocks(a), 0);
        // A reset of the endpoint clears every rank; removing it frees every slot.
        ix.apply_rank_all_with(a, 2, &[store(&[1], None, &toks[..4], 4)], |_| {});
        ix.apply(a, &store(&[1], None, &toks[..4], 4));
        ix.clear_endpoint(a);
        assert_eq!(ix.endpoint_blocks(a), 0);
        ix.apply_rank_all_with(a, 2, &[store(&[1], None, &toks[..4], 4)], |_| {});
        // Ids move with their ranks.
        ix.remap_endpoints(|id| Some(EndpointId(1 - id.0)));
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1), (b, 1)]);
        ix.apply_rank_all_with(b, 2, &[store(&[2], Some(1), &toks[4..8], 4)], |_| {});
        assert_eq!(ix.stats().orphaned, 0);
        ix.match_prefix(&req, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1), (b, 2)]);
        ix.remove_endpoint(b);
        ix.remove_endpoint(a);
        assert_eq!(ix.stats().endpoints, 0);
        assert_eq!(ix.stats().pairs, 0);
    }

    #[test]
    fn filters_and_rejections() {
        let toks: Vec<u32> = (0..8).collect();
        let mut ix = PrefixIndex::new(4);
        let a = EndpointId(1);
        // Wrong block size and wrong token count are rejected.
        ix.apply(a, &store(&[1, 2], None, &toks, 8));
        ix.apply(a, &store(&[1, 2], None, &toks[..7], 4));
        assert_eq!(ix.stats().rejected, 4);
        // CPU medium and other groups are ignored.
        let mut e = store(&[1, 2], None, &toks, 4);
        if let KvEvent::BlockStored(s) = &mut e {
            s.medium = Some(Medium::Cpu);
        }
        ix.apply(a, &e);
        if let KvEvent::BlockStored(s) = &mut e {
            s.medium = Some(Medium::Gpu);
            s.group_idx = Some(1);
        }
        ix.apply(a, &e);
        assert_eq!(ix.stats().ignored_events, 2);
        assert_eq!(ix.stats().pairs, 0);
        let mut ix = ix.with_kv_group(None);
        ix.apply(a, &e);
        assert_eq!(ix.stats().pairs, 2);
    }

    #[test]
    fn lora_blocks_do_not_match_base_requests() {
        let toks: Vec<u32> = (0..8).collect();
        let mut ix = PrefixIndex::new(4);
        let mut e = store(&[1, 2], None, &toks, 4);
        if let KvEvent::BlockStored(s) = &mut e {
            s.lora_name = Some("adapter".into());
        }
        ix.apply(EndpointId(1), &e);
        let mut out = Vec::new();
        ix.match_prefix(&block_hashes(&toks, 4), &mut out);
        assert!(out.is_empty());
        let req = crate::prefix_index::block_hashes_from(chain_root(Some("adapter")), &toks, 4);
        ix.match_prefix(&req, &mut out);
        assert_eq!(out, vec![(EndpointId(1), 2)]);
    }

    #[test]
    fn many_endpoints_use_bitsets_and_match_exactly() {
        let toks: Vec<u32> = (0..64).collect();
        let req = block_hashes(&toks, 4); // 16 blocks
        let mut ix = PrefixIndex::new(4);
        // Endpoint i holds the first (i % 17) blocks.
        for i in 0..300u32 {
            let n = (i % 17) as usize;
            if n == 0 {
                continue;
            }
            let engine: Vec<u64> = (0..n as u64).map(|b| u64::from(i) * 1000 + b).collect();
            ix.apply(EndpointId(i), &store(&engine, None, &toks[..n * 4], 4));
        }
        let mut out = Vec::new();
        ix.match_prefix(&req, &mut out);
        let got = sorted(out);
        let want: Vec<(EndpointId, u32)> = (0..300u32)
            .filter(|i| i % 17 != 0)
            .map(|i| (EndpointId(i), i % 17))
            .collect();
        assert_eq!(got, want);
        // Remove half of the endpoints; sets shrink back.
        for i in (0..300u32).step_by(2) {
            ix.remove_endpoint(EndpointId(i));
        }
        let mut out = Vec::new();
        ix.match_prefix(&req, &mut out);
        let want: Vec<(EndpointId, u32)> = (0..300u32)
            .filter(|i| i % 17 != 0 && i % 2 == 1)
            .map(|i| (EndpointId(i), i % 17))
            .collect();
        assert_eq!(sorted(out), want);
        assert!(ix.memory_bytes() > 0);
    }

    #[test]
    fn memory_is_given_back_after_evictions() {
        let toks: Vec<u32> = (0..40_000).collect();
        let mut ix = PrefixIndex::new(4);
        let hashes: Vec<u64> = (1..=10_000).collect();
        ix.apply(EndpointId(1), &store(&hashes, None, &toks, 4));
        let full = ix.memory_bytes();
        for chunk in hashes[..9_500].chunks(100) {
            ix.apply(EndpointId(1), &removed(chunk));
        }
        assert_eq!(ix.stats().pairs, 500);
        assert!(
            ix.memory_bytes() * 4 < full,
            "{} vs {full}",
            ix.memory_bytes()
        );
    }

    #[test]
    fn table_bytes_matches_hashbrown_growth() {
        let mut m: std::collections::HashMap<u64, u64, ahash::RandomState> = Default::default();
        for i in 0..1000 {
            m.insert(i, i);
        }
        // 1000 entries → 1024 buckets would exceed 7/8 load; hashbrown uses 2048.
        assert_eq!(table_bytes(m.capacity(), 16), 2048 * 17 + 16);
    }
}
