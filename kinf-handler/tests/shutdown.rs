//! Stopping `kinference serve` as Kubernetes stops a pod: on SIGTERM `/readyz` answers 503 at
//! once (so that the Service stops sending requests), requests that still arrive during
//! `--shutdown-delay` are served, then the listener closes and the process exits cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kinf_handler::grpc::handler_v1::handler_client::HandlerClient;
use kinf_handler::grpc::handler_v1::{DecideRequest, decide_response};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_readiness_first_then_stops_accepting() {
    let worker = tiny_sim("50", &[]).await;
    let dir = temp_dir("shutdown");
    write_tiny_bundle(&dir, &worker.http.to_string(), "");
    let mut server = ServeProcess::start(
        &dir,
        [
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--shutdown-delay",
            "2s",
        ],
    );
    let grpc = format!("http://{}", server.ports["grpc"].as_str().unwrap());
    let listen: SocketAddr = server.ports["listen"].as_str().unwrap().parse().unwrap();
    let admin: SocketAddr = server.ports["admin"].as_str().unwrap().parse().unwrap();
    let chat = json!({"model": "tiny-llama", "max_tokens": 4,
                      "messages": [{"role": "user", "content": "hello"}]});
    assert!(
        eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(admin).is_ok()
        })
        .await
    );
    let (s, body) = get_text(admin, "/readyz").await;
    assert_eq!(s, 200, "{body}");

    let signalled = Instant::now();
    server.terminate();
    // Not ready at once, with the reason.
    let mut draining = false;
    while signalled.elapsed() < Duration::from_millis(1500) {
        let (s, body) = get_text(admin, "/readyz").await;
        if s == 503 {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["draining"], true, "{v}");
            draining = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(draining, "/readyz still 200 after SIGTERM");
    // Still served while draining, over HTTP and gRPC.
    let (s, _, v) = post_json(listen, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(s, 200, "{v}");
    let mut c = HandlerClient::connect(grpc.clone()).await.unwrap();
    let r = c
        .decide(DecideRequest {
            path: "/v1/chat/completions".into(),
            headers: vec![],
            body: chat.to_string().into_bytes(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(r.outcome, Some(decide_response::Outcome::Route(_))),
        "{r:?}"
    );
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "the request came after the delay; the test proves nothing"
    );
    // Then the process exits cleanly, after the delay.
    let exited = loop {
        if let Some(status) = server.exited() {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(15),
            "still running 15 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "{exited:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(2),
        "exited before the delay"
    );
    assert!(std::net::TcpStream::connect(listen).is_err());
    assert!(HandlerClient::connect(grpc).await.is_err());
}
