//! Passive health of a provider: a circuit breaker fed by request outcomes and the observed
//! time-to-first-token.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Breaker state, as reported in snapshots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests flow; consecutive failures are counted.
    Closed,
    /// Requests are refused until the cool-down ends.
    Open,
    /// The cool-down ended: one probe request is let through.
    HalfOpen,
}

/// How a request ended, for the breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The provider answered properly.
    Success,
    /// Connection failure, timeout, 5xx, or a stream that died.
    Failure,
    /// Nothing learned (the client went away, a 4xx caused by the request).
    Neutral,
}

/// A consecutive-failure circuit breaker.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    cool_down: Duration,
    failures: u32,
    open_until: Option<Instant>,
    probe_in_flight: bool,
}

/// Permission to send one request; `probe` when it is the half-open probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// This request is the half-open probe.
    pub probe: bool,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `cool_down`.
    pub fn new(threshold: u32, cool_down: Duration) -> Self {
        Breaker {
            threshold: threshold.max(1),
            cool_down,
            failures: 0,
            open_until: None,
            probe_in_flight: false,
        }
    }

    /// The state at `now`.
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.open_until {
            None => BreakerState::Closed,
            Some(t) if now < t => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        }
    }

    /// Whether a request may be sent now (false while open, and while half-open with its probe
    /// in flight).
    pub fn would_admit(&self, now: Instant) -> bool {
        match self.state(now) {
            BreakerState::Closed => true,
            BreakerState::Open => false,
            BreakerState::HalfOpen => !self.probe_in_flight,
        }
    }

    /// Admits a request, or refuses it.
    pub fn admit(&mut self, now: Instant) -> Option<Admission> {
        match self.state(now) {
            BreakerState::Closed => Some(Admission { probe: false }),
            BreakerState::Open => None,
            BreakerState::HalfOpen if self.probe_in_flight => None,
            BreakerState::HalfOpen => {
                self.probe_in_flight = true;
                Some(Admission { probe: true })
            }
        }
    }

    /// Records how an admitted request ended.
    pub fn record(&mut self, adm: Admission, verdict: Verdict, now: Instant) {
        if adm.probe {
            self.probe_in_flight = false;
        }
        match verdict {
            Verdict::Success => {
                self.failures = 0;
                self.open_until = None;
            }
            Verdict::Failure => {
                self.failures = self.failures.saturating_add(1);
                let half_open = self.state(now) == BreakerState::HalfOpen;
                if adm.probe || half_open || self.failures >= self.threshold {
                    self.open_until = Some(now + self.cool_down);
                }
            }
            Verdict::Neutral => {}
        }
    }

    /// Consecutive failures counted.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

/// Observed TTFT: an exponentially weighted moving average and the last samples.
#[derive(Debug, Default)]
pub struct TtftStats {
    ewma: Option<f64>,
    samples: VecDeque<f64>,
    count: u64,
}

/// Weight of a new TTFT sample in the moving average.
pub const TTFT_ALPHA: f64 = 0.2;
/// Samples kept for quantiles.
pub const TTFT_WINDOW: usize = 256;

impl TtftStats {
    /// Adds a sample (seconds).
    pub fn observe(&mut self, s: f64) {
        if !s.is_finite() || s < 0.0 {
            return;
        }
        self.ewma = Some(match self.ewma {
            None => s,
            Some(m) => m + TTFT_ALPHA * (s - m),
        });
        if self.samples.len() == TTFT_WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
        self.count += 1;
    }

    /// The moving average, once a sample was seen.
    pub fn mean(&self) -> Option<f64> {
        self.ewma
    }

    /// The `q` quantile (0..=1) of the kept samples.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        let mut v: Vec<f64> = self.samples.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize;
        v.get(i).copied()
    }

    /// Samples seen in total.
    pub fn count(&self) -> u64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_half_opens() {
        let t0 = Instant::now();
        let mut b = Breaker::new(3, Duration::from_secs(10));
        for _ in 0..2 {
            let a = b.admit(t0);
            assert!(a.is_some());
            if let Some(a) = a {
                b.record(a, Verdict::Failure, t0);
            }
        }
        assert_eq!(b.state(t0), BreakerState::Closed);
        if let Some(a) = b.admit(t0) {
            b.record(a, Verdict::Failure, t0);
        }
        assert_eq!(b.state(t0), BreakerState::Open);
        assert!(b.admit(t0).is_none());
        let t1 = t0 + Duration::from_secs(11);
        assert_eq!(b.state(t1), BreakerState::HalfOpen);
        let probe = b.admit(t1);
        assert!(probe.is_some_and(|p| p.probe));
        assert!(b.admit(t1).is_none(), "one probe at a time");
        if let Some(p) = probe {
            b.record(p, Verdict::Failure, t1);
        }
        assert_eq!(b.state(t1), BreakerState::Open);
        let t2 = t1 + Duration::from_secs(11);
        if let Some(p) = b.admit(t2) {
            b.record(p, Verdict::Success, t2);
        }
        assert_eq!(b.state(t2), BreakerState::Closed);
    }

    #[test]
    fn ttft_average_and_quantiles() {
        let mut t = TtftStats::default();
        assert!(t.mean().is_none());
        for s in [1.0, 1.0, 2.0] {
            t.observe(s);
        }
        assert!(t.mean().is_some_and(|m| m > 1.0 && m < 2.0));
        assert_eq!(t.quantile(1.0), Some(2.0));
        assert_eq!(t.quantile(0.0), Some(1.0));
    }
}
