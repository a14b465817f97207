//! The CRD chart (`deploy/helm/kinference-crds/templates/`) holds exactly what `kinfctl crds`
//! prints: one file per CRD, in kind order. `KINF_UPDATE_CRDS=1` rewrites the files.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::PathBuf;

use kinfctl::cli::Format;

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/kinference-crds/templates")
}

#[test]
fn chart_crds_are_identical_to_kinfctl_crds() {
    let text = kinfctl::crds::crds_text(Format::Human);
    let docs: Vec<&str> = text.split("---\n").filter(|d| !d.is_empty()).collect();
    assert_eq!(docs.len(), 5);
    let mut concatenated = String::new();
    for (doc, kind) in docs.iter().zip(kinf_policy::ResourceKind::ALL) {
        let crd = kinf_policy::schema::crd(kind);
        let file = chart_dir().join(format!("{}.yaml", crd.spec.names.plural));
        let want = format!("---\n{doc}");
        if std::env::var_os("KINF_UPDATE_CRDS").is_some() {
            std::fs::write(&file, &want).unwrap();
        }
        let have = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (run with KINF_UPDATE_CRDS=1)", file.display()));
        assert!(
            have == want,
            "{} differs from `kinfctl crds`; regenerate with KINF_UPDATE_CRDS=1 cargo test -p kinfctl --test crds_chart",
            file.display()
        );
        concatenated.push_str(&have);
    }
    assert_eq!(
        concatenated, text,
        "the chart holds every CRD and nothing else"
    );
    let files = std::fs::read_dir(chart_dir()).unwrap().count();
    assert_eq!(files, 5, "no stray templates in the CRD chart");
}

#[test]
fn no_field_is_nullable_so_that_the_api_server_prunes_explicit_nulls() {
    // With `nullable: true` the API server stores `field: null` on create and the compiler
    // refuses it; without, the null is pruned and the field is absent, as on update.
    let text = kinfctl::crds::crds_text(Format::Json);
    let crds: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut optional_fields = 0;
    fn walk(v: &serde_json::Value, optional: &mut usize) {
        match v {
            serde_json::Value::Object(m) => {
                assert!(!m.contains_key("nullable"), "nullable in {v}");
                if let (Some(serde_json::Value::Object(props)), req) =
                    (m.get("properties"), m.get("required"))
                {
                    let required = req.and_then(|r| r.as_array()).map_or(0, Vec::len);
                    *optional += props.len().saturating_sub(required);
                }
                m.values().for_each(|c| walk(c, optional));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|c| walk(c, optional)),
            _ => {}
        }
    }
    walk(&crds, &mut optional_fields);
    assert!(optional_fields > 100, "{optional_fields} optional fields");
}

#[test]
fn selector_operators_are_an_enum_so_the_api_server_refuses_a_misspelt_one() {
    // `operator: in` would be stored and select nothing; with the enum the API server refuses
    // it at `kubectl apply`, as it does for a pod's selector.
    let crd = serde_json::to_value(kinf_policy::schema::crd(
        kinf_policy::ResourceKind::InferenceWorkerSet,
    ))
    .unwrap();
    let op = crd
        .pointer(
            "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/selector\
             /properties/matchExpressions/items/properties/operator",
        )
        .unwrap_or_else(|| panic!("no operator in {crd}"));
    assert_eq!(
        op["enum"],
        serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
    );
    assert_eq!(op["type"], "string");
}
