//! Shared server state, the HTTP router, and the small endpoints (`/health`, `/v1/models`,
//! `/kv_event_sources`, `/reset_prefix_cache`, `/sim/*`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, StatusCode, header};

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
    pub fn model(&self, requested: Option<&str>) -> Result<String, String> {
        match requested {
            None => Ok(self.names.first().cloned().unwrap_or_default()),
            Some(m) if self.names.iter().any(|n| n == m) => Ok(m.to_owned()),
            Some(m) => Err(format!("The model `{m}` does not exist.")),
        }
    }

    /// Checks lengths as vLLM does; returns the tokens to generate.
    pub fn max_tokens(&self, prompt_len: usize, requested: Option<u64>) -> Result<u32, String> {
        let max = self.max_model_len as usize;
        if prompt_len == 0 {
            return Err("The prompt is empty.".into());
        }
        if prompt_len >= max {
            return Err(format!(
                "This model's maximum context length is {max} tokens. However, your request has \
                 {prompt_len} input tokens. Please reduce the length of the input messages."
            ));
        }
        match requested {
            None => Ok((max - prompt_len) as u32),
            Some(0) => Err("max_tokens must be at least 1, got 0.".into()),
            // Compared without adding, so that a huge `n` cannot wrap around and pass.
            Some(n) if n > (max - prompt_len) as u64 => Err(format!(
                "This model's maximum context length is {max} tokens. However, you requested \
                 {} tokens ({prompt_len} in the messages, {n} in the completion). Please reduce \
                 the length of the messages or completion.",
                (prompt_len as u128) + u128::from(n)
            )),
            Some(n) => u32::try_from(n).map_err(|_| format!("max_tokens {n} is too large")),
        }
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
    let param = param.map_or_else(|| "null".to_owned(), js);
    json_response(
        status,
        format!(
            "{{\"error\":{{\"message\":{},\"type\":\"{typ}\",\"param\":{param},\"code\":{}}}}}",
            js(message),
            status.as_u16()
        ),
    )
}

/// The server's routes.
pub fn router(state: St) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/tokenize", post(openai::tokenize))
        .route("/metrics", get(metrics_text::metrics))
        .route("/kv_event_sources", get(kv_event_sources))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/sim/faults", get(get_faults).post(set_faults))
        .route("/sim/restart_publisher", post(restart_publisher))
        .route("/sim/cache", get(cached_blocks))
        .fallback(not_found)
        .with_state(state)
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn not_found() -> Response {
    json_response(StatusCode::NOT_FOUND, "{\"detail\":\"Not Found\"}".into())
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
