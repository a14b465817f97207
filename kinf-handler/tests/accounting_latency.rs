//! Latency objectives and golden signals, accounted directly (no gateway): which responses
//! count for which objective, and the per-token times they are measured by.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kinf_handler::accounting::{Served, SloSet, account_response};
use kinf_handler::metrics::Metrics;
use kinf_lang::compiled::CostInfo;
use kinf_router::usage::TokenUsage;

/// A completed streamed 200: first token at `ttft`, `out` output tokens, `dur` in all.
fn served(ttft: Option<f64>, out: u64, dur: f64) -> Served<'static> {
    Served {
        tenant: Some("acme"),
        requested_model: "small",
        upstream_model: "tiny-llama",
        destination: "tiny",
        destination_namespace: "test",
        endpoint: "127.0.0.1:1",
        cost: CostInfo {
            uncached_prompt: 1.0,
            cached_prompt: 0.1,
            output: 2.0,
            priced: true,
        },
        status: 200,
        completed: true,
        client_gone: false,
        streamed: true,
        ttft_s: ttft,
        mean_itl_s: ttft.map(|_| 0.02),
        duration_s: dur,
        longest_share: 1.0,
        usage: TokenUsage {
            cached_prompt_tokens: 100,
            uncached_prompt_tokens: 900,
            cache_write_prompt_tokens: 0,
            output_tokens: out,
        },
        estimated: false,
    }
}

fn slo_count(m: &Metrics, counter: &str, slo: &str) -> Option<f64> {
    m.value(
        counter,
        &[("slo", slo), ("tenant", "acme"), ("model", "small")],
    )
}

const REQUESTS: &str = "kinference_slo_requests_total";
const GOOD: &str = "kinference_slo_good_total";

#[test]
fn a_non_streamed_request_counts_for_no_ttft_objective_even_with_a_first_token_time() {
    // A gRPC `Report` may give a non-streamed response a `ttft_seconds` (a proxy's time to the
    // response's first byte: its whole body). That is no first-token time: the request counts
    // for no `ttft` objective (metrics.md: "non-streamed requests are not counted, however
    // they end"), good or bad, while it still counts for `e2e`.
    let m = Metrics::new();
    m.set_slos(
        SloSet::from_yaml(
            "- {name: fast, metric: ttft, quantile: 0.9, threshold: 1s}\n- {name: whole, metric: e2e, quantile: 0.9, threshold: 5s}\n",
        )
        .unwrap(),
    );
    let non_streamed = |status: u16, ttft: f64| Served {
        streamed: false,
        status,
        completed: status == 200,
        ..served(Some(ttft), 11, 1.5)
    };
    // Within the threshold, over it, and failed.
    account_response(&m, &non_streamed(200, 0.5));
    account_response(&m, &non_streamed(200, 1.4));
    account_response(&m, &non_streamed(502, 0.5));
    assert_eq!(slo_count(&m, REQUESTS, "fast"), None);
    assert_eq!(slo_count(&m, REQUESTS, "whole"), Some(3.0));
    assert_eq!(slo_count(&m, GOOD, "whole"), Some(2.0));
    // A stream's first token counts.
    account_response(&m, &served(Some(0.5), 11, 1.5));
    assert_eq!(slo_count(&m, REQUESTS, "fast"), Some(1.0));
    assert_eq!(slo_count(&m, GOOD, "fast"), Some(1.0));
}

#[test]
fn tpot_divides_by_the_longest_choices_tokens_minus_one_without_float_drift() {
    // One second of decode after the first token.
    let tpot = |out: u64, share: f64| {
        Served {
            longest_share: share,
            ..served(Some(0.5), out, 1.5)
        }
        .tpot_s()
    };
    // One choice: 11 tokens, 10 gaps.
    assert!((tpot(11, 1.0).unwrap() - 0.1).abs() < 1e-12);
    assert_eq!(tpot(1, 1.0), None);
    // The longest of several choices has 2 tokens (1 gap), whatever the total: `out × 2/out`
    // is 1.999… for many totals (49, 98, 103, …), which is still 2 tokens.
    for out in 2..2_000u64 {
        let t = tpot(out, 2.0 / out as f64);
        assert_eq!(t, Some(1.0), "2 of {out} tokens");
    }
    // And k tokens of the longest choice are k − 1 gaps, exactly.
    for (k, out) in [(3u64, 7u64), (10, 49), (50, 149), (7, 1000)] {
        let t = tpot(out, k as f64 / out as f64).unwrap();
        assert_eq!(t, 1.0 / (k - 1) as f64, "{k} of {out} tokens");
    }

    // Through the accounting: the response is a TPOT sample and counts for a TPOT objective.
    let m = Metrics::new();
    m.set_slos(
        SloSet::from_yaml("- {name: steady, metric: tpot, quantile: 0.9, threshold: 2s}").unwrap(),
    );
    account_response(
        &m,
        &Served {
            longest_share: 2.0 / 49.0,
            ..served(Some(0.5), 49, 1.5)
        },
    );
    let gl = [("tenant", "acme"), ("model", "small")];
    assert_eq!(m.value("kinference_tpot_seconds_count", &gl), Some(1.0));
    assert_eq!(m.value("kinference_tpot_seconds_sum", &gl), Some(1.0));
    assert_eq!(slo_count(&m, GOOD, "steady"), Some(1.0));
}

#[test]
fn thresholds_are_the_durations_written() {
    use kinf_handler::accounting::slo::parse_duration;
    // Multiplying by 1e-3 drifts: 1400ms was 1.4000000000000001 s, 36ms 0.036000000000000004 s,
    // 5us 4.9999999999999996e-6 s (below what was written).
    for (text, want) in [
        ("1400ms", 1.4),
        ("2300ms", 2.3),
        ("36ms", 0.036),
        ("9ms", 0.009),
        ("5us", 5e-6),
        ("250ms", 0.25),
        ("1.5s", 1.5),
        ("2m", 120.0),
    ] {
        assert_eq!(parse_duration(text), Some(want), "{text}");
    }
    let m = Metrics::new();
    let set =
        SloSet::from_yaml("- {metric: e2e, quantile: 0.9, threshold: 1400ms}\n- {metric: tpot, quantile: 0.99, threshold: 36ms}\n")
            .unwrap();
    let names: Vec<&str> = set.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["e2e_p90_1.4s", "tpot_p99_36ms"]);
    m.set_slos(set);
    assert_eq!(
        m.value(
            "kinference_slo_threshold_seconds",
            &[("slo", "e2e_p90_1.4s"), ("metric", "e2e")]
        ),
        Some(1.4)
    );
    assert_eq!(
        m.value(
            "kinference_slo_threshold_seconds",
            &[("slo", "tpot_p99_36ms"), ("metric", "tpot")]
        ),
        Some(0.036)
    );
}
