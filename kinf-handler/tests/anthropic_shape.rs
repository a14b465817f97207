//! Anthropic clients get Anthropic's shapes: a vLLM worker's errors on `/v1/messages`
//! (bodies captured from a real vLLM 0.32.0, CPU build, `--max-model-len 2048`) are translated
//! into Anthropic's error object with the same status and message, and `GET /v1/models`
//! answers a request carrying `anthropic-version` in Anthropic's Models API shape.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::reload;
use parking_lot::Mutex;
use serde_json::{Value, json};
use support::{post_raw, temp_dir};

/// vLLM 0.32 `/v1/messages`, a prompt over `max_model_len` (plain or `stream: true`: the same
/// answer, before any event): Anthropic's envelope with vLLM's own error type.
const TOO_LONG: &str = r#"{"type":"error","error":{"type":"BadRequestError","message":"This model's maximum context length is 2048 tokens. However, your prompt contains at least 2049 input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=2049)"}}"#;
/// vLLM 0.32 `/v1/messages` without `max_tokens`: a request-schema error, in OpenAI's shape.
const NO_MAX_TOKENS: &str = r#"{"error":{"message":"1 validation error:\n  {'type': 'missing', 'loc': 'body.max_tokens', 'msg': 'Field required', 'input': '<dict of 2 items>'}","type":"Bad Request","param":"body.max_tokens","code":400}}"#;
/// vLLM 0.32 `/v1/messages` with `role: robot`.
const BAD_ROLE: &str = r#"{"error":{"message":"1 validation error:\n  {'type': 'literal_error', 'loc': 'body.messages.0.role', 'msg': \"Input should be 'user', 'assistant' or 'system'\", 'input': 'robot', 'ctx': {'expected': \"'user', 'assistant' or 'system'\"}}","type":"Bad Request","param":"body.messages.0.role","code":400}}"#;
/// vLLM 0.32 `/v1/messages` naming a model it does not serve.
const BAD_MODEL: &str = r#"{"type":"error","error":{"type":"NotFoundError","message":"The model `nope` does not exist. Valid aliases: tiny-llama."}}"#;
/// An OpenAI-shaped error of vLLM's chat API, which OpenAI clients get as it is.
const CHAT_TOO_LONG: &str = r#"{"error":{"message":"This model's maximum context length is 2048 tokens.","type":"BadRequestError","param":"input_tokens","code":400}}"#;

/// A worker that answers every request with the status, content type and body set last.
#[derive(Clone)]
struct Worker(Arc<Mutex<(u16, &'static str, String)>>);

impl Worker {
    fn answer(&self, status: u16, content_type: &'static str, body: &str) {
        *self.0.lock() = (status, content_type, body.to_owned());
    }
}

async fn reply(State(w): State<Worker>) -> Response {
    let (status, ct, body) = w.0.lock().clone();
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", ct)],
        body,
    )
        .into_response()
}

async fn start_worker() -> (SocketAddr, Worker) {
    let w = Worker(Arc::new(Mutex::new((200, "application/json", "{}".into()))));
    let app = Router::new()
        .route("/v1/messages", post(reply))
        .route("/v1/chat/completions", post(reply))
        .with_state(w.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, w)
}

fn write_bundle(dir: &Path, worker: SocketAddr) {
    std::fs::write(
        dir.join("bundle.yaml"),
        format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{worker}"]
  models: [ {{ name: tiny-llama, aliases: [small, tiny] }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: t }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
"#
        ),
    )
    .unwrap();
}

/// A gateway without live ingestion (the worker above serves no `/metrics`).
async fn start_gateway(dir: &Path) -> SocketAddr {
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    let noop: kinf_handler::serve::OnApplied = Arc::new(|_, _| {});
    reload(&gw, dir, None, &noop);
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

async fn setup(tag: &str) -> (SocketAddr, Worker) {
    let (worker_addr, worker) = start_worker().await;
    let dir = temp_dir(tag);
    write_bundle(&dir, worker_addr);
    (start_gateway(&dir).await, worker)
}

/// GETs `http://addr{path}` with `headers`: the status and the body as JSON.
async fn get_json(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = hyper::Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)));
    (status, v)
}

const ANTHROPIC: &[(&str, &str)] = &[("anthropic-version", "2023-06-01")];

#[tokio::test]
async fn worker_errors_on_messages_reach_the_client_in_anthropics_shape() {
    let (addr, worker) = setup("anthropic-errors").await;
    let request = |stream: bool| {
        json!({"model": "tiny", "max_tokens": 4, "stream": stream,
            "messages": [{"role": "user", "content": "Hello"}]})
    };
    let message_of = |body: &str| {
        let v: Value = serde_json::from_str(body).unwrap();
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    for (name, status, body, ty, stream) in [
        ("too long", 400, TOO_LONG, "invalid_request_error", false),
        (
            "too long, streamed",
            400,
            TOO_LONG,
            "invalid_request_error",
            true,
        ),
        (
            "no max_tokens",
            400,
            NO_MAX_TOKENS,
            "invalid_request_error",
            false,
        ),
        ("bad role", 400, BAD_ROLE, "invalid_request_error", false),
        ("unknown model", 404, BAD_MODEL, "not_found_error", false),
    ] {
        worker.answer(status, "application/json", body);
        let (got, headers, bytes) =
            post_raw(addr, "/v1/messages", &request(stream), ANTHROPIC).await;
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(got, status, "{name}: {text}");
        assert_eq!(headers["content-type"], "application/json", "{name}");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "error": {"type": ty, "message": message_of(body)}}),
            "{name}"
        );
    }
    // The field at fault is named in the message (Anthropic's object has no `param`).
    worker.answer(400, "application/json", NO_MAX_TOKENS);
    let (_, _, bytes) = post_raw(addr, "/v1/messages", &request(false), ANTHROPIC).await;
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("body.max_tokens"),
        "{v}"
    );

    // Errors without a JSON body: the status's type, and what the worker said.
    for (status, ct, body, ty, message) in [
        (
            503,
            "text/plain",
            "",
            "overloaded_error",
            "the worker answered 503 Service Unavailable",
        ),
        (
            500,
            "text/plain",
            "Internal Server Error",
            "api_error",
            "Internal Server Error",
        ),
        (
            413,
            "text/html",
            "<h1>too large</h1>",
            "request_too_large",
            "<h1>too large</h1>",
        ),
    ] {
        worker.answer(status, ct, body);
        let (got, headers, bytes) = post_raw(addr, "/v1/messages", &request(false), &[]).await;
        assert_eq!(got, status);
        assert_eq!(headers["content-type"], "application/json");
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], ty, "{v}");
        assert_eq!(v["error"]["message"], message, "{v}");
    }

    // A stream vLLM fails after it started: its `error` event, with Anthropic's type.
    let start = r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"tiny","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":0}}}"#;
    let failed = r#"{"type":"error","error":{"type":"internal_error","message":"Invalid data format received"}}"#;
    worker.answer(
        200,
        "text/event-stream",
        &format!("event: message_start\ndata: {start}\n\nevent: error\ndata: {failed}\n\n"),
    );
    let (got, _, bytes) = post_raw(addr, "/v1/messages", &request(true), ANTHROPIC).await;
    assert_eq!(got, 200);
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let error = text
        .split("\n\n")
        .find_map(|e| e.strip_prefix("event: error\ndata: "))
        .unwrap_or_else(|| panic!("no error event: {text}"));
    let error: Value = serde_json::from_str(error).unwrap();
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "api_error",
            "message": "Invalid data format received"}}),
        "{text}"
    );
    assert_eq!(text.matches("event: error").count(), 1, "{text}");

    // An error already in Anthropic's shape passes through byte for byte.
    let anthropic = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    worker.answer(429, "application/json", anthropic);
    let (got, _, bytes) = post_raw(addr, "/v1/messages", &request(false), ANTHROPIC).await;
    assert_eq!(got, 429);
    assert_eq!(bytes, anthropic.as_bytes());

    // OpenAI clients get the worker's OpenAI error as it is.
    worker.answer(400, "application/json", CHAT_TOO_LONG);
    let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "Hello"}]});
    let (got, _, bytes) = post_raw(addr, "/v1/chat/completions", &chat, &[]).await;
    assert_eq!(got, 400);
    assert_eq!(bytes, CHAT_TOO_LONG.as_bytes());
}

#[tokio::test]
async fn the_model_list_answers_anthropic_clients_in_anthropics_shape() {
    let (addr, _worker) = setup("anthropic-models").await;
    let model = |id: &str| {
        json!({"type": "model", "id": id, "display_name": id,
            "created_at": "1970-01-01T00:00:00Z"})
    };
    let (s, v) = get_json(addr, "/v1/models", ANTHROPIC).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v,
        json!({"data": [model("small"), model("tiny"), model("tiny-llama")],
            "has_more": false, "first_id": "small", "last_id": "tiny-llama"})
    );
    // Pages, as Anthropic's `limit`, `after_id` and `before_id` ask.
    let (_, v) = get_json(addr, "/v1/models?limit=2", ANTHROPIC).await;
    assert_eq!(v["data"], json!([model("small"), model("tiny")]));
    assert_eq!(
        (&v["has_more"], &v["first_id"], &v["last_id"]),
        (&json!(true), &json!("small"), &json!("tiny"))
    );
    let (_, v) = get_json(addr, "/v1/models?limit=2&after_id=tiny", ANTHROPIC).await;
    assert_eq!(v["data"], json!([model("tiny-llama")]));
    assert_eq!(v["has_more"], false);
    let (_, v) = get_json(addr, "/v1/models?limit=1&before_id=tiny-llama", ANTHROPIC).await;
    assert_eq!(v["data"], json!([model("tiny")]));
    assert_eq!(v["has_more"], true);
    let (_, v) = get_json(addr, "/v1/models?after_id=tiny-llama", ANTHROPIC).await;
    assert_eq!(
        v,
        json!({"data": [], "has_more": false, "first_id": null, "last_id": null})
    );
    // A bad `limit`: Anthropic's error, naming the field.
    let (s, v) = get_json(addr, "/v1/models?limit=0", ANTHROPIC).await;
    assert_eq!(s, 400);
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("`limit`"),
        "{v}"
    );

    // One model (Anthropic's `models.retrieve`), and one that does not exist.
    let (s, v) = get_json(addr, "/v1/models/tiny", ANTHROPIC).await;
    assert_eq!((s, v), (200, model("tiny")));
    let (s, v) = get_json(addr, "/v1/models/claude-opus-4", ANTHROPIC).await;
    assert_eq!(s, 404);
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("claude-opus-4"),
        "{v}"
    );

    // Without `anthropic-version`: OpenAI's shapes, as before (the query is ignored).
    let (s, v) = get_json(addr, "/v1/models?limit=1", &[]).await;
    assert_eq!(s, 200);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["small", "tiny", "tiny-llama"]);
    assert_eq!(v["data"][0]["object"], "model");
    let (s, v) = get_json(addr, "/v1/models/claude-opus-4", &[]).await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    assert_eq!(v["error"]["param"], "model", "{v}");
}
