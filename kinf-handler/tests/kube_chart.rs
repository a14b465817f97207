//! Static checks of the Helm charts (no `helm` binary on these machines, so templates are not
//! rendered): the plain YAML files parse; CRD templates are the five CRDs; every template has
//! balanced actions and blocks, includes only defined templates and reads only values that
//! `values.yaml` defines; RBAC names exactly the CRD plurals and their `/status`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn helm_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm")
}

fn parse_yaml(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut sources = kinf_lang::Sources::new();
    let id = sources.add(path.display().to_string(), text);
    let mut diags = Vec::new();
    let docs = kinf_lang::yaml::parse_documents(id, sources.get(id).unwrap(), &mut diags);
    assert!(diags.is_empty(), "{}: {diags:?}", path.display());
    docs.iter().map(|d| d.root.to_json()).collect()
}

#[test]
fn crd_chart_templates_are_the_five_crds() {
    let dir = helm_dir().join("kinference-crds");
    let chart = parse_yaml(&dir.join("Chart.yaml"));
    assert_eq!(chart[0]["name"], "kinference-crds");
    let mut names = BTreeSet::new();
    for kind in kinf_policy::ResourceKind::ALL {
        let crd = kinf_policy::schema::crd(kind);
        let docs = parse_yaml(&dir.join(format!("templates/{}.yaml", crd.spec.names.plural)));
        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0], serde_json::to_value(&crd).unwrap(), "{kind}");
        assert_eq!(docs[0]["kind"], "CustomResourceDefinition");
        names.insert(docs[0]["metadata"]["name"].as_str().unwrap().to_owned());
    }
    assert_eq!(names.len(), 5);
}

fn values_paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let Value::Object(m) = v {
        for (k, child) in m {
            let p = format!("{prefix}.{k}");
            out.insert(p.clone());
            values_paths(child, &p, out);
        }
    }
}

#[test]
fn app_chart_templates_are_well_formed_and_read_defined_values() {
    let dir = helm_dir().join("kinference");
    let chart = parse_yaml(&dir.join("Chart.yaml"));
    assert_eq!(chart[0]["name"], "kinference");
    let values = parse_yaml(&dir.join("values.yaml"));
    let mut defined = BTreeSet::new();
    values_paths(&values[0], ".Values", &mut defined);
    let helpers = std::fs::read_to_string(dir.join("templates/_helpers.tpl")).unwrap();
    let defines: BTreeSet<String> = helpers
        .split("define \"")
        .skip(1)
        .map(|s| s.split('"').next().unwrap().to_owned())
        .collect();
    let mut kinds = BTreeSet::new();
    for entry in std::fs::read_dir(dir.join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // Balanced actions, and blocks closed by `end`.
        let mut depth: i32 = 0;
        let mut rest = text.as_str();
        while let Some(start) = rest.find("{{") {
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .unwrap_or_else(|| panic!("{name}: unclosed action"));
            let action = after[..end].trim_matches(|c: char| c == '-' || c.is_whitespace());
            let word = action.split_whitespace().next().unwrap_or("");
            match word {
                "if" | "with" | "range" | "define" => depth += 1,
                "end" => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0, "{name}: `end` without a block");
            for tok in action.split(|c: char| c.is_whitespace() || c == '(' || c == ')') {
                if let Some(v) = tok.strip_prefix(".Values.") {
                    let p = format!(".Values.{v}");
                    assert!(defined.contains(&p), "{name}: `{p}` is not in values.yaml");
                }
            }
            if let Some(i) = action
                .strip_prefix("include \"")
                .or(action.strip_prefix("include \""))
            {
                let tpl = i.split('"').next().unwrap();
                assert!(
                    defines.contains(tpl),
                    "{name}: include of undefined `{tpl}`"
                );
            }
            for part in action.split("include \"").skip(1) {
                let tpl = part.split('"').next().unwrap();
                assert!(
                    defines.contains(tpl),
                    "{name}: include of undefined `{tpl}`"
                );
            }
            rest = &after[end + 2..];
        }
        assert_eq!(depth, 0, "{name}: unclosed block");
        for line in text.lines() {
            if let Some(k) = line.strip_prefix("kind: ") {
                kinds.insert(k.trim().to_owned());
            }
        }
        if name == "rbac.yaml" {
            for kind in kinf_policy::ResourceKind::ALL {
                let plural = kinf_policy::schema::crd(kind).spec.names.plural;
                assert!(text.contains(&format!("- {plural}\n")), "rbac: {plural}");
                assert!(
                    text.contains(&format!("- {plural}/status\n")),
                    "rbac: {plural}/status"
                );
            }
            assert!(!text.contains("\"*\""), "rbac: no wildcards");
            // The ClusterRole and its binding are cluster-scoped: their names carry the
            // release's namespace, so that releases in two namespaces do not collide.
            assert!(
                text.contains("$roleName := ternary (printf \"%s-%s\" .Release.Namespace $name) $name .Values.watch.allNamespaces"),
                "rbac: cluster-scoped names must include the release namespace"
            );
            // The last good policy: only the ConfigMap named after the Lease.
            assert!(
                text.contains(
                    "resourceNames: [{{ printf \"%s-last-good\" .Values.lease.name | quote }}]"
                ),
                "rbac: the last-good ConfigMap by name"
            );
            let uses = text.matches("name: {{ $roleName }}").count();
            assert_eq!(
                uses, 3,
                "rbac: the role, its binding and the binding's roleRef"
            );
        }
    }
    for k in [
        "Deployment",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Role",
        "RoleBinding",
    ] {
        assert!(kinds.contains(k), "the chart has a {k}: {kinds:?}");
    }
}

/// Every value of the app chart has a row in `docs/reference/helm-values.md` (a value whose
/// own entries are not listed, such as `resources`, is one row), and every row names a value.
#[test]
fn every_chart_value_is_documented_in_helm_values_md() {
    let values = parse_yaml(&helm_dir().join("kinference/values.yaml"));
    let mut defined = BTreeSet::new();
    values_paths(&values[0], "", &mut defined);
    let defined: BTreeSet<String> = defined
        .into_iter()
        .map(|p| p.trim_start_matches('.').to_owned())
        .collect();
    let doc =
        std::fs::read_to_string(helm_dir().join("../../docs/reference/helm-values.md")).unwrap();
    let rows: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |"))
        .map(|(key, _)| key.to_owned())
        .collect();
    for row in &rows {
        assert!(
            defined.contains(row),
            "helm-values.md documents `{row}`, which values.yaml does not define"
        );
    }
    // A value is covered by its own row or by a row of a value that contains it.
    for path in &defined {
        let covered =
            rows.contains(path) || rows.iter().any(|r| path.starts_with(&format!("{r}.")));
        // A mapping whose every entry has a row of its own needs none.
        let parent_of_rows = rows.iter().any(|r| r.starts_with(&format!("{path}.")));
        assert!(
            covered || parent_of_rows,
            "values.yaml defines `{path}`, which helm-values.md does not document"
        );
    }
}
