//! Deterministic workload generators used by the calibration report, the speed benchmark and
//! tests (the benchmark crate has its own, richer ones).

use std::sync::Arc;

use serde::Serialize;

use crate::engine::Request;
use crate::hash::Rng;

/// The published benchmark's shared-prefix workload: each request is one of `num_prefixes`
/// prefixes of `prefix_tokens` tokens, followed by `unique_tokens` random tokens, and generates
/// `output_tokens` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SharedPrefixSpec {
    /// Distinct prefixes.
    pub num_prefixes: usize,
    /// Tokens per prefix.
    pub prefix_tokens: usize,
    /// Unique tokens appended per request.
    pub unique_tokens: usize,
    /// Tokens generated per request.
    pub output_tokens: u32,
    /// Token ids are drawn from `0..vocab`.
    pub vocab: u32,
}

impl SharedPrefixSpec {
    /// NOTES.md §4: 24 prefixes × 16,000 tokens + 256 unique, 256 output tokens.
    pub fn published() -> Self {
        Self {
            num_prefixes: 24,
            prefix_tokens: 16_000,
            unique_tokens: 256,
            output_tokens: 256,
            vocab: 151_936,
        }
    }

    /// Prompt length.
    pub fn prompt_tokens(&self) -> usize {
        self.prefix_tokens + self.unique_tokens
    }
}

/// Generates [`SharedPrefixSpec`] requests with ids `0, 1, 2, …`, choosing the prefix
/// uniformly at random.
#[derive(Debug, Clone)]
pub struct SharedPrefixGen {
    spec: SharedPrefixSpec,
    prefixes: Vec<Vec<u32>>,
    rng: Rng,
    next_id: u64,
}

impl SharedPrefixGen {
    /// A generator for `spec`, deterministic for `seed`.
    pub fn new(spec: SharedPrefixSpec, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let prefixes = (0..spec.num_prefixes)
            .map(|_| rng.tokens(spec.prefix_tokens, spec.vocab))
            .collect();
        Self {
            spec,
            prefixes,
            rng,
            next_id: 0,
        }
    }

    /// The spec.
    pub fn spec(&self) -> &SharedPrefixSpec {
        &self.spec
    }

    /// The prefixes' token ids.
    pub fn prefixes(&self) -> &[Vec<u32>] {
        &self.prefixes
    }

    /// The next request and the index of its prefix.
    pub fn next_request(&mut self) -> (usize, Request) {
        let p = self.rng.below(self.prefixes.len() as u64) as usize;
        let req = self.request_with_prefix(p);
        (p, req)
    }

    /// The next request, with prefix `p` (modulo the number of prefixes).
    pub fn request_with_prefix(&mut self, p: usize) -> Request {
        let n = self.prefixes.len().max(1);
        let prefix = self.prefixes.get(p % n).map(Vec::as_slice).unwrap_or(&[]);
        let mut prompt = Vec::with_capacity(self.spec.prompt_tokens());
        prompt.extend_from_slice(prefix);
        for _ in 0..self.spec.unique_tokens {
            prompt.push(self.rng.below(u64::from(self.spec.vocab.max(1))) as u32);
        }
        let id = self.next_id;
        self.next_id += 1;
        Request::new(id, Arc::<[u32]>::from(prompt), self.spec.output_tokens)
    }
}

/// Poisson arrival times (exponential gaps with mean `1 / rate` seconds), starting after 0.
#[derive(Debug, Clone)]
pub struct Poisson {
    rate: f64,
    t: f64,
    rng: Rng,
}

impl Poisson {
    /// Arrivals at `rate` per second, deterministic for `seed`.
    pub fn new(rate: f64, seed: u64) -> Self {
        Self {
            rate,
            t: 0.0,
            rng: Rng::new(seed ^ 0x706f_6973_736f_6e00),
        }
    }
}

impl Iterator for Poisson {
    type Item = f64;

    fn next(&mut self) -> Option<f64> {
        self.t += self.rng.exp(self.rate);
        self.t.is_finite().then_some(self.t)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_requests_share_exactly_their_prefix() {
        let spec = SharedPrefixSpec {
            num_prefixes: 3,
            prefix_tokens: 32,
            unique_tokens: 8,
            output_tokens: 4,
            vocab: 1000,
        };
        let mut g = SharedPrefixGen::new(spec, 1);
        let mut h = SharedPrefixGen::new(spec, 1);
        for _ in 0..20 {
            let (p, r) = g.next_request();
            let (q, s) = h.next_request();
            assert_eq!((p, &r), (q, &s));
            assert_eq!(r.prompt.len(), 40);
            assert_eq!(&r.prompt[..32], g.prefixes()[p].as_slice());
        }
    }

    #[test]
    fn poisson_rate_is_right() {
        let n = 20_000;
        let last = Poisson::new(5.0, 3).take(n).last().unwrap();
        let rate = n as f64 / last;
        assert!((rate - 5.0).abs() < 0.2, "{rate}");
    }
}
