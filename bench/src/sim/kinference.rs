//! `kinference`: the real decision engine (`kinf_router::Decider`) with a policy bundle from
//! `testdata/bench/kinference/`, fed only what the gateway (`kinf-handler`) sees:
//!
//! - KV events of every engine, applied to the worker set's prefix index as they are published
//!   (`WorkerSetState::apply_kv_events`, as the KV-event subscriber does);
//! - `/metrics` samples (`num_requests_waiting`, `num_requests_running`,
//!   `kv_cache_usage_perc`) every `metrics.interval` (1 s) of simulated time, pushed into each
//!   endpoint's `LoadWindow` (as `kinf-handler/src/live/scraper.rs` does);
//! - the prompt's block hashes computed once, before the decision (`Request::block_hashes`),
//!   and used by the decision and by `record_routed` (as the gateway's `forward.rs` does);
//! - `ClusterState::set_now` before a decision whose millisecond differs from the last one,
//!   `record_routed` and `begin_request` after it (as `kinf-handler/src/gateway/forward.rs::decide`
//!   does), `first_token` at the first token and `end_request` when the request finishes (as
//!   the gateway's in-flight ticket does);
//! - observed TTFTs (first token − request sent) into `observe_ttft` with the inputs the
//!   prediction used (`Route::prediction`, as `forward.rs::report` does).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kinf_lang::CompiledPolicy;
use kinf_router::state::{ClusterState, LoadSample};
use kinf_router::{Decider, Outcome};
use kinf_sim::{Engine, Output};
use serde::Serialize;

use super::{RouterDetails, SimRequest, SimRouter};

/// Namespace and worker-set name of the benchmark bundle.
const NS: &str = "bench";
const WS: &str = "sim-workers";
/// Model name of the benchmark bundle.
pub const MODEL: &str = "qwen-27b";

/// The address of simulated engine `i`.
pub fn address(i: usize) -> String {
    format!("sim-{i}:8000")
}

/// Loads the bundle in `dir` (every `.yaml` file), with the worker set's `endpoints:` line
/// replaced by `n` simulated engines and its `blockSize:` line by the engines' block size, and
/// compiles it.
pub fn load_policy(dir: &Path, n: usize, block: usize) -> Result<Arc<CompiledPolicy>, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let eps: Vec<String> = (0..n).map(|i| format!("\"{}\"", address(i))).collect();
    let line = format!("  endpoints: [{}]", eps.join(", "));
    let mut sources = kinf_lang::Sources::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let text: String = text
            .lines()
            .map(|l| {
                if l.starts_with("  endpoints:") {
                    line.clone()
                } else if l.starts_with("  blockSize:") {
                    format!("  blockSize: {block}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        sources.add(f.display().to_string(), text);
    }
    let c = kinf_lang::compile(&sources);
    c.policy.ok_or_else(|| {
        let msgs: Vec<String> = c.diagnostics.iter().map(|d| format!("{d:?}")).collect();
        format!(
            "policy in {} does not compile: {}",
            dir.display(),
            msgs.join("; ")
        )
    })
}

/// What a prediction was based on, kept until the first token.
struct Pending {
    worker: usize,
    sent: f64,
    prediction: kinf_router::PredictionInputs,
    first_token_seen: bool,
}

/// A compact decision trace: per candidate, what the decision read and predicted.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceSample {
    /// Simulated time, seconds.
    pub t: f64,
    /// Request id.
    pub id: u64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// The rule that decided.
    pub rule: Option<Arc<str>>,
    /// The chosen engine.
    pub chosen: usize,
    /// `(engine, cached tokens, queued (30 s avg), running (30 s avg), predicted TTFT s,
    /// recompute cost s, decode cost s)` per candidate; the pick minimizes the sum of the last
    /// three.
    pub candidates: Vec<(usize, u32, f64, f64, f64, f64, f64)>,
    /// Filters that dropped candidates: `(filter, engine)`.
    pub dropped: Vec<(String, usize)>,
    /// The engine's true waiting+running requests at decision time (ground truth, for the
    /// analysis only; the decision did not see it).
    pub true_load: Vec<usize>,
}

/// The Kinference router in the simulation.
pub struct Kinference {
    policy: Arc<CompiledPolicy>,
    state: ClusterState,
    addr: Vec<Arc<str>>,
    by_addr: HashMap<Arc<str>, usize>,
    /// The engines' block size: prompts are hashed once per request, before the decision, as
    /// the gateway does.
    block: usize,
    pending: HashMap<u64, Pending>,
    last_ms: Option<u64>,
    trace_every: u64,
    decisions: u64,
    /// Sampled decision traces.
    pub traces: Vec<TraceSample>,
    /// Decisions by rule name.
    pub rules: HashMap<String, u64>,
    /// Rejected decisions.
    pub rejected: u64,
}

impl Kinference {
    /// For `n` engines of block size `block` with the bundle in `dir`; keeps one decision trace
    /// every `trace_every` decisions (0: none).
    pub fn new(dir: &Path, n: usize, block: usize, trace_every: u64) -> Result<Self, String> {
        let policy = load_policy(dir, n, block)?;
        let state = ClusterState::from_policy(&policy, block);
        let addr: Vec<Arc<str>> = (0..n).map(|i| Arc::from(address(i))).collect();
        let by_addr = addr
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, a)| (a, i))
            .collect();
        Ok(Self {
            policy,
            state,
            addr,
            by_addr,
            block,
            pending: HashMap::new(),
            last_ms: None,
            trace_every,
            decisions: 0,
            traces: Vec::new(),
            rules: HashMap::new(),
            rejected: 0,
        })
    }

    /// The request is over: no longer in flight.
    fn end(&mut self, id: u64) {
        if let Some(p) = self.pending.remove(&id)
            && let Some(a) = self.addr.get(p.worker)
        {
            let a = a.clone();
            self.state.end_request(
                NS,
                WS,
                &a,
                p.prediction.uncached_tokens,
                !p.first_token_seen,
            );
        }
    }

    fn ms(t: f64) -> u64 {
        (t * 1000.0).round().max(0.0) as u64
    }
}

impl SimRouter for Kinference {
    fn scrape_interval(&self) -> Option<f64> {
        Some(1.0)
    }

    fn scrape(&mut self, now: f64, engines: &[Engine]) {
        let at_ms = Self::ms(now);
        let Some(ws) = self.state.worker_sets.values_mut().next() else {
            return;
        };
        for (i, v) in engines.iter().enumerate().take(ws.endpoints.len()) {
            let g = v.gauges();
            ws.push_load(
                i,
                LoadSample {
                    at_ms,
                    queued: g.waiting as f64,
                    running: g.running as f64,
                    kv_usage: g.kv_cache_usage,
                },
            );
        }
        // The scraped values are visible from now on: the window ends at the next decision.
        self.last_ms = None;
    }

    fn route(&mut self, now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let now_ms = Self::ms(now);
        if self.last_ms != Some(now_ms) {
            self.state.set_now(now_ms);
            self.last_ms = Some(now_ms);
        }
        let mut r = kinf_router::Request::new(MODEL, req.prompt.len() as u32);
        r.token_ids = Some(req.prompt.clone());
        r.hash_prompt(self.block);
        r.max_tokens = req.max_tokens;
        r.tenant = req.meta.tenant.clone();
        r.qos = req.meta.qos;
        // Decisions 1, 1 + trace_every, … are recorded (`--trace-every`), with full traces;
        // the others decide with summaries.
        let traced = self.trace_every > 0 && self.decisions.is_multiple_of(self.trace_every);
        let detail = if traced {
            kinf_router::TraceDetail::Full
        } else {
            kinf_router::TraceDetail::Summary
        };
        let d = Decider::decide_with(&self.policy, &r, &self.state, detail);
        self.decisions += 1;
        let rule = d.rule.clone();
        *self
            .rules
            .entry(rule.as_deref().unwrap_or("default").to_string())
            .or_insert(0) += 1;
        let Outcome::Route(route) = &d.outcome else {
            self.rejected += 1;
            return usize::MAX; // refused: the fleet rejects it with NoEngine
        };
        let w = self
            .by_addr
            .get(&route.endpoint)
            .copied()
            .unwrap_or(usize::MAX);
        self.state
            .record_routed(NS, WS, &route.endpoint, &r, route.cached_tokens, now_ms);
        let prediction = route.prediction.unwrap_or_default();
        self.state
            .begin_request(NS, WS, &route.endpoint, prediction.uncached_tokens);
        self.pending.insert(
            req.id,
            Pending {
                worker: w,
                sent: now,
                prediction,
                first_token_seen: false,
            },
        );
        if traced {
            let stages = d
                .trace
                .rules
                .iter()
                .rev()
                .find_map(|rt| rt.stages.as_ref())
                .or(d.trace.default.as_ref());
            let idx = |a: &str| self.by_addr.get(a).copied().unwrap_or(usize::MAX);
            let (candidates, dropped) = stages.map_or((Vec::new(), Vec::new()), |s| {
                (
                    s.considered
                        .iter()
                        .map(|c| {
                            (
                                idx(&c.id.endpoint),
                                c.cached_prompt_tokens,
                                c.queued_prompts.unwrap_or(0.0),
                                c.running_prompts.unwrap_or(0.0),
                                c.predicted_ttft.total_s,
                                c.predicted_ttft.recompute_s,
                                c.predicted_ttft.decode_s,
                            )
                        })
                        .collect(),
                    s.dropped
                        .iter()
                        .map(|x| (x.filter.to_string(), idx(&x.candidate.endpoint)))
                        .collect(),
                )
            });
            self.traces.push(TraceSample {
                t: now,
                id: req.id,
                prompt_tokens: r.prompt_tokens,
                rule,
                chosen: w,
                candidates,
                dropped,
                true_load: engines
                    .iter()
                    .map(|v| {
                        let g = v.gauges();
                        g.waiting + g.running
                    })
                    .collect(),
            });
        }
        w
    }

    fn observe(&mut self, _now: f64, engine: usize, out: &Output) {
        match out {
            Output::KvEvents(b) => {
                if let (Some(ws), Some(a)) = (
                    self.state.worker_sets.values_mut().next(),
                    self.addr.get(engine),
                ) {
                    ws.apply_kv_events(a, &b.events);
                }
            }
            Output::FirstToken { id, time, .. } => {
                if let Some(p) = self.pending.get_mut(id)
                    && let Some(a) = self.addr.get(p.worker)
                {
                    p.first_token_seen = true;
                    let (a, i) = (a.clone(), p.prediction);
                    let sent = p.sent;
                    self.state.observe_ttft(
                        NS,
                        WS,
                        &a,
                        i.prefill_tokens(),
                        i.queued,
                        i.running,
                        time - sent,
                    );
                    self.state.first_token(NS, WS, &a, i.uncached_tokens);
                }
            }
            Output::Finished(f) => self.end(f.id),
            Output::Rejected(r) => self.end(r.id),
            _ => {}
        }
    }

    fn take_details(&mut self) -> Option<RouterDetails> {
        Some(RouterDetails {
            rules: std::mem::take(&mut self.rules),
            traces: std::mem::take(&mut self.traces),
        })
    }
}
