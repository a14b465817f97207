//! The gRPC side of Kinference: the decision service ([`handler`], `kinference.handler.v1`)
//! for proxies that forward requests themselves, and an Envoy external-processing adapter
//! ([`ext_proc`], `envoy.service.ext_proc.v3.ExternalProcessor`) speaking the Gateway API
//! Inference Extension's endpoint-picker protocol.
//!
//! Both reuse the HTTP gateway's I/O-free steps ([`forward::admit`](crate::gateway::forward::admit),
//! [`forward::plan`](crate::gateway::forward::plan),
//! [`forward::upstream_body`](crate::gateway::forward::upstream_body),
//! [`forward::report`](crate::gateway::forward::report)), so a decision made over gRPC is the
//! decision the HTTP gateway would have made. See `docs/reference/grpc.md`.

pub mod codec;
pub mod ext_proc;
pub mod first_request;
pub mod handler;
pub mod pending;
pub mod tls;

use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use tonic::codegen::Service;
use tonic::server::NamedService;

use crate::gateway::Gateway;
use crate::gateway::errors::{Api, ApiError};

/// Generated code: Kinference's `Handler` service.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod proto {
    /// `kinference.handler.v1`.
    pub mod kinference {
        /// `kinference.handler`.
        pub mod handler {
            /// `kinference.handler.v1`.
            pub mod v1 {
                tonic::include_proto!("kinference.handler.v1");
            }
        }
    }

    /// The subset of Envoy's API used by the external-processing adapter (same packages,
    /// messages and field numbers as upstream).
    pub mod envoy {
        /// `envoy.config`.
        pub mod config {
            /// `envoy.config.core`.
            pub mod core {
                /// `envoy.config.core.v3`.
                pub mod v3 {
                    tonic::include_proto!("envoy.config.core.v3");
                }
            }
        }
        /// `envoy.type`.
        pub mod r#type {
            /// `envoy.type.v3`.
            pub mod v3 {
                tonic::include_proto!("envoy.r#type.v3");
            }
        }
        /// `envoy.service`.
        pub mod service {
            /// `envoy.service.ext_proc`.
            pub mod ext_proc {
                /// `envoy.service.ext_proc.v3`.
                pub mod v3 {
                    tonic::include_proto!("envoy.service.ext_proc.v3");
                }
            }
        }
    }
}

pub use proto::envoy::service::ext_proc::v3 as ext_proc_v3;
pub use proto::kinference::handler::v1 as handler_v1;

/// Both gRPC services on one router: `kinference.handler.v1.Handler` and
/// `envoy.service.ext_proc.v3.ExternalProcessor`, each accepting messages up to
/// [`decode_limit`].
pub fn services(gw: Arc<Gateway>) -> tonic::service::Routes {
    let pending = Arc::new(pending::Pending::default());
    // Decisions never reported hold their tenant's stream slots and concurrency until they
    // expire: let them go on time even when no other `Decide` comes (while the services
    // live).
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let weak = Arc::downgrade(&pending);
        rt.spawn(async move {
            let mut every = tokio::time::interval(PENDING_EXPIRY_INTERVAL);
            loop {
                every.tick().await;
                match weak.upgrade() {
                    Some(p) => p.expire(),
                    None => break,
                }
            }
        });
    }
    let handler = handler::HandlerService::new(gw.clone(), pending);
    let ext = ext_proc::ExtProcService::new(gw.clone());
    tonic::service::Routes::new(DecodeLimited {
        server: handler_v1::handler_server::HandlerServer::new(handler),
        gw: gw.clone(),
    })
    .add_service(DecodeLimited {
        server: ext_proc_v3::external_processor_server::ExternalProcessorServer::new(ext),
        gw,
    })
}

/// How often expired pending decisions are dropped.
pub const PENDING_EXPIRY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Headroom over the largest body for a message's other fields (path, headers).
pub const DECODE_HEADROOM: usize = 1 << 20;

/// The smallest decoding limit: tonic's default, so response-body chunks that Envoy sends to
/// the external processor fit as before even when every front door's body limit is small.
pub const MIN_DECODE_LIMIT: usize = 4 << 20;

/// The largest gRPC message accepted, read at each call so that it follows policy reloads:
/// the largest `limits.maxBodyBytes` of the policy in force (the 32 MiB default while none
/// is), at least [`MIN_DECODE_LIMIT`], plus [`DECODE_HEADROOM`]. Every body some front door
/// accepts therefore reaches admission, which answers the documented 413 when it is over the
/// door's own limit. A larger message is refused by tonic before it is read (gRPC
/// `OUT_OF_RANGE` on `Decide`; see [`ext_proc`] for the stream).
pub fn decode_limit(gw: &Gateway) -> usize {
    let largest = gw
        .runtime()
        .map_or(crate::gateway::runtime::DEFAULT_MAX_BODY_BYTES, |rt| {
            rt.doors
                .iter()
                .map(|d| d.max_body_bytes)
                .max()
                .unwrap_or(crate::gateway::runtime::DEFAULT_MAX_BODY_BYTES)
        });
    largest
        .max(MIN_DECODE_LIMIT)
        .saturating_add(DECODE_HEADROOM)
}

/// A generated server whose `max_decoding_message_size` is set to [`decode_limit`] at each
/// call.
#[derive(Clone)]
struct DecodeLimited<S> {
    server: S,
    gw: Arc<Gateway>,
}

/// A generated server's `max_decoding_message_size`.
trait WithDecodeLimit {
    fn with_decode_limit(self, limit: usize) -> Self;
}

impl WithDecodeLimit for handler_v1::handler_server::HandlerServer<handler::HandlerService> {
    fn with_decode_limit(self, limit: usize) -> Self {
        self.max_decoding_message_size(limit)
    }
}

impl WithDecodeLimit
    for ext_proc_v3::external_processor_server::ExternalProcessorServer<ext_proc::ExtProcService>
{
    fn with_decode_limit(self, limit: usize) -> Self {
        self.max_decoding_message_size(limit)
    }
}

impl<S, B> Service<axum::http::Request<B>> for DecodeLimited<S>
where
    S: Service<axum::http::Request<B>> + WithDecodeLimit + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.server.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        // Generated servers are always ready (they only clone an `Arc`), so calling a fresh
        // clone without polling it first is sound.
        self.server
            .clone()
            .with_decode_limit(decode_limit(&self.gw))
            .call(req)
    }
}

impl<S: NamedService> NamedService for DecodeLimited<S> {
    const NAME: &'static str = S::NAME;
}

/// Serves [`services`] on `listener` (HTTP/2, plaintext) until the task is dropped or the
/// listener fails; a connection's first request must arrive within the default
/// `--header-read-timeout`.
pub async fn serve_grpc(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
) -> Result<(), tonic::transport::Error> {
    serve_grpc_with_shutdown(
        gw,
        listener,
        crate::listen::DEFAULT_HEADER_READ_TIMEOUT,
        std::future::pending(),
    )
    .await
}

/// [`serve_grpc`] with the first request's deadline `head_timeout`
/// ([`first_request`]), stopping gracefully when `shutdown` completes.
pub async fn serve_grpc_with_shutdown(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    head_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    use tokio_stream::StreamExt as _;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |conn| {
        conn.map(|tcp| {
            let _ = tcp.set_nodelay(true);
            first_request::FirstRequestDeadline::new(tcp, head_timeout)
        })
    });
    tonic::transport::Server::builder()
        .layer(first_request::MarkFirstRequest)
        .add_routes(services(gw))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// The API a request path is for (a query string is ignored).
pub fn api_for_path(path: &str) -> Option<Api> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    match path {
        "/v1/chat/completions" => Some(Api::Chat),
        "/v1/completions" => Some(Api::Completions),
        "/v1/messages" => Some(Api::Messages),
        _ => None,
    }
}

/// The error answered while no policy is in force.
pub(crate) fn not_ready_error() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "not_ready",
        "no policy is in force yet; see /readyz",
    )
}

/// Longest header name or value quoted in an error message.
const QUOTED_MAX: usize = 64;

/// `s` for an error message: control characters escaped, at most [`QUOTED_MAX`] characters.
fn quoted(s: &[u8]) -> String {
    let text = String::from_utf8_lossy(s);
    let mut out: String = text
        .chars()
        .take(QUOTED_MAX)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().nth(QUOTED_MAX).is_some() {
        out.push_str("...");
    }
    out
}

/// Builds an HTTP header map from name/value pairs. Pseudo-headers are dropped, except
/// `:authority`, which stands in for `host` when there is none. A pair that is not a valid
/// HTTP header is a 400 `invalid_request` (param `headers`) naming the first one, as the HTTP
/// gateway would refuse it; `Decide` and ext_proc both use this.
pub(crate) fn request_headers<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<HeaderMap, ApiError> {
    let mut map = HeaderMap::new();
    let mut authority = None;
    let mut bad = 0usize;
    let mut first_bad = None;
    for (name, value) in pairs {
        let problem = if name == ":authority" {
            match HeaderValue::from_bytes(value) {
                Ok(v) => {
                    authority = Some(v);
                    continue;
                }
                Err(_) => format!("`{}` has an invalid value", quoted(name.as_bytes())),
            }
        } else if name.starts_with(':') {
            continue;
        } else {
            match (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_bytes(value),
            ) {
                (Ok(n), Ok(v)) => {
                    map.append(n, v);
                    continue;
                }
                (Err(_), _) => format!("`{}` is not a valid header name", quoted(name.as_bytes())),
                (Ok(_), Err(_)) => format!("`{}` has an invalid value", quoted(name.as_bytes())),
            }
        };
        bad += 1;
        first_bad.get_or_insert(problem);
    }
    if let Some(first) = first_bad {
        return Err(ApiError::invalid(
            "headers",
            format!("{bad} request header(s) are not valid HTTP headers; the first: {first}"),
        ));
    }
    if let Some(a) = authority
        && !map.contains_key(header::HOST)
    {
        map.insert(header::HOST, a);
    }
    Ok(map)
}

pub(crate) use crate::gateway::forward::count_request;

/// The JSON error body for `api`, serialized.
pub(crate) fn error_body(e: &ApiError, api: Api) -> Vec<u8> {
    serde_json::to_vec(&e.body(api)).unwrap_or_default()
}

/// Removes the `stream_options.include_usage` that admission injected, for callers that will
/// not see the response (the client then gets exactly the stream it asked for).
pub(crate) fn uninject_usage(body: &mut serde_json::Map<String, serde_json::Value>) {
    let empty = match body.get_mut("stream_options") {
        Some(serde_json::Value::Object(o)) => {
            o.remove("include_usage");
            o.is_empty()
        }
        _ => false,
    };
    if empty {
        body.remove("stream_options");
    }
}
