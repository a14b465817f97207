//! Metrics scraper and health checks against an in-test HTTP server serving vLLM fixtures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kinf_handler::live::{EndpointSpec, LiveConfig, LiveIngest, ScrapeStatus, SharedState};
use kinf_router::ClusterState;
use kinf_router::predictor::TtftModel;
use kinf_router::prefix_index::{ApproxIndex, EndpointId};
use kinf_router::state::{EndpointState, LoadWindow, PrefixTracking, WorkerSetState};

const UNDER_LOAD: &str =
    include_str!("../../testdata/vllm-0.32.0-cpu/run3-eager/metrics_under_load.txt");
const WS: &str = "default/pool";
const INTERVAL: Duration = Duration::from_millis(50);

/// A vLLM-like server: `/metrics` and `/health`. Aborting the task closes every connection.
async fn server() -> (String, tokio::task::JoinHandle<()>) {
    server_with(Arc::new(parking_lot::Mutex::new(UNDER_LOAD.to_owned()))).await
}

/// [`server`] with a `/metrics` body the test changes.
async fn server_with(
    metrics: Arc<parking_lot::Mutex<String>>,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let metrics = metrics.clone();
            conns.spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (status, b) = match req.uri().path() {
                        "/metrics" => (200, metrics.lock().clone()),
                        "/health" => (200, String::new()),
                        _ => (404, String::new()),
                    };
                    async move {
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from(b)))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (address, task)
}

fn state(addresses: &[&str]) -> Arc<SharedState> {
    let mut st = ClusterState::default();
    st.worker_sets.insert(
        WS.into(),
        WorkerSetState {
            endpoints: addresses
                .iter()
                .enumerate()
                .map(|(i, a)| EndpointState {
                    address: (*a).into(),
                    ready: true,
                    stale: false,
                    load: LoadWindow::default(),
                    ttft: TtftModel::from_prior(5000.0, 0.02),
                    index_id: EndpointId(i as u32),
                    assumed_cached_tokens: None,
                    inflight: Default::default(),
                    reported_block_size: None,
                    max_model_lens: Vec::new(),
                })
                .collect(),
            prefix: PrefixTracking::Approximate(ApproxIndex::new(1024, 600_000)),
            block_size: 32,
            block_size_configured: true,
            block_size_adopted: false,
            block_size_resyncs: 0,
            ttft: TtftModel::from_prior(5000.0, 0.02),
            routed: kinf_router::state::speculative_index(),
            positions: Default::default(),
            floor: Default::default(),
            context_limits: Default::default(),
        },
    );
    SharedState::new(st)
}

fn spec(address: &str) -> EndpointSpec {
    EndpointSpec {
        worker_set: WS.into(),
        address: address.into(),
        metrics_path: "/metrics".into(),
        metrics_interval: INTERVAL,
        kv_events: None,
    }
}

fn scrape(ingest: &LiveIngest, address: &str) -> ScrapeStatus {
    ingest.endpoint_status(WS, address).unwrap().scrape
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn config() -> LiveConfig {
    LiveConfig {
        min_timeout: Duration::from_millis(200),
        ..LiveConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_load_then_goes_stale_and_unready_when_the_server_stops() {
    let (address, server) = server().await;
    let shared = state(&[&address]);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(&address)]);
    wait_until("a scrape", || scrape(&ingest, &address).scrapes_ok >= 1).await;

    let latest = shared.with(|st| *st.worker_sets[WS].endpoints[0].load.latest().unwrap());
    assert_eq!(latest.queued, 1.0);
    assert_eq!(latest.running, 7.0);
    assert_eq!(latest.kv_usage, 0.8888888888888888);
    let s = scrape(&ingest, &address);
    let cfg = s.cache_config.clone().unwrap();
    assert_eq!(cfg.block_size, Some(32));
    assert_eq!(cfg.num_gpu_blocks, Some(64));
    assert_eq!(cfg.prefix_caching_hash_algo.as_deref(), Some("sha256"));
    assert!(!s.stale && s.ready && !s.block_size_mismatch);
    assert_eq!(s.last_sample, Some([1.0, 7.0, 0.8888888888888888]));

    server.abort();
    let _ = server.await;
    wait_until("stale", || scrape(&ingest, &address).stale).await;
    let s = scrape(&ingest, &address);
    let stale_at = shared.now_ms();
    let last_ok = s.last_success_ms.unwrap();
    assert!(
        stale_at - last_ok >= 3 * INTERVAL.as_millis() as u64,
        "stale after {} ms",
        stale_at - last_ok
    );
    assert!(s.consecutive_failures >= 1 && s.scrapes_failed >= 1);
    assert!(s.last_error.is_some());
    assert!(
        s.last_error_ms
            .is_some_and(|t| t > last_ok && t <= stale_at),
        "{s:?}"
    );
    wait_until("not ready", || !scrape(&ingest, &address).ready).await;
    assert!(scrape(&ingest, &address).health_consecutive_failures >= 3);
    shared.with(|st| {
        let ep = &st.worker_sets[WS].endpoints[0];
        assert!(ep.stale && !ep.ready);
    });

    let mut text = String::new();
    ingest.render_metrics(&mut text);
    for line in [
        format!("kinference_endpoint_stale{{worker_set=\"{WS}\",endpoint=\"{address}\"}} 1"),
        format!("kinference_endpoint_ready{{worker_set=\"{WS}\",endpoint=\"{address}\"}} 0"),
        "# TYPE kinference_scrapes_total counter".to_owned(),
    ] {
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
    assert!(text.contains("result=\"ok\"} "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_keeps_unchanged_endpoints_and_stops_removed_ones() {
    let (a, _sa) = server().await;
    let (b, _sb) = server().await;
    let shared = state(&[&a, &b]);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(&a), spec(&b)]);
    wait_until("both scraped", || {
        scrape(&ingest, &a).scrapes_ok >= 2 && scrape(&ingest, &b).scrapes_ok >= 1
    })
    .await;
    let before = scrape(&ingest, &a).scrapes_ok;
    ingest.sync_endpoints(vec![spec(&a)]);
    let st = ingest.status();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].address, a);
    // Still the same task: its counters continue.
    assert!(scrape(&ingest, &a).scrapes_ok >= before);
    // A changed interval restarts the endpoint's scraper (its KV subscriber, if any, keeps
    // running: see `live_kv.rs`).
    let mut changed = spec(&a);
    changed.metrics_interval = Duration::from_millis(60);
    ingest.sync_endpoints(vec![changed.clone()]);
    assert_eq!(ingest.endpoints(), vec![changed]);
    assert!(scrape(&ingest, &a).scrapes_ok < before);
    ingest.shutdown();
    assert!(ingest.status().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_or_missing_load_values_keep_the_previous_ones_and_do_not_poison_the_window() {
    let metrics = Arc::new(parking_lot::Mutex::new(UNDER_LOAD.to_owned()));
    let (address, _server) = server_with(metrics.clone()).await;
    let shared = state(&[&address]);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(&address)]);
    wait_until("a scrape", || scrape(&ingest, &address).scrapes_ok >= 1).await;
    assert_eq!(
        scrape(&ingest, &address).last_sample,
        Some([1.0, 7.0, 0.8888888888888888])
    );

    // A broken exporter: an absurd queue, running not a number, no KV usage at all.
    *metrics.lock() = "vllm:num_requests_waiting{engine=\"0\"} 1e20\n\
                       vllm:num_requests_running{engine=\"0\"} NaN\n"
        .to_owned();
    let ok = scrape(&ingest, &address).scrapes_ok;
    wait_until("bad scrapes", || {
        scrape(&ingest, &address).scrapes_ok >= ok + 3
    })
    .await;
    let s = scrape(&ingest, &address);
    assert!(s.implausible_samples >= 3, "{s:?}");
    assert_eq!(s.last_sample, Some([1.0, 7.0, 0.8888888888888888]));

    // Back to normal: 3 queued. The window's average is the samples' (1 and 3), not 1e20
    // (and not a sum that lost the small samples to it).
    *metrics.lock() = "vllm:num_requests_waiting{engine=\"0\"} 3\n\
                       vllm:num_requests_running{engine=\"0\"} 2\n\
                       vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"
        .to_owned();
    let ok = scrape(&ingest, &address).scrapes_ok;
    wait_until("good scrapes", || {
        scrape(&ingest, &address).scrapes_ok >= ok + 3
    })
    .await;
    assert_eq!(scrape(&ingest, &address).last_sample, Some([3.0, 2.0, 0.5]));
    let now = shared.now_ms();
    let avg = shared.with(|st| {
        st.worker_sets[WS].endpoints[0]
            .load
            .average(Duration::from_secs(30), now)
    });
    assert!(
        (1.0..=3.0).contains(&avg.queued_prompts)
            && (0.5..=0.8888888888888888).contains(&avg.kv_cache_usage),
        "{avg:?}"
    );
    let mut text = String::new();
    ingest.render_metrics(&mut text);
    let line = format!(
        "kinference_endpoint_implausible_samples_total{{worker_set=\"{WS}\",endpoint=\"{address}\"}} "
    );
    assert!(text.contains(&line), "{line} not in\n{text}");
    let line =
        format!("kinference_block_size_mismatch{{worker_set=\"{WS}\",endpoint=\"{address}\"}} 0");
    assert!(text.contains(&line), "{line} not in\n{text}");
}
