//! `InferencePolicy`: ordered routing rules and token limits.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{BackendType, DurationString, Threshold};
use crate::status::PolicyStatus;

/// Ordered routing rules for the pools it targets, and per-tenant token limits.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kinference.buoyant.io",
    version = "v1alpha1",
    kind = "InferencePolicy",
    namespaced,
    status = "PolicyStatus",
    shortname = "ipol",
    category = "kinference",
    doc = "Ordered routing rules for inference requests, and token limits.",
    printcolumn(name = "Rules", type_ = "integer", json_path = ".status.rules"),
    printcolumn(name = "Pools", type_ = "string", json_path = ".status.pools"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Accepted\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferencePolicySpec {
    /// The pools this policy applies to. Absent or empty: every pool in the namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<TargetRef>,
    /// Order among several policies targeting the same pool: lower first, then by name.
    /// Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Rules, evaluated in order; the first whose `matches` holds decides.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Token and request rate limits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<TokenLimit>,
}

/// A reference to a pool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TargetRef {
    /// API group. Default `kinference.buoyant.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind of the target. Only `InferencePool` today. Default `InferencePool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TargetKind>,
    /// Name of the pool in the policy's namespace.
    pub name: String,
}

/// Kinds a policy can target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TargetKind {
    /// An [`crate::InferencePool`].
    InferencePool,
}

/// One routing rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// Unique within the policy; named in decisions, metrics and reject messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Entries OR-ed; the fields inside one entry AND-ed. Absent or empty: matches every request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<RequestMatch>,
    /// How matching requests are routed.
    #[serde(default)]
    pub route: Route,
}

/// Conditions on a request; every field given must hold.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestMatch {
    /// The requested model: a served name, an alias, or a glob (`qwen-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A tag a classifier put on the request (e.g. `pii-detected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The tenant the request was identified as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The request's quality-of-service class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<Qos>,
    /// Size of the prompt in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<Threshold>,
    /// A request header with an exact value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<HeaderMatch>,
    /// A condition in the expression language, e.g. `promptTokens > 8000 && tag("pii-detected")`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

/// Quality-of-service class of a request (header `x-kinference-qos`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Qos {
    /// A user is waiting (the default).
    Interactive,
    /// Batch work: throughput matters, latency does not.
    Batch,
    /// Work that may be postponed or refused when the fleet is busy.
    Deferrable,
}

impl Qos {
    /// Every class.
    pub const ALL: [Qos; 3] = [Qos::Interactive, Qos::Batch, Qos::Deferrable];

    /// The YAML and header spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Interactive => "interactive",
            Qos::Batch => "batch",
            Qos::Deferrable => "deferrable",
        }
    }
}

/// A header condition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderMatch {
    /// Header name (case-insensitive).
    pub name: String,
    /// Exact value.
    pub value: String,
}

/// The routing stages of a rule: consider → exclude → select → onEmpty.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Route {
    /// Builds the candidate set (union of the entries). Default: every destination of the pool
    /// serving the requested model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consider: Vec<Consider>,
    /// Named filters dropping candidates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<ExcludeFilter>,
    /// Ordered tiers; the first with a surviving candidate picks one. Default: one tier,
    /// `minimize: PredictedTTFT` over all survivors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub select: Vec<SelectTier>,
    /// What happens when no tier has a candidate. Default `Reject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_empty: Option<OnEmpty>,
    /// With `onEmpty: Reject`: what the client is told when this rule rejects (the error's
    /// message, followed by the rule's and the policy's names). 1 to 1024 characters, no
    /// control characters. Default: a generic message naming the rule and the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub reject_message: Option<String>,
}

/// One entry of `consider`; the fields given are AND-ed.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Consider {
    /// Destinations serving any of these models (instead of the requested one). A candidate
    /// serving another model than requested means the body's `model` is rewritten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<ModelSet>,
    /// Only destinations of this backend type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackendType>,
    /// Only the destination (worker set or provider) of this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// A set of model names or aliases.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSet {
    /// Served names or aliases.
    #[schemars(length(min = 1))]
    pub names: Vec<String>,
}

/// A named filter that drops candidates.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExcludeFilter {
    /// Unique within the rule; shown in decision traces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Apply the filter only when this request condition holds.
    #[serde(rename = "if", default, skip_serializing_if = "Option::is_none")]
    pub if_: Option<RequestMatch>,
    /// Which candidates to drop; every field given must hold for a candidate to be dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop: Option<DropPredicate>,
    /// Averaging window of load measures. Default `30s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationString>,
}

/// A predicate on candidates; every field given must hold.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DropPredicate {
    /// The candidate's backend type or destination name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendSelector>,
    /// Average number of prompts waiting in the worker's queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_prompts: Option<Threshold>,
    /// Average number of requests the worker is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_prompts: Option<Threshold>,
    /// Average KV-cache usage, 0..1 (`0.7` or `70%`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage: Option<Threshold>,
    /// The candidate's predicted time to first token for this request (`2s`).
    #[serde(
        rename = "predictedTTFT",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub predicted_ttft: Option<Threshold>,
    /// A condition in the expression language over the request and the candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
}

/// Selects candidates by backend type and/or destination name.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendSelector {
    /// Backend type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackendType>,
    /// Destination (worker set or provider) name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A select tier: which candidates it looks at, and how it picks one.
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelectTier {
    /// Only candidates of this backend type.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<BackendType>,
    /// Pick the candidate with the lowest value of this measure. Default `PredictedTTFT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimize: Option<Measure>,
    /// Pick the first ready candidate in this order of destination names; candidates not named
    /// are not part of the tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
}

/// Measures a tier can minimize.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Measure {
    /// Predicted time to first token (queue wait + prefill of uncached tokens + overhead).
    #[serde(rename = "PredictedTTFT")]
    PredictedTtft,
    /// Average queued prompts.
    QueuedPrompts,
    /// Average running requests.
    RunningPrompts,
    /// Average KV-cache usage.
    KvCacheUsage,
    /// Estimated cost of the request at the destination's prices.
    Cost,
}

impl Measure {
    /// The YAML spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::PredictedTtft => "PredictedTTFT",
            Measure::QueuedPrompts => "QueuedPrompts",
            Measure::RunningPrompts => "RunningPrompts",
            Measure::KvCacheUsage => "KvCacheUsage",
            Measure::Cost => "Cost",
        }
    }
}

/// What a rule does when no select tier has a candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OnEmpty {
    /// Fail closed: reject the request with 503, naming the rule.
    Reject,
    /// Continue with the next rule whose `matches` holds (then the default route).
    NextRule,
}

/// A rate limit for a tenant (optionally per model or qos).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenLimit {
    /// Unique within the policy; shown in 429 responses and metrics.
    pub name: String,
    /// Which requests share this budget (model, tenant, qos, ...). Absent: every request, with
    /// a separate budget per tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matches: Option<RequestMatch>,
    /// Tokens per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub tokens_per_minute: Option<u64>,
    /// Which tokens count against `tokensPerMinute`. Default `Total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<TokenCount>,
    /// Requests per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub requests_per_minute: Option<u64>,
    /// Requests in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub concurrent_requests: Option<u64>,
    /// What happens to a request over this limit. Default `Reject` (429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_exceeded: Option<WhenExceeded>,
}

/// What happens to a request over a limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum WhenExceeded {
    /// 429 with `Retry-After` and `x-ratelimit-*` headers.
    #[default]
    Reject,
    /// Admit it without charging this limit and tag it `over-limit`, so that rules can route
    /// it elsewhere (`matches: {tag: over-limit}`: a cheaper model, batch capacity, ...).
    Tag,
}

/// Which tokens a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TokenCount {
    /// Prompt plus output tokens.
    Total,
    /// All prompt tokens.
    Prompt,
    /// Prompt tokens not served from the prefix cache.
    UncachedPrompt,
    /// Output tokens.
    Output,
}

/// Re-exported for readers of the rule types.
pub type Window = DurationString;
