//! YAML with source spans: a small tree built from `saphyr-parser` events.
//!
//! Scalars are resolved with the YAML 1.2 core schema (plain `true`, `2`, `0.7`, `null`, `~`;
//! quoted scalars are always strings). Duplicate keys are reported, the first one kept. Merge
//! keys (`<<: *defaults`) are resolved, as `kubectl` resolves them.
//!
//! Two limits keep hostile input (the gateway compiles objects users submit) from exhausting
//! the stack or memory: collections nest at most [`MAX_DEPTH`] levels, and the aliases of one
//! file repeat at most [`MAX_ALIAS_NODES`] values in all. Both are reported as KINF0001 at
//! the collection or alias that crosses them, and end the reading of the file.

use std::borrow::Cow;
use std::collections::HashMap;

pub use compact_str::CompactString;
use saphyr_parser::{Event, Marker, Parser, ScalarStyle};

use crate::codes::Code;
use crate::diagnostic::Diagnostic;
use crate::path::{FieldPath, Seg};
use crate::source::{FileId, SourceFile, Span};

/// The deepest nesting of collections (mappings and lists) a document may have: a root mapping
/// of scalars is one level. The same limit holds for both parsers, and for nesting that
/// aliases build. (Policies use fewer than 10.)
pub const MAX_DEPTH: usize = 128;

/// The most values (scalars and collections) that the aliases of one file may repeat, in
/// all: each alias counts the values of the node it repeats, expanded aliases included. Keeps a
/// small file of nested aliases (a "billion laughs") from expanding exponentially.
pub const MAX_ALIAS_NODES: usize = 100_000;

/// The key of a YAML merge (`<<: *defaults`).
const MERGE_KEY: &str = "<<";

/// How a scalar was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Plain scalar, or a collection.
    Plain,
    /// `'...'` or `"..."`.
    Quoted,
    /// `|` or `>` block scalar.
    Block,
}

/// A YAML value with its span.
#[derive(Clone, Debug)]
pub struct Node {
    /// The value.
    pub value: Value,
    /// Where it was written.
    pub span: Span,
    /// How a scalar was written.
    pub style: Style,
}

/// The value of a [`Node`].
#[derive(Clone, Debug)]
pub enum Value {
    /// `null`, `~` or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(CompactString),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in source order.
    Map(Vec<Entry>),
}

/// One key/value pair of a mapping.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The key, as a string.
    pub key: CompactString,
    /// Where the key was written.
    pub key_span: Span,
    /// The value.
    pub value: Node,
}

/// One YAML document of a file.
#[derive(Clone, Debug)]
pub struct Document {
    /// The file it came from.
    pub file: FileId,
    /// 0-based index of the document in its file.
    pub index: usize,
    /// Its root node.
    pub root: Node,
    /// Its aliases (`*name`, merged ones included), in source order.
    pub aliases: Vec<AliasUse>,
}

/// An alias (`*name`) and the anchored value (`&name`) it repeats. The nodes inside the copy
/// keep the spans of the anchored value; the copy itself has the alias's span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AliasUse {
    /// Where the anchored value is written.
    pub anchored: Span,
    /// Where the alias is written.
    pub at: Span,
}

impl Value {
    /// A short name of the value's type for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

impl Node {
    /// The value of key `k`, if this is a mapping holding it.
    pub fn get(&self, k: &str) -> Option<&Node> {
        self.entry(k).map(|e| &e.value)
    }

    /// The entry of key `k`, if this is a mapping holding it.
    pub fn entry(&self, k: &str) -> Option<&Entry> {
        match &self.value {
            Value::Map(entries) => entries.iter().find(|e| e.key == k),
            _ => None,
        }
    }

    /// The string value, if this is a string scalar.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Follows a path. Returns the deepest node reached and whether the path was followed to its
    /// end, plus the span of the last key when the path ends in a key.
    pub fn lookup(&self, path: &FieldPath) -> Lookup<'_> {
        let mut node = self;
        let mut key_span = None;
        for seg in &path.0 {
            let next = match (&node.value, seg) {
                (Value::Map(entries), Seg::Key(k)) => {
                    entries.iter().find(|e| e.key == *k).map(|e| {
                        key_span = Some(e.key_span);
                        &e.value
                    })
                }
                (Value::Seq(items), Seg::Index(i)) => {
                    key_span = None;
                    items.get(*i)
                }
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => {
                    return Lookup {
                        node,
                        key_span: None,
                        complete: false,
                    };
                }
            }
        }
        Lookup {
            node,
            key_span,
            complete: true,
        }
    }

    /// Converts to JSON for schema validation and typed deserialization.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match &self.value {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Value::Str(s) => J::String(s.to_string()),
            Value::Seq(items) => J::Array(items.iter().map(Node::to_json).collect()),
            Value::Map(entries) => {
                // Keys are unique (duplicates are dropped while parsing): plain inserts, without
                // the sort buffer of `collect`.
                let mut map = serde_json::Map::new();
                for e in entries {
                    map.insert(e.key.to_string(), e.value.to_json());
                }
                J::Object(map)
            }
        }
    }

    /// Byte offset where a scalar's content starts (after an opening quote).
    pub fn content_start(&self) -> usize {
        match self.style {
            Style::Quoted => self.span.start + 1,
            _ => self.span.start,
        }
    }
}

/// Result of [`Node::lookup`].
#[derive(Clone, Copy, Debug)]
pub struct Lookup<'a> {
    /// The deepest node reached.
    pub node: &'a Node,
    /// Span of the last key followed, when the path ends in a key.
    pub key_span: Option<Span>,
    /// Whether the whole path was followed.
    pub complete: bool,
}

/// Parses every document of a file. Syntax errors are pushed to `diags`; documents that ended
/// before the error are still returned.
///
/// Files in the subset of [`crate::yaml_fast`] are read by it; the others (and all invalid
/// ones) by `saphyr-parser`. Both feed the same tree builder the same events.
pub fn parse_documents(
    id: FileId,
    file: &SourceFile,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Document> {
    let mut local = Vec::new();
    let mut builder = Builder::new(id, file, &mut local);
    let fast = crate::yaml_fast::parse_into(&file.text, &mut builder);
    // A limit the builder reported while the fast front end read the file ends it as the full
    // parser's events would (the full parser may scan past it first).
    if fast.is_ok() || builder.stopped {
        let docs = builder.docs;
        diags.append(&mut local);
        return docs;
    }
    parse_documents_full(id, file, diags)
}

/// [`parse_documents`] with `saphyr-parser` only (the reference the fast path is tested
/// against).
pub fn parse_documents_full(
    id: FileId,
    file: &SourceFile,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Document> {
    let mut builder = Builder::new(id, file, diags);
    let mut parser = Parser::new_from_str(&file.text);
    loop {
        match parser.next_event() {
            None => break,
            Some(Ok((event, span))) => {
                let start = builder.byte(span.start);
                let end = builder.byte(span.end);
                if builder.event(event, start, end) {
                    break;
                }
            }
            Some(Err(err)) => {
                let mut at = builder.byte(*err.marker());
                if err.info().contains("tab") {
                    at = offending_tab(&file.text, at);
                }
                let span = Span::new(id, at, at + 1);
                // The scanner's own bound on flow nesting (255 levels), found while it scans
                // ahead of the events: the same problem as `MAX_DEPTH`.
                let d = if err.info().contains("recursion limit exceeded") {
                    too_deep(span, "nested too deep".into())
                } else {
                    let (msg, help) = describe_scan_error(err.info());
                    Diagnostic::error(Code::YamlSyntax, msg)
                        .at(span, "here")
                        .with_help(help)
                };
                builder.diags.push(d);
                break;
            }
        }
    }
    builder.docs
}

/// Collections nested more than [`MAX_DEPTH`] levels deep.
fn too_deep(span: Span, label: String) -> Diagnostic {
    Diagnostic::error(
        Code::YamlSyntax,
        format!("collections are nested more than {MAX_DEPTH} levels deep"),
    )
    .at(span, label)
    .with_help(
        "a resource needs only a few levels of mappings and lists; look for a `[` or `{` that \
         is never closed, or an alias repeated inside itself",
    )
}

/// The tab that a scanner error about tabs at byte `at` is about. The parser marks what follows
/// a tab of indentation (`\trules:` is marked at `r`), or the start of a plain scalar whose
/// next line is indented with a tab (a line above the tab): the tab is the one at `at`, else
/// the first tab of indentation from `at`'s line on. `at` when there is none.
fn offending_tab(text: &str, at: usize) -> usize {
    if text.as_bytes().get(at) == Some(&b'\t') {
        return at;
    }
    let Some(before) = text.get(..at) else {
        return at;
    };
    let mut line_start = before.rfind(['\n', '\r']).map_or(0, |i| i + 1);
    while let Some(line) = text.get(line_start..) {
        let content = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - content.len();
        // A blank line may hold tabs.
        let blank = content.is_empty() || content.starts_with(['\n', '\r']);
        if !blank && let Some(tab) = line.get(..indent).and_then(|lead| lead.find('\t')) {
            return line_start + tab;
        }
        match line.find(['\n', '\r']) {
            Some(end) => line_start += end + 1,
            None => break,
        }
    }
    at
}

fn describe_scan_error(info: &str) -> (String, String) {
    let msg = format!("invalid YAML: {info}");
    let help = if info.contains("tab") {
        "YAML indentation must use spaces, not tabs".to_string()
    } else if info.contains("mapping values are not allowed") {
        "a `key: value` appears where it cannot start; check indentation, or quote a value that contains `: `".to_string()
    } else if info.contains("did not find expected key") || info.contains("block end") {
        "check that keys at the same level are indented by the same number of spaces".to_string()
    } else if info.contains("quoted scalar") {
        "close the quoted string with the quote it starts with".to_string()
    } else if info.contains("unknown anchor") {
        "define the anchor with `&name` before referring to it with `*name`".to_string()
    } else {
        "fix the YAML syntax at the marked position".to_string()
    };
    (msg, help)
}

/// An open collection. Its children wait on the builder's shared `items` / `entries` stacks
/// from index `base` on, and move into an exactly sized vector when it closes (no regrowth).
enum Frame {
    Seq {
        start: usize,
        anchor: usize,
        base: usize,
        shape: Shape,
    },
    Map {
        start: usize,
        anchor: usize,
        base: usize,
        pending_key: Option<(CompactString, Span)>,
        shape: Shape,
        /// The keys so far and where they are written, once the mapping has
        /// [`INDEXED_KEYS`] of them (smaller ones are scanned).
        keys: Option<HashMap<CompactString, Span>>,
    },
}

/// Entries from which an open mapping looks its keys up in an index rather than scanning them
/// for duplicates: a mapping of n keys then costs O(n), not O(n²) (a hostile document may hold
/// a mapping of a hundred thousand keys).
const INDEXED_KEYS: usize = 32;

/// What the limits need of an open collection: the document's value count when it opened, and
/// the height of its tallest child so far.
#[derive(Clone, Copy, Debug)]
struct Shape {
    nodes_before: usize,
    child_height: usize,
}

/// An anchored node, with what an alias to it adds to the limits.
struct Anchored {
    node: Node,
    /// Values in it (scalars and collections, its aliases expanded).
    nodes: usize,
    /// Levels of collections in it (0 for a scalar).
    height: usize,
}

struct Builder<'a> {
    id: FileId,
    file: &'a SourceFile,
    stack: Vec<Frame>,
    items: Vec<Node>,
    entries: Vec<Entry>,
    anchors: HashMap<usize, Anchored>,
    /// The aliases of the current document.
    aliases: Vec<AliasUse>,
    docs: Vec<Document>,
    diags: &'a mut Vec<Diagnostic>,
    /// Values read in the file so far, aliases expanded (differences give a node's size).
    nodes: usize,
    /// Values the aliases of the current document have repeated.
    alias_nodes: usize,
    /// A limit was crossed: the rest of the file is not read.
    stopped: bool,
}

impl<'a> Builder<'a> {
    fn new(id: FileId, file: &'a SourceFile, diags: &'a mut Vec<Diagnostic>) -> Self {
        Builder {
            id,
            file,
            stack: Vec::new(),
            items: Vec::new(),
            entries: Vec::new(),
            anchors: HashMap::new(),
            aliases: Vec::new(),
            docs: Vec::new(),
            diags,
            nodes: 0,
            alias_nodes: 0,
            stopped: false,
        }
    }

    fn byte(&self, m: Marker) -> usize {
        self.file.byte_at(m.line(), m.col())
    }

    fn span(&self, start: usize, end: usize) -> Span {
        Span::new(self.id, start, end)
    }

    /// Handles one event; returns true at the end of the stream, or when a limit was crossed
    /// (the rest of the file is then not read). Inlined into the event sites of the fast front
    /// end, where the event is known and only its branch remains.
    #[inline(always)]
    fn event(&mut self, event: Event<'_>, start: usize, end: usize) -> bool {
        if self.stopped {
            return true;
        }
        match event {
            Event::StreamEnd => return true,
            Event::Nothing | Event::StreamStart | Event::DocumentStart(_) | Event::DocumentEnd => {}
            Event::Alias(id) => return self.alias(id, start, end),
            Event::Scalar(text, style, anchor, tag) => {
                let len = text.len();
                let (value, style) =
                    resolve_scalar(text, style, tag.as_ref().map(|t| t.suffix.as_str()));
                let node = Node {
                    value,
                    span: self.span(start, end.max(start + len.min(1))),
                    style,
                };
                self.nodes += 1;
                if anchor > 0 {
                    self.anchors.insert(
                        anchor,
                        Anchored {
                            node: node.clone(),
                            nodes: 1,
                            height: 0,
                        },
                    );
                }
                self.push(node, 0);
            }
            Event::SequenceStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.too_deep(start, end, None);
                }
                let shape = self.open();
                self.stack.push(Frame::Seq {
                    start,
                    anchor,
                    base: self.items.len(),
                    shape,
                });
            }
            Event::MappingStart(anchor, _) => {
                if self.stack.len() >= MAX_DEPTH {
                    return self.too_deep(start, end, None);
                }
                let shape = self.open();
                self.stack.push(Frame::Map {
                    start,
                    anchor,
                    base: self.entries.len(),
                    pending_key: None,
                    shape,
                    keys: None,
                });
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let (value, frame_start, anchor, shape) = match self.stack.pop() {
                    Some(Frame::Seq {
                        start,
                        anchor,
                        base,
                        shape,
                    }) => (
                        Value::Seq(self.items.drain(base..).collect()),
                        start,
                        anchor,
                        shape,
                    ),
                    Some(Frame::Map {
                        start,
                        anchor,
                        base,
                        shape,
                        ..
                    }) => (Value::Map(self.merge_keys(base)), start, anchor, shape),
                    None => return false,
                };
                let end = self.collection_end(&value, frame_start, end);
                let node = Node {
                    value,
                    span: self.span(frame_start, end),
                    style: Style::Plain,
                };
                let height = shape.child_height + 1;
                if anchor > 0 {
                    self.anchors.insert(
                        anchor,
                        Anchored {
                            node: node.clone(),
                            nodes: self.nodes - shape.nodes_before,
                            height,
                        },
                    );
                }
                self.push(node, height);
            }
        }
        false
    }

    /// The entries of the mapping that closes (from `base` on), its merge keys resolved as
    /// YAML 1.1 and Kubernetes' YAML reader (so `kubectl apply`) resolve them: `<<: *defaults`
    /// or `<<: [*a, *b]` adds the entries of the merged mappings that the mapping does not set
    /// itself, an earlier mapping of the list winning over a later one. A merge key whose value
    /// is not a mapping (or a list of mappings) is reported.
    fn merge_keys(&mut self, base: usize) -> Vec<Entry> {
        if !self
            .entries
            .get(base..)
            .is_some_and(|open| open.iter().any(|e| e.key == MERGE_KEY))
        {
            return self.entries.drain(base..).collect();
        }
        let mut own: Vec<Entry> = Vec::new();
        let mut merged: Vec<Entry> = Vec::new();
        for e in self.entries.drain(base..).collect::<Vec<_>>() {
            if e.key != MERGE_KEY {
                own.push(e);
                continue;
            }
            let sources = match e.value.value {
                Value::Seq(items) => items,
                _ => vec![e.value],
            };
            for n in sources {
                match n.value {
                    Value::Map(entries) => merged.extend(entries),
                    other => self.diags.push(
                        Diagnostic::error(
                            Code::YamlSyntax,
                            format!(
                                "a merge key (`<<`) takes a mapping or a list of mappings, found {}",
                                other.type_name()
                            ),
                        )
                        .at(n.span, "not a mapping")
                        .with_help(
                            "merge the fields of an anchored mapping with `<<: *name`, or write \
                             the fields out",
                        ),
                    ),
                }
            }
        }
        // A set, not a scan of `own` per entry: a merged mapping may be large.
        let mut keys: std::collections::HashSet<CompactString> =
            own.iter().map(|e| e.key.clone()).collect();
        for m in merged {
            if keys.insert(m.key.clone()) {
                own.push(m);
            }
        }
        own
    }

    /// Counts a collection that opens, and returns its [`Shape`].
    fn open(&mut self) -> Shape {
        let shape = Shape {
            nodes_before: self.nodes,
            child_height: 0,
        };
        self.nodes += 1;
        shape
    }

    /// An alias: a copy of its anchored node, within the limits. Returns true when a limit
    /// stops the reading.
    fn alias(&mut self, id: usize, start: usize, end: usize) -> bool {
        let span = self.span(start, end);
        let Some(a) = self.anchors.get(&id) else {
            // The parser knows the anchor: it belongs to an earlier document.
            self.diags.push(
                Diagnostic::error(
                    Code::YamlSyntax,
                    "this alias names an anchor of an earlier document",
                )
                .at(span, "not an anchor of this document")
                .with_help("anchors (`&name`) hold only within their document (after `---`)"),
            );
            self.nodes += 1;
            let node = Node {
                value: Value::Null,
                span,
                style: Style::Plain,
            };
            self.push(node, 0);
            return false;
        };
        let (nodes, height) = (a.nodes, a.height);
        if self.stack.len() + height > MAX_DEPTH {
            return self.too_deep(start, end, Some(height));
        }
        if self.alias_nodes + nodes > MAX_ALIAS_NODES {
            self.diags.push(
                Diagnostic::error(
                    Code::YamlSyntax,
                    format!("the aliases of this file repeat more than {MAX_ALIAS_NODES} values"),
                )
                .at(
                    span,
                    format!(
                        "repeats {nodes} value(s), after {} already repeated",
                        self.alias_nodes
                    ),
                )
                .with_help(
                    "aliases (`*name`) of anchors (`&name`) that hold other aliases grow \
                     exponentially: write the values out, or repeat fewer of them",
                ),
            );
            self.stopped = true;
            return true;
        }
        self.alias_nodes += nodes;
        self.nodes += nodes;
        self.aliases.push(AliasUse {
            anchored: a.node.span,
            at: span,
        });
        let node = Node {
            span,
            ..a.node.clone()
        };
        self.push(node, height);
        false
    }

    /// Reports a collection (or an alias, with the height of what it repeats) that would nest
    /// collections more than [`MAX_DEPTH`] levels deep, and stops the reading.
    fn too_deep(&mut self, start: usize, end: usize, alias_height: Option<usize>) -> bool {
        let span = self.span(start, end.max(start + 1));
        let label = match alias_height {
            None => format!("level {}", self.stack.len() + 1),
            Some(h) => format!(
                "repeats {h} level(s) of collections at level {}",
                self.stack.len() + 1
            ),
        };
        self.diags.push(too_deep(span, label));
        self.stopped = true;
        true
    }

    /// Block collections end where their last child ends (the parser reports the end marker
    /// at the start of the next token, which may be lines below).
    fn collection_end(&self, value: &Value, start: usize, reported: usize) -> usize {
        let last = match value {
            Value::Seq(items) => items.last().map(|n| n.span.end),
            // The furthest entry: entries merged in (`<<: *a`) come last, from their anchor.
            Value::Map(entries) => entries
                .iter()
                .map(|e| e.value.span.end.max(e.key_span.end))
                .max(),
            _ => None,
        };
        match last {
            Some(end)
                if reported > end
                    && self
                        .file
                        .text
                        .get(end..reported)
                        .is_some_and(|s| s.contains(['\n', '\r']) || s.trim().is_empty()) =>
            {
                end
            }
            _ => reported.max(start),
        }
    }

    /// Adds a finished node (`height` levels of collections) to the open collection, or as a
    /// document's root.
    fn push(&mut self, node: Node, height: usize) {
        match self.stack.last_mut() {
            None => {
                // A document ends. Its anchors end with it (YAML's anchors are per document);
                // the alias budget is the file's, so that many small bombs in one file cannot
                // add up to one large one.
                self.anchors.clear();
                let aliases = std::mem::take(&mut self.aliases);
                if !matches!(node.value, Value::Null) {
                    let index = self.docs.len();
                    self.docs.push(Document {
                        file: self.id,
                        index,
                        root: node,
                        aliases,
                    });
                }
            }
            Some(Frame::Seq { shape, .. }) => {
                shape.child_height = shape.child_height.max(height);
                self.items.push(node);
            }
            Some(Frame::Map {
                base,
                pending_key,
                shape,
                keys,
                ..
            }) => match pending_key.take() {
                None => {
                    let key_span = node.span;
                    let key = match node.value {
                        Value::Str(s) => s,
                        Value::Null => CompactString::const_new("null"),
                        Value::Bool(b) => CompactString::from(b.to_string()),
                        Value::Int(i) => CompactString::from(i.to_string()),
                        Value::Float(f) => CompactString::from(f.to_string()),
                        Value::Seq(_) | Value::Map(_) => {
                            self.diags.push(
                                Diagnostic::error(
                                    Code::YamlSyntax,
                                    "a mapping key must be a scalar".to_string(),
                                )
                                .at(key_span, "complex key")
                                .with_help("write keys as plain strings such as `name:`"),
                            );
                            CompactString::default()
                        }
                    };
                    *pending_key = Some((key, key_span));
                }
                Some((key, key_span)) => {
                    shape.child_height = shape.child_height.max(height);
                    let entries = &mut self.entries;
                    let open = entries.get(*base..).unwrap_or(&[]);
                    if keys.is_none() && open.len() >= INDEXED_KEYS {
                        *keys = Some(open.iter().map(|e| (e.key.clone(), e.key_span)).collect());
                    }
                    let first = match keys {
                        Some(index) => index.get(&key).copied(),
                        None => open.iter().find(|e| e.key == key).map(|e| e.key_span),
                    };
                    if let Some(first_span) = first {
                        self.diags.push(
                            Diagnostic::error(Code::DuplicateKey, format!("duplicate key `{key}`"))
                                .at(key_span, "repeated here")
                                .with_related(first_span, "first written here")
                                .with_help(
                                    "remove one of the two keys; only the first would be used",
                                ),
                        );
                    } else {
                        if let Some(index) = keys {
                            index.insert(key.clone(), key_span);
                        }
                        entries.push(Entry {
                            key,
                            key_span,
                            value: node,
                        });
                    }
                }
            },
        }
    }
}

impl<'t> crate::yaml_fast::Sink<'t> for Builder<'_> {
    #[inline(always)]
    fn event(&mut self, event: Event<'t>, start: usize, end: usize) {
        Builder::event(self, event, start, end);
    }
}

/// Takes the scalar's text by value: the parser hands over an owned string for most scalars,
/// which then becomes the node's without a copy.
fn resolve_scalar(text: Cow<'_, str>, style: ScalarStyle, tag: Option<&str>) -> (Value, Style) {
    let quoted = match style {
        ScalarStyle::Plain => Style::Plain,
        ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => Style::Quoted,
        ScalarStyle::Literal | ScalarStyle::Folded => Style::Block,
    };
    if let Some(tag) = tag {
        match tag {
            "str" => return (Value::Str(compact(text)), quoted),
            "int" => {
                if let Ok(i) = text.parse() {
                    return (Value::Int(i), quoted);
                }
            }
            "float" => {
                if let Ok(f) = text.parse() {
                    return (Value::Float(f), quoted);
                }
            }
            _ => {}
        }
    }
    if quoted != Style::Plain {
        return (Value::Str(compact(text)), quoted);
    }
    // Most plain scalars (keys, names) start with a letter that no special value (`null`,
    // `true`, `false`, `.inf`, ...) and no number starts with: strings, without the comparisons.
    if text.as_bytes().first().is_some_and(|b| {
        b.is_ascii_alphabetic() && !matches!(b, b'n' | b'N' | b't' | b'T' | b'f' | b'F')
    }) {
        return (Value::Str(compact(text)), Style::Plain);
    }
    (resolve_plain(text), Style::Plain)
}

/// A plain scalar's value by YAML 1.2's core schema: null, booleans, special floats, numbers,
/// otherwise a string.
fn resolve_plain(text: Cow<'_, str>) -> Value {
    match &*text {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        "true" | "True" | "TRUE" => Value::Bool(true),
        "false" | "False" | "FALSE" => Value::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => Value::Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => Value::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => Value::Float(f64::NAN),
        _ => match parse_number(&text) {
            Some(v) => v,
            None => Value::Str(compact(text)),
        },
    }
}

fn parse_number(text: &str) -> Option<Value> {
    let digits = text.strip_prefix(['-', '+']).unwrap_or(text);
    if let Some((radix, digits)) = radix_literal(text) {
        // Past `i64`, still a number, as a decimal one is (the core schema's `0x` / `0o`
        // integers have no size limit): a float, which range checks report as too large.
        return match radix_digits(digits, radix) {
            Some(i) => Some(Value::Int(i)),
            None => radix_digits_f64(digits, radix).map(Value::Float),
        };
    }
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        // An integer past `i64` is still a number (a float, as JSON would read it), not a
        // string: range checks then report it as too large.
        return Some(match text.parse() {
            Ok(i) => Value::Int(i),
            Err(_) => Value::Float(text.parse().ok()?),
        });
    }
    let first = digits.bytes().next()?;
    let looks_numeric = (first.is_ascii_digit() || first == b'.')
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && digits.bytes().any(|b| b.is_ascii_digit());
    if looks_numeric {
        return text.parse::<f64>().ok().map(Value::Float);
    }
    None
}

/// The radix and digits of a plain scalar written with a YAML 1.2 core schema prefix: `0x`
/// (hexadecimal) or `0o` (octal). Whether the digits are valid is [`radix_digits`]'s to say.
pub(crate) fn radix_literal(text: &str) -> Option<(u32, &str)> {
    if let Some(hex) = text.strip_prefix("0x") {
        Some((16, hex))
    } else {
        text.strip_prefix("0o").map(|oct| (8, oct))
    }
}

/// The value of the digits of a `0x` / `0o` integer: digits of `radix` only. The core schema's
/// `0x[0-9a-fA-F]+` and `0o[0-7]+` take no sign (`i64::from_str_radix` would take one: `0x-5`
/// would be -5), so a signed one is not a number but a string, as `0xZZ` is. `None` also past
/// the range of `i64`.
pub(crate) fn radix_digits(digits: &str, radix: u32) -> Option<i64> {
    if !are_radix_digits(digits, radix) {
        return None;
    }
    i64::from_str_radix(digits, radix).ok()
}

/// Whether `digits` are one or more digits of `radix`, and nothing else (no sign).
pub(crate) fn are_radix_digits(digits: &str, radix: u32) -> bool {
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

/// The value of the digits of a `0x` / `0o` integer as a float, whatever its size (infinite
/// past `f64`, as a decimal integer of over 308 digits is); `None` when the digits are not
/// those of `radix` (or there are none), as for [`radix_digits`].
fn radix_digits_f64(digits: &str, radix: u32) -> Option<f64> {
    if digits.is_empty() {
        return None;
    }
    digits.chars().try_fold(0.0_f64, |acc, c| {
        c.to_digit(radix)
            .map(|d| acc * f64::from(radix) + f64::from(d))
    })
}

/// A scalar's text as a [`CompactString`]: short texts (most keys and values) inline, long
/// owned texts keep their buffer.
fn compact(text: Cow<'_, str>) -> CompactString {
    match text {
        Cow::Borrowed(s) => CompactString::from(s),
        Cow::Owned(s) => CompactString::from(s),
    }
}

/// At most this many aliases are noted on one diagnostic; the last note counts the others.
const MAX_ALIAS_NOTES: usize = 4;

/// Notes, on each diagnostic that stands for repeats (`repeated`, from
/// [`crate::diagnostic::merge_repeats`]), the aliases of `docs` that repeat the value it is
/// about: those whose anchored value holds its primary span, innermost first.
///
/// Anchored values are nodes of the source, so their spans nest or are apart: the ones holding
/// a span are a chain of parents, found from the last one starting before it (a binary search)
/// in at most as many steps as collections nest.
pub(crate) fn note_aliases(
    diags: &mut [Diagnostic],
    repeated: &[bool],
    docs: &[Document],
    sources: &crate::source::Sources,
) {
    if !repeated.contains(&true) {
        return;
    }
    // Each anchored value once, with its aliases, by position (outer first on a tie).
    let mut uses: HashMap<Span, Vec<Span>> = HashMap::new();
    for u in docs.iter().flat_map(|d| &d.aliases) {
        uses.entry(u.anchored).or_default().push(u.at);
    }
    let mut anchored: Vec<(Span, Vec<Span>)> = uses.into_iter().collect();
    anchored.sort_by_key(|(s, _)| (s.file, s.start, std::cmp::Reverse(s.end)));
    // The innermost anchored value holding each one.
    let mut parent: Vec<Option<usize>> = Vec::with_capacity(anchored.len());
    let mut open: Vec<usize> = Vec::new();
    for (i, (s, _)) in anchored.iter().enumerate() {
        while let Some(&top) = open.last() {
            match anchored.get(top) {
                Some((t, _)) if t.file == s.file && t.start <= s.start && s.end <= t.end => break,
                _ => {
                    open.pop();
                }
            }
        }
        parent.push(open.last().copied());
        open.push(i);
    }
    for (d, _) in diags.iter_mut().zip(repeated).filter(|(_, r)| **r) {
        let Some((p, _)) = d.primary else {
            continue;
        };
        let after = anchored.partition_point(|(s, _)| (s.file, s.start) <= (p.file, p.start));
        let mut at = after.checked_sub(1);
        let mut notes: Vec<Span> = Vec::new();
        while let Some(i) = at {
            let Some((s, aliases)) = anchored.get(i) else {
                break;
            };
            if s.file != p.file {
                break;
            }
            if s.start <= p.start && p.end <= s.end {
                notes.extend(aliases.iter().copied());
            }
            at = parent.get(i).copied().flatten();
        }
        let more = notes.len().saturating_sub(MAX_ALIAS_NOTES);
        notes.truncate(MAX_ALIAS_NOTES);
        let last = notes.len().saturating_sub(1);
        for (k, at) in notes.into_iter().enumerate() {
            let alias = sources
                .get(at.file)
                .and_then(|f| f.text.get(at.start..at.end))
                .unwrap_or("the alias");
            let label = if k == last && more > 0 {
                let s = if more == 1 { "" } else { "es" };
                format!("`{alias}` repeats it here (and {more} other alias{s})")
            } else {
                format!("`{alias}` repeats it here")
            };
            d.related.push((at, label));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Plain scalar resolution without the letter shortcut.
    fn reference(text: &str) -> Value {
        resolve_plain(Cow::Borrowed(text))
    }

    fn check(text: &str) {
        let (v, style) = resolve_scalar(Cow::Borrowed(text), ScalarStyle::Plain, None);
        assert_eq!(style, Style::Plain);
        assert_eq!(
            format!("{v:?}"),
            format!("{:?}", reference(text)),
            "{text:?}"
        );
    }

    #[test]
    fn radix_integers_take_no_sign() {
        let int = |t: &str| match reference(t) {
            Value::Int(i) => Some(i),
            _ => None,
        };
        assert_eq!(int("0x1f"), Some(31));
        assert_eq!(int("0xFF"), Some(255));
        assert_eq!(int("0o17"), Some(15));
        // A sign after the prefix (which `from_str_radix` accepts), or before it, makes the
        // scalar a string, as invalid digits do.
        for t in [
            "0x-5", "0x+5", "0o-7", "0o+7", "-0x5", "+0x5", "0x", "0o", "0o8", "0xZZ", "0x 5",
        ] {
            assert!(matches!(reference(t), Value::Str(ref s) if s == t), "{t:?}");
        }
    }

    #[test]
    fn radix_integers_past_i64_are_numbers() {
        // As a decimal integer past `i64` is: a float, not a string.
        let float = |t: &str| match reference(t) {
            Value::Float(f) => Some(f),
            _ => None,
        };
        assert_eq!(
            float("0x8000000000000000"),
            Some(9_223_372_036_854_775_808.0)
        );
        assert_eq!(
            float("0o1000000000000000000000"),
            Some(9_223_372_036_854_775_808.0)
        );
        assert_eq!(float("0xFFFFFFFFFFFFFFFFFFFF"), Some(2.0_f64.powi(80)));
        assert_eq!(
            float(&format!("0x{}", "f".repeat(300))),
            Some(f64::INFINITY)
        );
        assert!(matches!(
            reference("0x7FFFFFFFFFFFFFFF"),
            Value::Int(i64::MAX)
        ));
        // Signed or with foreign digits, still strings, whatever their size.
        for t in [
            "0x-8000000000000000",
            "-0x8000000000000000",
            "0o9000000000000000000000",
        ] {
            assert!(matches!(reference(t), Value::Str(ref s) if s == t), "{t:?}");
        }
    }

    #[test]
    fn plain_scalars_resolve_as_before() {
        for t in [
            "", "~", "null", "Null", "NULL", "nul", "true", "True", "TRUE", "false", "False",
            "FALSE", "no", "yes", "on", "off", "inf", "Inf", "nan", "NaN", ".inf", "-.inf",
            "+.INF", ".nan", "0x1f", "0o17", "0b1", "12", "-12", "+3", "1.5", "1e3", "e3", "E3",
            "x1", "model-3", "Local", "a: b", "é",
        ] {
            check(t);
        }
    }

    proptest! {
        #[test]
        fn plain_scalars_resolve_as_before_prop(t in "[a-zA-Z0-9.~+\\-_ :]{0,10}") {
            check(&t);
        }
    }
}
