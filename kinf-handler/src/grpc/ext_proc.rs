//! `envoy.service.ext_proc.v3.ExternalProcessor`: the Gateway API Inference Extension's
//! endpoint-picker protocol, so Envoy (or any gateway speaking it) can route through
//! Kinference's decisions while forwarding the bytes itself.
//!
//! Per stream (one HTTP exchange):
//! 1. `request_headers`: remembered. A `POST` to an inference API without a body
//!    (`end_of_stream`) is refused (400 naming `body`, as the HTTP gateway answers an empty
//!    body); other requests without a body, or for a path that is not an inference API, pass
//!    through untouched. Otherwise an empty
//!    `HeadersResponse` is sent (in `FULL_DUPLEX_STREAMED` request-body mode, nothing is
//!    sent until the body is complete).
//! 2. `request_body` chunks are collected until `end_of_stream`; earlier chunks are answered
//!    with `clear_body` (STREAMED mode), the last one with the decision.
//! 3. The decision ([`forward::admit_async`] and [`forward::plan`]): a route answers with a
//!    `BodyResponse` whose `CommonResponse` sets `x-gateway-destination-endpoint: host:port`,
//!    the `x-kinference-*` headers and `content-length`, clears the route cache and replaces the
//!    body with the rewritten one (in `FULL_DUPLEX_STREAMED` mode: a `HeadersResponse` with the
//!    headers, then a `BodyResponse` with a `streamed_response`). A rejection answers with an
//!    `ImmediateResponse` carrying the API-shaped error.
//! 4. `response_headers` / `response_body` pass through; when Envoy sends response bodies,
//!    first-token time, inter-token gaps and usage are observed and reported
//!    ([`forward::report`]) at `end_of_stream`, or when the stream closes.
//!
//! A message out of this order (anything before `request_headers`, `request_headers` twice, a
//! `request_body` after the request's `end_of_stream`, `response_headers` twice, a
//! `response_body` after the response's `end_of_stream`) ends the stream with
//! `FAILED_PRECONDITION`; a message with no `request` set, or one that does not decode, with
//! `INVALID_ARGUMENT`. A message over [`super::decode_limit`] is answered with the 413
//! `ImmediateResponse` while a request body is being collected, `RESOURCE_EXHAUSTED` otherwise.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::ext_proc_v3::external_processor_server::ExternalProcessor;
use super::ext_proc_v3::processing_request::Request as Req;
use super::ext_proc_v3::processing_response::Response as Resp;
use super::ext_proc_v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody,
    HttpHeaders, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    body_mutation, common_response,
};
use super::proto::envoy::config::core::v3::{HeaderValue, HeaderValueOption, header_value_option};
use super::proto::envoy::r#type::v3::HttpStatus;
use super::{
    api_for_path, count_request, error_body, not_ready_error, request_headers, uninject_usage,
};
use crate::gateway::Gateway;
use crate::gateway::errors::{Api, ApiError};
use crate::gateway::forward::{self, Chosen, ResponseObservation};
use crate::gateway::sse_tap::{SseTap, body_usage};

/// The header carrying the chosen endpoint (`host:port`), as in the Gateway API Inference
/// Extension.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// `BodySendMode` values of Envoy's `ProcessingMode`.
mod body_mode {
    pub const STREAMED: i32 = 1;
    pub const BUFFERED: i32 = 2;
    pub const BUFFERED_PARTIAL: i32 = 3;
    pub const FULL_DUPLEX_STREAMED: i32 = 4;
    /// The largest value Envoy defines (`GRPC`).
    pub const MAX_KNOWN: i32 = 5;
}

/// Largest non-streamed response body kept to read its usage.
const MAX_RESPONSE_BODY: usize = 8 << 20;

/// The external processor.
#[derive(Debug)]
pub struct ExtProcService {
    gw: Arc<Gateway>,
}

impl ExtProcService {
    /// The processor on `gw`.
    pub fn new(gw: Arc<Gateway>) -> Self {
        ExtProcService { gw }
    }
}

type ProcessStream =
    Pin<Box<dyn futures_util::Stream<Item = Result<ProcessingResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for ExtProcService {
    type ProcessStream = ProcessStream;

    async fn process(
        &self,
        request: tonic::Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Self::ProcessStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel::<Result<ProcessingResponse, tonic::Status>>(16);
        let gw = self.gw.clone();
        tokio::spawn(async move {
            let mut ex = Exchange::new(gw);
            // Every way out of the loop reaches `finish`: Envoy gone, the stream refused, or
            // its end.
            'messages: while let Some(msg) = inbound.next().await {
                let result = match msg {
                    Ok(m) => ex.on_message(m).await,
                    Err(e) => Err(ex.on_stream_error(e)),
                };
                match result {
                    Ok(out) => {
                        for r in out {
                            if tx.send(Ok(r)).await.is_err() {
                                break 'messages;
                            }
                        }
                    }
                    // The 413 answers the request; nothing more can be read.
                    Err(Ended::Answered(r)) => {
                        if !ex.observability {
                            let _ = tx.send(Ok(r)).await;
                        }
                        break;
                    }
                    Err(Ended::Failed(status)) => {
                        tracing::warn!(
                            code = ?status.code(),
                            reason = status.message(),
                            "ext_proc stream refused"
                        );
                        let _ = tx.send(Err(status)).await;
                        break;
                    }
                }
            }
            ex.finish();
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// A routed request, waiting for its response.
struct Routed {
    api: Api,
    chosen: Chosen,
    started: Instant,
    sent_at: Instant,
    stream: bool,
    strip_usage: bool,
    tap: SseTap,
    status: u16,
    response_seen: bool,
    body: Vec<u8>,
    reported: bool,
    /// The rate-limit reservation, settled when the response is reported; dropped with the
    /// exchange otherwise (concurrency given back, the estimate kept charged).
    reservation: Option<crate::tenants::Reservation>,
    /// The tenant's stream slot (a streamed request), held until the response is reported.
    stream_slot: Option<crate::gateway::streams::StreamSlot>,
}

/// What [`Exchange::decide`] decided.
struct Decided {
    chosen: Chosen,
    /// The body to send upstream.
    body: Bytes,
    /// Whether the response's usage chunk must be removed (it was injected).
    strip_usage: bool,
    /// Whether the request streams.
    stream: bool,
    reservation: Option<crate::tenants::Reservation>,
    stream_slot: Option<crate::gateway::streams::StreamSlot>,
}

/// How a stream ends early.
enum Ended {
    /// With this last response (a 413 for a message too large to read), then status OK.
    Answered(ProcessingResponse),
    /// With this error status (logged).
    Failed(tonic::Status),
}

/// Where the request side of an exchange is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing received: `request_headers` must come first.
    Start,
    /// Collecting an inference request's body.
    Body,
    /// Passing a non-inference request's body through.
    PassBody,
    /// The request ended (decided, passed through, or without a body).
    Done,
    /// Rejected with an `ImmediateResponse`: request body chunks Envoy sent before it saw the
    /// answer are dropped unanswered.
    Rejected,
}

/// The state of one ext_proc stream (one HTTP exchange).
struct Exchange {
    gw: Arc<Gateway>,
    started: Instant,
    request_mode: i32,
    response_mode: i32,
    observability: bool,
    phase: Phase,
    response_headers_seen: bool,
    response_ended: bool,
    /// The body limit of the request's front door, found once its headers are known.
    body_limit: usize,
    headers: Vec<(String, Vec<u8>)>,
    api: Option<Api>,
    body: Vec<u8>,
    routed: Option<Routed>,
}

impl Exchange {
    fn new(gw: Arc<Gateway>) -> Self {
        Exchange {
            gw,
            started: Instant::now(),
            request_mode: body_mode::BUFFERED,
            response_mode: 0,
            observability: false,
            phase: Phase::Start,
            response_headers_seen: false,
            response_ended: false,
            body_limit: crate::gateway::runtime::DEFAULT_MAX_BODY_BYTES,
            headers: Vec::new(),
            api: None,
            body: Vec::new(),
            routed: None,
        }
    }

    fn duplex_request(&self) -> bool {
        self.request_mode == body_mode::FULL_DUPLEX_STREAMED
    }

    fn duplex_response(&self) -> bool {
        self.response_mode == body_mode::FULL_DUPLEX_STREAMED
    }

    /// Whether Envoy will send response bodies (so an injected usage chunk can be removed).
    fn sees_response_body(&self) -> bool {
        matches!(
            self.response_mode,
            body_mode::STREAMED
                | body_mode::BUFFERED
                | body_mode::BUFFERED_PARTIAL
                | body_mode::FULL_DUPLEX_STREAMED
        )
    }

    /// Handles one message; returns the responses to send (none in observability mode), or
    /// how the stream ends.
    async fn on_message(
        &mut self,
        msg: ProcessingRequest,
    ) -> Result<Vec<ProcessingResponse>, Ended> {
        if let Some(pc) = msg.protocol_config {
            self.request_mode = known_mode("request_body_mode", pc.request_body_mode);
            self.response_mode = known_mode("response_body_mode", pc.response_body_mode);
        }
        self.observability = msg.observability_mode;
        let Some(req) = msg.request else {
            return Err(Ended::Failed(tonic::Status::invalid_argument(
                "ProcessingRequest has no `request` set (expected one of request_headers, \
                 request_body, request_trailers, response_headers, response_body, \
                 response_trailers)",
            )));
        };
        self.check_order(&req)?;
        let out = match req {
            Req::RequestHeaders(h) => self.on_request_headers(h),
            Req::RequestBody(b) => self.on_request_body(b).await,
            Req::ResponseHeaders(h) => self.on_response_headers(&h),
            Req::ResponseBody(b) => self.on_response_body(b),
            Req::RequestTrailers(_) => vec![resp(Resp::RequestTrailers(Default::default()))],
            Req::ResponseTrailers(_) => vec![resp(Resp::ResponseTrailers(Default::default()))],
        };
        Ok(if self.observability { Vec::new() } else { out })
    }

    /// Refuses a message that is out of the documented order.
    fn check_order(&self, req: &Req) -> Result<(), Ended> {
        let got = match req {
            Req::RequestHeaders(_) => "request_headers",
            Req::RequestBody(_) => "request_body",
            Req::RequestTrailers(_) => "request_trailers",
            Req::ResponseHeaders(_) => "response_headers",
            Req::ResponseBody(_) => "response_body",
            Req::ResponseTrailers(_) => "response_trailers",
        };
        let why = match (req, self.phase) {
            (Req::RequestHeaders(_), Phase::Start) => None,
            (_, Phase::Start) => Some("before request_headers"),
            (Req::RequestHeaders(_), _) => Some("a second time"),
            (Req::RequestBody(_), Phase::Done) => Some("after the request's end_of_stream"),
            (Req::ResponseHeaders(_), _) if self.response_headers_seen || self.response_ended => {
                Some("a second time, or after the response body")
            }
            (Req::ResponseBody(_), _) if self.response_ended => {
                Some("after the response's end_of_stream")
            }
            _ => None,
        };
        match why {
            None => Ok(()),
            Some(why) => Err(Ended::Failed(tonic::Status::failed_precondition(format!(
                "ext_proc message out of order: {got} {why}; expected {}",
                self.expected()
            )))),
        }
    }

    /// The messages expected next, for error messages.
    fn expected(&self) -> &'static str {
        match self.phase {
            Phase::Start => "request_headers first",
            Phase::Body | Phase::PassBody => "request_body chunks until end_of_stream",
            Phase::Done | Phase::Rejected if self.response_ended => {
                "response_trailers or the end of the stream"
            }
            Phase::Done | Phase::Rejected if self.response_headers_seen => {
                "response_body or trailers"
            }
            Phase::Done | Phase::Rejected => "response_headers, response_body or trailers",
        }
    }

    /// The status to end the stream with after `inbound` failed; a message over the decoding
    /// limit while the request body is collected is the 413 Envoy can show the client.
    fn on_stream_error(&mut self, e: tonic::Status) -> Ended {
        // tonic refuses a message over `max_decoding_message_size` with OUT_OF_RANGE.
        if e.code() != tonic::Code::OutOfRange {
            return Ended::Failed(e);
        }
        if self.phase == Phase::Body
            && let Some(api) = self.api
        {
            tracing::warn!(
                reason = e.message(),
                "ext_proc request body over the limit: 413"
            );
            return Ended::Answered(self.too_large(api, self.body_limit));
        }
        Ended::Failed(tonic::Status::resource_exhausted(e.message().to_owned()))
    }

    /// The 413 `ImmediateResponse` for a body over `limit`; the request is over.
    fn too_large(&mut self, api: Api, limit: usize) -> ProcessingResponse {
        self.phase = Phase::Rejected;
        self.body = Vec::new();
        let e = forward::too_large(limit);
        count_request(
            &self.gw,
            api,
            e.status.as_u16(),
            e.code,
            &Default::default(),
        );
        immediate(&e, api)
    }

    /// The body limit of the front door the request (its headers received) came to.
    fn door_body_limit(&self) -> usize {
        let Some(rt) = self.gw.runtime() else {
            return crate::gateway::runtime::DEFAULT_MAX_BODY_BYTES;
        };
        let host = self
            .headers
            .iter()
            .find(|(k, _)| k == "host")
            .or_else(|| self.headers.iter().find(|(k, _)| k == ":authority"))
            .and_then(|(_, v)| std::str::from_utf8(v).ok());
        rt.door(host).max_body_bytes
    }

    fn on_request_headers(&mut self, h: HttpHeaders) -> Vec<ProcessingResponse> {
        self.started = Instant::now();
        self.headers = h
            .headers
            .map(|m| m.headers)
            .unwrap_or_default()
            .into_iter()
            .map(|hv| {
                let v = if hv.raw_value.is_empty() {
                    hv.value.into_bytes()
                } else {
                    hv.raw_value
                };
                (hv.key.to_ascii_lowercase(), v)
            })
            .collect();
        let path = self
            .headers
            .iter()
            .find(|(k, _)| k == ":path")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        let method_post = self
            .headers
            .iter()
            .any(|(k, v)| k == ":method" && v.as_slice() == b"POST");
        if h.end_of_stream
            && method_post
            && let Some(api) = api_for_path(&path)
        {
            // An inference request without a body: refused as the HTTP gateway refuses an
            // empty body (400 naming `body`), rather than passed through undecided.
            let e = match crate::gateway::parse::parse(api, b"") {
                Err(e) => e,
                Ok(_) => ApiError::invalid("body", "the request has no body"),
            };
            self.phase = Phase::Rejected;
            count_request(
                &self.gw,
                api,
                e.status.as_u16(),
                e.code,
                &crate::accounting::Who::default(),
            );
            return vec![immediate(&e, api)];
        }
        self.api = if h.end_of_stream {
            None
        } else {
            api_for_path(&path)
        };
        self.phase = match (h.end_of_stream, self.api) {
            (true, _) => Phase::Done,
            (false, Some(_)) => Phase::Body,
            (false, None) => Phase::PassBody,
        };
        if self.phase == Phase::Body {
            self.body_limit = self.door_body_limit();
        }
        if self.api.is_some() && self.duplex_request() {
            // The headers are answered once the body is complete, with the decision.
            return Vec::new();
        }
        vec![resp(Resp::RequestHeaders(HeadersResponse::default()))]
    }

    async fn on_request_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        if self.phase == Phase::Rejected {
            return Vec::new();
        }
        let Some(api) = self.api.filter(|_| self.phase == Phase::Body) else {
            if b.end_of_stream {
                self.phase = Phase::Done;
            }
            return vec![self.pass_request_body(b)];
        };
        if self.body.len().saturating_add(b.body.len()) > self.body_limit {
            // Answered at once: the rest of the body is not collected.
            return vec![self.too_large(api, self.body_limit)];
        }
        self.body.extend_from_slice(&b.body);
        if !b.end_of_stream {
            if self.duplex_request() {
                return Vec::new();
            }
            // STREAMED mode: hold the chunk back; the whole new body goes with the last one.
            return vec![resp(Resp::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::ClearBody(true)),
                    }),
                    ..Default::default()
                }),
            }))];
        }
        self.phase = Phase::Done;
        let body = std::mem::take(&mut self.body);
        let mut who = crate::accounting::Who::default();
        match self.decide(api, body, &mut who).await {
            Ok(Decided {
                chosen,
                body: new_body,
                strip_usage,
                stream,
                reservation,
                stream_slot,
            }) => {
                let mut set = vec![
                    set_header(DESTINATION_HEADER, chosen.endpoint.as_bytes()),
                    set_header("content-length", new_body.len().to_string().as_bytes()),
                ];
                for (n, v) in &chosen.headers {
                    set.push(set_header(n, v.as_bytes()));
                }
                let mutation = HeaderMutation {
                    set_headers: set,
                    remove_headers: Vec::new(),
                };
                let out = if self.duplex_request() {
                    vec![
                        resp(Resp::RequestHeaders(HeadersResponse {
                            response: Some(CommonResponse {
                                header_mutation: Some(mutation),
                                clear_route_cache: true,
                                ..Default::default()
                            }),
                        })),
                        resp(Resp::RequestBody(BodyResponse {
                            response: Some(CommonResponse {
                                body_mutation: Some(BodyMutation {
                                    mutation: Some(body_mutation::Mutation::StreamedResponse(
                                        StreamedBodyResponse {
                                            body: new_body.to_vec(),
                                            end_of_stream: true,
                                        },
                                    )),
                                }),
                                ..Default::default()
                            }),
                        })),
                    ]
                } else {
                    vec![resp(Resp::RequestBody(BodyResponse {
                        response: Some(CommonResponse {
                            status: common_response::ResponseStatus::Continue as i32,
                            header_mutation: Some(mutation),
                            body_mutation: Some(BodyMutation {
                                mutation: Some(body_mutation::Mutation::Body(new_body.to_vec())),
                            }),
                            clear_route_cache: true,
                        }),
                    }))]
                };
                let now = Instant::now();
                self.routed = Some(Routed {
                    api,
                    chosen,
                    started: self.started,
                    sent_at: now,
                    stream,
                    strip_usage,
                    tap: SseTap::new(api, strip_usage),
                    status: 0,
                    response_seen: false,
                    body: Vec::new(),
                    reported: false,
                    reservation,
                    stream_slot,
                });
                out
            }
            Err(e) => {
                self.phase = Phase::Rejected;
                count_request(&self.gw, api, e.status.as_u16(), e.code, &who);
                vec![immediate(&e, api)]
            }
        }
    }

    /// Admission, the tenant's limits and the decision.
    async fn decide(
        &self,
        api: Api,
        body: Vec<u8>,
        who: &mut crate::accounting::Who,
    ) -> Result<Decided, ApiError> {
        let rt = self.gw.runtime().ok_or_else(not_ready_error)?;
        let headers = request_headers(self.headers.iter().map(|(k, v)| (k.as_str(), &v[..])))?;
        let mut admitted = forward::admit_async(&self.gw, &rt, api, &headers, body.into()).await?;
        who.admitted(&admitted);
        let forward::Planned {
            chosen,
            reservation,
            stream_slot,
        } = forward::limit_and_plan(&self.gw, &rt, &headers, &mut admitted).await?;
        who.routed(&chosen);
        let strip = admitted.inject_usage && self.sees_response_body();
        if admitted.inject_usage && !strip {
            // The response will not be seen: do not add a chunk the client did not ask for.
            uninject_usage(&mut admitted.parsed.body);
        }
        let body = forward::upstream_body(&admitted, &chosen);
        count_request(&self.gw, api, 200, "routed", who);
        Ok(Decided {
            chosen,
            body,
            strip_usage: strip,
            stream: admitted.parsed.stream,
            reservation,
            stream_slot,
        })
    }

    fn pass_request_body(&self, b: HttpBody) -> ProcessingResponse {
        if self.duplex_request() {
            // Full duplex: every chunk must be echoed back.
            return resp(Resp::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(
                            StreamedBodyResponse {
                                body: b.body,
                                end_of_stream: b.end_of_stream,
                            },
                        )),
                    }),
                    ..Default::default()
                }),
            }));
        }
        resp(Resp::RequestBody(BodyResponse::default()))
    }

    fn on_response_headers(&mut self, h: &HttpHeaders) -> Vec<ProcessingResponse> {
        // The tenant's `x-ratelimit-*` headers, as the HTTP gateway adds them to every response
        // (before a response without a body settles the reservation).
        let set_headers: Vec<_> = self
            .routed
            .iter()
            .flat_map(|r| r.reservation.iter())
            .flat_map(|r| r.headers().pairs())
            .map(|(n, v)| set_header(n, v.as_bytes()))
            .collect();
        self.response_headers_seen = true;
        self.response_ended |= h.end_of_stream;
        if let Some(r) = &mut self.routed {
            r.response_seen = true;
            r.status = h
                .headers
                .as_ref()
                .and_then(|m| m.headers.iter().find(|hv| hv.key == ":status"))
                .and_then(|hv| {
                    let v = if hv.raw_value.is_empty() {
                        hv.value.as_bytes()
                    } else {
                        &hv.raw_value[..]
                    };
                    std::str::from_utf8(v).ok()?.parse().ok()
                })
                .unwrap_or(0);
            // Counted in `kinference_requests_total` once, at its decision (`routed`); the
            // response is accounted when it is reported.
            if h.end_of_stream {
                self.report(false);
            }
        }
        // The body changes size when the usage chunk is removed: drop content-length.
        let strip = self
            .routed
            .as_ref()
            .is_some_and(|r| r.strip_usage && r.stream);
        let remove_headers = if strip {
            vec!["content-length".into()]
        } else {
            Vec::new()
        };
        let response = (!set_headers.is_empty() || strip).then(|| CommonResponse {
            header_mutation: Some(HeaderMutation {
                set_headers,
                remove_headers,
            }),
            ..Default::default()
        });
        vec![resp(Resp::ResponseHeaders(HeadersResponse { response }))]
    }

    fn on_response_body(&mut self, b: HttpBody) -> Vec<ProcessingResponse> {
        self.response_ended |= b.end_of_stream;
        let duplex = self.duplex_response();
        let now = Instant::now();
        let mut replace: Option<Vec<u8>> = None;
        if let Some(r) = &mut self.routed {
            if r.stream {
                let mut out = r.tap.feed(&b.body, now).to_vec();
                if b.end_of_stream {
                    out.extend_from_slice(&r.tap.finish());
                }
                if r.strip_usage {
                    replace = Some(out);
                }
            } else if r.body.len() + b.body.len() <= MAX_RESPONSE_BODY {
                r.body.extend_from_slice(&b.body);
            }
        }
        if b.end_of_stream {
            self.report(true);
        }
        let body = if duplex {
            Some(body_mutation::Mutation::StreamedResponse(
                StreamedBodyResponse {
                    body: replace.unwrap_or(b.body),
                    end_of_stream: b.end_of_stream,
                },
            ))
        } else {
            replace.map(body_mutation::Mutation::Body)
        };
        vec![resp(Resp::ResponseBody(BodyResponse {
            response: body.map(|m| CommonResponse {
                body_mutation: Some(BodyMutation { mutation: Some(m) }),
                ..Default::default()
            }),
        }))]
    }

    /// Reports the routed request's outcome once.
    fn report(&mut self, ended: bool) {
        let body_seen = self.sees_response_body();
        let Some(r) = &mut self.routed else {
            return;
        };
        if r.reported || !r.response_seen {
            return;
        }
        r.reported = true;
        if !body_seen {
            // Envoy does not send response bodies: only the status and the duration are
            // known, and nothing says the response was cut short. Taken as complete, or every
            // such response would count as incomplete and fail every objective.
            r.tap.observed.completed = true;
        } else if !r.stream {
            r.tap.observed.usage = body_usage(r.api, &r.body);
            r.tap.observed.completed = ended;
        }
        let obs = ResponseObservation::from_tap(r.status, &r.tap.observed, r.sent_at, r.started);
        forward::report(&self.gw, r.api, &r.chosen, &obs);
        // As over HTTP: settled with the usage; without it, a stream with the tokens seen and a
        // worker's whole 4xx answer with the prompt alone. Otherwise (Envoy does not send the
        // response body, a whole answer without usage or cut short) what was generated is
        // unknown and the whole estimate stays charged (dropped: concurrency given back).
        let reservation = r.reservation.take();
        if body_seen {
            let known = forward::output_known(r.stream, r.status, ended);
            forward::settle_or_keep_reservation(reservation, &r.chosen, &obs, known);
        }
        r.stream_slot = None;
    }

    /// The stream closed: report what was seen. A routed request whose response never
    /// started (the client went away, or the proxy ended the exchange without passing a
    /// response through) is reported as the HTTP gateway reports a client that left while the
    /// upstream had the request: status 499, incomplete, its usage estimated from the prompt,
    /// so that its tenant is accounted for it. Its rate-limit reservation is dropped
    /// (concurrency given back, the whole estimate kept charged).
    fn finish(&mut self) {
        if let Some(r) = &mut self.routed
            && !r.response_seen
            && !r.reported
        {
            r.reported = true;
            let obs = ResponseObservation {
                status: crate::accounting::CLIENT_CLOSED_STATUS,
                completed: false,
                duration_s: r.started.elapsed().as_secs_f64(),
                client_gone: true,
                ..ResponseObservation::default()
            };
            forward::report(&self.gw, r.api, &r.chosen, &obs);
            drop(r.reservation.take());
            r.stream_slot = None;
            return;
        }
        self.report(false);
    }
}

/// `mode` if Envoy defines it; otherwise a warning, and 0 (`NONE`: for the request body the
/// same as `BUFFERED` here, which is what an unknown value always meant).
fn known_mode(field: &str, mode: i32) -> i32 {
    if (0..=body_mode::MAX_KNOWN).contains(&mode) {
        return mode;
    }
    tracing::warn!(
        field,
        mode,
        "ext_proc: unknown body send mode, treated as NONE"
    );
    0
}

fn resp(r: Resp) -> ProcessingResponse {
    ProcessingResponse { response: Some(r) }
}

fn set_header(name: &str, value: &[u8]) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_string(),
            value: String::new(),
            raw_value: value.to_vec(),
        }),
        append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        keep_empty_value: false,
    }
}

fn immediate(e: &ApiError, api: Api) -> ProcessingResponse {
    let mut set = vec![set_header("content-type", b"application/json")];
    if let Some(s) = e.retry_after_s {
        set.push(set_header("retry-after", s.to_string().as_bytes()));
    }
    // A rate limit's `x-ratelimit-*` headers, as the HTTP gateway sends them.
    for (k, v) in e.extra.iter().flat_map(|x| x.headers.iter()) {
        set.push(set_header(k, v.as_bytes()));
    }
    resp(Resp::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(e.status.as_u16()),
        }),
        headers: Some(HeaderMutation {
            set_headers: set,
            remove_headers: Vec::new(),
        }),
        body: error_body(e, api),
        details: format!("kinference_{}", e.code),
    }))
}
