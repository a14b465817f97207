//! KV-event subscriber against an in-test zeromq publisher (frames captured from vLLM 0.32).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kinf_handler::live::{EndpointSpec, KvStatus, LiveConfig, LiveIngest, SharedState};
use kinf_lang::compiled::KvEventsInfo;
use kinf_router::ClusterState;
use kinf_router::kv_events::decode_payload;
use kinf_router::predictor::TtftModel;
use kinf_router::prefix_index::{EndpointId, IndexStats, PrefixIndex};
use kinf_router::state::{EndpointState, LoadWindow, PrefixTracking, WorkerSetState};
use zeromq::{Endpoint, PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

const FRAMES: &str = include_str!("../../testdata/vllm-0.32.0-cpu/kv_frames_run2_evictions.jsonl");
const TOPIC: &str = "kv@pod-b@tiny";
const WS: &str = "default/pool";

#[derive(Clone)]
struct Frame {
    seq: i64,
    payload: Vec<u8>,
}

/// What a publisher's replay socket still buffers, shared with the test.
type Buffer = Arc<parking_lot::Mutex<Vec<Frame>>>;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn frames() -> Vec<Frame> {
    FRAMES
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            assert_eq!(v["topic"], TOPIC);
            Frame {
                seq: v["seq"].as_i64().unwrap(),
                payload: hex(v["payload_hex"].as_str().unwrap()),
            }
        })
        .collect()
}

fn state(address: &str) -> Arc<SharedState> {
    state_with(address, 32, true)
}

/// One endpoint at `address`, exact prefix tracking at `block_size` (declared in the policy
/// when `configured`, else the gateway's default, which the workers' report replaces).
fn state_with(address: &str, block_size: usize, configured: bool) -> Arc<SharedState> {
    let mut st = ClusterState::default();
    st.worker_sets.insert(
        WS.into(),
        WorkerSetState {
            endpoints: vec![EndpointState {
                address: address.into(),
                ready: true,
                stale: false,
                load: LoadWindow::default(),
                ttft: TtftModel::from_prior(5000.0, 0.02),
                index_id: EndpointId(0),
                assumed_cached_tokens: None,
                inflight: Default::default(),
                reported_block_size: None,
                max_model_lens: Vec::new(),
            }],
            prefix: PrefixTracking::Exact(PrefixIndex::new(block_size)),
            block_size,
            block_size_configured: configured,
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

/// A fresh index fed `frames[i]` for each `i` in `which`; `(endpoint blocks, stats)`.
fn reference(frames: &[Frame], which: &[usize]) -> (usize, IndexStats) {
    let mut idx = PrefixIndex::new(32);
    for &i in which {
        let (_, events, _) = decode_payload(&frames[i].payload).unwrap();
        idx.apply_all(EndpointId(0), &events);
    }
    (idx.endpoint_blocks(EndpointId(0)), idx.stats())
}

fn index(shared: &SharedState) -> (usize, IndexStats) {
    shared.with(|st| match &st.worker_sets[WS].prefix {
        PrefixTracking::Exact(i) => (i.endpoint_blocks(EndpointId(0)), i.stats()),
        PrefixTracking::Approximate(_) => panic!("approximate"),
    })
}

fn config() -> LiveConfig {
    LiveConfig {
        retry_delay: Duration::from_millis(50),
        replay_timeout: Duration::from_secs(5),
        ..LiveConfig::default()
    }
}

/// Waits until a scrape has recorded the worker's current process start time: a restart is
/// a change of it, so changing it before the first scrape would be seen as no restart.
async fn wait_for_start_seen(ingest: &LiveIngest, address: &str) {
    wait_until("the process start time scraped", || {
        ingest
            .endpoint_status(WS, address)
            .is_some_and(|s| s.scrape.process_start_s.is_some())
    })
    .await;
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn kv(ingest: &LiveIngest, address: &str) -> KvStatus {
    ingest.endpoint_status(WS, address).unwrap().kv.unwrap()
}

fn port_of(ep: &Endpoint) -> u16 {
    match ep {
        Endpoint::Tcp(_, p) => *p,
        _ => panic!("not tcp"),
    }
}

fn msg(frames: Vec<Vec<u8>>) -> ZmqMessage {
    ZmqMessage::try_from(frames.into_iter().map(Bytes::from).collect::<Vec<_>>()).unwrap()
}

struct Publisher {
    sock: PubSocket,
    port: u16,
}

impl Publisher {
    async fn bind() -> Self {
        let mut sock = PubSocket::new();
        let ep = sock.bind("tcp://127.0.0.1:0").await.unwrap();
        Publisher {
            port: port_of(&ep),
            sock,
        }
    }

    /// Sends undecodable probes until the subscriber has counted one, so that the
    /// subscription is known to have reached the publisher (no slow-joiner loss).
    async fn await_subscriber(&mut self, ingest: &LiveIngest, address: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let before = kv(ingest, address).decode_errors;
        loop {
            self.sock
                .send(msg(vec![TOPIC.into(), b"probe".to_vec(), vec![]]))
                .await
                .unwrap();
            if kv(ingest, address).decode_errors > before {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "subscriber never joined"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn publish(&mut self, f: &Frame) {
        self.sock
            .send(msg(vec![
                TOPIC.into(),
                f.seq.to_be_bytes().to_vec(),
                f.payload.clone(),
            ]))
            .await
            .unwrap();
    }
}

fn spec(address: &str, port: Option<u16>, replay_port: Option<u16>) -> EndpointSpec {
    EndpointSpec {
        worker_set: WS.into(),
        address: address.into(),
        metrics_path: "/metrics".into(),
        metrics_interval: Duration::from_secs(3600),
        kv_events: Some(KvEventsInfo {
            port,
            replay_port,
            topic: TOPIC.into(),
        }),
    }
}

/// An address on which nothing listens (for the scraper, which these tests ignore).
const NO_HTTP: &str = "127.0.0.1:9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_is_stored_minus_removed_then_cleared_and_restart_resets() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), None)]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    for f in &fr[..4] {
        publ.publish(f).await;
    }
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    // The probes' decode errors came before the batches: the error is history, and its time
    // says so.
    let k = kv(&ingest, NO_HTTP);
    assert!(
        k.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("decode")),
        "{k:?}"
    );
    let (error_at, message_at) = (k.last_error_ms.unwrap(), k.last_message_ms.unwrap());
    assert!(
        error_at <= message_at && message_at <= shared.now_ms(),
        "{k:?}"
    );

    // Independent check: engine hashes stored minus removed.
    let mut live = std::collections::HashSet::new();
    for f in &fr[..4] {
        let (_, events, _) = decode_payload(&f.payload).unwrap();
        for e in events {
            match e {
                kinf_router::kv_events::KvEvent::BlockStored(s) => live.extend(s.block_hashes),
                kinf_router::kv_events::KvEvent::BlockRemoved(r) => {
                    for h in r.block_hashes {
                        live.remove(&h);
                    }
                }
                _ => {}
            }
        }
    }
    let (blocks, stats) = index(&shared);
    assert_eq!(blocks, live.len());
    assert_eq!((blocks, stats), reference(&fr, &[0, 1, 2, 3]));
    assert!(blocks > 0);

    // AllBlocksCleared.
    publ.publish(&fr[4]).await;
    wait_until("seq 4 applied", || kv(&ingest, NO_HTTP).last_seq == Some(4)).await;
    assert_eq!(index(&shared).0, 0);

    // The publisher restarts: sequence 0 again.
    publ.publish(&fr[1]).await; // seq 1 < expected 5: a duplicate, dropped
    publ.publish(&fr[0]).await;
    wait_until("restart", || kv(&ingest, NO_HTTP).restarts == 1).await;
    wait_until("seq 0 applied", || kv(&ingest, NO_HTTP).last_seq == Some(0)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.resets, k.gaps, k.duplicates, k.messages), (1, 0, 1, 7));
    assert_eq!(index(&shared).0, reference(&fr, &[0]).0);
    assert!(k.connected);
    assert_eq!(k.publishers, vec![format!("tcp://127.0.0.1:{}", publ.port)]);

    let mut text = String::new();
    ingest.render_metrics(&mut text);
    assert!(
        text.contains(&format!(
            "kinference_kv_resets_total{{worker_set=\"{WS}\",endpoint=\"{NO_HTTP}\"}} 1"
        )),
        "{text}"
    );
}

/// A replay `ROUTER` serving the fixture frames like vLLM 0.32; returns its port.
async fn replay_server(buffer: Buffer, requests: Arc<std::sync::atomic::AtomicU32>) -> u16 {
    let mut router = RouterSocket::new();
    let port = port_of(&router.bind("tcp://127.0.0.1:0").await.unwrap());
    tokio::spawn(async move {
        loop {
            let m = router.recv().await.unwrap();
            let v: Vec<Bytes> = m.into_vec();
            assert_eq!(v.len(), 3, "[identity, \"\", start_seq]");
            assert!(v[1].is_empty());
            let start = i64::from_be_bytes(v[2].as_ref().try_into().unwrap());
            requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let fr = buffer.lock().clone();
            for f in fr.iter().filter(|f| f.seq >= start) {
                let reply = vec![
                    v[0].to_vec(),
                    vec![],
                    TOPIC.into(),
                    f.seq.to_be_bytes().to_vec(),
                    f.payload.clone(),
                ];
                router.send(msg(reply)).await.unwrap();
            }
            let end = vec![
                v[0].to_vec(),
                vec![],
                vec![],
                (-1i64).to_be_bytes().to_vec(),
                vec![],
            ];
            router.send(msg(end)).await.unwrap();
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_is_filled_by_replay() {
    let fr = frames();
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    // The replay buffer holds what was published.
    let buffer = Buffer::default();
    let replay_port = replay_server(buffer.clone(), requests.clone()).await;
    let mut publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), Some(replay_port))]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    // On connecting, the subscriber asked for what was buffered: nothing yet.
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    buffer.lock().extend(fr[..4].iter().cloned());
    publ.publish(&fr[0]).await;
    publ.publish(&fr[1]).await;
    publ.publish(&fr[3]).await; // seq 2 is lost
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!(
        (k.gaps, k.missed, k.replays, k.replay_failures, k.resets),
        (1, 1, 1, 0, 0)
    );
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_running_publisher_catches_up_from_its_replay_buffer_at_once() {
    let fr = frames();
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    // The worker has been running: it published 0..=3 before the gateway started.
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(fr[..4].to_vec()));
    let replay_port = replay_server(buffer, requests.clone()).await;
    let publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), Some(replay_port))]);
    // No live message: what it stored is known anyway.
    wait_until("buffer replayed", || {
        kv(&ingest, NO_HTTP).last_seq == Some(3)
    })
    .await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.gaps, k.replays, k.resets), (0, 1, 0));
}

/// A vLLM-like `/metrics` and `/health` server and the knobs the test turns.
struct MetricsWorker {
    address: String,
    /// `process_start_time_seconds`.
    start: Arc<std::sync::atomic::AtomicU64>,
    /// Whether `/health` answers 200.
    healthy: Arc<std::sync::atomic::AtomicBool>,
    /// The `block_size` label of `vllm:cache_config_info` (0: the series is not exposed).
    block_size: Arc<std::sync::atomic::AtomicU64>,
}

impl MetricsWorker {
    async fn start() -> Self {
        let start = Arc::new(std::sync::atomic::AtomicU64::new(1_795_960_000));
        let healthy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let block_size = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let address = metrics_server(start.clone(), healthy.clone(), block_size.clone()).await;
        MetricsWorker {
            address,
            start,
            healthy,
            block_size,
        }
    }

    /// Ingestion of this worker, scraped every 50 ms, with KV events from `port` (and a replay
    /// socket on `replay_port`).
    fn ingest(&self, port: u16, replay_port: Option<u16>) -> (Arc<SharedState>, LiveIngest) {
        self.ingest_into(state(&self.address), port, replay_port)
    }

    /// [`ingest`](Self::ingest) into a state of the test's.
    fn ingest_into(
        &self,
        shared: Arc<SharedState>,
        port: u16,
        replay_port: Option<u16>,
    ) -> (Arc<SharedState>, LiveIngest) {
        let ingest = LiveIngest::with_config(shared.clone(), config());
        let mut sp = spec(&self.address, Some(port), replay_port);
        sp.metrics_interval = Duration::from_millis(50);
        ingest.sync_endpoints(vec![sp]);
        (shared, ingest)
    }
}

/// A vLLM-like `/metrics` and `/health` whose `process_start_time_seconds` the test sets.
async fn metrics_server(
    start: Arc<std::sync::atomic::AtomicU64>,
    healthy: Arc<std::sync::atomic::AtomicBool>,
    block_size: Arc<std::sync::atomic::AtomicU64>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (start, healthy, block_size) = (start.clone(), healthy.clone(), block_size.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let start = start.load(std::sync::atomic::Ordering::SeqCst);
                    let healthy = healthy.load(std::sync::atomic::Ordering::SeqCst);
                    let cache_config = match block_size.load(std::sync::atomic::Ordering::SeqCst) {
                        0 => String::new(),
                        b => format!(
                            "vllm:cache_config_info{{block_size=\"{b}\",engine=\"0\"}} 1.0\n"
                        ),
                    };
                    async move {
                        if req.uri().path() == "/health" && !healthy {
                            let mut r = hyper::Response::new(Full::new(Bytes::new()));
                            *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                            return Ok::<_, Infallible>(r);
                        }
                        let body = match req.uri().path() {
                            "/metrics" => format!(
                                "vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} 0\n\
                                 vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} 0\n\
                                 vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} 0\n\
                                 process_start_time_seconds {start}\n{cache_config}"
                            ),
                            _ => String::new(),
                        };
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_restart_seen_in_its_metrics_resets_the_index_and_catches_up_the_new_process() {
    let fr = frames();
    let worker = MetricsWorker::start().await;
    let (address, start) = (&worker.address, &worker.start);
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(fr[..4].to_vec()));
    let replay_port = replay_server(buffer.clone(), requests.clone()).await;
    let publ = Publisher::bind().await;
    let (shared, ingest) = worker.ingest(publ.port, Some(replay_port));
    wait_until("old process caught up", || {
        kv(&ingest, address).last_seq == Some(3)
    })
    .await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));

    // The worker restarts. The new process has published more batches than the old one had
    // (seq 0..=4 against 0..=3), none of which reached the subscriber: by sequence numbers
    // alone its next message (5) would look like a gap after 3, "filled" from the new
    // process's buffer, and the old process's blocks would stay. Only the last new batch
    // stores anything here.
    let new: Vec<Frame> = (0..5)
        .map(|seq| Frame {
            seq,
            payload: if seq == 4 {
                fr[3].payload.clone()
            } else {
                fr[0].payload.clone()
            },
        })
        .collect();
    *buffer.lock() = new.clone();
    wait_for_start_seen(&ingest, address).await;
    start.fetch_add(7_200, std::sync::atomic::Ordering::SeqCst);
    wait_until("restart seen", || kv(&ingest, address).restarts == 1).await;
    wait_until("new process caught up", || {
        kv(&ingest, address).last_seq == Some(4)
    })
    .await;
    assert_eq!(index(&shared), reference(&new, &[0, 1, 2, 3, 4]));
    let scrape = ingest.endpoint_status(WS, address).unwrap().scrape;
    assert_eq!(scrape.worker_restarts, 1);
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gap_without_replay_resets_the_endpoint() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), None)]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    publ.publish(&fr[0]).await;
    publ.publish(&fr[1]).await;
    wait_until("seq 1 applied", || kv(&ingest, NO_HTTP).last_seq == Some(1)).await;
    assert_eq!(index(&shared).0, 6);
    publ.publish(&fr[3]).await; // seq 2 is lost
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.gaps, k.replays, k.resets), (1, 0, 1));
    // Everything known before the gap is forgotten (the reset empties the endpoint's index);
    // what remains is exactly what seq 3 stored, a prompt of its own (no parent).
    assert_eq!(index(&shared).0, reference(&fr, &[3]).0);
    assert_eq!(index(&shared).0, 3);
    assert_ne!(index(&shared).0, reference(&fr, &[0, 1, 2, 3]).0);
}

/// Serves `/kv_event_sources` pointing at a publisher.
async fn sources_server(body: String) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = Arc::new(body);
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let body = body.clone();
            conns.spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let body = body.clone();
                    async move {
                        let (status, b) = match req.uri().path() {
                            "/kv_event_sources" => (200, body.to_string()),
                            _ => (404, String::new()),
                        };
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
    (port, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publisher_discovered_from_kv_event_sources() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let body = format!(
        r#"{{"0":{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{}","replay_endpoint":null,"buffer_steps":10000,"hwm":100000,"max_queue_size":100000,"topic":"{TOPIC}"}}}}"#,
        publ.port
    );
    let (http_port, _server) = sources_server(body).await;
    let address = format!("127.0.0.1:{http_port}");
    let shared = state(&address);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    let mut s = spec(&address, None, None);
    s.kv_events.as_mut().unwrap().topic = "".into(); // the discovered topic is used
    ingest.sync_endpoints(vec![s]);
    publ.await_subscriber(&ingest, &address).await;
    for f in &fr[..4] {
        publ.publish(f).await;
    }
    wait_until("seq 3 applied", || {
        kv(&ingest, &address).last_seq == Some(3)
    })
    .await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
    let k = kv(&ingest, &address);
    assert_eq!(k.publishers, vec![format!("tcp://127.0.0.1:{}", publ.port)]);
    assert_eq!(k.topic, TOPIC);
    assert!(k.replay_endpoints.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_to_a_restarted_publisher_and_resets() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let port = publ.port;
    let shared = state(NO_HTTP);
    let cfg = LiveConfig {
        kv_idle_reconnect: Duration::from_millis(200),
        ..config()
    };
    let ingest = LiveIngest::with_config(shared.clone(), cfg);
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(port), None)]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    for f in &fr[..4] {
        publ.publish(f).await;
    }
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    assert_eq!(index(&shared).0, reference(&fr, &[0, 1, 2, 3]).0);

    // The publisher process restarts on the same port.
    drop(publ);
    let mut publ = Publisher {
        sock: PubSocket::new(),
        port,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while publ
        .sock
        .bind(&format!("tcp://127.0.0.1:{port}"))
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "cannot rebind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    publ.await_subscriber(&ingest, NO_HTTP).await;
    publ.publish(&fr[0]).await;
    wait_until("restart", || kv(&ingest, NO_HTTP).restarts == 1).await;
    wait_until("seq 0 applied", || kv(&ingest, NO_HTTP).last_seq == Some(0)).await;
    let k = kv(&ingest, NO_HTTP);
    assert!(k.reconnects >= 1);
    assert_eq!(k.resets, 1);
    assert_eq!(index(&shared).0, reference(&fr, &[0]).0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_health_checks_fail_is_shown_disconnected_at_once() {
    let worker = MetricsWorker::start().await;
    let (address, healthy) = (&worker.address, &worker.healthy);
    let mut publ = Publisher::bind().await;
    let (_shared, ingest) = worker.ingest(publ.port, None);
    publ.await_subscriber(&ingest, address).await;
    assert!(kv(&ingest, address).connected);
    // The worker dies: its publisher is gone and its health checks fail. The subscriber does
    // not wait out the 30 s idle timeout to say so.
    drop(publ);
    healthy.store(false, std::sync::atomic::Ordering::SeqCst);
    wait_until("shown disconnected", || !kv(&ingest, address).connected).await;
    assert!(kv(&ingest, address).reconnects >= 1);
    assert!(!ingest.endpoint_status(WS, address).unwrap().scrape.ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_the_kv_events_showed_first_is_not_counted_or_reset_again_by_the_metrics() {
    let fr = frames();
    let worker = MetricsWorker::start().await;
    let (address, start) = (&worker.address, &worker.start);
    let mut publ = Publisher::bind().await;
    let (shared, ingest) = worker.ingest(publ.port, None);
    publ.await_subscriber(&ingest, address).await;
    for f in &fr[..4] {
        publ.publish(f).await;
    }
    wait_until("old process applied", || {
        kv(&ingest, address).last_seq == Some(3)
    })
    .await;
    // The new process's first batch arrives before its metrics show the new start time.
    publ.publish(&Frame {
        seq: 0,
        payload: fr[3].payload.clone(),
    })
    .await;
    wait_until("seq restart", || kv(&ingest, address).restarts == 1).await;
    let after_seq_restart = index(&shared);
    wait_for_start_seen(&ingest, address).await;
    start.fetch_add(7_200, std::sync::atomic::Ordering::SeqCst);
    wait_until("metrics restart seen", || {
        ingest
            .endpoint_status(WS, address)
            .unwrap()
            .scrape
            .worker_restarts
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let k = kv(&ingest, address);
    assert_eq!((k.restarts, k.resets), (1, 1), "{k:?}");
    // What the new process published is kept (no replay socket to get it back).
    assert_eq!(index(&shared), after_seq_restart);
    assert_eq!(index(&shared).0, reference(&fr, &[3]).0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bogus_sequence_number_does_not_freeze_the_stream() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), None)]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    publ.publish(&fr[0]).await;
    publ.publish(&fr[1]).await;
    wait_until("seq 1 applied", || kv(&ingest, NO_HTTP).last_seq == Some(1)).await;
    // Batch 2 arrives with a corrupt sequence number, far ahead: an unfilled gap, a reset.
    let bogus = i64::MAX - 1;
    publ.publish(&Frame {
        seq: bogus,
        payload: fr[2].payload.clone(),
    })
    .await;
    wait_until("bogus applied", || {
        kv(&ingest, NO_HTTP).last_seq == Some(bogus)
    })
    .await;
    // The genuine stream goes on at 3: applied, not dropped as a duplicate.
    publ.publish(&fr[3]).await;
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.gaps, k.resets, k.duplicates), (1, 1, 0), "{k:?}");
    assert_eq!(index(&shared), reference(&fr, &[2, 3]));

    // Again and again: the missed count saturates (it used to overflow, a panic in debug
    // builds that killed the subscriber).
    for seq in 4..7 {
        for s in [bogus, seq] {
            publ.publish(&Frame {
                seq: s,
                payload: fr[0].payload.clone(),
            })
            .await;
        }
    }
    wait_until("seq 6 applied", || kv(&ingest, NO_HTTP).last_seq == Some(6)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.gaps, k.resets, k.duplicates), (4, 4, 0), "{k:?}");
    assert_eq!(k.missed, u64::MAX);
    assert_eq!(index(&shared).0, reference(&fr, &[0]).0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_replayed_before_the_first_block_size_report_are_kept() {
    let fr = frames();
    let worker = MetricsWorker::start().await;
    let address = &worker.address;
    // The worker has been running (it published 0..=3); its block size (32) is not the
    // gateway's default (16 here), and the worker set declares none.
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(fr[..4].to_vec()));
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let replay_port = replay_server(buffer, requests).await;
    let publ = Publisher::bind().await;
    let (shared, ingest) =
        worker.ingest_into(state_with(address, 16, false), publ.port, Some(replay_port));
    // The catch-up replay comes before any scrape reports the size: its events carry it.
    wait_until("buffer replayed", || {
        kv(&ingest, address).last_seq == Some(3)
    })
    .await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
    assert_eq!(shared.with(|st| st.worker_sets[WS].block_size), 32);

    // Now the metrics report it: the same size, nothing is dropped.
    worker
        .block_size
        .store(32, std::sync::atomic::Ordering::SeqCst);
    wait_until("block size scraped", || {
        ingest
            .endpoint_status(WS, address)
            .and_then(|s| s.scrape.cache_config)
            .is_some_and(|c| c.block_size == Some(32))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
    let s = ingest.endpoint_status(WS, address).unwrap();
    assert!(!s.scrape.block_size_mismatch);
    let k = s.kv.unwrap();
    assert_eq!((k.resets, k.reconnects), (0, 0), "{k:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_of_one_data_parallel_rank_leaves_the_other_ranks_blocks() {
    let fr = frames();
    let mut rank0 = Publisher::bind().await;
    let mut rank1 = Publisher::bind().await;
    let source = |port: u16| {
        format!(
            r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{port}","replay_endpoint":null,"topic":"{TOPIC}"}}"#
        )
    };
    let body = format!(
        r#"{{"0":{},"1":{}}}"#,
        source(rank0.port),
        source(rank1.port)
    );
    let (http_port, _server) = sources_server(body).await;
    let address = format!("127.0.0.1:{http_port}");
    let shared = state(&address);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(&address, None, None)]);
    rank0.await_subscriber(&ingest, &address).await;
    rank1.await_subscriber(&ingest, &address).await;
    // Both ranks cache the same prompts (same engine hashes).
    for f in &fr[..2] {
        rank0.publish(f).await;
        rank1.publish(f).await;
    }
    wait_until("both ranks' batches", || {
        kv(&ingest, &address).messages >= 4
    })
    .await;
    let both = reference(&fr, &[0, 1]).0;
    wait_until("both indexed", || index(&shared).0 == 2 * both).await;
    // Rank 1 misses a batch (no replay socket): its blocks are forgotten, rank 0's are not.
    rank1.publish(&fr[3]).await;
    wait_until("rank 1 reset", || kv(&ingest, &address).resets == 1).await;
    wait_until("rank 1's seq 3 applied", || {
        index(&shared).0 == both + reference(&fr, &[3]).0
    })
    .await;
    // The endpoint still matches what rank 0 holds: its engine hashes are all there.
    let held = shared.with(|st| match &st.worker_sets[WS].prefix {
        PrefixTracking::Exact(i) => i.engine_hashes(EndpointId(0)),
        PrefixTracking::Approximate(_) => panic!("approximate"),
    });
    let mut rank0_hashes = PrefixIndex::new(32);
    for f in &fr[..2] {
        let (_, events, _) = decode_payload(&f.payload).unwrap();
        rank0_hashes.apply_all(EndpointId(0), &events);
    }
    for h in rank0_hashes.engine_hashes(EndpointId(0)) {
        assert!(held.contains(&h), "rank 0's block {h} was forgotten");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_block_size_catches_the_kv_events_up_again() {
    let fr = frames();
    let worker = MetricsWorker::start().await;
    let address = &worker.address;
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(fr[..4].to_vec()));
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let replay_port = replay_server(buffer, requests.clone()).await;
    let publ = Publisher::bind().await;
    let (shared, ingest) =
        worker.ingest_into(state_with(address, 32, false), publ.port, Some(replay_port));
    wait_until("buffer replayed", || {
        kv(&ingest, address).last_seq == Some(3)
    })
    .await;
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
    assert_eq!(requests.load(std::sync::atomic::Ordering::SeqCst), 1);
    // Every worker of the set now reports another size (after a rolling upgrade): it is
    // adopted, the index starts over, and the subscriber asks the replay buffer again.
    worker
        .block_size
        .store(16, std::sync::atomic::Ordering::SeqCst);
    wait_until("caught up again", || {
        requests.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    shared.with(|st| {
        let ws = &st.worker_sets[WS];
        assert_eq!((ws.block_size, ws.block_size_resyncs), (16, 1));
    });
    wait_until("reconnected", || kv(&ingest, address).reconnects >= 1).await;
    // (The fixture's events are of the old size: not indexed at the new one.)
    assert_eq!(index(&shared).0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_scrape_interval_leaves_the_kv_subscription_in_sequence() {
    let fr = frames();
    let mut publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    let before = spec(NO_HTTP, Some(publ.port), None);
    ingest.sync_endpoints(vec![before.clone()]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    publ.publish(&fr[0]).await;
    publ.publish(&fr[1]).await;
    wait_until("seq 1 applied", || kv(&ingest, NO_HTTP).last_seq == Some(1)).await;

    // A policy change touches only the metrics settings: the scraper is restarted, the KV
    // subscriber is not. (Restarted, it would take the next message, 2, for a gap from 0 and,
    // without a replay socket, forget what the endpoint caches; vLLM never reports those
    // blocks again.)
    let mut changed = before.clone();
    changed.metrics_interval = Duration::from_secs(1800);
    changed.metrics_path = "/other-metrics".into();
    ingest.sync_endpoints(vec![changed.clone()]);
    assert_eq!(ingest.endpoints(), vec![changed.clone()]);
    publ.await_subscriber(&ingest, NO_HTTP).await;
    publ.publish(&fr[2]).await;
    publ.publish(&fr[3]).await;
    wait_until("seq 3 applied", || kv(&ingest, NO_HTTP).last_seq == Some(3)).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.gaps, k.resets, k.reconnects), (0, 0, 0), "{k:?}");
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));

    // A changed `kvEvents` does renew the subscription (fresh `kv` counters): here a replay
    // socket was added, which the new subscriber catches up from.
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(fr[..4].to_vec()));
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let replay_port = replay_server(buffer, requests.clone()).await;
    let mut with_replay = changed.clone();
    with_replay.kv_events.as_mut().unwrap().replay_port = Some(replay_port);
    ingest.sync_endpoints(vec![with_replay]);
    wait_until("caught up", || kv(&ingest, NO_HTTP).replays == 1).await;
    let k = kv(&ingest, NO_HTTP);
    assert_eq!((k.messages, k.last_seq), (0, Some(3)), "{k:?}");
    assert_eq!(
        k.replay_endpoints,
        vec![format!("tcp://127.0.0.1:{replay_port}")]
    );
    assert_eq!(index(&shared), reference(&fr, &[0, 1, 2, 3]));
}

/// A ZMTP 3.0 `PUB` peer written by hand, to send what zeromq's `PubSocket` does not: after
/// the handshake, its first connection gets a second `READY` command (the zeromq crate's
/// `SubSocket::recv` panics on a command frame), every later one `message`. Returns its port
/// and the number of connections accepted.
async fn raw_publisher(message: Vec<Vec<u8>>) -> (u16, Arc<std::sync::atomic::AtomicU32>) {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let count = accepted.clone();
    let mut greeting = [0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3; // ZMTP 3.0
    greeting[12..16].copy_from_slice(b"NULL");
    let mut ready = vec![5u8];
    ready.extend_from_slice(b"READY");
    ready.push(11);
    ready.extend_from_slice(b"Socket-Type");
    ready.extend_from_slice(&3u32.to_be_bytes());
    ready.extend_from_slice(b"PUB");
    let ready = [vec![0x04, ready.len() as u8], ready].concat();
    let mut wire = Vec::new();
    for (i, f) in message.iter().enumerate() {
        let more = u8::from(i + 1 < message.len());
        if f.len() > 255 {
            wire.push(more | 0x02);
            wire.extend_from_slice(&(f.len() as u64).to_be_bytes());
        } else {
            wire.push(more);
            wire.push(f.len() as u8);
        }
        wire.extend_from_slice(f);
    }
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (ready, wire) = (ready.clone(), wire.clone());
            tokio::spawn(async move {
                stream.write_all(&greeting).await.unwrap();
                stream.write_all(&ready).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let after = if n == 0 { &ready } else { &wire };
                let _ = stream.write_all(after).await;
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    (port, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_panics_is_restarted_and_the_endpoint_reset() {
    let fr = frames();
    let (port, accepted) = raw_publisher(vec![
        TOPIC.into(),
        0i64.to_be_bytes().to_vec(),
        fr[0].payload.clone(),
    ])
    .await;
    let shared = state(NO_HTTP);
    // What the index knew of the endpoint before: a panic may leave a batch half applied,
    // and the restarted subscriber has lost its place in the stream.
    shared.with(|st| {
        let ws = st.worker_sets.get_mut(WS).unwrap();
        let (_, events, _) = decode_payload(&fr[3].payload).unwrap();
        ws.apply_kv_events(NO_HTTP, &events);
    });
    assert_eq!(index(&shared).0, reference(&fr, &[3]).0);
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(port), None)]);
    // The first connection makes the zeromq crate panic inside the subscriber. It used to end
    // the task: no reconnect, no more events, `connected` true and no error, ever.
    wait_until("the publisher's message after the panic", || {
        kv(&ingest, NO_HTTP).last_seq == Some(0)
    })
    .await;
    assert!(accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    let k = kv(&ingest, NO_HTTP);
    assert!(
        k.last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("subscriber panicked")),
        "{k:?}"
    );
    assert!(k.connected && k.resets >= 1 && k.reconnects >= 1, "{k:?}");
    // What was known before the panic is forgotten; what came after is indexed.
    let held = |shared: &SharedState| {
        shared.with(|st| match &st.worker_sets[WS].prefix {
            PrefixTracking::Exact(i) => {
                let mut h = i.engine_hashes(EndpointId(0));
                h.sort_unstable();
                h
            }
            PrefixTracking::Approximate(_) => panic!("approximate"),
        })
    };
    let mut after = PrefixIndex::new(32);
    let (_, events, _) = decode_payload(&fr[0].payload).unwrap();
    after.apply_all(EndpointId(0), &events);
    let mut expected = after.engine_hashes(EndpointId(0));
    expected.sort_unstable();
    assert!(!expected.is_empty());
    assert_eq!(held(&shared), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_catch_up_lets_decisions_in_between_its_slices() {
    use kinf_handler::live::kv_subscriber::MAX_BLOCKS_PER_LOCK;
    use kinf_router::kv_events::{BlockStored, KvEvent, Medium, encode_payload};
    // The worker's replay buffer holds many long prompts: 20 times what is applied under one
    // lock.
    let per_batch = 256usize;
    let batches = 20 * MAX_BLOCKS_PER_LOCK / per_batch;
    let buffered: Vec<Frame> = (0..batches)
        .map(|i| {
            let stored = BlockStored {
                block_hashes: (0..per_batch).map(|b| (i * per_batch + b) as u64).collect(),
                parent: None,
                token_ids: (0..per_batch * 32)
                    .map(|t| (i * 1_000_000 + t) as u32)
                    .collect(),
                block_size: 32,
                medium: Some(Medium::Gpu),
                ..BlockStored::default()
            };
            Frame {
                seq: i as i64,
                payload: encode_payload(1.0, &[KvEvent::BlockStored(stored)], Some(0)),
            }
        })
        .collect();
    let total = batches * per_batch;
    let buffer: Buffer = Arc::new(parking_lot::Mutex::new(buffered));
    let requests = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let replay_port = replay_server(buffer, requests).await;
    let publ = Publisher::bind().await;
    let shared = state(NO_HTTP);
    // A decision's view of the index while the catch-up is applied.
    let watcher = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            let mut partial = std::collections::BTreeSet::new();
            loop {
                let blocks = index(&shared).0;
                if blocks == total || std::time::Instant::now() > deadline {
                    return (blocks, partial);
                }
                if blocks > 0 {
                    partial.insert(blocks);
                }
            }
        })
    };
    let ingest = LiveIngest::with_config(shared.clone(), config());
    ingest.sync_endpoints(vec![spec(NO_HTTP, Some(publ.port), Some(replay_port))]);
    let (blocks, partial) = tokio::task::spawn_blocking(move || watcher.join().unwrap())
        .await
        .unwrap();
    assert_eq!(blocks, total);
    // Applied at once, the catch-up would have held the lock, and every decision, from the
    // empty index to the full one.
    assert!(
        !partial.is_empty(),
        "no decision got in during the catch-up"
    );
    assert!(partial.iter().all(|&b| b < total));
    wait_until("every batch counted", || {
        kv(&ingest, NO_HTTP).last_seq == Some(batches as i64 - 1)
    })
    .await;
}
