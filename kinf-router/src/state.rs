//! Live cluster state as the decision engine reads it: endpoints grouped by worker set, their
//! windowed load, TTFT models and KV-cache prefix index; providers' readiness and latency.
//!
//! Ingestion (metrics scrapers, KV-event subscribers, response reports) writes it; decisions
//! read it. The server publishes immutable snapshots so that ingestion never blocks a decision.
//! Time is passed in by the caller (milliseconds on any monotonic clock): the library reads no
//! clock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;

use crate::predictor::TtftModel;
use crate::prefix_index::{EndpointId, PrefixIndex};

/// How long load samples are kept.
pub const SAMPLE_RETENTION: Duration = Duration::from_secs(300);

/// One load sample of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSample {
    /// When it was taken (ms).
    pub at_ms: u64,
    /// `vllm:num_requests_waiting`.
    pub queued: f64,
    /// `vllm:num_requests_running`.
    pub running: f64,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f64,
}

/// Averages over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Load {
    /// Average queued prompts.
    pub queued_prompts: f64,
    /// Average running prompts.
    pub running_prompts: f64,
    /// Average KV-cache usage.
    pub kv_cache_usage: f64,
}

/// Windowed load samples.
#[derive(Clone, Debug, Default)]
pub struct LoadWindow {
    samples: VecDeque<LoadSample>,
}

impl LoadWindow {
    /// Adds a sample and forgets samples older than the retention.
    pub fn push(&mut self, s: LoadSample) {
        let keep_after = s.at_ms.saturating_sub(SAMPLE_RETENTION.as_millis() as u64);
        while self.samples.front().is_some_and(|f| f.at_ms < keep_after) {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Time-unweighted average of samples taken within `window` before `now_ms` (the newest
    /// sample alone when none falls in the window; zeros when there is none).
    pub fn average(&self, window: Duration, now_ms: u64) -> Load {
        let since = now_ms.saturating_sub(window.as_millis() as u64);
        let (mut n, mut q, mut r, mut k) = (0.0, 0.0, 0.0, 0.0);
        for s in self.samples.iter().rev().take_while(|s| s.at_ms >= since) {
            n += 1.0;
            q += s.queued;
            r += s.running;
            k += s.kv_usage;
        }
        if n == 0.0 {
            return self
                .samples
                .back()
                .map(|s| Load {
                    queued_prompts: s.queued,
                    running_prompts: s.running,
                    kv_cache_usage: s.kv_usage,
                })
                .unwrap_or_default();
        }
        Load {
            queued_prompts: q / n,
            running_prompts: r / n,
            kv_cache_usage: k / n,
        }
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<&LoadSample> {
        self.samples.back()
    }
}

/// One vLLM endpoint.
#[derive(Clone, Debug)]
pub struct EndpointState {
    /// `host:port`.
    pub address: Arc<str>,
    /// Passes health checks.
    pub ready: bool,
    /// Its metrics are older than allowed; load is treated as unknown (see docs).
    pub stale: bool,
    /// Load samples.
    pub load: LoadWindow,
    /// Learned TTFT model.
    pub ttft: TtftModel,
    /// Its id in the worker set's prefix index.
    pub index_id: EndpointId,
    /// Cached prompt tokens to assume for every request (offline explain/test states); `None`
    /// means: ask the prefix index.
    pub assumed_cached_tokens: Option<u32>,
}

/// The endpoints of one worker set, with its prefix index.
#[derive(Clone, Debug)]
pub struct WorkerSetState {
    /// Endpoints in a stable order.
    pub endpoints: Vec<EndpointState>,
    /// KV-cache contents per endpoint (exact from KV events, or approximate).
    pub index: PrefixIndex,
    /// Block size of the index.
    pub block_size: usize,
}

/// One provider.
#[derive(Clone, Debug)]
pub struct ProviderState {
    /// Healthy and below its concurrency limit.
    pub ready: bool,
    /// Observed TTFT (moving average), when any was observed.
    pub ttft_s: Option<f64>,
    /// Requests in flight.
    pub in_flight: u32,
}

/// Everything the engine reads about the cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// Worker sets by `namespace/name`.
    pub worker_sets: AHashMap<Arc<str>, WorkerSetState>,
    /// Providers by `namespace/name`.
    pub providers: AHashMap<Arc<str>, ProviderState>,
    /// The time decisions are made at (ms): windows end here.
    pub now_ms: u64,
}

impl ClusterState {
    /// Key of a destination: `namespace/name`.
    pub fn key(namespace: &str, name: &str) -> Arc<str> {
        format!("{namespace}/{name}").into()
    }

    /// The state of a worker set.
    pub fn worker_set(&self, namespace: &str, name: &str) -> Option<&WorkerSetState> {
        self.worker_sets.get(format!("{namespace}/{name}").as_str())
    }

    /// The state of a provider.
    pub fn provider(&self, namespace: &str, name: &str) -> Option<&ProviderState> {
        self.providers.get(format!("{namespace}/{name}").as_str())
    }

    /// Builds a state for a compiled policy: every static endpoint ready and idle, every
    /// provider ready, empty caches, TTFT models from the worker sets' priors.
    pub fn from_policy(policy: &kinf_lang::CompiledPolicy, block_size: usize) -> Self {
        let mut st = ClusterState::default();
        for d in &policy.destinations {
            let key = Self::key(&d.namespace, &d.name);
            if let Some(w) = &d.worker_set {
                let bs = w.block_size.map(|b| b as usize).unwrap_or(block_size);
                let endpoints = w
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, a)| EndpointState {
                        address: a.clone(),
                        ready: true,
                        stale: false,
                        load: LoadWindow::default(),
                        ttft: TtftModel::from_prior(
                            w.prior.prefill_tokens_per_second,
                            w.prior.overhead.as_secs_f64(),
                        ),
                        index_id: EndpointId(i as u32),
                        assumed_cached_tokens: None,
                    })
                    .collect();
                st.worker_sets.insert(
                    key,
                    WorkerSetState {
                        endpoints,
                        index: PrefixIndex::new(bs),
                        block_size: bs,
                    },
                );
            } else if d.provider.is_some() {
                st.providers.insert(
                    key,
                    ProviderState {
                        ready: true,
                        ttft_s: None,
                        in_flight: 0,
                    },
                );
            }
        }
        st
    }
}
