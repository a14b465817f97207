//! `kinf-bench live` in miniature: shared-prefix at scale 32 (500-token prefixes), 3 time-scaled
//! kinf-sim workers, 40 requests, behind the `kinference` gateway, `vllm-router` cache_aware
//! and `vllm-router` random. Every request must succeed, and the gateway's workers must hit
//! their prefix caches at least as often as the random router's.
//!
//! Needs the `kinf-sim` and `kinference` binaries next to `kinf-bench` (a workspace build, as
//! scripts/test.sh does) and `KINF_PEERS_PYTHON` (the peers venv's python, scripts/peers/setup.sh,
//! whose `bin/` has `vllm-router`). Skips without them unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use support::prerequisites;

fn live(bench: &Path, vllm_router: &Path, router: &str) -> Value {
    let out = Command::new(bench)
        .args(["live", "--workload", "shared-prefix", "--router", router])
        .args(["--scale", "32", "--speed", "20", "--requests", "40"])
        .args(["--load", "poisson:1", "--seed", "5", "--format", "json"])
        .arg("--vllm-router")
        .arg(vllm_router)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{router}: {stdout}\n{stderr}");
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{router}: not JSON ({e}): {stdout}"));
    println!(
        "{router}: ttft p50 {} s, cache hit {}, errors {}",
        v["ttft_p50_s"], v["cache_hit_rate"], v["errors"]
    );
    v
}

#[test]
fn gateway_and_peers_serve_everything_and_the_gateway_hits_the_cache() {
    let Some((bench, vr)) = prerequisites() else {
        return;
    };
    let runs: Vec<(&str, Value)> = ["kinference", "vllm-cache-aware", "random"]
        .into_iter()
        .map(|r| (r, live(&bench, &vr, r)))
        .collect();
    for (r, v) in &runs {
        assert_eq!(v["errors"], 0, "{r}: {}", v["first_error"]);
        assert_eq!(v["requests"], 40, "{r}");
        assert_eq!(v["router"], *r);
        for k in ["ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "output_tok_s"] {
            assert!(
                v[k].as_f64().is_some_and(|x| x > 0.0),
                "{r}: {k} = {}",
                v[k]
            );
        }
        // The SLO (8 s ÷ 32) may be missed on a loaded machine; the figures must still be there.
        for k in ["goodput_rpm", "slo_attainment"] {
            assert!(
                v[k].as_f64().is_some_and(|x| x >= 0.0),
                "{r}: {k} = {}",
                v[k]
            );
        }
        // Every request was served by one of the three workers, each counted once.
        let served: f64 = v["per_worker"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["requests"].as_f64().unwrap())
            .sum();
        assert_eq!(served, 40.0, "{r}: {}", v["per_worker"]);
    }
    let hit = |r: &str| {
        runs.iter().find(|(n, _)| *n == r).unwrap().1["cache_hit_rate"]
            .as_f64()
            .unwrap()
    };
    assert!(
        hit("kinference") >= hit("random"),
        "kinference hit rate {} < random's {}",
        hit("kinference"),
        hit("random")
    );
    // Some prefixes repeat within 40 requests: the gateway's workers must have reused them.
    assert!(hit("kinference") > 0.0, "{}", hit("kinference"));
}
