//! Wall-clock driving of the [`Engine`]: one task owns it, submits arrivals at the current
//! simulated time (wall time since start × `--speed`), sleeps until the engine's next event
//! and dispatches outputs to per-request channels and KV batches to the publisher.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot};

use super::kv_publisher::KvMsg;
use crate::{
    Engine, EngineMetrics, FinishReason, Gauges, Output, RejectReason, Request, RequestId,
    RequestStats,
};

/// Simulated time ↔ wall time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    epoch0: f64,
    speed: f64,
}

impl Clock {
    /// A clock starting now, running `speed` simulated seconds per wall second.
    pub fn new(speed: f64) -> Self {
        let epoch0 = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self {
            start: Instant::now(),
            epoch0,
            speed: if speed.is_finite() && speed > 0.0 {
                speed
            } else {
                1.0
            },
        }
    }

    /// Simulated seconds since start.
    pub fn sim_now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.speed
    }

    /// The wall instant of simulated time `t` (capped an hour ahead).
    pub fn instant_of(&self, t: f64) -> Instant {
        let wall = (t / self.speed).clamp(0.0, 3600.0 + self.start.elapsed().as_secs_f64());
        let d = Duration::try_from_secs_f64(wall).unwrap_or(Duration::ZERO);
        self.start.checked_add(d).unwrap_or(self.start)
    }

    /// Unix time of simulated time `t`.
    pub fn epoch_of(&self, t: f64) -> f64 {
        self.epoch0 + t / self.speed
    }

    /// Unix time the server started.
    pub fn epoch0(&self) -> f64 {
        self.epoch0
    }
}

/// What a request's channel receives.
#[derive(Debug, Clone)]
pub enum Event {
    /// A generated token.
    Token {
        /// Position among the output tokens.
        index: u32,
        /// Token id.
        token: u32,
    },
    /// The request finished.
    Finished {
        /// Why.
        reason: FinishReason,
        /// Its timings and token counts.
        stats: RequestStats,
    },
    /// The engine refused it.
    Rejected(RejectReason),
}

/// How a non-streamed request ended, for [`collect`].
#[derive(Debug)]
pub enum Collected {
    /// It finished: the generated text, why, and its stats.
    Done {
        /// The output text.
        text: String,
        /// Why it finished.
        reason: FinishReason,
        /// Timings and token counts.
        stats: RequestStats,
    },
    /// The die-mid-stream fault cut it: the connection must be dropped.
    Cut,
    /// The engine refused it.
    Rejected(RejectReason),
    /// The engine task is gone.
    Stopped,
}

/// Collects a non-streamed request's tokens as text; `die` cuts it after that many tokens.
pub async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    guard: &mut AbortGuard,
    tokens: &super::tokens::Tokens,
    die: Option<u32>,
) -> Collected {
    let mut text = String::new();
    let mut count = 0u32;
    loop {
        match rx.recv().await {
            Some(Event::Token { index, token }) => {
                count += 1;
                if die.is_some_and(|d| count > d) {
                    return Collected::Cut;
                }
                text.push_str(&tokens.piece(token, index));
            }
            Some(Event::Finished { reason, stats }) => {
                guard.disarm();
                if die.is_some_and(|d| count >= d) {
                    return Collected::Cut;
                }
                return Collected::Done {
                    text,
                    reason,
                    stats,
                };
            }
            Some(Event::Rejected(r)) => {
                guard.disarm();
                return Collected::Rejected(r);
            }
            None => return Collected::Stopped,
        }
    }
}

/// Engine state for `/metrics`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Gauges.
    pub gauges: Gauges,
    /// Counters and histograms.
    pub metrics: EngineMetrics,
}

enum Command {
    Submit(Request, mpsc::UnboundedSender<Event>),
    Abort(RequestId),
    Reset(oneshot::Sender<bool>),
    Snapshot(oneshot::Sender<Snapshot>),
    RestartPublisher(oneshot::Sender<bool>),
    CachedBlocks(oneshot::Sender<Vec<u64>>),
}

/// A handle on the driver task.
#[derive(Debug, Clone)]
pub struct Driver {
    tx: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// Aborts its request when dropped unless disarmed (client disconnects drop it).
#[derive(Debug)]
pub struct AbortGuard {
    id: RequestId,
    tx: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl AbortGuard {
    /// The request finished: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

impl Driver {
    /// Starts the driver task owning `engine`.
    pub fn spawn(engine: Engine, clock: Clock, kv: Option<mpsc::UnboundedSender<KvMsg>>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(engine, clock, rx, kv));
        Self {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Submits a prompt; returns its event channel and a guard that aborts it when dropped.
    pub fn submit(
        &self,
        prompt: impl Into<Arc<[u32]>>,
        max_tokens: u32,
        output_seed: u64,
    ) -> (mpsc::UnboundedReceiver<Event>, AbortGuard) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (etx, erx) = mpsc::unbounded_channel();
        let req = Request::new(id, prompt, max_tokens).with_output_seed(output_seed);
        let _ = self.tx.send(Command::Submit(req, etx));
        (
            erx,
            AbortGuard {
                id,
                tx: self.tx.clone(),
                armed: true,
            },
        )
    }

    /// The engine's gauges and metrics now.
    pub async fn snapshot(&self) -> Option<Snapshot> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Snapshot(tx)).ok()?;
        rx.await.ok()
    }

    /// `POST /reset_prefix_cache`: whether the cache was reset.
    pub async fn reset_prefix_cache(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Reset(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Every block hash in the engine's prefix cache now, sorted: the ground truth a consumer
    /// of the KV events should have (`GET /sim/cache`).
    pub async fn cached_blocks(&self) -> Option<Vec<u64>> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::CachedBlocks(tx)).ok()?;
        rx.await.ok()
    }

    /// Restarts the KV-event publisher (sequence from 0); returns whether the engine's prefix
    /// cache could be cleared too.
    pub async fn restart_publisher(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::RestartPublisher(tx)).is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }
}

async fn run(
    mut engine: Engine,
    clock: Clock,
    mut rx: mpsc::UnboundedReceiver<Command>,
    kv: Option<mpsc::UnboundedSender<KvMsg>>,
) {
    let mut subs: HashMap<RequestId, mpsc::UnboundedSender<Event>> = HashMap::new();
    let mut out = Vec::new();
    loop {
        engine.advance_into(clock.sim_now(), &mut out);
        dispatch(&mut out, &mut subs, kv.as_ref(), &clock);
        let cmd = match engine.next_event_time() {
            Some(t) => {
                let wake = tokio::time::Instant::from_std(clock.instant_of(t));
                tokio::select! {
                    c = rx.recv() => Some(c),
                    () = tokio::time::sleep_until(wake) => None,
                }
            }
            None => Some(rx.recv().await),
        };
        let cmd = match cmd {
            None => continue,
            Some(None) => break,
            Some(Some(c)) => c,
        };
        match cmd {
            Command::Submit(req, etx) => {
                let id = req.id;
                match engine.submit(req, clock.sim_now()) {
                    Ok(()) => {
                        subs.insert(id, etx);
                    }
                    Err(r) => {
                        let _ = etx.send(Event::Rejected(r.reason));
                    }
                }
            }
            Command::Abort(id) => {
                engine.abort(id);
            }
            Command::Reset(tx) => {
                engine.advance_into(clock.sim_now(), &mut out);
                dispatch(&mut out, &mut subs, kv.as_ref(), &clock);
                let _ = tx.send(engine.reset_prefix_cache());
            }
            Command::Snapshot(tx) => {
                engine.advance_into(clock.sim_now(), &mut out);
                dispatch(&mut out, &mut subs, kv.as_ref(), &clock);
                let _ = tx.send(Snapshot {
                    gauges: engine.gauges(),
                    metrics: engine.metrics().clone(),
                });
            }
            Command::CachedBlocks(tx) => {
                engine.advance_into(clock.sim_now(), &mut out);
                dispatch(&mut out, &mut subs, kv.as_ref(), &clock);
                let _ = tx.send(engine.cached_block_hashes());
            }
            Command::RestartPublisher(tx) => {
                engine.advance_into(clock.sim_now(), &mut out);
                dispatch(&mut out, &mut subs, kv.as_ref(), &clock);
                let cleared = engine.reset_prefix_cache();
                if let Some(kv) = &kv {
                    let _ = kv.send(KvMsg::Restart {
                        synthetic_clear: !cleared,
                        ts: clock.epoch_of(clock.sim_now()),
                    });
                }
                let _ = tx.send(cleared);
            }
        }
    }
}

fn dispatch(
    out: &mut Vec<Output>,
    subs: &mut HashMap<RequestId, mpsc::UnboundedSender<Event>>,
    kv: Option<&mpsc::UnboundedSender<KvMsg>>,
    clock: &Clock,
) {
    for o in out.drain(..) {
        match o {
            Output::Token {
                id, index, token, ..
            } => {
                if let Some(s) = subs.get(&id) {
                    let _ = s.send(Event::Token { index, token });
                }
            }
            Output::Finished(f) => {
                if let Some(s) = subs.remove(&f.id) {
                    let _ = s.send(Event::Finished {
                        reason: f.reason,
                        stats: f.stats,
                    });
                }
            }
            Output::Rejected(r) => {
                if let Some(s) = subs.remove(&r.id) {
                    let _ = s.send(Event::Rejected(r.reason));
                }
            }
            Output::KvEvents(b) => {
                if let Some(kv) = kv {
                    let ts = clock.epoch_of(b.time);
                    let _ = kv.send(KvMsg::Batch {
                        ts,
                        payload: b.payload(ts, Some(0)),
                    });
                }
            }
            Output::FirstToken { .. } => {}
        }
    }
}
