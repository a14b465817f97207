//! The KV-event publisher: a ZMQ `PUB` socket sending vLLM 0.32 frames
//! `[topic, seq (8-byte big-endian, from 0), msgpack payload]`, a bounded replay buffer, and the
//! replay `ROUTER` socket (a `DEALER` sends `["", start_seq]` and receives
//! `["", topic, seq, payload]` per buffered message with `seq ≥ start_seq`, then the end marker
//! `["", "", -1, ""]`; a request of any other shape is ignored, as vLLM does).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use kinf_router::kv_events::{KvEvent, encode_payload};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketRecv, SocketSend, ZmqMessage};

use super::faults::{SharedFaults, Stream};

/// What the driver sends the publisher.
#[derive(Debug)]
pub enum KvMsg {
    /// One engine step's events, already encoded.
    Batch {
        /// Unix timestamp in the payload.
        ts: f64,
        /// msgpack `[ts, events, dp_rank]`.
        payload: Vec<u8>,
    },
    /// Restart: sequence numbers start again at 0 and the replay buffer empties, as when vLLM
    /// restarts. With `synthetic_clear`, an `AllBlocksCleared` message is published first (the
    /// engine could not reset its cache itself).
    Restart {
        /// Publish an `AllBlocksCleared` message.
        synthetic_clear: bool,
        /// Its timestamp.
        ts: f64,
    },
}

/// Addresses of the bound sockets.
#[derive(Debug, Clone)]
pub struct KvEndpoints {
    /// PUB endpoint, e.g. `tcp://127.0.0.1:5557`.
    pub publisher: String,
    /// ROUTER endpoint, if replay is on.
    pub replay: Option<String>,
}

type Buffer = Arc<Mutex<VecDeque<(i64, Vec<u8>)>>>;

/// Binds the sockets and starts the publisher (and replay) tasks.
pub async fn start(
    host: &str,
    port: u16,
    replay_port: Option<u16>,
    topic: String,
    faults: SharedFaults,
    buffer_len: usize,
) -> Result<(KvEndpoints, mpsc::UnboundedSender<KvMsg>), String> {
    let mut pub_socket = zeromq::PubSocket::new();
    let ep = pub_socket
        .bind(&format!("tcp://{host}:{port}"))
        .await
        .map_err(|e| format!("binding the KV-event socket: {e}"))?;
    let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
    let replay = match replay_port {
        Some(rp) => {
            let mut router = zeromq::RouterSocket::new();
            let rep = router
                .bind(&format!("tcp://{host}:{rp}"))
                .await
                .map_err(|e| format!("binding the replay socket: {e}"))?;
            tokio::spawn(serve_replay(router, buffer.clone(), topic.clone()));
            Some(rep.to_string())
        }
        None => None,
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let publisher = Publisher {
        socket: pub_socket,
        topic,
        seq: 0,
        n: 0,
        buffer,
        buffer_len: buffer_len.max(1),
        faults,
        held: None,
    };
    tokio::spawn(publisher.run(rx));
    Ok((
        KvEndpoints {
            publisher: ep.to_string(),
            replay,
        },
        tx,
    ))
}

struct Publisher {
    socket: zeromq::PubSocket,
    topic: String,
    seq: i64,
    /// Messages seen (fault-decision counter).
    n: u64,
    buffer: Buffer,
    buffer_len: usize,
    faults: SharedFaults,
    /// A message held back by the reorder fault.
    held: Option<ZmqMessage>,
}

fn frames(topic: &str, seq: i64, payload: &[u8]) -> Option<ZmqMessage> {
    ZmqMessage::try_from(vec![
        Bytes::copy_from_slice(topic.as_bytes()),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::copy_from_slice(payload),
    ])
    .ok()
}

impl Publisher {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<KvMsg>) {
        loop {
            let msg = if self.held.is_some() {
                match tokio::time::timeout(Duration::from_millis(50), rx.recv()).await {
                    Ok(m) => m,
                    Err(_) => {
                        self.flush_held().await;
                        continue;
                    }
                }
            } else {
                rx.recv().await
            };
            let Some(msg) = msg else { break };
            match msg {
                KvMsg::Batch { payload, .. } => self.publish(payload).await,
                KvMsg::Restart {
                    synthetic_clear,
                    ts,
                } => {
                    self.flush_held().await;
                    self.seq = 0;
                    if let Ok(mut b) = self.buffer.lock() {
                        b.clear();
                    }
                    if synthetic_clear {
                        let payload = encode_payload(ts, &[KvEvent::AllBlocksCleared], Some(0));
                        self.publish(payload).await;
                    }
                }
            }
        }
    }

    async fn flush_held(&mut self) {
        if let Some(m) = self.held.take() {
            let _ = self.socket.send(m).await;
        }
    }

    async fn publish(&mut self, payload: Vec<u8>) {
        let seq = self.seq;
        self.seq += 1;
        let n = self.n;
        self.n += 1;
        let f = self.faults.get();
        let msg = frames(&self.topic, seq, &payload);
        if let Ok(mut b) = self.buffer.lock() {
            b.push_back((seq, payload));
            while b.len() > self.buffer_len {
                b.pop_front();
            }
        }
        let Some(msg) = msg else { return };
        if self.faults.roll(Stream::KvDrop, n, f.kv_drop_rate) {
            return;
        }
        if self.held.is_none() && self.faults.roll(Stream::KvReorder, n, f.kv_reorder_rate) {
            self.held = Some(msg);
            return;
        }
        let _ = self.socket.send(msg).await;
        self.flush_held().await;
    }
}

async fn serve_replay(mut router: zeromq::RouterSocket, buffer: Buffer, topic: String) {
    loop {
        let Ok(req) = router.recv().await else {
            continue;
        };
        let parts = req.into_vec();
        // vLLM 0.32 answers `[identity, "", start_seq]` only (any other frame count is logged
        // and ignored), reading `start_seq` as an unsigned big-endian integer.
        let [identity, _, start] = parts.as_slice() else {
            tracing::warn!(frames = parts.len(), "invalid replay request ignored");
            continue;
        };
        let identity = identity.clone();
        let start = replay_start(start);
        let items: Vec<(i64, Vec<u8>)> = match buffer.lock() {
            Ok(b) => b
                .iter()
                .filter(|(s, _)| u128::try_from(*s).is_ok_and(|s| s >= start))
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        };
        for (seq, payload) in items {
            let reply = vec![
                identity.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(topic.as_bytes()),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                Bytes::from(payload),
            ];
            if let Ok(m) = ZmqMessage::try_from(reply) {
                let _ = router.send(m).await;
            }
        }
        let end = vec![
            identity,
            Bytes::new(),
            Bytes::new(),
            Bytes::copy_from_slice(&(-1i64).to_be_bytes()),
            Bytes::new(),
        ];
        if let Ok(m) = ZmqMessage::try_from(end) {
            let _ = router.send(m).await;
        }
    }
}

/// `int.from_bytes(frame, "big")` as vLLM reads a replay request's start (saturating past
/// 128 bits, which no sequence number reaches).
fn replay_start(frame: &[u8]) -> u128 {
    let digits = frame
        .iter()
        .position(|&b| b != 0)
        .map_or(&[][..], |i| &frame[i..]);
    if digits.len() > 16 {
        return u128::MAX;
    }
    digits
        .iter()
        .fold(0u128, |acc, &b| (acc << 8) | u128::from(b))
}

#[cfg(test)]
mod tests {
    use super::replay_start;

    #[test]
    fn replay_start_reads_an_unsigned_big_endian_integer_of_any_length() {
        assert_eq!(replay_start(&[]), 0);
        assert_eq!(replay_start(&8i64.to_be_bytes()), 8);
        assert_eq!(replay_start(&[1, 0]), 256);
        // -1 as vLLM's DEALER clients never send it: unsigned, so past every sequence number.
        assert_eq!(replay_start(&(-1i64).to_be_bytes()), u128::from(u64::MAX));
        assert_eq!(replay_start(&[0xff; 17]), u128::MAX);
    }
}
