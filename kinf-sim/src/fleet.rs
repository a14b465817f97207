//! Many engines on one virtual clock, with a pluggable router.
//!
//! [`Fleet`] keeps one global event queue (a binary heap of each engine's next event time;
//! ties broken by engine index), so that outputs come out in time order across engines and a
//! run is deterministic. Before a request is routed at time `t`, every event up to `t` is
//! processed, so the router sees each engine's state as of `t`.
//!
//! A router is any `FnMut(&Request, &[EngineView]) -> usize` (returning the chosen engine's
//! index), or a type implementing [`Router`], which may also observe every output (KV events
//! to maintain a prefix index, first tokens to learn TTFT, completions).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use crate::engine::{
    Engine, EngineOptions, InvalidProfile, Output, RejectReason, Rejected, Request,
};
use crate::metrics::{Counters, Gauges};
use crate::profile::Profile;

/// A read-only view of one engine, given to routers.
#[derive(Debug, Clone, Copy)]
pub struct EngineView<'a> {
    /// The engine's index in the fleet.
    pub index: usize,
    /// The engine (ground truth; a realistic router uses only what vLLM exposes:
    /// [`gauges`](Self::gauges), [`counters`](Self::counters) and the KV events it observed).
    pub engine: &'a Engine,
}

impl EngineView<'_> {
    /// Running/waiting counts and KV usage, as `/metrics` reports them.
    pub fn gauges(&self) -> Gauges {
        self.engine.gauges()
    }

    /// The engine's counters.
    pub fn counters(&self) -> &Counters {
        self.engine.counters()
    }

    /// Prompt tokens queued or mid-prefill.
    pub fn pending_prefill_tokens(&self) -> u64 {
        self.engine.pending_prefill_tokens()
    }
}

/// Chooses an engine for each request; may observe every output.
pub trait Router {
    /// The index of the engine (into `engines`) that serves `req`.
    fn route(&mut self, req: &Request, engines: &[EngineView<'_>]) -> usize;

    /// Called with every output of every engine, in time order, before the caller's sink.
    fn observe(&mut self, _engine: usize, _output: &Output) {}
}

impl<F> Router for F
where
    F: FnMut(&Request, &[EngineView<'_>]) -> usize,
{
    fn route(&mut self, req: &Request, engines: &[EngineView<'_>]) -> usize {
        self(req, engines)
    }
}

/// Totals of a [`Fleet::run`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RunSummary {
    /// Requests offered.
    pub submitted: u64,
    /// Requests refused (by an engine, or routed to no engine).
    pub rejected: u64,
    /// Requests that finished.
    pub finished: u64,
    /// Virtual time when the last event happened, seconds.
    pub end_time: f64,
    /// Engine steps executed, all engines together.
    pub steps: u64,
}

const NONE: u64 = u64::MAX;

#[inline]
fn key(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

/// `n` engines, one event queue. See the module docs.
#[derive(Debug)]
pub struct Fleet {
    engines: Vec<Engine>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
    scheduled: Vec<u64>,
    now: f64,
    buf: Vec<Output>,
}

impl Fleet {
    /// `n` identical engines.
    pub fn new(profile: &Profile, opts: EngineOptions, n: usize) -> Result<Self, InvalidProfile> {
        let engines = (0..n)
            .map(|_| Engine::new(profile.clone(), opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_engines(engines))
    }

    /// A fleet of the given engines (they may differ).
    pub fn from_engines(engines: Vec<Engine>) -> Self {
        let mut f = Self {
            scheduled: vec![NONE; engines.len()],
            engines,
            heap: BinaryHeap::new(),
            now: 0.0,
            buf: Vec::new(),
        };
        for i in 0..f.engines.len() {
            f.reschedule(i);
        }
        f
    }

    /// Number of engines.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Whether the fleet has no engine.
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// The engines.
    pub fn engines(&self) -> &[Engine] {
        &self.engines
    }

    /// One engine.
    pub fn engine(&self, i: usize) -> Option<&Engine> {
        self.engines.get(i)
    }

    /// Runs `f` on engine `i` (to submit, abort or reset out of band) and re-reads its next
    /// event time. `None` if there is no such engine.
    pub fn with_engine<T>(&mut self, i: usize, f: impl FnOnce(&mut Engine) -> T) -> Option<T> {
        let e = self.engines.get_mut(i)?;
        // Bring the engine's clock to the fleet's (no event of it is due before: they were
        // all processed), so that what `f` does happens now.
        self.buf.clear();
        e.advance_into(self.now, &mut self.buf);
        let r = f(e);
        self.reschedule(i);
        Some(r)
    }

    /// The fleet's clock.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// When the next event of any engine is due.
    pub fn next_event_time(&self) -> Option<f64> {
        self.heap.peek().map(|Reverse((k, _))| f64::from_bits(*k))
    }

    /// Counters summed over the engines.
    pub fn total_counters(&self) -> Counters {
        let mut t = Counters::default();
        for e in &self.engines {
            let c = e.counters();
            t.prefix_cache_queries += c.prefix_cache_queries;
            t.prefix_cache_hits += c.prefix_cache_hits;
            t.prompt_tokens += c.prompt_tokens;
            t.generation_tokens += c.generation_tokens;
            t.requests_finished += c.requests_finished;
            t.requests_aborted += c.requests_aborted;
            t.requests_rejected += c.requests_rejected;
            t.preemptions += c.preemptions;
            t.steps += c.steps;
            t.prefill_tokens_computed += c.prefill_tokens_computed;
            t.busy_s += c.busy_s;
        }
        t
    }

    fn reschedule(&mut self, i: usize) {
        let Some(e) = self.engines.get(i) else { return };
        let Some(slot) = self.scheduled.get_mut(i) else {
            return;
        };
        match e.next_event_time() {
            Some(t) => {
                let k = key(t);
                if *slot != k {
                    *slot = k;
                    self.heap.push(Reverse((k, i as u32)));
                }
            }
            None => *slot = NONE,
        }
    }

    /// Processes every engine event up to `t`, in time order (ties by engine index); each
    /// output goes to `sink(engine_index, output)`.
    pub fn advance_to(&mut self, t: f64, sink: &mut impl FnMut(usize, Output)) {
        while let Some(&Reverse((k, i))) = self.heap.peek() {
            let time = f64::from_bits(k);
            if time > t {
                break;
            }
            self.heap.pop();
            let i = i as usize;
            if self.scheduled.get(i) != Some(&k) {
                continue; // superseded entry
            }
            if let Some(s) = self.scheduled.get_mut(i) {
                *s = NONE;
            }
            let Some(e) = self.engines.get_mut(i) else {
                continue;
            };
            self.buf.clear();
            e.advance_into(time, &mut self.buf);
            for o in self.buf.drain(..) {
                sink(i, o);
            }
            self.reschedule(i);
        }
        if t > self.now {
            self.now = t;
        }
    }

    /// Submits `req` to engine `engine` at `now` (after processing every event up to `now`);
    /// a refusal goes to the sink as [`Output::Rejected`]. Returns whether it was accepted.
    pub fn submit_to(
        &mut self,
        engine: usize,
        req: Request,
        now: f64,
        sink: &mut impl FnMut(usize, Output),
    ) -> bool {
        self.advance_to(now, sink);
        let now = now.max(self.now);
        let Some(e) = self.engines.get_mut(engine) else {
            sink(
                engine,
                Output::Rejected(Rejected {
                    id: req.id,
                    time: now,
                    reason: RejectReason::NoEngine,
                }),
            );
            return false;
        };
        match e.submit(req, now) {
            Ok(()) => {
                self.reschedule(engine);
                true
            }
            Err(r) => {
                sink(engine, Output::Rejected(r));
                false
            }
        }
    }

    /// Processes events up to `now`, asks `router` for an engine, and submits `req` there.
    /// Returns the chosen index (which may be out of range: the request is then rejected with
    /// [`RejectReason::NoEngine`]) and whether the engine accepted it.
    pub fn route<R: Router + ?Sized>(
        &mut self,
        req: Request,
        now: f64,
        router: &mut R,
        sink: &mut impl FnMut(usize, Output),
    ) -> (usize, bool) {
        self.advance_to(now, &mut |i, o| {
            router.observe(i, &o);
            sink(i, o);
        });
        let choice = {
            let views: Vec<EngineView<'_>> = self
                .engines
                .iter()
                .enumerate()
                .map(|(index, engine)| EngineView { index, engine })
                .collect();
            router.route(&req, &views)
        };
        let ok = self.submit_to(choice, req, now, &mut |i, o| {
            router.observe(i, &o);
            sink(i, o);
        });
        (choice, ok)
    }

    /// Processes every remaining event (all engines run dry).
    pub fn run_until_idle(&mut self, sink: &mut impl FnMut(usize, Output)) {
        self.advance_to(f64::INFINITY, sink);
        self.now = self
            .engines
            .iter()
            .map(Engine::now)
            .fold(0.0, f64::max)
            .max(if self.now.is_finite() { self.now } else { 0.0 });
    }

    /// Routes every arrival `(time, request)` (times are taken in order; an earlier time than
    /// the previous one counts as the previous one), then runs until idle. Every output goes
    /// to `router.observe` and then to `sink`.
    pub fn run<R, I, S>(&mut self, arrivals: I, router: &mut R, mut sink: S) -> RunSummary
    where
        R: Router + ?Sized,
        I: IntoIterator<Item = (f64, Request)>,
        S: FnMut(usize, Output),
    {
        let steps0 = self.total_counters().steps;
        let mut summary = RunSummary::default();
        let count = |o: &Output, s: &mut RunSummary| match o {
            Output::Finished(_) => s.finished += 1,
            Output::Rejected(_) => s.rejected += 1,
            _ => {}
        };
        for (t, req) in arrivals {
            summary.submitted += 1;
            let t = t.max(self.now);
            self.route(req, t, router, &mut |i, o| {
                count(&o, &mut summary);
                sink(i, o);
            });
        }
        self.run_until_idle(&mut |i, o| {
            router.observe(i, &o);
            count(&o, &mut summary);
            sink(i, o);
        });
        summary.end_time = self.now;
        summary.steps = self.total_counters().steps - steps0;
        summary
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn req(id: u64, len: usize) -> Request {
        Request::new(
            id,
            (0..len as u32)
                .map(|t| t + id as u32 * 7)
                .collect::<Vec<_>>(),
            4,
        )
    }

    #[test]
    fn routes_with_a_closure_and_runs_dry() {
        let mut f = Fleet::new(&Profile::tiny(), EngineOptions::default(), 3).unwrap();
        let arrivals = (0..30).map(|i| (i as f64 * 0.001, req(i, 20)));
        let mut finished = vec![0u32; 3];
        let mut router = |r: &Request, v: &[EngineView<'_>]| (r.id as usize) % v.len();
        let s = f.run(arrivals, &mut router, |i, o| {
            if let Output::Finished(_) = o {
                finished[i] += 1;
            }
        });
        assert_eq!(s.submitted, 30);
        assert_eq!(s.finished, 30);
        assert_eq!(finished, vec![10, 10, 10]);
        assert!(f.engines().iter().all(Engine::is_idle));
        assert!(f.next_event_time().is_none());
    }

    #[test]
    fn out_of_range_choice_is_rejected() {
        let mut f = Fleet::new(&Profile::tiny(), EngineOptions::default(), 2).unwrap();
        let mut router = |_: &Request, _: &[EngineView<'_>]| 5usize;
        let mut rejected = 0;
        let s = f.run([(0.0, req(1, 8))], &mut router, |_, o| {
            if matches!(o, Output::Rejected(r) if r.reason == RejectReason::NoEngine) {
                rejected += 1;
            }
        });
        assert_eq!(rejected, 1);
        assert_eq!(s.rejected, 1);
    }

    #[test]
    fn outputs_come_in_time_order_across_engines() {
        let mut f = Fleet::new(&Profile::tiny(), EngineOptions::default(), 4).unwrap();
        let arrivals = (0..40).map(|i| (i as f64 * 0.0007, req(i, 10 + (i as usize % 13))));
        let mut last = 0.0f64;
        let mut router = |r: &Request, v: &[EngineView<'_>]| (r.id as usize * 3) % v.len();
        f.run(arrivals, &mut router, |_, o| {
            assert!(o.time() >= last, "{} < {last}", o.time());
            last = o.time();
        });
    }
}
