//! `POST /v1/chat/completions` and `POST /v1/completions`, plain and streamed, in vLLM 0.32's
//! byte shapes (see `fixtures/vllm-0.32.0-cpu/chat1.json`, `comp1.json`, `chat_stream.txt`,
//! `completion_stream.txt`). Usage always carries `prompt_tokens_details.cached_tokens` (as with
//! vLLM's `--enable-prompt-tokens-details`).

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use kinf_router::tokenize::ChatMessage;
use serde_json::Value;

use super::driver::{Collected, Event, collect};
use super::http::{St, json_response, openai_error};
use super::sse::{self, js};
use crate::{FinishReason, RejectReason, RequestStats};

const FINGERPRINT: &str = "vllm-0.32.0-kinfsim";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

struct Ctx {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
}

impl Ctx {
    fn head(&self) -> String {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        format!(
            "\"id\":{},\"object\":\"{object}\",\"created\":{},\"model\":{}",
            js(&self.id),
            self.created,
            js(&self.model)
        )
    }

    fn chunk(&self, text: &str, finish: Option<FinishReason>) -> String {
        let fin = finish.map_or_else(|| "null".to_owned(), |r| js(reason(r)));
        match self.kind {
            Kind::Chat => {
                let stop = if finish.is_some() {
                    ",\"stop_reason\":null"
                } else {
                    ""
                };
                format!(
                    "{{{},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"logprobs\":null,\
                     \"finish_reason\":{fin}{stop},\"token_ids\":null}}]}}",
                    self.head(),
                    js(text)
                )
            }
            Kind::Completion => format!(
                "{{{},\"choices\":[{{\"index\":0,\"text\":{},\"logprobs\":null,\"finish_reason\":\
                 {fin},\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}}]}}",
                self.head(),
                js(text)
            ),
        }
    }

    fn usage_chunk(&self, stats: &RequestStats) -> String {
        format!(
            "{{{},\"choices\":[],\"usage\":{},\"system_fingerprint\":\"{FINGERPRINT}\"}}",
            self.head(),
            usage(stats, false)
        )
    }
}

fn reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

fn usage(s: &RequestStats, with_completion_details: bool) -> String {
    let details = if with_completion_details {
        ",\"completion_tokens_details\":null"
    } else {
        ""
    };
    format!(
        "{{\"prompt_tokens\":{},\"total_tokens\":{},\"completion_tokens\":{},\
         \"prompt_tokens_details\":{{\"cached_tokens\":{}}}{details}}}",
        s.prompt_tokens,
        s.prompt_tokens + s.output_tokens,
        s.output_tokens,
        s.cached_tokens
    )
}

fn bad(msg: &str) -> Response {
    openai_error(StatusCode::BAD_REQUEST, msg, None)
}

/// Text of a message's `content` (a string or an array of `{"type":"text","text":…}` parts).
pub fn content_text(v: Option<&Value>) -> Result<String, String> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                match p.get("text").and_then(Value::as_str) {
                    Some(t) => {
                        if !out.is_empty() {
                            out.push('\n');
                        }
                        out.push_str(t);
                    }
                    None => return Err("only text content parts are supported".into()),
                }
            }
            Ok(out)
        }
        Some(_) => Err("`content` must be a string or an array of parts".into()),
    }
}

fn parse(body: &Bytes) -> Result<Value, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err("the request body must be a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

fn requested_max(v: &Value) -> Result<Option<u64>, String> {
    for key in ["max_completion_tokens", "max_tokens"] {
        match v.get(key) {
            None | Some(Value::Null) => {}
            Some(x) => {
                return x
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| format!("`{key}` must be a non-negative integer"));
            }
        }
    }
    Ok(None)
}

/// The prompt tokens of a chat request body (`messages`).
fn chat_prompt(s: &St, v: &Value) -> Result<Vec<u32>, String> {
    let Some(msgs) = v.get("messages").and_then(Value::as_array) else {
        return Err("`messages` is required and must be an array".into());
    };
    let mut messages = Vec::with_capacity(msgs.len());
    for m in msgs {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err("each message needs a string `role`".into());
        };
        messages.push(ChatMessage::new(role, content_text(m.get("content"))?));
    }
    s.tokens.chat(&messages)
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<St>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(e) => return bad(&e),
    };
    match chat_prompt(&s, &v) {
        Ok(prompt) => run(s, Kind::Chat, &v, prompt).await,
        Err(e) => bad(&e),
    }
}

/// `POST /tokenize` (vLLM's): `{"prompt": ...}` or `{"messages": [...]}` →
/// `{"count", "max_model_len", "tokens", "token_strs"}`.
pub async fn tokenize(State(s): State<St>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(e) => return bad(&e),
    };
    let tokens = if v.get("messages").is_some() {
        chat_prompt(&s, &v)
    } else {
        match v.get("prompt") {
            Some(Value::String(p)) => s.tokens.prompt(p),
            _ => Err("`prompt` (a string) or `messages` is required".into()),
        }
    };
    match tokens {
        Ok(t) => axum::Json(serde_json::json!({
            "count": t.len(),
            "max_model_len": s.max_model_len,
            "tokens": t,
            "token_strs": null,
        }))
        .into_response(),
        Err(e) => bad(&e),
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<St>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(e) => return bad(&e),
    };
    let prompt = match v.get("prompt") {
        Some(Value::String(p)) => s.tokens.prompt(p),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            s.tokens.prompt(a[0].as_str().unwrap_or_default())
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(a
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| t as u32)
            .collect()),
        _ => Err("`prompt` must be a string or an array of token ids".into()),
    };
    match prompt {
        Ok(p) => run(s, Kind::Completion, &v, p).await,
        Err(e) => bad(&e),
    }
}

async fn run(s: St, kind: Kind, v: &Value, prompt: Vec<u32>) -> Response {
    let model = match s.model(v.get("model").and_then(Value::as_str)) {
        Ok(m) => m,
        Err(e) => return openai_error(StatusCode::NOT_FOUND, &e, Some("model")),
    };
    let requested = match requested_max(v) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    let max_tokens = match s.max_tokens(prompt.len(), requested) {
        Ok(m) => m,
        Err(e) => return bad(&e),
    };
    let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let n = s.next_n();
    if s.failed(n) {
        return openai_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "simulated failure (kinf-sim fault fail_rate)",
            None,
        );
    }
    let die = s.die_after(n);
    let ctx = Ctx {
        kind,
        id: s.id(
            match kind {
                Kind::Chat => "chatcmpl",
                Kind::Completion => "cmpl",
            },
            n,
        ),
        created: s.created(),
        model,
    };
    let seed = s.output_seed(&prompt);
    let (mut rx, mut guard) = s.driver.submit(prompt, max_tokens, seed);
    if !stream {
        return match collect(&mut rx, &mut guard, &s.tokens, die).await {
            Collected::Done {
                text,
                reason: r,
                stats,
            } => json_response(StatusCode::OK, plain(&ctx, &text, r, &stats)),
            Collected::Cut => sse::cut_response(),
            Collected::Rejected(r) => bad(&rejected(r)),
            Collected::Stopped => {
                openai_error(StatusCode::INTERNAL_SERVER_ERROR, "engine stopped", None)
            }
        };
    }
    let (tx, body) = sse::channel_body();
    let tokens = s.tokens.clone();
    tokio::spawn(async move {
        if kind == Kind::Chat {
            let first = format!(
                "{{{},\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\
                 \"logprobs\":null,\"finish_reason\":null}}],\"prompt_token_ids\":null,\"prompt_text\":null}}",
                ctx.head()
            );
            if !sse::send(&tx, sse::data(&first)).await {
                return;
            }
        }
        if die == Some(0) {
            sse::cut(&tx).await;
            return;
        }
        let mut held: Option<String> = None;
        let mut sent = 0u32;
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Token { index, token } => {
                    if let Some(h) = held.take() {
                        if !sse::send(&tx, sse::data(&ctx.chunk(&h, None))).await {
                            return;
                        }
                        sent += 1;
                        if die.is_some_and(|d| sent >= d) {
                            sse::cut(&tx).await;
                            return;
                        }
                    }
                    held = Some(tokens.piece(token, index));
                }
                Event::Finished { reason: r, stats } => {
                    guard.disarm();
                    let last = held.take().unwrap_or_default();
                    if !sse::send(&tx, sse::data(&ctx.chunk(&last, Some(r)))).await {
                        return;
                    }
                    if die.is_some_and(|d| sent + 1 >= d) {
                        sse::cut(&tx).await;
                        return;
                    }
                    if include_usage && !sse::send(&tx, sse::data(&ctx.usage_chunk(&stats))).await {
                        return;
                    }
                    let _ = sse::send(&tx, sse::data("[DONE]")).await;
                    return;
                }
                Event::Rejected(r) => {
                    guard.disarm();
                    let err = format!(
                        "{{\"error\":{{\"message\":{},\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}}}",
                        js(&rejected(r))
                    );
                    let _ = sse::send(&tx, sse::data(&err)).await;
                    let _ = sse::send(&tx, sse::data("[DONE]")).await;
                    return;
                }
            }
        }
    });
    sse::sse_response(body)
}

/// The message of an engine rejection.
pub fn rejected(r: RejectReason) -> String {
    format!("the engine refused the request: {r:?}")
}

fn plain(ctx: &Ctx, text: &str, r: FinishReason, stats: &RequestStats) -> String {
    match ctx.kind {
        Kind::Chat => format!(
            "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{{\
             \"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":{},\"refusal\":null,\
             \"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null}},\
             \"logprobs\":null,\"finish_reason\":{},\"stop_reason\":null,\"token_ids\":null,\
             \"routed_experts\":null}}],\"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\
             \"usage\":{},\"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\
             \"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}}",
            js(&ctx.id),
            ctx.created,
            js(&ctx.model),
            js(text),
            js(reason(r)),
            usage(stats, true)
        ),
        Kind::Completion => format!(
            "{{\"id\":{},\"object\":\"text_completion\",\"created\":{},\"model\":{},\"choices\":[{{\
             \"index\":0,\"text\":{},\"logprobs\":null,\"finish_reason\":{},\"stop_reason\":null,\
             \"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null,\
             \"routed_experts\":null}}],\"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\
             \"usage\":{},\"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}}",
            js(&ctx.id),
            ctx.created,
            js(&ctx.model),
            js(text),
            js(reason(r)),
            usage(stats, true)
        ),
    }
}
