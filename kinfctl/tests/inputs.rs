//! The input files of `kinfctl explain` and `kinfctl test` (request, state and case files) and
//! the paths of `lint` and `--cases`: nothing is lost or silently accepted, every error names the
//! field, what it allows and its `FILE:LINE:COLUMN`, and empty inputs fail.
//!
//! Accept changed snapshots with `cargo insta accept`, or run with `INSTA_UPDATE=always`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod support;

use std::path::{Path, PathBuf};

use kinfctl::cli::Format;
use kinfctl::{EXIT_FINDINGS, EXIT_OK, EXIT_USAGE};
use support::{Tmp, bundle};

/// `kinfctl test BUNDLE --cases ...`: exit code, stdout, stderr.
fn test_cmd(tmp: &Tmp, cases: &[PathBuf]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(&[bundle()], cases, Format::Human, &mut out, &mut err);
    (code, tmp.clean(&out), tmp.clean(&err))
}

/// `kinfctl explain BUNDLE --request R [--state S]` (human output: errors on stderr): exit
/// code, stdout, stderr.
fn explain(tmp: &Tmp, request: &Path, state: Option<&Path>) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[bundle()],
        request,
        state,
        Format::Human,
        &mut out,
        &mut err,
    );
    (code, tmp.clean(&out), tmp.clean(&err))
}

const LOCAL: &str = "request: { model: llama-70b }\nexpect: { backendType: Local }\n";
const WRONG: &str = "request: { model: llama-70b }\nexpect: { backendType: Provider }\n";

#[test]
fn every_document_of_a_case_file_runs() {
    let tmp = Tmp::new("inputs", "documents");
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
    let tmp = Tmp::new("inputs", "stray");
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
    let errors: Vec<String> = kinfctl::test_cmd::parse_cases("cases.yaml", text)
        .expect_err("invalid")
        .iter()
        .map(ToString::to_string)
        .collect();
    let errors = errors.join("\n");
    insta::assert_snapshot!("case_file_errors", errors);
}

/// Expected values no decision can have (a misspelt `outcome` or `backendType`, a status that is
/// no HTTP status) and two cases of one name are errors before anything runs: the first would
/// fail forever, the second makes reports ambiguous.
#[test]
fn impossible_expectations_and_repeated_names_are_errors() {
    let text = "\
cases:
- name: misspelt outcome
  request: { model: llama-70b }
  expect: { outcome: rout }
- name: lower-case backend
  request: { model: llama-70b }
  expect: { backendType: local, status: 5030 }
- name: twice
  request: { model: llama-70b }
  expect: { outcome: reject, backendType: null, status: 503 }
- name: twice
  request: { model: llama-70b }
  expect: { outcome: route, backendType: Provider }
";
    let errors: Vec<String> = kinfctl::test_cmd::parse_cases("cases.yaml", text)
        .expect_err("invalid")
        .iter()
        .map(ToString::to_string)
        .collect();
    insta::assert_snapshot!("impossible_expectations", errors.join("\n"));
    // The same values, spelt as decisions spell them, are accepted.
    let fixed = text
        .replace("rout }", "route }")
        .replace("local, status: 5030", "Local, status: 404")
        .replacen("name: twice", "name: once", 1);
    assert!(kinfctl::test_cmd::parse_cases("cases.yaml", &fixed).is_ok());
}

/// A case whose state names what the policy does not have is reported with every other such
/// case, before any case's result: no `ok`/`FAIL` lines and a summary that counted half the
/// cases.
#[test]
fn states_that_do_not_fit_the_policy_are_all_reported_before_any_result() {
    let tmp = Tmp::new("inputs", "state-misfits");
    let f = tmp.file(
        "cases.yaml",
        &format!(
            "name: fine\n{LOCAL}---\nname: endpoint\nrequest: {{ model: llama-70b }}\nstate: {{ endpoints: {{ \"10.9.9.9:8000\": {{ queuedPrompts: 6 }} }} }}\nexpect: {{ outcome: route }}\n---\nname: provider\nrequest: {{ model: llama-70b }}\nstate: {{ providers: {{ nope: {{ ready: false }} }} }}\nexpect: {{ outcome: route }}\n"
        ),
    );
    let (code, out, err) = test_cmd(&tmp, &[f]);
    assert_eq!(code, EXIT_USAGE, "{out}\n{err}");
    assert_eq!(out, "", "no result before the errors are fixed");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 2, "{err}");
    assert!(
        errors[0].contains("TMP/cases.yaml:7:23:") && errors[0].contains("10.9.9.9:8000"),
        "{err}"
    );
    assert!(
        errors[1].contains("TMP/cases.yaml:12:23:") && errors[1].contains("`nope`"),
        "{err}"
    );
}

#[test]
fn empty_case_inputs_fail() {
    let tmp = Tmp::new("inputs", "empty");
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
    let tmp = Tmp::new("inputs", "explain");
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
    let tmp = Tmp::new("inputs", "lint");
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

/// The JSON document a command wrote on stdout; stderr must be empty.
fn json_only(tmp: &Tmp, out: &[u8], err: &[u8]) -> serde_json::Value {
    assert!(err.is_empty(), "stderr: {}", tmp.clean(err));
    let text = tmp.clean(out);
    let v = serde_json::from_str(&text);
    assert!(v.is_ok(), "stdout is not JSON: {text}");
    v.unwrap()
}

/// `kinfctl test --format json`: exit code and the JSON on stdout.
fn test_json(tmp: &Tmp, paths: &[PathBuf], cases: &[PathBuf]) -> (i32, serde_json::Value) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(paths, cases, Format::Json, &mut out, &mut err);
    (code, json_only(tmp, &out, &err))
}

#[test]
fn test_json_reports_file_errors_as_json_on_stdout() {
    let tmp = Tmp::new("inputs", "test-json");
    // A case file with two errors: each is a diagnostic with its place and help.
    let bad = tmp.file(
        "bad.yaml",
        "cases:\n- name: a\n  request: { model: llama-70b }\n  expected: { rule: x }\n",
    );
    let (code, v) = test_json(&tmp, &[bundle()], &[bad]);
    assert_eq!(code, EXIT_USAGE);
    assert_eq!(
        v["summary"],
        serde_json::json!({"errors": 2, "warnings": 0})
    );
    let d = &v["diagnostics"][0];
    assert_eq!(d["severity"], "error");
    assert_eq!(d["code"], serde_json::Value::Null);
    assert_eq!(d["file"], "TMP/bad.yaml");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(d["message"], "the case has no `expect`");
    assert!(
        d["help"].as_str().unwrap().starts_with("add `expect:`"),
        "{d}"
    );
    let d = &v["diagnostics"][1];
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(4), Some(3))
    );
    assert_eq!(d["message"], "unknown field `expected` in a case");
    assert_eq!(d["help"], "did you mean `expect`?");

    // A YAML syntax error of a case file.
    let broken = tmp.file("broken.yaml", "cases: [\n");
    let (code, v) = test_json(&tmp, &[bundle()], &[broken]);
    assert_eq!(code, EXIT_USAGE);
    assert_eq!(v["diagnostics"][0]["file"], "TMP/broken.yaml");
    assert!(v["diagnostics"][0]["line"].is_u64(), "{v}");

    // A case file that cannot be read: no place, the message names it.
    let (code, v) = test_json(&tmp, &[bundle()], &[tmp.0.join("missing.yaml")]);
    assert_eq!(code, EXIT_USAGE);
    assert_eq!(
        v["diagnostics"][0]["message"],
        "cannot read `TMP/missing.yaml`: no such file or directory"
    );
    assert_eq!(v["diagnostics"][0]["file"], serde_json::Value::Null);

    // A policy directory without policies.
    std::fs::create_dir_all(tmp.0.join("empty")).unwrap();
    let good = tmp.file("good.yaml", LOCAL);
    let (code, v) = test_json(&tmp, &[tmp.0.join("empty")], std::slice::from_ref(&good));
    assert_eq!(code, EXIT_USAGE);
    assert!(
        v["diagnostics"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("no policy files found: `TMP/empty`"),
        "{v}"
    );

    // Policies that do not compile: their diagnostics, with codes, as `lint` gives them; exit 1.
    let policy = tmp.file(
        "policies/p.yaml",
        "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec: { rules: [], bogus: 1 }\n",
    );
    let (code, v) = test_json(&tmp, &[policy], &[good]);
    assert_eq!(code, EXIT_FINDINGS);
    let diags = v["diagnostics"].as_array().unwrap();
    assert!(
        diags
            .iter()
            .any(|d| d["code"] == "KINF0101" && d["file"] == "TMP/policies/p.yaml"),
        "{v}"
    );
    assert!(v["summary"]["errors"].as_u64().unwrap() >= 1, "{v}");

    // A case whose state names an unknown endpoint: the place in the case file, the case named.
    let unknown = tmp.file(
        "unknown-endpoint.yaml",
        "name: ghost\nrequest: { model: llama-70b }\nstate:\n  endpoints:\n    \"10.9.9.9:8000\": { ready: false }\nexpect: { outcome: route }\n",
    );
    let (code, v) = test_json(&tmp, &[bundle()], &[unknown]);
    assert_eq!(code, EXIT_USAGE);
    let d = &v["diagnostics"][0];
    assert_eq!(d["file"], "TMP/unknown-endpoint.yaml");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(5), Some(5))
    );
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .starts_with("ghost: state: `10.9.9.9:8000` is not an endpoint"),
        "{d}"
    );

    // Human output is unchanged: text on stderr, nothing on stdout.
    let (code, out, err) = test_cmd(&tmp, &[tmp.0.join("missing.yaml")]);
    assert_eq!(code, EXIT_USAGE);
    assert!(out.is_empty(), "{out}");
    assert_eq!(
        err,
        "error: cannot read `TMP/missing.yaml`: no such file or directory\n"
    );
}

#[test]
fn other_json_commands_report_errors_as_json_on_stdout() {
    let tmp = Tmp::new("inputs", "json-errors");
    // explain: every error of the request and the state file.
    let bad_req = tmp.file("bad-req.yaml", "model: llama-70b\npromptTokens: -5\n");
    let bad_state = tmp.file("bad-state.yaml", "endpoints: [1]\n");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[bundle()],
        &bad_req,
        Some(&bad_state),
        Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    let files: Vec<&str> = v["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["TMP/bad-req.yaml", "TMP/bad-state.yaml"], "{v}");
    assert_eq!(v["diagnostics"][0]["line"], 2);

    // lint: a path that does not exist (the summary keeps lint's `files`).
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::lint::run(
        &[tmp.0.join("nope")],
        false,
        Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    assert_eq!(
        v["summary"],
        serde_json::json!({"errors": 1, "warnings": 0, "files": 0})
    );
    assert!(
        v["diagnostics"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read `TMP/nope`"),
        "{v}"
    );

    // graph: an unknown pool.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::graph::run(
        &[bundle()],
        Some("nope"),
        kinfctl::cli::GraphFormat::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    assert!(
        v["diagnostics"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("no pool `nope`"),
        "{v}"
    );

    // explain-code and schema: a typo, with its suggestion as `help`.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code =
        kinfctl::explain_code::run(Some("KINF9999"), false, Format::Json, &mut out, &mut err);
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    assert_eq!(
        v["diagnostics"][0]["message"],
        "unknown diagnostic code `KINF9999`"
    );
    assert!(v["diagnostics"][0]["help"].is_string(), "{v}");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::crds::run_schema("InferencePolcy", Format::Json, &mut out, &mut err);
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    assert_eq!(
        v["diagnostics"][0]["help"],
        "did you mean `InferencePolicy`?"
    );

    // classify: an unreadable file.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let missing = tmp.0.join("missing.json");
    let code = kinfctl::classify::run(
        kinfctl::classify::Input::File(&missing),
        None,
        Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, EXIT_USAGE);
    let v = json_only(&tmp, &out, &err);
    assert!(
        v["diagnostics"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read `TMP/missing.json`"),
        "{v}"
    );
}
