//! Model-name globs such as `qwen-*`, `Qwen/Qwen3.?-*` or `llama-[0-9]b`.

use std::fmt;
use std::hash::{Hash, Hasher};

use pest::Parser;
use pest::iterators::Pair;
use pest_derive::Parser;

use crate::error::{Failure, Span, SyntaxError, render_failure};

#[derive(Parser)]
#[grammar = "glob.pest"]
struct GlobParser;

/// A compiled model-name pattern.
///
/// Syntax: `*` matches any run of characters (`/` included, possibly empty),
/// `?` exactly one character, `[abc]` / `[a-z]` one character of a class and
/// `[!a-z]` (or `[^a-z]`) one character outside it; `\` makes the next
/// character literal. Every other character matches itself, case-sensitively.
///
/// Matching takes at most O(pattern length × name length) steps: there is no
/// exponential backtracking, whatever the pattern.
///
/// Equality and hashing compare the source text.
#[derive(Debug, Clone)]
pub struct Glob {
    source: String,
    tokens: Vec<Token>,
    /// The unescaped text when the pattern has no wildcard.
    literal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Char(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Box<[(char, char)]>,
    },
}

impl Token {
    fn accepts(&self, c: char) -> bool {
        match self {
            Token::Char(x) => *x == c,
            Token::Any => true,
            Token::Star => false,
            Token::Class { negated, ranges } => {
                ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c)) != *negated
            }
        }
    }
}

impl Glob {
    /// Parses a pattern. Empty patterns, unclosed or empty classes, reversed
    /// ranges (`[z-a]`), a stray `]` and a trailing `\` are errors.
    pub fn parse(input: &str) -> Result<Glob, SyntaxError> {
        if input.is_empty() {
            return Err(SyntaxError::new(Span::new(0, 0), "empty model pattern")
                .with_help("write a model name, or `*` to match every model"));
        }
        let pairs = GlobParser::parse(Rule::glob, input).map_err(|e| pest_error(&e, input))?;
        let mut tokens = Vec::new();
        for pair in pairs.flatten() {
            let token = match pair.as_rule() {
                Rule::star if tokens.last() == Some(&Token::Star) => continue,
                Rule::star => Token::Star,
                Rule::any_char => Token::Any,
                Rule::literal => Token::Char(first_char(pair.as_str())),
                Rule::escaped => Token::Char(escaped_char(pair.as_str())),
                Rule::class => class(pair)?,
                _ => continue,
            };
            tokens.push(token);
        }
        let literal = tokens
            .iter()
            .map(|t| match t {
                Token::Char(c) => Some(*c),
                _ => None,
            })
            .collect::<Option<String>>();
        Ok(Glob {
            source: input.to_owned(),
            tokens,
            literal,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the pattern has no wildcard, so it matches exactly one name.
    pub fn is_literal(&self) -> bool {
        self.literal.is_some()
    }

    /// The one name a literal pattern matches (escapes removed), or `None`
    /// when the pattern has a wildcard.
    pub fn as_literal(&self) -> Option<&str> {
        self.literal.as_deref()
    }

    /// Whether `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> bool {
        let mut steps = 0;
        self.matches_counting(name, &mut steps)
    }

    /// [`Glob::matches`], counting loop iterations in `steps` (for the proof
    /// that matching is polynomial).
    fn matches_counting(&self, name: &str, steps: &mut usize) -> bool {
        if let Some(literal) = &self.literal {
            return literal == name;
        }
        // Classic wildcard matching: on a mismatch, resume after the most
        // recent `*`, which swallows one more character. Earlier stars never
        // need revisiting, so this is O(tokens × chars).
        let (mut p, mut t) = (0usize, 0usize);
        let mut resume: Option<(usize, usize)> = None;
        loop {
            *steps += 1;
            let next = name.get(t..).and_then(|rest| rest.chars().next());
            match (self.tokens.get(p), next) {
                (Some(Token::Star), _) => {
                    p += 1;
                    resume = Some((p, t));
                    continue;
                }
                (Some(token), Some(c)) if token.accepts(c) => {
                    p += 1;
                    t += c.len_utf8();
                    continue;
                }
                (None, None) => return true,
                _ => {}
            }
            let Some((star_p, star_t)) = resume else {
                return false;
            };
            let Some(c) = name.get(star_t..).and_then(|rest| rest.chars().next()) else {
                return false;
            };
            p = star_p;
            t = star_t + c.len_utf8();
            resume = Some((p, t));
        }
    }
}

impl PartialEq for Glob {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Glob {}

impl Hash for Glob {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.source.hash(state);
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl std::str::FromStr for Glob {
    type Err = SyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Glob::parse(s)
    }
}

fn first_char(text: &str) -> char {
    text.chars().next().unwrap_or_default()
}

/// `\x` → `x`; any other class character is itself.
fn escaped_char(text: &str) -> char {
    first_char(text.strip_prefix('\\').unwrap_or(text))
}

fn class(pair: Pair<'_, Rule>) -> Result<Token, SyntaxError> {
    let span = Span::of(pair.as_span());
    let mut negated = false;
    let mut ranges = Vec::new();
    for item in pair.into_inner() {
        match item.as_rule() {
            Rule::negate => negated = true,
            Rule::class_char => {
                let c = escaped_char(item.as_str());
                ranges.push((c, c));
            }
            Rule::range => {
                let range_span = Span::of(item.as_span());
                let text = item.as_str();
                let mut ends = item.into_inner().map(|p| escaped_char(p.as_str()));
                let (lo, hi) = (
                    ends.next().unwrap_or_default(),
                    ends.next().unwrap_or_default(),
                );
                if lo > hi {
                    return Err(
                        SyntaxError::new(range_span, format!("invalid range `{text}`"))
                            .with_help(format!("write the smaller character first: `{hi}-{lo}`")),
                    );
                }
                ranges.push((lo, hi));
            }
            _ => {}
        }
    }
    if ranges.is_empty() {
        return Err(SyntaxError::new(span, "empty character class").with_help(
            "list at least one character, e.g. `[0-9]`, or write `\\[` for a literal `[`",
        ));
    }
    Ok(Token::Class {
        negated,
        ranges: ranges.into_boxed_slice(),
    })
}

fn pest_error(err: &pest::error::Error<Rule>, input: &str) -> SyntaxError {
    lexical_error(input)
        .unwrap_or_else(|| render_failure(&Failure::from_pest(err), input, |_| "a character"))
}

/// The first unclosed `[`, stray `]` or trailing `\`, which are the ways a
/// pattern can fail to parse.
fn lexical_error(input: &str) -> Option<SyntaxError> {
    let mut chars = input.char_indices();
    while let Some((i, c)) = chars.next() {
        let span = Span::new(i, i + c.len_utf8());
        match c {
            '\\' if chars.next().is_none() => {
                return Some(
                    SyntaxError::new(span, "`\\` at the end of the pattern escapes nothing")
                        .with_help("write `\\\\` to match a backslash"),
                );
            }
            '[' => {
                // Skip to the matching `]`, honouring escapes.
                let mut closed = false;
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        ']' => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                }
                if !closed {
                    return Some(
                        SyntaxError::new(span, "unclosed character class")
                            .with_help("close it with `]`, or write `\\[` to match a literal `[`"),
                    );
                }
            }
            ']' => {
                return Some(
                    SyntaxError::new(span, "unmatched `]`")
                        .with_help("write `\\]` to match a literal `]`"),
                );
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    fn glob(s: &str) -> Glob {
        Glob::parse(s).unwrap()
    }

    #[test]
    fn literal_patterns() {
        let g = glob("Qwen/Qwen3.6-27B");
        assert!(g.is_literal());
        assert_eq!(g.as_literal(), Some("Qwen/Qwen3.6-27B"));
        assert_eq!(g.as_str(), "Qwen/Qwen3.6-27B");
        assert!(g.matches("Qwen/Qwen3.6-27B"));
        assert!(!g.matches("Qwen/Qwen3.6-27b"));
        let g = glob(r"a\*b");
        assert_eq!(g.as_literal(), Some("a*b"));
        assert!(g.matches("a*b"));
        assert!(!g.matches("axb"));
    }

    #[test]
    fn star_matches_any_run_including_slash() {
        let g = glob("qwen-*");
        assert!(!g.is_literal());
        assert!(g.matches("qwen-"));
        assert!(g.matches("qwen-3.6-27b"));
        assert!(!g.matches("qwen"));
        assert!(glob("*").matches(""));
        assert!(glob("*").matches("a/b/c"));
        assert!(glob("*/GLM-*").matches("zai-org/GLM-5.3"));
        assert!(glob("a*b*c").matches("a-b-x-c"));
        assert!(!glob("a*b*c").matches("a-c-b"));
        assert!(glob("**a").matches("xa"));
    }

    #[test]
    fn question_and_classes() {
        assert!(glob("glm-?.3").matches("glm-5.3"));
        assert!(!glob("glm-?.3").matches("glm-.3"));
        assert!(glob("?").matches("é"));
        assert!(glob("llama-[78]b").matches("llama-8b"));
        assert!(!glob("llama-[78]b").matches("llama-9b"));
        assert!(glob("v[0-9]").matches("v5"));
        assert!(!glob("v[0-9]").matches("vx"));
        assert!(glob("v[!0-9]").matches("vx"));
        assert!(glob("v[^0-9]").matches("vx"));
        assert!(!glob("v[!0-9]").matches("v1"));
        assert!(glob("[-a]").matches("-"));
        assert!(glob("[a-]").matches("-"));
        assert!(glob(r"[\]]").matches("]"));
        assert!(glob("[a-cx-z]").matches("y"));
    }

    #[test]
    fn errors() {
        let err = Glob::parse("qwen-[0-9").unwrap_err();
        assert_eq!(err.message, "unclosed character class");
        assert_eq!(err.span, Span::new(5, 6));
        let err = Glob::parse("a[]").unwrap_err();
        assert_eq!(err.message, "empty character class");
        assert_eq!(err.span, Span::new(1, 3));
        let err = Glob::parse("[z-a]").unwrap_err();
        assert_eq!(err.message, "invalid range `z-a`");
        assert_eq!(
            err.help.as_deref(),
            Some("write the smaller character first: `a-z`")
        );
        assert_eq!(err.span, Span::new(1, 4));
        let err = Glob::parse("a]").unwrap_err();
        assert_eq!(err.message, "unmatched `]`");
        assert_eq!(err.span, Span::new(1, 2));
        let err = Glob::parse(r"a\").unwrap_err();
        assert_eq!(err.span, Span::new(1, 2));
        assert_eq!(Glob::parse("").unwrap_err().message, "empty model pattern");
    }

    /// Reference matcher: dynamic programming over (token, char) pairs.
    fn reference(tokens: &[Token], name: &[char]) -> bool {
        let mut table = vec![vec![false; name.len() + 1]; tokens.len() + 1];
        table[tokens.len()][name.len()] = true;
        for p in (0..tokens.len()).rev() {
            for t in (0..=name.len()).rev() {
                table[p][t] = match &tokens[p] {
                    Token::Star => table[p + 1][t] || (t < name.len() && table[p][t + 1]),
                    tok => t < name.len() && tok.accepts(name[t]) && table[p + 1][t + 1],
                };
            }
        }
        table[0][0]
    }

    fn pattern() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("*".to_owned()),
                Just("?".to_owned()),
                Just("a".to_owned()),
                Just("b".to_owned()),
                Just("/".to_owned()),
                Just("[ab]".to_owned()),
                Just("[!a]".to_owned()),
            ],
            0..8,
        )
        .prop_map(|parts| parts.concat())
        .prop_filter("non-empty", |p| !p.is_empty())
    }

    proptest! {
        #[test]
        fn agrees_with_reference(pattern in pattern(), name in "[ab/é]{0,10}") {
            let g = Glob::parse(&pattern).unwrap();
            let chars: Vec<char> = name.chars().collect();
            prop_assert_eq!(g.matches(&name), reference(&g.tokens, &chars));
        }

        /// Adversarial inputs (`a*a*a*…b` against `aaaa…`) would take
        /// exponential time with naive backtracking; the step count stays
        /// within tokens × chars.
        #[test]
        fn matching_is_polynomial(stars in 1usize..40, len in 0usize..3000, tail in "[ab?]") {
            let pattern = format!("{}{tail}", "a*".repeat(stars));
            let g = Glob::parse(&pattern).unwrap();
            let name = "a".repeat(len);
            let mut steps = 0;
            let _ = g.matches_counting(&name, &mut steps);
            let bound = (g.tokens.len() + 1) * (len + 1) + g.tokens.len() + 1;
            prop_assert!(steps <= bound, "{} steps > bound {}", steps, bound);
        }

        #[test]
        fn parse_never_panics(input in "\\PC{0,20}") {
            let _ = Glob::parse(&input);
        }
    }
}
