//! Smoke test of `kinf-bench sim`: tiny simulations (the `tiny` profile, token counts divided
//! by 64) of every workload under every router, in a debug build in seconds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kinf_bench::sim::{
    LoadSpec, RouterKind, SimConfig, SimResult, WallBreakdown, WorkloadKind, run,
};
use proptest::prelude::*;

fn tiny(w: WorkloadKind, r: RouterKind, seed: u64) -> SimConfig {
    let mut c = SimConfig::new(w, r);
    c.profile = "tiny".into();
    c.scale = 64;
    c.seed = seed;
    c.load = LoadSpec::Poisson(if w == WorkloadKind::Multiturn {
        2.0
    } else {
        15.0
    });
    c.duration_s = 4.0;
    c.warmup_s = 0.0;
    c
}

/// The result without its wall-clock fields.
fn simulated(r: &SimResult) -> SimResult {
    let mut r = r.clone();
    r.wall_s = 0.0;
    r.decision_us_mean = 0.0;
    r.decision_us_p50 = 0.0;
    r.decision_us_p99 = 0.0;
    r.wall_breakdown = WallBreakdown::default();
    r
}

#[test]
fn every_router_finishes_every_request_of_every_workload() {
    for w in WorkloadKind::ALL {
        for r in RouterKind::ALL {
            let res = run(&tiny(w, r, 1)).unwrap_or_else(|e| panic!("{w:?} {r:?}: {e}"));
            assert!(res.requests > 10, "{w:?} {r:?}: {} requests", res.requests);
            assert_eq!(
                res.requests, res.submitted,
                "{w:?} {r:?}: all sent in the window"
            );
            assert_eq!(res.rejected, 0, "{w:?} {r:?}");
            assert!(res.ttft_p50_s > 0.0 && res.ttft_p50_s <= res.ttft_p90_s);
            assert!(res.e2e_p50_s >= res.ttft_p50_s, "{w:?} {r:?}");
            assert!((0.0..=1.0).contains(&res.cache_hit_rate));
            assert!((0.0..=1.0).contains(&res.slo_attainment));
            assert_eq!(
                res.per_worker_requests.iter().sum::<u64>(),
                res.submitted,
                "{w:?} {r:?}"
            );
        }
    }
}

#[test]
fn closed_loop_keeps_the_clients_busy_and_measures_goodput() {
    let mut c = tiny(WorkloadKind::SharedPrefix, RouterKind::Kinference, 3);
    c.load = LoadSpec::Concurrency(4);
    c.warmup_s = 1.0;
    let r = run(&c).unwrap();
    assert!(r.requests > 20, "{}", r.requests);
    assert_eq!(r.concurrency, Some(4));
    assert!(r.goodput_rpm > 0.0 && r.goodput_rpm <= r.throughput_rpm + 1e-9);
}

#[test]
fn the_wall_breakdown_accounts_for_the_run_and_names_where_it_went() {
    let r = run(&tiny(WorkloadKind::SharedPrefix, RouterKind::Kinference, 1)).unwrap();
    let b = r.wall_breakdown;
    let parts = [
        b.setup_s,
        b.engine_s,
        b.decide_s,
        b.observe_s,
        b.scrape_s,
        b.workload_s,
        b.other_s,
    ];
    assert!(parts.iter().all(|p| *p >= 0.0 && p.is_finite()), "{b:?}");
    // Every part that this run exercises took some time: engines stepped, decisions were
    // made, KV events were observed, metrics scraped, prompts generated.
    for (name, p) in [
        ("engine", b.engine_s),
        ("decide", b.decide_s),
        ("observe", b.observe_s),
        ("scrape", b.scrape_s),
        ("workload", b.workload_s),
    ] {
        assert!(p > 0.0, "{name}: {b:?}");
    }
    // The decision part is the sum the decision statistics come from.
    let from_mean = r.decision_us_mean * r.submitted as f64 / 1e6;
    assert!(
        (b.decide_s - from_mean).abs() <= 1e-3 + 0.01 * b.decide_s,
        "{} s vs {from_mean} s",
        b.decide_s
    );
    // The measured parts do not overlap: with the remainder they add up to the run's wall
    // time (a part counted twice would exceed it, and `other_s` is clamped at zero).
    let sum: f64 = parts.iter().sum();
    assert!(
        (sum - r.wall_s).abs() <= 1e-6 * r.wall_s + 1e-9,
        "{sum} vs {}",
        r.wall_s
    );
}

#[test]
fn kinference_hits_the_cache_more_than_random_on_shared_prefix() {
    // The calibrated profile with prompts divided by 16 (24 prefixes of 1,000 tokens): prefill
    // time dominates, as in the real workload. Kinference misses each prefix once, random up to
    // once per worker.
    let cfg = |r| {
        let mut c = SimConfig::new(WorkloadKind::SharedPrefix, r);
        c.scale = 16;
        c.seed = 2;
        c.load = LoadSpec::Poisson(2.0);
        c.duration_s = 60.0;
        c
    };
    let k = run(&cfg(RouterKind::Kinference)).unwrap();
    let r = run(&cfg(RouterKind::Random)).unwrap();
    assert!(
        k.cache_hit_rate > r.cache_hit_rate,
        "kinference {} vs random {}",
        k.cache_hit_rate,
        r.cache_hit_rate
    );
    assert!(k.rules.is_some(), "kinference reports its rules");
}

#[test]
fn mixed_tenants_batch_requests_take_the_batch_rule() {
    let mut c = tiny(WorkloadKind::MixedTenants, RouterKind::Kinference, 1);
    c.trace_every = 1;
    let r = run(&c).unwrap();
    let rules = r.rules.unwrap();
    assert!(
        rules.get("batch-to-idle-workers").copied().unwrap_or(0) > 0,
        "{rules:?}"
    );
    assert!(
        rules.get("lowest-predicted-ttft").copied().unwrap_or(0) > 0,
        "{rules:?}"
    );
    assert!(!r.traces.unwrap().is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]
    #[test]
    fn a_run_is_deterministic_for_its_seed(seed in 0u64..1000, router in 0usize..8, load in 0usize..2) {
        let r = RouterKind::ALL[router];
        let mut c = tiny(WorkloadKind::Hotspot, r, seed);
        c.duration_s = 2.0;
        if load == 1 {
            c.load = LoadSpec::Concurrency(3);
        }
        let a = run(&c).unwrap();
        let b = run(&c).unwrap();
        prop_assert_eq!(simulated(&a), simulated(&b));
    }
}
