//! The peer routers, each reimplemented from its published decision rule (NOTES.md §3) with
//! its default parameters, and each fed only what it would see in a real deployment:
//!
//! | router | sees |
//! |---|---|
//! | `random`, `round-robin` | nothing |
//! | `least-queue` | its own in-flight count per worker |
//! | `epp` | `/metrics` (waiting queue, KV usage) scraped every 50 ms; its own approximate prefix index of what it routed |
//! | `sglang-cache-aware` | its own in-flight counts; its own approximate prefix tree of what it routed |
//! | `dynamo` | KV events from every engine; its own active-sequence bookkeeping (first tokens, completions) |
//! | `aibrix` | its own in-flight counts; its own approximate prefix table of what it routed |
//!
//! Prefix matching: the real routers hash characters (EPP: 64-character chunks; SGLang: a
//! character radix tree) or tokens (AIBrix: 128-token blocks; Dynamo: the engine's blocks).
//! The simulation has token ids only; character chunks are modelled as 16-token blocks
//! (≈ 64 characters at ≈ 4 characters per token).

use std::collections::{HashMap, VecDeque};

use kinf_router::prefix_index::{EndpointId, PrefixIndex, block_hashes};
use kinf_sim::hash::Rng;
use kinf_sim::{Engine, Output};

use super::{SimRequest, SimRouter};

/// Requests routed and not yet finished, per worker: what a proxy in the data path knows.
#[derive(Debug, Clone, Default)]
pub struct InFlight {
    /// Per worker.
    pub count: Vec<u32>,
    owner: HashMap<u64, usize>,
}

impl InFlight {
    fn new(n: usize) -> Self {
        Self {
            count: vec![0; n],
            owner: HashMap::new(),
        }
    }

    fn add(&mut self, id: u64, w: usize) {
        if let Some(c) = self.count.get_mut(w) {
            *c += 1;
            self.owner.insert(id, w);
        }
    }

    /// Forgets `id` when it finished or was refused; returns its worker.
    fn done(&mut self, out: &Output) -> Option<(u64, usize)> {
        let id = match out {
            Output::Finished(f) => f.id,
            Output::Rejected(r) => r.id,
            _ => return None,
        };
        let w = self.owner.remove(&id)?;
        if let Some(c) = self.count.get_mut(w) {
            *c = c.saturating_sub(1);
        }
        Some((id, w))
    }
}

/// Index of the minimum of `key` over `0..n`; ties broken uniformly at random.
fn argmin_rand<K: PartialOrd + Copy>(n: usize, rng: &mut Rng, key: impl Fn(usize) -> K) -> usize {
    let mut best: Vec<usize> = Vec::new();
    let mut bk: Option<K> = None;
    for i in 0..n {
        let k = key(i);
        match bk {
            Some(b) if k > b => {}
            Some(b) if k == b => best.push(i),
            _ => {
                bk = Some(k);
                best.clear();
                best.push(i);
            }
        }
    }
    let j = rng.below(best.len().max(1) as u64) as usize;
    best.get(j).copied().unwrap_or(0)
}

/// `random`: a Kubernetes Service (kube-proxy picks a backend uniformly per connection; one
/// request per connection here).
pub struct Random {
    rng: Rng,
}

impl Random {
    /// Seeded.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: Rng::new(seed ^ 0x7261_6e64),
        }
    }
}

impl SimRouter for Random {
    fn route(&mut self, _now: f64, _req: &SimRequest, engines: &[Engine]) -> usize {
        self.rng.below(engines.len().max(1) as u64) as usize
    }
}

/// `round-robin`.
#[derive(Default)]
pub struct RoundRobin {
    next: usize,
}

impl SimRouter for RoundRobin {
    fn route(&mut self, _now: f64, _req: &SimRequest, engines: &[Engine]) -> usize {
        let i = self.next % engines.len().max(1);
        self.next = self.next.wrapping_add(1);
        i
    }
}

/// `least-queue`: fewest requests in flight through this router (ties at random), as the
/// `least_request` policy of Envoy or NGINX does.
pub struct LeastQueue {
    inflight: InFlight,
    rng: Rng,
}

impl LeastQueue {
    /// For `n` workers.
    pub fn new(n: usize, seed: u64) -> Self {
        Self {
            inflight: InFlight::new(n),
            rng: Rng::new(seed ^ 0x6c71),
        }
    }
}

impl SimRouter for LeastQueue {
    fn route(&mut self, _now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let c = &self.inflight.count;
        let w = argmin_rand(engines.len(), &mut self.rng, |i| {
            c.get(i).copied().unwrap_or(u32::MAX)
        });
        self.inflight.add(req.id, w);
        w
    }

    fn observe(&mut self, _now: f64, _engine: usize, out: &Output) {
        self.inflight.done(out);
    }
}

/// A per-worker LRU set of block hashes: the approximate prefix indexes of EPP and AIBrix
/// (what was routed where, not what the engine holds).
#[derive(Debug, Clone)]
struct LruBlocks {
    cap: usize,
    /// hash → last use stamp.
    map: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
    stamp: u64,
}

impl LruBlocks {
    fn new(cap: usize) -> Self {
        Self {
            cap,
            map: HashMap::new(),
            order: VecDeque::new(),
            stamp: 0,
        }
    }

    fn insert(&mut self, h: u64) {
        self.stamp += 1;
        self.map.insert(h, self.stamp);
        self.order.push_back((h, self.stamp));
        while self.map.len() > self.cap {
            let Some((old, s)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old) == Some(&s) {
                self.map.remove(&old);
            }
        }
        // Keep the queue from growing without bound on repeated inserts.
        if self.order.len() > 4 * self.cap.max(1024) {
            let map = &self.map;
            self.order.retain(|(h, s)| map.get(h) == Some(s));
        }
    }

    fn contains(&self, h: u64) -> bool {
        self.map.contains_key(&h)
    }

    /// Leading blocks of `hashes` present.
    fn prefix_len(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.contains(**h)).count()
    }
}

/// `epp`: the Gateway API Inference Extension endpoint picker (llm-d's default scheduling
/// profile). Score = 2·queue + 2·kv-cache + 3·prefix, highest wins (ties at random).
///
/// - queue scorer: `(maxQ − q) / (maxQ − minQ)` over candidates (1 when all equal), `q` =
///   `vllm:num_requests_waiting` (`pkg/epp/scheduling/framework/plugins/scorer/queue.go`);
/// - kv-cache scorer: `1 − vllm:kv_cache_usage_perc` (`…/scorer/kvcache_utilization.go`);
/// - prefix scorer: matched leading blocks / request blocks, over an approximate index of what
///   was routed where: 64-character blocks (modelled as 16 tokens), at most 256 blocks per
///   request, an LRU of 31,250 blocks per pod (`…/plugins/multi/prefix/plugin.go` defaults);
///   the picked pod learns the request's blocks after scheduling.
///
/// Metrics are scraped every 50 ms (the EPP's default `refreshMetricsInterval`).
/// Source: NOTES.md §3; upstream `kubernetes-sigs/gateway-api-inference-extension`.
pub struct Epp {
    waiting: Vec<f64>,
    kv: Vec<f64>,
    lru: Vec<LruBlocks>,
    rng: Rng,
}

/// EPP prefix-plugin block size, tokens (64 characters).
pub const EPP_BLOCK_TOKENS: usize = 16;
/// EPP prefix plugin: blocks considered per request.
pub const EPP_MAX_BLOCKS: usize = 256;
/// EPP prefix plugin: LRU capacity per pod, blocks.
pub const EPP_LRU_PER_POD: usize = 31_250;

impl Epp {
    /// For `n` workers.
    pub fn new(n: usize, seed: u64) -> Self {
        Self {
            waiting: vec![0.0; n],
            kv: vec![0.0; n],
            lru: (0..n).map(|_| LruBlocks::new(EPP_LRU_PER_POD)).collect(),
            rng: Rng::new(seed ^ 0x0065_7070),
        }
    }
}

impl SimRouter for Epp {
    fn scrape_interval(&self) -> Option<f64> {
        Some(0.05)
    }

    fn scrape(&mut self, _now: f64, engines: &[Engine]) {
        for (i, v) in engines.iter().enumerate() {
            let g = v.gauges();
            if let Some(w) = self.waiting.get_mut(i) {
                *w = g.waiting as f64;
            }
            if let Some(k) = self.kv.get_mut(i) {
                *k = g.kv_cache_usage;
            }
        }
    }

    fn route(&mut self, _now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let n = engines.len();
        let mut hashes = block_hashes(&req.prompt, EPP_BLOCK_TOKENS).to_vec();
        hashes.truncate(EPP_MAX_BLOCKS);
        let total = hashes.len().max(1) as f64;
        let maxq = self.waiting.iter().copied().fold(f64::MIN, f64::max);
        let minq = self.waiting.iter().copied().fold(f64::MAX, f64::min);
        let scores: Vec<f64> = (0..n)
            .map(|i| {
                let q = self.waiting.get(i).copied().unwrap_or(0.0);
                let queue = if maxq > minq {
                    (maxq - q) / (maxq - minq)
                } else {
                    1.0
                };
                let kv = 1.0 - self.kv.get(i).copied().unwrap_or(0.0);
                let prefix = self
                    .lru
                    .get(i)
                    .map_or(0.0, |l| l.prefix_len(&hashes) as f64 / total);
                2.0 * queue + 2.0 * kv + 3.0 * prefix
            })
            .collect();
        let w = argmin_rand(n, &mut self.rng, |i| {
            -scores.get(i).copied().unwrap_or(f64::MIN)
        });
        if let Some(l) = self.lru.get_mut(w) {
            for h in &hashes {
                l.insert(*h);
            }
        }
        w
    }
}

/// `sglang-cache-aware`: SGLang's (and vllm-router's) `cache_aware` policy with the CLI
/// defaults `cache_threshold` 0.3, `balance_abs_threshold` 64, `balance_rel_threshold` 1.5.
///
/// Load = requests in flight through the router. If `max − min > 64` and `max > 1.5 · min`,
/// route to the least loaded worker. Otherwise find the worker whose approximate tree (what
/// the router sent it) matches the longest prefix; if `matched / prompt > 0.3` route there,
/// else to the worker with the smallest tree (most cache room). The tree learns the request
/// when it is routed; its size is capped (`max_tree_size` 2^26 characters ≈ 2^24 tokens,
/// LRU eviction). Sources: NOTES.md §3; `sgl-project/sglang` `sgl-router/src/policies/
/// cache_aware.rs` (and its fork in `vllm-project/router`).
pub struct SglangCacheAware {
    inflight: InFlight,
    trees: Vec<LruBlocks>,
    rng: Rng,
}

/// Block used to model SGLang's character radix tree, tokens.
pub const SGLANG_BLOCK_TOKENS: usize = 16;

impl SglangCacheAware {
    /// For `n` workers.
    pub fn new(n: usize, seed: u64) -> Self {
        Self {
            inflight: InFlight::new(n),
            trees: (0..n)
                .map(|_| LruBlocks::new((1 << 24) / SGLANG_BLOCK_TOKENS))
                .collect(),
            rng: Rng::new(seed ^ 0x0073_676c),
        }
    }
}

impl SimRouter for SglangCacheAware {
    fn route(&mut self, _now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let n = engines.len();
        let load = &self.inflight.count;
        let max = load.iter().copied().max().unwrap_or(0);
        let min = load.iter().copied().min().unwrap_or(0);
        let hashes = block_hashes(&req.prompt, SGLANG_BLOCK_TOKENS);
        let imbalanced = max.saturating_sub(min) > 64 && f64::from(max) > 1.5 * f64::from(min);
        let w = if imbalanced {
            argmin_rand(n, &mut self.rng, |i| {
                load.get(i).copied().unwrap_or(u32::MAX)
            })
        } else {
            let matched: Vec<usize> = (0..n)
                .map(|i| self.trees.get(i).map_or(0, |t| t.prefix_len(&hashes)))
                .collect();
            let best = argmin_rand(n, &mut self.rng, |i| {
                std::cmp::Reverse(matched.get(i).copied().unwrap_or(0))
            });
            let rate = (matched.get(best).copied().unwrap_or(0) * SGLANG_BLOCK_TOKENS) as f64
                / req.prompt.len().max(1) as f64;
            if rate > 0.3 {
                best
            } else {
                let trees = &self.trees;
                argmin_rand(n, &mut self.rng, |i| {
                    trees.get(i).map_or(0, |t| t.map.len())
                })
            }
        };
        if let Some(t) = self.trees.get_mut(w) {
            for h in hashes.iter() {
                t.insert(*h);
            }
        }
        self.inflight.add(req.id, w);
        w
    }

    fn observe(&mut self, _now: f64, _engine: usize, out: &Output) {
        self.inflight.done(out);
    }
}

/// One active sequence in Dynamo's bookkeeping.
struct ActiveSeq {
    worker: usize,
    hashes: Vec<u64>,
    prefill_blocks: u64,
    prefilling: bool,
}

/// `dynamo`: NVIDIA Dynamo's KV router with its defaults (`--kv-overlap-score-weight` 1,
/// `--router-temperature` 0: the lowest cost wins, ties at random).
///
/// For each worker, `cost = overlap_weight · prefill_blocks + decode_blocks` where
/// `prefill_blocks` = blocks still to prefill of the worker's active sequences (until their
/// first token) + the request's blocks not cached there (`max(blocks − overlap, 0)`), and
/// `decode_blocks` = distinct blocks of the worker's active sequences including the request's.
/// `overlap` comes from a radix index fed by the engines' KV events (the same events
/// Kinference gets). Sources: NOTES.md §3; `ai-dynamo/dynamo` `lib/llm/src/kv_router/
/// scheduler.rs` (`DefaultWorkerSelector`) and `sequence.rs` (`ActiveSequences`), docs
/// `docs/router/kv_cache_routing.md`.
pub struct Dynamo {
    index: PrefixIndex,
    block: usize,
    active: HashMap<u64, ActiveSeq>,
    /// Per worker: distinct active block hashes with reference counts.
    blocks: Vec<HashMap<u64, u32>>,
    prefill: Vec<u64>,
    rng: Rng,
}

impl Dynamo {
    /// For `n` workers with the engines' block size.
    pub fn new(n: usize, block: usize, seed: u64) -> Self {
        Self {
            index: PrefixIndex::new(block),
            block,
            active: HashMap::new(),
            blocks: vec![HashMap::new(); n],
            prefill: vec![0; n],
            rng: Rng::new(seed ^ 0x0064_796e),
        }
    }

    fn finish_prefill(&mut self, id: u64) {
        if let Some(s) = self.active.get_mut(&id)
            && s.prefilling
        {
            s.prefilling = false;
            if let Some(p) = self.prefill.get_mut(s.worker) {
                *p = p.saturating_sub(s.prefill_blocks);
            }
        }
    }
}

impl SimRouter for Dynamo {
    fn route(&mut self, _now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let n = engines.len();
        let hashes = block_hashes(&req.prompt, self.block).to_vec();
        let mut found = Vec::new();
        self.index.match_prefix(&hashes, &mut found);
        let mut overlap = vec![0u64; n];
        for (id, b) in found {
            if let Some(o) = overlap.get_mut(id.0 as usize) {
                *o = u64::from(b);
            }
        }
        let nb = hashes.len() as u64;
        let costs: Vec<f64> = (0..n)
            .map(|i| {
                let new_prefill = nb.saturating_sub(overlap.get(i).copied().unwrap_or(0));
                let prefill = self.prefill.get(i).copied().unwrap_or(0) + new_prefill;
                let active = self.blocks.get(i);
                let decode = active.map_or(0, |m| m.len() as u64)
                    + hashes
                        .iter()
                        .filter(|h| active.is_none_or(|m| !m.contains_key(h)))
                        .count() as u64;
                1.0 * prefill as f64 + decode as f64
            })
            .collect();
        let w = argmin_rand(n, &mut self.rng, |i| {
            costs.get(i).copied().unwrap_or(f64::MAX)
        });
        let prefill_blocks = nb.saturating_sub(overlap.get(w).copied().unwrap_or(0));
        if let Some(m) = self.blocks.get_mut(w) {
            for h in &hashes {
                *m.entry(*h).or_insert(0) += 1;
            }
        }
        if let Some(p) = self.prefill.get_mut(w) {
            *p += prefill_blocks;
        }
        self.active.insert(
            req.id,
            ActiveSeq {
                worker: w,
                hashes,
                prefill_blocks,
                prefilling: true,
            },
        );
        w
    }

    fn observe(&mut self, _now: f64, engine: usize, out: &Output) {
        match out {
            Output::KvEvents(b) => self.index.apply_all(EndpointId(engine as u32), &b.events),
            Output::FirstToken { id, .. } => self.finish_prefill(*id),
            Output::Finished(_) | Output::Rejected(_) => {
                let id = match out {
                    Output::Finished(f) => f.id,
                    Output::Rejected(r) => r.id,
                    _ => return,
                };
                self.finish_prefill(id);
                if let Some(s) = self.active.remove(&id)
                    && let Some(m) = self.blocks.get_mut(s.worker)
                {
                    for h in &s.hashes {
                        if let Some(c) = m.get_mut(h) {
                            *c -= 1;
                            if *c == 0 {
                                m.remove(h);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

/// `aibrix`: AIBrix's `prefix-cache` routing algorithm.
///
/// Load = running requests per pod (the gateway's own counts). If `max − min > 16`
/// (`AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT`, per NOTES.md §3), pick the
/// least loaded pod. Otherwise match the request's 128-token blocks
/// (`AIBRIX_PREFIX_CACHE_BLOCK_SIZE`) against a table of what was routed where, and among pods
/// with a match and `running ≤ mean + 2σ` (`…_STANDARD_DEVIATION_FACTOR`) take the highest match
/// percentage (then fewest running); with no such pod, the least loaded. The picked pod learns
/// the request's blocks. Sources: NOTES.md §3; `vllm-project/aibrix`
/// `pkg/plugins/gateway/algorithms/prefix_cache.go` and its README.
pub struct Aibrix {
    inflight: InFlight,
    table: Vec<LruBlocks>,
    rng: Rng,
}

/// AIBrix prefix-cache block size, tokens.
pub const AIBRIX_BLOCK_TOKENS: usize = 128;

impl Aibrix {
    /// For `n` workers.
    pub fn new(n: usize, seed: u64) -> Self {
        Self {
            inflight: InFlight::new(n),
            table: (0..n).map(|_| LruBlocks::new(1 << 20)).collect(),
            rng: Rng::new(seed ^ 0x0061_6962),
        }
    }
}

impl SimRouter for Aibrix {
    fn route(&mut self, _now: f64, req: &SimRequest, engines: &[Engine]) -> usize {
        let n = engines.len();
        let load = &self.inflight.count;
        let max = load.iter().copied().max().unwrap_or(0);
        let min = load.iter().copied().min().unwrap_or(0);
        let hashes = block_hashes(&req.prompt, AIBRIX_BLOCK_TOKENS);
        let least =
            |rng: &mut Rng| argmin_rand(n, rng, |i| load.get(i).copied().unwrap_or(u32::MAX));
        let w = if max - min > 16 {
            least(&mut self.rng)
        } else {
            let mean = load.iter().map(|&c| f64::from(c)).sum::<f64>() / n.max(1) as f64;
            let var = load
                .iter()
                .map(|&c| (f64::from(c) - mean).powi(2))
                .sum::<f64>()
                / n.max(1) as f64;
            let limit = mean + 2.0 * var.sqrt();
            let mut best: Option<(usize, usize, u32)> = None; // (worker, matched, running)
            for i in 0..n {
                let m = self.table.get(i).map_or(0, |t| t.prefix_len(&hashes));
                let r = load.get(i).copied().unwrap_or(0);
                if m == 0 || f64::from(r) > limit {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some((_, bm, br)) => m > bm || (m == bm && r < br),
                };
                if better {
                    best = Some((i, m, r));
                }
            }
            match best {
                Some((i, _, _)) => i,
                None => least(&mut self.rng),
            }
        };
        if let Some(t) = self.table.get_mut(w) {
            for h in hashes.iter() {
                t.insert(*h);
            }
        }
        self.inflight.add(req.id, w);
        w
    }

    fn observe(&mut self, _now: f64, _engine: usize, out: &Output) {
        self.inflight.done(out);
    }
}
