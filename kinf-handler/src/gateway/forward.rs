//! The request path: admission, decision, forwarding, and the response passed through.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kinf_policy::{BackendType, Qos};
use kinf_router::classify::Message;
use kinf_router::usage::TokenUsage;
use kinf_router::{Decider, Decision, Outcome};
use smallvec::SmallVec;

use super::errors::{Api, ApiError};
use super::parse::Parsed;
use super::sse_tap::{SseTap, body_usage};
use super::tokens::prompt_tokens;
use super::{Gateway, host, not_ready};

/// Pooled HTTP/1.1 client for upstream workers.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl UpstreamClient {
    /// A client with keep-alive pooling and `TCP_NODELAY`.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(std::time::Duration::from_secs(5)));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(std::time::Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .build(connector);
        UpstreamClient { client }
    }
}

impl Default for UpstreamClient {
    fn default() -> Self {
        Self::new()
    }
}

/// Request headers passed on to the upstream (everything else is dropped: the client's
/// credentials are for Kinference, not for the worker). `content-type` is always
/// `application/json`: the body sent is the gateway's own serialisation, whatever the client
/// declared.
const FORWARDED_HEADERS: [HeaderName; 2] = [header::ACCEPT, header::USER_AGENT];

/// The chosen route, with what its prediction was based on (for learning from the outcome).
#[derive(Clone, Debug)]
pub struct Chosen {
    /// `host:port` of the endpoint.
    pub endpoint: Arc<str>,
    /// Worker set name.
    pub destination: Arc<str>,
    /// Its namespace.
    pub namespace: Arc<str>,
    /// The model to send upstream.
    pub model: Arc<str>,
    /// `namespace/policy/rule` of the deciding rule, or `default`.
    pub rule: String,
    /// Headers to set (`x-kinference-*`).
    pub headers: Vec<(String, String)>,
    /// The identified tenant.
    pub tenant: Option<Arc<str>>,
    /// The model the client asked for.
    pub requested_model: Arc<str>,
    /// Prices of the destination, per million tokens.
    pub cost: kinf_lang::compiled::CostInfo,
    /// `namespace/name` of the provider, for provider routes (`endpoint` is then its URL).
    pub provider: Option<Arc<str>>,
    prompt_tokens: u32,
    /// The client asked for a stream (only a streamed response has a first-token time).
    streamed: bool,
    /// The request's own prompt tokens the destination does not hold (for estimating usage).
    uncached_tokens: u32,
    /// What the local endpoint's TTFT prediction was computed from (to learn from the outcome).
    prediction: Option<kinf_router::PredictionInputs>,
    /// Counts the request in flight at its endpoint until the last clone is dropped.
    inflight: Option<Arc<InFlightTicket>>,
    /// The request set no `max_tokens`: what it generates, over this many sequences, teaches
    /// the gateway its model's output length.
    learn_output: Option<u64>,
}

/// A request counted in flight at a local endpoint ([`ClusterState::begin_request`]): its
/// prefill is released at the first token ([`InFlightTicket::first_token`]) and the request
/// when the ticket is dropped, however the request ended (completed, failed, retried
/// elsewhere, or abandoned by the client).
///
/// [`ClusterState::begin_request`]: kinf_router::ClusterState::begin_request
#[derive(Debug)]
pub struct InFlightTicket {
    state: Arc<crate::live::SharedState>,
    namespace: Arc<str>,
    worker_set: Arc<str>,
    endpoint: Arc<str>,
    uncached_tokens: u32,
    first_token_seen: std::sync::atomic::AtomicBool,
}

impl InFlightTicket {
    /// The first token arrived: the request's prefill is done.
    pub fn first_token(&self) {
        if !self
            .first_token_seen
            .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            self.state.with(|st| {
                st.first_token(
                    &self.namespace,
                    &self.worker_set,
                    &self.endpoint,
                    self.uncached_tokens,
                )
            });
        }
    }
}

impl Drop for InFlightTicket {
    fn drop(&mut self) {
        let pending = !self
            .first_token_seen
            .load(std::sync::atomic::Ordering::Relaxed);
        self.state.with(|st| {
            st.end_request(
                &self.namespace,
                &self.worker_set,
                &self.endpoint,
                self.uncached_tokens,
                pending,
            )
        });
    }
}

/// What was observed of one response, for learning and accounting.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResponseObservation {
    /// Upstream HTTP status.
    pub status: u16,
    /// Time from receiving the request to the first token (streamed responses).
    pub ttft_s: Option<f64>,
    /// Time from forwarding the request upstream to the first token (streamed responses):
    /// the worker's TTFT, which its model learns.
    pub upstream_ttft_s: Option<f64>,
    /// Mean gap between tokens (streamed responses with two tokens or more).
    pub mean_itl_s: Option<f64>,
    /// Usage the upstream reported.
    pub usage: Option<TokenUsage>,
    /// Whether the response ended properly.
    pub completed: bool,
    /// Time from receiving the request to the end of the response.
    pub duration_s: f64,
    /// Token-carrying events seen (streamed responses): the output-token estimate when the
    /// upstream reported no usage.
    pub token_events: u64,
    /// The longest choice's share of the streamed tokens (1 with one choice, 1/n with `n` of
    /// equal length; 0 when unknown, taken as 1): TPOT is per choice.
    pub longest_share: f64,
    /// The client went away before the upstream ended the response: its latency says nothing
    /// of the service's, so it counts for no latency objective.
    pub client_gone: bool,
}

impl ResponseObservation {
    /// What a tap saw of a response with upstream `status`, forwarded at `sent_at` for a
    /// request received at `started`.
    pub fn from_tap(
        status: u16,
        o: &super::sse_tap::Observed,
        sent_at: Instant,
        started: Instant,
    ) -> Self {
        ResponseObservation {
            status,
            ttft_s: o
                .tokens
                .first_token_at
                .map(|t| t.duration_since(started).as_secs_f64()),
            upstream_ttft_s: o
                .tokens
                .first_token_at
                .map(|t| t.duration_since(sent_at).as_secs_f64()),
            mean_itl_s: o.tokens.mean_itl_s(),
            usage: o.usage,
            completed: o.completed,
            duration_s: started.elapsed().as_secs_f64(),
            token_events: o.tokens.token_events,
            longest_share: o.tokens.longest_share(),
            client_gone: false,
        }
    }
}

/// Learns from a finished response routed by `plan`: the endpoint's TTFT model, latency
/// histograms, token counters.
pub fn report(gw: &Gateway, api: Api, c: &Chosen, o: &ResponseObservation) {
    let m = &gw.metrics;
    // Only a whole answer with the worker's own count teaches the output length.
    if let (Some(sequences), Some(u), true) = (c.learn_output, o.usage, o.completed)
        && (200..300).contains(&o.status)
    {
        let l = gw
            .output_lengths
            .observe(&c.requested_model, u.output_tokens, sequences);
        if let Some(n) = l.estimate() {
            m.output_tokens_estimate
                .get_or_create(&crate::metrics::ModelLabels {
                    model: c.requested_model.to_string(),
                })
                .set(f64::from(n));
        }
    }
    let ep = crate::metrics::EndpointLabels {
        destination: c.destination.to_string(),
        destination_namespace: c.namespace.to_string(),
        endpoint: c.endpoint.to_string(),
    };
    if let Some(ttft) = o.upstream_ttft_s {
        m.upstream_ttft.get_or_create(&ep).observe(ttft);
        if let Some(p) = c.prediction {
            let err = gw.state.with(|st| {
                st.observe_ttft(
                    &c.namespace,
                    &c.destination,
                    &c.endpoint,
                    p.prefill_tokens(),
                    p.queued,
                    p.running,
                    ttft,
                )
            });
            if let Some(e) = err {
                m.ttft_prediction_error
                    .get_or_create(&crate::metrics::DestinationLabels {
                        destination: c.destination.to_string(),
                        destination_namespace: c.namespace.to_string(),
                    })
                    .observe(e.abs());
            }
        }
    }
    if let Some(itl) = o.mean_itl_s {
        m.upstream_itl.get_or_create(&ep).observe(itl);
    }
    m.request_duration
        .get_or_create(&crate::metrics::ApiLabels {
            api: api.label().to_string(),
        })
        .observe(o.duration_s);
    m.responses
        .get_or_create(&crate::metrics::ResponseLabels {
            destination: c.destination.to_string(),
            destination_namespace: c.namespace.to_string(),
            status: o.status.to_string(),
            outcome: if o.completed {
                "completed"
            } else {
                "incomplete"
            }
            .to_string(),
        })
        .inc();
    // Usage the upstream did not report (a stream cut short, a client gone) is estimated:
    // nothing is lost. An error response without usage used nothing: zero, not an estimate.
    let (usage, estimated) = match o.usage {
        Some(u) => (u, false),
        // An error response without usage used nothing: zero, and not counted as estimated.
        None => (
            crate::accounting::estimate_usage(
                o.status,
                u64::from(c.prompt_tokens),
                u64::from(c.uncached_tokens),
                o.token_events,
            ),
            crate::accounting::usage_is_estimated(o.status),
        ),
    };
    crate::accounting::account_response(
        m,
        &crate::accounting::Served {
            tenant: c.tenant.as_deref(),
            requested_model: &c.requested_model,
            upstream_model: &c.model,
            destination: &c.destination,
            destination_namespace: &c.namespace,
            endpoint: &c.endpoint,
            cost: c.cost,
            status: o.status,
            completed: o.completed,
            client_gone: o.client_gone,
            streamed: c.streamed,
            ttft_s: o.ttft_s,
            mean_itl_s: o.mean_itl_s,
            duration_s: o.duration_s,
            longest_share: o.longest_share,
            usage,
            estimated,
        },
    );
}

/// What to learn once a proxied response is over.
#[derive(Debug)]
struct Report {
    gw: Arc<Gateway>,
    api: Api,
    chosen: Chosen,
    started: Instant,
    sent_at: Instant,
    status: u16,
    reservation: Option<crate::tenants::Reservation>,
}

/// Settles a rate-limit reservation with what the request used: the reported usage, else an
/// estimate (the prompt, one output token per token event seen). Without usage that estimate
/// refunds the whole `max_tokens` of an answer whose output was not counted (a non-streamed
/// one): [`settle_or_keep_reservation`] keeps such an estimate charged.
pub fn settle_reservation(
    reservation: Option<crate::tenants::Reservation>,
    c: &Chosen,
    o: &ResponseObservation,
) {
    if let Some(res) = reservation {
        let used = o.usage.unwrap_or(TokenUsage {
            cached_prompt_tokens: 0,
            uncached_prompt_tokens: u64::from(c.prompt_tokens),
            cache_write_prompt_tokens: 0,
            output_tokens: o.token_events,
        });
        res.complete(&used);
    }
}

/// Settles a rate-limit reservation when what the response generated is known, else keeps its
/// whole estimate charged. With the usage the upstream reported, it is settled with that. Without
/// it, a response whose output was counted as it passed (`output_counted`: a stream, one output
/// token per token event) is settled with the estimate of [`settle_reservation`]; any other (a
/// non-streamed answer without `usage`, one whose body could not be read, an error response)
/// keeps the whole estimate: how much was generated is unknown, and the limit must not refund
/// output that may have been produced. Dropping the reservation gives its concurrency back.
pub fn settle_or_keep_reservation(
    reservation: Option<crate::tenants::Reservation>,
    c: &Chosen,
    o: &ResponseObservation,
    output_counted: bool,
) {
    if o.usage.is_some() || output_counted {
        settle_reservation(reservation, c, o);
    } else {
        drop(reservation);
    }
}

/// Whether what a worker's response generated is known without `usage`, for
/// [`settle_or_keep_reservation`]: a stream's token events were counted as they passed, and a
/// whole 4xx answer read in full is the worker refusing the request (vLLM's 400 for a prompt over
/// the context, say), which generated nothing.
pub fn output_known(streamed: bool, status: u16, whole_answer_read: bool) -> bool {
    streamed || ((400..500).contains(&status) && whole_answer_read)
}

/// Serves one inference request end to end.
pub async fn handle(gw: Arc<Gateway>, api: Api, headers: HeaderMap, body: Body) -> Response {
    let mut pending = Unanswered {
        gw: gw.clone(),
        api,
        started: Instant::now(),
        who: crate::accounting::Who::default(),
        forwarding: None,
        reservation: None,
        reached_upstream: false,
        answered: false,
    };
    let resp = match admit_and_forward(&gw, api, &headers, body, &mut pending).await {
        Ok(r) => r,
        Err(e) => {
            count_request(&gw, api, e.status.as_u16(), e.code, &pending.who);
            // Refused before any worker or provider had the request (a policy reject, no
            // capacity, every endpoint unreachable): it used nothing, so its reservation gives
            // the whole estimate back. One that reached an upstream keeps it charged.
            if !pending.reached_upstream
                && let Some(r) = pending.reservation.take()
            {
                r.complete(&TokenUsage::default());
            }
            e.into_response_for(api)
        }
    };
    // Counted (by the response head or just above): nothing left for the drop guard.
    pending.answered = true;
    resp
}

/// A request between arrival and its response, accounted when dropped unanswered: hyper drops
/// the handler's future when the client goes away, before a response (or an error) was made.
/// Such a request is counted once in `kinference_requests_total` (status 499, code
/// `client_closed_request`) and per tenant (outcome `incomplete`). One the upstream already
/// had is reported like a response cut short (usage estimated from the prompt; no output was
/// seen) and its upstream request is cancelled with the dropped future. Its rate-limit
/// reservation is dropped: concurrency is released and the whole estimate stays charged (how
/// much the worker generated is unknown, and disconnecting must not lift a token limit).
struct Unanswered {
    gw: Arc<Gateway>,
    api: Api,
    started: Instant,
    /// What is known of the request (tenant and model once admitted, destination once routed).
    who: crate::accounting::Who,
    /// The route the request was sent to, while its answer is awaited.
    forwarding: Option<Chosen>,
    /// The rate-limit reservation, until the response takes it.
    reservation: Option<crate::tenants::Reservation>,
    /// A worker or provider may have received the request (an answer failed after it was
    /// sent); `false` when every attempt failed to connect.
    reached_upstream: bool,
    /// A response (or an error) was made: it is accounted elsewhere.
    answered: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        use crate::accounting::{CLIENT_CLOSED, CLIENT_CLOSED_STATUS};
        let gw = &self.gw;
        gw.metrics
            .count_request(self.api.label(), CLIENT_CLOSED_STATUS, CLIENT_CLOSED);
        match self.forwarding.take() {
            Some(c) => {
                let obs = ResponseObservation {
                    status: CLIENT_CLOSED_STATUS,
                    completed: false,
                    duration_s: self.started.elapsed().as_secs_f64(),
                    ..ResponseObservation::default()
                };
                report(gw, self.api, &c, &obs);
            }
            None => crate::accounting::account_refusal(&gw.metrics, &self.who, CLIENT_CLOSED),
        }
        // Dropped, not completed: see the type's documentation.
        drop(self.reservation.take());
    }
}

/// Counts a request in `kinference_requests_total` and, when it ended without a response
/// passed through, in the per-tenant accounting (`who` says what was known of it).
/// Counts a request by the status sent to the client, and a refusal per tenant and model.
pub(crate) fn count_request(
    gw: &Gateway,
    api: Api,
    status: u16,
    code: &str,
    who: &crate::accounting::Who,
) {
    gw.metrics.count_request(api.label(), status, code);
    crate::accounting::account_refusal(&gw.metrics, who, code);
}

/// The context a request needs ([`kinf_router::Request::context_needed`]), only from an exact
/// count (the model's tokenizer, or token ids sent), and for one prompt (each prompt of a batch
/// is a sequence of its own).
fn required_context(parsed: &super::parse::Parsed, exact: bool, prompt_tokens: u32) -> Option<u32> {
    (exact && parsed.prompts == 1)
        .then(|| kinf_router::Request::context_needed(prompt_tokens, parsed.max_tokens))
}

/// The request field that holds the prompt: `prompt` (completions) or `messages`.
fn prompt_field(api: Api) -> &'static str {
    match api {
        Api::Completions => "prompt",
        Api::Chat | Api::Messages => "messages",
    }
}

/// Bodies larger than this are admitted (parsed, classified, tokenized) on the blocking pool
/// while other requests are in flight.
const BLOCKING_ADMIT_BYTES: usize = 16 << 10;

/// Bodies larger than this always go to the blocking pool: admitting them takes long enough
/// (several milliseconds) that a request arriving meanwhile should not wait behind them.
const INLINE_ADMIT_MAX_BYTES: usize = 256 << 10;

/// Counts a request in [`Gateway::admitting`] until dropped.
struct Admitting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Admitting<'a> {
    fn enter(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Admitting(n)
    }
}

impl Drop for Admitting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A request that passed admission: parsed, classified, tokenized, ready to be decided.
#[derive(Debug)]
pub struct Admitted {
    /// The parsed request; its body already carries the injected `stream_options`.
    pub parsed: Parsed,
    /// The request as the decision engine sees it.
    pub request: kinf_router::Request,
    /// Whether `stream_options.include_usage` was injected (the usage chunk must be removed).
    pub inject_usage: bool,
    /// The policy it is decided with.
    pub policy: Arc<kinf_lang::CompiledPolicy>,
    /// The token rate limits that apply (the front door's pool).
    pub limiter: Option<Arc<crate::tenants::Limiter>>,
}

impl Admitted {
    /// The tokens the request may use, reserved under its pool's token limits: the prompt
    /// tokens of every prompt of the batch, and `max_tokens` for each sequence generated (`n`
    /// per prompt), as the worker counts them in its usage.
    pub fn token_estimate(&self) -> crate::tenants::TokenEstimate {
        crate::tenants::TokenEstimate {
            prompt: u64::from(self.request.prompt_tokens)
                .saturating_add(self.parsed.later_prompt_tokens),
            output: u64::from(self.request.max_tokens).saturating_mul(self.parsed.sequences()),
        }
    }
}

/// The first half of admission: the request parsed, its tenant resolved, the front door's
/// body and message limits checked. What the `External` classifiers read.
#[derive(Debug)]
pub struct Intake {
    /// The parsed request.
    pub parsed: Parsed,
    tenant: Option<Arc<str>>,
}

/// Admission without I/O: [`intake`] then [`complete`]. Refuses (503
/// `classifier_unavailable`) a request whose front door has `External` classifiers, which need
/// [`admit_async`]: no path may skip them.
pub fn admit(
    rt: &super::runtime::Runtime,
    api: Api,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Admitted, ApiError> {
    let i = intake(rt, api, headers, bytes)?;
    if !rt.door(host(headers)).external.is_empty() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "classifier_unavailable",
            "this front door has External classifiers, which this admission path does not call",
        ));
    }
    complete(rt, api, headers, i, Vec::new())
}

/// Admission: parses `bytes` as an `api` request, applies the front door's limits, calls its
/// `External` classifiers (concurrently, each within its timeout; see
/// [`external`](super::external)), then classifies with the built-in classifiers and
/// tokenizes. Large bodies are parsed, classified and tokenized on the blocking pool while other
/// requests are in flight, in place when the request is alone (up to 256 KiB).
pub async fn admit_async(
    gw: &Gateway,
    rt: &Arc<super::runtime::Runtime>,
    api: Api,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Admitted, ApiError> {
    let mut a = admit_parsed(gw, rt, api, headers, bytes).await?;
    if a.parsed.output_limit_unknown()
        && let Some(n) = gw.output_lengths.estimate(&a.request.model)
    {
        a.request.max_tokens = n;
    }
    Ok(a)
}

/// [`admit_async`] before the learned output estimate.
async fn admit_parsed(
    gw: &Gateway,
    rt: &Arc<super::runtime::Runtime>,
    api: Api,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Result<Admitted, ApiError> {
    let door = rt.door_for(host(headers))?;
    // A large body takes a millisecond or more to parse, classify and tokenize: on the
    // blocking pool it cannot hold up other requests, but the hand-off and the hand-back
    // each wake a thread. Alone in the gateway, the request has nobody to hold up: admit it
    // in place.
    let blocking = bytes.len() > INLINE_ADMIT_MAX_BYTES
        || (bytes.len() > BLOCKING_ADMIT_BYTES
            && gw.admitting.load(std::sync::atomic::Ordering::Relaxed) > 1);
    if door.external.is_empty() {
        if !blocking {
            return admit(rt, api, headers, &bytes);
        }
        let (rt, headers) = (rt.clone(), headers.clone());
        return tokio::task::spawn_blocking(move || admit(&rt, api, &headers, &bytes))
            .await
            .map_err(join_error)?;
    }
    let i = if blocking {
        let (rt, headers) = (rt.clone(), headers.clone());
        tokio::task::spawn_blocking(move || intake(&rt, api, &headers, &bytes))
            .await
            .map_err(join_error)??
    } else {
        intake(rt, api, headers, &bytes)?
    };
    let extra = super::external::classify(&door.external, &i.parsed, &gw.metrics).await?;
    if blocking {
        let (rt, headers) = (rt.clone(), headers.clone());
        tokio::task::spawn_blocking(move || complete(&rt, api, &headers, i, extra))
            .await
            .map_err(join_error)?
    } else {
        complete(rt, api, headers, i, extra)
    }
}

fn join_error(e: tokio::task::JoinError) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// The first half of admission: body size, tenant, parse, message limit. No I/O.
pub fn intake(
    rt: &super::runtime::Runtime,
    api: Api,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<Intake, ApiError> {
    let door = rt.door_for(host(headers))?;
    if bytes.len() > door.max_body_bytes {
        return Err(too_large(door.max_body_bytes));
    }
    let tenant = match &door.tenants {
        Ok(r) => r
            .resolve(headers)
            .map_err(|e| ApiError::new(e.status(), e.code(), e.to_string()))?,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "tenant_identity_unavailable",
                "tenant identity is misconfigured on this gateway; see /admin/status",
            ));
        }
    };
    let parsed = super::parse::parse_limited(api, bytes, door.max_json_depth)?;
    if let Some(max) = door.max_messages
        && parsed.message_count() > max as usize
    {
        let mut e = ApiError::invalid(
            "messages",
            format!(
                "the request has {} messages; the limit is {max} (limits.maxMessages)",
                parsed.message_count()
            ),
        );
        e.code = "too_many_messages";
        return Err(e);
    }
    Ok(Intake { parsed, tenant })
}

/// The second half of admission: built-in classifiers (their tags joined with
/// `external_tags`), tokenization, the prompt-token limit, QoS. No I/O.
pub fn complete(
    rt: &super::runtime::Runtime,
    api: Api,
    headers: &HeaderMap,
    intake: Intake,
    external_tags: Vec<Arc<str>>,
) -> Result<Admitted, ApiError> {
    let door = rt.door(host(headers));
    let Intake { mut parsed, tenant } = intake;
    let messages: Vec<Message<'_>> = if door.classifiers.is_empty() {
        Vec::new()
    } else {
        parsed.classified_messages().collect()
    };
    let mut tags = if messages.is_empty() {
        Vec::new()
    } else {
        door.classifiers.classify(&messages).tags
    };
    if !external_tags.is_empty() {
        tags.extend(external_tags);
        tags.sort_unstable();
        tags.dedup();
    }
    let tokenizer = rt.tokenizers.get(parsed.model.as_str()).map(|t| &**t);
    let tokens = prompt_tokens(&parsed, tokenizer);
    let prompt_tokens = u32::try_from(tokens.ids.len()).unwrap_or(u32::MAX);
    if let Some(max) = door.max_prompt_tokens
        && u64::from(prompt_tokens) > max
    {
        let field = if api == Api::Completions {
            "prompt"
        } else {
            "messages"
        };
        return Err(ApiError::invalid(
            field,
            format!("the prompt has {prompt_tokens} tokens; the limit is {max}"),
        ));
    }
    let qos = match headers
        .get("x-kinference-qos")
        .map(|v| v.to_str().unwrap_or(""))
    {
        None | Some("interactive") => Qos::Interactive,
        Some("batch") => Qos::Batch,
        Some("deferrable") => Qos::Deferrable,
        Some(other) => {
            return Err(ApiError::invalid(
                "x-kinference-qos",
                format!(
                    "header `x-kinference-qos` is `{other}`; expected `interactive`, `batch` or `deferrable`"
                ),
            ));
        }
    };
    let request = kinf_router::Request {
        pool: door.pool.clone(),
        tenant,
        model: parsed.model.as_str().into(),
        tags: tags.into_iter().collect::<SmallVec<_>>(),
        qos,
        prompt_tokens,
        token_ids: Some(tokens.ids.clone()),
        block_hashes: None,
        max_tokens: parsed.max_output_tokens(),
        sequences: u32::try_from(parsed.sequences()).unwrap_or(u32::MAX),
        headers: headers
            .iter()
            .filter_map(|(k, v)| Some((Arc::from(k.as_str()), Arc::from(v.to_str().ok()?))))
            .collect(),
        stream: parsed.stream,
        required_context: required_context(&parsed, tokens.exact, prompt_tokens),
        messages: u32::try_from(parsed.message_count()).unwrap_or(u32::MAX),
    };
    // Injected `include_usage` lets the gateway account streamed responses; the extra chunk
    // is removed before it reaches the client.
    let inject_usage = parsed.stream && !parsed.client_wants_usage && api != Api::Messages;
    if inject_usage {
        let opts = parsed
            .body
            .entry("stream_options")
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
        // `"stream_options": null` is as if it were absent (admission accepted it as such).
        if opts.is_null() {
            *opts = serde_json::Value::Object(Default::default());
        }
        if let serde_json::Value::Object(o) = opts {
            o.insert("include_usage".into(), serde_json::Value::Bool(true));
            // vLLM honours `continuous_usage_stats` (usage on every chunk) only with
            // `include_usage`: without it the client gets no usage, and must not get it now
            // on every chunk that is passed through.
            o.remove("continuous_usage_stats");
        }
    }
    Ok(Admitted {
        parsed,
        request,
        inject_usage,
        policy: rt.applied.policy.clone(),
        limiter: door.limiter.clone(),
    })
}

/// Reads a request body of at most `limit` bytes within `timeout`: a declared
/// `Content-Length` over the limit is refused at once (nothing of the body is read), a body
/// that grows past it when it does (413); a body not received in time is a 408, one that cannot
/// be read (malformed chunked encoding, connection reset) a 400 naming `body`.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    match tokio::time::timeout(timeout, http_body_util::Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(limit)),
        Ok(Err(e)) => Err(body_unreadable(&*e)),
        Err(_) => Err(body_timeout(timeout)),
    }
}

/// The 413 for a body over `limits.maxBodyBytes`; the connection is closed (the rest of the
/// body is not read).
pub(crate) fn too_large(limit: usize) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is larger than the limit of {limit} bytes (limits.maxBodyBytes)"),
    );
    e.param = Some("body".into());
    closing(e)
}

/// The 400 for a body that could not be read (not its size: malformed chunked encoding, a
/// connection reset); the connection is closed.
fn body_unreadable(err: &(dyn std::error::Error + 'static)) -> ApiError {
    // The chain of causes, each said once (wrappers repeat their inner error's message).
    let mut causes: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if causes.last() != Some(&s_text) {
            causes.push(s_text);
        }
        source = s.source();
    }
    let message = format!("the request body could not be read: {}", causes.join(": "));
    closing(ApiError::invalid("body", message))
}

/// `e` with `connection: close`: the rest of the body is not read, so the connection cannot be
/// reused.
fn closing(mut e: ApiError) -> ApiError {
    e.extra = Some(Box::new(super::errors::ErrorExtra {
        headers: vec![("connection", "close".into())],
        openai_type: None,
    }));
    e
}

/// The 408 for a body not received within `limit`; the connection is closed (the rest of the
/// body is not read).
fn body_timeout(limit: std::time::Duration) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "request_timeout",
        format!(
            "the request body was not received within {} (--body-read-timeout)",
            kinf_grammar::format_duration(limit)
        ),
    );
    e.param = Some("body".into());
    closing(e)
}

/// What [`limit_and_plan`] decided, with what the request holds until it is over.
#[derive(Debug)]
pub struct Planned {
    /// The route.
    pub chosen: Chosen,
    /// The token reservation, to settle with [`settle_reservation`].
    pub reservation: Option<crate::tenants::Reservation>,
    /// The tenant's stream slot (a streamed request), given back when dropped.
    pub stream_slot: Option<super::streams::StreamSlot>,
}

/// The tenant's limits, then the decision, for callers that forward the request themselves
/// (gRPC `Decide` and ext_proc): the stream slot ([`acquire_stream`]), the token reservation
/// ([`reserve`]), then [`plan`]. When nothing can serve the request, its whole estimate goes
/// back.
pub async fn limit_and_plan(
    gw: &Gateway,
    rt: &super::runtime::Runtime,
    headers: &HeaderMap,
    admitted: &mut Admitted,
) -> Result<Planned, ApiError> {
    let stream_slot = acquire_stream(gw, rt, headers, admitted)?;
    let reservation = reserve(admitted).await?;
    match plan(gw, admitted) {
        Ok(chosen) => Ok(Planned {
            chosen,
            reservation,
            stream_slot,
        }),
        Err(e) => {
            if let Some(r) = reservation {
                r.complete(&TokenUsage::default());
            }
            Err(e)
        }
    }
}

/// The tenant's stream slot for a streamed request of an identified tenant (given back when
/// dropped); 429 `too_many_streams` when its front door's `maxConcurrentStreamsPerTenant` are
/// all in flight. `None` for other requests.
pub fn acquire_stream(
    gw: &Gateway,
    rt: &super::runtime::Runtime,
    headers: &HeaderMap,
    admitted: &Admitted,
) -> Result<Option<super::streams::StreamSlot>, ApiError> {
    match (&admitted.request.tenant, admitted.parsed.stream) {
        (Some(t), true) => {
            let max = rt.door(host(headers)).max_streams_per_tenant;
            match gw.streams.try_acquire(t, max) {
                Some(slot) => Ok(Some(slot)),
                None => Err(too_many_streams(t, max)),
            }
        }
        _ => Ok(None),
    }
}

/// Reserves the request's estimated tokens (and concurrency) under its pool's rate limits;
/// `None` when none apply. Over a `whenExceeded: Tag` limit the request goes through
/// uncharged by it, tagged `over-limit` for the rules; over any other: 429 (or 503 when the
/// limiter's store is unreachable in fail mode `closed`) with the rate-limit headers. Settle
/// the reservation with [`settle_reservation`] once the response is known.
pub async fn reserve(
    admitted: &mut Admitted,
) -> Result<Option<crate::tenants::Reservation>, ApiError> {
    let Some(l) = admitted.limiter.clone() else {
        return Ok(None);
    };
    let mut skipped: SmallVec<[Arc<str>; 2]> = SmallVec::new();
    loop {
        let estimate = admitted.token_estimate();
        match l
            .admit_skipping(&admitted.request, estimate, &skipped)
            .await
        {
            Ok(r) => return Ok(Some(r)),
            Err(crate::tenants::LimitError::Exceeded(x))
                if l.action(&x.limit) == kinf_policy::WhenExceeded::Tag
                    && !skipped.contains(&x.limit) =>
            {
                // Over a `whenExceeded: Tag` limit: through uncharged, tagged for the rules.
                let tag: Arc<str> = Arc::from(kinf_lang::check::OVER_LIMIT_TAG);
                if !admitted.request.has_tag(&tag) {
                    admitted.request.tags.push(tag);
                }
                skipped.push(x.limit.clone());
            }
            Err(e) => {
                let mut err = ApiError::new(e.status(), e.code(), e.to_string());
                err.retry_after_s = e.retry_after();
                if let crate::tenants::LimitError::Exceeded(x) = &e {
                    err.extra = Some(Box::new(super::errors::ErrorExtra {
                        headers: x.header_pairs(),
                        openai_type: Some(x.kind_label()),
                    }));
                }
                return Err(err);
            }
        }
    }
}

/// The 429 for a tenant at its limit of concurrent streams.
fn too_many_streams(tenant: &str, max: u32) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_streams",
        format!(
            "tenant `{tenant}` has {max} streamed responses in flight; the limit is {max} (limits.maxConcurrentStreamsPerTenant)"
        ),
    );
    e.param = Some("stream".into());
    e.retry_after_s = Some(1);
    e
}

/// A response body that holds a stream slot until it is dropped.
struct Held {
    body: Body,
    _slot: super::streams::StreamSlot,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// `resp` with its body holding `slot` (when there is one).
fn hold(resp: Response, slot: Option<super::streams::StreamSlot>) -> Response {
    match slot {
        None => resp,
        Some(slot) => resp.map(|body| Body::new(Held { body, _slot: slot })),
    }
}

/// Decides an admitted request: the chosen local endpoint, or the error to send (policy
/// rejections, unknown models, provider routes this build cannot serve).
pub fn plan(gw: &Gateway, a: &Admitted) -> Result<Chosen, ApiError> {
    let c = plan_with(gw, a, &[])?;
    match &c.provider {
        None => Ok(c),
        Some(p) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "provider_unsupported",
            format!(
                "the policy routed this request to provider `{p}`; provider traffic needs protocol translation and credentials, so it is served through Kinference's HTTP gateway, not handed to the calling proxy"
            ),
        )),
    }
}

/// Decides an admitted request, providers included; `excluded_providers` (`namespace/name`)
/// are treated as unavailable (they failed this request before the first byte).
pub fn plan_with(
    gw: &Gateway,
    a: &Admitted,
    excluded_providers: &[Arc<str>],
) -> Result<Chosen, ApiError> {
    let decide_start = Instant::now();
    // The prompt is hashed here, outside the state lock, for the block size the last local
    // decision for the same pool and model used; a decision under another block size hashes
    // the token ids itself.
    let hint = gw
        .state
        .block_size_hint(a.request.pool.as_ref(), &a.request.model);
    let hashed = with_block_hashes(&a.request, hint);
    let req = hashed.as_ref().unwrap_or(&a.request);
    let (decision, chosen) = decide(gw, &a.policy, req, excluded_providers, true);
    gw.metrics
        .observe_decision_seconds(decide_start.elapsed().as_secs_f64());
    outcome(gw, a, decision, chosen, true)
}

/// Where `a` would go, decided without routing it: nothing is recorded in the state (no
/// blocks claimed, nothing in flight) and no decision is counted in the metrics. For requests
/// that ask about a request without making it (`/v1/messages/count_tokens`).
pub fn plan_without_routing(gw: &Gateway, a: &Admitted) -> Result<Chosen, ApiError> {
    let (decision, chosen) = decide(gw, &a.policy, &a.request, &[], false);
    outcome(gw, a, decision, chosen, false)
}

/// The chosen route of a decision, or the client's error. With `routed`, the route is counted
/// in the metrics and learns the output length.
fn outcome(
    gw: &Gateway,
    a: &Admitted,
    decision: Decision,
    chosen: Option<Chosen>,
    routed: bool,
) -> Result<Chosen, ApiError> {
    match (decision.outcome, chosen) {
        (Outcome::Reject(r), _) => {
            let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let mut e = ApiError::new(status, r.code, r.message);
            if r.code == "model_not_found" {
                e.param = Some("model".into());
            }
            if r.code == "context_length_exceeded" {
                e.param = Some(prompt_field(a.parsed.api).into());
            }
            if status == StatusCode::SERVICE_UNAVAILABLE {
                e.retry_after_s = Some(1);
            }
            Err(e)
        }
        (Outcome::Route(_), Some(c)) if !routed => Ok(c),
        (Outcome::Route(_), Some(mut c)) => {
            gw.metrics.decision(&c.rule, &c.destination, &c.namespace);
            c.learn_output = a
                .parsed
                .output_limit_unknown()
                .then(|| a.parsed.sequences());
            Ok(c)
        }
        (Outcome::Route(r), None) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            format!("no route to `{}`", r.destination),
        )),
    }
}

/// The body to send upstream: the client's, with `model` set to the decided upstream model.
pub fn upstream_body(a: &Admitted, c: &Chosen) -> Bytes {
    /// The body's entries in their order, `model` replaced, serialised without copying the
    /// tree (a long prompt is tens of kilobytes of strings).
    struct WithModel<'a> {
        body: &'a serde_json::Map<String, serde_json::Value>,
        model: &'a str,
    }
    impl serde::Serialize for WithModel<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap as _;
            let mut m = s.serialize_map(Some(self.body.len()))?;
            for (k, v) in self.body {
                if k == "model" {
                    m.serialize_entry(k, self.model)?;
                } else {
                    m.serialize_entry(k, v)?;
                }
            }
            m.end()
        }
    }
    let body = &a.parsed.body;
    if !body.contains_key("model") {
        // Parsing requires `model`; kept for bodies built by other callers.
        let mut body = body.clone();
        body.insert(
            "model".into(),
            serde_json::Value::String(c.model.to_string()),
        );
        return Bytes::from(serde_json::to_vec(&body).unwrap_or_default());
    }
    let mut out = Vec::with_capacity(a.parsed.prompt_bytes() + 512);
    // Serialising a `Value` tree into a `Vec` cannot fail.
    let _ = serde_json::to_writer(
        &mut out,
        &WithModel {
            body,
            model: &c.model,
        },
    );
    Bytes::from(out)
}

async fn admit_and_forward(
    gw: &Arc<Gateway>,
    api: Api,
    headers: &HeaderMap,
    body: Body,
    pending: &mut Unanswered,
) -> Result<Response, ApiError> {
    crate::busy_poll::touch();
    let started = pending.started;
    let _admitting = Admitting::enter(&gw.admitting);
    let Some(rt) = gw.runtime() else {
        // Before the first policy is applied: counted, though no tenant is known yet.
        gw.metrics.count_request(api.label(), 503, "not_ready");
        return Ok(not_ready(api));
    };
    // A host no front door answers is refused before its body is read.
    let door = rt.door_for(host(headers))?;
    let limit = door.max_body_bytes;
    let bytes = read_body(headers, body, limit, gw.options.body_read_timeout).await?;
    // Tokenizing a long prompt takes milliseconds: `admit_async` keeps it off the async
    // workers.
    let mut admitted = admit_async(gw, &rt, api, headers, bytes).await?;
    pending.who.admitted(&admitted);
    // Held by the response body: given back when the body is dropped (stream over, client
    // gone, upstream failed) or when this function returns an error.
    let stream_slot = acquire_stream(gw, &rt, headers, &admitted)?;
    pending.reservation = reserve(&mut admitted).await?;
    let mut retried = false;
    let mut failed_providers: SmallVec<[Arc<str>; 2]> = SmallVec::new();
    // The last provider failure that let the decision move on: what the client gets when
    // nothing is left to try.
    let mut last_provider_error: Option<ApiError> = None;
    // Whether an earlier attempt's upstream may have had the request (then its charge stays).
    let mut reached_earlier = false;
    loop {
        let chosen = match plan_with(gw, &admitted, &failed_providers) {
            Ok(c) => c,
            Err(e) => return Err(last_provider_error.take().unwrap_or(e)),
        };
        // A request that fails after trying several destinations is accounted against the
        // first it tried (metrics.md).
        if pending.who.destination.is_none() {
            pending.who.routed(&chosen);
        }
        // From here until its answer, a client that goes away is accounted against this route.
        pending.forwarding = Some(chosen.clone());
        pending.reached_upstream = true;
        if let Some(key) = chosen.provider.clone() {
            let pool = gw.providers.load_full();
            let opts = crate::providers::ForwardOptions {
                stream: admitted.parsed.stream,
                usage_requested: !admitted.inject_usage,
                prompt_estimate: Some(u64::from(chosen.prompt_tokens)),
            };
            let forwarded = pool
                .forward_with(&key, api, admitted.parsed.body.clone(), &chosen.model, opts)
                .await;
            pending.forwarding = None;
            if let Err(e) = &forwarded {
                // Refused before sending (busy, circuit open, untranslatable, ...) or not
                // connected: the provider never had it.
                reached_earlier |= e.reached_provider();
                pending.reached_upstream = reached_earlier;
            }
            match forwarded {
                Ok(resp) => {
                    return Ok(hold(
                        respond_provider(
                            gw,
                            api,
                            chosen,
                            resp,
                            (started, admitted.parsed.stream),
                            pending.reservation.take(),
                        ),
                        stream_slot,
                    ));
                }
                Err(e) if e.fall_through && failed_providers.len() < 4 => {
                    tracing::warn!(provider = %key, error = %e, "provider failed before the first byte; deciding again without it");
                    gw.metrics.upstream_retry(&chosen.endpoint);
                    failed_providers.push(key);
                    last_provider_error = Some(e.to_api_error());
                    continue;
                }
                Err(e) => return Err(e.to_api_error()),
            }
        }
        let body = upstream_body(&admitted, &chosen);
        // The upstream's TTFT is measured from here: what the gateway spent before (body,
        // classifiers, limiter, decision) is in `kinference_ttft_seconds`, not the worker's.
        let sent_at = Instant::now();
        let failure = match send(gw, api, headers, &chosen, body).await {
            Err(e) => e,
            Ok(upstream) => {
                // A non-streamed answer is read whole before its head goes out; a client that goes
                // away meanwhile is still accounted against this route.
                let resp = respond(
                    gw,
                    api,
                    chosen,
                    upstream,
                    admitted.inject_usage,
                    (started, sent_at),
                    pending.reservation.take(),
                )
                .await;
                pending.forwarding = None;
                return Ok(hold(resp, stream_slot));
            }
        };
        pending.forwarding = None;
        match failure {
            SendError::Connect(e) if !retried => {
                // Nothing reached the worker: mark it down (health checks bring it back) and
                // decide again once.
                pending.reached_upstream = reached_earlier;
                tracing::warn!(endpoint = %chosen.endpoint, error = %e, "upstream unreachable; retrying on the next best endpoint");
                gw.metrics.upstream_retry(&chosen.endpoint);
                mark_unready(gw, &chosen);
                retried = true;
            }
            SendError::Connect(_) => {
                pending.reached_upstream = reached_earlier;
                mark_unready(gw, &chosen);
                return Err(failure.to_api_error(&chosen));
            }
            SendError::Timeout | SendError::Other(_) => return Err(failure.to_api_error(&chosen)),
        }
    }
}

/// The response of a provider (already in the client's protocol), with the decision's headers;
/// its outcome is reported when the body is over.
fn respond_provider(
    gw: &Arc<Gateway>,
    api: Api,
    chosen: Chosen,
    resp: crate::providers::ProviderResponse,
    (started, streamed): (Instant, bool),
    reservation: Option<crate::tenants::Reservation>,
) -> Response {
    let crate::providers::ProviderResponse {
        status,
        headers,
        body,
        outcome,
    } = resp;
    let builder = response_head(gw, api, status, &headers, &chosen, reservation.as_ref());
    let gw2 = gw.clone();
    tokio::spawn(async move {
        if let Ok(o) = outcome.await {
            let duration_s = started.elapsed().as_secs_f64();
            // The provider's times run from sending; the time before it counts too.
            let before_sending = (duration_s - o.duration_s).max(0.0);
            let obs = ResponseObservation {
                status: o.status,
                ttft_s: o.ttft_s.map(|t| t + before_sending),
                upstream_ttft_s: o.ttft_s,
                mean_itl_s: o.mean_itl_s,
                usage: o.usage,
                completed: o.completed,
                duration_s,
                token_events: o.token_events,
                longest_share: o.longest_share,
                client_gone: o.client_gone,
            };
            report(&gw2, api, &chosen, &obs);
            // Without usage, a stream is charged the tokens seen; a whole answer's output was
            // not counted, so its estimate stays charged.
            settle_or_keep_reservation(reservation, &chosen, &obs, streamed);
        }
    });
    builder.body(Body::from_stream(body)).unwrap_or_else(|e| {
        ApiError::new(StatusCode::BAD_GATEWAY, "upstream_error", e.to_string())
            .into_response_for(api)
    })
}

pub(crate) fn mark_unready(gw: &Gateway, c: &Chosen) {
    gw.state.with(|st| {
        if let Some(ws) = st
            .worker_sets
            .get_mut(format!("{}/{}", c.namespace, c.destination).as_str())
            && let Some(i) = ws.position(&c.endpoint)
        {
            ws.set_ready(i, false);
        }
    });
}

/// A copy of `req` carrying its prompt's block hashes for `block_size`, when it has token ids
/// for at least one block and no hashes yet (`None` otherwise, or when `block_size` is 0:
/// unknown).
fn with_block_hashes(req: &kinf_router::Request, block_size: u32) -> Option<kinf_router::Request> {
    let tokens = req.token_ids.as_ref()?;
    if block_size == 0 || req.block_hashes.is_some() || tokens.len() < block_size as usize {
        return None;
    }
    let mut hashed = req.clone();
    hashed.hash_prompt(block_size as usize);
    Some(hashed)
}

/// Decides under the state lock and notes what the prediction was based on.
/// Decides `req`. With `record`, a local route is recorded in the state (the prompt's blocks
/// claimed on the endpoint, the request counted in flight there until its ticket is dropped);
/// without, the decision leaves the state as it was.
fn decide(
    gw: &Gateway,
    policy: &kinf_lang::CompiledPolicy,
    req: &kinf_router::Request,
    excluded_providers: &[Arc<str>],
    record: bool,
) -> (Decision, Option<Chosen>) {
    let now = gw.state.now_ms();
    let providers = gw.providers.load();
    gw.state.with(|st| {
        if now != st.now_ms {
            st.set_now(now);
        }
        if !st.providers.is_empty() {
            providers.apply_to(st);
            for k in excluded_providers {
                if let Some(p) = st.providers.get_mut(k) {
                    p.ready = false;
                }
            }
        }
        // The gateway shows no traces (`kinfctl explain` does): skip the per-candidate records.
        let d = Decider::decide_with(policy, req, st, kinf_router::TraceDetail::Summary);
        let chosen = d.route().map(|r| {
            let local = r.backend_type == BackendType::Local;
            let uncached_tokens = req.prompt_tokens.saturating_sub(r.cached_tokens);
            let prediction = r.prediction.filter(|_| local);
            let inflight = if local && record {
                let block_size = st.record_routed(
                    &r.namespace,
                    &r.destination,
                    &r.endpoint,
                    req,
                    r.cached_tokens,
                    now,
                );
                if let Some(bs) = block_size {
                    gw.state.note_block_size(req.pool.as_ref(), &req.model, bs);
                }
                st.begin_request(&r.namespace, &r.destination, &r.endpoint, uncached_tokens);
                Some(Arc::new(InFlightTicket {
                    state: gw.state.clone(),
                    namespace: r.namespace.clone(),
                    worker_set: r.destination.clone(),
                    endpoint: r.endpoint.clone(),
                    uncached_tokens,
                    first_token_seen: std::sync::atomic::AtomicBool::new(false),
                }))
            } else {
                None
            };
            Chosen {
                endpoint: r.endpoint.clone(),
                destination: r.destination.clone(),
                namespace: r.namespace.clone(),
                model: r.model.clone(),
                rule: match (&d.policy, &d.rule) {
                    (Some(p), Some(rule)) => format!("{p}/{rule}"),
                    _ => "default".into(),
                },
                headers: r.headers.clone(),
                tenant: req.tenant.clone(),
                requested_model: req.model.clone(),
                cost: destination_cost(policy, &r.namespace, &r.destination, r.backend_type),
                provider: (!local).then(|| Arc::from(format!("{}/{}", r.namespace, r.destination))),
                prompt_tokens: req.prompt_tokens,
                streamed: req.stream,
                uncached_tokens,
                prediction,
                inflight,
                learn_output: None,
            }
        });
        (d, chosen)
    })
}

/// The prices of the destination a route chose. A worker set and a provider may share a
/// namespace and name: the kind tells them apart.
fn destination_cost(
    policy: &kinf_lang::CompiledPolicy,
    namespace: &str,
    name: &str,
    backend: BackendType,
) -> kinf_lang::compiled::CostInfo {
    policy
        .destinations
        .iter()
        .find(|d| &*d.name == name && &*d.namespace == namespace && d.backend == backend)
        .map(|d| d.cost)
        .unwrap_or_default()
}

/// Why a request did not get an answer from its endpoint.
pub(crate) enum SendError {
    /// Not connected: the endpoint never had the request.
    Connect(String),
    /// No response head within `--upstream-timeout`.
    Timeout,
    Other(String),
}

impl SendError {
    /// The client's error for this failure of `c`'s endpoint: 502 `upstream_unreachable`,
    /// 504 `upstream_timeout` or 502 `upstream_error`.
    pub(crate) fn to_api_error(&self, c: &Chosen) -> ApiError {
        match self {
            SendError::Connect(e) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!("endpoint {} is unreachable: {e}", c.endpoint),
            ),
            SendError::Timeout => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!("endpoint {} did not answer in time", c.endpoint),
            ),
            SendError::Other(e) => ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                format!("endpoint {} failed: {e}", c.endpoint),
            ),
        }
    }
}

async fn send(
    gw: &Gateway,
    api: Api,
    headers: &HeaderMap,
    c: &Chosen,
    body: Bytes,
) -> Result<hyper::Response<hyper::body::Incoming>, SendError> {
    send_to(gw, api.path(), headers, c, body).await
}

/// [`send`] to `path` on the chosen endpoint.
pub(crate) async fn send_to(
    gw: &Gateway,
    path: &str,
    headers: &HeaderMap,
    c: &Chosen,
    body: Bytes,
) -> Result<hyper::Response<hyper::body::Incoming>, SendError> {
    let uri = format!("http://{}{path}", c.endpoint);
    let mut b = Request::builder().method("POST").uri(uri);
    for h in FORWARDED_HEADERS.iter() {
        if let Some(v) = headers.get(h) {
            b = b.header(h, v);
        }
    }
    b = b.header(header::CONTENT_TYPE, "application/json");
    for key in ["anthropic-version", "anthropic-beta", "x-request-id"] {
        if let Some(v) = headers.get(key) {
            b = b.header(key, v);
        }
    }
    for (k, v) in &c.headers {
        b = b.header(k.as_str(), v.as_str());
    }
    let req = b
        .body(Full::new(body))
        .map_err(|e| SendError::Other(e.to_string()))?;
    crate::busy_poll::touch();
    let answer =
        tokio::time::timeout(gw.options.upstream_timeout, gw.client.client.request(req)).await;
    crate::busy_poll::touch();
    match answer {
        Err(_) => Err(SendError::Timeout),
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) if e.is_connect() => Err(SendError::Connect(e.to_string())),
        Ok(Err(e)) => Err(SendError::Other(e.to_string())),
    }
}

/// Counts the response and starts it: the upstream's status and headers (less the hop-by-hop
/// and length headers, which the body stream sets again), the decision's `x-kinference-*`
/// headers and the rate-limit headers.
fn response_head(
    gw: &Gateway,
    api: Api,
    status: StatusCode,
    upstream: &HeaderMap,
    chosen: &Chosen,
    reservation: Option<&crate::tenants::Reservation>,
) -> axum::http::response::Builder {
    count_request(
        gw,
        api,
        status.as_u16(),
        if status.is_success() {
            "ok"
        } else {
            "upstream_status"
        },
        &crate::accounting::Who::of(chosen),
    );
    let mut builder = Response::builder().status(status);
    for (k, v) in upstream.iter() {
        if k == header::CONTENT_LENGTH || k == header::TRANSFER_ENCODING || k == header::CONNECTION
        {
            continue;
        }
        builder = builder.header(k, v);
    }
    builder = with_route_headers(builder, chosen);
    for (k, v) in reservation.iter().flat_map(|r| r.headers().pairs()) {
        builder = builder.header(k, v);
    }
    builder
}

/// `builder` with the route's `x-kinference-*` headers (those that are valid header names and
/// values).
pub(crate) fn with_route_headers(
    mut builder: axum::http::response::Builder,
    chosen: &Chosen,
) -> axum::http::response::Builder {
    for (k, v) in &chosen.headers {
        if let (Ok(k), Ok(v)) = (
            HeaderName::try_from(k.as_str()),
            HeaderValue::try_from(v.as_str()),
        ) {
            builder = builder.header(k, v);
        }
    }
    builder
}

/// The worker's response, passed on: a stream through the tap (usage chunk removed when it was
/// injected), a non-streamed body read whole first, so that a failure while reading it is a
/// 502 in the caller's shape rather than a 200 cut short. Its outcome is reported when the
/// response is over.
#[allow(clippy::too_many_arguments)]
async fn respond(
    gw: &Arc<Gateway>,
    api: Api,
    chosen: Chosen,
    upstream: hyper::Response<hyper::body::Incoming>,
    inject_usage: bool,
    (started, sent_at): (Instant, Instant),
    reservation: Option<crate::tenants::Reservation>,
) -> Response {
    let (parts, body) = upstream.into_parts();
    let status = parts.status;
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let answer = if is_sse {
        Ok(Answer::Stream(body))
    } else {
        body.collect().await.map(|c| Answer::Whole(c.to_bytes()))
    };
    let builder = answer.is_ok().then(|| {
        response_head(
            gw,
            api,
            status,
            &parts.headers,
            &chosen,
            reservation.as_ref(),
        )
    });
    let mut fin = Finisher {
        report: Some(Report {
            gw: gw.clone(),
            api,
            chosen,
            started,
            sent_at,
            status: status.as_u16(),
            reservation,
        }),
        tap: SseTap::new(api, inject_usage),
        upstream_ended: !is_sse,
        output_counted: output_known(is_sse, status.as_u16(), answer.is_ok()),
    };
    let (mut builder, answer) = match (builder, answer) {
        (Some(b), Ok(a)) => (b, a),
        (_, answer) => {
            // Accounted (per tenant, objectives) as an answer that did not complete, by the
            // finisher; counted here only among the gateway's responses: the client gets a 502.
            // The worker had the request and what it generated is unknown: the finisher keeps
            // the token estimate charged.
            drop(fin);
            gw.metrics.count_request(api.label(), 502, "upstream_error");
            let why = answer.err().map_or_else(String::new, |e| format!(": {e}"));
            return ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                format!("the upstream's response could not be read whole{why}"),
            )
            .into_response_for(api);
        }
    };
    let body = match answer {
        // Accounted when the tap's stream ends or is dropped.
        Answer::Stream(body) => Body::from_stream(tap_stream(api, body, fin)),
        Answer::Whole(bytes) => {
            fin.tap.observed.usage = body_usage(api, &bytes);
            fin.tap.observed.completed = true;
            // Accounted now: the whole answer is in hand.
            drop(fin);
            match anthropic_error_body(api, status, &bytes) {
                Some(translated) => {
                    if let Some(h) = builder.headers_mut() {
                        h.insert(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static("application/json"),
                        );
                    }
                    Body::from(translated)
                }
                None => Body::from(bytes),
            }
        }
    };
    builder.body(body).unwrap_or_else(|e| {
        ApiError::new(StatusCode::BAD_GATEWAY, "upstream_error", e.to_string())
            .into_response_for(api)
    })
}

/// A worker's error answer (4xx, 5xx) to an Anthropic client, in Anthropic's error shape with
/// the same status when the worker's is not ([`super::errors::anthropic_error_from_upstream`]:
/// vLLM answers some errors of its `/v1/messages` in OpenAI's shape, and the others with its
/// own error types); `None` to pass the body on as it is (a success, another API, or already
/// Anthropic's).
pub(crate) fn anthropic_error_body(api: Api, status: StatusCode, body: &[u8]) -> Option<Bytes> {
    if api != Api::Messages || !(status.is_client_error() || status.is_server_error()) {
        return None;
    }
    let v = super::errors::anthropic_error_from_upstream(status, body)?;
    Some(Bytes::from(v.to_string()))
}

/// A worker's answer: a stream to tap, or a non-streamed body read whole.
enum Answer {
    Stream(hyper::body::Incoming),
    Whole(Bytes),
}

/// Accounting that runs when the response is over, however it ended (a client that goes away
/// drops the stream; what was seen until then is still counted).
struct Finisher {
    report: Option<Report>,
    tap: SseTap,
    /// The upstream body ended (or failed): dropped before that, the client went away.
    upstream_ended: bool,
    /// What the answer generated is known without usage ([`output_known`]): a stream's token
    /// events, or a whole 4xx's nothing. Otherwise, without usage (none in the body, or a body
    /// that could not be read), its estimate stays charged.
    output_counted: bool,
}

impl Finisher {
    /// Tells the in-flight count that the first token arrived (once).
    fn first_token(&self) {
        if let Some(t) = self
            .report
            .as_ref()
            .and_then(|r| r.chosen.inflight.as_ref())
        {
            t.first_token();
        }
    }
}

impl Drop for Finisher {
    fn drop(&mut self) {
        crate::busy_poll::touch();
        if let Some(r) = self.report.take() {
            let mut obs =
                ResponseObservation::from_tap(r.status, &self.tap.observed, r.sent_at, r.started);
            obs.client_gone = !self.upstream_ended && !self.tap.observed.completed;
            report(&r.gw, r.api, &r.chosen, &obs);
            settle_or_keep_reservation(r.reservation, &r.chosen, &obs, self.output_counted);
        }
    }
}

fn tap_stream(
    api: Api,
    body: hyper::body::Incoming,
    fin: Finisher,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let frames = body.into_data_stream();
    futures_util::stream::unfold(Some((frames, fin)), move |st| async move {
        let (mut frames, mut fin) = st?;
        loop {
            match frames.next().await {
                Some(Ok(chunk)) => {
                    let out = fin.tap.feed(&chunk, Instant::now());
                    if fin.tap.observed.tokens.first_token_at.is_some() {
                        fin.first_token();
                    }
                    if !out.is_empty() {
                        return Some((Ok(out), Some((frames, fin))));
                    }
                }
                Some(Err(e)) => {
                    fin.upstream_ended = true;
                    fin.tap.discard_partial();
                    let mut out = Vec::new();
                    let err = ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "upstream_error",
                        format!("the upstream stream failed: {e}"),
                    );
                    out.extend_from_slice(fin.tap.observed.early_end(api, &err).as_bytes());
                    // Dropping the finisher here accounts what was seen.
                    drop(fin);
                    return Some((Ok(Bytes::from(out)), None));
                }
                None => {
                    fin.upstream_ended = true;
                    let completed = fin.tap.observed.completed;
                    let mut out = Vec::new();
                    if completed {
                        out.extend_from_slice(&fin.tap.finish());
                    } else {
                        fin.tap.discard_partial();
                        let err = ApiError::new(
                            StatusCode::BAD_GATEWAY,
                            "upstream_incomplete",
                            "the upstream ended the stream before it was complete",
                        );
                        out.extend_from_slice(fin.tap.observed.early_end(api, &err).as_bytes());
                    }
                    drop(fin);
                    if out.is_empty() {
                        return None;
                    }
                    return Some((Ok(Bytes::from(out)), None));
                }
            }
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_ttft_runs_from_forwarding_and_the_clients_from_receipt() {
        use std::time::Duration;
        let started = Instant::now();
        // 40 ms in the gateway (body, classifiers, limiter, decision), then 100 ms upstream.
        let sent_at = started + Duration::from_millis(40);
        let mut o = super::super::sse_tap::Observed::default();
        o.tokens.token(0, sent_at + Duration::from_millis(100));
        let obs = ResponseObservation::from_tap(200, &o, sent_at, started);
        assert!((obs.ttft_s.unwrap() - 0.140).abs() < 1e-9, "{obs:?}");
        assert!(
            (obs.upstream_ttft_s.unwrap() - 0.100).abs() < 1e-9,
            "{obs:?}"
        );
    }

    #[test]
    fn a_provider_is_priced_at_its_own_cost_when_a_worker_set_has_its_name() {
        let text = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: llm, namespace: team }
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [ { name: m } ]
  cost: { uncachedPromptPerMillion: 1, outputPerMillion: 2 }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceProvider
metadata: { name: llm, namespace: team }
spec:
  type: OpenAI
  url: https://api.example.com/v1
  credentials: { env: KEY }
  models: [ { name: m, providerModel: m-large } ]
  cost: { uncachedPromptPerMillion: 10, outputPerMillion: 30 }
"#;
        let (_, c) = kinf_lang::compile_str("cluster.yaml", text);
        let policy = c.policy.unwrap();
        let local = destination_cost(&policy, "team", "llm", BackendType::Local);
        let provider = destination_cost(&policy, "team", "llm", BackendType::Provider);
        assert_eq!((local.uncached_prompt, local.output), (1.0, 2.0));
        assert_eq!((provider.uncached_prompt, provider.output), (10.0, 30.0));
    }

    #[test]
    fn prompts_are_hashed_before_the_lock_once_the_block_size_is_known() {
        let tokens: Arc<[u32]> = (0..100u32).collect();
        let mut req = kinf_router::Request::new("m", 100);
        req.token_ids = Some(tokens.clone());
        // No local decision yet: the block size is unknown, the decision hashes.
        assert!(with_block_hashes(&req, 0).is_none());
        // Three full blocks of 32 (the trailing partial block is never cached).
        let hashed = with_block_hashes(&req, 32).unwrap();
        let (bs, h) = hashed.block_hashes.clone().unwrap();
        assert_eq!(bs, 32);
        assert_eq!(
            &h[..],
            &kinf_router::prefix_index::block_hashes(&tokens, 32)[..]
        );
        assert_eq!(h.len(), 3);
        assert_eq!(hashed.token_ids, req.token_ids, "the token ids stay");
        // Hashed already, shorter than a block, or no token ids: nothing to do.
        assert!(with_block_hashes(&hashed, 32).is_none());
        assert!(with_block_hashes(&req, 128).is_none());
        req.token_ids = None;
        assert!(with_block_hashes(&req, 32).is_none());
    }

    #[test]
    fn the_block_size_hint_follows_the_last_local_decision_per_pool_and_model() {
        let st = crate::live::SharedState::new(kinf_router::ClusterState::default());
        let (a, b): (Arc<str>, Arc<str>) = ("model-a".into(), "model-b".into());
        let pool: Arc<str> = "team/pool".into();
        assert_eq!(st.block_size_hint(None, &a), 0);
        st.note_block_size(None, &a, 16);
        st.note_block_size(None, &b, 32);
        st.note_block_size(Some(&pool), &a, 64);
        assert_eq!(st.block_size_hint(None, &a), 16);
        assert_eq!(
            st.block_size_hint(None, &b),
            32,
            "another model keeps its own"
        );
        assert_eq!(
            st.block_size_hint(Some(&pool), &a),
            64,
            "another pool keeps its own"
        );
        st.note_block_size(None, &a, 32);
        assert_eq!(st.block_size_hint(None, &a), 32, "the last decision wins");
        st.note_block_size(None, &a, usize::MAX);
        assert_eq!(
            st.block_size_hint(None, &a),
            0,
            "a size no u32 holds is unknown"
        );
        // Bounded: past the limit the hints start over.
        for i in 0..crate::live::MAX_BLOCK_SIZE_HINTS {
            st.note_block_size(None, &Arc::from(format!("m{i}")), 16);
        }
        assert_eq!(st.block_size_hint(None, &b), 0, "the full map started over");
        assert_eq!(st.block_size_hint(None, &Arc::from("m4095")), 16);
    }
}
