//! Live cluster state as the decision engine reads it: endpoints grouped by worker set, their
//! windowed load, TTFT models and KV-cache prefix index; providers' readiness and latency.
//!
//! Ingestion (metrics scrapers, KV-event subscribers, response reports) writes it; decisions
//! read it. The server publishes immutable snapshots so that ingestion never blocks a decision.
//! Time is passed in by the caller (milliseconds on any monotonic clock): the library reads no
//! clock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use ahash::AHashMap;

use kinf_lang::check::DEFAULT_WINDOW;

use crate::kv_events::KvEvent;
use crate::load_floor::LoadFloor;
use crate::predictor::TtftModel;
use crate::prefix_index::{ApproxIndex, EndpointId, PrefixIndex};
use crate::request::Request;

/// How long load samples are kept.
pub const SAMPLE_RETENTION: Duration = Duration::from_secs(300);

/// Largest queued or running count a load sample may carry ([`LoadSample::checked`]): far
/// above what one vLLM server holds, and small enough that the window's running sums keep
/// their precision.
pub const MAX_PLAUSIBLE_COUNT: f64 = 1e6;

/// One load sample of an endpoint. A field that is NaN is unknown (e.g. the series was
/// missing from the scrape): [`LoadWindow::push`] keeps the previous sample's value for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadSample {
    /// When it was taken (ms).
    pub at_ms: u64,
    /// `vllm:num_requests_waiting`.
    pub queued: f64,
    /// `vllm:num_requests_running`.
    pub running: f64,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f64,
}

impl LoadSample {
    /// The sample with every unknown or implausible field (NaN, infinite, a count below 0 or
    /// above [`MAX_PLAUSIBLE_COUNT`], a KV usage outside 0..=1) replaced by `prev`'s value (0
    /// without a previous sample), and whether every field was kept as it was. One absurd
    /// value (a broken exporter's `1e20`) would otherwise dominate the window's averages, and
    /// a missing one read as 0 would make a busy endpoint look idle.
    pub fn checked(self, prev: Option<&LoadSample>) -> (LoadSample, bool) {
        let mut ok = true;
        let mut pick = |v: f64, plausible: bool, old: Option<f64>| {
            if plausible {
                v
            } else {
                ok = false;
                old.unwrap_or(0.0)
            }
        };
        let count = |v: f64| (0.0..=MAX_PLAUSIBLE_COUNT).contains(&v);
        let s = LoadSample {
            at_ms: self.at_ms,
            queued: pick(self.queued, count(self.queued), prev.map(|p| p.queued)),
            running: pick(self.running, count(self.running), prev.map(|p| p.running)),
            kv_usage: pick(
                self.kv_usage,
                (0.0..=1.0).contains(&self.kv_usage),
                prev.map(|p| p.kv_usage),
            ),
        };
        (s, ok)
    }
}

/// The resolution of the load window's sums ([`LoadWindow`]), in units per one: of queued
/// and of running prompts (a millionth), and of KV usage (a billionth). A sample adds at most
/// 1e12 units of each, so the sums (of at most twice the samples kept) stay far below
/// `i64::MAX`.
pub const LOAD_UNITS_PER_ONE: [f64; 3] = [1e6, 1e6, 1e9];

/// The sample's values in load units ([`LOAD_UNITS_PER_ONE`]): queued, running, KV usage.
/// The values are checked ([`LoadSample::checked`]: finite, 0 to [`MAX_PLAUSIBLE_COUNT`]),
/// so each cast only drops the fraction `round` left at 0.
fn sample_units(s: &LoadSample) -> [i64; 3] {
    let [q, r, k] = LOAD_UNITS_PER_ONE;
    [
        (s.queued * q).round() as i64,
        (s.running * r).round() as i64,
        (s.kv_usage * k).round() as i64,
    ]
}

/// `a + b`, element-wise (saturating: unreachable with checked samples).
fn add_units(a: [i64; 3], b: [i64; 3]) -> [i64; 3] {
    [
        a[0].saturating_add(b[0]),
        a[1].saturating_add(b[1]),
        a[2].saturating_add(b[2]),
    ]
}

/// Averages over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Load {
    /// Average queued prompts.
    pub queued_prompts: f64,
    /// Average running prompts.
    pub running_prompts: f64,
    /// Average KV-cache usage.
    pub kv_cache_usage: f64,
}

/// Windowed load samples, with running sums so that any window's average costs a binary
/// search instead of a pass over the samples. The sums are recomputed from the samples kept
/// once as many samples have been forgotten as are kept (amortised O(1) per sample); samples
/// are bounded ([`LoadSample::checked`]).
///
/// The sums are exact: integers, in units of a millionth of a prompt and a billionth of the
/// KV cache ([`LOAD_UNITS_PER_ONE`]; each sample's values are rounded to that). An average is then the window's exact sum divided once, so it depends
/// only on the samples in the window: a constant load averages to itself, and two endpoints
/// with the same samples in the window average the same whatever came before. With
/// floating-point running sums, a KV usage of 0.8 in every sample averaged 0.8000000000000002
/// over most windows (a difference of rounded prefix sums), so `kvCacheUsage: { greaterThan:
/// 80% }` dropped an endpoint at exactly 80 %, and `minimize: KvCacheUsage` ranked two
/// equally loaded endpoints by their sample histories instead of by endpoint order.
#[derive(Clone, Debug, Default)]
pub struct LoadWindow {
    samples: VecDeque<(LoadSample, [i64; 3])>,
    /// Samples forgotten since the running sums were last recomputed.
    forgotten: usize,
    /// The default-window average, computed off the decision path by
    /// [`ClusterState::set_now`], and the times `[from, until]` (ms) it holds for: from when
    /// it was computed until the oldest sample in the window leaves it.
    default_at: Option<(u64, u64, Load)>,
}

impl LoadWindow {
    /// Adds a sample and forgets samples older than the retention. Samples must come in time
    /// order; an older one is ignored. Unknown or implausible fields take the previous
    /// sample's value ([`LoadSample::checked`]); returns false when any did.
    pub fn push(&mut self, s: LoadSample) -> bool {
        if self.samples.back().is_some_and(|(b, _)| b.at_ms > s.at_ms) {
            return true;
        }
        let (s, plausible) = s.checked(self.latest());
        let keep_after = s.at_ms.saturating_sub(SAMPLE_RETENTION.as_millis() as u64);
        while self
            .samples
            .front()
            .is_some_and(|(f, _)| f.at_ms < keep_after)
        {
            self.samples.pop_front();
            self.forgotten += 1;
        }
        self.default_at = None;
        let prev = self.samples.back().map(|(_, c)| *c).unwrap_or([0; 3]);
        let cum = add_units(prev, sample_units(&s));
        self.samples.push_back((s, cum));
        if self.forgotten >= self.samples.len() {
            self.recompute_sums();
        }
        plausible
    }

    /// Recomputes the running sums from the samples kept.
    fn recompute_sums(&mut self) {
        let mut acc = [0i64; 3];
        for (s, c) in &mut self.samples {
            acc = add_units(acc, sample_units(s));
            *c = acc;
        }
        self.forgotten = 0;
    }

    /// Average of the samples taken within `window` before `now_ms` (the newest sample alone
    /// when none falls in the window; zeros when there is none).
    pub fn average(&self, window: Duration, now_ms: u64) -> Load {
        if window == DEFAULT_WINDOW
            && let Some((from, until, load)) = self.default_at
            && (from..=until).contains(&now_ms)
        {
            return load;
        }
        let since = now_ms.saturating_sub(window.as_millis() as u64);
        let first = self.samples.partition_point(|(s, _)| s.at_ms < since);
        let n = self.samples.len() - first;
        let Some((last, end)) = self.samples.back() else {
            return Load::default();
        };
        if n == 0 {
            return Load {
                queued_prompts: last.queued,
                running_prompts: last.running,
                kv_cache_usage: last.kv_usage,
            };
        }
        // Running sums before the window's first sample (they still include samples that were
        // forgotten, so subtract rather than assume zero).
        let start = match first.checked_sub(1).and_then(|i| self.samples.get(i)) {
            Some((_, c)) => *c,
            None => self.samples.front().map_or([0; 3], |(s, c)| {
                let u = sample_units(s);
                [c[0] - u[0], c[1] - u[1], c[2] - u[2]]
            }),
        };
        // The exact sum, divided once (`n × units` is exact: an integer below 2^53).
        let n = n as f64;
        let mean = |i: usize| (end[i] - start[i]) as f64 / (n * LOAD_UNITS_PER_ONE[i]);
        Load {
            queued_prompts: mean(0),
            running_prompts: mean(1),
            kv_cache_usage: mean(2),
        }
    }

    /// Precomputes the default-window average at `now_ms`, unless the one computed earlier
    /// still holds (no sample came or left the window since): with a thousand endpoints and a
    /// new millisecond at almost every request, recomputing them all was a few percent of the
    /// simulator's time.
    pub fn refresh_default(&mut self, now_ms: u64) {
        if self
            .default_at
            .is_some_and(|(from, until, _)| (from..=until).contains(&now_ms))
        {
            return;
        }
        self.default_at = None;
        let load = self.average(DEFAULT_WINDOW, now_ms);
        let since = now_ms.saturating_sub(DEFAULT_WINDOW.as_millis() as u64);
        let first = self.samples.partition_point(|(s, _)| s.at_ms < since);
        let until = self.samples.get(first).map_or(u64::MAX, |(s, _)| {
            s.at_ms.saturating_add(DEFAULT_WINDOW.as_millis() as u64)
        });
        self.default_at = Some((now_ms, until, load));
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<&LoadSample> {
        self.samples.back().map(|(s, _)| s)
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;
    use crate::prefix_index::block_hashes;

    #[test]
    fn window_average_equals_a_direct_mean() {
        let mut w = LoadWindow::default();
        for i in 0..400u64 {
            w.push(LoadSample {
                at_ms: i * 1000,
                queued: (i % 7) as f64,
                running: (i % 3) as f64,
                kv_usage: (i % 10) as f64 / 10.0,
            });
        }
        for (win, now) in [
            (30u64, 399_000u64),
            (10, 399_500),
            (60, 250_000),
            (1, 399_000),
            (1000, 399_000),
        ] {
            let since = now.saturating_sub(win * 1000);
            let xs: Vec<u64> = (0..400u64)
                .filter(|i| i * 1000 >= since && i * 1000 <= now && i * 1000 >= 99_000)
                .collect();
            let direct = xs.iter().map(|i| (i % 7) as f64).sum::<f64>() / xs.len() as f64;
            let got = w.average(Duration::from_secs(win), now);
            assert!(
                (got.queued_prompts - direct).abs() < 1e-9,
                "window {win}: {} vs {direct}",
                got.queued_prompts
            );
        }
        // No sample in the window: the newest sample.
        assert_eq!(
            w.average(Duration::from_secs(1), 900_000).queued_prompts,
            (399 % 7) as f64
        );
        assert_eq!(
            LoadWindow::default().average(Duration::from_secs(30), 0),
            Load::default()
        );
    }

    fn policy(block_size: &str, endpoints: &str) -> std::sync::Arc<kinf_lang::CompiledPolicy> {
        let text = format!(
            r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: {{ name: w }}
spec:
  endpoints: [{endpoints}]
  models: [{{ name: m }}]
  kvEvents: {{}}
{block_size}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {{ name: p }}
spec: {{ destinations: [{{ kind: InferenceWorkerSet, name: w }}] }}
"#
        );
        let (_, c) = kinf_lang::compile_str("p.yaml", &text);
        c.policy.unwrap_or_else(|| panic!("{:?}", c.diagnostics))
    }

    fn stored(tokens: u32, bs: u32) -> KvEvent {
        KvEvent::BlockStored(crate::kv_events::BlockStored {
            block_hashes: [1].into_iter().collect(),
            parent: None,
            token_ids: (0..tokens).collect(),
            block_size: bs,
            lora_id: None,
            medium: None,
            lora_name: None,
            extra_keys: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
        })
    }

    #[test]
    fn discovered_block_size_is_adopted_only_when_none_is_configured() {
        let p = policy("", r#""a:1", "b:1""#);
        let mut st = ClusterState::from_policy(&p, 32);
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        assert!(ws.observe_block_size("a:1", 16));
        assert!(!ws.observe_block_size("a:1", 16));
        assert_eq!(ws.block_size, 16);
        ws.apply_kv_events("a:1", &[stored(16, 16)]);
        let mut out = Vec::new();
        ws.prefix
            .match_prefix(&block_hashes(&(0..16).collect::<Vec<_>>(), 16), 0, &mut out);
        assert_eq!(out.len(), 1, "a block of the adopted size is indexed");

        // The same worker set in a new policy keeps what it learned, adopted size included.
        let mut next = ClusterState::from_policy(&p, 32);
        next.carry_over_from(st);
        let ws = next
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        assert_eq!(ws.block_size, 16);
        let mut out = Vec::new();
        ws.prefix
            .match_prefix(&block_hashes(&(0..16).collect::<Vec<_>>(), 16), 0, &mut out);
        assert_eq!(out.len(), 1, "the index survived the policy change");
        // Still adopted: another size from one worker does not replace it.
        assert!(!ws.observe_block_size("b:1", 32));
        assert_eq!(ws.block_size, 16);

        // A configured size is kept.
        let p = policy("  blockSize: 32", r#""a:1""#);
        let mut st = ClusterState::from_policy(&p, 16);
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        assert!(!ws.observe_block_size("a:1", 16));
        ws.apply_kv_events("a:1", &[stored(16, 16)]);
        assert_eq!(ws.block_size, 32);
        let PrefixTracking::Exact(index) = &ws.prefix else {
            panic!()
        };
        assert_eq!(index.stats().rejected, 1);
    }

    /// `(address, matched blocks)` of every endpoint holding the prompt's first block, the
    /// routed claims continuing the reported prefixes (as decisions count them).
    fn matches(ws: &WorkerSetState, prompt: &[u32]) -> Vec<(String, u32)> {
        let hashes = block_hashes(prompt, ws.block_size);
        let mut out = Vec::new();
        ws.prefix.match_prefix(&hashes, 0, &mut out);
        let mut dense = vec![0u32; ws.endpoints.len()];
        for (id, d) in out {
            dense[id.0 as usize] = dense[id.0 as usize].max(d);
        }
        ws.routed.extend_matches(&hashes, 0, &mut dense);
        let mut v: Vec<(String, u32)> = ws
            .endpoints
            .iter()
            .filter_map(|e| {
                let d = dense.get(e.index_id.0 as usize).copied().unwrap_or(0);
                (d > 0).then(|| (e.address.to_string(), d))
            })
            .collect();
        v.sort();
        v
    }

    fn store(hashes: &[u64], parent: Option<u64>, tokens: &[u32], bs: u32) -> KvEvent {
        KvEvent::BlockStored(crate::kv_events::BlockStored {
            block_hashes: hashes.iter().copied().collect(),
            parent,
            token_ids: tokens.to_vec(),
            block_size: bs,
            ..Default::default()
        })
    }

    fn orphaned(ws: &WorkerSetState) -> u64 {
        match &ws.prefix {
            PrefixTracking::Exact(index) => index.stats().orphaned,
            PrefixTracking::Approximate(_) => panic!("approximate"),
        }
    }

    #[test]
    fn an_endpoint_list_change_keeps_what_the_remaining_endpoints_cache() {
        for block_size in ["  blockSize: 16", ""] {
            let p = policy(block_size, r#""a:1", "b:1""#);
            let mut st = ClusterState::from_policy(&p, 32);
            let pa: Vec<u32> = (0..64).collect();
            let pb: Vec<u32> = (1000..1064).collect();
            let ws = st
                .worker_sets
                .get_mut("default/w")
                .unwrap_or_else(|| panic!());
            // (Without a configured size, the events' size is adopted.)
            ws.apply_kv_events("a:1", &[store(&[11, 12], None, &pa[..32], 16)]);
            ws.apply_kv_events("b:1", &[store(&[21, 22], None, &pb[..32], 16)]);
            assert_eq!(ws.block_size, 16);
            // b was routed the whole prompt: blocks 2 and 3 are claimed.
            let mut req = Request::new("m", 64);
            req.token_ids = Some(pb.clone().into());
            st.record_routed("default", "w", "b:1", &req, 32, 0);
            let ws = &st.worker_sets["default/w"];
            assert_eq!(matches(ws, &pa), vec![("a:1".to_string(), 2)]);
            assert_eq!(matches(ws, &pb), vec![("b:1".to_string(), 4)]);

            // a is removed and c added: b moves to position 0, c takes a's old position.
            let next_p = policy(block_size, r#""b:1", "c:1""#);
            let mut next = ClusterState::from_policy(&next_p, 32);
            next.carry_over_from(st);
            let ws = next
                .worker_sets
                .get_mut("default/w")
                .unwrap_or_else(|| panic!());
            assert_eq!(ws.block_size, 16);
            assert_eq!(matches(ws, &pa), vec![], "a's blocks went with it");
            assert_eq!(matches(ws, &pb), vec![("b:1".to_string(), 4)]);
            assert!(
                matches!(
                    ws.floor.usable(&ws.endpoints),
                    crate::load_floor::Usable::Yes { .. }
                ),
                "ids are positions: decisions can bound the set"
            );
            // b's next events chain onto what it stored before the change.
            ws.apply_kv_events("b:1", &[store(&[23, 24], Some(22), &pb[32..], 16)]);
            assert_eq!(orphaned(ws), 0);
            assert_eq!(matches(ws, &pb), vec![("b:1".to_string(), 4)]);
            ws.apply_kv_events("c:1", &[store(&[31], None, &pa[..16], 16)]);
            assert_eq!(matches(ws, &pa), vec![("c:1".to_string(), 1)]);

            // An endpoint added at the front: the others keep theirs too.
            let grown = policy(block_size, r#""d:1", "b:1", "c:1""#);
            let mut again = ClusterState::from_policy(&grown, 32);
            again.carry_over_from(next);
            let ws = again
                .worker_sets
                .get_mut("default/w")
                .unwrap_or_else(|| panic!());
            assert_eq!(matches(ws, &pa), vec![("c:1".to_string(), 1)]);
            assert_eq!(matches(ws, &pb), vec![("b:1".to_string(), 4)]);
            ws.apply_kv_events("c:1", &[store(&[32], Some(31), &pa[16..32], 16)]);
            assert_eq!(orphaned(ws), 0);
            assert_eq!(matches(ws, &pa), vec![("c:1".to_string(), 2)]);

            // Another configured size, or another tracking mode, starts over.
            let other = policy("  blockSize: 32", r#""d:1", "b:1", "c:1""#);
            let mut fresh = ClusterState::from_policy(&other, 32);
            fresh.carry_over_from(again);
            let ws = &fresh.worker_sets["default/w"];
            assert_eq!(ws.block_size, 32);
            assert_eq!(matches(ws, &pb), vec![]);
        }
    }

    #[test]
    fn workers_that_disagree_on_the_block_size_do_not_churn_the_index() {
        let p = policy("", r#""a:1", "b:1""#);
        let mut st = ClusterState::from_policy(&p, 32);
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        assert!(ws.observe_block_size("a:1", 16));
        ws.apply_kv_events("a:1", &[stored(16, 16)]);
        let one: Vec<u32> = (0..16).collect();
        // A rolling upgrade: b reports another size at every scrape, a keeps its own.
        for _ in 0..5 {
            assert!(!ws.observe_block_size("b:1", 32));
            assert!(!ws.observe_block_size("a:1", 16));
        }
        assert_eq!(ws.block_size, 16);
        assert_eq!(matches(ws, &one), vec![("a:1".to_string(), 1)]);
        assert_eq!(ws.block_size_resyncs, 0);
        // a is upgraded too: every worker reports 32 now, which is adopted once. The index
        // held blocks of the old size: a resync is asked for.
        assert!(ws.observe_block_size("a:1", 32));
        assert_eq!(ws.block_size, 32);
        assert_eq!(ws.block_size_resyncs, 1);
        assert!(!ws.observe_block_size("b:1", 32));
        assert!(!ws.observe_block_size("a:1", 32));
        assert_eq!(ws.block_size_resyncs, 1);
    }

    #[test]
    fn events_replayed_before_the_first_scrape_are_indexed_at_their_block_size() {
        let p = policy("", r#""a:1""#);
        let mut st = ClusterState::from_policy(&p, 32);
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        // A subscriber caught up from the replay buffer before any scrape.
        ws.apply_kv_events("a:1", &[KvEvent::AllBlocksCleared, stored(16, 16)]);
        assert_eq!(ws.block_size, 16);
        let one: Vec<u32> = (0..16).collect();
        assert_eq!(matches(ws, &one), vec![("a:1".to_string(), 1)]);
        // The first scrape reports the same size: nothing is lost.
        assert!(!ws.observe_block_size("a:1", 16));
        assert_eq!(matches(ws, &one), vec![("a:1".to_string(), 1)]);
        assert_eq!(ws.block_size_resyncs, 0);
        // Events of another size after that are rejected, and do not switch it.
        ws.apply_kv_events("a:1", &[stored(32, 32)]);
        assert_eq!(ws.block_size, 16);
    }

    #[test]
    fn a_size_taken_from_events_is_that_endpoints_report_and_dead_reports_do_not_hold_back() {
        let p = policy("", r#""a:1", "b:1""#);
        let mut st = ClusterState::from_policy(&p, 32);
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        ws.apply_kv_events("a:1", &[stored(16, 16)]);
        assert_eq!(ws.block_size, 16);
        // `b` alone reports 32: `a`'s events said 16, so the set does not switch (it did, and
        // wiped `a`'s index).
        assert!(!ws.observe_block_size("b:1", 32));
        assert_eq!(ws.block_size, 16);
        // `a` is gone (not ready): its old report no longer holds the set back.
        ws.set_ready(0, false);
        assert!(ws.observe_block_size("b:1", 32));
        assert_eq!(ws.block_size, 32);
    }

    #[test]
    fn one_absurd_or_missing_sample_does_not_corrupt_the_window() {
        let mut w = LoadWindow::default();
        let at = |i: u64, queued: f64, kv: f64| LoadSample {
            at_ms: i * 1000,
            queued,
            running: 1.0,
            kv_usage: kv,
        };
        assert!(w.push(at(0, 2.0, 0.5)));
        // An exporter's glitch: the previous values stand in.
        assert!(!w.push(at(1, 1e20, 7.0)));
        assert_eq!(w.latest().map(|s| (s.queued, s.kv_usage)), Some((2.0, 0.5)));
        // Unknown (NaN: a missing series) keeps the previous value, not 0 (idle).
        assert!(!w.push(at(2, f64::NAN, f64::NAN)));
        assert!(!w.push(at(3, f64::INFINITY, -0.5)));
        assert_eq!(w.latest().map(|s| (s.queued, s.kv_usage)), Some((2.0, 0.5)));
        for i in 4..100 {
            assert!(w.push(at(i, 3.0, 0.25)));
        }
        let avg = w.average(Duration::from_secs(10), 99_000);
        assert_eq!((avg.queued_prompts, avg.kv_cache_usage), (3.0, 0.25));
        // Without a previous sample, an implausible value reads 0.
        let mut w = LoadWindow::default();
        assert!(!w.push(at(0, -1.0, 0.5)));
        assert_eq!(w.latest().map(|s| s.queued), Some(0.0));
    }

    #[test]
    fn window_sums_do_not_drift_over_a_long_run() {
        let mut w = LoadWindow::default();
        let value = |i: u64| {
            if i % 1000 < 10 {
                MAX_PLAUSIBLE_COUNT - 0.3
            } else {
                (i % 7) as f64 * 0.1 + 0.01
            }
        };
        let n = 200_000u64;
        for i in 0..n {
            w.push(LoadSample {
                at_ms: i * 1000,
                queued: value(i),
                running: 0.0,
                kv_usage: 0.0,
            });
        }
        let now = (n - 1) * 1000;
        let direct = (n - 30..n).map(value).sum::<f64>() / 30.0;
        let got = w.average(Duration::from_secs(29), now).queued_prompts;
        assert!((got - direct).abs() < 1e-9, "{got} vs {direct}");
    }

    #[test]
    fn routed_prompts_claim_only_uncached_blocks_until_they_are_reported() {
        let p = policy("  blockSize: 16", r#""a:1""#);
        let mut st = ClusterState::from_policy(&p, 16);
        let prompt: Vec<u32> = (0..64).collect();
        let hashes = block_hashes(&prompt, 16);
        let mut req = Request::new("m", 64);
        req.token_ids = Some(prompt.clone().into());
        let ws = st
            .worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!());
        // The engine reported the prompt's first two blocks (engine hashes 1, 2).
        let mut two = stored(32, 16);
        if let KvEvent::BlockStored(s) = &mut two {
            s.block_hashes = [1, 2].into_iter().collect();
        }
        ws.apply_kv_events("a:1", &[two]);
        let depth = |st: &ClusterState| {
            let ws = st.worker_sets.get("default/w").unwrap_or_else(|| panic!());
            let mut out = Vec::new();
            ws.prefix.match_prefix(&hashes, 0, &mut out);
            let mut dense = vec![0u32; 1];
            for (id, d) in out {
                dense[id.0 as usize] = d;
            }
            ws.routed.extend_matches(&hashes, 1_000, &mut dense);
            dense[0]
        };
        assert_eq!(depth(&st), 2);

        // A cached count beyond the prompt (a caller's mistake) claims nothing.
        st.record_routed("default", "w", "a:1", &req, 10_000, 0);
        let ws = st.worker_sets.get("default/w").unwrap_or_else(|| panic!());
        assert_eq!(ws.routed.stats().pairs, 0);

        // Routed with 32 tokens cached: blocks 2 and 3 are claimed, not the reported ones.
        st.record_routed("default", "w", "a:1", &req, 32, 0);
        let ws = st.worker_sets.get("default/w").unwrap_or_else(|| panic!());
        assert_eq!(ws.routed.stats().pairs, 2);
        assert_eq!(depth(&st), 4, "the claims continue the reported prefix");

        // The engine reports blocks 2 and 3: the claims end, the index holds them.
        let mut next = stored(64, 16);
        if let KvEvent::BlockStored(s) = &mut next {
            s.parent = Some(2);
            s.block_hashes = [3, 4].into_iter().collect();
            s.token_ids = (32..64).collect();
        }
        st.worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!())
            .apply_kv_events("a:1", &[next]);
        let ws = st.worker_sets.get("default/w").unwrap_or_else(|| panic!());
        assert_eq!(ws.routed.stats().pairs, 0);
        assert_eq!(depth(&st), 4);

        // The engine evicts block 1: the prefix ends there (a claim would have kept the
        // later blocks matchable).
        let removed = KvEvent::BlockRemoved(crate::kv_events::BlockRemoved {
            block_hashes: [2].into_iter().collect(),
            medium: None,
            group_idx: None,
        });
        st.worker_sets
            .get_mut("default/w")
            .unwrap_or_else(|| panic!())
            .apply_kv_events("a:1", &[removed]);
        assert_eq!(depth(&st), 1);
    }

    #[test]
    fn a_request_hashed_by_its_caller_claims_the_same_blocks() {
        let p = policy("  blockSize: 16", r#""a:1""#);
        let prompt: Vec<u32> = (0..64).collect();
        let claimed = |req: &Request| {
            let mut st = ClusterState::from_policy(&p, 16);
            assert_eq!(
                st.record_routed("default", "w", "a:1", req, 16, 0),
                Some(16)
            );
            assert_eq!(st.record_routed("default", "w", "b:1", req, 16, 0), None);
            let ws = st.worker_sets.get("default/w").unwrap_or_else(|| panic!());
            let mut depth = vec![0u32; 1];
            ws.routed
                .extend_matches(&block_hashes(&prompt, 16), 1_000, &mut depth);
            (ws.routed.stats().pairs, depth[0])
        };
        let mut tokens = Request::new("m", 64);
        tokens.token_ids = Some(prompt.clone().into());
        // Blocks 1–3 are claimed (block 0 is cached); with nothing reported the match stops
        // at block 0, the claims do not start a prefix.
        assert_eq!(claimed(&tokens), (3, 0));
        // Hashes only, of the worker set's block size: the same claims.
        let mut hashed = Request::new("m", 64);
        hashed.block_hashes = Some((16, block_hashes(&prompt, 16).to_vec().into()));
        assert_eq!(claimed(&hashed), (3, 0));
        // Hashes of another block size and no tokens: nothing to claim.
        hashed.block_hashes = Some((32, block_hashes(&prompt, 32).to_vec().into()));
        assert_eq!(claimed(&hashed).0, 0);
    }

    #[test]
    fn precomputed_default_window_equals_the_computed_one_and_expires_on_push() {
        let mut w = LoadWindow::default();
        for i in 0..40u64 {
            w.push(LoadSample {
                at_ms: i * 1000,
                queued: i as f64,
                running: 1.0,
                kv_usage: 0.5,
            });
        }
        let direct = w.average(DEFAULT_WINDOW, 39_000);
        w.refresh_default(39_000);
        assert_eq!(w.average(DEFAULT_WINDOW, 39_000), direct);
        // Another time or window is computed, not served from the cache.
        assert_ne!(w.average(DEFAULT_WINDOW, 45_000), direct);
        w.push(LoadSample {
            at_ms: 40_000,
            queued: 1000.0,
            running: 1.0,
            kv_usage: 0.5,
        });
        assert_ne!(w.average(DEFAULT_WINDOW, 39_000).queued_prompts, 1000.0);
        assert!(w.average(DEFAULT_WINDOW, 40_000).queued_prompts > direct.queued_prompts);
    }

    #[test]
    fn a_kept_default_average_equals_a_fresh_one_at_every_millisecond() {
        let mut w = LoadWindow::default();
        for i in 0..40u64 {
            w.push(LoadSample {
                at_ms: i * 1000 + i % 3,
                queued: (i % 7) as f64,
                running: (i % 5) as f64,
                kv_usage: (i % 10) as f64 / 10.0,
            });
        }
        let fresh = |w: &LoadWindow, now: u64| {
            let mut c = w.clone();
            c.default_at = None;
            c.average(DEFAULT_WINDOW, now)
        };
        // Forward through samples leaving the window (and past the newest), then backward.
        let times: Vec<u64> = (38_000..=75_000u64)
            .step_by(7)
            .chain((0..=40_000u64).rev().step_by(13))
            .collect();
        for now in times {
            w.refresh_default(now);
            assert_eq!(
                w.average(DEFAULT_WINDOW, now),
                fresh(&w, now),
                "at {now} ms"
            );
        }
    }

    #[test]
    fn lookups_by_address_survive_an_outdated_position_hint() {
        let text = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceWorkerSet\nmetadata: { name: w }\nspec:\n  endpoints: [\"a:1\", \"b:1\", \"c:1\"]\n  models: [{ name: m }]\n---\napiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePool\nmetadata: { name: p }\nspec:\n  destinations: [{ kind: InferenceWorkerSet, name: w }]\n";
        let (_, c) = kinf_lang::compile_str("p.yaml", text);
        let Some(policy) = c.policy else {
            panic!("does not compile: {:?}", c.diagnostics)
        };
        let mut st = ClusterState::from_policy(&policy, 16);
        let key = st.worker_sets.keys().next().cloned().unwrap_or_default();
        let (ns, name) = key.split_once('/').unwrap_or_default();
        let (ns, name) = (ns.to_string(), name.to_string());
        let Some(ws) = st.worker_sets.get_mut(&*key) else {
            panic!("no worker set")
        };
        assert_eq!(ws.positions.len(), 3);
        assert_eq!(ws.index_id("c:1"), Some(EndpointId(2)));
        // The hint now points at the wrong endpoints, or at none.
        ws.endpoints.swap(0, 2);
        ws.positions.remove("b:1");
        assert_eq!(ws.index_id("c:1"), Some(EndpointId(2)));
        assert_eq!(ws.index_id("a:1"), Some(EndpointId(0)));
        assert_eq!(ws.index_id("b:1"), Some(EndpointId(1)));
        assert_eq!(ws.index_id("d:1"), None);
        st.begin_request(&ns, &name, "a:1", 100);
        let inflight = |st: &ClusterState, a: &str| {
            st.worker_sets
                .get(&*key)
                .and_then(|w| w.endpoints.iter().find(|e| &*e.address == a))
                .map(|e| e.inflight.requests)
        };
        assert_eq!(inflight(&st, "a:1"), Some(1));
        assert_eq!(inflight(&st, "c:1"), Some(0));
    }
}

/// Requests this gateway routed to an endpoint that have not finished: known at once, unlike
/// the scraped queue, which lags by a scrape interval (and, with chunked prefill, hardly ever
/// shows a queue at all). See [`ClusterState::begin_request`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Requests routed and not yet finished.
    pub requests: u32,
    /// Uncached prompt tokens of the routed requests whose first token has not been seen: the
    /// prefill work queued ahead of a new request.
    pub prefill_tokens: u64,
}

/// One vLLM endpoint.
#[derive(Clone, Debug)]
pub struct EndpointState {
    /// `host:port`.
    pub address: Arc<str>,
    /// Passes health checks.
    pub ready: bool,
    /// Its metrics are older than allowed; load is treated as unknown (see docs).
    pub stale: bool,
    /// Load samples.
    pub load: LoadWindow,
    /// Learned TTFT model.
    pub ttft: TtftModel,
    /// Its id in the worker set's prefix index.
    pub index_id: EndpointId,
    /// Cached prompt tokens to assume for every request (offline explain/test states); `None`
    /// means: ask the prefix index.
    pub assumed_cached_tokens: Option<u32>,
    /// What this gateway has routed there and not seen finish.
    pub inflight: InFlight,
    /// The block size the worker last reported (`vllm:cache_config_info`), if any
    /// ([`WorkerSetState::observe_block_size`]).
    pub reported_block_size: Option<u32>,
    /// The models the worker reported serving (`GET /v1/models`), with their `max_model_len`
    /// ([`WorkerSetState::set_max_model_lens`]); empty when not read.
    pub max_model_lens: Vec<(Arc<str>, u64)>,
}

/// Capacity per endpoint of approximate prefix tracking, in blocks.
pub const APPROX_CAPACITY_BLOCKS: usize = 16_384;
/// Age after which approximate tracking forgets a routed prefix.
pub const APPROX_MAX_AGE: Duration = Duration::from_secs(600);

/// Age after which a routed prefix that exact tracking has not confirmed is forgotten
/// ([`WorkerSetState::routed`]): longer than a prefill usually waits and runs, after which the
/// engine's KV events have reported the blocks (or the request never reached it).
pub const SPECULATIVE_MAX_AGE: Duration = Duration::from_secs(10);

/// How a worker set's KV-cache contents are known.
#[derive(Clone, Debug)]
pub enum PrefixTracking {
    /// From vLLM's KV events: exact.
    Exact(PrefixIndex),
    /// No KV events: what was routed where, with capacity and age limits. Approximate, and
    /// reported as such in traces and status.
    Approximate(ApproxIndex),
}

impl PrefixTracking {
    /// `exact` or `approximate`.
    pub fn mode(&self) -> &'static str {
        match self {
            PrefixTracking::Exact(_) => "exact",
            PrefixTracking::Approximate(_) => "approximate",
        }
    }

    /// Longest cached prefix (in blocks) of the request per endpoint holding its first block
    /// (with exact tracking, an endpoint with several data-parallel ranks appears once per
    /// rank holding it: take the largest).
    pub fn match_prefix(&self, hashes: &[u64], now_ms: u64, out: &mut Vec<(EndpointId, u32)>) {
        match self {
            PrefixTracking::Exact(i) => i.match_prefix(hashes, out),
            PrefixTracking::Approximate(i) => i.match_prefix(hashes, now_ms, out),
        }
    }
}

/// The endpoints of one worker set, with its prefix tracking.
#[derive(Clone, Debug)]
pub struct WorkerSetState {
    /// Endpoints in a stable order.
    pub endpoints: Vec<EndpointState>,
    /// KV-cache contents per endpoint.
    pub prefix: PrefixTracking,
    /// Block size used for prefix hashes.
    pub block_size: usize,
    /// Whether the worker set declares `blockSize`; if not, the size the workers report
    /// (`vllm:cache_config_info`, [`WorkerSetState::observe_block_size`]) or the first
    /// indexed `BlockStored` event carries ([`WorkerSetState::apply_kv_events`]) is adopted.
    pub block_size_configured: bool,
    /// Whether `block_size` was adopted from what the workers report (or confirmed by it):
    /// after that, a worker reporting another size changes it only once every endpoint that
    /// reported a size reports that one (a finished rolling upgrade), never back and forth.
    pub block_size_adopted: bool,
    /// Times an adopted block size replaced one under which the exact index held blocks or
    /// had rejected some: those are lost, and the KV subscribers should catch up again
    /// (replay) at the new size. Only grows, across policy reloads too.
    pub block_size_resyncs: u64,
    /// The TTFT model decisions use for every endpoint of the set, learned from all of their
    /// observations: the endpoints are the same hardware and model, and one model per
    /// endpoint drifts apart (an endpoint that gets no traffic never corrects a bad estimate,
    /// so it is avoided for good). Each endpoint's own model ([`EndpointState::ttft`]) still
    /// learns from its observations, for per-endpoint error reporting.
    pub ttft: TtftModel,
    /// With exact tracking: the blocks of the prompts routed to each endpoint in the last
    /// [`SPECULATIVE_MAX_AGE`] that it did not already hold, claimed at routing time
    /// ([`ClusterState::record_routed`]); routing the prompt there again does not renew a
    /// claim (so that a prefix the engine evicted is not kept alive by the traffic it
    /// attracts); blocks KV events already reported are not claimed, and a claim ends when
    /// they report its block.
    /// KV events report a prompt's blocks only once its prefill has computed them; until then,
    /// a request with the same prefix routed to the same endpoint will find them cached (its
    /// prefill is queued behind), so a match continues the reported prefix through the
    /// claimed blocks ([`ApproxIndex::extend_matches`]). Without it,
    /// the requests of a new prefix that arrive during its first prefill all look cold and are
    /// spread over the fleet, each recomputing the prefix. Unused with approximate tracking,
    /// which records routed prompts anyway.
    pub routed: ApproxIndex,
    /// Each endpoint's position in `endpoints`, by address: a hint for lookups by address
    /// (every routed request, first token and completion makes several), checked against the
    /// endpoint it names, so that a missing or outdated entry costs a scan, never a wrong
    /// answer. [`ClusterState::from_policy`] fills it; `Default` leaves it empty.
    pub positions: EndpointPositions,
    /// The smallest prediction inputs over the usable endpoints, so that a decision scores only
    /// the endpoints that hold part of the prompt when none of the others can rank better
    /// ([`LoadFloor`]). The methods that change an endpoint's readiness, staleness, load or
    /// in-flight counts keep it current ([`push_load`](Self::push_load),
    /// [`set_ready`](Self::set_ready), [`set_stale`](Self::set_stale),
    /// [`ClusterState::begin_request`] and the like); after changing those fields directly,
    /// call [`rebuild_floor`](Self::rebuild_floor). A floor built for another list of endpoints
    /// (the `Default` one included) is not used.
    pub floor: LoadFloor,
    /// By upstream model, the smallest `max_model_len` its endpoints reported
    /// ([`EndpointState::max_model_lens`]); kept current by
    /// [`set_max_model_lens`](Self::set_max_model_lens) and
    /// [`carry_over_from`](Self::carry_over_from).
    pub context_limits: AHashMap<Arc<str>, u64>,
}

/// [`WorkerSetState::positions`].
pub type EndpointPositions = AHashMap<Arc<str>, usize>;

/// An empty index of routed prompts for [`WorkerSetState::routed`].
pub fn speculative_index() -> ApproxIndex {
    ApproxIndex::new(
        APPROX_CAPACITY_BLOCKS,
        SPECULATIVE_MAX_AGE.as_millis() as u64,
    )
}

impl WorkerSetState {
    /// The position in `endpoints` of the endpoint at `address`.
    pub fn position(&self, address: &str) -> Option<usize> {
        if let Some(&i) = self.positions.get(address)
            && self
                .endpoints
                .get(i)
                .is_some_and(|e| &*e.address == address)
        {
            return Some(i);
        }
        self.endpoints.iter().position(|e| &*e.address == address)
    }

    fn endpoint_mut(&mut self, address: &str) -> Option<&mut EndpointState> {
        let i = self.position(address)?;
        self.endpoints.get_mut(i)
    }

    /// Applies `change` to the endpoint at `address` and brings the load floor up to date.
    fn change_endpoint(&mut self, address: &str, change: impl FnOnce(&mut EndpointState)) {
        let Some(i) = self.position(address) else {
            return;
        };
        self.change_at(i, change);
    }

    /// Applies `change` to the endpoint at position `i` and brings the load floor up to date.
    fn change_at(&mut self, i: usize, change: impl FnOnce(&mut EndpointState)) {
        if let Some(ep) = self.endpoints.get_mut(i) {
            change(ep);
            self.floor.update(i, ep);
        }
    }

    /// Adds a load sample to the endpoint at position `i` ([`LoadWindow::push`]); returns
    /// false when an unknown or implausible value was replaced by the previous one.
    pub fn push_load(&mut self, i: usize, sample: LoadSample) -> bool {
        let mut plausible = true;
        self.change_at(i, |ep| plausible = ep.load.push(sample));
        plausible
    }

    /// Records the models the endpoint at `address` serves, with their `max_model_len` (what
    /// its `GET /v1/models` answered; empty: not known, e.g. after a restart), and brings
    /// [`context_limits`](Self::context_limits) up to date.
    pub fn set_max_model_lens(&mut self, address: &str, lens: Vec<(Arc<str>, u64)>) {
        let Some(ep) = self.endpoint_mut(address) else {
            return;
        };
        if ep.max_model_lens == lens {
            return;
        }
        ep.max_model_lens = lens;
        self.rebuild_context_limits();
    }

    /// The smallest `max_model_len` the endpoints reported for the upstream `model`, if any
    /// reported one: a request needing more context than this is refused by some of them.
    pub fn context_limit(&self, model: &str) -> Option<u64> {
        self.context_limits.get(model).copied()
    }

    fn rebuild_context_limits(&mut self) {
        let mut limits: AHashMap<Arc<str>, u64> = AHashMap::new();
        for (model, len) in self.endpoints.iter().flat_map(|e| &e.max_model_lens) {
            let l = limits.entry(model.clone()).or_insert(*len);
            *l = (*l).min(*len);
        }
        self.context_limits = limits;
    }

    /// Sets whether the endpoint at position `i` passes health checks.
    pub fn set_ready(&mut self, i: usize, ready: bool) {
        self.change_at(i, |ep| ep.ready = ready);
    }

    /// Sets whether the endpoint at position `i` has stale metrics.
    pub fn set_stale(&mut self, i: usize, stale: bool) {
        self.change_at(i, |ep| ep.stale = stale);
    }

    /// Rebuilds the load floor from the endpoints, after their fields were changed directly.
    pub fn rebuild_floor(&mut self) {
        self.floor = LoadFloor::build(&self.endpoints);
    }

    /// The prefix-index id of the endpoint at `address`.
    pub fn index_id(&self, address: &str) -> Option<EndpointId> {
        let i = self.position(address)?;
        self.endpoints.get(i).map(|e| e.index_id)
    }

    /// Forgets what an endpoint caches: after a KV-event sequence gap that replay cannot fill,
    /// or a publisher restart ([`crate::kv_events::SeqStatus`]). Returns false when the endpoint
    /// is unknown.
    pub fn reset_endpoint(&mut self, address: &str) -> bool {
        let Some(id) = self.index_id(address) else {
            return false;
        };
        match &mut self.prefix {
            PrefixTracking::Exact(index) => index.clear_endpoint(id),
            PrefixTracking::Approximate(index) => index.clear_endpoint(id),
        }
        self.routed.clear_endpoint(id);
        true
    }

    /// Forgets what data-parallel rank `rank` of an endpoint caches (its publisher's sequence
    /// gap could not be filled, or it restarted), leaving its other ranks' blocks
    /// ([`apply_rank_kv_events`](Self::apply_rank_kv_events)). The routed claims of the
    /// endpoint stay (they are not per rank; they expire on their own). Returns false when
    /// the endpoint is unknown.
    pub fn reset_endpoint_rank(&mut self, address: &str, rank: u32) -> bool {
        let Some(id) = self.index_id(address) else {
            return false;
        };
        match &mut self.prefix {
            PrefixTracking::Exact(index) => index.clear_rank(id, rank),
            PrefixTracking::Approximate(index) => index.clear_endpoint(id),
        }
        true
    }

    /// Takes in the block size the worker at `address` reports (`vllm:cache_config_info`).
    /// Without a configured size, the first report (or the first indexed `BlockStored`, see
    /// [`apply_kv_events`](Self::apply_kv_events)) is adopted; a later one that differs is
    /// adopted only when every endpoint that reported a size reports it, so that a worker set
    /// whose workers disagree (a rolling upgrade) keeps one size instead of switching, and
    /// emptying its index, at every scrape. When the size changes, the prefix tracking starts
    /// over (blocks of another size never match). Returns true when the size changed; the
    /// caller compares the report with [`block_size`](Self::block_size) to flag a mismatch.
    pub fn observe_block_size(&mut self, address: &str, block_size: usize) -> bool {
        if block_size == 0 {
            return false;
        }
        if let Some(i) = self.position(address)
            && let Some(ep) = self.endpoints.get_mut(i)
        {
            ep.reported_block_size = u32::try_from(block_size).ok();
        }
        if self.block_size_configured {
            return false;
        }
        if block_size == self.block_size {
            self.block_size_adopted = true;
            return false;
        }
        // Every endpoint that reports a size, and is ready and fresh, must agree before the set
        // switches: a dead or stale endpoint's old report does not hold a new size back.
        if self.block_size_adopted
            && !self.endpoints.iter().all(|e| {
                !e.ready
                    || e.stale
                    || e.reported_block_size
                        .is_none_or(|b| b as usize == block_size)
            })
        {
            return false;
        }
        self.set_block_size(block_size);
        true
    }

    /// Switches to an adopted block size: the prefix tracking and the routed claims start
    /// over; when the exact index held blocks or had rejected some, that is counted in
    /// [`block_size_resyncs`](Self::block_size_resyncs).
    fn set_block_size(&mut self, block_size: usize) {
        let lost = match &self.prefix {
            PrefixTracking::Exact(index) => {
                let st = index.stats();
                st.pairs > 0 || st.rejected > 0
            }
            PrefixTracking::Approximate(_) => false,
        };
        self.block_size = block_size;
        self.block_size_adopted = true;
        self.prefix = match &self.prefix {
            PrefixTracking::Exact(_) => PrefixTracking::Exact(PrefixIndex::new(block_size)),
            PrefixTracking::Approximate(_) => PrefixTracking::Approximate(ApproxIndex::new(
                APPROX_CAPACITY_BLOCKS,
                APPROX_MAX_AGE.as_millis() as u64,
            )),
        };
        self.routed = speculative_index();
        if lost {
            self.block_size_resyncs += 1;
        }
    }

    /// Applies KV events published by one endpoint (exact tracking only; ignored otherwise).
    /// Returns false when the endpoint is unknown.
    ///
    /// Without a configured block size and before one was adopted, the first `BlockStored`
    /// the index would take (GPU, its KV-cache group) decides the size: events replayed when
    /// a subscriber joins, before the first scrape reported the workers' size, are then
    /// indexed instead of rejected.
    pub fn apply_kv_events(&mut self, address: &str, events: &[KvEvent]) -> bool {
        self.apply_rank_kv_events(address, 0, events)
    }

    /// [`apply_kv_events`](Self::apply_kv_events) for the events of data-parallel rank
    /// `rank` of the endpoint: each rank's blocks are tracked apart, so that one rank's
    /// evictions, `AllBlocksCleared` or reset ([`reset_endpoint_rank`](Self::reset_endpoint_rank))
    /// leave the blocks the endpoint's other ranks hold; the endpoint matches the deepest
    /// prefix any of its ranks holds.
    pub fn apply_rank_kv_events(&mut self, address: &str, rank: u32, events: &[KvEvent]) -> bool {
        let Some(id) = self.index_id(address) else {
            return false;
        };
        if !self.block_size_adopted
            && !self.block_size_configured
            && let PrefixTracking::Exact(index) = &self.prefix
            && let Some(bs) = events.iter().find_map(|e| match e {
                KvEvent::BlockStored(s) if s.block_size > 0 && index.accepts_stored(s) => {
                    Some(s.block_size as usize)
                }
                _ => None,
            })
        {
            // What the endpoint's own events say is its report too, so that a later scrape of
            // another endpoint alone cannot switch the set away from it.
            if let Some(ep) = self
                .position(address)
                .and_then(|i| self.endpoints.get_mut(i))
            {
                ep.reported_block_size = u32::try_from(bs).ok();
            }
            if bs == self.block_size {
                self.block_size_adopted = true;
            } else {
                self.set_block_size(bs);
            }
        }
        if let PrefixTracking::Exact(index) = &mut self.prefix {
            // A block the engine reported is no longer a claim: the index holds it now (and
            // forgets it when the engine evicts it, which a claim would not).
            // The claims' endpoint is looked up once per batch, not per stored block.
            let mut claims = self.routed.releaser(id);
            index.apply_rank_all_with(id, rank, events, |own| {
                if let Some(c) = claims.as_mut() {
                    c.release(own);
                }
            });
        }
        true
    }
}

/// One provider.
#[derive(Clone, Debug)]
pub struct ProviderState {
    /// Healthy and below its concurrency limit.
    pub ready: bool,
    /// Observed TTFT (moving average), when any was observed.
    pub ttft_s: Option<f64>,
    /// Requests in flight.
    pub in_flight: u32,
}

/// Everything the engine reads about the cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// Worker sets by `namespace/name`.
    pub worker_sets: AHashMap<Arc<str>, WorkerSetState>,
    /// Providers by `namespace/name`.
    pub providers: AHashMap<Arc<str>, ProviderState>,
    /// The time decisions are made at (ms): windows end here.
    pub now_ms: u64,
}

impl ClusterState {
    /// Key of a destination: `namespace/name`.
    pub fn key(namespace: &str, name: &str) -> Arc<str> {
        format!("{namespace}/{name}").into()
    }

    /// The state of a worker set.
    pub fn worker_set(&self, namespace: &str, name: &str) -> Option<&WorkerSetState> {
        self.worker_sets.get(format!("{namespace}/{name}").as_str())
    }

    /// The state of a provider.
    pub fn provider(&self, namespace: &str, name: &str) -> Option<&ProviderState> {
        self.providers.get(format!("{namespace}/{name}").as_str())
    }

    /// Builds a state for a compiled policy: every static endpoint ready and idle, every
    /// provider ready, empty caches, TTFT models from the worker sets' priors.
    pub fn from_policy(policy: &kinf_lang::CompiledPolicy, block_size: usize) -> Self {
        let mut st = ClusterState::default();
        for d in &policy.destinations {
            let key = Self::key(&d.namespace, &d.name);
            if let Some(w) = &d.worker_set {
                let bs = w.block_size.map(|b| b as usize).unwrap_or(block_size);
                let endpoints: Vec<EndpointState> = w
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, a)| EndpointState {
                        address: a.clone(),
                        ready: true,
                        stale: false,
                        load: LoadWindow::default(),
                        ttft: TtftModel::from_prior(
                            w.prior.prefill_tokens_per_second,
                            w.prior.overhead.as_secs_f64(),
                        ),
                        index_id: EndpointId(i as u32),
                        assumed_cached_tokens: None,
                        inflight: InFlight::default(),
                        reported_block_size: None,
                        max_model_lens: Vec::new(),
                    })
                    .collect();
                let prefix = if w.kv_events.is_some() {
                    PrefixTracking::Exact(PrefixIndex::new(bs))
                } else {
                    PrefixTracking::Approximate(ApproxIndex::new(
                        APPROX_CAPACITY_BLOCKS,
                        APPROX_MAX_AGE.as_millis() as u64,
                    ))
                };
                let positions = endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (e.address.clone(), i))
                    .collect();
                st.worker_sets.insert(
                    key,
                    WorkerSetState {
                        floor: LoadFloor::build(&endpoints),
                        positions,
                        endpoints,
                        prefix,
                        block_size: bs,
                        block_size_configured: w.block_size.is_some(),
                        block_size_adopted: false,
                        block_size_resyncs: 0,
                        ttft: TtftModel::from_prior(
                            w.prior.prefill_tokens_per_second,
                            w.prior.overhead.as_secs_f64(),
                        ),
                        routed: speculative_index(),
                        context_limits: AHashMap::new(),
                    },
                );
            } else if d.provider.is_some() {
                st.providers.insert(
                    key,
                    ProviderState {
                        ready: true,
                        ttft_s: None,
                        in_flight: 0,
                    },
                );
            }
        }
        st
    }
}

impl ClusterState {
    /// Sets the time decisions are made at and precomputes every endpoint's default-window
    /// load, so that decisions read it instead of averaging samples.
    pub fn set_now(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        for ws in self.worker_sets.values_mut() {
            for ep in &mut ws.endpoints {
                ep.load.refresh_default(now_ms);
            }
        }
    }

    /// Records that `req` was routed to an endpoint: the endpoint will hold the prompt's
    /// blocks. Approximate tracking learns it for good (until capacity or age evicts it); exact
    /// tracking claims, for [`SPECULATIVE_MAX_AGE`] ([`WorkerSetState::routed`]), the blocks
    /// after the first `cached_tokens` (the decision's [`Route::cached_tokens`]: those the
    /// endpoint already holds or has been claimed for), until KV events have reported them.
    /// The blocks are the request's [`block_hashes`](Request::block_hashes) when their block
    /// size is the worker set's, else hashed from its token ids; without either nothing is
    /// recorded. Returns the worker set's block size (`None`: no such worker set or endpoint),
    /// for a caller that hashes the next prompt before taking its lock.
    ///
    /// [`Route::cached_tokens`]: crate::Route::cached_tokens
    pub fn record_routed(
        &mut self,
        namespace: &str,
        worker_set: &str,
        address: &str,
        req: &Request,
        cached_tokens: u32,
        now_ms: u64,
    ) -> Option<usize> {
        let ws = self
            .worker_sets
            .get_mut(format!("{namespace}/{worker_set}").as_str())?;
        let id = ws.index_id(address)?;
        let hashes = req.prompt_hashes(ws.block_size);
        match &mut ws.prefix {
            PrefixTracking::Approximate(index) => index.record(id, &hashes, now_ms),
            PrefixTracking::Exact(_) => {
                // Blocks before the cached ones are either reported by KV events or claimed
                // already (a claim is not renewed by routing again).
                let from = (cached_tokens as usize / ws.block_size.max(1)).min(hashes.len());
                ws.routed
                    .claim(id, hashes.get(from..).unwrap_or(&[]), now_ms);
            }
        }
        Some(ws.block_size)
    }

    fn worker_set_mut(&mut self, namespace: &str, worker_set: &str) -> Option<&mut WorkerSetState> {
        self.worker_sets
            .get_mut(format!("{namespace}/{worker_set}").as_str())
    }

    /// Counts a request routed to an endpoint with `uncached_tokens` to prefill
    /// ([`PredictionInputs::uncached_tokens`](crate::PredictionInputs::uncached_tokens) of the
    /// route's prediction) as in flight, so that the
    /// next decisions see the work at once. Pair with [`first_token`](Self::first_token) and
    /// [`end_request`](Self::end_request).
    pub fn begin_request(
        &mut self,
        namespace: &str,
        worker_set: &str,
        address: &str,
        uncached_tokens: u32,
    ) {
        if let Some(ws) = self.worker_set_mut(namespace, worker_set) {
            ws.change_endpoint(address, |ep| {
                ep.inflight.requests = ep.inflight.requests.saturating_add(1);
                ep.inflight.prefill_tokens = ep
                    .inflight
                    .prefill_tokens
                    .saturating_add(u64::from(uncached_tokens));
            });
        }
    }

    /// The request's first token arrived: its prefill is no longer queued work.
    pub fn first_token(
        &mut self,
        namespace: &str,
        worker_set: &str,
        address: &str,
        uncached_tokens: u32,
    ) {
        if let Some(ws) = self.worker_set_mut(namespace, worker_set) {
            ws.change_endpoint(address, |ep| {
                ep.inflight.prefill_tokens = ep
                    .inflight
                    .prefill_tokens
                    .saturating_sub(u64::from(uncached_tokens));
            });
        }
    }

    /// The request finished (completed, failed or abandoned). `prefill_pending` is true when
    /// its first token was never seen, so its prefill tokens are released too.
    pub fn end_request(
        &mut self,
        namespace: &str,
        worker_set: &str,
        address: &str,
        uncached_tokens: u32,
        prefill_pending: bool,
    ) {
        if let Some(ws) = self.worker_set_mut(namespace, worker_set) {
            ws.change_endpoint(address, |ep| {
                ep.inflight.requests = ep.inflight.requests.saturating_sub(1);
                if prefill_pending {
                    ep.inflight.prefill_tokens = ep
                        .inflight
                        .prefill_tokens
                        .saturating_sub(u64::from(uncached_tokens));
                }
            });
        }
    }

    /// Learns from an observed TTFT of a request routed to an endpoint, given the inputs its
    /// prediction used. Returns the prediction error (observed − predicted, seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn observe_ttft(
        &mut self,
        namespace: &str,
        worker_set: &str,
        address: &str,
        uncached_tokens: f64,
        queued: f64,
        running: f64,
        observed_s: f64,
    ) -> Option<f64> {
        let ws = self
            .worker_sets
            .get_mut(format!("{namespace}/{worker_set}").as_str())?;
        let predicted = ws.ttft.predict(uncached_tokens, queued, running).total_s;
        let ep = ws.endpoint_mut(address)?;
        ep.ttft
            .observe(uncached_tokens, queued, running, observed_s);
        ws.ttft
            .observe(uncached_tokens, queued, running, observed_s);
        Some(observed_s - predicted)
    }

    /// Prediction error of every endpoint, sorted by worker set and address.
    pub fn prediction_errors(&self) -> Vec<PredictionError> {
        let mut out: Vec<PredictionError> = self
            .worker_sets
            .iter()
            .flat_map(|(k, ws)| {
                ws.endpoints.iter().map(move |e| PredictionError {
                    worker_set: k.clone(),
                    endpoint: e.address.clone(),
                    abs_error_s: e.ttft.abs_error_s(),
                    rel_error: e.ttft.rel_error(),
                    observations: e.ttft.observations(),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.worker_set, &a.endpoint).cmp(&(&b.worker_set, &b.endpoint)));
        out
    }
}

impl ClusterState {
    /// Carries what was learned in `old` over to a state freshly built for a new policy
    /// ([`ClusterState::from_policy`]), worker set by worker set
    /// ([`WorkerSetState::carry_over_from`]). Providers keep their state.
    pub fn carry_over_from(&mut self, mut old: ClusterState) {
        for (key, ws) in &mut self.worker_sets {
            if let Some(prev) = old.worker_sets.remove(key) {
                ws.carry_over_from(prev);
            }
        }
        for (key, p) in &mut self.providers {
            if let Some(prev) = old.providers.remove(key) {
                *p = prev;
            }
        }
        self.now_ms = old.now_ms;
    }
}

impl WorkerSetState {
    /// Carries what `prev`, the same worker set's state under the previous policy, learned
    /// into this one, freshly built for the new policy ([`ClusterState::from_policy`]):
    ///
    /// - each endpoint at an address `prev` had keeps its readiness, staleness, load, TTFT
    ///   model, in-flight counts and reported block size; the set keeps its TTFT model;
    /// - when the prefix tracking mode is unchanged and the block size is too (or is not
    ///   configured: an adopted size is kept), the prefix index and the routed claims are
    ///   kept: the entries of endpoints that remain move to their new positions, those of
    ///   removed endpoints are dropped, added endpoints start empty. An endpoint added,
    ///   removed or flapping must not wipe what the others cache: their KV subscribers keep
    ///   running in sequence, so nothing would be replayed, and vLLM reports a block only
    ///   when it stores it, so blocks still cached would never be reported again (and the
    ///   events continuing them would be dropped as orphans).
    pub fn carry_over_from(&mut self, prev: WorkerSetState) {
        self.block_size_resyncs = self.block_size_resyncs.max(prev.block_size_resyncs);
        // Index ids of the endpoints that remain: old → new.
        let mut moved: AHashMap<EndpointId, EndpointId> = AHashMap::new();
        for ep in &mut self.endpoints {
            let Some(p) = prev
                .position(&ep.address)
                .and_then(|i| prev.endpoints.get(i))
            else {
                continue;
            };
            ep.ready = p.ready;
            ep.stale = p.stale;
            ep.load = p.load.clone();
            ep.ttft = p.ttft.clone();
            ep.inflight = p.inflight;
            ep.reported_block_size = p.reported_block_size;
            ep.max_model_lens = p.max_model_lens.clone();
            moved.insert(p.index_id, ep.index_id);
        }
        self.rebuild_context_limits();
        self.ttft = prev.ttft;
        let same_size = prev.block_size == self.block_size || !self.block_size_configured;
        if same_size && prev.prefix.mode() == self.prefix.mode() {
            if !self.block_size_configured {
                self.block_size = prev.block_size;
                // A size the previous policy configured was not reported by the workers.
                self.block_size_adopted = prev.block_size_adopted && !prev.block_size_configured;
            }
            let remap = |id: EndpointId| moved.get(&id).copied();
            self.prefix = prev.prefix;
            match &mut self.prefix {
                PrefixTracking::Exact(index) => index.remap_endpoints(remap),
                PrefixTracking::Approximate(index) => index.remap_endpoints(remap),
            }
            self.routed = prev.routed;
            self.routed.remap_endpoints(remap);
        }
        self.rebuild_floor();
    }
}

/// TTFT prediction error of one endpoint (moving averages).
#[derive(Clone, Debug, PartialEq)]
pub struct PredictionError {
    /// `namespace/name` of the worker set.
    pub worker_set: Arc<str>,
    /// Endpoint address.
    pub endpoint: Arc<str>,
    /// Mean |observed − predicted|, seconds.
    pub abs_error_s: f64,
    /// Mean |observed − predicted| / observed.
    pub rel_error: f64,
    /// Observations learned from.
    pub observations: u64,
}
