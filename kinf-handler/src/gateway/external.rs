//! `External` classifiers: HTTP services called on the request path.
//!
//! Each of a front door's `External` classifiers receives `POST <url>` with
//! `{"messages": [{"role", "content"}, ...]}` (every message the model will see; a completions
//! prompt is one `user` message) and answers `{"tags": [...]}`. The classifiers of a door are
//! called concurrently, each within its `timeout`. Tags the spec does not declare in `tags` are
//! dropped (and counted). A failure (timeout, connection error, non-2xx status, a body that is
//! not `{"tags": [strings]}`) applies the classifier's failure mode: `FailOpen` adds nothing,
//! `FailClosed` adds `failureTag`, or rejects the request with 503 `classifier_unavailable`
//! when there is none.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ahash::AHashSet;
use axum::http::{Method, Request, StatusCode, Uri, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kinf_policy::{ClassifierSpec, ClassifierType, FailureMode};
use serde::{Deserialize, Serialize};

use super::errors::ApiError;
use super::parse::Parsed;
use crate::metrics::Metrics;

/// Default time allowed for an external classifier.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

/// Largest classifier response body read.
const MAX_RESPONSE_BYTES: usize = 1 << 20;

/// One `External` classifier of a front door.
#[derive(Debug)]
pub struct ExternalClassifier {
    /// `namespace/gateway/name`: the metrics label and the name in errors.
    pub label: Arc<str>,
    /// Where requests are sent; `Err`: the configured URL is unusable (every call fails).
    pub url: Result<Uri, String>,
    /// Tags the service may produce; any other tag it returns is dropped.
    pub tags: AHashSet<Arc<str>>,
    /// Time allowed per call.
    pub timeout: Duration,
    /// What happens on failure.
    pub failure_mode: FailureMode,
    /// With `FailClosed`: the tag added on failure (absent: the request is rejected).
    pub failure_tag: Option<Arc<str>>,
}

impl ExternalClassifier {
    /// The `External` classifiers among `specs` of the `GatewayBackend` `namespace/gateway`,
    /// with the problems found in their configuration (unusable URLs or timeouts).
    pub fn from_specs(
        namespace: &str,
        gateway: &str,
        specs: &[ClassifierSpec],
    ) -> (Vec<ExternalClassifier>, Vec<String>) {
        let mut problems = Vec::new();
        let list = specs
            .iter()
            .filter(|s| s.type_ == ClassifierType::External)
            .map(|s| {
                let label: Arc<str> = Arc::from(format!("{namespace}/{gateway}/{}", s.name));
                let url = match s.url.as_deref() {
                    None => Err("no `url`".to_owned()),
                    Some(u) => u
                        .parse::<Uri>()
                        .map_err(|e| format!("`url` {u:?} is not a URL: {e}"))
                        .and_then(|uri| match uri.scheme_str() {
                            Some("http" | "https") if uri.authority().is_some() => Ok(uri),
                            _ => Err(format!("`url` {u:?} is not an http(s) URL")),
                        }),
                };
                if let Err(e) = &url {
                    problems.push(format!("classifier {label}: {e}; every call fails"));
                }
                let timeout = match s.timeout.as_deref() {
                    None => DEFAULT_TIMEOUT,
                    Some(t) => kinf_grammar::parse_duration(t).unwrap_or_else(|e| {
                        problems.push(format!(
                            "classifier {label}: timeout {t:?}: {e}; using {}ms",
                            DEFAULT_TIMEOUT.as_millis()
                        ));
                        DEFAULT_TIMEOUT
                    }),
                };
                ExternalClassifier {
                    url,
                    tags: s.tags.iter().map(|t| Arc::from(t.as_str())).collect(),
                    timeout,
                    failure_mode: s.failure_mode.unwrap_or(FailureMode::FailClosed),
                    failure_tag: s.failure_tag.as_deref().map(Arc::from),
                    label,
                }
            })
            .collect();
        (list, problems)
    }

    fn mode_label(&self) -> &'static str {
        match self.failure_mode {
            FailureMode::FailClosed => "FailClosed",
            FailureMode::FailOpen => "FailOpen",
        }
    }
}

#[derive(Serialize)]
struct Msg<'a> {
    role: &'a str,
    content: &'a str,
}

#[derive(Serialize)]
struct Query<'a> {
    messages: Vec<Msg<'a>>,
}

#[derive(Deserialize)]
struct Answer {
    tags: Vec<String>,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// The shared client (connection pooling across requests and policy generations); `None`
/// when TLS could not be set up (every call fails).
fn client() -> Option<&'static HttpsClient> {
    static CLIENT: OnceLock<Option<HttpsClient>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let mut http = HttpConnector::new();
            http.enforce_http(false);
            http.set_nodelay(true);
            let https = hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
                .ok()?
                .https_or_http()
                .enable_http1()
                .wrap_connector(http);
            Some(
                Client::builder(TokioExecutor::new())
                    .pool_idle_timeout(Duration::from_secs(90))
                    .build(https),
            )
        })
        .as_ref()
}

/// The request body sent to every external classifier of a request.
pub fn query_body(parsed: &Parsed) -> Bytes {
    let messages: Vec<Msg<'_>> = parsed
        .classified_messages()
        .map(|m| Msg {
            role: m.role,
            content: m.content,
        })
        .collect();
    Bytes::from(serde_json::to_vec(&Query { messages }).unwrap_or_default())
}

/// Calls one classifier; its declared tags, or why it failed.
async fn call(c: &ExternalClassifier, body: Bytes) -> Result<(Vec<Arc<str>>, usize), String> {
    let url = c.url.as_ref().map_err(Clone::clone)?;
    let client = client().ok_or("no HTTP client (TLS setup failed)")?;
    let req = Request::builder()
        .method(Method::POST)
        .uri(url.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Full::new(body))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the response failed: {e}"))?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("answered {status}"));
        }
        let answer: Answer = serde_json::from_slice(&bytes)
            .map_err(|e| format!("the response is not {{\"tags\": [strings]}}: {e}"))?;
        Ok(answer)
    };
    let answer = tokio::time::timeout(c.timeout, exchange)
        .await
        .map_err(|_| format!("no answer within {}ms", c.timeout.as_millis()))??;
    let total = answer.tags.len();
    let kept: Vec<Arc<str>> = answer
        .tags
        .iter()
        .filter_map(|t| c.tags.get(t.as_str()).cloned())
        .collect();
    let dropped = total - kept.len();
    Ok((kept, dropped))
}

/// Runs every classifier in `classifiers` concurrently on `prompt`: the tags they add (failure
/// tags included), or the 503 for the first `FailClosed` classifier without a `failureTag` that
/// failed. Latency, failures and dropped tags are recorded in `metrics`.
pub async fn classify(
    classifiers: &[ExternalClassifier],
    parsed: &Parsed,
    metrics: &Metrics,
) -> Result<Vec<Arc<str>>, ApiError> {
    if classifiers.is_empty() {
        return Ok(Vec::new());
    }
    let body = query_body(parsed);
    let results = futures_util::future::join_all(classifiers.iter().map(|c| {
        let body = body.clone();
        async move {
            let start = Instant::now();
            let r = call(c, body).await;
            metrics.observe_classifier_seconds(&c.label, start.elapsed().as_secs_f64());
            r
        }
    }))
    .await;
    let mut tags = Vec::new();
    let mut rejection = None;
    for (c, r) in classifiers.iter().zip(results) {
        match r {
            Ok((kept, dropped)) => {
                if dropped > 0 {
                    metrics.classifier_undeclared_tags(&c.label, dropped as u64);
                }
                tags.extend(kept);
            }
            Err(why) => {
                metrics.classifier_failure(&c.label, c.mode_label());
                tracing::warn!(classifier = %c.label, error = %why, mode = c.mode_label(), "external classifier failed");
                match (c.failure_mode, &c.failure_tag) {
                    (FailureMode::FailOpen, _) => {}
                    (FailureMode::FailClosed, Some(t)) => tags.push(t.clone()),
                    (FailureMode::FailClosed, None) => {
                        if rejection.is_none() {
                            let mut e = ApiError::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                "classifier_unavailable",
                                format!(
                                    "classifier `{}` is unavailable ({why}) and fails closed; the request was not served",
                                    c.label
                                ),
                            );
                            e.retry_after_s = Some(1);
                            rejection = Some(e);
                        }
                    }
                }
            }
        }
    }
    match rejection {
        Some(e) => Err(e),
        None => Ok(tags),
    }
}
