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
    /// Destinations left out because the request needs more context than their workers'
    /// `max_model_len` (each also listed in `unavailable`). Not serialized.
    #[serde(skip)]
    pub context: ContextShortfall,
}

/// How many of the destinations a stage considered were too short of context for the request:
/// when all of them were, the request is refused with 400 `context_length_exceeded`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextShortfall {
    /// Destinations the request's model resolved to.
    pub destinations: u32,
    /// Of those, left out for their context.
    pub too_short: u32,
    /// The longest context (`max_model_len`) among those left out.
    pub longest: u64,
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
///
/// Serialized with its reason both as text (`reason`, as displayed) and structured: `backend`,
/// `destination` and `when` (the parts of the `drop` condition that held, or null), `measures`
/// (each comparison of a measured value with a bound that held) and `windowS` (the window the
/// load values were averaged over, or null when the filter read no load).
#[derive(Clone, Debug, PartialEq)]
pub struct DropTrace {
    /// Filter name.
    pub filter: Arc<str>,
    /// Candidate.
    pub candidate: CandidateRef,
    /// The values that made the drop condition hold.
    pub reason: DropReason,
}

impl Serialize for DropTrace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let r = &self.reason;
        let mut st = s.serialize_struct("DropTrace", 8)?;
        st.serialize_field("filter", &self.filter)?;
        st.serialize_field("candidate", &self.candidate)?;
        st.serialize_field("reason", r)?;
        st.serialize_field("backend", &r.backend)?;
        st.serialize_field("destination", &r.destination)?;
        st.serialize_field("measures", &Comparisons(&r.measures))?;
        st.serialize_field("when", &r.when)?;
        st.serialize_field("windowS", &r.window.map(|w| w.as_secs_f64()))?;
        st.end()
    }
}

/// The comparisons of [`DropReason::measures`] that held, one per bound: a range with both
/// bounds gives two.
struct Comparisons<'a>(&'a [DropMeasure]);

/// One comparison of a measured value with a bound, as serialized in a trace.
#[derive(Serialize)]
struct Comparison {
    name: &'static str,
    value: f64,
    unit: &'static str,
    op: &'static str,
    bound: f64,
}

impl Serialize for Comparisons<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(None)?;
        for m in self.0 {
            let bounds = [(">", m.range.greater_than), ("<", m.range.less_than)];
            for (op, bound) in bounds {
                if let Some(bound) = bound {
                    seq.serialize_element(&Comparison {
                        name: m.name,
                        value: m.value,
                        unit: m.unit.as_str(),
                        op,
                        bound,
                    })?;
                }
            }
        }
        seq.end()
    }
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
/// Displayed (and serialized alone) as text such as
/// `backend Local, queuedPrompts 5 > 2, kvCacheUsage 95% > 90%; load averaged over 30s`: values
/// with their units (`2.104s > 2s`), `kvCacheUsage` as the policy wrote its threshold (a
/// fraction, or a percentage).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DropReason {
    /// The backend type condition that held.
    pub backend: Option<BackendType>,
    /// The destination condition that held.
    pub destination: Option<Arc<str>>,
    /// Each measure of the condition, its value, and the range it fell in.
    pub measures: smallvec::SmallVec<[DropMeasure; 2]>,
    /// The `when` expression's text, when one held.
    pub when: Option<Arc<str>>,
    /// The window the load values were averaged over (`queuedPrompts`, `runningPrompts`,
    /// `kvCacheUsage`, in `measures` or in `when`); `None` when the filter read no load.
    pub window: Option<std::time::Duration>,
}

/// A measure of a drop condition and the value that fell in its range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropMeasure {
    /// The measure as policies name it: `queuedPrompts`, `runningPrompts`, `kvCacheUsage`,
    /// `predictedTTFT`.
    pub name: &'static str,
    /// The measured value, in `unit`.
    pub value: f64,
    /// The range of the condition, in `unit`.
    pub range: kinf_lang::compiled::Range,
    /// The unit of the value and the range.
    pub unit: MeasureUnit,
}

/// The unit of a [`DropMeasure`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MeasureUnit {
    /// A number of prompts (an average: it can have a fraction).
    Prompts,
    /// A fraction from 0 to 1, shown as such (`0.95`).
    Ratio,
    /// A fraction from 0 to 1, shown as a percentage (`95%`): the policy wrote the threshold so.
    Percent,
    /// Seconds.
    Seconds,
}

impl MeasureUnit {
    /// The unit's name in the JSON trace: `prompts`, `ratio` (also for [`MeasureUnit::Percent`]:
    /// the values are fractions) or `s`.
    pub fn as_str(self) -> &'static str {
        match self {
            MeasureUnit::Prompts => "prompts",
            MeasureUnit::Ratio | MeasureUnit::Percent => "ratio",
            MeasureUnit::Seconds => "s",
        }
    }

    /// `v` as text in this unit, with at most `decimals` decimals (trailing zeros removed).
    fn text(self, v: f64, decimals: usize) -> String {
        let (v, suffix) = match self {
            MeasureUnit::Prompts | MeasureUnit::Ratio => (v, ""),
            MeasureUnit::Percent => (v * 100.0, "%"),
            MeasureUnit::Seconds => (v, "s"),
        };
        let mut t = format!("{v:.decimals$}");
        if t.contains('.') {
            let kept = t.trim_end_matches('0').trim_end_matches('.').len();
            t.truncate(kept);
        }
        if t == "-0" {
            t = "0".into();
        }
        t.push_str(suffix);
        t
    }
}

impl std::fmt::Display for DropMeasure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Bounds as written (thresholds have few digits; `90%` is 0.9, shown back as `90%`
        // despite 0.9 × 100 not being exactly 90); values rounded, to 3 decimals (1 for a
        // percentage), unless that would show a value equal to a bound it is not equal to.
        let bound = |b: f64| self.unit.text(b, 9);
        let bounds = [self.range.greater_than, self.range.less_than].map(|b| b.map(bound));
        let short = if self.unit == MeasureUnit::Percent {
            1
        } else {
            3
        };
        let mut value = self.unit.text(self.value, short);
        for decimals in short + 1..=15 {
            if !bounds.iter().flatten().any(|b| *b == value) {
                break;
            }
            value = self.unit.text(self.value, decimals);
        }
        write!(f, "{} {value}", self.name)?;
        match bounds {
            [Some(g), Some(l)] => write!(f, " > {g} and < {l}"),
            [Some(g), None] => write!(f, " > {g}"),
            [None, Some(l)] => write!(f, " < {l}"),
            [None, None] => Ok(()),
        }
    }
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
        for m in &self.measures {
            parts.push(m.to_string());
        }
        if let Some(w) = &self.when {
            parts.push(format!("when `{w}` holds"));
        }
        f.write_str(&parts.join(", "))?;
        if let Some(w) = self.window {
            write!(f, "; load averaged over {}s", w.as_secs_f64())?;
        }
        Ok(())
    }
}

impl Serialize for DropReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use kinf_lang::compiled::Range;

    use super::*;

    fn measure(
        name: &'static str,
        value: f64,
        g: Option<f64>,
        l: Option<f64>,
        unit: MeasureUnit,
    ) -> String {
        DropMeasure {
            name,
            value,
            range: Range {
                greater_than: g,
                less_than: l,
            },
            unit,
        }
        .to_string()
    }

    #[test]
    fn drop_measures_read_with_their_units() {
        use MeasureUnit::*;
        assert_eq!(
            measure("predictedTTFT", 2.1044, Some(2.0), None, Seconds),
            "predictedTTFT 2.104s > 2s"
        );
        assert_eq!(
            measure("queuedPrompts", 12.5, Some(8.0), None, Prompts),
            "queuedPrompts 12.5 > 8"
        );
        assert_eq!(
            measure("runningPrompts", 0.25, None, Some(0.5), Prompts),
            "runningPrompts 0.25 < 0.5"
        );
        assert_eq!(
            measure("kvCacheUsage", 0.9512, Some(0.7), Some(0.99), Percent),
            "kvCacheUsage 95.1% > 70% and < 99%"
        );
        assert_eq!(
            measure("kvCacheUsage", 0.9512, Some(0.7), None, Ratio),
            "kvCacheUsage 0.951 > 0.7"
        );
        // Rounding never shows a value equal to a bound it is beyond.
        assert_eq!(
            measure("predictedTTFT", 2.0004, Some(2.0), None, Seconds),
            "predictedTTFT 2.0004s > 2s"
        );
        assert_eq!(
            measure("kvCacheUsage", 0.90004, Some(0.9), None, Percent),
            "kvCacheUsage 90.004% > 90%"
        );
    }

    #[test]
    fn a_drop_reason_names_its_window() {
        let r = DropReason {
            backend: Some(BackendType::Local),
            measures: [DropMeasure {
                name: "queuedPrompts",
                value: 5.0,
                range: Range {
                    greater_than: Some(2.0),
                    less_than: None,
                },
                unit: MeasureUnit::Prompts,
            }]
            .into_iter()
            .collect(),
            window: Some(std::time::Duration::from_secs(30)),
            ..DropReason::default()
        };
        assert_eq!(
            r.to_string(),
            "backend Local, queuedPrompts 5 > 2; load averaged over 30s"
        );
    }
}
