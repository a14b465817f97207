//! `POST /v1/chat/completions` and `POST /v1/completions`, plain and streamed, in vLLM 0.32's
//! byte shapes (see `fixtures/vllm-0.32.0-cpu/chat1.json`, `comp1.json`, `chat_stream.txt`,
//! `chat_stream_n2.txt`, `completion_stream.txt`).
//!
//! The worker behaves as vLLM started with `--enable-prompt-tokens-details`: usage carries
//! `prompt_tokens_details` with `cached_tokens` (the engine's prefix-cache hit) and, for chat,
//! `created_cache_tokens` (prompt tokens in full blocks that this request wrote to the cache),
//! each in the shape vLLM serializes for that endpoint and mode. `n > 1` runs `n` engine
//! requests on the same prompt; `stream_options.continuous_usage_stats` puts `usage` on every
//! chunk.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use http::{HeaderMap, StatusCode};
use kinf_router::tokenize::ChatMessage;
use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::driver::{AbortGuard, Collected, Event, collect};
use super::http::{ApiError, St, json_response, parse_body, require_json};
use super::sse::{self, js};
use crate::hash::mix64;
use crate::{FinishReason, RejectReason, RequestStats};

const FINGERPRINT: &str = "vllm-0.32.0-kinfsim";

/// vLLM's `VLLM_MAX_N_SEQUENCES` default: the largest `n`.
const MAX_N: u64 = 16_384;

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
    /// Prompt length (counted once whatever `n`).
    prompt_tokens: u32,
    block_size: u32,
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

    /// The chat stream's first chunk of choice `index` (`delta.role`).
    fn role_chunk(&self, index: usize, usage: Option<&str>) -> String {
        format!(
            "{{{},\"choices\":[{{\"index\":{index},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\
             \"logprobs\":null,\"finish_reason\":null}}]{},\"prompt_token_ids\":null,\"prompt_text\":null}}",
            self.head(),
            usage_field(usage)
        )
    }

    /// A token chunk of choice `index`; with `finish`, the choice's last one. `fingerprint`:
    /// vLLM stamps `system_fingerprint` on the last chunk when no usage chunk follows.
    fn chunk(
        &self,
        index: usize,
        text: &str,
        finish: Option<FinishReason>,
        usage: Option<&str>,
        fingerprint: bool,
    ) -> String {
        let fin = finish.map_or_else(|| "null".to_owned(), |r| js(reason(r)));
        let tail = format!(
            "{}{}",
            usage_field(usage),
            if fingerprint && finish.is_some() {
                format!(",\"system_fingerprint\":\"{FINGERPRINT}\"")
            } else {
                String::new()
            }
        );
        match self.kind {
            Kind::Chat => {
                let stop = if finish.is_some() {
                    ",\"stop_reason\":null"
                } else {
                    ""
                };
                format!(
                    "{{{},\"choices\":[{{\"index\":{index},\"delta\":{{\"content\":{}}},\"logprobs\":null,\
                     \"finish_reason\":{fin}{stop},\"token_ids\":null}}]{tail}}}",
                    self.head(),
                    js(text)
                )
            }
            Kind::Completion => format!(
                "{{{},\"choices\":[{{\"index\":{index},\"text\":{},\"logprobs\":null,\"finish_reason\":\
                 {fin},\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}}]{tail}}}",
                self.head(),
                js(text)
            ),
        }
    }

    /// The `include_usage` chunk (`"choices":[]`): `first` is the stats of the choice whose
    /// output came first (vLLM takes the cache figures from the first output it streams),
    /// `completion` the tokens of all choices.
    fn usage_chunk(&self, first: &RequestStats, completion: u32) -> String {
        format!(
            "{{{},\"choices\":[],\"usage\":{},\"system_fingerprint\":\"{FINGERPRINT}\"}}",
            self.head(),
            self.usage(first, completion, false)
        )
    }

    /// `continuous_usage_stats` usage of a chunk after `completion` tokens of its choice
    /// (no `prompt_tokens_details`; chat adds `"completion_tokens_details":null`).
    fn running_usage(&self, completion: u32) -> String {
        let p = self.prompt_tokens;
        let details = match self.kind {
            Kind::Chat => ",\"completion_tokens_details\":null",
            Kind::Completion => "",
        };
        format!(
            "{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{completion}{details}}}",
            p + completion
        )
    }

    /// Final usage, as vLLM 0.32 serializes it with `--enable-prompt-tokens-details`:
    /// plain chat `{"cached_tokens","created_cache_tokens","multimodal_tokens":null}`, plain
    /// completion the same with `"created_cache_tokens":null`, streamed chat
    /// `{"cached_tokens","created_cache_tokens"}`, streamed completion `{"cached_tokens"}`
    /// (nulls dropped); plain responses end with `"completion_tokens_details":null`.
    fn usage(&self, first: &RequestStats, completion: u32, plain: bool) -> String {
        let cached = first.cached_tokens;
        let details = match (self.kind, plain) {
            (Kind::Chat, true) => format!(
                "{{\"cached_tokens\":{cached},\"created_cache_tokens\":{},\"multimodal_tokens\":null}}",
                created_cache_tokens(first, self.block_size)
            ),
            (Kind::Chat, false) => format!(
                "{{\"cached_tokens\":{cached},\"created_cache_tokens\":{}}}",
                created_cache_tokens(first, self.block_size)
            ),
            (Kind::Completion, true) => format!(
                "{{\"cached_tokens\":{cached},\"created_cache_tokens\":null,\"multimodal_tokens\":null}}"
            ),
            (Kind::Completion, false) => format!("{{\"cached_tokens\":{cached}}}"),
        };
        let p = self.prompt_tokens;
        format!(
            "{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{completion},\
             \"prompt_tokens_details\":{details}{}}}",
            p + completion,
            if plain {
                ",\"completion_tokens_details\":null"
            } else {
                ""
            }
        )
    }
}

fn usage_field(usage: Option<&str>) -> String {
    usage.map_or_else(String::new, |u| format!(",\"usage\":{u}"))
}

/// vLLM 0.32's `created_cache_tokens` (`PrefillStats.finalize`): the prompt tokens in full
/// blocks the request holds once prefilled, less those it found cached.
pub fn created_cache_tokens(stats: &RequestStats, block_size: u32) -> u32 {
    let bs = block_size.max(1);
    (stats.prompt_tokens / bs * bs).saturating_sub(stats.cached_tokens)
}

fn reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// Text of a message's `content` (a string or an array of `{"type":"text","text":…}` parts);
/// `loc` names the field in errors (`body.messages.0.content`).
pub fn content_text(v: Option<&Value>, loc: &str) -> Result<String, ApiError> {
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
                    None => {
                        return Err(ApiError::invalid(
                            "kinf-sim serves text content parts only".into(),
                            None,
                        ));
                    }
                }
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::schema(
            loc,
            "string_type",
            "Input should be a valid string",
        )),
    }
}

/// Python truthiness of a JSON value (`data.get(key)` in vLLM's validators).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|x| x != 0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// An optional integer field (`null` = absent); kept wide so that any JSON integer compares.
fn opt_int(v: &Map<String, Value>, key: &str) -> Result<Option<i128>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_i64()
            .map(i128::from)
            .or_else(|| x.as_u64().map(i128::from))
            .map(Some)
            .ok_or_else(|| {
                ApiError::schema(
                    &format!("body.{key}"),
                    "int_type",
                    "Input should be a valid integer",
                )
            }),
    }
}

/// An optional boolean field.
fn opt_bool(v: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::schema(
            &format!("body.{key}"),
            "bool_type",
            "Input should be a valid boolean",
        )),
    }
}

/// What a completions request without `max_tokens` generates at most (vLLM's default).
const COMPLETIONS_DEFAULT_MAX_TOKENS: i128 = 16;

/// `max_completion_tokens` (chat), else `max_tokens`, with the name vLLM reports.
fn requested_max(
    v: &Map<String, Value>,
    kind: Kind,
) -> Result<(Option<i128>, &'static str), ApiError> {
    if kind == Kind::Chat
        && let Some(n) = opt_int(v, "max_completion_tokens")?
    {
        return Ok((Some(n), "max_completion_tokens"));
    }
    Ok((opt_int(v, "max_tokens")?, "max_tokens"))
}

/// The prompt tokens of a chat request body (`messages`).
fn chat_prompt(s: &St, v: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
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
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(ApiError::missing(&format!("messages.{i}.role")));
        };
        let content = content_text(m.get("content"), &format!("body.messages.{i}.content"))?;
        messages.push(ChatMessage::new(role, content));
    }
    s.tokens
        .chat(&messages)
        .map_err(|e| ApiError::invalid(e, None))
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<St>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = require_json(&headers) {
        return e.openai();
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return e.openai(),
    };
    match chat_prompt(&s, &v) {
        Ok(prompt) => run(s, Kind::Chat, &v, prompt).await,
        Err(e) => e.openai(),
    }
}

/// `POST /tokenize` (vLLM's): `{"prompt": ...}` or `{"messages": [...]}` →
/// `{"count", "max_model_len", "tokens", "token_strs"}`.
pub async fn tokenize(State(s): State<St>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = require_json(&headers) {
        return e.openai();
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return e.openai(),
    };
    let tokens = if v.contains_key("messages") {
        chat_prompt(&s, &v)
    } else {
        match v.get("prompt") {
            Some(Value::String(p)) => s.tokens.prompt(p).map_err(|e| ApiError::invalid(e, None)),
            _ => Err(ApiError::missing("prompt")),
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
        Err(e) => e.openai(),
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<St>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(e) = require_json(&headers) {
        return e.openai();
    }
    let v = match parse_body(&body) {
        Ok(v) => v,
        Err(e) => return e.openai(),
    };
    let empty = || {
        ApiError::invalid(
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"
                .into(),
            Some("prompt"),
        )
    };
    let prompt = match v.get("prompt") {
        None | Some(Value::Null) => Err(empty()),
        Some(Value::String(p)) if p.is_empty() => Err(empty()),
        Some(Value::String(p)) => s.tokens.prompt(p).map_err(|e| ApiError::invalid(e, None)),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => s
            .tokens
            .prompt(a[0].as_str().unwrap_or_default())
            .map_err(|e| ApiError::invalid(e, None)),
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => Ok(a
            .iter()
            .filter_map(Value::as_u64)
            .map(|t| u32::try_from(t).unwrap_or(u32::MAX))
            .collect()),
        Some(Value::Array(a)) if a.len() > 1 && a.iter().all(|p| p.is_string() || p.is_array()) => {
            Err(ApiError::invalid(
                "kinf-sim serves one prompt per request (no batched prompts)".into(),
                Some("prompt"),
            ))
        }
        Some(_) => Err(ApiError::schema(
            "body.prompt",
            "string_type",
            "Input should be a valid string",
        )),
    };
    match prompt {
        Ok(p) => run(s, Kind::Completion, &v, p).await,
        Err(e) => e.openai(),
    }
}

/// The request options shared by both endpoints, validated in vLLM's order.
struct Opts {
    model: String,
    max_tokens: u32,
    n: usize,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

fn options(
    s: &St,
    kind: Kind,
    v: &Map<String, Value>,
    prompt_len: usize,
) -> Result<Opts, ApiError> {
    let stream = opt_bool(v, "stream")?;
    if truthy(v.get("stream_options")) && !truthy(v.get("stream")) {
        return Err(ApiError::invalid(
            "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
                .into(),
            Some("stream_options"),
        ));
    }
    let (include_usage, continuous_usage) = match v.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(o)) => {
            let flag = |k: &str| match o.get(k) {
                None | Some(Value::Null) => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(_) => Err(ApiError::schema(
                    &format!("body.stream_options.{k}"),
                    "bool_type",
                    "Input should be a valid boolean",
                )),
            };
            let usage = flag("include_usage")?;
            (usage, usage && flag("continuous_usage_stats")?)
        }
        Some(_) => {
            return Err(ApiError::schema(
                "body.stream_options",
                "model_type",
                "Input should be a valid dictionary or instance of StreamOptions",
            ));
        }
    };
    let n = match opt_int(v, "n")? {
        None => 1,
        Some(n) if n < 1 => {
            return Err(ApiError::invalid(
                format!("n must be at least 1, got {n}."),
                None,
            ));
        }
        Some(n) if n > i128::from(MAX_N) => {
            return Err(ApiError::invalid(
                format!(
                    "n must be at most {MAX_N}, got {n}. To raise the limit, set the \
                     VLLM_MAX_N_SEQUENCES environment variable."
                ),
                None,
            ));
        }
        Some(n) => usize::try_from(n).unwrap_or(1),
    };
    let model = match v.get("model") {
        None | Some(Value::Null) => s.model(None)?,
        Some(Value::String(m)) => s.model(Some(m))?,
        Some(_) => {
            return Err(ApiError::schema(
                "body.model",
                "string_type",
                "Input should be a valid string",
            ));
        }
    };
    let (requested, param) = requested_max(v, kind)?;
    // vLLM's `CompletionRequest.max_tokens` defaults to 16 (OpenAI's default for completions);
    // a chat request without a limit may fill the context.
    let requested = match kind {
        Kind::Completion => requested.or(Some(COMPLETIONS_DEFAULT_MAX_TOKENS)),
        Kind::Chat => requested,
    };
    let max_tokens = s.max_tokens(prompt_len, requested, param)?;
    Ok(Opts {
        model,
        max_tokens,
        n,
        stream,
        include_usage,
        continuous_usage,
    })
}

/// A submitted choice: its events and the guard that aborts it.
type Choice = (mpsc::UnboundedReceiver<Event>, AbortGuard);

async fn run(s: St, kind: Kind, v: &Map<String, Value>, prompt: Vec<u32>) -> Response {
    let o = match options(&s, kind, v, prompt.len()) {
        Ok(o) => o,
        Err(e) => return e.openai(),
    };
    let n = s.next_n();
    if s.failed(n) {
        return ApiError::internal("simulated failure (kinf-sim fault fail_rate)").openai();
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
        model: o.model,
        prompt_tokens: u32::try_from(prompt.len()).unwrap_or(u32::MAX),
        block_size: s.block_size,
    };
    // Choice 0 keeps the prompt's own seed (same output as with `n: 1`).
    let seed = s.output_seed(&prompt);
    let prompt: std::sync::Arc<[u32]> = prompt.into();
    let mut choices: Vec<Choice> = (0..o.n)
        .map(|i| {
            let seed_i = if i == 0 {
                seed
            } else {
                mix64(seed ^ mix64(i as u64))
            };
            s.driver.submit(prompt.clone(), o.max_tokens, seed_i)
        })
        .collect();
    if !o.stream {
        let mut outs = Vec::with_capacity(choices.len());
        for (rx, guard) in &mut choices {
            match collect(rx, guard, &s.tokens, die).await {
                Collected::Done {
                    text,
                    reason: r,
                    stats,
                } => outs.push((text, r, stats)),
                Collected::Cut => return sse::cut_response(),
                Collected::Rejected(r) => return ApiError::invalid(rejected(r), None).openai(),
                Collected::Stopped => return ApiError::internal("engine stopped").openai(),
            }
        }
        return json_response(StatusCode::OK, plain(&ctx, &outs));
    }
    let (tx, body) = sse::channel_body();
    let tokens = s.tokens.clone();
    let (include_usage, continuous) = (o.include_usage, o.continuous_usage);
    tokio::spawn(async move {
        let count = choices.len();
        let mut guards = Vec::with_capacity(count);
        let mut streams = Vec::with_capacity(count);
        for (i, (rx, guard)) in choices.into_iter().enumerate() {
            guards.push(guard);
            streams.push(
                futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|ev| (ev, rx))
                })
                .map(move |ev| (i, ev))
                .boxed(),
            );
        }
        let mut events = futures_util::stream::select_all(streams);
        if kind == Kind::Chat {
            for i in 0..count {
                let usage = continuous.then(|| ctx.running_usage(0));
                if !sse::send(&tx, sse::data(&ctx.role_chunk(i, usage.as_deref()))).await {
                    return;
                }
            }
        }
        if die == Some(0) {
            sse::cut(&tx).await;
            return;
        }
        // Each choice's latest token is held back until the next event shows whether it is
        // the last (vLLM puts `finish_reason` on the last token's chunk).
        let mut held: Vec<Option<String>> = vec![None; count];
        let mut emitted = vec![0u32; count];
        let mut finished: Vec<Option<RequestStats>> = vec![None; count];
        let mut sent = 0u32;
        let mut first_out: Option<usize> = None;
        while let Some((i, ev)) = events.next().await {
            first_out.get_or_insert(i);
            match ev {
                Event::Token { index, token } => {
                    if let Some(h) = held[i].take() {
                        emitted[i] += 1;
                        let usage = continuous.then(|| ctx.running_usage(emitted[i]));
                        let c = ctx.chunk(i, &h, None, usage.as_deref(), false);
                        if !sse::send(&tx, sse::data(&c)).await {
                            return;
                        }
                        sent += 1;
                        if die.is_some_and(|d| sent >= d) {
                            sse::cut(&tx).await;
                            return;
                        }
                    }
                    held[i] = Some(tokens.piece(token, index));
                }
                Event::Finished { reason: r, stats } => {
                    guards[i].disarm();
                    let last = held[i].take().unwrap_or_default();
                    emitted[i] += 1;
                    let usage = continuous.then(|| ctx.running_usage(emitted[i]));
                    let c = ctx.chunk(i, &last, Some(r), usage.as_deref(), !include_usage);
                    if !sse::send(&tx, sse::data(&c)).await {
                        return;
                    }
                    sent += 1;
                    if die.is_some_and(|d| sent >= d) {
                        sse::cut(&tx).await;
                        return;
                    }
                    finished[i] = Some(stats);
                    if finished.iter().all(Option::is_some) {
                        break;
                    }
                }
                Event::Rejected(r) => {
                    guards[i].disarm();
                    let err = ApiError::invalid(rejected(r), None);
                    let body = format!(
                        "{{\"error\":{{\"message\":{},\"type\":\"{}\",\"param\":null,\"code\":400}}}}",
                        js(&err.message),
                        err.typ
                    );
                    let _ = sse::send(&tx, sse::data(&body)).await;
                    let _ = sse::send(&tx, sse::data("[DONE]")).await;
                    return;
                }
            }
        }
        if finished.iter().any(Option::is_none) {
            // The engine stopped before every choice finished.
            return;
        }
        let Some(Some(first)) = finished.get(first_out.unwrap_or(0)) else {
            return;
        };
        if include_usage {
            let completion = finished.iter().flatten().map(|st| st.output_tokens).sum();
            if !sse::send(&tx, sse::data(&ctx.usage_chunk(first, completion))).await {
                return;
            }
        }
        let _ = sse::send(&tx, sse::data("[DONE]")).await;
    });
    sse::sse_response(body)
}

/// The message of an engine rejection.
pub fn rejected(r: RejectReason) -> String {
    format!("the engine refused the request: {r:?}")
}

/// A plain response of `outs` (text, finish reason, stats per choice, in index order). The
/// cache figures are the last-finished choice's, as in vLLM's final output of an `n > 1`
/// request.
fn plain(ctx: &Ctx, outs: &[(String, FinishReason, RequestStats)]) -> String {
    let completion = outs.iter().map(|(_, _, st)| st.output_tokens).sum();
    let usage = outs
        .iter()
        .map(|(_, _, st)| st)
        .reduce(|a, b| if b.finished >= a.finished { b } else { a })
        .map_or_else(|| "null".to_owned(), |st| ctx.usage(st, completion, true));
    let choices: Vec<String> = outs
        .iter()
        .enumerate()
        .map(|(i, (text, r, _))| match ctx.kind {
            Kind::Chat => format!(
                "{{\"index\":{i},\"message\":{{\"role\":\"assistant\",\"content\":{},\"refusal\":null,\
                 \"annotations\":null,\"audio\":null,\"function_call\":null,\"reasoning\":null}},\
                 \"logprobs\":null,\"finish_reason\":{},\"stop_reason\":null,\"token_ids\":null,\
                 \"routed_experts\":null}}",
                js(text),
                js(reason(*r))
            ),
            Kind::Completion => format!(
                "{{\"index\":{i},\"text\":{},\"logprobs\":null,\"finish_reason\":{},\"stop_reason\":null,\
                 \"token_ids\":null,\"prompt_logprobs\":null,\"prompt_token_ids\":null,\
                 \"routed_experts\":null}}",
                js(text),
                js(reason(*r))
            ),
        })
        .collect();
    let choices = choices.join(",");
    match ctx.kind {
        Kind::Chat => format!(
            "{{\"id\":{},\"object\":\"chat.completion\",\"created\":{},\"model\":{},\"choices\":[{choices}],\
             \"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\"usage\":{usage},\
             \"prompt_logprobs\":null,\"prompt_token_ids\":null,\"prompt_text\":null,\
             \"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}}",
            js(&ctx.id),
            ctx.created,
            js(&ctx.model),
        ),
        Kind::Completion => format!(
            "{{\"id\":{},\"object\":\"text_completion\",\"created\":{},\"model\":{},\"choices\":[{choices}],\
             \"service_tier\":null,\"system_fingerprint\":\"{FINGERPRINT}\",\"usage\":{usage},\
             \"kv_transfer_params\":null,\"ec_transfer_params\":null,\"metrics\":null}}",
            js(&ctx.id),
            ctx.created,
            js(&ctx.model),
        ),
    }
}
