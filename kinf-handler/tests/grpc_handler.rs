//! The gRPC decision service and the Envoy ext_proc adapter, end to end over a real socket.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::sync::Arc;

use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::grpc::ext_proc_v3::external_processor_client::ExternalProcessorClient;
use kinf_handler::grpc::ext_proc_v3::processing_request::Request as Req;
use kinf_handler::grpc::ext_proc_v3::processing_response::Response as Resp;
use kinf_handler::grpc::ext_proc_v3::{
    CommonResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, body_mutation,
};
use kinf_handler::grpc::handler_v1::handler_client::HandlerClient;
use kinf_handler::grpc::handler_v1::{
    DecideRequest, DecideResponse, Header, ReportRequest, Usage, decide_response,
};
use kinf_handler::grpc::proto::envoy::config::core::v3::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

const QWEN: [&str; 2] = ["10.0.2.1:8000", "10.0.2.2:8000"];
const GLM: [&str; 2] = ["10.0.1.1:8000", "10.0.1.2:8000"];

async fn start() -> String {
    start_gateway().await.1
}

/// The gateway (for its metrics) and the gRPC URL.
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

fn chat(model: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 16
    }))
    .unwrap()
}

/// A streamed chat request for `n` choices.
fn streamed_chat(model: &str, n: u32) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 16,
        "n": n,
        "stream": true
    }))
    .unwrap()
}

fn decide_req(body: Vec<u8>) -> DecideRequest {
    DecideRequest {
        path: "/v1/chat/completions".into(),
        headers: vec![Header {
            name: "content-type".into(),
            value: "application/json".into(),
        }],
        body,
    }
}

#[tokio::test]
async fn decide_routes_an_alias_and_report_finds_it() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let r = c
        .decide(decide_req(chat("qwen")))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Route(route)) = r.outcome else {
        panic!("expected a route, got {r:?}");
    };
    assert!(QWEN.contains(&route.endpoint.as_str()), "{route:?}");
    assert_eq!(route.model, "Qwen/Qwen3.6-27B");
    let body: Value = serde_json::from_slice(&route.body).unwrap();
    assert_eq!(body["model"], "Qwen/Qwen3.6-27B");
    assert_eq!(body["messages"][0]["content"], "hello there");
    assert!(!route.headers_to_set.is_empty());
    assert!(
        route
            .headers_to_set
            .iter()
            .all(|h| h.name.starts_with("x-kinference-")),
        "{:?}",
        route.headers_to_set
    );
    assert!(!route.decision_id.is_empty());
    assert!(!route.rule.is_empty());

    // The abstract name goes to either worker set.
    let r = c
        .decide(decide_req(chat("standard-model")))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Route(r2)) = r.outcome else {
        panic!("expected a route, got {r:?}");
    };
    assert!(QWEN.contains(&r2.endpoint.as_str()) || GLM.contains(&r2.endpoint.as_str()));

    let rep = ReportRequest {
        decision_id: route.decision_id.clone(),
        status: 200,
        ttft_seconds: Some(0.05),
        mean_itl_seconds: Some(0.01),
        usage: Some(Usage {
            prompt_tokens: 10,
            cached_tokens: 2,
            completion_tokens: 5,
        }),
        completed: true,
        duration_seconds: 0.2,
        longest_choice_tokens: None,
    };
    c.report(rep.clone()).await.unwrap();
    // Reported once: a second report is unknown.
    let e = c.report(rep).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let e = c
        .report(ReportRequest {
            decision_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn decide_rejects_unknown_models_and_bad_json() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let r = c
        .decide(decide_req(chat("no-such-model")))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
        panic!("expected a reject, got {r:?}");
    };
    assert_eq!(rej.http_status, 404);
    let body: Value = serde_json::from_slice(&rej.body).unwrap();
    assert_eq!(body["error"]["param"], "model", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error");

    let r = c
        .decide(decide_req(b"{not json".to_vec()))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
        panic!("expected a reject, got {r:?}");
    };
    assert_eq!(rej.http_status, 400);
    let body: Value = serde_json::from_slice(&rej.body).unwrap();
    assert!(body["error"]["message"].is_string(), "{body}");

    // Anthropic shape on /v1/messages.
    let mut req = decide_req(chat("no-such-model"));
    req.path = "/v1/messages".into();
    let r = c.decide(req).await.unwrap().into_inner();
    let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
        panic!("expected a reject, got {r:?}");
    };
    let body: Value = serde_json::from_slice(&rej.body).unwrap();
    assert_eq!(body["type"], "error", "{body}");

    // A path that is no inference path: 404 `unknown_path`, in the shape the HTTP gateway
    // gives it (Anthropic's under `/v1/messages/`; it was always OpenAI's).
    for (path, anthropic) in [
        ("/v1/messages/count_tokens", true),
        ("/v1/embeddings", false),
    ] {
        let mut req = decide_req(chat("qwen"));
        req.path = path.into();
        let r = c.decide(req).await.unwrap().into_inner();
        let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
            panic!("expected a reject, got {r:?}");
        };
        assert_eq!((rej.http_status, rej.code.as_str()), (404, "unknown_path"));
        let body: Value = serde_json::from_slice(&rej.body).unwrap();
        assert_eq!(body["type"] == "error", anthropic, "{path}: {body}");
    }
}

#[tokio::test]
async fn report_refuses_a_status_that_is_no_http_status_and_keeps_the_decision() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let r = c
        .decide(decide_req(chat("qwen")))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Route(route)) = r.outcome else {
        panic!("expected a route, got {r:?}");
    };
    for status in [70_000, 99, 600] {
        let e = c
            .report(ReportRequest {
                decision_id: route.decision_id.clone(),
                status,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{status}: {e:?}");
        assert!(e.message().contains(&status.to_string()), "{e:?}");
    }
    // Still pending: the corrected report is taken.
    c.report(ReportRequest {
        decision_id: route.decision_id,
        status: 200,
        completed: true,
        ..Default::default()
    })
    .await
    .unwrap();
}

fn hv(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn headers_msg(path: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":method", "POST"),
                    hv(":path", path),
                    hv(":authority", "gateway.example"),
                    hv("content-type", "application/json"),
                ],
            }),
            end_of_stream: false,
        })),
        ..Default::default()
    }
}

fn body_msg(b: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Req::RequestBody(HttpBody {
            body: b.to_vec(),
            end_of_stream: eos,
        })),
        ..Default::default()
    }
}

async fn ext_proc(url: String, msgs: Vec<ProcessingRequest>) -> Vec<ProcessingResponse> {
    let mut c = ExternalProcessorClient::connect(url).await.unwrap();
    let n = msgs.len();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut inbound = c
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    for m in msgs {
        tx.send(m).await.unwrap();
        // One response per message (non-duplex modes).
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap();
        match r {
            Some(r) => {
                let stop = matches!(r.response, Some(Resp::ImmediateResponse(_)));
                out.push(r);
                if stop {
                    break;
                }
            }
            None => break,
        }
    }
    drop(tx);
    assert!(out.len() <= n);
    out
}

fn header<'a>(c: &'a CommonResponse, name: &str) -> Option<&'a str> {
    c.header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|o| o.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| std::str::from_utf8(&h.raw_value).unwrap())
}

#[tokio::test]
async fn ext_proc_routes_a_split_body() {
    let url = start().await;
    let body = chat("glm");
    let (a, b) = body.split_at(body.len() / 2);
    let out = ext_proc(
        url,
        vec![
            headers_msg("/v1/chat/completions"),
            body_msg(a, false),
            body_msg(b, true),
        ],
    )
    .await;
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(matches!(out[0].response, Some(Resp::RequestHeaders(_))));
    let Some(Resp::RequestBody(first)) = &out[1].response else {
        panic!("{:?}", out[1]);
    };
    let first = first.response.as_ref().unwrap();
    assert!(matches!(
        first.body_mutation.as_ref().unwrap().mutation,
        Some(body_mutation::Mutation::ClearBody(true))
    ));
    let Some(Resp::RequestBody(last)) = &out[2].response else {
        panic!("{:?}", out[2]);
    };
    let c = last.response.as_ref().unwrap();
    let dest = header(c, "x-gateway-destination-endpoint").unwrap();
    assert!(GLM.contains(&dest), "{dest}");
    assert!(c.clear_route_cache);
    let Some(body_mutation::Mutation::Body(new_body)) = &c.body_mutation.as_ref().unwrap().mutation
    else {
        panic!("{c:?}");
    };
    let v: Value = serde_json::from_slice(new_body).unwrap();
    assert_eq!(v["model"], "zai-org/GLM-5.3");
    assert_eq!(
        header(c, "content-length").unwrap(),
        new_body.len().to_string()
    );
    assert!(
        c.header_mutation
            .as_ref()
            .unwrap()
            .set_headers
            .iter()
            .any(|o| o.header.as_ref().unwrap().key.starts_with("x-kinference-"))
    );
}

#[tokio::test]
async fn ext_proc_rejects_an_unknown_model_immediately() {
    let url = start().await;
    let out = ext_proc(
        url,
        vec![
            headers_msg("/v1/chat/completions"),
            body_msg(&chat("no-such-model"), true),
        ],
    )
    .await;
    let Some(Resp::ImmediateResponse(ir)) = &out[1].response else {
        panic!("{out:?}");
    };
    assert_eq!(ir.status.unwrap().code, 404);
    let v: Value = serde_json::from_slice(&ir.body).unwrap();
    assert_eq!(v["error"]["param"], "model");
}

#[tokio::test]
async fn ext_proc_passes_other_paths_through() {
    let url = start().await;
    let out = ext_proc(url, vec![headers_msg("/v1/models"), body_msg(b"{}", true)]).await;
    assert_eq!(out.len(), 2);
    let Some(Resp::RequestBody(b)) = &out[1].response else {
        panic!("{out:?}");
    };
    assert!(b.response.is_none());
}

#[tokio::test]
async fn ext_proc_refuses_an_inference_post_without_a_body() {
    let url = start().await;
    let mut headers = headers_msg("/v1/chat/completions");
    if let Some(Req::RequestHeaders(h)) = &mut headers.request {
        h.end_of_stream = true;
    }
    let out = ext_proc(url.clone(), vec![headers]).await;
    let imm = immediate_of(&out[0]);
    assert_eq!(imm.status.as_ref().unwrap().code, 400);
    let body: Value = serde_json::from_slice(&imm.body).unwrap();
    assert_eq!(body["error"]["param"], "body", "{body}");
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");

    // Without a body to a path that is no inference path: passed through, as before.
    let mut get = headers_msg("/v1/models");
    if let Some(Req::RequestHeaders(h)) = &mut get.request {
        h.end_of_stream = true;
    }
    let out = ext_proc(url, vec![get]).await;
    assert!(
        matches!(out[0].response, Some(Resp::RequestHeaders(_))),
        "{out:?}"
    );
}

#[tokio::test]
async fn ext_proc_full_duplex_streams_and_strips_the_injected_usage_chunk() {
    use kinf_handler::grpc::ext_proc_v3::ProtocolConfiguration;
    let url = start().await;
    let mut c = ExternalProcessorClient::connect(url).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut inbound = c
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
    };
    let mut h = headers_msg("/v1/chat/completions");
    h.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: 4,
        response_body_mode: 4,
        send_body_without_waiting_for_header_response: false,
    });
    tx.send(h).await.unwrap();
    let body = serde_json::to_vec(&json!({
        "model": "qwen", "stream": true,
        "messages": [{"role": "user", "content": "hi"}]
    }))
    .unwrap();
    tx.send(body_msg(&body, true)).await.unwrap();
    let r = next().await;
    let Some(Resp::RequestHeaders(hr)) = &r.response else {
        panic!("{r:?}");
    };
    let common = hr.response.as_ref().unwrap();
    assert!(QWEN.contains(&header(common, "x-gateway-destination-endpoint").unwrap()));
    let r = next().await;
    let Some(Resp::RequestBody(br)) = &r.response else {
        panic!("{r:?}");
    };
    let Some(body_mutation::Mutation::StreamedResponse(s)) = &br
        .response
        .as_ref()
        .unwrap()
        .body_mutation
        .as_ref()
        .unwrap()
        .mutation
    else {
        panic!("{br:?}");
    };
    assert!(s.end_of_stream);
    let v: Value = serde_json::from_slice(&s.body).unwrap();
    assert_eq!(v["model"], "Qwen/Qwen3.6-27B");
    assert_eq!(v["stream_options"]["include_usage"], true);

    tx.send(ProcessingRequest {
        request: Some(Req::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    hv(":status", "200"),
                    hv("content-type", "text/event-stream"),
                ],
            }),
            end_of_stream: false,
        })),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = next().await;
    assert!(
        matches!(r.response, Some(Resp::ResponseHeaders(_))),
        "{r:?}"
    );
    let sse = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
        "data: [DONE]\n\n",
    );
    let resp_body = ProcessingRequest {
        request: Some(Req::ResponseBody(HttpBody {
            body: sse.as_bytes().to_vec(),
            end_of_stream: true,
        })),
        ..Default::default()
    };
    tx.send(resp_body).await.unwrap();
    let r = next().await;
    let Some(Resp::ResponseBody(br)) = &r.response else {
        panic!("{r:?}");
    };
    let Some(body_mutation::Mutation::StreamedResponse(s)) = &br
        .response
        .as_ref()
        .unwrap()
        .body_mutation
        .as_ref()
        .unwrap()
        .mutation
    else {
        panic!("{br:?}");
    };
    let out = std::str::from_utf8(&s.body).unwrap();
    assert!(out.contains("Hel") && out.contains("[DONE]"), "{out}");
    assert!(!out.contains("usage"), "{out}");
    assert!(s.end_of_stream);
}

/// Sends `msgs` on one ext_proc stream, half-closes it, and reads until it ends: the
/// responses, and the final status (`Ok` when it ended cleanly).
async fn ext_proc_until_end(
    url: String,
    msgs: Vec<ProcessingRequest>,
) -> (Vec<ProcessingResponse>, tonic::Status) {
    let mut c = ExternalProcessorClient::connect(url).await.unwrap();
    let mut inbound = c
        .process(tokio_stream::iter(msgs))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .expect("the stream ends");
        match next {
            Ok(Some(r)) => out.push(r),
            Ok(None) => return (out, tonic::Status::ok("")),
            Err(e) => return (out, e),
        }
    }
}

/// A codec for raw (possibly malformed) protobuf bytes.
#[derive(Clone, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_client(url: String) -> tonic::client::Grpc<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = tonic::client::Grpc::new(ch);
    g.ready().await.unwrap();
    g
}

/// Raw messages on one ext_proc stream: the decoded responses and the final status.
async fn raw_ext_proc(url: String, msgs: Vec<Vec<u8>>) -> (Vec<ProcessingResponse>, tonic::Status) {
    use prost::Message;
    let mut g = raw_client(url).await;
    let mut inbound = g
        .streaming(
            tonic::Request::new(tokio_stream::iter(msgs)),
            http::uri::PathAndQuery::from_static(
                "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
            ),
            Raw,
        )
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), inbound.message())
            .await
            .expect("the stream ends");
        match next {
            Ok(Some(r)) => out.push(ProcessingResponse::decode(&r[..]).unwrap()),
            Ok(None) => return (out, tonic::Status::ok("")),
            Err(e) => return (out, e),
        }
    }
}

fn immediate_of(r: &ProcessingResponse) -> &kinf_handler::grpc::ext_proc_v3::ImmediateResponse {
    match &r.response {
        Some(Resp::ImmediateResponse(ir)) => ir,
        other => panic!("expected an ImmediateResponse, got {other:?}"),
    }
}

/// A chat body padded with `pad` bytes of JSON whitespace (large, but cheap to admit).
fn padded_chat(model: &str, pad: usize) -> Vec<u8> {
    let mut b = chat(model);
    let end = b.pop().unwrap();
    assert_eq!(end, b'}');
    b.resize(b.len() + pad, b' ');
    b.push(b'}');
    b
}

const DEFAULT_MAX_BODY: usize = 32 << 20;

#[tokio::test]
async fn ext_proc_undecodable_message_ends_the_stream_with_invalid_argument() {
    use prost::Message;
    let url = start().await;
    // Valid headers, then a request_body (field 4) whose length runs past the buffer.
    let (out, status) = raw_ext_proc(
        url.clone(),
        vec![
            headers_msg("/v1/chat/completions").encode_to_vec(),
            b"\x22\xff".to_vec(),
        ],
    )
    .await;
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(matches!(out[0].response, Some(Resp::RequestHeaders(_))));
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("ProcessingRequest"), "{status:?}");

    let (out, status) = raw_ext_proc(url, vec![b"\x12\xff\xff".to_vec()]).await;
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn ext_proc_takes_body_chunks_over_4_mib_and_answers_413_over_the_limit() {
    let url = start().await;
    // One chunk over tonic's 4 MiB default decoding limit: routed.
    let (out, status) = ext_proc_until_end(
        url.clone(),
        vec![
            headers_msg("/v1/chat/completions"),
            body_msg(&padded_chat("glm", 5 << 20), true),
        ],
    )
    .await;
    assert!(status.code() == tonic::Code::Ok, "{status:?}");
    let Some(Resp::RequestBody(b)) = &out[1].response else {
        panic!("{:?}", out.get(1).map(|r| &r.response));
    };
    let c = b.response.as_ref().unwrap();
    assert!(GLM.contains(&header(c, "x-gateway-destination-endpoint").unwrap()));

    // Chunks adding up to more than maxBodyBytes: 413 as soon as the limit is passed.
    let chunk = vec![b' '; 8 << 20];
    let mut msgs = vec![headers_msg("/v1/chat/completions")];
    msgs.extend((0..5).map(|_| body_msg(&chunk, false)));
    let (out, status) = ext_proc_until_end(url.clone(), msgs).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    assert_eq!(out.len(), 6, "headers, four chunks held, then the 413");
    let ir = immediate_of(&out[5]);
    assert_eq!(ir.status.unwrap().code, 413);
    assert_eq!(ir.details, "kinference_body_too_large");

    // One chunk over the gRPC decoding limit itself: still the 413.
    let (out, status) = ext_proc_until_end(
        url,
        vec![
            headers_msg("/v1/chat/completions"),
            body_msg(&padded_chat("glm", DEFAULT_MAX_BODY + (2 << 20)), true),
        ],
    )
    .await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    assert_eq!(out.len(), 2, "{out:?}");
    let ir = immediate_of(&out[1]);
    assert_eq!(ir.status.unwrap().code, 413);
    let v: Value = serde_json::from_slice(&ir.body).unwrap();
    assert_eq!(v["error"]["param"], "body", "{v}");
}

#[tokio::test]
async fn decide_takes_bodies_over_4_mib_and_rejects_over_the_limit_with_413() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let r = c
        .decide(decide_req(padded_chat("qwen", 5 << 20)))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Route(route)) = r.outcome else {
        panic!("expected a route, got {:?}", r.outcome.map(|_| ()));
    };
    assert!(
        QWEN.contains(&route.endpoint.as_str()),
        "{}",
        route.endpoint
    );

    let r = c
        .decide(decide_req(padded_chat("qwen", DEFAULT_MAX_BODY)))
        .await
        .unwrap()
        .into_inner();
    let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
        panic!("expected a reject");
    };
    assert_eq!(rej.http_status, 413);
    assert_eq!(rej.code, "body_too_large");
}

#[tokio::test]
async fn ext_proc_refuses_messages_out_of_order() {
    let url = start().await;
    let refused = async |msgs: Vec<ProcessingRequest>, answered: usize, says: &str| {
        let (out, status) = ext_proc_until_end(url.clone(), msgs).await;
        assert_eq!(
            status.code(),
            tonic::Code::FailedPrecondition,
            "{says}: {status:?}"
        );
        assert!(status.message().contains(says), "{status:?}");
        assert_eq!(out.len(), answered, "{out:?}");
    };
    // A second body after end_of_stream would be a second decision.
    refused(
        vec![
            headers_msg("/v1/chat/completions"),
            body_msg(&chat("glm"), true),
            body_msg(&chat("glm"), true),
        ],
        2,
        "request_body after the request's end_of_stream",
    )
    .await;
    refused(
        vec![
            headers_msg("/v1/chat/completions"),
            headers_msg("/v1/chat/completions"),
        ],
        1,
        "request_headers a second time",
    )
    .await;
    refused(
        vec![body_msg(&chat("glm"), true)],
        0,
        "request_body before request_headers; expected request_headers first",
    )
    .await;
    let response_headers = ProcessingRequest {
        request: Some(Req::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![hv(":status", "200")],
            }),
            end_of_stream: false,
        })),
        ..Default::default()
    };
    refused(
        vec![response_headers.clone()],
        0,
        "response_headers before request_headers",
    )
    .await;

    let mut h = headers_msg("/v1/models");
    if let Some(Req::RequestHeaders(hh)) = &mut h.request {
        hh.end_of_stream = true;
    }
    let response_body = |eos| ProcessingRequest {
        request: Some(Req::ResponseBody(HttpBody {
            body: b"{}".to_vec(),
            end_of_stream: eos,
        })),
        ..Default::default()
    };
    refused(
        vec![
            h,
            response_headers.clone(),
            response_body(true),
            response_body(true),
        ],
        3,
        "response_body after the response's end_of_stream; expected response_trailers",
    )
    .await;

    // The documented pass-through cases still work: headers with end_of_stream, then the
    // response and trailers.
    let mut h = headers_msg("/v1/chat/completions");
    if let Some(Req::RequestHeaders(hh)) = &mut h.request {
        hh.end_of_stream = true;
    }
    let trailers = ProcessingRequest {
        request: Some(Req::ResponseTrailers(Default::default())),
        ..Default::default()
    };
    let (out, status) = ext_proc_until_end(url.clone(), vec![h, response_headers, trailers]).await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    assert_eq!(out.len(), 3, "{out:?}");
}

#[tokio::test]
async fn ext_proc_refuses_an_empty_processing_request() {
    let url = start().await;
    let (out, status) = ext_proc_until_end(url, vec![ProcessingRequest::default()]).await;
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("`request`"), "{status:?}");
}

#[tokio::test]
async fn malformed_unary_messages_are_invalid_argument() {
    let url = start().await;
    let mut g = raw_client(url).await;
    // DecideRequest.path (field 1) claims 127 bytes that are not there.
    let e = g
        .unary(
            tonic::Request::new(b"\x0a\x7f/v1".to_vec()),
            http::uri::PathAndQuery::from_static("/kinference.handler.v1.Handler/Decide"),
            Raw,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("DecideRequest.path"), "{e:?}");
    g.ready().await.unwrap();
    // ReportRequest.decision_id (field 1) with a varint wire type.
    let e = g
        .unary(
            tonic::Request::new(b"\x08\xff".to_vec()),
            http::uri::PathAndQuery::from_static("/kinference.handler.v1.Handler/Report"),
            Raw,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("ReportRequest"), "{e:?}");
}

#[tokio::test]
async fn decide_names_the_first_invalid_header() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let mut decide = async |headers: Vec<(&str, String)>| {
        let mut req = decide_req(chat("qwen"));
        req.headers.extend(headers.into_iter().map(|(n, v)| Header {
            name: n.into(),
            value: v,
        }));
        let r = c.decide(req).await.unwrap().into_inner();
        let Some(decide_response::Outcome::Reject(rej)) = r.outcome else {
            panic!("expected a reject, got {r:?}");
        };
        assert_eq!(rej.http_status, 400);
        let v: Value = serde_json::from_slice(&rej.body).unwrap();
        assert_eq!(v["error"]["param"], "headers");
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let m = decide(vec![("bad header", "x".into()), ("x-ok", "a\nb".into())]).await;
    assert!(m.starts_with("2 request header(s)"), "{m}");
    assert!(m.contains("`bad header` is not a valid header name"), "{m}");
    let m = decide(vec![("x-bad", "a\nb".into())]).await;
    assert!(m.contains("`x-bad` has an invalid value"), "{m}");
    assert!(!m.contains("a\nb"), "{m}");
    // A huge name is cut short.
    let long = format!("bad {}", "n".repeat(10_000));
    let m = decide(vec![(long.as_str(), "x".into())]).await;
    assert!(m.len() < 300, "{m}");
    assert!(m.contains("..."), "{m}");
}

#[tokio::test]
async fn ext_proc_rejects_an_invalid_header_like_decide() {
    let url = start().await;
    let mut h = headers_msg("/v1/chat/completions");
    if let Some(Req::RequestHeaders(hh)) = &mut h.request {
        hh.headers
            .as_mut()
            .unwrap()
            .headers
            .push(hv("bad header", "x"));
    }
    let out = ext_proc(url, vec![h, body_msg(&chat("glm"), true)]).await;
    let ir = immediate_of(&out[1]);
    assert_eq!(ir.status.unwrap().code, 400);
    let v: Value = serde_json::from_slice(&ir.body).unwrap();
    assert_eq!(v["error"]["param"], "headers", "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(m.contains("`bad header`"), "{m}");
}

#[tokio::test]
async fn report_without_a_decision_id_is_invalid_argument() {
    let url = start().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let e = c.report(ReportRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert_eq!(e.message(), "decision_id is required");
}

#[tokio::test]
async fn report_with_n_choices_measures_tpot_over_the_longest_choice() {
    let (gw, url) = start_gateway().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let route = |r: DecideResponse| match r.outcome {
        Some(decide_response::Outcome::Route(route)) => route,
        other => panic!("expected a route, got {other:?}"),
    };
    // A streamed request: only a stream has a first token, hence a TPOT.
    let route = route(
        c.decide(decide_req(streamed_chat("qwen", 2)))
            .await
            .unwrap()
            .into_inner(),
    );
    // Two choices, 10 output tokens in all, the longest 5: 0.4 s of decode over 4 gaps.
    let rep = ReportRequest {
        decision_id: route.decision_id.clone(),
        status: 200,
        ttft_seconds: Some(0.1),
        mean_itl_seconds: Some(0.1),
        usage: Some(Usage {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 10,
        }),
        completed: true,
        duration_seconds: 0.5,
        longest_choice_tokens: Some(5),
    };
    // Bad input is refused by name, and the decision is still there to report.
    for (bad, field) in [
        (
            ReportRequest {
                longest_choice_tokens: Some(11),
                ..rep.clone()
            },
            "longest_choice_tokens (11) exceeds usage.completion_tokens (10)",
        ),
        (
            ReportRequest {
                usage: None,
                ..rep.clone()
            },
            "longest_choice_tokens needs usage",
        ),
        (
            ReportRequest {
                longest_choice_tokens: Some(0),
                ..rep.clone()
            },
            "longest_choice_tokens is 0 while usage.completion_tokens is 10",
        ),
    ] {
        let e = c.report(bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(field), "{}", e.message());
    }
    c.report(rep).await.unwrap();
    let tpot = |name: &str| {
        gw.metrics
            .value(name, &[("tenant", "anonymous"), ("model", "qwen")])
            .unwrap()
    };
    assert_eq!(tpot("kinference_tpot_seconds_count"), 1.0);
    let sum = tpot("kinference_tpot_seconds_sum");
    assert!(
        (sum - 0.1).abs() < 1e-9,
        "0.4 s over the longest choice's 4 gaps: {sum}"
    );
}

/// Decides `body` and returns the route's decision id.
async fn decision_id(c: &mut HandlerClient<tonic::transport::Channel>, body: Vec<u8>) -> String {
    match c
        .decide(decide_req(body))
        .await
        .unwrap()
        .into_inner()
        .outcome
    {
        Some(decide_response::Outcome::Route(route)) => route.decision_id,
        other => panic!("expected a route, got {other:?}"),
    }
}

/// Every metric, rendered: what a refused report must leave as it was.
fn rendered(gw: &Gateway) -> String {
    let mut text = String::new();
    gw.metrics.render(&mut text);
    text
}

/// A complete 200 with a first token at 0.1 s, 11 output tokens and 1.1 s in all.
fn full_report(decision_id: &str) -> ReportRequest {
    ReportRequest {
        decision_id: decision_id.to_owned(),
        status: 200,
        ttft_seconds: Some(0.1),
        mean_itl_seconds: Some(0.1),
        usage: Some(Usage {
            prompt_tokens: 10,
            cached_tokens: 0,
            completion_tokens: 11,
        }),
        completed: true,
        duration_seconds: 1.1,
        longest_choice_tokens: None,
    }
}

/// grpc.md: `ttft_seconds` is for streamed responses; metrics.md: TTFT, prefill time and TPOT
/// are measured on streamed responses only, and a non-streamed request has no first-token
/// time. A `Report` that gives a non-streamed request one anyway must not feed them (nor the
/// endpoint's TTFT model, nor the inter-token gaps a non-streamed response does not have); its
/// duration and tokens still count.
#[tokio::test]
async fn report_of_a_non_streamed_request_feeds_no_first_token_metrics() {
    let (gw, url) = start_gateway().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let golden = [("tenant", "anonymous"), ("model", "qwen")];
    let count = |name: &str| gw.metrics.value(name, &golden).unwrap_or(0.0);
    let upstream_ttft = || {
        rendered(&gw)
            .lines()
            .filter(|l| l.starts_with("kinference_upstream_ttft_seconds_count{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };

    let id = decision_id(&mut c, chat("qwen")).await;
    c.report(full_report(&id)).await.unwrap();
    for name in [
        "kinference_ttft_seconds_count",
        "kinference_itl_seconds_count",
        "kinference_tpot_seconds_count",
    ] {
        assert_eq!(count(name), 0.0, "{name} of a non-streamed request");
    }
    assert_eq!(upstream_ttft(), 0.0, "the TTFT model learns nothing");
    let prefill: f64 = rendered(&gw)
        .lines()
        .filter(|l| l.starts_with("kinference_tenant_prefill_seconds_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(prefill, 0.0, "no prefill time without a first token");
    assert_eq!(count("kinference_e2e_latency_seconds_count"), 1.0);
    let decode: f64 = rendered(&gw)
        .lines()
        .filter(|l| l.starts_with("kinference_tenant_decode_seconds_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!((decode - 1.1).abs() < 1e-9, "the whole duration: {decode}");

    // The same report of a streamed request feeds them all.
    let id = decision_id(&mut c, streamed_chat("qwen", 1)).await;
    c.report(full_report(&id)).await.unwrap();
    for name in [
        "kinference_ttft_seconds_count",
        "kinference_itl_seconds_count",
        "kinference_tpot_seconds_count",
    ] {
        assert_eq!(count(name), 1.0, "{name} of a streamed request");
    }
    assert_eq!(upstream_ttft(), 1.0);
    let tpot = count("kinference_tpot_seconds_sum");
    assert!((tpot - 0.1).abs() < 1e-9, "1 s over 10 gaps: {tpot}");
}

/// grpc.md: times that are negative or not finite, or a first token after the response ended,
/// are refused with `INVALID_ARGUMENT` naming the field; nothing is counted and the decision
/// stays pending, so that the corrected report is taken.
#[tokio::test]
async fn report_refuses_negative_or_non_finite_times_by_name_and_counts_nothing() {
    let (gw, url) = start_gateway().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let id = decision_id(&mut c, streamed_chat("qwen", 1)).await;
    let good = full_report(&id);
    let before = rendered(&gw);
    for v in [-0.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for (bad, field) in [
            (
                ReportRequest {
                    ttft_seconds: Some(v),
                    ..good.clone()
                },
                "ttft_seconds",
            ),
            (
                ReportRequest {
                    mean_itl_seconds: Some(v),
                    ..good.clone()
                },
                "mean_itl_seconds",
            ),
            (
                ReportRequest {
                    duration_seconds: v,
                    ..good.clone()
                },
                "duration_seconds",
            ),
        ] {
            let e = c.report(bad).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field} {v}: {e:?}");
            assert!(
                e.message().starts_with(&format!("{field} is ")),
                "{field} {v}: {}",
                e.message()
            );
        }
    }
    // A first token after the end of the response (or with no duration at all).
    for duration_seconds in [0.05, 0.0] {
        let e = c
            .report(ReportRequest {
                duration_seconds,
                ..good.clone()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .starts_with("ttft_seconds (0.1) exceeds duration_seconds"),
            "{}",
            e.message()
        );
    }
    assert_eq!(rendered(&gw), before, "a refused report counts nothing");
    // `-0.0` is zero, not negative.
    c.report(ReportRequest {
        mean_itl_seconds: Some(-0.0),
        ..good.clone()
    })
    .await
    .unwrap();
    assert_ne!(rendered(&gw), before);
}

/// An unknown decision id, a second report of one, and a report after its decision expired
/// are `NOT_FOUND` naming the id (cut short when long) and count nothing.
#[tokio::test]
async fn reports_of_unknown_reported_or_expired_decisions_are_not_found_and_count_nothing() {
    use kinf_handler::grpc::handler::HandlerService;
    use kinf_handler::grpc::pending::Pending;

    let (gw, url) = start_gateway().await;
    let mut c = HandlerClient::connect(url).await.unwrap();
    let id = decision_id(&mut c, streamed_chat("qwen", 1)).await;
    c.report(full_report(&id)).await.unwrap();
    let before = rendered(&gw);
    let e = c.report(full_report(&id)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains(&format!("`{id}`")), "{}", e.message());
    let e = c.report(full_report("no-such-decision")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(
        e.message().contains("`no-such-decision`"),
        "{}",
        e.message()
    );
    // A huge id is not sent back whole (the message travels in a header).
    let huge = "x".repeat(1 << 20);
    let e = c.report(full_report(&huge)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(e.message().len() < 200, "{}", e.message().len());
    assert!(e.message().contains(&format!("`{}...`", &huge[..64])));
    assert_eq!(rendered(&gw), before, "nothing counted");

    // Expired: a store whose decisions live 50 ms.
    let svc = HandlerService::new(
        gw.clone(),
        Arc::new(Pending::new(std::time::Duration::from_millis(50), 16)),
    );
    let routed = svc
        .decide_request(decide_req(streamed_chat("qwen", 1)))
        .await;
    let Some(decide_response::Outcome::Route(route)) = routed.outcome else {
        panic!("expected a route, got {routed:?}");
    };
    tokio::time::sleep(std::time::Duration::from_millis(80)).await;
    let before = rendered(&gw);
    let e = svc
        .report_outcome(&full_report(&route.decision_id))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().contains("expired"), "{}", e.message());
    assert_eq!(rendered(&gw), before, "nothing counted");
}
