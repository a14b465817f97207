//! The seed policies: compiled DAG snapshots, and every golden decision case passes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};

const SEEDS: &[&str] = &[
    "batch-only-to-idle-gpus",
    "burst-to-cloud",
    "model-aliases",
    "pii-stays-local",
    "smart-semantic-routing",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_seed_case_passes() {
    std::env::set_current_dir(root()).unwrap();
    for seed in SEEDS {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = kinfctl::test_cmd::run(
            &[PathBuf::from(format!("testdata/policies/{seed}"))],
            &[PathBuf::from(format!("testdata/cases/{seed}"))],
            kinfctl::cli::Format::Human,
            &mut out,
            &mut err,
        );
        let out = String::from_utf8(out).unwrap();
        assert_eq!(code, 0, "{seed}:\n{out}\n{}", String::from_utf8_lossy(&err));
        let last = out.lines().last().unwrap_or_default();
        let passed: usize = last.split(' ').next().unwrap().parse().unwrap();
        assert!(passed >= 4, "{seed}: {last}");
        assert!(last.ends_with("passed, 0 failed"), "{seed}: {last}");
    }
}

#[test]
fn every_quickstart_case_passes() {
    // The configuration scripts/demo.sh serves, with its own cases: among them, that a PII
    // prompt for `standard-model` never reaches the GLM workers its comment keeps PII from.
    std::env::set_current_dir(root()).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(
        &[PathBuf::from("deploy/quickstart")],
        &[PathBuf::from("testdata/cases/quickstart")],
        kinfctl::cli::Format::Human,
        &mut out,
        &mut err,
    );
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, 0, "{out}\n{}", String::from_utf8_lossy(&err));
    assert_eq!(out.lines().last(), Some("4 passed, 0 failed"), "{out}");
}

#[test]
fn a_wrong_expectation_fails_with_a_diff() {
    std::env::set_current_dir(root()).unwrap();
    let dir = std::env::temp_dir().join(format!("kinfctl-case-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let case = dir.join("wrong.yaml");
    std::fs::write(
        &case,
        "request: { model: llama-70b }\nexpect: { backendType: Provider, rule: burst-to-cloud }\n",
    )
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(
        &[PathBuf::from("testdata/policies/burst-to-cloud")],
        &[case],
        kinfctl::cli::Format::Human,
        &mut out,
        &mut err,
    );
    let out = String::from_utf8(out).unwrap();
    assert_eq!(code, 1);
    assert!(
        out.contains("backendType:\n  - expected: \"Provider\"\n  + actual:   \"Local\""),
        "{out}"
    );
    assert!(out.trim_end().ends_with("0 passed, 1 failed"), "{out}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn compiled_dags_of_the_seeds() {
    for seed in SEEDS {
        let dir = root().join("testdata/policies").join(seed);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let mut sources = kinf_lang::Sources::new();
        for f in files {
            let name = format!(
                "testdata/policies/{seed}/{}",
                f.file_name().unwrap().to_string_lossy()
            );
            sources.add(name, std::fs::read_to_string(&f).unwrap());
        }
        let c = kinf_lang::compile(&sources);
        assert!(c.diagnostics.is_empty(), "{seed}: {:?}", c.diagnostics);
        let policy = c.policy.unwrap();
        let text: String = policy
            .pools
            .iter()
            .map(|p| kinf_lang::dag::render_pool(p, &policy))
            .collect();
        let dot: String = policy
            .pools
            .iter()
            .map(|p| kinf_lang::dag::RuleDag::build(p).to_dot(p, &policy))
            .collect();
        insta::assert_snapshot!(format!("dag_{seed}"), text);
        insta::assert_snapshot!(format!("dot_{seed}"), dot);
    }
}

#[test]
fn explain_json_has_the_documented_fields() {
    std::env::set_current_dir(root()).unwrap();
    let dir = std::env::temp_dir().join(format!("kinfctl-explain-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let req = dir.join("req.yaml");
    std::fs::write(
        &req,
        "model: llama-70b\ntags: [pii-detected]\npromptTokens: 500\n",
    )
    .unwrap();
    let state = dir.join("state.yaml");
    std::fs::write(&state, "endpoints:\n  \"10.0.0.1:8000\": { ready: false }\n  \"10.0.0.2:8000\": { ready: false }\n").unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[PathBuf::from("testdata/policies/pii-stays-local")],
        &req,
        Some(&state),
        kinfctl::cli::Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&err));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["outcome"], "reject");
    assert_eq!(v["status"], 503);
    assert_eq!(v["code"], "policy_rejected");
    assert_eq!(v["rule"], "serve");
    assert_eq!(v["policy"], "inference/pii-stays-local");
    for k in ["backendType", "endpoint", "model", "stages"] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let dropped = &v["stages"]["rules"][0]["stages"]["dropped"][0];
    assert_eq!(dropped["filter"], "pii-never-leaves-cluster");
    // A state naming an unknown endpoint is a usage error naming it.
    std::fs::write(
        &state,
        "endpoints:\n  \"10.9.9.9:8000\": { ready: false }\n",
    )
    .unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[PathBuf::from("testdata/policies/pii-stays-local")],
        &req,
        Some(&state),
        kinfctl::cli::Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, 2);
    // With `--format json` the error is JSON on stdout too, at its place in the state file.
    assert!(err.is_empty(), "{}", String::from_utf8_lossy(&err));
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let d = &v["diagnostics"][0];
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("`10.9.9.9:8000` is not an endpoint"),
        "{v}"
    );
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(2), Some(3))
    );
    std::fs::remove_dir_all(dir).ok();
}
