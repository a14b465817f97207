//! gRPC over TLS: the same services as [`super::serve_grpc`] on connections that complete a
//! rustls handshake (ALPN `h2`). Handshakes run in their own tasks, so a slow client holds up
//! no one else; one not done within [`crate::listen::TLS_HANDSHAKE_TIMEOUT`] is dropped, and
//! then the first request must arrive within the head timeout ([`super::first_request`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::first_request::{FirstRequestDeadline, MarkFirstRequest};
use crate::gateway::Gateway;

/// A server-side TLS connection that tonic can serve.
#[derive(Debug)]
pub struct TlsConn(tokio_rustls::server::TlsStream<TcpStream>);

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The TLS configuration of the gRPC listener (ALPN `h2` only).
pub fn grpc_tls_config(
    files: &crate::listen::TlsFiles,
) -> Result<Arc<rustls::ServerConfig>, String> {
    crate::listen::tls_config(files, &[b"h2"])
}

/// Serves [`super::services`] over TLS on `listener` until `shutdown` completes; a
/// connection's first request must arrive within `head_timeout` of its handshake.
pub async fn serve_grpc_tls(
    gw: Arc<Gateway>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    head_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    type Conn = FirstRequestDeadline<TlsConn>;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Conn, std::io::Error>>(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let accept = tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                break;
            }
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(
                    crate::listen::TLS_HANDSHAKE_TIMEOUT,
                    acceptor.accept(tcp),
                )
                .await
                {
                    Ok(Ok(s)) => {
                        let conn = FirstRequestDeadline::new(TlsConn(s), head_timeout);
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "gRPC TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "gRPC TLS handshake timed out"),
                }
            });
        }
    });
    let result = tonic::transport::Server::builder()
        .layer(MarkFirstRequest)
        .add_routes(super::services(gw))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(rx), shutdown)
        .await;
    accept.abort();
    result
}
