//! The request as the decision engine sees it.

use std::sync::Arc;

use kinf_policy::Qos;
use smallvec::SmallVec;

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
    /// [`crate::prefix_index::block_hashes`]) and their block size, for callers that hash
    /// tokens themselves. Used when `token_ids` is absent and the block size matches.
    pub block_hashes: Option<(u32, Arc<[u64]>)>,
    /// `max_tokens` (or the default used for estimates).
    pub max_tokens: u32,
    /// Request headers, names lowercase.
    pub headers: Vec<(Arc<str>, Arc<str>)>,
    /// Whether the client asked for streaming.
    pub stream: bool,
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
            headers: Vec::new(),
            stream: false,
            messages: 1,
        }
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
