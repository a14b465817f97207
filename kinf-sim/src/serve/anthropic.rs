//! `POST /v1/messages` (Anthropic Messages API as vLLM 0.32 serves it), plain and streamed
//! (`message_start`, `content_block_start`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`; see `fixtures/vllm-0.32.0-cpu/messages_stream.txt`).
//! `input_tokens` in the final usage counts uncached prompt tokens; cached ones are
//! `cache_read_input_tokens`.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::StatusCode;
use kinf_router::tokenize::ChatMessage;
use serde_json::Value;

use super::driver::{Collected, Event, collect};
use super::http::{St, json_response};
use super::openai::{content_text, rejected};
use super::sse::{self, js};
use crate::{FinishReason, RequestStats};

fn error(status: StatusCode, typ: &str, msg: &str) -> Response {
    json_response(
        status,
        format!(
            "{{\"type\":\"error\",\"error\":{{\"type\":\"{typ}\",\"message\":{}}}}}",
            js(msg)
        ),
    )
}

fn bad(msg: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", msg)
}

fn stop_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "max_tokens",
        FinishReason::Abort => "end_turn",
    }
}

fn final_usage(s: &RequestStats) -> String {
    format!(
        "{{\"input_tokens\":{},\"output_tokens\":{},\"cache_creation_input_tokens\":0,\
         \"cache_read_input_tokens\":{}}}",
        s.prompt_tokens.saturating_sub(s.cached_tokens),
        s.output_tokens,
        s.cached_tokens
    )
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<St>, body: Bytes) -> Response {
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return bad("the request body must be a JSON object"),
        Err(e) => return bad(&format!("invalid JSON: {e}")),
    };
    let model = match s.model(v.get("model").and_then(Value::as_str)) {
        Ok(m) => m,
        Err(e) => return error(StatusCode::NOT_FOUND, "not_found_error", &e),
    };
    let Some(requested) = v.get("max_tokens").and_then(Value::as_u64) else {
        return bad("`max_tokens` is required and must be a non-negative integer");
    };
    let Some(msgs) = v.get("messages").and_then(Value::as_array) else {
        return bad("`messages` is required and must be an array");
    };
    let mut messages = Vec::with_capacity(msgs.len() + 1);
    match v.get("system") {
        None | Some(Value::Null) => {}
        sys => match content_text(sys) {
            Ok(t) => messages.push(ChatMessage::new("system", t)),
            Err(e) => return bad(&e),
        },
    }
    for m in msgs {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return bad("each message needs a string `role`");
        };
        match content_text(m.get("content")) {
            Ok(c) => messages.push(ChatMessage::new(role, c)),
            Err(e) => return bad(&e),
        }
    }
    let prompt = match s.tokens.chat(&messages) {
        Ok(p) => p,
        Err(e) => return bad(&e),
    };
    let max_tokens = match s.max_tokens(prompt.len(), Some(requested)) {
        Ok(m) => m,
        Err(e) => return bad(&e),
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let n = s.next_n();
    if s.failed(n) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "simulated failure (kinf-sim fault fail_rate)",
        );
    }
    let die = s.die_after(n);
    let id = s.id("chatcmpl", n);
    let prompt_len = prompt.len();
    let seed = s.output_seed(&prompt);
    let (mut rx, mut guard) = s.driver.submit(prompt, max_tokens, seed);
    if !stream {
        return match collect(&mut rx, &mut guard, &s.tokens, die).await {
            Collected::Done {
                text,
                reason,
                stats,
            } => json_response(
                StatusCode::OK,
                format!(
                    "{{\"id\":{},\"type\":\"message\",\"role\":\"assistant\",\"content\":[{{\
                     \"type\":\"text\",\"text\":{}}}],\"model\":{},\"stop_reason\":\"{}\",\
                     \"usage\":{}}}",
                    js(&id),
                    js(&text),
                    js(&model),
                    stop_reason(reason),
                    final_usage(&stats)
                ),
            ),
            Collected::Cut => sse::cut_response(),
            Collected::Rejected(r) => bad(&rejected(r)),
            Collected::Stopped => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "api_error",
                "engine stopped",
            ),
        };
    }
    let (tx, body) = sse::channel_body();
    let tokens = s.tokens.clone();
    tokio::spawn(async move {
        let start = format!(
            "{{\"type\":\"message_start\",\"message\":{{\"id\":{},\"type\":\"message\",\"role\":\
             \"assistant\",\"content\":[],\"model\":{},\"stop_reason\":null,\"stop_sequence\":null,\
             \"usage\":{{\"input_tokens\":{prompt_len},\"output_tokens\":0}}}}}}",
            js(&id),
            js(&model)
        );
        if !sse::send(&tx, sse::event("message_start", &start)).await {
            return;
        }
        let block_start = "{\"type\":\"content_block_start\",\"content_block\":{\"type\":\"text\",\"text\":\"\"},\"index\":0}";
        if !sse::send(&tx, sse::event("content_block_start", block_start)).await {
            return;
        }
        if die == Some(0) {
            sse::cut(&tx).await;
            return;
        }
        let mut sent = 0u32;
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Token { index, token } => {
                    let delta = format!(
                        "{{\"type\":\"content_block_delta\",\"delta\":{{\"type\":\"text_delta\",\
                         \"text\":{}}},\"index\":0}}",
                        js(&tokens.piece(token, index))
                    );
                    if !sse::send(&tx, sse::event("content_block_delta", &delta)).await {
                        return;
                    }
                    sent += 1;
                    if die.is_some_and(|d| sent >= d) {
                        sse::cut(&tx).await;
                        return;
                    }
                }
                Event::Finished { reason, stats } => {
                    guard.disarm();
                    let frames = [
                        sse::event(
                            "content_block_stop",
                            "{\"type\":\"content_block_stop\",\"index\":0}",
                        ),
                        sse::event(
                            "message_delta",
                            &format!(
                                "{{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\
                                 \"stop_sequence\":null}},\"usage\":{}}}",
                                stop_reason(reason),
                                final_usage(&stats)
                            ),
                        ),
                        sse::event("message_stop", "{\"type\":\"message_stop\"}"),
                    ];
                    for f in frames {
                        if !sse::send(&tx, f).await {
                            return;
                        }
                    }
                    return;
                }
                Event::Rejected(r) => {
                    guard.disarm();
                    let err = format!(
                        "{{\"type\":\"error\",\"error\":{{\"type\":\"invalid_request_error\",\"message\":{}}}}}",
                        js(&rejected(r))
                    );
                    let _ = sse::send(&tx, sse::event("error", &err)).await;
                    return;
                }
            }
        }
    });
    sse::sse_response(body)
}
