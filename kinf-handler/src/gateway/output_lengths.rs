//! Output lengths learned per model, for the requests that set no `max_tokens`.
//!
//! A chat or messages request without `max_tokens` may generate until the model stops (vLLM
//! then lets it fill the context), so what it will cost is unknown when it is admitted. The
//! gateway estimates it for the token-rate limits' reservation, the `Cost` measure and the
//! decode load it counts at the endpoint. It starts at [`DEFAULT_MAX_TOKENS`] and, once a model
//! has answered [`MIN_OBSERVATIONS`] such requests, uses the moving average of what they
//! generated per sequence (an exponentially weighted mean, weight [`WEIGHT`] for the newest),
//! so that the estimate follows the model and its traffic rather than a constant.
//!
//! [`DEFAULT_MAX_TOKENS`]: super::parse::DEFAULT_MAX_TOKENS

use std::sync::Arc;

use ahash::AHashMap;

/// Answers a model must have given before its average replaces the default.
pub const MIN_OBSERVATIONS: u64 = 20;
/// Weight of the newest answer in the moving average (about the last 40 answers count).
pub const WEIGHT: f64 = 0.05;
/// Most models remembered: the names are those of routed requests, so a bound only guards
/// memory against a policy serving very many model names.
pub const MAX_MODELS: usize = 4096;

/// One model's average.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Learned {
    /// Moving average of the output tokens per sequence.
    pub mean: f64,
    /// Answers seen.
    pub observations: u64,
}

impl Learned {
    /// The estimate in tokens, once there are enough observations: the average rounded up,
    /// at least 1.
    pub fn estimate(&self) -> Option<u32> {
        (self.observations >= MIN_OBSERVATIONS).then(|| {
            let t = self.mean.ceil().clamp(1.0, f64::from(u32::MAX));
            t as u32
        })
    }
}

/// Learned output lengths, by the model name the client asked for. Shared by every policy
/// generation.
#[derive(Debug, Default)]
pub struct OutputLengths {
    by_model: parking_lot::RwLock<AHashMap<Arc<str>, Learned>>,
}

impl OutputLengths {
    /// Learns that a request for `model` without `max_tokens` generated `output_tokens` over
    /// `sequences` sequences. Returns the model's state after it.
    pub fn observe(&self, model: &Arc<str>, output_tokens: u64, sequences: u64) -> Learned {
        let per_sequence = output_tokens as f64 / sequences.max(1) as f64;
        let mut map = self.by_model.write();
        if !map.contains_key(model) && map.len() >= MAX_MODELS {
            return Learned {
                mean: per_sequence,
                observations: 1,
            };
        }
        let l = map.entry(model.clone()).or_insert(Learned {
            mean: per_sequence,
            observations: 0,
        });
        // Until the weight's window has filled, the plain mean of what was seen (a first
        // answer does not count for 100 %, nor later ones for only 5 %).
        l.observations += 1;
        let w = WEIGHT.max(1.0 / l.observations as f64);
        l.mean += w * (per_sequence - l.mean);
        *l
    }

    /// The output tokens per sequence to expect of a request for `model` without
    /// `max_tokens`, once enough are known.
    pub fn estimate(&self, model: &str) -> Option<u32> {
        self.by_model.read().get(model).and_then(Learned::estimate)
    }

    /// Every model's state, by name.
    pub fn snapshot(&self) -> Vec<(Arc<str>, Learned)> {
        let mut v: Vec<_> = self
            .by_model
            .read()
            .iter()
            .map(|(k, l)| (k.clone(), *l))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_estimate_waits_for_enough_answers_then_follows_them() {
        let o = OutputLengths::default();
        let m: Arc<str> = "llama".into();
        for i in 1..MIN_OBSERVATIONS {
            o.observe(&m, 40, 1);
            assert_eq!(o.estimate("llama"), None, "after {i}");
        }
        o.observe(&m, 40, 1);
        assert_eq!(o.estimate("llama"), Some(40));
        assert_eq!(o.estimate("other"), None);
        // Per sequence: 300 tokens over 3 sequences is 100 each; the average moves toward it
        // by the weight, rounded up.
        o.observe(&m, 300, 3);
        assert_eq!(
            o.estimate("llama"),
            Some((40.0 + WEIGHT * 60.0_f64).ceil() as u32)
        );
        // A run of longer answers takes it there.
        for _ in 0..400 {
            o.observe(&m, 100, 1);
        }
        assert_eq!(o.estimate("llama"), Some(100));
    }

    #[test]
    fn the_first_answers_count_equally() {
        let o = OutputLengths::default();
        let m: Arc<str> = "m".into();
        for t in [10, 20, 30, 40] {
            o.observe(&m, t, 1);
        }
        let l = o.snapshot()[0].1;
        assert_eq!((l.mean, l.observations), (25.0, 4));
    }

    #[test]
    fn an_empty_answer_is_estimated_at_one_token_and_models_are_bounded() {
        let o = OutputLengths::default();
        let m: Arc<str> = "m".into();
        for _ in 0..MIN_OBSERVATIONS {
            o.observe(&m, 0, 1);
        }
        assert_eq!(o.estimate("m"), Some(1));
        for i in 0..MAX_MODELS + 10 {
            o.observe(&Arc::from(format!("m{i}")), 5, 1);
        }
        assert_eq!(o.snapshot().len(), MAX_MODELS);
    }
}
