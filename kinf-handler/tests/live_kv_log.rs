//! What the KV-event subscriber logs (a test binary of its own: it installs the process's
//! global log subscriber).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kinf_handler::live::{EndpointSpec, KvStatus, LiveConfig, LiveIngest, SharedState};
use kinf_lang::compiled::KvEventsInfo;
use kinf_router::ClusterState;
use kinf_router::kv_events::{BlockStored, KvEvent, Medium, encode_payload};
use kinf_router::predictor::TtftModel;
use kinf_router::prefix_index::{EndpointId, PrefixIndex};
use kinf_router::state::{EndpointState, LoadWindow, PrefixTracking, WorkerSetState};
use zeromq::{Endpoint, PubSocket, Socket, SocketSend, ZmqMessage};

const WS: &str = "default/pool";
const TOPIC: &str = "kv@pod-b@tiny";
const ADDRESS: &str = "127.0.0.1:9";

/// Everything logged, as text.
#[derive(Clone, Default)]
struct LogCapture(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn state() -> Arc<SharedState> {
    let mut st = ClusterState::default();
    st.worker_sets.insert(
        WS.into(),
        WorkerSetState {
            endpoints: vec![EndpointState {
                address: ADDRESS.into(),
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
            prefix: PrefixTracking::Exact(PrefixIndex::new(32)),
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

fn kv(ingest: &LiveIngest) -> KvStatus {
    ingest.endpoint_status(WS, ADDRESS).unwrap().kv.unwrap()
}

fn blocks(shared: &SharedState) -> usize {
    shared.with(|st| match &st.worker_sets[WS].prefix {
        PrefixTracking::Exact(i) => i.endpoint_blocks(EndpointId(0)),
        PrefixTracking::Approximate(_) => panic!("approximate"),
    })
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn msg(frames: Vec<Vec<u8>>) -> ZmqMessage {
    ZmqMessage::try_from(frames.into_iter().map(Bytes::from).collect::<Vec<_>>()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_messages_are_counted_and_logged_without_flooding_the_log() {
    let logs = LogCapture::default();
    let sink = logs.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    )
    .unwrap();
    let mut publ = PubSocket::new();
    let port = match publ.bind("tcp://127.0.0.1:0").await.unwrap() {
        Endpoint::Tcp(_, p) => p,
        _ => panic!("not tcp"),
    };
    let shared = state();
    let ingest = LiveIngest::with_config(
        shared.clone(),
        LiveConfig {
            retry_delay: Duration::from_millis(50),
            ..LiveConfig::default()
        },
    );
    ingest.sync_endpoints(vec![EndpointSpec {
        worker_set: WS.into(),
        address: ADDRESS.into(),
        metrics_path: "/metrics".into(),
        metrics_interval: Duration::from_secs(3600),
        kv_events: Some(KvEventsInfo {
            port: Some(port),
            replay_port: None,
            topic: TOPIC.into(),
        }),
    }]);
    let stored = KvEvent::BlockStored(BlockStored {
        block_hashes: [1u64, 2].into_iter().collect(),
        parent: None,
        token_ids: (0..64).collect(),
        block_size: 32,
        medium: Some(Medium::Gpu),
        ..BlockStored::default()
    });
    let good = encode_payload(1.0, &[stored], Some(0));
    let bad = [
        // Not msgpack; a truncated payload; a sequence frame of the wrong length.
        vec![TOPIC.into(), 0i64.to_be_bytes().to_vec(), b"\xc1".to_vec()],
        vec![
            TOPIC.into(),
            0i64.to_be_bytes().to_vec(),
            good[..good.len() / 2].to_vec(),
        ],
        vec![TOPIC.into(), vec![0; 3], good.clone()],
    ];
    // Until the subscription has reached the publisher, messages are lost: send until one
    // was counted, then the rest.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while kv(&ingest).decode_errors == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no subscriber");
        publ.send(msg(bad[0].clone())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..4 {
        for m in &bad {
            publ.send(msg(m.clone())).await.unwrap();
        }
    }
    publ.send(msg(vec![
        TOPIC.into(),
        0i64.to_be_bytes().to_vec(),
        good.clone(),
    ]))
    .await
    .unwrap();
    // The good message is applied; the bad ones only counted.
    wait_until("seq 0 applied", || kv(&ingest).last_seq == Some(0)).await;
    assert_eq!(blocks(&shared), 2);
    let total = kv(&ingest).decode_errors;
    assert!(total >= 13, "{total}");
    let text = String::from_utf8(logs.0.lock().clone()).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("undecodable KV-event message"))
        .collect();
    // At the 1st, 2nd, 4th, 8th… error of the subscription: a few lines, not one per message.
    let logged = (1..=total).filter(|n| n.is_power_of_two()).count();
    assert_eq!(warnings.len(), logged, "{text}");
    assert!(
        warnings
            .iter()
            .all(|l| l.contains(ADDRESS) && l.contains("decode_errors")),
        "{text}"
    );
}
