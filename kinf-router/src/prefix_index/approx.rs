//! Approximate prefix tracking for workers that publish no KV events.
//!
//! Laid out for fleets where nearly every table lookup misses the CPU caches: a
//! [`BlockMap`] from each block to its touches (one inline, the common case; two or more in an
//! arena), and per endpoint an LRU queue whose entries are marked dead the moment they go stale
//! (their touch released or renewed), so that trimming drops them without a lookup.

use std::collections::VecDeque;

use smallvec::SmallVec;

use super::EndpointId;
use super::slots::Slots;
use crate::block_map::BlockMap;

/// One endpoint's claim on a block.
#[derive(Debug, Clone, Copy, Default)]
struct Touch {
    slot: u32,
    /// Position of the touch's live entry in its endpoint's LRU queue
    /// ([`ApproxEndpoint::head`]).
    seq: u32,
    /// Caller's clock at the latest touch, in milliseconds.
    at_ms: u64,
}

/// [`Touch::slot`] of a [`Packed`] that refers to an arena list (never a real slot, which
/// fits in 31 bits).
const LIST: u32 = u32::MAX;

/// A block's touches as its table value: one touch inline or, when `slot` is [`LIST`], the
/// index in [`Arena::lists`] of two or more, stored in `seq`. (`Default` only fills the empty
/// slots of the table.)
#[derive(Debug, Clone, Copy, Default)]
struct Packed(Touch);

impl Packed {
    fn list_index(self) -> Option<usize> {
        (self.0.slot == LIST).then_some(self.0.seq as usize)
    }
}

/// The touches of a block touched by two or more endpoints, in touch order.
type TouchList = SmallVec<[Touch; 2]>;

/// The lists of [`Packed`] values, with reusable free entries.
#[derive(Debug, Clone, Default)]
struct Arena {
    lists: Vec<TouchList>,
    free: Vec<u32>,
}

impl Arena {
    /// The touches `v` holds, in touch order.
    fn touches<'a>(&'a self, v: &'a Packed) -> &'a [Touch] {
        match v.list_index() {
            None => std::slice::from_ref(&v.0),
            Some(i) => self.lists.get(i).map_or(&[], |l| &l[..]),
        }
    }

    fn touches_mut<'a>(&'a mut self, v: &'a mut Packed) -> &'a mut [Touch] {
        match v.list_index() {
            None => std::slice::from_mut(&mut v.0),
            Some(i) => self.lists.get_mut(i).map_or(&mut [], |l| &mut l[..]),
        }
    }

    /// The touch of `slot` among `v`'s, if any.
    fn find_mut<'a>(&'a mut self, v: &'a mut Packed, slot: u32) -> Option<&'a mut Touch> {
        self.touches_mut(v).iter_mut().find(|t| t.slot == slot)
    }

    /// Appends `t` to `v`'s touches (moving them to a list when `v` held one inline); false
    /// if the arena is full (2^32 lists).
    fn push(&mut self, v: &mut Packed, t: Touch) -> bool {
        if let Some(i) = v.list_index() {
            return self.lists.get_mut(i).is_some_and(|l| {
                l.push(t);
                true
            });
        }
        let list = TouchList::from_buf([v.0, t]);
        let i = match self.free.pop() {
            Some(i) => {
                if let Some(l) = self.lists.get_mut(i as usize) {
                    *l = list;
                }
                i
            }
            None => {
                let Ok(i) = u32::try_from(self.lists.len()) else {
                    return false;
                };
                self.lists.push(list);
                i
            }
        };
        *v = Packed(Touch {
            slot: LIST,
            seq: i,
            at_ms: 0,
        });
        true
    }

    /// Removes the touch of `slot` from `v`, keeping the others' order (back inline when one
    /// is left); returns it and whether none is left.
    fn remove(&mut self, v: &mut Packed, slot: u32) -> Option<(Touch, bool)> {
        let Some(i) = v.list_index() else {
            return (v.0.slot == slot).then_some((v.0, true));
        };
        let list = self.lists.get_mut(i)?;
        let pos = list.iter().position(|t| t.slot == slot)?;
        let t = list.remove(pos);
        if list.len() > 1 {
            return Some((t, false));
        }
        let last = list.first().copied();
        *list = TouchList::new();
        self.free.push(i as u32);
        if let Some(last) = last {
            *v = Packed(last);
        }
        Some((t, last.is_none()))
    }

    fn heap_bytes(&self) -> usize {
        let spilled: usize = self
            .lists
            .iter()
            .filter(|l| l.spilled())
            .map(|l| l.capacity() * std::mem::size_of::<Touch>())
            .sum();
        self.lists.capacity() * std::mem::size_of::<TouchList>()
            + spilled
            + self.free.capacity() * 4
    }
}

/// Block → its touches.
#[derive(Debug, Clone, Default)]
struct Blocks {
    map: BlockMap<Packed>,
    arena: Arena,
}

impl Blocks {
    /// Removes the touch of `slot` from block `h` (and the block when no touch is left);
    /// returns it.
    fn take(&mut self, h: u64, slot: u32) -> Option<Touch> {
        let v = self.map.get_mut(h)?;
        let (t, empty) = self.arena.remove(v, slot)?;
        if empty {
            self.map.remove(h);
        }
        Some(t)
    }

    /// Sets the queue position of `slot`'s touch of block `h`.
    fn set_seq(&mut self, h: u64, slot: u32, seq: u32) {
        if let Some(v) = self.map.get_mut(h)
            && let Some(t) = self.arena.find_mut(v, slot)
        {
            t.seq = seq;
        }
    }
}

/// An entry of an endpoint's LRU queue.
#[derive(Debug, Clone, Copy)]
struct Queued {
    block: u64,
    /// The touch's time (while the entry is live).
    at_ms: u64,
    /// Whether the entry is its touch's, which was neither released, renewed nor evicted since;
    /// dead entries wait to be popped.
    live: bool,
}

#[derive(Debug, Clone, Default)]
struct ApproxEndpoint {
    /// Blocks currently attributed to the endpoint.
    held: usize,
    /// Position of `lru.front()` among all entries ever pushed, modulo 2^32 (unambiguous while
    /// the queue holds fewer than 2^32 entries).
    head: u32,
    /// Touches in touch order; each touch of the endpoint has exactly one live entry.
    lru: VecDeque<Queued>,
}

impl ApproxEndpoint {
    /// The position the next pushed entry gets.
    fn next_seq(&self) -> u32 {
        self.head.wrapping_add(self.lru.len() as u32)
    }

    /// Marks the entry at position `seq` dead.
    fn kill(&mut self, seq: u32) {
        if let Some(e) = self.lru.get_mut(seq.wrapping_sub(self.head) as usize) {
            e.live = false;
        }
    }

    fn pop_front(&mut self) {
        if self.lru.pop_front().is_some() {
            self.head = self.head.wrapping_add(1);
        }
    }
}

/// Counters of an [`ApproxIndex`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApproxStats {
    /// Endpoints known to the index.
    pub endpoints: usize,
    /// Distinct blocks attributed to at least one endpoint.
    pub blocks: usize,
    /// `(endpoint, block)` pairs.
    pub pairs: usize,
    /// Pairs dropped because an endpoint exceeded its capacity.
    pub evicted: u64,
    /// Pairs dropped because they were older than the maximum age.
    pub expired: u64,
}

/// **Approximate** prefix index for endpoints without KV events: it remembers which request
/// blocks were *routed* to which endpoint, not what the engine actually caches.
///
/// Each endpoint is assumed to keep at most `capacity_blocks` blocks, evicted least recently
/// routed first (a prompt's tail before its head, as vLLM frees blocks), and nothing older than
/// `max_age_ms`. It over-estimates when the engine evicted earlier (memory pressure, restarts)
/// and under-estimates blocks cached by requests that bypassed this router. Time is the caller's
/// monotonic clock in milliseconds; the index never reads a clock.
#[derive(Debug, Clone)]
pub struct ApproxIndex {
    capacity: usize,
    max_age_ms: u64,
    blocks: Blocks,
    endpoints: Slots<ApproxEndpoint>,
    pairs: usize,
    evicted: u64,
    expired: u64,
}

impl ApproxIndex {
    /// An empty index assuming `capacity_blocks` blocks per endpoint and entries valid for
    /// `max_age_ms`.
    pub fn new(capacity_blocks: usize, max_age_ms: u64) -> Self {
        Self {
            capacity: capacity_blocks,
            max_age_ms,
            blocks: Blocks::default(),
            endpoints: Slots::default(),
            pairs: 0,
            evicted: 0,
            expired: 0,
        }
    }

    /// Records that a request with blocks `request_hashes` was routed to `ep` at `now_ms`;
    /// then evicts beyond capacity and expires what is too old on that endpoint.
    pub fn record(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64) {
        self.touch(ep, request_hashes, now_ms, true);
    }

    /// Like [`record`](Self::record), but blocks `ep` already holds (not expired) keep their
    /// age: a claim expires the maximum age after the routing that made it, however often the
    /// prompt is routed there again. For claims that something else must confirm in time.
    pub fn claim(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64) {
        self.touch(ep, request_hashes, now_ms, false);
    }

    /// One table lookup per block.
    fn touch(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64, refresh: bool) {
        let max_age_ms = self.max_age_ms;
        let Some(slot) = self
            .endpoints
            .slot_or_insert((ep, 0), ApproxEndpoint::default)
        else {
            return;
        };
        let Self {
            blocks,
            endpoints,
            pairs,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        // Touch the tail first so that the head is the most recently used: eviction then
        // shortens a cached prompt from its end, which keeps its prefix matchable.
        for &h in request_hashes.iter().rev() {
            let new = Touch {
                slot,
                seq: state.next_seq(),
                at_ms: now_ms,
            };
            let (v, inserted) = blocks.map.get_or_insert_with(h, || Packed(new));
            let renewed = if inserted {
                None
            } else {
                match blocks.arena.find_mut(v, slot) {
                    Some(t) => {
                        if !refresh && now_ms.saturating_sub(t.at_ms) <= max_age_ms {
                            continue;
                        }
                        Some(std::mem::replace(t, new))
                    }
                    None => {
                        if !blocks.arena.push(v, new) {
                            continue;
                        }
                        None
                    }
                }
            };
            match renewed {
                Some(old) => state.kill(old.seq),
                None => {
                    state.held += 1;
                    *pairs += 1;
                }
            }
            state.lru.push_back(Queued {
                block: h,
                at_ms: now_ms,
                live: true,
            });
        }
        self.trim(slot, now_ms);
    }

    /// Forgets that `ep` holds block `h` (something else now accounts for it); its queue
    /// entry is marked dead and dropped later.
    pub fn release(&mut self, ep: EndpointId, h: u64) {
        if let Some(mut r) = self.releaser(ep) {
            r.release(h);
        }
    }

    /// A handle that forgets blocks of `ep` one by one ([`release`](Self::release)) with the
    /// endpoint looked up once, for a batch; `None` when `ep` holds nothing here.
    pub(crate) fn releaser(&mut self, ep: EndpointId) -> Option<Releaser<'_>> {
        let slot = self.endpoints.slot((ep, 0))?;
        Some(Releaser { index: self, slot })
    }

    /// Drops, on every endpoint, the entries older than the maximum age at `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let slots: Vec<u32> = self.endpoints.iter().map(|(s, _)| s).collect();
        for s in slots {
            self.trim(s, now_ms);
        }
    }

    /// Evicts LRU entries of `slot` beyond capacity or older than the maximum age, and compacts
    /// its queue when dead entries dominate. Dropping a dead entry costs no table lookup; an
    /// eviction costs one.
    fn trim(&mut self, slot: u32, now_ms: u64) {
        let Self {
            blocks,
            endpoints,
            pairs,
            evicted,
            expired,
            capacity,
            max_age_ms,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        while let Some(&front) = state.lru.front() {
            if !front.live {
                state.pop_front();
                continue;
            }
            // A live entry's time is its touch's.
            let too_old = now_ms.saturating_sub(front.at_ms) > *max_age_ms;
            if state.held <= *capacity && !too_old {
                break;
            }
            state.pop_front();
            if blocks.take(front.block, slot).is_none() {
                continue; // not reached: a live entry's touch exists
            }
            state.held -= 1;
            *pairs -= 1;
            if too_old {
                *expired += 1;
            } else {
                *evicted += 1;
            }
        }
        if state.lru.len() > 2 * state.held + 64 {
            state.lru.retain(|e| e.live);
            // The live entries moved: renumber their touches.
            for (i, e) in state.lru.iter().enumerate() {
                blocks.set_seq(e.block, slot, state.head.wrapping_add(i as u32));
            }
        }
    }

    /// Forgets every block attributed to `ep` (e.g. after the worker restarted).
    pub fn clear_endpoint(&mut self, ep: EndpointId) {
        let Some(slot) = self.endpoints.slot((ep, 0)) else {
            return;
        };
        let Self {
            blocks,
            endpoints,
            pairs,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        for e in std::mem::take(&mut state.lru) {
            if e.live && blocks.take(e.block, slot).is_some() {
                *pairs -= 1;
            }
        }
        state.held = 0;
    }

    /// Forgets `ep` entirely.
    pub fn remove_endpoint(&mut self, ep: EndpointId) {
        self.clear_endpoint(ep);
        self.endpoints.remove((ep, 0));
    }

    /// Renames the endpoints the index knows, as
    /// [`PrefixIndex::remap_endpoints`](super::PrefixIndex::remap_endpoints) does: `remap(id)`
    /// is the new id, or `None` to forget the endpoint; the others keep their blocks, ages and
    /// queues.
    pub fn remap_endpoints(&mut self, remap: impl FnMut(EndpointId) -> Option<EndpointId>) {
        let ids = self.endpoints.endpoint_ids();
        let (drop, rename) = super::slots::plan_remap(ids.into_iter(), remap);
        for id in drop {
            self.remove_endpoint(id);
        }
        self.endpoints
            .rename(|id| rename.get(&id).copied().unwrap_or(id));
    }

    /// Like [`PrefixIndex::match_prefix`](super::PrefixIndex::match_prefix), counting only
    /// entries no older than the maximum age at `now_ms` (whether or not [`expire`](Self::expire)
    /// ran). Cost grows with the number of endpoints sharing a block; meant for modest fleets.
    pub fn match_prefix(
        &self,
        request_hashes: &[u64],
        now_ms: u64,
        out: &mut Vec<(EndpointId, u32)>,
    ) {
        out.clear();
        let fresh = |t: &&Touch| now_ms.saturating_sub(t.at_ms) <= self.max_age_ms;
        let arena = &self.blocks.arena;
        let Some(first) = request_hashes.first().and_then(|&h| self.blocks.map.get(h)) else {
            return;
        };
        let mut active: SmallVec<[u32; 16]> = arena
            .touches(&first)
            .iter()
            .filter(fresh)
            .map(|t| t.slot)
            .collect();
        for (depth, &h) in request_hashes.iter().enumerate().skip(1) {
            if active.is_empty() {
                return;
            }
            let v = self.blocks.map.get(h);
            let touches = v.as_ref().map_or(&[][..], |v| arena.touches(v));
            active.retain(|s| {
                let keep = touches.iter().filter(fresh).any(|t| t.slot == *s);
                if !keep {
                    out.push((self.endpoints.id(*s), depth as u32));
                }
                keep
            });
        }
        let n = request_hashes.len() as u32;
        out.extend(active.iter().map(|&s| (self.endpoints.id(s), n)));
    }

    /// Extends matched prefixes through the blocks each endpoint holds here: `depths[id]` is
    /// endpoint `id`'s matched depth in blocks (ids past the end count as 0), found by another
    /// index; while this index holds the request's block at an endpoint's depth (no older than
    /// the maximum age at `now_ms`), the depth grows by one. Afterwards each depth is the
    /// longest prefix made of the blocks it had plus blocks held here; `depths` grows to cover
    /// every id it sets.
    ///
    /// Cost: one lookup per distinct depth reached (a depth shared by many endpoints is looked
    /// up once), not one per request block: cheap when this index holds only what the other
    /// one lacks.
    pub fn extend_matches(&self, request_hashes: &[u64], now_ms: u64, depths: &mut Vec<u32>) {
        let n = request_hashes.len() as u32;
        if n == 0 || self.blocks.map.is_empty() {
            return;
        }
        // Depths to look up, smallest first; 0 for endpoints that matched nothing.
        let mut todo: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = depths
            .iter()
            .copied()
            .filter(|&d| d > 0 && d < n)
            .chain(std::iter::once(0))
            .map(std::cmp::Reverse)
            .collect();
        let mut last = None;
        while let Some(std::cmp::Reverse(d)) = todo.pop() {
            if last == Some(d) {
                continue;
            }
            last = Some(d);
            let Some(v) = request_hashes
                .get(d as usize)
                .and_then(|&h| self.blocks.map.get(h))
            else {
                continue;
            };
            for t in self.blocks.arena.touches(&v) {
                if now_ms.saturating_sub(t.at_ms) > self.max_age_ms {
                    continue;
                }
                let i = self.endpoints.id(t.slot).0 as usize;
                if depths.len() <= i {
                    depths.resize(i + 1, 0);
                }
                if let Some(depth) = depths.get_mut(i)
                    && *depth == d
                {
                    *depth = d + 1;
                    if d + 1 < n {
                        todo.push(std::cmp::Reverse(d + 1));
                    }
                }
            }
        }
    }

    /// Counters and sizes.
    pub fn stats(&self) -> ApproxStats {
        ApproxStats {
            endpoints: self.endpoints.len(),
            blocks: self.blocks.map.len(),
            pairs: self.pairs,
            evicted: self.evicted,
            expired: self.expired,
        }
    }

    /// Estimated heap bytes held by the index.
    pub fn memory_bytes(&self) -> usize {
        let queues: usize = self
            .endpoints
            .iter()
            .map(|(_, e)| e.lru.capacity() * std::mem::size_of::<Queued>())
            .sum();
        std::mem::size_of::<Self>()
            + self.blocks.map.heap_bytes()
            + self.blocks.arena.heap_bytes()
            + queues
            + self.endpoints.heap_bytes()
    }
}

/// Forgets blocks of one endpoint of an [`ApproxIndex`] ([`ApproxIndex::releaser`]).
pub(crate) struct Releaser<'a> {
    index: &'a mut ApproxIndex,
    slot: u32,
}

impl Releaser<'_> {
    /// Forgets that the endpoint holds block `h`, as [`ApproxIndex::release`] does: one table
    /// lookup, and the touch's queue entry marked dead.
    pub(crate) fn release(&mut self, h: u64) {
        let index = &mut *self.index;
        let Some(t) = index.blocks.take(h, self.slot) else {
            return;
        };
        index.pairs -= 1;
        if let Some(state) = index.endpoints.get_mut(self.slot) {
            state.held = state.held.saturating_sub(1);
            state.kill(t.seq);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<(EndpointId, u32)>) -> Vec<(EndpointId, u32)> {
        v.sort();
        v
    }

    /// Checks the bookkeeping: every touch has exactly one live queue entry, at its `seq`,
    /// with its time; `held` and `pairs` count the touches; no block is without touches; the
    /// arena's lists hold two or more touches and the others are free.
    fn check(ix: &ApproxIndex) {
        let mut pairs = 0;
        let mut lists = 0;
        for (h, v) in ix.blocks.map.iter() {
            let ts = ix.blocks.arena.touches(&v);
            match v.list_index() {
                Some(_) => {
                    assert!(ts.len() >= 2);
                    lists += 1;
                }
                None => assert_eq!(ts.len(), 1),
            }
            for t in ts {
                let state = ix.endpoints.get(t.slot).unwrap();
                let e = state.lru[t.seq.wrapping_sub(state.head) as usize];
                assert!(e.live && e.block == h && e.at_ms == t.at_ms, "{h:#x}");
            }
            pairs += ts.len();
        }
        assert_eq!(ix.pairs, pairs);
        for (slot, state) in ix.endpoints.iter() {
            let touches = ix
                .blocks
                .map
                .iter()
                .flat_map(|(_, v)| ix.blocks.arena.touches(&v).to_vec())
                .filter(|t| t.slot == slot)
                .count();
            assert_eq!(state.held, touches);
        }
        assert_eq!(
            lists + ix.blocks.arena.free.len(),
            ix.blocks.arena.lists.len()
        );
        for (_, state) in ix.endpoints.iter() {
            let live = state.lru.iter().filter(|e| e.live).count();
            assert_eq!(state.held, live);
        }
    }

    #[test]
    fn records_matches_evicts_tail_first_and_expires() {
        let mut ix = ApproxIndex::new(4, 1_000);
        let (a, b) = (EndpointId(1), EndpointId(2));
        ix.record(a, &[1, 2, 3], 0);
        ix.record(b, &[1, 2], 0);
        let mut out = Vec::new();
        ix.match_prefix(&[1, 2, 3, 4], 10, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 3), (b, 2)]);

        // a's capacity is 4: recording [1, 9, 10] (2 new blocks) evicts 2 LRU blocks of a.
        // The LRU order of a is 3, 2, 1 (tail first), then 10, 9, 1 are touched.
        ix.record(a, &[1, 9, 10], 5);
        assert_eq!(ix.stats().evicted, 1);
        ix.match_prefix(&[1, 2, 3], 10, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 2), (b, 2)]);

        // Age: at t = 1_004 the records made at t = 0 are stale, those made at t = 5 are not.
        ix.match_prefix(&[1, 9, 10], 1_004, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 3)]);
        ix.match_prefix(&[1, 2], 1_004, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1)]);
        ix.expire(1_004);
        assert_eq!(ix.stats().pairs, 3);
        ix.expire(2_000);
        assert_eq!(ix.stats().pairs, 0);
        assert_eq!(ix.stats().blocks, 0);
    }

    #[test]
    fn remapped_endpoints_keep_their_blocks_and_dropped_ones_lose_them() {
        let mut ix = ApproxIndex::new(100, 1_000);
        let (a, b, c) = (EndpointId(0), EndpointId(1), EndpointId(2));
        ix.record(a, &[1, 2, 3], 0);
        ix.record(b, &[1, 2], 0);
        ix.record(c, &[1], 5);
        // a and c swap ids, b is gone.
        ix.remap_endpoints(|id| match id.0 {
            0 => Some(c),
            2 => Some(a),
            _ => None,
        });
        check(&ix);
        let mut out = Vec::new();
        ix.match_prefix(&[1, 2, 3], 10, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1), (c, 3)]);
        assert_eq!(ix.stats().endpoints, 2);
        assert_eq!(ix.stats().pairs, 4);
        // Their queues came along: ages and releases still work under the new ids.
        ix.release(c, 3);
        ix.match_prefix(&[1, 2, 3], 1_000, &mut out);
        assert_eq!(sorted(out.clone()), vec![(a, 1), (c, 2)]);
        // c's blocks (recorded at 0) are too old at 1_003, a's (at 5) are not.
        ix.match_prefix(&[1, 2, 3], 1_003, &mut out);
        assert_eq!(out, vec![(a, 1)]);
        ix.expire(1_004);
        check(&ix);
        assert_eq!(ix.stats().pairs, 1);
        // b's old id is a new endpoint, empty.
        ix.record(b, &[7], 1_004);
        ix.match_prefix(&[1], 1_004, &mut out);
        assert_eq!(out, vec![(a, 1)]);
        check(&ix);
    }

    #[test]
    fn extend_matches_continues_each_depth_through_fresh_claims() {
        let mut ix = ApproxIndex::new(100, 1_000);
        let (a, b, c) = (EndpointId(0), EndpointId(1), EndpointId(5));
        let req = [10, 11, 12, 13, 14];
        // a: reported 2 blocks elsewhere, claims blocks 2..4 here.
        ix.claim(a, &req[2..4], 0);
        // b: reported nothing; claims from the start.
        ix.claim(b, &req[..3], 0);
        // c: claims blocks 3.. but reported only 1 block: the gap at 1..3 stops it.
        ix.claim(c, &req[3..], 0);
        let mut depths = vec![2, 0];
        ix.extend_matches(&req, 10, &mut depths);
        // c's id (5) was past the end: the vector grew, and c stayed at 0.
        assert_eq!(depths, vec![4, 3, 0, 0, 0, 0]);

        // A depth reached by extension is looked up too (b: 0 → 3 → … with a later claim).
        ix.claim(b, &req[3..], 0);
        let mut depths = vec![0, 0, 0, 0, 0, 1];
        ix.extend_matches(&req, 10, &mut depths);
        assert_eq!(depths, vec![0, 5, 0, 0, 0, 1]);

        // Expired claims do not extend; a depth already at the request's end stays.
        let mut depths = vec![2, 5];
        ix.extend_matches(&req, 1_001, &mut depths);
        assert_eq!(depths, vec![2, 5]);
    }

    #[test]
    fn clear_and_remove() {
        let mut ix = ApproxIndex::new(100, 1_000);
        let (a, b) = (EndpointId(1), EndpointId(2));
        for _ in 0..50 {
            ix.record(a, &[1, 2, 3], 0);
        }
        ix.record(b, &[1], 0);
        assert_eq!(ix.stats().pairs, 4);
        ix.clear_endpoint(a);
        assert_eq!(ix.stats().pairs, 1);
        ix.remove_endpoint(b);
        assert_eq!(
            ix.stats(),
            ApproxStats {
                endpoints: 1,
                ..ApproxStats::default()
            }
        );
        assert!(ix.memory_bytes() > 0);
    }

    #[test]
    fn a_block_with_one_touch_takes_24_bytes_of_table() {
        assert_eq!(std::mem::size_of::<Packed>(), 16);
    }

    #[test]
    fn touches_keep_their_order_through_spills_and_releases() {
        let mut ix = ApproxIndex::new(100, 1_000);
        let (a, b, c) = (EndpointId(7), EndpointId(3), EndpointId(5));
        let mut out = Vec::new();
        for ep in [a, b, c] {
            ix.claim(ep, &[1, 2], 0);
            check(&ix);
        }
        // Ordered by first touch, not by id or slot.
        ix.match_prefix(&[1], 0, &mut out);
        assert_eq!(out, vec![(a, 1), (b, 1), (c, 1)]);
        ix.release(b, 1);
        check(&ix);
        ix.match_prefix(&[1], 0, &mut out);
        assert_eq!(out, vec![(a, 1), (c, 1)]);
        // Endpoints that stop early come first, the others in the order of the first block's
        // touches.
        ix.match_prefix(&[2, 1], 0, &mut out);
        assert_eq!(out, vec![(b, 1), (a, 2), (c, 2)]);
        // Back inline, then a new touch goes last; renewing one keeps its place.
        ix.release(a, 1);
        check(&ix);
        assert_eq!(ix.blocks.arena.free.len(), 1);
        ix.record(b, &[1], 1);
        ix.record(c, &[1], 2);
        check(&ix);
        ix.match_prefix(&[1], 2, &mut out);
        assert_eq!(out, vec![(c, 1), (b, 1)]);
        assert_eq!(ix.blocks.arena.free.len(), 0, "the free list is reused");
        let mut r = ix.releaser(c).unwrap();
        r.release(1);
        r.release(2);
        r.release(99);
        check(&ix);
        assert_eq!(ix.stats().pairs, 3);
        assert_eq!(ix.stats().blocks, 2);
    }

    #[test]
    fn dead_entries_are_dropped_and_the_queue_stays_bounded() {
        let mut ix = ApproxIndex::new(1_000, 1_000);
        let a = EndpointId(0);
        let queue = |ix: &ApproxIndex| ix.endpoints.get(0).unwrap().lru.len();
        // Block 1 stays live at the front of the queue, so dead entries pile up behind it.
        ix.record(a, &[1], 0);
        let mut compacted = 0;
        for round in 0..200u64 {
            let blocks: Vec<u64> = (10..20).map(|b| b + 100 * (round % 3)).collect();
            let before = queue(&ix);
            ix.record(a, &blocks, round);
            if queue(&ix) < before {
                compacted += 1;
            }
            check(&ix);
            // Release half, renew the others (each leaves a dead entry).
            for &b in blocks.iter().step_by(2) {
                ix.release(a, b);
            }
            check(&ix);
            let held = ix.endpoints.get(0).unwrap().held;
            assert!(queue(&ix) <= 2 * held + 64 + blocks.len(), "{round}");
        }
        assert!(compacted > 10, "{compacted}");
        let mut out = Vec::new();
        ix.match_prefix(&[1], 500, &mut out);
        assert_eq!(out, vec![(a, 1)]);
        ix.match_prefix(&[211, 213], 500, &mut out);
        assert_eq!(out, vec![(a, 2)]);
        ix.match_prefix(&[210], 500, &mut out);
        assert!(out.is_empty());
        // After compaction the touches point at their new positions: trimming and clearing
        // find them.
        ix.expire(1_100);
        check(&ix);
        ix.clear_endpoint(a);
        check(&ix);
        assert_eq!(ix.stats().pairs, 0);
        assert_eq!(ix.stats().blocks, 0);
    }

    proptest::proptest! {
        /// Random operations on a few endpoints and blocks keep the bookkeeping consistent.
        #[test]
        fn bookkeeping_stays_consistent(
            cap in 1usize..20,
            ops in proptest::collection::vec(
                (0u8..7, 0u32..3, proptest::collection::vec(0u64..12, 1..6), 0u64..300),
                1..300,
            ),
        ) {
            let mut ix = ApproxIndex::new(cap, 1_000);
            let mut now = 0;
            for (kind, ep, blocks, dt) in ops {
                let ep = EndpointId(ep);
                now += dt / 4;
                match kind {
                    0 | 1 => ix.record(ep, &blocks, now),
                    2 | 3 => ix.claim(ep, &blocks, now),
                    4 => {
                        if let Some(mut r) = ix.releaser(ep) {
                            for &b in &blocks {
                                r.release(b);
                            }
                        }
                    }
                    5 => ix.expire(now),
                    _ => if dt % 2 == 0 { ix.clear_endpoint(ep) } else { ix.remove_endpoint(ep) },
                }
                check(&ix);
                for (_, state) in ix.endpoints.iter() {
                    proptest::prop_assert!(state.held <= cap);
                }
            }
        }
    }
}
