//! Decisions waiting for their `Report`: a bounded map with a time-to-live, so decisions that
//! are never reported cannot grow memory without bound.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::gateway::errors::Api;
use crate::gateway::forward::Chosen;

/// Default time a decision waits for its report.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// Default most decisions kept.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// A decision waiting for its report. Dropping it unreported (expired, evicted) gives back its
/// stream slot and its rate-limit concurrency, and keeps its estimated tokens charged.
#[derive(Debug)]
pub struct PendingDecision {
    /// The API the request came in on.
    pub api: Api,
    /// What was chosen.
    pub chosen: Chosen,
    /// Its rate-limit reservation, settled by the report.
    pub reservation: Option<crate::tenants::Reservation>,
    /// Its tenant's stream slot (a streamed request), held until the report.
    pub stream_slot: Option<crate::gateway::streams::StreamSlot>,
    /// The client asked for a stream: only then does a report's first-token time and
    /// inter-token gap mean anything.
    pub streamed: bool,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, (PendingDecision, Instant)>,
    order: VecDeque<(String, Instant)>,
}

/// The pending decisions. Oldest entries are dropped first when full; expired ones on each
/// insertion.
#[derive(Debug)]
pub struct Pending {
    inner: Mutex<Inner>,
    ttl: Duration,
    capacity: usize,
    seed: u64,
    counter: AtomicU64,
}

impl Default for Pending {
    fn default() -> Self {
        Pending::new(DEFAULT_TTL, DEFAULT_CAPACITY)
    }
}

impl Pending {
    /// A store keeping at most `capacity` decisions for at most `ttl` each.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        let seed = ahash::RandomState::new().hash_one(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        Pending {
            inner: Mutex::new(Inner::default()),
            ttl,
            capacity: capacity.max(1),
            seed,
            counter: AtomicU64::new(0),
        }
    }

    /// Stores a decision; returns its id.
    pub fn insert(&self, decision: PendingDecision) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let id = format!("{:016x}{n:08x}", self.seed);
        let now = Instant::now();
        let mut g = self.inner.lock();
        let inner = &mut *g;
        self.evict(inner, now, self.capacity.saturating_sub(1));
        // Reported decisions leave their key in `order`; compact it when they pile up.
        if inner.order.len() > 2 * self.capacity.max(inner.map.len()) {
            let map = &inner.map;
            inner
                .order
                .retain(|(k, at)| map.get(k).is_some_and(|(_, t)| t == at));
        }
        inner.order.push_back((id.clone(), now));
        inner.map.insert(id.clone(), (decision, now));
        id
    }

    /// Drops the expired decisions (their stream slots and rate-limit concurrency are given
    /// back). Called before a new decision takes its own.
    pub fn expire(&self) {
        let mut g = self.inner.lock();
        self.evict(&mut g, Instant::now(), usize::MAX);
    }

    /// Drops expired decisions, then the oldest until at most `keep` are held.
    fn evict(&self, inner: &mut Inner, now: Instant, keep: usize) {
        while let Some((k, at)) = inner.order.front() {
            let live = inner.map.get(k).is_some_and(|(_, t)| t == at);
            let expired = now.duration_since(*at) >= self.ttl;
            if live && !expired && inner.map.len() <= keep {
                break;
            }
            if live {
                inner.map.remove(k);
            }
            inner.order.pop_front();
        }
    }

    /// Takes the decision `id` out, if it is known and has not expired.
    pub fn take(&self, id: &str) -> Option<PendingDecision> {
        let (d, at) = self.inner.lock().map.remove(id)?;
        (at.elapsed() < self.ttl).then_some(d)
    }

    /// Decisions held.
    pub fn len(&self) -> usize {
        self.inner.lock().map.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
