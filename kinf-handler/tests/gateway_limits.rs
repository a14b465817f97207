//! Request limits over real TCP: body size (413), header count and size (431), JSON nesting
//! depth and message count (400), slow clients (408 for a slow body, a slow head is cut off),
//! concurrent streams per tenant (429 with `Retry-After`, given back however a stream ends).
//! Every refusal is in the caller's API shape and names the limit and the field.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::listen::{HttpLimits, serve_http};
use kinf_handler::serve::reload;
use serde_json::{Value, json};
use support::{eventually, post_json, temp_dir};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: t }}
spec:
  endpoints: ["{upstream}"]
  models: [ {{ name: tiny-llama }} ]
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
  tenants: {{ apiKeys: {{ file: keys.txt }} }}
  limits:
    maxBodyBytes: 4096
    maxMessages: 3
    maxJsonDepth: 8
    maxConcurrentStreamsPerTenant: 2
"#
    )
}

/// An upstream whose streams send one chunk, then wait for `gate`; then a request whose
/// `user` is `fail` breaks off with an error, the others end with `[DONE]`.
async fn gated_upstream(gate: tokio::sync::watch::Receiver<bool>) -> SocketAddr {
    async fn chat(State(gate): State<tokio::sync::watch::Receiver<bool>>, body: Bytes) -> Response {
        let v: Value = serde_json::from_slice(&body).unwrap();
        if v["stream"] != true {
            let done = json!({"id": "c0", "object": "chat.completion", "model": "tiny-llama",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
            return ([("content-type", "application/json")], done.to_string()).into_response();
        }
        let fail = v["user"] == "fail";
        let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "model": "tiny-llama",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": null}]});
        let first = Bytes::from(format!("data: {chunk}\n\n"));
        let s = futures_util::stream::unfold(0, move |step| {
            let (first, mut gate) = (first.clone(), gate.clone());
            async move {
                match step {
                    0 => Some((Ok::<_, std::io::Error>(first), 1)),
                    1 => {
                        let _ = gate.wait_for(|open| *open).await;
                        if fail {
                            Some((Err(std::io::Error::other("worker died")), 2))
                        } else {
                            Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), 2))
                        }
                    }
                    _ => None,
                }
            }
        });
        (
            [("content-type", "text/event-stream")],
            Body::from_stream(s),
        )
            .into_response()
    }
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(gate);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

const LIMITS: HttpLimits = HttpLimits {
    max_header_bytes: 1024,
    max_headers: 16,
    header_read_timeout: Duration::from_millis(500),
};

async fn start(dir: &Path, upstream: SocketAddr) -> (Arc<Gateway>, SocketAddr) {
    start_with(dir, upstream, LIMITS).await
}

async fn start_with(
    dir: &Path,
    upstream: SocketAddr,
    limits: HttpLimits,
) -> (Arc<Gateway>, SocketAddr) {
    std::fs::write(dir.join("keys.txt"), "acme: sk-acme\nglobex: sk-globex\n").unwrap();
    std::fs::write(dir.join("bundle.yaml"), config(upstream)).unwrap();
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_millis(500),
        ..Default::default()
    });
    let noop: kinf_handler::serve::OnApplied = Arc::new(|_, _| {});
    reload(&gw, dir, None, &noop);
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(serve_http(l, app, limits, None, std::future::pending()));
    (gw, addr)
}

async fn setup(tag: &str) -> (Arc<Gateway>, SocketAddr, tokio::sync::watch::Sender<bool>) {
    let (open, gate) = tokio::sync::watch::channel(false);
    let upstream = gated_upstream(gate).await;
    let (gw, addr) = start(&temp_dir(tag), upstream).await;
    (gw, addr, open)
}

const KEY: (&str, &str) = ("authorization", "Bearer sk-acme");

fn chat(messages: usize, content: &str) -> Value {
    let m: Vec<Value> = (0..messages)
        .map(|_| json!({"role": "user", "content": content}))
        .collect();
    json!({"model": "tiny-llama", "messages": m})
}

fn anthropic(content: &str) -> Value {
    json!({"model": "tiny-llama", "max_tokens": 8,
           "messages": [{"role": "user", "content": content}]})
}

/// Asserts an OpenAI error object with `code`, `param`, and a message mentioning `limit`.
fn assert_openai(body: &Value, code: &str, param: &str, limit: &str) {
    let e = &body["error"];
    assert_eq!(e["code"], code, "{body}");
    assert_eq!(e["param"], param, "{body}");
    assert_eq!(e["type"], "invalid_request_error", "{body}");
    assert!(
        e["message"].as_str().unwrap().contains(limit),
        "the message names the limit `{limit}`: {body}"
    );
}

/// Asserts an Anthropic error object of `kind` whose message mentions `limit`.
fn assert_anthropic(body: &Value, kind: &str, limit: &str) {
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(limit),
        "the message names the limit `{limit}`: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_size_gets_413_in_each_api_shape() {
    let (_gw, addr, _open) = setup("lim-body").await;
    let big = "x".repeat(5000);
    let (s, h, b) = post_json(addr, "/v1/chat/completions", &chat(1, &big), &[KEY]).await;
    assert_eq!(s, 413, "{b}");
    assert_openai(
        &b,
        "body_too_large",
        "body",
        "4096 bytes (limits.maxBodyBytes)",
    );
    assert_eq!(h["connection"], "close");
    let (s, _, b) = post_json(addr, "/v1/messages", &anthropic(&big), &[KEY]).await;
    assert_eq!(s, 413, "{b}");
    assert_anthropic(&b, "request_too_large", "4096 bytes (limits.maxBodyBytes)");
    // A chunked body (no declared length) that grows past the limit: the same 413.
    let chunk = format!("{:x}\r\n{big}\r\n", big.len());
    let (resp, closed) = raw(
        addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer sk-acme\r\ntransfer-encoding: chunked\r\n\r\n",
        chunk.as_bytes(),
        Duration::from_secs(5),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(closed);
    assert_openai(
        &json_body(&resp),
        "body_too_large",
        "body",
        "limits.maxBodyBytes",
    );
    // Just under the limit passes the size check.
    let (s, _, b) = post_json(addr, "/v1/chat/completions", &chat(1, "ok"), &[KEY]).await;
    assert_eq!(s, 200, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_count_and_size_get_431_in_each_api_shape() {
    let (_gw, addr, _open) = setup("lim-headers").await;
    let names: Vec<String> = (0..20).map(|i| format!("x-extra-{i}")).collect();
    let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
    let (s, _, b) = post_json(addr, "/v1/chat/completions", &chat(1, "hi"), &many).await;
    assert_eq!(s, 431, "{b}");
    assert_openai(&b, "headers_too_large", "headers", "16");
    let (s, _, b) = post_json(addr, "/v1/messages", &anthropic("hi"), &many).await;
    assert_eq!(s, 431, "{b}");
    assert_anthropic(&b, "invalid_request_error", "16");

    let long = "v".repeat(1500);
    let (s, _, b) = post_json(
        addr,
        "/v1/completions",
        &json!({"model": "tiny-llama", "prompt": "hi"}),
        &[("x-long", long.as_str())],
    )
    .await;
    assert_eq!(s, 431, "{b}");
    assert_openai(&b, "headers_too_large", "headers", "1024");
    // Within both limits: served.
    let mut fine = many[..8].to_vec();
    fine.push(KEY);
    let (s, _, b) = post_json(addr, "/v1/chat/completions", &chat(1, "hi"), &fine).await;
    assert_eq!(s, 200, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_depth_and_message_count_get_400_naming_the_field() {
    let (_gw, addr, _open) = setup("lim-json").await;
    // `metadata` nests 1 (body) + 8 levels: over maxJsonDepth 8.
    let mut deep = json!(1);
    for _ in 0..8 {
        deep = json!([deep]);
    }
    let mut body = chat(1, "hi");
    body["metadata"] = deep.clone();
    let (s, _, b) = post_json(addr, "/v1/chat/completions", &body, &[KEY]).await;
    assert_eq!(s, 400, "{b}");
    assert_openai(&b, "json_too_deep", "metadata", "8");
    let mut body = anthropic("hi");
    body["metadata"] = deep;
    let (s, _, b) = post_json(addr, "/v1/messages", &body, &[KEY]).await;
    assert_eq!(s, 400, "{b}");
    assert_anthropic(&b, "invalid_request_error", "maxJsonDepth");
    // Far deeper than serde_json's own limit: still this limit's error, not a parse error.
    let raw = format!(
        r#"{{"model":"tiny-llama","messages":[],"x":{}1{}}}"#,
        "[".repeat(1500),
        "]".repeat(1500)
    );
    let (s, _, b) = post_raw_text(addr, "/v1/chat/completions", &raw).await;
    assert_eq!(s, 400, "{b}");
    assert_openai(&b, "json_too_deep", "x", "8");

    let (s, _, b) = post_json(addr, "/v1/chat/completions", &chat(4, "hi"), &[KEY]).await;
    assert_eq!(s, 400, "{b}");
    assert_openai(&b, "too_many_messages", "messages", "3");
    let (s, _, b) = post_json(addr, "/v1/chat/completions", &chat(3, "hi"), &[KEY]).await;
    assert_eq!(s, 200, "{b}");
}

async fn post_raw_text(addr: SocketAddr, path: &str, body: &str) -> (u16, (), Value) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .header(KEY.0, KEY.1)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        (),
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Writes `head` (and `body`) on a fresh connection, then reads until the server closes it or
/// `wait` passes: what came back and whether the connection was closed.
async fn raw(addr: SocketAddr, head: &str, body: &[u8], wait: Duration) -> (String, bool) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = Vec::new();
    let closed = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_body_gets_408_and_a_slow_head_is_cut_off() {
    let (_gw, addr, _open) = setup("lim-slow").await;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer sk-acme\r\ncontent-length: 100\r\n\r\n"
        );
        let started = std::time::Instant::now();
        let (resp, closed) = raw(addr, &head, b"{\"model\":", Duration::from_secs(5)).await;
        assert!(resp.starts_with("HTTP/1.1 408"), "{resp}");
        assert!(closed, "the connection is closed after a 408");
        assert!(started.elapsed() >= Duration::from_millis(450));
        let body: Value = serde_json::from_str(resp.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        if anthropic {
            assert_anthropic(&body, "invalid_request_error", "--body-read-timeout");
        } else {
            assert_openai(&body, "request_timeout", "body", "--body-read-timeout");
        }
    }
    // A head never finished: the connection is closed after the head deadline (500 ms).
    let started = std::time::Instant::now();
    let (resp, closed) = raw(
        addr,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n",
        b"",
        Duration::from_secs(5),
    )
    .await;
    assert!(closed, "a slow head is cut off");
    assert!(started.elapsed() >= Duration::from_millis(450));
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 408"),
        "nothing, or a 408: {resp}"
    );
}

/// A client that opens connections and never completes a request head cannot hold them: no
/// bytes at all, a part of the HTTP/2 preface (the server cannot yet tell HTTP/1 from HTTP/2),
/// or a whole HTTP/2 preface and settings but no request. Each is closed at the head deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_request_head_is_closed_at_the_head_deadline() {
    let (_gw, addr, _open) = setup("lim-idle").await;
    // An empty SETTINGS frame: length 0, type 4, flags 0, stream 0.
    let settings: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
    for (what, head, body) in [
        ("nothing", "", &[][..]),
        ("a partial HTTP/2 preface", "PRI * HTTP/2.0\r\n", &[][..]),
        (
            "an HTTP/2 preface and no request",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            settings,
        ),
    ] {
        let started = std::time::Instant::now();
        let (_, closed) = raw(addr, head, body, Duration::from_secs(5)).await;
        assert!(closed, "{what}: the connection is still open after 5 s");
        assert!(
            started.elapsed() >= Duration::from_millis(450),
            "{what}: closed before the deadline"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_streams_per_tenant_get_429_and_are_given_back() {
    let (gw, addr, open) = setup("lim-streams").await;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let stream = |key: &'static str, user: &'static str| {
        let client = client.clone();
        async move {
            let body = json!({"model": "tiny-llama", "stream": true, "user": user,
                              "messages": [{"role": "user", "content": "hi"}]});
            let req = hyper::Request::post(format!("http://{addr}/v1/chat/completions"))
                .header("content-type", "application/json")
                .header("authorization", format!("Bearer {key}"))
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            client.request(req).await.unwrap()
        }
    };
    let mut a = stream("sk-acme", "ok").await;
    let mut b = stream("sk-acme", "fail").await;
    assert_eq!((a.status().as_u16(), b.status().as_u16()), (200, 200));
    // The first chunk of each has passed: both are in flight.
    a.body_mut().frame().await.unwrap().unwrap();
    b.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(gw.streams.in_flight("acme"), 2);

    let refused = stream("sk-acme", "ok").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let v: Value =
        serde_json::from_slice(&refused.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["error"]["code"], "too_many_streams", "{v}");
    assert_eq!(v["error"]["param"], "stream", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maxConcurrentStreamsPerTenant")
    );
    // Another tenant has its own count; a non-streamed request is not counted.
    let mut other = stream("sk-globex", "ok").await;
    assert_eq!(other.status(), 200);
    other.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(gw.streams.in_flight("globex"), 1);

    // The client of `a` goes away mid-stream: its slot is given back.
    drop(a);
    assert!(
        eventually(Duration::from_secs(5), || gw.streams.in_flight("acme") == 1).await,
        "a disconnected client's stream is given back"
    );
    let mut c = stream("sk-acme", "ok").await;
    assert_eq!(c.status(), 200);
    c.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(gw.streams.in_flight("acme"), 2);

    // `b` ends with an upstream error, `c` and `other` complete: every slot is given back.
    open.send(true).unwrap();
    let b_rest = b.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&b_rest).contains("upstream_error"),
        "{b_rest:?}"
    );
    let c_rest = c.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&c_rest).contains("[DONE]"));
    other.into_body().collect().await.unwrap();
    assert!(
        eventually(Duration::from_secs(5), || gw.streams.total() == 0).await,
        "in flight after every stream ended: {}",
        gw.streams.total()
    );
}

/// The JSON body of a raw HTTP/1.1 response.
fn json_body(resp: &str) -> Value {
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {resp}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_refused_before_the_body_is_read() {
    let (_gw, addr, _open) = setup("lim-declared").await;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        // Nothing of the body is sent: the answer cannot wait for it (the body deadline here is
        // 500 ms; a 408 would come after it).
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer sk-acme\r\ncontent-length: 99999999999\r\n\r\n"
        );
        let started = std::time::Instant::now();
        let (resp, closed) = raw(addr, &head, b"", Duration::from_secs(5)).await;
        assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
        assert!(
            resp.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{resp}"
        );
        assert!(closed, "the connection is closed after the 413");
        assert!(
            started.elapsed() < Duration::from_millis(450),
            "answered at once, not after the body deadline: {:?}",
            started.elapsed()
        );
        let body = json_body(&resp);
        if anthropic {
            assert_anthropic(&body, "request_too_large", "limits.maxBodyBytes");
        } else {
            assert_openai(&body, "body_too_large", "body", "limits.maxBodyBytes");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_body_gets_400_naming_the_body_not_413() {
    let (_gw, addr, _open) = setup("lim-chunked").await;
    for (path, anthropic) in [("/v1/chat/completions", false), ("/v1/messages", true)] {
        // `zz` is not a chunk size.
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer sk-acme\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let (resp, _) = raw(addr, &head, b"zz\r\n", Duration::from_secs(5)).await;
        assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
        let body = json_body(&resp);
        if anthropic {
            assert_anthropic(&body, "invalid_request_error", "could not be read");
        } else {
            assert_openai(&body, "invalid_request", "body", "could not be read");
        }
    }
}

/// Writes `head` on a fresh connection, ignoring write errors (the server may close it before
/// the head is all sent), then reads until the server closes it or `wait` passes: what came
/// back and whether the connection was closed.
async fn raw_lossy(addr: SocketAddr, head: &[u8], wait: Duration) -> (String, bool) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = s.write_all(head).await;
    let mut out = Vec::new();
    let closed = tokio::time::timeout(wait, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_over_twice_the_header_limit_is_refused_without_being_buffered() {
    let (open, gate) = tokio::sync::watch::channel(false);
    let upstream = gated_upstream(gate).await;
    // The default limits: 64 KiB of headers, so hyper buffers at most 2 × 64 KiB + 16 KiB.
    let dir = temp_dir("lim-backstop");
    let (gw, addr) = start_with(&dir, upstream, HttpLimits::default()).await;
    let head = |size: usize| {
        format!(
            "GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "y".repeat(size)
        )
    };
    // Over the limit, within the backstop: the 431 in the caller's shape.
    // (Kept alive after it: wait for the response only.)
    let (resp, _) = raw_lossy(addr, head(100 << 10).as_bytes(), Duration::from_secs(1)).await;
    assert!(resp.starts_with("HTTP/1.1 431"), "{resp}");
    assert_openai(
        &json_body(&resp),
        "headers_too_large",
        "headers",
        "--max-header-bytes",
    );
    // 200 KB: past the backstop. hyper refuses it (a bare 431, or a reset) without reading
    // it all; it never reaches the check that measures it.
    let (resp, closed) = raw_lossy(addr, head(200_000).as_bytes(), Duration::from_secs(5)).await;
    assert!(closed, "the connection is closed");
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 431"),
        "a bare 431 or nothing: {resp}"
    );
    assert!(
        !resp.contains("headers_too_large"),
        "the whole head was buffered and measured: {resp}"
    );
    // Bodies are not bound by that buffer: 1 MiB (7 times it) streams through.
    std::fs::write(
        dir.join("bundle.yaml"),
        config(upstream).replace("maxBodyBytes: 4096", "maxBodyBytes: 2Mi"),
    )
    .unwrap();
    let noop: kinf_handler::serve::OnApplied = Arc::new(|_, _| {});
    reload(&gw, &dir, Some(0), &noop);
    let (s, _, b) = post_json(
        addr,
        "/v1/chat/completions",
        &chat(1, &"x".repeat(1 << 20)),
        &[KEY],
    )
    .await;
    assert_eq!(s, 200, "{b}");
    drop(open);
}
