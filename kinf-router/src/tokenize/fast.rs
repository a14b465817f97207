//! A faster encoder for the common byte-level BPE setup, equal to HF `tokenizers` by construction
//! and by differential tests.
//!
//! Without Oniguruma, HF `tokenizers` runs its pre-tokenizer regexes on `fancy-regex`, whose
//! backtracking VM spends ~0.8 µs per token on the GPT-2 / Llama 3 patterns, because of one
//! look-ahead alternative, `\s+(?!\S)`. Every such pattern ends in `|\s+(?!\S)|\s+`, and that
//! suffix has a closed form: at a whitespace run `[p, q)` that no earlier alternative matches, the
//! match is the whole run if it ends the text or is one character long, else the run minus its
//! last character. The earlier alternatives have no look-around, so the `regex` crate (whose
//! leftmost-first semantics give the same match as a backtracking engine) finds them.
//!
//! Used only when `tokenizer.json` has no normalizer, a BPE model, no normalized added tokens, and
//! a pre-tokenizer that is `ByteLevel` (GPT-2 regex) or `Sequence[Split(regex, Isolated),
//! ByteLevel(use_regex=false)]`. Then each split is mapped to byte-level characters and handed to
//! the tokenizer's own BPE model, as `tokenizers` does.

use regex::Regex;
use serde_json::Value as Json;
use tokenizers::{Model, ModelWrapper};

/// The regex of the `ByteLevel` pre-tokenizer (tokenizers `pre_tokenizers/byte_level.rs`).
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LOOKAHEAD_SUFFIX: &str = r"|\s+(?!\S)|\s+";

/// GPT-2's byte → character table (tokenizers `bytes_char`).
fn byte_chars() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let code = if printable {
            u32::from(b)
        } else {
            n += 1;
            255 + n
        };
        table[usize::from(b)] = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// The fast encoder of one tokenizer.
#[derive(Debug)]
pub(crate) struct FastByteLevel {
    /// The pattern's alternatives before `\s+(?!\S)|\s+`.
    head: Regex,
    /// `ByteLevel.add_prefix_space` (only in the plain `ByteLevel` form).
    add_prefix_space: bool,
    byte_chars: [char; 256],
}

fn bool_field(obj: &Json, key: &str, default: bool) -> bool {
    obj.get(key).and_then(Json::as_bool).unwrap_or(default)
}

fn is_type(obj: &Json, ty: &str) -> bool {
    obj.get("type").and_then(Json::as_str) == Some(ty)
}

impl FastByteLevel {
    /// The fast encoder for `tokenizer.json` (parsed), when its pipeline qualifies.
    pub(crate) fn from_json(json: &Json) -> Option<Self> {
        if !json.get("normalizer").is_none_or(Json::is_null) {
            return None;
        }
        if !is_type(json.get("model")?, "BPE") {
            return None;
        }
        let added = json.get("added_tokens").and_then(Json::as_array);
        if added.is_some_and(|a| a.iter().any(|t| bool_field(t, "normalized", true))) {
            return None;
        }
        let pre = json.get("pre_tokenizer")?;
        let (pattern, add_prefix_space) = if is_type(pre, "ByteLevel") {
            if !bool_field(pre, "use_regex", true) {
                return None;
            }
            (
                GPT2_PATTERN.to_owned(),
                bool_field(pre, "add_prefix_space", true),
            )
        } else if is_type(pre, "Sequence") {
            let [split, byte_level] = pre.get("pretokenizers")?.as_array()?.as_slice() else {
                return None;
            };
            let ok = is_type(split, "Split")
                && split.get("behavior").and_then(Json::as_str) == Some("Isolated")
                && !bool_field(split, "invert", false)
                && is_type(byte_level, "ByteLevel")
                && !bool_field(byte_level, "use_regex", true)
                && !bool_field(byte_level, "add_prefix_space", true);
            if !ok {
                return None;
            }
            let regex = split.get("pattern")?.get("Regex")?.as_str()?;
            (regex.to_owned(), false)
        } else {
            return None;
        };
        let head = pattern.strip_suffix(LOOKAHEAD_SUFFIX)?;
        // Fails (no fast path) if the rest has look-around or other fancy-regex-only syntax.
        let head = Regex::new(head).ok()?;
        Some(Self {
            head,
            add_prefix_space,
            byte_chars: byte_chars(),
        })
    }

    /// Appends the ids of `text` (no added tokens in it) to `out`. `Ok(false)`: a position the
    /// closed form does not cover; nothing was appended, use the regular encoder.
    pub(crate) fn encode(
        &self,
        model: &ModelWrapper,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<bool, String> {
        let prefixed;
        let text = if self.add_prefix_space && !text.starts_with(' ') && !text.is_empty() {
            prefixed = format!(" {text}");
            prefixed.as_str()
        } else {
            text
        };
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(text.len() / 4 + 1);
        let mut pos = 0;
        while pos < text.len() {
            if let Some(m) = self.head.find_at(text, pos)
                && m.start() == pos
                && m.end() > pos
            {
                spans.push((pos, m.end()));
                pos = m.end();
                continue;
            }
            // `\s+(?!\S)|\s+` at `pos`.
            let rest = &text[pos..];
            let mut run_end = pos;
            let mut last_len = 0;
            for c in rest.chars() {
                if !c.is_whitespace() {
                    break;
                }
                last_len = c.len_utf8();
                run_end += last_len;
            }
            if run_end == pos {
                return Ok(false);
            }
            let single = run_end - pos == last_len;
            let end = if run_end == text.len() || single {
                run_end
            } else {
                run_end - last_len
            };
            spans.push((pos, end));
            pos = end;
        }
        let start_len = out.len();
        let mut word = String::new();
        for (a, b) in spans {
            word.clear();
            for &byte in &text.as_bytes()[a..b] {
                word.push(self.byte_chars[usize::from(byte)]);
            }
            match model.tokenize(&word) {
                Ok(tokens) => out.extend(tokens.iter().map(|t| t.id)),
                Err(e) => {
                    out.truncate(start_len);
                    return Err(e.to_string());
                }
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_chars();
        assert_eq!(t[usize::from(b'a')], 'a');
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
    }
}
