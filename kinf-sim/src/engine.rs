//! One simulated vLLM engine on a virtual clock.
//!
//! The engine is a discrete-event model of vLLM v1's engine core: requests pass an API-server
//! delay ([`FrontendModel`](crate::FrontendModel)), wait in a FCFS queue, and are scheduled step
//! by step exactly as vLLM's scheduler does it (running requests first, preempting the most
//! recently admitted one when the KV cache is full; then waiting requests while
//! `max_num_seqs` and the `max_num_batched_tokens` budget allow, chunking prefills). Each step
//! takes the time [`StepModel`](crate::StepModel) gives for its composition; at its end every
//! request whose prompt is fully computed samples one token.
//!
//! Driving it: [`Engine::submit`] at time `now`, then [`Engine::advance_to`]`(t)` processes every
//! event up to `t` and returns the [`Output`]s; [`Engine::next_event_time`] says when the next
//! one is due. A discrete-event driver jumps from event to event; a real-time server calls
//! `advance_to(clock.now())` and sleeps until `next_event_time()` (or until a request arrives).
//! Everything is deterministic: the same calls give the same outputs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use kinf_router::kv_events::{BlockHashes, BlockStored, KvEvent, Medium, encode_payload};
use serde::Serialize;

use crate::block_pool::{BlockPool, IdMap};
use crate::hash::{NONE_HASH, PrefixHashes, block_hash, output_token};
use crate::metrics::{Counters, EngineMetrics, Gauges};
use crate::profile::Profile;

/// A request's identifier, chosen by the caller (unique among the engine's live requests).
pub type RequestId = u64;

/// A request to the engine: prompt token ids and how many tokens to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Caller-chosen identifier.
    pub id: RequestId,
    /// Prompt token ids (prefix caching depends on the real sequence).
    pub prompt: Arc<[u32]>,
    /// Tokens to generate (vLLM `max_tokens`; the simulator never stops early).
    pub max_tokens: u32,
    /// Seed of the generated token ids ([`crate::output_token`]); defaults to `id`.
    pub output_seed: u64,
    /// The block hashes of the prompt's leading tokens, if the caller had them
    /// ([`with_prefix_hashes`](Self::with_prefix_hashes)).
    prefix_hashes: Option<PrefixHashes>,
}

impl Request {
    /// A request generating `max_tokens` tokens after `prompt`.
    pub fn new(id: RequestId, prompt: impl Into<Arc<[u32]>>, max_tokens: u32) -> Self {
        Self {
            id,
            prompt: prompt.into(),
            max_tokens,
            output_seed: id,
            prefix_hashes: None,
        }
    }

    /// Attaches the precomputed hashes of a shared prefix, which the engine then does not
    /// compute again. The engine checks them when the request is submitted and ignores them
    /// unless the prompt begins with the prefix's tokens and the block size is its own, so a
    /// hint never changes an outcome.
    pub fn with_prefix_hashes(mut self, prefix: PrefixHashes) -> Self {
        self.prefix_hashes = Some(prefix);
        self
    }

    /// The prefix hashes attached with [`with_prefix_hashes`](Self::with_prefix_hashes).
    pub fn prefix_hashes(&self) -> Option<&PrefixHashes> {
        self.prefix_hashes.as_ref()
    }

    /// Sets the seed of the generated tokens.
    pub fn with_output_seed(mut self, seed: u64) -> Self {
        self.output_seed = seed;
        self
    }
}

/// What the engine can be asked to report besides first tokens and completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EngineOptions {
    /// Emit [`Output::KvEvents`] (vLLM's KV-cache events, one batch per step that changed the
    /// cache).
    pub kv_events: bool,
    /// Emit one [`Output::Token`] per generated token (streaming). Large simulations turn this
    /// off: ITL is still measured (histograms and per-request statistics).
    pub token_outputs: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            kv_events: true,
            token_outputs: true,
        }
    }
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// It generated `max_tokens` tokens (vLLM `finished_reason="length"`).
    Length,
    /// The caller aborted it (`finished_reason="abort"`).
    Abort,
}

/// Timings and token counts of one request (all times in seconds on the engine's clock).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RequestStats {
    /// When it was submitted.
    pub arrival: f64,
    /// When it reached the scheduler's queue (after the API-server delay).
    pub ready: f64,
    /// When it was first scheduled.
    pub scheduled: Option<f64>,
    /// When its first token was produced.
    pub first_token: Option<f64>,
    /// When its last token was produced (or it was aborted).
    pub finished: f64,
    /// Prompt length.
    pub prompt_tokens: u32,
    /// Prompt tokens found in the prefix cache when it was first scheduled.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// Times it was preempted.
    pub preemptions: u32,
}

impl RequestStats {
    /// Time to first token, from submission.
    pub fn ttft(&self) -> Option<f64> {
        self.first_token.map(|t| t - self.arrival)
    }

    /// End-to-end latency.
    pub fn e2e(&self) -> f64 {
        self.finished - self.arrival
    }

    /// Mean inter-token latency (decode time / (output tokens − 1)); `None` under 2 tokens.
    pub fn mean_itl(&self) -> Option<f64> {
        match self.first_token {
            Some(ft) if self.output_tokens >= 2 => {
                Some((self.finished - ft) / f64::from(self.output_tokens - 1))
            }
            _ => None,
        }
    }
}

/// A finished request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// When it finished.
    pub time: f64,
    /// Why.
    pub reason: FinishReason,
    /// Its timings.
    pub stats: RequestStats,
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// The prompt leaves no room for one output token within `max_model_len` (or the KV
    /// cache, whichever is smaller).
    PromptTooLong,
    /// The prompt is empty.
    EmptyPrompt,
    /// `max_tokens` is 0.
    NoOutput,
    /// A live request already has this id.
    DuplicateId,
    /// The submission time is not a finite, non-negative number.
    BadTime,
    /// A router chose an engine index that does not exist (see [`crate::Fleet::route`]).
    NoEngine,
}

/// A refused request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Rejected {
    /// The request.
    pub id: RequestId,
    /// When.
    pub time: f64,
    /// Why.
    pub reason: RejectReason,
}

/// The KV events one engine step produced, in order (one vLLM ZMQ message).
#[derive(Debug, Clone, PartialEq)]
pub struct KvBatch {
    /// When the step ended (vLLM publishes a step's events after it).
    pub time: f64,
    /// The events.
    pub events: Vec<KvEvent>,
}

impl KvBatch {
    /// The msgpack payload vLLM 0.32 would publish for this batch (`[ts, events, dp_rank]`),
    /// with the given wall-clock timestamp.
    pub fn payload(&self, ts: f64, dp_rank: Option<i64>) -> Vec<u8> {
        encode_payload(ts, &self.events, dp_rank)
    }
}

/// Something the engine did.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A request produced its first token.
    FirstToken {
        /// The request.
        id: RequestId,
        /// When.
        time: f64,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: u32,
        /// Prompt length.
        prompt_tokens: u32,
    },
    /// A generated token (only with [`EngineOptions::token_outputs`]; includes the first).
    Token {
        /// The request.
        id: RequestId,
        /// When.
        time: f64,
        /// Position among the request's output tokens (0-based).
        index: u32,
        /// The token id.
        token: u32,
    },
    /// A request finished.
    Finished(Finished),
    /// A request was refused (reported by drivers such as [`crate::Fleet`]; [`Engine::submit`]
    /// returns it directly).
    Rejected(Rejected),
    /// KV-cache events (only with [`EngineOptions::kv_events`]).
    KvEvents(KvBatch),
}

impl Output {
    /// When it happened.
    pub fn time(&self) -> f64 {
        match self {
            Self::FirstToken { time, .. } | Self::Token { time, .. } => *time,
            Self::Finished(f) => f.time,
            Self::Rejected(r) => r.time,
            Self::KvEvents(b) => b.time,
        }
    }
}

/// The step in flight: when it started and ends, and what it computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StepInfo {
    /// When it started.
    pub start: f64,
    /// When it ends.
    pub end: f64,
    /// Prompt tokens computed (all prefill chunks).
    pub prefill_tokens: u64,
    /// Sequences decoding one token.
    pub decode_seqs: u64,
    /// Requests scheduled (prefill chunks and decodes).
    pub scheduled: usize,
    /// Tokens scheduled (`prefill_tokens + decode_seqs`; at most `max_num_batched_tokens`).
    pub tokens: u64,
}

/// The profile's constants could not run an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidProfile(pub String);

impl std::fmt::Display for InvalidProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid profile: {}", self.0)
    }
}

impl std::error::Error for InvalidProfile {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the API-server delay.
    Pending,
    Waiting,
    Running,
}

#[derive(Debug, Clone)]
struct Seq {
    id: RequestId,
    prompt: Arc<[u32]>,
    max_tokens: u32,
    output_seed: u64,
    output_len: u32,
    /// Tokens whose KV is computed or scheduled in the step in flight.
    num_computed: u32,
    /// Engine hashes of the leading full blocks (extended lazily).
    hashes: Vec<u64>,
    /// Block table.
    blocks: Vec<u32>,
    /// Leading blocks of `blocks` already offered to the prefix cache.
    num_cached_blocks: u32,
    state: State,
    aborted: bool,
    arrival: f64,
    ready: f64,
    scheduled: Option<f64>,
    first_token: Option<f64>,
    last_token: f64,
    cached_tokens: u32,
    preemptions: u32,
}

impl Seq {
    #[inline]
    fn prompt_len(&self) -> u32 {
        self.prompt.len() as u32
    }

    #[inline]
    fn num_tokens(&self) -> u32 {
        self.prompt_len() + self.output_len
    }
}

/// Token `i` of a sequence: from the prompt, else generated.
#[inline]
fn token_at(prompt: &[u32], seed: u64, vocab: u32, i: u32) -> u32 {
    match prompt.get(i as usize) {
        Some(&t) => t,
        None => output_token(seed, i - prompt.len() as u32, vocab),
    }
}

/// Extends `seq.hashes` to `upto` blocks.
fn ensure_hashes(seq: &mut Seq, upto: usize, bs: usize, vocab: u32, scratch: &mut Vec<u32>) {
    let plen = seq.prompt.len();
    while seq.hashes.len() < upto {
        let k = seq.hashes.len();
        let parent = seq.hashes.last().copied().unwrap_or(NONE_HASH);
        let start = k * bs;
        let h = if start + bs <= plen {
            block_hash(parent, seq.prompt.get(start..start + bs).unwrap_or(&[]))
        } else {
            scratch.clear();
            for i in start..start + bs {
                scratch.push(token_at(&seq.prompt, seq.output_seed, vocab, i as u32));
            }
            block_hash(parent, scratch)
        };
        seq.hashes.push(h);
    }
}

/// Time → heap key (order-preserving for non-negative finite times).
#[inline]
fn key(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

/// One simulated vLLM engine. See the module docs.
#[derive(Debug)]
pub struct Engine {
    profile: Profile,
    opts: EngineOptions,
    bs: u32,
    /// `min(max_model_len, KV capacity in tokens)`.
    max_len: u32,
    now: f64,
    pool: BlockPool,
    seqs: Vec<Option<Seq>>,
    free_slots: Vec<u32>,
    by_id: IdMap<u32>,
    /// (ready time, submission order, slot).
    pending: BinaryHeap<Reverse<(u64, u64, u32)>>,
    order: u64,
    /// Aborted requests still in `pending`.
    pending_aborted: usize,
    waiting: VecDeque<u32>,
    running: Vec<u32>,
    /// The step in flight: (slot, tokens scheduled).
    items: Vec<(u32, u32)>,
    step_active: bool,
    step_start: f64,
    step_end: f64,
    step_info: StepInfo,
    /// Outputs produced outside a step (aborts, a reset while idle), delivered next.
    deferred: Vec<Output>,
    metrics: EngineMetrics,
    scratch_tokens: Vec<u32>,
    scratch_blocks: Vec<u32>,
    finished_scratch: Vec<u32>,
}

impl Engine {
    /// An idle engine at time 0 with an empty cache.
    pub fn new(profile: Profile, opts: EngineOptions) -> Result<Self, InvalidProfile> {
        profile.validate().map_err(InvalidProfile)?;
        let bs = profile.block_size;
        let cap = u64::from(profile.num_gpu_blocks) * u64::from(bs);
        let max_len = u64::from(profile.max_model_len)
            .min(cap)
            .min(u64::from(u32::MAX)) as u32;
        Ok(Self {
            pool: BlockPool::new(profile.num_gpu_blocks, opts.kv_events),
            profile,
            opts,
            bs,
            max_len,
            now: 0.0,
            seqs: Vec::new(),
            free_slots: Vec::new(),
            by_id: IdMap::default(),
            pending: BinaryHeap::new(),
            order: 0,
            pending_aborted: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            items: Vec::new(),
            step_active: false,
            step_start: 0.0,
            step_end: 0.0,
            step_info: StepInfo::default(),
            deferred: Vec::new(),
            metrics: EngineMetrics::default(),
            scratch_tokens: Vec::new(),
            scratch_blocks: Vec::new(),
            finished_scratch: Vec::new(),
        })
    }

    /// The engine's profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The engine's options.
    pub fn options(&self) -> EngineOptions {
        self.opts
    }

    /// The engine's clock: the latest time it was advanced to.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Longest sequence accepted: `min(max_model_len, KV capacity in tokens)`.
    pub fn max_len(&self) -> u32 {
        self.max_len
    }

    /// Counters and histograms.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.metrics
    }

    /// Counters.
    pub fn counters(&self) -> &Counters {
        &self.metrics.counters
    }

    /// Current gauges.
    pub fn gauges(&self) -> Gauges {
        Gauges {
            running: self.running.len(),
            waiting: self.waiting.len() + self.pending.len().saturating_sub(self.pending_aborted),
            kv_cache_usage: self.pool.usage(),
            free_blocks: self.pool.num_free(),
            cached_blocks: self.pool.num_cached(),
            num_gpu_blocks: self.pool.num_blocks(),
        }
    }

    /// The step in flight, if any.
    pub fn current_step(&self) -> Option<StepInfo> {
        self.step_active.then_some(self.step_info)
    }

    /// Number of live requests (pending, waiting or running).
    pub fn num_live(&self) -> usize {
        self.by_id.len()
    }

    /// Whether nothing is in flight or queued.
    pub fn is_idle(&self) -> bool {
        self.by_id.is_empty() && !self.step_active && self.deferred.is_empty()
    }

    /// Prompt tokens still to compute for requests queued or mid-prefill (a load measure for
    /// routers; prefix-cache hits not yet looked up are not subtracted).
    pub fn pending_prefill_tokens(&self) -> u64 {
        let mut total = 0u64;
        let mut add = |slot: u32| {
            if let Some(Some(s)) = self.seqs.get(slot as usize) {
                let left = s.num_tokens().saturating_sub(s.num_computed);
                if !s.aborted && (left > 1 || s.output_len == 0) {
                    total += u64::from(left);
                }
            }
        };
        for &s in &self.waiting {
            add(s);
        }
        for &s in &self.running {
            add(s);
        }
        for Reverse((_, _, s)) in &self.pending {
            add(*s);
        }
        total
    }

    /// Engine hashes of the full blocks of `tokens` for this engine's block size.
    pub fn block_hashes(&self, tokens: &[u32]) -> Vec<u64> {
        crate::hash::block_hashes(tokens, self.bs as usize)
    }

    /// How many leading blocks of a chain of engine `hashes` the prefix cache holds now
    /// (ground truth; an oracle router may use it).
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        let mut n = 0;
        self.pool.for_each_cached_prefix(hashes, |_| n += 1);
        n
    }

    /// Prompt tokens of `tokens` a request would find cached now (capped, as vLLM does, so
    /// that at least one token is computed).
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> u32 {
        if tokens.is_empty() {
            return 0;
        }
        let bs = self.bs as usize;
        let max_blocks = (tokens.len() - 1) / bs;
        let hashes = crate::hash::block_hashes(tokens.get(..max_blocks * bs).unwrap_or(&[]), bs);
        (self.cached_prefix_blocks(&hashes) * bs) as u32
    }

    /// Every engine block hash the prefix cache holds, sorted (ground truth for checking a
    /// consumer of the KV events).
    pub fn cached_block_hashes(&self) -> Vec<u64> {
        self.pool.cached_hashes()
    }

    /// Checks internal invariants (block accounting, queue consistency); for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check()?;
        let mut refs = vec![0u32; self.pool.num_blocks() as usize];
        for &slot in &self.running {
            let Some(Some(s)) = self.seqs.get(slot as usize) else {
                return Err(format!("running slot {slot} is empty"));
            };
            if s.state != State::Running {
                return Err(format!(
                    "request {} in running with state {:?}",
                    s.id, s.state
                ));
            }
            let need = s.num_computed.div_ceil(self.bs) as usize;
            if s.blocks.len() != need {
                return Err(format!(
                    "request {} holds {} blocks for {} computed tokens",
                    s.id,
                    s.blocks.len(),
                    s.num_computed
                ));
            }
            for &b in &s.blocks {
                if let Some(r) = refs.get_mut(b as usize) {
                    *r += 1;
                }
            }
        }
        for &slot in &self.waiting {
            let Some(Some(s)) = self.seqs.get(slot as usize) else {
                return Err(format!("waiting slot {slot} is empty"));
            };
            if !s.blocks.is_empty() || s.state != State::Waiting {
                return Err(format!("waiting request {} holds blocks", s.id));
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            if self.pool.ref_cnt(b as u32) != r {
                return Err(format!(
                    "block {b}: ref_cnt {} but {r} holders",
                    self.pool.ref_cnt(b as u32)
                ));
            }
        }
        if self.running.len() > self.profile.max_num_seqs as usize {
            return Err("more running requests than max_num_seqs".into());
        }
        Ok(())
    }

    /// Submits a request at time `now` (not before the engine's clock; earlier times are
    /// taken as the clock). It reaches the scheduler after the profile's API-server delay.
    pub fn submit(&mut self, req: Request, now: f64) -> Result<(), Rejected> {
        let reject = |reason| Rejected {
            id: req.id,
            time: now,
            reason,
        };
        if !now.is_finite() || now < 0.0 {
            self.metrics.counters.requests_rejected += 1;
            return Err(reject(RejectReason::BadTime));
        }
        let now = now.max(self.now);
        let reason = if req.prompt.is_empty() {
            Some(RejectReason::EmptyPrompt)
        } else if req.max_tokens == 0 {
            Some(RejectReason::NoOutput)
        } else if req.prompt.len() >= self.max_len as usize {
            Some(RejectReason::PromptTooLong)
        } else if self.by_id.contains_key(&req.id) {
            Some(RejectReason::DuplicateId)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.metrics.counters.requests_rejected += 1;
            return Err(Rejected {
                id: req.id,
                time: now,
                reason,
            });
        }
        let plen = req.prompt.len() as u32;
        let max_tokens = req.max_tokens.min(self.max_len - plen);
        let ready = now + self.profile.frontend.delay(req.prompt.len());
        // Hashes the caller computed once for a shared prefix, if they are this prompt's (the
        // rest are computed lazily). Checked here rather than when attached, since `prompt` is
        // a public field; the prompt was just built, so the comparison reads warm memory.
        let hashes = match &req.prefix_hashes {
            Some(p) if p.block_size() == self.bs && req.prompt.starts_with(p.tokens()) => {
                let mut v = Vec::with_capacity(((plen + max_tokens) / self.bs) as usize);
                v.extend_from_slice(p.hashes());
                v
            }
            _ => Vec::new(),
        };
        let seq = Seq {
            id: req.id,
            prompt: req.prompt,
            max_tokens,
            output_seed: req.output_seed,
            output_len: 0,
            num_computed: 0,
            hashes,
            blocks: Vec::new(),
            num_cached_blocks: 0,
            state: State::Pending,
            aborted: false,
            arrival: now,
            ready,
            scheduled: None,
            first_token: None,
            last_token: now,
            cached_tokens: 0,
            preemptions: 0,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                if let Some(cell) = self.seqs.get_mut(s as usize) {
                    *cell = Some(seq);
                }
                s
            }
            None => {
                self.seqs.push(Some(seq));
                (self.seqs.len() - 1) as u32
            }
        };
        self.by_id.insert(req.id, slot);
        self.pending.push(Reverse((key(ready), self.order, slot)));
        self.order += 1;
        Ok(())
    }

    /// Aborts a live request (as a client disconnect does). Its [`Output::Finished`] (reason
    /// [`FinishReason::Abort`]) comes with the next [`advance_to`](Self::advance_to): at once if
    /// it was not in the step in flight, else when that step ends. Returns whether the id was
    /// live.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(&slot) = self.by_id.get(&id) else {
            return false;
        };
        let in_step = self.step_active && self.items.iter().any(|&(s, _)| s == slot);
        let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
            return false;
        };
        if seq.aborted {
            return true;
        }
        seq.aborted = true;
        match seq.state {
            // Released when it leaves the API-server delay.
            State::Pending => {
                let stats = Self::stats_of(seq, self.now);
                self.by_id.remove(&id);
                self.pending_aborted += 1;
                self.metrics.counters.requests_aborted += 1;
                self.deferred.push(Output::Finished(Finished {
                    id,
                    time: self.now,
                    reason: FinishReason::Abort,
                    stats,
                }));
            }
            State::Waiting => {
                self.waiting.retain(|&s| s != slot);
                let now = self.now;
                let mut out = std::mem::take(&mut self.deferred);
                self.finish_request(slot, FinishReason::Abort, now, &mut out);
                self.deferred = out;
            }
            State::Running => {
                if !in_step {
                    self.running.retain(|&s| s != slot);
                    let now = self.now;
                    let mut out = std::mem::take(&mut self.deferred);
                    self.finish_request(slot, FinishReason::Abort, now, &mut out);
                    self.deferred = out;
                }
            }
        }
        true
    }

    /// Drops every cached block if no request holds any (vLLM's `POST /reset_prefix_cache`);
    /// `AllBlocksCleared` follows with the next step's events (at once when idle). Returns
    /// whether the cache was reset.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if !self.pool.reset() {
            return false;
        }
        if !self.step_active && self.pool.has_events() {
            let events = self.pool.take_events();
            self.deferred.push(Output::KvEvents(KvBatch {
                time: self.now,
                events,
            }));
        }
        true
    }

    /// When the next event is due: the end of the step in flight, a request leaving the
    /// API-server delay, or now if outputs are waiting to be delivered. `None` when idle.
    pub fn next_event_time(&self) -> Option<f64> {
        let mut t = if self.deferred.is_empty() {
            f64::INFINITY
        } else {
            self.now
        };
        if self.step_active {
            t = t.min(self.step_end);
        }
        if let Some(Reverse((k, _, _))) = self.pending.peek() {
            t = t.min(f64::from_bits(*k));
        }
        (t < f64::INFINITY).then_some(t)
    }

    /// Processes every event due at or before `t` (in time order) and sets the clock to `t`;
    /// outputs are appended to `out`.
    pub fn advance_into(&mut self, t: f64, out: &mut Vec<Output>) {
        while let Some(next) = self.next_event_time() {
            if next > t {
                break;
            }
            self.process_at(next, out);
        }
        if t > self.now {
            self.now = t;
        }
    }

    /// [`advance_into`](Self::advance_into) returning a fresh vector.
    pub fn advance_to(&mut self, t: f64) -> Vec<Output> {
        let mut out = Vec::new();
        self.advance_into(t, &mut out);
        out
    }

    /// Processes only the next event (and everything due at the same time); returns its time,
    /// or `None` when idle.
    pub fn advance_next(&mut self, out: &mut Vec<Output>) -> Option<f64> {
        let t = self.next_event_time()?;
        self.advance_into(t, out);
        Some(t)
    }

    /// Runs until idle; returns the time the last event happened.
    pub fn run_until_idle(&mut self, out: &mut Vec<Output>) -> f64 {
        while self.advance_next(out).is_some() {}
        self.now
    }

    fn process_at(&mut self, time: f64, out: &mut Vec<Output>) {
        if time > self.now {
            self.now = time;
        }
        out.append(&mut self.deferred);
        if self.step_active && self.step_end <= self.now {
            self.finish_step(out);
        }
        while let Some(&Reverse((k, _, slot))) = self.pending.peek() {
            if f64::from_bits(k) > self.now {
                break;
            }
            self.pending.pop();
            let Some(cell) = self.seqs.get_mut(slot as usize) else {
                continue;
            };
            match cell {
                Some(seq) if seq.aborted => {
                    *cell = None;
                    self.free_slots.push(slot);
                    self.pending_aborted -= 1;
                }
                Some(seq) => {
                    seq.state = State::Waiting;
                    self.waiting.push_back(slot);
                }
                None => {}
            }
        }
        if !self.step_active {
            self.start_step(out);
        }
    }

    fn start_step(&mut self, out: &mut Vec<Output>) {
        let mut composition = self.schedule();
        if self.items.is_empty() && !self.waiting.is_empty() {
            // A step that preempted admits nobody; if that left nothing to run, schedule
            // again (now without preemption) rather than stall.
            composition = self.schedule();
        }
        let (prefill_tokens, decode_seqs, pairs, decode_ctx) = composition;
        if self.items.is_empty() {
            // Unreachable with a validated profile (every accepted request fits an empty
            // cache); kept so that a bug can never stall the event loop.
            if self.running.is_empty()
                && let Some(slot) = self.waiting.pop_front()
            {
                let now = self.now;
                self.finish_request(slot, FinishReason::Abort, now, out);
            }
            if self.pool.has_events() {
                out.push(Output::KvEvents(KvBatch {
                    time: self.now,
                    events: self.pool.take_events(),
                }));
            }
            return;
        }
        let dur = self
            .profile
            .step
            .step_time(prefill_tokens, decode_seqs, pairs, decode_ctx);
        self.step_active = true;
        self.step_start = self.now;
        self.step_end = self.now + dur;
        self.step_info = StepInfo {
            start: self.step_start,
            end: self.step_end,
            prefill_tokens,
            decode_seqs,
            scheduled: self.items.len(),
            tokens: prefill_tokens + decode_seqs,
        };
        let c = &mut self.metrics.counters;
        c.steps += 1;
        c.busy_s += dur;
        c.prefill_tokens_computed += prefill_tokens;
    }

    /// vLLM v1's `Scheduler.schedule()`; fills `self.items`. Returns the step's composition
    /// (prefill tokens, decoding sequences, prefill attention pairs, decode context tokens).
    fn schedule(&mut self) -> (u64, u64, f64, u64) {
        self.items.clear();
        let mut budget = self.profile.max_num_batched_tokens;
        let mut prefill_tokens = 0u64;
        let mut decode_seqs = 0u64;
        let mut pairs = 0f64;
        let mut decode_ctx = 0u64;
        let mut account = |computed: u32, n: u32, decode: bool| {
            if decode {
                decode_seqs += 1;
                decode_ctx += u64::from(computed) + 1;
            } else {
                prefill_tokens += u64::from(n);
                let (c, n) = (f64::from(computed), f64::from(n));
                pairs += n * c + n * (n + 1.0) / 2.0;
            }
        };

        // Running requests, in admission order.
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let Some(&slot) = self.running.get(i) else {
                break;
            };
            let Some(Some(seq)) = self.seqs.get(slot as usize) else {
                i += 1;
                continue;
            };
            let before = seq.num_computed;
            let decode = seq.output_len > 0 && before + 1 == seq.num_tokens();
            let n = (seq.num_tokens() - before).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            // Fast path: a decode step inside the last block (no allocation, no block
            // becoming full).
            if decode && before % self.bs != 0 && (before + 1) % self.bs != 0 {
                if let Some(Some(seq)) = self.seqs.get_mut(slot as usize) {
                    seq.num_computed += 1;
                }
                account(before, 1, true);
                self.items.push((slot, 1));
                budget -= 1;
                i += 1;
                continue;
            }
            let scheduled = loop {
                if self.allocate(slot, n, 0) {
                    break true;
                }
                // Preempt the most recently admitted request (possibly this one).
                let Some(victim) = self.running.pop() else {
                    break false;
                };
                self.preempt(victim);
                preempted = true;
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            account(before, n, decode);
            self.items.push((slot, n));
            budget -= n;
            i += 1;
        }

        // Waiting requests, FCFS, unless this step preempted.
        if !preempted {
            let bs = self.bs;
            while budget > 0 && self.running.len() < self.profile.max_num_seqs as usize {
                let Some(&slot) = self.waiting.front() else {
                    break;
                };
                let hits = self.find_hits(slot);
                let Some(Some(seq)) = self.seqs.get(slot as usize) else {
                    self.waiting.pop_front();
                    continue;
                };
                let computed = hits * bs;
                let total = seq.num_tokens();
                let mut n = total - computed;
                if !self.profile.enable_chunked_prefill && n > budget {
                    break;
                }
                n = n.min(budget);
                let first = seq.scheduled.is_none();
                if !self.allocate(slot, n, hits) {
                    break;
                }
                self.waiting.pop_front();
                self.running.push(slot);
                let now = self.now;
                let c = &mut self.metrics.counters;
                c.prefix_cache_queries += u64::from(total);
                c.prefix_cache_hits += u64::from(computed);
                if let Some(Some(seq)) = self.seqs.get_mut(slot as usize) {
                    seq.state = State::Running;
                    if first {
                        seq.scheduled = Some(now);
                        seq.cached_tokens = computed;
                        self.metrics.histograms.queue.observe(now - seq.ready);
                    }
                }
                account(computed, n, false);
                self.items.push((slot, n));
                budget -= n;
            }
        }
        (prefill_tokens, decode_seqs, pairs, decode_ctx)
    }

    /// Looks up the longest cached prefix of a waiting request (at most `num_tokens − 1`
    /// tokens, so that one is computed); leaves the blocks in `scratch_blocks`, returns their
    /// number.
    fn find_hits(&mut self, slot: u32) -> u32 {
        self.scratch_blocks.clear();
        let bs = self.bs as usize;
        let vocab = self.profile.vocab_size;
        let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
            return 0;
        };
        let max_blocks = (seq.num_tokens() as usize - 1) / bs;
        ensure_hashes(seq, max_blocks, bs, vocab, &mut self.scratch_tokens);
        let hashes = seq.hashes.get(..max_blocks).unwrap_or(&seq.hashes);
        let found = &mut self.scratch_blocks;
        self.pool.for_each_cached_prefix(hashes, |b| found.push(b));
        self.scratch_blocks.len() as u32
    }

    /// vLLM's `allocate_slots`: gives `slot` the blocks for `n` more tokens (after `hits`
    /// cached blocks in `scratch_blocks`, for a request being admitted), caches the blocks
    /// that become full, and advances `num_computed`. `false` (and no change) if the free
    /// blocks do not suffice.
    fn allocate(&mut self, slot: u32, n: u32, hits: u32) -> bool {
        let bs = self.bs;
        let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
            return false;
        };
        let computed = if hits > 0 {
            hits * bs
        } else {
            seq.num_computed
        };
        let total = computed + n;
        let have = if hits > 0 {
            hits as usize
        } else {
            seq.blocks.len()
        };
        let need = (total.div_ceil(bs) as usize).saturating_sub(have);
        let hit_blocks = if hits > 0 {
            self.scratch_blocks.as_slice()
        } else {
            &[]
        };
        let evictable_hits = hit_blocks
            .iter()
            .filter(|&&b| self.pool.ref_cnt(b) == 0)
            .count();
        if need + evictable_hits > self.pool.num_free() as usize {
            return false;
        }
        if hits > 0 {
            for &b in hit_blocks {
                self.pool.touch(b);
            }
            seq.blocks.clear();
            seq.blocks.extend_from_slice(hit_blocks);
            seq.num_cached_blocks = hits;
        }
        for _ in 0..need {
            match self.pool.alloc() {
                Some(b) => seq.blocks.push(b),
                None => return false, // unreachable: checked above
            }
        }
        seq.num_computed = total;
        self.cache_full_blocks(slot);
        true
    }

    /// Offers the request's newly full blocks to the prefix cache; emits `BlockStored` for the
    /// hashes that are new to it (one event per run of consecutive new blocks).
    fn cache_full_blocks(&mut self, slot: u32) {
        let bs = self.bs as usize;
        let vocab = self.profile.vocab_size;
        let emit = self.pool.emits();
        let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
            return;
        };
        let full = seq.num_computed as usize / bs;
        let from = seq.num_cached_blocks as usize;
        if full <= from {
            return;
        }
        ensure_hashes(seq, full, bs, vocab, &mut self.scratch_tokens);
        let mut run: Option<BlockStored> = None;
        for k in from..full {
            let (Some(&b), Some(&h)) = (seq.blocks.get(k), seq.hashes.get(k)) else {
                break;
            };
            let fresh = self.pool.cache(b, h);
            if !emit {
                continue;
            }
            if fresh {
                let ev = run.get_or_insert_with(|| {
                    // Sized for the rest of the blocks (a run rarely stops early): one
                    // allocation per list instead of a chain of reallocations.
                    let left = full - k;
                    BlockStored {
                        parent: if k == 0 {
                            None
                        } else {
                            seq.hashes.get(k - 1).copied()
                        },
                        block_hashes: BlockHashes::with_capacity(left),
                        token_ids: Vec::with_capacity(left * bs),
                        block_size: bs as u32,
                        medium: Some(Medium::Gpu),
                        extra_keys: Some(Vec::with_capacity(left)),
                        group_idx: Some(0),
                        kv_cache_spec_kind: Some("full_attention".into()),
                        ..BlockStored::default()
                    }
                });
                ev.block_hashes.push(h);
                for i in k * bs..(k + 1) * bs {
                    ev.token_ids
                        .push(token_at(&seq.prompt, seq.output_seed, vocab, i as u32));
                }
                if let Some(keys) = &mut ev.extra_keys {
                    keys.push(None);
                }
            } else if let Some(ev) = run.take() {
                self.pool.push_event(KvEvent::BlockStored(ev));
            }
        }
        if let Some(ev) = run.take() {
            self.pool.push_event(KvEvent::BlockStored(ev));
        }
        seq.num_cached_blocks = full as u32;
    }

    /// Frees a request's blocks, last block first (so its tail is evicted before its head).
    fn release_blocks(&mut self, slot: u32) {
        let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
            return;
        };
        for &b in seq.blocks.iter().rev() {
            self.pool.free(b);
        }
        seq.blocks.clear();
        seq.num_cached_blocks = 0;
    }

    /// Preemption by recomputation: the request loses its blocks and goes back to the front
    /// of the waiting queue, keeping its generated tokens.
    fn preempt(&mut self, slot: u32) {
        self.release_blocks(slot);
        if let Some(Some(seq)) = self.seqs.get_mut(slot as usize) {
            seq.num_computed = 0;
            seq.state = State::Waiting;
            seq.preemptions += 1;
        }
        self.metrics.counters.preemptions += 1;
        self.waiting.push_front(slot);
    }

    fn stats_of(seq: &Seq, finished: f64) -> RequestStats {
        RequestStats {
            arrival: seq.arrival,
            ready: seq.ready,
            scheduled: seq.scheduled,
            first_token: seq.first_token,
            finished,
            prompt_tokens: seq.prompt_len(),
            cached_tokens: seq.cached_tokens,
            output_tokens: seq.output_len,
            preemptions: seq.preemptions,
        }
    }

    /// Releases a request (already out of `running`/`waiting`) and reports it.
    fn finish_request(
        &mut self,
        slot: u32,
        reason: FinishReason,
        time: f64,
        out: &mut Vec<Output>,
    ) {
        self.release_blocks(slot);
        let Some(cell) = self.seqs.get_mut(slot as usize) else {
            return;
        };
        let Some(seq) = cell.take() else {
            return;
        };
        self.free_slots.push(slot);
        self.by_id.remove(&seq.id);
        let stats = Self::stats_of(&seq, time);
        let c = &mut self.metrics.counters;
        match reason {
            FinishReason::Length => c.requests_finished += 1,
            FinishReason::Abort => c.requests_aborted += 1,
        }
        if reason == FinishReason::Length {
            let h = &mut self.metrics.histograms;
            h.e2e.observe(stats.e2e());
            if let Some(ft) = seq.first_token {
                h.decode.observe(time - ft);
                if let Some(itl) = stats.mean_itl() {
                    h.tpot.observe(itl);
                }
            }
        }
        out.push(Output::Finished(Finished {
            id: seq.id,
            time,
            reason,
            stats,
        }));
    }

    fn finish_step(&mut self, out: &mut Vec<Output>) {
        let end = self.step_end;
        self.step_active = false;
        if self.pool.has_events() {
            out.push(Output::KvEvents(KvBatch {
                time: end,
                events: self.pool.take_events(),
            }));
        }
        let vocab = self.profile.vocab_size;
        let token_outputs = self.opts.token_outputs;
        let mut finished = std::mem::take(&mut self.finished_scratch);
        finished.clear();
        let items = std::mem::take(&mut self.items);
        // Decoding sequences that also produced a token at the previous step's end share one
        // inter-token interval: observe them together.
        let prev_end = self.step_start;
        let mut same_gap = 0u64;
        for &(slot, _) in &items {
            let Some(Some(seq)) = self.seqs.get_mut(slot as usize) else {
                continue;
            };
            if seq.aborted {
                finished.push(slot);
                continue;
            }
            if seq.num_computed < seq.num_tokens() {
                continue; // a prefill chunk
            }
            let index = seq.output_len;
            seq.output_len += 1;
            let c = &mut self.metrics.counters;
            c.generation_tokens += 1;
            if index == 0 {
                seq.first_token = Some(end);
                c.prompt_tokens += u64::from(seq.prompt_len());
                let h = &mut self.metrics.histograms;
                h.ttft.observe(end - seq.arrival);
                if let Some(s) = seq.scheduled {
                    h.prefill.observe(end - s);
                }
                out.push(Output::FirstToken {
                    id: seq.id,
                    time: end,
                    cached_tokens: seq.cached_tokens,
                    prompt_tokens: seq.prompt_len(),
                });
            } else if seq.last_token == prev_end {
                same_gap += 1;
            } else {
                self.metrics.histograms.itl.observe(end - seq.last_token);
            }
            seq.last_token = end;
            if token_outputs {
                out.push(Output::Token {
                    id: seq.id,
                    time: end,
                    index,
                    token: output_token(seq.output_seed, index, vocab),
                });
            }
            if seq.output_len >= seq.max_tokens {
                finished.push(slot);
            }
        }
        self.metrics
            .histograms
            .itl
            .observe_n(end - prev_end, same_gap);
        self.items = items;
        if !finished.is_empty() {
            self.running.retain(|s| !finished.contains(s));
            for &slot in &finished {
                let reason = match self.seqs.get(slot as usize) {
                    Some(Some(s)) if s.aborted => FinishReason::Abort,
                    _ => FinishReason::Length,
                };
                self.finish_request(slot, reason, end, out);
            }
        }
        self.finished_scratch = finished;
        self.items.clear();
    }
}
