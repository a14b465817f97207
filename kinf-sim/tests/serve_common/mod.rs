//! Helpers for the `kinf-sim serve` tests: an in-process server, a minimal HTTP/1.1 client and
//! a ZMQ subscriber.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    missing_docs
)]

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use kinf_router::kv_events::{EventBatch, decode_message};
use kinf_sim::serve::{self, ServeArgs, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeromq::{Socket, SocketRecv};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/vllm-0.32.0-cpu")
        .join(name)
}

pub fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// Starts a server on free ports with KV events and replay, `--profile tiny --speed 50`.
pub async fn start(extra: &[&str]) -> Server {
    let mut args = vec![
        "--port",
        "0",
        "--model",
        "/models/tiny-llama",
        "--served-model-name",
        "tiny-llama",
        "--kv-events-port",
        "0",
        "--replay-port",
        "0",
        "--topic",
        "kv-events",
        "--profile",
        "tiny",
        "--speed",
        "50",
    ];
    if !extra.contains(&"--seed") {
        args.extend_from_slice(&["--seed", "7"]);
    }
    args.extend_from_slice(extra);
    serve::start(ServeArgs::from_args(args).unwrap())
        .await
        .unwrap()
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// The body ended properly (`Content-Length` reached or the terminating chunk seen).
    pub complete: bool,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request with `Connection: close` (`Content-Type: application/json`).
pub async fn http(server: &Server, method: &str, path: &str, body: Option<&str>) -> Resp {
    http_with(server, method, path, body, "application/json").await
}

/// [`http`] with another `Content-Type`.
pub async fn http_with(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
    content_type: &str,
) -> Resp {
    let mut s = tokio::net::TcpStream::connect(server.http).await.unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut raw)).await;
    parse(&raw)
}

fn parse(raw: &[u8]) -> Resp {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if !chunked {
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse::<usize>().ok());
        return Resp {
            status,
            complete: len.is_none_or(|l| l == rest.len()),
            headers,
            body: rest.to_owned(),
        };
    }
    let mut body = String::new();
    let mut rest = rest;
    let mut complete = false;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 {
            complete = true;
            break;
        }
        if after.len() < n {
            body.push_str(after);
            break;
        }
        body.push_str(&after[..n]);
        rest = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
    }
    Resp {
        status,
        headers,
        body,
        complete,
    }
}

/// `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|ev| {
            ev.lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_owned)
        })
        .collect()
}

/// `(event, data)` pairs of an SSE body.
pub fn sse_events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|ev| !ev.trim().is_empty())
        .map(|ev| {
            let name = ev
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("")
                .to_owned();
            let data = ev
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or("")
                .to_owned();
            (name, data)
        })
        .collect()
}

pub async fn subscriber(server: &Server) -> zeromq::SubSocket {
    let mut sub = zeromq::SubSocket::new();
    sub.connect(server.kv_events.as_deref().unwrap())
        .await
        .unwrap();
    sub.subscribe("").await.unwrap();
    // Let the subscription reach the publisher.
    tokio::time::sleep(Duration::from_millis(300)).await;
    sub
}

/// Decoded messages received within `wait`.
pub async fn collect(sub: &mut zeromq::SubSocket, wait: Duration) -> Vec<EventBatch> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Ok(msg)) = tokio::time::timeout_at(deadline, sub.recv()).await {
        let frames: Vec<Bytes> = msg.into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(|b| b.as_ref()).collect();
        out.push(decode_message(&refs).unwrap());
    }
    out
}

/// A chat request; streamed ones ask for the usage chunk (vLLM refuses `stream_options`
/// without `stream`).
pub fn chat_body(content: &str, max_tokens: u32, stream: bool) -> String {
    let mut body = serde_json::json!({
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    });
    if stream {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    body.to_string()
}

pub fn long_text(words: usize) -> String {
    (0..words)
        .map(|i| format!("w{}", i % 97))
        .collect::<Vec<_>>()
        .join(" ")
}
