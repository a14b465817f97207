//! Errors that stop a command (an unreadable file, an invalid request, state or case file, a
//! bundle that does not compile, an unknown pool or code).
//!
//! Each error is an [`Error`] from the point it is found: its [`ErrorKind`], its [`Place`] (when
//! it has one), message, notes and help are kept apart, never written into one text and read
//! back. It is rendered either as text on stderr (`error: [FILE:LINE:COLUMN: ]MESSAGE`, then
//! `  note:` and `  help:` lines) or, with `--format json`, as a diagnostic of one JSON document
//! on stdout in the shape of `kinfctl lint --format json` (`diagnostics` and `summary`), so that a
//! caller reading stdout always gets JSON. The exit code follows from the kind either way.

use std::fmt;
use std::io::Write;

use kinf_lang::{Diagnostic, Sources};
use serde_json::{Value, json};

use crate::lint::diagnostic_json;
use crate::{EXIT_FINDINGS, EXIT_USAGE};

/// What went wrong, which decides the exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A file or directory that cannot be read, or that holds nothing to read (no policy file,
    /// no case file).
    Read,
    /// An input file that is not valid: the YAML or a field of a request, state or case file
    /// (an unknown endpoint or provider of a state included), or a `classify` request body or
    /// evaluation file.
    Input,
    /// A name given on the command line that is not known: a pool, a diagnostic code, a kind.
    Unknown,
    /// Something the command line lacks: a diagnostic code, a `classify` input.
    Usage,
    /// A bundle that compiles but cannot serve the command (no GatewayBackend for `classify
    /// --config`).
    Bundle,
    /// A bundle that does not compile.
    Compile,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: &'static [ErrorKind] = &[
        ErrorKind::Read,
        ErrorKind::Input,
        ErrorKind::Unknown,
        ErrorKind::Usage,
        ErrorKind::Bundle,
        ErrorKind::Compile,
    ];

    /// The exit code of a command stopped by an error of this kind: 1 for a bundle that does not
    /// compile, 2 for the others.
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Compile => EXIT_FINDINGS,
            ErrorKind::Read
            | ErrorKind::Input
            | ErrorKind::Unknown
            | ErrorKind::Usage
            | ErrorKind::Bundle => EXIT_USAGE,
        }
    }
}

/// A place in a file: line and column from 1, the column counted in characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// The file's name, as given.
    pub file: String,
    /// Line, from 1.
    pub line: usize,
    /// Column, from 1, in characters.
    pub column: usize,
}

impl Place {
    /// The place of a byte offset in `sources` (`None` when the span is not in them).
    pub fn of(sources: &Sources, span: kinf_lang::Span) -> Option<Place> {
        let (file, line, column) = sources.locate(span)?;
        Some(Place {
            file: file.to_string(),
            line,
            column,
        })
    }
}

impl fmt::Display for Place {
    /// `FILE:LINE:COLUMN`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Another place that explains an error (the first of two duplicate keys).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Where; `None` when it has no place (the message then names the file).
    pub place: Option<Place>,
    /// What is there.
    pub message: String,
}

/// An error that stops a command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Where, when it is at a place in a file; `None` for errors about a whole file (the message
    /// then names it) or about no file. (Boxed: errors travel in `Result`s.)
    pub place: Option<Box<Place>>,
    /// What the error is about, when that is not the file it is in: the name of a test case.
    /// Text writes it before the place, JSON at the start of the message.
    pub subject: Option<String>,
    /// The message, one line, without the place.
    pub message: String,
    /// Other places that explain it.
    pub notes: Vec<Note>,
    /// A suggestion.
    pub help: Option<String>,
}

impl Error {
    /// An error without a place, notes or help.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            place: None,
            subject: None,
            message: message.into(),
            notes: Vec::new(),
            help: None,
        }
    }

    /// An error of [`ErrorKind::Read`].
    pub fn read(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::Read, message)
    }

    /// `cannot read `PATH`: CAUSE`, of [`ErrorKind::Read`].
    pub fn cannot_read(path: &std::path::Path, cause: impl fmt::Display) -> Self {
        Error::read(format!("cannot read `{}`: {cause}", path.display()))
    }

    /// The same error at `place`.
    pub fn at(mut self, place: Option<Place>) -> Self {
        self.place = place.map(Box::new);
        self
    }

    /// The same error with a help line.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// The same error about `subject` (a test case).
    pub fn about(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The error as a diagnostic of `kinfctl lint --format json`: without a code, severity
    /// `error`, the place as `file`, `line` and `column` (null without one), notes as `related`.
    pub fn to_json(&self) -> Value {
        let message = match &self.subject {
            Some(s) => format!("{s}: {}", self.message),
            None => self.message.clone(),
        };
        let place = self.place.as_deref();
        let related: Vec<Value> = self
            .notes
            .iter()
            .map(|n| {
                let at = n.place.as_ref();
                json!({
                    "file": at.map(|p| p.file.as_str()),
                    "line": at.map(|p| p.line),
                    "column": at.map(|p| p.column),
                    "message": n.message,
                })
            })
            .collect();
        json!({
            "code": null,
            "severity": "error",
            "message": message,
            "file": place.map(|p| p.file.as_str()),
            "line": place.map(|p| p.line),
            "column": place.map(|p| p.column),
            "endLine": null,
            "endColumn": null,
            "label": null,
            "help": self.help,
            "path": null,
            "resource": null,
            "related": related,
        })
    }
}

impl fmt::Display for Error {
    /// The text written after `error: `: `[SUBJECT: ][FILE:LINE:COLUMN: ]MESSAGE`, then a
    /// `  note: [FILE:LINE:COLUMN: ]MESSAGE` line for each note and a `  help: HELP` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.subject {
            write!(f, "{s}: ")?;
        }
        if let Some(p) = &self.place {
            write!(f, "{p}: ")?;
        }
        f.write_str(&self.message)?;
        for n in &self.notes {
            f.write_str("\n  note: ")?;
            if let Some(p) = &n.place {
                write!(f, "{p}: ")?;
            }
            f.write_str(&n.message)?;
        }
        if let Some(h) = &self.help {
            write!(f, "\n  help: {h}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// The exit code of errors: the highest of their kinds' (2 when there are none).
pub fn exit_code(errors: &[Error]) -> i32 {
    errors
        .iter()
        .map(|e| e.kind.exit_code())
        .max()
        .unwrap_or(EXIT_USAGE)
}

/// The JSON document of `diagnostics` (objects of [`diagnostic_json`] or [`Error::to_json`]):
/// the list and a `summary` with the count of each severity.
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

/// Reports errors: with `json`, one [`document`] on `out`; otherwise each as `error: TEXT` on
/// `err` (see [`Error`]'s `Display`). Returns their [`exit_code`].
pub fn errors(json: bool, out: &mut dyn Write, err: &mut dyn Write, errors: &[Error]) -> i32 {
    if json {
        let diags = errors.iter().map(Error::to_json).collect();
        write_json(out, &document(diags));
    } else {
        for e in errors {
            let _ = writeln!(err, "error: {e}");
        }
    }
    exit_code(errors)
}

/// Reports one error as [`errors`] does.
pub fn error(json: bool, out: &mut dyn Write, err: &mut dyn Write, error: Error) -> i32 {
    errors(json, out, err, std::slice::from_ref(&error))
}

/// Reports a bundle that does not compile: with `json`, its diagnostics (errors and warnings,
/// as `kinfctl lint --format json` gives them) in one [`document`] on `out`; otherwise each
/// diagnostic in plain text, then `error: CONCLUSION`, on `err`. Returns the exit code of
/// [`ErrorKind::Compile`].
pub fn compile_errors(
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
    sources: &Sources,
    diagnostics: &[Diagnostic],
    conclusion: &str,
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
    ErrorKind::Compile.exit_code()
}

/// The error of a bundle that does not compile, with `errors` errors, when its diagnostics are
/// not shown: it sends to `kinfctl lint` for them.
pub fn not_compiled(errors: usize) -> Error {
    Error::new(
        ErrorKind::Compile,
        format!("the bundle has {errors} error(s); run `kinfctl lint` to see them"),
    )
}

/// Reports a bundle that does not compile in brief: with `json`, its diagnostics as
/// [`compile_errors`] gives them; otherwise only `error` (see [`not_compiled`]) on `err`.
/// Returns the exit code of `error`.
pub fn compile_errors_brief(
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
    sources: &Sources,
    diagnostics: &[Diagnostic],
    error: Error,
) -> i32 {
    if json {
        let diags = diagnostics
            .iter()
            .map(|d| diagnostic_json(d, sources))
            .collect();
        write_json(out, &document(diags));
        error.kind.exit_code()
    } else {
        self::error(false, out, err, error)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn place(file: &str, line: usize, column: usize) -> Option<Place> {
        Some(Place {
            file: file.to_string(),
            line,
            column,
        })
    }

    #[test]
    fn places_notes_and_help_render_as_text_and_as_json() {
        let mut e = Error::new(ErrorKind::Input, "unknown field `expected` in a case")
            .at(place("dir/c.yaml", 5, 3))
            .with_help("did you mean `expect`?");
        e.notes.push(Note {
            place: place("dir/c.yaml", 2, 1),
            message: "first here".into(),
        });
        assert_eq!(
            e.to_string(),
            "dir/c.yaml:5:3: unknown field `expected` in a case\n  note: dir/c.yaml:2:1: first here\n  help: did you mean `expect`?"
        );
        let v = e.to_json();
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

    /// What used to be read back from the text: a message that looks as if it started with a
    /// place is a message; a subject goes before the place in text and into the message in JSON.
    #[test]
    fn the_json_comes_from_the_fields_not_the_text() {
        for text in [
            "cannot read `a:1:2: b.yaml`: No such file or directory (os error 2)",
            "x.yaml:3:4: looks placed",
            "c.yaml: invalid file",
        ] {
            let v = Error::read(text).to_json();
            assert_eq!(v["message"], text);
            assert_eq!(v["file"], Value::Null);
            assert_eq!(v["line"], Value::Null);
        }
        let e = Error::new(ErrorKind::Input, "state: `x` is not an endpoint")
            .at(place("c: 1.yaml", 5, 5))
            .about("ghost");
        assert_eq!(
            e.to_string(),
            "ghost: c: 1.yaml:5:5: state: `x` is not an endpoint"
        );
        let v = e.to_json();
        assert_eq!(v["message"], "ghost: state: `x` is not an endpoint");
        assert_eq!(v["file"], "c: 1.yaml");
        assert_eq!(v["line"], 5);
        // A help of several lines stays one help.
        let v = Error::new(ErrorKind::Usage, "m")
            .with_help("one\ntwo")
            .to_json();
        assert_eq!(
            (v["message"].as_str(), v["help"].as_str()),
            (Some("m"), Some("one\ntwo"))
        );
    }

    #[test]
    fn kinds_decide_the_exit_code() {
        for &k in ErrorKind::ALL {
            let want = if k == ErrorKind::Compile { 1 } else { 2 };
            assert_eq!(k.exit_code(), want, "{k:?}");
        }
        assert_eq!(exit_code(&[]), EXIT_USAGE);
    }
}
