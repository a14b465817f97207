//! Errors in the caller's API shape: the OpenAI error object for `/v1/chat/completions` and
//! `/v1/completions`, the Anthropic error object for `/v1/messages`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Which API a request came in on; decides the shape of errors and streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic).
    Messages,
}

impl Api {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Completions => "/v1/completions",
            Api::Messages => "/v1/messages",
        }
    }

    /// Label used in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Api::Chat => "chat",
            Api::Completions => "completions",
            Api::Messages => "messages",
        }
    }
}

/// An error to send to the client.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Machine-readable code (`invalid_request`, `model_not_found`, `policy_rejected`, ...).
    pub code: &'static str,
    /// What went wrong, in the caller's terms.
    pub message: String,
    /// The request field at fault, when there is one (`messages[2].content`).
    pub param: Option<String>,
    /// Seconds to wait before retrying (429, 503).
    pub retry_after_s: Option<u64>,
    /// Rarely needed details (rate limits), boxed to keep the error small.
    pub extra: Option<Box<ErrorExtra>>,
}

/// Details of an [`ApiError`] that only some errors carry.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorExtra {
    /// More response headers (`x-ratelimit-*`).
    pub headers: Vec<(&'static str, String)>,
    /// The OpenAI `error.type` when it is not the status's default (rate limits say which
    /// budget ran out: `tokens`, `requests`, `concurrency`, as OpenAI does).
    pub openai_type: Option<&'static str>,
}

impl ApiError {
    /// An error with no field and no retry hint.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            param: None,
            retry_after_s: None,
            extra: None,
        }
    }

    /// A 400 naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
        }
    }

    /// The OpenAI `error.type` for this status.
    fn openai_type(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 404 | 405 | 408 | 413 | 422 | 431 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            _ => "api_error",
        }
    }

    /// The JSON body in `api`'s shape.
    pub fn body(&self, api: Api) -> serde_json::Value {
        match api {
            Api::Messages => json!({
                "type": "error",
                "error": { "type": anthropic_type(self.status), "message": self.message },
            }),
            Api::Chat | Api::Completions => json!({
                "error": {
                    "message": self.message,
                    "type": self
                        .extra
                        .as_ref()
                        .and_then(|x| x.openai_type)
                        .unwrap_or_else(|| self.openai_type()),
                    "param": self.param,
                    "code": self.code,
                }
            }),
        }
    }

    /// One SSE event carrying this error, for a stream that fails after bytes have flowed.
    pub fn sse_event(&self, api: Api) -> String {
        match api {
            Api::Messages => format!("event: error\ndata: {}\n\n", self.body(api)),
            Api::Chat | Api::Completions => {
                format!("data: {}\n\ndata: [DONE]\n\n", self.body(api))
            }
        }
    }

    /// The HTTP response in `api`'s shape.
    pub fn into_response_for(self, api: Api) -> Response {
        let mut resp = (self.status, axum::Json(self.body(api))).into_response();
        if let Some(s) = self.retry_after_s {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        for (k, v) in self.extra.iter().flat_map(|x| x.headers.iter()) {
            if let Ok(v) = HeaderValue::try_from(v.as_str()) {
                resp.headers_mut().insert(*k, v);
            }
        }
        resp
    }
}

/// The Anthropic `error.type` for an HTTP status, as Anthropic documents them: 400
/// `invalid_request_error` (also the other client errors about the request: 405, 408, 409,
/// 422, 431, and any 4xx not listed), 401 `authentication_error`, 402 `billing_error`, 403
/// `permission_error`, 404 `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`,
/// 504 `timeout_error`, 529 `overloaded_error`, other 5xx `api_error`. 503 is
/// `overloaded_error`: here it says that nothing can serve the request right now (no policy
/// yet, no endpoint ready, a worker's own 503 for a retryable failure), a temporary condition
/// to retry later, which is what `overloaded_error` tells a client; `api_error` is an
/// unexpected failure.
pub fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        _ => "api_error",
    }
}

/// The `error.type` values of Anthropic's error objects (those its SDKs know, and
/// `request_too_large`, which its API documents for 413).
const ANTHROPIC_TYPES: &[&str] = &[
    "invalid_request_error",
    "authentication_error",
    "billing_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "timeout_error",
    "api_error",
    "overloaded_error",
];

/// Longest message taken from a worker's error body that is not JSON (an HTML page from a
/// proxy, say), in bytes.
const MAX_PLAIN_MESSAGE: usize = 2048;

/// A worker's error response (status 4xx or 5xx) for an Anthropic client: `None` when `body`
/// is already an Anthropic error (`{"type": "error", "error": {"type", "message"}}` with one
/// of Anthropic's types), else that object, with the same `status`'s type
/// ([`anthropic_type`]) and the worker's message kept.
///
/// vLLM 0.32's `/v1/messages` answers its handler's errors (a too-long prompt, an unknown
/// model) in Anthropic's envelope but with its own types (`BadRequestError`, `NotFoundError`,
/// `InternalServerError`, ...), and request-schema and HTTP errors (a missing `max_tokens`, a
/// wrong content type) in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`).
/// The message is taken from `error.message` (both shapes), a string `error`, a top-level
/// `message` (`{"object": "error", ...}`) or `detail` (FastAPI), else the body's text; when
/// the worker named a field (`param`) that the message does not mention, the message names
/// it at its end (Anthropic's error object has no field for it).
pub fn anthropic_error_from_upstream(status: StatusCode, body: &[u8]) -> Option<serde_json::Value> {
    use serde_json::Value;
    let parsed = serde_json::from_slice::<Value>(body).ok();
    let v = parsed.as_ref();
    let error = v.and_then(|v| v.get("error"));
    if v.and_then(|v| v.get("type")).and_then(Value::as_str) == Some("error")
        && error
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|t| ANTHROPIC_TYPES.contains(&t))
        && error
            .and_then(|e| e.get("message"))
            .is_some_and(Value::is_string)
    {
        return None;
    }
    let text = |x: &Value| match x {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let message = error
        .and_then(|e| e.get("message").or_else(|| e.as_str().map(|_| e)))
        .or_else(|| v.and_then(|v| v.get("message")))
        .or_else(|| v.and_then(|v| v.get("detail")))
        .filter(|m| !m.is_null())
        .map(text)
        .or_else(|| {
            let s = String::from_utf8_lossy(body);
            let s = s.trim();
            (!s.is_empty()).then(|| {
                let mut end = s.len().min(MAX_PLAIN_MESSAGE);
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s[..end].to_owned()
            })
        })
        .unwrap_or_else(|| {
            format!(
                "the worker answered {} {}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            )
            .trim_end()
            .to_owned()
        });
    let param = error
        .and_then(|e| e.get("param"))
        .or_else(|| v.and_then(|v| v.get("param")))
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty() && !message.contains(*p));
    let message = match param {
        Some(p) => format!("{message} (param: `{p}`)"),
        None => message,
    };
    Some(ApiError::new(status, "upstream_error", message).body(Api::Messages))
}

/// A worker's `error` event in an Anthropic stream (`{"type": "error", "error": {"type",
/// "message"}}`) as the error to send instead, with Anthropic's type for it
/// ([`ApiError::sse_event`]), when its own type is not one of Anthropic's; `None` to pass it on
/// as it is. vLLM 0.32 sends `internal_error` (Anthropic's `api_error`); the error names vLLM
/// uses for statuses map as those statuses do ([`anthropic_type`]).
pub fn anthropic_stream_error(event: &serde_json::Value) -> Option<ApiError> {
    use serde_json::Value;
    let error = event.get("error");
    let ty = error.and_then(|e| e.get("type")).and_then(Value::as_str);
    if ty.is_some_and(|t| ANTHROPIC_TYPES.contains(&t)) {
        return None;
    }
    let status = match ty {
        Some("BadRequestError" | "Bad Request") => StatusCode::BAD_REQUEST,
        Some("NotFoundError" | "Not Found") => StatusCode::NOT_FOUND,
        Some("ServiceUnavailableError" | "Service Unavailable") => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let message = error
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the worker's stream failed");
    Some(ApiError::new(status, "upstream_error", message))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape_names_the_field() {
        let e = ApiError::invalid("messages[0].role", "`role` is required");
        let b = e.body(Api::Chat);
        assert_eq!(b["error"]["param"], "messages[0].role");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["code"], "invalid_request");
    }

    #[test]
    fn anthropic_shape_has_type_error() {
        let e = ApiError::new(StatusCode::NOT_FOUND, "model_not_found", "no model `x`");
        let b = e.body(Api::Messages);
        assert_eq!(b["type"], "error");
        assert_eq!(b["error"]["type"], "not_found_error");
        assert_eq!(b["error"]["message"], "no model `x`");
    }

    #[test]
    fn stream_error_event_ends_an_openai_stream() {
        let e = ApiError::new(StatusCode::BAD_GATEWAY, "upstream_error", "worker died");
        let s = e.sse_event(Api::Chat);
        assert!(s.starts_with("data: {\"error\""));
        assert!(s.ends_with("data: [DONE]\n\n"));
        assert!(e.sse_event(Api::Messages).starts_with("event: error\n"));
    }

    #[test]
    fn worker_errors_become_anthropic_errors_with_the_statuss_type() {
        let t = |status: u16, body: &str| {
            anthropic_error_from_upstream(StatusCode::from_u16(status).unwrap(), body.as_bytes())
        };
        // vLLM 0.32's handler errors: Anthropic's envelope, its own type.
        let b = t(
            400,
            r#"{"type":"error","error":{"type":"BadRequestError","message":"too long (parameter=input_tokens, value=3000)"}}"#,
        )
        .unwrap();
        assert_eq!(
            b,
            json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": "too long (parameter=input_tokens, value=3000)"}})
        );
        // Its schema errors: OpenAI's shape; a field the message does not name is added.
        let b = t(
            400,
            r#"{"error":{"message":"Field required","type":"Bad Request","param":"body.max_tokens","code":400}}"#,
        )
        .unwrap();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(
            b["error"]["message"],
            "Field required (param: `body.max_tokens`)"
        );
        let b = t(
            404,
            r#"{"object":"error","message":"The model `x` does not exist.","type":"NotFoundError","param":null,"code":404}"#,
        )
        .unwrap();
        assert_eq!(b["error"]["type"], "not_found_error");
        assert_eq!(b["error"]["message"], "The model `x` does not exist.");
        assert_eq!(
            t(422, r#"{"detail":"Unprocessable"}"#).unwrap()["error"]["message"],
            "Unprocessable"
        );
        // Not JSON, or nothing at all.
        let b = t(502, "<html>Bad Gateway</html>\n").unwrap();
        assert_eq!(b["error"]["type"], "api_error");
        assert_eq!(b["error"]["message"], "<html>Bad Gateway</html>");
        let b = t(503, "").unwrap();
        assert_eq!(b["error"]["type"], "overloaded_error");
        assert_eq!(
            b["error"]["message"],
            "the worker answered 503 Service Unavailable"
        );
        // Already Anthropic's: passed on as it is.
        assert_eq!(
            t(
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#
            ),
            None
        );
    }

    #[test]
    fn anthropic_types_follow_anthropics_status_table() {
        for (status, ty) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (409, "invalid_request_error"),
            (413, "request_too_large"),
            (422, "invalid_request_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
            (529, "overloaded_error"),
        ] {
            assert_eq!(
                anthropic_type(StatusCode::from_u16(status).unwrap()),
                ty,
                "{status}"
            );
        }
    }
}
