//! `Decider::decide`: evaluates a compiled policy against a request and the cluster state.
//! The semantics are documented in `docs/concepts/policy-evaluation.md`; this file follows it.

use std::sync::Arc;
use std::time::Duration;

use kinf_grammar::{EvalContext, Value};
use kinf_lang::check::DEFAULT_WINDOW;
use kinf_lang::compiled::{
    CompiledPolicy, CompiledPool, CompiledRule, ConsiderEntry, DestId, Destination, DropCond,
    ExcludeFilter, Pick, Range, RequestCond, SelectTier,
};
use kinf_lang::env;
use kinf_policy::{BackendType, Measure, OnEmpty};
use smallvec::SmallVec;

use crate::decision::PredictionInputs;
use crate::decision::*;
use crate::predictor::{TtftModel, TtftParts};
use crate::prefix_index::EndpointId;
use crate::request::Request;
use crate::state::{ClusterState, EndpointState, Load, WorkerSetState};

mod scan;

/// The decision engine. Stateless: everything lives in the policy and the state.
#[derive(Clone, Copy, Debug, Default)]
pub struct Decider;

/// The inputs of an endpoint's TTFT prediction for a request with `uncached` tokens to
/// prefill: the newest scraped sample (not a window average: the queue changes faster than any
/// window) combined with what this gateway knows is in flight there.
pub(crate) fn prediction_inputs(ep: &EndpointState, uncached: u32) -> PredictionInputs {
    let (queued, running) = ep
        .load
        .latest()
        .map_or((0.0, 0.0), |s| (s.queued, s.running));
    let mine = f64::from(ep.inflight.requests);
    PredictionInputs {
        uncached_tokens: uncached,
        pending_prefill_tokens: ep.inflight.prefill_tokens,
        queued: (queued - mine).max(0.0),
        running: running.max(mine),
    }
}

/// An endpoint's prediction inputs for a request with `uncached` tokens to prefill, and its
/// predicted TTFT by the worker set's model (before capacity costs). Both decision paths
/// predict with it, so that their scores are the same numbers.
fn predict(
    ws: &WorkerSetState,
    ep: &EndpointState,
    uncached: u32,
) -> (PredictionInputs, TtftParts) {
    let p = prediction_inputs(ep, uncached);
    let ttft = ws.ttft.predict_behind(
        f64::from(p.uncached_tokens),
        p.pending_prefill_tokens as f64,
        p.queued,
        p.running,
    );
    (p, ttft)
}

/// A candidate during evaluation.
#[derive(Clone, Debug)]
struct Candidate<'s> {
    dest: DestId,
    dest_pos: usize,
    endpoint_pos: usize,
    // Names are borrowed from the policy and the state (no reference count per candidate:
    // with a thousand endpoints the increments and decrements were about 40 % of a
    // decision's samples).
    destination: &'s Arc<str>,
    endpoint: &'s Arc<str>,
    /// The endpoint's state (Local only), for load over other windows.
    ep: Option<&'s EndpointState>,
    prefix_tracking: &'static str,
    backend: BackendType,
    model: &'s Arc<str>,
    cached_tokens: u32,
    load: Option<Load>,
    prediction: Option<PredictionInputs>,
    /// The worker set's TTFT model (Local only), for the recompute cost.
    model_ttft: Option<&'s TtftModel>,
    ttft: TtftParts,
    cost: f64,
}

impl Candidate<'_> {
    fn id(&self) -> CandidateRef {
        CandidateRef {
            destination: self.destination.clone(),
            endpoint: self.endpoint.clone(),
        }
    }

    fn trace(&self) -> CandidateTrace {
        CandidateTrace {
            id: self.id(),
            backend_type: self.backend,
            model: self.model.clone(),
            queued_prompts: self.load.map(|l| l.queued_prompts),
            running_prompts: self.load.map(|l| l.running_prompts),
            kv_cache_usage: self.load.map(|l| l.kv_cache_usage),
            cached_prompt_tokens: self.cached_tokens,
            prefix_tracking: self.prefix_tracking,
            predicted_ttft: self.ttft,
            cost: self.cost,
        }
    }

    fn measure(&self, m: Measure) -> f64 {
        match m {
            Measure::PredictedTtft => self.ttft.rank_s(),
            Measure::QueuedPrompts => self.load.map_or(0.0, |l| l.queued_prompts),
            Measure::RunningPrompts => self.load.map_or(0.0, |l| l.running_prompts),
            Measure::KvCacheUsage => self.load.map_or(0.0, |l| l.kv_cache_usage),
            Measure::Cost => self.cost,
        }
    }
}

/// Per-decision memo of prefix matches, one per worker set.
struct Ctx<'a> {
    policy: &'a CompiledPolicy,
    pool: &'a CompiledPool,
    req: &'a Request,
    state: &'a ClusterState,
    detail: TraceDetail,
}

/// How much of a decision's evaluation its [`Trace`] records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceDetail {
    /// Every candidate: considered (with its load and predicted TTFT), dropped (with the
    /// filter and reason), surviving, and in each tier. What `kinfctl explain` shows.
    #[default]
    Full,
    /// Rules, tiers and picks only: the per-candidate lists (`considered`, `dropped`,
    /// `survivors`, each tier's `candidates`) are left empty. What a gateway that does not
    /// show traces needs; with a thousand endpoints the per-candidate records are most of a
    /// decision's cost. Stages whose applicable filters have no `when:` expression are then
    /// decided by scoring endpoints in place, building only the pick (`decide/scan.rs`), with
    /// the same outcome.
    Summary,
}

impl Decider {
    /// Decides one request, with a [`TraceDetail::Full`] trace.
    pub fn decide(policy: &CompiledPolicy, req: &Request, state: &ClusterState) -> Decision {
        Self::decide_with(policy, req, state, TraceDetail::Full)
    }

    /// Decides one request, recording `detail` in its trace. The outcome does not depend on
    /// `detail`.
    pub fn decide_with(
        policy: &CompiledPolicy,
        req: &Request,
        state: &ClusterState,
        detail: TraceDetail,
    ) -> Decision {
        let Some(pool) = policy.find_pool(req.pool.as_deref()) else {
            let names: Vec<String> = policy
                .pools
                .iter()
                .map(|p| format!("{}/{}", p.namespace, p.name))
                .collect();
            let message = match (req.pool.as_deref(), names.len()) {
                (_, 0) => "no InferencePool is configured, so no model is served; add an \
                           InferencePool to the bundle"
                    .to_string(),
                (Some(p), _) => format!("no pool `{p}` (pools: {})", names.join(", ")),
                (None, n) => format!(
                    "the request names no pool and there are {n} InferencePools ({}): \
                     a GatewayBackend's `pool` chooses one",
                    names.join(", ")
                ),
            };
            return reject_only(404, "unknown_pool", message, String::new());
        };
        let pool_name = format!("{}/{}", pool.namespace, pool.name);
        if !pool.models.contains_key(&req.model) {
            let mut names = pool.model_names();
            names.truncate(20);
            return reject_only(
                404,
                "model_not_found",
                format!(
                    "the model `{}` does not exist in pool `{pool_name}`; available: {}",
                    req.model,
                    names.join(", ")
                ),
                pool_name,
            );
        }
        let ctx = Ctx {
            policy,
            pool,
            req,
            state,
            detail,
        };
        let mut trace = Trace {
            pool: pool_name,
            ..Default::default()
        };
        for rule in &pool.rules {
            let matched =
                rule.matches.is_empty() || rule.matches.iter().any(|m| cond_holds(m, req));
            if !matched {
                trace.rules.push(RuleTrace {
                    policy: rule.policy.clone(),
                    rule: rule.name.clone(),
                    matched: false,
                    stages: None,
                });
                continue;
            }
            let (picked, mut stages) = ctx.run_stages(&rule.consider, Some(rule), &rule.select);
            match picked {
                Some(c) => {
                    stages.result = "route".into();
                    trace.rules.push(RuleTrace {
                        policy: rule.policy.clone(),
                        rule: rule.name.clone(),
                        matched: true,
                        stages: Some(stages),
                    });
                    return routed(&ctx, c, Some(rule), trace);
                }
                None => {
                    stages.result = format!("{:?}", rule.on_empty);
                    let too_long = context_reject(req, &stages);
                    trace.rules.push(RuleTrace {
                        policy: rule.policy.clone(),
                        rule: rule.name.clone(),
                        matched: true,
                        stages: Some(stages),
                    });
                    if rule.on_empty == OnEmpty::Reject {
                        if let Some(r) = too_long {
                            return Decision {
                                outcome: Outcome::Reject(r),
                                policy: Some(rule.policy.clone()),
                                rule: Some(rule.name.clone()),
                                trace,
                            };
                        }
                        return Decision {
                            outcome: Outcome::Reject(Reject {
                                status: 503,
                                code: "policy_rejected",
                                message: match &rule.reject_message {
                                    Some(m) => format!(
                                        "{m} (rejected by rule `{}` of policy `{}`)",
                                        rule.name, rule.policy
                                    ),
                                    None => format!(
                                        "rejected by rule `{}` of policy `{}`: no candidate for model `{}` is left (none ready, dropped by the rule's filters, or of no select tier's type; onEmpty: Reject)",
                                        rule.name, rule.policy, req.model
                                    ),
                                },
                            }),
                            policy: Some(rule.policy.clone()),
                            rule: Some(rule.name.clone()),
                            trace,
                        };
                    }
                }
            }
        }
        // Default route: requested model, Local by PredictedTTFT, then Provider by PredictedTTFT.
        static DEFAULT_TIERS: std::sync::OnceLock<[SelectTier; 2]> = std::sync::OnceLock::new();
        let tiers = DEFAULT_TIERS.get_or_init(|| {
            [
                SelectTier::new(
                    Some(BackendType::Local),
                    Pick::Minimize(Measure::PredictedTtft),
                    |_| None,
                ),
                SelectTier::new(
                    Some(BackendType::Provider),
                    Pick::Minimize(Measure::PredictedTtft),
                    |_| None,
                ),
            ]
        });
        let (picked, mut stages) = ctx.run_stages(&[], None, tiers);
        match picked {
            Some(c) => {
                stages.result = "route".into();
                trace.default = Some(stages);
                routed(&ctx, c, None, trace)
            }
            None => {
                stages.result = "Reject".into();
                let too_long = context_reject(req, &stages);
                trace.default = Some(stages);
                Decision {
                    outcome: Outcome::Reject(too_long.unwrap_or_else(|| Reject {
                        status: 503,
                        code: "no_capacity",
                        message: format!(
                            "no ready endpoint serves model `{}` (no rule decided; default route found no candidate)",
                            req.model
                        ),
                    })),
                    policy: None,
                    rule: None,
                    trace,
                }
            }
        }
    }
}

/// The refusal of a request that no considered destination could take only because it needs
/// more context than their workers have: 400 `context_length_exceeded` (as vLLM itself would
/// answer), instead of a 503 that invites a retry that cannot succeed.
fn context_reject(req: &Request, stages: &StagesTrace) -> Option<Reject> {
    let c = stages.context;
    let need = req.required_context?;
    let largest = c.longest;
    (c.too_short > 0 && c.too_short == c.destinations).then(|| Reject {
            status: 400,
            code: "context_length_exceeded",
            message: format!(
                "the request needs {need} tokens of context (its prompt and max_tokens); the longest context (max_model_len) of the models that could serve `{}` is {largest} tokens",
                req.model
            ),
        })
}

fn reject_only(status: u16, code: &'static str, message: String, pool: String) -> Decision {
    Decision {
        outcome: Outcome::Reject(Reject {
            status,
            code,
            message,
        }),
        policy: None,
        rule: None,
        trace: Trace {
            pool,
            ..Default::default()
        },
    }
}

fn routed(ctx: &Ctx<'_>, c: Candidate<'_>, rule: Option<&CompiledRule>, trace: Trace) -> Decision {
    let rewrite = **c.model != *ctx.req.model;
    let mut headers = vec![
        ("x-kinference-endpoint".to_string(), c.endpoint.to_string()),
        ("x-kinference-model".to_string(), c.model.to_string()),
    ];
    headers.push((
        "x-kinference-rule".to_string(),
        rule.map_or_else(
            || "default".to_string(),
            |r| format!("{}/{}", r.policy, r.name),
        ),
    ));
    Decision {
        outcome: Outcome::Route(Route {
            endpoint: c.endpoint.clone(),
            backend_type: c.backend,
            destination: c.destination.clone(),
            namespace: ctx
                .policy
                .destination(c.dest)
                .map_or_else(|| Arc::from(""), |d| d.namespace.clone()),
            model: c.model.clone(),
            rewrite_model: rewrite,
            predicted_ttft_s: Some(c.ttft.total_s),
            cached_tokens: c.cached_tokens,
            headers,
            prediction: c.prediction,
        }),
        policy: rule.map(|r| r.policy.clone()),
        rule: rule.map(|r| r.name.clone()),
        trace,
    }
}

impl<'a> Ctx<'a> {
    /// Consider, exclude and select; returns the pick and the trace.
    fn run_stages(
        &self,
        consider: &[ConsiderEntry],
        rule: Option<&CompiledRule>,
        tiers: &[SelectTier],
    ) -> (Option<Candidate<'a>>, StagesTrace) {
        if let Some(filters) = scan::filters(self, rule) {
            return self.run_stages_scan(consider, &filters, tiers);
        }
        let mut st = StagesTrace::default();
        let full = self.detail == TraceDetail::Full;
        let mut cands = self.candidates(consider, &mut st);
        // Dropped candidates are marked, not removed: no shifting of the candidate list.
        let mut alive = vec![true; cands.len()];
        if let Some(rule) = rule {
            for f in &rule.exclude {
                if f.condition
                    .as_ref()
                    .is_some_and(|c| !cond_holds(c, self.req))
                {
                    continue;
                }
                for (c, keep) in cands.iter().zip(alive.iter_mut()) {
                    if !*keep {
                        continue;
                    }
                    let load = self.load_of(c, f.window);
                    if let Some(reason) = drop_reason(f, c, load, self.req, self.policy) {
                        if full {
                            st.dropped.push(DropTrace {
                                filter: f.name.clone(),
                                candidate: c.id(),
                                reason,
                            });
                        }
                        *keep = false;
                    }
                }
            }
        }
        charge_capacity(&mut cands, &alive, self.req);
        let survivors: Vec<&Candidate<'a>> = cands
            .iter()
            .zip(&alive)
            .filter(|(_, keep)| **keep)
            .map(|(c, _)| c)
            .collect();
        if full {
            st.survivors = survivors.iter().map(|c| c.id()).collect();
        }
        let mut picked_any: Option<Candidate<'a>> = None;
        for tier in tiers {
            let in_tier: Vec<&Candidate<'a>> = survivors
                .iter()
                .copied()
                .filter(|c| tier.backend.is_none_or(|b| b == c.backend))
                .collect();
            let picked = match &tier.pick {
                Pick::Minimize(m) => min_by(&in_tier, *m),
                Pick::Order(ids) => ids.iter().find_map(|id| {
                    let of_dest: Vec<&Candidate<'a>> =
                        in_tier.iter().copied().filter(|c| c.dest == *id).collect();
                    min_by(&of_dest, Measure::PredictedTtft)
                }),
            };
            st.tiers.push(TierTrace {
                tier: tier.text.clone(),
                candidates: if full {
                    in_tier.iter().map(|c| c.id()).collect()
                } else {
                    Vec::new()
                },
                picked: picked.map(Candidate::id),
            });
            if let Some(p) = picked {
                picked_any = Some(p.clone());
                break;
            }
        }
        if full {
            st.considered = cands.iter().map(Candidate::trace).collect();
        }
        (picked_any, st)
    }

    fn load_of(&self, c: &Candidate<'_>, window: Duration) -> Option<Load> {
        if window == DEFAULT_WINDOW {
            return c.load;
        }
        c.ep.map(|ep| ep.load.average(window, self.state.now_ms))
    }

    /// The considered destinations with the upstream model each serves the request as, in pool
    /// order (`(destination, upstream model, position in the pool)`; the first consider entry
    /// naming a destination wins).
    fn dest_pairs(
        &self,
        consider: &[ConsiderEntry],
    ) -> SmallVec<[(DestId, &'a Arc<str>, usize); 8]> {
        let default_entry = [ConsiderEntry::default()];
        let entries = if consider.is_empty() {
            &default_entry[..]
        } else {
            consider
        };
        let pool: &'a CompiledPool = self.pool;
        let mut pairs: SmallVec<[(DestId, &'a Arc<str>, usize); 8]> = SmallVec::new();
        for e in entries {
            let requested = [self.req.model.clone()];
            let names: &[Arc<str>] = e.models.as_deref().unwrap_or(&requested);
            for name in names {
                let Some(targets) = pool.models.get(name) else {
                    continue;
                };
                for (dest, upstream) in targets {
                    let Some(d) = self.policy.destination(*dest) else {
                        continue;
                    };
                    if e.backend.is_some_and(|b| b != d.backend)
                        || e.destination.is_some_and(|x| x != *dest)
                    {
                        continue;
                    }
                    if !pairs.iter().any(|(x, _, _)| x == dest) {
                        let pos = pool
                            .destinations
                            .iter()
                            .position(|x| x == dest)
                            .unwrap_or(usize::MAX);
                        pairs.push((*dest, upstream, pos));
                    }
                }
            }
        }
        pairs.sort_by_key(|(_, _, pos)| *pos);
        pairs
    }

    /// The worker set behind a Local destination serving `upstream`, or `None` (noted in `st`)
    /// when no endpoint of it is known, or when its workers' context (`max_model_len`) is too
    /// short for the request ([`Request::required_context`]).
    fn worker_set(
        &self,
        d: &'a Destination,
        upstream: &str,
        st: &mut StagesTrace,
    ) -> Option<&'a WorkerSetState> {
        let key: Arc<str> = format!("{}/{}", d.namespace, d.name).into();
        let ws = self.state.worker_sets.get(&key);
        match ws {
            None => st
                .unavailable
                .push(format!("{}: no endpoints known", d.name)),
            // A selector that matches no pod: say so, as for endpoints that are not ready.
            Some(w) if w.endpoints.is_empty() => {
                st.unavailable.push(format!("{}: no endpoints", d.name));
            }
            Some(w) => {
                if let (Some(need), Some(limit)) =
                    (self.req.required_context, w.context_limit(upstream))
                    && u64::from(need) > limit
                {
                    st.unavailable.push(format!(
                        "{}: the request needs {need} tokens of context; `{upstream}` has {limit} (max_model_len)",
                        d.name
                    ));
                    st.context.too_short += 1;
                    st.context.longest = st.context.longest.max(limit);
                    return None;
                }
            }
        }
        ws
    }

    /// The candidate for a Provider destination, or `None` (noted in `st`) when it is not
    /// ready.
    fn provider_candidate(
        &self,
        dest: DestId,
        dest_pos: usize,
        d: &'a Destination,
        upstream: &'a Arc<str>,
        st: &mut StagesTrace,
    ) -> Option<Candidate<'a>> {
        let key: Arc<str> = format!("{}/{}", d.namespace, d.name).into();
        let ps = self.state.providers.get(&key);
        if ps.is_some_and(|p| !p.ready) {
            st.unavailable.push(format!("{}: not ready", d.name));
            return None;
        }
        let prior = d
            .provider
            .as_ref()
            .map_or(1.0, |p| p.expected_ttft.as_secs_f64());
        // An observed average that is not a time (NaN from a 0/0, a negative or infinite
        // value) is no observation: ranked by it, a NaN candidate was never replaced by a
        // faster one once first, and a negative one beat every other.
        let ttft_s = ps
            .and_then(|p| p.ttft_s)
            .filter(|t| t.is_finite() && *t >= 0.0)
            .unwrap_or(prior);
        Some(Candidate {
            dest,
            dest_pos,
            endpoint_pos: 0,
            destination: &d.name,
            endpoint: d.provider.as_ref().map_or(&d.name, |p| &p.url),
            ep: None,
            prefix_tracking: "none",
            backend: BackendType::Provider,
            model: upstream,
            cached_tokens: 0,
            load: None,
            prediction: None,
            model_ttft: None,
            ttft: TtftParts {
                wait_s: 0.0,
                prefill_s: 0.0,
                overhead_s: ttft_s,
                total_s: ttft_s,
                recompute_s: 0.0,
                decode_s: 0.0,
            },
            cost: cost(&d.cost, self.req, 0),
        })
    }

    /// The prompt tokens endpoint `ep` of `ws` caches for the request, or `None` (noted in
    /// `st`) when the endpoint is not a candidate: not ready, or stale while a fresh endpoint of
    /// the set is ready (`any_fresh`).
    fn local_cached_tokens(
        &self,
        d: &Destination,
        ws: &WorkerSetState,
        ep: &EndpointState,
        cached_blocks: &[u32],
        any_fresh: bool,
        st: &mut StagesTrace,
    ) -> Option<u32> {
        if !ep.ready {
            st.unavailable
                .push(format!("{}@{}: not ready", d.name, ep.address));
            return None;
        }
        // Stale endpoints (metrics not scraped lately: load unknown) are used only when no
        // fresh endpoint of the set is ready.
        if ep.stale && any_fresh {
            st.unavailable.push(format!(
                "{}@{}: stale metrics (a fresh endpoint of the set is ready)",
                d.name, ep.address
            ));
            return None;
        }
        Some(
            ep.assumed_cached_tokens
                .unwrap_or_else(|| {
                    cached_blocks
                        .get(ep.index_id.0 as usize)
                        .copied()
                        .unwrap_or(0)
                        * ws.block_size as u32
                })
                .min(self.req.prompt_tokens),
        )
    }

    /// The candidate for endpoint `i` of a Local destination's worker set, which caches
    /// `cached` tokens of the prompt. Its capacity costs are set later ([`charge_capacity`]).
    #[allow(clippy::too_many_arguments)] // the parts of one candidate, all needed
    fn local_candidate(
        &self,
        (dest, upstream, dest_pos): (DestId, &'a Arc<str>, usize),
        d: &'a Destination,
        ws: &'a WorkerSetState,
        i: usize,
        ep: &'a EndpointState,
        cached: u32,
    ) -> Candidate<'a> {
        let load = ep.load.average(DEFAULT_WINDOW, self.state.now_ms);
        let (prediction, ttft) = predict(ws, ep, self.req.prompt_tokens - cached);
        Candidate {
            dest,
            dest_pos,
            endpoint_pos: i,
            destination: &d.name,
            endpoint: &ep.address,
            ep: Some(ep),
            prefix_tracking: if ep.assumed_cached_tokens.is_some() {
                "assumed"
            } else {
                ws.prefix.mode()
            },
            backend: BackendType::Local,
            model: upstream,
            cached_tokens: cached,
            load: Some(load),
            prediction: Some(prediction),
            model_ttft: Some(&ws.ttft),
            ttft,
            cost: cost(&d.cost, self.req, cached),
        }
    }

    /// Builds the candidate set: union of the consider entries, in pool order.
    fn candidates(&self, consider: &[ConsiderEntry], st: &mut StagesTrace) -> Vec<Candidate<'a>> {
        let pairs = self.dest_pairs(consider);
        st.context.destinations = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        let capacity: usize = pairs
            .iter()
            .filter_map(|(d, _, _)| self.policy.destination(*d))
            .map(|d| {
                self.state
                    .worker_set(&d.namespace, &d.name)
                    .map_or(1, |w| w.endpoints.len())
            })
            .sum();
        let mut out = Vec::with_capacity(capacity);
        for pair in pairs {
            let (dest, upstream, dest_pos) = pair;
            let Some(d) = self.policy.destination(dest) else {
                continue;
            };
            match d.backend {
                BackendType::Local => {
                    let Some(ws) = self.worker_set(d, upstream, st) else {
                        continue;
                    };
                    let cached_blocks = self.prefix_matches(ws);
                    let any_fresh = ws.endpoints.iter().any(|e| e.ready && !e.stale);
                    for (i, ep) in ws.endpoints.iter().enumerate() {
                        if let Some(cached) =
                            self.local_cached_tokens(d, ws, ep, &cached_blocks, any_fresh, st)
                        {
                            out.push(self.local_candidate(pair, d, ws, i, ep, cached));
                        }
                    }
                }
                BackendType::Provider => {
                    if let Some(c) = self.provider_candidate(dest, dest_pos, d, upstream, st) {
                        out.push(c);
                    }
                }
            }
        }
        out.sort_by_key(|c| (c.dest_pos, c.endpoint_pos));
        out
    }

    /// Cached blocks of the request per endpoint id (dense; empty without token ids or
    /// matching block hashes).
    fn prefix_matches(&self, ws: &WorkerSetState) -> Vec<u32> {
        let mut dense = vec![0u32; ws.endpoints.len()];
        let hashes = self.req.prompt_hashes(ws.block_size);
        let hashes: &[u64] = &hashes;
        if !hashes.is_empty() {
            let mut found: Vec<(EndpointId, u32)> = Vec::with_capacity(ws.endpoints.len());
            ws.prefix
                .match_prefix(hashes, self.state.now_ms, &mut found);
            let mut put = |found: &[(EndpointId, u32)]| {
                for &(id, blocks) in found {
                    let i = id.0 as usize;
                    if dense.len() <= i {
                        dense.resize(i + 1, 0);
                    }
                    if let Some(slot) = dense.get_mut(i) {
                        *slot = (*slot).max(blocks);
                    }
                }
            };
            put(&found);
            // Exact tracking: prompts routed lately whose blocks no KV event has reported yet
            // continue the reported prefixes.
            if matches!(ws.prefix, crate::state::PrefixTracking::Exact(_)) {
                ws.routed
                    .extend_matches(hashes, self.state.now_ms, &mut dense);
            }
        }
        dense
    }
}

/// Sets each local candidate's capacity costs, what the choice costs the requests already in
/// flight on it: the recompute cost ([`TtftParts::recompute_s`]), for the prompt tokens it
/// would prefill beyond the fewest any surviving local candidate would (tokens that another
/// candidate caches; [`TtftModel::recompute_cost`]), and the decode cost
/// ([`TtftParts::decode_s`]), for the request's `max_tokens` decode steps
/// ([`TtftModel::decode_cost`]). Dropped candidates are charged against the survivors too, for
/// the trace.
fn charge_capacity(cands: &mut [Candidate<'_>], alive: &[bool], req: &Request) {
    let fewest = cands
        .iter()
        .zip(alive)
        .filter(|(c, keep)| **keep && c.backend == BackendType::Local)
        .filter_map(|(c, _)| c.prediction.map(|p| p.uncached_tokens))
        .min();
    let Some(fewest) = fewest else {
        return;
    };
    for c in cands.iter_mut() {
        charge(c, fewest, req);
    }
}

/// Sets one local candidate's capacity costs, `fewest` being the fewest prompt tokens any
/// surviving local candidate would prefill (see [`charge_capacity`]).
fn charge(c: &mut Candidate<'_>, fewest: u32, req: &Request) {
    if let (Some(p), Some(m)) = (c.prediction, c.model_ttft) {
        let extra = p.uncached_tokens.saturating_sub(fewest);
        c.ttft.recompute_s = m.recompute_cost(f64::from(extra), p.queued, p.running);
        c.ttft.decode_s = m.decode_cost(req.decode_tokens(), p.queued, p.running);
    }
}

fn cost(c: &kinf_lang::compiled::CostInfo, req: &Request, cached: u32) -> f64 {
    let uncached = f64::from(req.prompt_tokens.saturating_sub(cached));
    (uncached * c.uncached_prompt
        + f64::from(cached) * c.cached_prompt
        + req.decode_tokens() * c.output)
        / 1e6
}

/// The first candidate with the lowest measure.
fn min_by<'c, 's>(cands: &[&'c Candidate<'s>], m: Measure) -> Option<&'c Candidate<'s>> {
    let mut best: Option<&'c Candidate<'s>> = None;
    for c in cands {
        let v = c.measure(m);
        if best.is_none_or(|b| lower(v, b.measure(m))) {
            best = Some(c);
        }
    }
    best
}

/// Whether a candidate measuring `v` replaces the best so far, measuring `best`: when `v` is
/// strictly lower, or `best` is NaN and `v` is not (NaN ranks last; with `<` alone, a NaN
/// first candidate was never replaced). Both decision paths rank with it.
#[inline]
fn lower(v: f64, best: f64) -> bool {
    v < best || (best.is_nan() && !v.is_nan())
}

/// Whether a request condition holds.
pub fn cond_holds(c: &RequestCond, req: &Request) -> bool {
    c.model.as_ref().is_none_or(|m| m.matches(&req.model))
        && c.tag.as_ref().is_none_or(|t| req.has_tag(t))
        && c.tenant
            .as_ref()
            .is_none_or(|t| req.tenant.as_deref() == Some(&**t))
        && c.qos.is_none_or(|q| q == req.qos)
        && c.prompt_tokens
            .is_none_or(|r| r.contains(f64::from(req.prompt_tokens)))
        && c.header
            .as_ref()
            .is_none_or(|(n, v)| req.header(n) == Some(&**v))
        && c.when
            .as_ref()
            .is_none_or(|w| w.eval_bool(&ReqEval { req, cand: None }))
}

/// Whether a drop condition, apart from its `when:` expression, holds for a candidate of
/// `backend` and destination `dest` with `load` (over the filter's window) and `predicted_ttft`
/// seconds. [`drop_reason`] and the summary fast path both decide with it.
fn drop_holds(
    d: &DropCond,
    backend: BackendType,
    dest: DestId,
    load: Option<Load>,
    predicted_ttft: f64,
) -> bool {
    let within = |r: &Option<Range>, v: Option<f64>| match r {
        None => true,
        Some(r) => v.is_some_and(|v| r.contains(v)),
    };
    d.backend.is_none_or(|b| b == backend)
        && d.destination.is_none_or(|x| x == dest)
        && within(&d.queued_prompts, load.map(|l| l.queued_prompts))
        && within(&d.running_prompts, load.map(|l| l.running_prompts))
        && within(&d.kv_cache_usage, load.map(|l| l.kv_cache_usage))
        && within(&d.predicted_ttft, Some(predicted_ttft))
}

/// The reason filter `f`'s drop condition holds for a candidate, or `None` when it does not.
/// Values are kept, not formatted: the text is built only when the trace is displayed or
/// serialized.
fn drop_reason(
    f: &ExcludeFilter,
    c: &Candidate<'_>,
    load: Option<Load>,
    req: &Request,
    policy: &CompiledPolicy,
) -> Option<DropReason> {
    let d = &f.drop;
    if !drop_holds(d, c.backend, c.dest, load, c.ttft.total_s) {
        return None;
    }
    if let Some(w) = &d.when {
        let cand = CandEval { c, load };
        if !w.eval_bool(&ReqEval {
            req,
            cand: Some(&cand),
        }) {
            return None;
        }
    }
    // Every condition held: each measure given had a value in its range.
    let mut why = DropReason {
        backend: d.backend,
        destination: d
            .destination
            .and_then(|x| policy.destination(x).map(|d| d.name.clone())),
        when: d.when_text.clone(),
        window: d.reads_load().then_some(f.window),
        ..DropReason::default()
    };
    let ratio = if d.kv_cache_usage_percent {
        MeasureUnit::Percent
    } else {
        MeasureUnit::Ratio
    };
    for (name, range, value, unit) in [
        (
            "queuedPrompts",
            d.queued_prompts,
            load.map(|l| l.queued_prompts),
            MeasureUnit::Prompts,
        ),
        (
            "runningPrompts",
            d.running_prompts,
            load.map(|l| l.running_prompts),
            MeasureUnit::Prompts,
        ),
        (
            "kvCacheUsage",
            d.kv_cache_usage,
            load.map(|l| l.kv_cache_usage),
            ratio,
        ),
        (
            "predictedTTFT",
            d.predicted_ttft,
            Some(c.ttft.total_s),
            MeasureUnit::Seconds,
        ),
    ] {
        if let (Some(range), Some(value)) = (range, value) {
            why.measures.push(DropMeasure {
                name,
                value,
                range,
                unit,
            });
        }
    }
    Some(why)
}

struct CandEval<'a> {
    c: &'a Candidate<'a>,
    load: Option<Load>,
}

struct ReqEval<'a> {
    req: &'a Request,
    cand: Option<&'a CandEval<'a>>,
}

impl EvalContext for ReqEval<'_> {
    fn var(&self, index: usize) -> Value<'_> {
        let r = self.req;
        match index {
            env::VAR_PROMPT_TOKENS => Value::Int(i64::from(r.prompt_tokens)),
            env::VAR_MAX_TOKENS => Value::Int(i64::from(r.max_tokens)),
            env::VAR_TENANT => Value::Str(r.tenant.as_deref().unwrap_or("").into()),
            env::VAR_MODEL => Value::Str((&*r.model).into()),
            env::VAR_QOS => Value::Str(r.qos.as_str().into()),
            env::VAR_STREAM => Value::Bool(r.stream),
            env::VAR_MESSAGES => Value::Int(i64::from(r.messages)),
            _ => match self.cand {
                None => Value::Bool(false),
                Some(ce) => {
                    let c = ce.c;
                    let l = ce.load.unwrap_or_default();
                    match index {
                        env::VAR_QUEUED => Value::Float(l.queued_prompts),
                        env::VAR_RUNNING => Value::Float(l.running_prompts),
                        env::VAR_KV_USAGE => Value::Float(l.kv_cache_usage),
                        env::VAR_PREDICTED_TTFT => Value::Duration(c.ttft.total_s),
                        env::VAR_BACKEND => Value::Str(c.backend.as_str().into()),
                        env::VAR_DESTINATION => Value::Str((&**c.destination).into()),
                        env::VAR_SERVED_MODEL => Value::Str((&**c.model).into()),
                        env::VAR_CACHED_TOKENS => Value::Int(i64::from(c.cached_tokens)),
                        _ => Value::Bool(false),
                    }
                }
            },
        }
    }

    fn call(&self, index: usize, args: &[Value<'_>]) -> Value<'_> {
        let arg = match args.first() {
            Some(Value::Str(s)) => s.as_ref(),
            _ => return Value::Bool(false),
        };
        match index {
            env::FN_TAG => Value::Bool(self.req.has_tag(arg)),
            env::FN_HEADER => Value::Str(
                self.req
                    .header(&arg.to_ascii_lowercase())
                    .unwrap_or("")
                    .to_string()
                    .into(),
            ),
            env::FN_HAS_HEADER => Value::Bool(self.req.header(&arg.to_ascii_lowercase()).is_some()),
            _ => Value::Bool(false),
        }
    }
}
