//! The calibration report (`kinf-sim calibrate`): what a profile predicts for the published
//! benchmark's shared-prefix workload (NOTES.md §4), next to the published figures.
//!
//! Three parts:
//! - **idle**: one cold and one warm 16,256-token prompt on an otherwise idle engine;
//! - **light load**: the benchmark's setting (three workers, Poisson arrivals at a low rate,
//!   24 prefixes × 16,000 tokens + 256 unique, 256 output tokens) under two routers — `random`
//!   (the Kubernetes Service baseline) and `affinity` (the worker caching the longest prefix,
//!   least loaded on ties: what a cache-aware router does at light load). Requests are
//!   classified by what they found cached: *cold* (nothing), *warm* (the whole shared prefix);
//! - **cache curve**: prefix-cache hit rate (tokens) vs KV capacity for the same workload on
//!   one worker.

use serde::Serialize;

use crate::engine::{Engine, EngineOptions, InvalidProfile, Output, Request};
use crate::fleet::{EngineView, Fleet};
use crate::hash::Rng;
use crate::profile::Profile;
use crate::workload::{Poisson, SharedPrefixGen, SharedPrefixSpec};

/// What the report runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationSpec {
    /// The workload.
    pub workload: SharedPrefixSpec,
    /// Workers in the light-load runs (the benchmark's pool has three).
    pub workers: usize,
    /// Light-load arrival rate over the whole pool, requests per second.
    pub rate_per_s: f64,
    /// Requests per light-load run.
    pub requests: usize,
    /// KV capacities of the cache curve, in blocks.
    pub cache_blocks: Vec<u32>,
    /// Requests per cache-curve point before measuring.
    pub cache_warmup: usize,
    /// Requests measured per cache-curve point.
    pub cache_requests: usize,
    /// Seed of everything random.
    pub seed: u64,
}

impl CalibrationSpec {
    /// The published workload at light load (9 requests/min over three workers). For the
    /// `tiny` profile (which cannot hold 16k-token prompts) a scaled-down workload.
    pub fn for_profile(profile: &Profile) -> Self {
        if profile.max_model_len >= 20_000 && profile.capacity_tokens() >= 40_000 {
            let per_prefix = 16_256u32.div_ceil(profile.block_size.max(1));
            Self {
                workload: SharedPrefixSpec {
                    vocab: profile.vocab_size,
                    ..SharedPrefixSpec::published()
                },
                workers: 3,
                rate_per_s: 0.15,
                requests: 600,
                cache_blocks: [2u32, 4, 8, 12, 16, 20, 24, 28, 32]
                    .iter()
                    .map(|p| p * per_prefix)
                    .collect(),
                cache_warmup: 150,
                cache_requests: 600,
                seed: 1,
            }
        } else {
            let bs = profile.block_size.max(1);
            let per_prefix = 64u32.div_ceil(bs);
            Self {
                workload: SharedPrefixSpec {
                    num_prefixes: 24,
                    prefix_tokens: 60,
                    unique_tokens: 4,
                    output_tokens: 8,
                    vocab: profile.vocab_size,
                },
                workers: 3,
                rate_per_s: 30.0,
                requests: 600,
                cache_blocks: [2u32, 4, 8, 12, 16, 20, 24, 28, 32]
                    .iter()
                    .map(|p| p * per_prefix)
                    .collect(),
                cache_warmup: 150,
                cache_requests: 600,
                seed: 1,
            }
        }
    }
}

/// One cold and one warm prompt on an idle engine.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IdleFigures {
    /// TTFT of a prompt with nothing cached, seconds.
    pub cold_ttft_s: f64,
    /// TTFT of a prompt whose shared prefix is cached, seconds.
    pub warm_ttft_s: f64,
    /// Mean inter-token latency of the cold request, decoding alone, seconds.
    pub itl_s: f64,
    /// End-to-end latency of the cold request, seconds.
    pub cold_e2e_s: f64,
    /// End-to-end latency of the warm request, seconds.
    pub warm_e2e_s: f64,
}

/// Medians over a set of requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Requests in the set.
    pub requests: usize,
    /// Median TTFT, seconds.
    pub ttft_s: f64,
    /// 90th-percentile TTFT, seconds.
    pub ttft_p90_s: f64,
    /// Median of the per-request mean inter-token latency, seconds.
    pub itl_s: f64,
    /// Median end-to-end latency, seconds.
    pub e2e_s: f64,
}

/// One light-load run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Condition {
    /// The router.
    pub router: &'static str,
    /// All requests.
    pub all: Figures,
    /// Requests that found nothing cached.
    pub cold: Figures,
    /// Requests that found their whole shared prefix cached.
    pub warm: Figures,
    /// Requests with a partial hit.
    pub partial: usize,
    /// Prefix-cache hit rate (tokens) over the run.
    pub hit_rate: f64,
    /// Mean requests decoding per worker (time average).
    pub mean_decoding: f64,
    /// Simulated duration, seconds.
    pub duration_s: f64,
}

/// Light-load results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LightLoad {
    /// Kubernetes-Service-like random routing.
    pub random: Condition,
    /// Cache-affinity routing.
    pub affinity: Condition,
    /// Cold requests, from the run that had more of them (random routing).
    pub cold: Figures,
    /// Warm requests, from the run that had more of them (affinity routing).
    pub warm: Figures,
}

/// One point of the cache curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CachePoint {
    /// KV capacity, blocks.
    pub num_gpu_blocks: u32,
    /// KV capacity in prompts of the workload.
    pub capacity_prompts: f64,
    /// Prefix-cache hit rate in tokens.
    pub hit_rate: f64,
    /// Median TTFT, seconds.
    pub ttft_s: f64,
    /// Preemptions while measuring (a cache that cannot hold the running requests thrashes;
    /// recomputed requests query the cache again).
    pub preemptions: u64,
}

/// The published figures (NOTES.md §4), for comparison.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Published {
    /// Median TTFT, random routing (mostly cold), seconds.
    pub cold_ttft_s: f64,
    /// Median TTFT, Kinference routing (mostly warm), seconds.
    pub warm_ttft_s: f64,
    /// Median e2e, random routing, seconds.
    pub cold_e2e_s: f64,
    /// Median e2e, Kinference routing, seconds.
    pub warm_e2e_s: f64,
    /// `(e2e − TTFT) / 255`, random routing, seconds per token.
    pub cold_itl_s: f64,
    /// `(e2e − TTFT) / 255`, Kinference routing, seconds per token.
    pub warm_itl_s: f64,
}

impl Published {
    /// L40S, vLLM 0.31.0, Qwen-3.8-27B-FP8, three replicas.
    pub const L40S: Self = Self {
        cold_ttft_s: 6.88,
        warm_ttft_s: 0.31,
        cold_e2e_s: 20.5,
        warm_e2e_s: 11.3,
        cold_itl_s: (20.5 - 6.88) / 255.0,
        warm_itl_s: (11.3 - 0.31) / 255.0,
    };
}

/// The report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationReport {
    /// The profile's constants.
    pub profile: Profile,
    /// What was run.
    pub spec: CalibrationSpec,
    /// Idle engine.
    pub idle: IdleFigures,
    /// Light load.
    pub light_load: LightLoad,
    /// Hit rate vs cache size.
    pub cache_curve: Vec<CachePoint>,
    /// The published figures this profile is calibrated to (`l40s-qwen27b-fp8` only).
    pub published: Option<Published>,
}

fn quiet() -> EngineOptions {
    EngineOptions {
        kv_events: false,
        token_outputs: false,
    }
}

fn quantile(xs: &mut [f64], q: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let i = ((xs.len() - 1) as f64 * q).round() as usize;
    xs.get(i).copied().unwrap_or(f64::NAN)
}

/// Per-request observations of a run.
#[derive(Debug, Clone, Copy)]
struct Obs {
    ttft: f64,
    itl: f64,
    e2e: f64,
    cached: u32,
}

fn figures<'a>(obs: impl Iterator<Item = &'a Obs>) -> Figures {
    let v: Vec<&Obs> = obs.collect();
    let mut ttft: Vec<f64> = v.iter().map(|o| o.ttft).collect();
    let mut itl: Vec<f64> = v.iter().map(|o| o.itl).filter(|x| x.is_finite()).collect();
    let mut e2e: Vec<f64> = v.iter().map(|o| o.e2e).collect();
    Figures {
        requests: v.len(),
        ttft_s: quantile(&mut ttft, 0.5),
        ttft_p90_s: quantile(&mut ttft, 0.9),
        itl_s: quantile(&mut itl, 0.5),
        e2e_s: quantile(&mut e2e, 0.5),
    }
}

/// Runs the idle measurement.
pub fn idle(profile: &Profile, spec: &CalibrationSpec) -> Result<IdleFigures, InvalidProfile> {
    let mut e = Engine::new(profile.clone(), quiet())?;
    let mut g = SharedPrefixGen::new(spec.workload, spec.seed);
    let mut out = Vec::new();
    let mut t = 0.0;
    let mut run = |e: &mut Engine, req: Request, t: &mut f64| {
        out.clear();
        let _ = e.submit(req, *t);
        *t = e.run_until_idle(&mut out) + 1.0;
        out.iter().find_map(|o| match o {
            Output::Finished(f) => Some(f.stats),
            _ => None,
        })
    };
    let cold = run(&mut e, g.request_with_prefix(0), &mut t);
    let warm = run(&mut e, g.request_with_prefix(0), &mut t);
    let (Some(cold), Some(warm)) = (cold, warm) else {
        return Err(InvalidProfile(
            "the workload's prompts do not fit this profile".into(),
        ));
    };
    Ok(IdleFigures {
        cold_ttft_s: cold.ttft().unwrap_or(f64::NAN),
        warm_ttft_s: warm.ttft().unwrap_or(f64::NAN),
        itl_s: cold.mean_itl().unwrap_or(f64::NAN),
        cold_e2e_s: cold.e2e(),
        warm_e2e_s: warm.e2e(),
    })
}

/// Runs one light-load condition.
pub fn light_load_run(
    profile: &Profile,
    spec: &CalibrationSpec,
    affinity: bool,
) -> Result<Condition, InvalidProfile> {
    let mut fleet = Fleet::new(profile, quiet(), spec.workers)?;
    let mut g = SharedPrefixGen::new(spec.workload, spec.seed);
    let arrivals: Vec<(f64, Request)> = Poisson::new(spec.rate_per_s, spec.seed)
        .take(spec.requests)
        .map(|t| (t, g.next_request().1))
        .collect();
    let mut rng = Rng::new(spec.seed ^ 0xa11);
    let bs = profile.block_size as usize;
    let mut router = |req: &Request, views: &[EngineView<'_>]| -> usize {
        if !affinity {
            return rng.below(views.len() as u64) as usize;
        }
        let hashes = crate::hash::block_hashes(&req.prompt, bs);
        let mut best = 0;
        let mut best_key = None;
        for v in views {
            let g = v.gauges();
            // Longest cached prefix, then least loaded, then emptiest cache (spreads new
            // prefixes evenly), then lowest index.
            let k = (
                std::cmp::Reverse(v.engine.cached_prefix_blocks(&hashes)),
                g.running + g.waiting,
                g.cached_blocks,
            );
            if best_key.is_none_or(|b| k < b) {
                best_key = Some(k);
                best = v.index;
            }
        }
        best
    };
    let mut first: std::collections::HashMap<u64, (f64, u32)> = Default::default();
    let mut obs = Vec::with_capacity(spec.requests);
    // Time-averaged running count: integrate the gauge between outputs.
    let mut area = 0.0;
    let mut last_t = 0.0;
    let summary = {
        let first = &mut first;
        let obs = &mut obs;
        let mut running = vec![0usize; spec.workers];
        fleet.run(arrivals, &mut router, |i, o| {
            let t = o.time();
            area += running.iter().sum::<usize>() as f64 * (t - last_t);
            last_t = t;
            match o {
                Output::FirstToken {
                    id, cached_tokens, ..
                } => {
                    first.insert(id, (t, cached_tokens));
                }
                Output::Finished(f) => {
                    if let Some(r) = running.get_mut(i) {
                        *r = r.saturating_sub(1);
                    }
                    let cached = first.get(&f.id).map_or(0, |x| x.1);
                    obs.push(Obs {
                        ttft: f.stats.ttft().unwrap_or(f64::NAN),
                        itl: f.stats.mean_itl().unwrap_or(f64::NAN),
                        e2e: f.stats.e2e(),
                        cached,
                    });
                }
                _ => {}
            }
            if let Output::FirstToken { .. } = o
                && let Some(r) = running.get_mut(i)
            {
                *r += 1;
            }
        })
    };
    let c = fleet.total_counters();
    let full = spec.workload.prefix_tokens as u32 / profile.block_size * profile.block_size;
    let cold = figures(obs.iter().filter(|o| o.cached == 0));
    let warm = figures(obs.iter().filter(|o| o.cached >= full && full > 0));
    let partial = obs
        .iter()
        .filter(|o| o.cached > 0 && o.cached < full)
        .count();
    Ok(Condition {
        router: if affinity { "affinity" } else { "random" },
        all: figures(obs.iter()),
        cold,
        warm,
        partial,
        hit_rate: c.prefix_cache_hit_rate(),
        mean_decoding: if summary.end_time > 0.0 {
            area / summary.end_time / spec.workers.max(1) as f64
        } else {
            0.0
        },
        duration_s: summary.end_time,
    })
}

/// Runs one cache-curve point: one worker with `blocks` blocks.
pub fn cache_point(
    profile: &Profile,
    spec: &CalibrationSpec,
    blocks: u32,
) -> Result<CachePoint, InvalidProfile> {
    let mut p = profile.clone();
    p.num_gpu_blocks = blocks;
    let mut e = Engine::new(p, quiet())?;
    let mut g = SharedPrefixGen::new(spec.workload, spec.seed ^ u64::from(blocks));
    let rate = spec.rate_per_s / spec.workers.max(1) as f64;
    let mut out = Vec::new();
    let mut ttfts = Vec::new();
    let mut base = (0u64, 0u64, 0u64);
    let total = spec.cache_warmup + spec.cache_requests;
    for (n, t) in Poisson::new(rate, spec.seed ^ 0xcace)
        .take(total)
        .enumerate()
    {
        if n == spec.cache_warmup {
            let c = e.counters();
            base = (c.prefix_cache_queries, c.prefix_cache_hits, c.preemptions);
            ttfts.clear();
        }
        e.advance_into(t, &mut out);
        let _ = e.submit(g.next_request().1, t);
        for o in out.drain(..) {
            if let Output::Finished(f) = o
                && let Some(x) = f.stats.ttft()
            {
                ttfts.push(x);
            }
        }
    }
    e.run_until_idle(&mut out);
    for o in out.drain(..) {
        if let Output::Finished(f) = o
            && let Some(x) = f.stats.ttft()
        {
            ttfts.push(x);
        }
    }
    let c = e.counters();
    let q = c.prefix_cache_queries - base.0;
    let h = c.prefix_cache_hits - base.1;
    let per_prompt = (spec.workload.prompt_tokens() as u64).div_ceil(u64::from(profile.block_size));
    Ok(CachePoint {
        num_gpu_blocks: blocks,
        capacity_prompts: f64::from(blocks) / per_prompt.max(1) as f64,
        hit_rate: if q == 0 { 0.0 } else { h as f64 / q as f64 },
        ttft_s: quantile(&mut ttfts, 0.5),
        preemptions: c.preemptions - base.2,
    })
}

/// The whole report.
pub fn report(
    profile: &Profile,
    spec: &CalibrationSpec,
) -> Result<CalibrationReport, InvalidProfile> {
    let idle = idle(profile, spec)?;
    let random = light_load_run(profile, spec, false)?;
    let affinity = light_load_run(profile, spec, true)?;
    let cache_curve = spec
        .cache_blocks
        .iter()
        .map(|&b| cache_point(profile, spec, b))
        .collect::<Result<Vec<_>, _>>()?;
    let pooled = |f: &dyn Fn(&Condition) -> Figures| {
        let (a, b) = (f(&random), f(&affinity));
        if a.requests >= b.requests { a } else { b }
    };
    let cold = pooled(&|c: &Condition| c.cold);
    let warm = pooled(&|c: &Condition| c.warm);
    Ok(CalibrationReport {
        profile: profile.clone(),
        spec: spec.clone(),
        idle,
        light_load: LightLoad {
            random,
            affinity,
            cold,
            warm,
        },
        cache_curve,
        published: (profile.name == "l40s-qwen27b-fp8").then_some(Published::L40S),
    })
}

/// The report as text for humans.
pub fn render_human(r: &CalibrationReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let p = &r.profile;
    let w = &r.spec.workload;
    let _ = writeln!(s, "profile {}: {}", p.name, p.description);
    let _ = writeln!(
        s,
        "  block_size {}  num_gpu_blocks {} ({} tokens)  max_num_seqs {}  max_num_batched_tokens {}  chunked prefill {}",
        p.block_size,
        p.num_gpu_blocks,
        p.capacity_tokens(),
        p.max_num_seqs,
        p.max_num_batched_tokens,
        p.enable_chunked_prefill
    );
    let st = &p.step;
    let _ = writeln!(
        s,
        "  step = {:.4} s + {:.3e} s/prefill token + {:.3e} s/decode seq + {:.3e} s/prefill attention pair + {:.3e} s/decode context token",
        st.base_s,
        st.per_prefill_token_s,
        st.per_decode_seq_s,
        st.prefill_attention_s,
        st.decode_attention_s
    );
    let _ = writeln!(
        s,
        "  API-server delay = {:.3} s + {:.2e} s/prompt token",
        p.frontend.fixed_s, p.frontend.per_prompt_token_s
    );
    let _ = writeln!(
        s,
        "workload: {} prefixes x {} tokens + {} unique, {} output tokens",
        w.num_prefixes, w.prefix_tokens, w.unique_tokens, w.output_tokens
    );
    let i = &r.idle;
    let _ = writeln!(
        s,
        "idle engine: cold TTFT {:.3} s, warm TTFT {:.3} s, ITL {:.1} ms, e2e cold {:.2} s / warm {:.2} s",
        i.cold_ttft_s,
        i.warm_ttft_s,
        i.itl_s * 1e3,
        i.cold_e2e_s,
        i.warm_e2e_s
    );
    let l = &r.light_load;
    let _ = writeln!(
        s,
        "light load: {} workers, Poisson {:.3} req/s ({:.1} req/min), {} requests per router",
        r.spec.workers,
        r.spec.rate_per_s,
        r.spec.rate_per_s * 60.0,
        r.spec.requests
    );
    let _ = writeln!(
        s,
        "  {:<9} {:>5} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>8} {:>8}",
        "router",
        "reqs",
        "TTFT p50",
        "TTFT p90",
        "ITL p50",
        "e2e p50",
        "cold",
        "warm",
        "hit",
        "decoding"
    );
    for c in [&l.random, &l.affinity] {
        let _ = writeln!(
            s,
            "  {:<9} {:>5} {:>8.3}s {:>8.3}s {:>7.1}ms {:>8.2}s {:>6} {:>6} {:>7.1}% {:>8.2}",
            c.router,
            c.all.requests,
            c.all.ttft_s,
            c.all.ttft_p90_s,
            c.all.itl_s * 1e3,
            c.all.e2e_s,
            c.cold.requests,
            c.warm.requests,
            c.hit_rate * 100.0,
            c.mean_decoding
        );
    }
    let tokens = w.prefix_tokens + w.unique_tokens;
    for (class, f, pb) in [
        (
            "cold",
            &l.cold,
            r.published
                .map(|p| (p.cold_ttft_s, p.cold_itl_s, p.cold_e2e_s)),
        ),
        (
            "warm",
            &l.warm,
            r.published
                .map(|p| (p.warm_ttft_s, p.warm_itl_s, p.warm_e2e_s)),
        ),
    ] {
        let _ = write!(
            s,
            "  {class} {tokens}-token prompts ({} requests): TTFT p50 {:.3} s, ITL p50 {:.1} ms, e2e p50 {:.2} s",
            f.requests,
            f.ttft_s,
            f.itl_s * 1e3,
            f.e2e_s
        );
        match pb {
            Some((t, i, e)) => {
                let _ = writeln!(
                    s,
                    "  (published: TTFT {t:.2} s, (e2e - TTFT)/255 {:.1} ms, e2e {e:.1} s)",
                    i * 1e3
                );
            }
            None => s.push('\n'),
        }
    }
    let _ = writeln!(
        s,
        "cache hit rate vs KV capacity (1 worker, same workload, {} warm-up + {} measured requests):",
        r.spec.cache_warmup, r.spec.cache_requests
    );
    let _ = writeln!(
        s,
        "  {:>8} {:>10} {:>9} {:>9} {:>11}",
        "blocks", "prompts", "hit rate", "TTFT p50", "preemptions"
    );
    for c in &r.cache_curve {
        let _ = writeln!(
            s,
            "  {:>8} {:>10.1} {:>8.1}% {:>8.3}s {:>11}",
            c.num_gpu_blocks,
            c.capacity_prompts,
            c.hit_rate * 100.0,
            c.ttft_s,
            c.preemptions
        );
    }
    s
}
