//! The request as the decision engine sees it.

use std::sync::Arc;

use kinf_policy::Qos;
use smallvec::SmallVec;

use crate::prefix_index::{RequestHashes, block_hashes};

/// What the engine knows about one inference request.
#[derive(Clone, Debug)]
pub struct Request {
    /// The pool the front door serves (`name` or `namespace/name`); `None` when the policy has
    /// exactly one pool.
    pub pool: Option<Arc<str>>,
    /// The identified tenant.
    pub tenant: Option<Arc<str>>,
    /// The requested model (body `model`).
    pub model: Arc<str>,
    /// Tags set by classifiers.
    pub tags: SmallVec<[Arc<str>; 4]>,
    /// Quality-of-service class.
    pub qos: Qos,
    /// Prompt size in tokens.
    pub prompt_tokens: u32,
    /// The prompt's token ids, when the model's tokenizer is known (precise prefix matching).
    pub token_ids: Option<Arc<[u32]>>,
    /// Prefix block hashes computed by the caller (Kinference's own chained hash,
    /// [`crate::prefix_index::block_hashes`]) and their block size. Used instead of hashing
    /// `token_ids` wherever the block size matches a worker set's, so that a caller can hash
    /// the prompt once, outside any lock; when both are set they must be the hashes of
    /// `token_ids`. Ignored where the block size differs (`token_ids` are hashed then).
    pub block_hashes: Option<(u32, Arc<[u64]>)>,
    /// `max_tokens` (or the default used for estimates), per generated sequence.
    pub max_tokens: u32,
    /// Sequences the request generates: OpenAI's `n` times the prompts of a batched
    /// completion (1 for most requests; 0 is read as 1). Output estimates and the decode load
    /// are [`decode_tokens`](Self::decode_tokens): `max_tokens` for each sequence.
    pub sequences: u32,
    /// Request headers, names lowercase.
    pub headers: Vec<(Arc<str>, Arc<str>)>,
    /// Whether the client asked for streaming.
    pub stream: bool,
    /// Tokens the request needs in the model's context: its prompt plus its explicit
    /// `max_tokens` (plus 1 without one: vLLM then generates what is left, and refuses only a
    /// prompt that fills the context). A worker set whose workers reported a smaller
    /// `max_model_len` for the upstream model is no candidate
    /// ([`WorkerSetState::context_limit`](crate::state::WorkerSetState::context_limit)). `None`
    /// (the default) checks nothing: set it only from an exact token count.
    pub required_context: Option<u32>,
    /// Number of chat messages (1 for completions).
    pub messages: u32,
}

impl Request {
    /// A request for `model` with `prompt_tokens` tokens and defaults elsewhere.
    pub fn new(model: &str, prompt_tokens: u32) -> Self {
        Request {
            pool: None,
            tenant: None,
            model: model.into(),
            tags: SmallVec::new(),
            qos: Qos::Interactive,
            prompt_tokens,
            token_ids: None,
            block_hashes: None,
            max_tokens: 256,
            sequences: 1,
            headers: Vec::new(),
            stream: false,
            required_context: None,
            messages: 1,
        }
    }

    /// The context a request needs ([`required_context`](Self::required_context)): its
    /// `prompt_tokens` plus its explicit `max_tokens`, or plus 1 without one (vLLM then
    /// generates what the context has left, and refuses only a prompt that fills it).
    pub fn context_needed(prompt_tokens: u32, max_tokens: Option<u32>) -> u32 {
        prompt_tokens.saturating_add(max_tokens.unwrap_or(1).max(1))
    }

    /// Output tokens the request may generate in all: `max_tokens` × [`sequences`](Self::sequences).
    pub fn decode_tokens(&self) -> f64 {
        f64::from(self.max_tokens) * f64::from(self.sequences.max(1))
    }

    /// The prompt's block hashes for `block_size`: the caller's [`block_hashes`](Self::block_hashes)
    /// when their block size matches, else computed from `token_ids`; empty without either.
    pub fn prompt_hashes(&self, block_size: usize) -> PromptHashes<'_> {
        match (&self.block_hashes, &self.token_ids) {
            (Some((bs, h)), _) if *bs as usize == block_size => PromptHashes::Given(h),
            (_, Some(tokens)) => PromptHashes::Computed(block_hashes(tokens, block_size)),
            _ => PromptHashes::Given(&[]),
        }
    }

    /// Sets [`block_hashes`](Self::block_hashes) to the hashes of `token_ids` for
    /// `block_size` (nothing without token ids), so that later matching and
    /// [`ClusterState::record_routed`](crate::ClusterState::record_routed) need not hash them.
    pub fn hash_prompt(&mut self, block_size: usize) {
        let (Some(tokens), Ok(bs)) = (&self.token_ids, u32::try_from(block_size)) else {
            return;
        };
        let hashes = block_hashes(tokens, block_size);
        self.block_hashes = Some((bs, Arc::from(hashes.as_slice())));
    }

    /// Whether the request carries `tag`.
    pub fn has_tag(&self, tag: &str) -> bool {
        self.tags.iter().any(|t| &**t == tag)
    }

    /// The value of header `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| &**v)
    }
}

/// A request's block hashes for one block size ([`Request::prompt_hashes`]): the caller's, or
/// computed from its token ids.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // lives on the stack for one call; boxing would allocate
pub enum PromptHashes<'a> {
    /// [`Request::block_hashes`], whose block size matched.
    Given(&'a [u64]),
    /// Hashed from [`Request::token_ids`].
    Computed(RequestHashes),
}

impl std::ops::Deref for PromptHashes<'_> {
    type Target = [u64];

    fn deref(&self) -> &[u64] {
        match self {
            Self::Given(h) => h,
            Self::Computed(h) => h,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_hashes_are_used_only_for_their_block_size() {
        let tokens: Vec<u32> = (0..64).collect();
        let mut req = Request::new("m", 64);
        assert!(req.prompt_hashes(16).is_empty(), "no tokens, no hashes");
        req.token_ids = Some(tokens.clone().into());
        let computed = block_hashes(&tokens, 16);
        assert_eq!(&*req.prompt_hashes(16), &computed[..]);
        // The caller's hashes win where the size matches (here deliberately not the tokens'
        // hashes, to see which are used), and are ignored where it does not.
        req.block_hashes = Some((16, Arc::from(vec![7u64, 8, 9, 10])));
        assert_eq!(&*req.prompt_hashes(16), &[7, 8, 9, 10]);
        assert_eq!(&*req.prompt_hashes(32), &block_hashes(&tokens, 32)[..]);
        assert!(matches!(req.prompt_hashes(16), PromptHashes::Given(_)));
        // Hashing the prompt in place gives the computed hashes for that size.
        req.hash_prompt(32);
        assert_eq!(req.block_hashes.as_ref().map(|(bs, _)| *bs), Some(32));
        assert_eq!(&*req.prompt_hashes(32), &block_hashes(&tokens, 32)[..]);
        assert!(matches!(req.prompt_hashes(32), PromptHashes::Given(_)));
    }
}
