//! `kinf-bench sim`: routers compared on a simulated vLLM fleet (`kinf-sim`), deterministic
//! for a seed.
//!
//! One discrete-event loop drives the fleet: the next thing to happen is an engine event
//! (step end: tokens, completions, KV events), a router's metrics scrape, or a request
//! arrival, whichever is earliest (engine events first on ties). Arrivals are open-loop
//! Poisson sessions or a closed loop of `C` clients that each send their next request when the
//! previous one finished. Every engine output goes to the router's `observe` (KV events, first
//! tokens, completions) before the loop acts on it. Method and metric definitions:
//! `docs/benchmarks/README.md`.

pub mod cli;
pub mod kinference;
pub mod routers;
pub mod workload;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::ValueEnum;
use kinf_sim::hash::Rng;
use kinf_sim::{Engine, EngineOptions, Fleet, Output, Profile, Request};
use serde::Serialize;

use workload::{Generator, Meta, Session};
pub use workload::{MultiturnSizes, WorkloadKind};

/// A request as the router sees it.
#[derive(Debug, Clone)]
pub struct SimRequest {
    /// Unique id.
    pub id: u64,
    /// Prompt token ids (routers that tokenize see these; character-based ones are modelled
    /// on them, see [`routers`]).
    pub prompt: Arc<[u32]>,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Tenant and QoS (from the API key and headers in a real gateway).
    pub meta: Meta,
}

/// A router in the simulation: a decision per request, plus what it may observe.
pub trait SimRouter {
    /// The engine index for `req` at simulated time `now` (out of range: refused).
    /// `engines` is the fleet; a router reads from it only what its real counterpart could
    /// (its scrape, see [`SimRouter::scrape`]).
    fn route(&mut self, now: f64, req: &SimRequest, engines: &[Engine]) -> usize;

    /// Every engine output, in time order: KV events, first tokens, completions, refusals.
    fn observe(&mut self, _now: f64, _engine: usize, _out: &Output) {}

    /// How often the router scrapes `/metrics`, simulated seconds (`None`: never).
    fn scrape_interval(&self) -> Option<f64> {
        None
    }

    /// A metrics scrape at `now` (gauges as vLLM's `/metrics` reports them).
    fn scrape(&mut self, _now: f64, _engines: &[Engine]) {}

    /// What the router can tell about its decisions after the run (Kinference: rules and
    /// sampled traces).
    fn take_details(&mut self) -> Option<RouterDetails> {
        None
    }
}

/// Decisions per rule and sampled decision traces.
#[derive(Debug, Clone, Default)]
pub struct RouterDetails {
    /// Decisions per rule name.
    pub rules: HashMap<String, u64>,
    /// Sampled traces.
    pub traces: Vec<kinference::TraceSample>,
}

/// A router's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterKind {
    /// Uniform random (the Kubernetes Service baseline).
    Random,
    /// Round robin.
    RoundRobin,
    /// Fewest in-flight requests.
    LeastQueue,
    /// Gateway API Inference Extension endpoint picker.
    Epp,
    /// SGLang / vllm-router `cache_aware`.
    SglangCacheAware,
    /// NVIDIA Dynamo KV router.
    Dynamo,
    /// AIBrix prefix-cache routing.
    Aibrix,
    /// The real `kinf-router` decision engine.
    Kinference,
}

impl RouterKind {
    /// Every router, baselines first.
    pub const ALL: [RouterKind; 8] = [
        Self::Random,
        Self::RoundRobin,
        Self::LeastQueue,
        Self::Epp,
        Self::SglangCacheAware,
        Self::Dynamo,
        Self::Aibrix,
        Self::Kinference,
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::RoundRobin => "round-robin",
            Self::LeastQueue => "least-queue",
            Self::Epp => "epp",
            Self::SglangCacheAware => "sglang-cache-aware",
            Self::Dynamo => "dynamo",
            Self::Aibrix => "aibrix",
            Self::Kinference => "kinference",
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadSpec {
    /// Open loop: sessions start as a Poisson process of this rate (per second).
    Poisson(f64),
    /// Closed loop: this many clients, each sending its next request when the previous one
    /// finished.
    Concurrency(usize),
}

impl LoadSpec {
    /// Parses `poisson:RATE` or `concurrency:C`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (k, v) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: expected poisson:RATE or concurrency:C"))?;
        match k {
            "poisson" => v
                .parse::<f64>()
                .ok()
                .filter(|r| *r > 0.0 && r.is_finite())
                .map(Self::Poisson)
                .ok_or_else(|| format!("`{v}`: a positive rate")),
            "concurrency" => v
                .parse::<usize>()
                .ok()
                .filter(|c| *c > 0)
                .map(Self::Concurrency)
                .ok_or_else(|| format!("`{v}`: a positive integer")),
            _ => Err(format!("`{k}`: expected poisson or concurrency")),
        }
    }

    /// `poisson:RATE` / `concurrency:C`.
    pub fn label(&self) -> String {
        match self {
            Self::Poisson(r) => format!("poisson:{r}"),
            Self::Concurrency(c) => format!("concurrency:{c}"),
        }
    }
}

/// One simulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimConfig {
    /// Workload.
    pub workload: WorkloadKind,
    /// Router.
    pub router: RouterKind,
    /// Engines.
    pub workers: usize,
    /// Engine profile name (`kinf-sim profiles`).
    pub profile: String,
    /// Arrivals.
    pub load: LoadSpec,
    /// Requests are sent during `[0, duration)`, simulated seconds; the run then drains.
    pub duration_s: f64,
    /// Requests sent before this are not measured.
    pub warmup_s: f64,
    /// Seed (workload, arrivals, routers' tie-breaking).
    pub seed: u64,
    /// Divides every token count (1 for the benchmark; larger for smoke tests with `tiny`).
    pub scale: usize,
    /// The Kinference policy bundle.
    pub policy_dir: PathBuf,
    /// Keep one Kinference decision trace every this many decisions (0: none).
    pub trace_every: u64,
    /// Keep this many TTFT quantiles for CDF plots (0: none).
    pub cdf_points: usize,
    /// The multiturn workload's conversation sizes (ignored by the other workloads).
    pub multiturn: MultiturnSizes,
}

impl SimConfig {
    /// Defaults for a workload and router: 3 workers, the calibrated L40S profile, the
    /// workload's light Poisson load for 4,000 s, seed 1.
    pub fn new(workload: WorkloadKind, router: RouterKind) -> Self {
        Self {
            workload,
            router,
            workers: 3,
            profile: "l40s-qwen27b-fp8".into(),
            load: LoadSpec::Poisson(workload.light_rate(3)),
            duration_s: 4000.0,
            warmup_s: 0.0,
            seed: 1,
            scale: 1,
            policy_dir: default_policy_dir(),
            trace_every: 0,
            cdf_points: 0,
            multiturn: MultiturnSizes::default(),
        }
    }
}

/// `testdata/bench/kinference` of this repository.
pub fn default_policy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("testdata/bench/kinference")
}

/// What a simulation measured. Latencies in seconds of simulated time; `decision_us_*` and
/// `wall_s` are wall-clock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimResult {
    /// Where the figures come from: `sim`.
    pub source: String,
    /// Workload name.
    pub workload: String,
    /// Router name.
    pub router: String,
    /// Engines.
    pub workers: usize,
    /// Engine profile.
    pub profile: String,
    /// `poisson:RATE` or `concurrency:C`.
    pub load: String,
    /// Concurrency of a closed-loop run.
    pub concurrency: Option<usize>,
    /// Seed.
    pub seed: u64,
    /// The conversation sizes of a multiturn run (absent for the other workloads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multiturn_sizes: Option<MultiturnSizes>,
    /// Sending period, simulated seconds.
    pub duration_s: f64,
    /// Unmeasured start, simulated seconds.
    pub warmup_s: f64,
    /// The workload's SLO TTFT threshold, seconds.
    pub slo_ttft_s: f64,
    /// Measured requests (sent in `[warmup, duration)`), finished or refused.
    pub requests: u64,
    /// Of them, refused (by the router or an engine).
    pub rejected: u64,
    /// Requests sent in total.
    pub submitted: u64,
    /// TTFT quantiles of measured requests.
    pub ttft_p50_s: f64,
    /// 90th percentile.
    pub ttft_p90_s: f64,
    /// 99th percentile.
    pub ttft_p99_s: f64,
    /// Mean.
    pub ttft_mean_s: f64,
    /// End-to-end latency median.
    pub e2e_p50_s: f64,
    /// End-to-end latency 90th percentile.
    pub e2e_p90_s: f64,
    /// Median of per-request mean inter-token latency.
    pub itl_p50_s: f64,
    /// Measured requests with TTFT ≤ the SLO threshold, per minute of the measured period.
    pub goodput_rpm: f64,
    /// Measured requests finished per minute of the measured period.
    pub throughput_rpm: f64,
    /// Share of measured requests with TTFT ≤ the SLO threshold.
    pub slo_attainment: f64,
    /// Whether `slo_attainment ≥ 0.9`.
    pub slo_met: bool,
    /// Prompt tokens served from the prefix cache / prompt tokens, measured requests.
    pub cache_hit_rate: f64,
    /// Output tokens of measured requests per second of the measured period.
    pub output_tok_s: f64,
    /// Mean wall time of one routing decision, µs (router state updates excluded).
    pub decision_us_mean: f64,
    /// Median.
    pub decision_us_p50: f64,
    /// 99th percentile.
    pub decision_us_p99: f64,
    /// Measured requests per engine (max / mean): 1 is perfectly even.
    pub load_imbalance: f64,
    /// Requests routed to each engine (all requests; only for up to 64 engines).
    pub per_worker_requests: Vec<u64>,
    /// Engine steps.
    pub steps: u64,
    /// Simulated time when the fleet ran dry, seconds.
    pub sim_end_s: f64,
    /// Wall time of the run, seconds (a shared 2-core box: indicative only).
    pub wall_s: f64,
    /// Where `wall_s` went.
    pub wall_breakdown: WallBreakdown,
    /// TTFT quantiles (`cdf_points` evenly spaced), for CDF plots.
    pub ttft_cdf: Vec<f64>,
    /// Kinference only: decisions per rule.
    pub rules: Option<HashMap<String, u64>>,
    /// Kinference only: sampled decision traces.
    pub traces: Option<Vec<kinference::TraceSample>>,
}

/// Where a simulation's wall time went, seconds: each part is the time spent inside one kind
/// of call, measured around the call (`Instant`, about 25 ns a reading; a few per request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct WallBreakdown {
    /// Building the fleet (every engine's block pool), the router and the workload.
    pub setup_s: f64,
    /// The simulated engines: stepping (scheduling, the KV cache, producing KV events) and
    /// accepting requests.
    pub engine_s: f64,
    /// The router's decisions (`route`: for `kinference` the prompt's hashing, the decision and
    /// the state updates that go with it, `record_routed` and `begin_request`).
    pub decide_s: f64,
    /// The router taking in engine outputs (`observe`: for `kinference` KV events into the
    /// prefix index, first tokens into the TTFT model, completions).
    pub observe_s: f64,
    /// The router's metrics scrapes.
    pub scrape_s: f64,
    /// Generating sessions and turns (prompts).
    pub workload_s: f64,
    /// The rest: the event loop, per-request bookkeeping and the final statistics.
    pub other_s: f64,
}

/// Builds the router.
fn make_router(cfg: &SimConfig, block: usize) -> Result<Box<dyn SimRouter>, String> {
    let n = cfg.workers;
    let s = cfg.seed;
    Ok(match cfg.router {
        RouterKind::Random => Box::new(routers::Random::new(s)),
        RouterKind::RoundRobin => Box::new(routers::RoundRobin::default()),
        RouterKind::LeastQueue => Box::new(routers::LeastQueue::new(n, s)),
        RouterKind::Epp => Box::new(routers::Epp::new(n, s)),
        RouterKind::SglangCacheAware => Box::new(routers::SglangCacheAware::new(n, s)),
        RouterKind::Dynamo => Box::new(routers::Dynamo::new(n, block, s)),
        RouterKind::Aibrix => Box::new(routers::Aibrix::new(n, s)),
        RouterKind::Kinference => Box::new(kinference::Kinference::new(
            &cfg.policy_dir,
            n,
            block,
            cfg.trace_every,
        )?),
    })
}

/// Quantile `q` of sorted values (nearest rank); 0 when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(i.min(sorted.len() - 1)).copied().unwrap_or(0.0)
}

/// A client: its session, and the request it waits for.
struct Client {
    session: Session,
    previous: Option<(u64, u32)>,
}

/// The clients by index (the index is what pending sends and requests refer to). Open-loop
/// clients come and go, one per session (6 million in the scale target run): a retired
/// client's slot goes to the next one, so the table stays as large as the sessions in flight.
#[derive(Default)]
struct Clients {
    slots: Vec<Option<Client>>,
    free: Vec<usize>,
}

impl Clients {
    /// Adds a client; returns its index.
    fn add(&mut self, c: Client) -> usize {
        match self.free.pop() {
            Some(i) => {
                if let Some(slot) = self.slots.get_mut(i) {
                    *slot = Some(c);
                }
                i
            }
            None => {
                self.slots.push(Some(c));
                self.slots.len() - 1
            }
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut Client> {
        self.slots.get_mut(i).and_then(Option::as_mut)
    }

    /// Removes a client whose session is over (nothing refers to its index any more).
    fn retire(&mut self, i: usize) {
        if let Some(slot) = self.slots.get_mut(i)
            && slot.take().is_some()
        {
            self.free.push(i);
        }
    }
}

/// Per-request bookkeeping until it finishes.
struct Live {
    client: usize,
    measured: bool,
}

/// Runs one simulation.
pub fn run(cfg: &SimConfig) -> Result<SimResult, String> {
    let profile = Profile::by_name(&cfg.profile)
        .ok_or_else(|| format!("unknown profile `{}`", cfg.profile))?;
    if cfg.workers == 0 {
        return Err("--workers must be at least 1".into());
    }
    let started = Instant::now();
    let block = profile.block_size as usize;
    let vocab = profile.vocab_size;
    let opts = EngineOptions {
        kv_events: true,
        token_outputs: false,
    };
    let mut fleet = Fleet::new(&profile, opts, cfg.workers).map_err(|e| e.to_string())?;
    let mut router = make_router(cfg, block)?;
    let mut generator = Generator::new(cfg.workload, cfg.seed, vocab, cfg.scale, cfg.workers)
        .with_multiturn_sizes(cfg.multiturn)
        .with_prefix_hashes(profile.block_size);
    let mut wb = WallBreakdown {
        setup_s: started.elapsed().as_secs_f64(),
        ..WallBreakdown::default()
    };
    // Adds the time since `t0` to a part of `wb`.
    let spent = |part: &mut f64, t0: Instant| *part += t0.elapsed().as_secs_f64();
    let mut arrivals_rng = Rng::new(cfg.seed ^ 0x6172_7269_7661_6c73);
    let closed = matches!(cfg.load, LoadSpec::Concurrency(_));

    // Pending sends: (time, sequence, client).
    let mut sends: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let key = |t: f64| t.max(0.0).to_bits();
    let mut clients = Clients::default();
    let mut next_poisson = f64::INFINITY;
    match cfg.load {
        LoadSpec::Concurrency(c) => {
            let t0 = Instant::now();
            for _ in 0..c {
                let i = clients.add(Client {
                    session: generator.session(),
                    previous: None,
                });
                sends.push(Reverse((key(0.0), seq, i)));
                seq += 1;
            }
            spent(&mut wb.workload_s, t0);
        }
        LoadSpec::Poisson(rate) => next_poisson = arrivals_rng.exp(rate),
    }
    let scrape_every = router.scrape_interval();
    let mut next_scrape = if scrape_every.is_some() {
        0.0
    } else {
        f64::INFINITY
    };

    let mut live: HashMap<u64, Live> = HashMap::new();
    let mut next_id = 0u64;
    let mut submitted = 0u64;
    let mut per_worker = vec![0u64; cfg.workers];
    // Measured results.
    let mut ttft: Vec<f32> = Vec::new();
    let mut e2e: Vec<f32> = Vec::new();
    let mut itl: Vec<f32> = Vec::new();
    let mut measured = 0u64;
    let mut rejected = 0u64;
    let mut good = 0u64;
    let mut finished_ok = 0u64;
    let mut cached_tokens = 0u64;
    let mut prompt_tokens = 0u64;
    let mut output_tokens = 0u64;
    let mut decision_ns: Vec<u32> = Vec::new();
    let slo = cfg.workload.slo_ttft_s();
    let mut outs: Vec<(usize, Output)> = Vec::new();

    loop {
        let te = fleet.next_event_time().unwrap_or(f64::INFINITY);
        let ta_heap = sends
            .peek()
            .map_or(f64::INFINITY, |Reverse((k, _, _))| f64::from_bits(*k));
        let tp = if next_poisson < cfg.duration_s {
            next_poisson
        } else {
            f64::INFINITY
        };
        let ta = ta_heap.min(tp);
        if te.is_infinite() && ta.is_infinite() {
            break;
        }
        if te <= ta && te <= next_scrape {
            outs.clear();
            let t0 = Instant::now();
            fleet.advance_to(te, &mut |i, o| outs.push((i, o)));
            spent(&mut wb.engine_s, t0);
            for (i, o) in outs.drain(..) {
                let t0 = Instant::now();
                router.observe(te, i, &o);
                spent(&mut wb.observe_s, t0);
                let (id, fin) = match &o {
                    Output::Finished(f) => (f.id, Some(f.stats)),
                    Output::Rejected(r) => (r.id, None),
                    _ => continue,
                };
                let Some(l) = live.remove(&id) else { continue };
                let now = o.time();
                if l.measured {
                    measured += 1;
                    match fin {
                        Some(s) => {
                            let t = s.ttft().unwrap_or(f64::INFINITY);
                            ttft.push(t as f32);
                            e2e.push(s.e2e() as f32);
                            if let Some(x) = s.mean_itl() {
                                itl.push(x as f32);
                            }
                            finished_ok += 1;
                            if t <= slo {
                                good += 1;
                            }
                            cached_tokens += u64::from(s.cached_tokens);
                            prompt_tokens += u64::from(s.prompt_tokens);
                            output_tokens += u64::from(s.output_tokens);
                        }
                        None => rejected += 1,
                    }
                }
                // The client sends its next request now (closed loop, or the next turn of a
                // conversation), while the sending period lasts.
                let Some(c) = clients.get_mut(l.client) else {
                    continue;
                };
                c.previous = fin.map(|s| (id, s.output_tokens));
                if c.session.is_done() {
                    if closed {
                        let t0 = Instant::now();
                        c.session = generator.session();
                        spent(&mut wb.workload_s, t0);
                        c.previous = None;
                    } else {
                        clients.retire(l.client);
                        continue;
                    }
                }
                if now < cfg.duration_s {
                    sends.push(Reverse((key(now), seq, l.client)));
                    seq += 1;
                }
            }
            continue;
        }
        if next_scrape <= ta {
            let t0 = Instant::now();
            router.scrape(next_scrape, fleet.engines());
            spent(&mut wb.scrape_s, t0);
            next_scrape += scrape_every.unwrap_or(f64::INFINITY);
            continue;
        }
        // An arrival.
        let (t, client) = if tp <= ta_heap {
            let t0 = Instant::now();
            let session = generator.session();
            spent(&mut wb.workload_s, t0);
            let i = clients.add(Client {
                session,
                previous: None,
            });
            if let LoadSpec::Poisson(rate) = cfg.load {
                next_poisson += arrivals_rng.exp(rate);
            }
            (tp, i)
        } else {
            let Some(Reverse((_, _, c))) = sends.pop() else {
                continue;
            };
            (ta_heap, c)
        };
        let Some(c) = clients.get_mut(client) else {
            continue;
        };
        let t0 = Instant::now();
        let turn = c.session.next_turn(c.previous, vocab);
        spent(&mut wb.workload_s, t0);
        let Some(turn) = turn else {
            continue;
        };
        let id = next_id;
        next_id += 1;
        let hashed_prefix = turn.prefix;
        let req = SimRequest {
            id,
            prompt: turn.prompt,
            max_tokens: turn.max_tokens,
            meta: turn.meta,
        };
        // Bring the fleet to `t` (no engine event is due before it) so that the router
        // reads state as of now.
        let d0 = Instant::now();
        let w = router.route(t, &req, fleet.engines());
        let dt = d0.elapsed().as_nanos().min(u128::from(u32::MAX)) as u32;
        decision_ns.push(dt);
        submitted += 1;
        if let Some(c) = per_worker.get_mut(w) {
            *c += 1;
        }
        live.insert(
            id,
            Live {
                client,
                measured: t >= cfg.warmup_s && t < cfg.duration_s,
            },
        );
        let mut ereq = Request::new(id, req.prompt, req.max_tokens);
        if let Some(p) = hashed_prefix {
            ereq = ereq.with_prefix_hashes(p);
        }
        outs.clear();
        let t0 = Instant::now();
        fleet.submit_to(w, ereq, t, &mut |i, o| outs.push((i, o)));
        spent(&mut wb.engine_s, t0);
        // A refusal: account for it like an engine output.
        for (i, o) in std::mem::take(&mut outs) {
            let t0 = Instant::now();
            router.observe(t, i, &o);
            spent(&mut wb.observe_s, t0);
            if let Output::Rejected(r) = &o
                && let Some(l) = live.remove(&r.id)
            {
                if l.measured {
                    measured += 1;
                    rejected += 1;
                }
                if let Some(c) = clients.get_mut(l.client) {
                    c.previous = None;
                    if c.session.is_done() && !closed {
                        clients.retire(l.client);
                        continue;
                    }
                    if c.session.is_done() {
                        let t0 = Instant::now();
                        c.session = generator.session();
                        spent(&mut wb.workload_s, t0);
                    }
                    // Retry-free client: the next request after a short pause.
                    if t + 1.0 < cfg.duration_s {
                        sends.push(Reverse((key(t + 1.0), seq, l.client)));
                        seq += 1;
                    }
                }
            }
        }
    }

    let window = (cfg.duration_s - cfg.warmup_s).max(1e-9);
    let mut ttft_s: Vec<f64> = ttft.iter().map(|&x| f64::from(x)).collect();
    // Refused requests never get a first token: they count as infinitely slow.
    ttft_s.extend(std::iter::repeat_n(f64::INFINITY, rejected as usize));
    ttft_s.sort_by(f64::total_cmp);
    let mut e2e_s: Vec<f64> = e2e.iter().map(|&x| f64::from(x)).collect();
    e2e_s.sort_by(f64::total_cmp);
    let mut itl_s: Vec<f64> = itl.iter().map(|&x| f64::from(x)).collect();
    itl_s.sort_by(f64::total_cmp);
    let mut dec: Vec<f64> = decision_ns.iter().map(|&x| f64::from(x) / 1000.0).collect();
    dec.sort_by(f64::total_cmp);
    let dec_mean = if dec.is_empty() {
        0.0
    } else {
        dec.iter().sum::<f64>() / dec.len() as f64
    };
    let finite: Vec<f64> = ttft_s.iter().copied().filter(|x| x.is_finite()).collect();
    let mean_ttft = if finite.is_empty() {
        0.0
    } else {
        finite.iter().sum::<f64>() / finite.len() as f64
    };
    let cdf = if cfg.cdf_points > 1 && !finite.is_empty() {
        (0..cfg.cdf_points)
            .map(|k| quantile(&finite, k as f64 / (cfg.cdf_points - 1) as f64))
            .collect()
    } else {
        Vec::new()
    };
    let total_routed: u64 = per_worker.iter().sum();
    let imbalance = if total_routed > 0 {
        let max = per_worker.iter().copied().max().unwrap_or(0) as f64;
        max / (total_routed as f64 / cfg.workers as f64)
    } else {
        0.0
    };
    let mut result = SimResult {
        source: "sim".into(),
        workload: cfg.workload.name().into(),
        router: cfg.router.name().into(),
        workers: cfg.workers,
        profile: cfg.profile.clone(),
        load: cfg.load.label(),
        concurrency: match cfg.load {
            LoadSpec::Concurrency(c) => Some(c),
            LoadSpec::Poisson(_) => None,
        },
        seed: cfg.seed,
        multiturn_sizes: (cfg.workload == WorkloadKind::Multiturn).then_some(cfg.multiturn),
        duration_s: cfg.duration_s,
        warmup_s: cfg.warmup_s,
        slo_ttft_s: slo,
        requests: measured,
        rejected,
        submitted,
        ttft_p50_s: quantile(&ttft_s, 0.5),
        ttft_p90_s: quantile(&ttft_s, 0.9),
        ttft_p99_s: quantile(&ttft_s, 0.99),
        ttft_mean_s: mean_ttft,
        e2e_p50_s: quantile(&e2e_s, 0.5),
        e2e_p90_s: quantile(&e2e_s, 0.9),
        itl_p50_s: quantile(&itl_s, 0.5),
        goodput_rpm: good as f64 / (window / 60.0),
        throughput_rpm: finished_ok as f64 / (window / 60.0),
        slo_attainment: if measured > 0 {
            good as f64 / measured as f64
        } else {
            0.0
        },
        slo_met: measured > 0 && good as f64 >= 0.9 * measured as f64,
        cache_hit_rate: if prompt_tokens > 0 {
            cached_tokens as f64 / prompt_tokens as f64
        } else {
            0.0
        },
        output_tok_s: output_tokens as f64 / window,
        decision_us_mean: dec_mean,
        decision_us_p50: quantile(&dec, 0.5),
        decision_us_p99: quantile(&dec, 0.99),
        load_imbalance: imbalance,
        per_worker_requests: if cfg.workers <= 64 {
            per_worker
        } else {
            Vec::new()
        },
        steps: fleet.total_counters().steps,
        sim_end_s: fleet.now(),
        wall_s: 0.0,
        wall_breakdown: wb,
        ttft_cdf: cdf,
        rules: None,
        traces: None,
    };
    if let Some(d) = router.take_details() {
        result.rules = Some(d.rules);
        result.traces = Some(d.traces);
    }
    result.wall_s = started.elapsed().as_secs_f64();
    let b = &mut result.wall_breakdown;
    b.decide_s = decision_ns.iter().map(|&x| u64::from(x)).sum::<u64>() as f64 / 1e9;
    b.other_s = (result.wall_s
        - b.setup_s
        - b.engine_s
        - b.decide_s
        - b.observe_s
        - b.scrape_s
        - b.workload_s)
        .max(0.0);
    Ok(result)
}
