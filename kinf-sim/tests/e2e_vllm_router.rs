//! A third-party consumer of kinf-sim's KV events: the `vllm-router` PyPI package with its
//! `kv_aware` policy must route repeats to the worker holding their blocks
//! (scripts/e2e/vllm_router_kv_check.py). Needs `KINF_PEERS_PYTHON`: the peers venv's python
//! (scripts/peers/setup.sh), which also provides the `vllm-router` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

#[test]
fn vllm_router_kv_aware_consumes_kinf_sim_events() {
    let python = match std::env::var("KINF_PEERS_PYTHON") {
        Ok(p) if !p.is_empty() => p,
        _ if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") => {
            panic!("KINF_PEERS_PYTHON is not set (scripts/test.sh sets it up)")
        }
        _ => {
            eprintln!("SKIPPED: KINF_PEERS_PYTHON is not set; scripts/test.sh runs this test");
            return;
        }
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(&python)
        .arg(root.join("scripts/e2e/vllm_router_kv_check.py"))
        .args(["--kinf-sim", env!("CARGO_BIN_EXE_kinf-sim")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("POST /tokenize: HTTP 200"),
        "kinf-sim should answer /tokenize itself: {stdout}"
    );
    assert!(stdout.contains(", 0 failed"), "{stdout}");
}
