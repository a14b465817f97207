//! The interface between the [`Limiter`](super::Limiter) and where budgets live.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A boxed future returned by a store.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What to do with a request when the store cannot be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailMode {
    /// Admit it unlimited, and count it (`fail_open_admits`).
    Open,
    /// Refuse it with [`LimitError::Unavailable`](super::LimitError::Unavailable) (HTTP 503), and
    /// count it (`fail_closed_rejects`). The default, as for `kinference --limiter-fail-mode`:
    /// an outage of the limiter's store does not lift every tenant's limits.
    #[default]
    Closed,
}

impl std::str::FromStr for FailMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "open" | "Open" => Ok(FailMode::Open),
            "closed" | "Closed" => Ok(FailMode::Closed),
            _ => Err(format!("unknown fail mode `{s}` (open, closed)")),
        }
    }
}

/// One limit to check and charge for one request: the budget of (`limit`, `tenant`).
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// `policy/limit`.
    pub limit: Arc<str>,
    /// The tenant (`""` for requests without one).
    pub tenant: Arc<str>,
    /// Bucket capacity in tokens (`tokensPerMinute`), if the limit has one.
    pub tokens_per_minute: Option<u64>,
    /// Tokens to reserve (the estimate, restricted to what the limit counts).
    pub tokens: u64,
    /// Requests per minute, if the limit has one.
    pub requests_per_minute: Option<u64>,
    /// Requests in flight at most, if the limit has one.
    pub concurrent_requests: Option<u64>,
}

/// A budget's state as seen by one admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Capacity (per minute).
    pub limit: u64,
    /// What is left now (0 when in debt).
    pub remaining: u64,
    /// Milliseconds until the budget is full again.
    pub reset_ms: u64,
}

/// The token and request budgets of one [`Check`] after (or, when refused, at) admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckState {
    /// Token bucket, when the limit has `tokensPerMinute`.
    pub tokens: Option<Budget>,
    /// Request bucket, when the limit has `requestsPerMinute`.
    pub requests: Option<Budget>,
    /// Requests in flight (including this one when admitted), when the limit has
    /// `concurrentRequests`.
    pub in_flight: Option<u64>,
}

/// Which bound refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BudgetKind {
    /// `tokensPerMinute`.
    Tokens,
    /// `requestsPerMinute`.
    Requests,
    /// `concurrentRequests`.
    Concurrency,
}

/// A store's answer to an admission.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Every check passed and was charged, all at once.
    Admitted {
        /// One per check, in order.
        states: Vec<CheckState>,
        /// The lease of this request's concurrency slots (release it when settling).
        lease: u64,
    },
    /// A check failed; nothing was charged.
    Refused {
        /// Index of the check that failed.
        index: usize,
        /// Which of its bounds.
        kind: BudgetKind,
        /// Milliseconds until it would pass.
        retry_after_ms: u64,
        /// One per check, in order (not charged).
        states: Vec<CheckState>,
    },
}

/// What to give back for one admitted check when the request ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Settle {
    /// `policy/limit`.
    pub limit: Arc<str>,
    /// Tenant.
    pub tenant: Arc<str>,
    /// Bucket capacity, when the limit has `tokensPerMinute`.
    pub tokens_per_minute: Option<u64>,
    /// Tokens to give back (reserved − used; negative: a debt to charge).
    pub token_delta: i64,
    /// Whether a concurrency slot was taken and must be released.
    pub release_concurrency: bool,
    /// The admission's lease.
    pub lease: u64,
}

/// Store error (unreachable, timeout, protocol): the request is handled by the [`FailMode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StoreError {}

/// Counters of a store, shared by every [`Limiter`](super::Limiter) built on it.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Requests admitted.
    pub admitted: AtomicU64,
    /// Requests refused by a limit.
    pub rejected: AtomicU64,
    /// Store operations that failed (admissions and settlements).
    pub redis_errors: AtomicU64,
    /// Requests admitted without limits because the store failed and the mode is `Open`.
    pub fail_open_admits: AtomicU64,
    /// Requests refused because the store failed and the mode is `Closed`.
    pub fail_closed_rejects: AtomicU64,
}

/// A copy of [`StoreStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStatsSnapshot {
    /// Requests admitted.
    pub admitted: u64,
    /// Requests refused by a limit.
    pub rejected: u64,
    /// Store operations that failed.
    pub redis_errors: u64,
    /// Requests admitted unlimited in fail-open mode.
    pub fail_open_admits: u64,
    /// Requests refused in fail-closed mode.
    pub fail_closed_rejects: u64,
}

impl StoreStats {
    /// The counters now.
    pub fn snapshot(&self) -> StoreStatsSnapshot {
        StoreStatsSnapshot {
            admitted: self.admitted.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
            redis_errors: self.redis_errors.load(Ordering::Relaxed),
            fail_open_admits: self.fail_open_admits.load(Ordering::Relaxed),
            fail_closed_rejects: self.fail_closed_rejects.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where budgets live. Implementations: [`MemoryStore`](super::MemoryStore) (one process) and
/// [`RedisStore`](super::RedisStore) (shared by replicas).
pub trait LimitStore: Send + Sync + 'static {
    /// Checks every check and, only if all pass, charges them all (atomically per admission).
    fn admit<'a>(&'a self, checks: &'a [Check]) -> StoreFuture<'a, Result<Admission, StoreError>>;

    /// Gives back what an admitted request did not use (or charges its debt) and releases its
    /// concurrency slots. Must not block: a remote store does it in the background.
    fn settle(&self, settlements: Vec<Settle>);

    /// What to do when [`LimitStore::admit`] fails.
    fn fail_mode(&self) -> FailMode;

    /// The store's counters.
    fn stats(&self) -> &StoreStats;
}
