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
}

impl SharedState {
    /// Wraps a state.
    pub fn new(state: ClusterState) -> Arc<Self> {
        Arc::new(SharedState {
            state: Mutex::new(state),
            epoch: Instant::now(),
        })
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs `f` with exclusive access to the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut ClusterState) -> R) -> R {
        f(&mut self.state.lock())
    }
}
