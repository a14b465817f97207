//! Shared server state, the HTTP router, and the small endpoints (`/health`, `/v1/models`,
//! `/kv_event_sources`, `/reset_prefix_cache`, `/sim/*`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::driver::{Clock, Driver};
use super::faults::{SharedFaults, Stream};
use super::sse::js;
use super::tokens::Tokens;
use super::{anthropic, metrics_text, openai};
use crate::hash::mix64;

/// Everything the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// Served model names (the first labels metrics).
    pub names: Vec<String>,
    /// `--model` (`root` in `/v1/models`).
    pub root: String,
    /// Maximum model length.
    pub max_model_len: u32,
    /// KV block size.
    pub block_size: u32,
    /// KV-cache blocks.
    pub num_gpu_blocks: u32,
    /// The engine task.
    pub driver: Driver,
    /// Tokenizer.
    pub tokens: Tokens,
    /// Fault switches.
    pub faults: SharedFaults,
    /// `--seed`.
    pub seed: u64,
    /// Simulated clock.
    pub clock: Clock,
    /// Requests seen (ids and fault decisions).
    pub counter: AtomicU64,
    /// `GET /kv_event_sources`.
    pub kv_sources: String,
}

/// Shared state handle.
pub type St = Arc<AppState>;

impl AppState {
    /// A fresh per-request number.
    pub fn next_n(&self) -> u64 {
        self.counter.fetch_add(1, Ordering::Relaxed)
    }

    /// A vLLM-style id (`chatcmpl-…`, `cmpl-…`).
    pub fn id(&self, prefix: &str, n: u64) -> String {
        format!("{prefix}-{:016x}", mix64(self.seed ^ mix64(n ^ 0x1d)))
    }

    /// Unix seconds now.
    pub fn created(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// The served name to echo for a request's `model` (the first when absent); `Err` is
    /// vLLM's 404 for an unknown model.
    pub fn model(&self, requested: Option<&str>) -> Result<String, ApiError> {
        match requested {
            None => Ok(self.names.first().cloned().unwrap_or_default()),
            Some(m) if self.names.iter().any(|n| n == m) => Ok(m.to_owned()),
            Some(m) => Err(ApiError {
                status: StatusCode::NOT_FOUND,
                typ: "NotFoundError",
                message: format!(
                    "The model `{m}` does not exist. Valid aliases: {}.",
                    self.names.join(", ")
                ),
                param: Some("model".into()),
            }),
        }
    }

    /// Checks a request's lengths as vLLM 0.32 does and returns the tokens to generate:
    /// `max_tokens` (`max_completion_tokens`, named by `param`) over `max_model_len`, or a
    /// prompt that leaves no room for one output token, is a 400; a `max_tokens` that only
    /// overflows the context together with the prompt is clamped to what is left, and an
    /// absent one means all of it.
    pub fn max_tokens(
        &self,
        prompt_len: usize,
        requested: Option<i128>,
        param: &str,
    ) -> Result<u32, ApiError> {
        let max = self.max_model_len as usize;
        if let Some(n) = requested
            && n > max as i128
        {
            return Err(ApiError::invalid(
                format!(
                    "{param}={n} cannot be greater than max_model_len={max}. Please request \
                     fewer output tokens. (parameter={param}, value={n})"
                ),
                Some(param),
            ));
        }
        if prompt_len == 0 {
            return Err(ApiError::invalid(
                "The decoder prompt cannot be empty".into(),
                None,
            ));
        }
        if prompt_len > max {
            return Err(ApiError::invalid(
                format!(
                    "This model's maximum context length is {max} tokens. However, your prompt \
                     contains {prompt_len} input tokens, which exceeds this limit even without \
                     any output tokens. Please reduce the length of the input prompt. \
                     (parameter=input_tokens, value={prompt_len})"
                ),
                Some("input_tokens"),
            ));
        }
        let left = (max - prompt_len) as i128;
        let n = requested.map_or(left, |n| n.min(left));
        if n < 1 {
            return Err(ApiError::invalid(
                format!(
                    "max_tokens must be at least 1, got {n}. (parameter=max_tokens, value={n})"
                ),
                Some("max_tokens"),
            ));
        }
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// The injected 500 for request `n`, if the fail fault fires.
    pub fn failed(&self, n: u64) -> bool {
        let f = self.faults.get();
        self.faults.roll(Stream::Fail, n, f.fail_rate)
    }

    /// After how many tokens response `n` is cut, if the die fault fires.
    pub fn die_after(&self, n: u64) -> Option<u32> {
        let f = self.faults.get();
        f.die_after_tokens
            .filter(|_| self.faults.roll(Stream::Die, n, f.die_rate))
    }

    /// Seed of a prompt's generated tokens: identical prompts produce identical outputs.
    pub fn output_seed(&self, prompt: &[u32]) -> u64 {
        let bytes: Vec<u8> = prompt.iter().flat_map(|t| t.to_le_bytes()).collect();
        mix64(self.seed ^ xxhash_rust::xxh3::xxh3_64(&bytes))
    }
}

/// A JSON response.
pub fn json_response(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// vLLM's OpenAI error object: `{"error":{"message","type","param","code"}}`.
pub fn openai_error(status: StatusCode, message: &str, param: Option<&str>) -> Response {
    let typ = match status.as_u16() {
        400 => "BadRequestError",
        404 => "NotFoundError",
        500 => "InternalServerError",
        _ => "Error",
    };
    ApiError {
        status,
        typ,
        message: message.to_owned(),
        param: param.map(str::to_owned),
    }
    .openai()
}

/// A request error as vLLM 0.32 reports it.
///
/// Two kinds, as vLLM's FastAPI app has them: a body that does not fit the request schema
/// (invalid JSON, a missing or mistyped field) is refused by FastAPI's validation handler with
/// `type: "Bad Request"` and `param: "body.<field>"`, in the OpenAI shape on every route
/// (`/v1/messages` included); the others (`BadRequestError`, `NotFoundError`,
/// `InternalServerError`) come from the endpoint, which `/v1/messages` wraps in Anthropic's
/// shape `{"type":"error","error":{"type","message"}}` keeping vLLM's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// `error.type`.
    pub typ: &'static str,
    /// `error.message`.
    pub message: String,
    /// `error.param`.
    pub param: Option<String>,
}

/// `error.type` of a request-schema failure.
const SCHEMA: &str = "Bad Request";

impl ApiError {
    /// A 400 `BadRequestError` (vLLM's `VLLMValidationError`).
    pub fn invalid(message: String, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            typ: "BadRequestError",
            message,
            param: param.map(str::to_owned),
        }
    }

    /// A 500 `InternalServerError`.
    pub fn internal(message: &str) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            typ: "InternalServerError",
            message: message.to_owned(),
            param: None,
        }
    }

    /// A request-schema failure at `loc` (`body.messages`), pydantic's error `kind` and `msg`,
    /// worded as vLLM's validation handler words it.
    pub fn schema(loc: &str, kind: &str, msg: &str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            typ: SCHEMA,
            message: format!(
                "1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}'}}"
            ),
            param: Some(loc.to_owned()),
        }
    }

    /// A required field absent from the body.
    pub fn missing(field: &str) -> Self {
        Self::schema(&format!("body.{field}"), "missing", "Field required")
    }

    /// Whether it is a request-schema failure (OpenAI-shaped on every route).
    pub fn is_schema(&self) -> bool {
        self.typ == SCHEMA
    }

    /// The OpenAI-shaped response.
    pub fn openai(&self) -> Response {
        let param = self.param.as_deref().map_or_else(|| "null".to_owned(), js);
        json_response(
            self.status,
            format!(
                "{{\"error\":{{\"message\":{},\"type\":\"{}\",\"param\":{param},\"code\":{}}}}}",
                js(&self.message),
                self.typ,
                self.status.as_u16()
            ),
        )
    }

    /// The response of `/v1/messages`: schema failures as [`Self::openai`], the others in
    /// Anthropic's shape with vLLM's type.
    pub fn anthropic(&self) -> Response {
        if self.is_schema() {
            return self.openai();
        }
        json_response(
            self.status,
            format!(
                "{{\"type\":\"error\",\"error\":{{\"type\":\"{}\",\"message\":{}}}}}",
                self.typ,
                js(&self.message)
            ),
        )
    }
}

/// vLLM's `validate_json_request` on its inference routes: the request's media type must be
/// `application/json` (any case, parameters allowed), else a 400 `"Bad Request"`.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("");
    if media.trim().eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::BAD_REQUEST,
        typ: SCHEMA,
        message:
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
                .into(),
        param: None,
    })
}

/// Parses a request body as a JSON object, failing as vLLM's validation handler does.
pub fn parse_body(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::schema(
            "body",
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
        )),
        Err(e) => {
            // Python's `JSONDecodeError.pos`: the character offset of the error.
            let text = String::from_utf8_lossy(body);
            let pos: usize = text
                .split_inclusive('\n')
                .take(e.line().saturating_sub(1))
                .map(|l| l.chars().count())
                .sum::<usize>()
                + e.column().saturating_sub(1);
            Err(ApiError::schema(
                &format!("body.{pos}"),
                "json_invalid",
                "JSON decode error",
            ))
        }
    }
}

/// The server's routes.
pub fn router(state: St) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/tokenize", post(openai::tokenize))
        .route("/metrics", get(metrics_text::metrics))
        .route("/kv_event_sources", get(kv_event_sources))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/sim/faults", get(get_faults).post(set_faults))
        .route("/sim/restart_publisher", post(restart_publisher))
        .route("/sim/cache", get(cached_blocks))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, "{\"detail\":\"Not Found\"}".into())
}

async fn method_not_allowed() -> Response {
    json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "{\"detail\":\"Method Not Allowed\"}".into(),
    )
}

async fn models(State(s): State<St>) -> Response {
    let created = s.created();
    let data: Vec<String> = s
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            format!(
                "{{\"id\":{},\"object\":\"model\",\"created\":{created},\"owned_by\":\"vllm\",\
                 \"root\":{},\"parent\":null,\"max_model_len\":{},\"permission\":[{{\"id\":\
                 \"modelperm-{:016x}\",\"object\":\"model_permission\",\"created\":{created},\
                 \"allow_create_engine\":false,\"allow_sampling\":true,\"allow_logprobs\":true,\
                 \"allow_search_indices\":false,\"allow_view\":true,\"allow_fine_tuning\":false,\
                 \"organization\":\"*\",\"group\":null,\"is_blocking\":false}}]}}",
                js(name),
                js(&s.root),
                s.max_model_len,
                mix64(s.seed ^ created ^ i as u64)
            )
        })
        .collect();
    json_response(
        StatusCode::OK,
        format!("{{\"object\":\"list\",\"data\":[{}]}}", data.join(",")),
    )
}

async fn kv_event_sources(State(s): State<St>) -> Response {
    json_response(StatusCode::OK, s.kv_sources.clone())
}

async fn reset_prefix_cache(State(s): State<St>) -> StatusCode {
    if !s.driver.reset_prefix_cache().await {
        tracing::warn!("reset_prefix_cache: requests hold blocks; cache not reset");
    }
    StatusCode::OK
}

async fn get_faults(State(s): State<St>) -> Response {
    json_response(
        StatusCode::OK,
        serde_json::to_string(&s.faults.get()).unwrap_or_default(),
    )
}

async fn set_faults(State(s): State<St>, body: Bytes) -> Response {
    let patch: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return openai_error(StatusCode::BAD_REQUEST, &e.to_string(), None),
    };
    match s.faults.get().merged(&patch) {
        Ok(f) => {
            s.faults.set(f.clone());
            json_response(
                StatusCode::OK,
                serde_json::to_string(&f).unwrap_or_default(),
            )
        }
        Err(e) => openai_error(StatusCode::BAD_REQUEST, &e, None),
    }
}

/// `GET /sim/cache`: `{"blocks": N, "block_hashes": [..]}`, the engine's prefix cache (block
/// hashes as KV events report them, sorted), for checking a KV-event consumer against the truth.
async fn cached_blocks(State(s): State<St>) -> Response {
    match s.driver.cached_blocks().await {
        Some(hashes) => json_response(
            StatusCode::OK,
            serde_json::json!({"blocks": hashes.len(), "block_hashes": hashes}).to_string(),
        ),
        None => openai_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped",
            None,
        ),
    }
}

async fn restart_publisher(State(s): State<St>) -> impl IntoResponse {
    let cleared = s.driver.restart_publisher().await;
    json_response(
        StatusCode::OK,
        format!("{{\"restarted\":true,\"engine_cache_cleared\":{cleared}}}"),
    )
}
