//! `kinfctl crds`, `schema`, `graph` and usage errors.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};

use kinfctl::cli::{Format, GraphFormat};

fn run_crds(format: Format) -> String {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(kinfctl::crds::run_crds(format, &mut out, &mut err), 0);
    String::from_utf8(out).unwrap()
}

#[test]
fn crds_yaml_round_trips_to_the_generated_manifests() {
    let yaml = run_crds(Format::Human);
    let mut sources = kinf_lang::Sources::new();
    let id = sources.add("crds.yaml", yaml);
    let mut diags = Vec::new();
    let docs = kinf_lang::yaml::parse_documents(id, sources.get(id).unwrap(), &mut diags);
    assert!(diags.is_empty(), "{diags:?}");
    assert_eq!(docs.len(), 5);
    for (doc, kind) in docs.iter().zip(kinf_policy::ResourceKind::ALL) {
        let expected = serde_json::to_value(kinf_policy::schema::crd(kind)).unwrap();
        assert_eq!(doc.root.to_json(), expected, "{kind}");
        assert_eq!(
            doc.root
                .get("spec")
                .and_then(|s| s.get("group"))
                .and_then(|g| g.as_str()),
            Some("kinference.buoyant.io")
        );
    }
    let json: serde_json::Value = serde_json::from_str(&run_crds(Format::Json)).unwrap();
    assert_eq!(json.as_array().map(Vec::len), Some(5));
}

#[test]
fn crds_have_status_subresource_and_printer_columns() {
    for kind in kinf_policy::ResourceKind::ALL {
        let crd = serde_json::to_value(kinf_policy::schema::crd(kind)).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert!(version["subresources"]["status"].is_object(), "{kind}");
        let cols = version["additionalPrinterColumns"].as_array().unwrap();
        assert!(cols.iter().any(|c| c["name"] == "Age"), "{kind}");
    }
}

#[test]
fn schema_of_a_kind_and_a_typo() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::crds::run_schema("InferencePolicy", Format::Json, &mut out, &mut err),
        0
    );
    let schema: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(schema["properties"]["spec"]["properties"]["rules"].is_object());
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::crds::run_schema("InferencePolcy", Format::Human, &mut out, &mut err),
        2
    );
    assert!(String::from_utf8_lossy(&err).contains("did you mean `InferencePolicy`?"));
    assert!(out.is_empty());
}

#[test]
fn graph_dot_and_pool_filter_and_missing_path() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = root.join("testdata/policies/burst-to-cloud");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::graph::run(
            std::slice::from_ref(&dir),
            Some("llama-pool"),
            GraphFormat::Dot,
            &mut out,
            &mut err
        ),
        0
    );
    let dot = String::from_utf8(out).unwrap();
    assert!(dot.starts_with("digraph \"inference/llama-pool\""), "{dot}");
    assert!(dot.contains("exclude drop-overloaded-workers"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::graph::run(
            std::slice::from_ref(&dir),
            Some("nope"),
            GraphFormat::Text,
            &mut out,
            &mut err
        ),
        2
    );
    assert!(String::from_utf8_lossy(&err).contains("inference/llama-pool"));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::lint::run(
            &[PathBuf::from("/nonexistent/policies")],
            false,
            Format::Human,
            &mut out,
            &mut err
        ),
        2
    );
    assert!(String::from_utf8_lossy(&err).contains("/nonexistent/policies"));
}

#[test]
fn deny_warnings_turns_warnings_into_exit_1() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let f = root.join("testdata/diagnostics/KINF0503.yaml");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::lint::run(
            std::slice::from_ref(&f),
            false,
            Format::Json,
            &mut out,
            &mut err
        ),
        0
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::lint::run(
            std::slice::from_ref(&f),
            true,
            Format::Json,
            &mut out,
            &mut err
        ),
        1
    );
}

/// `spec.maxTokensField` of an InferenceProvider: the two OpenAI field names pass lint; anything
/// else is KINF0103 at the field, naming it, with the closest value as help.
#[test]
fn provider_max_tokens_field_is_checked_by_lint() {
    let provider = |value: &str| {
        format!(
            "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferenceProvider\nmetadata: {{ name: openai }}\nspec:\n  type: OpenAI\n  url: https://api.openai.com\n  maxTokensField: {value}\n  models:\n  - {{ name: gpt, providerModel: gpt-5 }}\n"
        )
    };
    let compile = |text: String| {
        let mut sources = kinf_lang::Sources::new();
        sources.add("p.yaml", text);
        let c = kinf_lang::compile(&sources);
        let json: Vec<serde_json::Value> = c
            .diagnostics
            .iter()
            .map(|d| kinfctl::lint::diagnostic_json(d, &sources))
            .collect();
        json
    };
    for good in ["max_tokens", "max_completion_tokens"] {
        let diags = compile(provider(good));
        assert!(diags.is_empty(), "{good}: {diags:?}");
    }
    let diags = compile(provider("max_completion_token"));
    assert_eq!(diags.len(), 1, "{diags:?}");
    let d = &diags[0];
    assert_eq!(d["code"], "KINF0103");
    assert_eq!(d["severity"], "error");
    assert_eq!(d["path"], "spec.maxTokensField");
    assert_eq!(
        d["message"],
        "unknown value `max_completion_token` for `maxTokensField`"
    );
    assert_eq!(d["help"], "did you mean `max_completion_tokens`?");
    assert_eq!(
        (d["line"].as_u64(), d["column"].as_u64()),
        (Some(7), Some(19))
    );
}

/// `explain-code --all --format json` is JSON (every code, as `explain-code CODE --format json`
/// gives it), not the Markdown catalogue.
#[test]
fn explain_code_all_as_json() {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::explain_code::run(None, true, Format::Json, &mut out, &mut err),
        0
    );
    assert!(err.is_empty());
    let all: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let all = all.as_array().unwrap();
    assert_eq!(all.len(), kinf_lang::Code::ALL.len());
    for (v, c) in all.iter().zip(kinf_lang::Code::ALL) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        assert_eq!(
            kinfctl::explain_code::run(Some(c.as_str()), false, Format::Json, &mut out, &mut err),
            0
        );
        let one: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v, &one, "{c}");
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(
        kinfctl::explain_code::run(None, true, Format::Human, &mut out, &mut err),
        0
    );
    assert_eq!(
        String::from_utf8(out).unwrap(),
        kinfctl::explain_code::catalogue()
    );
}
