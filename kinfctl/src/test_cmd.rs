//! `kinfctl test`: golden decision tests.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cli::Format;
use crate::explain::{decide_files, decision_json, load_policy};
use crate::scenario::{RequestFile, StateFile, parse_yaml};
use crate::{EXIT_FINDINGS, EXIT_OK, EXIT_USAGE};

/// One case: a request, a state, and the expected fields of `kinfctl explain --format json`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Case {
    /// Name shown in reports (default: the file name and index).
    #[serde(default)]
    pub name: Option<String>,
    /// What the case shows, for readers.
    #[serde(default)]
    pub description: Option<String>,
    /// The request.
    pub request: RequestFile,
    /// The state (default: everything ready, idle and cold).
    #[serde(default)]
    pub state: StateFile,
    /// Expected fields: any of `outcome`, `backendType`, `endpoint`, `destination`, `model`,
    /// `policy`, `rule`, `status`, `code`, `rewriteModel`.
    pub expect: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum CaseFile {
    Many { cases: Vec<Case> },
    One(Box<Case>),
}

const COMPARABLE: &[&str] = &[
    "outcome",
    "backendType",
    "endpoint",
    "destination",
    "model",
    "policy",
    "rule",
    "status",
    "code",
    "rewriteModel",
];

fn case_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("cannot read `{}`: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
                .collect();
            entries.sort();
            out.extend(entries);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(format!(
                "cannot read `{}`: no such file or directory",
                p.display()
            ));
        }
    }
    Ok(out)
}

fn load_cases(path: &Path) -> Result<Vec<(String, Case)>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let file: CaseFile = parse_yaml(&path.display().to_string(), &text)?;
    let cases = match file {
        CaseFile::Many { cases } => cases,
        CaseFile::One(c) => vec![*c],
    };
    for c in &cases {
        if let Some(k) = c.expect.keys().find(|k| !COMPARABLE.contains(&k.as_str())) {
            return Err(format!(
                "{}: unknown `expect` field `{k}` (allowed: {})",
                path.display(),
                COMPARABLE.join(", ")
            ));
        }
    }
    Ok(cases
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            (
                c.name
                    .clone()
                    .unwrap_or_else(|| format!("{}#{}", path.display(), i + 1)),
                c,
            )
        })
        .collect())
}

/// `kinfctl test`.
pub fn run(
    paths: &[PathBuf],
    cases: &[PathBuf],
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let policy = match load_policy(paths, err) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let files = match case_files(cases) {
        Ok(f) => f,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_USAGE;
        }
    };
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut results = Vec::new();
    for f in files {
        let list = match load_cases(&f) {
            Ok(l) => l,
            Err(e) => {
                let _ = writeln!(err, "error: {e}");
                return EXIT_USAGE;
            }
        };
        for (name, case) in list {
            let got = match decide_files(&policy, &case.request, &case.state) {
                Ok(d) => decision_json(&d),
                Err(e) => {
                    let _ = writeln!(err, "error: {name}: {e}");
                    return EXIT_USAGE;
                }
            };
            let mismatches: Vec<(String, serde_json::Value, serde_json::Value)> = case
                .expect
                .iter()
                .filter(|(k, v)| got.get(k.as_str()) != Some(v))
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.clone(),
                        got.get(k.as_str()).cloned().unwrap_or_default(),
                    )
                })
                .collect();
            if mismatches.is_empty() {
                passed += 1;
                if format == Format::Human {
                    let _ = writeln!(out, "ok   {name}");
                }
            } else {
                failed += 1;
                if format == Format::Human {
                    let _ = writeln!(out, "FAIL {name}");
                    for (k, want, have) in &mismatches {
                        let _ = writeln!(out, "  {k}:\n  - expected: {want}\n  + actual:   {have}");
                    }
                    if let Some(s) = got.get("stages") {
                        let _ = writeln!(out, "  trace: {s}");
                    }
                }
            }
            results.push(serde_json::json!({
                "name": name, "passed": mismatches.is_empty(),
                "mismatches": mismatches.iter().map(|(k, w, h)| serde_json::json!({"field": k, "expected": w, "actual": h})).collect::<Vec<_>>(),
            }));
        }
    }
    match format {
        Format::Json => {
            let v = serde_json::json!({"cases": results, "summary": {"passed": passed, "failed": failed}});
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
        }
        Format::Human => {
            let _ = writeln!(out, "{passed} passed, {failed} failed");
        }
    }
    if failed > 0 { EXIT_FINDINGS } else { EXIT_OK }
}
