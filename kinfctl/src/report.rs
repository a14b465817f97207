//! Errors that stop a command (an unreadable file, an invalid request, state or case file, a
//! bundle that does not compile, an unknown pool or code): on stderr as `error: MESSAGE` lines,
//! or, with `--format json`, as one JSON document on stdout in the shape of
//! `kinfctl lint --format json` (`diagnostics` and `summary`), so that a caller reading stdout
//! always gets JSON. The exit code is the caller's either way.

use std::io::Write;

use kinf_lang::{Diagnostic, Sources};
use serde_json::{Value, json};

use crate::lint::diagnostic_json;

/// An error rendered as kinfctl writes it after `error: ` — `[FILE:LINE:COLUMN: ]MESSAGE`,
/// then any `  note: ...` and `  help: ...` lines — as a diagnostic of
/// `kinfctl lint --format json`: without a code, severity `error`, the place split into `file`,
/// `line` and `column` (null when the message has none), notes as `related`.
pub fn error_json(text: &str) -> Value {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or_default();
    let (place, message) = split_place(first);
    let mut message = message.to_string();
    let mut help: Option<String> = None;
    let mut related = Vec::new();
    for line in lines {
        if let Some(h) = line.strip_prefix("  help: ") {
            help = Some(match help {
                Some(before) => format!("{before}\n{h}"),
                None => h.to_string(),
            });
        } else if let Some(n) = line.strip_prefix("  note: ") {
            let (at, label) = split_place(n);
            related.push(json!({
                "file": at.as_ref().map(|p| p.0),
                "line": at.as_ref().map(|p| p.1),
                "column": at.as_ref().map(|p| p.2),
                "message": label,
            }));
        } else {
            message.push('\n');
            message.push_str(line);
        }
    }
    json!({
        "code": null,
        "severity": "error",
        "message": message,
        "file": place.as_ref().map(|p| p.0),
        "line": place.as_ref().map(|p| p.1),
        "column": place.as_ref().map(|p| p.2),
        "endLine": null,
        "endColumn": null,
        "label": null,
        "help": help,
        "path": null,
        "resource": null,
        "related": related,
    })
}

/// `FILE:LINE:COLUMN: REST` as the place and the rest; `(None, text)` when `text` does not
/// start with a place (LINE and COLUMN whole numbers, FILE not empty).
fn split_place(text: &str) -> (Option<(&str, u64, u64)>, &str) {
    for (i, _) in text.match_indices(": ") {
        let head = &text[..i];
        let mut parts = head.rsplitn(3, ':');
        if let (Some(column), Some(line), Some(file)) = (parts.next(), parts.next(), parts.next())
            && !file.is_empty()
            && let (Ok(line), Ok(column)) = (line.parse::<u64>(), column.parse::<u64>())
        {
            return (Some((file, line, column)), &text[i + 2..]);
        }
    }
    (None, text)
}

/// The JSON document of `diagnostics` (objects of [`diagnostic_json`] or [`error_json`]): the
/// list and a `summary` with the count of each severity.
pub fn document(diagnostics: Vec<Value>) -> Value {
    let count = |s: &str| {
        diagnostics
            .iter()
            .filter(|d| d["severity"].as_str() == Some(s))
            .count()
    };
    let (errors, warnings) = (count("error"), count("warning"));
    json!({
        "diagnostics": diagnostics,
        "summary": {"errors": errors, "warnings": warnings},
    })
}

/// Writes `doc` pretty-printed on `out`.
pub fn write_json(out: &mut dyn Write, doc: &Value) {
    let _ = writeln!(
        out,
        "{}",
        serde_json::to_string_pretty(doc).unwrap_or_default()
    );
}

/// Reports errors given as text (see [`error_json`]): with `json`, one [`document`] on `out`;
/// otherwise each as `error: TEXT` on `err`. Returns `code`.
pub fn errors<S: AsRef<str>>(
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
    texts: &[S],
    code: i32,
) -> i32 {
    if json {
        let diags = texts.iter().map(|t| error_json(t.as_ref())).collect();
        write_json(out, &document(diags));
    } else {
        for t in texts {
            let _ = writeln!(err, "error: {}", t.as_ref());
        }
    }
    code
}

/// Reports a bundle that does not compile: with `json`, its diagnostics (errors and warnings,
/// as `kinfctl lint --format json` gives them) in one [`document`] on `out`; otherwise each
/// diagnostic in plain text, then `error: CONCLUSION`, on `err`. Returns `code`.
pub fn compile_errors(
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
    sources: &Sources,
    diagnostics: &[Diagnostic],
    conclusion: &str,
    code: i32,
) -> i32 {
    if json {
        let diags = diagnostics
            .iter()
            .map(|d| diagnostic_json(d, sources))
            .collect();
        write_json(out, &document(diags));
    } else {
        for d in diagnostics {
            let _ = writeln!(err, "{}", d.render_plain(sources));
        }
        let _ = writeln!(err, "error: {conclusion}");
    }
    code
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn places_notes_and_help_are_split_out() {
        let v = error_json(
            "dir/c.yaml:5:3: unknown field `expected` in a case\n  note: dir/c.yaml:2:1: first here\n  help: did you mean `expect`?",
        );
        assert_eq!(v["file"], "dir/c.yaml");
        assert_eq!(
            (v["line"].as_u64(), v["column"].as_u64()),
            (Some(5), Some(3))
        );
        assert_eq!(v["message"], "unknown field `expected` in a case");
        assert_eq!(v["help"], "did you mean `expect`?");
        assert_eq!(v["related"][0]["line"], 2);
        assert_eq!(v["related"][0]["message"], "first here");
        assert_eq!(v["code"], Value::Null);
        assert_eq!(v["severity"], "error");
    }

    #[test]
    fn messages_without_a_place_keep_their_text() {
        for text in [
            "cannot read `a:1.yaml`: No such file or directory (os error 2)",
            "no pool `x`; pools: inference/llama-pool",
            "c.yaml: invalid file",
        ] {
            let v = error_json(text);
            assert_eq!(v["message"], text);
            assert_eq!(v["file"], Value::Null);
            assert_eq!(v["line"], Value::Null);
        }
    }
}
