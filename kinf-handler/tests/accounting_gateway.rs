//! Per-tenant accounting through the gateway in-process: tokens and cost per tenant, model and
//! destination equal what the upstream reported; a stream cut mid-way is accounted as
//! incomplete with what it used; service-objective counters move; golden histograms and
//! capacity gauges are on `/metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kinf_handler::accounting::SloSet;
use kinf_handler::gateway::errors::Api;
use kinf_handler::gateway::forward::{self, ResponseObservation};
use kinf_handler::gateway::{Gateway, GatewayOptions};
use kinf_handler::serve::{OnApplied, reload};
use kinf_router::usage::TokenUsage;
use serde_json::Value;
use support::replay::CHAT;
use support::temp_dir;

/// Prices of the `tiny` worker set in [`config`], per million tokens.
const UNCACHED: f64 = 0.6;
const CACHED: f64 = 0.06;
const OUTPUT: f64 = 2.2;

fn config(endpoint: SocketAddr) -> String {
    format!(
        r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: tiny, namespace: test }}
spec:
  endpoints: ["{endpoint}"]
  cost: {{ uncachedPromptPerMillion: {UNCACHED}, cachedPromptPerMillion: {CACHED}, outputPerMillion: {OUTPUT} }}
  models:
  - name: tiny-llama
    aliases: [tiny, small-model]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: pool, namespace: test }}
spec:
  destinations: [ {{ kind: InferenceWorkerSet, name: tiny }} ]
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: GatewayBackend
metadata: {{ name: gw, namespace: test }}
spec:
  pool: pool
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: p, namespace: test }}
spec:
  rules:
  - name: small
    matches: [ {{ model: small-model }} ]
    route:
      select: [ {{ type: Local, minimize: PredictedTTFT }} ]
"#
    )
}

fn noop() -> OnApplied {
    Arc::new(|_, _| {})
}

async fn start_gateway(dir: &Path) -> (Arc<Gateway>, SocketAddr) {
    let gw = Gateway::new(GatewayOptions {
        base_dir: dir.to_path_buf(),
        upstream_timeout: Duration::from_secs(10),
        ..Default::default()
    });
    reload(&gw, dir, None, &noop());
    assert!(gw.store.is_ready(), "{:?}", gw.store.last_rejected());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let app = gw.router_with_admin();
    tokio::spawn(async move { axum::serve(l, app).await });
    (gw, addr)
}

async fn setup(tag: &str, die_mid_stream: bool) -> (Arc<Gateway>, SocketAddr) {
    let (up, _) = support::replay::start_upstream(die_mid_stream).await;
    let dir = temp_dir(tag);
    std::fs::write(dir.join("c.yaml"), config(up)).unwrap();
    start_gateway(&dir).await
}

async fn call(addr: SocketAddr, path: &str, body: &str) -> (StatusCode, String) {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let b = hyper::Request::builder()
        .method(if body.is_empty() { "GET" } else { "POST" })
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    let resp = client
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

const HELLO: &str = r#"{"model":"small-model","messages":[{"role":"user","content":"Hello there"}],"max_tokens":8}"#;
const STREAM: &str =
    r#"{"model":"small-model","messages":[{"role":"user","content":"Hi"}],"stream":true}"#;

fn tenant_value(
    gw: &Gateway,
    name: &str,
    tenant: &str,
    extra: &[(&'static str, &'static str)],
) -> Option<f64> {
    let mut l = vec![
        ("tenant", tenant),
        ("model", "small-model"),
        ("destination", "tiny"),
        ("destination_namespace", "test"),
    ];
    l.extend_from_slice(extra);
    gw.metrics.value(name, &l)
}

fn reported_usage() -> TokenUsage {
    let v: Value = serde_json::from_str(CHAT).unwrap();
    let u = &v["usage"];
    TokenUsage::from_openai(
        u["prompt_tokens"].as_u64().unwrap(),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        u["completion_tokens"].as_u64().unwrap(),
    )
}

fn price(u: &TokenUsage) -> f64 {
    (u.uncached_prompt_tokens as f64 * UNCACHED
        + u.cached_prompt_tokens as f64 * CACHED
        + u.output_tokens as f64 * OUTPUT)
        / 1e6
}

#[tokio::test]
async fn anonymous_tokens_and_cost_equal_what_the_upstream_reported() {
    let (gw, addr) = setup("http", false).await;
    for _ in 0..3 {
        let (status, body) = call(addr, "/v1/chat/completions", HELLO).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let u = reported_usage();
    let t = |kind: &'static str| {
        tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", kind)],
        )
    };
    assert_eq!(t("output"), Some(3.0 * u.output_tokens as f64));
    assert_eq!(
        t("uncached_prompt"),
        Some(3.0 * u.uncached_prompt_tokens as f64)
    );
    assert_eq!(
        t("cached_prompt"),
        Some(3.0 * u.cached_prompt_tokens as f64)
    );
    let cost = tenant_value(&gw, "kinference_tenant_cost_usd_total", "anonymous", &[]).unwrap();
    assert!((cost - 3.0 * price(&u)).abs() < 1e-12, "{cost}");
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_requests_total",
            "anonymous",
            &[("outcome", "completed"), ("code", "200")]
        ),
        Some(3.0)
    );
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_usage_estimated_total",
            "anonymous",
            &[]
        ),
        None
    );
    // Per-endpoint tokens add up to the same.
    let m = {
        let mut s = String::new();
        gw.metrics.render(&mut s);
        s
    };
    assert!(
        m.contains("kinference_endpoint_tokens_total{destination=\"tiny\""),
        "{m}"
    );
    // The legacy counter is unchanged.
    assert_eq!(
        gw.metrics.value(
            "kinference_tokens_total",
            &[
                ("model", "tiny-llama"),
                ("destination", "tiny"),
                ("destination_namespace", "test"),
                ("kind", "output")
            ]
        ),
        Some(3.0 * u.output_tokens as f64)
    );
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_accounted_as_incomplete_with_what_it_used() {
    let (gw, addr) = setup("cut", true).await;
    let (status, body) = call(addr, "/v1/chat/completions", STREAM).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("\"error\""), "{body}");
    // The finisher runs when the body stream is dropped; give it a moment.
    for _ in 0..50 {
        if tenant_value(
            &gw,
            "kinference_tenant_requests_total",
            "anonymous",
            &[("outcome", "incomplete"), ("code", "200")],
        )
        .is_some()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_requests_total",
            "anonymous",
            &[("outcome", "incomplete"), ("code", "200")]
        ),
        Some(1.0)
    );
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_usage_estimated_total",
            "anonymous",
            &[]
        ),
        Some(1.0)
    );
    // Two tokens (`min`, ` root`) arrived after the role announcement before the worker
    // died: the estimate is one output token per token-carrying event (the role-only opening
    // chunk carries none).
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", "output")]
        ),
        Some(2.0)
    );
    let prompt = tenant_value(
        &gw,
        "kinference_tenant_tokens_total",
        "anonymous",
        &[("kind", "uncached_prompt")],
    )
    .unwrap()
        + tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", "cached_prompt")],
        )
        .unwrap();
    assert!(
        prompt > 0.0,
        "the prompt the gateway tokenized is accounted"
    );
    let cost = tenant_value(&gw, "kinference_tenant_cost_usd_total", "anonymous", &[]).unwrap();
    assert!(cost > 0.0);
}

#[tokio::test]
async fn a_reported_response_is_accounted_to_its_tenant() {
    let (gw, _addr) = setup("tenant", false).await;
    let rt = gw.runtime().unwrap();
    // A stream: only a stream has a first token, and counts for `ttft` objectives.
    let admitted = forward::admit(&rt, Api::Chat, &HeaderMap::new(), STREAM.as_bytes()).unwrap();
    let mut chosen = forward::plan(&gw, &admitted).unwrap();
    chosen.tenant = Some("acme".into());
    assert_eq!(chosen.cost.output, OUTPUT);
    let usage = TokenUsage::from_openai(1000, 768, 100);
    let obs = ResponseObservation {
        status: 200,
        ttft_s: Some(0.4),
        upstream_ttft_s: Some(0.4),
        mean_itl_s: Some(0.02),
        usage: Some(usage),
        completed: true,
        duration_s: 2.38,
        token_events: 100,
        longest_share: 1.0,
        client_gone: false,
    };
    gw.metrics.set_slos(
        SloSet::from_yaml(
            "slos:\n- {name: acme-ttft, tenant: 'ac*', metric: ttft, quantile: 0.9, threshold: 500ms}\n- {name: acme-tpot, tenant: acme, model: 'small-*', metric: tpot, quantile: 0.9, threshold: 10ms}\n- {name: others, tenant: 'zz*', metric: e2e, quantile: 0.9, threshold: 1s}\n",
        )
        .unwrap(),
    );
    forward::report(&gw, Api::Chat, &chosen, &obs);
    forward::report(
        &gw,
        Api::Chat,
        &chosen,
        &ResponseObservation {
            ttft_s: Some(0.9),
            upstream_ttft_s: Some(0.9),
            ..obs.clone()
        },
    );
    let t = |kind: &'static str| {
        tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "acme",
            &[("kind", kind)],
        )
    };
    assert_eq!(t("cached_prompt"), Some(2.0 * 768.0));
    assert_eq!(t("uncached_prompt"), Some(2.0 * 232.0));
    assert_eq!(t("output"), Some(200.0));
    let cost = tenant_value(&gw, "kinference_tenant_cost_usd_total", "acme", &[]).unwrap();
    assert!((cost - 2.0 * price(&usage)).abs() < 1e-12, "{cost}");
    let slo = |name: &str, slo: &'static str| {
        gw.metrics.value(
            name,
            &[("slo", slo), ("tenant", "acme"), ("model", "small-model")],
        )
    };
    assert_eq!(slo("kinference_slo_requests_total", "acme-ttft"), Some(2.0));
    assert_eq!(slo("kinference_slo_good_total", "acme-ttft"), Some(1.0));
    // tpot = (2.38 - 0.4) / 99 = 0.02 s > 10 ms; (2.38 - 0.9) / 99 ≈ 0.015 s.
    assert_eq!(slo("kinference_slo_requests_total", "acme-tpot"), Some(2.0));
    assert_eq!(slo("kinference_slo_good_total", "acme-tpot"), Some(0.0));
    assert_eq!(slo("kinference_slo_requests_total", "others"), None);
    assert_eq!(
        gw.metrics.value(
            "kinference_slo_attainment_5m",
            &[("slo", "acme-ttft"), ("metric", "ttft")]
        ),
        Some(0.5)
    );
    assert_eq!(
        gw.metrics.value(
            "kinference_slo_objective",
            &[("slo", "acme-ttft"), ("metric", "ttft")]
        ),
        Some(0.9)
    );
    let decode = tenant_value(&gw, "kinference_tenant_decode_seconds_total", "acme", &[]).unwrap();
    assert!((decode - (1.98 + 1.48)).abs() < 1e-9, "{decode}");
    let kv = tenant_value(&gw, "kinference_tenant_kv_token_seconds_total", "acme", &[]).unwrap();
    assert!((kv - 1050.0 * (1.98 + 1.48)).abs() < 1e-6, "{kv}");
    assert_eq!(
        gw.metrics.value(
            "kinference_tpot_seconds_count",
            &[("tenant", "acme"), ("model", "small-model")]
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn rejections_are_accounted_per_model_and_histograms_and_capacity_are_on_metrics() {
    let (gw, addr) = setup("metrics", false).await;
    gw.metrics.set_slos(
        SloSet::from_yaml("- {name: all-e2e, metric: e2e, quantile: 0.99, threshold: 60s}")
            .unwrap(),
    );
    let (status, _) = call(addr, "/v1/chat/completions", STREAM).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(addr, "/v1/chat/completions", HELLO).await;
    assert_eq!(status, StatusCode::OK);
    // A model nobody serves: rejected by the policy, accounted with its model.
    let (status, body) = call(
        addr,
        "/v1/chat/completions",
        r#"{"model":"nope","messages":[{"role":"user","content":"Hi"}]}"#,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    // Malformed JSON: rejected before the model is known.
    let (status, _) = call(addr, "/v1/chat/completions", "{").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, text) = call(addr, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    // `KINF_METRICS_DUMP=path` saves the exposition (for `promtool check metrics`).
    if let Ok(path) = std::env::var("KINF_METRICS_DUMP") {
        std::fs::write(path, &text).unwrap();
    }
    // A model no pool serves is labelled "": a client must not create a series per string.
    assert!(!text.contains("model=\"nope\""), "{text}");
    let rejected_model = kinf_handler::metrics::sample_value(
        &text,
        "kinference_tenant_requests_total",
        &[
            ("tenant", "anonymous"),
            ("model", ""),
            ("destination", ""),
            ("destination_namespace", ""),
            ("outcome", "rejected"),
            ("code", "model_not_found"),
        ],
    );
    assert_eq!(rejected_model, Some(1.0), "{text}");
    assert!(
        text.contains("kinference_tenant_requests_total{tenant=\"anonymous\",model=\"\",destination=\"\",destination_namespace=\"\",outcome=\"rejected\",code=\""),
        "{text}"
    );
    for needle in [
        "# TYPE kinference_ttft_seconds histogram",
        "kinference_ttft_seconds_bucket{le=\"0.5\",tenant=\"anonymous\",model=\"small-model\"}",
        "kinference_itl_seconds_count{tenant=\"anonymous\",model=\"small-model\"}",
        "kinference_tpot_seconds_count{tenant=\"anonymous\",model=\"small-model\"}",
        "kinference_e2e_latency_seconds_count{tenant=\"anonymous\",model=\"small-model\"} 2",
        "kinference_slo_requests_total{slo=\"all-e2e\",tenant=\"anonymous\",model=\"small-model\"} 2",
        "kinference_slo_good_total{slo=\"all-e2e\",tenant=\"anonymous\",model=\"small-model\"} 2",
        "kinference_endpoint_routable{worker_set=\"test/tiny\",endpoint=",
        "# TYPE kinference_requests_total counter",
        "kinference_requests_total{api=\"chat\",status=\"200\",code=\"ok\"} 2",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
    assert!(!text.contains("# EOF"));
    // Every sample line parses as `name{labels} value`.
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (_, v) = line.rsplit_once(' ').unwrap();
        assert!(v.parse::<f64>().is_ok(), "{line}");
    }
}

/// An upstream answering chat requests by their `user`: `slow` is reported on `received` and
/// answered after a minute, `bad` gets vLLM's 400 (no usage), others the captured response.
async fn scripted_upstream(received: tokio::sync::mpsc::UnboundedSender<()>) -> SocketAddr {
    async fn chat(
        axum::extract::State(received): axum::extract::State<
            tokio::sync::mpsc::UnboundedSender<()>,
        >,
        body: Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        let v: Value = serde_json::from_slice(&body).unwrap();
        match v["user"].as_str() {
            Some("slow") => {
                let _ = received.send(());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Some("bad") => {
                let e = r#"{"object":"error","message":"max_tokens must be at least 1, got 0.","type":"BadRequestError","param":null,"code":400}"#;
                return (
                    StatusCode::BAD_REQUEST,
                    [("content-type", "application/json")],
                    e,
                )
                    .into_response();
            }
            _ => {}
        }
        ([("content-type", "application/json")], CHAT).into_response()
    }
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(received);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await });
    addr
}

/// [`config`] with one request in flight at a time (a concurrency limit) and 100,000 tokens per
/// minute.
fn config_one_at_a_time(endpoint: SocketAddr) -> String {
    format!(
        r#"{}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {{ name: limits, namespace: test }}
spec:
  limits:
  - name: one-at-a-time
    concurrentRequests: 1
  - name: tokens
    tokensPerMinute: 100000
"#,
        config(endpoint).trim_end()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_a_non_streamed_response_is_accounted_once() {
    let (tx, mut received) = tokio::sync::mpsc::unbounded_channel();
    let up = scripted_upstream(tx).await;
    let dir = temp_dir("gone");
    std::fs::write(dir.join("c.yaml"), config_one_at_a_time(up)).unwrap();
    let (gw, addr) = start_gateway(&dir).await;

    let body = r#"{"model":"small-model","user":"slow","max_tokens":50000,"messages":[{"role":"user","content":"Hello there, a long answer please"}]}"#;
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::io::AsyncWriteExt::write_all(&mut client, req.as_bytes())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), received.recv())
        .await
        .expect("the upstream never got the request");
    // The client goes away while the upstream generates.
    drop(client);

    let gone = [
        ("api", "chat"),
        ("status", "499"),
        ("code", "client_closed_request"),
    ];
    assert!(
        support::eventually(Duration::from_secs(5), || {
            gw.metrics.value("kinference_requests_total", &gone) == Some(1.0)
        })
        .await,
        "the request is counted once with status 499"
    );
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_requests_total",
            "anonymous",
            &[("outcome", "incomplete"), ("code", "client_closed_request")]
        ),
        Some(1.0)
    );
    assert_eq!(
        gw.metrics.value(
            "kinference_responses_total",
            &[
                ("destination", "tiny"),
                ("destination_namespace", "test"),
                ("status", "499"),
                ("outcome", "incomplete")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        gw.metrics.value(
            "kinference_request_duration_seconds_count",
            &[("api", "chat")]
        ),
        Some(1.0)
    );
    // Request durations reach past 80 s (long generations), unlike the decision histogram.
    for le in ["120.0", "600.0"] {
        assert_eq!(
            gw.metrics.value(
                "kinference_request_duration_seconds_bucket",
                &[("api", "chat"), ("le", le)]
            ),
            Some(1.0),
            "bucket le={le}"
        );
    }
    // Usage is estimated as for a stream cut short: the prompt, and no output was seen.
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_usage_estimated_total",
            "anonymous",
            &[]
        ),
        Some(1.0)
    );
    let prompt = tenant_value(
        &gw,
        "kinference_tenant_tokens_total",
        "anonymous",
        &[("kind", "uncached_prompt")],
    )
    .unwrap_or(0.0)
        + tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", "cached_prompt")],
        )
        .unwrap_or(0.0);
    assert!(prompt > 0.0, "the prompt is accounted");
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", "output")]
        ),
        Some(0.0)
    );

    // The concurrency slot was released: the next request is admitted and served. The token
    // reservation (prompt + 50,000) stays charged: how much was generated is unknown.
    let (status, headers, body) = support::post_json(
        addr,
        "/v1/chat/completions",
        &serde_json::from_str(HELLO).unwrap(),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let remaining: f64 = headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        remaining < 60_000.0,
        "the abandoned request's estimate was given back: {remaining} left"
    );
    assert_eq!(
        gw.metrics.value("kinference_requests_total", &gone),
        Some(1.0),
        "counted once"
    );
    assert_eq!(
        gw.metrics.value(
            "kinference_requests_total",
            &[("api", "chat"), ("status", "200"), ("code", "ok")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn an_upstream_error_without_usage_counts_zero_tokens_not_an_estimate() {
    let (tx, _received) = tokio::sync::mpsc::unbounded_channel();
    let up = scripted_upstream(tx).await;
    let dir = temp_dir("bad");
    std::fs::write(dir.join("c.yaml"), config(up)).unwrap();
    let (gw, addr) = start_gateway(&dir).await;
    let (status, body) = call(
        addr,
        "/v1/chat/completions",
        r#"{"model":"small-model","user":"bad","messages":[{"role":"user","content":"Hi"}],"max_tokens":5}"#,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("BadRequestError"), "passed through: {body}");
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_requests_total",
            "anonymous",
            &[("outcome", "upstream_error"), ("code", "400")]
        ),
        Some(1.0)
    );
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_usage_estimated_total",
            "anonymous",
            &[]
        ),
        None,
        "an error response used nothing: nothing is estimated"
    );
    assert_eq!(
        tenant_value(
            &gw,
            "kinference_tenant_tokens_total",
            "anonymous",
            &[("kind", "uncached_prompt")]
        ),
        Some(0.0)
    );
}

#[tokio::test]
async fn a_request_refused_before_any_worker_had_it_gives_its_token_estimate_back() {
    let (tx, _received) = tokio::sync::mpsc::unbounded_channel();
    let up = scripted_upstream(tx).await;
    let dir = temp_dir("refund");
    // `tiny` is served by the worker set, but the policy drops it for that name: a 503
    // `policy_rejected` decided after the request was admitted by the token limit.
    let refusing = config_one_at_a_time(up).replace(
        "  rules:\n",
        "  rules:\n  - name: refused\n    matches: [ { model: tiny } ]\n    route:\n      exclude: [ { name: everything, drop: { backend: { name: tiny } } } ]\n      select: [ { type: Local, minimize: PredictedTTFT } ]\n      onEmpty: Reject\n",
    );
    std::fs::write(dir.join("c.yaml"), refusing).unwrap();
    let (_gw, addr) = start_gateway(&dir).await;
    let refused = r#"{"model":"tiny","max_tokens":50000,"messages":[{"role":"user","content":"Hello there"}]}"#;
    let (status, _, body) = support::post_json(
        addr,
        "/v1/chat/completions",
        &serde_json::from_str(refused).unwrap(),
        &[],
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "policy_rejected", "{body}");
    // The next request finds the budget as if the refused one had never been admitted: only
    // its own reservation (prompt + 8 output tokens) is taken from the 100,000.
    let (status, headers, body) = support::post_json(
        addr,
        "/v1/chat/completions",
        &serde_json::from_str(HELLO).unwrap(),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let remaining: f64 = headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        remaining > 99_000.0,
        "the refused request's estimate is still charged: {remaining} left"
    );
}
