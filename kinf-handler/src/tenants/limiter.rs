//! Token, request and concurrency limits of a pool (`InferencePolicy.spec.limits`), per tenant.
//!
//! [`Limiter::admit`] finds the limits whose `matches` hold for a request, and charges the
//! budget (limit, tenant) of each, all or nothing: tokens and requests are token buckets holding
//! a minute's worth and refilling continuously; concurrency is a count of requests in flight. The
//! [`Reservation`] it returns gives back unused tokens (or charges the overrun) when the request
//! completes, and releases its concurrency slots when completed or dropped.

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue};
use kinf_lang::compiled::CompiledLimit;
use kinf_policy::TokenCount;
use kinf_router::Request;
use kinf_router::decide::cond_holds;
use kinf_router::usage::TokenUsage;

use super::store::{
    Admission, Budget, BudgetKind, Check, CheckState, FailMode, LimitStore, Settle, StoreStats,
    StoreStatsSnapshot,
};

/// The budget name of requests without a tenant.
pub const NO_TENANT: &str = "";

/// The tokens a request is expected to use, reserved at admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenEstimate {
    /// Prompt tokens.
    pub prompt: u64,
    /// Output tokens at most (`max_tokens`, or the default the gateway applies).
    pub output: u64,
}

impl TokenEstimate {
    /// `prompt_tokens` and `max_tokens` of the request.
    pub fn of(req: &Request) -> Self {
        TokenEstimate {
            prompt: u64::from(req.prompt_tokens),
            output: u64::from(req.max_tokens),
        }
    }
}

/// The tokens of `count` in a prompt/cached/output triple.
fn counted(count: TokenCount, prompt: u64, cached: u64, output: u64) -> u64 {
    match count {
        TokenCount::Total => prompt.saturating_add(output),
        TokenCount::Prompt => prompt,
        TokenCount::UncachedPrompt => prompt.saturating_sub(cached),
        TokenCount::Output => output,
    }
}

/// The `x-ratelimit-*` headers of a response (OpenAI's names and formats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitHeaders {
    /// The tightest token budget among the limits that applied (least remaining).
    pub tokens: Option<Budget>,
    /// The tightest request budget among the limits that applied.
    pub requests: Option<Budget>,
}

impl RateLimitHeaders {
    fn from_states(states: &[CheckState]) -> Self {
        let tightest = |f: fn(&CheckState) -> Option<Budget>| {
            states
                .iter()
                .filter_map(f)
                .min_by_key(|b| (b.remaining, u64::MAX - b.reset_ms))
        };
        RateLimitHeaders {
            tokens: tightest(|s| s.tokens),
            requests: tightest(|s| s.requests),
        }
    }

    /// Header name/value pairs: `x-ratelimit-{limit,remaining,reset}-{tokens,requests}`, for the
    /// budgets present.
    pub fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(6);
        if let Some(b) = self.tokens {
            out.push(("x-ratelimit-limit-tokens", b.limit.to_string()));
            out.push(("x-ratelimit-remaining-tokens", b.remaining.to_string()));
            out.push(("x-ratelimit-reset-tokens", format_reset(b.reset_ms)));
        }
        if let Some(b) = self.requests {
            out.push(("x-ratelimit-limit-requests", b.limit.to_string()));
            out.push(("x-ratelimit-remaining-requests", b.remaining.to_string()));
            out.push(("x-ratelimit-reset-requests", format_reset(b.reset_ms)));
        }
        out
    }

    /// Adds the headers to `map`.
    pub fn apply(&self, map: &mut HeaderMap) {
        for (name, value) in self.pairs() {
            if let Ok(v) = HeaderValue::from_str(&value) {
                map.insert(name, v);
            }
        }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_none() && self.requests.is_none()
    }
}

/// A duration as OpenAI writes `x-ratelimit-reset-*`: `0s`, `250ms`, `6s`, `1.5s`, `1m0s`,
/// `2m30.5s`, `1h2m0s`.
pub fn format_reset(ms: u64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let h = ms / 3_600_000;
    let m = (ms / 60_000) % 60;
    let rest = ms % 60_000;
    let secs = if rest.is_multiple_of(1000) {
        format!("{}s", rest / 1000)
    } else {
        let s = format!("{}.{:03}", rest / 1000, rest % 1000);
        format!("{}s", s.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// A request over a limit: HTTP 429, or 400 when it is larger than the limit's whole token
/// capacity ([`LimitExceeded::too_large`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitExceeded {
    /// `policy/limit`.
    pub limit: Arc<str>,
    /// The tenant whose budget is spent (`""`: requests without a tenant).
    pub tenant: Arc<str>,
    /// Which bound.
    pub kind: BudgetKind,
    /// What the request needed of it (tokens, or 1 request).
    pub requested: u64,
    /// The bound (tokens or requests per minute, or requests in flight).
    pub bound: u64,
    /// Milliseconds until the request would pass (concurrency: 1 s, a guess).
    pub retry_after_ms: u64,
    /// The `x-ratelimit-*` headers to send with the 429.
    pub headers: RateLimitHeaders,
    /// `Some(count)` when the request alone needs more tokens than the limit's whole capacity
    /// (`requested > bound`, `kind` [`BudgetKind::Tokens`]): no wait would let it through, so
    /// it is refused at once, without charging anything, with **400**
    /// `request_over_token_limit` and no `retry-after` (a 429 would have clients retry it
    /// forever). `count` is what the limit counts, for the message's advice.
    pub too_large: Option<TokenCount>,
}

impl LimitExceeded {
    /// `Retry-After` in whole seconds (at least 1).
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_ms.div_ceil(1000).max(1)
    }

    /// Whether waiting can ever let the request through (`false` for a request larger than
    /// the limit's capacity, see [`LimitExceeded::too_large`]).
    pub fn is_retryable(&self) -> bool {
        self.too_large.is_none()
    }

    /// Every header of the refusal: `retry-after` and `retry-after-ms` (only when waiting can
    /// help) and the `x-ratelimit-*` ones.
    pub fn header_pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(8);
        if self.is_retryable() {
            out.push(("retry-after", self.retry_after_secs().to_string()));
            out.push(("retry-after-ms", self.retry_after_ms.to_string()));
        }
        out.extend(self.headers.pairs());
        out
    }

    /// `type` of the OpenAI error body: `tokens`, `requests` (as OpenAI) or `concurrency`.
    pub fn kind_label(&self) -> &'static str {
        match self.kind {
            BudgetKind::Tokens => "tokens",
            BudgetKind::Requests => "requests",
            BudgetKind::Concurrency => "concurrency",
        }
    }
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenant = if self.tenant.is_empty() {
            "requests without a tenant".to_string()
        } else {
            format!("tenant {}", self.tenant)
        };
        if let Some(count) = self.too_large {
            let advice = match count {
                TokenCount::Total => "lower `max_tokens` (or `n`) or shorten the prompt",
                TokenCount::Prompt | TokenCount::UncachedPrompt => "shorten the prompt",
                TokenCount::Output => "lower `max_tokens` (or `n`)",
            };
            return write!(
                f,
                "request too large for rate limit {} of {tenant} on tokens per minute: limit {}, requested {}; \
                 it can never be admitted: {advice}, or raise the limit's `tokensPerMinute`",
                self.limit, self.bound, self.requested
            );
        }
        let retry = format_reset(self.retry_after_ms);
        match self.kind {
            BudgetKind::Tokens => write!(
                f,
                "rate limit {} reached for {tenant} on tokens per minute: limit {}, requested {}; retry in {retry}",
                self.limit, self.bound, self.requested
            ),
            BudgetKind::Requests => write!(
                f,
                "rate limit {} reached for {tenant} on requests per minute: limit {}; retry in {retry}",
                self.limit, self.bound
            ),
            BudgetKind::Concurrency => write!(
                f,
                "rate limit {} reached for {tenant} on concurrent requests: limit {}",
                self.limit, self.bound
            ),
        }
    }
}

/// Why a request was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// Over a limit: HTTP 429 `rate_limit_exceeded`; larger than a limit's whole token
    /// capacity ([`LimitExceeded::too_large`]): HTTP 400 `request_over_token_limit`.
    Exceeded(Box<LimitExceeded>),
    /// The store failed and the fail mode is `Closed`: HTTP 503 `rate_limiter_unavailable`.
    Unavailable(String),
}

impl LimitError {
    /// HTTP status: 429, 400 (a request larger than a limit's capacity) or 503.
    pub fn status(&self) -> http::StatusCode {
        match self {
            LimitError::Exceeded(e) if !e.is_retryable() => http::StatusCode::BAD_REQUEST,
            LimitError::Exceeded(_) => http::StatusCode::TOO_MANY_REQUESTS,
            LimitError::Unavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// Error code: `rate_limit_exceeded`, `request_over_token_limit` or
    /// `rate_limiter_unavailable`.
    pub fn code(&self) -> &'static str {
        match self {
            LimitError::Exceeded(e) if !e.is_retryable() => "request_over_token_limit",
            LimitError::Exceeded(_) => "rate_limit_exceeded",
            LimitError::Unavailable(_) => "rate_limiter_unavailable",
        }
    }

    /// `Retry-After` seconds (1 for a request that waiting cannot help: prefer
    /// [`LimitError::retry_after`], which says `None` then).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            LimitError::Exceeded(e) => e.retry_after_secs(),
            LimitError::Unavailable(_) => 1,
        }
    }

    /// The `Retry-After` seconds to send: `None` when waiting cannot help (a request larger
    /// than a limit's capacity).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            LimitError::Exceeded(e) if !e.is_retryable() => None,
            other => Some(other.retry_after_secs()),
        }
    }
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::Exceeded(e) => e.fmt(f),
            LimitError::Unavailable(why) => write!(f, "rate limiter unavailable: {why}"),
        }
    }
}

impl std::error::Error for LimitError {}

/// One admitted limit of a reservation.
#[derive(Clone, Debug)]
struct Held {
    limit: Arc<str>,
    tenant: Arc<str>,
    count: TokenCount,
    tokens_per_minute: Option<u64>,
    reserved: u64,
    concurrent: bool,
}

/// An admitted request's hold on its budgets. Call [`Reservation::complete`] with the usage
/// reported by the upstream; dropping it instead releases concurrency slots and keeps the whole
/// estimate charged.
#[must_use = "complete the reservation with the request's usage"]
pub struct Reservation {
    store: Option<Arc<dyn LimitStore>>,
    held: Vec<Held>,
    lease: u64,
    headers: RateLimitHeaders,
    unlimited: bool,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field(
                "limits",
                &self.held.iter().map(|h| &h.limit).collect::<Vec<_>>(),
            )
            .field("headers", &self.headers)
            .field("unlimited", &self.unlimited)
            .finish()
    }
}

impl Reservation {
    fn none(unlimited: bool) -> Self {
        Reservation {
            store: None,
            held: Vec::new(),
            lease: 0,
            headers: RateLimitHeaders::default(),
            unlimited,
        }
    }

    /// The `x-ratelimit-*` headers for the successful response (empty when no token or request
    /// limit applied).
    pub fn headers(&self) -> &RateLimitHeaders {
        &self.headers
    }

    /// Names of the limits charged.
    pub fn limits(&self) -> impl Iterator<Item = &str> {
        self.held.iter().map(|h| &*h.limit)
    }

    /// Whether the request was admitted without limits because the store failed (fail-open).
    pub fn is_unlimited(&self) -> bool {
        self.unlimited
    }

    /// Reconciles with the tokens the request actually used: each limit gets back what was
    /// reserved and not used, or is charged the overrun (a debt), counted as the limit counts
    /// (`UncachedPrompt` subtracts the cached prompt tokens now known). Releases concurrency
    /// slots. For a request that ended early, pass what it used so far.
    pub fn complete(mut self, usage: &TokenUsage) {
        self.settle(Some(usage));
    }

    fn settle(&mut self, usage: Option<&TokenUsage>) {
        let Some(store) = self.store.take() else {
            return;
        };
        let held = std::mem::take(&mut self.held);
        let settlements: Vec<Settle> = held
            .into_iter()
            .filter_map(|h| {
                let delta = match (usage, h.tokens_per_minute) {
                    (Some(u), Some(_)) => {
                        let used = counted(
                            h.count,
                            u.prompt_tokens(),
                            u.cached_prompt_tokens,
                            u.output_tokens,
                        );
                        clamp_i64(h.reserved) - clamp_i64(used)
                    }
                    _ => 0,
                };
                (delta != 0 || h.concurrent).then_some(Settle {
                    limit: h.limit,
                    tenant: h.tenant,
                    tokens_per_minute: h.tokens_per_minute,
                    token_delta: delta,
                    release_concurrency: h.concurrent,
                    lease: self.lease,
                })
            })
            .collect();
        if !settlements.is_empty() {
            store.settle(settlements);
        }
    }
}

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Not completed: keep the estimate charged, release concurrency.
        self.settle(None);
    }
}

/// The limits of one pool over a store. Build one per pool whenever a policy is applied (cheap);
/// the store, and so the budgets, outlive it.
#[derive(Clone)]
pub struct Limiter {
    limits: Arc<[Arc<CompiledLimit>]>,
    store: Arc<dyn LimitStore>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field(
                "limits",
                &self.limits.iter().map(|l| &l.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Limiter {
    /// A limiter for `limits` (a pool's [`CompiledPool::limits`](kinf_lang::compiled::CompiledPool))
    /// keeping budgets in `store`.
    pub fn new(limits: &[Arc<CompiledLimit>], store: Arc<dyn LimitStore>) -> Self {
        Limiter {
            limits: limits.iter().cloned().collect(),
            store,
        }
    }

    /// Whether the pool has no limits (admission is then free).
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The `whenExceeded` action of the limit named `name` (`policy/limit`).
    pub fn action(&self, name: &str) -> kinf_policy::WhenExceeded {
        self.limits
            .iter()
            .find(|l| &*l.name == name)
            .map(|l| l.when_exceeded)
            .unwrap_or_default()
    }

    /// The store's counters.
    pub fn stats(&self) -> StoreStatsSnapshot {
        self.store.stats().snapshot()
    }

    /// The checks a request is subject to.
    fn checks(
        &self,
        req: &Request,
        estimate: TokenEstimate,
        skip: &[Arc<str>],
    ) -> (Vec<Check>, Vec<TokenCount>) {
        let tenant: Arc<str> = req.tenant.clone().unwrap_or_else(|| Arc::from(NO_TENANT));
        let mut checks = Vec::with_capacity(self.limits.len());
        let mut counts = Vec::with_capacity(self.limits.len());
        for l in self.limits.iter() {
            if l.condition.as_ref().is_some_and(|c| !cond_holds(c, req)) || skip.contains(&l.name) {
                continue;
            }
            let tokens = if l.tokens_per_minute.is_some() {
                // The cached part of the prompt is not known before the request runs.
                counted(l.count, estimate.prompt, 0, estimate.output)
            } else {
                0
            };
            checks.push(Check {
                limit: l.name.clone(),
                tenant: tenant.clone(),
                tokens_per_minute: l.tokens_per_minute,
                tokens,
                requests_per_minute: l.requests_per_minute,
                concurrent_requests: l.concurrent_requests,
            });
            counts.push(l.count);
        }
        (checks, counts)
    }

    /// Admits `req` (its `tenant` must already be resolved) reserving `estimate`, or says which
    /// limit it is over. With no matching limit, admits without touching the store.
    /// The `whenExceeded` action of a limit is the caller's to apply ([`Limiter::action`]).
    pub async fn admit(
        &self,
        req: &Request,
        estimate: TokenEstimate,
    ) -> Result<Reservation, LimitError> {
        self.admit_skipping(req, estimate, &[]).await
    }

    /// [`Limiter::admit`] without the limits named in `skip` (limits whose `whenExceeded: Tag`
    /// let an over-limit request through uncharged).
    pub async fn admit_skipping(
        &self,
        req: &Request,
        estimate: TokenEstimate,
        skip: &[Arc<str>],
    ) -> Result<Reservation, LimitError> {
        let (checks, counts) = self.checks(req, estimate, skip);
        if checks.is_empty() {
            return Ok(Reservation::none(false));
        }
        let stats: &StoreStats = self.store.stats();
        // A request needing more than a limit's whole capacity could only ever pass by leaving
        // a debt on a full bucket, which other requests of the tenant keep from ever being
        // full: it would be refused forever with a `retry-after` that lies, or, admitted, drain
        // the bucket for everyone. Refused at once, before the store is asked (nothing is
        // charged, and the answer does not depend on the store being reachable). A client
        // error, like a prompt over `maxPromptTokens`: not counted among the 429s (`rejected`).
        if let Some((c, count)) = checks
            .iter()
            .zip(&counts)
            .find(|(c, _)| c.tokens_per_minute.is_some_and(|cap| c.tokens > cap))
        {
            return Err(LimitError::Exceeded(Box::new(LimitExceeded {
                limit: c.limit.clone(),
                tenant: c.tenant.clone(),
                kind: BudgetKind::Tokens,
                requested: c.tokens,
                bound: c.tokens_per_minute.unwrap_or(0),
                retry_after_ms: 0,
                headers: RateLimitHeaders::default(),
                too_large: Some(*count),
            })));
        }
        match self.store.admit(&checks).await {
            Ok(Admission::Admitted { states, lease }) => {
                StoreStats::bump(&stats.admitted);
                let headers = RateLimitHeaders::from_states(&states);
                let held = checks
                    .into_iter()
                    .zip(counts)
                    .map(|(c, count)| Held {
                        concurrent: c.concurrent_requests.is_some(),
                        limit: c.limit,
                        tenant: c.tenant,
                        count,
                        tokens_per_minute: c.tokens_per_minute,
                        reserved: c.tokens,
                    })
                    .collect();
                Ok(Reservation {
                    store: Some(self.store.clone()),
                    held,
                    lease,
                    headers,
                    unlimited: false,
                })
            }
            Ok(Admission::Refused {
                index,
                kind,
                retry_after_ms,
                states,
            }) => {
                StoreStats::bump(&stats.rejected);
                let mut headers = RateLimitHeaders::from_states(&states);
                let refused = states.get(index).copied().unwrap_or_default();
                match kind {
                    BudgetKind::Tokens => headers.tokens = refused.tokens.or(headers.tokens),
                    BudgetKind::Requests => {
                        headers.requests = refused.requests.or(headers.requests)
                    }
                    BudgetKind::Concurrency => {}
                }
                let c = checks.get(index);
                let (requested, bound) = match (kind, c) {
                    (BudgetKind::Tokens, Some(c)) => (c.tokens, c.tokens_per_minute.unwrap_or(0)),
                    (BudgetKind::Requests, Some(c)) => (1, c.requests_per_minute.unwrap_or(0)),
                    (BudgetKind::Concurrency, Some(c)) => (1, c.concurrent_requests.unwrap_or(0)),
                    (_, None) => (0, 0),
                };
                Err(LimitError::Exceeded(Box::new(LimitExceeded {
                    limit: c.map(|c| c.limit.clone()).unwrap_or_else(|| Arc::from("")),
                    tenant: c.map(|c| c.tenant.clone()).unwrap_or_else(|| Arc::from("")),
                    kind,
                    requested,
                    bound,
                    retry_after_ms,
                    headers,
                    too_large: None,
                })))
            }
            Err(e) => {
                StoreStats::bump(&stats.redis_errors);
                match self.store.fail_mode() {
                    FailMode::Open => {
                        StoreStats::bump(&stats.fail_open_admits);
                        tracing::warn!(error = %e, "rate-limit store failed; admitting (fail-open)");
                        Ok(Reservation::none(true))
                    }
                    FailMode::Closed => {
                        StoreStats::bump(&stats.fail_closed_rejects);
                        tracing::warn!(error = %e, "rate-limit store failed; refusing (fail-closed)");
                        Err(LimitError::Unavailable(e.0))
                    }
                }
            }
        }
    }
}
