//! Compact sets of endpoint slots holding one block.
//!
//! A [`Holders`] is 8 bytes: one or two slots inline (most blocks live on one or two endpoints),
//! otherwise an index into a [`HolderStore`] arena entry that is a sorted `Vec<u32>` or a bitset,
//! whichever is smaller for the slots it holds.

/// Tag bits of a [`Holders`] word.
const TAG_SHIFT: u32 = 62;
const TAG_TWO: u64 = 1 << TAG_SHIFT;
const TAG_SET: u64 = 2 << TAG_SHIFT;
const TAG_MASK: u64 = 3 << TAG_SHIFT;
const SLOT_BITS: u32 = 31;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;

/// The endpoints (dense slots) holding one block; never empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holders(u64);

/// A read-only view of a [`Holders`] set.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View<'a> {
    One(u32),
    Two(u32, u32),
    /// Sorted slots.
    List(&'a [u32]),
    /// Bit `s` set ⇔ slot `s` holds the block.
    Bits(&'a [u64]),
}

impl View<'_> {
    #[inline]
    pub(crate) fn contains(&self, s: u32) -> bool {
        match *self {
            View::One(a) => a == s,
            View::Two(a, b) => a == s || b == s,
            View::List(l) => l.binary_search(&s).is_ok(),
            View::Bits(w) => bit(w, s),
        }
    }

    /// Calls `f` for every slot, in increasing order.
    #[inline]
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32)) {
        match *self {
            View::One(a) => f(a),
            View::Two(a, b) => {
                f(a);
                f(b);
            }
            View::List(l) => l.iter().copied().for_each(f),
            View::Bits(words) => {
                for (wi, &w) in words.iter().enumerate() {
                    let mut w = w;
                    while w != 0 {
                        f(wi as u32 * 64 + w.trailing_zeros());
                        w &= w - 1;
                    }
                }
            }
        }
    }
}

#[inline]
pub(crate) fn bit(words: &[u64], s: u32) -> bool {
    words
        .get((s / 64) as usize)
        .is_some_and(|w| w & (1 << (s % 64)) != 0)
}

/// An arena entry for blocks held by three or more endpoints.
#[derive(Debug, Clone)]
enum SetBody {
    /// Sorted slots.
    List(Vec<u32>),
    /// Bitset over slots, with its population count.
    Bits { words: Vec<u64>, count: u32 },
}

impl SetBody {
    fn count(&self) -> usize {
        match self {
            SetBody::List(l) => l.len(),
            SetBody::Bits { count, .. } => *count as usize,
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            SetBody::List(l) => l.capacity() * 4,
            SetBody::Bits { words, .. } => words.capacity() * 8,
        }
    }

    /// The first two slots (used when collapsing back to inline).
    fn first_two(&self) -> (u32, u32) {
        let mut v = [u32::MAX; 2];
        let mut n = 0;
        View::from_body(self).for_each(|s| {
            if let Some(x) = v.get_mut(n) {
                *x = s;
            }
            n += 1;
        });
        (v[0], v[1])
    }

    /// Switches representation when the other one is clearly smaller.
    fn rebalance(&mut self) {
        match self {
            SetBody::List(l) => {
                let max = l.last().copied().unwrap_or(0);
                let words = max as usize / 64 + 1;
                if l.len() * 4 > words * 8 {
                    let mut w = vec![0u64; words];
                    for &s in l.iter() {
                        if let Some(x) = w.get_mut((s / 64) as usize) {
                            *x |= 1 << (s % 64);
                        }
                    }
                    *self = SetBody::Bits {
                        words: w,
                        count: l.len() as u32,
                    };
                }
            }
            SetBody::Bits { words, count } => {
                // Trim trailing zero words, then go back to a list when it is < half the size.
                while words.last() == Some(&0) {
                    words.pop();
                }
                if (*count as usize) * 4 * 2 < words.len() * 8 {
                    let mut l = Vec::with_capacity(*count as usize);
                    View::Bits(words).for_each(|s| l.push(s));
                    *self = SetBody::List(l);
                }
            }
        }
    }
}

impl<'a> View<'a> {
    fn from_body(b: &'a SetBody) -> Self {
        match b {
            SetBody::List(l) => View::List(l),
            SetBody::Bits { words, .. } => View::Bits(words),
        }
    }
}

/// Result of removing a slot from a [`Holders`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// The slot was not in the set.
    NotHeld,
    /// Removed; the set is not empty.
    Held,
    /// Removed the last slot: the caller must drop the block.
    Empty,
}

/// Arena of the holder sets with three or more slots.
#[derive(Debug, Clone, Default)]
pub(crate) struct HolderStore {
    sets: Vec<SetBody>,
    free: Vec<u32>,
}

/// Only fills the empty slots of a [`BlockMap`](crate::block_map::BlockMap); never read as a
/// set.
impl Default for Holders {
    fn default() -> Self {
        Self(0)
    }
}

impl Holders {
    #[inline]
    pub(crate) fn one(s: u32) -> Self {
        Holders(u64::from(s) & SLOT_MASK)
    }

    #[inline]
    fn two(a: u32, b: u32) -> Self {
        let (a, b) = if a < b { (a, b) } else { (b, a) };
        Holders(TAG_TWO | ((u64::from(b) & SLOT_MASK) << SLOT_BITS) | (u64::from(a) & SLOT_MASK))
    }

    #[inline]
    fn set(i: u32) -> Self {
        Holders(TAG_SET | u64::from(i))
    }

    #[inline]
    fn set_index(self) -> Option<usize> {
        (self.0 & TAG_MASK == TAG_SET).then_some((self.0 & !TAG_MASK) as usize)
    }
}

impl HolderStore {
    /// A view of `h`.
    #[inline]
    pub(crate) fn view(&self, h: Holders) -> View<'_> {
        match h.0 & TAG_MASK {
            0 => View::One((h.0 & SLOT_MASK) as u32),
            TAG_TWO => View::Two(
                (h.0 & SLOT_MASK) as u32,
                ((h.0 >> SLOT_BITS) & SLOT_MASK) as u32,
            ),
            _ => match self.sets.get((h.0 & !TAG_MASK) as usize) {
                Some(b) => View::from_body(b),
                None => View::List(&[]),
            },
        }
    }

    /// Adds slot `s`; returns whether it was new.
    pub(crate) fn insert(&mut self, h: &mut Holders, s: u32) -> bool {
        match self.view(*h) {
            View::One(a) => {
                if a == s {
                    return false;
                }
                *h = Holders::two(a, s);
                true
            }
            View::Two(a, b) => {
                if a == s || b == s {
                    return false;
                }
                let mut l = vec![a, b, s];
                l.sort_unstable();
                let mut body = SetBody::List(l);
                body.rebalance();
                *h = Holders::set(self.alloc(body));
                true
            }
            View::List(_) | View::Bits(_) => {
                let Some(body) = h.set_index().and_then(|i| self.sets.get_mut(i)) else {
                    return false;
                };
                let added = match body {
                    SetBody::List(l) => match l.binary_search(&s) {
                        Ok(_) => false,
                        Err(pos) => {
                            l.insert(pos, s);
                            true
                        }
                    },
                    SetBody::Bits { words, count } => {
                        let wi = (s / 64) as usize;
                        if wi >= words.len() {
                            words.resize(wi + 1, 0);
                        }
                        match words.get_mut(wi) {
                            Some(w) if *w & (1 << (s % 64)) == 0 => {
                                *w |= 1 << (s % 64);
                                *count += 1;
                                true
                            }
                            _ => false,
                        }
                    }
                };
                if added {
                    body.rebalance();
                }
                added
            }
        }
    }

    /// Removes slot `s`.
    pub(crate) fn remove(&mut self, h: &mut Holders, s: u32) -> Removed {
        match self.view(*h) {
            View::One(a) => {
                if a == s {
                    Removed::Empty
                } else {
                    Removed::NotHeld
                }
            }
            View::Two(a, b) => {
                if a == s {
                    *h = Holders::one(b);
                    Removed::Held
                } else if b == s {
                    *h = Holders::one(a);
                    Removed::Held
                } else {
                    Removed::NotHeld
                }
            }
            View::List(_) | View::Bits(_) => {
                let Some(i) = h.set_index() else {
                    return Removed::NotHeld;
                };
                let Some(body) = self.sets.get_mut(i) else {
                    return Removed::NotHeld;
                };
                let removed = match body {
                    SetBody::List(l) => match l.binary_search(&s) {
                        Ok(pos) => {
                            l.remove(pos);
                            true
                        }
                        Err(_) => false,
                    },
                    SetBody::Bits { words, count } => match words.get_mut((s / 64) as usize) {
                        Some(w) if *w & (1 << (s % 64)) != 0 => {
                            *w &= !(1 << (s % 64));
                            *count -= 1;
                            true
                        }
                        _ => false,
                    },
                };
                if !removed {
                    return Removed::NotHeld;
                }
                if body.count() <= 2 {
                    let (a, b) = body.first_two();
                    *h = Holders::two(a, b);
                    self.release(i);
                } else {
                    body.rebalance();
                }
                Removed::Held
            }
        }
    }

    fn alloc(&mut self, body: SetBody) -> u32 {
        if let Some(i) = self.free.pop()
            && let Some(slot) = self.sets.get_mut(i as usize)
        {
            *slot = body;
            return i;
        }
        self.sets.push(body);
        (self.sets.len() - 1) as u32
    }

    fn release(&mut self, i: usize) {
        if let Some(b) = self.sets.get_mut(i) {
            *b = SetBody::List(Vec::new());
            self.free.push(i as u32);
        }
    }

    /// Frees every set (used when the whole index is cleared).
    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Number of arena sets in use.
    #[cfg(test)]
    pub(crate) fn sets_in_use(&self) -> usize {
        self.sets.len() - self.free.len()
    }

    /// Heap bytes held by the arena.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.sets.capacity() * std::mem::size_of::<SetBody>()
            + self.free.capacity() * 4
            + self.sets.iter().map(SetBody::heap_bytes).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn slots(st: &HolderStore, h: Holders) -> Vec<u32> {
        let mut v = Vec::new();
        st.view(h).for_each(|s| v.push(s));
        v
    }

    #[test]
    fn grows_and_shrinks_through_all_representations() {
        let mut st = HolderStore::default();
        let mut h = Holders::one(5);
        let mut model = BTreeSet::from([5u32]);
        // Many slots spread wide, then dense, then removed again.
        let adds: Vec<u32> = (0..200).map(|i| (i * 37) % 700).collect();
        for &s in &adds {
            assert_eq!(st.insert(&mut h, s), model.insert(s));
            assert_eq!(slots(&st, h), model.iter().copied().collect::<Vec<_>>());
        }
        for &s in adds.iter().rev() {
            if model.len() == 1 {
                break;
            }
            let r = st.remove(&mut h, s);
            assert_eq!(r == Removed::Held, model.remove(&s));
            assert_eq!(slots(&st, h), model.iter().copied().collect::<Vec<_>>());
        }
        assert_eq!(st.sets_in_use(), 0);
        let last = *model.iter().next().unwrap_or(&0);
        assert_eq!(st.remove(&mut h, last + 1), Removed::NotHeld);
        assert_eq!(st.remove(&mut h, last), Removed::Empty);
    }

    #[test]
    fn holders_is_eight_bytes() {
        assert_eq!(std::mem::size_of::<Holders>(), 8);
    }
}
