//! `kinference serve --busy-poll`: the gateway binary in busy-polling mode serves plain and
//! streamed requests through a kinf-sim worker, and ingests the worker's KV events on its own
//! `kinf-ingest` thread (the prefix index learns the blocks; a repeat is routed with a cache
//! hit). Also: `--busy-poll` and `--worker-threads` are refused together.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{Value, json};
use support::{
    ServeProcess, post_json, post_raw, temp_dir, tiny_sim, tiny_tokenizer, write_tiny_bundle,
};

async fn admin_status(addr: SocketAddr) -> Value {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<axum::body::Bytes>>();
    let resp = client
        .get(format!("http://{addr}/admin/status").parse().unwrap())
        .await
        .unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).unwrap_or(Value::Null)
}

/// Polls `/admin/status` until `f` holds (true) or `timeout` passes (false).
async fn status_until(addr: SocketAddr, timeout: Duration, f: impl Fn(&Value) -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f(&admin_status(addr).await) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_polling_gateway_serves_and_ingests_kv_events() {
    let tok = tiny_tokenizer();
    let worker = tiny_sim(
        "1000",
        &[
            "--kv-events-port",
            "0",
            "--replay-port",
            "0",
            "--block-size",
            "16",
            "--tokenizer",
            &tok,
        ],
    )
    .await;
    let dir = temp_dir("busy-poll");
    write_tiny_bundle(
        &dir,
        &worker.http.to_string(),
        &format!(
            "  kvEvents: {{}}\n  metrics: {{ interval: 200ms }}\n  blockSize: 16\n  tokenizer: {{ path: {tok} }}\n"
        ),
    );
    let server = ServeProcess::start(&dir, ["--listen", "127.0.0.1:0", "--busy-poll", "200us"]);
    let pid = server.pid();
    let ports = &server.ports;
    let addr: SocketAddr = ports["listen"].as_str().unwrap().parse().unwrap();

    // Ready, with the KV-event stream connected.
    let connected = status_until(addr, Duration::from_secs(20), |st| {
        st["ingestion"]
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["kv"]["connected"] == true))
    })
    .await;
    assert!(
        connected,
        "KV events never connected: {}",
        admin_status(addr).await
    );

    // The ingestion thread exists.
    let names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == "kinf-ingest"),
        "threads: {names:?}"
    );

    // A long prompt (several blocks), sent twice: the second is a cache hit.
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(15);
    let body = json!({"model": "tiny-llama", "max_tokens": 2,
        "messages": [{"role": "user", "content": prompt}]});
    let (status, headers, first) = post_json(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        headers["x-kinference-endpoint"].to_str().unwrap(),
        worker.http.to_string()
    );
    let learned = status_until(addr, Duration::from_secs(10), |st| {
        st["ingestion"].as_array().is_some_and(|a| {
            a.iter()
                .any(|e| e["kv"]["events"].as_u64().unwrap_or(0) > 0)
        })
    })
    .await;
    assert!(
        learned,
        "no KV events ingested: {}",
        admin_status(addr).await
    );
    let (status, _, second) = post_json(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(status, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached > 0, "repeat was not a cache hit: {second}");

    // Many small requests in a row, and a streamed one.
    for i in 0..50 {
        let b = json!({"model": "tiny-llama", "max_tokens": 1,
            "messages": [{"role": "user", "content": format!("hello {i}")}]});
        let (status, _, v) = post_json(addr, "/v1/chat/completions", &b, &[]).await;
        assert_eq!(status, 200, "request {i}: {v}");
    }
    let b = json!({"model": "tiny-llama", "max_tokens": 3, "stream": true,
        "messages": [{"role": "user", "content": "stream please"}]});
    let (status, _, raw) = post_raw(addr, "/v1/chat/completions", &b, &[]).await;
    let text = String::from_utf8_lossy(&raw);
    assert_eq!(status, 200, "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The client did not ask for usage: the injected usage chunk is removed.
    assert!(!text.contains("\"usage\":{"), "{text}");
}

#[test]
fn busy_poll_and_worker_threads_are_refused_together() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kinference"))
        .args([
            "serve",
            "--config",
            ".",
            "--busy-poll",
            "200us",
            "--worker-threads",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--busy-poll") && err.contains("--worker-threads"),
        "{err}"
    );
}
