//! `POST /v1/messages/count_tokens` (Anthropic): how many input tokens a Messages request
//! would have, counted by a worker that serves the model it would go to.
//!
//! The body is admitted as a `/v1/messages` request would be (identity, front door, body
//! limit, validation, classification) and decided without being routed: nothing is claimed or
//! counted in flight, no rate limit is charged, and no output is generated. A local route sends
//! the body, `model` set to the route's model (and `max_tokens` to 1, which vLLM ignores), to
//! the endpoint's `/v1/messages/count_tokens` (vLLM 0.32 answers `{"input_tokens": N, ...}`
//! after its chat template), and passes the answer on. A route to a provider is answered by
//! the gateway's own count of the prompt, marked `x-kinference-count: estimate`. A request the policy refuses gets the refusal it would get
//! as a Messages request.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::{Map, Value};

use super::errors::{Api, ApiError};
use super::forward::{self, Chosen, SendError};
use super::{Gateway, host, not_ready};

/// The path, here and on the workers.
pub const PATH: &str = "/v1/messages/count_tokens";

/// Label of these requests in `kinference_requests_total`.
pub const LABEL: &str = "count_tokens";

/// Largest answer read from a worker (an answer is a few dozen bytes).
const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Answers one `count_tokens` request (see the module docs), counted in
/// `kinference_requests_total{api="count_tokens"}`.
pub async fn handle(gw: Arc<Gateway>, headers: HeaderMap, body: Body) -> Response {
    let Some(rt) = gw.runtime() else {
        gw.metrics.count_request(LABEL, 503, "not_ready");
        return not_ready(Api::Messages);
    };
    match count(&gw, &rt, &headers, body).await {
        Ok((resp, code)) => {
            gw.metrics
                .count_request(LABEL, resp.status().as_u16(), code);
            resp
        }
        Err(e) => {
            gw.metrics.count_request(LABEL, e.status.as_u16(), e.code);
            e.into_response_for(Api::Messages)
        }
    }
}

async fn count(
    gw: &Arc<Gateway>,
    rt: &Arc<super::runtime::Runtime>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Response, &'static str), ApiError> {
    let door = rt.door_for(host(headers))?;
    let bytes = forward::read_body(
        headers,
        body,
        door.max_body_bytes,
        gw.options.body_read_timeout,
    )
    .await?;
    // A count has no `max_tokens` (vLLM ignores one); the Messages validation requires one:
    // 1, whatever the client sent. A body that is not a JSON object goes to the validation as
    // it is, for its error.
    // The worker gets the same object, `model` set to the route's.
    let mut object = serde_json::from_slice::<Map<String, Value>>(&bytes).ok();
    let as_messages = match &mut object {
        Some(o) => {
            o.insert("max_tokens".into(), Value::from(1));
            Bytes::from(serde_json::to_vec(o).map_err(internal)?)
        }
        None => bytes,
    };
    let mut admitted = forward::admit_async(gw, rt, Api::Messages, headers, as_messages).await?;
    // Counting needs room for the prompt only: vLLM counts a prompt that fills the context.
    if admitted.request.required_context.is_some() {
        admitted.request.required_context = Some(admitted.request.prompt_tokens);
    }
    let mut chosen = forward::plan_without_routing(gw, &admitted)?;
    if chosen.provider.is_some() {
        return Ok((estimate(&admitted, &chosen)?, "ok"));
    }
    let mut upstream = object.unwrap_or_default();
    let mut retried = false;
    let answer = loop {
        upstream.insert("model".into(), Value::from(chosen.model.to_string()));
        let body = Bytes::from(serde_json::to_vec(&upstream).map_err(internal)?);
        match forward::send_to(gw, PATH, headers, &chosen, body).await {
            Ok(a) => break a,
            // Nothing reached the worker: mark it down (health checks bring it back) and
            // decide again once, as for any request.
            Err(e @ SendError::Connect(_)) => {
                forward::mark_unready(gw, &chosen);
                if retried {
                    return Err(e.to_api_error(&chosen));
                }
                retried = true;
                chosen = forward::plan_without_routing(gw, &admitted)?;
                if chosen.provider.is_some() {
                    return Ok((estimate(&admitted, &chosen)?, "ok"));
                }
            }
            Err(e) => return Err(e.to_api_error(&chosen)),
        }
    };
    let status = answer.status();
    let read = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER_BYTES).collect();
    let body = match tokio::time::timeout(gw.options.upstream_timeout, read).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(e)) => return Err(SendError::Other(e.to_string()).to_api_error(&chosen)),
        Err(_) => return Err(SendError::Timeout.to_api_error(&chosen)),
    };
    if status.is_success() {
        return Ok((json_response(status, body, &chosen)?, "ok"));
    }
    // A worker's error in Anthropic's shape (vLLM answers some in OpenAI's, or FastAPI's).
    let body = forward::anthropic_error_body(Api::Messages, status, &body).unwrap_or(body);
    Ok((json_response(status, body, &chosen)?, "upstream_status"))
}

/// The gateway's own count of the prompt, for a route to a provider.
fn estimate(admitted: &forward::Admitted, chosen: &Chosen) -> Result<Response, ApiError> {
    let body = serde_json::json!({ "input_tokens": admitted.request.prompt_tokens });
    let mut resp = json_response(StatusCode::OK, body.to_string().into(), chosen)?;
    resp.headers_mut().insert(
        HeaderName::from_static("x-kinference-count"),
        HeaderValue::from_static("estimate"),
    );
    Ok(resp)
}

/// A JSON answer with the route's `x-kinference-*` headers.
fn json_response(status: StatusCode, body: Bytes, chosen: &Chosen) -> Result<Response, ApiError> {
    let b = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json");
    forward::with_route_headers(b, chosen)
        .body(Body::from(body))
        .map_err(internal)
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}
