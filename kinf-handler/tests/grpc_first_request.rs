//! The gRPC listener closes a connection whose first request does not arrive within the head
//! timeout (`--header-read-timeout`), and leaves a connection that has carried one alone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kinf_handler::gateway::{Gateway, GatewayOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HEAD_TIMEOUT: Duration = Duration::from_millis(400);

async fn start() -> std::net::SocketAddr {
    let gw = Gateway::new(GatewayOptions::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kinf_handler::grpc::serve_grpc_with_shutdown(
        Arc::clone(&gw),
        listener,
        HEAD_TIMEOUT,
        std::future::pending(),
    ));
    addr
}

/// Reads until the server closes the connection (EOF or reset); the time it took.
async fn closed_after(mut tcp: tokio::net::TcpStream) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("the connection was still open after 10 s"),
        }
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_or_part_of_the_preface_is_closed() {
    let addr = start().await;
    let silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let waited = closed_after(silent).await;
    assert!(waited >= HEAD_TIMEOUT / 2, "closed after {waited:?}");

    let mut partial = tokio::net::TcpStream::connect(addr).await.unwrap();
    partial.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    closed_after(partial).await;
}

/// An HTTP/2 connection (preface and settings sent) on which a request is made after `delay`.
async fn request_after(addr: std::net::SocketAddr, delay: Duration) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let mut statuses = Vec::new();
    tokio::time::sleep(delay).await;
    // Twice, the second past the deadline: a connection that carried a request is kept.
    for pause in [Duration::ZERO, HEAD_TIMEOUT * 2] {
        tokio::time::sleep(pause).await;
        let req = hyper::Request::post(format!("http://{addr}/kinference.Unknown/Call"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let _ = resp.into_body().collect().await;
        statuses.push(status);
    }
    conn.abort();
    assert_eq!(statuses[0], statuses[1]);
    Ok(statuses[0])
}

#[tokio::test]
async fn a_connection_that_makes_a_request_in_time_is_kept_past_the_deadline() {
    let addr = start().await;
    // tonic answers an unknown method with HTTP 200 and grpc-status 12 (unimplemented).
    assert_eq!(request_after(addr, Duration::ZERO).await, Ok(200));
}

#[tokio::test]
async fn an_http2_connection_without_a_request_is_closed_at_the_deadline() {
    let addr = start().await;
    let err = request_after(addr, HEAD_TIMEOUT * 3).await.unwrap_err();
    assert!(!err.is_empty());
}
