//! Dense slot numbers for endpoints, so that block holder sets can be small arrays or bitsets.

use std::collections::HashMap;

use super::EndpointId;

/// Largest number of endpoints an index can hold at once (slots must fit in 31 bits).
pub(crate) const MAX_SLOTS: usize = 1 << 31;

/// Endpoint → dense slot, with per-slot state `T`. Freed slots are reused.
#[derive(Debug, Clone)]
pub(crate) struct Slots<T> {
    slot_of: HashMap<EndpointId, u32, ahash::RandomState>,
    /// `ids[slot]` is the endpoint in that slot (stale for free slots).
    ids: Vec<EndpointId>,
    states: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            slot_of: HashMap::default(),
            ids: Vec::new(),
            states: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slots<T> {
    #[inline]
    pub(crate) fn slot(&self, id: EndpointId) -> Option<u32> {
        self.slot_of.get(&id).copied()
    }

    /// The slot of `id`, allocating one (with state `make()`) if needed; `None` when full.
    pub(crate) fn slot_or_insert(
        &mut self,
        id: EndpointId,
        make: impl FnOnce() -> T,
    ) -> Option<u32> {
        if let Some(s) = self.slot(id) {
            return Some(s);
        }
        let s = match self.free.pop() {
            Some(s) => {
                let i = s as usize;
                if let (Some(slot_id), Some(state)) = (self.ids.get_mut(i), self.states.get_mut(i))
                {
                    *slot_id = id;
                    *state = Some(make());
                }
                s
            }
            None => {
                if self.ids.len() >= MAX_SLOTS - 1 {
                    return None;
                }
                let s = u32::try_from(self.ids.len()).ok()?;
                self.ids.push(id);
                self.states.push(Some(make()));
                s
            }
        };
        self.slot_of.insert(id, s);
        Some(s)
    }

    /// Frees the slot of `id` and returns its state.
    pub(crate) fn remove(&mut self, id: EndpointId) -> Option<(u32, T)> {
        let s = self.slot_of.remove(&id)?;
        let state = self.states.get_mut(s as usize)?.take()?;
        self.free.push(s);
        Some((s, state))
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
        super::exact::table_bytes(
            self.slot_of.capacity(),
            std::mem::size_of::<(EndpointId, u32)>(),
        ) + self.ids.capacity() * std::mem::size_of::<EndpointId>()
            + self.states.capacity() * std::mem::size_of::<Option<T>>()
            + self.free.capacity() * 4
    }
}
