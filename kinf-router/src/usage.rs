//! Token accounting primitives: what one request used, and what it cost.

use serde::Serialize;

use kinf_lang::compiled::CostInfo;

/// Tokens of one request, as reported by the upstream's `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenUsage {
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Prompt tokens computed.
    pub uncached_prompt_tokens: u64,
    /// Of the uncached tokens, those a provider wrote to its prompt cache (Anthropic's
    /// `cache_creation_input_tokens`, Bedrock's `cacheWriteInputTokens`); 0 from vLLM, which
    /// reports none. Omitted from JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_write_prompt_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

impl TokenUsage {
    /// From OpenAI-style counts: `prompt_tokens`, `prompt_tokens_details.cached_tokens`,
    /// `completion_tokens`. Cached tokens above the prompt size are clamped.
    pub fn from_openai(prompt_tokens: u64, cached_tokens: u64, completion_tokens: u64) -> Self {
        let cached = cached_tokens.min(prompt_tokens);
        TokenUsage {
            cached_prompt_tokens: cached,
            uncached_prompt_tokens: prompt_tokens - cached,
            cache_write_prompt_tokens: 0,
            output_tokens: completion_tokens,
        }
    }

    /// All prompt tokens.
    pub fn prompt_tokens(&self) -> u64 {
        self.cached_prompt_tokens + self.uncached_prompt_tokens
    }

    /// Prompt plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens() + self.output_tokens
    }

    /// Cost at the given prices per million tokens.
    pub fn cost(&self, prices: &CostInfo) -> f64 {
        (self.uncached_prompt_tokens as f64 * prices.uncached_prompt
            + self.cached_prompt_tokens as f64 * prices.cached_prompt
            + self.output_tokens as f64 * prices.output)
            / 1e6
    }

    /// Adds another request's usage.
    pub fn add(&mut self, other: &TokenUsage) {
        self.cached_prompt_tokens += other.cached_prompt_tokens;
        self.uncached_prompt_tokens += other.uncached_prompt_tokens;
        self.cache_write_prompt_tokens += other.cache_write_prompt_tokens;
        self.output_tokens += other.output_tokens;
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_prices_tokens() {
        let u = TokenUsage::from_openai(1000, 768, 100);
        assert_eq!(u.uncached_prompt_tokens, 232);
        assert_eq!(u.total_tokens(), 1100);
        let prices = CostInfo {
            uncached_prompt: 1.0,
            cached_prompt: 0.1,
            output: 2.0,
            priced: true,
        };
        let expect = (232.0 * 1.0 + 768.0 * 0.1 + 100.0 * 2.0) / 1e6;
        assert!((u.cost(&prices) - expect).abs() < 1e-12);
        assert_eq!(TokenUsage::from_openai(10, 50, 0).cached_prompt_tokens, 10);
    }
}
