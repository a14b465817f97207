//! Prompt tokenization and output text.
//!
//! With `--tokenizer DIR`, prompts are rendered and tokenized exactly as vLLM does
//! ([`kinf_router::tokenize::ChatTokenizer`]). Without it, the built-in tokenizer is used:
//!
//! - chat template: `<|{role}|>\n{content}\n` per message, then `<|assistant|>\n`;
//! - the text is split into pieces: runs of letters/digits, and single other characters;
//!   whitespace before a piece is kept with it (`" hello"` and `"hello"` differ);
//! - each piece's id is `16 + xxh3_64(piece) mod (vocab − 16)` (ids below 16 are reserved);
//! - id `1` (BOS) starts every prompt.
//!
//! Generated tokens come from [`crate::output_token`]; their text is a word from a fixed list
//! chosen by the token id (with a leading space after the first token), whichever tokenizer
//! is used.

use std::path::Path;
use std::sync::Arc;

use kinf_router::tokenize::{ChatMessage, ChatTokenizer};

/// Reserved ids of the built-in tokenizer.
const RESERVED: u32 = 16;
/// BOS id of the built-in tokenizer.
const BOS: u32 = 1;

const WORDS: [&str; 64] = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "cache",
    "block",
    "token",
    "prefix",
    "model",
    "route",
    "queue",
    "batch",
    "step",
    "time",
    "kv",
    "hash",
    "engine",
    "worker",
    "simulated",
];

/// The tokenizer in use.
#[derive(Clone)]
pub enum Tokens {
    /// The built-in deterministic tokenizer over `vocab` ids.
    Builtin {
        /// Vocabulary size.
        vocab: u32,
    },
    /// A Hugging Face tokenizer and chat template.
    Hf(Arc<ChatTokenizer>),
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin { vocab } => write!(f, "Builtin {{ vocab: {vocab} }}"),
            Self::Hf(_) => write!(f, "Hf"),
        }
    }
}

impl Tokens {
    /// Loads `dir/tokenizer.json` (+ `tokenizer_config.json`), or the built-in tokenizer.
    pub fn load(dir: Option<&Path>, vocab: u32) -> Result<Self, String> {
        let Some(dir) = dir else {
            return Ok(Self::Builtin {
                vocab: vocab.max(RESERVED + 1),
            });
        };
        let tj = std::fs::read_to_string(dir.join("tokenizer.json"))
            .map_err(|e| format!("{}: {e}", dir.join("tokenizer.json").display()))?;
        let tc = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
        let t = ChatTokenizer::from_files_content(&tj, tc.as_deref()).map_err(|e| e.to_string())?;
        Ok(Self::Hf(Arc::new(t)))
    }

    /// Token ids of a chat conversation (template rendered, generation prompt added).
    pub fn chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        match self {
            Self::Builtin { vocab } => {
                let mut text = String::new();
                for m in messages {
                    text.push_str(&format!("<|{}|>\n{}\n", m.role, m.content));
                }
                text.push_str("<|assistant|>\n");
                Ok(builtin_encode(&text, *vocab))
            }
            Self::Hf(t) => t.encode_chat(messages).map_err(|e| e.to_string()),
        }
    }

    /// Token ids of a completion prompt.
    pub fn prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Self::Builtin { vocab } => Ok(builtin_encode(text, *vocab)),
            Self::Hf(t) => t.encode_prompt(text).map_err(|e| e.to_string()),
        }
    }

    /// Text of the `index`-th generated token.
    pub fn piece(&self, token: u32, index: u32) -> String {
        let w = WORDS[token as usize % WORDS.len()];
        if index == 0 {
            w.to_owned()
        } else {
            format!(" {w}")
        }
    }
}

/// The built-in tokenizer (see the module documentation).
pub fn builtin_encode(text: &str, vocab: u32) -> Vec<u32> {
    let span = u64::from(vocab.saturating_sub(RESERVED).max(1));
    let id = |piece: &str| RESERVED + (xxhash_rust::xxh3::xxh3_64(piece.as_bytes()) % span) as u32;
    let mut out = vec![BOS];
    let mut cur = String::new();
    let mut cur_alnum = false;
    let mut space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            if !cur.is_empty() {
                out.push(id(&cur));
                cur.clear();
            }
            space = true;
            continue;
        }
        let alnum = c.is_alphanumeric();
        if !cur.is_empty() && (!alnum || !cur_alnum) {
            out.push(id(&cur));
            cur.clear();
        }
        if cur.is_empty() && space {
            cur.push(' ');
            space = false;
        }
        cur.push(c);
        cur_alnum = alnum;
    }
    if !cur.is_empty() {
        out.push(id(&cur));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn builtin_is_deterministic_and_prefix_stable() {
        let a = builtin_encode("Hello, world! How are you?", 1000);
        let b = builtin_encode("Hello, world! How are you? Fine.", 1000);
        assert_eq!(a.len(), 9);
        assert_eq!(&b[..a.len()], &a[..]);
        assert!(a.iter().all(|&t| t < 1000));
    }
}
