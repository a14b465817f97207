//! A simulated vLLM engine on a virtual clock.
//!
//! The model follows vLLM v1 (0.2x–0.3x): a KV cache of `num_gpu_blocks` blocks with prefix
//! caching (reference counts, LRU eviction of free blocks), a FCFS scheduler bounded by
//! `max_num_seqs` and `max_num_batched_tokens` with chunked prefill and preemption by
//! recomputation, and a per-step time computed from the step's prefill tokens, decoding
//! sequences and attention work ([`StepModel`]). It emits vLLM-shaped KV events
//! ([`kinf_router::kv_events::KvEvent`]) and keeps vLLM's metrics as plain structs.
//!
//! - [`Engine`]: one engine, driven by [`Engine::submit`], [`Engine::next_event_time`] and
//!   [`Engine::advance_to`] — by a discrete-event loop, or in real time by a server that
//!   advances it to the wall clock.
//! - [`Fleet`]: many engines on one event queue with a pluggable [`Router`].
//! - [`Profile`]: the constants (`l40s-qwen27b-fp8`, `h100-llama70b`, `tiny`); see
//!   `docs/sim/calibration.md`.
//! - [`calibrate`] and [`mod@bench`]: the `kinf-sim calibrate` report and the speed benchmark.
//!
//! Time is `f64` seconds everywhere.
//!
//! ```
//! use kinf_sim::{Engine, EngineOptions, EngineView, Fleet, Output, Profile, Request};
//!
//! // One engine, stepped from event to event.
//! let mut e = Engine::new(Profile::tiny(), EngineOptions::default())?;
//! e.submit(Request::new(1, vec![1, 2, 3, 4, 5, 6, 7, 8, 9], 4), 0.0)
//!     .map_err(|r| format!("{r:?}"))?;
//! let mut tokens = 0;
//! while let Some(t) = e.next_event_time() {
//!     for out in e.advance_to(t) {
//!         if let Output::Token { .. } = out {
//!             tokens += 1;
//!         }
//!     }
//! }
//! assert_eq!(tokens, 4);
//! assert_eq!(e.cached_block_hashes().len(), 3); // 12 of 13 tokens in full blocks of 4
//!
//! // Four engines, a least-loaded router, Poisson-ish arrivals.
//! let mut fleet = Fleet::new(&Profile::tiny(), EngineOptions::default(), 4)?;
//! let arrivals = (0..40u64).map(|i| (i as f64 * 0.001, Request::new(i, vec![7; 20], 5)));
//! let mut router = |_: &Request, engines: &[EngineView<'_>]| {
//!     let load = |v: &EngineView<'_>| v.gauges().running + v.gauges().waiting;
//!     engines.iter().min_by_key(|v| load(v)).map_or(0, |v| v.index)
//! };
//! let summary = fleet.run(arrivals, &mut router, |_engine, _output| {});
//! assert_eq!(summary.finished, 40);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bench;
mod block_pool;
pub mod calibrate;
mod engine;
mod fleet;
pub mod hash;
pub mod metrics;
mod profile;
pub mod serve;
pub mod workload;

pub use engine::{
    Engine, EngineOptions, FinishReason, Finished, InvalidProfile, KvBatch, Output, RejectReason,
    Rejected, Request, RequestId, RequestStats, StepInfo,
};
pub use fleet::{EngineView, Fleet, Router, RunSummary};
pub use hash::{PrefixHashes, output_token};
pub use metrics::{Counters, EngineMetrics, Gauges, Histogram, Histograms};
pub use profile::{FrontendModel, PROFILE_NAMES, Profile, StepModel};
