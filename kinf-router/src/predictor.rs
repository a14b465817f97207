//! Time-to-first-token prediction with coefficients learned online.
//!
//! For a local endpoint and a request:
//!
//! ```text
//! ttft = wait + prefill + overhead
//! wait     = pending_tokens × s_per_token × (1 + interference × running_prompts)
//!          + queued_prompts × per_queued_s
//!          + running_prompts × per_running_s
//! prefill  = uncached_tokens × s_per_token × (1 + interference × running_prompts)
//! overhead = overhead_s
//! ```
//!
//! `uncached_tokens = prompt_tokens − cached_prefix_tokens` comes from the prefix index;
//! `pending_tokens` are the uncached prompt tokens of the requests this gateway routed to the
//! endpoint whose first token has not arrived (prefill queued ahead; vLLM schedules prefill
//! first come, first served), and `queued_prompts` the queue the endpoint reports beyond those
//! requests (other gateways' work; [`crate::decision::PredictionInputs`]).
//! `running_prompts × per_running_s` is the decode load: every engine step carries one token
//! of each running sequence, so each running sequence makes every step longer, and a new
//! request's first token waits for the step in progress and then its own (the interference
//! factor is the same effect on a prefill that spans several steps). The four coefficients
//! `[overhead_s, s_per_token, per_queued_s, per_running_s]` start from the worker set's
//! performance prior and are refined by recursive least squares (forgetting factor 0.98) from
//! observed TTFTs (with the covariance kept symmetric and bounded by the prior's, against
//! wind-up, and the coefficients kept in range by projection, see [`TtftModel::observe`]). A
//! cold idle worker beats a warm worker once the warm one's queue wait exceeds the prefill it
//! saves — the point of predicting TTFT instead of maximizing cache hits.
//!
//! Selection ranks by the prediction plus two capacity costs, the delay the choice adds to the
//! requests already in flight on the endpoint: [`TtftModel::recompute_cost`] (prefilling tokens
//! that another candidate already caches delays every one of them) and
//! [`TtftModel::decode_cost`] (the request's decode makes each of their steps longer). Both are
//! free on an idle worker and grow with its load.

use serde::Serialize;

/// Parts of one prediction, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TtftParts {
    /// Waiting behind queued work and the decode steps of the running requests.
    pub wait_s: f64,
    /// Prefill of the uncached tokens.
    pub prefill_s: f64,
    /// Fixed overhead.
    pub overhead_s: f64,
    /// The sum: the predicted TTFT of this request.
    pub total_s: f64,
    /// Capacity cost of a recompute, not part of `total_s`: the delay that prefilling prompt
    /// tokens another candidate already caches adds to the other requests in flight on this
    /// endpoint ([`TtftModel::recompute_cost`]). `minimize: PredictedTTFT` ranks candidates by
    /// [`rank_s`](Self::rank_s) (`total_s + recompute_s + decode_s`); filters and the route's
    /// predicted TTFT use `total_s`. Zero (and left out of traces) when nothing is recomputed or
    /// nothing else is in flight.
    #[serde(skip_serializing_if = "is_zero")]
    pub recompute_s: f64,
    /// Capacity cost of the request's decode, not part of `total_s`: the delay that its decode
    /// steps add to the other requests in flight on this endpoint
    /// ([`TtftModel::decode_cost`]). Part of the rank like `recompute_s`; zero (and left out of
    /// traces) when nothing else is in flight.
    #[serde(skip_serializing_if = "is_zero")]
    pub decode_s: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl TtftParts {
    /// What `minimize: PredictedTTFT` ranks by: the predicted TTFT plus the capacity costs of
    /// the choice (recompute and decode).
    pub fn rank_s(&self) -> f64 {
        self.total_s + self.recompute_s + self.decode_s
    }
}

/// Default slowdown of prefill per running sequence (decode steps share the batch).
pub const DEFAULT_INTERFERENCE: f64 = 0.01;
/// Default number of prompt tokens a queued request is assumed to hold, for the wait prior.
pub const DEFAULT_QUEUED_PROMPT_TOKENS: f64 = 2048.0;
/// Default cost of one running sequence in an engine step, in prompt tokens, for the
/// decode-load prior (`per_running_s = 4 × s_per_token`): a decoding sequence adds about as much
/// to a step as a few prompt tokens do (its one new token, and the read of its KV cache).
pub const DEFAULT_RUNNING_PROMPT_TOKENS: f64 = 4.0;
/// Engine steps a short prompt's first token waits for, on average: the rest of the step in
/// progress (half of one, arriving at a random time) and its own. `per_running_s` is learned
/// from first tokens, so one running sequence makes a step longer by about
/// `per_running_s / FIRST_TOKEN_STEPS`.
pub const FIRST_TOKEN_STEPS: f64 = 1.5;
/// The share of a request's decode that a request already in flight overlaps, on average: one
/// that has just arrived overlaps all of it, one about to finish none of it (in steady state,
/// with output lengths alike, half).
pub const DECODE_OVERLAP: f64 = 0.5;

/// A residual larger than this many times the moving average of the residuals learned from,
/// and than this many times the prediction, is learned as that many ([`TtftModel::observe`]).
pub const OUTLIER_SCALES: f64 = 4.0;
/// The least limit on a residual learned from, in seconds ([`TtftModel::observe`]).
pub const MIN_RESIDUAL_LIMIT_S: f64 = 0.05;

/// Coefficients of the model: `[overhead_s, s_per_token, per_queued_s, per_running_s]`.
const N: usize = 4;
/// The least value of each coefficient.
const THETA_MIN: [f64; N] = [0.0, 1e-7, 0.0, 0.0];
/// The largest value of each coefficient.
const THETA_MAX: [f64; N] = [60.0, 1.0, 600.0, 1.0];

/// The learned TTFT model of one endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct TtftModel {
    theta: [f64; N],
    p: [[f64; N]; N],
    /// The prior's variances: the bound on `p`'s diagonal (see [`TtftModel::observe`]).
    p_max: [f64; N],
    interference: f64,
    observations: u64,
    abs_error_ewma_s: f64,
    rel_error_ewma: f64,
    /// Moving average of the residuals learned from, each limited as [`observe`](Self::observe)
    /// describes: the scale against which a residual counts as an outlier.
    residual_scale_s: f64,
}

impl TtftModel {
    /// A model from a prior: prefill tokens per second and fixed overhead.
    pub fn from_prior(prefill_tokens_per_second: f64, overhead_s: f64) -> Self {
        let tps = if prefill_tokens_per_second > 0.0 {
            prefill_tokens_per_second
        } else {
            5000.0
        };
        let s_per_token = 1.0 / tps;
        let p_max = [
            0.05f64.powi(2),
            (0.5 * s_per_token).powi(2),
            (0.5 * DEFAULT_QUEUED_PROMPT_TOKENS * s_per_token).powi(2),
            (DEFAULT_RUNNING_PROMPT_TOKENS * s_per_token).powi(2),
        ];
        TtftModel {
            theta: [
                overhead_s.max(0.0),
                s_per_token,
                DEFAULT_QUEUED_PROMPT_TOKENS * s_per_token,
                DEFAULT_RUNNING_PROMPT_TOKENS * s_per_token,
            ],
            // Prior confidence: overhead ±50 ms, per-token ±50 %, per-queued ±50 %,
            // per-running ±100 % (the least known: it depends on the model's attention cost and
            // the context lengths).
            p: diag(&p_max),
            p_max,
            interference: DEFAULT_INTERFERENCE,
            observations: 0,
            abs_error_ewma_s: 0.0,
            rel_error_ewma: 0.0,
            residual_scale_s: 0.0,
        }
    }

    fn features(&self, uncached_tokens: f64, queued: f64, running: f64) -> [f64; N] {
        [
            1.0,
            uncached_tokens * (1.0 + self.interference * running.max(0.0)),
            queued.max(0.0),
            running.max(0.0),
        ]
    }

    /// Predicts TTFT for a request with `uncached_tokens` behind `pending_tokens` of queued
    /// prefill: the prefill of both is one term of the model, split into `wait_s` (the pending
    /// share) and `prefill_s` (the request's own). [`observe`](Self::observe) takes
    /// `uncached_tokens + pending_tokens` as its prefill input.
    pub fn predict_behind(
        &self,
        uncached_tokens: f64,
        pending_tokens: f64,
        queued: f64,
        running: f64,
    ) -> TtftParts {
        let own = uncached_tokens.max(0.0);
        let pending = pending_tokens.max(0.0);
        let p = self.predict(own + pending, queued, running);
        let total_prefill = p.prefill_s;
        let own_share = if own + pending > 0.0 {
            own / (own + pending)
        } else {
            1.0
        };
        let prefill_s = total_prefill * own_share;
        TtftParts {
            wait_s: p.wait_s + (total_prefill - prefill_s),
            prefill_s,
            overhead_s: p.overhead_s,
            total_s: p.total_s,
            recompute_s: 0.0,
            decode_s: 0.0,
        }
    }

    /// The capacity cost of prefilling `recompute_tokens` prompt tokens that another candidate
    /// already caches, on an endpoint with `queued` and `running` requests: the prefill time of
    /// those tokens times the requests it delays there.
    ///
    /// An engine computes one batch per step: prefill chunks share their steps with the decode
    /// of every running request (and come before the prefill of queued ones), so each second of
    /// prefill on an endpoint is a second added to the latency of each request in flight there.
    /// Prefill of tokens that no candidate holds is spent wherever the request goes; tokens that
    /// another candidate holds are spent only because of this choice. Charging them at their
    /// cost to others makes the choice the one with the least total delay instead of the least
    /// delay for this request alone: free on an idle endpoint (nobody waits; a cold idle worker
    /// still beats a warm busy one), expensive on a busy one, where recomputing a long cached
    /// prefix would take capacity from everything already running there.
    pub fn recompute_cost(&self, recompute_tokens: f64, queued: f64, running: f64) -> f64 {
        if recompute_tokens <= 0.0 {
            return 0.0;
        }
        // The compute time of the tokens alone: the decode work sharing the steps is what is
        // delayed, so the interference factor of this request's own prefill does not apply.
        let prefill_s = self.predict(recompute_tokens, 0.0, 0.0).prefill_s;
        prefill_s * (queued.max(0.0) + running.max(0.0))
    }

    /// The capacity cost of a request's decode on an endpoint with `queued` and `running`
    /// requests: `2 × per_running_s / FIRST_TOKEN_STEPS × decode_tokens × DECODE_OVERLAP ×
    /// (queued + running)`, i.e. two thirds of `per_running_s × decode_tokens × (queued +
    /// running)`.
    ///
    /// The same argument as [`recompute_cost`](Self::recompute_cost), for the decode: every
    /// engine step carries one token of each running sequence, so while the request decodes
    /// (up to `decode_tokens` steps, its `max_tokens`) each step is longer by one sequence's
    /// share, and each request in flight there waits for the steps it overlaps. The share of a
    /// step is `per_running_s / FIRST_TOKEN_STEPS` (`per_running_s` is what one more running
    /// sequence adds to a first token, which waits for about one and a half steps), and a
    /// request in flight overlaps on average [`DECODE_OVERLAP`] of the decode. The delay is
    /// mutual: over the steps they share, each request in flight makes this request's own
    /// decode longer by the same share, hence the factor 2. The prediction alone sees the
    /// decode load only as this request's wait; this cost is what makes a request prefer the
    /// worker where its decode and the others' slow each other down least (without the own
    /// half, a hot prefix's requests kept piling onto the one worker that held it).
    pub fn decode_cost(&self, decode_tokens: f64, queued: f64, running: f64) -> f64 {
        let step_share_s = self.theta[3] / FIRST_TOKEN_STEPS;
        let in_flight = queued.max(0.0) + running.max(0.0);
        // Both directions: this request delays the others, and they delay it, by one share
        // per step shared.
        (2.0 * step_share_s * decode_tokens.max(0.0) * DECODE_OVERLAP * in_flight).max(0.0)
    }

    /// Predicts TTFT for a request with `uncached_tokens` on an endpoint with the given load.
    pub fn predict(&self, uncached_tokens: f64, queued: f64, running: f64) -> TtftParts {
        let x = self.features(uncached_tokens.max(0.0), queued, running);
        let overhead_s = self.theta[0].max(0.0);
        let prefill_s = (self.theta[1] * x[1]).max(0.0);
        let wait_s = (self.theta[2] * x[2]).max(0.0) + (self.theta[3] * x[3]).max(0.0);
        TtftParts {
            wait_s,
            prefill_s,
            overhead_s,
            total_s: wait_s + prefill_s + overhead_s,
            recompute_s: 0.0,
            decode_s: 0.0,
        }
    }

    /// Learns from one observed TTFT (seconds) of a request whose prediction inputs were these:
    /// one step of recursive least squares with forgetting, its covariance kept symmetric and
    /// bounded by the prior's, and the coefficients kept in range (`constrain`).
    ///
    /// An observation that is not a positive finite number, or whose inputs are not finite, is
    /// ignored: no first token comes in no time (a reporter's 0 means "unknown"), and a NaN or
    /// infinite input cannot be learned from (it made the error averages infinite for good).
    ///
    /// The residual learned from is limited to [`OUTLIER_SCALES`] times the larger of the
    /// moving average of the residuals learned before and the prediction itself (so an
    /// observation up to five times the prediction is learned in full), and never to less
    /// than [`MIN_RESIDUAL_LIMIT_S`] (a Huber step). One absurd observation (a TTFT of 2^64 ms
    /// from a clock that went backwards, a stream stuck for a day) otherwise moved the
    /// coefficients to their limits (an overhead of 60 s) in one step, and with the bounded
    /// covariance they took many hundreds of observations to come back: the endpoints looked
    /// a minute slow meanwhile. A real change still shows: residuals that stay large raise the
    /// scale by 30 % per observation.
    pub fn observe(&mut self, uncached_tokens: f64, queued: f64, running: f64, observed_s: f64) {
        let learnable = observed_s.is_finite()
            && observed_s > 0.0
            && uncached_tokens.is_finite()
            && queued.is_finite()
            && running.is_finite();
        if !learnable {
            return;
        }
        let predicted = self.predict(uncached_tokens, queued, running).total_s;
        let limit =
            (OUTLIER_SCALES * self.residual_scale_s.max(predicted)).max(MIN_RESIDUAL_LIMIT_S);
        // The reported errors count an outlier at the limit too: one absurd observation kept
        // `abs_error_s` huge for some 300 observations (×0.9 each), long after the model had
        // recovered. A real change still shows within a few observations (the limit grows).
        let err = (observed_s - predicted).abs().min(limit);
        let alpha = 0.1;
        self.abs_error_ewma_s = (1.0 - alpha) * self.abs_error_ewma_s + alpha * err;
        self.rel_error_ewma = (1.0 - alpha) * self.rel_error_ewma + alpha * (err / observed_s);
        self.observations += 1;
        // Recursive least squares with forgetting.
        let lambda = 0.98;
        let x = self.features(uncached_tokens.max(0.0), queued, running);
        let px = mat_vec(&self.p, &x);
        let denom = lambda + dot(&x, &px);
        if !denom.is_finite() || denom <= 0.0 {
            // Not a covariance any more (cannot happen with a positive semi-definite `p`):
            // start over from the prior's confidence instead of refusing every later update.
            self.p = diag(&self.p_max);
            return;
        }
        let residual = (observed_s - dot(&x, &self.theta)).clamp(-limit, limit);
        self.residual_scale_s = (1.0 - alpha) * self.residual_scale_s + alpha * residual.abs();
        let k = px.map(|v| v / denom);
        for (t, ki) in self.theta.iter_mut().zip(k) {
            *t += ki * residual;
        }
        // `k px^T` is symmetric, so `p` stays symmetric in exact arithmetic; in floating point
        // each update leaves a rounding-sized asymmetry that the division by `lambda` then
        // amplifies (×1/0.98 per observation). After a few thousand observations `p` was no
        // longer a covariance at all (a negative variance), the gains changed sign, the
        // coefficients were driven to their clamps and the update was refused for good
        // (`denom <= 0`): the model stopped learning. Each update is therefore symmetrized.
        let mut p = [[0.0; N]; N];
        for (i, row) in p.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                let sym = 0.5 * ((self.p[i][j] - k[i] * px[j]) + (self.p[j][i] - k[j] * px[i]));
                *cell = sym / lambda;
            }
        }
        // Bounded covariance: with forgetting, the variance of a coefficient that the recent
        // observations do not inform (a feature that stays constant, such as `queued` at 0)
        // grows by 1/0.98 per observation without bound, and the next observation that moves
        // that feature then swings the coefficient wildly (RLS "wind-up": overheads and
        // per-queued costs of minutes under sustained load). No coefficient is allowed to be
        // less certain than the prior made it: `p ← D p D` with `D` scaling each variance back
        // to its bound (keeps `p` positive semi-definite).
        let mut d = [1.0; N];
        for (i, di) in d.iter_mut().enumerate() {
            if p[i][i] > self.p_max[i] && p[i][i].is_finite() {
                *di = (self.p_max[i] / p[i][i]).sqrt();
            }
        }
        for (i, row) in p.iter_mut().enumerate() {
            for (j, cell) in row.iter_mut().enumerate() {
                *cell *= d[i] * d[j];
            }
        }
        // A variance that rounding made non-positive (or not finite) would stop the learning
        // the same way: start over from the prior's confidence.
        if (0..N).any(|i| !(p[i][i] > 0.0 && p[i][i].is_finite())) {
            p = diag(&self.p_max);
        }
        self.p = p;
        self.constrain();
    }

    /// Coefficients are physical quantities: keeps them non-negative and sane
    /// ([`THETA_MIN`], [`THETA_MAX`]).
    ///
    /// A coefficient outside its range is set to the bound and the others are corrected by
    /// their covariance with it (`θ ← θ − p[·][i] / p[i][i] × (θ_i − bound)`: the least-squares
    /// estimate given that coefficient at its bound), not merely clipped. Clipping one
    /// coefficient of a correlated pair leaves the other where it was moved to compensate for
    /// the unclipped value: when the data pull a coefficient below its bound at every update
    /// (the per-running cost, while the interference term already grows with `running`), its
    /// partner ratchets at every update; in the 3-worker chat scale run the overhead reached
    /// its 60 s limit within 150 s.
    fn constrain(&mut self) {
        for _ in 0..N {
            let Some(i) = (0..N).find(|&i| !(THETA_MIN[i]..=THETA_MAX[i]).contains(&self.theta[i]))
            else {
                break;
            };
            let bound = self.theta[i].clamp(THETA_MIN[i], THETA_MAX[i]);
            let excess = self.theta[i] - bound;
            let pii = self.p[i][i];
            if pii > 0.0 && excess.is_finite() {
                for (t, row) in self.theta.iter_mut().zip(&self.p) {
                    *t -= row[i] / pii * excess;
                }
            }
            self.theta[i] = bound;
        }
        for ((t, lo), hi) in self.theta.iter_mut().zip(THETA_MIN).zip(THETA_MAX) {
            *t = t.clamp(lo, hi);
        }
    }

    /// Observations learned from.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Moving average of |observed − predicted| in seconds, each error limited as the residual
    /// learned from is ([`observe`](Self::observe)).
    pub fn abs_error_s(&self) -> f64 {
        self.abs_error_ewma_s
    }

    /// Moving average of |observed − predicted| / observed.
    pub fn rel_error(&self) -> f64 {
        self.rel_error_ewma
    }

    /// Current prefill throughput estimate (tokens/s).
    pub fn prefill_tokens_per_second(&self) -> f64 {
        1.0 / self.theta[1]
    }
}

fn diag(v: &[f64; N]) -> [[f64; N]; N] {
    let mut m = [[0.0; N]; N];
    for (i, row) in m.iter_mut().enumerate() {
        row[i] = v[i];
    }
    m
}

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn mat_vec(m: &[[f64; N]; N], v: &[f64; N]) -> [f64; N] {
    m.map(|row| dot(&row, v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_idle_beats_warm_busy_and_warm_idle_beats_cold() {
        let m = TtftModel::from_prior(4000.0, 0.02);
        let prompt = 16_256.0;
        let warm_uncached = 256.0;
        let cold_idle = m.predict(prompt, 0.0, 0.0).total_s;
        let warm_idle = m.predict(warm_uncached, 0.0, 0.0).total_s;
        let warm_busy = m.predict(warm_uncached, 12.0, 8.0).total_s;
        assert!(warm_idle < cold_idle, "{warm_idle} < {cold_idle}");
        assert!(cold_idle < warm_busy, "{cold_idle} < {warm_busy}");
    }

    #[test]
    fn learns_a_slower_worker() {
        let mut m = TtftModel::from_prior(4000.0, 0.02);
        // The worker is really 2× slower than the prior says.
        for i in 0..200 {
            let tokens = 500.0 + (i % 7) as f64 * 1000.0;
            let queued = (i % 3) as f64;
            let truth = 0.03 + tokens / 2000.0 + queued * 1.0;
            m.observe(tokens, queued, 0.0, truth);
        }
        let p = m.predict(4000.0, 0.0, 0.0).total_s;
        assert!((p - (0.03 + 2.0)).abs() < 0.1, "predicted {p}");
        assert!(m.rel_error() < 0.05);
        assert!((m.prefill_tokens_per_second() - 2000.0).abs() < 100.0);
    }

    /// A small deterministic generator for test inputs (xorshift).
    fn next(state: &mut u64) -> f64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A model learned from 20,000 observations like the 3-worker chat scale run's: prefill
    /// inputs of 256–3,072 tokens, 50–600 running sequences, TTFTs of `truth(tokens, running)`
    /// with ±20 % noise.
    fn long_run_under_load(truth: impl Fn(f64, f64) -> f64) -> TtftModel {
        let mut m = TtftModel::from_prior(2980.0, 0.2);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..20_000 {
            let tokens = 256.0 * (1.0 + (next(&mut rng) * 12.0).floor());
            let running = 50.0 + next(&mut rng) * 550.0;
            let noise = 0.8 + 0.4 * next(&mut rng);
            m.observe(tokens, 0.0, running, truth(tokens, running) * noise);
        }
        m
    }

    #[test]
    fn keeps_learning_over_a_long_run_under_load() {
        // The 3-worker chat scale run: ≈ 18,000 observations, hundreds of running sequences,
        // prefill inputs of 256–3,000 tokens, TTFTs of 0.2–1 s. Before each update was
        // symmetrized, rounding made the covariance indefinite after ≈ 3,500 of them and the
        // model froze with its overhead at 0 and its per-token cost at the clamp's floor.
        let truth = |tokens: f64, running: f64| 0.2 + tokens * (1.0 + 0.01 * running) / 30_000.0;
        let m = long_run_under_load(truth);
        for (tokens, running) in [(256.0, 100.0), (2048.0, 500.0)] {
            let p = m.predict(tokens, 0.0, running).total_s;
            let t = truth(tokens, running);
            assert!((p - t).abs() < 0.1 * t, "predicted {p}, truth {t}");
        }
        for (i, row) in m.p.iter().enumerate() {
            assert!(row[i] > 0.0, "variance {i}: {}", row[i]);
            for (j, x) in row.iter().enumerate() {
                assert_eq!(*x, m.p[j][i], "p[{i}][{j}]");
            }
        }
    }

    #[test]
    fn learns_the_decode_load() {
        // A worker whose running sequences lengthen every step: 2 ms of TTFT per running
        // sequence, whatever the prompt, on top of the interference with a prefill. The
        // interference factor alone (prefill × 1 % per running sequence) cannot fit that: a
        // short prompt would be predicted nearly as fast behind 300 decoding sequences as on
        // an idle worker.
        let mut m = TtftModel::from_prior(5000.0, 0.1);
        let truth = |tokens: f64, running: f64| {
            0.1 + tokens * (1.0 + 0.01 * running) / 5000.0 + 0.002 * running
        };
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..2_000 {
            let tokens = 256.0 + (next(&mut rng) * 4_000.0).floor();
            let running = (next(&mut rng) * 300.0).floor();
            m.observe(tokens, 0.0, running, truth(tokens, running));
        }
        for (tokens, running) in [(256.0, 0.0), (256.0, 300.0), (4_000.0, 150.0)] {
            let p = m.predict(tokens, 0.0, running).total_s;
            let t = truth(tokens, running);
            assert!(
                (p - t).abs() < 0.05 * t,
                "({tokens}, {running}): {p} vs {t}"
            );
        }
        assert!((m.theta[3] - 0.002).abs() < 0.0005, "{:?}", m.theta);
    }

    #[test]
    fn a_coefficient_held_at_its_bound_does_not_drag_the_others() {
        // TTFTs that do not depend on the running sequences at all, while the interference
        // factor already grows with them: least squares wants a negative per-running cost at
        // every update. Clipped alone, it left the overhead where it had compensated, and the
        // overhead ratcheted up to its 60 s limit.
        let truth = |tokens: f64| 0.2 + tokens / 30_000.0;
        let m = long_run_under_load(|tokens, _| truth(tokens));
        assert!(m.theta[0] < 0.3, "{:?}", m.theta);
        for (tokens, running) in [(256.0, 100.0), (2048.0, 500.0)] {
            let p = m.predict(tokens, 0.0, running).total_s;
            let t = truth(tokens);
            assert!(
                (p - t).abs() < 0.15 * t,
                "({tokens}, {running}): {p} vs {t}"
            );
        }
    }

    #[test]
    fn decode_cost_is_free_when_idle_and_grows_with_the_requests_in_flight() {
        let m = TtftModel::from_prior(3000.0, 0.2);
        assert_eq!(m.decode_cost(256.0, 0.0, 0.0), 0.0);
        // One running sequence's share of a step, for half of the 256 steps, both ways.
        let per_step = DEFAULT_RUNNING_PROMPT_TOKENS / 3000.0 / FIRST_TOKEN_STEPS;
        let one = m.decode_cost(256.0, 0.0, 1.0);
        assert!((one - 2.0 * 128.0 * per_step).abs() < 1e-12, "{one}");
        assert!((m.decode_cost(256.0, 2.0, 10.0) - 12.0 * one).abs() < 1e-9);
        assert!((m.decode_cost(512.0, 0.0, 1.0) - 2.0 * one).abs() < 1e-12);
        // Part of the rank, not of the prediction.
        let mut parts = m.predict(256.0, 0.0, 10.0);
        let total = parts.total_s;
        parts.decode_s = m.decode_cost(256.0, 0.0, 10.0);
        assert_eq!(parts.total_s, total);
        assert_eq!(parts.rank_s(), total + parts.decode_s);
    }

    #[test]
    fn running_sequences_lengthen_the_predicted_wait() {
        let m = TtftModel::from_prior(3000.0, 0.2);
        let idle = m.predict(256.0, 0.0, 0.0);
        let busy = m.predict(256.0, 0.0, 100.0);
        let decode_wait = 100.0 * DEFAULT_RUNNING_PROMPT_TOKENS / 3000.0;
        assert!(
            (busy.wait_s - idle.wait_s - decode_wait).abs() < 1e-12,
            "{busy:?}"
        );
    }

    #[test]
    fn ignores_garbage_observations() {
        let mut m = TtftModel::from_prior(4000.0, 0.02);
        let before = m.clone();
        m.observe(100.0, 0.0, 0.0, f64::NAN);
        m.observe(100.0, 0.0, 0.0, -1.0);
        assert_eq!(m, before);
    }
}
