//! Streaming response bodies: SSE frames, and cutting a connection short.

use std::io;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use tokio::sync::mpsc;

/// Sends body chunks; an `Err` aborts the connection (no terminating chunk).
pub type BodyTx = mpsc::Sender<Result<Bytes, io::Error>>;

/// A body fed by a channel.
pub fn channel_body() -> (BodyTx, Body) {
    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(64);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (tx, Body::from_stream(stream))
}

/// A `200 text/event-stream` response around `body` (vLLM's headers).
pub fn sse_response(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    r
}

/// A `200` response whose connection is closed before any body byte (a crashed server).
pub fn cut_response() -> Response {
    let (tx, body) = channel_body();
    let _ = tx.try_send(Err(io::Error::other("simulated crash")));
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::OK;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `data: {json}\n\n`.
pub fn data(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// `event: {name}\ndata: {json}\n\n`.
pub fn event(name: &str, json: &str) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {json}\n\n"))
}

/// Sends a chunk; `false` when the client is gone.
pub async fn send(tx: &BodyTx, b: Bytes) -> bool {
    tx.send(Ok(b)).await.is_ok()
}

/// Aborts the connection (after giving the server a moment to flush what was sent, so that
/// the client receives every chunk before the cut).
pub async fn cut(tx: &BodyTx) {
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let _ = tx.send(Err(io::Error::other("simulated crash"))).await;
}

/// A JSON string literal.
pub fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}
