//! The prefix indexes against simple reference models: the real vLLM 0.32.0 event streams of
//! `testdata/vllm-0.32.0-cpu/`, and random operation sequences.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;

use kinf_router::kv_events::{
    BlockRemoved, BlockStored, EventBatch, KvEvent, Medium, decode_message,
};
use kinf_router::prefix_index::{
    ApproxIndex, EndpointId, PrefixIndex, ROOT_HASH, block_hashes, chain_hash, chain_root,
    chain_root_lora_id,
};
use proptest::prelude::*;
use serde_json::Value as Json;

// --- reference model ---------------------------------------------------------------------------

#[derive(Default, Clone)]
struct RefEndpoint {
    engine: HashMap<u64, u64>,
    held: HashSet<u64>,
}

/// The obvious model: per endpoint, engine hash → own hash and the set of own hashes held.
#[derive(Default)]
struct Model {
    block_size: usize,
    eps: BTreeMap<EndpointId, RefEndpoint>,
    orphaned: u64,
    /// Every block ever stored: own hash → (parent own hash, tokens), to rebuild prompts.
    registry: HashMap<u64, (u64, Vec<u32>)>,
}

impl Model {
    fn new(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }

    fn accepts(medium: Option<&Medium>, group: Option<u32>) -> bool {
        matches!(medium, None | Some(Medium::Gpu)) && matches!(group, None | Some(0))
    }

    fn apply(&mut self, ep: EndpointId, ev: &KvEvent) {
        match ev {
            KvEvent::BlockStored(s) => {
                if !Self::accepts(s.medium.as_ref(), s.group_idx) {
                    return;
                }
                let n = s.block_hashes.len();
                if s.block_size as usize != self.block_size
                    || s.token_ids.len() != n * self.block_size
                {
                    return;
                }
                let e = self.eps.entry(ep).or_default();
                let mut parent = match s.parent {
                    None => match (&s.lora_name, s.lora_id) {
                        (Some(name), _) => chain_root(Some(name)),
                        (None, Some(id)) => chain_root_lora_id(id),
                        (None, None) => ROOT_HASH,
                    },
                    Some(p) => match e.engine.get(&p) {
                        Some(&o) => o,
                        None => {
                            self.orphaned += n as u64;
                            return;
                        }
                    },
                };
                for (&eh, toks) in s
                    .block_hashes
                    .iter()
                    .zip(s.token_ids.chunks(self.block_size))
                {
                    let own = chain_hash(parent, toks);
                    self.registry.insert(own, (parent, toks.to_vec()));
                    if let Some(old) = e.engine.insert(eh, own)
                        && old != own
                    {
                        e.held.remove(&old);
                    }
                    e.held.insert(own);
                    parent = own;
                }
            }
            KvEvent::BlockRemoved(r) => {
                if !Self::accepts(r.medium.as_ref(), r.group_idx) {
                    return;
                }
                if let Some(e) = self.eps.get_mut(&ep) {
                    for h in &r.block_hashes {
                        if let Some(o) = e.engine.remove(h) {
                            e.held.remove(&o);
                        }
                    }
                }
            }
            KvEvent::AllBlocksCleared => {
                if let Some(e) = self.eps.get_mut(&ep) {
                    *e = RefEndpoint::default();
                }
            }
            KvEvent::Unknown(_) => {}
        }
    }

    fn remove_endpoint(&mut self, ep: EndpointId) {
        self.eps.remove(&ep);
    }

    fn match_prefix(&self, req: &[u64]) -> Vec<(EndpointId, u32)> {
        self.eps
            .iter()
            .filter_map(|(&ep, e)| {
                let n = req.iter().take_while(|h| e.held.contains(h)).count();
                (n > 0).then_some((ep, n as u32))
            })
            .collect()
    }

    /// The token sequence ending with block `own`, rebuilt through the parents.
    fn prompt_of(&self, own: u64) -> Option<Vec<u32>> {
        let mut blocks = Vec::new();
        let mut h = own;
        while h != ROOT_HASH {
            let (parent, toks) = self.registry.get(&h)?;
            blocks.push(toks.clone());
            h = *parent;
        }
        blocks.reverse();
        Some(blocks.concat())
    }
}

fn sorted(mut v: Vec<(EndpointId, u32)>) -> Vec<(EndpointId, u32)> {
    v.sort_unstable();
    v
}

/// Index and model agree on every endpoint's blocks and on the counters.
fn check_state(ix: &PrefixIndex, m: &Model) {
    let mut pairs = 0;
    for (&ep, e) in &m.eps {
        assert_eq!(ix.endpoint_blocks(ep), e.held.len(), "{ep:?} block count");
        for &h in &e.held {
            assert!(ix.contains(ep, h), "{ep:?} lacks {h:#x}");
        }
        pairs += e.held.len();
    }
    let st = ix.stats();
    assert_eq!(st.pairs, pairs, "pairs");
    let distinct: HashSet<u64> = m
        .eps
        .values()
        .flat_map(|e| e.held.iter().copied())
        .collect();
    assert_eq!(st.blocks, distinct.len(), "blocks");
    assert_eq!(st.orphaned, m.orphaned, "orphaned");
}

fn check_match(ix: &PrefixIndex, m: &Model, req: &[u64], out: &mut Vec<(EndpointId, u32)>) {
    ix.match_prefix(req, out);
    assert_eq!(sorted(out.clone()), m.match_prefix(req), "match_prefix");
}

// --- real vLLM streams ---------------------------------------------------------------------------

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../testdata/vllm-0.32.0-cpu")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(data(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn frames_file(rel: &str) -> Vec<EventBatch> {
    let mut msgs: Vec<Vec<Vec<u8>>> = Vec::new();
    for line in read(rel).lines() {
        if line.starts_with('#') || line.starts_with("nframes") {
            msgs.push(Vec::new());
        } else if let Some(rest) = line.strip_prefix("frame[") {
            let hex = rest.split_once("] ").map_or("", |(_, h)| h).trim();
            msgs.last_mut().unwrap().push(unhex(hex));
        }
    }
    msgs.iter()
        .map(|f| decode_message(&f.iter().map(Vec::as_slice).collect::<Vec<_>>()).unwrap())
        .collect()
}

fn jsonl(rel: &str) -> Vec<EventBatch> {
    read(rel)
        .lines()
        .map(|l| {
            let j: Json = serde_json::from_str(l).unwrap();
            let frames = [
                j["topic"].as_str().unwrap().as_bytes().to_vec(),
                unhex(j["seq_hex"].as_str().unwrap()),
                unhex(j["payload_hex"].as_str().unwrap()),
            ];
            decode_message(&frames.iter().map(Vec::as_slice).collect::<Vec<_>>()).unwrap()
        })
        .collect()
}

#[test]
fn real_streams_match_the_reference_after_every_batch() {
    let streams: Vec<(EndpointId, Vec<EventBatch>)> = vec![
        (EndpointId(10), frames_file("kv_events_raw_frames.txt")),
        (EndpointId(11), jsonl("kv_frames_run1.jsonl")),
        (EndpointId(12), jsonl("kv_frames_run2_evictions.jsonl")),
        (
            EndpointId(13),
            frames_file("run2-small-cache/kv_events_raw_frames.txt"),
        ),
        (
            EndpointId(14),
            jsonl("kv_frames_run3_guidellm_prefix.jsonl"),
        ),
    ];
    // Interleave the endpoints' batches in timestamp order, as a server would receive them.
    let mut all: Vec<(f64, EndpointId, &EventBatch)> = streams
        .iter()
        .flat_map(|(ep, bs)| bs.iter().map(move |b| (b.ts, *ep, b)))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut ix = PrefixIndex::new(32);
    let mut m = Model::new(32);
    let mut out = Vec::new();
    let mut matched_somewhere = 0;
    let mut saw_removal_effect = false;
    for (_, ep, b) in &all {
        for e in &b.events {
            let before = ix.stats().pairs;
            ix.apply(*ep, e);
            m.apply(*ep, e);
            if let KvEvent::BlockRemoved(r) = e {
                // Every eviction in the captures names blocks the endpoint holds.
                assert_eq!(before - ix.stats().pairs, r.block_hashes.len());
                saw_removal_effect = true;
            }
        }
        check_state(&ix, &m);
        // Every prompt ever stored (and a partial extra block) matches like the model says.
        let owns: Vec<u64> = m.registry.keys().copied().collect();
        for own in owns {
            let mut toks = m.prompt_of(own).unwrap();
            toks.extend([1, 2, 3]);
            let req = block_hashes(&toks, 32);
            check_match(&ix, &m, &req, &mut out);
            matched_somewhere += usize::from(!out.is_empty());
        }
    }
    let st = ix.stats();
    assert_eq!(
        st.orphaned, 0,
        "real streams are complete: every parent is known"
    );
    assert_eq!(st.unknown_removals, 0, "vLLM only removes blocks it stored");
    assert_eq!(st.rejected, 0);
    assert!(saw_removal_effect, "run2 has evictions");
    assert!(matched_somewhere > 100);
    // run2 ends with AllBlocksCleared: endpoint 12 holds nothing.
    assert_eq!(ix.endpoint_blocks(EndpointId(12)), 0);
    // GuideLLM's shared prefix: the first block of run3's prompts is held by endpoint 14 and
    // later prompts chained onto it.
    assert!(ix.endpoint_blocks(EndpointId(14)) > 16);
}

#[test]
fn a_gap_orphans_the_continuation_until_the_prefix_is_stored_again() {
    let batches = jsonl("kv_frames_run3_guidellm_prefix.jsonl");
    let mut ix = PrefixIndex::new(32);
    let ep = EndpointId(1);
    // Drop batch 0 (a gap): batch 1 chains onto a parent stored in batch 0.
    let KvEvent::BlockStored(first_child) = &batches[1].events[0] else {
        panic!()
    };
    assert!(first_child.parent.is_some());
    ix.apply_all(ep, &batches[1].events);
    assert_eq!(ix.stats().orphaned, first_child.block_hashes.len() as u64);
    assert_eq!(ix.endpoint_blocks(ep), 0);
}

// --- random operations -----------------------------------------------------------------------

const BS: usize = 4;
const BLOCKS: usize = 8;
const EPS: u32 = 5;

#[derive(Debug, Clone)]
enum Op {
    Store {
        ep: u32,
        prompt: usize,
        start: usize,
        len: usize,
        bad_parent: Option<u64>,
        variant: u8,
    },
    Remove {
        ep: u32,
        prompt: usize,
        mask: u8,
    },
    RemoveRandom {
        ep: u32,
        hash: u64,
    },
    Clear {
        ep: u32,
    },
    RemoveEndpoint {
        ep: u32,
    },
    Unknown {
        ep: u32,
    },
    /// The worker set's endpoint list changed: endpoint `l` gets index id `perm[l]`, and those
    /// with bit `l` of `drop` set were removed (a new endpoint takes the id).
    Remap {
        perm: Vec<u32>,
        drop: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..EPS, 0..4usize, 0..BLOCKS, 1..=BLOCKS, prop::option::weighted(0.1, any::<u64>()), 0u8..20)
            .prop_map(|(ep, prompt, start, len, bad_parent, variant)| Op::Store {
                ep, prompt, start, len, bad_parent, variant
            }),
        4 => (0..EPS, 0..4usize, any::<u8>()).prop_map(|(ep, prompt, mask)| Op::Remove { ep, prompt, mask }),
        1 => (0..EPS, any::<u64>()).prop_map(|(ep, hash)| Op::RemoveRandom { ep, hash }),
        1 => (0..EPS).prop_map(|ep| Op::Clear { ep }),
        1 => (0..EPS).prop_map(|ep| Op::RemoveEndpoint { ep }),
        1 => (0..EPS).prop_map(|ep| Op::Unknown { ep }),
        1 => (Just((0..EPS).collect::<Vec<u32>>()).prop_shuffle(), any::<u8>())
            .prop_map(|(perm, drop)| Op::Remap { perm, drop }),
    ]
}

/// Four prompts of `BLOCKS` blocks over a tiny alphabet; prompt k shares `shares[k]` leading
/// blocks with prompt 0.
fn prompts() -> impl Strategy<Value = Vec<Vec<u32>>> {
    (
        prop::collection::vec(prop::collection::vec(0u32..3, BS * BLOCKS), 4),
        prop::collection::vec(0..=BLOCKS, 4),
    )
        .prop_map(|(mut ps, shares)| {
            let base = ps[0].clone();
            for (p, share) in ps.iter_mut().zip(shares).skip(1) {
                p[..share * BS].copy_from_slice(&base[..share * BS]);
            }
            ps
        })
}

/// vLLM-like engine hash: a function of the block's content chain, salted per endpoint (even
/// endpoints share a salt, as vLLM ≥ 0.32 engines with the same hash seed do).
fn engine_hash(ep: u32, own: u64) -> u64 {
    let salt = if ep.is_multiple_of(2) {
        0
    } else {
        u64::from(ep)
    };
    (own ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)).rotate_left(17)
}

fn run_ops(prompts: &[Vec<u32>], ops: &[Op]) {
    let mut ix = PrefixIndex::new(BS);
    let mut m = Model::new(BS);
    let own: Vec<Vec<u64>> = prompts
        .iter()
        .map(|p| block_hashes(p, BS).to_vec())
        .collect();
    // Requests: every prefix of every prompt, plus each prompt with one corrupted block.
    let mut requests: Vec<Vec<u64>> = Vec::new();
    for (pi, p) in prompts.iter().enumerate() {
        for n in 0..=BLOCKS {
            requests.push(own[pi][..n].to_vec());
        }
        let mut q = p.clone();
        q[BS * 3] = 99;
        requests.push(block_hashes(&q, BS).to_vec());
    }
    let mut out = Vec::new();
    // Index id of each endpoint (engine hashes stay a function of the endpoint itself).
    let mut ids: Vec<u32> = (0..EPS).collect();
    for op in ops {
        let (ep, ev) = match *op {
            Op::Store {
                ep,
                prompt,
                start,
                len,
                bad_parent,
                variant,
            } => {
                let end = (start + len).min(BLOCKS);
                let parent = match (start, bad_parent) {
                    (_, Some(h)) => Some(h),
                    (0, None) => None,
                    (s, None) => Some(engine_hash(ep, own[prompt][s - 1])),
                };
                let mut s = BlockStored {
                    block_hashes: own[prompt][start..end]
                        .iter()
                        .map(|&o| engine_hash(ep, o))
                        .collect(),
                    parent,
                    token_ids: prompts[prompt][start * BS..end * BS].to_vec(),
                    block_size: BS as u32,
                    medium: Some(Medium::Gpu),
                    group_idx: Some(0),
                    ..Default::default()
                };
                match variant {
                    0 => s.medium = Some(Medium::Cpu),
                    1 => s.group_idx = Some(1),
                    2 => s.block_size = 8,
                    3 => {
                        s.token_ids.pop();
                    }
                    4 => s.lora_name = Some("adapter".into()),
                    _ => {}
                }
                (ep, KvEvent::BlockStored(s))
            }
            Op::Remove { ep, prompt, mask } => {
                let hashes = (0..BLOCKS)
                    .filter(|b| mask & (1 << b) != 0)
                    .map(|b| engine_hash(ep, own[prompt][b]))
                    .collect();
                (
                    ep,
                    KvEvent::BlockRemoved(BlockRemoved {
                        block_hashes: hashes,
                        medium: Some(Medium::Gpu),
                        group_idx: Some(0),
                    }),
                )
            }
            Op::RemoveRandom { ep, hash } => (
                ep,
                KvEvent::BlockRemoved(BlockRemoved {
                    block_hashes: [hash].into_iter().collect(),
                    medium: None,
                    group_idx: None,
                }),
            ),
            Op::Clear { ep } => (ep, KvEvent::AllBlocksCleared),
            Op::RemoveEndpoint { ep } => {
                ix.remove_endpoint(EndpointId(ids[ep as usize]));
                m.remove_endpoint(EndpointId(ids[ep as usize]));
                check_state(&ix, &m);
                continue;
            }
            Op::Unknown { ep } => (ep, KvEvent::Unknown("Future".into())),
            Op::Remap { ref perm, drop } => {
                let kept = |l: usize| drop & (1 << l) == 0;
                let to: HashMap<u32, u32> = (0..EPS as usize)
                    .filter(|&l| kept(l))
                    .map(|l| (ids[l], perm[l]))
                    .collect();
                ix.remap_endpoints(|id| to.get(&id.0).map(|&n| EndpointId(n)));
                let old = std::mem::take(&mut m.eps);
                for (id, e) in old {
                    if let Some(&n) = to.get(&id.0) {
                        m.eps.insert(EndpointId(n), e);
                    }
                }
                ids.clone_from(perm);
                check_state(&ix, &m);
                for r in &requests {
                    check_match(&ix, &m, r, &mut out);
                }
                continue;
            }
        };
        let id = EndpointId(ids[ep as usize]);
        ix.apply(id, &ev);
        m.apply(id, &ev);
        check_state(&ix, &m);
        for r in &requests {
            check_match(&ix, &m, r, &mut out);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn exact_index_equals_reference(ps in prompts(), ops in prop::collection::vec(op(), 1..60)) {
        run_ops(&ps, &ops);
    }

    #[test]
    fn match_prefix_never_panics_on_arbitrary_requests(
        ps in prompts(),
        ops in prop::collection::vec(op(), 0..20),
        req in prop::collection::vec(any::<u64>(), 0..20),
    ) {
        run_ops(&ps, &ops);
        let mut ix = PrefixIndex::new(BS);
        let mut out = Vec::new();
        ix.match_prefix(&req, &mut out);
        prop_assert!(out.is_empty());
        ix.apply(EndpointId(0), &KvEvent::BlockStored(BlockStored {
            block_hashes: [1].into_iter().collect(),
            token_ids: ps[0][..BS].to_vec(),
            block_size: BS as u32,
            ..Default::default()
        }));
        ix.match_prefix(&req, &mut out);
    }
}

/// Many endpoints (so holder sets become lists and bitsets), random subsets of one long prompt.
#[test]
fn wide_fleets_match_the_reference() {
    let prompt: Vec<u32> = (0..BS as u32 * 64).collect();
    let own = block_hashes(&prompt, BS);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(32));
    runner
        .run(
            &(
                prop::collection::vec((0u32..700, 1usize..64), 1..400),
                prop::collection::vec((0u32..700, 0usize..64), 0..100),
            ),
            |(stores, removes)| {
                let mut ix = PrefixIndex::new(BS);
                let mut m = Model::new(BS);
                for &(ep, n) in &stores {
                    let ev = KvEvent::BlockStored(BlockStored {
                        block_hashes: own[..n].iter().map(|&o| engine_hash(ep, o)).collect(),
                        token_ids: prompt[..n * BS].to_vec(),
                        block_size: BS as u32,
                        ..Default::default()
                    });
                    ix.apply(EndpointId(ep), &ev);
                    m.apply(EndpointId(ep), &ev);
                }
                for &(ep, b) in &removes {
                    let ev = KvEvent::BlockRemoved(BlockRemoved {
                        block_hashes: [engine_hash(ep, own[b])].into_iter().collect(),
                        ..Default::default()
                    });
                    ix.apply(EndpointId(ep), &ev);
                    m.apply(EndpointId(ep), &ev);
                }
                check_state(&ix, &m);
                let mut out = Vec::new();
                for n in [1, 2, 17, 63, 64] {
                    check_match(&ix, &m, &own[..n], &mut out);
                }
                for ep in (0..700).step_by(3) {
                    ix.remove_endpoint(EndpointId(ep));
                    m.remove_endpoint(EndpointId(ep));
                }
                check_state(&ix, &m);
                check_match(&ix, &m, &own, &mut out);
                Ok(())
            },
        )
        .unwrap();
}

// --- approximate index -------------------------------------------------------------------------

/// Reference for [`ApproxIndex`]: per endpoint, block → (tick, time); evict the smallest tick
/// beyond capacity, drop entries older than the maximum age.
struct ApproxModel {
    cap: usize,
    max_age: u64,
    tick: u64,
    eps: BTreeMap<EndpointId, HashMap<u64, (u64, u64)>>,
}

impl ApproxModel {
    fn trim(&mut self, ep: EndpointId, now: u64) {
        let (cap, max_age) = (self.cap, self.max_age);
        if let Some(e) = self.eps.get_mut(&ep) {
            e.retain(|_, &mut (_, at)| now.saturating_sub(at) <= max_age);
            while e.len() > cap {
                let (&h, _) = e.iter().min_by_key(|(_, (t, _))| *t).unwrap();
                e.remove(&h);
            }
        }
    }

    /// `record` (`refresh`) or `claim`: a claim leaves a held, fresh block as it is.
    fn touch(&mut self, ep: EndpointId, req: &[u64], now: u64, refresh: bool) {
        let e = self.eps.entry(ep).or_default();
        for &h in req.iter().rev() {
            let fresh = e
                .get(&h)
                .is_some_and(|&(_, at)| now.saturating_sub(at) <= self.max_age);
            if !refresh && fresh {
                continue;
            }
            self.tick += 1;
            e.insert(h, (self.tick, now));
        }
        self.trim(ep, now);
    }

    fn release(&mut self, ep: EndpointId, h: u64) {
        if let Some(e) = self.eps.get_mut(&ep) {
            e.remove(&h);
        }
    }

    fn match_prefix(&self, req: &[u64], now: u64) -> Vec<(EndpointId, u32)> {
        self.eps
            .iter()
            .filter_map(|(&ep, e)| {
                let n = req
                    .iter()
                    .take_while(|h| {
                        e.get(h)
                            .is_some_and(|&(_, at)| now.saturating_sub(at) <= self.max_age)
                    })
                    .count();
                (n > 0).then_some((ep, n as u32))
            })
            .collect()
    }
}

#[derive(Debug, Clone)]
enum ApproxOp {
    Record {
        ep: u32,
        prompt: usize,
        len: usize,
    },
    Claim {
        ep: u32,
        prompt: usize,
        len: usize,
    },
    Release {
        ep: u32,
        prompt: usize,
        block: usize,
    },
    Advance {
        ms: u64,
    },
    Expire,
    Clear {
        ep: u32,
    },
    Remove {
        ep: u32,
    },
}

/// Operations on `eps` endpoints; time advances by up to `step` ms at a time; clearing and
/// removing endpoints weigh `resets` against 190 for the other operations.
fn approx_op(eps: u32, step: u64, resets: u32) -> impl Strategy<Value = ApproxOp> {
    prop_oneof![
        60 => (0..eps, 0..4usize, 1..=BLOCKS).prop_map(|(ep, prompt, len)| ApproxOp::Record { ep, prompt, len }),
        40 => (0..eps, 0..4usize, 1..=BLOCKS).prop_map(|(ep, prompt, len)| ApproxOp::Claim { ep, prompt, len }),
        40 => (0..eps, 0..4usize, 0..BLOCKS).prop_map(|(ep, prompt, block)| ApproxOp::Release { ep, prompt, block }),
        30 => (0..step).prop_map(|ms| ApproxOp::Advance { ms }),
        10 => Just(ApproxOp::Expire),
        resets => (0..eps).prop_map(|ep| ApproxOp::Clear { ep }),
        resets => (0..eps).prop_map(|ep| ApproxOp::Remove { ep }),
    ]
}

/// Runs `ops` on an [`ApproxIndex`], the model and the implementation before the `BlockMap`
/// rewrite ([`old_approx`]): after every operation, the model's matches (as sets) and the old
/// implementation's (in the same order), its `extend_matches` results and its counters.
/// Endpoints `0..pins` first record a block of their own that no operation touches: while it
/// stays (no eviction, expiry or reset), dead queue entries pile up behind it.
fn run_approx_ops(
    ps: &[Vec<u32>],
    cap: usize,
    ops: &[ApproxOp],
    pins: u32,
) -> Result<(), TestCaseError> {
    let max_age = 1_000;
    let mut ix = ApproxIndex::new(cap, max_age);
    let mut old = old_approx::ApproxIndex::new(cap, max_age);
    let mut m = ApproxModel {
        cap,
        max_age,
        tick: 0,
        eps: BTreeMap::new(),
    };
    let own: Vec<Vec<u64>> = ps.iter().map(|p| block_hashes(p, BS).to_vec()).collect();
    let mut now = 0u64;
    let (mut out, mut old_out) = (Vec::new(), Vec::new());
    for ep in 0..pins {
        let pin = [u64::from(ep) + 1];
        ix.record(EndpointId(ep), &pin, now);
        old.record(EndpointId(ep), &pin, now);
        m.touch(EndpointId(ep), &pin, now, true);
    }
    for op in ops {
        match *op {
            ApproxOp::Record { ep, prompt, len } => {
                ix.record(EndpointId(ep), &own[prompt][..len], now);
                old.record(EndpointId(ep), &own[prompt][..len], now);
                m.touch(EndpointId(ep), &own[prompt][..len], now, true);
            }
            ApproxOp::Claim { ep, prompt, len } => {
                ix.claim(EndpointId(ep), &own[prompt][..len], now);
                old.claim(EndpointId(ep), &own[prompt][..len], now);
                m.touch(EndpointId(ep), &own[prompt][..len], now, false);
            }
            ApproxOp::Release { ep, prompt, block } => {
                ix.release(EndpointId(ep), own[prompt][block]);
                old.release(EndpointId(ep), own[prompt][block]);
                m.release(EndpointId(ep), own[prompt][block]);
            }
            ApproxOp::Advance { ms } => now += ms,
            ApproxOp::Expire => {
                ix.expire(now);
                old.expire(now);
                let eps: Vec<EndpointId> = m.eps.keys().copied().collect();
                for ep in eps {
                    m.trim(ep, now);
                }
            }
            ApproxOp::Clear { ep } => {
                ix.clear_endpoint(EndpointId(ep));
                old.clear_endpoint(EndpointId(ep));
                if let Some(e) = m.eps.get_mut(&EndpointId(ep)) {
                    e.clear();
                }
            }
            ApproxOp::Remove { ep } => {
                ix.remove_endpoint(EndpointId(ep));
                old.remove_endpoint(EndpointId(ep));
                m.eps.remove(&EndpointId(ep));
            }
        }
        prop_assert_eq!(ix.stats(), old.stats(), "after {:?}", op);
        for p in &own {
            for n in 1..=BLOCKS {
                ix.match_prefix(&p[..n], now, &mut out);
                old.match_prefix(&p[..n], now, &mut old_out);
                prop_assert_eq!(&out, &old_out, "order of matches");
                prop_assert_eq!(sorted(out.clone()), m.match_prefix(&p[..n], now));
                for shift in 0..3u32 {
                    let mut depths: Vec<u32> = (0..3).map(|e| (e + shift) % 4).collect();
                    let mut old_depths = depths.clone();
                    ix.extend_matches(&p[..n], now, &mut depths);
                    old.extend_matches(&p[..n], now, &mut old_depths);
                    prop_assert_eq!(depths, old_depths);
                }
            }
        }
        for (&ep, e) in &m.eps {
            // Entries beyond capacity never survive a record.
            prop_assert!(e.len() <= cap, "{:?}", ep);
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn approx_index_equals_reference(
        ps in prompts(),
        cap in 1usize..12,
        ops in prop::collection::vec(approx_op(EPS, 400, 10), 1..60),
    ) {
        run_approx_ops(&ps, cap, &ops, 0)?;
    }
}

/// Long runs on two endpoints, time advancing slowly or not, capacities small or ample, so that
/// dead queue entries pile up behind a live one and the queues are compacted (as well as
/// evicted and expired).
#[test]
fn approx_index_long_runs_equal_the_old_implementation() {
    let cases = ProptestConfig::default().cases / 8;
    let mut runner =
        proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases.max(4)));
    runner
        .run(
            &(
                prompts(),
                prop_oneof![1usize..12, 40usize..100],
                (1u64..40)
                    .prop_flat_map(|step| prop::collection::vec(approx_op(2, step, 1), 200..600)),
            ),
            |(ps, cap, ops)| run_approx_ops(&ps, cap, &ops, 2),
        )
        .unwrap();
}

/// `ApproxIndex` before its `BlockMap` rewrite, verbatim but for: `Slots` (below) without its
/// memory accounting, `ApproxStats` from the crate, and no `memory_bytes`.
mod old_approx {
    /// Endpoint → dense slot, with per-slot state `T`. Freed slots are reused.
    #[derive(Debug, Clone)]
    pub struct Slots<T> {
        slot_of: HashMap<EndpointId, u32, ahash::RandomState>,
        ids: Vec<EndpointId>,
        states: Vec<Option<T>>,
        free: Vec<u32>,
    }

    impl<T> Default for Slots<T> {
        fn default() -> Self {
            Self {
                slot_of: HashMap::default(),
                ids: Vec::new(),
                states: Vec::new(),
                free: Vec::new(),
            }
        }
    }

    impl<T> Slots<T> {
        fn slot(&self, id: EndpointId) -> Option<u32> {
            self.slot_of.get(&id).copied()
        }

        fn slot_or_insert(&mut self, id: EndpointId, make: impl FnOnce() -> T) -> Option<u32> {
            if let Some(s) = self.slot(id) {
                return Some(s);
            }
            let s = match self.free.pop() {
                Some(s) => {
                    self.ids[s as usize] = id;
                    self.states[s as usize] = Some(make());
                    s
                }
                None => {
                    self.ids.push(id);
                    self.states.push(Some(make()));
                    (self.ids.len() - 1) as u32
                }
            };
            self.slot_of.insert(id, s);
            Some(s)
        }

        fn remove(&mut self, id: EndpointId) -> Option<(u32, T)> {
            let s = self.slot_of.remove(&id)?;
            let state = self.states.get_mut(s as usize)?.take()?;
            self.free.push(s);
            Some((s, state))
        }

        fn id(&self, slot: u32) -> EndpointId {
            self.ids
                .get(slot as usize)
                .copied()
                .unwrap_or(EndpointId(u32::MAX))
        }

        fn get_mut(&mut self, slot: u32) -> Option<&mut T> {
            self.states.get_mut(slot as usize)?.as_mut()
        }

        fn len(&self) -> usize {
            self.slot_of.len()
        }

        fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
            self.states
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|s| (i as u32, s)))
        }
    }

    use std::collections::hash_map::{Entry, OccupiedEntry};
    use std::collections::{HashMap, VecDeque};

    use smallvec::SmallVec;

    use kinf_router::prefix_index::{ApproxStats, EndpointId};

    type Map<K, V> = HashMap<K, V, ahash::RandomState>;

    /// One endpoint's claim on a block.
    #[derive(Debug, Clone, Copy)]
    struct Touch {
        slot: u32,
        /// Index-wide counter value of the latest touch (identifies the live LRU queue entry).
        tick: u64,
        /// Caller's clock at the latest touch, in milliseconds.
        at_ms: u64,
    }

    #[derive(Debug, Clone, Default)]
    struct ApproxEndpoint {
        /// Blocks currently attributed to the endpoint.
        held: usize,
        /// `(block, tick)` in touch order; entries whose tick is no longer the block's are stale.
        lru: VecDeque<(u64, u64)>,
    }

    /// **Approximate** prefix index for endpoints without KV events: it remembers which request
    /// blocks were *routed* to which endpoint, not what the engine actually caches.
    ///
    /// Each endpoint is assumed to keep at most `capacity_blocks` blocks, evicted least recently
    /// routed first (a prompt's tail before its head, as vLLM frees blocks), and nothing older than
    /// `max_age_ms`. It over-estimates when the engine evicted earlier (memory pressure, restarts)
    /// and under-estimates blocks cached by requests that bypassed this router. Time is the caller's
    /// monotonic clock in milliseconds; the index never reads a clock.
    #[derive(Debug, Clone)]
    pub struct ApproxIndex {
        capacity: usize,
        max_age_ms: u64,
        blocks: Map<u64, Touches>,
        endpoints: Slots<ApproxEndpoint>,
        tick: u64,
        pairs: usize,
        evicted: u64,
        expired: u64,
    }

    impl ApproxIndex {
        /// An empty index assuming `capacity_blocks` blocks per endpoint and entries valid for
        /// `max_age_ms`.
        pub fn new(capacity_blocks: usize, max_age_ms: u64) -> Self {
            Self {
                capacity: capacity_blocks,
                max_age_ms,
                blocks: Map::default(),
                endpoints: Slots::default(),
                tick: 0,
                pairs: 0,
                evicted: 0,
                expired: 0,
            }
        }

        /// Records that a request with blocks `request_hashes` was routed to `ep` at `now_ms`;
        /// then evicts beyond capacity and expires what is too old on that endpoint.
        pub fn record(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64) {
            self.touch(ep, request_hashes, now_ms, true);
        }

        /// Like [`record`](Self::record), but blocks `ep` already holds (not expired) keep their
        /// age: a claim expires the maximum age after the routing that made it, however often the
        /// prompt is routed there again. For claims that something else must confirm in time.
        pub fn claim(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64) {
            self.touch(ep, request_hashes, now_ms, false);
        }

        fn touch(&mut self, ep: EndpointId, request_hashes: &[u64], now_ms: u64, refresh: bool) {
            let max_age_ms = self.max_age_ms;
            let Some(slot) = self.endpoints.slot_or_insert(ep, ApproxEndpoint::default) else {
                return;
            };
            let Self {
                blocks,
                endpoints,
                tick,
                pairs,
                ..
            } = self;
            let Some(state) = endpoints.get_mut(slot) else {
                return;
            };
            // Touch the tail first so that the head is the most recently used: eviction then
            // shortens a cached prompt from its end, which keeps its prefix matchable.
            for &h in request_hashes.iter().rev() {
                let touches = blocks.entry(h).or_default();
                let held = touches.iter_mut().find(|t| t.slot == slot);
                if !refresh
                    && held
                        .as_ref()
                        .is_some_and(|t| now_ms.saturating_sub(t.at_ms) <= max_age_ms)
                {
                    continue;
                }
                *tick += 1;
                match held {
                    Some(t) => {
                        t.tick = *tick;
                        t.at_ms = now_ms;
                    }
                    None => {
                        touches.push(Touch {
                            slot,
                            tick: *tick,
                            at_ms: now_ms,
                        });
                        state.held += 1;
                        *pairs += 1;
                    }
                }
                state.lru.push_back((h, *tick));
            }
            self.trim(slot, now_ms);
        }

        /// Forgets that `ep` holds block `h` (something else now accounts for it); its queue
        /// entry is dropped later, as a stale one.
        pub fn release(&mut self, ep: EndpointId, h: u64) {
            if let Some(mut r) = self.releaser(ep) {
                r.release(h);
            }
        }

        /// A handle that forgets blocks of `ep` one by one ([`release`](Self::release)) with the
        /// endpoint looked up once, for a batch; `None` when `ep` holds nothing here.
        pub fn releaser(&mut self, ep: EndpointId) -> Option<Releaser<'_>> {
            let slot = self.endpoints.slot(ep)?;
            Some(Releaser { index: self, slot })
        }

        /// Drops, on every endpoint, the entries older than the maximum age at `now_ms`.
        pub fn expire(&mut self, now_ms: u64) {
            let slots: Vec<u32> = self.endpoints.iter().map(|(s, _)| s).collect();
            for s in slots {
                self.trim(s, now_ms);
            }
        }

        /// Evicts LRU entries of `slot` beyond capacity or older than the maximum age, and compacts
        /// its queue when stale entries dominate.
        fn trim(&mut self, slot: u32, now_ms: u64) {
            let Self {
                blocks,
                endpoints,
                pairs,
                evicted,
                expired,
                capacity,
                max_age_ms,
                ..
            } = self;
            let Some(state) = endpoints.get_mut(slot) else {
                return;
            };
            while let Some(&(h, tick)) = state.lru.front() {
                // One lookup per entry: the block's touches are read and, if the entry goes,
                // updated through the same entry.
                let Entry::Occupied(touches) = blocks.entry(h) else {
                    state.lru.pop_front(); // stale: the block is no longer held at all
                    continue;
                };
                let ts = touches.get();
                let Some(pos) = ts.iter().position(|t| t.slot == slot && t.tick == tick) else {
                    state.lru.pop_front(); // stale: the block was touched again later
                    continue;
                };
                let too_old = ts
                    .get(pos)
                    .is_some_and(|t| now_ms.saturating_sub(t.at_ms) > *max_age_ms);
                if state.held <= *capacity && !too_old {
                    break;
                }
                state.lru.pop_front();
                remove_touch(touches, pos);
                state.held -= 1;
                *pairs -= 1;
                if too_old {
                    *expired += 1;
                } else {
                    *evicted += 1;
                }
            }
            if state.lru.len() > 2 * state.held + 64 {
                state.lru.retain(|&(h, tick)| {
                    blocks
                        .get(&h)
                        .is_some_and(|ts| ts.iter().any(|t| t.slot == slot && t.tick == tick))
                });
            }
        }

        /// Forgets every block attributed to `ep` (e.g. after the worker restarted).
        pub fn clear_endpoint(&mut self, ep: EndpointId) {
            let Some(slot) = self.endpoints.slot(ep) else {
                return;
            };
            let Self {
                blocks,
                endpoints,
                pairs,
                ..
            } = self;
            let Some(state) = endpoints.get_mut(slot) else {
                return;
            };
            for (h, tick) in std::mem::take(&mut state.lru) {
                // Only the live entry of a block (its latest touch) removes it.
                if take_touch(blocks, h, |t| t.slot == slot && t.tick == tick) {
                    *pairs -= 1;
                }
            }
            state.held = 0;
        }

        /// Forgets `ep` entirely.
        pub fn remove_endpoint(&mut self, ep: EndpointId) {
            self.clear_endpoint(ep);
            self.endpoints.remove(ep);
        }

        /// Like `PrefixIndex::match_prefix`, counting only
        /// entries no older than the maximum age at `now_ms` (whether or not [`expire`](Self::expire)
        /// ran). Cost grows with the number of endpoints sharing a block; meant for modest fleets.
        pub fn match_prefix(
            &self,
            request_hashes: &[u64],
            now_ms: u64,
            out: &mut Vec<(EndpointId, u32)>,
        ) {
            out.clear();
            let fresh = |t: &&Touch| now_ms.saturating_sub(t.at_ms) <= self.max_age_ms;
            let Some(first) = request_hashes.first().and_then(|h| self.blocks.get(h)) else {
                return;
            };
            let mut active: SmallVec<[u32; 16]> =
                first.iter().filter(fresh).map(|t| t.slot).collect();
            for (depth, h) in request_hashes.iter().enumerate().skip(1) {
                if active.is_empty() {
                    return;
                }
                let touches = self.blocks.get(h).map_or(&[][..], |t| &t[..]);
                active.retain(|s| {
                    let keep = touches.iter().filter(fresh).any(|t| t.slot == *s);
                    if !keep {
                        out.push((self.endpoints.id(*s), depth as u32));
                    }
                    keep
                });
            }
            let n = request_hashes.len() as u32;
            out.extend(active.iter().map(|&s| (self.endpoints.id(s), n)));
        }

        /// Extends matched prefixes through the blocks each endpoint holds here: `depths[id]` is
        /// endpoint `id`'s matched depth in blocks (ids past the end count as 0), found by another
        /// index; while this index holds the request's block at an endpoint's depth (no older than
        /// the maximum age at `now_ms`), the depth grows by one. Afterwards each depth is the
        /// longest prefix made of the blocks it had plus blocks held here; `depths` grows to cover
        /// every id it sets.
        ///
        /// Cost: one lookup per distinct depth reached (a depth shared by many endpoints is looked
        /// up once), not one per request block: cheap when this index holds only what the other
        /// one lacks.
        pub fn extend_matches(&self, request_hashes: &[u64], now_ms: u64, depths: &mut Vec<u32>) {
            let n = request_hashes.len() as u32;
            if n == 0 || self.blocks.is_empty() {
                return;
            }
            // Depths to look up, smallest first; 0 for endpoints that matched nothing.
            let mut todo: std::collections::BinaryHeap<std::cmp::Reverse<u32>> = depths
                .iter()
                .copied()
                .filter(|&d| d > 0 && d < n)
                .chain(std::iter::once(0))
                .map(std::cmp::Reverse)
                .collect();
            let mut last = None;
            while let Some(std::cmp::Reverse(d)) = todo.pop() {
                if last == Some(d) {
                    continue;
                }
                last = Some(d);
                let Some(touches) = request_hashes
                    .get(d as usize)
                    .and_then(|h| self.blocks.get(h))
                else {
                    continue;
                };
                for t in touches {
                    if now_ms.saturating_sub(t.at_ms) > self.max_age_ms {
                        continue;
                    }
                    let i = self.endpoints.id(t.slot).0 as usize;
                    if depths.len() <= i {
                        depths.resize(i + 1, 0);
                    }
                    if let Some(depth) = depths.get_mut(i)
                        && *depth == d
                    {
                        *depth = d + 1;
                        if d + 1 < n {
                            todo.push(std::cmp::Reverse(d + 1));
                        }
                    }
                }
            }
        }

        /// Counters and sizes.
        pub fn stats(&self) -> ApproxStats {
            ApproxStats {
                endpoints: self.endpoints.len(),
                blocks: self.blocks.len(),
                pairs: self.pairs,
                evicted: self.evicted,
                expired: self.expired,
            }
        }
    }

    type Touches = SmallVec<[Touch; 2]>;

    /// Removes the touch at `pos` of a block's touches, and the block when none is left.
    fn remove_touch(mut touches: OccupiedEntry<'_, u64, Touches>, pos: usize) {
        let ts = touches.get_mut();
        ts.remove(pos);
        if ts.is_empty() {
            touches.remove();
        }
    }

    /// Forgets blocks of one endpoint of an [`ApproxIndex`] ([`ApproxIndex::releaser`]).
    pub struct Releaser<'a> {
        index: &'a mut ApproxIndex,
        slot: u32,
    }

    impl Releaser<'_> {
        /// Forgets that the endpoint holds block `h`, as [`ApproxIndex::release`] does.
        pub fn release(&mut self, h: u64) {
            let slot = self.slot;
            let index = &mut *self.index;
            if !take_touch(&mut index.blocks, h, |t| t.slot == slot) {
                return;
            }
            index.pairs -= 1;
            if let Some(state) = index.endpoints.get_mut(slot) {
                state.held = state.held.saturating_sub(1);
            }
        }
    }

    /// Removes block `h`'s first touch that `which` selects (with one table lookup); returns
    /// whether there was one.
    fn take_touch(blocks: &mut Map<u64, Touches>, h: u64, which: impl Fn(&Touch) -> bool) -> bool {
        let Entry::Occupied(touches) = blocks.entry(h) else {
            return false;
        };
        let Some(pos) = touches.get().iter().position(which) else {
            return false;
        };
        remove_touch(touches, pos);
        true
    }
}
