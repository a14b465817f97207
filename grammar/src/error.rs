//! Source spans and syntax errors shared by every sub-language, plus the
//! rendering of pest failures into sentences.

use std::fmt;
use std::ops::Range;

use pest::RuleType;
use pest::error::{ErrorVariant, InputLocation};

/// A byte range `start..end` inside the string that was parsed.
///
/// Spans are relative to the string given to the parser, so the caller adds the
/// offset of that string inside its file. A span is never part of equality of
/// the syntax trees that carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Span {
    /// Offset of the first byte.
    pub start: usize,
    /// Offset one past the last byte.
    pub end: usize,
}

impl Span {
    /// Builds a span from its two offsets.
    pub const fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    /// The span as a range, for slicing the source.
    pub const fn range(self) -> Range<usize> {
        self.start..self.end
    }

    /// Length of the span in bytes.
    pub const fn len(self) -> usize {
        self.end.saturating_sub(self.start)
    }

    /// Whether the span covers no bytes (a position, such as the end of input).
    pub const fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// The smallest span covering both.
    pub fn to(self, other: Span) -> Span {
        Span::new(self.start.min(other.start), self.end.max(other.end))
    }

    /// The span moved right by `by` bytes.
    pub const fn shift(self, by: usize) -> Span {
        Span::new(self.start + by, self.end + by)
    }

    pub(crate) fn of(span: pest::Span<'_>) -> Span {
        Span::new(span.start(), span.end())
    }
}

impl From<Span> for Range<usize> {
    fn from(span: Span) -> Self {
        span.range()
    }
}

impl From<Span> for (usize, usize) {
    fn from(span: Span) -> Self {
        (span.start, span.end)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// A string that does not follow the syntax of its sub-language.
///
/// The message is lowercase and quotes user input in backticks; `help`, when
/// present, says how to fix it. `Display` prints the message only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SyntaxError {
    /// Where the problem is, as byte offsets into the parsed string.
    pub span: Span,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when there is something useful to say.
    pub help: Option<String>,
}

impl SyntaxError {
    /// A new error without help.
    pub fn new(span: Span, message: impl Into<String>) -> Self {
        Self {
            span,
            message: message.into(),
            help: None,
        }
    }

    /// The same error with `help` attached.
    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// The same error with its span moved right by `by` bytes (for a string
    /// parsed as part of a larger one).
    #[must_use]
    pub fn shifted(mut self, by: usize) -> Self {
        self.span = self.span.shift(by);
        self
    }
}

/// A pest failure reduced to what the renderers need.
pub(crate) struct Failure<R> {
    /// Byte offset where parsing stopped.
    pub pos: usize,
    /// Rules that would have been accepted at `pos`.
    pub expected: Vec<R>,
}

impl<R: RuleType> Failure<R> {
    pub(crate) fn from_pest(err: &pest::error::Error<R>) -> Self {
        let pos = match err.location {
            InputLocation::Pos(pos) => pos,
            InputLocation::Span((start, _)) => start,
        };
        let expected = match &err.variant {
            ErrorVariant::ParsingError { positives, .. } => positives.clone(),
            ErrorVariant::CustomError { .. } => Vec::new(),
        };
        Self { pos, expected }
    }

    /// The expected rules described in words, deduplicated, in a stable order.
    pub(crate) fn expected_words(&self, describe: impl Fn(R) -> &'static str) -> String {
        let mut words: Vec<&'static str> = Vec::new();
        for rule in &self.expected {
            let word = describe(*rule);
            if !words.contains(&word) {
                words.push(word);
            }
        }
        // "end of input" reads best last.
        words.sort_by_key(|w| *w == "end of input");
        join_or(&words)
    }
}

/// `a`, `a or b`, `a, b, or c`.
pub(crate) fn join_or(words: &[&str]) -> String {
    match words {
        [] => "something else".to_owned(),
        [one] => (*one).to_owned(),
        [a, b] => format!("{a} or {b}"),
        [init @ .., last] => format!("{}, or {last}", init.join(", ")),
    }
}

/// The token found at `pos`, as a span and a phrase such as "`foo`" or
/// "end of input".
pub(crate) fn found_at(input: &str, pos: usize) -> (Span, String) {
    let rest = input.get(pos..).unwrap_or("");
    let Some(first) = rest.chars().next() else {
        return (
            Span::new(input.len(), input.len()),
            "end of input".to_owned(),
        );
    };
    let len = if first.is_whitespace() {
        return (
            Span::new(pos, pos + first.len_utf8()),
            "whitespace".to_owned(),
        );
    } else if first.is_alphanumeric() || first == '_' {
        rest.find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '%')))
            .unwrap_or(rest.len())
    } else if "=!<>&|".contains(first) {
        rest.find(|c: char| !"=!<>&|".contains(c))
            .unwrap_or(rest.len())
            .min(2)
    } else {
        first.len_utf8()
    };
    let text = rest.get(..len).unwrap_or(rest);
    (Span::new(pos, pos + len), format!("`{text}`"))
}

/// The generic sentence for a pest failure: "expected X or Y, found `z`".
pub(crate) fn render_failure<R: RuleType>(
    failure: &Failure<R>,
    input: &str,
    describe: impl Fn(R) -> &'static str,
) -> SyntaxError {
    let (span, found) = found_at(input, failure.pos);
    let expected = failure.expected_words(describe);
    SyntaxError::new(span, format!("expected {expected}, found {found}"))
}
