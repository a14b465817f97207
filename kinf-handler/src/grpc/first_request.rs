//! A deadline for a gRPC connection's first request: a connection that has not sent a
//! complete request head (the HTTP/2 preface, its settings and one request's headers) within
//! `--header-read-timeout` of being accepted (after the TLS handshake) is closed. Without it a
//! client that connects and sends nothing, or only part of the preface, holds a socket and a
//! task forever: tonic and hyper start no timer before the first request.
//!
//! [`FirstRequestDeadline`] wraps the connection: while no request has been seen, a pending read
//! also waits on the deadline, and once it passes the read fails with `TimedOut`, which ends the
//! connection. The connection's [`FirstRequestSeen`] (its tonic connect info) is set by
//! [`MarkFirstRequest`], a layer in front of the services, when a request arrives on it; from
//! then on reads are the inner connection's own, whatever their pace (a long stream's body
//! chunks arrive when the client has them).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Set once the connection has carried a request (the connect info tonic puts in each
/// request's extensions).
#[derive(Debug, Clone, Default)]
pub struct FirstRequestSeen {
    seen: Arc<AtomicBool>,
}

impl FirstRequestSeen {
    /// Marks the connection as having carried a request.
    pub fn mark(&self) {
        self.seen.store(true, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.seen.load(Ordering::Relaxed)
    }
}

/// A connection closed when no request arrives on it within its deadline.
#[derive(Debug)]
pub struct FirstRequestDeadline<IO> {
    inner: IO,
    seen: FirstRequestSeen,
    /// `None` once a request was seen.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> FirstRequestDeadline<IO> {
    /// Wraps `inner`, whose first request must arrive within `timeout` from now.
    pub fn new(inner: IO, timeout: Duration) -> Self {
        Self {
            inner,
            seen: FirstRequestSeen::default(),
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
        }
    }
}

impl<IO: Send + 'static> Connected for FirstRequestDeadline<IO> {
    type ConnectInfo = FirstRequestSeen;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.seen.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstRequestDeadline<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        if this.seen.is_set() {
            this.deadline = None;
        }
        if let Some(deadline) = &mut this.deadline
            && deadline.as_mut().poll(cx).is_ready()
        {
            tracing::debug!("no gRPC request within --header-read-timeout: connection closed");
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no request within --header-read-timeout",
            )));
        }
        Poll::Pending
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FirstRequestDeadline<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The layer that marks a connection's [`FirstRequestSeen`] when a request arrives on it.
#[derive(Debug, Clone, Copy, Default)]
pub struct MarkFirstRequest;

impl<S> tower::Layer<S> for MarkFirstRequest {
    type Service = MarkFirstRequestService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MarkFirstRequestService { inner }
    }
}

/// See [`MarkFirstRequest`].
#[derive(Debug, Clone)]
pub struct MarkFirstRequestService<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for MarkFirstRequestService<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if let Some(seen) = req.extensions().get::<FirstRequestSeen>() {
            seen.mark();
        }
        self.inner.call(req)
    }
}
