//! The built-in complexity estimator: `complexity-low|medium|high` from a points score over
//! documented features of the whole conversation (see `docs/reference/classifiers.md`).

use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
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
    /// Estimated prompt tokens (characters / 4): 1 point at 256, 2 at 1024, 3 at 4096.
    pub tokens: [usize; 3],
    /// Conversation turns (non-system messages).
    pub turns: [usize; 2],
    /// Code: fenced blocks count 5 lines each, plus code-like lines.
    pub code_lines: [usize; 2],
    /// Math notation markers.
    pub math: [usize; 2],
    /// Multi-step markers (numbered list items, `first`, `then`, `next`, `finally`, `step`...).
    pub steps: [usize; 2],
    /// Question marks.
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
    /// Characters / 4 over all messages.
    pub tokens: usize,
    /// Non-system messages.
    pub turns: usize,
    /// Code-like lines plus 5 per fenced block.
    pub code_lines: usize,
    /// Math markers.
    pub math: usize,
    /// Multi-step markers.
    pub steps: usize,
    /// Question marks.
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
    words: Option<AhoCorasick>,
    tags: [Arc<str>; 3],
}

impl Complexity {
    /// A classifier with these thresholds.
    pub fn new(config: ComplexityConfig) -> Self {
        let words = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(AhoCorasickKind::DFA))
            .build(STEP_WORDS.iter().chain(MATH_WORDS))
            .ok();
        Complexity {
            config,
            words,
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

    /// The features of a request.
    pub fn features(&self, messages: &[Message<'_>]) -> Features {
        let mut f = Features::default();
        let mut chars = 0usize;
        for m in messages {
            chars += m.content.len();
            if m.role != "system" {
                f.turns += 1;
            }
            let text = m.content;
            f.questions += text.bytes().filter(|b| *b == b'?').count();
            let mut in_fence = false;
            for line in text.lines() {
                let t = line.trim();
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
            if let Some(ac) = &self.words {
                let bytes = text.as_bytes();
                for m in ac.find_iter(text) {
                    let before = m.start().checked_sub(1).and_then(|i| bytes.get(i));
                    let after = bytes.get(m.end());
                    let word_edge = |b: Option<&u8>| !b.is_some_and(|b| b.is_ascii_alphanumeric());
                    let pat = m.pattern().as_usize();
                    let is_symbol = !text
                        .get(m.start()..m.end())
                        .is_some_and(|s| s.bytes().all(|b| b.is_ascii_alphabetic()));
                    if !(is_symbol || (word_edge(before) && word_edge(after))) {
                        continue;
                    }
                    if pat < STEP_WORDS.len() {
                        f.steps += 1;
                    } else {
                        f.math += 1;
                    }
                }
            }
        }
        f.tokens = chars / 4;
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
