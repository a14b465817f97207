//! How a token reservation is settled when its response ends (tenants.md, "Reconciliation"),
//! through the gateway with a scripted worker: a response with `usage` gives back what it did
//! not use; a stream without a usage chunk is charged its prompt and one output token per token
//! event; a non-streamed answer whose usage is unknown (no `usage` in a 200, an error response
//! without it, a body that breaks while it is read: 502 `upstream_error`) keeps its whole
//! estimate charged, since the worker had the request and may have generated up to
//! `max_tokens`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use support::replay::{CHAT, CHAT_STREAM};
use support::{gateway, post_json, post_raw, temp_dir};

/// The bucket's capacity: `tokensPerMinute` of the one limit.
const CAPACITY: f64 = 100_000.0;
/// `max_tokens` of the scripted request: half the bucket.
const MAX_TOKENS: u64 = 50_000;

/// A worker that answers chat completions as the request's `user` says: `no-usage`, a 200
/// without `usage`; `broken`, a 200 whose body stops half way (the connection drops); `bad`, a
/// 500 error without `usage`; `refused`, vLLM's 400 for a request it will not run;
/// `stream-no-usage`, a stream that ends with `[DONE]` but without a usage chunk; anything
/// else, vLLM's answer with its `usage`.
async fn scripted_worker() -> SocketAddr {
    async fn chat(body: Bytes) -> Response {
        let v: Value = serde_json::from_slice(&body).unwrap();
        match v["user"].as_str() {
            Some("no-usage") => {
                let mut answer: Value = serde_json::from_str(CHAT).unwrap();
                answer.as_object_mut().unwrap().remove("usage");
                ([("content-type", "application/json")], answer.to_string()).into_response()
            }
            Some("broken") => {
                // The head and the first half go out; the rest fails a moment later (failing at
                // once, the worker would drop the connection before sending the head).
                let half = CHAT.get(..CHAT.len() / 2).unwrap().to_owned();
                let chunks = futures_util::stream::iter([Some(half), None]).then(|c| async move {
                    if c.is_none() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    c.map(Bytes::from)
                        .ok_or_else(|| std::io::Error::other("worker died"))
                });
                (
                    [("content-type", "application/json")],
                    Body::from_stream(chunks),
                )
                    .into_response()
            }
            Some("bad") => {
                let e = r#"{"object":"error","message":"an internal error","type":"InternalServerError","param":null,"code":500}"#;
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [("content-type", "application/json")],
                    e,
                )
                    .into_response()
            }
            Some("refused") => {
                let e = r#"{"object":"error","message":"This model's maximum context length is 2048 tokens.","type":"BadRequestError","param":null,"code":400}"#;
                (
                    StatusCode::BAD_REQUEST,
                    [("content-type", "application/json")],
                    e,
                )
                    .into_response()
            }
            Some("stream-no-usage") => {
                let events: String = CHAT_STREAM
                    .split_inclusive("\n\n")
                    .filter(|e| !e.contains("\"usage\""))
                    .collect();
                ([("content-type", "text/event-stream")], events).into_response()
            }
            _ => ([("content-type", "application/json")], CHAT).into_response(),
        }
    }
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(chat));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// One worker set behind one front door, every request under one token limit of
/// [`CAPACITY`] per minute.
fn config(worker: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [tiny] }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: t }}
spec:
  pool: pool
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: budgets, namespace: t }}
spec:
  limits:
  - name: tokens
    tokensPerMinute: {CAPACITY}
"#
    )
}

/// On a fresh gateway (a full bucket), sends a chat request of `max_tokens` [`MAX_TOKENS`]
/// scripted as `user`, then a small one that the worker answers with its usage: the first's
/// status and body, and the tokens the second's `x-ratelimit-remaining-tokens` says are left
/// after it. Settlement is synchronous with the memory store: the first response was settled
/// before the second was admitted.
async fn left_after(user: &str, stream: bool) -> (u16, String, f64) {
    let worker = scripted_worker().await;
    let dir = temp_dir(&format!("settle-{user}"));
    std::fs::write(dir.join("c.yaml"), config(worker)).unwrap();
    let (_gw, addr) = gateway(&dir).await;
    let scripted = json!({"model": "tiny", "user": user, "max_tokens": MAX_TOKENS,
                          "stream": stream,
                          "messages": [{"role": "user", "content": "Hello there"}]});
    let (status, _, body) = tokio::time::timeout(
        Duration::from_secs(20),
        post_raw(addr, "/v1/chat/completions", &scripted, &[]),
    )
    .await
    .expect("the scripted request did not end");
    let body = String::from_utf8_lossy(&body).into_owned();
    let probe = json!({"model": "tiny", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Hi"}]});
    let (s, h, v) = post_json(addr, "/v1/chat/completions", &probe, &[]).await;
    assert_eq!(s, 200, "{v}");
    let left: f64 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (status, body, left)
}

/// The estimate of the scripted request stayed charged: about half the bucket is gone (the
/// refill during the test is a few thousand tokens at most).
fn assert_estimate_kept(left: f64, what: &str) {
    assert!(
        left < CAPACITY - MAX_TOKENS as f64 + 10_000.0,
        "{what}: the estimate's `max_tokens` was given back ({left} tokens left)"
    );
}

/// The scripted request was settled with what it used: little of the bucket is gone.
fn assert_settled_small(left: f64, what: &str) {
    assert!(
        left > CAPACITY - 1_000.0,
        "{what}: the estimate stayed charged ({left} tokens left)"
    );
}

/// The control: a response with `usage` is settled with it, its unused `max_tokens` given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_with_usage_gives_back_what_it_did_not_use() {
    let (status, body, left) = left_after("with-usage", false).await;
    assert_eq!(status, 200, "{body}");
    assert_settled_small(left, "an answer with usage");
}

/// A non-streamed 200 without `usage`: what the worker generated is unknown (up to
/// `max_tokens`), so the whole estimate stays charged. Before, it was settled as "prompt only"
/// and the `max_tokens` part went back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streamed_answer_without_usage_keeps_its_estimate_charged() {
    let (status, body, left) = left_after("no-usage", false).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("\"usage\""), "{body}");
    assert_estimate_kept(left, "a 200 without usage");
}

/// A worker's body that breaks while it is read whole: the client gets a 502 `upstream_error`,
/// and, as tenants.md says of `upstream_error`, the estimate stays charged (the worker had the
/// request). Before, it was settled as "prompt only".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_answer_502_keeps_its_estimate_charged() {
    let (status, body, left) = left_after("broken", false).await;
    assert_eq!(status, 502, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("could not be read whole"), "{message}");
    assert_estimate_kept(left, "a body that broke half way");
}

/// A worker's error response without `usage` (passed through) keeps its estimate charged, as a
/// provider's does: nothing says how much was generated before the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_answer_without_usage_keeps_its_estimate_charged() {
    let (status, body, left) = left_after("bad", false).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("InternalServerError"),
        "passed through: {body}"
    );
    assert_estimate_kept(left, "a 500 without usage");
}

/// A stream that ends (`[DONE]`) without a usage chunk is settled with what it showed: the
/// prompt and one output token per token event (8 here), the rest of `max_tokens` given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_a_usage_chunk_is_charged_the_tokens_it_showed() {
    let (status, body, left) = left_after("stream-no-usage", true).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    assert!(!body.contains("\"usage\""), "{body}");
    assert_settled_small(left, "a stream without usage");
}

/// A worker's 400 (vLLM refusing the request: over the context) generated nothing: settled as
/// the prompt alone, the `max_tokens` part given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_400_gives_back_its_output_estimate() {
    let (status, body, left) = left_after("refused", false).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("maximum context length"),
        "passed through: {body}"
    );
    assert_settled_small(left, "a 400 from the worker");
}
