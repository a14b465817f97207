//! The load floor of a worker set: for the endpoints a decision may use, the smallest value of
//! each input of a TTFT prediction (prefill tokens queued ahead, queued and running requests),
//! kept up to date on every change, so that a decision can bound the rank of every endpoint
//! that holds none of the prompt without scoring them.
//!
//! A candidate's rank (predicted TTFT plus its capacity costs, [`crate::predictor`]) never
//! falls when one of those inputs rises: every term is a non-negative coefficient times a
//! non-negative input (a negative coefficient is clamped to zero) and the sums and products of
//! non-negative numbers round monotonically. So the rank of a cold endpoint built from the
//! component-wise minima is at most that of any cold endpoint, and a decision whose best
//! holder ranks strictly lower needs to score only the holders (`decide/scan.rs`).
//!
//! The floor is a segment tree over the endpoints' positions, `O(log n)` per change and
//! `O(1)` to read; it also keeps the positions a decision must report as unavailable (not
//! ready, or stale) and whether any endpoint is usable at all.

use std::collections::BTreeSet;

use crate::state::EndpointState;

/// One endpoint's prediction inputs (for a request it holds nothing of), or the component-wise
/// minimum over several.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorInputs {
    /// Prefill tokens queued ahead ([`crate::state::InFlight::prefill_tokens`]).
    pub pending_prefill_tokens: u64,
    /// Queued requests, as the prediction counts them.
    pub queued: f64,
    /// Running requests, as the prediction counts them.
    pub running: f64,
}

impl FloorInputs {
    /// No endpoint: larger than any.
    const NONE: FloorInputs = FloorInputs {
        pending_prefill_tokens: u64::MAX,
        queued: f64::INFINITY,
        running: f64::INFINITY,
    };

    fn min(self, o: FloorInputs) -> FloorInputs {
        FloorInputs {
            pending_prefill_tokens: self.pending_prefill_tokens.min(o.pending_prefill_tokens),
            queued: self.queued.min(o.queued),
            running: self.running.min(o.running),
        }
    }

    /// Whether this is the floor of no endpoint at all.
    pub fn is_none(&self) -> bool {
        self.queued == f64::INFINITY
    }
}

/// See the module docs. Built by [`LoadFloor::build`]; every change to an endpoint's
/// readiness, staleness, newest load sample, in-flight counts or assumed cache contents must be
/// followed by [`LoadFloor::update`] for it (the [`crate::state::WorkerSetState`] and
/// [`crate::ClusterState`] methods that change them do).
#[derive(Clone, Debug, Default)]
pub struct LoadFloor {
    /// Endpoints covered.
    len: usize,
    /// Leaves start at `width` (a power of two); node `k`'s children are `2k` and `2k + 1`.
    width: usize,
    nodes: Vec<FloorInputs>,
    /// Positions of endpoints that are not ready, or stale.
    unavailable: BTreeSet<usize>,
    /// Endpoints that are ready and not stale.
    fresh: usize,
    /// Endpoints with assumed cache contents ([`EndpointState::assumed_cached_tokens`]).
    assumed: usize,
    /// Whether every endpoint's prefix-index id is its position.
    ids_are_positions: bool,
    /// Per position: bit 0 fresh, bit 1 assumed contents (what `fresh` and `assumed` count).
    flags: Vec<u8>,
}

/// What a decision can use the floor for, with the worker set's endpoints.
pub enum Usable<'f> {
    /// The floor covers every endpoint: `floor` bounds the usable endpoints (`is_none()`: there
    /// are none), and `unavailable` are the positions to report as not usable, in order.
    Yes {
        /// The component-wise minima over the usable endpoints.
        floor: FloorInputs,
        /// The positions of the endpoints that are not ready, or stale.
        unavailable: &'f BTreeSet<usize>,
    },
    /// Score every endpoint: the floor does not cover this set (built for another list,
    /// assumed cache contents, ids that are not positions) or no endpoint is both ready and
    /// fresh (a decision then uses the stale ones that are ready).
    No,
}

impl LoadFloor {
    /// The floor of `endpoints`.
    pub fn build(endpoints: &[EndpointState]) -> Self {
        let len = endpoints.len();
        let width = len.next_power_of_two().max(1);
        let mut f = LoadFloor {
            len,
            width,
            nodes: vec![FloorInputs::NONE; 2 * width],
            flags: vec![0; len],
            unavailable: BTreeSet::new(),
            fresh: 0,
            assumed: 0,
            ids_are_positions: endpoints
                .iter()
                .enumerate()
                .all(|(i, e)| e.index_id.0 as usize == i),
        };
        for (i, ep) in endpoints.iter().enumerate() {
            f.set_leaf(i, ep);
        }
        for k in (1..width).rev() {
            f.pull(k);
        }
        f
    }

    /// Takes in the current state of the endpoint at position `i`.
    pub fn update(&mut self, i: usize, ep: &EndpointState) {
        if i >= self.len {
            return;
        }
        self.set_leaf(i, ep);
        let mut k = (self.width + i) / 2;
        while k >= 1 {
            self.pull(k);
            k /= 2;
        }
    }

    /// Whether a decision can bound `endpoints` with this floor (see [`Usable`]).
    pub fn usable(&self, endpoints: &[EndpointState]) -> Usable<'_> {
        if self.len != endpoints.len()
            || self.assumed > 0
            || !self.ids_are_positions
            || (self.fresh == 0 && self.len > 0)
        {
            return Usable::No;
        }
        Usable::Yes {
            floor: self.nodes.get(1).copied().unwrap_or(FloorInputs::NONE),
            unavailable: &self.unavailable,
        }
    }

    /// Whether the floor is the one [`build`](Self::build) would give for `endpoints` (for
    /// checks in tests and debug builds).
    pub fn agrees_with(&self, endpoints: &[EndpointState]) -> bool {
        let b = LoadFloor::build(endpoints);
        self.len == b.len
            && self.nodes.get(1) == b.nodes.get(1)
            && self.unavailable == b.unavailable
            && self.fresh == b.fresh
            && self.assumed == b.assumed
            && self.ids_are_positions == b.ids_are_positions
    }

    fn set_leaf(&mut self, i: usize, ep: &EndpointState) {
        let fresh = ep.ready && !ep.stale;
        let assumed = ep.assumed_cached_tokens.is_some();
        let flags = u8::from(fresh) | (u8::from(assumed) << 1);
        if let Some(old) = self.flags.get_mut(i) {
            self.fresh -= usize::from(*old & 1 != 0);
            self.assumed -= usize::from(*old & 2 != 0);
            *old = flags;
        }
        self.fresh += usize::from(fresh);
        self.assumed += usize::from(assumed);
        if fresh {
            self.unavailable.remove(&i);
        } else {
            self.unavailable.insert(i);
        }
        let leaf = if fresh && !assumed {
            let p = crate::decide::prediction_inputs(ep, 0);
            FloorInputs {
                pending_prefill_tokens: p.pending_prefill_tokens,
                queued: p.queued,
                running: p.running,
            }
        } else {
            FloorInputs::NONE
        };
        if let Some(n) = self.nodes.get_mut(self.width + i) {
            *n = leaf;
        }
    }

    fn pull(&mut self, k: usize) {
        let l = self.nodes.get(2 * k).copied().unwrap_or(FloorInputs::NONE);
        let r = self
            .nodes
            .get(2 * k + 1)
            .copied()
            .unwrap_or(FloorInputs::NONE);
        if let Some(n) = self.nodes.get_mut(k) {
            *n = l.min(r);
        }
    }
}
