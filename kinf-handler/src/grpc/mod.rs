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

pub mod ext_proc;
pub mod handler;
pub mod pending;
pub mod tls;

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};

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
/// `envoy.service.ext_proc.v3.ExternalProcessor`.
pub fn services(gw: Arc<Gateway>) -> tonic::service::Routes {
    let pending = Arc::new(pending::Pending::default());
    let handler = handler::HandlerService::new(gw.clone(), pending);
    let ext = ext_proc::ExtProcService::new(gw);
    tonic::service::Routes::new(handler_v1::handler_server::HandlerServer::new(handler))
        .add_service(ext_proc_v3::external_processor_server::ExternalProcessorServer::new(ext))
}

/// Serves [`services`] on `listener` (HTTP/2, plaintext) until the task is dropped or the
/// listener fails.
pub async fn serve_grpc(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
) -> Result<(), tonic::transport::Error> {
    serve_grpc_with_shutdown(gw, listener, std::future::pending()).await
}

/// [`serve_grpc`], stopping gracefully when `shutdown` completes.
pub async fn serve_grpc_with_shutdown(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
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

/// Builds an HTTP header map from name/value pairs. Pseudo-headers are dropped, except
/// `:authority`, which stands in for `host` when there is none. Pairs that are not valid HTTP
/// headers are skipped (and counted in the second return value).
pub(crate) fn header_map<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> (HeaderMap, usize) {
    let mut map = HeaderMap::new();
    let mut authority = None;
    let mut bad = 0;
    for (name, value) in pairs {
        if name == ":authority" {
            authority = HeaderValue::from_bytes(value).ok();
            continue;
        }
        if name.starts_with(':') {
            continue;
        }
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            (Ok(n), Ok(v)) => {
                map.append(n, v);
            }
            _ => bad += 1,
        }
    }
    if let Some(a) = authority
        && !map.contains_key(header::HOST)
    {
        map.insert(header::HOST, a);
    }
    (map, bad)
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
