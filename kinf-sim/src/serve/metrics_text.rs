//! `GET /metrics`: Prometheus text with vLLM 0.32's names, types, HELP lines and labels
//! (`engine`, `model_name`; counters end in `_total` with `_created` companions). Latency
//! histograms are in simulated seconds (equal to wall seconds at `--speed 1`).

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderValue, StatusCode, header};

use super::driver::Snapshot;
use super::faults::MetricsBreak;
use super::http::St;
use crate::Histogram;

/// Python-style float rendering (`0.0`, `451.0`, `1.7959600639776003e+09`).
pub fn num(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v != 0.0 && (v.abs() >= 1e16 || v.abs() < 1e-4) || v.abs() >= 1e9 && v.fract() != 0.0 {
        let s = format!("{v:e}");
        if let Some((m, e)) = s.split_once('e') {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            let m = if m.contains('.') {
                m.to_owned()
            } else {
                format!("{m}.0")
            };
            return format!("{m}e{sign}{digits:0>2}");
        }
        return s;
    }
    format!("{v:?}")
}

struct W {
    out: String,
    labels: String,
    created: f64,
}

impl W {
    fn head(&mut self, name: &str, typ: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {typ}");
    }

    fn gauge(&mut self, name: &str, help: &str, v: f64) {
        self.head(name, "gauge", help);
        let _ = writeln!(self.out, "{name}{{{}}} {}", self.labels, num(v));
    }

    fn created(&mut self, base: &str, help: &str, extra: &[String]) {
        let name = format!("{base}_created");
        self.head(&name, "gauge", help);
        if extra.is_empty() {
            let _ = writeln!(self.out, "{name}{{{}}} {}", self.labels, num(self.created));
        }
        for e in extra {
            let _ = writeln!(self.out, "{name}{{{e}}} {}", num(self.created));
        }
    }

    fn counter(&mut self, base: &str, help: &str, v: u64) {
        let name = format!("{base}_total");
        self.head(&name, "counter", help);
        let _ = writeln!(self.out, "{name}{{{}}} {}", self.labels, num(v as f64));
        self.created(base, help, &[]);
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.head(name, "histogram", help);
        let (eng, model) = self.labels.split_once(',').unwrap_or((&self.labels, ""));
        let mut cum = 0u64;
        for (i, c) in h.counts.iter().enumerate() {
            cum += c;
            let le = h
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| num(*b));
            let _ = writeln!(
                self.out,
                "{name}_bucket{{{eng},le=\"{le}\",{model}}} {}",
                num(cum as f64)
            );
        }
        let _ = writeln!(
            self.out,
            "{name}_count{{{}}} {}",
            self.labels,
            num(h.count as f64)
        );
        let _ = writeln!(self.out, "{name}_sum{{{}}} {}", self.labels, num(h.sum));
        self.created(name, help, &[]);
    }
}

/// Renders the exposition text.
pub fn render(s: &St, snap: &Snapshot) -> String {
    let model = s.names.first().cloned().unwrap_or_default();
    let labels = format!("engine=\"0\",model_name={}", super::sse::js(&model));
    let mut w = W {
        out: String::with_capacity(16 << 10),
        labels: labels.clone(),
        created: s.clock.epoch0(),
    };
    let g = &snap.gauges;
    let c = &snap.metrics.counters;
    let h = &snap.metrics.histograms;
    // prometheus_client's process collector, as vLLM's API server exposes it: a gateway reads
    // a restart from it.
    w.head(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    );
    let _ = writeln!(
        w.out,
        "process_start_time_seconds {}",
        num(s.clock.epoch0())
    );
    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        g.running as f64,
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        g.waiting as f64,
    );
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        g.kv_cache_usage,
    );
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        c.prefix_cache_queries,
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        c.prefix_cache_hits,
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        c.preemptions,
    );
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        c.prompt_tokens,
    );
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        c.generation_tokens,
    );
    let help = "Count of successfully processed requests.";
    w.head("vllm:request_success_total", "counter", help);
    let reasons = ["stop", "length", "abort", "error", "repetition"];
    let per_reason: Vec<String> = reasons
        .iter()
        .map(|r| {
            format!(
                "engine=\"0\",finished_reason=\"{r}\",model_name={}",
                super::sse::js(&model)
            )
        })
        .collect();
    for (r, l) in reasons.iter().zip(&per_reason) {
        let v = match *r {
            "length" => c.requests_finished,
            "abort" => c.requests_aborted,
            _ => 0,
        };
        let _ = writeln!(w.out, "vllm:request_success_total{{{l}}} {}", num(v as f64));
    }
    w.created("vllm:request_success", help, &per_reason);
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &h.ttft,
    );
    w.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &h.itl,
    );
    w.histogram(
        "vllm:request_time_per_output_token_seconds",
        "Histogram of time_per_output_token_seconds per request.",
        &h.tpot,
    );
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &h.e2e,
    );
    w.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &h.queue,
    );
    w.histogram(
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &h.prefill,
    );
    w.histogram(
        "vllm:request_decode_time_seconds",
        "Histogram of time spent in DECODE phase for request.",
        &h.decode,
    );
    let bs = s.block_size;
    let blocks = s.num_gpu_blocks;
    w.head(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig",
    );
    let _ = writeln!(
        w.out,
        "vllm:cache_config_info{{_block_size_resolved=\"True\",block_size=\"{bs}\",cache_dtype=\"auto\",\
         cache_hit_alignment_tokens=\"None\",effective_attention_block_size=\"{bs}\",\
         enable_mamba_shared_prefix_checkpoint=\"False\",enable_prefix_caching=\"True\",engine=\"0\",\
         gpu_memory_utilization=\"0.92\",hash_block_size=\"None\",is_attention_free=\"False\",\
         kv_cache_dtype_skip_layers=\"[]\",kv_cache_layout=\"None\",kv_cache_max_concurrency=\"{}\",\
         kv_cache_memory_bytes=\"None\",kv_cache_size_tokens=\"{}\",kv_offloading_backend=\"native\",\
         kv_offloading_size=\"None\",kv_sharing_fast_prefill=\"False\",mamba_block_size=\"None\",\
         mamba_cache_dtype=\"auto\",mamba_cache_mode=\"none\",mamba_page_size_padded=\"None\",\
         mamba_ssm_cache_dtype=\"float32\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\",\
         num_gpu_blocks_override=\"None\",prefix_cache_retention_interval=\"0\",\
         prefix_caching_hash_algo=\"sha256\",prefix_match_unit=\"None\",replayssm_buffer_len=\"16\",\
         skip_page_size_padded=\"None\",sliding_window=\"None\",swa_bounded_replay=\"True\",\
         use_kda_recoverssm=\"False\",use_replayssm=\"False\",user_specified_block_size=\"True\"}} 1.0",
        num(f64::from(blocks) * f64::from(bs) / f64::from(s.max_model_len.max(1))),
        u64::from(blocks) * u64::from(bs),
    );
    let _ = labels;
    w.out
}

/// `GET /metrics` (honours the `metrics_delay_ms` and `metrics_broken` faults).
pub async fn metrics(State(s): State<St>) -> Response {
    let f = s.faults.get();
    if f.metrics_delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(f.metrics_delay_ms)).await;
    }
    let (status, body) = match f.metrics_broken {
        Some(MetricsBreak::Error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal Server Error".to_owned(),
        ),
        Some(MetricsBreak::Garbage) => (
            StatusCode::OK,
            "vllm:num_requests_running{engine=\"0\" 1.0 2.0 }}}\n\u{0}garbage\n".to_owned(),
        ),
        None => match s.driver.snapshot().await {
            Some(snap) => (StatusCode::OK, render(&s, &snap)),
            None => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "engine stopped".to_owned(),
            ),
        },
    };
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
