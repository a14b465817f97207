//! Same seed, same simulation: every output of a fleet run is reproduced exactly.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use kinf_sim::hash::Rng;
use kinf_sim::workload::{Poisson, SharedPrefixGen, SharedPrefixSpec};
use kinf_sim::{EngineOptions, EngineView, Fleet, Output, Profile, Request};

fn run(seed: u64) -> Vec<(usize, Output)> {
    let spec = SharedPrefixSpec {
        num_prefixes: 6,
        prefix_tokens: 40,
        unique_tokens: 8,
        output_tokens: 6,
        vocab: 1000,
    };
    let mut g = SharedPrefixGen::new(spec, seed);
    let arrivals: Vec<(f64, Request)> = Poisson::new(300.0, seed)
        .take(400)
        .map(|t| (t, g.next_request().1))
        .collect();
    let mut profile = Profile::tiny();
    profile.num_gpu_blocks = 60;
    let mut fleet = Fleet::new(&profile, EngineOptions::default(), 4).unwrap();
    let mut rng = Rng::new(seed);
    let mut router = |_: &Request, v: &[EngineView<'_>]| rng.below(v.len() as u64) as usize;
    let mut out = Vec::new();
    fleet.run(arrivals, &mut router, |i, o| out.push((i, o)));
    out
}

#[test]
fn same_seed_same_outputs() {
    let a = run(17);
    let b = run(17);
    assert!(a.len() > 400 * 6);
    assert_eq!(a, b);
    let c = run(18);
    assert_ne!(a, c);
}
