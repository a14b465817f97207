//! `kinference.handler.v1.Handler`: decisions for proxies that forward requests themselves.

use std::sync::Arc;

use axum::http::StatusCode;
use kinf_router::usage::TokenUsage;

use super::handler_v1::handler_server::Handler;
use super::handler_v1::{
    DecideRequest, DecideResponse, Header, Reject, ReportRequest, ReportResponse, Route,
    decide_response,
};
use super::pending::{Pending, PendingDecision};
use super::{api_for_path, count_request, error_body, not_ready_error, request_headers};
use crate::gateway::Gateway;
use crate::gateway::errors::{Api, ApiError};
use crate::gateway::forward::{self, ResponseObservation};

/// The `Handler` service.
#[derive(Debug)]
pub struct HandlerService {
    gw: Arc<Gateway>,
    pending: Arc<Pending>,
}

impl HandlerService {
    /// The service on `gw`, keeping decisions awaiting their report in `pending`.
    pub fn new(gw: Arc<Gateway>, pending: Arc<Pending>) -> Self {
        HandlerService { gw, pending }
    }

    /// Decides one request (the body of `Decide`).
    pub async fn decide_request(&self, req: DecideRequest) -> DecideResponse {
        let mut who = crate::accounting::Who::default();
        let outcome = match api_for_path(&req.path) {
            None => reject(
                &ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_path",
                    format!(
                        "`{}` is not an inference path; expected /v1/chat/completions, /v1/completions or /v1/messages",
                        req.path
                    ),
                ),
                // The error shape the HTTP gateway gives that path (Anthropic's under
                // `/v1/messages/`).
                crate::listen::api_of_path(&req.path),
            ),
            Some(api) => match self.route(api, req, &mut who).await {
                Ok(r) => decide_response::Outcome::Route(r),
                Err(e) => {
                    count_request(&self.gw, api, e.status.as_u16(), e.code, &who);
                    reject(&e, api)
                }
            },
        };
        DecideResponse {
            outcome: Some(outcome),
        }
    }

    async fn route(
        &self,
        api: Api,
        req: DecideRequest,
        who: &mut crate::accounting::Who,
    ) -> Result<Route, ApiError> {
        let rt = self.gw.runtime().ok_or_else(not_ready_error)?;
        let headers = request_headers(
            req.headers
                .iter()
                .map(|h| (h.name.as_str(), h.value.as_bytes())),
        )?;
        let mut admitted =
            forward::admit_async(&self.gw, &rt, api, &headers, req.body.into()).await?;
        who.admitted(&admitted);
        // Decisions never reported hold their tenant's stream slots and concurrency until they
        // expire: let the expired ones go before this one counts them.
        self.pending.expire();
        let forward::Planned {
            chosen,
            reservation,
            stream_slot,
        } = forward::limit_and_plan(&self.gw, &rt, &headers, &mut admitted).await?;
        who.routed(&chosen);
        let body = forward::upstream_body(&admitted, &chosen);
        count_request(&self.gw, api, 200, "routed", who);
        let response_headers = reservation
            .iter()
            .flat_map(|r| r.headers().pairs())
            .map(|(name, value)| Header {
                name: name.to_owned(),
                value,
            })
            .collect();
        let decision_id = self.pending.insert(PendingDecision {
            api,
            chosen: chosen.clone(),
            reservation,
            stream_slot,
            streamed: admitted.parsed.stream,
        });
        Ok(Route {
            endpoint: chosen.endpoint.to_string(),
            body: body.to_vec(),
            headers_to_set: chosen
                .headers
                .iter()
                .map(|(n, v)| Header {
                    name: n.clone(),
                    value: v.clone(),
                })
                .collect(),
            model: chosen.model.to_string(),
            rule: chosen.rule.clone(),
            decision_id,
            destination: format!("{}/{}", chosen.namespace, chosen.destination),
            usage_injected: admitted.inject_usage,
            response_headers,
        })
    }

    /// Learns from a reported outcome (the body of `Report`).
    #[allow(clippy::result_large_err)]
    pub fn report_outcome(&self, req: &ReportRequest) -> Result<(), tonic::Status> {
        if req.decision_id.is_empty() {
            return Err(tonic::Status::invalid_argument("decision_id is required"));
        }
        // Checked before the decision is taken: a refused report can be sent again, fixed.
        let longest_share = longest_share(req)?;
        let status = u16::try_from(req.status)
            .ok()
            .filter(|s| *s == 0 || (100..=599).contains(s))
            .ok_or_else(|| {
                tonic::Status::invalid_argument(format!(
                    "status {} is not an HTTP status (100–599, or 0 for no response)",
                    req.status
                ))
            })?;
        // Times are durations: a negative or non-finite one is a bug of the caller, refused by
        // name (the decision stays pending) rather than learned from or silently dropped.
        let ttft = seconds("ttft_seconds", req.ttft_seconds)?;
        let mean_itl = seconds("mean_itl_seconds", req.mean_itl_seconds)?;
        let duration = seconds("duration_seconds", Some(req.duration_seconds))?.unwrap_or(0.0);
        if let Some(t) = ttft
            && t > duration
        {
            return Err(tonic::Status::invalid_argument(format!(
                "ttft_seconds ({t}) exceeds duration_seconds ({duration}): the first token \
                 cannot come after the response ended (duration_seconds is required with \
                 ttft_seconds)"
            )));
        }
        let Some(p) = self.pending.take(&req.decision_id) else {
            return Err(tonic::Status::not_found(format!(
                "no pending decision `{}` (never made, already reported, or expired)",
                shortened(&req.decision_id)
            )));
        };
        // Only a streamed response has a first token and gaps between tokens (grpc.md,
        // metrics.md): a non-streamed one's `ttft_seconds` is the time to its whole body, which
        // would teach the endpoint's TTFT model, the TTFT and prefill metrics and TPOT a
        // decode time of zero. Ignored for it, as the HTTP gateway never measures one.
        let (ttft, mean_itl) = if p.streamed {
            (ttft, mean_itl)
        } else {
            (None, None)
        };
        let obs = ResponseObservation {
            status,
            // The caller measured both from when it sent the request on.
            ttft_s: ttft,
            upstream_ttft_s: ttft,
            mean_itl_s: mean_itl,
            usage: req.usage.map(|u| {
                TokenUsage::from_openai(u.prompt_tokens, u.cached_tokens, u.completion_tokens)
            }),
            completed: req.completed,
            duration_s: duration,
            token_events: 0,
            longest_share,
            // What the caller reports is the response it passed on.
            client_gone: false,
        };
        forward::report(&self.gw, p.api, &p.chosen, &obs);
        // Settled with the reported usage; without it, what was generated is unknown and the
        // whole estimate stays charged (the reservation is dropped: concurrency given back).
        if obs.usage.is_some() {
            forward::settle_reservation(p.reservation, &p.chosen, &obs);
        }
        Ok(())
    }
}

/// A reported time in seconds: finite and not negative, else `INVALID_ARGUMENT` naming
/// `field`.
#[allow(clippy::result_large_err)]
fn seconds(field: &str, value: Option<f64>) -> Result<Option<f64>, tonic::Status> {
    match value {
        Some(v) if !v.is_finite() || v < 0.0 => Err(tonic::Status::invalid_argument(format!(
            "{field} is {v}: expected a finite number of seconds, 0 or more"
        ))),
        // `-0.0` is 0.
        v => Ok(v.map(|v| v.max(0.0))),
    }
}

/// `id` as quoted in an error: at most 64 characters (the status message goes back in a
/// header; a decision id is 24).
fn shortened(id: &str) -> String {
    const MAX: usize = 64;
    match id.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &id[..cut]),
        None => id.to_owned(),
    }
}

/// The longest choice's share of the output tokens (`longest_choice_tokens` over
/// `usage.completion_tokens`); 1 when unset or without output.
#[allow(clippy::result_large_err)]
fn longest_share(req: &ReportRequest) -> Result<f64, tonic::Status> {
    let Some(longest) = req.longest_choice_tokens else {
        return Ok(1.0);
    };
    let Some(usage) = req.usage else {
        return Err(tonic::Status::invalid_argument(
            "longest_choice_tokens needs usage (its share of usage.completion_tokens)",
        ));
    };
    if longest == 0 && usage.completion_tokens > 0 {
        return Err(tonic::Status::invalid_argument(format!(
            "longest_choice_tokens is 0 while usage.completion_tokens is {}: the longest \
             choice has at least one of them",
            usage.completion_tokens
        )));
    }
    if longest > usage.completion_tokens {
        return Err(tonic::Status::invalid_argument(format!(
            "longest_choice_tokens ({longest}) exceeds usage.completion_tokens ({})",
            usage.completion_tokens
        )));
    }
    Ok(match usage.completion_tokens {
        0 => 1.0,
        all => longest as f64 / all as f64,
    })
}

fn reject(e: &ApiError, api: Api) -> decide_response::Outcome {
    let mut headers = vec![Header {
        name: "content-type".into(),
        value: "application/json".into(),
    }];
    if let Some(s) = e.retry_after_s {
        headers.push(Header {
            name: "retry-after".into(),
            value: s.to_string(),
        });
    }
    // A rate limit's `x-ratelimit-*` headers, as the HTTP gateway sends them.
    for (k, v) in e.extra.iter().flat_map(|x| x.headers.iter()) {
        headers.push(Header {
            name: (*k).to_string(),
            value: v.clone(),
        });
    }
    decide_response::Outcome::Reject(Reject {
        http_status: u32::from(e.status.as_u16()),
        body: error_body(e, api),
        headers,
        code: e.code.to_string(),
    })
}

#[tonic::async_trait]
impl Handler for HandlerService {
    async fn decide(
        &self,
        request: tonic::Request<DecideRequest>,
    ) -> Result<tonic::Response<DecideResponse>, tonic::Status> {
        Ok(tonic::Response::new(
            self.decide_request(request.into_inner()).await,
        ))
    }

    async fn report(
        &self,
        request: tonic::Request<ReportRequest>,
    ) -> Result<tonic::Response<ReportResponse>, tonic::Status> {
        self.report_outcome(request.get_ref())?;
        Ok(tonic::Response::new(ReportResponse {}))
    }
}
