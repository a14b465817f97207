//! Splitting text at added tokens exactly where HF `tokenizers` splits it.
//!
//! `AddedVocabulary::extract_and_normalize` first cuts the raw text at every *non-normalized*
//! added token (leftmost-longest Aho-Corasick; `lstrip`/`rstrip` swallow adjacent whitespace),
//! then normalizes, pre-tokenizes and encodes each remaining piece on its own. So the ids of a
//! text are the concatenation of the ids of its pieces, and each piece can be encoded (and
//! cached) independently. This module reproduces that first cut.

use aho_corasick::{AhoCorasick, MatchKind};
use tokenizers::Tokenizer;

/// One piece of a text: an added token, or the text between two of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// An added token (its whitespace, if it strips any, included), by id.
    Added(u32),
    /// Text between added tokens; `start` is its byte offset in the whole text.
    Text { text: &'a str, start: usize },
}

#[derive(Debug, Clone, Copy)]
struct Pattern {
    id: u32,
    lstrip: bool,
    rstrip: bool,
}

/// Cuts texts at the non-normalized added tokens of one tokenizer.
#[derive(Debug)]
pub(crate) struct Splitter {
    automaton: Option<AhoCorasick>,
    patterns: Vec<Pattern>,
    /// False when a splitting token is `single_word`: whether it matches depends on the
    /// characters around it, which a piece encoded alone does not see. Callers then encode
    /// whole texts.
    pub(crate) exact: bool,
}

impl Splitter {
    /// The splitter of `tokenizer`'s added vocabulary.
    pub(crate) fn new(tokenizer: &Tokenizer) -> Result<Self, String> {
        let mut tokens: Vec<(u32, tokenizers::AddedToken)> = tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| !t.normalized && !t.content.is_empty())
            .collect();
        tokens.sort_by_key(|(id, _)| *id);
        let exact = !tokens.iter().any(|(_, t)| t.single_word);
        let patterns = tokens
            .iter()
            .map(|(id, t)| Pattern {
                id: *id,
                lstrip: t.lstrip,
                rstrip: t.rstrip,
            })
            .collect();
        let automaton = if tokens.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(tokens.iter().map(|(_, t)| t.content.as_str()))
                    .map_err(|e| e.to_string())?,
            )
        };
        Ok(Self {
            automaton,
            patterns,
            exact,
        })
    }

    /// Appends the pieces of `text` to `out` (empty text pieces are left out).
    pub(crate) fn split<'a>(&self, text: &'a str, out: &mut Vec<Piece<'a>>) {
        let Some(ac) = &self.automaton else {
            if !text.is_empty() {
                out.push(Piece::Text { text, start: 0 });
            }
            return;
        };
        let mut offset = 0;
        for m in ac.find_iter(text) {
            let Some(pattern) = self.patterns.get(m.pattern().as_usize()) else {
                continue;
            };
            let mut start = m.start();
            let mut stop = m.end();
            if pattern.lstrip {
                let before = &text[..start];
                let trimmed = before.trim_end_matches(char::is_whitespace).len();
                start = trimmed.max(offset);
            }
            if pattern.rstrip {
                let after = &text[stop..];
                stop += after.len() - after.trim_start_matches(char::is_whitespace).len();
            }
            if offset < start {
                out.push(Piece::Text {
                    text: &text[offset..start],
                    start: offset,
                });
            }
            out.push(Piece::Added(pattern.id));
            offset = stop;
        }
        if offset < text.len() {
            out.push(Piece::Text {
                text: &text[offset..],
                start: offset,
            });
        }
    }
}
