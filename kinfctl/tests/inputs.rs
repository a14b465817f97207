//! The input files of `kinfctl explain` and `kinfctl test` (request, state and case files) and
//! the paths of `lint` and `--cases`: nothing is lost or silently accepted, every error names the
//! field, what it allows and its `FILE:LINE:COLUMN`, and empty inputs fail.
//!
//! Accept changed snapshots with `cargo insta accept`, or run with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};

use kinfctl::cli::Format;
use kinfctl::{EXIT_FINDINGS, EXIT_OK, EXIT_USAGE};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn bundle() -> PathBuf {
    root().join("testdata/policies/burst-to-cloud")
}

/// A fresh directory for one test.
struct Tmp(PathBuf);

impl Tmp {
    fn new(test: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("kinfctl-inputs-{}-{test}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        Tmp(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Output with this directory written as `TMP`.
    fn clean(&self, bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).replace(&self.0.display().to_string(), "TMP")
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// `kinfctl test BUNDLE --cases ...`: exit code, stdout, stderr.
fn test_cmd(tmp: &Tmp, cases: &[PathBuf]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(&[bundle()], cases, Format::Human, &mut out, &mut err);
    (code, tmp.clean(&out), tmp.clean(&err))
}

/// `kinfctl explain BUNDLE --request R [--state S]`: exit code, stdout, stderr.
fn explain(tmp: &Tmp, request: &Path, state: Option<&Path>) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[bundle()],
        request,
        state,
        Format::Json,
        &mut out,
        &mut err,
    );
    (code, tmp.clean(&out), tmp.clean(&err))
}

const LOCAL: &str = "request: { model: llama-70b }\nexpect: { backendType: Local }\n";
const WRONG: &str = "request: { model: llama-70b }\nexpect: { backendType: Provider }\n";

#[test]
fn every_document_of_a_case_file_runs() {
    let tmp = Tmp::new("documents");
    // The failing case is in the second document: it must run, and fail the run.
    let f = tmp.file(
        "cases.yaml",
        &format!(
            "name: first\n{LOCAL}---\nname: second\n{WRONG}---\ncases:\n- {}",
            LOCAL.replace('\n', "\n  ")
        ),
    );
    let (code, out, err) = test_cmd(&tmp, &[f]);
    assert_eq!(code, EXIT_FINDINGS, "{out}\n{err}");
    let verdicts: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("ok ") || l.starts_with("FAIL "))
        .collect();
    assert_eq!(
        verdicts,
        ["ok   first", "FAIL second", "ok   TMP/cases.yaml#3"],
        "{out}"
    );
    assert!(out.ends_with("2 passed, 1 failed\n"), "{out}");
}

#[test]
fn keys_next_to_cases_and_unknown_keys_are_errors() {
    let tmp = Tmp::new("stray");
    // A list of cases with a case's keys beside it: the stray case used to be dropped.
    let stray = tmp.file(
        "stray.yaml",
        &format!(
            "cases:\n- name: listed\n  request: {{ model: llama-70b }}\n  expect: {{ backendType: Local }}\nname: stray\n{WRONG}"
        ),
    );
    let (code, out, err) = test_cmd(&tmp, &[stray]);
    assert_eq!(code, EXIT_USAGE, "{out}");
    assert!(
        out.is_empty(),
        "no case runs when a case file is invalid: {out}"
    );
    insta::assert_snapshot!("stray_keys", err);

    let unknown = tmp.file(
        "unknown.yaml",
        "cases:\n- name: a\n  request: { model: llama-70b }\n  expect: { outcome: route }\n  expected: { rule: x }\n",
    );
    let (code, _, err) = test_cmd(&tmp, &[unknown]);
    assert_eq!(code, EXIT_USAGE);
    assert_eq!(
        err,
        "error: TMP/unknown.yaml:5:3: unknown field `expected` in a case\n  help: did you mean `expect`?\n"
    );
}

#[test]
fn case_file_errors_are_in_the_users_terms_with_places() {
    let text = "\
cases:
- name: quoted number
  request: { model: llama-70b, promptTokens: \"1000\" }
  expect: { outcome: route }
- name: nothing checked
  request: { model: llama-70b }
  expect: {}
- name: no request
  expect: { outcome: route, backend: Local }
- name: bad state
  request: { model: llama-70b }
  state:
    endpoints:
      \"10.0.0.1:8000\": { kvCacheUsage: 90, queuedPrompts: .nan }
    provider: { bedrock: { ready: false } }
  expect: { outcome: route }
---
- request: { model: llama-70b }
  expect: { outcome: route }
---
cases: []
";
    let errors = kinfctl::test_cmd::parse_cases("cases.yaml", text)
        .expect_err("invalid")
        .join("\n");
    insta::assert_snapshot!("case_file_errors", errors);
}

#[test]
fn empty_case_inputs_fail() {
    let tmp = Tmp::new("empty");
    // Cases one directory too deep: `--cases` is not recursive.
    tmp.file("cases/sub/a.yaml", LOCAL);
    let (code, out, err) = test_cmd(&tmp, &[tmp.0.join("cases")]);
    assert_eq!(code, EXIT_USAGE, "{out}");
    assert_eq!(
        err,
        "error: no test cases found: `TMP/cases` holds no case file (`*.yaml`, `*.yml`)\n  help: case directories are not read recursively: name `TMP/cases/sub` with another `--cases`\n"
    );
    for (name, text) in [
        ("empty-list.yaml", "cases: []\n"),
        ("blank.yaml", "# nothing yet\n"),
    ] {
        let f = tmp.file(name, text);
        let (code, out, err) = test_cmd(&tmp, &[f]);
        assert_eq!(code, EXIT_USAGE, "{name}: {out}");
        assert!(err.contains(&format!("TMP/{name}:1:")), "{name}: {err}");
    }
    // The directory with the cases works.
    let (code, out, _) = test_cmd(&tmp, &[tmp.0.join("cases/sub")]);
    assert_eq!(code, EXIT_OK, "{out}");
}

#[test]
fn request_and_state_files_hold_one_valid_document() {
    let tmp = Tmp::new("explain");
    let two = tmp.file("two.yaml", "{ model: nope }\n---\n{ model: llama-70b }\n");
    let (code, out, err) = explain(&tmp, &two, None);
    assert_eq!(code, EXIT_USAGE, "{out}");
    assert!(
        err.starts_with("error: TMP/two.yaml:3:1: a request file holds one YAML document"),
        "{err}"
    );

    let req = tmp.file("req.yaml", "{ model: llama-70b }\n");
    let two_states = tmp.file(
        "two-states.yaml",
        "endpoints: {}\n---\nendpoints: { \"10.0.0.1:8000\": { ready: false } }\n",
    );
    let (code, _, err) = explain(&tmp, &req, Some(&two_states));
    assert_eq!(code, EXIT_USAGE);
    assert!(
        err.starts_with("error: TMP/two-states.yaml:3:1: a state file holds one YAML document"),
        "{err}"
    );

    // Values out of range, in the request and the state: every error of both files.
    let bad_req = tmp.file(
        "bad-req.yaml",
        "model: llama-70b\npromptTokens: -5\nqos: BATCH\n",
    );
    let bad_state = tmp.file(
        "bad-state.yaml",
        "endpoints:\n  \"10.0.0.1:8000\": { queuedPrompts: -100, kvCacheUsage: 7 }\nproviders:\n  bedrock: { ttftSeconds: -3 }\n",
    );
    let (code, out, err) = explain(&tmp, &bad_req, Some(&bad_state));
    assert_eq!(code, EXIT_USAGE, "{out}");
    insta::assert_snapshot!("request_and_state_errors", err);

    // An unknown endpoint is reported where it is written.
    let unknown = tmp.file(
        "unknown.yaml",
        "endpoints:\n  \"10.9.9.9:8000\": { ready: false }\n",
    );
    let (code, _, err) = explain(&tmp, &req, Some(&unknown));
    assert_eq!(code, EXIT_USAGE);
    assert!(
        err.starts_with("error: TMP/unknown.yaml:2:3: state: `10.9.9.9:8000` is not an endpoint"),
        "{err}"
    );

    // The edges of the ranges are accepted.
    let edges = tmp.file(
        "edges.yaml",
        "endpoints:\n  \"10.0.0.1:8000\": { queuedPrompts: 0, kvCacheUsage: 1.0, cachedPromptTokens: 4294967295 }\n  \"10.0.0.2:8000\":\nproviders:\n  bedrock: { ttftSeconds: 0 }\n",
    );
    let (code, _, err) = explain(&tmp, &req, Some(&edges));
    assert_eq!(code, EXIT_OK, "{err}");
}

#[test]
fn a_directory_without_policy_files_is_an_error() {
    let tmp = Tmp::new("lint");
    let empty = tmp.0.join("policies");
    std::fs::create_dir_all(empty.join("nested")).unwrap();
    tmp.file("policies/README.md", "not a policy\n");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::lint::run(
        std::slice::from_ref(&empty),
        false,
        Format::Human,
        &mut out,
        &mut err,
    );
    assert_eq!(code, EXIT_USAGE, "{}", tmp.clean(&out));
    assert_eq!(
        tmp.clean(&err),
        "error: no policy files found: `TMP/policies` holds no `*.yaml` or `*.yml` file (subdirectories included)\n  help: check the path\n"
    );
    // `explain` and `test` read bundles the same way: an empty bundle decides nothing.
    let req = tmp.file("req.yaml", "{ model: llama-70b }\n");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(&[empty], &req, None, Format::Json, &mut out, &mut err);
    assert_eq!(code, EXIT_USAGE);
}

#[test]
fn human_lint_columns_count_characters() {
    let text = "\
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: p, namespace: inference }
spec:
  rules:
  - name: \"ré🎉\"
    matches:
    - { tenant: \"日本語\", modl: nope }
";
    let mut sources = kinf_lang::Sources::new();
    sources.add("uni.yaml", text);
    let c = kinf_lang::compile(&sources);
    let d = c
        .diagnostics
        .iter()
        .find(|d| d.code == kinf_lang::Code::UnknownField)
        .expect("unknown field");
    let json = kinfctl::lint::diagnostic_json(d, &sources);
    assert_eq!(
        (json["line"].as_u64(), json["column"].as_u64()),
        (Some(8), Some(24))
    );
    let human = kinfctl::lint::render_human(d, &sources);
    assert!(human.contains("╭─[uni.yaml:8:24]"), "{human}");
    insta::assert_snapshot!("non_ascii_columns", human);
}
