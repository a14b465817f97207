//! The summary fast path of the consider, exclude and select stages: the pick is found by
//! scoring each endpoint in place, without building a [`Candidate`] for it; only the pick is
//! built. It serves every summary decision whose applicable filters have no `when:` expression
//! (those need a candidate to evaluate against).
//!
//! It decides exactly what [`Ctx::run_stages`]'s general path decides, with the same summary
//! trace: the same inputs go through the same functions in the same order (so the scores are
//! bit-identical), candidates are visited in the general path's order (pool position, then
//! endpoint position), and a later candidate replaces a best only when its measure is strictly
//! lower, as `min_by` does. `tests/decide_scan_props.rs` checks the equality on random fleets.
//!
//! With a thousand endpoints a candidate's record, its trace entries and the intermediate
//! lists were most of a decision's cost.
//!
//! When every tier ranks by PredictedTTFT, a worker set whose load floor is usable
//! ([`crate::load_floor`]) has only its endpoints that hold part of the prompt scored; the
//! others are bounded by the floor's rank, an endpoint that holds nothing with the smallest of
//! every prediction input. The pick stands when it ranks strictly below every such bound; else
//! the scan is repeated over every endpoint, so that ties are broken by order as above.

use kinf_lang::compiled::{CompiledRule, ConsiderEntry, DestId, ExcludeFilter, Pick, SelectTier};
use kinf_policy::{BackendType, Measure};
use smallvec::SmallVec;

use super::{Candidate, Ctx, TraceDetail, charge, cond_holds, cost, drop_holds, lower, predict};
use crate::decision::{StagesTrace, TierTrace};
use crate::load_floor::{FloorInputs, Usable};
use crate::state::WorkerSetState;

/// Where a scored candidate is: endpoint `endpoint` of the `slot`-th scanned Local destination,
/// or the `slot`-th scanned Provider candidate.
#[derive(Clone, Copy)]
enum At {
    Local { slot: usize, endpoint: usize },
    Provider { slot: usize },
}

/// A considered destination, in candidate order: the `n`-th scanned Local destination or
/// Provider candidate.
#[derive(Clone, Copy)]
enum Scanned {
    Local(usize),
    Provider(usize),
}

/// A Local endpoint's inputs to its measures, from pass 1.
#[derive(Clone, Copy)]
struct Scored {
    /// Prompt tokens it would prefill.
    uncached: u32,
    /// The prediction's queued and running requests.
    queued: f64,
    running: f64,
    /// The predicted TTFT (before capacity costs).
    total_s: f64,
}

/// The best candidate so far of one scope: its measure and where it is.
#[derive(Clone, Copy)]
struct Best {
    value: f64,
    at: At,
}

/// `min_by`'s rule: the first candidate with the lowest measure (NaN ranks last).
fn offer(best: &mut Option<Best>, value: f64, at: At) {
    if best.is_none_or(|b| lower(value, b.value)) {
        *best = Some(Best { value, at });
    }
}

/// The exclude filters that apply to the request, when the fast path decides this stage: a
/// summary trace, and no applicable filter with a `when:` expression. `None`: the general path
/// decides.
pub(super) fn filters<'r>(ctx: &Ctx<'_>, rule: Option<&'r CompiledRule>) -> Option<Filters<'r>> {
    if ctx.detail != TraceDetail::Summary {
        return None;
    }
    let active: Filters<'r> = rule
        .map(|r| {
            r.exclude
                .iter()
                .filter(|f| f.condition.as_ref().is_none_or(|c| cond_holds(c, ctx.req)))
                .collect()
        })
        .unwrap_or_default();
    active
        .iter()
        .all(|f| f.drop.when.is_none())
        .then_some(active)
}

/// The exclude filters that apply to a request.
pub(super) type Filters<'r> = SmallVec<[&'r ExcludeFilter; 4]>;

/// One select tier's running result.
enum TierBest {
    /// `minimize`: the best candidate of the tier's backend by the measure.
    Minimize(Measure, Option<Best>),
    /// `order`: picked later from the per-destination bests.
    Order,
}

impl<'a> Ctx<'a> {
    /// The stages on the fast path (see the module docs), with the applicable `filters` that
    /// [`filters`] returned.
    pub(super) fn run_stages_scan(
        &self,
        consider: &[ConsiderEntry],
        filters: &[&ExcludeFilter],
        tiers: &[SelectTier],
    ) -> (Option<Candidate<'a>>, StagesTrace) {
        // Bounding the endpoints that hold none of the prompt by their load floor needs every
        // tier to rank by PredictedTTFT, the measure the floor bounds.
        let bounded = !tiers.is_empty()
            && tiers
                .iter()
                .all(|t| matches!(t.pick, Pick::Minimize(Measure::PredictedTtft)));
        if bounded && let Some(decided) = self.scan_once(consider, filters, tiers, true) {
            return decided;
        }
        self.scan_once(consider, filters, tiers, false)
            .unwrap_or_default()
    }

    /// One scan. With `bounded`, a Local destination whose load floor is usable scores only
    /// the endpoints that hold part of the prompt; `None` when a skipped endpoint could have
    /// ranked as well as the pick (the caller then scans every endpoint). Without it, never
    /// `None`.
    fn scan_once(
        &self,
        consider: &[ConsiderEntry],
        filters: &[&ExcludeFilter],
        tiers: &[SelectTier],
        bounded: bool,
    ) -> Option<(Option<Candidate<'a>>, StagesTrace)> {
        let mut st = StagesTrace::default();
        let pairs = self.dest_pairs(consider);
        st.context.destinations = u32::try_from(pairs.len()).unwrap_or(u32::MAX);
        let now = self.state.now_ms;
        // Pass 1, in candidate order: the surviving Local candidates (position and the prompt
        // tokens each would prefill), the surviving Provider candidates, and the fewest tokens
        // any surviving Local candidate would prefill.
        let mut locals = Vec::new();
        let mut providers = Vec::new();
        let mut order: SmallVec<[Scanned; 8]> = SmallVec::new();
        let mut fewest: Option<u32> = None;
        // Bounded destinations with endpoints not scored: their worker set and load floor.
        let mut skipped: SmallVec<[(&WorkerSetState, FloorInputs); 2]> = SmallVec::new();
        for &pair in &pairs {
            let (dest, upstream, dest_pos) = pair;
            let Some(d) = self.policy.destination(dest) else {
                continue;
            };
            match d.backend {
                BackendType::Local => {
                    let Some(ws) = self.worker_set(d, upstream, &mut st) else {
                        continue;
                    };
                    let cached_blocks = self.prefix_matches(ws);
                    // The positions to score: every endpoint, or, bounded by the load floor,
                    // those that hold part of the prompt (and the unavailable ones, which are
                    // reported as such, in position order: holders report nothing).
                    let floor = match (bounded, ws.floor.usable(&ws.endpoints)) {
                        (true, Usable::Yes { floor, unavailable }) => {
                            // The floor must be current; it is kept so by the state's methods.
                            debug_assert!(ws.floor.agrees_with(&ws.endpoints), "stale load floor");
                            for &i in unavailable {
                                if let Some(ep) = ws.endpoints.get(i) {
                                    let _ = self.local_cached_tokens(
                                        d,
                                        ws,
                                        ep,
                                        &cached_blocks,
                                        true,
                                        &mut st,
                                    );
                                }
                            }
                            Some((floor, unavailable))
                        }
                        _ => None,
                    };
                    let any_fresh =
                        floor.is_some() || ws.endpoints.iter().any(|e| e.ready && !e.stale);
                    // Bounded: the holders' positions; else every position, 0..n.
                    let holders: Option<SmallVec<[usize; 8]>> = floor.map(|(_, unavailable)| {
                        cached_blocks
                            .iter()
                            .enumerate()
                            .filter(|&(i, &b)| b > 0 && !unavailable.contains(&i))
                            .map(|(i, _)| i)
                            .collect()
                    });
                    let all = if holders.is_none() {
                        ws.endpoints.len()
                    } else {
                        0
                    };
                    let mut scored = Vec::with_capacity(holders.as_ref().map_or(all, |h| h.len()));
                    for i in holders.iter().flatten().copied().chain(0..all) {
                        let Some(ep) = ws.endpoints.get(i) else {
                            continue;
                        };
                        let Some(cached) =
                            self.local_cached_tokens(d, ws, ep, &cached_blocks, any_fresh, &mut st)
                        else {
                            continue;
                        };
                        let (p, ttft) = predict(ws, ep, self.req.prompt_tokens - cached);
                        // The window's average, as `load_of` gives the general path (the
                        // default window's is kept precomputed by `LoadWindow`).
                        let dropped = filters.iter().any(|f| {
                            drop_holds(
                                &f.drop,
                                BackendType::Local,
                                dest,
                                Some(ep.load.average(f.window, now)),
                                ttft.total_s,
                            )
                        });
                        if dropped {
                            continue;
                        }
                        let u = p.uncached_tokens;
                        fewest = Some(fewest.map_or(u, |f| f.min(u)));
                        scored.push((
                            i,
                            Scored {
                                uncached: u,
                                queued: p.queued,
                                running: p.running,
                                total_s: ttft.total_s,
                            },
                        ));
                    }
                    if let Some((floor, _)) = floor
                        && !floor.is_none()
                    {
                        skipped.push((ws, floor));
                    }
                    order.push(Scanned::Local(locals.len()));
                    locals.push((pair, d, ws, scored));
                }
                BackendType::Provider => {
                    let Some(c) = self.provider_candidate(dest, dest_pos, d, upstream, &mut st)
                    else {
                        continue;
                    };
                    let dropped = filters
                        .iter()
                        .any(|f| drop_holds(&f.drop, c.backend, c.dest, None, c.ttft.total_s));
                    if !dropped {
                        order.push(Scanned::Provider(providers.len()));
                        providers.push(c);
                    }
                }
            }
        }

        // Pass 2: each survivor's measures, as `charge_capacity` and `Candidate::measure`
        // compute them, offered to every tier of its backend.
        let mut bests: SmallVec<[TierBest; 4]> = tiers
            .iter()
            .map(|t| match &t.pick {
                Pick::Minimize(m) => TierBest::Minimize(*m, None),
                Pick::Order(_) => TierBest::Order,
            })
            .collect();
        let any_order = bests.iter().any(|b| matches!(b, TierBest::Order));
        // `order` tiers pick by PredictedTTFT within one destination.
        let mut per_dest: SmallVec<[(DestId, Option<Best>); 8]> = SmallVec::new();
        let decode_tokens = self.req.decode_tokens();
        let mut offer_all =
            |backend: BackendType, dest: DestId, at: At, measure: &dyn Fn(Measure) -> f64| {
                for (t, b) in tiers.iter().zip(bests.iter_mut()) {
                    if let TierBest::Minimize(m, best) = b
                        && t.backend.is_none_or(|x| x == backend)
                    {
                        offer(best, measure(*m), at);
                    }
                }
                if any_order {
                    let rank = measure(Measure::PredictedTtft);
                    match per_dest.iter_mut().find(|(d, _)| *d == dest) {
                        Some((_, best)) => offer(best, rank, at),
                        None => per_dest.push((dest, Some(Best { value: rank, at }))),
                    }
                }
            };
        for scanned in order {
            match scanned {
                Scanned::Local(slot) => {
                    let Some(((dest, _, _), d, ws, scored)) = locals.get(slot) else {
                        continue;
                    };
                    let m = &ws.ttft;
                    for &(i, ref sc) in scored {
                        let Some(ep) = ws.endpoints.get(i) else {
                            continue;
                        };
                        let u = sc.uncached;
                        let extra = u.saturating_sub(fewest.unwrap_or(u));
                        let recompute_s = m.recompute_cost(f64::from(extra), sc.queued, sc.running);
                        let decode_s = m.decode_cost(decode_tokens, sc.queued, sc.running);
                        let rank = sc.total_s + recompute_s + decode_s;
                        let load = || ep.load.average(super::DEFAULT_WINDOW, now);
                        let measure = |m: Measure| -> f64 {
                            match m {
                                Measure::PredictedTtft => rank,
                                Measure::QueuedPrompts => load().queued_prompts,
                                Measure::RunningPrompts => load().running_prompts,
                                Measure::KvCacheUsage => load().kv_cache_usage,
                                Measure::Cost => {
                                    cost(&d.cost, self.req, self.req.prompt_tokens - u)
                                }
                            }
                        };
                        offer_all(
                            BackendType::Local,
                            *dest,
                            At::Local { slot, endpoint: i },
                            &measure,
                        );
                    }
                }
                Scanned::Provider(slot) => {
                    if let Some(c) = providers.get(slot) {
                        offer_all(c.backend, c.dest, At::Provider { slot }, &|m| c.measure(m));
                    }
                }
            }
        }

        // The pick, built as the general path builds it.
        let build = |at: At| -> Option<Candidate<'a>> {
            match at {
                At::Local { slot, endpoint } => {
                    let (pair, d, ws, scored) = locals.get(slot)?;
                    let ep = ws.endpoints.get(endpoint)?;
                    let u = scored.iter().find(|(i, _)| *i == endpoint)?.1.uncached;
                    let mut c = self.local_candidate(
                        *pair,
                        d,
                        ws,
                        endpoint,
                        ep,
                        self.req.prompt_tokens - u,
                    );
                    charge(&mut c, fewest.unwrap_or(u), self.req);
                    Some(c)
                }
                At::Provider { slot } => providers.get(slot).cloned(),
            }
        };
        if !skipped.is_empty() && !self.skipped_rank_higher(&skipped, tiers, &bests, fewest) {
            return None;
        }
        let mut picked_any = None;
        for (tier, best) in tiers.iter().zip(&bests) {
            let best = match (best, &tier.pick) {
                (TierBest::Minimize(_, b), _) => *b,
                (TierBest::Order, Pick::Order(ids)) => ids.iter().find_map(|id| {
                    let backend = self.policy.destination(*id).map(|d| d.backend);
                    if tier.backend.is_some_and(|b| Some(b) != backend) {
                        return None;
                    }
                    per_dest.iter().find(|(d, _)| d == id).and_then(|(_, b)| *b)
                }),
                (TierBest::Order, Pick::Minimize(_)) => None, // built from the same tiers
            };
            let picked = best.and_then(|b| build(b.at));
            st.tiers.push(TierTrace {
                tier: tier.text.clone(),
                candidates: Vec::new(),
                picked: picked.as_ref().map(Candidate::id),
            });
            if picked.is_some() {
                picked_any = picked;
                break;
            }
        }
        Some((picked_any, st))
    }

    /// Whether every endpoint a bounded scan skipped ranks strictly higher than the pick: for
    /// each tier up to the one that picks, which may take a Local candidate, its best must be
    /// strictly below the rank of each skipped set's floor, an endpoint that holds none of the
    /// prompt with the smallest of every prediction input (see [`crate::load_floor`]). Ties and
    /// tiers without a best fall back to scoring every endpoint, so that the order decides
    /// exactly as an unbounded scan does.
    fn skipped_rank_higher(
        &self,
        skipped: &[(&WorkerSetState, FloorInputs)],
        tiers: &[SelectTier],
        bests: &[TierBest],
        fewest: Option<u32>,
    ) -> bool {
        // A cold endpoint is charged the recompute of what the survivor with the fewest
        // uncached tokens holds; without a surviving holder, the cold ones set that minimum.
        let Some(fewest) = fewest else {
            return false;
        };
        let prompt = self.req.prompt_tokens;
        let decode_tokens = self.req.decode_tokens();
        let floor_rank = |ws: &WorkerSetState, f: &FloorInputs| -> f64 {
            let ttft = ws.ttft.predict_behind(
                f64::from(prompt),
                f.pending_prefill_tokens as f64,
                f.queued,
                f.running,
            );
            let extra = prompt.saturating_sub(fewest);
            let recompute_s = ws
                .ttft
                .recompute_cost(f64::from(extra), f.queued, f.running);
            let decode_s = ws.ttft.decode_cost(decode_tokens, f.queued, f.running);
            ttft.total_s + recompute_s + decode_s
        };
        for (tier, best) in tiers.iter().zip(bests) {
            let best = match best {
                TierBest::Minimize(_, b) => *b,
                TierBest::Order => return false,
            };
            if tier.backend.is_none_or(|b| b == BackendType::Local) {
                let Some(best) = best else {
                    return false;
                };
                if !skipped.iter().all(|(ws, f)| best.value < floor_rank(ws, f)) {
                    return false;
                }
            }
            if best.is_some() {
                return true;
            }
        }
        true
    }
}
