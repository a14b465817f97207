//! The engine's KV events, fed into Kinference's prefix index, reproduce the engine's true
//! cache contents after a random workload (evictions, preemptions, shared prefixes, a reset).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashMap;

use kinf_router::prefix_index::{self, EndpointId, PrefixIndex};
use kinf_sim::hash::{Rng, block_hashes};
use kinf_sim::{EngineOptions, EngineView, Fleet, Output, Profile, Request, output_token};

const BS: usize = 4;

struct World {
    fleet: Fleet,
    index: PrefixIndex,
    /// engine hash → own hash, for every block any request could have cached.
    own: HashMap<u64, u64>,
}

impl World {
    /// Checks the index against engine `i`'s cache (only meaningful when no step is in flight:
    /// vLLM publishes a step's events when the step ends).
    fn check(&self, i: usize) {
        let e = self.fleet.engine(i).unwrap();
        let ep = EndpointId(i as u32);
        let truth = e.cached_block_hashes();
        assert_eq!(
            self.index.endpoint_blocks(ep),
            truth.len(),
            "engine {i}: index holds {} blocks, engine {}",
            self.index.endpoint_blocks(ep),
            truth.len()
        );
        for h in &truth {
            let own = self.own[h];
            assert!(
                self.index.contains(ep, own),
                "engine {i} block {h:x} missing"
            );
        }
    }
}

fn run(seed: u64) {
    let mut profile = Profile::tiny();
    profile.num_gpu_blocks = 48; // small: evictions and preemptions
    profile.max_num_seqs = 4;
    let mut w = World {
        fleet: Fleet::new(&profile, EngineOptions::default(), 3).unwrap(),
        index: PrefixIndex::new(BS),
        own: HashMap::new(),
    };
    let mut rng = Rng::new(seed);
    let prefixes: Vec<Vec<u32>> = (0..5)
        .map(|_| {
            let n = 4 + rng.below(40) as usize;
            rng.tokens(n, 1000)
        })
        .collect();
    let mut t = 0.0;
    let mut route_rng = rng.fork(9);
    for id in 0..300u64 {
        t += rng.exp(400.0);
        let mut prompt = prefixes[rng.below(5) as usize].clone();
        let extra = rng.below(30) as usize;
        prompt.extend(rng.tokens(extra, 1000));
        if prompt.is_empty() {
            prompt.push(1);
        }
        let max_tokens = 1 + rng.below(20) as u32;
        // Every block this request may cache: prompt and generated tokens.
        let mut seq = prompt.clone();
        seq.extend((0..max_tokens).map(|i| output_token(id, i, profile.vocab_size)));
        for (e, o) in block_hashes(&seq, BS)
            .into_iter()
            .zip(prefix_index::block_hashes(&seq, BS))
        {
            w.own.insert(e, o);
        }
        let req = Request::new(id, prompt, max_tokens);
        let index = &mut w.index;
        let mut router =
            |_: &Request, v: &[EngineView<'_>]| route_rng.below(v.len() as u64) as usize;
        w.fleet.route(req, t, &mut router, &mut |i, o| {
            if let Output::KvEvents(b) = &o {
                index.apply_all(EndpointId(i as u32), &b.events);
            }
        });
        if id % 25 == 0 {
            for i in 0..3 {
                if w.fleet.engine(i).unwrap().current_step().is_none() {
                    w.check(i);
                }
            }
        }
    }
    let index = &mut w.index;
    w.fleet.run_until_idle(&mut |i, o| {
        if let Output::KvEvents(b) = &o {
            index.apply_all(EndpointId(i as u32), &b.events);
        }
    });
    let c = w.fleet.total_counters();
    assert_eq!(c.requests_finished, 300);
    for i in 0..3 {
        w.fleet.engine(i).unwrap().check_invariants().unwrap();
        assert!(!w.fleet.engine(i).unwrap().cached_block_hashes().is_empty());
        w.check(i);
    }
    let stats = w.index.stats();
    assert_eq!(stats.orphaned, 0);
    assert_eq!(stats.unknown_removals, 0);
    assert_eq!(stats.rejected, 0);

    // A reset publishes AllBlocksCleared.
    assert_eq!(
        w.fleet.with_engine(1, |e| e.reset_prefix_cache()),
        Some(true)
    );
    let index = &mut w.index;
    w.fleet.run_until_idle(&mut |i, o| {
        if let Output::KvEvents(b) = &o {
            index.apply_all(EndpointId(i as u32), &b.events);
        }
    });
    assert_eq!(w.index.endpoint_blocks(EndpointId(1)), 0);
    w.check(1);
    w.check(0);
}

#[test]
fn prefix_index_fed_by_engine_events_equals_the_engine_cache() {
    for seed in 0..12 {
        run(seed);
    }
}

#[test]
fn the_workload_exercises_evictions_and_preemptions() {
    let mut profile = Profile::tiny();
    profile.num_gpu_blocks = 48;
    profile.max_num_seqs = 4;
    let mut fleet = Fleet::new(&profile, EngineOptions::default(), 1).unwrap();
    let mut rng = Rng::new(3);
    let mut removed = 0;
    let arrivals: Vec<(f64, Request)> = (0..200u64)
        .map(|id| {
            let n = 4 + rng.below(60) as usize;
            (
                id as f64 * 0.002,
                Request::new(id, rng.tokens(n, 1000), 1 + rng.below(20) as u32),
            )
        })
        .collect();
    let mut router = |_: &Request, _: &[EngineView<'_>]| 0usize;
    fleet.run(arrivals, &mut router, |_, o| {
        if let Output::KvEvents(b) = o {
            removed += b
                .events
                .iter()
                .filter(|e| matches!(e, kinf_router::kv_events::KvEvent::BlockRemoved(_)))
                .count();
        }
    });
    assert!(removed > 0);
    assert!(fleet.total_counters().preemptions > 0);
}
