//! Randomised engines and workloads: invariants hold after every event, every request ends
//! exactly once, and the KV cache is empty of references at the end.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;

use kinf_sim::{Engine, EngineOptions, FinishReason, Output, PrefixHashes, Profile, Request};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    block_size: u32,
    blocks: u32,
    max_num_seqs: u32,
    budget: u32,
    chunked: bool,
    requests: Vec<(u32, u8, u8, u32, bool)>, // (arrival ms, prefix id, extra tokens, max tokens, abort)
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u32..9,
        8u32..80,
        1u32..6,
        1u32..40,
        any::<bool>(),
        prop::collection::vec(
            (
                0u32..50,
                0u8..4,
                0u8..40,
                1u32..30,
                prop::bool::weighted(0.1),
            ),
            1..40,
        ),
    )
        .prop_map(
            |(block_size, blocks, max_num_seqs, budget, chunked, requests)| Case {
                block_size,
                blocks,
                max_num_seqs,
                budget,
                chunked,
                requests,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn invariants_hold_and_every_request_ends_once(c in case()) {
        let mut p = Profile::tiny();
        p.block_size = c.block_size;
        p.num_gpu_blocks = c.blocks;
        p.max_num_seqs = c.max_num_seqs;
        p.max_num_batched_tokens = c.budget;
        p.enable_chunked_prefill = c.chunked;
        if !c.chunked {
            p.max_model_len = c.budget.max(2);
            p.max_num_batched_tokens = p.max_model_len;
        }
        let mut e = Engine::new(p, EngineOptions::default()).unwrap();
        let prefixes: Vec<Vec<u32>> = (0..4u32).map(|k| (0..(5 + 7 * k)).map(|i| i * 13 + k).collect()).collect();
        let mut reqs = c.requests.clone();
        reqs.sort_by_key(|r| r.0);
        let mut accepted = HashSet::new();
        let mut to_abort = Vec::new();
        let mut out = Vec::new();
        for (id, (ms, pre, extra, max, abort)) in reqs.iter().enumerate() {
            let t = f64::from(*ms) * 1e-3;
            e.advance_into(t, &mut out);
            e.check_invariants().unwrap();
            let mut prompt = prefixes[*pre as usize].clone();
            prompt.extend((0..u32::from(*extra)).map(|i| 5000 + id as u32 * 100 + i));
            if e.submit(Request::new(id as u64, prompt, *max), t).is_ok() {
                accepted.insert(id as u64);
                if *abort {
                    to_abort.push(id as u64);
                }
            }
            if id % 3 == 0 {
                for a in to_abort.drain(..) {
                    e.abort(a);
                }
            }
        }
        for a in to_abort.drain(..) {
            e.abort(a);
        }
        while e.advance_next(&mut out).is_some() {
            e.check_invariants().unwrap();
        }
        let mut ended = HashSet::new();
        for o in &out {
            if let Output::Finished(f) = o {
                prop_assert!(ended.insert(f.id), "request {} ended twice", f.id);
                if f.reason == FinishReason::Length {
                    prop_assert!(f.stats.output_tokens >= 1);
                    prop_assert!(f.stats.ttft().unwrap() >= 0.0);
                }
            }
        }
        prop_assert_eq!(ended, accepted);
        prop_assert!(e.is_idle());
        prop_assert_eq!(e.gauges().kv_cache_usage, 0.0);
        prop_assert!(e.reset_prefix_cache());
    }
}

/// Runs the case's requests on one engine; `hint` says which shared prefix's hashes (and for
/// which block size) to attach to request `id` whose prompt begins with prefix `pre`.
fn outputs_with(c: &Case, hint: impl Fn(usize, usize) -> Option<(usize, u32)>) -> Vec<Output> {
    let mut p = Profile::tiny();
    p.block_size = c.block_size;
    p.num_gpu_blocks = c.blocks;
    p.max_num_seqs = c.max_num_seqs;
    p.max_num_batched_tokens = c.budget.max(40);
    p.enable_chunked_prefill = c.chunked;
    p.max_model_len = p.max_num_batched_tokens;
    let mut e = Engine::new(
        p,
        EngineOptions {
            kv_events: true,
            token_outputs: true,
        },
    )
    .unwrap();
    let prefixes: Vec<Arc<[u32]>> = (0..4u32)
        .map(|k| (0..(5 + 7 * k)).map(|i| i * 13 + k).collect())
        .collect();
    let mut reqs = c.requests.clone();
    reqs.sort_by_key(|r| r.0);
    let mut out = Vec::new();
    for (id, (ms, pre, extra, max, abort)) in reqs.iter().enumerate() {
        let t = f64::from(*ms) * 1e-3;
        e.advance_into(t, &mut out);
        let mut prompt = prefixes[*pre as usize].to_vec();
        prompt.extend((0..u32::from(*extra)).map(|i| 5000 + id as u32 * 100 + i));
        let mut r = Request::new(id as u64, prompt, *max);
        if let Some((k, bs)) = hint(id, *pre as usize) {
            r = r.with_prefix_hashes(PrefixHashes::new(prefixes[k].clone(), bs));
        }
        if e.submit(r, t).is_ok() && *abort {
            e.abort(id as u64);
        }
    }
    while e.advance_next(&mut out).is_some() {}
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Precomputed prefix hashes save work and change nothing: the right prefix, a prefix the
    /// prompt does not begin with and hashes for another block size (both ignored by the
    /// engine) all give the outputs of an engine that hashes everything itself, KV events and
    /// tokens included.
    #[test]
    fn prefix_hashes_change_no_output(c in case(), picks in prop::collection::vec(0u8..4, 40)) {
        let plain = outputs_with(&c, |_, _| None);
        let hinted = outputs_with(&c, |id, pre| match picks[id % picks.len()] {
            0 => None,
            1 | 2 => Some((pre, c.block_size)),
            _ => Some((pre, c.block_size + 1)),
        });
        prop_assert_eq!(&plain, &hinted);
        let wrong = outputs_with(&c, |_, pre| Some(((pre + 1) % 4, c.block_size)));
        prop_assert_eq!(&plain, &wrong);
    }
}

#[test]
fn prefix_hashes_are_the_engine_hashes_of_the_prefix() {
    let prefix: Arc<[u32]> = (0..40).collect();
    let hashes = PrefixHashes::new(prefix.clone(), 16);
    assert_eq!(
        hashes.hashes(),
        kinf_sim::hash::block_hashes(&prefix, 16).as_slice()
    );
    assert_eq!(hashes.hashes().len(), 2);
    assert_eq!((hashes.tokens(), hashes.block_size()), (&prefix[..], 16));
    let mut prompt = prefix.to_vec();
    prompt.extend(40..56);
    assert_eq!(
        kinf_sim::hash::block_hashes(&prompt, 16)[..2],
        *hashes.hashes()
    );
    let r = Request::new(1, prompt, 4).with_prefix_hashes(hashes.clone());
    assert_eq!(r.prefix_hashes(), Some(&hashes));
}
