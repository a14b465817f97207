//! Clients of external inference providers (`InferenceProvider`): OpenAI-compatible APIs,
//! Anthropic's Messages API and AWS Bedrock's Converse API, with protocol translation both ways
//! (streams included), per-provider concurrency limits, passive health with a circuit breaker,
//! and the observed time-to-first-token.
//!
//! One [`ProviderPool`] per gateway, rebuilt on each applied policy
//! ([`ProviderPool::from_policy`], keeping the health and TTFT of unchanged providers). The
//! gateway calls [`ProviderPool::forward`] for a decision that routes to a provider; an `Err`
//! always comes before any byte reached the client, so the gateway may fall through to the next
//! provider when [`ProviderError::fall_through`] is set. [`ProviderPool::state_snapshot`] and
//! [`ProviderPool::apply_to`] feed `ready`, `in_flight` and `ttft_s` to the decision engine.
//! See `docs/reference/providers.md`.

pub mod bedrock;
pub mod credentials;
pub mod health;
pub mod stream;
pub mod translate;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use ahash::AHashMap;
use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kinf_lang::compiled::ProviderInfo;
use kinf_policy::ProviderType;
use kinf_router::usage::TokenUsage;
use serde_json::{Map, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::gateway::errors::{Api, ApiError};
use crate::gateway::sse_tap::{SseTap, body_usage};
use credentials::{CredentialError, CredentialSource, ProviderCredentials};
use health::{Admission, Breaker, BreakerState, TtftStats, Verdict};
use stream::{ClientEncoder, Ev, ProviderDecoder};

/// The `anthropic-version` header sent to Anthropic.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Pool-wide settings.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Consecutive failures that open a provider's breaker.
    pub failure_threshold: u32,
    /// How long an open breaker refuses requests before letting one probe through.
    pub cool_down: Duration,
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Duration,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            failure_threshold: 5,
            cool_down: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
        }
    }
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn build_client(opts: &PoolOptions) -> Option<HttpsClient> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(opts.connect_timeout));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .ok()?
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http);
    Some(
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(https),
    )
}

#[derive(Debug)]
struct Health {
    breaker: Breaker,
    ttft: TtftStats,
}

/// One provider's client and live state.
struct Provider {
    key: Arc<str>,
    info: ProviderInfo,
    creds: Result<ProviderCredentials, CredentialError>,
    client: Option<HttpsClient>,
    limit: Option<Arc<Semaphore>>,
    in_flight: AtomicU32,
    health: parking_lot::Mutex<Health>,
    /// Consecutive failed active probes (`GET …/models`); not ready from
    /// [`PROBE_FAILURES_UNREADY`] on.
    probe_failures: AtomicU32,
}

/// Consecutive failed active probes after which a provider is not ready.
pub const PROBE_FAILURES_UNREADY: u32 = 3;

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("key", &self.key)
            .field("protocol", &self.info.protocol)
            .field("url", &self.info.url)
            .field("credentials", &self.creds)
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A provider's state for the decision engine and `/admin/status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderSnapshot {
    /// Breaker admits requests, credentials resolved, and below the concurrency limit.
    pub ready: bool,
    /// Requests in flight.
    pub in_flight: u32,
    /// Observed TTFT moving average (streamed responses), once observed.
    pub ttft_s: Option<f64>,
    /// Median of the recent TTFT samples.
    pub ttft_p50_s: Option<f64>,
    /// 90th percentile of the recent TTFT samples.
    pub ttft_p90_s: Option<f64>,
    /// TTFT samples seen.
    pub ttft_samples: u64,
    /// Configured expected TTFT (used until observed).
    pub expected_ttft_s: f64,
    /// Breaker state.
    pub breaker: BreakerState,
    /// Consecutive failures.
    pub consecutive_failures: u32,
    /// Credentials resolved.
    pub credentials_ok: bool,
}

/// Clients of every provider of a policy, keyed by `namespace/name`.
#[derive(Debug, Default)]
pub struct ProviderPool {
    providers: AHashMap<Arc<str>, Arc<Provider>>,
}

/// Why a request to a provider failed. Always before the first byte reached the client.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderError {
    /// What kind of failure.
    pub kind: ProviderErrorKind,
    /// HTTP status to send when no other provider takes the request.
    pub status: StatusCode,
    /// Machine-readable code (`provider_busy`, `provider_timeout`, ...).
    pub code: &'static str,
    /// What went wrong (never credentials).
    pub message: String,
    /// Always true for errors returned by [`ProviderPool::forward`]: nothing was sent to the
    /// client. Failures after the first byte end the stream with an error event instead.
    pub before_first_byte: bool,
    /// The gateway may try the next provider in `order` (false when the request itself is at
    /// fault, e.g. a 400 from the provider).
    pub fall_through: bool,
    /// The provider's own `retry-after` (seconds) on a 429, passed on to the client.
    pub retry_after_s: Option<u64>,
    /// The request field at fault (an untranslatable request: `tools`, `n`, ...).
    pub param: Option<String>,
}

/// Kinds of [`ProviderError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderErrorKind {
    /// No provider by that key in the pool.
    Unknown,
    /// The credentials could not be resolved.
    Credentials,
    /// The circuit breaker is open.
    CircuitOpen,
    /// At its concurrency limit.
    Busy,
    /// The request cannot be translated to the provider's protocol.
    Untranslatable,
    /// Connection failed.
    Connect,
    /// No first byte within the timeout.
    Timeout,
    /// The provider answered with an error status.
    Status(u16),
    /// The provider's answer could not be read or translated.
    Protocol,
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProviderError {}

impl ProviderError {
    fn new(
        kind: ProviderErrorKind,
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
        fall_through: bool,
    ) -> Self {
        ProviderError {
            kind,
            status,
            code,
            message: message.into(),
            before_first_byte: true,
            fall_through,
            retry_after_s: None,
            param: None,
        }
    }

    /// Whether the provider may have received the request: it answered (an error status, an
    /// unreadable answer) or did not answer in time. `false` for failures before anything was
    /// sent (unknown provider, credentials, circuit open, busy, untranslatable) and for a
    /// connection that failed.
    pub fn reached_provider(&self) -> bool {
        matches!(
            self.kind,
            ProviderErrorKind::Timeout | ProviderErrorKind::Status(_) | ProviderErrorKind::Protocol
        )
    }

    /// The error to send to the client (in its API's shape with
    /// [`ApiError::into_response_for`]).
    pub fn to_api_error(&self) -> ApiError {
        let mut e = ApiError::new(self.status, self.code, self.message.clone());
        e.param.clone_from(&self.param);
        if matches!(
            self.kind,
            ProviderErrorKind::Busy | ProviderErrorKind::CircuitOpen
        ) || self.status == StatusCode::TOO_MANY_REQUESTS
        {
            e.retry_after_s = Some(self.retry_after_s.unwrap_or(1).max(1));
        }
        e
    }
}

/// What was observed of a provider response, sent once when its body is over (completed, failed
/// or dropped by the client).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderOutcome {
    /// Provider HTTP status.
    pub status: u16,
    /// Usage, as the provider reported it.
    pub usage: Option<TokenUsage>,
    /// Time from sending the request to the first token (streamed responses).
    pub ttft_s: Option<f64>,
    /// Mean gap between consecutive tokens of a sequence (streamed, two tokens or more).
    pub mean_itl_s: Option<f64>,
    /// The longest choice's share of the streamed tokens (see
    /// [`crate::gateway::sse_tap::TokenTimes::longest_share`]).
    pub longest_share: f64,
    /// The response ended properly.
    pub completed: bool,
    /// Time from sending the request to the end of the response.
    pub duration_s: f64,
    /// Token-carrying events seen (streamed responses): what a response cut short before its
    /// usage is charged for.
    pub token_events: u64,
    /// The client went away before the provider's answer ended (a stream it abandoned).
    pub client_gone: bool,
}

/// How [`ProviderPool::forward_with`] sends a request and shapes its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardOptions {
    /// The client asked for a stream.
    pub stream: bool,
    /// An OpenAI streaming client asked for `stream_options.include_usage` itself (pass
    /// `!admitted.inject_usage`): if not, the usage chunk is removed from the stream.
    pub usage_requested: bool,
    /// The gateway's estimate of the prompt's tokens (the count it admitted the request
    /// with). A translated stream to an Anthropic client reports it as `input_tokens` in
    /// `message_start`, which comes before the provider's counts do; the provider's own
    /// counts follow in `message_delta`, which replace it (`None`: 0 is reported).
    pub prompt_estimate: Option<u64>,
}

/// The body stream: bytes in the client's protocol.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// A provider response, already in the client's protocol.
pub struct ProviderResponse {
    /// Status for the client.
    pub status: StatusCode,
    /// Headers for the client (`content-type`, `cache-control`).
    pub headers: HeaderMap,
    /// The body (JSON, or SSE when streamed).
    pub body: BodyStream,
    /// Resolves once the body is over, with usage and timings.
    pub outcome: oneshot::Receiver<ProviderOutcome>,
}

impl std::fmt::Debug for ProviderResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl ProviderPool {
    /// A pool for every provider destination of `policy`. Providers whose `ProviderInfo` is
    /// unchanged from `previous` keep their state (breaker, TTFT, in-flight count, client).
    pub fn from_policy(
        policy: &kinf_lang::CompiledPolicy,
        source: &dyn CredentialSource,
        options: &PoolOptions,
        previous: Option<&ProviderPool>,
    ) -> Self {
        Self::from_providers(
            policy.destinations.iter().filter_map(|d| {
                d.provider
                    .as_ref()
                    .map(|p| (d.namespace.clone(), d.name.clone(), p.clone()))
            }),
            source,
            options,
            previous,
        )
    }

    /// A pool of `(namespace, name, info)` providers.
    pub fn from_providers(
        providers: impl IntoIterator<Item = (Arc<str>, Arc<str>, ProviderInfo)>,
        source: &dyn CredentialSource,
        options: &PoolOptions,
        previous: Option<&ProviderPool>,
    ) -> Self {
        let client = build_client(options);
        let mut out = AHashMap::new();
        for (ns, name, info) in providers {
            let key: Arc<str> = format!("{ns}/{name}").into();
            let creds = match info.protocol {
                ProviderType::Bedrock => {
                    credentials::resolve_aws(source, &ns, info.credentials.as_ref())
                }
                _ => credentials::resolve_api_key(source, &ns, info.credentials.as_ref()),
            };
            if let Some(old) = previous.and_then(|p| p.providers.get(&key))
                && old.info == info
                && old.creds == creds
            {
                out.insert(key, old.clone());
                continue;
            }
            if let Err(e) = &creds {
                tracing::warn!(provider = %key, error = %e, "provider credentials unresolved");
            }
            let limit = info
                .max_concurrency
                .map(|n| Arc::new(Semaphore::new(n as usize)));
            out.insert(
                key.clone(),
                Arc::new(Provider {
                    key,
                    creds,
                    client: client.clone(),
                    limit,
                    in_flight: AtomicU32::new(0),
                    probe_failures: AtomicU32::new(0),
                    health: parking_lot::Mutex::new(Health {
                        breaker: Breaker::new(options.failure_threshold, options.cool_down),
                        ttft: TtftStats::default(),
                    }),
                    info,
                }),
            );
        }
        ProviderPool { providers: out }
    }

    /// Keys (`namespace/name`) of the providers.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<str>> {
        self.providers.keys()
    }

    /// Probes every provider whose API has a cheap read-only call (`GET /v1/models` of
    /// OpenAI-compatible and Anthropic APIs; Bedrock's runtime API has none, so it relies on
    /// passive health): a 2xx answer within the timeout resets its probe failures, anything
    /// else counts one. Returns how many probes failed.
    pub async fn probe_once(&self) -> usize {
        let probes = self.providers.values().filter_map(|p| {
            let path = match p.info.protocol {
                ProviderType::OpenAI => {
                    let url = p.info.url.trim_end_matches('/');
                    let has_path = url
                        .split_once("://")
                        .map(|(_, rest)| rest.contains('/'))
                        .unwrap_or(false);
                    if has_path { "/models" } else { "/v1/models" }
                }
                ProviderType::Anthropic => {
                    if p.info.url.trim_end_matches('/').ends_with("/v1") {
                        "/models"
                    } else {
                        "/v1/models"
                    }
                }
                ProviderType::Bedrock => return None,
            };
            let client = p.client.clone()?;
            let creds = p.creds.as_ref().ok()?;
            let mut b = Request::builder()
                .method("GET")
                .uri(join_url(&p.info.url, path));
            match (p.info.protocol, creds) {
                (ProviderType::OpenAI, ProviderCredentials::ApiKey(k)) => {
                    let mut v = HeaderValue::from_str(&format!("Bearer {}", k.expose())).ok()?;
                    v.set_sensitive(true);
                    b = b.header(header::AUTHORIZATION, v);
                }
                (ProviderType::Anthropic, c) => {
                    b = b.header("anthropic-version", ANTHROPIC_VERSION);
                    if let ProviderCredentials::ApiKey(k) = c {
                        let mut v = HeaderValue::from_str(k.expose()).ok()?;
                        v.set_sensitive(true);
                        b = b.header("x-api-key", v);
                    }
                }
                _ => {}
            }
            let req = b.body(Full::new(Bytes::new())).ok()?;
            let timeout = p.info.timeout.min(Duration::from_secs(5));
            Some(async move {
                let ok = matches!(
                    tokio::time::timeout(timeout, client.request(req)).await,
                    Ok(Ok(r)) if r.status().is_success()
                );
                if ok {
                    p.probe_failures.store(0, Ordering::Relaxed);
                } else {
                    let n = p.probe_failures.fetch_add(1, Ordering::Relaxed) + 1;
                    if n == PROBE_FAILURES_UNREADY {
                        tracing::warn!(provider = %p.key, "provider failing its health probes: not ready");
                    }
                }
                !ok
            })
        });
        futures_util::future::join_all(probes)
            .await
            .into_iter()
            .filter(|failed| *failed)
            .count()
    }

    /// Probes the pool every `every` until it is dropped (the task holds a weak reference).
    pub fn spawn_prober(self: &Arc<Self>, every: Duration) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(pool) = weak.upgrade() else { break };
                pool.probe_once().await;
            }
        });
    }

    /// Every provider's state now.
    pub fn state_snapshot(&self) -> Vec<(Arc<str>, ProviderSnapshot)> {
        let now = Instant::now();
        self.providers
            .iter()
            .map(|(k, p)| {
                let h = p.health.lock();
                let full = p.limit.as_ref().is_some_and(|s| s.available_permits() == 0);
                let snap = ProviderSnapshot {
                    ready: p.creds.is_ok()
                        && h.breaker.would_admit(now)
                        && !full
                        && p.probe_failures.load(Ordering::Relaxed) < PROBE_FAILURES_UNREADY,
                    in_flight: p.in_flight.load(Ordering::Relaxed),
                    ttft_s: h.ttft.mean(),
                    ttft_p50_s: h.ttft.quantile(0.5),
                    ttft_p90_s: h.ttft.quantile(0.9),
                    ttft_samples: h.ttft.count(),
                    expected_ttft_s: p.info.expected_ttft.as_secs_f64(),
                    breaker: h.breaker.state(now),
                    consecutive_failures: h.breaker.failures(),
                    credentials_ok: p.creds.is_ok(),
                };
                (k.clone(), snap)
            })
            .collect()
    }

    /// Why each provider whose credentials could not be resolved has none (never the
    /// credentials themselves), by `namespace/name`.
    pub fn credential_errors(&self) -> Vec<(Arc<str>, String)> {
        self.providers
            .iter()
            .filter_map(|(k, p)| p.creds.as_ref().err().map(|e| (k.clone(), e.to_string())))
            .collect()
    }

    /// Copies `ready`, `in_flight` and `ttft_s` of every provider into `st.providers`.
    pub fn apply_to(&self, st: &mut kinf_router::ClusterState) {
        for (k, s) in self.state_snapshot() {
            st.providers.insert(
                k,
                kinf_router::state::ProviderState {
                    ready: s.ready,
                    in_flight: s.in_flight,
                    ttft_s: s.ttft_s,
                },
            );
        }
    }

    /// Sends a client request to provider `key` with `provider_model`, translated to its
    /// protocol. `body` is the client's request as parsed (its `model` is replaced);
    /// `usage_requested` says whether an OpenAI streaming client asked for
    /// `stream_options.include_usage` itself (pass `!admitted.inject_usage`): if not, the usage
    /// chunk is removed from the stream. Returns once the response headers and, for a stream,
    /// its first bytes arrived within the provider's timeout. [`ProviderPool::forward_with`]
    /// with no prompt estimate.
    pub async fn forward(
        &self,
        key: &str,
        client_api: Api,
        body: Map<String, Value>,
        provider_model: &str,
        stream: bool,
        usage_requested: bool,
    ) -> Result<ProviderResponse, ProviderError> {
        let opts = ForwardOptions {
            stream,
            usage_requested,
            prompt_estimate: None,
        };
        self.forward_with(key, client_api, body, provider_model, opts)
            .await
    }

    /// [`ProviderPool::forward`], with the gateway's estimate of the prompt's tokens for what
    /// a translated stream reports before the provider's counts (see [`ForwardOptions`]).
    pub async fn forward_with(
        &self,
        key: &str,
        client_api: Api,
        body: Map<String, Value>,
        provider_model: &str,
        opts: ForwardOptions,
    ) -> Result<ProviderResponse, ProviderError> {
        let Some(p) = self.providers.get(key).cloned() else {
            return Err(ProviderError::new(
                ProviderErrorKind::Unknown,
                StatusCode::BAD_GATEWAY,
                "provider_unknown",
                format!("provider `{key}` is not configured"),
                true,
            ));
        };
        forward_to(p, client_api, body, provider_model, opts).await
    }
}

/// Releases the concurrency slot, records the breaker verdict and TTFT, sends the outcome.
struct Guard {
    provider: Arc<Provider>,
    _permit: Option<OwnedSemaphorePermit>,
    admission: Admission,
    verdict: Verdict,
    sent_at: Instant,
    status: u16,
    tokens: crate::gateway::sse_tap::TokenTimes,
    usage: Option<TokenUsage>,
    completed: bool,
    /// The provider's answer ended (whole, or with an error); dropped before that, the client
    /// went away.
    provider_ended: bool,
    tx: Option<oneshot::Sender<ProviderOutcome>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let now = Instant::now();
        let ttft = self
            .tokens
            .first_token_at
            .map(|t| t.duration_since(self.sent_at).as_secs_f64());
        {
            let mut h = self.provider.health.lock();
            h.breaker.record(self.admission, self.verdict, now);
            if let Some(t) = ttft {
                h.ttft.observe(t);
            }
        }
        self.provider.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(ProviderOutcome {
                status: self.status,
                usage: self.usage,
                ttft_s: ttft,
                mean_itl_s: self.tokens.mean_itl_s(),
                longest_share: self.tokens.longest_share(),
                completed: self.completed,
                duration_s: now.duration_since(self.sent_at).as_secs_f64(),
                token_events: self.tokens.token_events,
                client_gone: !self.provider_ended && !self.completed,
            });
        }
    }
}

fn scrub(msg: &str, creds: &ProviderCredentials) -> String {
    let mut m = msg.to_string();
    for s in creds.secret_values() {
        m = m.replace(s, "***");
    }
    m.chars().take(500).collect()
}

fn join_url(base: &str, path: &str) -> String {
    format!("{}{}", base.trim_end_matches('/'), path)
}

/// The URL and body for the provider, and the stop sequences a translated body carries (see
/// [`translate::matched_stop`]; none for a pass-through).
fn provider_request(
    p: &Provider,
    client_api: Api,
    mut body: Map<String, Value>,
    model: &str,
    stream: bool,
) -> Result<(String, Vec<u8>, Vec<String>), ProviderError> {
    let url = p.info.url.trim_end_matches('/');
    let has_path = url
        .split_once("://")
        .map(|(_, rest)| rest.contains('/'))
        .unwrap_or(false);
    let untrans = |e: translate::Untranslatable| ProviderError {
        param: Some(e.param.to_string()),
        ..ProviderError::new(
            ProviderErrorKind::Untranslatable,
            StatusCode::BAD_REQUEST,
            "provider_untranslatable",
            format!("`{}`: {}", e.param, e.message),
            true,
        )
    };
    let mut stops = Vec::new();
    let (path, body) = match (p.info.protocol, client_api) {
        (ProviderType::OpenAI, Api::Chat | Api::Completions) => {
            body.insert("model".into(), model.into());
            // Only when configured: unset, the client's choice of field passes through. (The
            // legacy completions API has only `max_tokens`.)
            if let Some(field) = p.info.max_tokens_field
                && client_api == Api::Chat
            {
                translate::set_max_tokens_field(&mut body, field);
            }
            if stream {
                let opts = body
                    .entry("stream_options")
                    .or_insert_with(|| Value::Object(Map::new()));
                // `"stream_options": null` is as if it were absent.
                if opts.is_null() {
                    *opts = Value::Object(Map::new());
                }
                if let Value::Object(o) = opts {
                    o.insert("include_usage".into(), Value::Bool(true));
                }
            }
            let suffix = if client_api == Api::Chat {
                "/chat/completions"
            } else {
                "/completions"
            };
            let prefix = if has_path { "" } else { "/v1" };
            (format!("{prefix}{suffix}"), body)
        }
        (ProviderType::Anthropic, Api::Messages) => {
            body.insert("model".into(), model.into());
            (anthropic_path(url), body)
        }
        (ProviderType::OpenAI, Api::Messages) => {
            let r = translate::parse_client(client_api, &body).map_err(untrans)?;
            translate::check_stop_count(&r, client_api, p.info.protocol).map_err(untrans)?;
            stops = translate::sent_stops(&r, p.info.protocol);
            let prefix = if has_path { "" } else { "/v1" };
            (
                format!("{prefix}/chat/completions"),
                translate::to_openai(
                    &r,
                    model,
                    stream,
                    p.info.max_tokens_field.unwrap_or_default(),
                ),
            )
        }
        (ProviderType::Anthropic, _) => {
            let r = translate::parse_client(client_api, &body).map_err(untrans)?;
            translate::check_anthropic(&r).map_err(untrans)?;
            stops = translate::sent_stops(&r, p.info.protocol);
            (
                anthropic_path(url),
                translate::to_anthropic(&r, model, stream),
            )
        }
        (ProviderType::Bedrock, _) => {
            let mut r = translate::parse_client(client_api, &body).map_err(untrans)?;
            translate::check_bedrock(&r).map_err(untrans)?;
            translate::check_stop_count(&r, client_api, p.info.protocol).map_err(untrans)?;
            if !translate::bedrock_caches(model) {
                r.forget_cache_points();
            }
            stops = translate::sent_stops(&r, p.info.protocol);
            let mut body = translate::to_bedrock(&r);
            translate::ask_claude_stop_sequence(&mut body, model);
            (bedrock::converse_path(model, stream), body)
        }
    };
    let bytes = serde_json::to_vec(&Value::Object(body)).map_err(|e| {
        ProviderError::new(
            ProviderErrorKind::Protocol,
            StatusCode::BAD_GATEWAY,
            "provider_error",
            e.to_string(),
            true,
        )
    })?;
    Ok((join_url(url, &path), bytes, stops))
}

fn anthropic_path(url: &str) -> String {
    if url.ends_with("/v1") {
        "/messages".into()
    } else {
        "/v1/messages".into()
    }
}

fn is_passthrough(protocol: ProviderType, api: Api) -> bool {
    matches!(
        (protocol, api),
        (ProviderType::OpenAI, Api::Chat | Api::Completions)
            | (ProviderType::Anthropic, Api::Messages)
    )
}

fn build_http_request(
    p: &Provider,
    creds: &ProviderCredentials,
    url: &str,
    body: Vec<u8>,
    stream: bool,
) -> Result<Request<Full<Bytes>>, ProviderError> {
    let internal = |m: String| {
        ProviderError::new(
            ProviderErrorKind::Protocol,
            StatusCode::BAD_GATEWAY,
            "provider_error",
            m,
            true,
        )
    };
    let mut b = Request::builder()
        .method("POST")
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json");
    let accept = match (p.info.protocol, stream) {
        (ProviderType::Bedrock, true) => "application/vnd.amazon.eventstream",
        (_, true) => "text/event-stream",
        (_, false) => "application/json",
    };
    b = b.header(header::ACCEPT, accept);
    match (p.info.protocol, creds) {
        (ProviderType::OpenAI, ProviderCredentials::ApiKey(k)) => {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", k.expose()))
                .map_err(|_| internal("the API key is not a valid header value".into()))?;
            v.set_sensitive(true);
            b = b.header(header::AUTHORIZATION, v);
        }
        (ProviderType::Anthropic, c) => {
            b = b.header("anthropic-version", ANTHROPIC_VERSION);
            if let ProviderCredentials::ApiKey(k) = c {
                let mut v = HeaderValue::from_str(k.expose())
                    .map_err(|_| internal("the API key is not a valid header value".into()))?;
                v.set_sensitive(true);
                b = b.header("x-api-key", v);
            }
        }
        (ProviderType::Bedrock, ProviderCredentials::Aws(aws)) => {
            let region = p.info.region.as_deref().unwrap_or("us-east-1");
            let signed = bedrock::sign(
                aws,
                region,
                bedrock::SERVICE,
                "POST",
                url,
                &[("content-type", "application/json"), ("accept", accept)],
                &body,
                SystemTime::now(),
            )
            .map_err(internal)?;
            for (k, v) in signed {
                let mut v = HeaderValue::from_str(&v)
                    .map_err(|_| internal("a SigV4 header is not a valid value".into()))?;
                v.set_sensitive(true);
                b = b.header(k.as_str(), v);
            }
        }
        _ => {}
    }
    b.body(Full::new(Bytes::from(body)))
        .map_err(|e| internal(format!("invalid provider request: {e}")))
}

async fn forward_to(
    p: Arc<Provider>,
    client_api: Api,
    body: Map<String, Value>,
    model: &str,
    opts: ForwardOptions,
) -> Result<ProviderResponse, ProviderError> {
    let ForwardOptions {
        stream,
        usage_requested,
        prompt_estimate,
    } = opts;
    let key = p.key.clone();
    let creds = match &p.creds {
        Ok(c) => c.clone(),
        Err(e) => {
            return Err(ProviderError::new(
                ProviderErrorKind::Credentials,
                StatusCode::BAD_GATEWAY,
                "provider_credentials",
                format!("provider `{key}`: {e}"),
                true,
            ));
        }
    };
    let Some(client) = p.client.clone() else {
        return Err(ProviderError::new(
            ProviderErrorKind::Protocol,
            StatusCode::BAD_GATEWAY,
            "provider_error",
            "no HTTPS client could be built",
            true,
        ));
    };
    let (url, req_body, sent_stops) = provider_request(&p, client_api, body, model, stream)?;
    let permit = match &p.limit {
        None => None,
        Some(s) => Some(s.clone().try_acquire_owned().map_err(|_| {
            ProviderError::new(
                ProviderErrorKind::Busy,
                StatusCode::SERVICE_UNAVAILABLE,
                "provider_busy",
                format!("provider `{key}` is at its concurrency limit"),
                true,
            )
        })?),
    };
    let Some(admission) = p.health.lock().breaker.admit(Instant::now()) else {
        return Err(ProviderError::new(
            ProviderErrorKind::CircuitOpen,
            StatusCode::SERVICE_UNAVAILABLE,
            "provider_unavailable",
            format!("provider `{key}` is failing; its circuit breaker is open"),
            true,
        ));
    };
    p.in_flight.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = oneshot::channel();
    let sent_at = Instant::now();
    let mut guard = Guard {
        provider: p.clone(),
        _permit: permit,
        admission,
        verdict: Verdict::Neutral,
        sent_at,
        status: 0,
        tokens: Default::default(),
        usage: None,
        completed: false,
        provider_ended: false,
        tx: Some(tx),
    };
    let timeout = p.info.timeout;
    let deadline = tokio::time::Instant::now() + timeout;
    let req = build_http_request(&p, &creds, &url, req_body, stream)?;
    // The provider answered something that cannot be used (read failed, unreadable, an error
    // before any token): its failure, and the next provider may take the request.
    let failed = |message: String| {
        ProviderError::new(
            ProviderErrorKind::Protocol,
            StatusCode::BAD_GATEWAY,
            "provider_error",
            scrub(&message, &creds),
            true,
        )
    };
    let timed_out = |what: &str| {
        ProviderError::new(
            ProviderErrorKind::Timeout,
            StatusCode::GATEWAY_TIMEOUT,
            "provider_timeout",
            format!(
                "provider `{key}` did not {what} within {:.3}s",
                timeout.as_secs_f64()
            ),
            true,
        )
    };
    let resp = match tokio::time::timeout_at(deadline, client.request(req)).await {
        Err(_) => {
            guard.verdict = Verdict::Failure;
            return Err(timed_out("answer"));
        }
        Ok(Err(e)) => {
            guard.verdict = Verdict::Failure;
            // Not connected: the provider never had the request. Failed later (the connection
            // dropped after the request was written): it may have, and started generating.
            let (kind, what) = if e.is_connect() {
                (ProviderErrorKind::Connect, "is unreachable")
            } else {
                (ProviderErrorKind::Protocol, "failed")
            };
            return Err(ProviderError::new(
                kind,
                StatusCode::BAD_GATEWAY,
                "provider_unreachable",
                scrub(&format!("provider `{key}` {what}: {e}"), &creds),
                true,
            ));
        }
        Ok(Ok(r)) => r,
    };
    let (parts, incoming) = resp.into_parts();
    guard.status = parts.status.as_u16();
    let mut frames = incoming.into_data_stream();
    if !parts.status.is_success() {
        let body = tokio::time::timeout_at(deadline, async {
            let mut buf = Vec::new();
            while let Some(Ok(c)) = frames.next().await {
                buf.extend_from_slice(&c);
                if buf.len() > 64 * 1024 {
                    break;
                }
            }
            buf
        })
        .await
        .unwrap_or_default();
        let upstream_msg = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| translate::provider_error_message(&v))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        let s = parts.status.as_u16();
        let (status, code, fall, verdict) = match s {
            429 => (
                StatusCode::TOO_MANY_REQUESTS,
                "provider_rate_limited",
                true,
                Verdict::Neutral,
            ),
            401 | 403 => (
                StatusCode::BAD_GATEWAY,
                "provider_auth",
                true,
                Verdict::Failure,
            ),
            // 404: the provider does not know the configured `providerModel` (a
            // misconfiguration, not the client's fault); 424: Bedrock's ModelErrorException, the
            // model failed.
            404 | 408 | 424 | 500.. => (
                StatusCode::BAD_GATEWAY,
                "provider_error",
                true,
                Verdict::Failure,
            ),
            _ => (parts.status, "provider_rejected", false, Verdict::Neutral),
        };
        guard.verdict = verdict;
        let mut err = ProviderError::new(
            ProviderErrorKind::Status(s),
            status,
            code,
            scrub(
                &format!("provider `{key}` answered {s}: {upstream_msg}"),
                &creds,
            ),
            fall,
        );
        // Whole seconds only (an HTTP date is not followed: the default of 1 s applies).
        err.retry_after_s = (s == 429)
            .then(|| parts.headers.get(http::header::RETRY_AFTER))
            .flatten()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|n| n.min(3600));
        return Err(err);
    }
    let mut headers = HeaderMap::new();
    let protocol = p.info.protocol;
    let passthrough = is_passthrough(protocol, client_api);
    if !stream {
        let collected = tokio::time::timeout_at(
            deadline,
            frames.fold(Ok(Vec::new()), |acc, c| async move {
                let mut acc = acc?;
                acc.extend_from_slice(&c?);
                Ok::<_, hyper::Error>(acc)
            }),
        )
        .await;
        let bytes = match collected {
            Err(_) => {
                guard.verdict = Verdict::Failure;
                return Err(timed_out("answer"));
            }
            Ok(Err(e)) => {
                guard.verdict = Verdict::Failure;
                return Err(failed(format!(
                    "provider `{key}`: reading the response failed: {e}"
                )));
            }
            Ok(Ok(b)) => b,
        };
        let out = if passthrough {
            guard.usage = body_usage(client_api, &bytes);
            Bytes::from(bytes)
        } else {
            let parsed = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| translate::parse_provider_response(protocol, &v));
            let Some(mut r) = parsed else {
                guard.verdict = Verdict::Failure;
                return Err(failed(format!(
                    "provider `{key}` sent a response that could not be read"
                )));
            };
            guard.usage = r.usage_reported.then_some(r.usage);
            r.stop_sequence =
                translate::matched_stop(&r.finish, r.stop_sequence.take(), &sent_stops);
            Bytes::from(translate::client_response(client_api, &r, model).to_string())
        };
        guard.verdict = Verdict::Success;
        guard.completed = true;
        guard.provider_ended = true;
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        drop(guard);
        return Ok(ProviderResponse {
            status: StatusCode::OK,
            headers,
            body: Box::pin(futures_util::stream::once(async move { Ok(out) })),
            outcome: rx,
        });
    }
    // Streamed: wait for the first bytes within the timeout.
    let first = match tokio::time::timeout_at(deadline, frames.next()).await {
        Err(_) => {
            guard.verdict = Verdict::Failure;
            return Err(timed_out("send its first bytes"));
        }
        Ok(Some(Ok(c))) => c,
        Ok(Some(Err(e))) => {
            guard.verdict = Verdict::Failure;
            return Err(failed(format!("provider `{key}` stream failed: {e}")));
        }
        Ok(None) => {
            guard.verdict = Verdict::Failure;
            return Err(failed(format!(
                "provider `{key}` ended the stream before sending anything"
            )));
        }
    };
    // An error event before any token (Anthropic's `overloaded_error`, a Bedrock throttling
    // frame) in the first bytes: nothing has reached the client yet, so the next provider can
    // still take the request.
    if let Some(why) = error_before_tokens(passthrough, protocol, client_api, &first) {
        guard.verdict = Verdict::Failure;
        return Err(failed(format!(
            "provider `{key}` reported an error before any token: {why}"
        )));
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    let mode = if passthrough {
        Mode::Pass(SseTap::new(client_api, !usage_requested))
    } else {
        Mode::Translate(
            ProviderDecoder::new(protocol),
            ClientEncoder::new(client_api, model, usage_requested)
                .with_sent_stops(sent_stops)
                .with_prompt_estimate(prompt_estimate),
        )
    };
    let st = StreamState {
        api: client_api,
        frames: Box::pin(frames),
        first: Some(first),
        mode,
        guard,
        idle: timeout,
        creds,
    };
    Ok(ProviderResponse {
        status: StatusCode::OK,
        headers,
        body: Box::pin(futures_util::stream::unfold(Some(st), step)),
        outcome: rx,
    })
}

enum Mode {
    Pass(SseTap),
    Translate(ProviderDecoder, ClientEncoder),
}

/// The error a stream's first bytes report before any token, if they do (decoded apart, as
/// the stream would decode them).
fn error_before_tokens(
    passthrough: bool,
    protocol: ProviderType,
    client_api: Api,
    first: &Bytes,
) -> Option<String> {
    if passthrough {
        let mut tap = SseTap::new(client_api, false);
        let _ = tap.feed(first, Instant::now());
        return (tap.observed.errored && tap.observed.tokens.token_events == 0)
            .then(|| "an error event".to_owned());
    }
    for ev in ProviderDecoder::new(protocol).feed(first) {
        match ev {
            Ev::Text(_) => return None,
            Ev::Error(why) => return Some(why),
            _ => {}
        }
    }
    None
}

type Frames = Pin<Box<dyn Stream<Item = Result<Bytes, hyper::Error>> + Send>>;

struct StreamState {
    api: Api,
    frames: Frames,
    first: Option<Bytes>,
    mode: Mode,
    guard: Guard,
    idle: Duration,
    creds: ProviderCredentials,
}

impl StreamState {
    /// Processes provider bytes; returns client bytes and whether the stream is over.
    fn process(&mut self, chunk: &[u8]) -> (Bytes, bool) {
        let now = Instant::now();
        match &mut self.mode {
            Mode::Pass(tap) => {
                let out = tap.feed(chunk, now);
                let o = &tap.observed;
                self.guard.tokens.clone_from(&o.tokens);
                self.guard.usage = o.usage;
                (out, false)
            }
            Mode::Translate(dec, enc) => {
                let mut out = BytesMut::new();
                let mut over = false;
                for ev in dec.feed(chunk) {
                    match &ev {
                        Ev::Text(_) => self.guard.tokens.token(0, now),
                        Ev::Error(m) => {
                            let msg =
                                scrub(&format!("the provider stream failed: {m}"), &self.creds);
                            out.extend_from_slice(
                                ApiError::new(StatusCode::BAD_GATEWAY, "provider_error", msg)
                                    .sse_event(self.api)
                                    .as_bytes(),
                            );
                            self.guard.verdict = Verdict::Failure;
                            over = true;
                            break;
                        }
                        _ => {}
                    }
                    enc.encode(&ev, &mut out);
                    self.guard.usage = enc.usage();
                    if enc.done {
                        self.guard.completed = true;
                        self.guard.verdict = Verdict::Success;
                        over = true;
                        break;
                    }
                }
                (out.freeze(), over)
            }
        }
    }

    /// The end of the provider's stream (`err`: why it ended early, with its code).
    fn finish(&mut self, err: Option<(&'static str, String)>) -> Bytes {
        self.guard.provider_ended = true;
        let mut out = BytesMut::new();
        let (completed, observed) = match &mut self.mode {
            Mode::Pass(tap) => {
                if err.is_none() && tap.observed.completed {
                    out.extend_from_slice(&tap.finish());
                } else {
                    // An error event follows: not glued to a partial event.
                    tap.discard_partial();
                }
                self.guard.usage = tap.observed.usage;
                (tap.observed.completed, Some(tap.observed.clone()))
            }
            Mode::Translate(_, enc) => (enc.done, None),
        };
        if completed && err.is_none() {
            self.guard.completed = true;
            self.guard.verdict = Verdict::Success;
        } else {
            self.guard.verdict = Verdict::Failure;
            let (code, msg) = err.unwrap_or_else(|| {
                (
                    "provider_incomplete",
                    "the provider ended the stream before it was complete".to_string(),
                )
            });
            let e = ApiError::new(StatusCode::BAD_GATEWAY, code, scrub(&msg, &self.creds));
            // A passed-through stream whose provider sent its own error event already told
            // the client: only the terminator follows.
            let end = match observed {
                Some(o) => o.early_end(self.api, &e),
                None => e.sse_event(self.api),
            };
            out.extend_from_slice(end.as_bytes());
        }
        out.freeze()
    }
}

async fn step(
    st: Option<StreamState>,
) -> Option<(Result<Bytes, std::io::Error>, Option<StreamState>)> {
    let mut st = st?;
    loop {
        let chunk = match st.first.take() {
            Some(c) => Some(Ok(c)),
            None => match tokio::time::timeout(st.idle, st.frames.next()).await {
                Err(_) => {
                    let out = st.finish(Some((
                        "provider_timeout",
                        format!(
                            "the provider sent nothing for {:.3}s",
                            st.idle.as_secs_f64()
                        ),
                    )));
                    return Some((Ok(out), None));
                }
                Ok(c) => c,
            },
        };
        match chunk {
            Some(Ok(c)) => {
                let (out, over) = st.process(&c);
                if over {
                    st.guard.provider_ended = true;
                    return Some((Ok(out), None));
                }
                if !out.is_empty() {
                    return Some((Ok(out), Some(st)));
                }
            }
            Some(Err(e)) => {
                let out = st.finish(Some((
                    "provider_incomplete",
                    format!("the provider stream failed: {e}"),
                )));
                return Some((Ok(out), None));
            }
            None => {
                let out = st.finish(None);
                if out.is_empty() {
                    return None;
                }
                return Some((Ok(out), None));
            }
        }
    }
}
