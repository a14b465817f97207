//! The in-process store: token buckets in a sharded map, one short lock per budget touched.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ahash::{AHashMap, RandomState};
use parking_lot::Mutex;

use super::store::{
    Admission, Budget, BudgetKind, Check, CheckState, FailMode, LimitStore, Settle, StoreError,
    StoreFuture, StoreStats,
};

const SHARDS: usize = 64;
/// Entries untouched this long, full, and with nothing in flight are forgotten.
const IDLE_MS: f64 = 120_000.0;
/// Admissions between two sweeps of one shard.
const SWEEP_EVERY: u64 = 4096;

/// A token bucket refilling `capacity` per minute, continuously.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bucket {
    /// Tokens available (negative: debt).
    pub level: f64,
    /// When `level` was computed, in ms since the store started.
    pub at_ms: f64,
}

impl Bucket {
    fn full(capacity: u64, now: f64) -> Bucket {
        Bucket {
            level: capacity as f64,
            at_ms: now,
        }
    }

    /// Refills up to `capacity` for the time elapsed.
    fn refill(&mut self, capacity: u64, now: f64) {
        let cap = capacity as f64;
        if now > self.at_ms {
            self.level = (self.level + (now - self.at_ms) * cap / 60_000.0).min(cap);
            self.at_ms = now;
        }
        if self.level > cap {
            self.level = cap;
        }
    }

    /// Whether `need` fits now. A request larger than the whole capacity fits only in a full
    /// bucket (it then leaves a debt), so that it is not refused forever.
    fn fits(&self, capacity: u64, need: f64) -> bool {
        need <= self.level || (need > capacity as f64 && self.level >= capacity as f64)
    }

    /// Milliseconds until `need` fits.
    fn wait_ms(&self, capacity: u64, need: f64) -> u64 {
        let cap = capacity as f64;
        let target = need.min(cap);
        ceil_ms((target - self.level).max(0.0) * 60_000.0 / cap.max(1.0))
    }

    fn budget(&self, capacity: u64) -> Budget {
        let cap = capacity as f64;
        Budget {
            limit: capacity,
            remaining: self.level.max(0.0).floor() as u64,
            reset_ms: ceil_ms((cap - self.level).max(0.0) * 60_000.0 / cap.max(1.0)),
        }
    }
}

fn ceil_ms(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        ms.ceil() as u64
    } else {
        0
    }
}

#[derive(Debug)]
struct Entry {
    tokens: Option<Bucket>,
    requests: Option<Bucket>,
    in_flight: u64,
    touched_ms: f64,
}

type Key = (Arc<str>, Arc<str>);

/// Budgets of one process. The default store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<AHashMap<Key, Entry>>]>,
    hasher: RandomState,
    start: Instant,
    stats: StoreStats,
    ops: AtomicU64,
    lease: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(AHashMap::new())).collect(),
            hasher: RandomState::with_seeds(1, 2, 3, 4),
            start: Instant::now(),
            stats: StoreStats::default(),
            ops: AtomicU64::new(0),
            lease: AtomicU64::new(1),
        }
    }

    fn now_ms(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1000.0
    }

    fn shard(&self, limit: &str, tenant: &str) -> &Mutex<AHashMap<Key, Entry>> {
        let mut h = self.hasher.build_hasher();
        limit.hash(&mut h);
        tenant.hash(&mut h);
        let i = (h.finish() as usize) % self.shards.len();
        // `i` is in range by construction; fall back to the first shard rather than panic.
        self.shards.get(i).unwrap_or(&self.shards[0])
    }

    /// Number of budgets held (for tests and the status page).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether no budget is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The synchronous admission ([`LimitStore::admit`] wraps it).
    pub fn admit_now(&self, checks: &[Check]) -> Admission {
        let now = self.now_ms();
        let mut states = Vec::with_capacity(checks.len());
        let mut refused: Option<(usize, BudgetKind, u64)> = None;
        // Charge one by one; on a refusal undo what was charged. Each budget is locked only
        // while it is updated.
        for (i, c) in checks.iter().enumerate() {
            let mut shard = self.shard(&c.limit, &c.tenant).lock();
            let e = shard
                .entry((c.limit.clone(), c.tenant.clone()))
                .or_insert_with(|| Entry {
                    tokens: None,
                    requests: None,
                    in_flight: 0,
                    touched_ms: now,
                });
            e.touched_ms = now;
            let need = c.tokens as f64;
            if let Some(cap) = c.tokens_per_minute {
                let b = e.tokens.get_or_insert_with(|| Bucket::full(cap, now));
                b.refill(cap, now);
                if !b.fits(cap, need) {
                    refused = Some((i, BudgetKind::Tokens, b.wait_ms(cap, need)));
                }
            }
            if refused.is_none()
                && let Some(cap) = c.requests_per_minute
            {
                let b = e.requests.get_or_insert_with(|| Bucket::full(cap, now));
                b.refill(cap, now);
                if !b.fits(cap, 1.0) {
                    refused = Some((i, BudgetKind::Requests, b.wait_ms(cap, 1.0)));
                }
            }
            if refused.is_none()
                && let Some(max) = c.concurrent_requests
                && e.in_flight >= max
            {
                refused = Some((i, BudgetKind::Concurrency, 1000));
            }
            if refused.is_none() {
                if let (Some(_), Some(b)) = (c.tokens_per_minute, e.tokens.as_mut()) {
                    b.level -= need;
                }
                if let (Some(_), Some(b)) = (c.requests_per_minute, e.requests.as_mut()) {
                    b.level -= 1.0;
                }
                if c.concurrent_requests.is_some() {
                    e.in_flight += 1;
                }
            }
            states.push(state_of(c, e));
            if refused.is_some() {
                break;
            }
        }
        let ops = self.ops.fetch_add(1, Ordering::Relaxed);
        if ops.is_multiple_of(SWEEP_EVERY) {
            self.sweep_shard((ops / SWEEP_EVERY) as usize % SHARDS, now);
        }
        match refused {
            None => Admission::Admitted {
                states,
                lease: self.lease.fetch_add(1, Ordering::Relaxed),
            },
            Some((index, kind, retry_after_ms)) => {
                // Undo the checks charged before the refused one.
                for c in checks.iter().take(index) {
                    self.give_back(c.limit.clone(), c.tenant.clone(), |e| {
                        if let (Some(cap), Some(b)) = (c.tokens_per_minute, e.tokens.as_mut()) {
                            b.level = (b.level + c.tokens as f64).min(cap as f64);
                        }
                        if let (Some(cap), Some(b)) = (c.requests_per_minute, e.requests.as_mut()) {
                            b.level = (b.level + 1.0).min(cap as f64);
                        }
                        if c.concurrent_requests.is_some() {
                            e.in_flight = e.in_flight.saturating_sub(1);
                        }
                    });
                }
                // States for headers, as nothing was charged (the checks before the refused
                // one were charged, then given back) and refilled to now (the checks after it
                // were not reached), as the Redis store reports them.
                for (i, c) in checks.iter().enumerate() {
                    if i == index {
                        continue;
                    }
                    let mut shard = self.shard(&c.limit, &c.tenant).lock();
                    let st = match shard.get_mut(&(c.limit.clone(), c.tenant.clone())) {
                        Some(e) => {
                            refill_entry(c, e, now);
                            state_of(c, e)
                        }
                        None => full_state(c),
                    };
                    if let Some(s) = states.get_mut(i) {
                        *s = st;
                    } else {
                        states.push(st);
                    }
                }
                Admission::Refused {
                    index,
                    kind,
                    retry_after_ms,
                    states,
                }
            }
        }
    }

    fn give_back(&self, limit: Arc<str>, tenant: Arc<str>, f: impl FnOnce(&mut Entry)) {
        let mut shard = self.shard(&limit, &tenant).lock();
        if let Some(e) = shard.get_mut(&(limit, tenant)) {
            f(e);
        }
    }

    fn sweep_shard(&self, i: usize, now: f64) {
        if let Some(shard) = self.shards.get(i) {
            shard.lock().retain(|_, e| {
                e.in_flight > 0
                    || now - e.touched_ms < IDLE_MS
                    || e.tokens.is_some_and(|b| b.level < 0.0)
            });
        }
    }
}

/// Refills the buckets of `c` in `e` to `now`.
fn refill_entry(c: &Check, e: &mut Entry, now: f64) {
    if let (Some(cap), Some(b)) = (c.tokens_per_minute, e.tokens.as_mut()) {
        b.refill(cap, now);
    }
    if let (Some(cap), Some(b)) = (c.requests_per_minute, e.requests.as_mut()) {
        b.refill(cap, now);
    }
}

fn state_of(c: &Check, e: &Entry) -> CheckState {
    CheckState {
        tokens: c
            .tokens_per_minute
            .zip(e.tokens)
            .map(|(cap, b)| b.budget(cap)),
        requests: c
            .requests_per_minute
            .zip(e.requests)
            .map(|(cap, b)| b.budget(cap)),
        in_flight: c.concurrent_requests.map(|_| e.in_flight),
    }
}

fn full_state(c: &Check) -> CheckState {
    let full = |cap: u64| Budget {
        limit: cap,
        remaining: cap,
        reset_ms: 0,
    };
    CheckState {
        tokens: c.tokens_per_minute.map(full),
        requests: c.requests_per_minute.map(full),
        in_flight: c.concurrent_requests.map(|_| 0),
    }
}

impl LimitStore for MemoryStore {
    fn admit<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a, Result<Admission, StoreError>> {
        let out = self.admit_now(checks);
        Box::pin(std::future::ready(Ok(out)))
    }

    fn settle(&self, settlements: Vec<Settle>) {
        let now = self.now_ms();
        for s in settlements {
            let (limit, tenant) = (s.limit.clone(), s.tenant.clone());
            let debt = s.tokens_per_minute.filter(|_| s.token_delta < 0);
            if let Some(cap) = debt {
                // A budget forgotten meanwhile (a request longer than the idle time) was full:
                // its debt is charged all the same, as the Redis store does.
                let mut shard = self.shard(&limit, &tenant).lock();
                shard
                    .entry((limit.clone(), tenant.clone()))
                    .or_insert_with(|| Entry {
                        tokens: None,
                        requests: None,
                        in_flight: 0,
                        touched_ms: now,
                    })
                    .tokens
                    .get_or_insert_with(|| Bucket::full(cap, now));
            }
            self.give_back(limit, tenant, |e| {
                if let (Some(cap), Some(b)) = (s.tokens_per_minute, e.tokens.as_mut()) {
                    b.refill(cap, now);
                    b.level = (b.level + s.token_delta as f64).min(cap as f64);
                }
                if s.release_concurrency {
                    e.in_flight = e.in_flight.saturating_sub(1);
                }
                e.touched_ms = now;
            });
        }
    }

    fn fail_mode(&self) -> FailMode {
        FailMode::Open
    }

    fn stats(&self) -> &StoreStats {
        &self.stats
    }
}
