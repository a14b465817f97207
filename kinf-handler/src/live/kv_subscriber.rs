//! Per-endpoint KV-event subscriber.
//!
//! The task resolves the endpoint's publishers (the configured port, or vLLM's
//! `GET /kv_event_sources`, see [`super::discovery`]), then for each publisher connects a `SUB`
//! socket, subscribes to the topic and decodes every `[topic, seq, payload]` message with
//! [`kinf_router::kv_events::decode_message`]. Sequence numbers are tracked with a
//! [`SeqTracker`]:
//!
//! * in order: applied to the worker set's prefix index, a receive burst (or a replay) under
//!   one lock per [`MAX_BLOCKS_PER_LOCK`] blocks;
//! * duplicate: dropped;
//! * gap (`expected..got` missing): when a replay endpoint is known, a `DEALER` asks vLLM's
//!   replay `ROUTER` for `expected` onwards (`["", expected]`, answers `["", topic, seq,
//!   payload]`…, end marker seq `-1`); the missing batches are applied in order, then the live
//!   one. Without a replay endpoint, or when the replay fails (timeout, missing sequence numbers,
//!   end before `got`), the endpoint's index is reset and the live batch applied;
//! * restart (sequence back to 0, or lower than expected on a new connection): the publisher
//!   restarted with an empty cache, so the endpoint's index is reset.
//!
//! A connection that receives nothing for [`LiveConfig::kv_idle_reconnect`] is renewed, since
//! the zeromq crate neither reconnects nor reports a lost publisher; so is one whose endpoint
//! the health checks turn not ready (it reconnects, failing, until the worker is back). So is
//! one whose worker process the scraper saw restart (`process_start_time_seconds` changed; the
//! scraper resets the index): a restarted worker that published more batches than the old one
//! before the subscriber noticed would otherwise look like a gap, "filled" from the new
//! process's buffer.
//!
//! With a replay endpoint, a subscriber without history (gateway start, endpoint added, worker
//! restarted) asks for everything the publisher still buffers as soon as it connects, rather
//! than waiting for a live message to show the gap.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures_util::FutureExt;
use kinf_lang::compiled::KvEventsInfo;
use kinf_router::kv_events::{
    EventBatch, KvEvent, ReplayItem, SeqStatus, SeqTracker, decode_message, decode_replay_reply,
    replay_request_frames,
};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::SharedState;
use super::config::LiveConfig;
use super::discovery::{KvSource, parse_sources, tcp_endpoint};
use super::http_get::HttpGet;
use super::status::EndpointStats;

/// Most messages received in one burst.
const MAX_BURST: usize = 256;

/// Most blocks (stored or removed; an event without blocks counts as one) applied under one
/// lock of the state. Decisions take the same lock: a replay of vLLM's whole buffer (10,000
/// batches by default) applied at once would hold every request's routing for as long as
/// indexing all of it takes.
pub const MAX_BLOCKS_PER_LOCK: usize = 4096;

/// The KV events of one endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct KvTarget {
    /// `namespace/name` of the worker set.
    pub worker_set: Arc<str>,
    /// `host:port` of the worker's HTTP server.
    pub address: Arc<str>,
    /// Publisher settings from the policy.
    pub kv: KvEventsInfo,
}

struct Ctx {
    shared: Arc<SharedState>,
    target: KvTarget,
    config: LiveConfig,
    stats: Arc<EndpointStats>,
}

/// Runs the subscriber(s) of one endpoint until the task is aborted.
pub async fn run_kv_subscriber(
    shared: Arc<SharedState>,
    target: KvTarget,
    config: LiveConfig,
    stats: Arc<EndpointStats>,
    http: HttpGet,
) {
    let ctx = Ctx {
        shared,
        target,
        config,
        stats,
    };
    let sources = ctx.sources(&http).await;
    ctx.stats.kv(|k| {
        k.publishers = sources.iter().map(|s| s.endpoint.clone()).collect();
        k.replay_endpoints = sources
            .iter()
            .filter_map(|s| s.replay_endpoint.clone())
            .collect();
        k.topic = sources.first().map(|s| s.topic.clone()).unwrap_or_default();
    });
    let connected = AtomicUsize::new(0);
    let n = sources.len();
    futures_util::future::join_all(sources.into_iter().enumerate().map(|(i, s)| {
        // Each data-parallel rank's blocks are tracked apart in the index.
        let rank = s.rank.parse().unwrap_or(i as u32);
        ctx.run_source(s, rank, n, &connected)
    }))
    .await;
}

impl Ctx {
    /// The configured publisher, or the discovered ones (retrying until discovery succeeds).
    async fn sources(&self, http: &HttpGet) -> Vec<KvSource> {
        let addr = &*self.target.address;
        if let Some(port) = self.target.kv.port {
            return vec![KvSource {
                rank: "0".into(),
                endpoint: tcp_endpoint(addr, port),
                replay_endpoint: self.target.kv.replay_port.map(|p| tcp_endpoint(addr, p)),
                topic: self.target.kv.topic.to_string(),
            }];
        }
        let url = format!("http://{addr}/kv_event_sources");
        loop {
            let r = http
                .get(&url, self.config.connect_timeout)
                .await
                .and_then(|body| parse_sources(&body, addr));
            match r {
                Ok(mut sources) => {
                    // A replay port in the policy overrides the discovered one.
                    if let Some(p) = self.target.kv.replay_port {
                        for s in &mut sources {
                            s.replay_endpoint = Some(tcp_endpoint(addr, p));
                        }
                    }
                    return sources;
                }
                Err(e) => {
                    tracing::debug!(endpoint = %addr, error = %e, "KV-event discovery failed");
                    self.kv_error(e);
                    tokio::time::sleep(self.config.retry_delay).await;
                }
            }
        }
    }

    async fn run_source(
        &self,
        src: KvSource,
        rank: u32,
        n_sources: usize,
        connected: &AtomicUsize,
    ) {
        let mut tracker = SeqTracker::new();
        // Restarts of the worker process that its metrics show (the scraper has reset the
        // index): the connection and the sequence numbers are the old process's.
        let mut incarnation = self.stats.incarnation.subscribe();
        incarnation.mark_unchanged();
        // The endpoint turned not ready: its publisher is likely gone; reconnect (failing, and
        // `connected: false`, until it is back) rather than wait out the idle timeout.
        let mut unready = self.stats.unready.subscribe();
        unready.mark_unchanged();
        // The worker set adopted another block size after its index had learned or rejected
        // blocks: what this publisher still buffers is indexed again at the new size (without
        // a replay socket there is nothing to catch up from).
        let mut resync = self.stats.resync.subscribe();
        resync.mark_unchanged();
        let can_replay = src.replay_endpoint.is_some();
        let mut first = true;
        loop {
            if !first {
                self.stats.kv(|k| k.reconnects += 1);
            }
            first = false;
            let mut sock = SubSocket::new();
            if let Err(e) = sock.subscribe(&src.topic).await {
                self.fail(format!("subscribe: {e}")).await;
                continue;
            }
            match tokio::time::timeout(self.config.connect_timeout, sock.connect(&src.endpoint))
                .await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.fail(format!("connect {}: {e}", src.endpoint)).await;
                    continue;
                }
                Err(_) => {
                    self.fail(format!("connect {}: timed out", src.endpoint))
                        .await;
                    continue;
                }
            }
            let c = connected.fetch_add(1, Ordering::Relaxed) + 1;
            self.stats.kv(|k| k.connected = c == n_sources);
            let mut fresh = true;
            if tracker.expected() == 0
                && let Some(r) = &src.replay_endpoint
            {
                self.catch_up(&mut tracker, &mut fresh, r, rank).await;
            }
            loop {
                let received = tokio::select! {
                    r = tokio::time::timeout(self.config.kv_idle_reconnect, sock.recv()) => r,
                    Ok(()) = incarnation.changed() => {
                        tracing::info!(endpoint = %self.target.address, "worker process restarted: renewing the KV-event subscription");
                        tracker = SeqTracker::new();
                        break;
                    }
                    Ok(()) = unready.changed() => {
                        tracing::info!(endpoint = %self.target.address, "endpoint not ready: renewing the KV-event subscription");
                        break;
                    }
                    Ok(()) = resync.changed(), if can_replay => {
                        tracing::info!(endpoint = %self.target.address, "block size changed: catching up from the replay buffer");
                        tracker = SeqTracker::new();
                        break;
                    }
                };
                let msg = match received {
                    Err(_) => break,
                    Ok(Err(e)) => {
                        self.kv_error(format!("receive: {e}"));
                        break;
                    }
                    Ok(Ok(m)) => m,
                };
                let mut burst = vec![msg];
                while burst.len() < MAX_BURST {
                    match sock.recv().now_or_never() {
                        Some(Ok(m)) => burst.push(m),
                        _ => break,
                    }
                }
                self.process(&mut tracker, &mut fresh, &src, rank, burst)
                    .await;
            }
            connected.fetch_sub(1, Ordering::Relaxed);
            self.stats.kv(|k| k.connected = false);
        }
    }

    /// Joining a publisher with a replay socket and no history (gateway start, endpoint
    /// added, worker restarted): asks for everything it still buffers, so that the blocks it
    /// stored before are known now rather than at its next event. Without it (the replay socket
    /// does not answer), the first live message is a gap from 0, replayed then.
    async fn catch_up(
        &self,
        tracker: &mut SeqTracker,
        fresh: &mut bool,
        replay_endpoint: &str,
        rank: u32,
    ) {
        match replay_buffered(replay_endpoint.to_owned(), self.config).await {
            Ok(batches) => {
                let mut pending: Vec<EventBatch> = batches
                    .into_iter()
                    .filter(|b| tracker.observe_replayed(b.seq) != SeqStatus::Duplicate)
                    .collect();
                if !pending.is_empty() {
                    self.stats.kv(|k| k.replays += 1);
                }
                self.flush(rank, &mut pending);
                // Live messages numbered below what the replay gave are duplicates, not a
                // restart.
                *fresh = false;
            }
            Err(e) => {
                tracing::debug!(endpoint = %self.target.address, error = %e, "KV-event catch-up replay failed");
                self.kv_error(format!("catch-up replay: {e}"));
            }
        }
    }

    /// Records `error` as the last KV error, at the server's time now.
    fn kv_error(&self, error: String) {
        let now = self.shared.now_ms();
        self.stats.kv(|k| k.error(error, now));
    }

    async fn fail(&self, e: String) {
        tracing::debug!(endpoint = %self.target.address, error = %e, "KV-event subscriber");
        self.kv_error(e);
        tokio::time::sleep(self.config.retry_delay).await;
    }

    async fn process(
        &self,
        tracker: &mut SeqTracker,
        fresh: &mut bool,
        src: &KvSource,
        rank: u32,
        burst: Vec<ZmqMessage>,
    ) {
        let mut pending: Vec<EventBatch> = Vec::with_capacity(burst.len());
        for m in burst {
            let frames: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
            let batch = match decode_message(&frames) {
                Ok(b) => b,
                Err(e) => {
                    let now = self.shared.now_ms();
                    let mut count = 0;
                    self.stats.kv(|k| {
                        k.decode_errors += 1;
                        count = k.decode_errors;
                        k.error(format!("decode: {e}"), now);
                    });
                    // Logged at the 1st, 2nd, 4th, 8th… error: a publisher sending nothing but
                    // undecodable messages (a newer wire format) does not flood the log.
                    if count.is_power_of_two() {
                        tracing::warn!(
                            endpoint = %self.target.address, publisher = %src.endpoint,
                            decode_errors = count, error = %e,
                            "undecodable KV-event message skipped"
                        );
                    }
                    continue;
                }
            };
            let now = self.shared.now_ms();
            self.stats.kv(|k| {
                k.messages += 1;
                k.last_message_ms = Some(now);
            });
            if std::mem::take(fresh) && batch.seq > 0 && batch.seq < tracker.expected() {
                // A new connection to a publisher that restarted while we were away.
                self.flush(rank, &mut pending);
                self.reset(rank, "publisher restarted (sequence went back)");
                self.stats.kv(|k| {
                    k.restarts += 1;
                    k.last_restart_unix_s = Some(unix_now_s());
                });
                *tracker = SeqTracker::new();
            }
            let rebases = tracker.rebases();
            match tracker.observe(batch.seq) {
                SeqStatus::InOrder => {
                    if tracker.rebases() != rebases {
                        tracing::info!(
                            endpoint = %self.target.address, seq = batch.seq,
                            "KV-event sequence went back after an unfilled gap: continuing from it"
                        );
                    }
                    pending.push(batch);
                }
                SeqStatus::Duplicate => self.stats.kv(|k| k.duplicates += 1),
                SeqStatus::Restart { .. } => {
                    self.flush(rank, &mut pending);
                    self.reset(rank, "publisher restarted (sequence 0)");
                    self.stats.kv(|k| {
                        k.restarts += 1;
                        k.last_restart_unix_s = Some(unix_now_s());
                    });
                    pending.push(batch);
                }
                SeqStatus::Gap { expected, got } => {
                    self.flush(rank, &mut pending);
                    self.stats.kv(|k| {
                        k.gaps += 1;
                        k.missed = k.missed.saturating_add(got.abs_diff(expected));
                    });
                    tracing::info!(
                        endpoint = %self.target.address, expected, got,
                        "KV-event sequence gap"
                    );
                    let mut filled = false;
                    if let Some(r) = &src.replay_endpoint {
                        match replay(r.clone(), expected, got, self.config).await {
                            Ok(mut batches) => {
                                self.flush(rank, &mut batches);
                                self.stats.kv(|k| k.replays += 1);
                                filled = true;
                            }
                            Err(e) => {
                                tracing::warn!(endpoint = %self.target.address, error = %e, "KV-event replay failed");
                                let now = self.shared.now_ms();
                                self.stats.kv(|k| {
                                    k.replay_failures += 1;
                                    k.error(format!("replay: {e}"), now);
                                });
                            }
                        }
                    }
                    if !filled {
                        self.reset(rank, "unfilled sequence gap");
                        // Had `got` been bogus (far ahead of the publisher), every genuine
                        // batch after it would now look like a duplicate: the next lower one
                        // from `expected` on continues the stream instead.
                        tracker.rebase_after_reset(expected);
                    }
                    pending.push(batch);
                }
            }
        }
        self.flush(rank, &mut pending);
    }

    /// Applies batches of data-parallel rank `rank`, in order, taking the state's lock once
    /// per [`MAX_BLOCKS_PER_LOCK`] blocks (a batch may be split between two).
    fn flush(&self, rank: u32, pending: &mut Vec<EventBatch>) {
        let Some(last) = pending.last().map(|b| b.seq) else {
            return;
        };
        let events: usize = pending.iter().map(|b| b.events.len()).sum();
        {
            let mut slices: Vec<&[KvEvent]> = Vec::new();
            let mut blocks = 0usize;
            for b in pending.iter() {
                let mut start = 0;
                for (i, e) in b.events.iter().enumerate() {
                    blocks += event_blocks(e);
                    if blocks >= MAX_BLOCKS_PER_LOCK {
                        slices.extend(b.events.get(start..=i));
                        self.apply_slices(rank, &mut slices);
                        start = i + 1;
                        blocks = 0;
                    }
                }
                slices.extend(b.events.get(start..).filter(|s| !s.is_empty()));
            }
            self.apply_slices(rank, &mut slices);
        }
        pending.clear();
        self.stats.kv(|k| {
            k.events += events as u64;
            k.last_seq = Some(last);
        });
    }

    /// Applies `slices` (events of rank `rank`, in order) under one lock, and empties it.
    fn apply_slices(&self, rank: u32, slices: &mut Vec<&[KvEvent]>) {
        if slices.is_empty() {
            return;
        }
        let (key, addr) = (&*self.target.worker_set, &*self.target.address);
        self.shared.with_fair(|st| {
            if let Some(ws) = st.worker_sets.get_mut(key) {
                for events in slices.iter() {
                    ws.apply_rank_kv_events(addr, rank, events);
                }
            }
        });
        slices.clear();
    }

    /// Forgets what rank `rank` of the endpoint caches (its other ranks keep theirs).
    fn reset(&self, rank: u32, why: &str) {
        tracing::info!(endpoint = %self.target.address, rank, why, "resetting the endpoint's prefix index");
        let (key, addr) = (&*self.target.worker_set, &*self.target.address);
        self.shared.with(|st| {
            if let Some(ws) = st.worker_sets.get_mut(key) {
                ws.reset_endpoint_rank(addr, rank);
            }
        });
        self.stats.kv(|k| k.resets += 1);
    }
}

/// What applying `e` costs, in blocks (at least 1).
fn event_blocks(e: &KvEvent) -> usize {
    match e {
        KvEvent::BlockStored(s) => s.block_hashes.len().max(1),
        KvEvent::BlockRemoved(r) => r.block_hashes.len().max(1),
        KvEvent::AllBlocksCleared | KvEvent::Unknown(_) => 1,
    }
}

/// This host's clock, Unix seconds.
fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Fetches batches `from..until` from a replay `ROUTER`, in a task of its own (within
/// [`LiveConfig::replay_timeout`]).
pub async fn replay(
    endpoint: String,
    from: i64,
    until: i64,
    config: LiveConfig,
) -> Result<Vec<EventBatch>, String> {
    replay_task(endpoint, from, Some(until), config).await
}

/// Fetches every batch a replay `ROUTER` still buffers, oldest first (within
/// [`LiveConfig::replay_timeout`]); the buffer may start after 0.
pub async fn replay_buffered(
    endpoint: String,
    config: LiveConfig,
) -> Result<Vec<EventBatch>, String> {
    replay_task(endpoint, 0, None, config).await
}

async fn replay_task(
    endpoint: String,
    from: i64,
    until: Option<i64>,
    config: LiveConfig,
) -> Result<Vec<EventBatch>, String> {
    let t = config.replay_timeout;
    let task = tokio::spawn(async move {
        match tokio::time::timeout(t, replay_inner(&endpoint, from, until)).await {
            Ok(r) => r,
            Err(_) => Err(format!("{endpoint}: timed out after {t:?}")),
        }
    });
    task.await.map_err(|e| format!("replay task failed: {e}"))?
}

/// A `DEALER` connected to a replay `ROUTER` that has been asked for `from` onwards.
async fn replay_request(endpoint: &str, from: i64) -> Result<DealerSocket, String> {
    let mut d = DealerSocket::new();
    d.connect(endpoint)
        .await
        .map_err(|e| format!("connect {endpoint}: {e}"))?;
    let frames: Vec<Bytes> = replay_request_frames(from)
        .into_iter()
        .map(Bytes::from)
        .collect();
    let msg = ZmqMessage::try_from(frames).map_err(|e| e.to_string())?;
    d.send(msg).await.map_err(|e| format!("send: {e}"))?;
    Ok(d)
}

/// Batches `from..until` in order, or with `until: None` every batch still buffered from
/// `from` on (the buffer may start later; the end marker ends it).
async fn replay_inner(
    endpoint: &str,
    from: i64,
    until: Option<i64>,
) -> Result<Vec<EventBatch>, String> {
    let mut out = Vec::new();
    if until.is_some_and(|u| from >= u) {
        return Ok(out);
    }
    let mut d = replay_request(endpoint, from).await?;
    let mut next = from;
    loop {
        let m = d.recv().await.map_err(|e| format!("receive: {e}"))?;
        let frames: Vec<&[u8]> = m.iter().map(|b| b.as_ref()).collect();
        match decode_replay_reply(&frames).map_err(|e| format!("decode: {e}"))? {
            ReplayItem::End => {
                return match until {
                    None => Ok(out),
                    Some(until) => Err(format!("replay ended at {next}, before {until}")),
                };
            }
            ReplayItem::Batch(b) if b.seq < next => {}
            ReplayItem::Batch(b) if b.seq > next && until.is_some() => {
                return Err(format!(
                    "replay skipped from {next} to {} (no longer buffered)",
                    b.seq
                ));
            }
            ReplayItem::Batch(b) => {
                next = b.seq + 1;
                out.push(b);
                if until.is_some_and(|u| next >= u) {
                    return Ok(out);
                }
            }
        }
    }
}
