//! The lowered, flat, immutable result of compilation that the decision engine evaluates.
//!
//! Everything is resolved: destinations are indices, model names map to (destination, upstream
//! model) pairs, thresholds are numbers, expressions are type-checked. A `CompiledPolicy` is
//! shared behind an `Arc` and replaced as a whole when the configuration changes.

use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;
use kinf_grammar::{Glob, TypedExpr};
use kinf_policy::{BackendType, Measure, OnEmpty, ProviderType, Qos, TokenCount};
use smallvec::SmallVec;

/// The destinations serving one client-facing model name, each with the upstream model name.
pub type ModelTargets = SmallVec<[(DestId, Arc<str>); 4]>;

/// Index of a destination in [`CompiledPolicy::destinations`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestId(pub u32);

/// Where a rule or resource was written: `file:line`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceRef {
    /// File name as given.
    pub file: Arc<str>,
    /// 1-based line.
    pub line: u32,
}

impl std::fmt::Display for SourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// A compiled bundle: every pool with its ordered rules.
#[derive(Debug, Default)]
pub struct CompiledPolicy {
    /// Every worker set and provider referenced by a pool.
    pub destinations: Vec<Destination>,
    /// Every pool.
    pub pools: Vec<CompiledPool>,
    /// Every gateway backend.
    pub gateways: Vec<CompiledGateway>,
    /// A hash of the sources; equal bundles have equal fingerprints.
    pub fingerprint: u64,
}

impl CompiledPolicy {
    /// The destination with this id.
    pub fn destination(&self, id: DestId) -> Option<&Destination> {
        self.destinations.get(id.0 as usize)
    }

    /// A pool by namespace and name.
    pub fn pool(&self, namespace: &str, name: &str) -> Option<&CompiledPool> {
        self.pools
            .iter()
            .find(|p| &*p.namespace == namespace && &*p.name == name)
    }

    /// The only pool, or the pool named (`name` or `namespace/name`).
    pub fn find_pool(&self, name: Option<&str>) -> Option<&CompiledPool> {
        match name {
            None => match self.pools.as_slice() {
                [only] => Some(only),
                _ => None,
            },
            Some(n) => self
                .pools
                .iter()
                .find(|p| &*p.name == n || format!("{}/{}", p.namespace, p.name) == n),
        }
    }

    /// The tags a request to `pool` can carry: those the classifiers of the GatewayBackends in
    /// front of it produce (with no GatewayBackend in the bundle, the gateway's default
    /// classifiers'), and `over-limit`, which a `whenExceeded: Tag` limit sets. Sorted.
    pub fn producible_tags(&self, pool: &CompiledPool) -> Vec<Arc<str>> {
        let mut tags: Vec<Arc<str>> = vec![Arc::from(crate::check::OVER_LIMIT_TAG)];
        if self.gateways.is_empty() {
            tags.extend(crate::check::default_classifier_tags());
        }
        for g in &self.gateways {
            let serves = self
                .pools
                .get(g.pool)
                .is_some_and(|p| p.namespace == pool.namespace && p.name == pool.name);
            if serves {
                tags.extend(g.tags.iter().cloned());
            }
        }
        tags.sort();
        tags.dedup();
        tags
    }
}

/// A worker set or provider.
#[derive(Debug)]
pub struct Destination {
    /// Its id.
    pub id: DestId,
    /// Namespace.
    pub namespace: Arc<str>,
    /// `metadata.name`.
    pub name: Arc<str>,
    /// Local (worker set) or Provider.
    pub backend: BackendType,
    /// Models served: upstream name and the client-facing names (name and aliases).
    pub models: Vec<ServedModel>,
    /// Worker-set details (Local only).
    pub worker_set: Option<WorkerSetInfo>,
    /// Provider details (Provider only).
    pub provider: Option<ProviderInfo>,
    /// Prices per million tokens.
    pub cost: CostInfo,
    /// Where it was declared.
    pub source: SourceRef,
}

/// A model a destination serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ServedModel {
    /// The name sent upstream (vLLM's served name, or the provider's model id).
    pub upstream: Arc<str>,
    /// Names clients may use for it.
    pub client_names: Vec<Arc<str>>,
}

/// Prices per million tokens (0 when not configured).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CostInfo {
    /// Uncached prompt tokens.
    pub uncached_prompt: f64,
    /// Cached prompt tokens.
    pub cached_prompt: f64,
    /// Output tokens.
    pub output: f64,
    /// Whether prices were configured (`cost:` set); without them every price is 0.
    pub priced: bool,
}

/// Details of a worker set.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSetInfo {
    /// Static endpoints (`host:port`), empty in selector mode.
    pub endpoints: Vec<Arc<str>>,
    /// Label selector (`key=value` pairs of `matchLabels`), empty in endpoints mode.
    pub selector: Vec<(String, String)>,
    /// vLLM HTTP port in selected pods.
    pub port: u16,
    /// KV-event publisher settings; `None` means approximate prefix tracking.
    pub kv_events: Option<KvEventsInfo>,
    /// Metrics path.
    pub metrics_path: Arc<str>,
    /// Scrape interval.
    pub metrics_interval: Duration,
    /// KV block size, when configured.
    pub block_size: Option<u32>,
    /// Tokenizer directory or ConfigMap, when configured.
    pub tokenizer: Option<Arc<str>>,
    /// Performance prior.
    pub prior: PerformancePrior,
}

/// KV-event publisher settings.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsInfo {
    /// PUB port; `None`: discovered from the worker's `GET /kv_event_sources`.
    pub port: Option<u16>,
    /// ROUTER replay port.
    pub replay_port: Option<u16>,
    /// Topic.
    pub topic: Arc<str>,
}

/// Performance prior of one worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PerformancePrior {
    /// Prompt tokens per second of prefill.
    pub prefill_tokens_per_second: f64,
    /// Output tokens per second of one sequence.
    pub decode_tokens_per_second: f64,
    /// Fixed overhead per request.
    pub overhead: Duration,
}

impl Default for PerformancePrior {
    fn default() -> Self {
        PerformancePrior {
            prefill_tokens_per_second: DEFAULT_PREFILL_TPS,
            decode_tokens_per_second: DEFAULT_DECODE_TPS,
            overhead: Duration::from_millis(20),
        }
    }
}

/// Default prefill throughput when a worker set declares none.
pub const DEFAULT_PREFILL_TPS: f64 = 5000.0;
/// Default decode throughput when a worker set declares none.
pub const DEFAULT_DECODE_TPS: f64 = 40.0;

/// Details of a provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderInfo {
    /// Wire protocol.
    pub protocol: ProviderType,
    /// Base URL.
    pub url: Arc<str>,
    /// AWS region (Bedrock).
    pub region: Option<Arc<str>>,
    /// Request timeout.
    pub timeout: Duration,
    /// Requests in flight at most.
    pub max_concurrency: Option<u32>,
    /// Expected TTFT until observed.
    pub expected_ttft: Duration,
    /// Where credentials come from (never the secret itself).
    pub credentials: Option<CredentialRef>,
    /// `spec.maxTokensField`: the field of the output token limit in OpenAI-shaped requests.
    pub max_tokens_field: Option<kinf_policy::MaxTokensField>,
}

/// A reference to credentials (never the secret value).
#[derive(Clone, Debug, PartialEq)]
pub enum CredentialRef {
    /// A Secret key.
    Secret {
        /// Secret name.
        name: Arc<str>,
        /// Key.
        key: Arc<str>,
    },
    /// An environment variable.
    Env(Arc<str>),
    /// A file.
    File(Arc<str>),
}

/// A pool with its model table and ordered rules.
#[derive(Debug)]
pub struct CompiledPool {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
    /// Destinations, in the pool's order.
    pub destinations: Vec<DestId>,
    /// Client-facing model name or alias → (destination, upstream model) pairs, in pool order.
    pub models: AHashMap<Arc<str>, ModelTargets>,
    /// Rules of every policy targeting the pool, in evaluation order.
    pub rules: Vec<Arc<CompiledRule>>,
    /// Token limits of every policy targeting the pool.
    pub limits: Vec<Arc<CompiledLimit>>,
    /// Where it was declared.
    pub source: SourceRef,
}

impl CompiledPool {
    /// Every client-facing name, sorted.
    pub fn model_names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.models.keys().map(|k| &**k).collect();
        v.sort_unstable();
        v
    }
}

/// One rule.
#[derive(Debug)]
pub struct CompiledRule {
    /// The policy it belongs to (`namespace/name`).
    pub policy: Arc<str>,
    /// The rule's name.
    pub name: Arc<str>,
    /// Entries OR-ed; empty matches every request.
    pub matches: Vec<RequestCond>,
    /// Candidate entries (union); empty means the default (destinations serving the requested
    /// model).
    pub consider: Vec<ConsiderEntry>,
    /// Exclude filters in order.
    pub exclude: Vec<ExcludeFilter>,
    /// Select tiers in order (never empty: defaults to one `minimize: PredictedTTFT` tier).
    pub select: Vec<SelectTier>,
    /// What to do when no tier has a candidate.
    pub on_empty: OnEmpty,
    /// `route.rejectMessage`: what the client is told when the rule rejects.
    pub reject_message: Option<Arc<str>>,
    /// Where it was written.
    pub source: SourceRef,
}

/// Conditions on a request (all must hold).
#[derive(Debug, Default)]
pub struct RequestCond {
    /// Requested model.
    pub model: Option<ModelPattern>,
    /// Required tag.
    pub tag: Option<Arc<str>>,
    /// Required tenant.
    pub tenant: Option<Arc<str>>,
    /// Required qos.
    pub qos: Option<Qos>,
    /// Prompt size bounds.
    pub prompt_tokens: Option<Range>,
    /// Header name (lowercase) and exact value.
    pub header: Option<(Arc<str>, Arc<str>)>,
    /// A type-checked `when:` expression over the request variables.
    pub when: Option<TypedExpr>,
    /// Normalized text of the condition, for traces.
    pub text: Arc<str>,
}

impl RequestCond {
    /// Whether the condition matches every request: it has no field, and no `when` or one that
    /// is always true (`'true'`, `'stream || true'`), which is the same as none.
    pub fn is_unconditional(&self) -> bool {
        self.model.is_none()
            && self.tag.is_none()
            && self.tenant.is_none()
            && self.qos.is_none()
            && self.prompt_tokens.is_none()
            && self.header.is_none()
            && self.effective_when().is_none()
    }

    /// The `when` expression, unless it is always true: what the analyses of which requests
    /// a condition matches (shadowed rules) compare. An always false one is kept: it is a
    /// condition, one that never holds (reported as KINF0412).
    pub fn effective_when(&self) -> Option<&TypedExpr> {
        self.when
            .as_ref()
            .filter(|w| crate::constant_when::constant(w.expr()) != Some(true))
    }

    /// Whether the condition never holds: its `when` is always false (`'false'`, `'!true'`;
    /// reported as KINF0412). Such a condition covers, and so shadows, nothing.
    pub fn never_matches(&self) -> bool {
        self.when
            .as_ref()
            .is_some_and(|w| crate::constant_when::constant(w.expr()) == Some(false))
    }
}

/// A model name or glob.
#[derive(Debug, Clone)]
pub enum ModelPattern {
    /// Exact name or alias.
    Exact(Arc<str>),
    /// A glob such as `qwen-*`.
    Glob(Glob),
}

impl ModelPattern {
    /// Whether a requested model name matches.
    pub fn matches(&self, model: &str) -> bool {
        match self {
            ModelPattern::Exact(m) => &**m == model,
            ModelPattern::Glob(g) => g.matches(model),
        }
    }
}

/// An open interval: `greaterThan` < value < `lessThan`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Range {
    /// Exclusive lower bound.
    pub greater_than: Option<f64>,
    /// Exclusive upper bound.
    pub less_than: Option<f64>,
}

impl Range {
    /// Whether `v` lies in the interval.
    pub fn contains(&self, v: f64) -> bool {
        self.greater_than.is_none_or(|g| v > g) && self.less_than.is_none_or(|l| v < l)
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.greater_than, self.less_than) {
            (Some(g), Some(l)) => {
                f.write_str("> ")?;
                write_number(f, g)?;
                f.write_str(" and < ")?;
                write_number(f, l)
            }
            (Some(g), None) => {
                f.write_str("> ")?;
                write_number(f, g)
            }
            (None, Some(l)) => {
                f.write_str("< ")?;
                write_number(f, l)
            }
            (None, None) => f.write_str("any"),
        }
    }
}

/// Writes `v` as `f64`'s `Display` does; whole numbers (most thresholds) through the cheaper
/// integer formatting, which prints the same digits (`Display` of `f64` never uses an exponent
/// and prints no `.0`).
fn write_number(f: &mut std::fmt::Formatter<'_>, v: f64) -> std::fmt::Result {
    // Below 2^53 every whole `f64` converts to `i64` exactly; `-0.0` prints as `-0`.
    if v.fract() == 0.0 && v.abs() < 9.0e15 && !(v == 0.0 && v.is_sign_negative()) {
        write!(f, "{}", v as i64)
    } else {
        write!(f, "{v}")
    }
}

/// One entry of `consider`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsiderEntry {
    /// Client-facing model names to consider instead of the requested one.
    pub models: Option<Vec<Arc<str>>>,
    /// Only this backend type.
    pub backend: Option<BackendType>,
    /// Only this destination.
    pub destination: Option<DestId>,
}

/// One exclude filter.
#[derive(Debug)]
pub struct ExcludeFilter {
    /// Its name.
    pub name: Arc<str>,
    /// Applies only when this holds.
    pub condition: Option<RequestCond>,
    /// Drops candidates for which this holds.
    pub drop: DropCond,
    /// Averaging window of load measures.
    pub window: Duration,
}

/// A predicate on candidates (all fields given must hold).
#[derive(Debug, Default)]
pub struct DropCond {
    /// Backend type.
    pub backend: Option<BackendType>,
    /// Destination.
    pub destination: Option<DestId>,
    /// Average queued prompts.
    pub queued_prompts: Option<Range>,
    /// Average running prompts.
    pub running_prompts: Option<Range>,
    /// Average KV-cache usage (0..1).
    pub kv_cache_usage: Option<Range>,
    /// Whether the `kvCacheUsage` threshold was written as a percentage (`90%`, not `0.9`), so
    /// that traces show its values the same way.
    pub kv_cache_usage_percent: bool,
    /// Predicted TTFT in seconds.
    pub predicted_ttft: Option<Range>,
    /// A type-checked `when:` expression over request and endpoint variables.
    pub when: Option<TypedExpr>,
    /// The `when:` expression as text (normalized), for traces.
    pub when_text: Option<Arc<str>>,
    /// Normalized text, for traces.
    pub text: Arc<str>,
}

impl DropCond {
    /// The `when` expression, unless it is always true: what the analysis of which
    /// candidates a filter always drops (KINF0504) looks at. An always false one is kept: the
    /// filter then never drops anything.
    pub fn effective_when(&self) -> Option<&TypedExpr> {
        self.when
            .as_ref()
            .filter(|w| crate::constant_when::constant(w.expr()) != Some(true))
    }

    /// Whether the condition reads a load measure averaged over the filter's `window`:
    /// `queuedPrompts`, `runningPrompts` or `kvCacheUsage`, as a threshold or inside `when`.
    /// Nothing else depends on the window (`predictedTTFT` is predicted from the newest sample).
    pub fn reads_load(&self) -> bool {
        self.queued_prompts.is_some()
            || self.running_prompts.is_some()
            || self.kv_cache_usage.is_some()
            || self.when.as_ref().is_some_and(|w| {
                w.vars().iter().any(|v| {
                    matches!(
                        *v,
                        crate::env::VAR_QUEUED | crate::env::VAR_RUNNING | crate::env::VAR_KV_USAGE
                    )
                })
            })
    }
}

/// One select tier.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectTier {
    /// Only candidates of this backend type.
    pub backend: Option<BackendType>,
    /// How the tier picks.
    pub pick: Pick,
    /// The tier as text (`Local minimize PredictedTTFT`, `Provider order [a, b]`), built once
    /// at compile time for traces.
    pub text: Arc<str>,
}

impl SelectTier {
    /// A tier; `name_of` names destinations for its text.
    pub fn new<'n>(
        backend: Option<BackendType>,
        pick: Pick,
        name_of: impl Fn(DestId) -> Option<&'n str>,
    ) -> Self {
        let scope = backend.map_or("any ", |b| {
            if b == BackendType::Local {
                "Local "
            } else {
                "Provider "
            }
        });
        // Written in place (no name list, no join).
        let mut text = String::from(scope);
        match &pick {
            Pick::Minimize(m) => {
                text.push_str("minimize ");
                text.push_str(m.as_str());
            }
            Pick::Order(ids) => {
                text.push_str("order [");
                for (i, name) in ids.iter().filter_map(|d| name_of(*d)).enumerate() {
                    if i > 0 {
                        text.push_str(", ");
                    }
                    text.push_str(name);
                }
                text.push(']');
            }
        }
        SelectTier {
            backend,
            pick,
            text: text.into(),
        }
    }
}

/// How a select tier picks among its candidates.
#[derive(Clone, Debug, PartialEq)]
pub enum Pick {
    /// Lowest value of a measure (ties: pool order, then endpoint order).
    Minimize(Measure),
    /// First destination in this order that has a candidate.
    Order(Vec<DestId>),
}

/// A compiled token limit.
#[derive(Debug)]
pub struct CompiledLimit {
    /// `policy/limit` (`namespace/policy/limit` outside the `default` namespace): the name
    /// shown to clients and the key of its budgets.
    pub name: Arc<str>,
    /// Which requests it applies to.
    pub condition: Option<RequestCond>,
    /// Tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Which tokens count.
    pub count: TokenCount,
    /// Requests per minute.
    pub requests_per_minute: Option<u64>,
    /// Concurrent requests.
    pub concurrent_requests: Option<u64>,
    /// Reject over-limit requests, or tag them `over-limit`.
    pub when_exceeded: kinf_policy::WhenExceeded,
}

/// A compiled gateway backend.
#[derive(Debug)]
pub struct CompiledGateway {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
    /// Index of its pool in [`CompiledPolicy::pools`].
    pub pool: usize,
    /// The spec as written (tenant identity, classifiers, limits are interpreted by the server).
    pub spec: kinf_policy::GatewayBackendSpec,
    /// Tags its classifiers can produce.
    pub tags: Vec<Arc<str>>,
}

#[cfg(test)]
mod tests {
    use super::Range;
    use proptest::prelude::*;

    /// The text `Range` printed before its whole-number fast path.
    fn reference(r: &Range) -> String {
        match (r.greater_than, r.less_than) {
            (Some(g), Some(l)) => format!("> {g} and < {l}"),
            (Some(g), None) => format!("> {g}"),
            (None, Some(l)) => format!("< {l}"),
            (None, None) => "any".to_string(),
        }
    }

    fn check(g: Option<f64>, l: Option<f64>) {
        let r = Range {
            greater_than: g,
            less_than: l,
        };
        assert_eq!(r.to_string(), reference(&r));
    }

    #[test]
    fn range_text_edge_values() {
        for v in [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.8,
            4000.0,
            8.999e15,
            9.0e15,
            9.007_199_254_740_992e15,
            1e16,
            1e300,
            -1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            check(Some(v), None);
            check(None, Some(v));
            check(Some(v), Some(v));
        }
        check(None, None);
    }

    proptest! {
        #[test]
        fn range_text_matches_f64_display(
            g in proptest::option::of(any::<f64>()),
            l in proptest::option::of(any::<f64>()),
            w in proptest::option::of(-1_000_000_000i64..1_000_000_000),
        ) {
            check(g, l);
            check(w.map(|w| w as f64), l);
        }
    }
}
