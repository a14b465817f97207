//! Approximate prefix tracking for workers that publish no KV events.

use std::collections::hash_map::{Entry, OccupiedEntry};
use std::collections::{HashMap, VecDeque};

use smallvec::SmallVec;

use super::EndpointId;
use super::exact::table_bytes;
use super::slots::Slots;

type Map<K, V> = HashMap<K, V, ahash::RandomState>;

/// One endpoint's claim on a block.
#[derive(Debug, Clone, Copy)]
struct Touch {
    slot: u32,
    /// Index-wide counter value of the latest touch (identifies the live LRU queue entry).
    tick: u64,
    /// Caller's clock at the latest touch, in milliseconds.
    at_ms: u64,
}

#[derive(Debug, Clone, Default)]
struct ApproxEndpoint {
    /// Blocks currently attributed to the endpoint.
    held: usize,
    /// `(block, tick)` in touch order; entries whose tick is no longer the block's are stale.
    lru: VecDeque<(u64, u64)>,
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
    blocks: Map<u64, Touches>,
    endpoints: Slots<ApproxEndpoint>,
    tick: u64,
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
            blocks: Map::default(),
            endpoints: Slots::default(),
            tick: 0,
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

    fn touch(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64, refresh: bool) {
        let max_age_ms = self.max_age_ms;
        let Some(slot) = self.endpoints.slot_or_insert(ep, ApproxEndpoint::default) else {
            return;
        };
        let Self {
            blocks,
            endpoints,
            tick,
            pairs,
            ..
        } = self;
        let Some(state) = endpoints.get_mut(slot) else {
            return;
        };
        // Touch the tail first so that the head is the most recently used: eviction then
        // shortens a cached prompt from its end, which keeps its prefix matchable.
        for &h in request_hashes.iter().rev() {
            let touches = blocks.entry(h).or_default();
            let held = touches.iter_mut().find(|t| t.slot == slot);
            if !refresh
                && held
                    .as_ref()
                    .is_some_and(|t| now_ms.saturating_sub(t.at_ms) <= max_age_ms)
            {
                continue;
            }
            *tick += 1;
            match held {
                Some(t) => {
                    t.tick = *tick;
                    t.at_ms = now_ms;
                }
                None => {
                    touches.push(Touch {
                        slot,
                        tick: *tick,
                        at_ms: now_ms,
                    });
                    state.held += 1;
                    *pairs += 1;
                }
            }
            state.lru.push_back((h, *tick));
        }
        self.trim(slot, now_ms);
    }

    /// Forgets that `ep` holds block `h` (something else now accounts for it); its queue
    /// entry is dropped later, as a stale one.
    pub fn release(&mut self, ep: EndpointId, h: u64) {
        if let Some(mut r) = self.releaser(ep) {
            r.release(h);
        }
    }

    /// A handle that forgets blocks of `ep` one by one ([`release`](Self::release)) with the
    /// endpoint looked up once, for a batch; `None` when `ep` holds nothing here.
    pub(crate) fn releaser(&mut self, ep: EndpointId) -> Option<Releaser<'_>> {
        let slot = self.endpoints.slot(ep)?;
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
    /// its queue when stale entries dominate.
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
        while let Some(&(h, tick)) = state.lru.front() {
            // One lookup per entry: the block's touches are read and, if the entry goes,
            // updated through the same entry.
            let Entry::Occupied(touches) = blocks.entry(h) else {
                state.lru.pop_front(); // stale: the block is no longer held at all
                continue;
            };
            let ts = touches.get();
            let Some(pos) = ts.iter().position(|t| t.slot == slot && t.tick == tick) else {
                state.lru.pop_front(); // stale: the block was touched again later
                continue;
            };
            let too_old = ts
                .get(pos)
                .is_some_and(|t| now_ms.saturating_sub(t.at_ms) > *max_age_ms);
            if state.held <= *capacity && !too_old {
                break;
            }
            state.lru.pop_front();
            remove_touch(touches, pos);
            state.held -= 1;
            *pairs -= 1;
            if too_old {
                *expired += 1;
            } else {
                *evicted += 1;
            }
        }
        if state.lru.len() > 2 * state.held + 64 {
            state.lru.retain(|&(h, tick)| {
                blocks
                    .get(&h)
                    .is_some_and(|ts| ts.iter().any(|t| t.slot == slot && t.tick == tick))
            });
        }
    }

    /// Forgets every block attributed to `ep` (e.g. after the worker restarted).
    pub fn clear_endpoint(&mut self, ep: EndpointId) {
        let Some(slot) = self.endpoints.slot(ep) else {
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
        for (h, tick) in std::mem::take(&mut state.lru) {
            // Only the live entry of a block (its latest touch) removes it.
            if take_touch(blocks, h, |t| t.slot == slot && t.tick == tick) {
                *pairs -= 1;
            }
        }
        state.held = 0;
    }

    /// Forgets `ep` entirely.
    pub fn remove_endpoint(&mut self, ep: EndpointId) {
        self.clear_endpoint(ep);
        self.endpoints.remove(ep);
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
        let Some(first) = request_hashes.first().and_then(|h| self.blocks.get(h)) else {
            return;
        };
        let mut active: SmallVec<[u32; 16]> = first.iter().filter(fresh).map(|t| t.slot).collect();
        for (depth, h) in request_hashes.iter().enumerate().skip(1) {
            if active.is_empty() {
                return;
            }
            let touches = self.blocks.get(h).map_or(&[][..], |t| &t[..]);
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
        if n == 0 || self.blocks.is_empty() {
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
            let Some(touches) = request_hashes
                .get(d as usize)
                .and_then(|h| self.blocks.get(h))
            else {
                continue;
            };
            for t in touches {
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
            blocks: self.blocks.len(),
            pairs: self.pairs,
            evicted: self.evicted,
            expired: self.expired,
        }
    }

    /// Estimated heap bytes held by the index.
    pub fn memory_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(u64, Touches)>();
        let spilled: usize = self
            .blocks
            .values()
            .filter(|t| t.spilled())
            .map(|t| t.capacity() * std::mem::size_of::<Touch>())
            .sum();
        let queues: usize = self
            .endpoints
            .iter()
            .map(|(_, e)| e.lru.capacity() * 16)
            .sum();
        std::mem::size_of::<Self>()
            + table_bytes(self.blocks.capacity(), entry)
            + spilled
            + queues
            + self.endpoints.heap_bytes()
    }
}

type Touches = SmallVec<[Touch; 2]>;

/// Removes the touch at `pos` of a block's touches, and the block when none is left.
fn remove_touch(mut touches: OccupiedEntry<'_, u64, Touches>, pos: usize) {
    let ts = touches.get_mut();
    ts.remove(pos);
    if ts.is_empty() {
        touches.remove();
    }
}

/// Forgets blocks of one endpoint of an [`ApproxIndex`] ([`ApproxIndex::releaser`]).
pub(crate) struct Releaser<'a> {
    index: &'a mut ApproxIndex,
    slot: u32,
}

impl Releaser<'_> {
    /// Forgets that the endpoint holds block `h`, as [`ApproxIndex::release`] does.
    pub(crate) fn release(&mut self, h: u64) {
        let slot = self.slot;
        let index = &mut *self.index;
        if !take_touch(&mut index.blocks, h, |t| t.slot == slot) {
            return;
        }
        index.pairs -= 1;
        if let Some(state) = index.endpoints.get_mut(slot) {
            state.held = state.held.saturating_sub(1);
        }
    }
}

/// Removes block `h`'s first touch that `which` selects (with one table lookup); returns
/// whether there was one.
fn take_touch(blocks: &mut Map<u64, Touches>, h: u64, which: impl Fn(&Touch) -> bool) -> bool {
    let Entry::Occupied(touches) = blocks.entry(h) else {
        return false;
    };
    let Some(pos) = touches.get().iter().position(which) else {
        return false;
    };
    remove_touch(touches, pos);
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<(EndpointId, u32)>) -> Vec<(EndpointId, u32)> {
        v.sort();
        v
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
}
