//! The gateway's own Prometheus metrics (`kinference_*`), kept in a `prometheus-client`
//! registry of typed families and rendered in the Prometheus text exposition format
//! (version 0.0.4, so that the live-ingestion text can be appended after it).
//!
//! Every family is a field of [`Metrics`]; callers use the typed methods below, the request
//! accounting in [`crate::accounting`] updates the per-tenant families directly. Every name,
//! type and label is documented in `docs/reference/metrics.md`.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::accounting::slo::{Rolling, SloSet};

/// Bucket bounds (seconds) for the gateway's internal latency histograms: decision time to
/// end-to-end time.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
];

/// Bucket bounds (seconds) for a request's whole time in the gateway: a refusal takes
/// microseconds, a long generation minutes (up to the 600 s default `--upstream-timeout`).
pub const REQUEST_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 120.0, 180.0, 300.0, 600.0,
];

/// Bucket bounds (seconds) for time to first token.
pub const TTFT_BUCKETS: &[f64] = &[
    0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
    60.0,
];

/// Bucket bounds (seconds) for inter-token latency and time per output token.
pub const TOKEN_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
];

/// Bucket bounds (seconds) for end-to-end latency.
pub const E2E_BUCKETS: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0,
    180.0, 300.0, 600.0,
];

/// An `f64` counter.
pub type FCounter = Counter<f64, std::sync::atomic::AtomicU64>;
/// An `f64` gauge.
pub type FGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Builds histograms with fixed buckets.
#[derive(Clone, Copy, Debug)]
pub struct Buckets(pub &'static [f64]);

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

/// A histogram family with fixed buckets.
pub type HistFamily<L> = Family<L, Histogram, Buckets>;

macro_rules! label_set {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
        pub struct $name {
            $($(#[$fm])* pub $field: String,)*
        }
    };
}

label_set!(
    /// `api`, `status`, `code`.
    RequestLabels { /** API. */ api, /** Status sent. */ status, /** Code. */ code }
);
label_set!(
    /// `rule`, `destination`, `destination_namespace`.
    DecisionLabels { /** Deciding rule. */ rule, /** Worker set. */ destination, /** Its namespace. */ destination_namespace }
);
label_set!(
    /// `destination`, `destination_namespace`, `endpoint`.
    EndpointLabels { /** Worker set. */ destination, /** Its namespace. */ destination_namespace, /** `host:port`. */ endpoint }
);
label_set!(
    /// `destination`, `destination_namespace`.
    DestinationLabels { /** Worker set. */ destination, /** Its namespace. */ destination_namespace }
);
label_set!(
    /// `api`.
    ApiLabels { /** API. */ api }
);
label_set!(
    /// `model`.
    ModelLabels { /** Requested model. */ model }
);
label_set!(
    /// `model`, `destination`, `destination_namespace`, `kind`.
    TokenLabels { /** Model sent upstream. */ model, /** Worker set. */ destination, /** Its namespace. */ destination_namespace, /** Token kind. */ kind }
);
label_set!(
    /// `destination`, `destination_namespace`, `status`, `outcome`.
    ResponseLabels { /** Worker set. */ destination, /** Its namespace. */ destination_namespace, /** Upstream status. */ status, /** Outcome. */ outcome }
);
label_set!(
    /// `endpoint`.
    RetryLabels { /** `host:port`. */ endpoint }
);
label_set!(
    /// `result`.
    ResultLabels { /** Result. */ result }
);
label_set!(
    /// `tenant`, `model`, `destination`, `destination_namespace`, `outcome`, `code`.
    TenantRequestLabels {
        /** Tenant. */ tenant, /** Requested model. */ model, /** Worker set. */ destination,
        /** Its namespace. */ destination_namespace, /** Outcome. */ outcome, /** Code. */ code
    }
);
label_set!(
    /// `tenant`, `model`, `destination`, `destination_namespace`, `kind`.
    TenantTokenLabels {
        /** Tenant. */ tenant, /** Requested model. */ model, /** Worker set. */ destination,
        /** Its namespace. */ destination_namespace, /** Token kind. */ kind
    }
);
label_set!(
    /// `tenant`, `model`, `destination`, `destination_namespace`.
    TenantLabels {
        /** Tenant. */ tenant, /** Requested model. */ model, /** Worker set. */ destination,
        /** Its namespace. */ destination_namespace
    }
);
label_set!(
    /// `tenant`, `model`.
    GoldenLabels { /** Tenant. */ tenant, /** Requested model. */ model }
);
label_set!(
    /// `slo`, `tenant`, `model`.
    SloLabels { /** SLO name. */ slo, /** Tenant. */ tenant, /** Requested model. */ model }
);
label_set!(
    /// `slo`, `metric`.
    SloInfoLabels { /** SLO name. */ slo, /** Measured metric. */ metric }
);
label_set!(
    /// `destination`, `destination_namespace`, `endpoint`, `kind`.
    EndpointTokenLabels { /** Worker set. */ destination, /** Its namespace. */ destination_namespace, /** `host:port`. */ endpoint, /** Token kind. */ kind }
);
label_set!(
    /// `worker_set`, `endpoint` (the live-ingestion metrics' labels).
    WorkerEndpointLabels { /** `namespace/name`. */ worker_set, /** `host:port`. */ endpoint }
);
label_set!(
    /// `classifier`.
    ClassifierLabels { /** `namespace/gateway/name`. */ classifier }
);
label_set!(
    /// `classifier`, `mode`.
    ClassifierFailureLabels { /** `namespace/gateway/name`. */ classifier, /** Failure mode applied. */ mode }
);

/// The registry and every family.
pub struct Metrics {
    registry: Registry,
    epoch: Instant,
    pub(crate) requests: Family<RequestLabels, Counter>,
    pub(crate) decisions: Family<DecisionLabels, Counter>,
    pub(crate) decision_seconds: Histogram,
    pub(crate) upstream_ttft: HistFamily<EndpointLabels>,
    pub(crate) upstream_itl: HistFamily<EndpointLabels>,
    pub(crate) ttft_prediction_error: HistFamily<DestinationLabels>,
    pub(crate) request_duration: HistFamily<ApiLabels>,
    pub(crate) tokens: Family<TokenLabels, Counter>,
    pub(crate) responses: Family<ResponseLabels, Counter>,
    pub(crate) retries: Family<RetryLabels, Counter>,
    pub(crate) policy_reloads: Family<ResultLabels, Counter>,
    pub(crate) policy_generation: FGauge,
    pub(crate) policy_refused: FGauge,
    pub(crate) policy_refused_namespaces: FGauge,
    // Per-tenant accounting.
    pub(crate) tenant_requests: Family<TenantRequestLabels, Counter>,
    pub(crate) tenant_tokens: Family<TenantTokenLabels, Counter>,
    pub(crate) tenant_cost: Family<TenantLabels, FCounter>,
    pub(crate) tenant_estimated: Family<TenantLabels, Counter>,
    pub(crate) tenant_prefill_seconds: Family<TenantLabels, FCounter>,
    pub(crate) tenant_decode_seconds: Family<TenantLabels, FCounter>,
    pub(crate) tenant_kv_token_seconds: Family<TenantLabels, FCounter>,
    // Golden signals.
    pub(crate) ttft: HistFamily<GoldenLabels>,
    pub(crate) itl: HistFamily<GoldenLabels>,
    pub(crate) tpot: HistFamily<GoldenLabels>,
    pub(crate) e2e: HistFamily<GoldenLabels>,
    // Service objectives.
    pub(crate) slo_requests: Family<SloLabels, Counter>,
    pub(crate) slo_good: Family<SloLabels, Counter>,
    pub(crate) slo_objective: Family<SloInfoLabels, FGauge>,
    pub(crate) slo_threshold: Family<SloInfoLabels, FGauge>,
    pub(crate) slo_attainment: Family<SloInfoLabels, FGauge>,
    pub(crate) slos: RwLock<Arc<SloSet>>,
    pub(crate) slo_rolling: Mutex<ahash::AHashMap<String, Rolling>>,
    // Capacity.
    pub(crate) endpoint_tokens: Family<EndpointTokenLabels, Counter>,
    pub(crate) endpoint_request_seconds: Family<EndpointLabels, FCounter>,
    pub(crate) endpoint_kv_usage: Family<WorkerEndpointLabels, FGauge>,
    pub(crate) endpoint_queued: Family<WorkerEndpointLabels, FGauge>,
    pub(crate) endpoint_running: Family<WorkerEndpointLabels, FGauge>,
    pub(crate) endpoint_load_age: Family<WorkerEndpointLabels, FGauge>,
    pub(crate) endpoint_routable: Family<WorkerEndpointLabels, FGauge>,
    pub(crate) output_tokens_estimate: Family<ModelLabels, FGauge>,
    pub(crate) classifier_seconds: HistFamily<ClassifierLabels>,
    pub(crate) classifier_failures: Family<ClassifierFailureLabels, Counter>,
    pub(crate) classifier_undeclared_tags: Family<ClassifierLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn hist<L: EncodeLabelSet + Clone + std::hash::Hash + Eq>(b: &'static [f64]) -> HistFamily<L> {
    Family::new_with_constructor(Buckets(b))
}

impl Metrics {
    /// A registry with every family registered (and no samples).
    pub fn new() -> Self {
        let mut m = Metrics {
            registry: Registry::default(),
            epoch: Instant::now(),
            requests: Family::default(),
            decisions: Family::default(),
            decision_seconds: Histogram::new(LATENCY_BUCKETS.iter().copied()),
            upstream_ttft: hist(LATENCY_BUCKETS),
            upstream_itl: hist(LATENCY_BUCKETS),
            ttft_prediction_error: hist(LATENCY_BUCKETS),
            request_duration: hist(REQUEST_BUCKETS),
            tokens: Family::default(),
            responses: Family::default(),
            retries: Family::default(),
            policy_reloads: Family::default(),
            policy_generation: FGauge::default(),
            policy_refused: FGauge::default(),
            policy_refused_namespaces: FGauge::default(),
            tenant_requests: Family::default(),
            tenant_tokens: Family::default(),
            tenant_cost: Family::default(),
            tenant_estimated: Family::default(),
            tenant_prefill_seconds: Family::default(),
            tenant_decode_seconds: Family::default(),
            tenant_kv_token_seconds: Family::default(),
            ttft: hist(TTFT_BUCKETS),
            itl: hist(TOKEN_BUCKETS),
            tpot: hist(TOKEN_BUCKETS),
            e2e: hist(E2E_BUCKETS),
            slo_requests: Family::default(),
            slo_good: Family::default(),
            slo_objective: Family::default(),
            slo_threshold: Family::default(),
            slo_attainment: Family::default(),
            slos: RwLock::new(Arc::new(SloSet::default())),
            slo_rolling: Mutex::new(ahash::AHashMap::new()),
            endpoint_tokens: Family::default(),
            endpoint_request_seconds: Family::default(),
            endpoint_kv_usage: Family::default(),
            endpoint_queued: Family::default(),
            endpoint_running: Family::default(),
            endpoint_load_age: Family::default(),
            endpoint_routable: Family::default(),
            output_tokens_estimate: Family::default(),
            classifier_seconds: hist(LATENCY_BUCKETS),
            classifier_failures: Family::default(),
            classifier_undeclared_tags: Family::default(),
        };
        m.register_all();
        m
    }

    fn register_all(&mut self) {
        // Counters are registered without `_total` (the encoder appends it), help texts without
        // their final period (the encoder appends one).
        let r = &mut self.registry;
        r.register(
            "kinference_requests",
            "Requests received, by API, status sent to the client and code",
            self.requests.clone(),
        );
        r.register(
            "kinference_decisions",
            "Routing decisions, by deciding rule (`namespace/policy/rule` or `default`) and destination",
            self.decisions.clone(),
        );
        r.register(
            "kinference_decision_seconds",
            "Time to decide a request (tokenization excluded)",
            self.decision_seconds.clone(),
        );
        r.register(
            "kinference_upstream_ttft_seconds",
            "Time from forwarding a request to its first token, per endpoint",
            self.upstream_ttft.clone(),
        );
        r.register(
            "kinference_upstream_itl_seconds",
            "Mean inter-token gap of streamed responses, per endpoint",
            self.upstream_itl.clone(),
        );
        r.register(
            "kinference_ttft_prediction_error_seconds",
            "|observed - predicted| TTFT of routed requests",
            self.ttft_prediction_error.clone(),
        );
        r.register(
            "kinference_request_duration_seconds",
            "Time from receiving a request to the end of its response, by API",
            self.request_duration.clone(),
        );
        r.register(
            "kinference_tokens",
            "Tokens reported by upstreams, by model sent upstream, destination and kind",
            self.tokens.clone(),
        );
        r.register(
            "kinference_responses",
            "Responses passed through, by destination, upstream status and whether they completed",
            self.responses.clone(),
        );
        r.register(
            "kinference_upstream_retries",
            "Requests retried on another endpoint after a connection failure",
            self.retries.clone(),
        );
        r.register(
            "kinference_policy_reloads",
            "Policy bundles read, by result (applied, unchanged, refused, partly_applied)",
            self.policy_reloads.clone(),
        );
        r.register(
            "kinference_policy_generation",
            "Generation of the policy in force",
            self.policy_generation.clone(),
        );
        r.register(
            "kinference_policy_refused",
            "1 when the newest bundle was refused, as a whole or in some namespaces (what was refused keeps the last good policy)",
            self.policy_refused.clone(),
        );
        r.register(
            "kinference_policy_refused_namespaces",
            "Kubernetes mode: namespaces whose objects in the newest bundle were refused while every other namespace's were applied",
            self.policy_refused_namespaces.clone(),
        );
        r.register(
            "kinference_tenant_requests",
            "Requests per tenant, requested model and destination, by outcome (completed, incomplete, upstream_error, rejected) and code",
            self.tenant_requests.clone(),
        );
        r.register(
            "kinference_tenant_tokens",
            "Tokens used per tenant, requested model and destination; kind is cached_prompt, uncached_prompt or output",
            self.tenant_tokens.clone(),
        );
        r.register(
            "kinference_tenant_cost_usd",
            "Cost in US dollars at the destination's prices, per tenant, requested model and destination",
            self.tenant_cost.clone(),
        );
        r.register(
            "kinference_tenant_usage_estimated",
            "Responses whose usage the upstream did not report (cut short): tokens were estimated by the gateway",
            self.tenant_estimated.clone(),
        );
        r.register(
            "kinference_tenant_prefill_seconds",
            "Sum of time to first token of streamed responses (prefill plus queueing), per tenant",
            self.tenant_prefill_seconds.clone(),
        );
        r.register(
            "kinference_tenant_decode_seconds",
            "Sum of decode time (end-to-end minus time to first token), per tenant: decode-slot seconds",
            self.tenant_decode_seconds.clone(),
        );
        r.register(
            "kinference_tenant_kv_token_seconds",
            "Sum of (prompt tokens + output tokens / 2) x decode seconds: KV-cache occupancy, per tenant",
            self.tenant_kv_token_seconds.clone(),
        );
        r.register(
            "kinference_ttft_seconds",
            "Time from receiving a request to its first token (streamed responses), per tenant and requested model",
            self.ttft.clone(),
        );
        r.register(
            "kinference_itl_seconds",
            "Mean inter-token latency of a streamed response, per tenant and requested model",
            self.itl.clone(),
        );
        r.register(
            "kinference_tpot_seconds",
            "Time per output token after the first: (e2e - ttft) / (output tokens - 1), per tenant and requested model",
            self.tpot.clone(),
        );
        r.register(
            "kinference_e2e_latency_seconds",
            "Time from receiving a request to the end of its response, per tenant and requested model",
            self.e2e.clone(),
        );
        r.register(
            "kinference_slo_requests",
            "Requests measured against a service objective",
            self.slo_requests.clone(),
        );
        r.register(
            "kinference_slo_good",
            "Requests that met a service objective's threshold",
            self.slo_good.clone(),
        );
        r.register(
            "kinference_slo_objective",
            "Target fraction of good requests of a service objective (its quantile)",
            self.slo_objective.clone(),
        );
        r.register(
            "kinference_slo_threshold_seconds",
            "Threshold of a service objective",
            self.slo_threshold.clone(),
        );
        r.register(
            "kinference_slo_attainment_5m",
            "Fraction of good requests of a service objective over the last 5 minutes (absent when none)",
            self.slo_attainment.clone(),
        );
        r.register(
            "kinference_endpoint_tokens",
            "Tokens processed per endpoint; kind is cached_prompt, uncached_prompt or output",
            self.endpoint_tokens.clone(),
        );
        r.register(
            "kinference_endpoint_request_seconds",
            "Sum of end-to-end durations of responses served by an endpoint (its rate is the mean number in flight)",
            self.endpoint_request_seconds.clone(),
        );
        r.register(
            "kinference_endpoint_kv_usage_ratio",
            "Newest vllm:kv_cache_usage_perc sample of the endpoint (0..1)",
            self.endpoint_kv_usage.clone(),
        );
        r.register(
            "kinference_endpoint_queued_requests",
            "Newest vllm:num_requests_waiting sample of the endpoint",
            self.endpoint_queued.clone(),
        );
        r.register(
            "kinference_endpoint_running_requests",
            "Newest vllm:num_requests_running sample of the endpoint",
            self.endpoint_running.clone(),
        );
        r.register(
            "kinference_endpoint_load_age_seconds",
            "Age of the endpoint's newest load sample",
            self.endpoint_load_age.clone(),
        );
        r.register(
            "kinference_endpoint_routable",
            "1 when the endpoint is ready and its metrics are fresh",
            self.endpoint_routable.clone(),
        );
        r.register(
            "kinference_output_tokens_estimate",
            "Output tokens per sequence expected of a request without max_tokens, learned from the model's answers",
            self.output_tokens_estimate.clone(),
        );
        r.register(
            "kinference_classifier_seconds",
            "Time an External classifier took to answer or fail, per classifier",
            self.classifier_seconds.clone(),
        );
        r.register(
            "kinference_classifier_failures",
            "External classifier failures (timeout, connection error, non-2xx, bad body), by classifier and failure mode",
            self.classifier_failures.clone(),
        );
        r.register(
            "kinference_classifier_undeclared_tags",
            "Tags an External classifier returned that its spec does not declare (dropped)",
            self.classifier_undeclared_tags.clone(),
        );
    }

    /// Seconds since this registry was created (for rolling windows).
    pub(crate) fn now_s(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// Counts a request in `kinference_requests_total`.
    pub fn count_request(&self, api: &str, status: u16, code: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                api: api.into(),
                status: status.to_string(),
                code: code.into(),
            })
            .inc();
    }

    /// Counts a routing decision to `destination` of namespace `destination_namespace`.
    pub fn decision(&self, rule: &str, destination: &str, destination_namespace: &str) {
        self.decisions
            .get_or_create(&DecisionLabels {
                rule: rule.into(),
                destination: destination.into(),
                destination_namespace: destination_namespace.into(),
            })
            .inc();
    }

    /// Observes the time a decision took.
    pub fn observe_decision_seconds(&self, v: f64) {
        self.decision_seconds.observe(v);
    }

    /// Observes the time an `External` classifier took (answer or failure).
    pub fn observe_classifier_seconds(&self, classifier: &str, v: f64) {
        self.classifier_seconds
            .get_or_create(&ClassifierLabels {
                classifier: classifier.into(),
            })
            .observe(v);
    }

    /// Counts a failed `External` classifier call; `mode` is its failure mode
    /// (`FailClosed`, `FailOpen`).
    pub fn classifier_failure(&self, classifier: &str, mode: &str) {
        self.classifier_failures
            .get_or_create(&ClassifierFailureLabels {
                classifier: classifier.into(),
                mode: mode.into(),
            })
            .inc();
    }

    /// Counts `n` tags an `External` classifier returned without declaring them (dropped).
    pub fn classifier_undeclared_tags(&self, classifier: &str, n: u64) {
        self.classifier_undeclared_tags
            .get_or_create(&ClassifierLabels {
                classifier: classifier.into(),
            })
            .inc_by(n);
    }

    /// Counts a retry after a connection failure to `endpoint`.
    pub fn upstream_retry(&self, endpoint: &str) {
        self.retries
            .get_or_create(&RetryLabels {
                endpoint: endpoint.into(),
            })
            .inc();
    }

    /// Counts a policy reload by result (`applied`, `unchanged`, `refused`, `partly_applied`).
    pub fn policy_reload(&self, result: &str) {
        self.policy_reloads
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Sets the generation of the policy in force.
    pub fn set_policy_generation(&self, generation: u64) {
        self.policy_generation.set(generation as f64);
    }

    /// Sets whether the newest bundle was refused, and in how many namespaces while the
    /// others were applied (0: not partly applied).
    pub fn set_policy_refused(&self, refused: bool, namespaces: usize) {
        self.policy_refused.set(if refused { 1.0 } else { 0.0 });
        self.policy_refused_namespaces.set(namespaces as f64);
    }

    /// Installs the service objectives (replacing any before). Counters of objectives that
    /// disappear stay (they are counters); their objective/threshold gauges are removed.
    pub fn set_slos(&self, slos: SloSet) {
        self.slo_objective.clear();
        self.slo_threshold.clear();
        self.slo_attainment.clear();
        for s in slos.iter() {
            let l = SloInfoLabels {
                slo: s.name.clone(),
                metric: s.metric.label().into(),
            };
            self.slo_objective.get_or_create(&l).set(s.quantile);
            self.slo_threshold.get_or_create(&l).set(s.threshold_s);
        }
        self.slo_rolling.lock().clear();
        *self.slos.write() = Arc::new(slos);
    }

    /// The service objectives in force.
    pub fn slos(&self) -> Arc<SloSet> {
        self.slos.read().clone()
    }

    /// Sets the capacity gauges from the live cluster state (called at scrape time).
    pub fn sample_state(&self, state: &crate::live::SharedState) {
        let now = state.now_ms();
        let rows: Vec<(
            WorkerEndpointLabels,
            Option<kinf_router::state::LoadSample>,
            bool,
        )> = state.with(|st| {
            st.worker_sets
                .iter()
                .flat_map(|(k, ws)| {
                    ws.endpoints.iter().map(move |e| {
                        (
                            WorkerEndpointLabels {
                                worker_set: k.to_string(),
                                endpoint: e.address.to_string(),
                            },
                            e.load.latest().copied(),
                            e.ready && !e.stale,
                        )
                    })
                })
                .collect()
        });
        self.endpoint_kv_usage.clear();
        self.endpoint_queued.clear();
        self.endpoint_running.clear();
        self.endpoint_load_age.clear();
        self.endpoint_routable.clear();
        for (l, sample, routable) in rows {
            self.endpoint_routable
                .get_or_create(&l)
                .set(if routable { 1.0 } else { 0.0 });
            if let Some(s) = sample {
                self.endpoint_kv_usage.get_or_create(&l).set(s.kv_usage);
                self.endpoint_queued.get_or_create(&l).set(s.queued);
                self.endpoint_running.get_or_create(&l).set(s.running);
                self.endpoint_load_age
                    .get_or_create(&l)
                    .set(now.saturating_sub(s.at_ms) as f64 / 1000.0);
            }
        }
    }

    /// Renders every family in the Prometheus text format (0.0.4), appending to `out`.
    pub fn render(&self, out: &mut String) {
        self.refresh_rolling();
        let mut om = String::with_capacity(16 * 1024);
        if prometheus_client::encoding::text::encode_registry(&mut om, &self.registry).is_err() {
            return;
        }
        openmetrics_to_prometheus(&om, out);
    }

    fn refresh_rolling(&self) {
        let now = self.now_s();
        let slos = self.slos();
        let rolling = self.slo_rolling.lock();
        for s in slos.iter() {
            let l = SloInfoLabels {
                slo: s.name.clone(),
                metric: s.metric.label().into(),
            };
            match rolling.get(&s.name).and_then(|r| r.attainment(now)) {
                Some(a) => {
                    self.slo_attainment.get_or_create(&l).set(a);
                }
                None => {
                    self.slo_attainment.remove(&l);
                }
            }
        }
    }

    /// The value of a counter, gauge, or histogram `_sum`/`_count`/`_bucket` sample with
    /// exactly these labels (tests and status). Counters are named with their `_total`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut text = String::new();
        self.render(&mut text);
        sample_value(&text, name, labels)
    }
}

/// Finds the sample `name{labels}` (labels in any order, exactly this set) in Prometheus text.
pub fn sample_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, ls) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}').unwrap_or(rest)),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        let parsed = parse_labels(ls);
        if parsed.len() == labels.len()
            && labels
                .iter()
                .all(|(k, v)| parsed.iter().any(|(pk, pv)| pk == k && pv == v))
        {
            return value.parse().ok();
        }
    }
    None
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            if c != ',' {
                key.push(c);
            }
        }
        if key.is_empty() {
            return out;
        }
        if chars.next() != Some('"') {
            return out;
        }
        let mut val = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => val.push('\n'),
                    Some(o) => val.push(o),
                    None => {}
                },
                '"' => break,
                o => val.push(o),
            }
        }
        out.push((key, val));
    }
}

/// Converts `prometheus-client`'s OpenMetrics text to the Prometheus 0.0.4 text format: the
/// `# EOF` marker is dropped and counter families are named with their `_total` (as their
/// samples are), so that other 0.0.4 text can follow.
pub fn openmetrics_to_prometheus(om: &str, out: &mut String) {
    let mut help: Option<&str> = None;
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.take() {
                out.push_str(h);
                out.push('\n');
            }
            if !rest.is_empty() {
                help = Some(line);
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.rsplit_once(' ').unwrap_or((rest, ""));
            let fixed = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some(h) = help.take() {
                let text = h
                    .strip_prefix("# HELP ")
                    .and_then(|r| r.split_once(' '))
                    .map_or("", |(_, t)| t);
                out.push_str("# HELP ");
                out.push_str(&fixed);
                out.push(' ');
                out.push_str(text);
                out.push('\n');
            }
            out.push_str("# TYPE ");
            out.push_str(&fixed);
            out.push(' ');
            out.push_str(kind);
            out.push('\n');
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms_in_prometheus_text() {
        let m = Metrics::new();
        m.count_request("chat", 200, "ok");
        m.count_request("chat", 200, "ok");
        m.count_request("chat", 200, "ok");
        m.set_policy_generation(3);
        m.observe_decision_seconds(0.0007);
        let mut s = String::new();
        m.render(&mut s);
        assert!(
            s.contains("# TYPE kinference_requests_total counter\n"),
            "{s}"
        );
        assert!(
            s.contains("kinference_requests_total{api=\"chat\",status=\"200\",code=\"ok\"} 3\n"),
            "{s}"
        );
        assert!(s.contains(
            "# TYPE kinference_policy_generation gauge\nkinference_policy_generation 3.0\n"
        ));
        assert!(s.contains("kinference_decision_seconds_bucket{le=\"0.001\"} 1\n"));
        assert!(s.contains("kinference_decision_seconds_bucket{le=\"0.0005\"} 0\n"));
        assert!(s.contains("kinference_decision_seconds_count 1\n"));
        assert!(!s.contains("# EOF"));
        assert_eq!(
            m.value(
                "kinference_requests_total",
                &[("code", "ok"), ("api", "chat"), ("status", "200")]
            ),
            Some(3.0)
        );
        assert_eq!(m.value("kinference_policy_generation", &[]), Some(3.0));
        assert_eq!(
            m.value("kinference_requests_total", &[("code", "ok")]),
            None
        );
    }

    #[test]
    fn label_values_are_escaped_and_read_back() {
        let m = Metrics::new();
        m.decision("a\"b\\c", "d", "ns");
        let mut s = String::new();
        m.render(&mut s);
        assert!(s.contains("rule=\"a\\\"b\\\\c\""), "{s}");
        assert_eq!(
            m.value(
                "kinference_decisions_total",
                &[
                    ("rule", "a\"b\\c"),
                    ("destination", "d"),
                    ("destination_namespace", "ns")
                ]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn every_family_has_help_and_type() {
        let m = Metrics::new();
        let mut s = String::new();
        m.render(&mut s);
        let types = s.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = s.lines().filter(|l| l.starts_with("# HELP ")).count();
        assert_eq!(types, helps);
        // Families without samples are not rendered; the four unlabelled metrics always are.
        assert_eq!(types, 4, "{s}");
    }
}
