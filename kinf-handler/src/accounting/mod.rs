//! Per-tenant accounting, golden signals, service objectives and capacity counters.
//!
//! Every request is accounted once, by tenant × requested model × destination:
//!
//! * requests passed through to an upstream are accounted by [`account_response`] when the
//!   response is over, however it ended (the gateway calls it from a drop guard, so a client
//!   that goes away or a worker that dies mid-stream is still accounted for what it used);
//! * requests refused before a response started (admission errors, policy rejections,
//!   unreachable or timed-out upstreams) are accounted by [`account_refusal`].
//!
//! Requests without an identified tenant are accounted as [`ANONYMOUS`]. The metric names,
//! labels and definitions are in `docs/reference/metrics.md`; `docs/capacity.md` turns them
//! into a capacity model.

pub mod slo;

use std::sync::Arc;

use kinf_lang::compiled::CostInfo;
use kinf_router::usage::TokenUsage;

use crate::metrics::{
    EndpointLabels, EndpointTokenLabels, GoldenLabels, Metrics, SloLabels, TenantLabels,
    TenantRequestLabels, TenantTokenLabels, TokenLabels,
};
pub use slo::{Slo, SloError, SloMetric, SloProblem, SloSet};

/// The `tenant` label of requests without an identified tenant.
pub const ANONYMOUS: &str = "anonymous";

/// What is known of a request when it is refused: its tenant and requested model once
/// admitted, its destination once routed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Who {
    /// The identified tenant.
    pub tenant: Option<Arc<str>>,
    /// The requested model.
    pub model: Option<Arc<str>>,
    /// The destination (worker set) it was routed to.
    pub destination: Option<Arc<str>>,
    /// The destination's namespace.
    pub destination_namespace: Option<Arc<str>>,
    /// The client asked for a stream (only then does a failure count for `ttft` objectives).
    pub streamed: bool,
}

impl Who {
    /// Notes what admission learned. The model is noted only when a pool of the policy serves
    /// that name (else it is labelled `""`): the `model` label of a refusal must not take
    /// whatever string a client sends, one series per string.
    pub fn admitted(&mut self, a: &crate::gateway::forward::Admitted) {
        let r = &a.request;
        self.tenant = r.tenant.clone();
        let known = a
            .policy
            .pools
            .iter()
            .any(|p| p.models.contains_key(&*r.model));
        self.model = Some(if known {
            r.model.clone()
        } else {
            Arc::from("")
        });
        self.streamed = a.parsed.stream;
    }

    /// Notes the route.
    pub fn routed(&mut self, c: &crate::gateway::forward::Chosen) {
        self.tenant = c.tenant.clone();
        self.model = Some(c.requested_model.clone());
        self.destination = Some(c.destination.clone());
        self.destination_namespace = Some(c.namespace.clone());
    }

    /// A routed request.
    pub fn of(c: &crate::gateway::forward::Chosen) -> Self {
        let mut w = Who::default();
        w.routed(c);
        w
    }
}

/// The tenant label of `tenant`.
pub fn tenant_label(tenant: Option<&str>) -> &str {
    match tenant {
        Some(t) if !t.is_empty() => t,
        _ => ANONYMOUS,
    }
}

/// The status counted for a request whose client went away before its response started
/// (nginx's "client closed request"; nothing is sent).
pub const CLIENT_CLOSED_STATUS: u16 = 499;

/// The code of a request whose client went away before its response started.
pub const CLIENT_CLOSED: &str = "client_closed_request";

/// Codes of [`crate::gateway::forward`]'s `count_request` for requests whose response was
/// passed through (accounted later by [`account_response`]).
const PASSED_THROUGH: [&str; 3] = ["ok", "upstream_status", "routed"];

/// Codes of routed requests that failed through the client's own fault (a provider's 4xx
/// other than 408 and 429, a request the provider's protocol cannot carry): like an upstream's
/// 4xx passed through, they count for no latency objective.
const CLIENT_FAULT: [&str; 2] = ["provider_rejected", "provider_untranslatable"];

/// Codes of requests refused before routing because the service could not serve them (no
/// endpoint or provider with capacity, an `External` classifier down and failing closed): the
/// client asked for nothing wrong, so they count against latency objectives as an upstream's
/// failure does. A fleet that is down then shows as objectives missed, not as no data.
const SERVICE_FAILED: [&str; 2] = ["no_capacity", "classifier_unavailable"];

/// Accounts a request that ended without a response from an upstream: `rejected` when it was
/// not routed (admission or policy), `upstream_error` when it was (the upstream could not be
/// reached or did not answer in time), `incomplete` when the client went away first
/// ([`CLIENT_CLOSED`]). Codes of passed-through responses are ignored (they are accounted by
/// [`account_response`]).
pub fn account_refusal(m: &Metrics, who: &Who, code: &str) {
    if PASSED_THROUGH.contains(&code) {
        return;
    }
    let tenant = tenant_label(who.tenant.as_deref());
    let model = who.model.as_deref().unwrap_or("");
    let client_closed = code == CLIENT_CLOSED;
    let (outcome, destination) = match &who.destination {
        _ if client_closed => ("incomplete", who.destination.as_deref().unwrap_or("")),
        Some(d) => ("upstream_error", &**d),
        None => ("rejected", ""),
    };
    let destination_namespace = if destination.is_empty() {
        ""
    } else {
        who.destination_namespace.as_deref().unwrap_or("")
    };
    m.tenant_requests
        .get_or_create(&TenantRequestLabels {
            tenant: tenant.into(),
            model: model.into(),
            destination: destination.into(),
            destination_namespace: destination_namespace.into(),
            outcome: outcome.into(),
            code: code.into(),
        })
        .inc();
    let upstream_failed =
        who.destination.is_some() && !client_closed && !CLIENT_FAULT.contains(&code);
    let service_failed = who.destination.is_none() && SERVICE_FAILED.contains(&code);
    if upstream_failed || service_failed {
        // The upstream (or the service, before any upstream) failed the request: it counts
        // against latency objectives (`ttft` only for a stream, as for responses: see
        // `account_response`).
        let slos = m.slos();
        let now = m.now_s();
        for s in slos.iter() {
            let counts = match s.metric {
                SloMetric::Ttft => who.streamed,
                SloMetric::E2e => true,
                SloMetric::Itl | SloMetric::Tpot => false,
            };
            if counts && s.matches(tenant, model) {
                count_slo(m, s, tenant, model, false, now);
            }
        }
    }
}

/// One response passed through, as accounted.
#[derive(Clone, Debug, PartialEq)]
pub struct Served<'a> {
    /// The identified tenant.
    pub tenant: Option<&'a str>,
    /// The model the client asked for.
    pub requested_model: &'a str,
    /// The model sent upstream.
    pub upstream_model: &'a str,
    /// Worker set.
    pub destination: &'a str,
    /// Its namespace.
    pub destination_namespace: &'a str,
    /// `host:port`.
    pub endpoint: &'a str,
    /// The destination's prices.
    pub cost: CostInfo,
    /// Upstream HTTP status.
    pub status: u16,
    /// Whether the response ended properly.
    pub completed: bool,
    /// The client went away before the upstream ended (a stream it abandoned): counts for no
    /// latency objective, like a 499.
    pub client_gone: bool,
    /// The client asked for a stream: only then can a first token be seen, so only then does
    /// the request count for `ttft` objectives.
    pub streamed: bool,
    /// Time from receiving the request to the first token (streamed responses).
    pub ttft_s: Option<f64>,
    /// Mean inter-token gap (streamed responses with two tokens or more).
    pub mean_itl_s: Option<f64>,
    /// Time from receiving the request to the end of the response.
    pub duration_s: f64,
    /// The longest choice's share of the output tokens (1 with one choice, 1/n with `n` of
    /// equal length; values outside (0, 1] are taken as 1).
    pub longest_share: f64,
    /// Tokens used (reported, or estimated when `estimated`).
    pub usage: TokenUsage,
    /// The upstream did not report usage: `usage` is the gateway's estimate.
    pub estimated: bool,
}

impl Served<'_> {
    /// Time per output token after the first, of the longest choice: `(e2e − ttft) /
    /// (output × longest_share − 1)`. With `n > 1` the choices decode side by side and `output`
    /// counts all of them; the time after the first token is the longest one's.
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        let share = if self.longest_share > 0.0 && self.longest_share <= 1.0 {
            self.longest_share
        } else {
            1.0
        };
        // A whole number of tokens: the product drifts off it (49 × (2/49) is 1.999…), which
        // would drop a two-token choice (or shift the divisor).
        let per_sequence = (self.usage.output_tokens as f64 * share).round();
        if per_sequence < 2.0 {
            return None;
        }
        Some((self.duration_s - ttft).max(0.0) / (per_sequence - 1.0))
    }

    /// Decode-slot seconds: end-to-end minus time to first token (all of it for responses
    /// without a first-token time).
    pub fn decode_s(&self) -> f64 {
        (self.duration_s - self.ttft_s.unwrap_or(0.0)).max(0.0)
    }
}

/// Estimates what a response used when the upstream did not say: the prompt as the gateway
/// tokenized it (split by the predicted cache hit) and one output token per token-carrying
/// event seen. Responses with an error status used nothing; a request whose client went away
/// while the upstream had it ([`CLIENT_CLOSED_STATUS`]) is estimated like a 2xx.
pub fn estimate_usage(
    status: u16,
    prompt_tokens: u64,
    uncached_prompt_tokens: u64,
    token_events: u64,
) -> TokenUsage {
    if !usage_is_estimated(status) {
        return TokenUsage::default();
    }
    let uncached = uncached_prompt_tokens.min(prompt_tokens);
    TokenUsage {
        cached_prompt_tokens: prompt_tokens - uncached,
        uncached_prompt_tokens: uncached,
        cache_write_prompt_tokens: 0,
        output_tokens: token_events,
    }
}

/// Whether a response with `status` and no reported usage is estimated
/// ([`estimate_usage`]): 2xx responses and requests whose client went away while the upstream
/// had them. Error responses without usage used nothing: they count zero tokens, not an
/// estimate.
pub fn usage_is_estimated(status: u16) -> bool {
    (200..300).contains(&status) || status == CLIENT_CLOSED_STATUS
}

/// Accounts one response passed through: request outcome, tokens and cost per tenant, golden
/// signals, service objectives, per-endpoint work.
pub fn account_response(m: &Metrics, s: &Served<'_>) {
    let tenant = tenant_label(s.tenant);
    let model = s.requested_model;
    let ok = (200..300).contains(&s.status);
    let (outcome, code) = match (ok, s.completed) {
        // The client went away while the upstream had the request: no response was sent.
        _ if s.status == CLIENT_CLOSED_STATUS => ("incomplete", CLIENT_CLOSED.to_string()),
        (false, _) => ("upstream_error", s.status.to_string()),
        (true, true) => ("completed", s.status.to_string()),
        (true, false) => ("incomplete", s.status.to_string()),
    };
    m.tenant_requests
        .get_or_create(&TenantRequestLabels {
            tenant: tenant.into(),
            model: model.into(),
            destination: s.destination.into(),
            destination_namespace: s.destination_namespace.into(),
            outcome: outcome.into(),
            code,
        })
        .inc();
    let tl = TenantLabels {
        tenant: tenant.into(),
        model: model.into(),
        destination: s.destination.into(),
        destination_namespace: s.destination_namespace.into(),
    };
    let u = s.usage;
    for (kind, v) in [
        ("cached_prompt", u.cached_prompt_tokens),
        ("uncached_prompt", u.uncached_prompt_tokens),
        ("output", u.output_tokens),
    ] {
        m.tenant_tokens
            .get_or_create(&TenantTokenLabels {
                tenant: tenant.into(),
                model: model.into(),
                destination: s.destination.into(),
                destination_namespace: s.destination_namespace.into(),
                kind: kind.into(),
            })
            .inc_by(v);
        m.tokens
            .get_or_create(&TokenLabels {
                model: s.upstream_model.into(),
                destination: s.destination.into(),
                destination_namespace: s.destination_namespace.into(),
                kind: kind.into(),
            })
            .inc_by(v);
        m.endpoint_tokens
            .get_or_create(&EndpointTokenLabels {
                destination: s.destination.into(),
                destination_namespace: s.destination_namespace.into(),
                endpoint: s.endpoint.into(),
                kind: kind.into(),
            })
            .inc_by(v);
    }
    m.tenant_cost.get_or_create(&tl).inc_by(u.cost(&s.cost));
    if s.estimated {
        m.tenant_estimated.get_or_create(&tl).inc();
    }
    m.endpoint_request_seconds
        .get_or_create(&EndpointLabels {
            destination: s.destination.into(),
            destination_namespace: s.destination_namespace.into(),
            endpoint: s.endpoint.into(),
        })
        .inc_by(s.duration_s.max(0.0));
    let tpot = s.tpot_s();
    if ok {
        let decode = s.decode_s();
        if let Some(t) = s.ttft_s {
            m.tenant_prefill_seconds
                .get_or_create(&tl)
                .inc_by(t.max(0.0));
        }
        m.tenant_decode_seconds.get_or_create(&tl).inc_by(decode);
        let kv = (u.prompt_tokens() as f64 + u.output_tokens as f64 / 2.0) * decode;
        m.tenant_kv_token_seconds.get_or_create(&tl).inc_by(kv);

        let gl = GoldenLabels {
            tenant: tenant.into(),
            model: model.into(),
        };
        if let Some(t) = s.ttft_s {
            m.ttft.get_or_create(&gl).observe(t);
        }
        if let Some(t) = s.mean_itl_s {
            m.itl.get_or_create(&gl).observe(t);
        }
        // A response cut short (the upstream or the connection failed after the headers) ended
        // early: its duration, and the per-token time derived from it, are not the latency of
        // a response, and would pull both distributions down.
        if s.completed {
            if let Some(t) = tpot {
                m.tpot.get_or_create(&gl).observe(t);
            }
            m.e2e.get_or_create(&gl).observe(s.duration_s);
        }
    }
    let slos = m.slos();
    if slos.is_empty() {
        return;
    }
    // The client's own errors say nothing of the service's latency: an upstream 4xx for the
    // request itself (a prompt over the context length, a bad parameter), and a request the
    // client abandoned. A 408 or 429 is the service's (too slow, or full) and counts.
    if s.client_gone || (400..500).contains(&s.status) && !matches!(s.status, 408 | 429) {
        return;
    }
    let now = m.now_s();
    for o in slos.iter().filter(|o| o.matches(tenant, model)) {
        let good = |v: f64| v <= o.threshold_s;
        let verdict = match o.metric {
            SloMetric::Ttft => match s.ttft_s {
                // A non-streamed request has no first-token time, however it ended: counting
                // only its failures would bias attainment low. A `Report` may still give it
                // one (the time to its whole body, which is no TTFT): not counted either.
                _ if !s.streamed => None,
                Some(t) => Some(ok && good(t)),
                // A stream that completed without a token.
                None if ok && s.completed => None,
                None => Some(false),
            },
            SloMetric::Itl => s.mean_itl_s.map(|t| ok && good(t)),
            SloMetric::Tpot => tpot.map(|t| ok && s.completed && good(t)),
            SloMetric::E2e => Some(ok && s.completed && good(s.duration_s)),
        };
        if let Some(g) = verdict {
            count_slo(m, o, tenant, model, g, now);
        }
    }
}

fn count_slo(m: &Metrics, o: &Slo, tenant: &str, model: &str, good: bool, now: f64) {
    let l = SloLabels {
        slo: o.name.clone(),
        tenant: tenant.into(),
        model: model.into(),
    };
    m.slo_requests.get_or_create(&l).inc();
    if good {
        m.slo_good.get_or_create(&l).inc();
    } else {
        // Make the good counter exist (at 0) so that good / requests is defined.
        let _ = m.slo_good.get_or_create(&l);
    }
    m.slo_rolling
        .lock()
        .entry(o.name.clone())
        .or_default()
        .add(now, good);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn served(ttft: Option<f64>, out: u64, dur: f64) -> Served<'static> {
        Served {
            tenant: Some("acme"),
            requested_model: "small",
            upstream_model: "tiny-llama",
            destination: "tiny",
            destination_namespace: "test",
            endpoint: "127.0.0.1:1",
            cost: CostInfo {
                uncached_prompt: 1.0,
                cached_prompt: 0.1,
                output: 2.0,
                priced: true,
            },
            status: 200,
            completed: true,
            client_gone: false,
            streamed: true,
            ttft_s: ttft,
            mean_itl_s: ttft.map(|_| 0.02),
            duration_s: dur,
            longest_share: 1.0,
            usage: TokenUsage {
                cached_prompt_tokens: 100,
                uncached_prompt_tokens: 900,
                cache_write_prompt_tokens: 0,
                output_tokens: out,
            },
            estimated: false,
        }
    }

    #[test]
    fn tpot_and_decode() {
        let s = served(Some(0.5), 11, 1.5);
        assert!((s.tpot_s().unwrap() - 0.1).abs() < 1e-12);
        assert!((s.decode_s() - 1.0).abs() < 1e-12);
        assert_eq!(served(Some(0.5), 1, 1.5).tpot_s(), None);
        // `n: 2`: 22 output tokens are 11 per choice, decoded side by side.
        let two = Served {
            longest_share: 0.5,
            ..served(Some(0.5), 22, 1.5)
        };
        assert!((two.tpot_s().unwrap() - 0.1).abs() < 1e-12);
        // Choices of 11 and 2 tokens: the time is the longer one's.
        let uneven = Served {
            longest_share: 11.0 / 13.0,
            ..served(Some(0.5), 13, 1.5)
        };
        assert!((uneven.tpot_s().unwrap() - 0.1).abs() < 1e-9);
        // Two choices of one token each: no gap.
        let short = Served {
            longest_share: 0.5,
            ..served(Some(0.5), 2, 1.5)
        };
        assert_eq!(short.tpot_s(), None);
        // The longest choice has a whole number of tokens, however the share rounds: 2 of 49.
        let drift = Served {
            longest_share: 2.0 / 49.0,
            ..served(Some(0.5), 49, 1.5)
        };
        assert_eq!(drift.tpot_s(), Some(1.0));
        // Unknown (0): one choice.
        let unknown = Served {
            longest_share: 0.0,
            ..served(Some(0.5), 11, 1.5)
        };
        assert!((unknown.tpot_s().unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(served(None, 5, 1.5).decode_s(), 1.5);
    }

    #[test]
    fn the_clients_own_errors_do_not_count_against_latency_objectives() {
        let m = Metrics::new();
        m.set_slos(
            SloSet::from_yaml(
                "- {name: fast, metric: ttft, quantile: 0.9, threshold: 1s}\n- {name: whole, metric: e2e, quantile: 0.9, threshold: 5s}\n",
            )
            .unwrap(),
        );
        let with_status = |status: u16| Served {
            status,
            completed: false,
            ttft_s: None,
            mean_itl_s: None,
            ..served(None, 0, 0.01)
        };
        // A prompt over the context length (vLLM's 400), a missing model, an abandoned request.
        for status in [400, 404, 422, CLIENT_CLOSED_STATUS] {
            account_response(&m, &with_status(status));
        }
        // A stream the client abandoned half way (the upstream had answered 200).
        account_response(
            &m,
            &Served {
                client_gone: true,
                ..with_status(200)
            },
        );
        let count = |name: &str, slo: &'static str| {
            m.value(
                name,
                &[("slo", slo), ("tenant", "acme"), ("model", "small")],
            )
        };
        assert_eq!(count("kinference_slo_requests_total", "fast"), None);
        assert_eq!(count("kinference_slo_requests_total", "whole"), None);
        // A timeout, a full upstream and a server error are the service's: bad.
        for status in [408, 429, 500, 502] {
            account_response(&m, &with_status(status));
        }
        for slo in ["fast", "whole"] {
            assert_eq!(
                count("kinference_slo_requests_total", slo),
                Some(4.0),
                "{slo}"
            );
            assert_eq!(count("kinference_slo_good_total", slo), Some(0.0), "{slo}");
        }
        // A non-streamed request has no first-token time: it counts for `e2e` only, whether
        // it failed or not.
        for status in [200, 502] {
            account_response(
                &m,
                &Served {
                    streamed: false,
                    completed: status == 200,
                    ..with_status(status)
                },
            );
        }
        assert_eq!(count("kinference_slo_requests_total", "fast"), Some(4.0));
        assert_eq!(count("kinference_slo_requests_total", "whole"), Some(6.0));
    }

    #[test]
    fn refusals_count_against_objectives_as_responses_do() {
        let m = Metrics::new();
        m.set_slos(
            SloSet::from_yaml(
                "- {name: fast, metric: ttft, quantile: 0.9, threshold: 1s}\n- {name: whole, metric: e2e, quantile: 0.9, threshold: 5s}\n",
            )
            .unwrap(),
        );
        let who = |streamed: bool| Who {
            tenant: Some("acme".into()),
            model: Some("small".into()),
            destination: Some("tiny".into()),
            destination_namespace: Some("test".into()),
            streamed,
        };
        let count = |slo: &'static str| {
            m.value(
                "kinference_slo_requests_total",
                &[("slo", slo), ("tenant", "acme"), ("model", "small")],
            )
        };
        // The client's own fault, from a provider: no objective.
        account_refusal(&m, &who(true), "provider_rejected");
        account_refusal(&m, &who(true), "provider_untranslatable");
        assert_eq!((count("fast"), count("whole")), (None, None));
        // An unreachable upstream: a non-streamed request counts for `e2e` only.
        account_refusal(&m, &who(false), "upstream_unreachable");
        assert_eq!((count("fast"), count("whole")), (None, Some(1.0)));
        account_refusal(&m, &who(true), "upstream_timeout");
        assert_eq!((count("fast"), count("whole")), (Some(1.0), Some(2.0)));
        // Not routed: the policy's own refusals and the client's errors count for nothing;
        // no capacity anywhere (a fleet down) and a classifier failing closed count as missed.
        let unrouted = |streamed: bool| Who {
            destination: None,
            destination_namespace: None,
            ..who(streamed)
        };
        for code in [
            "pii_blocked",
            "rate_limit_exceeded",
            "model_not_found",
            "invalid_request",
        ] {
            account_refusal(&m, &unrouted(true), code);
        }
        assert_eq!((count("fast"), count("whole")), (Some(1.0), Some(2.0)));
        account_refusal(&m, &unrouted(true), "no_capacity");
        account_refusal(&m, &unrouted(false), "classifier_unavailable");
        assert_eq!((count("fast"), count("whole")), (Some(2.0), Some(4.0)));
        let good = |slo: &'static str| {
            m.value(
                "kinference_slo_good_total",
                &[("slo", slo), ("tenant", "acme"), ("model", "small")],
            )
        };
        assert_eq!((good("fast"), good("whole")), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn worker_sets_of_the_same_name_in_two_namespaces_are_counted_apart() {
        let m = Metrics::new();
        account_response(&m, &served(Some(0.5), 11, 1.5));
        account_response(
            &m,
            &Served {
                destination_namespace: "other",
                ..served(Some(0.5), 7, 1.5)
            },
        );
        let output = |ns: &'static str| {
            m.value(
                "kinference_tenant_tokens_total",
                &[
                    ("tenant", "acme"),
                    ("model", "small"),
                    ("destination", "tiny"),
                    ("destination_namespace", ns),
                    ("kind", "output"),
                ],
            )
        };
        assert_eq!((output("test"), output("other")), (Some(11.0), Some(7.0)));
        let requests = |ns: &'static str| {
            m.value(
                "kinference_endpoint_request_seconds_total",
                &[
                    ("destination", "tiny"),
                    ("destination_namespace", ns),
                    ("endpoint", "127.0.0.1:1"),
                ],
            )
        };
        assert_eq!(
            (requests("test"), requests("other")),
            (Some(1.5), Some(1.5))
        );
    }

    #[test]
    fn responses_are_accounted_per_tenant() {
        let m = Metrics::new();
        m.set_slos(
            SloSet::from_yaml(
                "- {name: fast, metric: ttft, quantile: 0.9, threshold: 1s}\n- {name: other, tenant: 'x-*', metric: e2e, quantile: 0.9, threshold: 1s}\n",
            )
            .unwrap(),
        );
        account_response(&m, &served(Some(0.5), 11, 1.5));
        account_response(&m, &served(Some(2.0), 11, 3.0));
        let t = [
            ("tenant", "acme"),
            ("model", "small"),
            ("destination", "tiny"),
            ("destination_namespace", "test"),
        ];
        let v = |n: &str, extra: &[(&'static str, &'static str)]| {
            let mut l = t.to_vec();
            l.extend_from_slice(extra);
            m.value(n, &l)
        };
        assert_eq!(
            v(
                "kinference_tenant_requests_total",
                &[("outcome", "completed"), ("code", "200")]
            ),
            Some(2.0)
        );
        assert_eq!(
            v(
                "kinference_tenant_tokens_total",
                &[("kind", "uncached_prompt")]
            ),
            Some(1800.0)
        );
        let cost = v("kinference_tenant_cost_usd_total", &[]).unwrap();
        assert!(
            (cost - 2.0 * (900.0 + 10.0 + 22.0) / 1e6).abs() < 1e-12,
            "{cost}"
        );
        let slo = [("slo", "fast"), ("tenant", "acme"), ("model", "small")];
        assert_eq!(m.value("kinference_slo_requests_total", &slo), Some(2.0));
        assert_eq!(m.value("kinference_slo_good_total", &slo), Some(1.0));
        assert_eq!(
            m.value(
                "kinference_slo_attainment_5m",
                &[("slo", "fast"), ("metric", "ttft")]
            ),
            Some(0.5)
        );
        assert_eq!(
            m.value(
                "kinference_slo_requests_total",
                &[("slo", "other"), ("tenant", "acme"), ("model", "small")]
            ),
            None
        );
        assert_eq!(
            m.value(
                "kinference_ttft_seconds_count",
                &[("tenant", "acme"), ("model", "small")]
            ),
            Some(2.0)
        );
    }

    #[test]
    fn refusals_are_accounted() {
        let m = Metrics::new();
        let mut who = Who::default();
        account_refusal(&m, &who, "invalid_request");
        who.model = Some("small".into());
        account_refusal(&m, &who, "ok");
        who.destination = Some("tiny".into());
        who.destination_namespace = Some("test".into());
        account_refusal(&m, &who, "upstream_timeout");
        assert_eq!(
            m.value(
                "kinference_tenant_requests_total",
                &[
                    ("tenant", "anonymous"),
                    ("model", ""),
                    ("destination", ""),
                    ("destination_namespace", ""),
                    ("outcome", "rejected"),
                    ("code", "invalid_request")
                ]
            ),
            Some(1.0)
        );
        assert_eq!(
            m.value(
                "kinference_tenant_requests_total",
                &[
                    ("tenant", "anonymous"),
                    ("model", "small"),
                    ("destination", "tiny"),
                    ("destination_namespace", "test"),
                    ("outcome", "upstream_error"),
                    ("code", "upstream_timeout")
                ]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn estimates() {
        let u = estimate_usage(200, 100, 30, 7);
        assert_eq!(
            (
                u.cached_prompt_tokens,
                u.uncached_prompt_tokens,
                u.output_tokens
            ),
            (70, 30, 7)
        );
        assert_eq!(estimate_usage(500, 100, 30, 7), TokenUsage::default());
        // A client gone while the upstream had the request: estimated like a 2xx.
        assert_eq!(
            estimate_usage(CLIENT_CLOSED_STATUS, 100, 30, 0).prompt_tokens(),
            100
        );
        assert!(!usage_is_estimated(400));
    }

    #[test]
    fn a_client_gone_before_routing_is_incomplete_not_rejected() {
        let m = Metrics::new();
        let who = Who {
            model: Some("small".into()),
            ..Who::default()
        };
        account_refusal(&m, &who, CLIENT_CLOSED);
        assert_eq!(
            m.value(
                "kinference_tenant_requests_total",
                &[
                    ("tenant", "anonymous"),
                    ("model", "small"),
                    ("destination", ""),
                    ("destination_namespace", ""),
                    ("outcome", "incomplete"),
                    ("code", CLIENT_CLOSED)
                ]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn a_response_cut_short_is_not_a_latency_sample_but_fails_whole_response_objectives() {
        let m = Metrics::new();
        m.set_slos(
            SloSet::from_yaml(
                "- {name: fast, metric: ttft, quantile: 0.9, threshold: 1s}\n- {name: steady, metric: tpot, quantile: 0.9, threshold: 1s}\n- {name: whole, metric: e2e, quantile: 0.9, threshold: 5s}\n",
            )
            .unwrap(),
        );
        // 200 and a first token, then the upstream died after 5 of 50 tokens: 0.4 s in all.
        account_response(
            &m,
            &Served {
                completed: false,
                ..served(Some(0.2), 5, 0.4)
            },
        );
        let gl = [("tenant", "acme"), ("model", "small")];
        assert_eq!(m.value("kinference_ttft_seconds_count", &gl), Some(1.0));
        assert_eq!(m.value("kinference_e2e_latency_seconds_count", &gl), None);
        assert_eq!(m.value("kinference_tpot_seconds_count", &gl), None);
        let slo = |name: &str, counter: &str| {
            m.value(
                counter,
                &[("slo", name), ("tenant", "acme"), ("model", "small")],
            )
        };
        let (requests, good) = ("kinference_slo_requests_total", "kinference_slo_good_total");
        assert_eq!(slo("fast", good), Some(1.0), "its first token came in time");
        for name in ["steady", "whole"] {
            assert_eq!(slo(name, requests), Some(1.0), "{name}");
            assert_eq!(slo(name, good), Some(0.0), "{name}");
        }

        // The same response completed is a sample of each.
        account_response(&m, &served(Some(0.2), 5, 0.4));
        assert_eq!(
            m.value("kinference_e2e_latency_seconds_count", &gl),
            Some(1.0)
        );
        assert_eq!(m.value("kinference_tpot_seconds_count", &gl), Some(1.0));
        assert_eq!(slo("whole", good), Some(1.0));
        assert_eq!(slo("steady", good), Some(1.0));
    }
}
