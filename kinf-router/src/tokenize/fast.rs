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
//!
//! Two costs of that loop are avoided. Each split is found by an anchored forward search at the
//! current position (no reverse scan), with a search cache taken once per call from a small pool
//! instead of the `regex` crate's per-search pool, whose slow path (taken on every thread but the
//! first one) locks a mutex. And the ids of each split are memoised by its bytes
//! ([`WordCache`]), so that a word seen before costs one hash lookup instead of a call into the
//! BPE model, which builds a `String` per token. For the patterns real tokenizers ship, the
//! split at a position in ASCII text is found by a hand-written matcher (`ascii_split.rs`),
//! without a regex search at all.

use super::ascii_split::{Head, KnownHead};
use ahash::AHashMap;
use parking_lot::{Mutex, RwLock};
use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};
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

/// Most distinct splits whose ids are memoised per model; past it, new splits are encoded
/// without being remembered (a prompt of random bytes cannot grow the cache without bound).
const WORD_CACHE_ENTRIES: usize = 1 << 16;
/// Longest split (bytes) that is memoised: long runs are rare and rarely repeat.
const WORD_CACHE_MAX_BYTES: usize = 64;

/// Split bytes (before the byte-level mapping) → their ids.
type WordIds = AHashMap<Box<[u8]>, Box<[u32]>>;

/// Ids of pre-tokenizer splits, by the split's bytes.
#[derive(Debug, Default)]
struct WordCache(RwLock<WordIds>);

/// The fast encoder of one tokenizer.
#[derive(Debug)]
pub(crate) struct FastByteLevel {
    /// The pattern's alternatives before `\s+(?!\S)|\s+`.
    head: Regex,
    /// A hand-written matcher equal to `head` on ASCII text, for the patterns real tokenizers
    /// ship (see `ascii_split.rs`).
    known: Option<KnownHead>,
    /// Search caches of `head`, one taken per [`FastByteLevel::encode`] call.
    caches: Mutex<Vec<Cache>>,
    /// Memoised ids per model variant (see `ChatTokenizer::encode_segment`).
    words: [WordCache; 2],
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
        let known = KnownHead::from_head(head);
        // Fails (no fast path) if the rest has look-around or other fancy-regex-only syntax.
        let head = Regex::new(head).ok()?;
        Some(Self {
            head,
            known,
            caches: Mutex::new(Vec::new()),
            words: Default::default(),
            add_prefix_space,
            byte_chars: byte_chars(),
        })
    }

    /// Appends the ids of `text` (no added tokens in it) to `out`; `variant` names the model
    /// (memoised ids are kept per variant). `Ok(false)`: a position the closed form does not
    /// cover; nothing was appended, use the regular encoder.
    pub(crate) fn encode(
        &self,
        model: &ModelWrapper,
        variant: u8,
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
        let mut cache = self
            .caches
            .lock()
            .pop()
            .unwrap_or_else(|| self.head.create_cache());
        let spans = self.split(&mut cache, text);
        self.caches.lock().push(cache);
        let Some(spans) = spans else {
            return Ok(false);
        };
        let words = &self.words[usize::from(variant.min(1))];
        let start_len = out.len();
        // Splits seen for the first time: (byte range in `text`, id range in `out`).
        let mut fresh: Vec<((usize, usize), (usize, usize))> = Vec::new();
        {
            let known = words.0.read();
            let mut word = String::new();
            for (a, b) in spans {
                let bytes = &text.as_bytes()[a..b];
                if let Some(ids) = known.get(bytes) {
                    out.extend_from_slice(ids);
                    continue;
                }
                word.clear();
                word.extend(bytes.iter().map(|&byte| self.byte_chars[usize::from(byte)]));
                let from = out.len();
                match model.tokenize(&word) {
                    Ok(tokens) => out.extend(tokens.iter().map(|t| t.id)),
                    Err(e) => {
                        out.truncate(start_len);
                        return Err(e.to_string());
                    }
                }
                if bytes.len() <= WORD_CACHE_MAX_BYTES {
                    fresh.push(((a, b), (from, out.len())));
                }
            }
            if known.len() >= WORD_CACHE_ENTRIES {
                fresh.clear();
            }
        }
        if !fresh.is_empty() {
            let mut known = words.0.write();
            for ((a, b), (i, j)) in fresh {
                if known.len() >= WORD_CACHE_ENTRIES {
                    break;
                }
                known
                    .entry(Box::from(&text.as_bytes()[a..b]))
                    .or_insert_with(|| Box::from(&out[i..j]));
            }
        }
        Ok(true)
    }

    /// The pre-tokenizer's splits of `text` as byte ranges; `None` at a position the closed
    /// form of the look-ahead suffix does not cover.
    fn split(&self, cache: &mut Cache, text: &str) -> Option<Vec<(usize, usize)>> {
        let mut spans: Vec<(usize, usize)> = Vec::with_capacity(text.len() / 4 + 1);
        let mut pos = 0;
        while pos < text.len() {
            // Leftmost-first: a match of the head that starts at `pos` is the one an unanchored
            // search from `pos` would report, and an anchored search finds it without a reverse
            // scan for the start.
            let head = match self.known.map(|k| k.at(text.as_bytes(), pos)) {
                Some(Head::Match(end)) => Some(end),
                Some(Head::NoMatch) => None,
                None | Some(Head::Unknown) => {
                    let input = Input::new(text).range(pos..).anchored(Anchored::Yes);
                    self.head
                        .search_with(cache, &input)
                        .map(|m| m.end())
                        .filter(|&end| end > pos)
                }
            };
            if let Some(end) = head {
                spans.push((pos, end));
                pos = end;
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
                return None;
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
        Some(spans)
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
