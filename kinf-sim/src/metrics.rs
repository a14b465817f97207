//! Metrics-shaped engine state: the gauges, counters and histograms vLLM exports on
//! `/metrics`, as plain structs (rendering them is the server's job).

use serde::Serialize;

/// `vllm:time_to_first_token_seconds` bucket bounds (vLLM 0.32).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// `vllm:inter_token_latency_seconds` and `vllm:request_time_per_output_token_seconds`
/// bucket bounds (vLLM 0.32).
pub const ITL_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Bucket bounds of the request-duration histograms (`e2e_request_latency`,
/// `request_queue_time`, `request_prefill_time`, `request_decode_time`; vLLM 0.32).
pub const DURATION_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A Prometheus-style histogram: cumulative rendering is left to the exporter; `counts[i]`
/// counts observations in `(bounds[i-1], bounds[i]]`, the last entry those above every bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Histogram {
    /// Upper bounds of the finite buckets, ascending.
    pub bounds: &'static [f64],
    /// Per-bucket counts (`bounds.len() + 1` entries; the last is `+Inf`).
    pub counts: Vec<u64>,
    /// Sum of the observed values.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram with the given bucket bounds.
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records `n` observations of `v`.
    #[inline]
    pub fn observe_n(&mut self, v: f64, n: u64) {
        if n == 0 {
            return;
        }
        let i = self.bounds.partition_point(|&b| b < v);
        if let Some(c) = self.counts.get_mut(i) {
            *c += n;
        }
        self.sum += v * n as f64;
        self.count += n;
    }

    /// Records one observation.
    #[inline]
    pub fn observe(&mut self, v: f64) {
        self.observe_n(v, 1);
    }

    /// Mean of the observations (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum / self.count as f64
        }
    }

    /// Estimates quantile `q` (0..1) by linear interpolation inside the bucket, as Prometheus'
    /// `histogram_quantile` does. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && (seen + c) as f64 >= rank {
                let lo = if i == 0 {
                    0.0
                } else {
                    self.bounds.get(i - 1).copied().unwrap_or(0.0)
                };
                let Some(&hi) = self.bounds.get(i) else {
                    return Some(lo);
                };
                let frac = (rank - seen as f64) / c as f64;
                return Some(lo + (hi - lo) * frac.clamp(0.0, 1.0));
            }
            seen += c;
        }
        self.bounds.last().copied()
    }
}

/// Engine-wide counters (vLLM's `*_total` counters plus simulator bookkeeping).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Counters {
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total`: of those, tokens found cached.
    pub prefix_cache_hits: u64,
    /// `vllm:prompt_tokens_total`: prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// `vllm:generation_tokens_total`.
    pub generation_tokens: u64,
    /// `vllm:request_success_total{finished_reason="length"}`.
    pub requests_finished: u64,
    /// Requests aborted by the caller (`finished_reason="abort"`).
    pub requests_aborted: u64,
    /// Requests rejected at submission (too long for the model or the cache).
    pub requests_rejected: u64,
    /// `vllm:num_preemptions_total`.
    pub preemptions: u64,
    /// Engine steps executed.
    pub steps: u64,
    /// Prompt tokens computed (prefill work actually done, after cache hits).
    pub prefill_tokens_computed: u64,
    /// Seconds the engine spent executing steps.
    pub busy_s: f64,
}

impl Counters {
    /// Prefix-cache hit rate in tokens (0 when nothing was queried).
    pub fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache_queries == 0 {
            0.0
        } else {
            self.prefix_cache_hits as f64 / self.prefix_cache_queries as f64
        }
    }
}

/// Instantaneous engine state (vLLM's gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Gauges {
    /// `vllm:num_requests_running`.
    pub running: usize,
    /// `vllm:num_requests_waiting` (here including requests still in the API-server delay).
    pub waiting: usize,
    /// `vllm:kv_cache_usage_perc` (0..1): share of blocks not free.
    pub kv_cache_usage: f64,
    /// Free blocks (including cached blocks no request uses).
    pub free_blocks: u32,
    /// Distinct block hashes held by the prefix cache.
    pub cached_blocks: usize,
    /// Total blocks.
    pub num_gpu_blocks: u32,
}

/// The histograms vLLM exports, fed by the engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Histograms {
    /// `vllm:time_to_first_token_seconds` (from submission, API-server delay included).
    pub ttft: Histogram,
    /// `vllm:inter_token_latency_seconds`.
    pub itl: Histogram,
    /// `vllm:request_time_per_output_token_seconds` (per request: decode time / (tokens − 1)).
    pub tpot: Histogram,
    /// `vllm:e2e_request_latency_seconds`.
    pub e2e: Histogram,
    /// `vllm:request_queue_time_seconds` (scheduler waiting queue to first scheduling).
    pub queue: Histogram,
    /// `vllm:request_prefill_time_seconds` (first scheduling to first token).
    pub prefill: Histogram,
    /// `vllm:request_decode_time_seconds` (first token to last token).
    pub decode: Histogram,
}

impl Default for Histograms {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(&TTFT_BUCKETS),
            itl: Histogram::new(&ITL_BUCKETS),
            tpot: Histogram::new(&ITL_BUCKETS),
            e2e: Histogram::new(&DURATION_BUCKETS),
            queue: Histogram::new(&DURATION_BUCKETS),
            prefill: Histogram::new(&DURATION_BUCKETS),
            decode: Histogram::new(&DURATION_BUCKETS),
        }
    }
}

/// Everything an engine counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineMetrics {
    /// Counters.
    pub counters: Counters,
    /// Histograms.
    pub histograms: Histograms,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_and_quantiles() {
        let mut h = Histogram::new(&ITL_BUCKETS);
        h.observe(0.01); // le 0.01 (bounds are inclusive)
        h.observe_n(0.04, 3);
        h.observe(1000.0);
        assert_eq!(h.count, 5);
        assert_eq!(h.counts[0], 1);
        assert_eq!(h.counts[2], 3);
        assert_eq!(*h.counts.last().unwrap(), 1);
        let med = h.quantile(0.5).unwrap();
        assert!((0.025..=0.05).contains(&med), "{med}");
        assert!(Histogram::new(&TTFT_BUCKETS).quantile(0.5).is_none());
    }
}
