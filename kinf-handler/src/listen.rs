//! The HTTP listeners (client-facing and admin): HTTP/1.1 and HTTP/2 (cleartext, or over TLS
//! with ALPN), with the connection-level limits a hostile client meets before any handler runs:
//! header count and size (431 in the caller's API shape), a deadline for the request head (the
//! connection is closed), and optional TLS ([`TlsFiles`]) shared with the gRPC listener.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::gateway::errors::{Api, ApiError};

/// Default largest request head, in bytes (header names and values, 4 bytes more per header).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;
/// Default most request headers.
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// Default deadline for a client to send its whole request head.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for a client's TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for open connections to finish after a shutdown signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Connection-level limits of an HTTP listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// Largest request head: the sum of header names and values plus 4 bytes per header.
    pub max_header_bytes: usize,
    /// Most request headers.
    pub max_headers: usize,
    /// Deadline to receive the first request head from the connection's start (any protocol),
    /// and on HTTP/1 each later one; the connection is closed after it.
    pub header_read_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        }
    }
}

/// A PEM certificate chain and private key for the listeners.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Builds the rustls server configuration of `files`, offering `alpn` protocols (`h2`,
/// `http/1.1`). Each error names the file at fault: a certificate file without a certificate, a
/// key file without a usable private key (none, encrypted, or of a type ring cannot sign with),
/// or a key that is not the one of the first certificate.
pub fn tls_config(files: &TlsFiles, alpn: &[&[u8]]) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::{self, PemObject};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (cert_path, key_path) = (files.cert.display(), files.key.display());
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("TLS certificate {cert_path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "TLS certificate {cert_path}: no certificate in the file (expected PEM \
             `CERTIFICATE` blocks, the server's first)"
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| match e {
        pem::Error::NoItemsFound => format!(
            "TLS key {key_path}: no private key in the file (expected a PEM `PRIVATE KEY` \
             (PKCS#8), `RSA PRIVATE KEY` (PKCS#1) or `EC PRIVATE KEY` (SEC1) block; encrypted \
             keys are not supported)"
        ),
        e => format!("TLS key {key_path}: {e}"),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let signing_key = provider.key_provider.load_private_key(key).map_err(|e| {
        format!(
            "TLS key {key_path}: unsupported private key ({e}); use RSA (2048 bits or more), \
             ECDSA P-256 or P-384, or Ed25519"
        )
    })?;
    let certified = rustls::sign::CertifiedKey::new(certs, signing_key);
    match certified.keys_match() {
        // `Unknown`: the key cannot tell its public half; rustls accepts such keys too.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => {
            return Err(format!(
                "TLS key {key_path} does not belong to the certificate {cert_path} (the first \
                 certificate in the file must be the one issued for this key)"
            ));
        }
        Err(e) => return Err(format!("TLS certificate {cert_path}: {e}")),
    }
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(certified)));
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// [`tls_config`] for the HTTP listeners (`h2`, `http/1.1`).
pub fn http_tls_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, String> {
    tls_config(files, &[b"h2", b"http/1.1"])
}

/// The API shape of errors for a request path: Anthropic for `/v1/messages`, else OpenAI.
pub fn api_of_path(path: &str) -> Api {
    if path.starts_with("/v1/messages") {
        Api::Messages
    } else if path.starts_with("/v1/completions") {
        Api::Completions
    } else {
        Api::Chat
    }
}

/// The 431 for a request head over `limits`, in the caller's API shape; `None` when it fits.
pub fn check_headers(
    path: &str,
    headers: &axum::http::HeaderMap,
    limits: &HttpLimits,
) -> Option<Response> {
    let count = headers.len();
    let bytes: usize = headers
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum();
    let (param, message) = if count > limits.max_headers {
        (
            "headers",
            format!(
                "the request has {count} headers; the limit is {} (--max-headers)",
                limits.max_headers
            ),
        )
    } else if bytes > limits.max_header_bytes {
        (
            "headers",
            format!(
                "the request headers are {bytes} bytes; the limit is {} (--max-header-bytes)",
                limits.max_header_bytes
            ),
        )
    } else {
        return None;
    };
    let mut e = ApiError::new(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "headers_too_large",
        message,
    );
    e.param = Some(param.into());
    Some(e.into_response_for(api_of_path(path)))
}

async fn header_limits(State(limits): State<HttpLimits>, req: Request, next: Next) -> Response {
    if let Some(r) = check_headers(req.uri().path(), req.headers(), &limits) {
        return r.into_response();
    }
    next.run(req).await
}

/// The HTTP/1 read buffer (hence the largest head hyper buffers) for `limits`: twice
/// `max_header_bytes` plus 16 KiB for the request line and per-line overhead, and at least
/// hyper's minimum of 8 KiB. Bodies stream through this buffer in reads of at most its size.
fn head_backstop(limits: &HttpLimits) -> usize {
    limits
        .max_header_bytes
        .saturating_mul(2)
        .saturating_add(16 << 10)
        .max(8 << 10)
}

/// The hyper connection builder for `limits`: header count and size enforced by hyper at
/// twice the configured limits (a backstop: within it, [`check_headers`] answers in the
/// caller's shape; past it hyper answers a bare 431 and closes the connection, having
/// buffered no more than [`head_backstop`]), the head deadline, HTTP/2 header lists bounded
/// the same way.
fn builder(limits: &HttpLimits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    let backstop = head_backstop(limits);
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.max_headers.saturating_mul(2).max(16))
        .max_buf_size(backstop);
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(backstop).unwrap_or(u32::MAX));
    b
}

/// Serves one connection. It is closed when its first request head has not arrived within
/// `limits.header_read_timeout` of its start (after the TLS handshake): hyper's own head
/// deadline (HTTP/1) only starts once the protocol is known, so a client that sends nothing, a
/// part of the HTTP/2 preface, or an HTTP/2 preface and no request would otherwise hold the
/// connection forever. Later requests of an HTTP/1 connection are bounded by hyper's deadline.
async fn serve_connection<I>(
    builder: &auto::Builder<TokioExecutor>,
    io: I,
    app: Router,
    watcher: hyper_util::server::graceful::Watcher,
    limits: &HttpLimits,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    use hyper::service::Service as _;
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = started.clone();
    let inner = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |req| {
        seen.store(true, std::sync::atomic::Ordering::Relaxed);
        inner.call(req)
    });
    let conn = watcher.watch(
        builder
            .serve_connection_with_upgrades(io, service)
            .into_owned(),
    );
    tokio::pin!(conn);
    tokio::select! {
        served = &mut conn => served,
        () = tokio::time::sleep(limits.header_read_timeout) => {
            if started.load(std::sync::atomic::Ordering::Relaxed) {
                conn.await
            } else {
                tracing::debug!("no request head within --header-read-timeout: connection closed");
                Ok(())
            }
        }
    }
}

/// Serves `app` on `listener` until `shutdown` completes, then waits up to
/// [`SHUTDOWN_GRACE`] for open connections. With `tls`, every connection is TLS (a handshake
/// not done within [`TLS_HANDSHAKE_TIMEOUT`] is dropped).
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let app = app.layer(axum::middleware::from_fn_with_state(limits, header_limits));
    let builder = Arc::new(builder(&limits));
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let served = match acceptor {
                None => serve_connection(&builder, TokioIo::new(tcp), app, watcher, &limits).await,
                Some(acceptor) => {
                    let tls =
                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => {
                                tracing::debug!(%peer, "TLS handshake timed out");
                                return;
                            }
                        };
                    serve_connection(&builder, TokioIo::new(tls), app, watcher, &limits).await
                }
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the shutdown grace period");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn header_count_and_size_are_checked_in_the_callers_shape() {
        let limits = HttpLimits {
            max_header_bytes: 100,
            max_headers: 3,
            ..HttpLimits::default()
        };
        let mut h = HeaderMap::new();
        h.insert("a", HeaderValue::from_static("1"));
        assert!(check_headers("/v1/chat/completions", &h, &limits).is_none());
        h.insert("x-big", HeaderValue::from_static("y"));
        h.insert("x-c", HeaderValue::from_static("1"));
        h.insert("x-d", HeaderValue::from_static("1"));
        let r = check_headers("/v1/messages", &h, &limits);
        assert_eq!(
            r.map(|r| r.status()),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let mut h = HeaderMap::new();
        h.insert(
            "x-big",
            HeaderValue::from_str(&"y".repeat(200)).unwrap_or(HeaderValue::from_static("")),
        );
        assert!(check_headers("/v1/chat/completions", &h, &limits).is_some());
    }

    #[test]
    fn the_head_backstop_is_twice_the_limit_plus_16_kib() {
        assert_eq!(head_backstop(&HttpLimits::default()), 144 << 10);
        let tiny = HttpLimits {
            max_header_bytes: 0,
            ..HttpLimits::default()
        };
        // hyper's floor for its read buffer is 8 KiB; 16 KiB of slack is always above it.
        assert_eq!(head_backstop(&tiny), 16 << 10);
        let huge = HttpLimits {
            max_header_bytes: usize::MAX,
            ..HttpLimits::default()
        };
        assert_eq!(head_backstop(&huge), usize::MAX);
    }

    #[test]
    fn api_shape_follows_the_path() {
        assert_eq!(api_of_path("/v1/messages"), Api::Messages);
        assert_eq!(api_of_path("/v1/completions"), Api::Completions);
        assert_eq!(api_of_path("/v1/chat/completions"), Api::Chat);
        assert_eq!(api_of_path("/metrics"), Api::Chat);
    }
}
