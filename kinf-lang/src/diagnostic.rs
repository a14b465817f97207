//! Diagnostics: code, severity, message, labelled spans and help.

use std::fmt;

use miette::{LabeledSpan, NamedSource, SourceSpan};

use crate::codes::Code;
use crate::path::FieldPath;
use crate::source::{Sources, Span};

/// Error or warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The bundle is not applied.
    Error,
    /// The bundle is applied; something is probably wrong.
    Warning,
}

impl Severity {
    /// `error` or `warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One finding of the compiler.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// Stable code.
    pub code: Code,
    /// Error or warning.
    pub severity: Severity,
    /// Lowercase message; user input in backticks.
    pub message: String,
    /// Where, with a label.
    pub primary: Option<(Span, String)>,
    /// Other places that explain the finding (e.g. the earlier rule that shadows this one).
    pub related: Vec<(Span, String)>,
    /// How to fix it.
    pub help: Option<String>,
    /// Field path inside the resource, for places without a file (Kubernetes status).
    pub field_path: Option<FieldPath>,
    /// `Kind/namespace/name` of the resource, when known.
    pub resource: Option<String>,
}

impl Diagnostic {
    /// A diagnostic with the code's default severity.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            primary: None,
            related: Vec::new(),
            help: None,
            field_path: None,
            resource: None,
        }
    }

    /// An error (whatever the code's default severity).
    pub fn error(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            severity: Severity::Error,
            ..Self::new(code, message)
        }
    }

    /// Sets the primary span and its label.
    pub fn at(mut self, span: Span, label: impl Into<String>) -> Self {
        self.primary = Some((span, label.into()));
        self
    }

    /// Adds a related span.
    pub fn with_related(mut self, span: Span, label: impl Into<String>) -> Self {
        self.related.push((span, label.into()));
        self
    }

    /// Sets the help text.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Sets the help text when there is one.
    pub fn with_help_opt(mut self, help: Option<String>) -> Self {
        if help.is_some() {
            self.help = help;
        }
        self
    }

    /// Sets the field path.
    pub fn with_path(mut self, path: FieldPath) -> Self {
        self.field_path = Some(path);
        self
    }

    /// Sets the resource.
    pub fn with_resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    /// Sets the resource label when one is given.
    pub fn with_resource_opt(mut self, resource: Option<String>) -> Self {
        if resource.is_some() {
            self.resource = resource;
        }
        self
    }

    /// Sort key: file, position, then code.
    pub fn sort_key(&self) -> (u32, usize, Code) {
        match &self.primary {
            Some((span, _)) => (span.file.0, span.start, self.code),
            None => (u32::MAX, 0, self.code),
        }
    }

    /// A miette report of this diagnostic over the given sources.
    pub fn to_report(&self, sources: &Sources) -> Report {
        let file = self.primary.as_ref().and_then(|(s, _)| sources.get(s.file));
        Report {
            diag: self.clone(),
            source: file.map(|f| NamedSource::new(f.name.clone(), f.text.clone())),
            same_file: self.primary.as_ref().map(|(s, _)| s.file),
        }
    }

    /// A plain, machine-stable rendering: `file:line:col: severity[CODE]: message`.
    pub fn render_plain(&self, sources: &Sources) -> String {
        let loc = self
            .primary
            .as_ref()
            .and_then(|(s, _)| sources.locate(*s))
            .map(|(f, l, c)| format!("{f}:{l}:{c}: "))
            .unwrap_or_default();
        let mut out = format!(
            "{loc}{}[{}]: {}",
            self.severity.as_str(),
            self.code,
            self.message
        );
        for (span, label) in &self.related {
            if let Some((f, l, c)) = sources.locate(*span) {
                out.push_str(&format!("\n  note: {f}:{l}:{c}: {label}"));
            }
        }
        if let Some(help) = &self.help {
            out.push_str(&format!("\n  help: {help}"));
        }
        out
    }
}

/// A [`Diagnostic`] bound to its source text, implementing [`miette::Diagnostic`].
#[derive(Debug)]
pub struct Report {
    diag: Diagnostic,
    source: Option<NamedSource<std::sync::Arc<str>>>,
    same_file: Option<crate::source::FileId>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.diag.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(self.diag.code.as_str()))
    }

    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.diag.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.diag
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn url<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        Some(Box::new(format!(
            "https://kinference.ai/docs/diagnostics#{}",
            self.diag.code.as_str().to_ascii_lowercase()
        )))
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        self.source.as_ref().map(|s| s as &dyn miette::SourceCode)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        let primary =
            self.diag.primary.as_ref().map(|(s, l)| {
                LabeledSpan::new_primary_with_span(Some(l.clone()), to_source_span(*s))
            });
        // miette renders labels of one source only; related spans in other files are
        // mentioned in the plain and JSON renderings.
        let related = self
            .diag
            .related
            .iter()
            .filter(|(s, _)| Some(s.file) == self.same_file)
            .map(|(s, l)| LabeledSpan::new_with_span(Some(l.clone()), to_source_span(*s)));
        Some(Box::new(primary.into_iter().chain(related)))
    }
}

fn to_source_span(span: Span) -> SourceSpan {
    SourceSpan::new(span.start.into(), span.len())
}

/// Sorts diagnostics by position and removes duplicates: exact ones, and repeats of a finding
/// (the same finding at the same place under another field path, as a value that YAML aliases
/// repeat gives), of which the first is kept.
pub fn sort_and_dedup(diags: &mut Vec<Diagnostic>) {
    merge_repeats(diags);
}

impl Diagnostic {
    /// Whether `other` is the same finding at the same place, found again under another field
    /// path: the case of a value that aliases (`*name`) repeat. Each place it is repeated at is
    /// checked, under its own path, but its nodes keep the spans of the anchored value (`&name`):
    /// an error in it is one error in the file.
    pub(crate) fn repeats(&self, other: &Diagnostic) -> bool {
        self.primary.is_some()
            && self.code == other.code
            && self.severity == other.severity
            && self.primary == other.primary
            && self.message == other.message
            && self.help == other.help
            && self.related == other.related
            && self.resource == other.resource
    }
}

/// [`sort_and_dedup`]; returns, for each diagnostic kept, whether it stands for repeats under
/// other field paths (which were removed).
pub(crate) fn merge_repeats(diags: &mut Vec<Diagnostic>) -> Vec<bool> {
    // Stable: of repeats, the first one found is kept (usually the anchored value's own).
    diags.sort_by_key(|a| a.sort_key());
    let mut kept: Vec<Diagnostic> = Vec::with_capacity(diags.len());
    let mut repeated: Vec<bool> = Vec::with_capacity(diags.len());
    // Where the diagnostics of the current sort key start in `kept`: repeats share their key.
    let mut run = 0;
    for d in diags.drain(..) {
        if kept.last().is_some_and(|k| k.sort_key() != d.sort_key()) {
            run = kept.len();
        }
        let same = kept
            .get(run..)
            .and_then(|open| open.iter().position(|k| k.repeats(&d) || *k == d));
        match same {
            Some(i) => {
                if kept
                    .get(run + i)
                    .is_some_and(|k| k.field_path != d.field_path)
                    && let Some(r) = repeated.get_mut(run + i)
                {
                    *r = true;
                }
            }
            None => {
                kept.push(d);
                repeated.push(false);
            }
        }
    }
    *diags = kept;
    repeated
}
