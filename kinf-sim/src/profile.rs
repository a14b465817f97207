//! Engine profiles: KV capacity, scheduler limits and the step-time model.
//!
//! A profile is plain data. The named ones ([`Profile::by_name`]) are documented, with how
//! their constants were derived, in `docs/sim/calibration.md`; any field can be overridden
//! (for example `num_gpu_blocks` to study cache size).

use serde::{Deserialize, Serialize};

/// Names of the built-in profiles.
pub const PROFILE_NAMES: [&str; 3] = ["l40s-qwen27b-fp8", "h100-llama70b", "tiny"];

/// Time of one engine step (one forward pass over the scheduled tokens), in seconds:
///
/// `base + per_prefill_token·P + per_decode_seq·D + prefill_attention·A + decode_attention·C`
///
/// where `P` is the number of prompt tokens computed in the step (all prefill chunks), `D` the
/// number of sequences decoding one token, `A` the causal attention pairs of the prefill chunks
/// (a chunk of `n` tokens after `c` computed ones contributes `n·c + n(n+1)/2`), and `C` the sum
/// of the context lengths the decoding sequences attend to.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepModel {
    /// Fixed cost of a step (weights read once per forward pass, launch overhead), seconds.
    pub base_s: f64,
    /// Per prompt token computed (the dense, compute-bound part of prefill), seconds.
    pub per_prefill_token_s: f64,
    /// Per decoding sequence, excluding attention (sampling, per-row work), seconds.
    pub per_decode_seq_s: f64,
    /// Per causal (query, key) pair of a prefill chunk, seconds.
    pub prefill_attention_s: f64,
    /// Per context token attended to by a decoding sequence (KV read), seconds.
    pub decode_attention_s: f64,
}

impl StepModel {
    /// The time of a step with the given composition.
    #[inline]
    pub fn step_time(
        &self,
        prefill_tokens: u64,
        decode_seqs: u64,
        prefill_pairs: f64,
        decode_context: u64,
    ) -> f64 {
        self.base_s
            + self.per_prefill_token_s * prefill_tokens as f64
            + self.per_decode_seq_s * decode_seqs as f64
            + self.prefill_attention_s * prefill_pairs
            + self.decode_attention_s * decode_context as f64
    }
}

/// Time a request spends in the API server before the engine's scheduler sees it (HTTP,
/// chat template, tokenization): `fixed + per_prompt_token · prompt_tokens` seconds. It counts
/// in TTFT and e2e latency, as it does for a client measuring vLLM.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct FrontendModel {
    /// Fixed delay per request, seconds.
    pub fixed_s: f64,
    /// Delay per prompt token, seconds.
    pub per_prompt_token_s: f64,
}

impl FrontendModel {
    /// The delay of a prompt of `tokens` tokens.
    #[inline]
    pub fn delay(&self, tokens: usize) -> f64 {
        self.fixed_s + self.per_prompt_token_s * tokens as f64
    }
}

/// One simulated engine's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Profile name.
    pub name: String,
    /// What it models, in a sentence.
    pub description: String,
    /// Tokens per KV block (vLLM `--block-size`).
    pub block_size: u32,
    /// KV-cache capacity in blocks (vLLM `num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Longest sequence, prompt plus output (`--max-model-len`).
    pub max_model_len: u32,
    /// Whether prompts may be split across steps (`--enable-chunked-prefill`, on by default).
    pub enable_chunked_prefill: bool,
    /// Vocabulary size, for generated token ids.
    pub vocab_size: u32,
    /// Step-time model.
    pub step: StepModel,
    /// API-server delay before scheduling.
    pub frontend: FrontendModel,
}

impl Profile {
    /// A built-in profile by name (see [`PROFILE_NAMES`]).
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "l40s-qwen27b-fp8" => Some(Self::l40s_qwen27b_fp8()),
            "h100-llama70b" => Some(Self::h100_llama70b()),
            "tiny" => Some(Self::tiny()),
            _ => None,
        }
    }

    /// One L40S (48 GB) running a 27B dense model in FP8 (Qwen-3.8-27B-FP8 as in the published
    /// Kinference benchmark) on vLLM with its defaults for GPUs under 70 GiB. Calibrated to
    /// NOTES.md §4: cold 16,256-token TTFT ≈ 6.9 s and warm ≈ 0.3 s at light load,
    /// 40–55 ms per output token.
    pub fn l40s_qwen27b_fp8() -> Self {
        Self {
            name: "l40s-qwen27b-fp8".into(),
            description: "1x L40S 48 GB, 27B dense FP8 (Qwen-3.8-27B-FP8), vLLM defaults for \
                          GPUs under 70 GiB; calibrated to the published Kinference benchmark"
                .into(),
            block_size: 16,
            num_gpu_blocks: 10_000,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 32_768,
            enable_chunked_prefill: true,
            vocab_size: 151_936,
            step: StepModel {
                base_s: 0.040,
                per_prefill_token_s: 3.36e-4,
                per_decode_seq_s: 6.0e-4,
                prefill_attention_s: 6.8e-9,
                decode_attention_s: 8.0e-8,
            },
            frontend: FrontendModel {
                fixed_s: 0.055,
                per_prompt_token_s: 5.9e-6,
            },
        }
    }

    /// One vLLM engine serving a 70B dense model (Llama-3.x-70B, FP8 weights) with tensor
    /// parallelism over two H100 SXM 80 GB, vLLM defaults for GPUs of 70 GiB and more.
    /// Estimated from hardware figures, not calibrated against a measurement.
    pub fn h100_llama70b() -> Self {
        Self {
            name: "h100-llama70b".into(),
            description: "Llama-3.x-70B FP8, TP=2 on 2x H100 SXM 80 GB, vLLM defaults for GPUs \
                          of 70 GiB and more; estimated from hardware figures, not calibrated"
                .into(),
            block_size: 16,
            num_gpu_blocks: 13_000,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            enable_chunked_prefill: true,
            vocab_size: 128_256,
            step: StepModel {
                base_s: 0.016,
                per_prefill_token_s: 1.77e-4,
                per_decode_seq_s: 2.0e-4,
                prefill_attention_s: 4.4e-9,
                decode_attention_s: 6.0e-8,
            },
            frontend: FrontendModel {
                fixed_s: 0.055,
                per_prompt_token_s: 5.9e-6,
            },
        }
    }

    /// A small, fast engine for tests: block size 4, 256 blocks, 8 sequences, 32-token budget,
    /// 1 ms steps plus 10 µs per prompt token, no API-server delay.
    pub fn tiny() -> Self {
        Self {
            name: "tiny".into(),
            description: "small engine for tests: block 4, 256 blocks, 8 seqs, 32-token budget"
                .into(),
            block_size: 4,
            num_gpu_blocks: 256,
            max_num_seqs: 8,
            max_num_batched_tokens: 32,
            max_model_len: 512,
            enable_chunked_prefill: true,
            vocab_size: 1000,
            step: StepModel {
                base_s: 0.001,
                per_prefill_token_s: 1.0e-5,
                per_decode_seq_s: 1.0e-4,
                prefill_attention_s: 0.0,
                decode_attention_s: 0.0,
            },
            frontend: FrontendModel {
                fixed_s: 0.0,
                per_prompt_token_s: 0.0,
            },
        }
    }

    /// KV capacity in tokens.
    pub fn capacity_tokens(&self) -> u64 {
        u64::from(self.num_gpu_blocks) * u64::from(self.block_size)
    }

    /// Why this profile cannot run, if it cannot.
    pub fn validate(&self) -> Result<(), String> {
        if self.block_size == 0 {
            return Err("`block_size` must be at least 1".into());
        }
        if self.num_gpu_blocks == 0 {
            return Err("`num_gpu_blocks` must be at least 1".into());
        }
        if self.max_num_seqs == 0 {
            return Err("`max_num_seqs` must be at least 1".into());
        }
        if self.max_num_batched_tokens == 0 {
            return Err("`max_num_batched_tokens` must be at least 1".into());
        }
        if self.max_model_len < 2 {
            return Err("`max_model_len` must be at least 2".into());
        }
        if !self.enable_chunked_prefill && self.max_num_batched_tokens < self.max_model_len {
            return Err(
                "without chunked prefill `max_num_batched_tokens` must be at least `max_model_len`"
                    .into(),
            );
        }
        let s = &self.step;
        let fe = &self.frontend;
        let all = [
            s.base_s,
            s.per_prefill_token_s,
            s.per_decode_seq_s,
            s.prefill_attention_s,
            s.decode_attention_s,
            fe.fixed_s,
            fe.per_prompt_token_s,
        ];
        if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err("step and frontend constants must be finite and non-negative".into());
        }
        if s.base_s <= 0.0 {
            return Err("`step.base_s` must be positive (a step takes time)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn built_in_profiles_are_valid() {
        for name in PROFILE_NAMES {
            let p = Profile::by_name(name).unwrap();
            assert_eq!(p.name, name);
            p.validate().unwrap();
        }
        assert!(Profile::by_name("nope").is_none());
    }

    #[test]
    fn validation_catches_bad_constants() {
        let mut p = Profile::tiny();
        p.step.base_s = 0.0;
        assert!(p.validate().is_err());
        let mut p = Profile::tiny();
        p.enable_chunked_prefill = false;
        assert!(p.validate().is_err());
        p.max_num_batched_tokens = p.max_model_len;
        p.validate().unwrap();
    }
}
