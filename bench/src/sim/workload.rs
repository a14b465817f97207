//! The benchmark's workloads: what each request's prompt is, and how requests group into
//! sessions (a multi-turn conversation is one session of 8 requests, each sent when the
//! previous one finished; every other workload has one request per session).
//!
//! Token ids are random (deterministic for the seed): prefix caching only needs equal token
//! chains to be equal. Sizes are in tokens. `docs/benchmarks/README.md` documents each one.

use std::sync::Arc;

use clap::ValueEnum;
use kinf_policy::Qos;
use kinf_sim::PrefixHashes;
use kinf_sim::hash::Rng;
use serde::Serialize;

/// A workload's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// One of 24 prefixes × 16,000 tokens + 256 unique tokens, 256 output tokens (NOTES.md §4).
    SharedPrefix,
    /// 8-turn conversations; each turn's prompt is the whole conversation so far plus a new user
    /// turn.
    Multiturn,
    /// No sharing: 16,256 random tokens, 256 output tokens.
    Independent,
    /// Three tenants with different prefixes, sizes and QoS.
    MixedTenants,
    /// Like shared-prefix, but prefix popularity is Zipf-skewed (s = 1.1).
    Hotspot,
    /// The scale study's: one of 8 × workers system prompts of 1,792 tokens + 256 unique
    /// tokens (2,048-token prompts), 128 output tokens.
    Chat,
}

impl WorkloadKind {
    /// Every workload.
    pub const ALL: [WorkloadKind; 5] = [
        Self::SharedPrefix,
        Self::Multiturn,
        Self::Independent,
        Self::MixedTenants,
        Self::Hotspot,
    ];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Self::SharedPrefix => "shared-prefix",
            Self::Multiturn => "multiturn",
            Self::Independent => "independent",
            Self::MixedTenants => "mixed-tenants",
            Self::Hotspot => "hotspot",
            Self::Chat => "chat",
        }
    }

    /// The TTFT threshold of the workload's SLO (90 % of requests at or under it), seconds:
    /// 8 s for shared-prefix, 4 s for multiturn (NOTES.md §4); 8 s for the other
    /// long-prompt workloads, 4 s for mixed-tenants (short interactive prompts dominate).
    pub fn slo_ttft_s(self) -> f64 {
        match self {
            Self::Multiturn | Self::MixedTenants | Self::Chat => 4.0,
            Self::SharedPrefix | Self::Independent | Self::Hotspot => 8.0,
        }
    }

    /// Default light-load Poisson rate in sessions per second for 3 workers (scaled linearly
    /// with the worker count): 0.15 req/s, the calibrated light load of
    /// `docs/sim/calibration.md`; for multiturn 0.025 conversations/s (8 turns each:
    /// 0.2 req/s); for hotspot 0.45 req/s, since the point of that workload is load; for chat
    /// (the scale study) 10 req/s per worker.
    pub fn light_rate(self, workers: usize) -> f64 {
        let per3 = match self {
            Self::Multiturn => 0.025,
            Self::Hotspot => 0.45,
            Self::Chat => 30.0,
            Self::SharedPrefix | Self::Independent | Self::MixedTenants => 0.15,
        };
        per3 * workers as f64 / 3.0
    }
}

/// Tenant tags of the mixed-tenants workload (`chat`, `rag`, `batch`); `None` elsewhere.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    /// The tenant.
    pub tenant: Option<Arc<str>>,
    /// Its QoS class.
    pub qos: Qos,
}

/// One request to send: prompt, output length and who sends it.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Prompt token ids.
    pub prompt: Arc<[u32]>,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Tenant and QoS.
    pub meta: Meta,
    /// The engine hashes of the shared prefix the prompt begins with, when the generator
    /// computes them ([`Generator::with_prefix_hashes`]).
    pub prefix: Option<PrefixHashes>,
}

/// A session: requests sent one after another (each once the previous finished).
#[derive(Debug, Clone)]
pub struct Session {
    /// Remaining turns' new tokens (multiturn: user turn tokens; others: whole prompts).
    pending: std::collections::VecDeque<Turn>,
    /// Multiturn: the conversation so far is prepended to each next turn's new tokens, with the
    /// previous answer (reproduced with [`kinf_sim::output_token`]).
    conversational: bool,
    /// The conversation so far.
    history: Vec<u32>,
}

impl Session {
    /// The next request of the session; `previous` is the `(output_seed, output_tokens)` of
    /// the turn before (its answer joins the conversation).
    pub fn next_turn(&mut self, previous: Option<(u64, u32)>, vocab: u32) -> Option<Turn> {
        let mut t = self.pending.pop_front()?;
        if self.conversational {
            if let Some((seed, n)) = previous {
                self.history
                    .extend((0..n).map(|i| kinf_sim::output_token(seed, i, vocab)));
            }
            self.history.extend_from_slice(&t.prompt);
            t.prompt = Arc::from(self.history.as_slice());
        }
        Some(t)
    }

    /// Whether turns remain.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Turns of a multiturn conversation.
pub const MULTITURN_TURNS: usize = 8;

/// Sizes of the multiturn workload: a conversation opens with `first_tokens` new tokens, each
/// later user turn adds `user_tokens`, each answer `output_tokens`.
///
/// The published benchmark does not give its conversations' sizes, only their medians (NOTES.md
/// §4: 1.70 s under random routing, 0.59 s under Kinference). The default is the least-squares
/// fit of the two first sizes to those two medians on the calibrated profile (log errors, a grid
/// of 250 × 25 tokens, 256 output tokens as in the other workloads, mean of the medians over
/// seeds 1–3): `bench/experiments/fit-multiturn.sh` reruns the fit, and
/// `docs/benchmarks/README.md` gives its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MultiturnSizes {
    /// Tokens of a conversation's first user turn (instructions and a document).
    pub first_tokens: usize,
    /// Tokens of each later user turn.
    pub user_tokens: usize,
    /// Tokens of each answer.
    pub output_tokens: u32,
}

impl Default for MultiturnSizes {
    fn default() -> Self {
        Self {
            first_tokens: 4_250,
            user_tokens: 1_050,
            output_tokens: 256,
        }
    }
}

impl std::str::FromStr for MultiturnSizes {
    type Err = String;

    /// `FIRST,USER,OUTPUT`, e.g. `4250,1050,256`; each at least 1.
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let [first, user, output] = parts.as_slice() else {
            return Err(format!(
                "expected FIRST,USER,OUTPUT token counts (e.g. 4250,1050,256), got `{s}`"
            ));
        };
        let count = |name: &str, v: &str| -> Result<usize, String> {
            match v.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "{name} must be a whole number of tokens ≥ 1, got `{v}`"
                )),
            }
        };
        let output = count("OUTPUT", output)?;
        Ok(Self {
            first_tokens: count("FIRST", first)?,
            user_tokens: count("USER", user)?,
            output_tokens: u32::try_from(output)
                .map_err(|_| format!("OUTPUT must be at most {}, got `{output}`", u32::MAX))?,
        })
    }
}

/// Zipf exponent of the hotspot workload's prefix popularity.
pub const HOTSPOT_ZIPF_S: f64 = 1.1;

/// One mixed-tenants tenant.
struct Tenant {
    name: Arc<str>,
    qos: Qos,
    share: f64,
    prefixes: Vec<Arc<[u32]>>,
    unique_tokens: usize,
    output_tokens: u32,
}

/// Generates sessions for one workload, deterministic for the seed.
pub struct Generator {
    kind: WorkloadKind,
    rng: Rng,
    vocab: u32,
    prefixes: Vec<Arc<[u32]>>,
    /// Cumulative popularity of `prefixes` (hotspot), else empty (uniform).
    cdf: Vec<f64>,
    tenants: Vec<Tenant>,
    /// Scale: divides every token count (for fast smoke tests with the `tiny` profile).
    scale: usize,
    /// The multiturn workload's sizes.
    multiturn: MultiturnSizes,
    /// `prefixes`' engine hashes, index for index ([`Self::with_prefix_hashes`]); empty when
    /// the generator does not attach them.
    prefix_hashes: Vec<PrefixHashes>,
}

impl Generator {
    /// A generator for a fleet of `workers`; `scale` divides every size (1 for the real
    /// benchmark).
    pub fn new(kind: WorkloadKind, seed: u64, vocab: u32, scale: usize, workers: usize) -> Self {
        let scale = scale.max(1);
        let mut rng = Rng::new(seed ^ 0x776f_726b_6c6f_6164);
        let mut prefixes = Vec::new();
        let mut cdf = Vec::new();
        let mut tenants = Vec::new();
        let sz = |n: usize| (n / scale).max(1);
        match kind {
            WorkloadKind::SharedPrefix | WorkloadKind::Hotspot => {
                for _ in 0..24 {
                    prefixes.push(Arc::from(rng.tokens(sz(16_000), vocab)));
                }
                if kind == WorkloadKind::Hotspot {
                    let w: Vec<f64> = (1..=24)
                        .map(|r| 1.0 / (r as f64).powf(HOTSPOT_ZIPF_S))
                        .collect();
                    let total: f64 = w.iter().sum();
                    let mut acc = 0.0;
                    for x in w {
                        acc += x / total;
                        cdf.push(acc);
                    }
                }
            }
            WorkloadKind::MixedTenants => {
                let mut mk = |n: usize, len: usize| -> Vec<Arc<[u32]>> {
                    (0..n)
                        .map(|_| Arc::from(rng.tokens(sz(len), vocab)))
                        .collect()
                };
                tenants.push(Tenant {
                    name: "chat".into(),
                    qos: Qos::Interactive,
                    share: 0.6,
                    prefixes: mk(16, 4_000),
                    unique_tokens: sz(200),
                    output_tokens: 200,
                });
                tenants.push(Tenant {
                    name: "rag".into(),
                    qos: Qos::Interactive,
                    share: 0.25,
                    prefixes: mk(8, 12_000),
                    unique_tokens: sz(300),
                    output_tokens: 150,
                });
                tenants.push(Tenant {
                    name: "batch".into(),
                    qos: Qos::Batch,
                    share: 0.15,
                    prefixes: Vec::new(),
                    unique_tokens: sz(6_000),
                    output_tokens: 400,
                });
            }
            WorkloadKind::Chat => {
                for _ in 0..8 * workers.max(1) {
                    prefixes.push(Arc::from(rng.tokens(sz(1_792), vocab)));
                }
            }
            WorkloadKind::Multiturn | WorkloadKind::Independent => {}
        }
        Self {
            kind,
            rng,
            vocab,
            prefixes,
            cdf,
            tenants,
            scale,
            multiturn: MultiturnSizes::default(),
            prefix_hashes: Vec::new(),
        }
    }

    /// Attaches to each turn that begins with a shared prefix (shared-prefix, hotspot, chat)
    /// the prefix's engine hashes for blocks of `block_size` tokens, computed once per prefix,
    /// so that engines do not hash it again for every request. Outcomes are the same.
    pub fn with_prefix_hashes(mut self, block_size: u32) -> Self {
        self.prefix_hashes = self
            .prefixes
            .iter()
            .map(|p| PrefixHashes::new(p.clone(), block_size))
            .collect();
        self
    }

    /// The hashes of prefix `p`, if the generator attaches them.
    fn hashes_of(&self, p: usize) -> Option<PrefixHashes> {
        self.prefix_hashes.get(p).cloned()
    }

    /// Uses `sizes` for multiturn conversations instead of the default.
    pub fn with_multiturn_sizes(mut self, sizes: MultiturnSizes) -> Self {
        self.multiturn = sizes;
        self
    }

    fn out(&self, n: u32) -> u32 {
        (n / self.scale as u32).max(1)
    }

    fn pick_prefix(&mut self) -> usize {
        if self.cdf.is_empty() {
            return self.rng.below(self.prefixes.len().max(1) as u64) as usize;
        }
        let u = self.rng.next_f64();
        self.cdf
            .iter()
            .position(|&c| u < c)
            .unwrap_or(self.cdf.len().saturating_sub(1))
    }

    fn with_unique(&mut self, prefix: &[u32], unique: usize) -> Arc<[u32]> {
        // Collected straight into the `Arc` (both parts have an exact length): one
        // allocation and one copy of the prefix, not a `Vec` copied again.
        let vocab = u64::from(self.vocab.max(1));
        let rng = &mut self.rng;
        prefix
            .iter()
            .copied()
            .chain((0..unique).map(|_| rng.below(vocab) as u32))
            .collect()
    }

    /// The next session.
    pub fn session(&mut self) -> Session {
        let interactive = Meta {
            tenant: None,
            qos: Qos::Interactive,
        };
        let single = |t: Turn| Session {
            pending: [t].into_iter().collect(),
            conversational: false,
            history: Vec::new(),
        };
        match self.kind {
            WorkloadKind::SharedPrefix | WorkloadKind::Hotspot => {
                let p = self.pick_prefix();
                let prefix = self
                    .prefixes
                    .get(p)
                    .cloned()
                    .unwrap_or_else(|| Arc::from([]));
                let unique = (256 / self.scale).max(1);
                let prompt = self.with_unique(&prefix, unique);
                single(Turn {
                    prompt,
                    max_tokens: self.out(256),
                    meta: interactive,
                    prefix: self.hashes_of(p),
                })
            }
            WorkloadKind::Chat => {
                let p = self.pick_prefix();
                let prefix = self
                    .prefixes
                    .get(p)
                    .cloned()
                    .unwrap_or_else(|| Arc::from([]));
                let prompt = self.with_unique(&prefix, (256 / self.scale).max(1));
                single(Turn {
                    prompt,
                    max_tokens: self.out(128),
                    meta: interactive,
                    prefix: self.hashes_of(p),
                })
            }
            WorkloadKind::Independent => {
                let prompt = self.with_unique(&[], (16_256 / self.scale).max(1));
                single(Turn {
                    prompt,
                    max_tokens: self.out(256),
                    meta: interactive,
                    prefix: None,
                })
            }
            WorkloadKind::Multiturn => {
                let mut pending = std::collections::VecDeque::new();
                for k in 0..MULTITURN_TURNS {
                    let n = if k == 0 {
                        self.multiturn.first_tokens
                    } else {
                        self.multiturn.user_tokens
                    };
                    let prompt = self.with_unique(&[], (n / self.scale).max(1));
                    pending.push_back(Turn {
                        prompt,
                        max_tokens: self.out(self.multiturn.output_tokens),
                        meta: interactive.clone(),
                        prefix: None,
                    });
                }
                Session {
                    pending,
                    conversational: true,
                    history: Vec::new(),
                }
            }
            WorkloadKind::MixedTenants => {
                let u = self.rng.next_f64();
                let mut acc = 0.0;
                let mut ti = self.tenants.len().saturating_sub(1);
                for (i, t) in self.tenants.iter().enumerate() {
                    acc += t.share;
                    if u < acc {
                        ti = i;
                        break;
                    }
                }
                let (prefix, unique, out, meta) = match self.tenants.get(ti) {
                    Some(t) => {
                        let prefix = if t.prefixes.is_empty() {
                            Arc::from([])
                        } else {
                            let k = self.rng.below(t.prefixes.len() as u64) as usize;
                            t.prefixes.get(k).cloned().unwrap_or_else(|| Arc::from([]))
                        };
                        (
                            prefix,
                            t.unique_tokens,
                            t.output_tokens,
                            Meta {
                                tenant: Some(t.name.clone()),
                                qos: t.qos,
                            },
                        )
                    }
                    None => (Arc::from([]), 1, 1, interactive),
                };
                let prompt = self.with_unique(&prefix, unique);
                single(Turn {
                    prompt,
                    max_tokens: self.out(out),
                    meta,
                    prefix: None,
                })
            }
        }
    }
}
