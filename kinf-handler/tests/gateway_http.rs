//! The HTTP gateway against upstreams that replay real vLLM 0.32 responses (captured bytes in
//! testdata/vllm-0.32.0-cpu): pass-through, model rewrite, usage injection and stripping,
//! errors in the caller's shape, retry on connection failure, live reload.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::{OnApplied, reload};
use serde_json::Value;
use support::replay::{CHAT, CHAT_STREAM, MESSAGES, start_upstream};
use support::temp_dir;

fn config(endpoints: &[String], max_body: &str) -> String {
    let eps = endpoints
        .iter()
        .map(|e| format!("\"{e}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: test }}
spec:
  endpoints: [{eps}]
  models:
  - name: tiny-llama
    aliases: [tiny, small-model]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: test }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: test }}
spec:
  pool: pool
  limits: {{ maxBodyBytes: {max_body} }}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p, namespace: test }}
spec:
  rules:
  - name: small
    matches: [ {{ model: small-model }} ]
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
"#
    )
}

fn noop() -> OnApplied {
    Arc::new(|_, _| {})
}

async fn start_gateway(dir: &Path) -> (Arc<Gateway>, SocketAddr) {
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    reload(&gw, dir, None, &noop());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    (gw, addr)
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

async fn call(addr: SocketAddr, path: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = hyper::Request::builder()
        .method(if body.is_empty() { "GET" } else { "POST" })
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

const HELLO: &str = r#"{"model":"small-model","messages":[{"role":"user","content":"Hello there"}],"max_tokens":8}"#;

#[tokio::test]
async fn plain_chat_is_rewritten_forwarded_and_passed_back_unchanged() {
    let (up, seen) = start_upstream(false).await;
    let dir = temp_dir("plain");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (gw, addr) = start_gateway(&dir).await;

    let r = call(
        addr,
        "/v1/chat/completions",
        HELLO,
        &[("authorization", "Bearer sk-client")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body, CHAT, "the response passes through byte for byte");
    assert_eq!(r.headers["x-kinference-endpoint"], up.to_string().as_str());
    assert_eq!(r.headers["x-kinference-model"], "tiny-llama");
    assert_eq!(r.headers["x-kinference-rule"], "test/p/small");
    let (body0, headers0) = {
        let s = seen.lock();
        (s.bodies[0].clone(), s.headers[0].clone())
    };
    assert_eq!(body0["model"], "tiny-llama", "model rewritten upstream");
    assert_eq!(body0["messages"][0]["content"], "Hello there");
    assert!(body0.get("stream_options").is_none());
    assert!(
        !headers0.contains_key("authorization"),
        "client credentials are not forwarded"
    );
    let usage = gw.metrics.value(
        "kinference_tokens_total",
        &[
            ("model", "tiny-llama"),
            ("destination", "tiny"),
            ("destination_namespace", "test"),
            ("kind", "output"),
        ],
    );
    assert_eq!(usage, Some(16.0));

    // /v1/models lists names and aliases.
    let m = call(addr, "/v1/models", "", &[]).await.json();
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["small-model", "tiny", "tiny-llama"]);
}

#[tokio::test]
async fn streams_get_usage_injected_and_the_extra_chunk_removed() {
    let (up, seen) = start_upstream(false).await;
    let dir = temp_dir("stream");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (gw, addr) = start_gateway(&dir).await;

    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true}"#;
    let r = call(addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        seen.lock().bodies[0]["stream_options"]["include_usage"],
        true
    );
    assert!(
        !r.body.contains("\"usage\""),
        "usage chunk leaked: {}",
        r.body
    );
    assert!(r.body.ends_with("data: [DONE]\n\n"));
    let expected: String = CHAT_STREAM
        .split_inclusive("\n\n")
        .filter(|e| !e.contains("\"usage\""))
        .collect();
    assert_eq!(
        r.body, expected,
        "every other event passes through unchanged"
    );
    // The usage was still accounted, and the TTFT observed.
    assert_eq!(
        gw.metrics.value(
            "kinference_tokens_total",
            &[
                ("model", "tiny-llama"),
                ("destination", "tiny"),
                ("destination_namespace", "test"),
                ("kind", "uncached_prompt")
            ],
        ),
        Some(85.0)
    );
    let mut m = String::new();
    gw.metrics.render(&mut m);
    assert!(
        m.contains("kinference_upstream_ttft_seconds_count{destination=\"tiny\""),
        "{m}"
    );

    // A client that asked for usage gets it.
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}"#;
    let r = call(addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(r.body, CHAT_STREAM);

    // `"stream_options": null` is no request for usage: it is asked for all the same (before,
    // the null was forwarded and the response went unaccounted), and the chunk is removed.
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":null}"#;
    let r = call(addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        seen.lock().bodies[2]["stream_options"],
        serde_json::json!({"include_usage": true})
    );
    assert_eq!(r.body, expected);
}

#[tokio::test]
async fn errors_come_in_the_callers_shape() {
    let (up, _) = start_upstream(false).await;
    let dir = temp_dir("errors");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "1Ki")).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;

    let r = call(addr, "/v1/chat/completions", "{not json", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["param"], "body");

    let r = call(addr, "/v1/chat/completions", r#"{"model":"tiny"}"#, &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["param"], "messages");

    let r = call(
        addr,
        "/v1/chat/completions",
        r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let e = r.json();
    assert_eq!(e["error"]["code"], "model_not_found");
    assert_eq!(e["error"]["param"], "model");
    assert!(e["error"]["message"].as_str().unwrap().contains("nope"));

    let r = call(
        addr,
        "/v1/messages",
        r#"{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "not_found_error");

    let big = format!(
        r#"{{"model":"tiny","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2000)
    );
    let r = call(addr, "/v1/chat/completions", &big, &[]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        r.headers["connection"], "close",
        "the unread body makes the connection unusable"
    );
    assert_eq!(r.json()["error"]["code"], "body_too_large");

    let r = call(
        addr,
        "/v1/chat/completions",
        HELLO,
        &[("x-kinference-qos", "urgent")],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["param"], "x-kinference-qos");

    // Anthropic requests pass through to /v1/messages with the model rewritten.
    let r = call(
        addr,
        "/v1/messages",
        r#"{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"x"}]}"#,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, MESSAGES);
}

#[tokio::test]
async fn a_dead_endpoint_is_retried_on_the_next_one() {
    let (up, seen) = start_upstream(false).await;
    // A port that refuses connections.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dir = temp_dir("retry");
    std::fs::write(
        dir.join("c.yaml"),
        config(&[dead.to_string(), up.to_string()], "64Ki"),
    )
    .unwrap();
    let (gw, addr) = start_gateway(&dir).await;
    for _ in 0..4 {
        let r = call(addr, "/v1/chat/completions", HELLO, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
        assert_eq!(r.headers["x-kinference-endpoint"], up.to_string().as_str());
    }
    assert_eq!(seen.lock().bodies.len(), 4);
    let retries = gw
        .metrics
        .value(
            "kinference_upstream_retries_total",
            &[("endpoint", &dead.to_string())],
        )
        .unwrap_or(0.0);
    assert!(retries >= 1.0, "{retries}");
}

#[tokio::test]
async fn a_worker_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let (up, _) = start_upstream(true).await;
    let dir = temp_dir("die");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (gw, addr) = start_gateway(&dir).await;
    let body = r#"{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"stream":true}"#;
    let r = call(addr, "/v1/chat/completions", body, &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    let events: Vec<&str> = r.body.split_inclusive("\n\n").collect();
    assert_eq!(events.len(), 3 + 2, "{}", r.body);
    // The half-received fourth event is dropped (an SSE client drops an event the stream ends
    // inside of), so that the error event is one of its own: glued to it, it was invalid JSON.
    assert!(events[3].starts_with("data: {\"error\""), "{}", events[3]);
    let error: serde_json::Value =
        serde_json::from_str(events[3].trim_start_matches("data: ").trim_end()).unwrap();
    assert_eq!(error["error"]["code"], "upstream_error", "{error}");
    assert_eq!(events[4], "data: [DONE]\n\n");
    assert_eq!(
        gw.metrics.value(
            "kinference_responses_total",
            &[
                ("destination", "tiny"),
                ("destination_namespace", "test"),
                ("status", "200"),
                ("outcome", "incomplete")
            ]
        ),
        Some(1.0)
    );

    // A non-streamed answer that breaks half way: a 502 in the caller's shape, not a 200 cut
    // short.
    let r = call(addr, "/v1/chat/completions", HELLO, &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.body);
    let v = r.json();
    assert_eq!(v["error"]["code"], "upstream_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("could not be read whole"),
        "{v}"
    );
    assert_eq!(
        gw.metrics.value(
            "kinference_requests_total",
            &[
                ("api", "chat"),
                ("status", "502"),
                ("code", "upstream_error")
            ]
        ),
        Some(1.0)
    );
    // Accounted once per tenant: as the incomplete answer it was, not also as a refusal.
    let mut m = String::new();
    gw.metrics.render(&mut m);
    let refusals: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("kinference_tenant_requests_total{"))
        .filter(|l| l.contains("code=\"upstream_error\""))
        .collect();
    assert!(refusals.is_empty(), "{refusals:#?}");
}

#[tokio::test]
async fn a_broken_bundle_is_refused_and_the_last_good_policy_stays() {
    let (up, _) = start_upstream(false).await;
    let dir = temp_dir("reload");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (gw, addr) = start_gateway(&dir).await;
    let first = gw.store.current().unwrap().generation;

    // An edit with an error: refused, visible, and requests still work.
    std::fs::write(
        dir.join("c.yaml"),
        config(&[up.to_string()], "64Ki").replace("minimize: PredictedTTFT", "minimize: Speed"),
    )
    .unwrap();
    reload(&gw, &dir, Some(0), &noop());
    assert_eq!(gw.store.current().unwrap().generation, first);
    let ready = call(addr, "/readyz", "", &[]).await;
    assert_eq!(ready.status, StatusCode::OK);
    // vLLM's liveness path answers too (load generators probe it).
    assert_eq!(call(addr, "/health", "", &[]).await.status, StatusCode::OK);
    let detail = ready.json();
    let errors = detail["lastRefused"]["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().unwrap().contains("c.yaml:")),
        "errors name the file and line: {detail}"
    );
    let status = call(addr, "/admin/status", "", &[]).await.json();
    assert!(
        status["lastRefused"]["codes"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );
    assert_eq!(
        call(addr, "/v1/chat/completions", HELLO, &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        gw.metrics.value("kinference_policy_refused", &[]),
        Some(1.0)
    );

    // Fixed: applied, refusal cleared.
    std::fs::write(
        dir.join("c.yaml"),
        config(&[up.to_string()], "64Ki").replace("small-model]", "small-model, little]"),
    )
    .unwrap();
    reload(&gw, &dir, Some(0), &noop());
    assert_eq!(gw.store.current().unwrap().generation, first + 1);
    assert!(gw.store.last_rejected().is_none());
    let r = call(
        addr,
        "/v1/chat/completions",
        &HELLO.replace("small-model", "little"),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// `method path` with `body` and exactly `headers` (no default content type).
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[tokio::test]
async fn the_upstream_gets_json_whatever_content_type_the_client_declared() {
    let (up, seen) = start_upstream(false).await;
    let dir = temp_dir("ctype");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    let declared: [&[(&str, &str)]; 4] = [
        &[("content-type", "text/plain")],
        &[("content-type", "application/x-www-form-urlencoded")],
        &[("content-type", "application/json; charset=utf-8")],
        &[],
    ];
    for (i, headers) in declared.iter().enumerate() {
        let r = request(addr, "POST", "/v1/chat/completions", HELLO, headers).await;
        assert_eq!(r.status, StatusCode::OK, "{headers:?}: {}", r.body);
        let seen_types: Vec<String> = seen.lock().headers[i]
            .get_all("content-type")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(seen_types, ["application/json"], "client sent {headers:?}");
    }
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_in_the_callers_shape() {
    let (up, _) = start_upstream(false).await;
    let dir = temp_dir("notfound");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;

    // Wrong method: 405 with `allow`, OpenAI shape...
    let r = request(addr, "GET", "/v1/chat/completions", "", &[]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED, "{}", r.body);
    assert_eq!(r.headers["allow"], "POST");
    assert_eq!(r.headers["content-type"], "application/json");
    let e = r.json();
    assert_eq!(e["error"]["code"], "method_not_allowed", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert_eq!(e["error"]["param"], Value::Null, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("GET"));
    let r = request(addr, "POST", "/v1/models", "{}", &[]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    // ... Anthropic's under /v1/messages.
    let r = request(addr, "GET", "/v1/messages", "", &[]).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.headers["allow"], "POST");
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");

    // Unknown path: 404 in the caller's shape.
    for (method, path) in [("GET", "/v1/foo"), ("POST", "/v1/embeddings"), ("GET", "/")] {
        let r = request(addr, method, path, "", &[]).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{method} {path}");
        let e = r.json();
        assert_eq!(e["error"]["code"], "not_found", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(path),
            "{e}"
        );
    }
    let r = request(addr, "POST", "/v1/messages/batches", "{}", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "not_found_error", "{e}");

    // `GET /v1/models/{id}`: every name `/v1/models` lists, and nothing else.
    let listed = call(addr, "/v1/models", "", &[]).await.json();
    for m in listed["data"].as_array().unwrap() {
        let id = m["id"].as_str().unwrap();
        let r = request(addr, "GET", &format!("/v1/models/{id}"), "", &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{id}: {}", r.body);
        let got = r.json();
        assert_eq!(got["id"], id);
        assert_eq!(got["object"], "model");
        assert_eq!(got["owned_by"], m["owned_by"]);
    }
    let r = request(addr, "GET", "/v1/models/nope", "", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let e = r.json();
    assert_eq!(e["error"]["code"], "model_not_found", "{e}");
    assert_eq!(e["error"]["param"], "model", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    let r = request(addr, "GET", "/v1/models/org/tiny", "", &[]).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "a name with a slash is looked up whole"
    );
    assert_eq!(r.json()["error"]["code"], "model_not_found");
}

#[tokio::test]
async fn a_bundle_without_a_pool_says_so() {
    let (up, _) = start_upstream(false).await;
    let dir = temp_dir("nopool");
    std::fs::write(
        dir.join("c.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: test }}
spec:
  endpoints: ["{up}"]
  models: [ {{ name: tiny-llama }} ]
"#
        ),
    )
    .unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    let r = call(
        addr,
        "/v1/chat/completions",
        r#"{"model":"tiny-llama","messages":[{"role":"user","content":"Hi"}]}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let e = r.json();
    assert_eq!(e["error"]["code"], "unknown_pool", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no InferencePool is configured"),
        "{message}"
    );
    assert!(!message.contains("<unspecified>"), "{message}");
}

#[tokio::test]
async fn a_request_before_any_policy_is_refused_not_ready_and_counted() {
    // No reload: no policy is in force yet.
    let gw = Gateway::new(GatewayOptions {
        base_dir: temp_dir("no-policy"),
        ..Default::default()
    });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    let r = call(
        addr,
        "/v1/chat/completions",
        r#"{"model":"m","messages":[{"role":"user","content":"Hi"}]}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "not_ready");
    assert_eq!(
        gw.metrics.value(
            "kinference_requests_total",
            &[("api", "chat"), ("status", "503"), ("code", "not_ready")]
        ),
        Some(1.0)
    );
}

/// `config` with a pool-wide token limit, so that each response's `x-ratelimit-remaining-tokens`
/// shows what the request reserved (the bucket starts full).
fn config_with_token_limit(endpoint: &str) -> String {
    format!(
        r#"{}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: limits, namespace: test }}
spec:
  limits:
  - name: tokens
    tokensPerMinute: 100000
"#,
        config(&[endpoint.to_owned()], "64Ki").trim_end()
    )
}

/// OpenAI's and vLLM's completions take a batch of token-id prompts (`[[1, 2], [3]]`), as
/// they take a batch of strings: it is forwarded unchanged. Before, the gateway refused it with
/// a 400 naming `prompt`.
#[tokio::test]
async fn completions_take_a_batch_of_token_id_prompts() {
    let (up, seen) = start_upstream(false).await;
    let dir = temp_dir("token-batch");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    let body = r#"{"model":"tiny","prompt":[[1,2,3],[4,5]],"max_tokens":4}"#;
    let r = call(addr, "/v1/completions", body, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let sent = seen.lock().bodies[0].clone();
    assert_eq!(sent["prompt"], serde_json::json!([[1, 2, 3], [4, 5]]));
    assert_eq!(sent["model"], "tiny-llama");
    // What no API accepts is still refused here, in the caller's shape, naming the prompt.
    for bad in [
        r#"{"model":"tiny","prompt":[[1,2],"x"]}"#,
        r#"{"model":"tiny","prompt":[[1,-2]]}"#,
        r#"{"model":"tiny","prompt":[[1,[2]]]}"#,
    ] {
        let r = call(addr, "/v1/completions", bad, &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
        assert!(
            r.json()["error"]["param"]
                .as_str()
                .is_some_and(|p| p.starts_with("prompt")),
            "{bad}: {}",
            r.body
        );
    }
    assert_eq!(
        seen.lock().bodies.len(),
        1,
        "nothing malformed was forwarded"
    );
}

/// vLLM sends `stream_options.continuous_usage_stats` (usage on every chunk) only with
/// `include_usage`. A client that asked for the first without the second gets no usage from
/// vLLM; through the gateway, which asks for `include_usage` on its behalf, it got `usage` on
/// every chunk but the last (only the final usage chunk was removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_usage_stats_without_include_usage_stay_off() {
    let worker = support::tiny_sim("50", &[]).await;
    let dir = temp_dir("continuous");
    std::fs::write(
        dir.join("c.yaml"),
        config(&[worker.http.to_string()], "64Ki"),
    )
    .unwrap();
    let (gw, addr) = start_gateway(&dir).await;
    let body = |opts: &str| {
        format!(
            r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hi"}}],"max_tokens":4,"stream":true,"stream_options":{opts}}}"#
        )
    };
    // Straight at the worker (vLLM's behaviour), then through the gateway.
    let quiet = body(r#"{"continuous_usage_stats":true}"#);
    let direct = call(worker.http, "/v1/chat/completions", &quiet, &[]).await;
    assert!(!direct.body.contains("\"usage\""), "{}", direct.body);
    let r = call(addr, "/v1/chat/completions", &quiet, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.ends_with("data: [DONE]\n\n"), "{}", r.body);
    assert!(!r.body.contains("\"usage\""), "usage leaked: {}", r.body);
    // The gateway still learnt the usage.
    let output = || {
        gw.metrics.value(
            "kinference_tokens_total",
            &[
                ("model", "tiny-llama"),
                ("destination", "tiny"),
                ("destination_namespace", "test"),
                ("kind", "output"),
            ],
        )
    };
    assert_eq!(output(), Some(4.0));
    // A client that asked for both gets usage on every chunk, as from vLLM.
    let both = body(r#"{"include_usage":true,"continuous_usage_stats":true}"#);
    let r = call(addr, "/v1/chat/completions", &both, &[]).await;
    let chunks: Vec<&str> = r
        .body
        .split("\n\n")
        .filter(|e| e.starts_with("data: {"))
        .collect();
    assert!(chunks.len() > 4, "{}", r.body);
    assert!(chunks.iter().all(|c| c.contains("\"usage\"")), "{}", r.body);
    assert_eq!(output(), Some(8.0));
}

/// Anthropic's `max_tokens` is at least 1. vLLM refuses 0 with a request-schema error, which
/// its `/v1/messages` answers in OpenAI's shape (`{"error": {..., "param":
/// "body.max_tokens"}}`): an Anthropic SDK cannot read it. The gateway refuses it itself, in
/// Anthropic's shape, and the worker never sees it.
#[tokio::test]
async fn messages_refuse_max_tokens_0_in_anthropics_shape() {
    let (up, seen) = start_upstream(false).await;
    let dir = temp_dir("messages-max0");
    std::fs::write(dir.join("c.yaml"), config(&[up.to_string()], "64Ki")).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    let r = call(
        addr,
        "/v1/messages",
        r#"{"model":"tiny","max_tokens":0,"messages":[{"role":"user","content":"x"}]}"#,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    let e = r.json();
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`max_tokens`"),
        "{e}"
    );
    assert!(seen.lock().bodies.is_empty(), "forwarded to the worker");
    // 1 is fine.
    let r = call(
        addr,
        "/v1/messages",
        r#"{"model":"tiny","max_tokens":1,"messages":[{"role":"user","content":"x"}]}"#,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
}

/// What a request reserves under a token limit is what vLLM may generate: on
/// `/v1/completions`, `max_tokens` (vLLM's default 16 when absent or null; vLLM's completions
/// know no `max_completion_tokens`), for every choice (`n`) of every prompt of a batch, plus
/// the prompts of the whole batch. Before, a completions request without `max_tokens`
/// reserved 256, one with `max_completion_tokens` reserved that, and `n` and later prompts
/// were not counted.
#[tokio::test]
async fn token_reservations_count_what_vllm_will_generate() {
    let (up, _seen) = start_upstream(false).await;
    let dir = temp_dir("estimates");
    std::fs::write(dir.join("c.yaml"), config_with_token_limit(&up.to_string())).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    // The bucket holds 100000; each response settles its usage (the replayed answer's 102
    // tokens), and 100 ms refill more than that, so every request below starts from a full
    // bucket and its remaining tokens say what it reserved.
    // (0 for a request that was refused: it reserved nothing.)
    let reserved = |r: &Reply| {
        let Some(left) = r.headers.get("x-ratelimit-remaining-tokens") else {
            assert_ne!(r.status, StatusCode::OK, "{}", r.body);
            return 0;
        };
        100_000 - left.to_str().unwrap().parse::<u64>().unwrap()
    };
    let mut got = Vec::new();
    for body in [
        // 3 prompt tokens (token ids are exact) + vLLM's default of 16.
        r#"{"model":"tiny","prompt":[1,2,3]}"#,
        r#"{"model":"tiny","prompt":[1,2,3],"max_tokens":null}"#,
        // `max_completion_tokens` is no field of vLLM's completions: still 16.
        r#"{"model":"tiny","prompt":[1,2,3],"max_completion_tokens":5000}"#,
        // `max_tokens` is.
        r#"{"model":"tiny","prompt":[1,2,3],"max_tokens":10}"#,
        // Two choices of 10.
        r#"{"model":"tiny","prompt":[1,2,3],"max_tokens":10,"n":2}"#,
        // A batch of two prompts (3 + 4 tokens), two choices each.
        r#"{"model":"tiny","prompt":[[1,2,3],[4,5,6,7]],"max_tokens":10,"n":2}"#,
    ] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        got.push(reserved(&call(addr, "/v1/completions", body, &[]).await));
    }
    assert_eq!(got, [19, 19, 19, 13, 23, 47]);
    // Chat: `max_completion_tokens` first, then `max_tokens`; `n` choices of it each.
    let chat = |extra: &str| {
        format!(r#"{{"model":"tiny","messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#)
    };
    let mut chat_got = Vec::new();
    for extra in [
        r#","max_tokens":10"#,
        r#","max_tokens":10,"n":3"#,
        r#","max_completion_tokens":10,"max_tokens":99,"n":3"#,
    ] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        chat_got.push(reserved(
            &call(addr, "/v1/chat/completions", &chat(extra), &[]).await,
        ));
    }
    let prompt = chat_got[0] - 10;
    assert_eq!(chat_got, [prompt + 10, prompt + 30, prompt + 30]);
}
