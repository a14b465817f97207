//! A fake inference provider for tests: OpenAI-compatible, Anthropic and Bedrock Converse
//! shapes on 127.0.0.1, checking credentials and SigV4 signatures, recording requests, and
//! failing on demand.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

/// The OpenAI key the fake accepts.
pub const OPENAI_KEY: &str = "sk-fake-openai-0123456789";
/// The Anthropic key the fake accepts.
pub const ANTHROPIC_KEY: &str = "sk-ant-fake-9876543210";
/// The AWS access key id the fake accepts.
pub const AWS_ID: &str = "AKIDFAKEEXAMPLE";
/// The AWS secret key the fake verifies signatures with.
pub const AWS_SECRET: &str = "fakeSecretKeyForSigV4Tests/0123456789";
/// The region the fake expects.
pub const REGION: &str = "us-west-2";
/// The text every answer carries, in two deltas.
pub const DELTAS: [&str; 2] = ["Hello", " world"];

/// How the fake misbehaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Answers properly.
    Normal,
    /// 500 before any byte.
    Fail500,
    /// 429 with `retry-after` of this many seconds.
    Fail429(u64),
    /// This status before any byte, with an error body.
    FailWith(u16),
    /// Answers 200, then streams one error event before any token (Anthropic's
    /// `overloaded_error`, an OpenAI-style `{"error": …}` chunk).
    StreamErrorFirst,
    /// Sleeps this long before answering.
    Hang(Duration),
    /// Streams the first event and then drops the connection.
    DieMidStream,
    /// Streams every event but the last (Bedrock: the `metadata` frame with the usage) and
    /// then drops the connection.
    DieBeforeLast,
}

/// One request received.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// Path.
    pub path: String,
    /// Headers (lower-case names).
    pub headers: Vec<(String, String)>,
    /// JSON body.
    pub body: Value,
}

/// Shared state of the fake.
#[derive(Debug)]
pub struct Fake {
    /// `http://127.0.0.1:port`.
    pub url: String,
    /// Requests received.
    pub requests: parking_lot::Mutex<Vec<Recorded>>,
    /// Current behaviour.
    pub mode: parking_lot::Mutex<Mode>,
    /// Auth failures seen.
    pub auth_failures: std::sync::atomic::AtomicU32,
}

impl Fake {
    /// Starts the fake on an ephemeral port.
    pub async fn start() -> Arc<Fake> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let fake = Arc::new(Fake {
            url: format!("http://{addr}"),
            requests: parking_lot::Mutex::new(Vec::new()),
            mode: parking_lot::Mutex::new(Mode::Normal),
            auth_failures: Default::default(),
        });
        let f = fake.clone();
        let app = axum::Router::new().fallback(move |req: Request<Body>| {
            let f = f.clone();
            async move { f.handle(req).await }
        });
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        fake
    }

    /// Sets the behaviour.
    pub fn set_mode(&self, m: Mode) {
        *self.mode.lock() = m;
    }

    /// The last request.
    pub fn last(&self) -> Recorded {
        self.requests.lock().last().cloned().unwrap()
    }

    async fn handle(self: Arc<Self>, req: Request<Body>) -> Response {
        let (parts, body) = req.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20)
            .await
            .unwrap_or_default();
        let path = parts.uri.path().to_string();
        let headers: Vec<(String, String)> = parts
            .headers
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let h = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if parts.method == axum::http::Method::GET && path.ends_with("/models") {
            // Health probes: answered when the credentials are right, not recorded.
            let ok = h("authorization") == format!("Bearer {OPENAI_KEY}")
                || h("x-api-key") == ANTHROPIC_KEY;
            let status = if !ok {
                StatusCode::UNAUTHORIZED
            } else if *self.mode.lock() == Mode::Fail500 {
                StatusCode::INTERNAL_SERVER_ERROR
            } else {
                StatusCode::OK
            };
            return (status, axum::Json(json!({"object": "list", "data": []}))).into_response();
        }
        let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.requests.lock().push(Recorded {
            path: path.clone(),
            headers: headers.clone(),
            body: json.clone(),
        });
        let auth_ok = if path.starts_with("/model/") {
            verify_sigv4(&parts.method, &path, &headers, &bytes)
        } else if path.ends_with("/messages") {
            h("x-api-key") == ANTHROPIC_KEY && !h("anthropic-version").is_empty()
        } else {
            h("authorization") == format!("Bearer {OPENAI_KEY}")
        };
        if !auth_ok {
            self.auth_failures
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": {"message": "bad credentials", "type": "authentication_error"}})),
            )
                .into_response();
        }
        let mode = *self.mode.lock();
        match mode {
            Mode::Fail500 => {
                return (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(json!({"error": {"message": "internal failure"}})),
                )
                    .into_response();
            }
            Mode::Fail429(s) => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", s.to_string())],
                    axum::Json(
                        json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
                    ),
                )
                    .into_response();
            }
            Mode::FailWith(code) => {
                return (
                    StatusCode::from_u16(code).unwrap(),
                    axum::Json(json!({"error": {"message": format!("failed with {code}")}})),
                )
                    .into_response();
            }
            Mode::Hang(d) => tokio::time::sleep(d).await,
            _ => {}
        }
        let die = match mode {
            Mode::DieMidStream => Some(Die::AfterFirst),
            Mode::DieBeforeLast => Some(Die::BeforeLast),
            _ => None,
        };
        if path.starts_with("/model/") {
            let model = path
                .trim_start_matches("/model/")
                .split('/')
                .next()
                .unwrap_or("");
            if path.ends_with("/converse-stream") {
                return stream_response(
                    bedrock_frames(),
                    die,
                    "application/vnd.amazon.eventstream",
                );
            }
            let _ = model;
            return axum::Json(json!({
                "output": {"message": {"role": "assistant", "content": [{"text": DELTAS.concat()}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": 8, "outputTokens": 2, "cacheReadInputTokens": 4, "totalTokens": 14},
                "metrics": {"latencyMs": 10},
            }))
            .into_response();
        }
        let stream = json.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let model = json
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if mode == Mode::StreamErrorFirst && stream {
            let ev = if path.ends_with("/messages") {
                sse_event(
                    "error",
                    &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                )
            } else {
                sse_data(&json!({"error": {"message": "overloaded", "type": "server_error"}}))
            };
            return stream_response(vec![ev], None, "text/event-stream");
        }
        if path.ends_with("/messages") {
            if stream {
                return stream_response(anthropic_events(&model), die, "text/event-stream");
            }
            return axum::Json(json!({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": DELTAS.concat()}],
                "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"input_tokens": 8, "cache_read_input_tokens": 4, "output_tokens": 2},
            }))
            .into_response();
        }
        let usage = json!({"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14,
            "prompt_tokens_details": {"cached_tokens": 4}});
        let chat = path.ends_with("/chat/completions");
        if stream {
            let include = json
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true);
            let mut ev: Vec<Bytes> = DELTAS
                .iter()
                .map(|d| sse_data(&json!({"id": "c1", "object": "chat.completion.chunk", "model": model,
                    "choices": [if chat { json!({"index": 0, "delta": {"content": d}, "finish_reason": null}) } else { json!({"index": 0, "text": d, "finish_reason": null}) }]})))
                .collect();
            ev.push(sse_data(
                &json!({"id": "c1", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ));
            if include {
                ev.push(sse_data(
                    &json!({"id": "c1", "object": "chat.completion.chunk", "model": model,
                    "choices": [], "usage": usage}),
                ));
            }
            ev.push(Bytes::from_static(b"data: [DONE]\n\n"));
            return stream_response(ev, die, "text/event-stream");
        }
        axum::Json(json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "model": model,
            "choices": [if chat {
                json!({"index": 0, "message": {"role": "assistant", "content": DELTAS.concat()}, "finish_reason": "stop"})
            } else {
                json!({"index": 0, "text": DELTAS.concat(), "finish_reason": "stop"})
            }],
            "usage": usage,
        }))
        .into_response()
    }
}

fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn sse_event(name: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

fn anthropic_events(model: &str) -> Vec<Bytes> {
    let mut v = vec![
        sse_event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
            "role": "assistant", "model": model, "content": [], "usage": {"input_tokens": 8, "cache_read_input_tokens": 4, "output_tokens": 1}}}),
        ),
        sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for d in DELTAS {
        v.push(sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": d}}),
        ));
    }
    v.push(sse_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    v.push(sse_event("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}})));
    v.push(sse_event("message_stop", &json!({"type": "message_stop"})));
    v
}

/// One AWS event-stream frame.
pub fn frame(event_type: &str, payload: &Value) -> Bytes {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let msg = Message::new(Bytes::from(payload.to_string()))
        .add_header(Header::new(
            ":message-type",
            HeaderValue::String("event".into()),
        ))
        .add_header(Header::new(
            ":event-type",
            HeaderValue::String(event_type.to_string().into()),
        ))
        .add_header(Header::new(
            ":content-type",
            HeaderValue::String("application/json".into()),
        ));
    let mut buf = Vec::new();
    aws_smithy_eventstream::frame::write_message_to(&msg, &mut buf).unwrap();
    Bytes::from(buf)
}

fn bedrock_frames() -> Vec<Bytes> {
    let mut v = vec![frame("messageStart", &json!({"role": "assistant"}))];
    for d in DELTAS {
        v.push(frame(
            "contentBlockDelta",
            &json!({"contentBlockIndex": 0, "delta": {"text": d}}),
        ));
    }
    v.push(frame("contentBlockStop", &json!({"contentBlockIndex": 0})));
    v.push(frame("messageStop", &json!({"stopReason": "end_turn"})));
    v.push(frame("metadata", &json!({"usage": {"inputTokens": 8, "outputTokens": 2, "cacheReadInputTokens": 4, "totalTokens": 14}, "metrics": {"latencyMs": 5}})));
    v
}

/// Where a stream is cut.
#[derive(Clone, Copy)]
enum Die {
    AfterFirst,
    BeforeLast,
}

fn stream_response(events: Vec<Bytes>, die: Option<Die>, content_type: &'static str) -> Response {
    let cut = match die {
        None => usize::MAX,
        Some(Die::AfterFirst) => 1,
        Some(Die::BeforeLast) => events.len().saturating_sub(1),
    };
    let s =
        futures_util::stream::iter(events.into_iter().enumerate()).then(move |(i, b)| async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            if i >= cut {
                Err(std::io::Error::other("died"))
            } else {
                Ok::<_, std::io::Error>(b)
            }
        });
    let s = s.take_while_inclusive_ok();
    Response::builder()
        .header("content-type", content_type)
        .body(Body::from_stream(s))
        .unwrap()
}

trait TakeWhileOk: futures_util::Stream + Sized {
    fn take_while_inclusive_ok(self) -> futures_util::stream::BoxStream<'static, Self::Item>;
}

impl<S> TakeWhileOk for S
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    fn take_while_inclusive_ok(self) -> futures_util::stream::BoxStream<'static, Self::Item> {
        use futures_util::StreamExt;
        let mut failed = false;
        self.take_while(move |r| {
            let keep = !failed;
            if r.is_err() {
                failed = true;
            }
            futures_util::future::ready(keep)
        })
        .boxed()
    }
}

use futures_util::StreamExt;

/// Parses `YYYYMMDDTHHMMSSZ`.
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let n = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    let (y, m, d) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (hh, mm, ss) = (n(9, 11)?, n(11, 13)?, n(13, 15)?);
    // Days from civil (Howard Hinnant).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = days * 86400 + hh * 3600 + mm * 60 + ss;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).ok()?))
}

/// Recomputes the SigV4 signature of a request with the fake's credentials (using
/// `aws-sigv4` directly) and compares it with the request's `authorization` header.
pub fn verify_sigv4(
    method: &axum::http::Method,
    path: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> bool {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    let h = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    };
    let (Some(auth), Some(date), Some(host)) = (h("authorization"), h("x-amz-date"), h("host"))
    else {
        return false;
    };
    if !auth.contains(&format!("Credential={AWS_ID}/"))
        || !auth.contains(&format!("/{REGION}/bedrock/aws4_request"))
    {
        return false;
    }
    let Some(time) = parse_amz_date(date) else {
        return false;
    };
    let identity: aws_smithy_runtime_api::client::identity::Identity =
        aws_credential_types::Credentials::new(AWS_ID, AWS_SECRET, None, None, "fake").into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(REGION)
        .name("bedrock")
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .unwrap()
        .into();
    // Sign the headers the request says it signed (host and x-amz-date are added by the signer).
    let signed: Vec<&str> = auth
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("")
        .split(';')
        .collect();
    let extra: Vec<(&str, &str)> = headers
        .iter()
        .filter(|(k, _)| signed.contains(&k.as_str()) && k != "host" && k != "x-amz-date")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let url = format!("http://{host}{path}");
    let req = SignableRequest::new(
        method.as_str(),
        url,
        extra.into_iter(),
        SignableBody::Bytes(body),
    )
    .unwrap();
    let (instr, _) = sign(req, &params).unwrap().into_parts();
    instr
        .headers()
        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        .is_some_and(|(_, v)| v == auth)
}
