//! Reading the YAML input files of `kinfctl explain` and `kinfctl test` (request, state and case
//! files) with their places: every error names the field, what it allows, and the
//! `FILE:LINE:COLUMN` of the offending key or value (the column counts characters).
//!
//! Each error is a [`crate::report::Error`] with its place kept apart from its message, written
//! as text or JSON only when reported.
//!
//! The files are read from kinf-lang's YAML tree, which keeps the span of every key and value,
//! rather than through serde, whose errors have no place and speak in Rust types.

use std::path::Path;

use kinf_lang::Sources;
use kinf_lang::yaml::{Document, Entry, Node, Value};
use kinf_lang::{FileId, Span};

use crate::report::{Error, ErrorKind, Note, Place};

/// The errors of one input file, each an [`Error`] of [`ErrorKind::Input`] with its place (or
/// of [`ErrorKind::Read`] when the file cannot be read).
pub type Errors = Vec<Error>;

/// One input file being read: its text (for places) and the errors found so far.
pub struct Input {
    sources: Sources,
    file: FileId,
    /// Each error with the byte offset it is at, to report them in file order.
    errors: Vec<(usize, Error)>,
}

impl Input {
    /// The file `name` holding `text`, with its YAML documents; syntax errors (including
    /// duplicate keys) are returned at once.
    pub fn parse(name: &str, text: &str) -> Result<(Input, Vec<Document>), Errors> {
        let mut sources = Sources::new();
        let file = sources.add(name, text);
        let mut diags = Vec::new();
        let docs = match sources.get(file) {
            Some(f) => kinf_lang::yaml::parse_documents(file, f, &mut diags),
            None => Vec::new(),
        };
        let input = Input {
            sources,
            file,
            errors: Vec::new(),
        };
        if diags.is_empty() {
            return Ok((input, docs));
        }
        Err(diags
            .iter()
            .map(|d| {
                let mut e = input.placed(d.primary.as_ref().map(|(span, _)| *span), &d.message);
                e.notes = d
                    .related
                    .iter()
                    .map(|(span, label)| match input.at(*span) {
                        Some(p) => Note {
                            place: Some(p),
                            message: label.clone(),
                        },
                        None => Note {
                            place: None,
                            message: format!("{}: {label}", input.name()),
                        },
                    })
                    .collect();
                e.help = d.help.clone();
                e
            })
            .collect())
    }

    /// Reads a file and parses it.
    pub fn read(path: &Path) -> Result<(Input, Vec<Document>), Errors> {
        let text = std::fs::read_to_string(path).map_err(|e| vec![Error::cannot_read(path, e)])?;
        Self::parse(&path.display().to_string(), &text)
    }

    /// The file's name.
    pub fn name(&self) -> &str {
        self.sources.get(self.file).map_or("", |f| f.name.as_str())
    }

    /// The place of a span's start.
    pub fn at(&self, span: Span) -> Option<Place> {
        Place::of(&self.sources, span)
    }

    /// The place of the file's start (line 1, column 1), for errors about the whole file.
    pub fn start(&self) -> Span {
        Span::new(self.file, 0, 0)
    }

    /// An error of [`ErrorKind::Input`] at a span; without one (or when the span has no
    /// place), the message starts with the file's name.
    fn placed(&self, span: Option<Span>, message: &str) -> Error {
        match span.and_then(|s| self.at(s)) {
            Some(p) => Error::new(ErrorKind::Input, message).at(Some(p)),
            None => Error::new(ErrorKind::Input, format!("{}: {message}", self.name())),
        }
    }

    /// Records an error at a span.
    pub fn error(&mut self, span: Span, message: impl AsRef<str>, help: Option<String>) {
        self.push(span.start, span, message.as_ref(), help);
    }

    /// Records an error at a span, reported after those recorded with [`Input::error`].
    pub fn error_last(&mut self, span: Span, message: impl AsRef<str>, help: Option<String>) {
        self.push(usize::MAX, span, message.as_ref(), help);
    }

    fn push(&mut self, offset: usize, span: Span, message: &str, help: Option<String>) {
        let mut e = self.placed(Some(span), message);
        e.help = help;
        self.errors.push((offset, e));
    }

    /// Adds a help line to the last error, unless it has one.
    pub fn add_help(&mut self, help: String) {
        if let Some((_, last)) = self.errors.last_mut()
            && last.help.is_none()
        {
            last.help = Some(help);
        }
    }

    /// `Ok(value)` when no error was recorded, else every error, in file order.
    pub fn finish<T>(self, value: Option<T>) -> Result<T, Errors> {
        match value {
            Some(v) if self.errors.is_empty() => Ok(v),
            _ if self.errors.is_empty() => Err(vec![Error::new(
                ErrorKind::Input,
                format!("{}: invalid file", self.name()),
            )]),
            _ => {
                let mut errors = self.errors;
                errors.sort_by_key(|(offset, _)| *offset);
                Err(errors.into_iter().map(|(_, e)| e).collect())
            }
        }
    }

    /// The text written for a node, as the user wrote it.
    fn source(&self, node: &Node) -> &str {
        self.sources
            .get(node.span.file)
            .and_then(|f| f.text.get(node.span.start..node.span.end))
            .unwrap_or("")
            .trim()
    }

    /// What a node is, for "must be X, not Y": a scalar as written (in backticks), a list, a
    /// mapping, or nothing.
    pub fn found(&self, node: &Node) -> String {
        match &node.value {
            Value::Seq(_) => "a list".to_string(),
            Value::Map(_) => "a mapping".to_string(),
            _ => {
                let text = self.source(node);
                if text.is_empty() {
                    return "nothing (null)".to_string();
                }
                let mut short: String = text.chars().take(40).collect();
                if short.len() < text.len() {
                    short.push('…');
                }
                if short.contains('\n') {
                    return node.value.type_name().to_string();
                }
                format!("`{short}`")
            }
        }
    }

    /// A help line for a quoted scalar that would be right without its quotes.
    fn unquote_help(&self, node: &Node, right: impl Fn(&Value) -> bool) -> Option<String> {
        let Value::Str(s) = &node.value else {
            return None;
        };
        if node.style != kinf_lang::yaml::Style::Quoted {
            return None;
        }
        let (_, docs) = Input::parse("", s).ok()?;
        let doc = docs.first()?;
        right(&doc.root.value).then(|| format!("write `{s}` without quotes"))
    }

    /// The entries of a mapping whose keys must be among `allowed`; each other key is an error
    /// at the key. `what` names the mapping in messages ("the request", "endpoint `x`").
    pub fn mapping<'n>(
        &mut self,
        node: &'n Node,
        what: &str,
        allowed: &[&str],
    ) -> Option<&'n [Entry]> {
        let Value::Map(entries) = &node.value else {
            let found = self.found(node);
            self.error(
                node.span,
                format!("{what} must be a mapping (`field: value`), not {found}"),
                None,
            );
            return None;
        };
        for e in entries {
            if !allowed.contains(&e.key.as_str()) {
                let help = kinf_lang::suggest::help_for(&e.key, allowed.iter().copied(), "fields");
                self.error(
                    e.key_span,
                    format!("unknown field `{}` in {what}", e.key),
                    Some(help),
                );
            }
        }
        Some(entries)
    }

    /// A required entry: an error at `at` (the mapping) when it is missing.
    pub fn required<'n>(
        &mut self,
        entries: &'n [Entry],
        key: &str,
        at: Span,
        what: &str,
        help: &str,
    ) -> Option<&'n Node> {
        let found = entries.iter().find(|e| e.key == key).map(|e| &e.value);
        if found.is_none() {
            self.error(at, format!("{what} has no `{key}`"), Some(help.to_string()));
        }
        found
    }

    /// A string.
    pub fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.to_string()),
            _ => {
                let found = self.found(node);
                let help = matches!(node.value, Value::Int(_) | Value::Float(_) | Value::Bool(_))
                    .then(|| format!("quote it: `\"{}\"`", self.source(node)));
                self.error(
                    node.span,
                    format!("{field} must be a string, not {found}"),
                    help,
                );
                None
            }
        }
    }

    /// A non-empty string.
    pub fn non_empty(&mut self, node: &Node, field: &str) -> Option<String> {
        let s = self.string(node, field)?;
        if s.trim().is_empty() {
            self.error(node.span, format!("{field} must not be empty"), None);
            return None;
        }
        Some(s)
    }

    /// `true` or `false`.
    pub fn boolean(&mut self, node: &Node, field: &str) -> Option<bool> {
        match node.value {
            Value::Bool(b) => Some(b),
            _ => {
                let found = self.found(node);
                let help = self.unquote_help(node, |v| matches!(v, Value::Bool(_)));
                self.error(
                    node.span,
                    format!("{field} must be `true` or `false`, not {found}"),
                    help,
                );
                None
            }
        }
    }

    /// A whole number from 0 to `u32::MAX`.
    pub fn count(&mut self, node: &Node, field: &str) -> Option<u32> {
        if let Value::Int(i) = node.value
            && let Ok(n) = u32::try_from(i)
        {
            return Some(n);
        }
        let found = self.found(node);
        let help = self.unquote_help(
            node,
            |v| matches!(v, Value::Int(i) if u32::try_from(*i).is_ok()),
        );
        self.error(
            node.span,
            format!(
                "{field} must be a whole number from 0 to {}, not {found}",
                u32::MAX
            ),
            help,
        );
        None
    }

    /// A [`count`](Self::count) of at least 1 (`n`, `maxModelLen`): 0 is an error of its own.
    pub fn positive_count(&mut self, node: &Node, field: &str) -> Option<u32> {
        let v = self.count(node, field)?;
        if v == 0 {
            self.error(
                node.span,
                format!("{field} must be at least 1, not 0"),
                None,
            );
            return None;
        }
        Some(v)
    }

    /// A finite number from `min` to `max` (inclusive; no upper bound when `None`).
    pub fn number(&mut self, node: &Node, field: &str, min: f64, max: Option<f64>) -> Option<f64> {
        let v = match node.value {
            Value::Int(i) => Some(i as f64),
            Value::Float(f) => Some(f),
            _ => None,
        };
        if let Some(v) = v
            && v.is_finite()
            && v >= min
            && max.is_none_or(|m| v <= m)
        {
            return Some(v);
        }
        let range = match max {
            Some(m) => format!("a number from {min} to {m}"),
            None => format!("a number, {min} or more"),
        };
        let found = self.found(node);
        let help = self.unquote_help(node, |v| {
            matches!(v, Value::Int(_)) || matches!(v, Value::Float(f) if f.is_finite())
        });
        self.error(
            node.span,
            format!("{field} must be {range}, not {found}"),
            help,
        );
        None
    }

    /// A list of strings.
    pub fn strings(&mut self, node: &Node, field: &str, item: &str) -> Option<Vec<String>> {
        let Value::Seq(items) = &node.value else {
            let found = self.found(node);
            self.error(
                node.span,
                format!("{field} must be a list of strings, not {found}"),
                None,
            );
            return None;
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for n in items {
            match self.string(n, item) {
                Some(s) => out.push(s),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

/// The one document of a request or state file: `None` when the file has none; an error at the
/// second document when it has several.
pub fn single_document<'d>(
    input: &mut Input,
    docs: &'d [Document],
    kind: &str,
) -> Option<&'d Document> {
    if let Some(second) = docs.get(1) {
        input.error(
            second.root.span,
            format!(
                "a {kind} file holds one YAML document; this is document 2 of {}",
                docs.len()
            ),
            Some(match kind {
                "request" => "put each request in its own file; to decide several requests, \
                              write them as cases of `kinfctl test`"
                    .to_string(),
                _ => format!("put each {kind} in its own file"),
            }),
        );
    }
    docs.first()
}
