//! Tenants' limits over gRPC, as on the HTTP gateway: token and concurrency limits and
//! `maxConcurrentStreamsPerTenant` refuse a `Decide` (429 `Reject` with the rate-limit headers)
//! and an ext_proc exchange (429 `ImmediateResponse`). A decision holds its reservation until
//! its `Report` (settled with the reported usage), or until it expires; one that nothing can
//! serve gives it back at once. Routed requests carry the tenant's `x-ratelimit-*` headers for the
//! client, in `Route.response_headers` and in ext_proc's response-header mutation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::grpc::ext_proc_v3::external_processor_client::ExternalProcessorClient;
use kinf_handler::grpc::ext_proc_v3::processing_request::Request as Req;
use kinf_handler::grpc::ext_proc_v3::processing_response::Response as Resp;
use kinf_handler::grpc::ext_proc_v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use kinf_handler::grpc::handler::HandlerService;
use kinf_handler::grpc::handler_v1::{
    DecideRequest, Header, ReportRequest, Usage, decide_response,
};
use kinf_handler::grpc::pending::Pending;
use kinf_handler::grpc::proto::envoy::config::core::v3::{HeaderMap, HeaderValue};
use serde_json::json;

/// One worker set; tenants named by `x-tenant`. `acme` may spend 200 tokens a minute, `solo`
/// has one request in flight at a time, and every tenant one streamed response.
const CONFIG: &str = r#"
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: tiny, namespace: t }
spec:
  endpoints: ["10.0.0.1:8000"]
  models: [ { name: tiny-llama } ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: pool, namespace: t }
spec:
  destinations: [ { kind: InferenceWorkerSet, name: tiny } ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: { name: gw, namespace: t }
spec:
  pool: pool
  tenants: { trustedHeader: x-tenant }
  limits: { maxConcurrentStreamsPerTenant: 1 }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: p, namespace: t }
spec:
  rules:
  - name: local
    route:
      select: [ { type: Local, minimize: PredictedTTFT } ]
  limits:
  - name: acme-budget
    matches: { tenant: acme }
    tokensPerMinute: 200
  - name: solo-one-at-a-time
    matches: { tenant: solo }
    concurrentRequests: 1
"#;

fn gateway(tag: &str) -> Arc<Gateway> {
    let dir = support::temp_dir(tag);
    std::fs::write(dir.join("c.yaml"), CONFIG).unwrap();
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.clone(),
        ..GatewayOptions::default()
    });
    gw.apply(&kinf_handler::config_dir::read_dir(&dir).unwrap());
    assert!(gw.runtime().is_some(), "{:?}", gw.store.last_rejected());
    gw
}

fn body(model: &str, stream: bool) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 40,
        "stream": stream,
    }))
    .unwrap()
}

fn decide(tenant: &str, body: Vec<u8>) -> DecideRequest {
    DecideRequest {
        path: "/v1/chat/completions".into(),
        headers: vec![Header {
            name: "x-tenant".into(),
            value: tenant.into(),
        }],
        body,
    }
}

enum Outcome {
    Routed(String),
    Refused(u32, String, Vec<(String, String)>),
}

async fn run(svc: &HandlerService, req: DecideRequest) -> Outcome {
    match svc.decide_request(req).await.outcome {
        Some(decide_response::Outcome::Route(r)) => Outcome::Routed(r.decision_id),
        Some(decide_response::Outcome::Reject(r)) => Outcome::Refused(
            r.http_status,
            r.code,
            r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
        ),
        None => panic!("no outcome"),
    }
}

fn routed(o: Outcome) -> String {
    match o {
        Outcome::Routed(id) => id,
        Outcome::Refused(s, c, _) => panic!("refused: {s} {c}"),
    }
}

fn refused(o: Outcome) -> (u32, String, Vec<(String, String)>) {
    match o {
        Outcome::Refused(s, c, h) => (s, c, h),
        Outcome::Routed(_) => panic!("routed, expected a refusal"),
    }
}

fn report(id: &str, completion_tokens: u64) -> ReportRequest {
    ReportRequest {
        decision_id: id.into(),
        status: 200,
        usage: Some(Usage {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens,
        }),
        completed: true,
        duration_seconds: 0.1,
        ..Default::default()
    }
}

#[tokio::test]
async fn decide_spends_the_token_budget_and_a_report_settles_it() {
    let svc = HandlerService::new(gateway("grpc-tokens"), Arc::new(Pending::default()));
    // Decisions nothing can serve give their whole estimate back: ten of them (each would
    // reserve about 50 of the 200 tokens) leave the budget whole.
    for _ in 0..10 {
        let (status, code, _) =
            refused(run(&svc, decide("acme", body("no-such-model", false))).await);
        assert_eq!((status, code.as_str()), (404, "model_not_found"));
    }
    // Each decision reserves its prompt plus 40 tokens out of 200.
    let mut ids = Vec::new();
    let refusal = loop {
        match run(&svc, decide("acme", body("tiny-llama", false))).await {
            Outcome::Routed(id) => ids.push(id),
            o => break refused(o),
        }
        assert!(ids.len() < 10, "acme was never limited over gRPC");
    };
    assert!(!ids.is_empty());
    let (status, code, headers) = refusal;
    assert_eq!((status, code.as_str()), (429, "rate_limit_exceeded"));
    let h = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(h("x-ratelimit-limit-tokens"), Some("200"), "{headers:?}");
    assert!(h("retry-after").is_some(), "{headers:?}");
    // Another tenant is not held back.
    routed(run(&svc, decide("globex", body("tiny-llama", false))).await);

    // Reported with 1 output token each: the unused estimates come back, and acme is served.
    for id in &ids {
        svc.report_outcome(&report(id, 1)).unwrap();
    }
    routed(run(&svc, decide("acme", body("tiny-llama", false))).await);
}

#[tokio::test]
async fn a_decision_holds_concurrency_until_its_report_or_its_expiry() {
    let pending = Arc::new(Pending::new(Duration::from_millis(300), 100));
    let svc = HandlerService::new(gateway("grpc-concurrency"), pending);
    let first = routed(run(&svc, decide("solo", body("tiny-llama", false))).await);
    let (status, code, _) = refused(run(&svc, decide("solo", body("tiny-llama", false))).await);
    assert_eq!((status, code.as_str()), (429, "rate_limit_exceeded"));
    svc.report_outcome(&report(&first, 3)).unwrap();
    let second = routed(run(&svc, decide("solo", body("tiny-llama", false))).await);

    // A decision that nothing can serve (an unknown model) gives its slot back at once.
    svc.report_outcome(&report(&second, 3)).unwrap();
    let (status, code, _) = refused(run(&svc, decide("solo", body("no-such-model", false))).await);
    assert_eq!((status, code.as_str()), (404, "model_not_found"));
    let _never_reported = routed(run(&svc, decide("solo", body("tiny-llama", false))).await);
    assert!(matches!(
        run(&svc, decide("solo", body("tiny-llama", false))).await,
        Outcome::Refused(429, ..)
    ));
    // Never reported: held until it expires.
    tokio::time::sleep(Duration::from_millis(400)).await;
    routed(run(&svc, decide("solo", body("tiny-llama", false))).await);
}

#[tokio::test]
async fn decide_holds_a_stream_slot_until_the_report() {
    let svc = HandlerService::new(gateway("grpc-streams"), Arc::new(Pending::default()));
    let first = routed(run(&svc, decide("globex", body("tiny-llama", true))).await);
    let (status, code, _) = refused(run(&svc, decide("globex", body("tiny-llama", true))).await);
    assert_eq!((status, code.as_str()), (429, "too_many_streams"));
    // Not streamed, or another tenant: not counted.
    routed(run(&svc, decide("globex", body("tiny-llama", false))).await);
    routed(run(&svc, decide("initech", body("tiny-llama", true))).await);
    svc.report_outcome(&report(&first, 3)).unwrap();
    routed(run(&svc, decide("globex", body("tiny-llama", true))).await);
}

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn request_headers(tenant: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":method", "POST"),
                    hv(":path", "/v1/chat/completions"),
                    hv(":authority", "gateway.example"),
                    hv("content-type", "application/json"),
                    hv("x-tenant", tenant),
                ],
            }),
            end_of_stream: false,
        })),
        ..Default::default()
    }
}

fn request_body(b: Vec<u8>) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::RequestBody(HttpBody {
            body: b,
            end_of_stream: true,
        })),
        ..Default::default()
    }
}

fn response_headers_end() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![hv(":status", "200")],
            }),
            end_of_stream: true,
        })),
        ..Default::default()
    }
}

/// An open ext_proc exchange: send a message, read its response.
struct Exchange {
    tx: tokio::sync::mpsc::Sender<ProcessingRequest>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl Exchange {
    async fn open(url: &str) -> Exchange {
        let mut c = ExternalProcessorClient::connect(url.to_owned())
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let rx = c
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Exchange { tx, rx }
    }

    async fn send(&mut self, m: ProcessingRequest) -> ProcessingResponse {
        self.tx.send(m).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    }

    /// Request headers and body; the response to the body.
    async fn request(&mut self, tenant: &str) -> ProcessingResponse {
        self.send(request_headers(tenant)).await;
        self.send(request_body(body("tiny-llama", false))).await
    }
}

#[tokio::test]
async fn ext_proc_refuses_a_tenant_over_its_concurrency_until_the_response_ends() {
    let gw = gateway("extproc-limits");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(kinf_handler::grpc::serve_grpc(gw, listener));

    let mut first = Exchange::open(&url).await;
    let r = first.request("solo").await;
    assert!(matches!(r.response, Some(Resp::RequestBody(_))), "{r:?}");

    let mut second = Exchange::open(&url).await;
    let r = second.request("solo").await;
    let Some(Resp::ImmediateResponse(imm)) = r.response else {
        panic!("expected a 429 ImmediateResponse, got {r:?}");
    };
    assert_eq!(imm.status.unwrap().code, 429);
    assert_eq!(imm.details, "kinference_rate_limit_exceeded");
    let body: serde_json::Value = serde_json::from_slice(&imm.body).unwrap();
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");

    // The first response ends (headers only): its concurrency is given back.
    first.send(response_headers_end()).await;
    let mut third = Exchange::open(&url).await;
    let r = third.request("solo").await;
    assert!(matches!(r.response, Some(Resp::RequestBody(_))), "{r:?}");
}

/// The `x-ratelimit-*` headers of a response's mutation (name, value).
fn rate_limit_headers(r: &ProcessingResponse) -> Vec<(String, String)> {
    let Some(Resp::ResponseHeaders(h)) = &r.response else {
        panic!("expected a response_headers answer, got {r:?}");
    };
    h.response
        .iter()
        .flat_map(|c| c.header_mutation.iter())
        .flat_map(|m| m.set_headers.iter())
        .filter_map(|o| o.header.as_ref())
        .filter(|h| h.key.starts_with("x-ratelimit-"))
        .map(|h| {
            (
                h.key.clone(),
                String::from_utf8(h.raw_value.clone()).unwrap(),
            )
        })
        .collect()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn a_route_carries_the_tenants_rate_limit_headers_for_the_client() {
    let svc = HandlerService::new(gateway("grpc-ok-headers"), Arc::new(Pending::default()));
    let route = |tenant: &'static str| {
        let svc = &svc;
        async move {
            match svc
                .decide_request(decide(tenant, body("tiny-llama", false)))
                .await
                .outcome
            {
                Some(decide_response::Outcome::Route(r)) => r
                    .response_headers
                    .into_iter()
                    .map(|h| (h.name, h.value))
                    .collect::<Vec<_>>(),
                o => panic!("expected a route, got {o:?}"),
            }
        }
    };
    let first = route("acme").await;
    let second = route("acme").await;
    assert_eq!(header(&first, "x-ratelimit-limit-tokens"), Some("200"));
    assert!(
        header(&first, "x-ratelimit-reset-tokens").is_some(),
        "{first:?}"
    );
    let remaining = |h: &[(String, String)]| -> u64 {
        header(h, "x-ratelimit-remaining-tokens")
            .unwrap()
            .parse()
            .unwrap()
    };
    // Each decision reserves its estimate: what remains falls.
    assert!(
        remaining(&second) < remaining(&first),
        "{first:?} {second:?}"
    );
    assert!(remaining(&first) < 200, "{first:?}");
    // No token or request limit applies to these tenants: no headers.
    assert_eq!(route("globex").await, Vec::new());
    assert_eq!(route("solo").await, Vec::new());
}

#[tokio::test]
async fn ext_proc_adds_the_tenants_rate_limit_headers_to_the_response() {
    let gw = gateway("extproc-ok-headers");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(kinf_handler::grpc::serve_grpc(gw, listener));

    let mut acme = Exchange::open(&url).await;
    let r = acme.request("acme").await;
    assert!(matches!(r.response, Some(Resp::RequestBody(_))), "{r:?}");
    let headers = rate_limit_headers(&acme.send(response_headers_end()).await);
    assert_eq!(header(&headers, "x-ratelimit-limit-tokens"), Some("200"));
    let remaining: u64 = header(&headers, "x-ratelimit-remaining-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!(remaining < 200, "{headers:?}");

    let mut solo = Exchange::open(&url).await;
    solo.request("solo").await;
    assert_eq!(
        rate_limit_headers(&solo.send(response_headers_end()).await),
        Vec::new()
    );
}

/// Response headers with `status`, more (a body) to follow.
fn response_headers(status: u16) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":status", &status.to_string()),
                    hv("content-type", "application/json"),
                ],
            }),
            end_of_stream: false,
        })),
        ..Default::default()
    }
}

/// Through ext_proc with Envoy sending buffered response bodies, tenant `acme` sends a
/// non-streamed request answered with `status` and `answer` (no `usage`), then a second one:
/// the tokens left after the first's reservation and after the second's.
async fn remaining_around(tag: &str, status: u16, answer: serde_json::Value) -> (i64, i64) {
    let gw = gateway(tag);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(kinf_handler::grpc::serve_grpc(gw, listener));
    let left = |r: &ProcessingResponse| -> i64 {
        header(&rate_limit_headers(r), "x-ratelimit-remaining-tokens")
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut first = Exchange::open(&url).await;
    let mut h = request_headers("acme");
    h.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: 2,
        response_body_mode: 2,
        send_body_without_waiting_for_header_response: false,
    });
    first.send(h).await;
    first.send(request_body(body("tiny-llama", false))).await;
    let after_first = left(&first.send(response_headers(status)).await);
    first
        .send(ProcessingRequest {
            request: Some(Req::ResponseBody(HttpBody {
                body: serde_json::to_vec(&answer).unwrap(),
                end_of_stream: true,
            })),
            ..Default::default()
        })
        .await;
    let mut second = Exchange::open(&url).await;
    second.request("acme").await;
    let after_second = left(&second.send(response_headers_end()).await);
    (after_first, after_second)
}

/// A whole answer without `usage` may have generated up to `max_tokens` (40): its estimate
/// stays charged, so the second request finds the first's whole reservation still spent. A
/// worker's 400 generated nothing: only the first's prompt stays charged.
#[tokio::test]
async fn ext_proc_keeps_the_estimate_of_an_answer_without_usage_and_settles_a_4xx_as_its_prompt() {
    let answer = json!({"id": "x", "object": "chat.completion", "model": "tiny-llama",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}]});
    let (first, second) = remaining_around("extproc-no-usage", 200, answer).await;
    // The second reserved its prompt and 40 more, and nothing of the first came back (a few
    // tokens may have refilled meanwhile).
    assert!(
        first - second >= 40,
        "{first} → {second}: the first's max_tokens came back"
    );
    let error = json!({"object": "error", "message": "too long", "type": "BadRequestError",
                       "param": null, "code": 400});
    let (first, second) = remaining_around("extproc-4xx", 400, error).await;
    // The first's 40 output tokens came back, and the second reserved about as much as the
    // first had: what is spent is little more than the first's prompt.
    assert!(
        first - second < 40,
        "{first} → {second}: the 4xx stayed charged as output"
    );
}
