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
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

pub use config::LiveConfig;
pub use status::{EndpointStatus, KvStatus, ScrapeStatus};
pub use supervisor::{EndpointSpec, LiveIngest};

use kinf_router::ClusterState;
use parking_lot::Mutex;

/// The cluster state shared by the gateway and its ingestion tasks.
#[derive(Debug)]
pub struct SharedState {
    state: Mutex<ClusterState>,
    epoch: Instant,
    /// The block size of the worker set the last local decision routed to (0: none yet), read
    /// without the lock to hash the next prompt before taking it.
    block_size_hint: AtomicU32,
}

impl SharedState {
    /// Wraps a state.
    pub fn new(state: ClusterState) -> Arc<Self> {
        Arc::new(SharedState {
            state: Mutex::new(state),
            epoch: Instant::now(),
            block_size_hint: AtomicU32::new(0),
        })
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The block size to hash the next prompt with before deciding (outside the lock): the
    /// one the last local decision used; 0 until one was made.
    pub fn block_size_hint(&self) -> u32 {
        self.block_size_hint.load(Ordering::Relaxed)
    }

    /// Notes the block size of the worker set a request was routed to
    /// ([`block_size_hint`](Self::block_size_hint)).
    pub fn note_block_size(&self, block_size: usize) {
        let b = u32::try_from(block_size).unwrap_or(0);
        self.block_size_hint.store(b, Ordering::Relaxed);
    }

    /// Runs `f` with exclusive access to the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        f(&mut self.state.lock())
    }
}
