//! Hand-written matchers for the pre-tokenizer regexes that real tokenizers ship (GPT-2,
//! Llama 3, Qwen 2), on ASCII text.
//!
//! At each position the byte-level fast path (`fast.rs`) needs the match of the pattern's
//! alternatives before `\s+(?!\S)|\s+` that starts there. For the known patterns that match is
//! decided here from ASCII bytes alone, a few nanoseconds per split instead of a regex search.
//! Wherever a non-ASCII character could change the answer (is `é` a letter? is U+00A0 a space?
//! does `ſ` fold to `s`?), the matcher answers [`Head::Unknown`] and the caller runs the regex,
//! which stays the definition. Equality with the regex is checked by a property test.

/// The known patterns, by their alternatives before `|\s+(?!\S)|\s+`.
const GPT2_HEAD: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+";
const LLAMA3_HEAD: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+";
const QWEN2_HEAD: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+";

/// A pattern head this module can match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KnownHead {
    /// GPT-2's `ByteLevel` regex.
    Gpt2,
    /// Llama 3 / tiktoken `cl100k`-style, with at most `max_digits` digits per split (3 for
    /// Llama 3, 1 for Qwen 2).
    Llama3 {
        /// Digits per split.
        max_digits: usize,
    },
}

/// The head's match at a position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Head {
    /// The head matches `[pos, end)`.
    Match(usize),
    /// No alternative of the head matches at `pos`.
    NoMatch,
    /// A non-ASCII character could change the answer: ask the regex.
    Unknown,
}

/// ASCII character classes of the patterns (`\p{L}`, `\p{N}`, `\s`, and the rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Digit,
    Space,
    Other,
    /// Not ASCII: its class is not decided here.
    NonAscii,
}

fn class(b: u8) -> Class {
    match b {
        b'a'..=b'z' | b'A'..=b'Z' => Class::Letter,
        b'0'..=b'9' => Class::Digit,
        // Unicode `White_Space` in ASCII: TAB, LF, VT, FF, CR and SPACE.
        b'\t'..=b'\r' | b' ' => Class::Space,
        0x80..=0xff => Class::NonAscii,
        _ => Class::Other,
    }
}

impl KnownHead {
    /// The matcher for a pattern head, when it is one of the known ones.
    pub(crate) fn from_head(head: &str) -> Option<Self> {
        match head {
            GPT2_HEAD => Some(KnownHead::Gpt2),
            LLAMA3_HEAD => Some(KnownHead::Llama3 { max_digits: 3 }),
            QWEN2_HEAD => Some(KnownHead::Llama3 { max_digits: 1 }),
            _ => None,
        }
    }

    /// The head's leftmost-first match at `pos` (`pos < text.len()`).
    pub(crate) fn at(self, text: &[u8], pos: usize) -> Head {
        match self {
            KnownHead::Gpt2 => gpt2(text, pos),
            KnownHead::Llama3 { max_digits } => llama3(text, pos, max_digits),
        }
    }
}

/// The end of the run of `want` starting at `from`; `None` if a non-ASCII character (which
/// might belong to the class) is reached.
fn run(text: &[u8], from: usize, want: Class) -> Option<usize> {
    let mut i = from;
    while let Some(&b) = text.get(i) {
        match class(b) {
            c if c == want => i += 1,
            Class::NonAscii => return None,
            _ => break,
        }
    }
    Some(i)
}

fn to_head(end: Option<usize>) -> Head {
    end.map_or(Head::Unknown, Head::Match)
}

/// `'s|'t|'re|'ve|'m|'ll|'d` at `pos` (where `text[pos]` is `'`), case-insensitively when
/// `fold` (the `(?i:...)` form, where `ſ` and the Kelvin sign also fold to ASCII letters).
fn contraction(text: &[u8], pos: usize, fold: bool) -> Head {
    let norm = |b: u8| if fold { b.to_ascii_lowercase() } else { b };
    let Some(&c1) = text.get(pos + 1) else {
        return Head::NoMatch;
    };
    if c1 >= 0x80 {
        return if fold { Head::Unknown } else { Head::NoMatch };
    }
    match norm(c1) {
        b's' | b't' | b'm' | b'd' => Head::Match(pos + 2),
        first @ (b'r' | b'v' | b'l') => {
            let second = if first == b'l' { b'l' } else { b'e' };
            match text.get(pos + 2) {
                Some(&c2) if c2 >= 0x80 && fold => Head::Unknown,
                Some(&c2) if norm(c2) == second => Head::Match(pos + 3),
                _ => Head::NoMatch,
            }
        }
        _ => Head::NoMatch,
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`.
fn gpt2(text: &[u8], pos: usize) -> Head {
    let c = text[pos];
    if c == b'\'' {
        let h = contraction(text, pos, false);
        if h != Head::NoMatch {
            return h;
        }
    }
    // Each of the three runs may start with one space; the space itself belongs to none of
    // them, so without it they cannot match at a space either.
    let from = if c == b' ' { pos + 1 } else { pos };
    let Some(&first) = text.get(from) else {
        return Head::NoMatch;
    };
    match class(first) {
        Class::NonAscii => Head::Unknown,
        Class::Space => Head::NoMatch,
        want => to_head(run(text, from, want)),
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+`.
fn llama3(text: &[u8], pos: usize, max_digits: usize) -> Head {
    let c = text[pos];
    let cls = class(c);
    if cls == Class::NonAscii {
        return Head::Unknown;
    }
    if c == b'\'' {
        let h = contraction(text, pos, true);
        if h != Head::NoMatch {
            return h;
        }
    }
    // `[^\r\n\p{L}\p{N}]?\p{L}+`
    if cls == Class::Letter {
        return to_head(run(text, pos, Class::Letter));
    }
    if cls != Class::Digit && c != b'\r' && c != b'\n' {
        match text.get(pos + 1).map(|&b| class(b)) {
            Some(Class::NonAscii) => return Head::Unknown,
            Some(Class::Letter) => return to_head(run(text, pos + 1, Class::Letter)),
            _ => {}
        }
    }
    // `\p{N}{1,D}`
    if cls == Class::Digit {
        let mut i = pos;
        while i < pos + max_digits {
            match text.get(i).map(|&b| class(b)) {
                Some(Class::Digit) => i += 1,
                Some(Class::NonAscii) => return Head::Unknown,
                _ => break,
            }
        }
        return Head::Match(i);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let from = if c == b' ' { pos + 1 } else { pos };
    match text.get(from).map(|&b| class(b)) {
        Some(Class::Other) => {
            let Some(mut end) = run(text, from, Class::Other) else {
                return Head::Unknown;
            };
            while matches!(text.get(end), Some(b'\r' | b'\n')) {
                end += 1;
            }
            return Head::Match(end);
        }
        Some(Class::NonAscii) if c == b' ' => return Head::Unknown,
        _ => {}
    }
    // `\s*[\r\n]+`: the longest prefix of the whitespace run that ends with a line break.
    if cls == Class::Space {
        let Some(end) = run(text, pos, Class::Space) else {
            return Head::Unknown;
        };
        return match text[pos..end]
            .iter()
            .rposition(|&b| b == b'\r' || b == b'\n')
        {
            Some(k) => Head::Match(pos + k + 1),
            None => Head::NoMatch,
        };
    }
    Head::NoMatch
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use proptest::prelude::*;
    use regex_automata::meta::Regex;
    use regex_automata::{Anchored, Input};

    /// The regex's answer, as the fast path used it before this module.
    fn by_regex(re: &Regex, text: &str, pos: usize) -> Head {
        let input = Input::new(text).range(pos..).anchored(Anchored::Yes);
        match re.search(&input) {
            Some(m) if m.end() > pos => Head::Match(m.end()),
            _ => Head::NoMatch,
        }
    }

    fn agree(head: &str, text: &str) -> Result<(), TestCaseError> {
        let known = KnownHead::from_head(head).unwrap();
        let re = Regex::new(head).unwrap();
        for pos in 0..text.len() {
            if !text.is_char_boundary(pos) {
                continue;
            }
            let fast = known.at(text.as_bytes(), pos);
            if fast != Head::Unknown {
                prop_assert_eq!(fast, by_regex(&re, text, pos), "{:?} at {}", text, pos);
            }
        }
        Ok(())
    }

    /// Text from pieces that exercise every alternative and class boundary.
    fn text() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "a", "Z", "word", "x1", "0", "42", "12345", " ", "  ", "\t", "\n", "\r\n", "\x0b",
            "\x0c", "\x1c", "'", "'s", "'S", "'re", "'RE", "'ll", "'Ll", "'ve", "'d", "'x", "(",
            ").", "--", "!?", "\x00", "\x7f", "é", "ß", "中", "\u{a0}", "\u{2003}", "٣", "ſ",
            "\u{212a}", "Ⅻ", "—",
        ]);
        prop::collection::vec(piece, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn gpt2_agrees_with_the_regex(t in text()) {
            agree(GPT2_HEAD, &t)?;
        }

        #[test]
        fn llama3_agrees_with_the_regex(t in text()) {
            agree(LLAMA3_HEAD, &t)?;
        }

        #[test]
        fn qwen2_agrees_with_the_regex(t in text()) {
            agree(QWEN2_HEAD, &t)?;
        }
    }

    #[test]
    fn ascii_prose_is_decided_without_the_regex() {
        let t = "Hello, world's 2024 plans:\n\tbuild  it!\r\n";
        for head in [GPT2_HEAD, LLAMA3_HEAD, QWEN2_HEAD] {
            let known = KnownHead::from_head(head).unwrap();
            for pos in 0..t.len() {
                assert_ne!(
                    known.at(t.as_bytes(), pos),
                    Head::Unknown,
                    "{head} at {pos}"
                );
            }
            agree(head, t).unwrap();
        }
    }

    #[test]
    fn unknown_patterns_are_not_claimed() {
        assert_eq!(KnownHead::from_head(r"\p{L}+"), None);
    }
}
