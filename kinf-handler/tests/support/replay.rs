//! An upstream that replays captured vLLM 0.32 responses (testdata/vllm-0.32.0-cpu).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures_util::StreamExt;
use parking_lot::Mutex;
use serde_json::Value;

/// `chat1.json`: the non-streamed chat response.
pub const CHAT: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/chat1.json");
/// `chat_stream.txt`: the streamed chat response (with the usage chunk).
pub const CHAT_STREAM: &str = include_str!("../../../testdata/vllm-0.32.0-cpu/chat_stream.txt");
/// `messages_nonstream.json`: the Anthropic messages response.
pub const MESSAGES: &str =
    include_str!("../../../testdata/vllm-0.32.0-cpu/messages_nonstream.json");

/// What an upstream received.
#[derive(Default)]
pub struct Seen {
    /// Request bodies.
    pub bodies: Vec<Value>,
    /// Request headers.
    pub headers: Vec<HeaderMap>,
}

#[derive(Clone)]
struct Upstream {
    seen: Arc<Mutex<Seen>>,
    /// Stop streaming half way and drop the connection.
    die_mid_stream: bool,
}

async fn replay(State(u): State<Upstream>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    let stream = v["stream"].as_bool().unwrap_or(false);
    {
        let mut s = u.seen.lock();
        s.bodies.push(v);
        s.headers.push(headers);
    }
    let die = u.die_mid_stream;
    if !stream {
        if !die {
            return ([("content-type", "application/json")], CHAT).into_response();
        }
        // Half the body, then the connection drops.
        let half = CHAT.get(..CHAT.len() / 2).unwrap_or(CHAT);
        return (
            [("content-type", "application/json")],
            Body::from_stream(cut(vec![half.to_owned()])),
        )
            .into_response();
    }
    let mut events: Vec<String> = CHAT_STREAM
        .split_inclusive("\n\n")
        .map(str::to_owned)
        .collect();
    if die {
        // Three events and half of the fourth, then the connection drops.
        events.truncate(4);
        if let Some(last) = events.last_mut() {
            last.truncate(last.len() / 2);
        }
    }
    let s: futures_util::stream::BoxStream<'static, Result<Bytes, std::io::Error>> = if die {
        cut(events).boxed()
    } else {
        futures_util::stream::iter(events)
            .then(|e| async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                Ok::<_, std::io::Error>(Bytes::from(e))
            })
            .boxed()
    };
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(s),
    )
        .into_response()
}

/// `chunks`, then an error (the connection drops).
fn cut(chunks: Vec<String>) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::iter(chunks.into_iter().map(Some).chain([None])).then(|c| async move {
        tokio::time::sleep(Duration::from_millis(2)).await;
        c.map(Bytes::from)
            .ok_or_else(|| std::io::Error::other("worker died"))
    })
}

async fn messages(State(u): State<Upstream>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap();
    {
        let mut s = u.seen.lock();
        s.bodies.push(v);
        s.headers.push(headers);
    }
    ([("content-type", "application/json")], MESSAGES).into_response()
}

/// An upstream on 127.0.0.1 replaying real vLLM 0.32 responses (testdata captures) to chat,
/// completions and messages requests, recording what it received; `die_mid_stream` drops
/// streams in the middle of their fourth event, and non-streamed answers half way.
pub async fn start_upstream(die_mid_stream: bool) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app = Router::new()
        .route("/v1/chat/completions", post(replay))
        .route("/v1/completions", post(replay))
        .route("/v1/messages", post(messages))
        .with_state(Upstream {
            seen: seen.clone(),
            die_mid_stream,
        });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    (addr, seen)
}
