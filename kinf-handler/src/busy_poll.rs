//! Busy polling: keep the event loop awake for a short window after request activity instead
//! of sleeping in `epoll_wait`.
//!
//! A proxy sleeps twice per request while the bytes are elsewhere: after forwarding the request
//! (until the upstream answers) and after answering (until the client sends its next request).
//! Waking a sleeping thread costs little on bare metal but tens to hundreds of microseconds on
//! a virtual machine whose idle vCPU halts (the wake-up is an inter-processor interrupt and a
//! VM entry). With `--busy-poll WINDOW` the runtime runs one worker thread and a polling task
//! that, for `WINDOW` after the last request activity, yields in a loop: every yield makes the
//! worker poll its sockets with a zero timeout, so a response that arrives inside the window
//! is picked up without a wake-up. Outside the window the task sleeps and costs nothing.
//!
//! The price is CPU: up to one core spins while requests arrive closer together than the
//! window. This is the reactor trade-off of Seastar's `--idle-poll-time-us` and of Linux's
//! `SO_BUSY_POLL`; it is off unless asked for.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// The process-wide poller, set once by `kinference serve --busy-poll`.
static POLLER: OnceLock<Arc<BusyPoll>> = OnceLock::new();

/// Spins the event loop for a window after the last [`touch`].
#[derive(Debug)]
pub struct BusyPoll {
    window_ns: u64,
    epoch: Instant,
    last_ns: AtomicU64,
    sleeping: AtomicBool,
    wake: Notify,
}

impl BusyPoll {
    /// A poller that spins for `window` after each [`touch`](Self::touch); run it with
    /// [`run`](Self::run).
    pub fn new(window: Duration) -> Self {
        Self {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            last_ns: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            wake: Notify::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Marks activity: the poller spins until `window` after now.
    pub fn touch(&self) {
        self.last_ns.store(self.now_ns(), Ordering::Relaxed);
        if self.sleeping.swap(false, Ordering::AcqRel) {
            self.wake.notify_one();
        }
    }

    /// The polling loop: yields while inside the window, sleeps until the next
    /// [`touch`](Self::touch) outside it. Never returns.
    pub async fn run(self: Arc<Self>) {
        loop {
            let idle = self
                .now_ns()
                .saturating_sub(self.last_ns.load(Ordering::Relaxed));
            if idle < self.window_ns {
                tokio::task::yield_now().await;
                continue;
            }
            self.sleeping.store(true, Ordering::Release);
            // A touch between the check above and this store re-arms through `notify_one`'s
            // stored permit, so no activity is missed.
            if self
                .now_ns()
                .saturating_sub(self.last_ns.load(Ordering::Relaxed))
                < self.window_ns
            {
                self.sleeping.store(false, Ordering::Release);
                continue;
            }
            self.wake.notified().await;
        }
    }
}

/// Starts busy polling with `window` on the current runtime. Call once, from inside the
/// runtime; later calls are ignored. The runtime should have one worker thread: with more, an
/// idle worker blocks in `epoll_wait` holding the I/O driver and the polling worker cannot
/// poll it.
pub fn start(window: Duration) {
    let poller = Arc::new(BusyPoll::new(window));
    if POLLER.set(poller.clone()).is_ok() {
        tokio::spawn(poller.run());
    }
}

/// Marks request activity: the poller spins for its window from now. A no-op when busy
/// polling is off.
#[inline]
pub fn touch() {
    if let Some(p) = POLLER.get() {
        p.touch();
    }
}
