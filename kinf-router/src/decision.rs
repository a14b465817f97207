//! The result of a decision, with its full trace.

use std::sync::Arc;

use kinf_policy::BackendType;
use serde::Serialize;

use crate::predictor::TtftParts;

/// What to do with the request.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// Send it to an endpoint.
    Route(Route),
    /// Refuse it.
    Reject(Reject),
}

/// A routing decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// `host:port` of a local endpoint, or the provider's URL.
    pub endpoint: Arc<str>,
    /// Local or Provider.
    pub backend_type: BackendType,
    /// The worker set or provider name.
    pub destination: Arc<str>,
    /// Its namespace.
    pub namespace: Arc<str>,
    /// The model to send upstream (served name, or provider model id).
    pub model: Arc<str>,
    /// Whether the body's `model` must be rewritten (it differs from the requested name).
    pub rewrite_model: bool,
    /// Predicted TTFT of the chosen candidate.
    pub predicted_ttft_s: Option<f64>,
    /// Prompt tokens the chosen endpoint already holds.
    pub cached_tokens: u32,
    /// Headers to set on the upstream request and the response.
    pub headers: Vec<(String, String)>,
    /// The inputs of the chosen local endpoint's TTFT prediction, to learn from the observed
    /// TTFT with ([`crate::ClusterState::observe_ttft`]) and to count the request in flight
    /// ([`crate::ClusterState::begin_request`]); `None` for providers.
    #[serde(skip)]
    pub prediction: Option<PredictionInputs>,
}

/// What a local endpoint's TTFT prediction was computed from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PredictionInputs {
    /// The request's prompt tokens the endpoint does not hold.
    pub uncached_tokens: u32,
    /// Prefill tokens queued ahead of it: the uncached tokens of requests routed there whose
    /// first token has not arrived ([`crate::state::InFlight`]).
    pub pending_prefill_tokens: u64,
    /// Queued prompts the endpoint reported that are not this gateway's in-flight requests.
    pub queued: f64,
    /// Running prompts: the larger of the reported count and this gateway's in-flight requests.
    pub running: f64,
}

impl PredictionInputs {
    /// The prefill-token input of the model: the request's own plus those queued ahead.
    pub fn prefill_tokens(&self) -> f64 {
        f64::from(self.uncached_tokens) + self.pending_prefill_tokens as f64
    }
}

/// A refusal, shaped for an OpenAI/Anthropic error response.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reject {
    /// HTTP status.
    pub status: u16,
    /// Machine-readable code: `policy_rejected`, `no_capacity`, `model_not_found`, `unknown_pool`.
    pub code: &'static str,
    /// Human message naming the policy and rule.
    pub message: String,
}

/// A decision and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Route or reject.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The policy whose rule decided (`namespace/name`); `None` for the default route.
    pub policy: Option<Arc<str>>,
    /// The rule that decided; `None` for the default route.
    pub rule: Option<Arc<str>>,
    /// Every step taken.
    pub trace: Trace,
}

impl Decision {
    /// The route, if routed.
    pub fn route(&self) -> Option<&Route> {
        match &self.outcome {
            Outcome::Route(r) => Some(r),
            Outcome::Reject(_) => None,
        }
    }

    /// The reject, if rejected.
    pub fn reject(&self) -> Option<&Reject> {
        match &self.outcome {
            Outcome::Reject(r) => Some(r),
            Outcome::Route(_) => None,
        }
    }
}

/// A candidate named in a trace: `destination@endpoint` when serialized or displayed.
/// Cheap to clone (two `Arc`s), so traces cost no string formatting on the decision path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CandidateRef {
    /// Destination name.
    pub destination: Arc<str>,
    /// Endpoint address or provider URL.
    pub endpoint: Arc<str>,
}

impl std::fmt::Display for CandidateRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.destination, self.endpoint)
    }
}

impl Serialize for CandidateRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The trace of a decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// `namespace/name` of the pool.
    pub pool: String,
    /// Rules evaluated, in order.
    pub rules: Vec<RuleTrace>,
    /// The default route, when it was used.
    pub default: Option<StagesTrace>,
}

/// One rule's evaluation.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleTrace {
    /// Policy.
    pub policy: Arc<str>,
    /// Rule.
    pub rule: Arc<str>,
    /// Whether its matches held.
    pub matched: bool,
    /// Stages, when it matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stages: Option<StagesTrace>,
}

/// Consider → exclude → select of one rule (or the default route).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StagesTrace {
    /// Candidates after consider.
    pub considered: Vec<CandidateTrace>,
    /// Endpoints of considered destinations that were not candidates (not ready).
    pub unavailable: Vec<String>,
    /// Each candidate dropped, by which filter and why.
    pub dropped: Vec<DropTrace>,
    /// Candidates after exclude.
    pub survivors: Vec<CandidateRef>,
    /// Select tiers tried.
    pub tiers: Vec<TierTrace>,
    /// `route`, or the onEmpty action taken (`Reject`, `NextRule`).
    pub result: String,
}

/// A candidate and its measures.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateTrace {
    /// `destination@endpoint`.
    pub id: CandidateRef,
    /// Local or Provider.
    pub backend_type: BackendType,
    /// Upstream model.
    pub model: Arc<str>,
    /// Average queued prompts (Local).
    pub queued_prompts: Option<f64>,
    /// Average running prompts (Local).
    pub running_prompts: Option<f64>,
    /// Average KV-cache usage (Local).
    pub kv_cache_usage: Option<f64>,
    /// Prompt tokens already cached there.
    pub cached_prompt_tokens: u32,
    /// How `cachedPromptTokens` is known: `exact` (KV events), `approximate` (what was routed
    /// where), `assumed` (given by the caller, e.g. a `kinfctl explain` state file), `none`
    /// (providers).
    pub prefix_tracking: &'static str,
    /// Predicted TTFT and its parts.
    pub predicted_ttft: TtftParts,
    /// Estimated cost of the request at its prices.
    pub cost: f64,
}

/// A dropped candidate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DropTrace {
    /// Filter name.
    pub filter: Arc<str>,
    /// Candidate.
    pub candidate: CandidateRef,
    /// The values that made the drop condition hold.
    pub reason: DropReason,
}

/// One select tier.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierTrace {
    /// The tier, as text.
    pub tier: Arc<str>,
    /// Candidates it looked at.
    pub candidates: Vec<CandidateRef>,
    /// The one it picked.
    pub picked: Option<CandidateRef>,
}

/// Why a filter dropped a candidate: the parts of its `drop` condition and the measured values.
/// Displayed and serialized as text such as `backend Local, queuedPrompts 5.000 is > 2`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DropReason {
    /// The backend type condition that held.
    pub backend: Option<BackendType>,
    /// The destination condition that held.
    pub destination: Option<Arc<str>>,
    /// Measure name, measured value, and the range it fell in.
    pub measures: smallvec::SmallVec<[(&'static str, f64, kinf_lang::compiled::Range); 2]>,
    /// The `drop` condition's text, when a `when` expression held.
    pub when: Option<Arc<str>>,
}

impl std::fmt::Display for DropReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if let Some(b) = self.backend {
            parts.push(format!("backend {}", b.as_str()));
        }
        if let Some(d) = &self.destination {
            parts.push(format!("destination {d}"));
        }
        for (name, v, r) in &self.measures {
            parts.push(format!("{name} {v:.3} is {r}"));
        }
        if let Some(w) = &self.when {
            parts.push(format!("condition `{w}` holds"));
        }
        f.write_str(&parts.join(", "))
    }
}

impl Serialize for DropReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
