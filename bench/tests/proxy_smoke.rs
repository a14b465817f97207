//! `kinf-bench proxy` in miniature, with the gateway in `--busy-poll` mode: both cases, every
//! target measured (no errors anywhere), the JSON shape the docs describe, and the gateway
//! argument recorded. Speed is not asserted (benchmarks, not timed tests).
//!
//! Needs the `kinf-sim` and `kinference` binaries next to `kinf-bench` (a workspace build, as
//! scripts/test.sh does) and `KINF_PEERS_PYTHON` (the peers venv's python, whose `bin/` has
//! `vllm-router`). Skips without them unless `KINF_REQUIRE_E2E=1`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;

use serde_json::Value;
use support::prerequisites;

#[test]
fn proxy_benchmark_measures_both_gateways_on_both_cases() {
    let Some((bench, vr)) = prerequisites() else {
        return;
    };
    let out = Command::new(&bench)
        .args([
            "proxy",
            "--requests",
            "60",
            "--long-requests",
            "6",
            "--warmup",
            "20",
        ])
        .args([
            "--rounds",
            "2",
            "--concurrency",
            "4",
            "--long-tokens",
            "3000",
        ])
        .args([
            "--gateway-arg=--busy-poll=200us",
            "--require-peer",
            "--format",
            "json",
        ])
        .arg("--vllm-router")
        .arg(&vr)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(
        v["params"]["gateway_args"],
        serde_json::json!(["--busy-poll=200us"])
    );
    for case in ["small", "long"] {
        let c = &v["cases"][case];
        assert!(c["prompt_tokens"].as_u64().unwrap() > 0, "{case}: {c}");
        for target in ["direct", "kinference", "vllm_router"] {
            for run in ["latency", "throughput"] {
                let r = &c[target][run];
                assert_eq!(r["errors"], 0, "{case}/{target}/{run}: {r}");
                assert!(
                    r["requests"].as_u64().unwrap() > 0,
                    "{case}/{target}/{run}: {r}"
                );
                assert!(
                    r["p50_ms"].as_f64().unwrap() > 0.0,
                    "{case}/{target}/{run}: {r}"
                );
            }
        }
        for target in ["kinference", "vllm_router"] {
            assert!(
                c[target]["added_p50_ms"].is_number(),
                "{case}/{target}: {c}"
            );
        }
    }
    for t in [
        "small_added_p50_le_0_2ms",
        "small_added_p99_le_1ms",
        "long_added_p50_le_2ms",
        "small_rps_ge_vllm_router",
    ] {
        assert!(v["targets"][t].is_boolean(), "{t}: {}", v["targets"]);
    }
    println!(
        "small added p50 {} ms, long added p50 {} ms (smoke sizes, not the benchmark)",
        v["cases"]["small"]["kinference"]["added_p50_ms"],
        v["cases"]["long"]["kinference"]["added_p50_ms"]
    );
}
