//! [`BlockMap`]: an open-addressing hash map from 64-bit block hashes to small `Copy` values,
//! built for the prefix caches of a fleet, where nearly every lookup misses the CPU caches.
//!
//! - **One cache line per lookup.** Key and value sit side by side in one slot, so a hit costs
//!   one memory access (a general-purpose table reads a control byte and then the entry: two
//!   accesses, the second waiting on the first).
//! - **Batched lookups.** [`BlockMap::for_each_leading`] walks a prompt's chain of block
//!   hashes a batch at a time: it reads the home slot of every key of a batch, then resolves
//!   them. The first reads do not depend on each other, so their misses overlap instead of
//!   following one another.
//! - Linear probing, at most three quarters full; removal shifts the following entries back
//!   (no tombstones). Key 0 marks an empty slot; an entry for key 0 is kept on the side.
//! - **Keys chosen by clients cannot pile up.** A key's home slot is the top bits of the key
//!   times a random odd multiplier drawn for each map (multiply-shift hashing, a universal
//!   family): two distinct keys share a home slot with probability about 2 / slots whatever
//!   they are, so prompts crafted to make colliding block hashes gain nothing without the
//!   multiplier. Any keys work, not only uniform ones.
//!
//! Iteration order is unspecified.

/// The key of an empty slot.
const EMPTY: u64 = 0;
/// Smallest table allocated.
const MIN_SLOTS: usize = 16;
/// The most keys looked up together by [`BlockMap::for_each_leading`].
pub const BATCH: usize = 16;

#[derive(Debug, Clone, Copy)]
struct Slot<V> {
    key: u64,
    value: V,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct BlockMap<V> {
    /// A power of two in length, or empty.
    slots: Vec<Slot<V>>,
    /// Entries in `slots` (not counting `zero`).
    len: usize,
    /// The entry of key 0, which cannot live in `slots`.
    zero: Option<V>,
    /// `64 - log2(slots.len())`.
    shift: u32,
    /// The multiply-shift hash's random odd multiplier.
    mul: u64,
}

/// A random odd multiplier (from `ahash`'s per-process random state).
fn random_multiplier() -> u64 {
    ahash::RandomState::new().hash_one(0x6b69_6e66_2d6d_6170_u64) | 1
}

impl<V: Copy + Default> Default for BlockMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Copy + Default> BlockMap<V> {
    /// An empty map (allocates on first insert).
    pub fn new() -> Self {
        Self {
            slots: Vec::new(),
            len: 0,
            zero: None,
            shift: 64,
            mul: random_multiplier(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len + usize::from(self.zero.is_some())
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries the map holds without growing.
    pub fn capacity(&self) -> usize {
        max_len(self.slots.len())
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot<V>>()
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        // `shift` is 64 only while `slots` is empty; the index is then out of range, and every
        // caller reads slots with `get` or only when the table is non-empty.
        (key.wrapping_mul(self.mul) >> (self.shift & 63)) as usize
    }

    /// The slot holding `key` (≠ 0), if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        let mask = self.mask();
        let mut i = self.home(key);
        loop {
            let s = self.slots.get(i)?;
            if s.key == key {
                return Some(i);
            }
            if s.key == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.zero;
        }
        self.find(key)
            .and_then(|i| self.slots.get(i))
            .map(|s| s.value)
    }

    /// Calls `f` with the value of each leading key of `keys` that has an entry, in order,
    /// and stops at the first key without one, or when `f` returns `false`: the walk along a
    /// prompt's chain of block hashes. Looks the keys up `batch` at a time (1 to [`BATCH`]),
    /// reading a batch's home slots before resolving any, so that their memory accesses
    /// overlap; lookups past the end of the run are wasted, at most `batch - 1`.
    #[inline]
    pub fn for_each_leading(&self, keys: &[u64], batch: usize, mut f: impl FnMut(V) -> bool) {
        let mut found = [None; BATCH];
        for chunk in keys.chunks(batch.clamp(1, BATCH)) {
            self.get_batch(chunk, &mut found);
            for v in found.iter().take(chunk.len()) {
                match v {
                    Some(v) if f(*v) => {}
                    _ => return,
                }
            }
        }
    }

    /// The values of up to [`BATCH`] keys, written to `out[..keys.len()]` (extra keys are
    /// ignored). Reads every key's home slot before resolving any, so that the memory accesses
    /// overlap.
    #[inline]
    fn get_batch(&self, keys: &[u64], out: &mut [Option<V>; BATCH]) {
        let keys = keys.get(..keys.len().min(BATCH)).unwrap_or(keys);
        if self.slots.is_empty() {
            for (o, &k) in out.iter_mut().zip(keys) {
                *o = if k == EMPTY { self.zero } else { None };
            }
            return;
        }
        // First pass: one independent load per key. Its result is only compared, so the loads
        // are all in flight before the first one returns.
        let mut first = [EMPTY; BATCH];
        for (f, &k) in first.iter_mut().zip(keys) {
            *f = self.slots.get(self.home(k)).map_or(EMPTY, |s| s.key);
        }
        for ((o, &k), &f) in out.iter_mut().zip(keys).zip(&first) {
            *o = if f == k && k != EMPTY {
                self.slots.get(self.home(k)).map(|s| s.value)
            } else if f == EMPTY && k != EMPTY {
                None
            } else {
                self.get(k)
            };
        }
    }

    /// A mutable reference to the value of `key`.
    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut V> {
        if key == EMPTY {
            return self.zero.as_mut();
        }
        let i = self.find(key)?;
        self.slots.get_mut(i).map(|s| &mut s.value)
    }

    /// Inserts or replaces; returns the previous value.
    #[inline]
    pub fn insert(&mut self, key: u64, value: V) -> Option<V> {
        let (v, inserted) = self.get_or_insert_with(key, || value);
        if inserted {
            None
        } else {
            Some(std::mem::replace(v, value))
        }
    }

    /// The value of `key`, inserting `make()` first if absent; `true` when it inserted.
    #[inline]
    pub fn get_or_insert_with(&mut self, key: u64, make: impl FnOnce() -> V) -> (&mut V, bool) {
        if key == EMPTY {
            let inserted = self.zero.is_none();
            return (self.zero.get_or_insert_with(make), inserted);
        }
        if self.len + 1 > self.capacity() {
            self.resize(slots_for(self.len + 1).max(self.slots.len() * 2));
        }
        let mask = self.mask();
        let mut i = self.home(key);
        // Indexing: `slots` is non-empty here and `i` is masked by its length - 1.
        loop {
            let k = self.slots[i].key;
            if k == key {
                return (&mut self.slots[i].value, false);
            }
            if k == EMPTY {
                self.len += 1;
                self.slots[i] = Slot { key, value: make() };
                return (&mut self.slots[i].value, true);
            }
            i = (i + 1) & mask;
        }
    }

    /// Removes `key`; returns its value.
    pub fn remove(&mut self, key: u64) -> Option<V> {
        if key == EMPTY {
            return self.zero.take();
        }
        let mut hole = self.find(key)?;
        let value = self.slots.get(hole).map(|s| s.value);
        // Backward shift: move every following entry of the probe run that may live at the
        // hole into it, so that no lookup ever stops early at a hole.
        let mask = self.mask();
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let Some(&next) = self.slots.get(j) else {
                break;
            };
            if next.key == EMPTY {
                break;
            }
            let home = self.home(next.key);
            if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
                if let Some(h) = self.slots.get_mut(hole) {
                    *h = next;
                }
                hole = j;
            }
        }
        if let Some(h) = self.slots.get_mut(hole) {
            h.key = EMPTY;
            h.value = V::default();
        }
        self.len -= 1;
        value
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, V)> + '_ {
        self.zero.map(|v| (EMPTY, v)).into_iter().chain(
            self.slots
                .iter()
                .filter(|s| s.key != EMPTY)
                .map(|s| (s.key, s.value)),
        )
    }

    /// Removes every entry and frees the table.
    pub fn clear(&mut self) {
        self.slots = Vec::new();
        self.len = 0;
        self.zero = None;
        self.shift = 64;
    }

    /// Shrinks the table to hold at least `min` entries (and every current one).
    pub fn shrink_to(&mut self, min: usize) {
        let want = if self.len.max(min) == 0 {
            0
        } else {
            slots_for(self.len.max(min))
        };
        if want < self.slots.len() {
            self.resize(want);
        }
    }

    /// Rehashes into `n` slots (a power of two ≥ what the entries need, or 0 when empty).
    fn resize(&mut self, n: usize) {
        let old = std::mem::take(&mut self.slots);
        self.slots = vec![
            Slot {
                key: EMPTY,
                value: V::default()
            };
            n
        ];
        self.shift = if n == 0 { 64 } else { 64 - n.trailing_zeros() };
        let mask = self.mask();
        for s in old.into_iter().filter(|s| s.key != EMPTY) {
            let mut i = self.home(s.key);
            while let Some(t) = self.slots.get_mut(i) {
                if t.key == EMPTY {
                    *t = s;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
    }
}

/// Entries a table of `slots` slots may hold: three quarters.
fn max_len(slots: usize) -> usize {
    slots / 4 * 3
}

/// The smallest table (a power of two, at least [`MIN_SLOTS`]) that holds `n` entries.
fn slots_for(n: usize) -> usize {
    let mut s = MIN_SLOTS;
    while max_len(s) < n {
        s *= 2;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        Bump(u64),
        Shrink(usize),
    }

    /// Keys from a small range, so that operations collide, probe runs wrap around the table
    /// and key 0 turns up; keys that differ only in their top bits; any keys.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..64, (0u64..8).prop_map(|k| k << 58), any::<u64>()]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (key(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            3 => key().prop_map(Op::Remove),
            1 => key().prop_map(Op::Bump),
            1 => (0usize..40).prop_map(Op::Shrink),
        ]
    }

    proptest! {
        /// Every operation leaves the map equal to a `HashMap` given the same operations, and
        /// batched lookups agree with single ones.
        #[test]
        fn behaves_as_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut m = BlockMap::<u32>::new();
            let mut model = HashMap::<u64, u32>::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => prop_assert_eq!(m.insert(k, v), model.insert(k, v)),
                    Op::Remove(k) => prop_assert_eq!(m.remove(k), model.remove(&k)),
                    Op::Bump(k) => {
                        let (v, inserted) = m.get_or_insert_with(k, || 7);
                        *v += 1;
                        prop_assert_eq!(inserted, !model.contains_key(&k));
                        *model.entry(k).or_insert(7) += 1;
                    }
                    Op::Shrink(n) => m.shrink_to(n),
                }
                prop_assert_eq!(m.len(), model.len());
                prop_assert!(m.len() <= m.capacity() + 1);
            }
            let mut got: Vec<_> = m.iter().collect();
            got.sort_unstable();
            let mut want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
            want.sort_unstable();
            prop_assert_eq!(got, want);
            let keys: Vec<u64> = (0..64).chain((0..8).map(|k| k << 58)).collect();
            for batch in [1, 3, BATCH] {
                let mut run = Vec::new();
                m.for_each_leading(&keys, batch, |v| { run.push(v); true });
                let want: Vec<u32> = keys.iter().map_while(|k| model.get(k).copied()).collect();
                prop_assert_eq!(run, want);
            }
            for chunk in keys.chunks(BATCH) {
                let mut out = [None; BATCH];
                m.get_batch(chunk, &mut out);
                for (k, o) in chunk.iter().zip(out) {
                    prop_assert_eq!(o, model.get(k).copied());
                    prop_assert_eq!(m.get(*k), model.get(k).copied());
                }
            }
        }
    }

    #[test]
    fn each_map_draws_its_own_multiplier() {
        let (a, b) = (BlockMap::<u32>::new(), BlockMap::<u32>::new());
        assert_eq!(a.mul & 1, 1);
        assert_ne!(a.mul, b.mul, "equal with probability 2^-63");
    }

    #[test]
    fn grows_and_shrinks_with_its_entries() {
        let mut m = BlockMap::<u64>::new();
        assert_eq!(m.heap_bytes(), 0);
        for k in 1..=1000u64 {
            m.insert(k.wrapping_mul(0x1234_5678_9abc_def1), k);
        }
        assert_eq!(m.len(), 1000);
        assert!(m.capacity() >= 1000 && m.capacity() < 4000);
        for k in 1..=990u64 {
            assert_eq!(m.remove(k.wrapping_mul(0x1234_5678_9abc_def1)), Some(k));
        }
        let before = m.heap_bytes();
        m.shrink_to(20);
        assert!(m.heap_bytes() < before / 16);
        for k in 991..=1000u64 {
            assert_eq!(m.get(k.wrapping_mul(0x1234_5678_9abc_def1)), Some(k));
        }
        m.clear();
        assert!(m.is_empty());
        assert_eq!(m.get(5), None);
    }
}
