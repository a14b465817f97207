//! Fault injection: failed requests, streams cut short, lost or reordered KV events, a
//! restarted publisher and a slow or broken `/metrics`. Decisions are deterministic functions
//! of `--seed` and a per-kind counter.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::hash::mix64;

/// How a broken `/metrics` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MetricsBreak {
    /// HTTP 500 with a short text body.
    Error,
    /// HTTP 200 with text that is not Prometheus exposition.
    Garbage,
}

/// The fault switches (CLI flags `--fault-*`, or JSON keys of `POST /sim/faults`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Fraction (0..1) of inference requests answered with an OpenAI-style 500 error.
    #[arg(long = "fault-fail-rate", default_value_t = 0.0)]
    pub fail_rate: f64,
    /// Cut responses (streamed or not) after this many tokens: the connection is closed
    /// without `data: [DONE]` (or without a body) and the request is aborted.
    #[arg(long = "fault-die-after-tokens")]
    pub die_after_tokens: Option<u32>,
    /// Fraction (0..1) of responses `die_after_tokens` applies to.
    #[arg(long = "fault-die-rate", default_value_t = 1.0)]
    pub die_rate: f64,
    /// Fraction (0..1) of KV-event messages not published (their sequence numbers are still
    /// used, so subscribers see gaps; replay still has them).
    #[arg(long = "fault-kv-drop-rate", default_value_t = 0.0)]
    pub kv_drop_rate: f64,
    /// Fraction (0..1) of KV-event messages held back and published after the next one.
    #[arg(long = "fault-kv-reorder-rate", default_value_t = 0.0)]
    pub kv_reorder_rate: f64,
    /// Delay of every `/metrics` answer, milliseconds.
    #[arg(long = "fault-metrics-delay-ms", default_value_t = 0)]
    pub metrics_delay_ms: u64,
    /// Make `/metrics` fail.
    #[arg(long = "fault-metrics-broken", value_enum)]
    pub metrics_broken: Option<MetricsBreak>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            fail_rate: 0.0,
            die_after_tokens: None,
            die_rate: 1.0,
            kv_drop_rate: 0.0,
            kv_reorder_rate: 0.0,
            metrics_delay_ms: 0,
            metrics_broken: None,
        }
    }
}

impl Faults {
    /// Applies the keys present in a JSON object over the current settings.
    pub fn merged(&self, patch: &serde_json::Value) -> Result<Self, String> {
        let mut cur = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let (Some(cur_obj), Some(patch_obj)) = (cur.as_object_mut(), patch.as_object()) else {
            return Err("the body must be a JSON object".into());
        };
        for (k, v) in patch_obj {
            cur_obj.insert(k.clone(), v.clone());
        }
        let f: Self = serde_json::from_value(cur).map_err(|e| e.to_string())?;
        for (name, v) in [
            ("fail_rate", f.fail_rate),
            ("die_rate", f.die_rate),
            ("kv_drop_rate", f.kv_drop_rate),
            ("kv_reorder_rate", f.kv_reorder_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("`{name}` must be between 0 and 1"));
            }
        }
        Ok(f)
    }
}

/// The fault switches shared by the server's tasks.
#[derive(Debug, Clone)]
pub struct SharedFaults {
    inner: Arc<Mutex<Faults>>,
    seed: u64,
}

/// Independent decision streams.
#[derive(Debug, Clone, Copy)]
pub enum Stream {
    /// Fail a request.
    Fail = 1,
    /// Cut a response.
    Die = 2,
    /// Drop a KV message.
    KvDrop = 3,
    /// Reorder a KV message.
    KvReorder = 4,
}

impl SharedFaults {
    /// Shared switches starting at `faults`.
    pub fn new(faults: Faults, seed: u64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(faults)),
            seed,
        }
    }

    /// The current switches.
    pub fn get(&self) -> Faults {
        match self.inner.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Replaces the switches.
    pub fn set(&self, f: Faults) {
        match self.inner.lock() {
            Ok(mut g) => *g = f,
            Err(p) => *p.into_inner() = f,
        }
    }

    /// Whether the `n`-th decision of `stream` fires at probability `p` (deterministic).
    pub fn roll(&self, stream: Stream, n: u64, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        let h = mix64(self.seed ^ mix64((stream as u64) << 56 ^ n));
        ((h >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}
