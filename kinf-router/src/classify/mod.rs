//! Built-in request classifiers (issue 7): PII detection ([`pii`]) and a prompt-complexity
//! estimate ([`complexity`]). Pure and synchronous: no I/O, no async runtime.
//!
//! [`Classifiers::from_specs`] builds the set configured on a `GatewayBackend`
//! (`External` classifiers are skipped: the server calls them). [`Classifiers::classify`] reads
//! every message the model will see and returns the tags plus every PII match with its value
//! redacted. See `docs/reference/classifiers.md` for the rules.

pub mod complexity;
pub mod eval;
pub mod pii;

use std::sync::Arc;

use kinf_policy::{ClassifierSpec, ClassifierType, PiiEntity};
use serde::Serialize;

pub use complexity::{Complexity, ComplexityConfig, ComplexityLevel};
pub use pii::Pii;

/// One message of a request, as the model will see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: &'a str,
    /// The text content (parts already concatenated).
    pub content: &'a str,
    /// Text the model also reads that is not a message of its own: the name and arguments of
    /// a tool call (OpenAI `tool_calls`, Anthropic `tool_use` blocks) or a later prompt of a
    /// completions batch. Read like any message, but not counted as a conversation turn.
    pub also_seen: bool,
}

impl<'a> Message<'a> {
    /// A message.
    pub fn new(role: &'a str, content: &'a str) -> Self {
        Message {
            role,
            content,
            also_seen: false,
        }
    }

    /// Text the model also reads, of a message of `role` (see the field `also_seen`).
    pub fn also_seen(role: &'a str, content: &'a str) -> Self {
        Message {
            role,
            content,
            also_seen: true,
        }
    }
}

/// A PII value found in a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Match {
    /// The entity.
    pub entity: PiiEntity,
    /// Its tag, `pii-<entity>`.
    pub tag: Arc<str>,
    /// Index of the message in the request.
    pub message_index: usize,
    /// Byte offset of the value's start in the message content.
    pub start: usize,
    /// Byte offset just past the value's end.
    pub end: usize,
    /// The value with every character but the first and the last replaced by `*`.
    pub redacted: String,
}

/// The result of classifying a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// Tags, sorted and deduplicated.
    pub tags: Vec<Arc<str>>,
    /// PII matches ordered by message, then position.
    pub matches: Vec<Match>,
}

/// The built-in classifiers of one gateway.
#[derive(Clone, Debug)]
pub struct Classifiers {
    pii: Option<Pii>,
    complexity: Option<Complexity>,
}

impl Default for Classifiers {
    /// PII with every entity, and complexity with the default thresholds.
    fn default() -> Self {
        Classifiers {
            pii: Some(Pii::new(&PiiEntity::ALL)),
            complexity: Some(Complexity::new(ComplexityConfig::default())),
        }
    }
}

impl Classifiers {
    /// Explicit configuration; `None` disables a classifier.
    pub fn new(pii: Option<Pii>, complexity: Option<Complexity>) -> Self {
        Classifiers { pii, complexity }
    }

    /// The built-in classifiers among `specs`. `External` specs are skipped. Several `Pii`
    /// specs detect the union of their entities (an empty list means all).
    pub fn from_specs(specs: &[ClassifierSpec]) -> Self {
        let mut entities: Vec<PiiEntity> = Vec::new();
        let mut any_pii = false;
        let mut complexity = None;
        for s in specs {
            match s.type_ {
                ClassifierType::Pii => {
                    any_pii = true;
                    if s.entities.is_empty() {
                        entities.extend(PiiEntity::ALL);
                    } else {
                        entities.extend(s.entities.iter().copied());
                    }
                }
                ClassifierType::Complexity => {
                    complexity = Some(Complexity::new(complexity_config(s.thresholds.as_ref())));
                }
                ClassifierType::External => {}
            }
        }
        Classifiers {
            pii: any_pii.then(|| Pii::new(&entities)),
            complexity,
        }
    }

    /// Whether no built-in classifier is configured.
    pub fn is_empty(&self) -> bool {
        self.pii.is_none() && self.complexity.is_none()
    }

    /// The PII classifier, if configured.
    pub fn pii(&self) -> Option<&Pii> {
        self.pii.as_ref()
    }

    /// The complexity classifier, if configured.
    pub fn complexity(&self) -> Option<&Complexity> {
        self.complexity.as_ref()
    }

    /// Classifies a request: every message is read.
    pub fn classify(&self, messages: &[Message<'_>]) -> Classification {
        let mut out = Classification::default();
        if let Some(p) = &self.pii {
            out.matches = p.scan(messages);
            if !out.matches.is_empty() {
                out.tags.push(Arc::clone(&p.detected_tag));
                for m in &out.matches {
                    out.tags.push(Arc::clone(&m.tag));
                }
            }
        }
        if let Some(c) = &self.complexity {
            out.tags.push(c.tag(c.level(messages)));
        }
        out.tags.sort();
        out.tags.dedup();
        out
    }
}

/// `value` with every character except the first and the last replaced by `*` (all of them
/// when it has at most two characters). Line breaks are masked too.
pub fn redact(value: &str) -> String {
    let n = value.chars().count();
    if n <= 2 {
        return "*".repeat(n);
    }
    let mut out = String::with_capacity(n);
    let mut chars = value.chars();
    if let Some(c) = chars.next() {
        out.push(c);
    }
    for _ in 0..n - 2 {
        out.push('*');
    }
    if let Some(c) = chars.next_back() {
        out.push(c);
    }
    out
}

/// The complexity configuration of a spec's `thresholds`: given values over the defaults.
/// Lists of the wrong length are ignored (lint reports them).
pub fn complexity_config(t: Option<&kinf_policy::ComplexityThresholds>) -> ComplexityConfig {
    let mut c = ComplexityConfig::default();
    let Some(t) = t else { return c };
    fn set<const N: usize>(dst: &mut [usize; N], src: &Option<Vec<u32>>) {
        if let Some(v) = src
            && v.len() == N
        {
            for (d, s) in dst.iter_mut().zip(v) {
                *d = *s as usize;
            }
        }
    }
    set(&mut c.tokens, &t.tokens);
    set(&mut c.turns, &t.turns);
    set(&mut c.code_lines, &t.code_lines);
    set(&mut c.math, &t.math);
    set(&mut c.steps, &t.steps);
    set(&mut c.questions, &t.questions);
    if let Some(m) = t.medium_at {
        c.medium_at = m;
    }
    if let Some(h) = t.high_at {
        c.high_at = h;
    }
    c
}
