//! The short soak (`kinf-bench soak` for a few seconds): real `kinference` and `kinf-sim`
//! processes under Poisson load; accounting must match the workers exactly, no request may
//! fail and file descriptors must not grow. Memory growth is judged only by the long run
//! (docs/security.md), since a few seconds are all warm-up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Command;

fn sibling(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kinf-bench"))
        .parent()
        .unwrap()
        .join(name)
}

#[test]
fn short_soak_keeps_accounting_exact_and_descriptors_flat() {
    for bin in ["kinference", "kinf-sim"] {
        if !sibling(bin).is_file() {
            if std::env::var("KINF_REQUIRE_E2E").as_deref() == Ok("1") {
                panic!("{} is not built", sibling(bin).display());
            }
            eprintln!("SKIPPED: {} is not built (cargo build --workspace)", bin);
            return;
        }
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kinf-bench"))
        .args([
            "soak",
            "--duration",
            "12s",
            "--warmup",
            "3s",
            "--window",
            "3s",
        ])
        .args([
            "--probe-seconds",
            "3",
            "--probe-concurrency",
            "48",
            "--speed",
            "0.05",
        ])
        .args(["--max-memory-growth", "10"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON report ({e}):\n{stdout}\n{stderr}"));
    let checks = &v["checks"];
    assert_eq!(checks["accounting"], true, "{v}");
    assert_eq!(checks["errors"], true, "{v}");
    assert_eq!(checks["file_descriptors"], true, "{v}");
    assert!(v["requests"].as_u64().unwrap() > 10, "{v}");
    let gw = &v["accounting"]["gateway"];
    let wk = &v["accounting"]["workers"];
    assert!(wk["output_tokens"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(gw, wk, "gateway totals equal the workers' totals");
    assert!(v["windows"].as_array().unwrap().len() >= 3, "{v}");
}
