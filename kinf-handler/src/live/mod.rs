//! Live cluster state: the [`ClusterState`] the decision engine reads, shared between the
//! request path and the ingestion tasks (metrics scrapers, KV-event subscribers, health checks).
//!
//! One mutex guards the state. Decisions take it for a few microseconds; ingestion applies a
//! whole scrape or event batch at a time. Time is milliseconds since the server started
//! ([`SharedState::now_ms`]), the monotonic clock every sample and decision uses.

pub mod config;
pub mod discovery;
pub mod http_get;
pub mod kv_subscriber;
pub mod prom_text;
pub mod scraper;
pub mod status;
pub mod supervisor;

use std::sync::Arc;
use std::time::Instant;

use ahash::AHashMap;

pub use config::LiveConfig;
pub use status::{EndpointStatus, KvStatus, ScrapeStatus};
pub use supervisor::{EndpointSpec, LiveIngest};

use kinf_router::ClusterState;
use parking_lot::{Mutex, RwLock};

/// The cluster state shared by the gateway and its ingestion tasks.
#[derive(Debug)]
pub struct SharedState {
    state: Mutex<ClusterState>,
    epoch: Instant,
    /// Per front door and requested model, the block size of the worker set the last local
    /// decision for them routed to; read without the state lock to hash the next such prompt
    /// before taking it.
    block_size_hints: RwLock<AHashMap<HintKey, u32>>,
}

/// What a block-size hint is kept per: the request's pool (`None`: the policy's only one) and
/// its requested model. Requests that share both are decided by the same rules, so they
/// usually go to worker sets with the same block size.
type HintKey = (Option<Arc<str>>, Arc<str>);

/// The most block-size hints kept ([`SharedState::note_block_size`]).
pub const MAX_BLOCK_SIZE_HINTS: usize = 4096;

impl SharedState {
    /// Wraps a state.
    pub fn new(state: ClusterState) -> Arc<Self> {
        Arc::new(SharedState {
            state: Mutex::new(state),
            epoch: Instant::now(),
            block_size_hints: RwLock::new(AHashMap::new()),
        })
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The block size to hash a prompt for `pool` and `model` with before deciding (outside
    /// the state lock): the one the last local decision for the same pool and model used; 0
    /// until one was made.
    pub fn block_size_hint(&self, pool: Option<&Arc<str>>, model: &Arc<str>) -> u32 {
        let key = (pool.cloned(), model.clone());
        self.block_size_hints.read().get(&key).copied().unwrap_or(0)
    }

    /// Notes the block size of the worker set a request for `pool` and `model` was routed to
    /// ([`block_size_hint`](Self::block_size_hint)). A size no `u32` holds is noted as
    /// unknown (0). Takes the write lock only when the hint changes. The hints are bounded
    /// ([`MAX_BLOCK_SIZE_HINTS`]): a rule may route any requested model name, so clients could
    /// otherwise grow them without limit; when full they start over (a missing hint only
    /// moves the hashing back under the lock).
    pub fn note_block_size(&self, pool: Option<&Arc<str>>, model: &Arc<str>, block_size: usize) {
        let b = u32::try_from(block_size).unwrap_or(0);
        if self.block_size_hint(pool, model) == b {
            return;
        }
        let mut hints = self.block_size_hints.write();
        if hints.len() >= MAX_BLOCK_SIZE_HINTS {
            hints.clear();
        }
        hints.insert((pool.cloned(), model.clone()), b);
    }

    /// Runs `f` with exclusive access to the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        f(&mut self.state.lock())
    }

    /// Like [`with`](Self::with), then hands the lock to a thread waiting for it, if any,
    /// rather than letting the caller take it again at once: for ingestion that applies a long
    /// series of updates one slice at a time, so that decisions get in between the slices.
    pub fn with_fair<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        let mut guard = self.state.lock();
        let r = f(&mut guard);
        parking_lot::MutexGuard::unlock_fair(guard);
        r
    }
}
