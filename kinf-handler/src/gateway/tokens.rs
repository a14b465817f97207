//! Prompt tokens of a request: exact when the model's tokenizer is known (the same ids vLLM
//! computes, so KV-event prefix matching is exact), otherwise a stand-in sequence of one id per
//! four bytes of the rendered prompt, which keeps prompt-size estimates and approximate prefix
//! tracking meaningful.

use std::sync::Arc;

use kinf_router::tokenize::ChatTokenizer;

use super::parse::{Parsed, Prompt};

/// The token ids of a prompt and whether they are exact.
#[derive(Clone, Debug)]
pub struct PromptTokens {
    /// Token ids.
    pub ids: Arc<[u32]>,
    /// From the model's tokenizer (true) or the byte stand-in (false).
    pub exact: bool,
}

/// Tokenizes `parsed` with `tokenizer`, or with the stand-in when there is none or it fails.
pub fn prompt_tokens(parsed: &Parsed, tokenizer: Option<&ChatTokenizer>) -> PromptTokens {
    if let Prompt::Tokens(ids) = &parsed.prompt {
        return PromptTokens {
            ids: ids.as_slice().into(),
            exact: true,
        };
    }
    if let Some(t) = tokenizer {
        let r = match &parsed.prompt {
            Prompt::Chat(m) => t.encode_chat(m),
            Prompt::Text(s) => t.encode_prompt(s),
            Prompt::Tokens(_) => Ok(Vec::new()),
        };
        match r {
            Ok(ids) => {
                return PromptTokens {
                    ids: ids.into(),
                    exact: true,
                };
            }
            Err(e) => tracing::debug!(error = %e, "tokenizer failed; using the byte stand-in"),
        }
    }
    let mut ids = Vec::with_capacity(parsed.prompt_bytes() / 4 + 1);
    match &parsed.prompt {
        Prompt::Chat(m) => {
            let mut carry = Carry::default();
            for msg in m {
                carry.push(msg.role.as_bytes(), &mut ids);
                carry.push(b"\n", &mut ids);
                carry.push(msg.content.as_bytes(), &mut ids);
                carry.push(b"\n", &mut ids);
            }
            carry.flush(&mut ids);
        }
        Prompt::Text(s) => {
            let mut carry = Carry::default();
            carry.push(s.as_bytes(), &mut ids);
            carry.flush(&mut ids);
        }
        Prompt::Tokens(_) => {}
    }
    PromptTokens {
        ids: ids.into(),
        exact: false,
    }
}

/// Packs a byte stream into little-endian u32 words.
#[derive(Default)]
struct Carry {
    word: [u8; 4],
    len: usize,
}

impl Carry {
    fn push(&mut self, bytes: &[u8], out: &mut Vec<u32>) {
        for b in bytes {
            self.word[self.len] = *b;
            self.len += 1;
            if self.len == 4 {
                out.push(u32::from_le_bytes(self.word));
                self.len = 0;
            }
        }
    }

    fn flush(&mut self, out: &mut Vec<u32>) {
        if self.len > 0 {
            self.word[self.len..].fill(0);
            out.push(u32::from_le_bytes(self.word));
            self.len = 0;
        }
    }
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;
    use crate::gateway::errors::Api;
    use crate::gateway::parse::parse;

    #[test]
    fn stand_in_is_a_shared_prefix_for_shared_prefixes() {
        let a = parse(
            Api::Chat,
            br#"{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant with a long shared system prompt."},{"role":"user","content":"one"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let b = parse(
            Api::Chat,
            br#"{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant with a long shared system prompt."},{"role":"user","content":"two, longer"}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        let ta = prompt_tokens(&a, None);
        let tb = prompt_tokens(&b, None);
        assert!(!ta.exact);
        let common = ta
            .ids
            .iter()
            .zip(tb.ids.iter())
            .take_while(|(x, y)| x == y)
            .count();
        assert!(common >= 16, "{common}");
        assert_eq!(ta.ids.len(), a.prompt_bytes().div_ceil(4));
    }
}
