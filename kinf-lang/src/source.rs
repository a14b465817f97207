//! Source files, byte spans and line/column lookup.

use std::sync::Arc;

/// Index of a file in [`Sources`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// A byte range in one source file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Span {
    /// The file.
    pub file: FileId,
    /// First byte.
    pub start: usize,
    /// One past the last byte.
    pub end: usize,
}

impl Span {
    /// A span from `start` to `end` in `file`.
    pub fn new(file: FileId, start: usize, end: usize) -> Self {
        Span {
            file,
            start,
            end: end.max(start),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the span covers no byte.
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// One named source text (a file, or a string given in memory).
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Name shown in diagnostics (the path as given).
    pub name: String,
    /// The text.
    pub text: Arc<str>,
    line_starts: Vec<usize>,
    ascii: bool,
}

impl SourceFile {
    /// A source file named `name` holding `text`.
    pub fn new(name: impl Into<String>, text: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = text.into();
        // Lines end at `\n`, `\r\n` or a lone `\r`, as YAML (and its parser's markers) count them.
        let bytes = text.as_bytes();
        let mut line_starts = vec![0];
        line_starts.extend(
            bytes
                .iter()
                .enumerate()
                .filter(|&(i, &b)| b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n')))
                .map(|(i, _)| i + 1),
        );
        let ascii = text.is_ascii();
        SourceFile {
            name: name.into(),
            text,
            line_starts,
            ascii,
        }
    }

    /// 1-based line and column (in characters) of a byte offset. A byte order mark that starts
    /// the line is not a column (editors do not show it).
    pub fn line_col(&self, byte: usize) -> (usize, usize) {
        let byte = byte.min(self.text.len());
        let line = match self.line_starts.binary_search(&byte) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let start = self.line_starts.get(line).copied().unwrap_or(0);
        let start = self.after_bom(start).min(byte);
        let col = self
            .text
            .get(start..byte)
            .map(|s| s.chars().count())
            .unwrap_or(0);
        (line + 1, col + 1)
    }

    /// Byte offset of a 1-based line and 0-based character column, clamped to the text.
    ///
    /// A byte order mark that starts the line is not counted: the YAML parser skips it without
    /// a column (a UTF-8 file saved with a BOM has one before its first line).
    pub fn byte_at(&self, line: usize, col_chars: usize) -> usize {
        let Some(&start) = self.line_starts.get(line.saturating_sub(1)) else {
            return self.text.len();
        };
        if self.ascii {
            // One byte per character: no scan (long lines would make it quadratic).
            return (start + col_chars).min(self.text.len());
        }
        let start = self.after_bom(start);
        let rest = self.text.get(start..).unwrap_or("");
        let offset = rest
            .char_indices()
            .nth(col_chars)
            .map(|(i, _)| i)
            .unwrap_or(rest.len());
        start + offset
    }

    /// `line_start`, past a byte order mark that starts the line.
    fn after_bom(&self, line_start: usize) -> usize {
        const BOM: &str = "\u{feff}";
        match self.text.get(line_start..) {
            Some(rest) if !self.ascii && rest.starts_with(BOM) => line_start + BOM.len(),
            _ => line_start,
        }
    }
}

/// All source files of one compilation.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    files: Vec<SourceFile>,
}

impl Sources {
    /// No files.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file and returns its id.
    pub fn add(&mut self, name: impl Into<String>, text: impl Into<Arc<str>>) -> FileId {
        let id = FileId(u32::try_from(self.files.len()).unwrap_or(u32::MAX));
        self.files.push(SourceFile::new(name, text));
        id
    }

    /// The file with this id.
    pub fn get(&self, id: FileId) -> Option<&SourceFile> {
        self.files.get(id.0 as usize)
    }

    /// Every file with its id.
    pub fn iter(&self) -> impl Iterator<Item = (FileId, &SourceFile)> {
        self.files
            .iter()
            .enumerate()
            .map(|(i, f)| (FileId(i as u32), f))
    }

    /// Number of files.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Whether there are no files.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// File name, 1-based line and column of a span's start.
    pub fn locate(&self, span: Span) -> Option<(&str, usize, usize)> {
        let file = self.get(span.file)?;
        let (line, col) = file.line_col(span.start);
        Some((&file.name, line, col))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_end_at_lf_crlf_and_lone_cr() {
        for text in ["a\nbc\nd", "a\r\nbc\r\nd", "a\rbc\rd", "a\r\nbc\rd"] {
            let f = SourceFile::new("t", text);
            let d = text.rfind('d').unwrap_or(0);
            let c = text.find('c').unwrap_or(0);
            assert_eq!(f.line_col(d), (3, 1), "{text:?}");
            assert_eq!(f.line_col(c), (2, 2), "{text:?}");
            assert_eq!(f.byte_at(3, 0), d, "{text:?}");
            assert_eq!(f.byte_at(2, 1), c, "{text:?}");
        }
    }
}
