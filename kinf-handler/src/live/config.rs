//! Tunables of live ingestion.

use std::time::Duration;

/// Rules and timeouts of the ingestion tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveConfig {
    /// An endpoint is stale after this many scrape intervals without a successful scrape.
    pub stale_after_intervals: u32,
    /// An endpoint is not ready after this many consecutive failed health checks.
    pub unready_after_failures: u32,
    /// Lower bound of the scrape/health timeout (which is otherwise the interval).
    pub min_timeout: Duration,
    /// Reconnect a `SUB` socket that received nothing for this long (the zeromq crate does
    /// not report a lost publisher, so an idle connection is renewed; a restarted publisher is
    /// then recognised by its sequence numbers).
    pub kv_idle_reconnect: Duration,
    /// Time limit of a whole replay.
    pub replay_timeout: Duration,
    /// Time limit of one connection attempt (`SUB`, `DEALER`) and of discovery requests.
    pub connect_timeout: Duration,
    /// Delay before retrying a failed connection or discovery.
    pub retry_delay: Duration,
}

impl Default for LiveConfig {
    fn default() -> Self {
        LiveConfig {
            stale_after_intervals: 3,
            unready_after_failures: 3,
            min_timeout: Duration::from_millis(200),
            kv_idle_reconnect: Duration::from_secs(30),
            replay_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            retry_delay: Duration::from_secs(1),
        }
    }
}
