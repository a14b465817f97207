//! A fast front end for the YAML that policies are written in: block mappings and sequences,
//! single-line flow collections, single-line plain and quoted scalars, comments, `---`.
//!
//! It produces the same events, with the same byte spans, as `saphyr-parser` does for that
//! subset, so the tree builder of [`crate::yaml`] turns them into the same tree. Anything else
//! (anchors, aliases, tags, block scalars, multi-line scalars or flow collections, complex keys,
//! empty values, escapes, tabs, non-ASCII text, and every syntax error) is [`Unsupported`]: the
//! caller then parses the file with `saphyr-parser`, whose diagnostics stay the reference.
//!
//! Collections nested deeper than [`crate::yaml::MAX_DEPTH`] are [`Unsupported`] too: the
//! descent is recursive, and bounding it keeps the stack small. The start event of the
//! collection that crosses the limit is handed over first, so that the tree builder reports it
//! where it is (and keeps its result: the full parser would find the nesting later, after
//! scanning ahead).

use std::borrow::Cow;

use saphyr_parser::{Event, ScalarStyle};

/// The text uses something outside the fast subset (or is invalid): parse it with the full
/// parser instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unsupported;

type Res<T = ()> = Result<T, Unsupported>;

/// Longest key accepted (the full parser rejects simple keys over 1024 characters).
const MAX_KEY_LEN: usize = 1000;

/// Receives the events of [`parse_into`].
pub trait Sink<'t> {
    /// One node event with its byte span (start, end).
    fn event(&mut self, event: Event<'t>, start: usize, end: usize);
}

/// A closure as a [`Sink`].
struct Closure<'a, 't>(&'a mut dyn FnMut(Event<'t>, usize, usize));

impl<'t> Sink<'t> for Closure<'_, 't> {
    fn event(&mut self, event: Event<'t>, start: usize, end: usize) {
        (self.0)(event, start, end);
    }
}

/// Parses `text`, handing every node event with its byte span (start, end) to `sink`.
/// Only start, end and scalar events are produced (stream and document events carry nothing
/// the tree needs). On [`Unsupported`], the events already handed over must be discarded.
pub fn parse<'t>(text: &'t str, sink: &mut dyn FnMut(Event<'t>, usize, usize)) -> Res {
    parse_into(text, &mut Closure(sink))
}

/// [`parse`] into a statically known sink: each event site calls it directly (the tree
/// builder, inlined there, then only runs the part of its event handling for that event).
pub fn parse_into<'t, S: Sink<'t>>(text: &'t str, sink: &mut S) -> Res {
    if !text.is_ascii() || text.bytes().any(|b| b == b'\t' || b == b'\r') {
        return Err(Unsupported);
    }
    // A comment on a last line without a line break would end block collections at the end
    // of the text, not at their last value (a quirk of the full parser): leave it to that one.
    let tail = text.rfind('\n').map_or(text, |i| &text[i + 1..]);
    if tail.contains('#') {
        return Err(Unsupported);
    }
    let mut p = Fast {
        text,
        b: text.as_bytes(),
        pos: 0,
        depth: 0,
        sink,
    };
    p.stream()
}

struct Fast<'t, 's, S> {
    text: &'t str,
    b: &'t [u8],
    pos: usize,
    /// Collections open at the cursor.
    depth: usize,
    sink: &'s mut S,
}

/// The first content line after the cursor.
#[derive(Clone, Copy, Debug)]
struct Line {
    /// Offset of the line's first byte.
    start: usize,
    /// Spaces before its first character.
    indent: usize,
}

impl Line {
    fn first(self) -> usize {
        self.start + self.indent
    }
}

fn is_space_or_end(b: Option<u8>) -> bool {
    matches!(b, None | Some(b' ' | b'\n'))
}

fn is_flow_indicator(b: u8) -> bool {
    matches!(b, b',' | b'[' | b']' | b'{' | b'}')
}

impl<'t, S: Sink<'t>> Fast<'t, '_, S> {
    fn at(&self, i: usize) -> Option<u8> {
        self.b.get(i).copied()
    }

    #[inline(always)]
    fn emit(&mut self, event: Event<'t>, start: usize, end: usize) {
        self.sink.event(event, start, end);
    }

    fn line_start(&self, i: usize) -> usize {
        self.text[..i].rfind('\n').map_or(0, |n| n + 1)
    }

    fn line_end(&self, i: usize) -> usize {
        self.text[i..].find('\n').map_or(self.b.len(), |n| i + n)
    }

    /// The next line at or after `from` (a line start) holding more than spaces and a comment.
    fn content_line(&self, mut from: usize) -> Option<Line> {
        while from < self.b.len() {
            let mut i = from;
            while self.at(i) == Some(b' ') {
                i += 1;
            }
            match self.at(i) {
                None => return None,
                Some(b'\n') => from = i + 1,
                Some(b'#') => from = self.line_end(i) + 1,
                Some(_) => {
                    return Some(Line {
                        start: from,
                        indent: i - from,
                    });
                }
            }
        }
        None
    }

    /// The next line at or after `from` holding more than spaces (comment lines count).
    fn nonblank_line(&self, mut from: usize) -> Option<Line> {
        while from < self.b.len() {
            let mut i = from;
            while self.at(i) == Some(b' ') {
                i += 1;
            }
            match self.at(i) {
                None => return None,
                Some(b'\n') => from = i + 1,
                Some(_) => {
                    return Some(Line {
                        start: from,
                        indent: i - from,
                    });
                }
            }
        }
        None
    }

    /// Whether the line starting at `start` is a document marker (`---` or `...` at column 0).
    fn is_marker(&self, start: usize) -> bool {
        let s = &self.b[start..];
        (s.starts_with(b"---") || s.starts_with(b"...")) && is_space_or_end(s.get(3).copied())
    }

    fn stream(&mut self) -> Res {
        let mut from = 0;
        while let Some(line) = self.content_line(from) {
            let s = &self.b[line.start..];
            if line.indent == 0 && (s.starts_with(b"---") || s.starts_with(b"...")) {
                // `...` and `--- content` are left to the full parser.
                if !s.starts_with(b"---") || !is_space_or_end(s.get(3).copied()) {
                    return Err(Unsupported);
                }
                self.pos = line.start + 3;
                self.rest_of_line()?;
                from = self.pos;
                continue;
            }
            if line.indent != 0 || matches!(s.first(), Some(b'%')) {
                return Err(Unsupported);
            }
            self.pos = line.start;
            self.block_node(line)?;
            // The root ends at a document marker or at the end.
            match self.content_line(self.pos) {
                Some(next) if next.indent == 0 && self.is_marker(next.start) => from = next.start,
                Some(_) => return Err(Unsupported),
                None => break,
            }
        }
        Ok(())
    }

    /// After a value: only spaces and a comment may follow on the line. Leaves the cursor at the
    /// start of the next line.
    fn rest_of_line(&mut self) -> Res {
        let mut i = self.pos;
        while self.at(i) == Some(b' ') {
            i += 1;
        }
        match self.at(i) {
            None => {
                self.pos = i;
                Ok(())
            }
            Some(b'\n') => {
                self.pos = i + 1;
                Ok(())
            }
            Some(b'#') if i > self.pos => {
                self.pos = (self.line_end(i) + 1).min(self.b.len());
                Ok(())
            }
            _ => Err(Unsupported),
        }
    }

    /// A block node whose first character is the first of `line`, at column `line.indent`.
    fn block_node(&mut self, line: Line) -> Res {
        self.pos = line.first();
        if self.at(self.pos) == Some(b'-') && is_space_or_end(self.at(self.pos + 1)) {
            self.block_seq(line.indent, false)
        } else {
            self.block_map(line.indent)
        }
    }

    /// The end offset the full parser reports for a block collection: where the next token
    /// starts (only compared with the last child's end, across a line break).
    fn next_token(&self) -> usize {
        self.content_line(self.pos)
            .map_or(self.b.len(), |l| l.first())
    }

    /// A block mapping whose first key is at the cursor, at column `indent`.
    fn block_map(&mut self, indent: usize) -> Res {
        let depth = self.depth;
        let r = self.block_map_body(indent);
        self.depth = depth;
        r
    }

    fn block_map_body(&mut self, indent: usize) -> Res {
        let start = self.pos;
        self.emit(Event::MappingStart(0, None), start, start);
        self.enter()?;
        loop {
            let (key, ks, ke) = self.block_key()?;
            self.emit(Event::Scalar(key, ScalarStyle::Plain, 0, None), ks, ke);
            // The cursor is after the `:`.
            self.block_value(indent)?;
            match self.content_line(self.pos) {
                Some(next) if next.indent == 0 && self.is_marker(next.start) => break,
                Some(next) if next.indent == indent => {
                    let first = next.first();
                    if self.at(first) == Some(b'-') && is_space_or_end(self.at(first + 1)) {
                        return Err(Unsupported);
                    }
                    self.pos = first;
                }
                Some(next) if next.indent < indent => break,
                Some(_) => return Err(Unsupported),
                None => break,
            }
        }
        let end = self.next_token();
        self.emit(Event::MappingEnd, end, end);
        Ok(())
    }

    /// A plain key at the cursor, followed by `:` and a space or line break. Leaves the cursor
    /// after the `:`.
    fn block_key(&mut self) -> Res<(Cow<'t, str>, usize, usize)> {
        let start = self.pos;
        if !self.plain_start(start, false) {
            return Err(Unsupported);
        }
        // One pass to the `:` or the line's end (no separate search for the line's end).
        let mut i = start;
        loop {
            match self.at(i) {
                None | Some(b'\n') => return Err(Unsupported),
                Some(b':') if is_space_or_end(self.at(i + 1)) => break,
                Some(b'#') if self.b[i - 1] == b' ' => return Err(Unsupported),
                Some(_) => i += 1,
            }
        }
        let colon = i;
        let mut end = colon;
        while end > start && self.b[end - 1] == b' ' {
            end -= 1;
        }
        if end - start > MAX_KEY_LEN {
            return Err(Unsupported);
        }
        self.pos = colon + 1;
        Ok((Cow::Borrowed(&self.text[start..end]), start, end))
    }

    /// Whether a plain scalar may start at `i` (no indicator, except `-` before a safe
    /// character).
    fn plain_start(&self, i: usize, flow: bool) -> bool {
        match self.at(i) {
            None | Some(b' ' | b'\n') => false,
            Some(b'-') => match self.at(i + 1) {
                None | Some(b' ' | b'\n') => false,
                Some(c) => !(flow && is_flow_indicator(c)),
            },
            Some(
                b'?' | b':' | b',' | b'[' | b']' | b'{' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|'
                | b'>' | b'\'' | b'"' | b'%' | b'@' | b'`',
            ) => false,
            Some(_) => true,
        }
    }

    /// The value of a block mapping entry at column `indent`, the cursor after its `:`.
    /// Leaves the cursor at the start of the line after the value.
    fn block_value(&mut self, indent: usize) -> Res {
        while self.at(self.pos) == Some(b' ') {
            self.pos += 1;
        }
        match self.at(self.pos) {
            None | Some(b'\n' | b'#') => {
                self.rest_of_line()?;
                let Some(next) = self.content_line(self.pos) else {
                    return Err(Unsupported);
                };
                let first = next.first();
                let dash = self.at(first) == Some(b'-') && is_space_or_end(self.at(first + 1));
                if next.indent == 0 && self.is_marker(next.start) {
                    return Err(Unsupported);
                }
                if next.indent > indent {
                    self.block_node(next)
                } else if next.indent == indent && dash {
                    self.pos = first;
                    self.block_seq(indent, true)
                } else {
                    // An empty value.
                    Err(Unsupported)
                }
            }
            Some(_) => self.inline_value(indent),
        }
    }

    /// A value written on the line of its key or `-`, the cursor on its first character;
    /// `indent` is the column of the collection holding it. Leaves the cursor at the start of
    /// the next line.
    fn inline_value(&mut self, indent: usize) -> Res {
        let plain = match self.at(self.pos) {
            Some(b'{') => {
                self.flow_map()?;
                false
            }
            Some(b'[') => {
                self.flow_seq()?;
                false
            }
            Some(b'\'' | b'"') => {
                let (v, style, s, e) = self.quoted()?;
                self.emit(Event::Scalar(v, style, 0, None), s, e);
                false
            }
            _ => {
                self.block_plain()?;
                true
            }
        };
        // `a: b: c`, `"a": b` after a `-`, `{a: b}: c`: keys the fast path does not take.
        let mut i = self.pos;
        while self.at(i) == Some(b' ') {
            i += 1;
        }
        if self.at(i) == Some(b':') {
            return Err(Unsupported);
        }
        self.rest_of_line()?;
        // A more indented line after it may continue the scalar (or be an error).
        let next = if plain {
            self.nonblank_line(self.pos)
        } else {
            self.content_line(self.pos)
        };
        match next {
            Some(l) if l.indent > indent => Err(Unsupported),
            _ => Ok(()),
        }
    }

    /// A plain scalar in block context, ending at the end of the line or at ` #`.
    fn block_plain(&mut self) -> Res {
        let start = self.pos;
        if !self.plain_start(start, false) {
            return Err(Unsupported);
        }
        let mut i = start;
        loop {
            match self.at(i) {
                None | Some(b'\n') => break,
                Some(b':') if is_space_or_end(self.at(i + 1)) => return Err(Unsupported),
                Some(b'#') if self.b[i - 1] == b' ' => break,
                Some(_) => i += 1,
            }
        }
        let mut end = i;
        while end > start && self.b[end - 1] == b' ' {
            end -= 1;
        }
        self.pos = end;
        let text = Cow::Borrowed(&self.text[start..end]);
        self.emit(Event::Scalar(text, ScalarStyle::Plain, 0, None), start, end);
        Ok(())
    }

    /// A quoted scalar on one line, without escapes other than `''`.
    fn quoted(&mut self) -> Res<(Cow<'t, str>, ScalarStyle, usize, usize)> {
        let start = self.pos;
        let q = self.b[start];
        let mut i = start + 1;
        let mut doubled = false;
        loop {
            match self.at(i) {
                None | Some(b'\n' | b'\\') => return Err(Unsupported),
                Some(c) if c == q => {
                    if q == b'\'' && self.at(i + 1) == Some(b'\'') {
                        doubled = true;
                        i += 2;
                        continue;
                    }
                    break;
                }
                Some(_) => i += 1,
            }
        }
        let body = &self.text[start + 1..i];
        self.pos = i + 1;
        let (value, style) = if q == b'\'' {
            let v = if doubled {
                Cow::Owned(body.replace("''", "'"))
            } else {
                Cow::Borrowed(body)
            };
            (v, ScalarStyle::SingleQuoted)
        } else {
            (Cow::Borrowed(body), ScalarStyle::DoubleQuoted)
        };
        Ok((value, style, start, self.token_end(self.pos)))
    }

    /// Counts a collection whose start was emitted. Beyond [`crate::yaml::MAX_DEPTH`] levels the
    /// file is [`Unsupported`]; the tree builder, which saw that start, has then reported it.
    fn enter(&mut self) -> Res {
        self.depth += 1;
        if self.depth > crate::yaml::MAX_DEPTH {
            return Err(Unsupported);
        }
        Ok(())
    }

    fn skip_spaces(&mut self) {
        while self.at(self.pos) == Some(b' ') {
            self.pos += 1;
        }
    }

    /// A flow node (inside `{}` or `[]`) at the cursor.
    fn flow_node(&mut self) -> Res {
        match self.at(self.pos) {
            Some(b'{') => self.flow_map(),
            Some(b'[') => self.flow_seq(),
            Some(b'\'' | b'"') => {
                let (v, style, s, e) = self.quoted()?;
                self.emit(Event::Scalar(v, style, 0, None), s, e);
                Ok(())
            }
            _ => {
                let (v, s, e) = self.flow_plain()?;
                self.emit(Event::Scalar(v, ScalarStyle::Plain, 0, None), s, e);
                Ok(())
            }
        }
    }

    /// A plain scalar in flow context, on one line.
    fn flow_plain(&mut self) -> Res<(Cow<'t, str>, usize, usize)> {
        let start = self.pos;
        if !self.plain_start(start, true) {
            return Err(Unsupported);
        }
        let mut i = start;
        loop {
            match self.at(i) {
                None | Some(b'\n') => return Err(Unsupported),
                Some(b',' | b'[' | b']' | b'{' | b'}') => break,
                Some(b':') => match self.at(i + 1) {
                    None | Some(b' ' | b'\n' | b',' | b'[' | b']' | b'{' | b'}') => break,
                    Some(_) => i += 1,
                },
                Some(b'#') if self.b[i - 1] == b' ' => return Err(Unsupported),
                // The full parser rejects `-` before a flow indicator after a space, too.
                Some(b'-')
                    if self.b[i - 1] == b' ' && self.at(i + 1).is_some_and(is_flow_indicator) =>
                {
                    return Err(Unsupported);
                }
                Some(_) => i += 1,
            }
        }
        let mut end = i;
        while end > start && self.b[end - 1] == b' ' {
            end -= 1;
        }
        self.pos = end;
        Ok((Cow::Borrowed(&self.text[start..end]), start, end))
    }

    /// Emits the end of a flow collection, the cursor after its `}` or `]`. The full parser's
    /// token for the bracket also covers the spaces after it, and a comment after those.
    fn flow_end(&mut self, event: Event<'t>) {
        let end = self.token_end(self.pos);
        self.emit(event, self.pos - 1, end);
    }

    /// Where the full parser ends a quoted scalar or closing bracket that ends at `from`: after
    /// the spaces that follow, and after a comment that follows those.
    fn token_end(&self, from: usize) -> usize {
        let mut end = from;
        while self.at(end) == Some(b' ') {
            end += 1;
        }
        if end > from && self.at(end) == Some(b'#') {
            end = self.line_end(end);
        }
        end
    }

    /// `{ key: value, ... }` on one line, the cursor on the `{`.
    fn flow_map(&mut self) -> Res {
        let depth = self.depth;
        let r = self.flow_map_body();
        self.depth = depth;
        r
    }

    fn flow_map_body(&mut self) -> Res {
        let start = self.pos;
        self.emit(Event::MappingStart(0, None), start, start + 1);
        self.enter()?;
        self.pos += 1;
        self.skip_spaces();
        if self.at(self.pos) == Some(b'}') {
            self.pos += 1;
            self.flow_end(Event::MappingEnd);
            return Ok(());
        }
        loop {
            let (k, style, ks, ke) = match self.at(self.pos) {
                Some(b'\'' | b'"') => self.quoted()?,
                _ => {
                    let (k, s, e) = self.flow_plain()?;
                    (k, ScalarStyle::Plain, s, e)
                }
            };
            self.skip_spaces();
            if self.at(self.pos) != Some(b':') || self.at(self.pos + 1) != Some(b' ') {
                return Err(Unsupported);
            }
            self.emit(Event::Scalar(k, style, 0, None), ks, ke);
            self.pos += 1;
            self.skip_spaces();
            if matches!(self.at(self.pos), None | Some(b',' | b'}' | b'\n' | b'#')) {
                return Err(Unsupported);
            }
            self.flow_node()?;
            self.skip_spaces();
            match self.at(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_spaces();
                    if matches!(self.at(self.pos), None | Some(b'}' | b',' | b'\n' | b'#')) {
                        return Err(Unsupported);
                    }
                }
                Some(b'}') => {
                    self.pos += 1;
                    self.flow_end(Event::MappingEnd);
                    return Ok(());
                }
                _ => return Err(Unsupported),
            }
        }
    }

    /// `[ item, ... ]` on one line, the cursor on the `[`.
    fn flow_seq(&mut self) -> Res {
        let depth = self.depth;
        let r = self.flow_seq_body();
        self.depth = depth;
        r
    }

    fn flow_seq_body(&mut self) -> Res {
        let start = self.pos;
        self.emit(Event::SequenceStart(0, None), start, start + 1);
        self.enter()?;
        self.pos += 1;
        self.skip_spaces();
        if self.at(self.pos) == Some(b']') {
            self.pos += 1;
            self.flow_end(Event::SequenceEnd);
            return Ok(());
        }
        loop {
            if matches!(self.at(self.pos), None | Some(b',' | b']' | b'\n' | b'#')) {
                return Err(Unsupported);
            }
            self.flow_node()?;
            self.skip_spaces();
            match self.at(self.pos) {
                Some(b',') => {
                    self.pos += 1;
                    self.skip_spaces();
                }
                Some(b']') => {
                    self.pos += 1;
                    self.flow_end(Event::SequenceEnd);
                    return Ok(());
                }
                // `[a: b]` (a single-pair mapping) and everything else.
                _ => return Err(Unsupported),
            }
        }
    }

    /// A block sequence whose first `-` is at the cursor, at column `indent`; `indentless` when
    /// it is the value of a mapping entry at the same column.
    fn block_seq(&mut self, indent: usize, indentless: bool) -> Res {
        let depth = self.depth;
        let r = self.block_seq_body(indent, indentless);
        self.depth = depth;
        r
    }

    fn block_seq_body(&mut self, indent: usize, indentless: bool) -> Res {
        let mut start = self.pos;
        if indentless {
            // The full parser starts an indentless sequence at its first item's content.
            start = self.pos + 1;
            while self.at(start) == Some(b' ') {
                start += 1;
            }
            if matches!(self.at(start), None | Some(b'\n' | b'#')) {
                return Err(Unsupported);
            }
        }
        self.emit(Event::SequenceStart(0, None), start, start);
        self.enter()?;
        loop {
            // The cursor is on a `-`.
            self.pos += 1;
            self.skip_spaces();
            match self.at(self.pos) {
                None | Some(b'\n' | b'#') => {
                    self.rest_of_line()?;
                    match self.content_line(self.pos) {
                        Some(next)
                            if next.indent > indent
                                && !(next.indent == 0 && self.is_marker(next.start)) =>
                        {
                            self.block_node(next)?;
                        }
                        // An empty item.
                        _ => return Err(Unsupported),
                    }
                }
                Some(b'-') if is_space_or_end(self.at(self.pos + 1)) => {
                    return Err(Unsupported);
                }
                Some(_) => {
                    let col = self.pos - self.line_start(self.pos);
                    if self.starts_key() {
                        self.block_map(col)?;
                    } else {
                        self.inline_value(indent)?;
                    }
                }
            }
            match self.content_line(self.pos) {
                Some(next) if next.indent == 0 && self.is_marker(next.start) => break,
                Some(next) if next.indent == indent => {
                    let first = next.first();
                    if self.at(first) == Some(b'-') && is_space_or_end(self.at(first + 1)) {
                        self.pos = first;
                    } else if indentless {
                        break;
                    } else {
                        return Err(Unsupported);
                    }
                }
                Some(next) if next.indent < indent => break,
                Some(_) => return Err(Unsupported),
                None => break,
            }
        }
        let end = self.next_token();
        self.emit(Event::SequenceEnd, end, end);
        Ok(())
    }

    /// Whether the line from the cursor starts with a plain key (`name:` followed by a space or
    /// the line's end).
    fn starts_key(&self) -> bool {
        if !self.plain_start(self.pos, false) {
            return false;
        }
        let mut i = self.pos;
        loop {
            match self.at(i) {
                None | Some(b'\n') => return false,
                Some(b':') if is_space_or_end(self.at(i + 1)) => return true,
                Some(b'#') if self.b[i - 1] == b' ' => return false,
                Some(_) => i += 1,
            }
        }
    }
}
