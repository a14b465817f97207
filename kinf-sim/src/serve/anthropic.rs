//! `POST /v1/messages` (Anthropic Messages API as vLLM 0.32 serves it), plain and streamed
//! (`message_start`, `content_block_start`, `content_block_delta`…, `content_block_stop`,
//! `message_delta`, `message_stop`; see `fixtures/vllm-0.32.0-cpu/messages_stream.txt`).
//! Usage is vLLM's translation of the chat usage (`--enable-prompt-tokens-details`):
//! `cache_read_input_tokens` = cached prompt tokens, `cache_creation_input_tokens` = prompt
//! tokens in full blocks this request wrote to the cache, `input_tokens` = the rest.
//! Errors keep vLLM's types (`BadRequestError`, `NotFoundError`, …) in Anthropic's shape; a body
//! that does not fit the request schema gets vLLM's OpenAI-shaped validation error.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::{HeaderMap, StatusCode};
use kinf_router::tokenize::ChatMessage;
use serde_json::Value;

use super::driver::{Collected, Event, collect};
use super::http::{ApiError, St, json_response, parse_body, require_json};
use super::openai::{content_text, created_cache_tokens, rejected};
use super::sse::{self, js};
use crate::{FinishReason, RequestStats};

fn stop_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "max_tokens",
        FinishReason::Abort => "end_turn",
    }
}

fn final_usage(s: &RequestStats, block_size: u32) -> String {
    let created = created_cache_tokens(s, block_size);
    format!(
        "{{\"input_tokens\":{},\"output_tokens\":{},\"cache_creation_input_tokens\":{created},\
         \"cache_read_input_tokens\":{}}}",
        s.prompt_tokens
            .saturating_sub(s.cached_tokens)
            .saturating_sub(created),
        s.output_tokens,
        s.cached_tokens
    )
}

/// The request's `model` and `messages`, as the request schema requires them.
fn model_and_messages(
    v: &serde_json::Map<String, Value>,
) -> Result<(String, &Vec<Value>), ApiError> {
    let model = match v.get("model") {
        None => return Err(ApiError::missing("model")),
        Some(Value::String(m)) => m.clone(),
        Some(_) => {
            return Err(ApiError::schema(
                "body.model",
                "string_type",
                "Input should be a valid string",
            ));
        }
    };
    let msgs = match v.get("messages") {
        None => return Err(ApiError::missing("messages")),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::schema(
                "body.messages",
                "list_type",
                "Input should be a valid list",
            ));
        }
    };
    Ok((model, msgs))
}

/// `system` (if any) and `msgs` as chat messages, for the chat template.
fn chat_messages(
    v: &serde_json::Map<String, Value>,
    msgs: &[Value],
) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages = Vec::with_capacity(msgs.len() + 1);
    match v.get("system") {
        None | Some(Value::Null) => {}
        sys => messages.push(ChatMessage::new(
            "system",
            content_text(sys, "body.system")?,
        )),
    }
    for (i, m) in msgs.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::missing(&format!("messages.{i}.role")));
        };
        let content = content_text(m.get("content"), &format!("body.messages.{i}.content"))?;
        messages.push(ChatMessage::new(role, content));
    }
    Ok(messages)
}

/// `POST /v1/messages/count_tokens`: the prompt's length after the chat template, as vLLM
/// 0.32 answers it (`{"input_tokens": N, "context_management": {"original_input_tokens": N}}`).
pub async fn count_tokens(State(s): State<St>, headers: HeaderMap, body: Bytes) -> Response {
    count(&s, &headers, &body).unwrap_or_else(|e| e.anthropic())
}

fn count(s: &St, headers: &HeaderMap, body: &Bytes) -> Result<Response, ApiError> {
    require_json(headers)?;
    let v = parse_body(body)?;
    let (model, msgs) = model_and_messages(&v)?;
    let messages = chat_messages(&v, msgs)?;
    s.model(Some(&model))?;
    let prompt = s
        .tokens
        .chat(&messages)
        .map_err(|e| ApiError::invalid(e, None))?;
    Ok(json_response(
        StatusCode::OK,
        format!(
            "{{\"input_tokens\":{n},\"context_management\":{{\"original_input_tokens\":{n}}}}}",
            n = prompt.len()
        ),
    ))
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<St>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = require_json(&headers) {
        return e.anthropic();
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return e.anthropic(),
    };
    // The request schema first (all three fields are required), as FastAPI validates it.
    let (model, msgs) = match model_and_messages(&v) {
        Ok(x) => x,
        Err(e) => return e.anthropic(),
    };
    let requested = match v.get("max_tokens") {
        None => return ApiError::missing("max_tokens").anthropic(),
        Some(x) => match x.as_i64() {
            Some(n) if n < 1 => {
                return ApiError::schema(
                    "body.max_tokens",
                    "value_error",
                    "Value error, max_tokens must be positive",
                )
                .anthropic();
            }
            Some(n) => i128::from(n),
            None => {
                return ApiError::schema(
                    "body.max_tokens",
                    "int_type",
                    "Input should be a valid integer",
                )
                .anthropic();
            }
        },
    };
    let stream = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return ApiError::schema(
                "body.stream",
                "bool_type",
                "Input should be a valid boolean",
            )
            .anthropic();
        }
    };
    let messages = match chat_messages(&v, msgs) {
        Ok(m) => m,
        Err(e) => return e.anthropic(),
    };
    let model = match s.model(Some(&model)) {
        Ok(m) => m,
        Err(e) => return e.anthropic(),
    };
    let prompt = match s.tokens.chat(&messages) {
        Ok(p) => p,
        Err(e) => return ApiError::invalid(e, None).anthropic(),
    };
    let max_tokens = match s.max_tokens(prompt.len(), Some(requested), "max_tokens") {
        Ok(m) => m,
        Err(e) => return e.anthropic(),
    };
    let n = s.next_n();
    if s.failed(n) {
        return ApiError::internal("simulated failure (kinf-sim fault fail_rate)").anthropic();
    }
    let die = s.die_after(n);
    let id = s.id("chatcmpl", n);
    let prompt_len = prompt.len();
    let block_size = s.block_size;
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
                    final_usage(&stats, block_size)
                ),
            ),
            Collected::Cut => sse::cut_response(),
            Collected::Rejected(r) => ApiError::invalid(rejected(r), None).anthropic(),
            Collected::Stopped => ApiError::internal("engine stopped").anthropic(),
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
                                final_usage(&stats, block_size)
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
                        "{{\"type\":\"error\",\"error\":{{\"type\":\"BadRequestError\",\"message\":{}}}}}",
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
