//! `External` classifiers on the request path: an in-test classifier service whose tags drive
//! the decision (HTTP and gRPC `Decide`), undeclared tags dropped, and the failure modes
//! (`FailClosed` with and without `failureTag`, `FailOpen`) with their metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::grpc::handler_v1::handler_client::HandlerClient;
use kinf_handler::grpc::handler_v1::{DecideRequest, Header, decide_response};
use kinf_handler::serve::{OnApplied, reload};
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::temp_dir;

const CHAT: &str = include_str!("../../testdata/vllm-0.32.0-cpu/chat1.json");

async fn upstream() -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(|| async { ([("content-type", "application/json")], CHAT) }),
        )
        .route(
            "/v1/completions",
            post(|| async { ([("content-type", "application/json")], CHAT) }),
        )
        .route(
            "/v1/messages",
            post(|| async {
                axum::Json(json!({
                    "id": "msg_1", "type": "message", "role": "assistant", "model": "tiny-llama",
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn", "stop_sequence": null,
                    "usage": {"input_tokens": 5, "output_tokens": 1}
                }))
            }),
        );
    serve(app).await
}

async fn serve(app: Router) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// The classifier service: `/pii` tags prompts with an `@` or `SSN` `pii-detected` (plus an
/// undeclared tag), prompts mentioning `secret-project` only with an undeclared tag; `/slow`
/// answers after 500 ms; `/down` answers 500; `/junk` answers a body that is not tags.
async fn classifier(seen: Arc<Mutex<Vec<Value>>>) -> SocketAddr {
    let pii = move |body: Bytes| {
        let seen = seen.clone();
        async move {
            let v: Value = serde_json::from_slice(&body).unwrap();
            seen.lock().push(v.clone());
            let text: String = v["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["content"].as_str().unwrap().to_owned())
                .collect();
            let tags: Vec<&str> = if text.contains('@') || text.contains("SSN") {
                vec!["pii-detected", "not-declared"]
            } else if text.contains("secret-project") {
                vec!["not-declared"]
            } else {
                vec![]
            };
            axum::Json(json!({ "tags": tags })).into_response()
        }
    };
    let app = Router::new()
        .route("/pii", post(pii))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                axum::Json(json!({"tags": []}))
            }),
        )
        .route(
            "/down",
            post(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response() }),
        )
        .route(
            "/junk",
            post(|| async { ([("content-type", "application/json")], r#"{"tags": "x"}"#) }),
        );
    serve(app).await
}

/// One pool, five front doors told apart by host, each with one `External` classifier.
fn config(upstream: SocketAddr, cls: SocketAddr) -> String {
    let door = |name: &str, classifier: &str| {
        format!(
            r#"---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: {name}, namespace: test }}
spec:
  pool: pool
  hosts: [{name}.test]
  tenants: {{ defaultTenant: anonymous }}
  classifiers:
  - {classifier}
"#
        )
    };
    let mut s = format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: test }}
spec:
  endpoints: ["{upstream}"]
  models:
  - name: tiny-llama
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: test }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p, namespace: test }}
spec:
  rules:
  - name: pii
    matches: [ {{ tag: pii-detected }} ]
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
  - name: undeclared
    matches: [ {{ tag: not-declared }} ]
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
  - name: other
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
"#
    );
    s += &door(
        "tagger",
        &format!(
            "{{ name: pii, type: External, url: \"http://{cls}/pii\", tags: [pii-detected], timeout: 2s }}"
        ),
    );
    s += &door(
        "closedtag",
        &format!(
            "{{ name: slow, type: External, url: \"http://{cls}/slow\", tags: [pii-detected], timeout: 20ms, failureMode: FailClosed, failureTag: pii-detected }}"
        ),
    );
    s += &door(
        "closed",
        &format!(
            "{{ name: down, type: External, url: \"http://{cls}/down\", tags: [pii-detected] }}"
        ),
    );
    s += &door(
        "open",
        &format!(
            "{{ name: slow, type: External, url: \"http://{cls}/slow\", tags: [pii-detected], timeout: 20ms, failureMode: FailOpen }}"
        ),
    );
    s += &door(
        "junk",
        &format!(
            "{{ name: junk, type: External, url: \"http://{cls}/junk\", tags: [pii-detected], timeout: 2s, failureMode: FailClosed, failureTag: pii-detected }}"
        ),
    );
    s
}

fn noop() -> OnApplied {
    Arc::new(|_, _| {})
}

struct Setup {
    gw: Arc<Gateway>,
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
}

async fn setup(name: &str) -> Setup {
    let up = upstream().await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let cls = classifier(seen.clone()).await;
    let dir = temp_dir(name);
    std::fs::write(dir.join("c.yaml"), config(up, cls)).unwrap();
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    reload(&gw, &dir, None, &noop());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let rt = gw.runtime().unwrap();
    assert!(rt.problems.is_empty(), "{:?}", rt.problems);
    let addr = serve(gw.router_with_admin()).await;
    Setup { gw, addr, seen }
}

struct Reply {
    status: StatusCode,
    rule: Option<String>,
    body: Value,
}

async fn call(addr: SocketAddr, host: &str, path: &str, body: &Value) -> Reply {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}{path}"))
        .header("host", host)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status();
    let rule = resp
        .headers()
        .get("x-kinference-rule")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    Reply { status, rule, body }
}

fn chat(user: &str) -> Value {
    json!({
        "model": "tiny-llama",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": user}
        ],
        "max_tokens": 8
    })
}

const PII: &str = "Please email jane.doe@example.com about the refund.";
const CLEAN: &str = "What is the capital of France?";

#[tokio::test]
async fn external_tags_drive_the_decision() {
    let s = setup("ext-tags").await;
    let r = call(s.addr, "tagger.test", "/v1/chat/completions", &chat(PII)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"));
    // The service saw every message, in order.
    let q = s.seen.lock()[0].clone();
    assert_eq!(
        q,
        json!({"messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": PII}
        ]})
    );

    let r = call(s.addr, "tagger.test", "/v1/chat/completions", &chat(CLEAN)).await;
    assert_eq!(r.rule.as_deref(), Some("test/p/other"), "{}", r.body);

    // Completions: the prompt is one user message.
    let r = call(
        s.addr,
        "tagger.test",
        "/v1/completions",
        &json!({"model": "tiny-llama", "prompt": format!("My SSN is on file. {CLEAN}"), "max_tokens": 4}),
    )
    .await;
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"), "{}", r.body);
    assert_eq!(
        s.seen.lock().last().unwrap()["messages"][0]["role"],
        "user",
        "a completions prompt is one user message"
    );

    // A large body (admitted on the blocking pool) is classified too.
    let big = format!("{} {PII}", "lorem ipsum ".repeat(2000));
    let r = call(s.addr, "tagger.test", "/v1/chat/completions", &chat(&big)).await;
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"), "{}", r.body);

    let count = s.gw.metrics.value(
        "kinference_classifier_seconds_count",
        &[("classifier", "test/tagger/pii")],
    );
    assert_eq!(count, Some(4.0), "every call's latency is observed");
}

/// An Anthropic request: the service gets each `tool_use` block's name and `input` as a
/// message of the assistant, after the messages (as the chat API's `tool_calls`), and each
/// `tool_result`'s content in its user message.
#[tokio::test]
async fn anthropic_tool_use_input_and_tool_results_reach_the_service() {
    let s = setup("ext-tool-use").await;
    let body = json!({
        "model": "tiny-llama",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "Write to my colleague."},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "send_mail",
                 "input": {"to": "jane.doe@example.com"}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [
                    {"type": "text", "text": "sent"}
                ]}
            ]}
        ]
    });
    let r = call(s.addr, "tagger.test", "/v1/messages", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"), "{}", r.body);
    assert_eq!(
        s.seen.lock().last().unwrap(),
        &json!({"messages": [
            {"role": "user", "content": "Write to my colleague."},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "sent"},
            {"role": "assistant", "content": r#"send_mail {"to":"jane.doe@example.com"}"#}
        ]})
    );
}

/// The chat API's deprecated single `function_call` (still forwarded to providers) is read like
/// a `tool_calls` entry: personal data in its arguments is classified, not missed.
#[tokio::test]
async fn a_deprecated_function_call_reaches_the_service() {
    let s = setup("ext-function-call").await;
    let body = json!({
        "model": "tiny-llama",
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "Write to my colleague."},
            {"role": "assistant", "content": null,
             "function_call": {"name": "send_mail", "arguments": "{\"to\":\"jane.doe@example.com\"}"}},
            {"role": "function", "name": "send_mail", "content": "sent"}
        ]
    });
    let r = call(s.addr, "tagger.test", "/v1/chat/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"), "{}", r.body);
    assert_eq!(
        s.seen.lock().last().unwrap()["messages"][3],
        json!({"role": "assistant", "content": r#"send_mail {"to":"jane.doe@example.com"}"#})
    );
}

#[tokio::test]
async fn undeclared_tags_are_dropped_and_counted() {
    let s = setup("ext-undeclared").await;
    let r = call(
        s.addr,
        "tagger.test",
        "/v1/chat/completions",
        &chat("Status of secret-project?"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.rule.as_deref(),
        Some("test/p/other"),
        "`not-declared` is not in the spec's tags: dropped"
    );
    let r = call(s.addr, "tagger.test", "/v1/chat/completions", &chat(PII)).await;
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"));
    assert_eq!(
        s.gw.metrics.value(
            "kinference_classifier_undeclared_tags_total",
            &[("classifier", "test/tagger/pii")]
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn fail_closed_with_a_failure_tag_adds_the_tag() {
    let s = setup("ext-closed-tag").await;
    let r = call(
        s.addr,
        "closedtag.test",
        "/v1/chat/completions",
        &chat(CLEAN),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        r.rule.as_deref(),
        Some("test/p/pii"),
        "timed out: the failure tag stands in"
    );
    // A body that is not `{"tags": [strings]}` is a failure too.
    let r = call(s.addr, "junk.test", "/v1/chat/completions", &chat(CLEAN)).await;
    assert_eq!(r.rule.as_deref(), Some("test/p/pii"), "{}", r.body);
    let m = &s.gw.metrics;
    assert_eq!(
        m.value(
            "kinference_classifier_failures_total",
            &[
                ("classifier", "test/closedtag/slow"),
                ("mode", "FailClosed")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.value(
            "kinference_classifier_failures_total",
            &[("classifier", "test/junk/junk"), ("mode", "FailClosed")]
        ),
        Some(1.0)
    );
    let sum = m
        .value(
            "kinference_classifier_seconds_sum",
            &[("classifier", "test/closedtag/slow")],
        )
        .unwrap();
    assert!(
        (0.015..0.4).contains(&sum),
        "the call is cut at its 20ms timeout: {sum}"
    );
}

#[tokio::test]
async fn fail_closed_without_a_tag_rejects_with_503_in_the_callers_shape() {
    let s = setup("ext-closed").await;
    let r = call(s.addr, "closed.test", "/v1/chat/completions", &chat(CLEAN)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "classifier_unavailable");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("test/closed/down"), "{msg}");
    assert!(msg.contains("500"), "{msg}");

    let r = call(
        s.addr,
        "closed.test",
        "/v1/messages",
        &json!({"model": "tiny-llama", "max_tokens": 8, "messages": [{"role": "user", "content": CLEAN}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.body);
    assert_eq!(r.body["type"], "error", "Anthropic shape: {}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("test/closed/down")
    );
    assert_eq!(
        s.gw.metrics.value(
            "kinference_classifier_failures_total",
            &[("classifier", "test/closed/down"), ("mode", "FailClosed")]
        ),
        Some(2.0)
    );
    assert_eq!(
        s.gw.metrics.value(
            "kinference_requests_total",
            &[
                ("api", "chat"),
                ("status", "503"),
                ("code", "classifier_unavailable")
            ]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn fail_open_serves_without_tags() {
    let s = setup("ext-open").await;
    let r = call(s.addr, "open.test", "/v1/chat/completions", &chat(PII)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.rule.as_deref(), Some("test/p/other"));
    assert_eq!(
        s.gw.metrics.value(
            "kinference_classifier_failures_total",
            &[("classifier", "test/open/slow"), ("mode", "FailOpen")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn grpc_decide_calls_external_classifiers() {
    let s = setup("ext-grpc").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kinf_handler::grpc::serve_grpc(s.gw.clone(), listener));
    let mut client = HandlerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let decide = |host: &str, text: &str| DecideRequest {
        path: "/v1/chat/completions".into(),
        headers: vec![
            Header {
                name: "content-type".into(),
                value: "application/json".into(),
            },
            Header {
                name: "host".into(),
                value: host.into(),
            },
        ],
        body: serde_json::to_vec(&chat(text)).unwrap(),
    };
    let r = client
        .decide(decide("tagger.test", PII))
        .await
        .unwrap()
        .into_inner();
    match r.outcome.unwrap() {
        decide_response::Outcome::Route(route) => assert_eq!(route.rule, "test/p/pii"),
        other => panic!("{other:?}"),
    }
    let r = client
        .decide(decide("closed.test", CLEAN))
        .await
        .unwrap()
        .into_inner();
    match r.outcome.unwrap() {
        decide_response::Outcome::Reject(rej) => {
            assert_eq!(rej.http_status, 503);
            assert_eq!(rej.code, "classifier_unavailable");
        }
        other => panic!("{other:?}"),
    }
}
