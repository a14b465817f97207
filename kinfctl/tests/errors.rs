//! Every kind of error that stops a command, through the commands that produce it, in both
//! formats: with `--format json` it is JSON on stdout with the place (`file`, `line`, `column`)
//! the text names, nothing on stderr, and the same exit code; the JSON says what the text says,
//! field for field. The JSON is built from the error's fields, not read back from its text, so
//! a reworded message or a file name that looks like a place cannot move a place into the
//! message or out of it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Parser;
use kinfctl::cli::{Format, GraphFormat};
use kinfctl::report::ErrorKind;
use serde_json::Value;
use support::{Tmp, bundle};

type Command<'a> = Box<dyn Fn(Format, &mut dyn Write, &mut dyn Write) -> i32 + 'a>;

/// One way to stop a command.
struct Scenario<'a> {
    name: &'static str,
    kind: ErrorKind,
    /// `(file, line, column)` of the first error, the file relative to the temporary directory
    /// (`TMP/...`); `None` when it has no place.
    place: Option<(&'static str, u64, u64)>,
    run: Command<'a>,
}

/// The scenarios of each kind. The match has no catch-all: a new kind needs a scenario here.
fn names_of(kind: ErrorKind) -> &'static [&'static str] {
    match kind {
        ErrorKind::Read => &[
            "lint: missing path",
            "lint: no policy files",
            "explain: missing request file",
            "test: missing case file",
            "test: case directory without cases",
            "classify: missing file named like a place",
        ],
        ErrorKind::Input => &[
            "explain: request and state fields",
            "explain: duplicate key with a note",
            "explain: unknown endpoint in the state",
            "explain: request file named like a place",
            "test: case file fields",
            "test: unknown endpoint of a case",
            "test: case file without cases",
            "classify: request body without text",
            "classify: evaluation file",
        ],
        ErrorKind::Unknown => &[
            "graph: unknown pool",
            "explain-code: unknown code",
            "schema: unknown kind",
        ],
        ErrorKind::Usage => &["explain-code: no code", "classify: no input"],
        ErrorKind::Bundle => &["classify: bundle without GatewayBackend"],
        ErrorKind::Compile => &[
            "explain: bundle does not compile",
            "test: bundle does not compile",
            "graph: bundle does not compile",
            "classify: bundle does not compile",
        ],
    }
}

const BROKEN_POLICY: &str = "apiVersion: kinference.buoyant.io/v1alpha1\nkind: InferencePolicy\nmetadata: { name: p }\nspec: { rules: [], bogus: 1 }\n";
const GOOD_CASE: &str = "request: { model: llama-70b }\nexpect: { backendType: Local }\n";

fn scenarios(tmp: &Tmp) -> Vec<Scenario<'_>> {
    let req = tmp.file("req.yaml", "{ model: llama-70b }\n");
    let good_case = tmp.file("good-case.yaml", GOOD_CASE);
    let broken = tmp.file("broken/p.yaml", BROKEN_POLICY);
    std::fs::create_dir_all(tmp.path("empty/nested")).unwrap();
    tmp.file("empty/README.md", "not a policy\n");
    tmp.file("cases/sub/a.yaml", GOOD_CASE);
    let explain = move |request: PathBuf, state: Option<PathBuf>, paths: Vec<PathBuf>| -> Command {
        Box::new(move |f, out, err| {
            kinfctl::explain::run(&paths, &request, state.as_deref(), f, out, err)
        })
    };
    let test = |cases: PathBuf, paths: Vec<PathBuf>| -> Command {
        Box::new(move |f, out, err| {
            kinfctl::test_cmd::run(&paths, std::slice::from_ref(&cases), f, out, err)
        })
    };
    let graph = |paths: Vec<PathBuf>, pool: Option<&'static str>| -> Command {
        Box::new(move |f, out, err| {
            let f = match f {
                Format::Human => GraphFormat::Text,
                Format::Json => GraphFormat::Json,
            };
            kinfctl::graph::run(&paths, pool, f, out, err)
        })
    };
    let classify = |args: Vec<String>| -> Command {
        Box::new(move |f, out, err| {
            let mut argv = vec!["kinfctl".to_string(), "classify".to_string()];
            argv.extend(args.iter().cloned());
            argv.push("--format".into());
            argv.push(if f == Format::Json { "json" } else { "human" }.into());
            kinfctl::run(kinfctl::cli::Cli::try_parse_from(argv).unwrap(), out, err)
        })
    };
    let path = |p: &Path| p.display().to_string();
    vec![
        // Read.
        Scenario {
            name: "lint: missing path",
            kind: ErrorKind::Read,
            place: None,
            run: {
                let p = tmp.path("nope");
                Box::new(move |f, out, err| {
                    kinfctl::lint::run(std::slice::from_ref(&p), false, f, out, err)
                })
            },
        },
        Scenario {
            name: "lint: no policy files",
            kind: ErrorKind::Read,
            place: None,
            run: {
                let p = tmp.path("empty");
                Box::new(move |f, out, err| {
                    kinfctl::lint::run(std::slice::from_ref(&p), false, f, out, err)
                })
            },
        },
        Scenario {
            name: "explain: missing request file",
            kind: ErrorKind::Read,
            place: None,
            run: explain(tmp.path("missing.yaml"), None, vec![bundle()]),
        },
        Scenario {
            name: "test: missing case file",
            kind: ErrorKind::Read,
            place: None,
            run: test(tmp.path("missing.yaml"), vec![bundle()]),
        },
        Scenario {
            name: "test: case directory without cases",
            kind: ErrorKind::Read,
            place: None,
            run: test(tmp.path("cases"), vec![bundle()]),
        },
        Scenario {
            name: "classify: missing file named like a place",
            kind: ErrorKind::Read,
            place: None,
            run: classify(vec!["--file".into(), path(&tmp.path("a:1:2: b.json"))]),
        },
        // Input.
        Scenario {
            name: "explain: request and state fields",
            kind: ErrorKind::Input,
            place: Some(("TMP/bad-req.yaml", 2, 15)),
            run: explain(
                tmp.file("bad-req.yaml", "model: llama-70b\npromptTokens: -5\nqos: BATCH\n"),
                Some(tmp.file(
                    "bad-state.yaml",
                    "endpoints:\n  \"10.0.0.1:8000\": { queuedPrompts: -100, kvCacheUsage: 7 }\n",
                )),
                vec![bundle()],
            ),
        },
        Scenario {
            name: "explain: duplicate key with a note",
            kind: ErrorKind::Input,
            place: Some(("TMP/dup.yaml", 1, 13)),
            run: explain(
                tmp.file("dup.yaml", "{ model: m, model: n }\n"),
                None,
                vec![bundle()],
            ),
        },
        Scenario {
            name: "explain: unknown endpoint in the state",
            kind: ErrorKind::Input,
            place: Some(("TMP/ghost-state.yaml", 2, 3)),
            run: explain(
                req.clone(),
                Some(tmp.file(
                    "ghost-state.yaml",
                    "endpoints:\n  \"10.9.9.9:8000\": { ready: false }\n",
                )),
                vec![bundle()],
            ),
        },
        Scenario {
            name: "explain: request file named like a place",
            kind: ErrorKind::Input,
            place: Some(("TMP/r:1:2: x.yaml", 2, 15)),
            run: explain(
                tmp.file("r:1:2: x.yaml", "model: llama-70b\npromptTokens: -5\n"),
                None,
                vec![bundle()],
            ),
        },
        Scenario {
            name: "test: case file fields",
            kind: ErrorKind::Input,
            place: Some(("TMP/bad-case.yaml", 2, 3)),
            run: test(
                tmp.file(
                    "bad-case.yaml",
                    "cases:\n- name: a\n  request: { model: llama-70b }\n  expected: { rule: x }\n",
                ),
                vec![bundle()],
            ),
        },
        Scenario {
            name: "test: unknown endpoint of a case",
            kind: ErrorKind::Input,
            place: Some(("TMP/ghost-case.yaml", 5, 5)),
            run: test(
                tmp.file(
                    "ghost-case.yaml",
                    "name: ghost\nrequest: { model: llama-70b }\nstate:\n  endpoints:\n    \"10.9.9.9:8000\": { ready: false }\nexpect: { outcome: route }\n",
                ),
                vec![bundle()],
            ),
        },
        Scenario {
            name: "test: case file without cases",
            kind: ErrorKind::Input,
            place: Some(("TMP/blank.yaml", 1, 1)),
            run: test(tmp.file("blank.yaml", "# nothing yet\n"), vec![bundle()]),
        },
        Scenario {
            name: "classify: request body without text",
            kind: ErrorKind::Input,
            place: None,
            run: classify(vec![
                "--file".into(),
                path(&tmp.file("body.json", r#"{"model": "m"}"#)),
            ]),
        },
        Scenario {
            name: "classify: evaluation file",
            kind: ErrorKind::Input,
            place: None,
            run: classify(vec![
                "--eval".into(),
                path(&tmp.file("eval.jsonl", "not json\n")),
            ]),
        },
        // Unknown.
        Scenario {
            name: "graph: unknown pool",
            kind: ErrorKind::Unknown,
            place: None,
            run: graph(vec![bundle()], Some("nope")),
        },
        Scenario {
            name: "explain-code: unknown code",
            kind: ErrorKind::Unknown,
            place: None,
            run: Box::new(|f, out, err| {
                kinfctl::explain_code::run(Some("KINF9999"), false, f, out, err)
            }),
        },
        Scenario {
            name: "schema: unknown kind",
            kind: ErrorKind::Unknown,
            place: None,
            run: Box::new(|f, out, err| kinfctl::crds::run_schema("InferencePolcy", f, out, err)),
        },
        // Usage.
        Scenario {
            name: "explain-code: no code",
            kind: ErrorKind::Usage,
            place: None,
            run: Box::new(|f, out, err| kinfctl::explain_code::run(None, false, f, out, err)),
        },
        Scenario {
            name: "classify: no input",
            kind: ErrorKind::Usage,
            place: None,
            run: classify(Vec::new()),
        },
        // Bundle.
        Scenario {
            name: "classify: bundle without GatewayBackend",
            kind: ErrorKind::Bundle,
            place: None,
            run: classify(vec![
                "--text".into(),
                "x".into(),
                "--config".into(),
                path(&bundle()),
            ]),
        },
        // Compile.
        Scenario {
            name: "explain: bundle does not compile",
            kind: ErrorKind::Compile,
            place: Some(("TMP/broken/p.yaml", 4, 20)),
            run: explain(req.clone(), None, vec![broken.clone()]),
        },
        Scenario {
            name: "test: bundle does not compile",
            kind: ErrorKind::Compile,
            place: Some(("TMP/broken/p.yaml", 4, 20)),
            run: test(good_case, vec![broken.clone()]),
        },
        Scenario {
            name: "graph: bundle does not compile",
            kind: ErrorKind::Compile,
            place: Some(("TMP/broken/p.yaml", 4, 20)),
            run: graph(vec![broken.clone()], None),
        },
        Scenario {
            name: "classify: bundle does not compile",
            kind: ErrorKind::Compile,
            place: Some(("TMP/broken/p.yaml", 4, 20)),
            run: classify(vec![
                "--text".into(),
                "x".into(),
                "--config".into(),
                path(&tmp.path("broken")),
            ]),
        },
    ]
}

/// The text kinfctl writes for a diagnostic of `--format json` without a code, after `error: `,
/// with the place left out: what is left of the text once the place is taken from it.
fn text_without_place(d: &Value) -> String {
    let mut s = d["message"].as_str().unwrap().to_string();
    for n in d["related"].as_array().unwrap() {
        s.push_str("\n  note: ");
        if let Some(f) = n["file"].as_str() {
            s.push_str(&format!("{f}:{}:{}: ", n["line"], n["column"]));
        }
        s.push_str(n["message"].as_str().unwrap());
    }
    if let Some(h) = d["help"].as_str() {
        s.push_str(&format!("\n  help: {h}"));
    }
    s
}

/// The `error: ` blocks of stderr: each `error: ` line with the indented lines after it.
fn error_blocks(err: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in err.lines() {
        if let Some(rest) = line.strip_prefix("error: ") {
            blocks.push(rest.to_string());
        } else if line.starts_with("  ")
            && let Some(last) = blocks.last_mut()
        {
            last.push('\n');
            last.push_str(line);
        } else {
            panic!("not an error line: {line:?} in\n{err}");
        }
    }
    blocks
}

#[test]
fn every_error_kind_is_json_with_the_place_its_text_names() {
    let tmp = Tmp::new("errors", "kinds");
    let all = scenarios(&tmp);
    for &kind in ErrorKind::ALL {
        for name in names_of(kind) {
            let s = all.iter().find(|s| s.name == *name);
            assert!(s.is_some_and(|s| s.kind == kind), "no scenario `{name}`");
        }
    }
    for s in &all {
        let name = s.name;
        assert!(names_of(s.kind).contains(&name), "{name}: not listed");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = (s.run)(Format::Human, &mut out, &mut err);
        let (out, err) = (tmp.clean(&out), tmp.clean(&err));
        assert_eq!(code, s.kind.exit_code(), "{name}: {err}");
        assert!(out.is_empty(), "{name}: text on stdout: {out}");
        assert!(
            err.lines().any(|l| l.starts_with("error: ")),
            "{name}: {err}"
        );

        let (mut jout, mut jerr) = (Vec::new(), Vec::new());
        let jcode = (s.run)(Format::Json, &mut jout, &mut jerr);
        assert_eq!(jcode, code, "{name}: the exit code depends on the format");
        assert!(jerr.is_empty(), "{name}: stderr: {}", tmp.clean(&jerr));
        let text = tmp.clean(&jout);
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{name}: stdout is not JSON ({e}): {text}"));
        let diags = v["diagnostics"].as_array().unwrap();
        assert!(!diags.is_empty(), "{name}: {v}");
        assert!(v["summary"]["errors"].as_u64().unwrap() >= 1, "{name}: {v}");
        let first = &diags[0];
        let place = first["file"].as_str().map(|f| {
            (
                f,
                first["line"].as_u64().unwrap(),
                first["column"].as_u64().unwrap(),
            )
        });
        assert_eq!(place, s.place, "{name}: {first}");

        if s.kind == ErrorKind::Compile {
            // The compiler's own diagnostics, each with its code and place.
            for d in diags {
                assert!(d["code"].is_string(), "{name}: {d}");
                assert!(d["line"].is_u64(), "{name}: {d}");
            }
            continue;
        }
        // The JSON says what the text says: each diagnostic is one `error: ` block, its place
        // (when it has one) written in the block, and the rest of the block its message,
        // notes and help.
        let blocks = error_blocks(&err);
        assert_eq!(blocks.len(), diags.len(), "{name}: {err}\n{v}");
        for (block, d) in blocks.iter().zip(diags) {
            assert_eq!(d["code"], Value::Null, "{name}");
            assert_eq!(d["severity"], "error", "{name}");
            let block = match d["file"].as_str() {
                Some(f) => {
                    let at = format!("{f}:{}:{}: ", d["line"], d["column"]);
                    assert!(block.contains(&at), "{name}: `{at}` not in {block}");
                    block.replacen(&at, "", 1)
                }
                None => block.clone(),
            };
            assert_eq!(block, text_without_place(d), "{name}");
        }
    }
}

/// A file whose name looks like a place (`a:1:2: b.json`) is named in the message; it is not
/// taken for a place.
#[test]
fn a_file_name_that_looks_like_a_place_stays_in_the_message() {
    let tmp = Tmp::new("errors", "colon");
    let missing = tmp.path("a:1:2: b.json");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::classify::run(
        kinfctl::classify::Input::File(&missing),
        None,
        Format::Json,
        &mut out,
        &mut err,
    );
    assert_eq!(code, kinfctl::EXIT_USAGE);
    let v: Value = serde_json::from_str(&tmp.clean(&out)).unwrap();
    let d = &v["diagnostics"][0];
    assert_eq!(d["file"], Value::Null, "{d}");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .starts_with("cannot read `TMP/a:1:2: b.json`: "),
        "{d}"
    );
}

/// The endpoints and providers an unknown one is compared with are listed in sorted order,
/// whatever the order of the engine's maps.
#[test]
fn known_endpoints_and_providers_are_listed_in_order() {
    let tmp = Tmp::new("errors", "order");
    let req = tmp.file("req.yaml", "{ model: llama-70b }\n");
    let state = tmp.file("state.yaml", "providers:\n  nope: {}\n");
    for _ in 0..8 {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = kinfctl::explain::run(
            &[bundle()],
            &req,
            Some(&state),
            Format::Human,
            &mut out,
            &mut err,
        );
        assert_eq!(code, kinfctl::EXIT_USAGE);
        assert_eq!(
            tmp.clean(&err),
            "error: TMP/state.yaml:2:3: state: `nope` is not a provider (providers: inference/bedrock, inference/databricks)\n"
        );
    }
}

#[test]
fn a_misspelt_provider_in_a_state_gets_a_suggestion() {
    let tmp = Tmp::new("errors", "misspelt-provider");
    let req = tmp.file("req.yaml", "{ model: llama-70b }\n");
    let state = tmp.file("state.yaml", "providers:\n  bedrok: { ready: false }\n");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = kinfctl::explain::run(
        &[bundle()],
        &req,
        Some(&state),
        Format::Human,
        &mut out,
        &mut err,
    );
    assert_eq!(code, kinfctl::EXIT_USAGE);
    assert_eq!(
        tmp.clean(&err),
        "error: TMP/state.yaml:2:3: state: `bedrok` is not a provider (providers: inference/bedrock, inference/databricks)\n  help: did you mean `bedrock`?\n"
    );
}
