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
                ix.remove_endpoint(EndpointId(ep));
                m.remove_endpoint(EndpointId(ep));
                check_state(&ix, &m);
                continue;
            }
            Op::Unknown { ep } => (ep, KvEvent::Unknown("Future".into())),
        };
        ix.apply(EndpointId(ep), &ev);
        m.apply(EndpointId(ep), &ev);
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

    fn record(&mut self, ep: EndpointId, req: &[u64], now: u64) {
        let e = self.eps.entry(ep).or_default();
        for &h in req.iter().rev() {
            self.tick += 1;
            e.insert(h, (self.tick, now));
        }
        self.trim(ep, now);
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
    Record { ep: u32, prompt: usize, len: usize },
    Advance { ms: u64 },
    Expire,
    Clear { ep: u32 },
    Remove { ep: u32 },
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn approx_index_equals_reference(
        ps in prompts(),
        cap in 1usize..12,
        ops in prop::collection::vec(prop_oneof![
            6 => (0..EPS, 0..4usize, 1..=BLOCKS).prop_map(|(ep, prompt, len)| ApproxOp::Record { ep, prompt, len }),
            3 => (0u64..400).prop_map(|ms| ApproxOp::Advance { ms }),
            1 => Just(ApproxOp::Expire),
            1 => (0..EPS).prop_map(|ep| ApproxOp::Clear { ep }),
            1 => (0..EPS).prop_map(|ep| ApproxOp::Remove { ep }),
        ], 1..60),
    ) {
        let max_age = 1_000;
        let mut ix = ApproxIndex::new(cap, max_age);
        let mut m = ApproxModel { cap, max_age, tick: 0, eps: BTreeMap::new() };
        let own: Vec<Vec<u64>> = ps.iter().map(|p| block_hashes(p, BS).to_vec()).collect();
        let mut now = 0u64;
        let mut out = Vec::new();
        for op in &ops {
            match *op {
                ApproxOp::Record { ep, prompt, len } => {
                    ix.record(EndpointId(ep), &own[prompt][..len], now);
                    m.record(EndpointId(ep), &own[prompt][..len], now);
                }
                ApproxOp::Advance { ms } => now += ms,
                ApproxOp::Expire => {
                    ix.expire(now);
                    let eps: Vec<EndpointId> = m.eps.keys().copied().collect();
                    for ep in eps {
                        m.trim(ep, now);
                    }
                }
                ApproxOp::Clear { ep } => {
                    ix.clear_endpoint(EndpointId(ep));
                    if let Some(e) = m.eps.get_mut(&EndpointId(ep)) {
                        e.clear();
                    }
                }
                ApproxOp::Remove { ep } => {
                    ix.remove_endpoint(EndpointId(ep));
                    m.eps.remove(&EndpointId(ep));
                }
            }
            for p in &own {
                for n in 1..=BLOCKS {
                    ix.match_prefix(&p[..n], now, &mut out);
                    prop_assert_eq!(sorted(out.clone()), m.match_prefix(&p[..n], now));
                }
            }
            for (&ep, e) in &m.eps {
                // Entries beyond capacity never survive a record.
                prop_assert!(e.len() <= cap, "{:?}", ep);
            }
        }
    }
}
