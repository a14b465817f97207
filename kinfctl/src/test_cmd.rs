//! `kinfctl test`: golden decision tests.

use std::io::Write;
use std::path::{Path, PathBuf};

use kinf_lang::yaml::{Node, Value};

use crate::cli::Format;
use crate::explain::{decide_files, decision_json, load_policy, tag_warnings};
use crate::input::{Errors, Input};
use crate::report::{self, Error, ErrorKind};
use crate::scenario::{RequestFile, StateFile};
use crate::{EXIT_FINDINGS, EXIT_OK};

/// One case: a request, a state, and the expected fields of `kinfctl explain --format json`.
#[derive(Clone, Debug)]
pub struct Case {
    /// Name shown in reports (default: the file name and index).
    pub name: Option<String>,
    /// What the case shows, for readers.
    pub description: Option<String>,
    /// The request.
    pub request: RequestFile,
    /// The state (default: everything ready, idle and cold).
    pub state: StateFile,
    /// Expected fields: any of [`COMPARABLE`].
    pub expect: serde_json::Map<String, serde_json::Value>,
}

/// The fields of a case.
pub const CASE_FIELDS: &[&str] = &["name", "description", "request", "state", "expect"];

/// The fields `expect` may hold.
pub const COMPARABLE: &[&str] = &[
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

const CASE_FILE_HELP: &str = "each YAML document of a case file (documents are separated by \
    `---`) holds one case (`request`, `expect`, and optionally `name`, `description`, `state`) \
    or `cases:` with a list of cases";

/// The case files named by `--cases`: files as given, and the `*.yaml` / `*.yml` files directly
/// inside each directory. A directory without any is an error.
fn case_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Error> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut entries = Vec::new();
            let mut subdirs = Vec::new();
            for e in std::fs::read_dir(p).map_err(|e| Error::cannot_read(p, e))? {
                let Ok(e) = e else { continue };
                let path = e.path();
                if path.is_dir() {
                    subdirs.push(path);
                } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                    entries.push(path);
                }
            }
            if entries.is_empty() {
                subdirs.sort();
                let help = match subdirs.first() {
                    Some(d) => format!(
                        "case directories are not read recursively: name `{}` with another `--cases`",
                        d.display()
                    ),
                    None => "check the path, or put case files in it".to_string(),
                };
                return Err(Error::read(format!(
                    "no test cases found: `{}` holds no case file (`*.yaml`, `*.yml`)",
                    p.display()
                ))
                .with_help(help));
            }
            entries.sort();
            out.extend(entries);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(Error::cannot_read(p, "no such file or directory"));
        }
    }
    Ok(out)
}

/// Reads a case file: every YAML document, each one case or `cases:` with a list of them.
/// Cases are named `FILE#N` (N counts from 1 through the file) unless they have a `name`.
pub fn parse_cases(name: &str, text: &str) -> Result<Vec<(String, Case)>, Errors> {
    let (mut input, docs) = Input::parse(name, text)?;
    let mut cases = Vec::new();
    let mut names = std::collections::HashSet::new();
    let mut ok = true;
    for doc in &docs {
        let root = &doc.root;
        let list = match &root.value {
            Value::Map(entries) if entries.iter().any(|e| e.key == "cases") => {
                for e in entries.iter().filter(|e| e.key != "cases") {
                    let message = format!(
                        "`{}` cannot be next to `cases`: a document holds one case, \
                         or `cases:` and nothing else",
                        e.key
                    );
                    let help = "move it into a case of the list, \
                                or put the case in a document of its own after `---`";
                    input.error(e.key_span, message, Some(help.to_string()));
                    ok = false;
                }
                let Some(items_node) = root.get("cases") else {
                    continue;
                };
                match &items_node.value {
                    Value::Seq(items) if items.is_empty() => {
                        input.error(
                            items_node.span,
                            "`cases` is an empty list",
                            Some("add cases to it, or delete the file".to_string()),
                        );
                        ok = false;
                        continue;
                    }
                    Value::Seq(items) => items.iter().collect(),
                    _ => {
                        let found = input.found(items_node);
                        input.error(
                            items_node.span,
                            format!("`cases` must be a list of cases, not {found}"),
                            Some(CASE_FILE_HELP.to_string()),
                        );
                        ok = false;
                        continue;
                    }
                }
            }
            Value::Map(_) => vec![root],
            Value::Seq(_) => {
                input.error(
                    root.span,
                    "a case file document must be a mapping, not a list",
                    Some("put the list under `cases:`".to_string()),
                );
                ok = false;
                continue;
            }
            _ => {
                let found = input.found(root);
                input.error(
                    root.span,
                    format!("a case file document must be a mapping, not {found}"),
                    Some(CASE_FILE_HELP.to_string()),
                );
                ok = false;
                continue;
            }
        };
        for node in list {
            match case(&mut input, node) {
                Some(c) if c.name.as_ref().is_some_and(|n| names.contains(n)) => {
                    let name = c.name.unwrap_or_default();
                    let span = node.get("name").map_or(node.span, |n| n.span);
                    input.error(
                        span,
                        format!("two cases are named `{name}`: reports could not tell them apart"),
                        Some("give each case of the file a name of its own".to_string()),
                    );
                    ok = false;
                    cases.push((String::new(), empty_case()));
                }
                Some(c) => {
                    names.extend(c.name.clone());
                    let n = cases.len() + 1;
                    let label = c.name.clone().unwrap_or_else(|| format!("{name}#{n}"));
                    cases.push((label, c));
                }
                None => {
                    ok = false;
                    // Keep the numbering of the cases that follow.
                    cases.push((String::new(), empty_case()));
                }
            }
        }
    }
    if ok && cases.is_empty() {
        let start = input.start();
        input.error_last(
            start,
            "no test cases found: the file holds no case",
            Some(CASE_FILE_HELP.to_string()),
        );
    }
    input.finish(ok.then_some(cases))
}

fn empty_case() -> Case {
    Case {
        name: None,
        description: None,
        request: RequestFile::default(),
        state: StateFile::default(),
        expect: serde_json::Map::new(),
    }
}

/// One case; errors are recorded in `input`.
fn case(input: &mut Input, node: &Node) -> Option<Case> {
    let entries = input.mapping(node, "a case", CASE_FIELDS)?;
    let mut ok = entries
        .iter()
        .all(|e| CASE_FIELDS.contains(&e.key.as_str()));
    let mut c = empty_case();
    match input.required(
        entries,
        "request",
        node.span,
        "the case",
        "add `request: { model: NAME }`",
    ) {
        Some(n) => match RequestFile::from_node(input, n) {
            Some(r) => c.request = r,
            None => ok = false,
        },
        None => ok = false,
    }
    match input.required(
        entries,
        "expect",
        node.span,
        "the case",
        "add `expect:` with the fields to check, e.g. `{ outcome: route, destination: NAME }`",
    ) {
        Some(n) => match expect(input, n) {
            Some(e) => c.expect = e,
            None => ok = false,
        },
        None => ok = false,
    }
    for e in entries {
        let n = &e.value;
        let good = match e.key.as_str() {
            "name" => input.non_empty(n, "`name`").map(|v| c.name = Some(v)),
            "description" if matches!(n.value, Value::Null) => Some(()),
            "description" => input
                .string(n, "`description`")
                .map(|v| c.description = Some(v)),
            "state" => StateFile::from_node(input, n).map(|v| c.state = v),
            _ => Some(()),
        };
        ok &= good.is_some();
    }
    ok.then_some(c)
}

/// `expect`: a non-empty mapping of [`COMPARABLE`] fields to scalars.
fn expect(input: &mut Input, node: &Node) -> Option<serde_json::Map<String, serde_json::Value>> {
    let entries = input.mapping(node, "`expect`", COMPARABLE)?;
    let mut ok = entries.iter().all(|e| COMPARABLE.contains(&e.key.as_str()));
    if entries.is_empty() {
        input.error(
            node.span,
            "`expect` is empty: the case would check nothing and always pass",
            Some(format!(
                "expect at least one of {}",
                COMPARABLE
                    .iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        );
        return None;
    }
    let mut out = serde_json::Map::new();
    for e in entries {
        if matches!(e.value.value, Value::Seq(_) | Value::Map(_)) {
            let found = input.found(&e.value);
            input.error(
                e.value.span,
                format!(
                    "`expect.{}` must be a single value (or `null`), not {found}",
                    e.key
                ),
                None,
            );
            ok = false;
            continue;
        }
        let value = e.value.to_json();
        if let Some(allowed) = allowed_values(&e.key)
            && let Some(v) = value.as_str()
            && !allowed.contains(&v)
        {
            input.error(
                e.value.span,
                format!(
                    "`expect.{}` is `{v}`, which no decision has: the case could never pass",
                    e.key
                ),
                Some(kinf_lang::suggest::help_for(
                    v,
                    allowed.iter().copied(),
                    "values",
                )),
            );
            ok = false;
            continue;
        }
        if e.key == "status"
            && !matches!(value, serde_json::Value::Null)
            && !value.as_u64().is_some_and(|s| (100..=599).contains(&s))
        {
            input.error(
                e.value.span,
                format!("`expect.status` must be an HTTP status code (100 to 599), not `{value}`"),
                Some("a rejected decision's status, e.g. `503`, `404` or `429`".to_string()),
            );
            ok = false;
            continue;
        }
        out.insert(e.key.to_string(), value);
    }
    ok.then_some(out)
}

/// The values `kinfctl explain` can give field `key`, when they are a closed set.
fn allowed_values(key: &str) -> Option<&'static [&'static str]> {
    match key {
        "outcome" => Some(&["route", "reject"]),
        "backendType" => Some(&["Local", "Provider"]),
        _ => None,
    }
}

fn load_cases(path: &Path) -> Result<Vec<(String, Case)>, Errors> {
    let text = std::fs::read_to_string(path).map_err(|e| vec![Error::cannot_read(path, e)])?;
    parse_cases(&path.display().to_string(), &text)
}

/// `kinfctl test`.
pub fn run(
    paths: &[PathBuf],
    cases: &[PathBuf],
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let json = format == Format::Json;
    let policy = match load_policy(paths, format, out, err) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let files = match case_files(cases) {
        Ok(f) => f,
        Err(e) => return report::error(json, out, err, e),
    };
    // Every case file is read before any case runs, and all their errors are reported.
    let mut all = Vec::new();
    let mut errors = Vec::new();
    for f in &files {
        match load_cases(f) {
            Ok(l) => all.extend(l),
            Err(e) => errors.extend(e),
        }
    }
    if !errors.is_empty() {
        return report::errors(json, out, err, &errors);
    }
    if all.is_empty() {
        // `case_files` refuses empty directories and `parse_cases` empty files; no `--cases`
        // at all is refused by the command line.
        let e = Error::new(ErrorKind::Read, "no test cases found");
        return report::error(json, out, err, e);
    }
    // Every case is decided before any result is shown: a case whose request or state does not
    // fit the policy (an endpoint no worker set has, say) is an error like those of the case
    // files, reported with the others and before any `ok`/`FAIL` line.
    let mut decided = Vec::with_capacity(all.len());
    for (name, case) in all {
        match decide_files(&policy, &case.request, &case.state) {
            Ok(d) => decided.push((name, case, decision_json(&d))),
            // The place of `e` (in the case file) stays a place; the case is named before it.
            Err(e) => errors.push(e.about(name)),
        }
    }
    if !errors.is_empty() {
        return report::errors(json, out, err, &errors);
    }
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut results = Vec::new();
    for (name, case, got) in decided {
        let warnings = tag_warnings(&policy, &case.request);
        if format == Format::Human {
            for w in &warnings {
                let _ = writeln!(err, "warning: {name}: {w}");
            }
        }
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
            "name": name, "passed": mismatches.is_empty(), "warnings": warnings,
            "mismatches": mismatches.iter().map(|(k, w, h)| serde_json::json!({"field": k, "expected": w, "actual": h})).collect::<Vec<_>>(),
        }));
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
