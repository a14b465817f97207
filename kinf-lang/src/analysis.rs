//! Whole-pool analyses that need the ordered rules: shadowed rules, select tiers that can never
//! have a candidate, rules whose candidate set is always empty.

use std::sync::Arc;

use ahash::AHashSet;
use kinf_policy::{BackendType, Measure, OnEmpty};
use smallvec::SmallVec;

use crate::check::Checker;
use crate::codes::Code;
use crate::compiled::{
    CompiledPolicy, CompiledRule, DestId, ExcludeFilter, ModelPattern, Pick, RequestCond,
};
use crate::dag::RuleDag;
use crate::diagnostic::Diagnostic;
use crate::path::FieldPath;

pub(crate) fn check_pool_rules(
    ck: &mut Checker<'_>,
    out: &CompiledPolicy,
    pi: usize,
    rules: &[(Arc<CompiledRule>, usize, FieldPath)],
) {
    let Some(pool) = out.pools.get(pi) else {
        return;
    };
    // The DAG over the rules as they will be evaluated.
    let view = crate::compiled::CompiledPool {
        namespace: pool.namespace.clone(),
        name: pool.name.clone(),
        destinations: pool.destinations.clone(),
        models: pool.models.clone(),
        rules: rules.iter().map(|(r, _, _)| r.clone()).collect(),
        limits: Vec::new(),
        source: pool.source.clone(),
    };
    let dag = RuleDag::build(&view);
    debug_assert!(dag.is_acyclic());
    // Rules with errors were lowered partially: neither warn about them nor because of them.
    let sound = |doc: usize, path: &FieldPath| {
        ck.broken_rules.is_empty() || !ck.broken_rules.contains(&(doc, path.clone()))
    };
    let sound_rules: Vec<bool> = rules.iter().map(|(_, d, p)| sound(*d, p)).collect();
    let reachable = dag.reachable_rules();
    // Lowering lists each destination of a pool once; then candidate sets need no dedup.
    let dests_unique = {
        let mut seen = AHashSet::new();
        pool.destinations.iter().all(|id| seen.insert(*id))
    };
    let mut wild: Vec<usize> = Vec::new();
    let mut by_model: ahash::AHashMap<Arc<str>, Vec<usize>> = ahash::AHashMap::new();
    for (j, (rule, doc, path)) in rules.iter().enumerate() {
        if !sound_rules[j] {
            continue;
        }
        let bundle = ck.bundle;
        let span = || bundle.value_span(*doc, &path.key("name"));
        // Shadowed: unreachable in the DAG (after a catch-all), or every match entry covered by
        // an earlier rule that rejects when empty.
        let shadow = if never_matches(rule) {
            // KINF0412 says why it never applies.
            None
        } else if !reachable.get(j).copied().unwrap_or(true) {
            rules[..j]
                .iter()
                .zip(&sound_rules[..j])
                .filter(|(_, ok)| **ok)
                .map(|(r, _)| r)
                .rev()
                .find(|(r, _, _)| {
                    r.on_empty == OnEmpty::Reject
                        && (r.matches.is_empty()
                            || r.matches.iter().any(RequestCond::is_unconditional))
                })
        } else {
            // Only earlier rules that can cover this rule's first entry need a full check:
            // those with an entry for any model, and those naming the same exact model.
            let mut cands: Vec<usize> = wild.clone();
            if let Some(Some(ModelPattern::Exact(m))) = rule.matches.first().map(|e| &e.model)
                && let Some(v) = by_model.get(m)
            {
                cands.extend(v.iter().copied());
            }
            cands.sort_unstable();
            cands.dedup();
            cands
                .into_iter()
                .filter_map(|i| rules.get(i))
                .find(|(r, _, _)| covers_rule(r, rule))
        };
        if sound_rules[j] && rule.on_empty == OnEmpty::Reject {
            let any_model = rule.matches.is_empty()
                || rule
                    .matches
                    .iter()
                    .any(|e| !matches!(e.model, Some(ModelPattern::Exact(_))));
            if any_model {
                wild.push(j);
            }
            for e in &rule.matches {
                if let Some(ModelPattern::Exact(m)) = &e.model {
                    let v = by_model.entry(m.clone()).or_default();
                    if v.last() != Some(&j) {
                        v.push(j);
                    }
                }
            }
        }
        if let Some((earlier, edoc, epath)) = shadow {
            let mut d = Diagnostic::new(Code::ShadowedRule,
                format!("rule `{}` can never apply in pool `{}`: rule `{}` (policy `{}`) matches every request it matches and is evaluated first",
                    rule.name, pool.name, earlier.name, earlier.policy))
                .with_path(path.key("name"))
                .with_help(format!("move `{}` before `{}`, narrow `{}`'s matches, or set `onEmpty: NextRule` on `{}`", rule.name, earlier.name, earlier.name, earlier.name));
            if let Some(s) = span() {
                d = d.at(s, "never applies");
            }
            if let Some(s) = ck.bundle.value_span(*edoc, &epath.key("name")) {
                d = d.with_related(s, "shadowed by this rule");
            }
            ck.push(d);
        }
        // Candidate analysis.
        let Possible {
            set: possible,
            dropping,
        } = possible_destinations(out, pi, rule, dests_unique);
        // A filter whose `drop` is only an always true `when` drops every candidate, which
        // KINF0412 reports at that `when`, with what it does to the rule: not repeated here.
        let drops_all = |f: &ExcludeFilter| {
            f.condition
                .as_ref()
                .is_none_or(RequestCond::is_unconditional)
                && f.drop.backend.is_none()
                && f.drop.destination.is_none()
                && f.drop.queued_prompts.is_none()
                && f.drop.running_prompts.is_none()
                && f.drop.kv_cache_usage.is_none()
                && f.drop.predicted_ttft.is_none()
                && f.drop.when.is_some()
                && f.drop.effective_when().is_none()
        };
        if possible.is_empty() && !dropping.is_empty() && rule.exclude.iter().any(drops_all) {
            continue;
        }
        if possible.is_empty() {
            let mut d = if dropping.is_empty() {
                Diagnostic::new(Code::EmptyCandidates,
                    format!("rule `{}` never has a candidate in pool `{}`: the models it matches, its consider and its unconditional excludes leave no destination", rule.name, pool.name))
                    .with_help(format!("check the matched models and `consider` (models, type, destination) against the pool's destinations: {}", pool_destinations(out, pool)))
            } else {
                let names: Vec<String> = dropping
                    .iter()
                    .filter_map(|(k, _)| rule.exclude.get(*k))
                    .map(|f| format!("`{}`", f.name))
                    .collect();
                let (filters, drop, them) = if names.len() == 1 {
                    ("exclude filter", "drops", "the filter an `if:` or a load condition so that it applies")
                } else {
                    ("exclude filters", "drop", "the filters an `if:` or a load condition so that they apply")
                };
                Diagnostic::new(Code::EmptyCandidates,
                    format!("rule `{}` never has a candidate in pool `{}`: {filters} {} {drop} every destination the rule considers, whatever the request and the load", rule.name, pool.name, names.join(", ")))
                    .with_help(format!("with every candidate dropped the rule rejects each request it matches (with `onEmpty: NextRule`, passes it on): give {them} only sometimes, or remove {}", if names.len() == 1 { "it" } else { "them" }))
            }
            .with_path(path.key("route"));
            if let Some(s) = span() {
                d = d.at(s, "always empty");
            }
            // A sound rule compiled every filter it has: `exclude[k]` is the k-th written.
            for (k, ids) in &dropping {
                let fpath = path.key("route").key("exclude").index(*k).key("drop");
                if let Some(s) = ck.bundle.value_span(*doc, &fpath) {
                    let names: Vec<String> = ids
                        .iter()
                        .filter_map(|id| out.destination(*id))
                        .map(|d| format!("`{}` ({})", d.name, d.backend.as_str()))
                        .collect();
                    d = d.with_related(s, format!("drops {} for every request", names.join(", ")));
                }
            }
            ck.push(d);
            continue;
        }
        // Earlier `minimize` tiers: one picks whenever a survivor of its type exists, so a later
        // tier whose candidates are all of those types never gets to pick.
        let mut picks_any: Option<usize> = None;
        let mut picks_type: Vec<(BackendType, usize)> = Vec::new();
        for (t, tier) in rule.select.iter().enumerate() {
            let tpath = path.key("route").key("select").index(t);
            if matches!(tier.pick, Pick::Minimize(Measure::Cost)) {
                unpriced_cost(ck, out, pool, rule, (*doc, &tpath), t, &possible);
            }
            if let Pick::Minimize(
                m @ (Measure::QueuedPrompts | Measure::RunningPrompts | Measure::KvCacheUsage),
            ) = tier.pick
                && tier.backend != Some(BackendType::Local)
                && possible.iter().any(|(_, b)| *b == BackendType::Provider)
            {
                ck.report(
                    *doc,
                    &tpath,
                    Code::MeasureUnavailable,
                    format!(
                        "select tier {} of rule `{}` minimizes {} over providers too, which report no load: a provider counts as 0 and always wins in pool `{}`",
                        t + 1,
                        rule.name,
                        m.as_str(),
                        pool.name
                    ),
                    "providers always win",
                    Some("add `type: Local` to the tier (and a later `type: Provider` tier as a fallback), or minimize `PredictedTTFT`".into()),
                );
            }
            let earlier = picks_any.or_else(|| {
                let of = |b: BackendType| picks_type.iter().find(|(x, _)| *x == b).map(|(_, k)| *k);
                match tier.backend {
                    Some(b) => of(b),
                    None => of(BackendType::Local)
                        .zip(of(BackendType::Provider))
                        .map(|(a, b)| a.max(b)),
                }
            });
            if let Pick::Minimize(_) = tier.pick {
                match tier.backend {
                    None => picks_any = picks_any.or(Some(t)),
                    Some(b) if !picks_type.iter().any(|(x, _)| *x == b) => picks_type.push((b, t)),
                    Some(_) => {}
                }
            }
            let reachable = possible.iter().any(|(id, b)| {
                tier.backend.is_none_or(|tb| tb == *b)
                    && match &tier.pick {
                        Pick::Minimize(_) => true,
                        Pick::Order(ids) => ids.contains(id),
                    }
            });
            if !reachable {
                ck.report(
                    *doc,
                    &tpath,
                    Code::UnreachableTier,
                    format!(
                        "select tier {} of rule `{}` can never have a candidate in pool `{}`",
                        t + 1,
                        rule.name,
                        pool.name
                    ),
                    "never has a candidate",
                    Some(tier_help(out, &possible)),
                );
            } else if let Some(k) = earlier {
                let help = match rule.select.get(k).and_then(|e| e.backend) {
                    None => format!(
                        "give tier {} a `type` (e.g. `type: Local`) so that later tiers are a fallback, or remove tier {}",
                        k + 1,
                        t + 1
                    ),
                    Some(b) => format!(
                        "tier {} picks whenever a {} candidate survives: move tier {} before it, or remove it",
                        k + 1,
                        b.as_str(),
                        t + 1
                    ),
                };
                ck.report(
                    *doc,
                    &tpath,
                    Code::UnreachableTier,
                    format!(
                        "select tier {} of rule `{}` can never pick in pool `{}`: tier {} minimizes over every candidate it could have and picks first",
                        t + 1,
                        rule.name,
                        pool.name,
                        k + 1
                    ),
                    "never picks",
                    Some(help),
                );
            }
        }
    }
}

/// KINF0507: tier `t` of `rule` (at `tpath`) minimizes `Cost` over candidates some of which have no prices.
/// Without prices a destination costs 0, so it always wins against priced ones (and with no
/// prices at all the tier picks by pool order).
fn unpriced_cost(
    ck: &mut Checker<'_>,
    out: &CompiledPolicy,
    pool: &crate::compiled::CompiledPool,
    rule: &CompiledRule,
    (doc, tpath): (usize, &FieldPath),
    t: usize,
    possible: &[(DestId, BackendType)],
) {
    let Some(tier) = rule.select.get(t) else {
        return;
    };
    let mut unpriced: Vec<String> = Vec::new();
    let mut priced = 0usize;
    for (id, b) in possible {
        if tier.backend.is_some_and(|tb| tb != *b) {
            continue;
        }
        let Some(d) = out.destination(*id) else {
            continue;
        };
        if d.cost.priced {
            priced += 1;
        } else {
            let name = format!("`{}` ({})", d.name, b.as_str());
            if !unpriced.contains(&name) {
                unpriced.push(name);
            }
        }
    }
    if unpriced.is_empty() {
        return;
    }
    let consequence = if priced == 0 {
        "no candidate has prices, so every one costs 0 and the tier picks by pool order"
    } else {
        "a destination without prices costs 0, so it always wins over priced ones"
    };
    ck.report(
        doc,
        tpath,
        Code::UnpricedCost,
        format!(
            "select tier {} of rule `{}` minimizes Cost in pool `{}`, but {} {} no `cost`: {consequence}",
            t + 1,
            rule.name,
            pool.name,
            unpriced.join(", "),
            if unpriced.len() == 1 { "has" } else { "have" },
        ),
        "unpriced candidates",
        Some("set `cost:` (prices per million tokens) on every destination this tier can pick, or minimize another measure".into()),
    );
}

fn pool_destinations(out: &CompiledPolicy, pool: &crate::compiled::CompiledPool) -> String {
    let names: Vec<String> = pool
        .destinations
        .iter()
        .filter_map(|id| {
            out.destination(*id)
                .map(|d| format!("`{}` ({})", d.name, d.backend.as_str()))
        })
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

fn tier_help(out: &CompiledPolicy, possible: &[(DestId, BackendType)]) -> String {
    let names: Vec<String> = possible
        .iter()
        .filter_map(|(id, b)| {
            out.destination(*id)
                .map(|d| format!("`{}` ({})", d.name, b.as_str()))
        })
        .collect();
    format!(
        "after consider and exclude, only these destinations can be candidates: {}",
        names.join(", ")
    )
}

/// What [`possible_destinations`] finds.
#[derive(Default)]
struct Possible {
    /// The destinations that can be candidates.
    set: Vec<(DestId, BackendType)>,
    /// The filters (their indices in `exclude`, in order) that drop destinations the rule
    /// considers whatever the request and the load, each with those it drops (the first
    /// such filter of a destination only).
    dropping: Vec<(usize, Vec<DestId>)>,
}

/// Destinations that can be candidates of a rule in a pool, ignoring load (so: consider, and
/// filters that drop by backend type or name unconditionally).
fn possible_destinations(
    policy: &CompiledPolicy,
    pi: usize,
    rule: &CompiledRule,
    dests_unique: bool,
) -> Possible {
    let mut out = Possible::default();
    let Some(pool) = policy.pools.get(pi) else {
        return out;
    };
    // Per consider entry with `models`: a bit set of the destination ids serving any of them
    // (looked up once per rule rather than once per destination).
    let words = policy.destinations.len().div_ceil(64);
    let served: Vec<Option<SmallVec<[u64; 4]>>> = rule
        .consider
        .iter()
        .map(|c| {
            c.models.as_ref().map(|names| {
                let mut bits: SmallVec<[u64; 4]> = SmallVec::from_elem(0, words);
                for n in names {
                    if let Some(v) = pool.models.get(n) {
                        for (d, _) in v {
                            let i = d.0 as usize;
                            // Ids outside `policy.destinations` are never asked about below.
                            if let Some(w) = bits.get_mut(i / 64) {
                                *w |= 1 << (i % 64);
                            }
                        }
                    }
                }
                bits
            })
        })
        .collect();
    let has = |bits: &[u64], id: DestId| {
        let i = id.0 as usize;
        bits.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    };
    // When every consider entry names models, a destination serving none of them is never
    // considered: one bit test rules it out before the entries are looked at.
    let union: Option<SmallVec<[u64; 4]>> =
        if !rule.consider.is_empty() && served.iter().all(Option::is_some) {
            let mut u: SmallVec<[u64; 4]> = SmallVec::from_elem(0, words);
            for bits in served.iter().flatten() {
                for (w, b) in u.iter_mut().zip(bits.iter()) {
                    *w |= *b;
                }
            }
            Some(u)
        } else {
            None
        };
    // When every match entry names an exact model, only destinations serving one of them can
    // be a candidate for the requested model: without `consider`, or by a `consider` entry
    // without `models` (one with `models` considers those models instead).
    let exact_models: Option<Vec<&Arc<str>>> = (!rule.matches.is_empty())
        .then(|| {
            rule.matches
                .iter()
                .map(|e| match &e.model {
                    Some(ModelPattern::Exact(m)) => Some(m),
                    _ => None,
                })
                .collect()
        })
        .flatten();
    for &id in &pool.destinations {
        if let Some(u) = &union
            && !has(u, id)
        {
            continue;
        }
        let serves_requested = || {
            exact_models.as_ref().is_none_or(|models| {
                models.iter().any(|m| {
                    pool.models
                        .get(*m)
                        .is_some_and(|v| v.iter().any(|(d, _)| *d == id))
                })
            })
        };
        let Some(d) = policy.destination(id) else {
            continue;
        };
        let considered = if rule.consider.is_empty() {
            serves_requested()
        } else {
            rule.consider.iter().zip(&served).any(|(c, served)| {
                c.backend.is_none_or(|b| b == d.backend)
                    && c.destination.is_none_or(|x| x == id)
                    && match served {
                        Some(bits) => has(bits, id),
                        None => serves_requested(),
                    }
            })
        };
        if !considered {
            continue;
        }
        // An `if` or a `drop.when` that is always true is no condition; one that is always
        // false never holds, so its filter drops nothing.
        let dropped_by = rule.exclude.iter().position(|f| {
            f.condition
                .as_ref()
                .is_none_or(RequestCond::is_unconditional)
                && f.drop.queued_prompts.is_none()
                && f.drop.running_prompts.is_none()
                && f.drop.kv_cache_usage.is_none()
                && f.drop.predicted_ttft.is_none()
                && f.drop.effective_when().is_none()
                && f.drop.backend.is_none_or(|b| b == d.backend)
                && f.drop.destination.is_none_or(|x| x == id)
        });
        match dropped_by {
            Some(k) => match out.dropping.iter_mut().find(|(j, _)| *j == k) {
                Some((_, ids)) if ids.contains(&id) => {}
                Some((_, ids)) => ids.push(id),
                None => out.dropping.push((k, vec![id])),
            },
            None => out.set.push((id, d.backend)),
        }
    }
    if !dests_unique {
        let mut seen = AHashSet::new();
        out.set.retain(|(id, _)| seen.insert(*id));
    }
    out.dropping.sort_unstable_by_key(|(k, _)| *k);
    out
}

/// Whether `rule` never matches a request: it has `matches` entries, and each has a `when` that
/// is always false (KINF0412 reports each). Such a rule is neither shadowed nor shadows.
fn never_matches(rule: &CompiledRule) -> bool {
    !rule.matches.is_empty() && rule.matches.iter().all(RequestCond::never_matches)
}

fn covers_rule(earlier: &CompiledRule, later: &CompiledRule) -> bool {
    if never_matches(earlier) || never_matches(later) {
        return false;
    }
    if earlier.matches.is_empty() {
        return true;
    }
    if later.matches.is_empty() {
        return earlier.matches.iter().any(RequestCond::is_unconditional);
    }
    // A later entry that never matches needs no cover.
    later
        .matches
        .iter()
        .filter(|b| !b.never_matches())
        .all(|b| earlier.matches.iter().any(|a| covers(a, b)))
}

/// Whether every request matching `b` also matches `a`.
fn covers(a: &RequestCond, b: &RequestCond) -> bool {
    if a.never_matches() {
        return false;
    }
    if !(a.model.is_none() || b.model.is_some()) {
        return false;
    }
    let model = match (&a.model, &b.model) {
        (None, _) => true,
        (Some(ModelPattern::Exact(x)), Some(ModelPattern::Exact(y))) => x == y,
        (Some(ModelPattern::Glob(g)), Some(ModelPattern::Exact(y))) => g.matches(y),
        (Some(ModelPattern::Glob(g)), Some(ModelPattern::Glob(h))) => g.as_str() == h.as_str(),
        _ => false,
    };
    let eq = |x: &Option<Arc<str>>, y: &Option<Arc<str>>| x.is_none() || x == y;
    let range = match (&a.prompt_tokens, &b.prompt_tokens) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(ra), Some(rb)) => {
            ra.greater_than
                .is_none_or(|g| rb.greater_than.is_some_and(|h| h >= g))
                && ra
                    .less_than
                    .is_none_or(|l| rb.less_than.is_some_and(|m| m <= l))
        }
    };
    // Cheap comparisons first; the `when` texts only when everything else already covers. A
    // `when` that is always true is no condition.
    let when = || match (a.effective_when(), b.effective_when()) {
        (None, _) => true,
        (Some(x), Some(y)) => x.expr() == y.expr(),
        _ => false,
    };
    model
        && eq(&a.tag, &b.tag)
        && eq(&a.tenant, &b.tenant)
        && (a.qos.is_none() || a.qos == b.qos)
        && range
        && (a.header.is_none() || a.header == b.header)
        && when()
}
