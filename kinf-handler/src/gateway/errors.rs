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

    /// The Anthropic `error.type` for this status.
    fn anthropic_type(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 405 | 408 | 422 | 431 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        }
    }

    /// The JSON body in `api`'s shape.
    pub fn body(&self, api: Api) -> serde_json::Value {
        match api {
            Api::Messages => json!({
                "type": "error",
                "error": { "type": self.anthropic_type(), "message": self.message },
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

#[cfg(test)]
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
}
