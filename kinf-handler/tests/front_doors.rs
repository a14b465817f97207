//! Choosing the front door (`GatewayBackend`) by host: over HTTP/1.1 (`Host`) and HTTP/2
//! (`:authority`, which clients send instead of `Host`), and what a host that no door answers
//! gets under `--unknown-hosts first-door` (the first door) and `reject` (404 `unknown_host`
//! in the caller's API shape; a door without `hosts` still catches it). Each door serves a
//! pool with its own model, so `/v1/models` says which door answered.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use kinf_handler::gateway::runtime::UnknownHosts;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::grpc::handler::HandlerService;
use kinf_handler::grpc::handler_v1::{DecideRequest, Header, decide_response};
use kinf_handler::listen::{HttpLimits, serve_http};
use kinf_handler::serve::{OnApplied, reload};
use serde_json::{Value, json};
use support::temp_dir;

/// Pools `alpha` and `beta`, each with a model of its own, and a front door for each:
/// `alpha.test` (created first) and `beta.test`; with `catch_all`, a third door without
/// `hosts` serving `beta`.
fn config(catch_all: bool) -> String {
    let mut s = String::new();
    for (name, port) in [("alpha", 9), ("beta", 10)] {
        s += &format!(
            r#"---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: {name}, namespace: test }}
spec:
  endpoints: ["127.0.0.1:{port}"]
  models:
  - name: {name}-model
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: {name}, namespace: test }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: {name} }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: {name}, namespace: test }}
spec:
  targetRefs: [ {{ kind: InferencePool, name: {name} }} ]
  rules:
  - name: local
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: {name}, namespace: test }}
spec:
  pool: {name}
  hosts: [{name}.test]
"#
        );
    }
    if catch_all {
        s += r#"---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: { name: everyone-else, namespace: test }
spec:
  pool: beta
"#;
    }
    s
}

fn noop() -> OnApplied {
    Arc::new(|_, _| {})
}

async fn gateway(
    tag: &str,
    catch_all: bool,
    unknown_hosts: UnknownHosts,
) -> (Arc<Gateway>, SocketAddr) {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("c.yaml"), config(catch_all)).unwrap();
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        unknown_hosts,
        ..Default::default()
    });
    reload(&gw, &dir, None, &noop());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    // The listener the binary uses (HTTP/1.1 and HTTP/2 on one port).
    tokio::spawn(async move {
        serve_http(l, app, HttpLimits::default(), None, std::future::pending()).await
    });
    (gw, addr)
}

/// A request over HTTP/1.1 with `Host: host` (`None`: no `Host` header at all).
async fn http1(
    addr: SocketAddr,
    host: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(path);
    if let Some(h) = host {
        req = req.header("host", h);
    }
    let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
    let resp = send
        .send_request(
            req.header("content-type", "application/json")
                .body(Full::new(bytes))
                .unwrap(),
        )
        .await
        .unwrap();
    read(resp).await
}

/// A `GET` over HTTP/2 (prior knowledge, no TLS) whose `:authority` is `authority`, with no
/// `Host` header, as HTTP/2 clients send it.
async fn http2_get(addr: SocketAddr, authority: &str, path: &str) -> (u16, Value) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri(format!("http://{authority}{path}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    assert!(req.headers().get("host").is_none());
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), hyper::Version::HTTP_2);
    read(resp).await
}

async fn read(resp: hyper::Response<hyper::body::Incoming>) -> (u16, Value) {
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

/// The model ids `/v1/models` lists.
fn ids(v: &Value) -> Vec<&str> {
    v["data"]
        .as_array()
        .unwrap_or_else(|| panic!("not a model list: {v}"))
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect()
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
}

#[tokio::test]
async fn http2_requests_reach_the_front_door_their_authority_names() {
    let (_gw, addr) = gateway("doors-h2", false, UnknownHosts::FirstDoor).await;
    // HTTP/1.1: the `Host` header, with or without a port, in any case.
    let (s, v) = http1(addr, Some("beta.test"), "GET", "/v1/models", None).await;
    assert_eq!((s, ids(&v)), (200, vec!["beta-model"]));
    let (_, v) = http1(addr, Some("BETA.test:8080"), "GET", "/v1/models", None).await;
    assert_eq!(ids(&v), vec!["beta-model"]);
    // HTTP/2: `:authority` only. Before it was copied into `Host`, every HTTP/2 request went
    // to the first door.
    let (s, v) = http2_get(addr, "beta.test", "/v1/models").await;
    assert_eq!((s, ids(&v)), (200, vec!["beta-model"]), "{v}");
    let (_, v) = http2_get(addr, "beta.test:443", "/v1/models").await;
    assert_eq!(ids(&v), vec!["beta-model"]);
    let (_, v) = http2_get(addr, "alpha.test", "/v1/models").await;
    assert_eq!(ids(&v), vec!["alpha-model"]);
}

#[tokio::test]
async fn by_default_a_host_no_door_names_goes_to_the_first_door() {
    let (_gw, addr) = gateway("doors-first", false, UnknownHosts::FirstDoor).await;
    for host in [Some("127.0.0.1:8080"), Some("gamma.test"), None] {
        let (s, v) = http1(addr, host, "GET", "/v1/models", None).await;
        assert_eq!((s, ids(&v)), (200, vec!["alpha-model"]), "host {host:?}");
    }
    let (_, v) = http2_get(addr, "gamma.test", "/v1/models").await;
    assert_eq!(ids(&v), vec!["alpha-model"]);
}

#[tokio::test]
async fn with_reject_a_host_no_door_names_gets_404_in_the_callers_shape() {
    let (gw, addr) = gateway("doors-reject", false, UnknownHosts::Reject).await;
    // Named hosts are served as before.
    let (s, v) = http1(addr, Some("alpha.test"), "GET", "/v1/models", None).await;
    assert_eq!((s, ids(&v)), (200, vec!["alpha-model"]));

    // OpenAI shape: the model list, a model, a chat completion (refused before its body is
    // read or its model looked up).
    for (method, path, body) in [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/alpha-model", None),
        ("POST", "/v1/chat/completions", Some(chat("alpha-model"))),
        (
            "POST",
            "/v1/completions",
            Some(json!({"model": "alpha-model", "prompt": "hi"})),
        ),
    ] {
        let (s, v) = http1(addr, Some("gamma.test:8080"), method, path, body).await;
        assert_eq!(s, 404, "{path}: {v}");
        assert_eq!(v["error"]["code"], "unknown_host", "{path}: {v}");
        assert_eq!(v["error"]["param"], "host", "{path}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("`gamma.test:8080`") && msg.contains("--unknown-hosts reject"),
            "{msg}"
        );
    }
    // Anthropic shape on /v1/messages.
    let (s, v) = http1(
        addr,
        Some("gamma.test"),
        "POST",
        "/v1/messages",
        Some(json!({"model": "alpha-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(s, 404, "{v}");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    // No `Host` at all (HTTP/1.0-style).
    let (s, v) = http1(addr, None, "GET", "/v1/models", None).await;
    assert_eq!(s, 404, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("names no host"),
        "{v}"
    );
    // HTTP/2 by `:authority`, refused and served alike.
    let (s, _) = http2_get(addr, "gamma.test", "/v1/models").await;
    assert_eq!(s, 404);
    let (s, v) = http2_get(addr, "beta.test", "/v1/models").await;
    assert_eq!((s, ids(&v)), (200, vec!["beta-model"]));

    // gRPC `Decide` refuses it the same way, by `:authority`.
    let svc = HandlerService::new(gw.clone(), Default::default());
    let decide = |authority: &str| DecideRequest {
        path: "/v1/chat/completions".into(),
        headers: vec![Header {
            name: ":authority".into(),
            value: authority.into(),
        }],
        body: chat("alpha-model").to_string().into_bytes(),
    };
    let out = svc.decide_request(decide("gamma.test")).await;
    match out.outcome {
        Some(decide_response::Outcome::Reject(r)) => {
            assert_eq!(
                (r.http_status, r.code.as_str()),
                (404, "unknown_host"),
                "{r:?}"
            );
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(body["error"]["code"], "unknown_host", "{body}");
        }
        other => panic!("expected a 404 reject, got {other:?}"),
    }
    // A host a door names is routed (its endpoint is not up, but the decision is made).
    let out = svc.decide_request(decide("alpha.test")).await;
    assert!(
        matches!(out.outcome, Some(decide_response::Outcome::Route(ref r)) if r.model == "alpha-model"),
        "{:?}",
        out.outcome
    );
}

#[tokio::test]
async fn with_reject_a_door_without_hosts_still_catches_every_other_host() {
    let (_gw, addr) = gateway("doors-catch", true, UnknownHosts::Reject).await;
    for host in [Some("gamma.test"), None] {
        let (s, v) = http1(addr, host, "GET", "/v1/models", None).await;
        assert_eq!((s, ids(&v)), (200, vec!["beta-model"]), "host {host:?}");
    }
    let (_, v) = http1(addr, Some("alpha.test"), "GET", "/v1/models", None).await;
    assert_eq!(ids(&v), vec!["alpha-model"]);
}
