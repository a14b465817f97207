//! Per-endpoint ingestion status, shared between the ingestion tasks and the admin/status and
//! `/metrics` views.

use std::sync::Arc;

use parking_lot::Mutex;

use super::prom_text::CacheConfig;

/// Metrics-scrape and health-check status of one endpoint.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScrapeStatus {
    /// Server time (ms, [`super::SharedState::now_ms`]) of the last successful scrape.
    pub last_success_ms: Option<u64>,
    /// The last scrape error, kept after later successes.
    pub last_error: Option<String>,
    /// Server time (ms, as `last_success_ms`) of `last_error`: compare it with
    /// `last_success_ms` to tell an old error from a current one.
    pub last_error_ms: Option<u64>,
    /// Scrapes failed since the last success.
    pub consecutive_failures: u32,
    /// Successful scrapes.
    pub scrapes_ok: u64,
    /// Failed scrapes.
    pub scrapes_failed: u64,
    /// Health checks failed since the last success.
    pub health_consecutive_failures: u32,
    /// Successful health checks.
    pub health_ok: u64,
    /// Failed health checks.
    pub health_failed: u64,
    /// The last health-check error.
    pub last_health_error: Option<String>,
    /// No successful scrape for the stale limit.
    pub stale: bool,
    /// Passes health checks.
    pub ready: bool,
    /// The newest sample as kept: `[queued, running, kv_usage]` (a value that was missing,
    /// not a number or implausible is the previous one's, see `implausible_samples`).
    pub last_sample: Option<[f64; 3]>,
    /// Successful scrapes in which a load value was missing, not a number or implausible
    /// (a count below 0 or above 10⁶, a KV usage outside 0–1) and the previous one was kept.
    pub implausible_samples: u64,
    /// `vllm:cache_config_info` as last scraped.
    pub cache_config: Option<CacheConfig>,
    /// The scraped block size differs from the one the worker set's prefix index uses
    /// (configured, or adopted from the workers' reports): this worker's KV events are not
    /// indexed.
    pub block_size_mismatch: bool,
    /// `process_start_time_seconds` as last scraped (Unix seconds), when the worker exposes it.
    pub process_start_s: Option<f64>,
    /// Restarts of the worker process seen by its metrics (`process_start_time_seconds`
    /// changed): each one resets the endpoint's prefix index.
    pub worker_restarts: u64,
    /// The models the worker serves (`GET /v1/models`, read once it is healthy and again
    /// after a restart); `None` until read.
    pub served_models: Option<Vec<ServedModelInfo>>,
}

/// One model of a worker's `/v1/models`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedModelInfo {
    /// The served model name (`id`).
    pub id: String,
    /// vLLM's `max_model_len`: the longest prompt plus output, in tokens.
    pub max_model_len: Option<u64>,
}

/// KV-event subscription status of one endpoint (all its publishers together).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KvStatus {
    /// Publisher endpoints subscribed to (`tcp://host:port`), once known.
    pub publishers: Vec<String>,
    /// Replay endpoints, once known.
    pub replay_endpoints: Vec<String>,
    /// Subscribed topic.
    pub topic: String,
    /// Connected to every publisher.
    pub connected: bool,
    /// Last sequence number applied.
    pub last_seq: Option<i64>,
    /// Messages (batches) received.
    pub messages: u64,
    /// Events applied to the index.
    pub events: u64,
    /// Messages that did not decode.
    pub decode_errors: u64,
    /// Sequence gaps seen.
    pub gaps: u64,
    /// Batches skipped over by gaps.
    pub missed: u64,
    /// Gaps filled by a replay.
    pub replays: u64,
    /// Replays that failed (followed by a reset).
    pub replay_failures: u64,
    /// Times the endpoint's index was reset (unfilled gap, publisher restart).
    pub resets: u64,
    /// Publisher restarts seen (sequence back to 0).
    pub restarts: u64,
    /// When the event stream last showed a restart (Unix seconds, this host's clock): the
    /// scraper does not reset again for a new `process_start_time_seconds` at or before it.
    #[serde(skip)]
    pub last_restart_unix_s: Option<f64>,
    /// Duplicate batches dropped.
    pub duplicates: u64,
    /// Reconnections of the `SUB` socket.
    pub reconnects: u64,
    /// The last error (connection, discovery, decode, replay), kept after the stream recovers.
    pub last_error: Option<String>,
    /// Server time (ms, [`super::SharedState::now_ms`]) of `last_error`.
    pub last_error_ms: Option<u64>,
    /// Server time (ms) of the last batch received: with `connected`, it tells whether
    /// `last_error` is history or current.
    pub last_message_ms: Option<u64>,
}

impl KvStatus {
    /// Records `error` as the last one, seen at server time `now_ms`.
    pub fn error(&mut self, error: String, now_ms: u64) {
        self.last_error = Some(error);
        self.last_error_ms = Some(now_ms);
    }
}

/// Snapshot of one endpoint's ingestion.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointStatus {
    /// `namespace/name` of the worker set.
    pub worker_set: String,
    /// `host:port`.
    pub address: String,
    /// Scrape and health.
    pub scrape: ScrapeStatus,
    /// KV events, when the worker set publishes them.
    pub kv: Option<KvStatus>,
}

/// Live counters of one endpoint, written by its tasks.
#[derive(Debug)]
pub struct EndpointStats {
    /// Scrape and health.
    pub scrape: Mutex<ScrapeStatus>,
    /// KV events (`None` without KV events).
    pub kv: Mutex<Option<KvStatus>>,
    /// Worker-process restarts the scraper has seen ([`ScrapeStatus::worker_restarts`]): the
    /// KV subscriber watches it, since a restarted worker's event stream may not show it.
    pub incarnation: tokio::sync::watch::Sender<u64>,
    /// Times the endpoint turned not ready (health checks failing): the KV subscriber drops
    /// its connection then, since the zeromq crate does not notice a publisher that is gone.
    pub unready: tokio::sync::watch::Sender<u64>,
    /// Times the worker set's block size changed after its index had learned (or rejected)
    /// blocks: the KV subscriber catches up again from the replay buffer at the new size.
    pub resync: tokio::sync::watch::Sender<u64>,
}

impl EndpointStats {
    /// Fresh stats; `kv` says whether KV events are subscribed.
    pub fn new(kv: bool) -> Arc<Self> {
        Arc::new(EndpointStats {
            scrape: Mutex::new(ScrapeStatus {
                ready: true,
                ..ScrapeStatus::default()
            }),
            kv: Mutex::new(kv.then(KvStatus::default)),
            incarnation: tokio::sync::watch::Sender::new(0),
            unready: tokio::sync::watch::Sender::new(0),
            resync: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Updates the KV status (no effect without KV events).
    pub fn kv(&self, f: impl FnOnce(&mut KvStatus)) {
        if let Some(k) = self.kv.lock().as_mut() {
            f(k);
        }
    }
}
