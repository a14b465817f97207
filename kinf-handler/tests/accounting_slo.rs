//! Service objectives and per-tenant accounting on paths where the gateway sees less than the
//! whole response: Envoy's ext_proc without response bodies (`response_body_mode` `NONE`, or
//! an Envoy that sends no `protocol_config`). An ext_proc request is counted once in
//! `kinference_requests_total`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kinf_handler::accounting::SloSet;
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::grpc::ext_proc_v3::external_processor_client::ExternalProcessorClient;
use kinf_handler::grpc::ext_proc_v3::processing_request::Request as Req;
use kinf_handler::grpc::ext_proc_v3::{HttpBody, HttpHeaders, ProcessingRequest};
use kinf_handler::grpc::proto::envoy::config::core::v3::{HeaderMap, HeaderValue};
use serde_json::json;

/// The gateway (for its metrics) with the model-aliases policy, and its gRPC URL.
async fn start_gateway() -> (Arc<Gateway>, String) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../testdata/policies/model-aliases");
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.clone(),
        ..GatewayOptions::default()
    });
    let sources = kinf_handler::config_dir::read_dir(&dir).unwrap();
    gw.apply(&sources);
    assert!(gw.runtime().is_some(), "the policy applies");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kinf_handler::grpc::serve_grpc(Arc::clone(&gw), listener));
    (gw, format!("http://{addr}"))
}

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn headers(list: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: list.iter().map(|(k, v)| hv(k, v)).collect(),
        }),
        end_of_stream,
    }
}

/// One exchange as an Envoy that sends no response body: the request, the response headers
/// (`status`), then the stream closes (the HTTP exchange is over).
async fn exchange_without_response_body(url: String, status: &str, stream: bool) {
    let mut c = ExternalProcessorClient::connect(url).await.unwrap();
    let body = serde_json::to_vec(&json!({
        "model": "glm", "stream": stream, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello there"}]
    }))
    .unwrap();
    let msgs = [
        Req::RequestHeaders(headers(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gateway.example"),
                ("content-type", "application/json"),
            ],
            false,
        )),
        Req::RequestBody(HttpBody {
            body,
            end_of_stream: true,
        }),
        Req::ResponseHeaders(headers(
            &[(":status", status), ("content-type", "text/event-stream")],
            false,
        )),
    ];
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut inbound = c
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for m in msgs {
        tx.send(ProcessingRequest {
            request: Some(m),
            ..Default::default()
        })
        .await
        .unwrap();
        // One answer per message in these (non-duplex) modes.
        tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    // Envoy closes the stream when the HTTP exchange is over.
    drop(tx);
    let end = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .unwrap();
    assert!(matches!(end, Ok(None)), "{end:?}");
}

/// Waits until `name{labels}` is `want` (an exchange is reported when its stream closes).
async fn wait_for(gw: &Gateway, name: &str, labels: &[(&str, &str)], want: f64) {
    for _ in 0..500 {
        if gw.metrics.value(name, labels) == Some(want) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut text = String::new();
    gw.metrics.render(&mut text);
    panic!("{name}{labels:?} never reached {want}:\n{text}");
}

const TENANT: [(&str, &str); 4] = [
    ("tenant", "anonymous"),
    ("model", "glm"),
    ("destination", "glm-worker"),
    ("destination_namespace", "inference"),
];

/// Without the response body, only the status and the duration are known: a 2xx is not
/// "incomplete", it counts for `e2e` objectives by its duration, and for no `ttft` objective
/// (no first-token time can be seen).
#[tokio::test]
async fn ext_proc_without_response_bodies_does_not_count_every_response_as_failed() {
    let (gw, url) = start_gateway().await;
    gw.metrics.set_slos(
        SloSet::from_yaml(
            "- {name: first, metric: ttft, quantile: 0.9, threshold: 1m}\n- {name: whole, metric: e2e, quantile: 0.9, threshold: 1m}\n",
        )
        .unwrap(),
    );
    exchange_without_response_body(url.clone(), "200", true).await;
    exchange_without_response_body(url.clone(), "200", false).await;
    let mut completed = TENANT.to_vec();
    completed.extend([("outcome", "completed"), ("code", "200")]);
    wait_for(&gw, "kinference_tenant_requests_total", &completed, 2.0).await;
    // Each request is counted once among the requests received: at its decision.
    let requests = |code: &str| {
        gw.metrics.value(
            "kinference_requests_total",
            &[("api", "chat"), ("status", "200"), ("code", code)],
        )
    };
    assert_eq!((requests("routed"), requests("ok")), (Some(2.0), None));
    let mut incomplete = TENANT.to_vec();
    incomplete.extend([("outcome", "incomplete"), ("code", "200")]);
    assert_eq!(
        gw.metrics
            .value("kinference_tenant_requests_total", &incomplete),
        None
    );
    let slo = |name: &str, slo: &'static str| {
        gw.metrics.value(
            name,
            &[("slo", slo), ("tenant", "anonymous"), ("model", "glm")],
        )
    };
    assert_eq!(slo("kinference_slo_requests_total", "whole"), Some(2.0));
    assert_eq!(slo("kinference_slo_good_total", "whole"), Some(2.0));
    assert_eq!(slo("kinference_slo_requests_total", "first"), None);
    // A 5xx is the service's failure, whatever was seen of its body.
    exchange_without_response_body(url, "503", true).await;
    let mut failed = TENANT.to_vec();
    failed.extend([("outcome", "upstream_error"), ("code", "503")]);
    wait_for(&gw, "kinference_tenant_requests_total", &failed, 1.0).await;
    assert_eq!(slo("kinference_slo_requests_total", "whole"), Some(3.0));
    assert_eq!(slo("kinference_slo_good_total", "whole"), Some(2.0));
    assert_eq!(slo("kinference_slo_requests_total", "first"), Some(1.0));
    assert_eq!(slo("kinference_slo_good_total", "first"), Some(0.0));
}

/// An exchange whose response never starts (the client goes away while the worker has the
/// request; Envoy resets the ext_proc stream) is accounted to its tenant as the HTTP gateway
/// accounts a client that left: incomplete, `client_closed_request`, its prompt's tokens
/// charged as an estimate. Before, nothing was accounted for it.
#[tokio::test]
async fn ext_proc_exchange_without_a_response_is_accounted_to_its_tenant() {
    let (gw, url) = start_gateway().await;
    let mut c = ExternalProcessorClient::connect(url).await.unwrap();
    let body = serde_json::to_vec(&json!({
        "model": "glm", "stream": true, "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello there"}]
    }))
    .unwrap();
    let msgs = [
        Req::RequestHeaders(headers(
            &[
                (":method", "POST"),
                (":path", "/v1/chat/completions"),
                (":authority", "gateway.example"),
                ("content-type", "application/json"),
            ],
            false,
        )),
        Req::RequestBody(HttpBody {
            body,
            end_of_stream: true,
        }),
    ];
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut inbound = c
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for m in msgs {
        tx.send(ProcessingRequest {
            request: Some(m),
            ..Default::default()
        })
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    // Routed (the body's answer came back); the stream now ends without response headers.
    drop(tx);
    drop(inbound);
    let mut gone = TENANT.to_vec();
    gone.extend([("outcome", "incomplete"), ("code", "client_closed_request")]);
    wait_for(&gw, "kinference_tenant_requests_total", &gone, 1.0).await;
    let tokens = |kind: &'static str| {
        let mut labels = TENANT.to_vec();
        labels.push(("kind", kind));
        gw.metrics
            .value("kinference_tenant_tokens_total", &labels)
            .unwrap_or(0.0)
    };
    let prompt = tokens("uncached_prompt") + tokens("cached_prompt");
    assert!(prompt > 0.0, "the prompt is charged as an estimate");
    // Counted once among the requests received, at its decision.
    assert_eq!(
        gw.metrics.value(
            "kinference_requests_total",
            &[("api", "chat"), ("status", "200"), ("code", "routed")]
        ),
        Some(1.0)
    );
}
