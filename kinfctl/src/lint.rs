//! `kinfctl lint`.

use std::io::Write;
use std::path::PathBuf;

use std::sync::Arc;

use kinf_lang::diagnostic::Report;
use kinf_lang::{Diagnostic, Sources};
use miette::{
    GraphicalReportHandler, GraphicalTheme, MietteError, MietteSpanContents, SourceCode,
    SourceSpan, SpanContents,
};

use crate::cli::Format;
use crate::{EXIT_FINDINGS, EXIT_OK};

/// One diagnostic as JSON.
pub fn diagnostic_json(d: &Diagnostic, sources: &Sources) -> serde_json::Value {
    let loc = d.primary.as_ref().and_then(|(s, _)| {
        let (f, l, c) = sources.locate(*s)?;
        let end = sources.get(s.file).map(|file| file.line_col(s.end));
        Some((f.to_string(), l, c, end))
    });
    let related: Vec<serde_json::Value> = d
        .related
        .iter()
        .filter_map(|(s, label)| {
            let (f, l, c) = sources.locate(*s)?;
            Some(serde_json::json!({"file": f, "line": l, "column": c, "message": label}))
        })
        .collect();
    serde_json::json!({
        "code": d.code.as_str(),
        "severity": d.severity.as_str(),
        "message": d.message,
        "file": loc.as_ref().map(|l| l.0.clone()),
        "line": loc.as_ref().map(|l| l.1),
        "column": loc.as_ref().map(|l| l.2),
        "endLine": loc.as_ref().and_then(|l| l.3.map(|e| e.0)),
        "endColumn": loc.as_ref().and_then(|l| l.3.map(|e| e.1)),
        "label": d.primary.as_ref().map(|(_, l)| l.clone()),
        "help": d.help,
        "path": d.field_path.as_ref().map(|p| p.to_string()),
        "resource": d.resource,
        "related": related,
    })
}

/// Renders one diagnostic for humans (no colours, stable width).
pub fn render_human(d: &Diagnostic, sources: &Sources) -> String {
    let handler = GraphicalReportHandler::new_themed(GraphicalTheme::unicode_nocolor())
        .with_width(100)
        .with_links(false);
    let mut s = String::new();
    let report = CharColumnReport {
        source: d
            .primary
            .as_ref()
            .and_then(|(span, _)| sources.get(span.file))
            .map(|f| CharColumns {
                name: f.name.clone(),
                text: f.text.clone(),
            }),
        inner: d.to_report(sources),
    };
    if handler.render_report(&mut s, &report).is_err() {
        s = d.render_plain(sources);
    }
    // Related places in other files are not drawn by miette: list them.
    let primary_file = d.primary.as_ref().map(|(s, _)| s.file);
    for (span, label) in &d.related {
        if Some(span.file) != primary_file
            && let Some((f, l, c)) = sources.locate(*span)
        {
            s.push_str(&format!("  note: {label} at {f}:{l}:{c}\n"));
        }
    }
    s
}

/// A source text that miette reads with the column of each snippet's header (`╭─[FILE:LINE:COLUMN]`)
/// counted in characters, as in `--format json` and the plain rendering: miette counts bytes,
/// which differ once the line has non-ASCII text before the marked place.
#[derive(Debug)]
struct CharColumns {
    name: String,
    text: Arc<str>,
}

impl SourceCode for CharColumns {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let bytes: &'a [u8] = self.text.as_bytes();
        let inner = bytes.read_span(span, context_lines_before, context_lines_after)?;
        // A column of 0 is the start of a line either way (always so with context lines).
        let column = if inner.column() == 0 {
            0
        } else {
            let at = span.offset().min(self.text.len());
            let before = self.text.get(..at).unwrap_or_default();
            // miette starts lines after `\n` and after a lone `\r`.
            let line_start = before.rfind(['\n', '\r']).map_or(0, |i| i + 1);
            before
                .get(line_start..)
                .map_or(inner.column(), |l| l.chars().count())
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            inner.line(),
            column,
            inner.line_count(),
        )))
    }
}

/// kinf-lang's report of a diagnostic, read from [`CharColumns`].
#[derive(Debug)]
struct CharColumnReport {
    inner: Report,
    source: Option<CharColumns>,
}

impl std::fmt::Display for CharColumnReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl std::error::Error for CharColumnReport {}

impl miette::Diagnostic for CharColumnReport {
    fn code<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.inner.code()
    }
    fn severity(&self) -> Option<miette::Severity> {
        self.inner.severity()
    }
    fn help<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.inner.help()
    }
    fn url<'a>(&'a self) -> Option<Box<dyn std::fmt::Display + 'a>> {
        self.inner.url()
    }
    fn source_code(&self) -> Option<&dyn SourceCode> {
        match &self.source {
            Some(s) => Some(s),
            None => self.inner.source_code(),
        }
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = miette::LabeledSpan> + '_>> {
        self.inner.labels()
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        self.inner.related()
    }
    fn diagnostic_source(&self) -> Option<&dyn miette::Diagnostic> {
        self.inner.diagnostic_source()
    }
}

/// `kinfctl lint`.
pub fn run(
    paths: &[PathBuf],
    deny_warnings: bool,
    format: Format,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let sources = match crate::load::read_sources(paths) {
        Ok(s) => s,
        Err(e) => {
            if format == Format::Json {
                // The shape of the diagnostics below, with no file read.
                let mut doc = crate::report::document(vec![e.to_json()]);
                doc["summary"]["files"] = 0.into();
                crate::report::write_json(out, &doc);
            } else {
                let _ = writeln!(err, "error: {e}");
            }
            return e.kind.exit_code();
        }
    };
    let c = kinf_lang::compile(&sources);
    let errors = c.errors();
    let warnings = c.warnings();
    match format {
        Format::Json => {
            let v = serde_json::json!({
                "diagnostics": c.diagnostics.iter().map(|d| diagnostic_json(d, &sources)).collect::<Vec<_>>(),
                "summary": {"errors": errors, "warnings": warnings, "files": sources.len()},
            });
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&v).unwrap_or_default()
            );
        }
        Format::Human => {
            for d in &c.diagnostics {
                let _ = write!(out, "{}", render_human(d, &sources));
                let _ = writeln!(out);
            }
            let verdict = if errors > 0 { "not applied" } else { "ok" };
            let _ = writeln!(
                out,
                "{} file(s): {errors} error(s), {warnings} warning(s) — {verdict}",
                sources.len()
            );
        }
    }
    let failing = errors > 0 || (deny_warnings && warnings > 0);
    if failing { EXIT_FINDINGS } else { EXIT_OK }
}
