//! What an inference request carries from the API server to an inference worker, and the
//! events that come back (JSON on the wire between them).

use crate::chat_template::ChatMessage;
use crate::judge::local::prompt_seed;
use crate::sampler::SamplingParams;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use verity_verifiers::judge::JudgePrompt;

/// Where a served model's weights live in the object store; the API server resolves a
/// request's `model` name to this (with the caller's org checked) before forwarding it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSource {
    /// Published folder of the base model.
    pub base_prefix: String,
    /// `hf` or `gguf`.
    pub base_format: String,
    /// Checkpoint folders folded into the base's weights when it loads, bottom first (the
    /// models a chained job started from; each an adapter merged in or full weights).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merged: Vec<String>,
    /// A checkpoint folder served instead of the base: a PEFT adapter (applied over the shared
    /// base) or full weights.
    pub checkpoint_prefix: Option<String>,
}

impl ModelSource {
    /// The key a worker caches this model under (also what it advertises as loaded).
    pub fn cache_key(&self) -> String {
        match &self.checkpoint_prefix {
            Some(checkpoint) => format!("{}+{checkpoint}", self.base_key()),
            None => self.base_key(),
        }
    }

    /// The cache key of the base with the merged checkpoints folded in.
    pub fn base_key(&self) -> String {
        std::iter::once(self.base_prefix.as_str())
            .chain(self.merged.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("+")
    }
}

/// The text to continue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptInput {
    /// Chat messages, rendered with the model's chat template and an open assistant turn.
    Chat(Vec<ChatMessage>),
    /// Raw text, tokenized as it is.
    Text(String),
    /// Token ids, continued as they are (the Tinker API's `ModelInput`).
    Tokens(Vec<u32>),
    /// A model grader's judge prompt, asked as a training worker's judge asks it
    /// ([`crate::judge::local::render_prompt`]: the chat template, or the contents one per line
    /// for a model without one); its `max_tokens` is cut to what the prompt leaves of the
    /// context instead of refused.
    Judge(Vec<ChatMessage>),
}

/// Sampling settings of one request (validated by the API server).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationParams {
    /// Completions to sample.
    pub n: usize,
    /// Softmax temperature; 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass kept.
    pub top_p: f32,
    /// Longest completion; `None`: up to the model's context.
    pub max_tokens: Option<usize>,
    /// Texts that end a completion (not included in it).
    pub stop: Vec<String>,
    /// Token ids that end a completion as its end-of-sequence token does (included in its
    /// tokens, not in its text): the Tinker API's `stop` as token ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_token_ids: Vec<u32>,
    /// Seed; choice `i` samples from the stream `(seed, 0, i)`, as `verity generate` does.
    pub seed: u64,
    /// Log-probabilities to report: `None` none, `Some(k)` the chosen token's and the `k` most
    /// likely alternatives at each position.
    pub logprobs: Option<usize>,
    /// Added to the logits of these token ids before sampling.
    #[serde(default)]
    pub logit_bias: BTreeMap<u32, f32>,
    /// Report the log-probability of each prompt token given the ones before it (temperature 1,
    /// as the trainer scores them), as a [`GenerationEvent::PromptLogprobs`] before any delta.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prompt_logprobs: bool,
    /// OpenAI's structured outputs: with a JSON format the completion follows it (constrained
    /// decoding); absent is free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<verity_core::response_format::ResponseFormat>,
}

impl Default for GenerationParams {
    /// One choice at temperature 1 and top_p 1, up to the model's context, seed 0, nothing else.
    fn default() -> Self {
        GenerationParams {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            max_tokens: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            seed: 0,
            logprobs: None,
            logit_bias: BTreeMap::new(),
            prompt_logprobs: false,
            response_format: None,
        }
    }
}

impl GenerationParams {
    /// The sampler's settings for this request's rows: its `n` choices of at most
    /// `max_new_tokens` (what the context leaves of `max_tokens`). Stop strings, stop tokens and
    /// the grammar are matched by the serving loop itself, so the sampler gets none.
    pub fn sampling(&self, max_new_tokens: usize) -> SamplingParams {
        SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            max_new_tokens,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// A model grader's judge prompt, sampled as a training worker's judge samples it: one reply
/// from the prompt's own seed ([`prompt_seed`]), of at most the grader's reply budget.
impl From<&JudgePrompt> for GenerationParams {
    fn from(prompt: &JudgePrompt) -> Self {
        let s = &prompt.sampling;
        GenerationParams {
            temperature: s.temperature as f32,
            top_p: s.top_p as f32,
            max_tokens: Some(s.max_completion_tokens),
            seed: prompt_seed(prompt),
            ..GenerationParams::default()
        }
    }
}

/// One inference request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationRequest {
    /// The model to run.
    pub model: ModelSource,
    /// What to continue.
    pub prompt: PromptInput,
    /// How to sample.
    pub params: GenerationParams,
}

/// A candidate token with its log-probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability (natural log, temperature 1).
    pub logprob: f32,
}

/// The log-probability of a sampled token and of the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    /// The token's id.
    #[serde(default)]
    pub id: u32,
    /// The token's text.
    pub token: String,
    /// Its log-probability (natural log, temperature 1).
    pub logprob: f32,
    /// The most likely tokens at this position, best first.
    pub top: Vec<TopLogprob>,
}

/// Why a completion ended, in OpenAI's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` (or the context) was reached.
    Length,
}

/// What a running generation reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GenerationEvent {
    /// Accepted: the prompt's size and the completion budget.
    Started {
        /// Tokens of the prompt.
        prompt_tokens: usize,
        /// The longest completion allowed.
        max_tokens: usize,
    },
    /// The log-probability of each prompt token after the first given the ones before it (when
    /// asked for with `prompt_logprobs`).
    PromptLogprobs {
        /// One per prompt token from the second on.
        logprobs: Vec<f32>,
    },
    /// More text of choice `index` (and the log-probabilities of the tokens that made it).
    Delta {
        /// The choice.
        index: usize,
        /// Text to append.
        text: String,
        /// Per-token log-probabilities, when asked for.
        logprobs: Vec<TokenLogprob>,
    },
    /// Choice `index` ended.
    Finished {
        /// The choice.
        index: usize,
        /// Why.
        reason: StopReason,
        /// Tokens it generated.
        completion_tokens: usize,
    },
    /// The generation broke off (a failure of the worker, not of the request).
    Failed {
        /// What went wrong.
        message: String,
    },
    /// The request asks what this model cannot do (e.g. a `response_format` its tokenizer
    /// cannot be constrained to): the client's to change, before any token.
    Refused {
        /// The request field at fault.
        param: String,
        /// Why.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use verity_verifiers::judge::{JudgeMessage, JudgeSampling};

    fn judge_prompt(text: &str) -> JudgePrompt {
        JudgePrompt {
            model: "judge".into(),
            messages: vec![JudgeMessage { role: "user".into(), content: text.into() }],
            sampling: JudgeSampling {
                temperature: 0.5,
                top_p: 0.9,
                seed: 3,
                max_completion_tokens: 40,
                reasoning_effort: None,
            },
        }
    }

    #[test]
    fn a_routed_judge_prompt_samples_as_the_local_judge_does() {
        let prompt = judge_prompt("Score this.");
        let routed = GenerationParams::from(&prompt);
        assert_eq!((routed.n, routed.temperature, routed.top_p), (1, 0.5, 0.9));
        assert_eq!(routed.max_tokens, Some(40));
        // the per-prompt stream, as `judge::local::generate` draws it
        assert_eq!(routed.seed, prompt_seed(&prompt));
        assert_ne!(routed.seed, GenerationParams::from(&judge_prompt("Other.")).seed);
        let local = SamplingParams::from(&prompt.sampling);
        assert_eq!((local.temperature, local.top_p, local.max_new_tokens), (0.5, 0.9, 40));
    }

    #[test]
    fn a_request_s_rows_sample_with_its_settings_and_no_stop_strings() {
        let request = GenerationParams {
            n: 3,
            temperature: 0.2,
            top_p: 0.8,
            max_tokens: Some(100),
            stop: vec!["\n".into()],
            seed: 9,
            ..GenerationParams::default()
        };
        let rows = request.sampling(12);
        assert_eq!((rows.n, rows.temperature, rows.top_p, rows.seed), (3, 0.2, 0.8, 9));
        assert_eq!(rows.max_new_tokens, 12, "the budget the context leaves, not max_tokens");
        assert!(rows.stop_strings.is_empty(), "the serving loop matches stop strings itself");
    }
}
