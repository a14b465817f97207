//! The built-in complexity estimator: `complexity-low|medium|high` from a points score over
//! documented features of the whole conversation (see `docs/reference/classifiers.md`).

use std::sync::Arc;

use serde::Serialize;

use super::Message;

/// The three levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComplexityLevel {
    /// `complexity-low`.
    Low,
    /// `complexity-medium`.
    Medium,
    /// `complexity-high`.
    High,
}

impl ComplexityLevel {
    /// The tag.
    pub fn as_tag(self) -> &'static str {
        match self {
            ComplexityLevel::Low => "complexity-low",
            ComplexityLevel::Medium => "complexity-medium",
            ComplexityLevel::High => "complexity-high",
        }
    }
}

/// Thresholds. A feature scores 0, 1 or 2 points: 1 at its first threshold, 2 at its second.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ComplexityConfig {
    /// Estimated prompt tokens (bytes of content / 4): 1 point at 256, 2 at 1024, 3 at 4096.
    pub tokens: [usize; 3],
    /// Conversation turns (non-system messages; text [`Message`] marks `also_seen` is no turn).
    pub turns: [usize; 2],
    /// Code: fenced blocks count 5 lines each, plus code-like lines.
    pub code_lines: [usize; 2],
    /// Math notation markers.
    pub math: [usize; 2],
    /// Multi-step markers (numbered list items, `first`, `then`, `next`, `finally`, `step`...).
    pub steps: [usize; 2],
    /// Question marks (not those starting a URL's query string).
    pub questions: [usize; 2],
    /// Score at which a request is medium.
    pub medium_at: u32,
    /// Score at which a request is high.
    pub high_at: u32,
}

impl Default for ComplexityConfig {
    fn default() -> Self {
        ComplexityConfig {
            tokens: [256, 1024, 4096],
            turns: [4, 10],
            code_lines: [3, 20],
            math: [2, 6],
            steps: [3, 6],
            questions: [2, 5],
            medium_at: 2,
            high_at: 5,
        }
    }
}

/// Feature values of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    /// Bytes of content / 4 over all messages.
    pub tokens: usize,
    /// Non-system messages; text [`Message`] marks `also_seen` is not counted.
    pub turns: usize,
    /// Code-like lines plus 5 per fenced block.
    pub code_lines: usize,
    /// Math markers.
    pub math: usize,
    /// Multi-step markers.
    pub steps: usize,
    /// Question marks, but not those starting a URL's query string (`https://x.com/a?b=1`,
    /// `www.x.com/a?b=1`, `x.com/a?b=1`).
    pub questions: usize,
}

const STEP_WORDS: &[&str] = &[
    "first",
    "firstly",
    "then",
    "next",
    "finally",
    "afterwards",
    "step",
    "secondly",
    "lastly",
];
const MATH_WORDS: &[&str] = &[
    "\\frac",
    "\\sum",
    "\\int",
    "\\sqrt",
    "\\begin{equation",
    "\\alpha",
    "\\lim",
    "$$",
    "∑",
    "∫",
    "√",
    "≤",
    "≥",
    "≠",
    "∀",
    "∃",
    "integral",
    "derivative",
    "theorem",
    "prove",
    "eigenvalue",
    "matrix",
    "equation",
];

/// The complexity classifier.
#[derive(Clone, Debug)]
pub struct Complexity {
    config: ComplexityConfig,
    tags: [Arc<str>; 3],
}

impl Complexity {
    /// A classifier with these thresholds.
    pub fn new(config: ComplexityConfig) -> Self {
        Complexity {
            config,
            tags: [
                Arc::from("complexity-low"),
                Arc::from("complexity-medium"),
                Arc::from("complexity-high"),
            ],
        }
    }

    /// The thresholds.
    pub fn config(&self) -> &ComplexityConfig {
        &self.config
    }

    /// The tag of a level.
    pub fn tag(&self, level: ComplexityLevel) -> Arc<str> {
        let [l, m, h] = &self.tags;
        Arc::clone(match level {
            ComplexityLevel::Low => l,
            ComplexityLevel::Medium => m,
            ComplexityLevel::High => h,
        })
    }

    /// The features of a request: one pass over the bytes of each message (lines, `?`, words
    /// and math symbols together).
    pub fn features(&self, messages: &[Message<'_>]) -> Features {
        let mut f = Features::default();
        let mut bytes = 0usize;
        for m in messages {
            bytes += m.content.len();
            // A tool call's arguments or a later batch prompt is part of a message, not a turn.
            if m.role != "system" && !m.also_seen {
                f.turns += 1;
            }
            scan(m.content, &mut f);
        }
        f.tokens = bytes / 4;
        f
    }

    /// The score of a request's features.
    pub fn score(&self, f: &Features) -> u32 {
        let c = &self.config;
        let two = |v: usize, t: [usize; 2]| u32::from(v >= t[0]) + u32::from(v >= t[1]);
        let tokens = c.tokens.iter().filter(|t| f.tokens >= **t).count() as u32;
        tokens
            + two(f.turns, c.turns)
            + two(f.code_lines, c.code_lines)
            + two(f.math, c.math)
            + two(f.steps, c.steps)
            + two(f.questions, c.questions)
    }

    /// The level of a request.
    pub fn level(&self, messages: &[Message<'_>]) -> ComplexityLevel {
        let s = self.score(&self.features(messages));
        if s >= self.config.high_at {
            ComplexityLevel::High
        } else if s >= self.config.medium_at {
            ComplexityLevel::Medium
        } else {
            ComplexityLevel::Low
        }
    }
}

/// Byte classes of the scan.
const OTHER: u8 = 0;
const ALNUM: u8 = 1;
const QUESTION: u8 = 2;
const NEWLINE: u8 = 3;
const BACKSLASH: u8 = 4;
const DOLLAR: u8 = 5;
/// First byte of the UTF-8 math symbols (`∑`, `∫`, `√`, `≤`, `≥`, `≠`, `∀`, `∃`).
const E2: u8 = 6;

static CLASS: [u8; 256] = {
    let mut t = [OTHER; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = if c.is_ascii_alphanumeric() {
            ALNUM
        } else {
            match c {
                b'?' => QUESTION,
                b'\n' => NEWLINE,
                b'\\' => BACKSLASH,
                b'$' => DOLLAR,
                0xE2 => E2,
                _ => OTHER,
            }
        };
        b += 1;
    }
    t
};

/// The LaTeX commands counted as math (matched ASCII case-insensitively, wherever they occur).
const LATEX: &[&str] = &[
    "\\frac",
    "\\sum",
    "\\int",
    "\\sqrt",
    "\\begin{equation",
    "\\alpha",
    "\\lim",
];

/// The math symbols after their first byte `0xE2`.
const SYMBOL_TAILS: &[[u8; 2]] = &[
    [0x88, 0x91], // ∑
    [0x88, 0xAB], // ∫
    [0x88, 0x9A], // √
    [0x89, 0xA4], // ≤
    [0x89, 0xA5], // ≥
    [0x89, 0xA0], // ≠
    [0x88, 0x80], // ∀
    [0x88, 0x83], // ∃
];

/// Adds the features of one message's text to `f`, in one pass over its bytes. Matches
/// `STEP_WORDS` and `MATH_WORDS` as a leftmost-longest, non-overlapping scan would: a word
/// counts when it is a whole run of ASCII letters and digits; a LaTeX command, `$$` or a math
/// symbol counts wherever it starts, and what it covers is not read again. A `?` inside a URL
/// ([`UrlMemo`]) that a query character follows ([`query_byte`]) starts its query string and
/// is no question.
fn scan(text: &str, f: &mut Features) {
    let bytes = text.as_bytes();
    let mut urls = UrlMemo::default();
    let mut in_fence = false;
    let mut line_start = 0;
    // Start of the run of ASCII letters and digits being read, when it is a word: not glued
    // to a LaTeX command before it (`\fracx`).
    let mut word: Option<usize> = None;
    // Whether the byte before `i` is an ASCII letter or digit.
    let mut after_alnum = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let class = CLASS[usize::from(b)];
        if class == ALNUM {
            if !after_alnum {
                word = Some(i);
                after_alnum = true;
            }
            i += 1;
            continue;
        }
        if let Some(start) = word.take() {
            count_word(bytes.get(start..i).unwrap_or_default(), f);
        }
        after_alnum = false;
        i += match class {
            QUESTION => {
                // The URL test only for a `?` that a query byte follows: questions are few, and
                // tracking URLs at every byte made the scan 10 % slower.
                if !(bytes.get(i + 1).is_some_and(|b| query_byte(*b)) && urls.in_url(bytes, i)) {
                    f.questions += 1;
                }
                1
            }
            NEWLINE => {
                line(text.get(line_start..i).unwrap_or(""), &mut in_fence, f);
                line_start = i + 1;
                1
            }
            BACKSLASH => match latex_at(bytes.get(i..).unwrap_or_default()) {
                Some(cmd) => {
                    f.math += 1;
                    after_alnum = cmd.last().is_some_and(u8::is_ascii_alphanumeric);
                    cmd.len()
                }
                None => 1,
            },
            DOLLAR if bytes.get(i + 1) == Some(&b'$') => {
                f.math += 1;
                2
            }
            E2 if bytes
                .get(i + 1..i + 3)
                .is_some_and(|tail| SYMBOL_TAILS.iter().any(|t| t == tail)) =>
            {
                f.math += 1;
                3
            }
            _ => 1,
        };
    }
    if let Some(start) = word {
        count_word(bytes.get(start..).unwrap_or_default(), f);
    }
    line(text.get(line_start..).unwrap_or(""), &mut in_fence, f);
}

/// Whether a position is inside a URL (from `://` after a letter or digit, or from `www.` after
/// no letter or digit, to the next [`url_end`] byte; or in a word that starts with a bare host
/// and a path, `x.com/a`, see [`bare_host`]), found by reading back from it; what was read is
/// remembered, so that the positions asked about, in increasing order, read each byte at most
/// once in all.
#[derive(Default)]
struct UrlMemo {
    /// The positions before this one have been read.
    read_to: usize,
    /// Whether a URL start (`://`, `www.`) is before `read_to` in its word.
    scheme: bool,
    /// Where the word holding `read_to` starts (meaningful while `scheme` is false).
    word_start: usize,
    /// Whether the word starts with a bare host and a path, once its first `/` has been read.
    bare: Option<bool>,
    /// The word has no `/` before this position.
    slash_from: usize,
}

impl UrlMemo {
    /// Whether `at` (not before the previous `at`) is inside a URL. Out of line: inlined, it
    /// made the scan loop slower for every byte.
    #[inline(never)]
    fn in_url(&mut self, bytes: &[u8], at: usize) -> bool {
        let from = self.read_to.min(at);
        for j in (from..at).rev() {
            let b = bytes.get(j).copied().unwrap_or(b'\n');
            if url_end(b) {
                // A new word: what was remembered is of an earlier one.
                self.scheme = false;
                self.word_start = j + 1;
                self.bare = None;
                self.slash_from = j + 1;
                break;
            }
            let alnum_before = || {
                j.checked_sub(1)
                    .and_then(|p| bytes.get(p))
                    .is_some_and(u8::is_ascii_alphanumeric)
            };
            let scheme = b == b':' && bytes.get(j + 1..j + 3) == Some(b"//") && alnum_before();
            // A URL without a scheme (`www.x.com/a?b=1`).
            let www = matches!(b, b'w' | b'W')
                && bytes
                    .get(j..j + 4)
                    .is_some_and(|w| w.eq_ignore_ascii_case(b"www."))
                && !alnum_before();
            if scheme || www {
                self.scheme = true;
                break;
            }
        }
        self.read_to = at;
        if self.scheme {
            return true;
        }
        if self.bare.is_none() {
            let tail = bytes.get(self.slash_from..at).unwrap_or_default();
            match tail.iter().position(|&b| b == b'/') {
                Some(k) => {
                    let word = bytes
                        .get(self.word_start..self.slash_from + k)
                        .unwrap_or_default();
                    self.bare = Some(bare_host(word));
                }
                None => self.slash_from = at,
            }
        }
        self.bare == Some(true)
    }
}

/// Whether the text before a word's first `/` ends in a host name (`x.com`, `api.example.org`):
/// letters, digits and `-` in two or more labels separated by `.`, the last of two or more
/// letters, not glued to a letter, digit, `.` or `-` before it. So `x.com/a?b=1` and
/// `(docs.rs/serde?search=x)` are URLs, and `and/or?`, `1.5/2?` and `e.g./?` are not.
fn bare_host(before_slash: &[u8]) -> bool {
    let host_byte = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-');
    let run = before_slash
        .iter()
        .rev()
        .take_while(|b| host_byte(b))
        .count();
    let host = before_slash
        .get(before_slash.len() - run..)
        .unwrap_or_default();
    let mut labels = host.split(|&b| b == b'.');
    let Some(tld) = labels.next_back() else {
        return false;
    };
    let mut others = 0;
    for label in labels {
        if label.is_empty() {
            return false;
        }
        others += 1;
    }
    others > 0 && tld.len() >= 2 && tld.iter().all(u8::is_ascii_alphabetic)
}

/// A byte that ends a URL: ASCII whitespace (the line break included), `"`, `<`, `>` and
/// `` ` ``.
fn url_end(b: u8) -> bool {
    matches!(
        b,
        b' ' | b'\t' | b'\n' | b'\r' | 0x0C | b'"' | b'<' | b'>' | b'`'
    )
}

/// A byte that continues a URL's query string after its `?`: an ASCII letter or digit, or one
/// of `=&%_-~+/[`. After anything else (a space, `.`, `)`, `?`, the end) the `?` ends a
/// question (`Have you seen https://x.com/a?`).
fn query_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'=' | b'&' | b'%' | b'_' | b'-' | b'~' | b'+' | b'/' | b'['
        )
}

/// The LaTeX command that `rest` starts with, if any.
fn latex_at(rest: &[u8]) -> Option<&'static [u8]> {
    LATEX.iter().map(|c| c.as_bytes()).find(|c| {
        rest.get(..c.len())
            .is_some_and(|r| r.eq_ignore_ascii_case(c))
    })
}

/// Counts `word` (a whole run of ASCII letters and digits) if it is a step or a math word.
fn count_word(word: &[u8], f: &mut Features) {
    match word_kind(word) {
        Some(true) => f.steps += 1,
        Some(false) => f.math += 1,
        None => {}
    }
}

/// For each word length up to 10, bit `c - b'a'` is set when a listed word (`STEP_WORDS`,
/// `MATH_WORDS`) of 4 to 10 ASCII letters has that length and starts with letter `c`: most
/// words are ruled out by one lookup, before any comparison.
static LISTED_WORDS: [u32; 11] = {
    let mut t = [0u32; 11];
    let lists = [STEP_WORDS, MATH_WORDS];
    let mut l = 0;
    while l < lists.len() {
        let mut w = 0;
        while w < lists[l].len() {
            let b = lists[l][w].as_bytes();
            if b.len() >= 4 && b.len() < t.len() && is_ascii_letters(b) {
                t[b.len()] |= 1 << (b[0].to_ascii_lowercase() - b'a');
            }
            w += 1;
        }
        l += 1;
    }
    t
};

const fn is_ascii_letters(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_alphabetic() {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `word` (a run of ASCII letters and digits) may be a listed word: its length and
/// first letter are those of one.
fn may_be_listed(word: &[u8]) -> bool {
    let (Some(first), Some(mask)) = (word.first(), LISTED_WORDS.get(word.len())) else {
        return false;
    };
    let letter = first.to_ascii_lowercase().wrapping_sub(b'a');
    letter < 26 && mask & (1 << letter) != 0
}

/// `Some(true)` for a step word, `Some(false)` for a math word (ASCII case-insensitive).
fn word_kind(word: &[u8]) -> Option<bool> {
    if !may_be_listed(word) {
        return None;
    }
    let eq = |w: &&str| word.eq_ignore_ascii_case(w.as_bytes());
    if STEP_WORDS.iter().any(eq) {
        Some(true)
    } else if MATH_WORDS.iter().any(eq) {
        Some(false)
    } else {
        None
    }
}

/// The per-line features (fences, code lines, numbered list items) of one line.
fn line(line: &str, in_fence: &mut bool, f: &mut Features) {
    let t = line.trim();
    if t.is_empty() {
        return;
    }
    if t.starts_with("```") {
        if !*in_fence {
            f.code_lines += 5;
        }
        *in_fence = !*in_fence;
        return;
    }
    if *in_fence {
        return;
    }
    if is_code_line(t) {
        f.code_lines += 1;
    }
    if is_list_item(t) {
        f.steps += 1;
    }
}

/// A line that looks like code: ends with `;`, `{` or `}`, or starts with a keyword of a common
/// language.
fn is_code_line(t: &str) -> bool {
    if t.is_empty() {
        return false;
    }
    const STARTS: &[&str] = &[
        "def ",
        "fn ",
        "class ",
        "import ",
        "from ",
        "#include",
        "function ",
        "return ",
        "const ",
        "let ",
        "var ",
        "pub ",
        "public ",
        "private ",
        "if (",
        "for (",
        "while (",
        "SELECT ",
        "package ",
        "func ",
        "async ",
        "elif ",
        "} else",
    ];
    t.ends_with(';')
        || t.ends_with('{')
        || t.ends_with('}')
        || STARTS.iter().any(|s| t.starts_with(s))
}

/// Numbered list items: `1. `, `2) `.
fn is_list_item(t: &str) -> bool {
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && digits <= 2 {
        return matches!(t.as_bytes().get(digits), Some(b'.' | b')'))
            && matches!(t.as_bytes().get(digits + 1), Some(b' '));
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use aho_corasick::{AhoCorasickBuilder, AhoCorasickKind, MatchKind};
    use proptest::prelude::*;

    use super::*;

    /// The previous implementation (three passes: `?`, lines, Aho-Corasick over the words), with
    /// URL query strings found by regexes: the one-pass scan must count the same.
    fn reference(text: &str) -> Features {
        let mut f = Features::default();
        f.questions += text.bytes().filter(|b| *b == b'?').count();
        // A `?` and a query byte, inside a URL: after its start (`://` after a letter or
        // digit, or `www.` after no letter or digit) with no URL end between them.
        let url_start = regex::Regex::new(r"[A-Za-z0-9]://|(?:^|[^A-Za-z0-9])(?i:www)\.").unwrap();
        let query = regex::Regex::new(r"\?[A-Za-z0-9=&%_~+/\[-]").unwrap();
        // A word whose first `/` follows a host name (`x.com/`), not glued to a host byte.
        let bare =
            regex::Regex::new(r"^[^/]*?(?:^|[^A-Za-z0-9./-])(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}/")
                .unwrap();
        for q in query.find_iter(text) {
            let from = text[..q.start()]
                .rfind(['\t', '\n', '\x0C', '\r', ' ', '"', '<', '>', '`'])
                .map_or(0, |p| p + 1);
            if url_start.is_match(&text[from..q.start()]) || bare.is_match(&text[from..q.start()]) {
                f.questions -= 1;
            }
        }
        let mut in_fence = false;
        for l in text.lines() {
            let t = l.trim();
            if t.starts_with("```") {
                if !in_fence {
                    f.code_lines += 5;
                }
                in_fence = !in_fence;
                continue;
            }
            if in_fence {
                continue;
            }
            if is_code_line(t) {
                f.code_lines += 1;
            }
            if is_list_item(t) {
                f.steps += 1;
            }
        }
        let ac = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(AhoCorasickKind::DFA))
            .build(STEP_WORDS.iter().chain(MATH_WORDS))
            .unwrap();
        let bytes = text.as_bytes();
        for m in ac.find_iter(text) {
            let before = m.start().checked_sub(1).and_then(|i| bytes.get(i));
            let after = bytes.get(m.end());
            let word_edge = |b: Option<&u8>| !b.is_some_and(|b| b.is_ascii_alphanumeric());
            let is_symbol = !text
                .get(m.start()..m.end())
                .is_some_and(|s| s.bytes().all(|b| b.is_ascii_alphabetic()));
            if !(is_symbol || (word_edge(before) && word_edge(after))) {
                continue;
            }
            if m.pattern().as_usize() < STEP_WORDS.len() {
                f.steps += 1;
            } else {
                f.math += 1;
            }
        }
        f
    }

    fn one_pass(text: &str) -> Features {
        let mut f = Features::default();
        scan(text, &mut f);
        f
    }

    const PIECES: &[&str] = &[
        "first",
        "Firstly",
        "THEN",
        "next",
        "step",
        "steps",
        "matrix",
        "prove",
        "theorem",
        "\\frac",
        "\\FRAC",
        "\\integral",
        "\\int",
        "\\begin{equation}",
        "\\begin{Equations",
        "$$",
        "$",
        "∑",
        "≤",
        "≥",
        "é",
        "∀x",
        "?",
        "\n",
        "\r\n",
        " ",
        "  ",
        "\t",
        "x",
        "2",
        "1. ",
        "12) ",
        "```",
        "```rust\n",
        "fn main() {",
        "}",
        "return x;",
        "def f():",
        "a_b",
        "then2",
        "2then",
        "-",
        ".",
        "\u{a0}",
        "equation",
        "derivative",
        "afterwards",
        "lastly",
        "https://x.com/a",
        "x.com/a",
        "a.b",
        "e.g.",
        "x.co",
        "1.5/",
        "-",
        "(docs.rs/",
        "www.",
        "WwW.",
        "www",
        "http:",
        "//",
        "://",
        "?b=1",
        "&c=2",
        "a?",
        "??",
        "\"",
        ">",
        "`",
        "/",
        "%",
    ];

    /// The word test without the length and first-letter filter (for runs of ASCII letters
    /// and digits).
    fn reference_word_kind(word: &[u8]) -> Option<bool> {
        let eq = |w: &&str| word.eq_ignore_ascii_case(w.as_bytes());
        if STEP_WORDS.iter().any(eq) {
            Some(true)
        } else if MATH_WORDS.iter().any(eq) {
            Some(false)
        } else {
            None
        }
    }

    /// The listed words made of ASCII letters (the others are LaTeX commands and symbols).
    fn listed_letter_words() -> Vec<&'static str> {
        STEP_WORDS
            .iter()
            .chain(MATH_WORDS)
            .copied()
            .filter(|w| w.bytes().all(|b| b.is_ascii_alphabetic()))
            .collect()
    }

    #[test]
    fn every_listed_word_passes_the_filter_in_any_case() {
        for w in STEP_WORDS.iter().chain(MATH_WORDS) {
            if !w.bytes().all(|b| b.is_ascii_alphabetic()) {
                continue;
            }
            let upper = w.to_ascii_uppercase();
            for v in [w.to_string(), upper] {
                assert!(may_be_listed(v.as_bytes()), "{v}");
                assert_eq!(word_kind(v.as_bytes()), reference_word_kind(v.as_bytes()));
                assert!(word_kind(v.as_bytes()).is_some(), "{v}");
            }
        }
        assert!(!may_be_listed(b"the"));
        assert!(!may_be_listed(b"quarterly"));
        assert!(!may_be_listed(b"2then"));
    }

    proptest! {
        #[test]
        fn one_pass_counts_as_the_three_pass_reference(
            parts in proptest::collection::vec(0..PIECES.len(), 0..60)
        ) {
            let text: String = parts.iter().map(|i| PIECES[*i]).collect();
            prop_assert_eq!(one_pass(&text), reference(&text), "{:?}", text);
        }

        #[test]
        fn one_pass_counts_as_the_reference_on_any_text(text in "\\PC{0,200}") {
            prop_assert_eq!(one_pass(&text), reference(&text));
        }

        #[test]
        fn filtered_word_test_agrees_with_the_plain_one(word in "[a-zA-Z0-9]{0,12}") {
            prop_assert_eq!(word_kind(word.as_bytes()), reference_word_kind(word.as_bytes()));
        }

        #[test]
        fn filtered_word_test_agrees_on_listed_prefixes(
            listed in proptest::sample::select(listed_letter_words()),
            cut in 0usize..12,
            upper in any::<bool>(),
        ) {
            let word: String = listed.chars().take(cut).collect();
            let word = if upper { word.to_ascii_uppercase() } else { word };
            prop_assert_eq!(word_kind(word.as_bytes()), reference_word_kind(word.as_bytes()));
        }
    }
}
