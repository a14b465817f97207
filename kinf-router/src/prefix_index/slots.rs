//! Dense slot numbers for endpoints, so that block holder sets can be small arrays or bitsets.

use std::collections::HashMap;

use super::EndpointId;

/// Largest number of endpoints an index can hold at once (slots must fit in 31 bits).
pub(crate) const MAX_SLOTS: usize = 1 << 31;

/// What a slot is allocated for: an endpoint and, for an endpoint serving several
/// data-parallel ranks (each with a cache and event stream of its own), the rank; 0 otherwise.
pub(crate) type Key = (EndpointId, u32);

/// `(endpoint, rank)` → dense slot, with per-slot state `T`. Freed slots are reused. Matches
/// report a slot's endpoint ([`ids`](Self::ids)), whatever its rank.
#[derive(Debug, Clone)]
pub(crate) struct Slots<T> {
    slot_of: HashMap<Key, u32, ahash::RandomState>,
    /// `ids[slot]` is the endpoint in that slot (stale for free slots).
    ids: Vec<EndpointId>,
    /// `ranks[slot]` is its rank.
    ranks: Vec<u32>,
    /// Live slots of a rank other than 0: without any, an endpoint's slots are found by one
    /// lookup instead of a pass.
    ranked: usize,
    states: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            slot_of: HashMap::default(),
            ids: Vec::new(),
            ranks: Vec::new(),
            ranked: 0,
            states: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slots<T> {
    #[inline]
    pub(crate) fn slot(&self, key: Key) -> Option<u32> {
        self.slot_of.get(&key).copied()
    }

    /// The slot of `key`, allocating one (with state `make()`) if needed; `None` when full.
    pub(crate) fn slot_or_insert(&mut self, key: Key, make: impl FnOnce() -> T) -> Option<u32> {
        if let Some(s) = self.slot(key) {
            return Some(s);
        }
        let s = match self.free.pop() {
            Some(s) => {
                let i = s as usize;
                if let (Some(slot_id), Some(rank), Some(state)) = (
                    self.ids.get_mut(i),
                    self.ranks.get_mut(i),
                    self.states.get_mut(i),
                ) {
                    *slot_id = key.0;
                    *rank = key.1;
                    *state = Some(make());
                }
                s
            }
            None => {
                if self.ids.len() >= MAX_SLOTS - 1 {
                    return None;
                }
                let s = u32::try_from(self.ids.len()).ok()?;
                self.ids.push(key.0);
                self.ranks.push(key.1);
                self.states.push(Some(make()));
                s
            }
        };
        self.slot_of.insert(key, s);
        if key.1 != 0 {
            self.ranked += 1;
        }
        Some(s)
    }

    /// Frees the slot of `key` and returns its state.
    pub(crate) fn remove(&mut self, key: Key) -> Option<(u32, T)> {
        let s = self.slot_of.remove(&key)?;
        let state = self.states.get_mut(s as usize)?.take()?;
        self.free.push(s);
        if key.1 != 0 {
            self.ranked -= 1;
        }
        Some((s, state))
    }

    /// The live slots of endpoint `id`, one per rank (a lookup while every slot is of rank
    /// 0, else a pass over the slots).
    pub(crate) fn slots_of(&self, id: EndpointId) -> Vec<u32> {
        if self.ranked == 0 {
            return self.slot((id, 0)).into_iter().collect();
        }
        self.iter()
            .map(|(s, _)| s)
            .filter(|&s| self.id(s) == id)
            .collect()
    }

    /// The key of a live slot.
    pub(crate) fn key(&self, slot: u32) -> Key {
        (
            self.id(slot),
            self.ranks.get(slot as usize).copied().unwrap_or(0),
        )
    }

    /// The distinct endpoints of the live slots, sorted.
    pub(crate) fn endpoint_ids(&self) -> Vec<EndpointId> {
        let mut v: Vec<EndpointId> = self.iter().map(|(s, _)| self.id(s)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Gives every live slot's endpoint the id `rename` returns for it (its rank stays),
    /// keeping the slot (and so everything stored by slot). `rename` must be injective over
    /// the live endpoints; a slot whose new key an earlier one already took is left out of the
    /// key map, so callers drop (or [`plan_remap`]) such endpoints first.
    pub(crate) fn rename(&mut self, mut rename: impl FnMut(EndpointId) -> EndpointId) {
        let mut slot_of: HashMap<Key, u32, ahash::RandomState> =
            HashMap::with_capacity_and_hasher(self.slot_of.len(), Default::default());
        for (i, ((id, rank), state)) in self
            .ids
            .iter_mut()
            .zip(&self.ranks)
            .zip(&self.states)
            .enumerate()
        {
            if state.is_none() {
                continue;
            }
            let new = rename(*id);
            if let std::collections::hash_map::Entry::Vacant(e) = slot_of.entry((new, *rank)) {
                e.insert(i as u32);
                *id = new;
            }
        }
        self.slot_of = slot_of;
    }

    #[inline]
    pub(crate) fn id(&self, slot: u32) -> EndpointId {
        self.ids
            .get(slot as usize)
            .copied()
            .unwrap_or(EndpointId(u32::MAX))
    }

    #[inline]
    pub(crate) fn ids(&self) -> &[EndpointId] {
        &self.ids
    }

    #[inline]
    pub(crate) fn get(&self, slot: u32) -> Option<&T> {
        self.states.get(slot as usize)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
        self.states.get_mut(slot as usize)?.as_mut()
    }

    /// Number of live endpoints.
    pub(crate) fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Live `(slot, state)` pairs.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.states
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i as u32, s)))
    }

    /// Heap bytes of the bookkeeping itself (not of the states' own heap data).
    pub(crate) fn heap_bytes(&self) -> usize {
        super::exact::table_bytes(self.slot_of.capacity(), std::mem::size_of::<(Key, u32)>())
            + self.ids.capacity() * std::mem::size_of::<EndpointId>()
            + self.ranks.capacity() * 4
            + self.states.capacity() * std::mem::size_of::<Option<T>>()
            + self.free.capacity() * 4
    }
}

/// Splits a remapping of endpoint ids (`remap`: the new id, or `None` to forget the
/// endpoint) into the endpoints to remove and the renaming of the others. An endpoint whose
/// new id an earlier one already took is removed too, so that the renaming is injective.
pub(crate) fn plan_remap(
    ids: impl Iterator<Item = EndpointId>,
    mut remap: impl FnMut(EndpointId) -> Option<EndpointId>,
) -> (
    Vec<EndpointId>,
    HashMap<EndpointId, EndpointId, ahash::RandomState>,
) {
    let mut drop = Vec::new();
    let mut rename: HashMap<EndpointId, EndpointId, ahash::RandomState> = HashMap::default();
    let mut taken: std::collections::HashSet<EndpointId, ahash::RandomState> =
        std::collections::HashSet::default();
    for id in ids {
        match remap(id) {
            Some(new) if taken.insert(new) => {
                rename.insert(id, new);
            }
            _ => drop.push(id),
        }
    }
    (drop, rename)
}
