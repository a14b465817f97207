//! The live workloads: the simulation's shapes, scaled down by a factor, as chat prompts whose
//! text tokenizes to the intended lengths.
//!
//! Every word of a prompt is one of [`WORDS`], each of which is a single token (with its
//! leading space) in `testdata/tokenizers/tiny-llama`, and the byte-level pre-tokenizer never
//! merges across a space: a text of `n` words is `n` tokens, give or take the first word (no
//! leading space) and the chat template's fixed tokens (measured and reported by the run).

use serde_json::{Value, json};

/// Words that are one token each (with a leading space) in the tiny-llama tokenizer (checked by
/// a test).
pub const WORDS: [&str; 64] = [
    "action",
    "after",
    "already",
    "always",
    "archive",
    "argument",
    "assert",
    "attribute",
    "back",
    "because",
    "before",
    "binary",
    "break",
    "byte",
    "cache",
    "called",
    "case",
    "check",
    "class",
    "close",
    "code",
    "compress",
    "contain",
    "continue",
    "create",
    "data",
    "decode",
    "defaults",
    "does",
    "each",
    "element",
    "else",
    "encoding",
    "errors",
    "exception",
    "exist",
    "field",
    "file",
    "files",
    "first",
    "flags",
    "follow",
    "format",
    "frame",
    "full",
    "function",
    "global",
    "group",
    "have",
    "help",
    "host",
    "import",
    "index",
    "info",
    "input",
    "instance",
    "integer",
    "into",
    "items",
    "just",
    "length",
    "like",
    "link",
    "load",
];

/// The workloads of `kinf-bench live` (the simulation's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// One of 24 prefixes of 16,000 tokens + 256 unique tokens, 256 output tokens; prefixes
    /// drawn uniformly.
    SharedPrefix,
    /// 8-turn conversations: 1,300-token user messages, 256 output tokens per turn; each turn's
    /// prompt holds the whole conversation so far (the simulation's sizes).
    Multiturn,
    /// 16,256-token prompts sharing nothing, 256 output tokens.
    Independent,
    /// Shared-prefix with Zipf-skewed popularity (s = 1.1, as the simulation: the most popular
    /// prefix ≈30% of requests), so that the warmest worker becomes the busiest.
    Hotspot,
}

impl Workload {
    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Workload::SharedPrefix => "shared-prefix",
            Workload::Multiturn => "multiturn",
            Workload::Independent => "independent",
            Workload::Hotspot => "hotspot",
        }
    }

    /// The published TTFT SLO at full scale (seconds): 4 s for multiturn, 8 s otherwise.
    pub fn slo_ttft_full_s(self) -> f64 {
        match self {
            Workload::Multiturn => 4.0,
            _ => 8.0,
        }
    }

    /// The simulation's light load at full scale for 3 workers, in requests per second
    /// (`kinf-bench sim`'s defaults): 0.15, multiturn 0.2 (0.025 conversations/s), hotspot 0.45.
    pub fn light_rate_full(self) -> f64 {
        match self {
            Workload::Multiturn => 0.2,
            Workload::Hotspot => 0.45,
            Workload::SharedPrefix | Workload::Independent => 0.15,
        }
    }
}

/// Token counts of a workload at full scale (the simulation's), before scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Distinct shared prefixes (0: none).
    pub prefixes: usize,
    /// Tokens of each shared prefix.
    pub prefix_tokens: usize,
    /// Unique tokens after the prefix (single-turn), or of the first message (multiturn).
    pub unique_tokens: usize,
    /// Output tokens per request.
    pub output_tokens: usize,
    /// Turns per conversation (1: single-turn).
    pub turns: usize,
    /// Tokens of each user message after the first (multiturn).
    pub turn_tokens: usize,
}

impl Shape {
    /// The full-scale shape of `w`.
    pub fn full(w: Workload) -> Shape {
        match w {
            Workload::SharedPrefix | Workload::Hotspot => Shape {
                prefixes: 24,
                prefix_tokens: 16_000,
                unique_tokens: 256,
                output_tokens: 256,
                turns: 1,
                turn_tokens: 0,
            },
            Workload::Independent => Shape {
                prefixes: 0,
                prefix_tokens: 0,
                unique_tokens: 16_256,
                output_tokens: 256,
                turns: 1,
                turn_tokens: 0,
            },
            Workload::Multiturn => Shape {
                prefixes: 0,
                prefix_tokens: 0,
                unique_tokens: 1_300,
                output_tokens: 256,
                turns: 8,
                turn_tokens: 1_300,
            },
        }
    }

    /// Token counts divided by `scale` (at least 1 where non-zero); counts of things
    /// (prefixes, turns) unchanged.
    pub fn scaled(self, scale: usize) -> Shape {
        let s = scale.max(1);
        let d = |n: usize| if n == 0 { 0 } else { (n / s).max(1) };
        Shape {
            prefixes: self.prefixes,
            prefix_tokens: d(self.prefix_tokens),
            unique_tokens: d(self.unique_tokens),
            output_tokens: d(self.output_tokens),
            turns: self.turns,
            turn_tokens: d(self.turn_tokens),
        }
    }

    /// As JSON, for the result's parameters.
    pub fn to_json(self) -> Value {
        json!({
            "prefixes": self.prefixes, "prefix_tokens": self.prefix_tokens,
            "unique_tokens": self.unique_tokens, "output_tokens": self.output_tokens,
            "turns": self.turns, "turn_tokens": self.turn_tokens,
        })
    }
}

/// SplitMix64: a small deterministic generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` and a stream label.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with rate `rate` (mean 1/rate).
    pub fn exp(&mut self, rate: f64) -> f64 {
        -(1.0 - self.unit()).ln() / rate
    }
}

/// `n` words drawn from `rng`, space-separated.
pub fn words(rng: &mut Rng, n: usize) -> String {
    let mut s = String::with_capacity(n * 8);
    for i in 0..n {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    s
}

/// One request's new user message (the conversation before it is the session's history).
#[derive(Clone, Debug, PartialEq)]
pub struct Turn {
    /// The user message.
    pub content: String,
    /// `max_tokens`.
    pub max_tokens: usize,
}

/// A session: one request, or the turns of one conversation, sent in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Session {
    /// The shared prefix it uses (single-turn prefix workloads), for traces.
    pub prefix: Option<usize>,
    /// Its turns.
    pub turns: Vec<Turn>,
}

/// The sessions of a run of `requests` requests (conversations: `ceil(requests / turns)`),
/// deterministic for `seed`.
pub fn sessions(w: Workload, shape: Shape, requests: usize, seed: u64) -> Vec<Session> {
    let prefix_texts: Vec<String> = (0..shape.prefixes)
        .map(|k| {
            words(
                &mut Rng::new(seed, 1_000_000 + k as u64),
                shape.prefix_tokens,
            )
        })
        .collect();
    let weights: Vec<f64> = (0..shape.prefixes)
        .map(|k| match w {
            Workload::Hotspot => 1.0 / ((k + 1) as f64).powf(1.1),
            _ => 1.0,
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut pick = Rng::new(seed, 1);
    let n = requests.div_ceil(shape.turns.max(1));
    (0..n)
        .map(|i| {
            let mut r = Rng::new(seed, 2_000_000 + i as u64);
            if shape.turns > 1 {
                let turns = (0..shape.turns)
                    .map(|t| Turn {
                        content: words(
                            &mut r,
                            if t == 0 {
                                shape.unique_tokens
                            } else {
                                shape.turn_tokens
                            },
                        ),
                        max_tokens: shape.output_tokens,
                    })
                    .collect();
                return Session {
                    prefix: None,
                    turns,
                };
            }
            let prefix = if shape.prefixes == 0 {
                None
            } else {
                let mut x = pick.unit() * total;
                let mut k = 0;
                while k + 1 < weights.len() && x >= weights[k] {
                    x -= weights[k];
                    k += 1;
                }
                Some(k)
            };
            let unique = words(&mut r, shape.unique_tokens);
            let content = match prefix {
                Some(k) => format!("{} {unique}", prefix_texts[k]),
                None => unique,
            };
            Session {
                prefix,
                turns: vec![Turn {
                    content,
                    max_tokens: shape.output_tokens,
                }],
            }
        })
        .collect()
}

/// Send times (simulated seconds from the start) of `n` sessions arriving as a Poisson process
/// of `rate` per simulated second, deterministic for `seed`.
pub fn poisson_arrivals(n: usize, rate: f64, seed: u64) -> Vec<f64> {
    let mut r = Rng::new(seed, 3);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                t += r.exp(rate);
            }
            t
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn tokenizer() -> kinf_router::tokenize::ChatTokenizer {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/tokenizers/tiny-llama"
        );
        let tj = std::fs::read_to_string(format!("{dir}/tokenizer.json")).unwrap();
        let tc = std::fs::read_to_string(format!("{dir}/tokenizer_config.json")).unwrap();
        kinf_router::tokenize::ChatTokenizer::from_files_content(&tj, Some(&tc)).unwrap()
    }

    fn chat_tokens(t: &kinf_router::tokenize::ChatTokenizer, content: &str) -> Vec<u32> {
        t.encode_chat(&[kinf_router::tokenize::ChatMessage::new("user", content)])
            .unwrap()
    }

    #[test]
    fn prompts_tokenize_to_the_intended_length() {
        let t = tokenizer();
        let base = chat_tokens(&t, "").len();
        for w in [
            Workload::SharedPrefix,
            Workload::Independent,
            Workload::Hotspot,
        ] {
            let shape = Shape::full(w).scaled(8);
            for s in sessions(w, shape, 20, 7) {
                let n = chat_tokens(&t, &s.turns[0].content).len() - base;
                let want = shape.prefix_tokens + shape.unique_tokens;
                // The first word has no leading space: at most a few tokens more.
                assert!(n >= want && n <= want + 3, "{w:?}: {n} tokens, want {want}");
            }
        }
    }

    #[test]
    fn sessions_share_prefixes_as_designed_and_are_deterministic() {
        let shape = Shape::full(Workload::SharedPrefix).scaled(16);
        assert_eq!(shape.prefix_tokens, 1000);
        assert_eq!(shape.output_tokens, 16);
        let a = sessions(Workload::SharedPrefix, shape, 200, 1);
        assert_eq!(a, sessions(Workload::SharedPrefix, shape, 200, 1));
        assert_ne!(a, sessions(Workload::SharedPrefix, shape, 200, 2));
        // Same prefix → same first prefix_tokens words; different → different first words.
        let words_of = |s: &Session| -> Vec<String> {
            s.turns[0]
                .content
                .split(' ')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let (x, y) = (
            &a[0],
            a.iter().skip(1).find(|s| s.prefix == a[0].prefix).unwrap(),
        );
        assert_eq!(
            words_of(x)[..shape.prefix_tokens],
            words_of(y)[..shape.prefix_tokens]
        );
        assert_ne!(
            words_of(x)[shape.prefix_tokens..],
            words_of(y)[shape.prefix_tokens..]
        );
        let z = a.iter().find(|s| s.prefix != a[0].prefix).unwrap();
        assert_ne!(words_of(x)[..8], words_of(z)[..8]);
        // Uniform: every prefix used, none dominating.
        let mut count = [0usize; 24];
        for s in &a {
            count[s.prefix.unwrap()] += 1;
        }
        assert!(count.iter().all(|&c| c > 0 && c < 30), "{count:?}");
    }

    #[test]
    fn hotspot_is_skewed_and_multiturn_has_conversations() {
        let shape = Shape::full(Workload::Hotspot).scaled(16);
        let a = sessions(Workload::Hotspot, shape, 1000, 3);
        let top = a.iter().filter(|s| s.prefix == Some(0)).count();
        assert!((250..370).contains(&top), "{top}");
        let m = Shape::full(Workload::Multiturn).scaled(8);
        let c = sessions(Workload::Multiturn, m, 20, 3);
        assert_eq!(c.len(), 3);
        assert!(c.iter().all(|s| s.turns.len() == 8));
        assert_eq!(c[0].turns[0].content.split(' ').count(), 162);
        assert_eq!(c[0].turns[1].content.split(' ').count(), 162);
    }

    #[test]
    fn poisson_arrivals_have_the_requested_rate() {
        let t = poisson_arrivals(4000, 2.0, 9);
        assert_eq!(t[0], 0.0);
        assert!(t.windows(2).all(|w| w[1] >= w[0]));
        let rate = (t.len() - 1) as f64 / t[t.len() - 1];
        assert!((1.9..2.1).contains(&rate), "{rate}");
    }
}
