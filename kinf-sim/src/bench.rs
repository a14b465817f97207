//! Speed of the discrete-event engine (`kinf-sim bench`): simulated requests per minute of
//! wall time for a fleet of engines on one core.
//!
//! Workloads (all with Poisson arrivals at `rate_per_worker × workers` requests per second):
//! - `chat`: one of `8 × workers` system prompts of 2,000 tokens + 200 unique tokens, 200 output
//!   tokens;
//! - `shared-prefix`: the published benchmark's (24 prefixes × 16,000 tokens + 256 unique, 256
//!   output tokens).
//!
//! The router is a cheap prefix-affine power of two choices: the first block's hash names two
//! candidate engines and the less loaded one wins, so that requests sharing a system prompt
//! mostly meet their cache without the router hashing whole prompts.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::engine::{EngineOptions, InvalidProfile, Output, Request};
use crate::fleet::{EngineView, Fleet};
use crate::hash::{Rng, block_hash, mix64};
use crate::profile::Profile;
use crate::workload::Poisson;

/// Which requests the benchmark sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchWorkload {
    /// `8 × workers` system prompts of 2,000 tokens + 200 unique, 200 output tokens.
    Chat,
    /// 24 prefixes × 16,000 tokens + 256 unique, 256 output tokens.
    SharedPrefix,
}

impl BenchWorkload {
    /// `(prefixes, prefix tokens, unique tokens, output tokens)` for `workers` engines.
    pub fn shape(self, workers: usize) -> (usize, usize, usize, u32) {
        match self {
            Self::Chat => (8 * workers.max(1), 2_000, 200, 200),
            Self::SharedPrefix => (24, 16_000, 256, 256),
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchSpec {
    /// Engine profile.
    pub profile: Profile,
    /// Engines.
    pub workers: usize,
    /// Requests to simulate.
    pub requests: usize,
    /// Workload.
    pub workload: BenchWorkload,
    /// Arrival rate per engine, requests per second.
    pub rate_per_worker: f64,
    /// Whether engines build KV events (a router consuming them would need them).
    pub kv_events: bool,
    /// Seed.
    pub seed: u64,
}

/// What it measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// The spec.
    pub spec: BenchSpec,
    /// Requests that finished.
    pub finished: u64,
    /// Wall-clock seconds (workload generation included).
    pub wall_s: f64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// The figure: finished requests per minute of wall time.
    pub requests_per_wall_minute: f64,
    /// CPU seconds of the simulating thread (Linux `/proc/thread-self/schedstat`), which
    /// excludes time the thread waited for a core on a busy machine.
    pub cpu_s: Option<f64>,
    /// Finished requests per CPU minute of the simulating thread.
    pub requests_per_cpu_minute: Option<f64>,
    /// Simulated time per wall time.
    pub speedup: f64,
    /// Engine steps, all engines.
    pub steps: u64,
    /// Steps per wall second.
    pub steps_per_wall_s: f64,
    /// Mean sequences per step (generated tokens / steps).
    pub mean_batch: f64,
    /// Prefix-cache hit rate (tokens), all engines.
    pub hit_rate: f64,
    /// KV events produced (when enabled).
    pub kv_events: u64,
    /// Median TTFT (seconds) over all requests.
    pub ttft_p50_s: f64,
    /// Requests preempted, all engines.
    pub preemptions: u64,
}

/// Runs the benchmark.
pub fn run(spec: &BenchSpec) -> Result<BenchReport, InvalidProfile> {
    let opts = EngineOptions {
        kv_events: spec.kv_events,
        token_outputs: false,
    };
    let mut fleet = Fleet::new(&spec.profile, opts, spec.workers)?;
    let (num_prefixes, prefix_tokens, unique_tokens, output_tokens) =
        spec.workload.shape(spec.workers);
    let vocab = spec.profile.vocab_size;
    let started = Instant::now();
    let cpu0 = thread_cpu_s();
    let mut rng = Rng::new(spec.seed);
    let prefixes: Vec<Arc<[u32]>> = (0..num_prefixes)
        .map(|_| Arc::from(rng.tokens(prefix_tokens, vocab)))
        .collect();
    let bs = spec.profile.block_size as usize;
    let rate = spec.rate_per_worker * spec.workers as f64;
    let mut id = 0u64;
    let mut buf: Vec<u32> = Vec::with_capacity(prefix_tokens + unique_tokens);
    let arrivals = Poisson::new(rate, spec.seed).take(spec.requests).map(|t| {
        let p = rng.below(prefixes.len() as u64) as usize;
        // Built in a reused buffer (it stays in cache), then copied once into the request.
        buf.clear();
        if let Some(pre) = prefixes.get(p) {
            buf.extend_from_slice(pre);
        }
        for _ in 0..unique_tokens {
            buf.push(rng.below(u64::from(vocab.max(1))) as u32);
        }
        id += 1;
        let prompt: Arc<[u32]> = Arc::from(buf.as_slice());
        (t, Request::new(id, prompt, output_tokens))
    });
    let mut router = |req: &Request, views: &[EngineView<'_>]| -> usize {
        let n = views.len().max(1) as u64;
        let h = mix64(block_hash(0, req.prompt.get(..bs).unwrap_or(&req.prompt)));
        let a = (h % n) as usize;
        let b = ((h >> 32) % n) as usize;
        let load = |i: usize| {
            views.get(i).map_or(usize::MAX, |v| {
                let g = v.gauges();
                g.running + g.waiting
            })
        };
        if load(b) + 2 < load(a) { b } else { a }
    };
    let mut kv_events = 0u64;
    let mut ttft = crate::metrics::Histogram::new(&crate::metrics::TTFT_BUCKETS);
    let summary = fleet.run(arrivals, &mut router, |_, o| match o {
        Output::KvEvents(b) => kv_events += b.events.len() as u64,
        Output::Finished(f) => {
            if let Some(t) = f.stats.ttft() {
                ttft.observe(t);
            }
        }
        _ => {}
    });
    let wall = started.elapsed().as_secs_f64();
    let cpu = match (cpu0, thread_cpu_s()) {
        (Some(a), Some(b)) if b > a => Some(b - a),
        _ => None,
    };
    let c = fleet.total_counters();
    Ok(BenchReport {
        spec: spec.clone(),
        finished: summary.finished,
        wall_s: wall,
        simulated_s: summary.end_time,
        requests_per_wall_minute: summary.finished as f64 / wall.max(1e-9) * 60.0,
        cpu_s: cpu,
        requests_per_cpu_minute: cpu.map(|c| summary.finished as f64 / c.max(1e-9) * 60.0),
        speedup: summary.end_time / wall.max(1e-9),
        steps: summary.steps,
        steps_per_wall_s: summary.steps as f64 / wall.max(1e-9),
        mean_batch: if c.steps == 0 {
            0.0
        } else {
            c.generation_tokens as f64 / c.steps as f64
        },
        hit_rate: c.prefix_cache_hit_rate(),
        kv_events,
        ttft_p50_s: ttft.quantile(0.5).unwrap_or(f64::NAN),
        preemptions: c.preemptions,
    })
}

/// CPU time the calling thread has used, seconds (Linux only).
fn thread_cpu_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = text.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

/// The report as text for humans.
pub fn render_human(r: &BenchReport) -> String {
    let s = &r.spec;
    let (np, pt, ut, ot) = s.workload.shape(s.workers);
    format!(
        "kinf-sim bench: profile {}, {} workers, workload {:?} ({} prefixes x {} + {} unique tokens, {} output), {:.2} req/s per worker, kv events {}\n\
         {} requests in {:.2} s wall = {:.0} simulated requests per wall minute ({})\n\
         simulated {:.0} s ({:.1} h) = {:.0}x real time; {} steps ({:.0}/s wall), mean batch {:.1}, hit rate {:.1}%, TTFT p50 {:.3} s, preemptions {}, kv events {}\n",
        s.profile.name,
        s.workers,
        s.workload,
        np,
        pt,
        ut,
        ot,
        s.rate_per_worker,
        s.kv_events,
        r.finished,
        r.wall_s,
        r.requests_per_wall_minute,
        match (r.cpu_s, r.requests_per_cpu_minute) {
            (Some(c), Some(m)) => format!("{c:.2} s on CPU = {m:.0} per CPU minute"),
            _ => "CPU time not available".to_owned(),
        },
        r.simulated_s,
        r.simulated_s / 3600.0,
        r.speedup,
        r.steps,
        r.steps_per_wall_s,
        r.mean_batch,
        r.hit_rate * 100.0,
        r.ttft_p50_s,
        r.preemptions,
        r.kv_events
    )
}
