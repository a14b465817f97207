//! A scenario's request `tags` are checked against the tags the classifiers in front of its
//! pool produce: one no classifier produces (a misspelling, usually) is warned about, since no
//! real request carries it. And a `prompt` is classified as the gateway would, by the default
//! classifiers when the bundle has no GatewayBackend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use kinfctl::cli::Format;
use support::{Tmp, root};

fn explain(policies: &str, request: &str, format: Format) -> (i32, String, String) {
    let tmp = Tmp::new("request-tags", &format!("{policies}-{format:?}"));
    let req = tmp.file("req.yaml", request);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[root().join("testdata/policies").join(policies)],
        &req,
        None,
        format,
        &mut out,
        &mut err,
    );
    (
        code,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn a_tag_no_classifier_produces_is_warned_about_with_the_closest_one() {
    let req = "model: llama-70b\ntags: [pii-detect, complexity-high]\n";
    let (code, _, err) = explain("pii-stays-local", req, Format::Human);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        err,
        "warning: request tag `pii-detect` is produced by no classifier in front of pool \
         `inference/llama-pool`: the gateway never sets it, so no real request carries it; did \
         you mean `pii-detected`?\n\
         warning: request tag `complexity-high` is produced by no classifier in front of pool \
         `inference/llama-pool`: the gateway never sets it, so no real request carries it; tags \
         produced: `over-limit`, `pii-credential`, `pii-credit-card`, `pii-detected`, `pii-email`, \
         `pii-iban`, `pii-ip-address`, `pii-phone`, `pii-ssn`\n"
    );
    let (code, out, err) = explain("pii-stays-local", req, Format::Json);
    assert_eq!((code, err.as_str()), (0, ""));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let warnings = v["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 2, "{v}");
    assert!(warnings[0].as_str().unwrap().contains("`pii-detect`"));
    // Tags that are produced: no warning.
    let (_, out, err) = explain(
        "pii-stays-local",
        "model: llama-70b\ntags: [pii-detected, pii-email, over-limit]\n",
        Format::Json,
    );
    assert_eq!(err, "");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
}

#[test]
fn without_a_gateway_backend_the_prompt_is_classified_by_the_default_classifiers() {
    let (code, out, err) = explain(
        "model-aliases",
        "model: standard-model\nprompt: 'My SSN is 123-45-6789, call me at jane@example.com.'\n\
         tags: [pii-ssn]\n",
        Format::Json,
    );
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let tags: Vec<&str> = v["promptTags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    for t in ["pii-detected", "pii-ssn", "pii-email"] {
        assert!(tags.contains(&t), "{t} in {tags:?}");
    }
    // The default classifiers produce `pii-ssn`: no warning.
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
}

#[test]
fn test_cases_with_unproduced_tags_are_warned_about() {
    let tmp = Tmp::new("request-tags", "test-cmd");
    let cases = tmp.file(
        "cases.yaml",
        "cases:\n- name: misspelt\n  request: { model: llama-70b, tags: [pii-detcted] }\n  expect: { outcome: route }\n",
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::test_cmd::run(
        &[root().join("testdata/policies/pii-stays-local")],
        std::slice::from_ref(&cases),
        Format::Human,
        &mut out,
        &mut err,
    );
    let err = String::from_utf8(err).unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(
        err.starts_with(
            "warning: misspelt: request tag `pii-detcted` is produced by no classifier"
        ) && err.contains("did you mean `pii-detected`?"),
        "{err}"
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    kinfctl::test_cmd::run(
        &[root().join("testdata/policies/pii-stays-local")],
        &[cases],
        Format::Json,
        &mut out,
        &mut err,
    );
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["cases"][0]["warnings"].as_array().unwrap().len(),
        1,
        "{v}"
    );
}
