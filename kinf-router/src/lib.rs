//! The embeddable Kinference decision library.
//!
//! Given a [`kinf_lang::CompiledPolicy`], a [`Request`] and the [`ClusterState`],
//! [`Decider::decide`] returns a [`Decision`] — route (endpoint, backend type, destination, model
//! to send upstream, header mutations) or reject (HTTP status, code, message naming the policy
//! and rule) — always with a full trace. Synchronous, no I/O, no async runtime.
//!
//! Also here: vLLM KV-event decoding ([`kv_events`]), the KV-cache prefix index
//! ([`prefix_index`]) and the block-hash table behind it ([`block_map`]), the TTFT predictor
//! ([`predictor`]) and token accounting ([`usage`]).

pub mod block_map;
pub mod classify;
pub mod decide;
pub mod decision;
pub mod kv_events;
pub mod load_floor;
pub mod predictor;
pub mod prefix_index;
pub mod request;
pub mod state;
pub mod synthetic;
pub mod tokenize;
pub mod usage;

pub use decide::{Decider, TraceDetail};
pub use decision::{Decision, Outcome, PredictionInputs, Reject, Route};
pub use request::Request;
pub use state::ClusterState;
