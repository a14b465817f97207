//! The in-process store: token buckets in a sharded map, one short lock per budget touched.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ahash::{AHashMap, RandomState};
use parking_lot::{Mutex, MutexGuard};

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
    /// The capacity it was last refilled with (for the idle sweep, which has no limit at hand).
    pub capacity: u64,
}

impl Bucket {
    fn full(capacity: u64, now: f64) -> Bucket {
        Bucket {
            level: capacity as f64,
            at_ms: now,
            capacity,
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
        self.capacity = capacity;
    }

    /// Whether the bucket is full at `now` (whatever it holds has been earned back).
    fn is_full_at(&self, now: f64) -> bool {
        let cap = self.capacity as f64;
        self.level + (now - self.at_ms).max(0.0) * cap / 60_000.0 >= cap
    }

    /// Whether `need` fits now. A request larger than the whole capacity never fits (the
    /// [`Limiter`](super::Limiter) refuses it before asking the store).
    fn fits(&self, need: f64) -> bool {
        need <= self.level
    }

    /// Milliseconds until `need` fits (until the bucket is full, for more than it holds).
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

    fn shard_index(&self, limit: &str, tenant: &str) -> usize {
        let mut h = self.hasher.build_hasher();
        limit.hash(&mut h);
        tenant.hash(&mut h);
        (h.finish() as usize) % self.shards.len()
    }

    fn shard(&self, limit: &str, tenant: &str) -> &Mutex<AHashMap<Key, Entry>> {
        let i = self.shard_index(limit, tenant);
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
    ///
    /// Every check is decided and charged under the locks of all the shards it touches, taken
    /// in index order (settlements and sweeps hold one shard at a time, so no deadlock): the
    /// admission is all or nothing at one instant, as the Redis store's script is, and another
    /// request never sees a charge that is about to be undone. When refused, the bound named is
    /// the one that waits longest, so that `retry-after` is when the request would pass.
    pub fn admit_now(&self, checks: &[Check]) -> Admission {
        let now = self.now_ms();
        let shard_of: Vec<usize> = checks
            .iter()
            .map(|c| self.shard_index(&c.limit, &c.tenant))
            .collect();
        let mut order = shard_of.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: Vec<(usize, MutexGuard<'_, AHashMap<Key, Entry>>)> = order
            .into_iter()
            .filter_map(|i| self.shards.get(i).map(|s| (i, s.lock())))
            .collect();
        // Refill every bucket to now and find the bound that keeps the request out longest.
        let mut refused: Option<(usize, BudgetKind, u64)> = None;
        let mut refuse = |i: usize, kind: BudgetKind, wait: u64| {
            if refused.is_none_or(|(_, _, longest)| wait > longest) {
                refused = Some((i, kind, wait));
            }
        };
        for (i, c) in checks.iter().enumerate() {
            let Some(e) = entry_in(&mut guards, shard_of.get(i).copied(), c, now) else {
                continue;
            };
            e.touched_ms = now;
            if let Some(cap) = c.tokens_per_minute {
                let b = e.tokens.get_or_insert_with(|| Bucket::full(cap, now));
                b.refill(cap, now);
                let need = c.tokens as f64;
                if !b.fits(need) {
                    refuse(i, BudgetKind::Tokens, b.wait_ms(cap, need));
                }
            }
            if let Some(cap) = c.requests_per_minute {
                let b = e.requests.get_or_insert_with(|| Bucket::full(cap, now));
                b.refill(cap, now);
                if !b.fits(1.0) {
                    refuse(i, BudgetKind::Requests, b.wait_ms(cap, 1.0));
                }
            }
            if let Some(max) = c.concurrent_requests
                && e.in_flight >= max
            {
                refuse(i, BudgetKind::Concurrency, 1000);
            }
        }
        // Charge them all, or none; the states are as charged (admitted) or as they are
        // (refused).
        let mut states = Vec::with_capacity(checks.len());
        for (i, c) in checks.iter().enumerate() {
            let Some(e) = entry_in(&mut guards, shard_of.get(i).copied(), c, now) else {
                states.push(full_state(c));
                continue;
            };
            if refused.is_none() {
                if let (Some(_), Some(b)) = (c.tokens_per_minute, e.tokens.as_mut()) {
                    b.level -= c.tokens as f64;
                }
                if let (Some(_), Some(b)) = (c.requests_per_minute, e.requests.as_mut()) {
                    b.level -= 1.0;
                }
                if c.concurrent_requests.is_some() {
                    e.in_flight += 1;
                }
            }
            states.push(state_of(c, e));
        }
        drop(guards);
        let ops = self.ops.fetch_add(1, Ordering::Relaxed);
        if ops.is_multiple_of(SWEEP_EVERY) {
            self.sweep_shard((ops / SWEEP_EVERY) as usize % SHARDS, now);
        }
        match refused {
            None => Admission::Admitted {
                states,
                lease: self.lease.fetch_add(1, Ordering::Relaxed),
            },
            Some((index, kind, retry_after_ms)) => Admission::Refused {
                index,
                kind,
                retry_after_ms,
                states,
            },
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
            // Forgotten only when full: a debt (or a drained request bucket) is kept until it
            // is earned back, however long that takes, and then forgotten.
            shard.lock().retain(|_, e| {
                e.in_flight > 0
                    || now - e.touched_ms < IDLE_MS
                    || e.tokens.is_some_and(|b| !b.is_full_at(now))
                    || e.requests.is_some_and(|b| !b.is_full_at(now))
            });
        }
    }
}

/// The entry of `c` in the locked shard `shard` (created empty if absent); `None` only if that
/// shard was not locked, which [`MemoryStore::admit_now`] rules out.
fn entry_in<'g>(
    guards: &'g mut [(usize, MutexGuard<'_, AHashMap<Key, Entry>>)],
    shard: Option<usize>,
    c: &Check,
    now: f64,
) -> Option<&'g mut Entry> {
    let shard = shard?;
    let (_, map) = guards.iter_mut().find(|(i, _)| *i == shard)?;
    Some(
        map.entry((c.limit.clone(), c.tenant.clone()))
            .or_insert_with(|| Entry {
                tokens: None,
                requests: None,
                in_flight: 0,
                touched_ms: now,
            }),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tokens: u64) -> Check {
        Check {
            limit: "p/tpm".into(),
            tenant: "t".into(),
            tokens_per_minute: Some(100),
            tokens,
            requests_per_minute: None,
            concurrent_requests: None,
        }
    }

    fn sweep_all(store: &MemoryStore, now: f64) {
        for i in 0..SHARDS {
            store.sweep_shard(i, now);
        }
    }

    /// A budget left in debt is kept while the debt is not earned back (forgetting it would
    /// hand the tenant a full bucket), and forgotten once it is, however long after: it used
    /// to be kept until touched again, as its level when last touched was negative.
    #[test]
    fn idle_sweep_forgets_a_repaid_debt() {
        let store = MemoryStore::new();
        assert!(matches!(
            store.admit_now(&[check(100)]),
            Admission::Admitted { .. }
        ));
        // Used 1000 of the 100 reserved: 900 of debt, repaid after 10 minutes at 100/min.
        store.settle(vec![Settle {
            limit: "p/tpm".into(),
            tenant: "t".into(),
            tokens_per_minute: Some(100),
            token_delta: -900,
            release_concurrency: false,
            lease: 1,
        }]);
        let now = store.now_ms();
        sweep_all(&store, now + 5.0 * 60_000.0);
        assert_eq!(store.len(), 1, "a debt still owed was forgotten");
        sweep_all(&store, now + 11.0 * 60_000.0);
        assert!(store.is_empty(), "a repaid debt is kept forever");
    }
}
