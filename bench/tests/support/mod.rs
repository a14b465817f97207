//! Shared by the end-to-end smoke tests of `kinf-bench`: what they need, and skipping (or, with
//! `KINF_REQUIRE_E2E=1`, failing) when it is missing.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

/// Skips (prints why, returns `None`) or, with `KINF_REQUIRE_E2E=1`, fails.
pub fn require<T>(what: &str) -> Option<T> {
    if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") {
        panic!("{what} (KINF_REQUIRE_E2E=1)");
    }
    eprintln!("SKIPPED: {what}; scripts/test.sh runs this test");
    None
}

/// The `kinf-bench` binary (with `kinf-sim` and `kinference` built beside it) and the peers
/// venv's `vllm-router` (`KINF_PEERS_PYTHON`, scripts/peers/setup.sh).
pub fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_kinf-bench"));
    let dir = bench.parent().unwrap().to_path_buf();
    for b in ["kinf-sim", "kinference"] {
        if !dir.join(b).exists() {
            return require(&format!(
                "{} is not built (cargo build -p kinf-sim -p kinf-handler)",
                dir.join(b).display()
            ));
        }
    }
    let Some(python) = std::env::var_os("KINF_PEERS_PYTHON").filter(|p| !p.is_empty()) else {
        return require("KINF_PEERS_PYTHON is not set");
    };
    let vr = PathBuf::from(python).with_file_name("vllm-router");
    if !vr.exists() {
        return require(&format!("{} not found", vr.display()));
    }
    Some((bench, vr))
}
