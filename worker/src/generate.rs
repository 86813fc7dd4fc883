//! `generate`: sample completions from a local model with its chat template applied.

use crate::chat_template::ChatMessage;
use crate::device::parse_device;
use crate::error::Result;
use crate::loader::{load_model, LoadedModel};
use crate::model::compact::RolloutDtype;
use crate::sampler::{sample, FinishReason, SamplingParams};
use serde::Serialize;
use std::path::Path;

/// Options of `verity generate`.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// System message placed before the prompt (else the template's default).
    pub system: Option<String>,
    /// Longest completion in tokens.
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus mass kept.
    pub top_p: f32,
    /// Most likely tokens kept (0 = all).
    pub top_k: usize,
    /// Completions to sample.
    pub n: usize,
    /// RNG seed.
    pub seed: u64,
    /// Device spec (`cpu`, `cuda:N`).
    pub device: String,
    /// Precision of the weights sampling reads.
    pub rollout_dtype: RolloutDtype,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self {
            system: None,
            max_tokens: 256,
            temperature: 0.7,
            top_p: 1.0,
            top_k: 0,
            n: 1,
            seed: 0,
            device: "cpu".into(),
            rollout_dtype: RolloutDtype::F32,
        }
    }
}

/// One generated completion.
#[derive(Debug, Clone, Serialize)]
pub struct GeneratedText {
    /// Decoded text (special tokens dropped).
    pub text: String,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Number of generated tokens.
    pub tokens: usize,
}

/// `verity generate`: loads the model (HF folder or GGUF), applies the chat template to
/// `prompt` (after `system` if any) and samples `n` completions.
pub fn generate(model: &Path, prompt: &str, opts: &GenerateOptions) -> Result<Vec<GeneratedText>> {
    let device = parse_device(&opts.device)?;
    let lm = load_model(model, &device)?;
    generate_with(&lm, prompt, opts)
}

/// Like [`generate`] with an already loaded model.
pub fn generate_with(
    lm: &LoadedModel,
    prompt: &str,
    opts: &GenerateOptions,
) -> Result<Vec<GeneratedText>> {
    let mut messages = Vec::new();
    if let Some(system) = &opts.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    messages.push(ChatMessage::new("user", prompt));
    let text = lm.tokenizer.apply_chat_template(&messages, true)?;
    let ids = lm.tokenizer.encode(&text)?;
    let params = SamplingParams {
        n: opts.n,
        temperature: opts.temperature,
        top_p: opts.top_p,
        top_k: opts.top_k,
        max_new_tokens: opts.max_tokens,
        stop_strings: vec![],
        seed: opts.seed,
        rollout_dtype: opts.rollout_dtype,
        max_batch_rows: 0,
        constraint: None,
    };
    let out = sample(
        &lm.model,
        &[ids],
        &params,
        &lm.tokenizer.eos_token_ids,
        lm.tokenizer.pad_id(),
        Some(&lm.tokenizer),
    )?;
    out.into_iter()
        .map(|c| {
            Ok(GeneratedText {
                text: lm.tokenizer.decode(&c.token_ids, true)?,
                finish_reason: c.finish_reason,
                tokens: c.token_ids.len(),
            })
        })
        .collect()
}
