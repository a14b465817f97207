//! The multiturn workload's default sizes reproduce the published light-load medians
//! (NOTES.md §4: 1.70 s under a Kubernetes Service, 0.59 s under Kinference) on the
//! calibrated profile, as the report's light-load runs measure them (mean over seeds 1–3 of
//! each run's median TTFT). Ranges, not exact values: the fit itself is
//! `bench/experiments/fit-multiturn.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use kinf_bench::sim::{MultiturnSizes, RouterKind, SimConfig, WorkloadKind, run};

fn mean_median_ttft(router: RouterKind, sizes: MultiturnSizes) -> f64 {
    let medians: Vec<f64> = (1..=3)
        .map(|seed| {
            let mut c = SimConfig::new(WorkloadKind::Multiturn, router);
            c.seed = seed;
            c.multiturn = sizes;
            run(&c).unwrap().ttft_p50_s
        })
        .collect();
    medians.iter().sum::<f64>() / medians.len() as f64
}

#[test]
fn the_default_multiturn_sizes_land_on_the_published_medians() {
    let sizes = MultiturnSizes::default();
    let random = mean_median_ttft(RouterKind::Random, sizes);
    let kinference = mean_median_ttft(RouterKind::Kinference, sizes);
    // Within 3 % of each published median.
    assert!((1.65..=1.75).contains(&random), "random {random}");
    assert!(
        (0.572..=0.608).contains(&kinference),
        "kinference {kinference}"
    );
}

#[test]
fn multiturn_sizes_parse_and_refuse_what_is_not_three_counts() {
    let s: MultiturnSizes = "4000, 1100,256".parse().unwrap();
    assert_eq!(
        (s.first_tokens, s.user_tokens, s.output_tokens),
        (4000, 1100, 256)
    );
    for bad in [
        "4000,1100",
        "4000,1100,256,1",
        "4000,0,256",
        "a,1,1",
        "1,1,4294967296",
    ] {
        let err = bad.parse::<MultiturnSizes>().unwrap_err();
        assert!(!err.is_empty(), "{bad}");
    }
    assert!(
        "4000,0,256"
            .parse::<MultiturnSizes>()
            .unwrap_err()
            .contains("USER")
    );
}
