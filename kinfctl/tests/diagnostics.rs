//! The diagnostics catalogue, end to end: one fixture per code in `testdata/diagnostics/`, its
//! rendering snapshotted, the seed bundles clean, `docs/diagnostics.md` in sync, every long
//! explanation written, and the JSON shape of `kinfctl lint --format json`.
//!
//! Accept changed snapshots with `cargo insta accept`, or run with `INSTA_UPDATE=always`.
//! Regenerate the docs with `cargo run -q -p kinfctl -- explain-code --all > docs/diagnostics.md`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use kinf_lang::{Code, Compilation, Severity, Sources};
use kinfctl::cli::Format;

/// The workspace root: fixtures are read from here, but named relative to it.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The fixture of a code, by its name relative to the workspace root.
fn fixture_name(code: Code) -> String {
    format!("testdata/diagnostics/{}.yaml", code.as_str())
}

/// Compiles files of the workspace, each named by its relative path.
fn compile(names: &[String]) -> (Sources, Compilation) {
    let mut sources = Sources::new();
    for name in names {
        let text = std::fs::read_to_string(root().join(name))
            .unwrap_or_else(|e| panic!("cannot read `{name}`: {e}"));
        sources.add(name.clone(), text);
    }
    let c = kinf_lang::compile(&sources);
    (sources, c)
}

/// Every diagnostic of a compilation, rendered for humans, then in the plain format.
fn render(sources: &Sources, c: &Compilation) -> String {
    let mut out = String::new();
    for d in &c.diagnostics {
        out.push_str(&kinfctl::lint::render_human(d, sources));
        out.push('\n');
    }
    out.push_str("---- plain ----\n");
    for d in &c.diagnostics {
        out.push_str(&d.render_plain(sources));
        out.push('\n');
    }
    out
}

#[test]
fn every_code_has_a_fixture_that_reports_it() {
    for &code in Code::ALL {
        let name = fixture_name(code);
        assert!(
            root().join(&name).is_file(),
            "{code}: missing fixture `{name}`"
        );
        let (sources, c) = compile(std::slice::from_ref(&name));
        assert!(
            !c.diagnostics.is_empty(),
            "{code}: `{name}` reports nothing"
        );
        // The fixture shows this code and nothing else, so its snapshot documents one problem.
        for d in &c.diagnostics {
            assert_eq!(
                d.code,
                code,
                "{code}: `{name}` also reports:\n{}",
                d.render_plain(&sources)
            );
            assert_eq!(d.severity, code.severity(), "{code}: wrong severity");
            let (span, _) = d
                .primary
                .as_ref()
                .unwrap_or_else(|| panic!("{code}: no span"));
            let (file, line, column) = sources.locate(*span).expect("span in a known file");
            assert_eq!(file, name);
            assert!(
                line >= 1 && column >= 1,
                "{code}: reported at {file}:{line}:{column}"
            );
            assert!(
                d.help.is_some(),
                "{code}: no help in:\n{}",
                d.render_plain(&sources)
            );
        }
        assert_eq!(
            c.policy.is_none(),
            code.severity() == Severity::Error,
            "{code}: applied?"
        );
        insta::assert_snapshot!(code.as_str(), render(&sources, &c));
    }
}

#[test]
fn errors_are_reported_together_in_source_order() {
    // Three unknown fields in two resources of one file: all reported, by position, and the
    // pool that refers to the broken worker set does not add a follow-up error.
    let (sources, c) = compile(&[fixture_name(Code::UnknownField)]);
    let places: Vec<(usize, usize)> = c
        .diagnostics
        .iter()
        .map(|d| {
            let (span, _) = d.primary.as_ref().expect("span");
            let (_, line, column) = sources.locate(*span).expect("located");
            (line, column)
        })
        .collect();
    assert_eq!(places.len(), 3, "{places:?}");
    assert!(places.windows(2).all(|w| w[0] < w[1]), "{places:?}");
    assert_eq!(c.errors(), 3);
}

#[test]
fn seed_bundles_lint_clean() {
    let dir = root().join("testdata/policies");
    let mut bundles: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("testdata/policies")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    bundles.sort();
    assert!(!bundles.is_empty());
    for bundle in bundles {
        let mut names: Vec<String> = std::fs::read_dir(&bundle)
            .expect("bundle")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .map(|p| {
                p.strip_prefix(root())
                    .expect("under root")
                    .display()
                    .to_string()
            })
            .collect();
        names.sort();
        let (sources, c) = compile(&names);
        let rendered: Vec<String> = c
            .diagnostics
            .iter()
            .map(|d| d.render_plain(&sources))
            .collect();
        assert!(
            rendered.is_empty(),
            "{}:\n{}",
            bundle.display(),
            rendered.join("\n")
        );
        assert!(c.policy.is_some());
    }
}

#[test]
fn docs_catalogue_is_in_sync() {
    let path = root().join("docs/diagnostics.md");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == kinfctl::explain_code::catalogue(),
        "docs/diagnostics.md is stale: run `cargo run -q -p kinfctl -- explain-code --all > docs/diagnostics.md`"
    );
}

#[test]
fn every_explanation_is_written_with_a_wrong_and_a_right_example() {
    for &code in Code::ALL {
        let text = code.explanation();
        assert_ne!(text.trim(), "TODO", "{code}: explanation not written");
        let mut in_code = false;
        for line in text.lines() {
            in_code ^= line.starts_with("```");
            assert!(
                in_code || !line.starts_with('#'),
                "{code}: no headings (the catalogue adds `## {code}`): {line}"
            );
        }
        for example in ["**Wrong**", "**Right**"] {
            let (_, after) = text
                .split_once(example)
                .unwrap_or_else(|| panic!("{code}: no {example} example"));
            assert!(
                after.trim_start().starts_with("```yaml\n"),
                "{code}: {example} is not followed by a ```yaml block"
            );
        }
        // Every YAML example parses, except for the YAML problem a wrong example shows.
        let mut wrong = false;
        for (i, chunk) in text.split("```yaml\n").enumerate() {
            if i > 0 {
                let yaml = chunk.split("```").next().unwrap_or_default();
                let mut sources = Sources::new();
                let id = sources.add(format!("{code} example {i}"), yaml);
                let mut diags = Vec::new();
                let file = sources.get(id).expect("file");
                kinf_lang::yaml::parse_documents(id, file, &mut diags);
                diags.retain(|d| !(wrong && d.code == code));
                let syntax: Vec<String> = diags.iter().map(|d| d.render_plain(&sources)).collect();
                assert!(
                    syntax.is_empty(),
                    "{code}: example {i} is not YAML:\n{}",
                    syntax.join("\n")
                );
            }
            // The marker closest before the next block says whether it is a wrong example.
            let prose = chunk.rsplit("```").next().unwrap_or_default();
            wrong = prose.rfind("**Wrong**") > prose.rfind("**Right**");
        }
    }
}

#[test]
fn lint_json_has_the_documented_shape() {
    let path = root().join(fixture_name(Code::UnknownModel));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let exit = kinfctl::lint::run(&[path], false, Format::Json, &mut out, &mut err);
    assert_eq!(
        exit,
        kinfctl::EXIT_FINDINGS,
        "stderr: {}",
        String::from_utf8_lossy(&err)
    );
    let v: serde_json::Value = serde_json::from_slice(&out).expect("one JSON document");

    let diags = v["diagnostics"]
        .as_array()
        .expect("`diagnostics` is a list");
    assert_eq!(diags.len(), 1);
    let d = &diags[0];
    assert_eq!(d["code"], "KINF0301");
    assert_eq!(d["severity"], "error");
    assert_eq!(
        d["message"],
        "no destination of the targeted pools serves model `llama-70B`"
    );
    assert!(
        d["file"]
            .as_str()
            .expect("file")
            .ends_with("testdata/diagnostics/KINF0301.yaml")
    );
    assert_eq!(d["line"], 24);
    assert_eq!(d["column"], 14);
    assert_eq!(d["endLine"], 24);
    assert_eq!(d["endColumn"], 23);
    assert_eq!(d["label"], "unknown model");
    assert_eq!(d["help"], "did you mean `llama-70b`?");
    assert_eq!(d["path"], "spec.rules[0].matches[0].model");
    assert_eq!(d["resource"], "InferencePolicy/default/llama-only");
    assert!(
        d["related"]
            .as_array()
            .expect("`related` is a list")
            .is_empty()
    );
    for key in [
        "code", "severity", "message", "file", "line", "column", "help",
    ] {
        assert!(d.get(key).is_some(), "missing `{key}`");
    }

    let summary = &v["summary"];
    assert_eq!(summary["errors"], 1);
    assert_eq!(summary["warnings"], 0);
}

#[test]
fn lint_json_lists_related_places() {
    let path = root().join(fixture_name(Code::DuplicateRuleName));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    kinfctl::lint::run(&[path], false, Format::Json, &mut out, &mut err);
    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
    let related = v["diagnostics"][0]["related"].as_array().expect("related");
    assert_eq!(related.len(), 1);
    assert_eq!(related[0]["line"], 22);
    assert_eq!(related[0]["message"], "first used here");
}

#[test]
fn when_errors_point_at_the_fault_in_block_and_escaped_scalars_and_name_their_resource() {
    // The same kind of fault written four ways: a folded block, a literal block, a
    // double-quoted string with escaped quotes, and (not followed: `\t` is another escape) a
    // double-quoted string with a tab escape, which labels the whole value.
    let text = r#"apiVersion: kinference.buoyant.io/v1alpha1
kind: InferenceWorkerSet
metadata: { name: w }
spec:
  endpoints: ["10.0.0.1:8000"]
  models:
  - name: m
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: { name: p }
spec:
  destinations:
  - { kind: InferenceWorkerSet, name: w }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: { name: positions }
spec:
  rules:
  - name: folded
    matches:
    - when: >
        promptTokens > 8000 &&
        promptTokens >> 3
  - name: literal
    matches:
    - when: |
        tenant == "a"
          && promptToken > 3
  - name: escaped
    matches:
    - when: "tenant == \"a\" && promptTokens >< 3"
  - name: tab
    matches:
    - when: "tenant == \"a\t\" &&& true"
"#;
    let mut sources = Sources::new();
    sources.add("positions.yaml", text);
    let c = kinf_lang::compile(&sources);
    let places: Vec<(usize, usize, &str)> = c
        .diagnostics
        .iter()
        .map(|d| {
            let (span, _) = d.primary.as_ref().expect("span");
            let (_, line, column) = sources.locate(*span).expect("located");
            let end = sources
                .get(span.file)
                .map(|f| &f.text[span.start..span.end])
                .unwrap_or_default();
            assert_eq!(
                d.resource.as_deref(),
                Some("InferencePolicy/default/positions"),
                "{}",
                d.render_plain(&sources)
            );
            (line, column, end)
        })
        .collect();
    assert_eq!(
        places,
        vec![
            (25, 23, ">"),
            (30, 14, "promptToken"),
            (33, 47, "<"),
            (36, 13, r#""tenant == \"a\t\" &&& true""#),
        ],
        "{}",
        render(&sources, &c)
    );
    insta::assert_snapshot!(render(&sources, &c));
}

#[test]
fn a_when_expression_that_ends_early_or_is_empty_is_located() {
    let text = std::fs::read_to_string(root().join(fixture_name(Code::ExprSyntax)))
        .unwrap()
        .replace(
            "    - when: 4000 < promptTokens < 8000",
            "    - when: 'promptTokens > 8000 &&'\n    - when: ''\n    - when: promptTokens >",
        );
    let mut sources = Sources::new();
    sources.add("ends.yaml", text);
    let c = kinf_lang::compile(&sources);
    let places: Vec<(usize, usize)> = c
        .diagnostics
        .iter()
        .map(|d| {
            let (span, _) = d
                .primary
                .as_ref()
                .unwrap_or_else(|| panic!("no place: {}", d.render_plain(&sources)));
            let (_, line, column) = sources.locate(*span).expect("located");
            (line, column)
        })
        .collect();
    // Just past the last operator, at the empty value's quotes, at the end of a plain scalar.
    assert_eq!(places, vec![(24, 36), (25, 13), (26, 27)]);
}
